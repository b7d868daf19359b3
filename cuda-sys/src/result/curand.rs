//! Checked cuRAND calls that a runtime makes itself: creating and destroying a
//! generator, and setting its stream. A status other than success is a
//! [`LibraryError`](super::LibraryError) named by [`curand_status_name`] and described by
//! [`status_description`].
//!
//! Calls that take a generator are `unsafe fn`: it is live (created and not
//! destroyed) and not used by another thread during the call.

use super::{curand_status_name, library_check_described, Result};
use crate::curand::{cudaStream_t, curandGenerator_t, curandRngType, curandStatus};

/// `Ok(())` for success, else the [`LibraryError`](super::LibraryError) of `status` for
/// `call`.
#[inline]
pub fn check(status: curandStatus, call: &'static str) -> Result<()> {
    library_check_described(status.0, call, curand_status_name, status_description)
}

/// cuRAND's words for `status`. cuRAND has no function that returns them (cuBLAS and
/// cuSPARSE do), so they are a fixed table written from the descriptions of its
/// status values in its documentation and header; `None` for success and for a status
/// this table does not know (a newer library's), which is then named only. Pure.
pub fn status_description(status: u32) -> Option<&'static str> {
    Some(match status {
        100 => "header file and linked library version do not match",
        101 => "generator not initialized",
        102 => "memory allocation failed",
        103 => "generator is wrong type",
        104 => "argument out of range",
        105 => "length requested is not a multiple of dimension",
        106 => "GPU does not have double precision required by MRG32k3a",
        201 => "kernel launch failure",
        202 => "preexisting failure on library entry",
        203 => "initialization of CUDA failed",
        204 => "architecture mismatch, GPU does not support requested feature",
        999 => "internal library error",
        _ => return None,
    })
}

/// A new generator of `rng_type` in the current context (`curandCreateGenerator`); the
/// caller destroys it once with [`destroy_generator`].
pub fn create_generator(rng_type: curandRngType) -> Result<curandGenerator_t> {
    let f = crate::curand::api()?.curandCreateGenerator()?;
    let mut g: curandGenerator_t = std::ptr::null_mut();
    // SAFETY: `g` is a valid out pointer; the library checks the type.
    check(unsafe { f(&mut g, rng_type) }, "curandCreateGenerator")?;
    Ok(g)
}

/// Destroys a generator (`curandDestroyGenerator`).
///
/// # Safety
/// `generator` came from [`create_generator`], is destroyed once and not used
/// afterwards.
pub unsafe fn destroy_generator(generator: curandGenerator_t) -> Result<()> {
    let f = crate::curand::api()?.curandDestroyGenerator()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(generator) }, "curandDestroyGenerator")
}

/// Makes the generator's calls run on `stream` (`curandSetStream`); a driver `CUstream`
/// converts with `.cast()`.
///
/// # Safety
/// `generator` is live; `stream` is a live stream (or a default-stream handle) of the
/// generator's context, alive as long as the generator uses it.
pub unsafe fn set_stream(generator: curandGenerator_t, stream: cudaStream_t) -> Result<()> {
    let f = crate::curand::api()?.curandSetStream()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(generator, stream) }, "curandSetStream")
}
