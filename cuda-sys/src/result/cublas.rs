//! Checked cuBLAS calls that a runtime makes itself: creating and destroying a handle,
//! and setting its stream. A status other than success is a
//! [`LibraryError`](super::LibraryError) named by [`cublas_status_name`].
//!
//! Calls that take a handle are `unsafe fn`: it is live (created and not
//! destroyed) and not used by another thread during the call.

use super::{cublas_status_name, library_check, Result};
use crate::cublas::{cublasHandle_t, cublasStatus_t, cudaStream_t};

/// `Ok(())` for success, else the [`LibraryError`](super::LibraryError) of `status` for
/// `call`.
#[inline]
pub fn check(status: cublasStatus_t, call: &'static str) -> Result<()> {
    library_check(status.0, call, cublas_status_name)
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
