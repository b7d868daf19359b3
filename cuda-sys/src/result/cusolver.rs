//! Checked cuSOLVER calls that a runtime makes itself: creating and destroying a
//! dense-API handle, and setting its stream. A status other than success is a
//! [`LibraryError`](super::LibraryError) named by [`cusolver_status_name`] and described by
//! [`status_description`].
//!
//! Calls that take a handle are `unsafe fn`: it is live (created and not
//! destroyed) and not used by another thread during the call.

use super::{cusolver_status_name, library_check_described, Result};
use crate::cusolver::{cudaStream_t, cusolverDnHandle_t, cusolverStatus_t};

/// `Ok(())` for success, else the [`LibraryError`](super::LibraryError) of `status` for
/// `call`.
#[inline]
pub fn check(status: cusolverStatus_t, call: &'static str) -> Result<()> {
    library_check_described(status.0, call, cusolver_status_name, status_description)
}

/// cuSOLVER's words for `status`. cuSOLVER has no function that returns them (cuBLAS and
/// cuSPARSE do), so they are a fixed table written from the descriptions of its
/// status values in its documentation and header; `None` for success and for a status
/// this table does not know (a newer library's), which is then named only. Pure.
pub fn status_description(status: u32) -> Option<&'static str> {
    Some(match status {
        1 => "the library was not initialized",
        2 => "resource allocation failed",
        3 => "an unsupported value or parameter was passed",
        4 => "the device does not support a feature the function needs",
        5 => "an access to GPU memory space failed",
        6 => "the GPU program failed to execute",
        7 => "an internal operation failed",
        8 => "the matrix type is not supported",
        9 => "the operation is not supported",
        10 => "a zero pivot was encountered",
        11 => "invalid license",
        12 => "the iterative refinement solver parameters were not initialized",
        13 => "an iterative refinement solver parameter is invalid",
        14 => "the iterative refinement solver precision is invalid",
        15 => "the iterative refinement solver refinement method is invalid",
        16 => "the iterative refinement solver iteration limit is invalid",
        20 => "an internal operation of the iterative refinement solver failed",
        21 => "the iterative refinement solver does not support this operation",
        22 => "the iterative refinement solver went out of range",
        23 => "GMRES refinement supports only one right-hand side",
        25 => "the iterative refinement solver information was not initialized",
        26 => "the iterative refinement solver information was not destroyed",
        30 => "the matrix is singular",
        31 => "the workspace is invalid (not allocated or too small)",
        _ => return None,
    })
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
