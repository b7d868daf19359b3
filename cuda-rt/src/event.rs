//! Events: markers recorded in a stream, for synchronisation and timing.
//!
//! `Event::new(block, disable_timing, interprocess)` follows CuPy. Creating an event is
//! cheap: a dropped event's handle goes to a small free list of the dropping thread,
//! keyed by device and flags, and the next event with the same flags on that thread
//! takes it back without a driver call. The list is bounded; events beyond it, and
//! interprocess events, are destroyed. What is left in a thread's list is destroyed
//! when the thread exits.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, Ordering};

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result, StateKind};
use crate::stream::{context_for, get_current_stream, AsStream};

bitflags::bitflags! {
    /// How an event behaves (`CU_EVENT_*`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct EventFlags: u32 {
        /// `synchronize` blocks the thread instead of spinning (`CU_EVENT_BLOCKING_SYNC`).
        const BLOCKING_SYNC = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC.0;
        /// The event records no time, which makes it cheaper
        /// (`CU_EVENT_DISABLE_TIMING`).
        const DISABLE_TIMING = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
        /// The event can be shared with another process; requires `DISABLE_TIMING`
        /// (`CU_EVENT_INTERPROCESS`).
        const INTERPROCESS = sys::CUevent_flags::CU_EVENT_INTERPROCESS.0;
    }
}

/// Most released events a thread keeps for reuse (all devices and flags together).
pub const EVENT_CACHE_CAPACITY: usize = 64;

/// How many (device, flags) pairs a thread's cache holds handles of at once.
const CACHE_KEYS: usize = 4;
/// Most handles a thread keeps per (device, flags) pair: all of them, so one pair
/// alone can fill the cache.
const PER_KEY: usize = EVENT_CACHE_CAPACITY;

/// A released event handle waiting for reuse.
#[derive(Clone, Copy)]
struct Cached {
    device: i32,
    flags: u32,
    handle: usize,
}

/// The handles of one (device, flags) pair: a stack of `len` handles (a slot with
/// none is free for any pair).
struct Slot {
    device: Cell<i32>,
    flags: Cell<u32>,
    len: Cell<usize>,
    handles: [Cell<usize>; PER_KEY],
}

/// One thread's free lists of event handles: a few fixed stacks of plain cells, so
/// taking and giving back are a short scan and a few loads and stores, with no
/// borrow flag, no allocation and no destructor check. The handles left at thread
/// exit are destroyed by [`CacheGuard`], armed when the first handle is kept.
struct EventCache {
    slots: [Slot; CACHE_KEYS],
    /// The handles kept, all slots together (at most [`EVENT_CACHE_CAPACITY`]).
    total: Cell<usize>,
    /// [`UNARMED`], [`ARMED`] or [`EXITING`].
    state: Cell<u8>,
}

/// No handle kept yet: the exit guard is not registered.
const UNARMED: u8 = 0;
/// The exit guard is registered.
const ARMED: u8 = 1;
/// The thread is exiting: nothing more is kept.
const EXITING: u8 = 2;

impl EventCache {
    const fn new() -> EventCache {
        EventCache {
            slots: [const {
                Slot {
                    device: Cell::new(0),
                    flags: Cell::new(0),
                    len: Cell::new(0),
                    handles: [const { Cell::new(0) }; PER_KEY],
                }
            }; CACHE_KEYS],
            total: Cell::new(0),
            state: Cell::new(UNARMED),
        }
    }

    #[inline]
    fn take(&self, device: i32, flags: u32) -> Option<usize> {
        for s in &self.slots {
            let n = s.len.get();
            if n != 0 && s.device.get() == device && s.flags.get() == flags {
                let h = s.handles.get(n - 1)?.get();
                s.len.set(n - 1);
                self.total.set(self.total.get().saturating_sub(1));
                return Some(h);
            }
        }
        None
    }

