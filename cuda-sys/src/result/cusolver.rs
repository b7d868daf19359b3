//! Checked cuSOLVER calls that a runtime makes itself: creating and destroying a
//! dense-API handle, and setting its stream. A status other than success is a
//! [`LibraryError`](super::LibraryError) named by [`cusolver_status_name`].
//!
//! Calls that take a handle are `unsafe fn`: it is live (created and not
//! destroyed) and not used by another thread during the call.

use super::{cusolver_status_name, library_check, Result};
use crate::cusolver::{cudaStream_t, cusolverDnHandle_t, cusolverStatus_t};

/// `Ok(())` for success, else the [`LibraryError`](super::LibraryError) of `status` for
/// `call`.
#[inline]
pub fn check(status: cusolverStatus_t, call: &'static str) -> Result<()> {
    library_check(status.0, call, cusolver_status_name)
}

/// A new cuSOLVER dense handle in the current context (`cusolverDnCreate`); the caller
/// destroys it once with [`dn_destroy`].
pub fn dn_create() -> Result<cusolverDnHandle_t> {
    let f = crate::cusolver::api()?.cusolverDnCreate()?;
    let mut h: cusolverDnHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out pointer.
    check(unsafe { f(&mut h) }, "cusolverDnCreate")?;
    Ok(h)
}

/// Destroys a dense handle (`cusolverDnDestroy`).
///
/// # Safety
/// `handle` came from [`dn_create`], is destroyed once and not used afterwards.
pub unsafe fn dn_destroy(handle: cusolverDnHandle_t) -> Result<()> {
    let f = crate::cusolver::api()?.cusolverDnDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(handle) }, "cusolverDnDestroy")
}

/// Makes the handle's calls run on `stream` (`cusolverDnSetStream`); a driver
/// `CUstream` converts with `.cast()`.
///
/// # Safety
/// `handle` is live; `stream` is a live stream (or a default-stream handle) of the
/// handle's context, alive as long as the handle uses it.
pub unsafe fn dn_set_stream(handle: cusolverDnHandle_t, stream: cudaStream_t) -> Result<()> {
    let f = crate::cusolver::api()?.cusolverDnSetStream()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(handle, stream) }, "cusolverDnSetStream")
}
