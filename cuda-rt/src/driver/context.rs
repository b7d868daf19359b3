//! Primary contexts: retained once per device for the life of the process, and made
//! current on a thread only when it is not current already (a thread-local cache of the
//! context this library last made current saves the driver call).
//!
//! If code outside cuda-rt changes the thread's current context with the raw driver API,
//! it calls [`crate::device::forget_current_context`] (this module's
//! [`forget_current`]) afterwards so the cache is not trusted.

use std::sync::OnceLock;

use super::{drv, sys};
use crate::error::{ArgumentKind, Error, Result};

pub use crate::thread_state::MAX_DEVICES;
use crate::thread_state::{
    context_device, context_made_current, forget_context, set_context_device,
    set_context_made_current,
};

/// Retained primary contexts, as addresses (a `CUcontext` is not `Send`).
static PRIMARY: [OnceLock<Result<usize>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// Device `id`'s primary context, retained on first use and never released (CuPy does
/// the same: the context lives as long as the process).
pub fn primary(id: i32) -> Result<sys::CUcontext> {
    let slot = usize::try_from(id)
        .ok()
        .and_then(|i| PRIMARY.get(i))
        .ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("device id {id} is out of range"),
            )
        })?;
    let addr = slot
        .get_or_init(|| {
            let dev = super::device::get(id)?;
            let mut ctx: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: `ctx` is a valid out pointer; `dev` came from cuDeviceGet.
            drv!(cuDevicePrimaryCtxRetain(&mut ctx, dev))?;
            Ok(ctx as usize)
        })
        .clone()?;
    Ok(addr as sys::CUcontext)
}

/// Makes device `id`'s primary context current on this thread, unless this library
/// already made it current here.
#[inline]
pub fn make_current(id: i32) -> Result<()> {
    // One thread-local load and compare when the device is already current (every
    // hot path calls this): no primary-context lookup, no driver call.
    if context_device() == id && id >= 0 {
        return Ok(());
    }
    make_current_slow(id)
}

#[cold]
fn make_current_slow(id: i32) -> Result<()> {
    let ctx = primary(id)?;
    if context_made_current() != ctx as usize {
        set_current(ctx)?;
    }
    set_context_device(id);
    Ok(())
}

/// `cuCtxSetCurrent`, and remembers it.
pub fn set_current(ctx: sys::CUcontext) -> Result<()> {
    // Unknown until the call succeeds (and for a context that is not a primary one).
    set_context_device(-1);
    // SAFETY: `ctx` is a context handle (the driver rejects invalid ones).
    drv!(cuCtxSetCurrent(ctx))?;
    set_context_made_current(ctx as usize);
    Ok(())
}

/// The thread's current context as the driver sees it (`cuCtxGetCurrent`).
pub fn current() -> Result<sys::CUcontext> {
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `ctx` is a valid out pointer.
    drv!(cuCtxGetCurrent(&mut ctx))?;
    Ok(ctx)
}

/// Forgets which context cuda-rt made current on this thread; the next
/// [`make_current`] asks the driver again.
pub fn forget_current() {
    forget_context();
}

/// Free and total memory of the current context's device (`cuMemGetInfo`).
pub fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out pointers.
    drv!(cuMemGetInfo_v2(&mut free, &mut total))?;
    Ok((free, total))
}

/// Blocks until the current context's work is done (`cuCtxSynchronize`).
pub fn synchronize() -> Result<()> {
    // SAFETY: no pointers involved.
    drv!(cuCtxSynchronize())
}

/// The current context's stream priority range as `(least, greatest)`; greater
/// priority is a lower number (`cuCtxGetStreamPriorityRange`).
pub fn stream_priority_range() -> Result<(i32, i32)> {
    let (mut least, mut greatest) = (0, 0);
    // SAFETY: both are valid out pointers.
    drv!(cuCtxGetStreamPriorityRange(&mut least, &mut greatest))?;
    Ok((least, greatest))
}

/// Whether device `dev` can access memory of device `peer` (`cuDeviceCanAccessPeer`).
pub fn can_access_peer(dev: sys::CUdevice, peer: sys::CUdevice) -> Result<bool> {
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer; the devices come from cuDeviceGet.
    drv!(cuDeviceCanAccessPeer(&mut v, dev, peer))?;
    Ok(v != 0)
}
