//! Checked cuSPARSE calls that a runtime makes itself: creating and destroying a
//! handle, and setting its stream. A status other than success is a
//! [`LibraryError`](super::LibraryError) named by [`cusparse_status_name`] and described by
//! [`status_description`].
//!
//! Calls that take a handle are `unsafe fn`: it is live (created and not
//! destroyed) and not used by another thread during the call.

use super::{cusparse_status_name, library_check_described, Result};
use crate::cusparse::{cudaStream_t, cusparseHandle_t, cusparseStatus_t};

/// `Ok(())` for success, else the [`LibraryError`](super::LibraryError) of `status` for
/// `call`.
#[inline]
pub fn check(status: cusparseStatus_t, call: &'static str) -> Result<()> {
    library_check_described(status.0, call, cusparse_status_name, status_description)
}

/// cuSPARSE's words for `status` (`cusparseGetErrorString`), e.g. `initialization error` for `CUSPARSE_STATUS_NOT_INITIALIZED`. `None`
/// when the library or the function is missing (an older cuSPARSE): the error then
/// carries the status's name only. Never fails.
pub fn status_description(status: u32) -> Option<&'static str> {
    let f = crate::cusparse::api().ok()?.cusparseGetErrorString().ok()?;
    // SAFETY: cusparseGetErrorString takes any status value and returns a static string (or null).
    let p = unsafe { f(cusparseStatus_t(status)) };
    // SAFETY: null or the library's static NUL-terminated string; the loader never
    // unloads the library.
    unsafe { super::static_status_string(p) }
}

/// A new cuSPARSE handle in the current context (`cusparseCreate`); the caller destroys
/// it once with [`destroy`].
pub fn create() -> Result<cusparseHandle_t> {
    let f = crate::cusparse::api()?.cusparseCreate()?;
    let mut h: cusparseHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out pointer.
    check(unsafe { f(&mut h) }, "cusparseCreate")?;
    Ok(h)
}

/// Destroys a handle (`cusparseDestroy`).
///
/// # Safety
/// `handle` came from [`create`], is destroyed once and not used afterwards.
pub unsafe fn destroy(handle: cusparseHandle_t) -> Result<()> {
    let f = crate::cusparse::api()?.cusparseDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(handle) }, "cusparseDestroy")
}

/// Makes the handle's calls run on `stream` (`cusparseSetStream`); a driver `CUstream`
/// converts with `.cast()`.
///
/// # Safety
/// `handle` is live; `stream` is a live stream (or a default-stream handle) of the
/// handle's context, alive as long as the handle uses it.
pub unsafe fn set_stream(handle: cusparseHandle_t, stream: cudaStream_t) -> Result<()> {
    let f = crate::cusparse::api()?.cusparseSetStream()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(handle, stream) }, "cusparseSetStream")
}
