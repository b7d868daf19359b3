//! Checked driver calls about contexts (`cuCtx*`) and primary contexts
//! (`cuDevicePrimaryCtx*`).
//!
//! Most driver calls act on the calling thread's current context; [`set_current`]
//! makes one current. Which context to make current, and when, is the caller's policy
//! (cuda-rt keeps each device's primary context current and remembers it per thread).

use super::{api, check, Result};
use crate::driver::{CUcontext, CUdevice};

/// Device `dev`'s primary context, retained (`cuDevicePrimaryCtxRetain`): it lives until
/// as many [`primary_ctx_release`] calls as retains. An ordinal that is not a device is
/// an error code.
pub fn primary_ctx_retain(dev: CUdevice) -> Result<CUcontext> {
    let f = api()?.cuDevicePrimaryCtxRetain()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out pointer; the driver checks `dev`.
    check(unsafe { f(&mut ctx, dev) }, "cuDevicePrimaryCtxRetain")?;
    Ok(ctx)
}

/// Releases one retain of device `dev`'s primary context (`cuDevicePrimaryCtxRelease`).
/// With the last release the context is destroyed, and every handle and address of it
/// with it.
///
/// # Safety
/// The caller gives back a retain of its own ([`primary_ctx_retain`]), once: no one
/// else's handles depend on it.
pub unsafe fn primary_ctx_release(dev: CUdevice) -> Result<()> {
    let f = api()?.cuDevicePrimaryCtxRelease_v2()?;
    // SAFETY: the retain given back is the caller's (see `# Safety`); the driver checks
    // `dev`.
    check(unsafe { f(dev) }, "cuDevicePrimaryCtxRelease_v2")
}

/// Makes `ctx` current on the calling thread (`cuCtxSetCurrent`); null unbinds the
/// current one.
///
/// # Safety
/// `ctx` is null or a live context (a retained primary context, or one created and not
/// yet destroyed).
#[inline]
pub unsafe fn set_current(ctx: CUcontext) -> Result<()> {
    let f = api()?.cuCtxSetCurrent()?;
    // SAFETY: `ctx` is null or live (caller).
    check(unsafe { f(ctx) }, "cuCtxSetCurrent")
}

/// The calling thread's current context as the driver sees it, null for none
/// (`cuCtxGetCurrent`).
pub fn get_current() -> Result<CUcontext> {
    let f = api()?.cuCtxGetCurrent()?;
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out pointer.
    check(unsafe { f(&mut ctx) }, "cuCtxGetCurrent")?;
    Ok(ctx)
}

/// Blocks until the current context's work is done (`cuCtxSynchronize`); an error code
/// when no context is current.
pub fn synchronize() -> Result<()> {
    let f = api()?.cuCtxSynchronize()?;
    // SAFETY: no arguments.
    check(unsafe { f() }, "cuCtxSynchronize")
}

/// The current context's stream priority range as `(least, greatest)`; greater
/// priority is a lower number (`cuCtxGetStreamPriorityRange`).
pub fn get_stream_priority_range() -> Result<(i32, i32)> {
    let f = api()?.cuCtxGetStreamPriorityRange()?;
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both are valid out pointers.
    check(
        unsafe { f(&mut least, &mut greatest) },
        "cuCtxGetStreamPriorityRange",
    )?;
    Ok((least, greatest))
}

/// Lets the current context access memory of `peer` (`cuCtxEnablePeerAccess`, flags
/// 0). A second call for the same pair is `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`;
/// a device that cannot reach the peer is `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`.
///
/// # Safety
/// `peer` is a live context (a retained primary context, or one created and not yet
/// destroyed); a context is current on the calling thread.
pub unsafe fn enable_peer_access(peer: CUcontext) -> Result<()> {
    let f = api()?.cuCtxEnablePeerAccess()?;
    // SAFETY: `peer` is live (caller); flags must be 0.
    check(unsafe { f(peer, 0) }, "cuCtxEnablePeerAccess")
}

/// Takes back the current context's access to memory of `peer`
/// (`cuCtxDisablePeerAccess`); `CUDA_ERROR_PEER_ACCESS_NOT_ENABLED` when it had none.
///
/// # Safety
/// `peer` is a live context; a context is current on the calling thread; no work
/// queued or running in the current context still reads or writes `peer`'s memory.
pub unsafe fn disable_peer_access(peer: CUcontext) -> Result<()> {
    let f = api()?.cuCtxDisablePeerAccess()?;
    // SAFETY: `peer` is live and unused by queued work (caller).
    check(unsafe { f(peer) }, "cuCtxDisablePeerAccess")
}