    /// Keeps `c` when there is room; otherwise hands it back to be destroyed.
    #[inline]
    fn give(&self, c: Cached) -> Option<Cached> {
        if self.state.get() != ARMED && !self.arm() {
            return Some(c);
        }
        let total = self.total.get();
        if total >= EVENT_CACHE_CAPACITY {
            return Some(c);
        }
        // A slot keeps its pair while empty, so the usual take-then-give cycle finds
        // its own slot first.
        let mut empty = None;
        for s in &self.slots {
            let n = s.len.get();
            if s.device.get() == c.device && s.flags.get() == c.flags {
                return match s.handles.get(n) {
                    Some(h) => {
                        h.set(c.handle);
                        s.len.set(n + 1);
                        self.total.set(total + 1);
                        None
                    }
                    None => Some(c),
                };
            }
            if n == 0 && empty.is_none() {
                empty = Some(s);
            }
        }
        let Some((s, h)) = empty.and_then(|s| Some((s, s.handles.first()?))) else {
            return Some(c);
        };
        s.device.set(c.device);
        s.flags.set(c.flags);
        h.set(c.handle);
        s.len.set(1);
        self.total.set(total + 1);
        None
    }

    /// Registers the exit guard on first use; `false` once the thread is exiting.
    #[cold]
    #[inline(never)]
    fn arm(&self) -> bool {
        if self.state.get() == EXITING {
            return false;
        }
        if GUARD.try_with(|_| ()).is_err() {
            self.state.set(EXITING);
            return false;
        }
        self.state.set(ARMED);
        true
    }

    #[cfg(any(test, feature = "test-util"))]
    fn len(&self) -> usize {
        self.total.get()
    }

    /// Empties the cache, handing each handle to `f`.
    fn drain(&self, mut f: impl FnMut(usize)) {
        self.total.set(0);
        for s in &self.slots {
            let n = s.len.replace(0);
            for h in s.handles.iter().take(n) {
                f(h.get());
            }
        }
    }
}

/// Destroys what is left in the thread's cache when the thread exits.
struct CacheGuard;

impl Drop for CacheGuard {
    fn drop(&mut self) {
        let _ = CACHE.try_with(|c| {
            c.state.set(EXITING);
            // At thread exit an error leaves nothing to do.
            c.drain(|h| {
                // SAFETY: a cached handle belongs to the cache alone (its event was
                // dropped or its fence gave it back), and draining empties the cache.
                let _ = unsafe { result::event::destroy(h as sys::CUevent) };
            });
        });
    }
}

thread_local! {
    static CACHE: EventCache = const { EventCache::new() };
    static GUARD: CacheGuard = const { CacheGuard };
}

/// How many released events this thread holds for reuse (test instrumentation,
/// feature `test-util`).
#[cfg(feature = "test-util")]
pub fn cached_event_count() -> usize {
    CACHE.try_with(EventCache::len).unwrap_or(0)
}

/// The 64 bytes that name an interprocess event to another process
/// (`CUipcEventHandle`). Send them by any means; [`Event::from_ipc_handle`] opens them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcEventHandle([u8; 64]);

impl IpcEventHandle {
    /// The handle's bytes.
    pub fn as_bytes(&self) -> &[u8; 64] {
        &self.0
    }

    /// A handle from bytes another process got from [`Event::ipc_handle`].
    pub fn from_bytes(bytes: [u8; 64]) -> Self {
        IpcEventHandle(bytes)
    }
}

