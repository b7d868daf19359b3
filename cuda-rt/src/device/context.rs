//! Primary contexts: retained once per device for the life of the process, and made
//! current on a thread only when it is not current already (a thread-local cache of the
//! context this library last made current saves the driver call).
//!
//! This is cuda-rt's policy over the checked calls of [`cuda_sys::result::context`]. If
//! code outside cuda-rt changes the thread's current context with the raw driver API,
//! it calls [`crate::device::forget_current_context`] (this module's
//! [`forget_current`]) afterwards so the cache is not trusted.

use std::sync::OnceLock;

use cuda_sys::driver::CUcontext;
use cuda_sys::result;

use crate::error::{ArgumentKind, Error, Result, StateKind};
pub(crate) use crate::thread_state::MAX_DEVICES;
use crate::thread_state::{
    context_device, context_made_current, forget_context, set_context_device,
    set_context_made_current,
};

/// `cuInit(0)`, once per process; later calls return the first outcome.
pub(crate) fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| Ok(result::init()?)).clone()
}

/// Retained primary contexts, as addresses (a `CUcontext` is not `Send`).
static PRIMARY: [OnceLock<Result<usize>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// Device `id`'s primary context, retained on first use and never released (CuPy does
/// the same: the context lives as long as the process).
pub(crate) fn primary(id: i32) -> Result<CUcontext> {
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
            init()?;
            let dev = result::device::get(id)?;
            Ok(result::context::primary_ctx_retain(dev)? as usize)
        })
        .clone()?;
    Ok(addr as CUcontext)
}

/// Makes device `id`'s primary context current on this thread, unless this library
/// already made it current here.
#[inline]
pub(crate) fn make_current(id: i32) -> Result<()> {
    // One thread-local load and compare when the device is already current (every
    // hot path calls this): no primary-context lookup, no driver call.
    if context_device() == id && id >= 0 {
        return Ok(());
    }
    make_current_slow(id)
}

#[cold]
fn make_current_slow(id: i32) -> Result<()> {
    // A driver thread running a host function never gets a context from cuda-rt (the
    // fast path above is never taken there), so every cuda-rt call that reaches the
    // driver passes here first and is refused, as CUDA requires.
    if result::stream::in_host_function() {
        return Err(Error::invalid_state(
            StateKind::InHostFunction,
            "a cuda-rt call from a host function, stream callback or graph host node: CUDA \
             forbids CUDA calls there (they may fail or deadlock); queue the work from \
             another thread, after the function has run",
        ));
    }
    let ctx = primary(id)?;
    if context_made_current() != ctx as usize {
        // Unknown until the call succeeds.
        set_context_device(-1);
        // SAFETY: `ctx` is a primary context retained above and never released, so it
        // is live for the rest of the process.
        unsafe { result::context::set_current(ctx) }?;
        set_context_made_current(ctx as usize);
    }
    set_context_device(id);
    Ok(())
}

/// Forgets which context cuda-rt made current on this thread; the next
/// [`make_current`] asks the driver again.
pub(crate) fn forget_current() {
    forget_context();
}
