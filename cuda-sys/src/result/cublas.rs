//! Checked cuBLAS calls that a runtime makes itself: creating and destroying a handle,
//! and setting its stream. A status other than success is a
//! [`LibraryError`](super::LibraryError) named by [`cublas_status_name`] and described by
//! [`status_description`].
//!
//! Calls that take a handle are `unsafe fn`: it is live (created and not
//! destroyed) and not used by another thread during the call.

use super::{cublas_status_name, library_check_described, Result};
use crate::cublas::{cublasHandle_t, cublasStatus_t, cudaStream_t};

/// `Ok(())` for success, else the [`LibraryError`](super::LibraryError) of `status` for
/// `call`.
#[inline]
pub fn check(status: cublasStatus_t, call: &'static str) -> Result<()> {
    library_check_described(status.0, call, cublas_status_name, status_description)
}

/// cuBLAS's words for `status` (`cublasGetStatusString`), e.g. `the library was not initialized` for `CUBLAS_STATUS_NOT_INITIALIZED`. `None`
/// when the library or the function is missing (an older cuBLAS): the error then
/// carries the status's name only. Never fails.
pub fn status_description(status: u32) -> Option<&'static str> {
    let f = crate::cublas::api().ok()?.cublasGetStatusString().ok()?;
    // SAFETY: cublasGetStatusString takes any status value and returns a static string (or null).
    let p = unsafe { f(cublasStatus_t(status)) };
    // SAFETY: null or the library's static NUL-terminated string; the loader never
    // unloads the library.
    unsafe { super::static_status_string(p) }
}

/// A new cuBLAS handle in the current context (`cublasCreate`); the caller destroys it
/// once with [`destroy`].
pub fn create() -> Result<cublasHandle_t> {
    let f = crate::cublas::api()?.cublasCreate_v2()?;
    let mut h: cublasHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out pointer.
    check(unsafe { f(&mut h) }, "cublasCreate")?;
    Ok(h)
}

/// Destroys a handle (`cublasDestroy`).
///
/// # Safety
/// `handle` came from [`create`], is destroyed once and not used afterwards.
pub unsafe fn destroy(handle: cublasHandle_t) -> Result<()> {
    let f = crate::cublas::api()?.cublasDestroy_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(handle) }, "cublasDestroy")
}

/// Makes the handle's calls run on `stream` (`cublasSetStream`); a driver `CUstream`
/// converts with `.cast()` (it is the runtime's `cudaStream_t`).
///
/// # Safety
/// `handle` is live; `stream` is a live stream (or a default-stream handle) of the
/// handle's context, alive as long as the handle uses it.
pub unsafe fn set_stream(handle: cublasHandle_t, stream: cudaStream_t) -> Result<()> {
    let f = crate::cublas::api()?.cublasSetStream_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(handle, stream) }, "cublasSetStream")
}