impl std::fmt::Debug for IpcEventHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcEventHandle(")?;
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// A CUDA event, owned: its handle goes back to the thread's cache (or is destroyed)
/// on drop.
///
/// Events order work across streams without the host waiting, and time it:
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::prelude::*;
/// use cuda_rt::{get_elapsed_time, DeviceBuffer, Event, Stream};
/// let (producer, consumer) = (Stream::non_blocking()?, Stream::non_blocking()?);
/// let mut a = DeviceBuffer::<f32>::empty(1 << 20)?;
/// let mut b = DeviceBuffer::<f32>::empty(1 << 20)?;
/// let start = Event::new(false, false, false)?; // spinning, timed, not interprocess
/// start.record_on(&producer)?;
/// a.fill_async(1.0, &producer)?;
/// let filled = producer.record(None)?; // a new event, after the fill
/// consumer.wait_event(&filled)?; // the consumer's later work waits on the device
/// b.copy_from_async(&a, &consumer)?;
/// let end = consumer.record(None)?;
/// end.synchronize()?; // the host waits here
/// println!("fill and copy: {:.3} ms", get_elapsed_time(&start, &end)?);
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Event {
    handle: usize,
    device: i32,
    flags: EventFlags,
    /// Whether the event was recorded since it was created (or opened by IPC).
    recorded: AtomicBool,
}

impl Event {
    /// CuPy's `Event(block, disable_timing, interprocess)` on the current device.
    /// `interprocess` requires `disable_timing` (an error otherwise, before any CUDA
    /// call).
    #[inline]
    pub fn new(block: bool, disable_timing: bool, interprocess: bool) -> Result<Event> {
        let mut flags = EventFlags::empty();
        flags.set(EventFlags::BLOCKING_SYNC, block);
        flags.set(EventFlags::DISABLE_TIMING, disable_timing);
        flags.set(EventFlags::INTERPROCESS, interprocess);
        Event::with_flags(flags)
    }

    /// An event with `flags` on the current device.
    #[inline]
    pub fn with_flags(flags: EventFlags) -> Result<Event> {
        Event::on_device(get_device_id(), flags)
    }

    /// An event with `flags` on `device`.
    #[inline]
    pub fn on_device(device: i32, flags: EventFlags) -> Result<Event> {
        check_flags(flags)?;
        let cached = if flags.contains(EventFlags::INTERPROCESS) {
            None
        } else {
            CACHE
                .try_with(|c| c.take(device, flags.bits()))
                .ok()
                .flatten()
        };
        let handle = match cached {
            Some(h) => h,
            None => create_uncached(device, flags)?,
        };
        Ok(Event {
            handle,
            device,
            flags,
            recorded: AtomicBool::new(false),
        })
    }

    /// Opens an interprocess event that another process exported with
    /// [`ipc_handle`](Event::ipc_handle), in the current device's context. The event
    /// counts as recorded: its state is the other process's.
    pub fn from_ipc_handle(handle: &IpcEventHandle) -> Result<Event> {
        let device = get_device_id();
        make_current(device)?;
        let h = result::event::ipc_open_event_handle(handle.as_bytes())?;
        Ok(Event {
            handle: h as usize,
            device,
            flags: EventFlags::INTERPROCESS | EventFlags::DISABLE_TIMING,
            recorded: AtomicBool::new(true),
        })
    }

    /// Takes ownership of an event created elsewhere (it is destroyed, or cached, on
    /// drop). It counts as recorded, since its history is unknown.
    ///
    /// # Safety
    /// `handle` must be a live event of `device`'s primary context, created with
    /// `flags`, that nobody else destroys.
    pub unsafe fn from_raw(handle: sys::CUevent, device: i32, flags: EventFlags) -> Event {
        Event {
            handle: handle as usize,
            device,
            flags,
            recorded: AtomicBool::new(true),
        }
    }

    /// Gives up ownership: the handle is returned and no longer destroyed on drop.
    pub fn into_raw(self) -> sys::CUevent {
        let h = self.handle as sys::CUevent;
        std::mem::forget(self);
        h
    }

    /// The raw `CUevent`.
    #[inline]
    pub fn as_raw(&self) -> sys::CUevent {
        self.handle as sys::CUevent
    }

    /// The handle as an integer (CuPy's `Event.ptr`).
    pub fn ptr(&self) -> usize {
        self.handle
    }

    /// The device the event belongs to.
    pub fn device_id(&self) -> i32 {
        self.device
    }

    /// The event's flags.
    pub fn flags(&self) -> EventFlags {
        self.flags
    }

    /// Whether the event was recorded since it was created.
    pub fn is_recorded(&self) -> bool {
        self.recorded.load(Ordering::Relaxed)
    }

    /// Marks the event as recorded without a driver call (a graph's event-record node
    /// will record it when the graph runs, so waits on it must not be skipped).
    pub(crate) fn mark_recorded(&self) {
        self.recorded.store(true, Ordering::Relaxed);
    }

    /// Records the event on this thread's current stream of the event's device.
    pub fn record(&self) -> Result<()> {
        let s = crate::stream::current_stream_unretained(self.device);
        self.record_on(&s)
    }

    /// Records the event on `stream`, which must belong to the event's device.
    #[inline]
    pub fn record_on<S: AsStream + ?Sized>(&self, stream: &S) -> Result<()> {
        let dev = stream.device_id();
        if dev != self.device {
            return Err(Error::invalid_argument(
                ArgumentKind::WrongDevice {
                    expected: self.device,
                    found: dev,
                },
                format!(
                    "an event of device {} cannot be recorded on a stream of device {dev}",
                    self.device
                ),
            ));
        }
        let s = stream.as_raw();
        if s as usize == crate::stream::LEGACY_DEFAULT_HANDLE
            || s as usize == crate::stream::PER_THREAD_DEFAULT_HANDLE
        {
            make_current(dev)?;
        }
        // SAFETY: the event is live while `self` is; the stream is live while `stream`
        // is borrowed (`AsStream`), of the event's device (checked above), and a
        // default stream's context was made current above.
        unsafe { result::event::record(self.as_raw(), s) }?;
        self.recorded.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Blocks until the event's last record has completed (at once if never recorded).
    pub fn synchronize(&self) -> Result<()> {
        if !self.is_recorded() {
            return Ok(());
        }
        // SAFETY: the event is live while `self` is.
        unsafe { result::event::synchronize(self.as_raw()) }
            .map_err(|e| crate::error::explain_capture(e.into(), "Event::synchronize"))
    }

    /// `true` when the event's last record has completed (or it was never recorded),
    /// `false` while work before it is pending.
    #[inline]
    pub fn query(&self) -> Result<bool> {
        if !self.is_recorded() {
            return Ok(true);
        }
        // SAFETY: the event is live while `self` is.
        Ok(unsafe { result::event::query(self.as_raw()) }?)
    }

    /// CuPy's `Event.done`: the same as [`query`](Event::query).
    pub fn done(&self) -> Result<bool> {
        self.query()
    }

    /// The work before the event's last record, as a
    /// [`Future`](std::future::Future) that any executor can await: `Ok(())` once it is
    /// done (at once if it is done already, or the event was never recorded), or the
    /// driver's error if it failed. A driver callback wakes the task (no polling; see
    /// [`stream::completion`](crate::stream::completion)).
    ///
    /// The record is the one made before this call: recording the event again later
    /// changes nothing for this future, and the event may be dropped before the future
    /// completes. Nothing waits on the stream that recorded it: a stream of the
    /// completion's own waits for the event and calls back, so the recording stream
    /// goes on at full speed (the cost is a stream made and destroyed, some
    /// microseconds, when the work is still running).
    ///
    /// An error (resolved at the first poll) when the event was recorded in a graph
    /// capture, or inside a host function.
    ///
    /// ```no_run
    /// # async fn demo() -> cuda_rt::Result<()> {
    /// use cuda_rt::prelude::*;
    /// use cuda_rt::{DeviceBuffer, Stream};
    /// let stream = Stream::non_blocking()?;
    /// let mut buf = DeviceBuffer::<f32>::empty(1 << 24)?;
    /// buf.fill_async(2.0, &stream)?;
    /// let filled = stream.record(None)?;
    /// buf.fill_async(3.0, &stream)?; // queued at once, not held by the await below
    /// filled.completion().await?;
    /// # Ok(()) }
    /// ```
    pub fn completion(&self) -> crate::stream::Completion {
        if !self.is_recorded() {
            return crate::stream::Completion::known(Ok(()));
        }
        // SAFETY: the event is live while `self` is borrowed, and the call returns
        // before the borrow ends.
        unsafe { crate::stream::completion::after_event(self.as_raw(), self.device) }
    }

    /// Milliseconds from this event to `end` (both recorded, both with timing, and
    /// `end` completed); see [`get_elapsed_time`].
    pub fn elapsed_time(&self, end: &Event) -> Result<f32> {
        get_elapsed_time(self, end)
    }

    /// The handle another process opens this event with; the event must be
    /// interprocess. From then on the event counts as recorded here, since the other
    /// process may record it: [`synchronize`](Event::synchronize) and waits ask the
    /// driver.
    pub fn ipc_handle(&self) -> Result<IpcEventHandle> {
        if !self.flags.contains(EventFlags::INTERPROCESS) {
            return Err(Error::invalid_argument(
                ArgumentKind::Incompatible,
                "ipc_handle needs an interprocess event: create it with \
                 Event::new(_, true, true)",
            ));
        }
        // SAFETY: the event is live while `self` is.
        let h = IpcEventHandle(unsafe { result::event::ipc_get_event_handle(self.as_raw()) }?);
        // Once exported, another process may record it: waits and queries must ask the
        // driver from now on (an event never recorded anywhere is complete to the
        // driver too).
        self.mark_recorded();
        Ok(h)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        let c = Cached {
            device: self.device,
            flags: self.flags.bits(),
            handle: self.handle,
        };
        let left = if self.flags.contains(EventFlags::INTERPROCESS) {
            Some(c)
        } else {
            CACHE.try_with(|cache| cache.give(c)).unwrap_or(Some(c))
        };
        if let Some(c) = left {
            destroy_uncached(c.handle);
        }
    }
}

/// A raw event handle of `device` with `flags`, from this thread's cache or new: what
/// the pinned copies' in-flight fences record. Give it back with [`give_raw`].
pub(crate) fn take_raw(device: i32, flags: EventFlags) -> Result<usize> {
    match CACHE
        .try_with(|c| c.take(device, flags.bits()))
        .ok()
        .flatten()
    {
        Some(h) => Ok(h),
        None => create_uncached(device, flags),
    }
}

/// Gives a handle from [`take_raw`] back to this thread's cache (or destroys it when
/// the cache is full or the thread is exiting).
pub(crate) fn give_raw(device: i32, flags: EventFlags, handle: usize) {
    let c = Cached {
        device,
        flags: flags.bits(),
        handle,
    };
    if let Some(c) = CACHE.try_with(|cache| cache.give(c)).unwrap_or(Some(c)) {
        destroy_uncached(c.handle);
    }
}

/// Creates a handle when the cache has none.
#[cold]
#[inline(never)]
fn create_uncached(device: i32, flags: EventFlags) -> Result<usize> {
    make_current(device)?;
    Ok(result::event::create(flags.bits())? as usize)
}

/// Destroys a handle the cache did not keep.
#[cold]
#[inline(never)]
fn destroy_uncached(handle: usize) {
    // Inside a host function the driver may not be called: the handle is kept
    // (leaked), as memory dropped there is (docs/soundness.md, "Host functions").
    if result::stream::in_host_function() {
        return;
    }
    // An error here (a context torn down at exit) leaves nothing to clean up.
    // SAFETY: the callers hand over a handle nothing holds any more (its `Event`
    // dropped, or its fence gave it back) and that the cache did not keep: destroyed
    // once, here.
    let _ = unsafe { result::event::destroy(handle as sys::CUevent) };
}

#[inline]
fn check_flags(flags: EventFlags) -> Result<()> {
    if flags.contains(EventFlags::INTERPROCESS) && !flags.contains(EventFlags::DISABLE_TIMING) {
        return Err(Error::invalid_argument(
            ArgumentKind::Incompatible,
            "an interprocess event must have timing disabled: \
             Event::new(block, disable_timing = true, interprocess = true)",
        ));
    }
    Ok(())
}

/// Milliseconds between `start` and `end` (CuPy's `get_elapsed_time`). A clear error
/// when either event has timing disabled or was never recorded, when they belong to
/// different devices, and when `end` has not completed yet (synchronize it first).
pub fn get_elapsed_time(start: &Event, end: &Event) -> Result<f32> {
    for (which, ev) in [("start", start), ("end", end)] {
        if ev.flags.contains(EventFlags::DISABLE_TIMING) {
            return Err(Error::invalid_argument(
                ArgumentKind::Incompatible,
                format!(
                    "elapsed time: the {which} event was created with timing disabled \
                     (disable_timing = true)"
                ),
            ));
        }
        if !ev.is_recorded() {
            return Err(Error::invalid_state(
                StateKind::NotRecorded,
                format!("elapsed time: the {which} event was never recorded"),
            ));
        }
    }
    if start.device != end.device {
        return Err(Error::invalid_argument(
            ArgumentKind::WrongDevice {
                expected: start.device,
                found: end.device,
            },
            format!(
                "elapsed time: the start event is of device {} and the end event of device {}",
                start.device, end.device
            ),
        ));
    }
    // SAFETY: both events are live while borrowed, and of the same device (checked
    // above).
    match unsafe { result::event::elapsed_time(start.as_raw(), end.as_raw()) }.map_err(Error::from)
    {
        Err(e) if e.driver_code() == Some(sys::CUresult::CUDA_ERROR_NOT_READY) => {
            Err(Error::invalid_state(
                StateKind::NotReady,
                format!(
                    "elapsed time: an event has not completed yet; call end.synchronize() \
                     first ({e})"
                ),
            ))
        }
        r => r,
    }
}

/// A stream's event operations: record an event on it, make it wait for one (CuPy's
/// `Stream.record` and `Stream.wait_event`).
///
/// Implemented for every [`AsStream`] (owned, borrowed and foreign streams); nothing
/// else can implement it. It is a trait of its own, defined here rather than in
/// [`AsStream`], because it takes an [`Event`]: streams sit below events. Bring it in
/// scope with [`crate::prelude`] (`use cuda_rt::prelude::*;`) or by name.
pub trait StreamEventExt: AsStream {
    /// Records `event` on this stream, or a new event (blocking, with timing, as
    /// CuPy's `Event()`) when `None`, and returns it. The event must belong to the
    /// stream's device.
    fn record(&self, event: Option<Event>) -> Result<Event> {
        let ev = match event {
            Some(ev) => ev,
            None => Event::on_device(self.device_id(), EventFlags::BLOCKING_SYNC)?,
        };
        ev.record_on(self)?;
        Ok(ev)
    }

    /// Makes work queued on this stream after this call wait until `event`'s last
    /// record has completed. An event never recorded is complete: nothing waits.
    fn wait_event(&self, event: &Event) -> Result<()> {
        if !event.is_recorded() {
            return Ok(());
        }
        context_for(self)?;
        if crate::capture::any_capture_active() {
            // The wait may fork this stream into a capture: noted with a fence.
            // SAFETY: the event is live while `event` is borrowed; the stream's
            // context is current (`context_for`).
            return unsafe { crate::capture::wait_event_forking(self, event.as_raw()) };
        }
        // SAFETY: the stream is live while `self` is borrowed (an `AsStream` keeps it
        // alive, see `crate::stream`), and its context is current (`context_for`).
        // The event is live while `event` is borrowed (an `Event` destroys it on drop).
        Ok(unsafe { result::stream::wait_event(self.as_raw(), event.as_raw()) }?)
    }
}

impl<S: AsStream + ?Sized> StreamEventExt for S {}

/// Records a new event (with timing) on this thread's current stream, as CuPy's
/// `Stream.record()` with no event does.
pub fn record_now() -> Result<Event> {
    get_current_stream().record(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interprocess_without_disable_timing_is_refused_before_any_cuda_call() {
        let e = Event::new(false, false, true).unwrap_err();
        assert!(
            e.to_string()
                .contains("interprocess event must have timing disabled"),
            "{e}"
        );
    }

    #[test]
    fn event_cache_is_keyed_by_device_and_flags_and_bounded() {
        let c = EventCache::new();
        // Armed by hand: the fake handles must not reach the exit guard.
        c.state.set(ARMED);
        let cached = |device, flags, handle| Cached {
            device,
            flags,
            handle,
        };
        assert!(c.give(cached(0, 1, 10)).is_none());
        assert!(c.give(cached(1, 1, 11)).is_none());
        assert_eq!(c.take(0, 2), None, "other flags");
        assert_eq!(c.take(1, 1), Some(11));
        assert_eq!(c.take(1, 1), None);
        assert_eq!(c.take(0, 1), Some(10));
        assert_eq!(c.len(), 0);
        for i in 0..EVENT_CACHE_CAPACITY - 3 {
            assert!(c.give(cached(0, 0, 100 + i)).is_none());
        }
        let last = 100 + EVENT_CACHE_CAPACITY - 4;
        assert_eq!(c.take(0, 0), Some(last), "last in, first out");
        for k in 1..CACHE_KEYS as u32 {
            assert!(c.give(cached(0, k, 200)).is_none());
        }
        let other = c.give(cached(1, 0, 2));
        let other = other.map(|c| c.handle);
        assert_eq!(other, Some(2), "no slot free: handed back");
        assert_eq!(c.len(), EVENT_CACHE_CAPACITY - 1);
        assert!(
            c.give(cached(0, 0, 3)).is_none(),
            "one pair fills the cache"
        );
        assert_eq!(c.len(), EVENT_CACHE_CAPACITY);
        let over = c.give(cached(0, 0, 1));
        assert_eq!(over.map(|c| c.handle), Some(1), "full: handed back");
        // Handles are fake: drop them without destroying.
        c.drain(|_| ());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn ipc_handle_debug_is_hex() {
        let mut b = [0u8; 64];
        b[0] = 0xab;
        let s = format!("{:?}", IpcEventHandle::from_bytes(b));
        assert!(s.starts_with("IpcEventHandle(ab00"), "{s}");
    }
}
