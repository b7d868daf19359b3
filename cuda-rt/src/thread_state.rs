//! Every piece of per-thread state cuda-rt keeps for CUDA's per-thread notions, in one
//! place, each with a name that says what it is:
//!
//! - [`selected_device`]: the thread's current device as the user sees it (CuPy's
//!   per-thread device, 0 until set). `device` reads and sets it.
//! - the context cache: the context cuda-rt last made current on this thread and the
//!   device whose primary context that is, so the hot paths skip `cuCtxSetCurrent`
//!   when it is current already. `device::context` reads and sets it; code outside
//!   cuda-rt that changes the context calls
//!   [`forget_current_context`](crate::device::forget_current_context).
//! - the current stream of each device: its raw handle (what the hot paths read) and
//!   what keeps it alive while it is current. `stream` reads and sets them.
//!
//! Each cache of objects kept per thread for speed (the recycled memory objects, the
//! event cache, the pool's remembered arena, the library handles, the allocator
//! scopes) lives beside the type it caches; this module holds the state that says
//! what is *current*.
//!
//! The stream keep-alive is type-erased (`Arc<dyn Any>`), so this module needs nothing
//! from the modules above it.

use std::any::Any;
use std::cell::Cell;
use std::sync::Arc;

/// Most devices a process can address through cuda-rt.
pub const MAX_DEVICES: usize = 64;

/// The legacy default stream's handle, what a device's current stream is until set.
const LEGACY_DEFAULT: usize = 0;

/// What keeps a current stream alive (an `Arc` of the stream's owned part).
pub(crate) type StreamKeep = Arc<dyn Any + Send + Sync>;

thread_local! {
    /// The thread's current device id, as the user selected it.
    static SELECTED_DEVICE: Cell<i32> = const { Cell::new(0) };
    /// The context cuda-rt last made current on this thread (0: unknown).
    static CONTEXT_MADE_CURRENT: Cell<usize> = const { Cell::new(0) };
    /// The device whose primary context cuda-rt last made (or found) current on this
    /// thread (-1: none known).
    static CONTEXT_DEVICE: Cell<i32> = const { Cell::new(-1) };
    /// The current stream's handle per device. No destructor, so it stays readable
    /// during thread exit.
    static CURRENT_STREAM_HANDLES: [Cell<usize>; MAX_DEVICES] =
        const { [const { Cell::new(LEGACY_DEFAULT) }; MAX_DEVICES] };
    /// What keeps each current stream alive while it is current here.
    static CURRENT_STREAM_KEEP: StreamKeeps =
        const { StreamKeeps([const { Cell::new(None) }; MAX_DEVICES]) };
}

struct StreamKeeps([Cell<Option<StreamKeep>>; MAX_DEVICES]);

impl Drop for StreamKeeps {
    fn drop(&mut self) {
        // The thread is ending: its streams go back to the default first, so nothing
        // run later in this thread's teardown reads a handle released here.
        let _ = CURRENT_STREAM_HANDLES.try_with(|c| c.iter().for_each(|h| h.set(LEGACY_DEFAULT)));
    }
}

// ---- the selected device ----

/// The thread's current device id (0 until set).
#[inline]
pub(crate) fn selected_device() -> i32 {
    SELECTED_DEVICE.try_with(Cell::get).unwrap_or(0)
}

/// Sets the thread's current device id (validated by the caller).
#[inline]
pub(crate) fn select_device(id: i32) {
    let _ = SELECTED_DEVICE.try_with(|c| c.set(id));
}

// ---- the context cache ----

/// The device whose primary context cuda-rt knows to be current here (-1: none).
#[inline]
pub(crate) fn context_device() -> i32 {
    CONTEXT_DEVICE.try_with(Cell::get).unwrap_or(-1)
}

/// Notes that device `id`'s primary context is current here (-1: unknown).
#[inline]
pub(crate) fn set_context_device(id: i32) {
    let _ = CONTEXT_DEVICE.try_with(|d| d.set(id));
}

/// The context cuda-rt last made current here, as an address (0: unknown).
#[inline]
pub(crate) fn context_made_current() -> usize {
    CONTEXT_MADE_CURRENT.try_with(Cell::get).unwrap_or(0)
}

/// Notes the context cuda-rt made current here.
#[inline]
pub(crate) fn set_context_made_current(ctx: usize) {
    let _ = CONTEXT_MADE_CURRENT.try_with(|c| c.set(ctx));
}

/// Forgets the whole context cache: the next use asks the driver.
pub(crate) fn forget_context() {
    set_context_made_current(0);
    set_context_device(-1);
}

// ---- current streams ----

/// The current stream handle of the device at `idx` (< [`MAX_DEVICES`]); the legacy
/// default stream's during thread exit.
#[inline]
pub(crate) fn current_stream_handle(idx: usize) -> usize {
    CURRENT_STREAM_HANDLES
        .try_with(|c| c[idx].get())
        .unwrap_or(LEGACY_DEFAULT)
}

/// A clone of what keeps the current stream of the device at `idx` alive, if anything.
pub(crate) fn current_stream_keep(idx: usize) -> Option<StreamKeep> {
    CURRENT_STREAM_KEEP
        .try_with(|k| {
            let held = k.0[idx].take();
            let copy = held.clone();
            k.0[idx].set(held);
            copy
        })
        .ok()
        .flatten()
}

/// Makes `handle` (kept alive by `keep`) the current stream of the device at `idx`,
/// returning the previous handle and keep-alive; `None` during thread exit.
pub(crate) fn replace_current_stream(
    idx: usize,
    handle: usize,
    keep: Option<StreamKeep>,
) -> Option<(usize, Option<StreamKeep>)> {
    let prev_keep = CURRENT_STREAM_KEEP
        .try_with(|k| k.0[idx].replace(keep))
        .ok()?;
    let prev = CURRENT_STREAM_HANDLES
        .try_with(|c| c[idx].replace(handle))
        .ok()?;
    Some((prev, prev_keep))
}
