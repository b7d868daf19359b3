//! Streams: owned ([`Stream`]), borrowed ([`StreamRef`]), foreign ([`ExternalStream`]),
//! and the per-thread, per-device current stream.
//!
//! The current stream is per thread and per device, the legacy default stream until
//! set. [`AsStream::enter`] makes a stream current for a scope and restores what was
//! current on entry when the [`StreamScope`] drops (also after a
//! [`use_stream`](AsStream::use_stream) inside); `use_stream` sets it with no scope.
//! A stream of a device other than the thread's current device cannot be made current.
//!
//! The operations of a stream are on the [`AsStream`] trait (`synchronize`, `query`,
//! `completion`, `launch_host_func`, `add_callback`, `enter`, ...), so owned, borrowed and foreign
//! streams all have them. Those that take a higher module's types are on traits that
//! module defines for every `AsStream`: [`StreamEventExt`](crate::StreamEventExt)
//! (`record`, `wait_event`) and [`StreamCaptureExt`](crate::StreamCaptureExt)
//! (`begin_capture`, `end_capture`, ...). [`crate::prelude`] brings them all in scope.
//!
//! # Who keeps a stream alive
//! A [`Stream`] is reference counted, as CuPy's stream objects are: the driver's
//! stream is destroyed when the last of these goes: the `Stream`, every [`StreamRef`]
//! taken from it ([`AsStream::as_stream_ref`], [`get_current_stream`]), every thread
//! on which it is the current stream, and every [`MemoryAsync`](crate::memory::MemoryAsync)
//! allocated on it (which is freed on it). So no sequence of safe calls (a stream made
//! current on one thread and dropped on another, a forgotten [`StreamScope`], memory
//! freed after its stream object went) reaches the driver with a destroyed handle.
//! [`ExternalStream`] and [`StreamRef::from_raw`] wrap handles someone else owns: they
//! are `unsafe` to make, and their maker keeps the stream alive.
//!
//! [`AsStream`] is sealed: only this module's three stream types implement it, so the
//! raw handle it gives the driver is always one of theirs.

use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::{ArgumentKind, CaptureKind, DriverError, Error, Result, StateKind};
use crate::thread_state::{self, MAX_DEVICES};

pub mod completion;
pub(crate) mod retire;
pub use completion::Completion;

/// The legacy default stream's handle (CUDA's `0`).
pub const LEGACY_DEFAULT_HANDLE: usize = 0;
/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`, CUDA's `0x2`).
pub const PER_THREAD_DEFAULT_HANDLE: usize = 2;

/// Whether `handle` is one of the two default streams, which act in the context that
/// is current when they are used.
#[inline]
fn is_default_handle(handle: usize) -> bool {
    handle == LEGACY_DEFAULT_HANDLE || handle == PER_THREAD_DEFAULT_HANDLE
}

/// Makes the stream's device current when the stream is a default stream (whose
/// meaning depends on the current context); other streams carry their context.
#[inline]
pub(crate) fn context_for<S: AsStream + ?Sized>(s: &S) -> Result<()> {
    if is_default_handle(s.as_raw() as usize) {
        make_current(s.device_id())?;
    }
    Ok(())
}

/// Refuses host closures on a capturing stream: a captured host node may run once per
/// graph launch (or never), which a `FnOnce` closure cannot honour.
fn refuse_capture<S: AsStream + ?Sized>(s: &S, what: &str) -> Result<()> {
    // SAFETY: the stream is live while `s` is borrowed ("Who keeps a stream alive"
    // above).
    let status = unsafe { result::stream::is_capturing(s.as_raw()) }?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return Err(Error::capture(
            CaptureKind::Refused,
            format!(
                "{what} on stream {:#x} of device {}: the stream is capturing a graph, and a \
                 run-once Rust closure cannot become a graph node (it could run once per \
                 launch); use launch_host_func_repeatable, or end the capture first",
                s.as_raw() as usize,
                s.device_id()
            ),
        ));
    }
    Ok(())
}

mod sealed {
    /// Seals [`AsStream`](super::AsStream): the driver trusts the handle it gives.
    pub trait Sealed {}
    impl Sealed for super::Stream {}
    impl Sealed for super::StreamRef {}
    impl Sealed for super::ExternalStream {}
}

/// Anything that names a stream of a device, with the operations of a stream.
///
/// Sealed: implemented by [`Stream`], [`StreamRef`] and [`ExternalStream`] only, since
/// the driver trusts the raw handle it returns (a made-up handle would reach the
/// driver from safe code).
pub trait AsStream: sealed::Sealed {
    /// The raw `CUstream`.
    fn as_raw(&self) -> sys::CUstream;
    /// The device the stream belongs to.
    fn device_id(&self) -> i32;
    /// A shared reference to the stream, which keeps a [`Stream`] alive for as long
    /// as it (or a clone) lives.
    fn as_stream_ref(&self) -> StreamRef;

    /// The handle as an integer (CuPy's `Stream.ptr`; 0 and 2 for the default streams).
    fn ptr(&self) -> usize {
        self.as_raw() as usize
    }

    /// Blocks until all work queued on the stream is done. During a capture an
    /// [`Error::Capture`] (kind [`Invalidated`](crate::CaptureKind::Invalidated)) that
    /// says the capture is now invalid.
    fn synchronize(&self) -> Result<()> {
        context_for(self)?;
        // SAFETY: the stream is live while `self` is borrowed ("Who keeps a stream alive"
        // above), and its context is current (`context_for`).
        unsafe { result::stream::synchronize(self.as_raw()) }
            .map_err(|e| crate::error::explain_capture(e.into(), "synchronize"))
    }

    /// `true` when all work queued on the stream is done, `false` while some is
    /// pending (`cuStreamQuery`).
    fn query(&self) -> Result<bool> {
        context_for(self)?;
        // SAFETY: the stream is live while `self` is borrowed ("Who keeps a stream alive"
        // above), and its context is current (`context_for`).
        unsafe { result::stream::query(self.as_raw()) }
            .map_err(|e| crate::error::explain_capture(e.into(), "query"))
    }

    /// CuPy's `Stream.done`: the same as [`query`](AsStream::query).
    fn done(&self) -> Result<bool> {
        self.query()
    }

    /// The work queued on the stream so far, as a [`Future`](std::future::Future) that
    /// any executor can await: it resolves to `Ok(())` once that work is done, or to
    /// the driver's error if it failed. The task is woken by a stream callback the
    /// driver calls when the work is done (no polling; see [`completion`]).
    ///
    /// The callback is queued now, in stream order: work queued later on this stream
    /// waits for it (it only wakes a task, but the driver's round trip to the host
    /// thread is a pause of some microseconds). To await without that pause, record an
    /// event and await [`Event::completion`](crate::Event::completion) instead. The
    /// stream may be dropped before the work is done, and so may the future.
    ///
    /// An error (resolved at the first poll) when the stream is capturing a graph
    /// (captured work runs when the graph is launched: await the stream it is launched
    /// on), or inside a host function.
    ///
    /// ```no_run
    /// # async fn demo() -> cuda_rt::Result<()> {
    /// use cuda_rt::prelude::*;
    /// use cuda_rt::{DeviceBuffer, Stream};
    /// let stream = Stream::non_blocking()?;
    /// let mut buf = DeviceBuffer::<u8>::empty(1 << 30)?;
    /// buf.memset_async(0, &stream)?;
    /// let gpu = stream.completion(); // queued now, in stream order
    /// // ... other `.await`s here (a file read, a socket) run while the GPU works ...
    /// gpu.await?;
    /// # Ok(()) }
    /// ```
    fn completion(&self) -> Completion {
        // SAFETY: the stream is live while `self` is borrowed ("Who keeps a stream
        // alive" above), and the call returns before the borrow ends.
        unsafe { completion::after_stream(self.as_raw(), self.device_id()) }
    }

    /// Runs `f` on a driver thread once all work queued before it on this stream is
    /// done; work queued after it waits for it (`cuLaunchHostFunc`). `f` runs exactly
    /// once; a panic in it is caught (see [`host_func_panic_count`]) and never reaches
    /// the driver. CUDA forbids CUDA calls in `f`: a cuda-rt call made there (also by
    /// a drop) returns [`StateKind::InHostFunction`]
    /// instead of reaching the driver. An error when the stream is capturing a graph;
    /// then, and when the launch fails, `f` is dropped without running.
    fn launch_host_func<F>(&self, f: F) -> Result<()>
    where
        F: FnOnce() + Send + 'static,
        Self: Sized,
    {
        context_for(self)?;
        refuse_capture(self, "launch_host_func")?;
        // SAFETY: the stream is live while `self` is borrowed ("Who keeps a stream alive"
        // above), and its context is current (`context_for`).
        Ok(unsafe { result::stream::launch_host_func(self.as_raw(), f) }?)
    }

    /// CuPy's `Stream.add_callback`: runs `f` in stream order with the stream's status
    /// (`Err` when an earlier operation on the stream failed), exactly once, on a driver
    /// thread (`cuStreamAddCallback`). A panic is caught as in
    /// [`launch_host_func`](AsStream::launch_host_func), and so are cuda-rt calls in it.
    fn add_callback<F>(&self, f: F) -> Result<()>
    where
        F: FnOnce(std::result::Result<(), DriverError>) + Send + 'static,
        Self: Sized,
    {
        context_for(self)?;
        refuse_capture(self, "add_callback")?;
        // SAFETY: the stream is live while `self` is borrowed ("Who keeps a stream alive"
        // above), and its context is current (`context_for`).
        Ok(unsafe { result::stream::add_callback(self.as_raw(), f) }?)
    }

    /// Makes this the current stream of its device on this thread until the returned
    /// guard drops, which restores the stream current on entry (CuPy's `with stream:`).
    /// An error when the stream's device is not the thread's current device.
    fn enter(&self) -> Result<StreamScope<'_>> {
        let s = self.as_stream_ref();
        check_device(&s)?;
        let prev = set_current_stream(s)?;
        Ok(StreamScope {
            prev,
            _borrow: PhantomData,
        })
    }

    /// Makes this the current stream of its device on this thread, with no scope (CuPy's
    /// `Stream.use()`). The thread holds a reference to the stream while it is current,
    /// so dropping the [`Stream`] (on any thread) leaves it usable here until another
    /// stream is made current or the thread ends. An error when the stream's device is
    /// not the thread's current device.
    fn use_stream(&self) -> Result<()> {
        let s = self.as_stream_ref();
        check_device(&s)?;
        set_current_stream(s).map(|_| ())
    }
}

/// Waits for everything queued on `raw`, for a caller that lends the queued work
/// something it takes back on return (a borrowed host slice, a staging buffer, memory
/// whose last pointer may go next): an error must not mean "stop waiting" while the
/// work may still run. A wait the driver refuses because another thread's capture is
/// under way (a global-mode capture refuses waits on every thread) is retried until
/// that capture ends; any other error (a lost context, where no work runs any more;
/// this thread's own capture, which no wait here can outlast) is returned.
///
/// The stream itself capturing is not proof that the lent work went into a graph:
/// another thread may have begun its capture (through cuda-rt) after the caller
/// queued real work, which then still runs. That work was queued before the
/// capture's fence (an event `capture::begin` records on the stream just before the
/// capture begins, see `capture::fence_of`), so the fence is waited for instead of
/// the stream: the stream is not touched (a wait on it would invalidate the capture),
/// and the capturing thread need not end its capture first (it may be waiting for
/// this thread). A stream forked into a capture through cuda-rt (`wait_event` on an
/// event recorded in it) has a fence of its own, recorded just before the fork. Where
/// there is no fence (a fork made outside cuda-rt), the capture is waited out (the
/// refused wait invalidates it, and its thread ends it), and the refusal is returned
/// once the stream is idle: the work may or may not have been captured, so the
/// operation did not certainly happen. Only a capture this
/// thread began, or one cuda-rt did not begin (a raw `cuStreamBeginCapture`, whose
/// caller answers for it), is returned at once. A caller must not hold the capture
/// transition lock here (`capture::enqueue_using`): that capture's end would wait
/// for it.
///
/// The callers queue their work through `capture::enqueue_uncaptured`, which
/// refuses work a capture took: what they wait for here was queued outside any
/// capture, so work queued before a capture of the stream is all there is.
///
/// # Safety
/// `raw` is a live stream or a default-stream handle whose context is current.
pub(crate) unsafe fn drain(raw: sys::CUstream) -> Result<()> {
    let mut pause = std::time::Duration::from_micros(10);
    // The refusal of a capture on the stream itself that was waited out, returned
    // once the stream is idle.
    let mut outlasted: Option<Error> = None;
    loop {
        // SAFETY: `raw` is live (caller).
        let fence = unsafe { fence_of_capture(raw) };
        let waited = match &fence {
            // SAFETY: the fence's event is live while `fence` holds it, and was
            // recorded before the stream was in the capture: not captured work.
            Some(f) => unsafe { result::event::synchronize(f.as_raw()) },
            // SAFETY: `raw` is live (caller).
            None => unsafe { result::stream::synchronize(raw) },
        };
        let e = match waited {
            Ok(()) => return outlasted.map_or(Ok(()), Err),
            Err(e) => Error::from(e),
        };
        let refused_by_a_capture = e.driver_code().is_some_and(crate::error::is_capture_code);
        if !refused_by_a_capture || crate::capture::this_thread_captures() {
            return Err(e);
        }
        if fence.is_none() {
            // SAFETY: as above.
            let own = unsafe { result::stream::get_capture_info(raw) };
            if let Ok((st, id, _)) = own {
                if st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                    // The stream itself captures, with no fence. Work queued before
                    // another thread began that capture still runs on the stream and
                    // uses what the caller lent: wait until that thread ends the
                    // capture. This thread's own capture (or one cuda-rt does not
                    // know) cannot be waited out here.
                    if !crate::capture::begun_by_another_thread(raw as usize, id) {
                        return Err(e);
                    }
                    outlasted.get_or_insert(e);
                }
            }
        }
        // A fence's wait refused by another thread's global-mode capture, or the
        // stream's: retried until that capture ends.
        std::thread::sleep(pause);
        pause = (pause * 2).min(std::time::Duration::from_millis(1));
    }
}

/// The fence (`capture::fence_of`) to wait for instead of `raw` when `raw` is in a
/// capture that another thread began through cuda-rt: `None` (wait for the stream)
/// while no capture is under way (one relaxed load), when the stream does not
/// capture, or when its capture has no fence.
///
/// # Safety
/// As for [`drain`].
#[inline]
unsafe fn fence_of_capture(raw: sys::CUstream) -> Option<std::sync::Arc<crate::event::Event>> {
    if !crate::capture::any_capture_active() {
        return None;
    }
    // SAFETY: `raw` is live (caller).
    let (st, id, _) = unsafe { result::stream::get_capture_info(raw) }.ok()?;
    if st == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        return None;
    }
    crate::capture::fence_of(raw as usize, id)
}

fn check_device(s: &StreamRef) -> Result<()> {
    let cur = get_device_id();
    if s.device != cur {
        return Err(Error::invalid_state(
            StateKind::DeviceNotCurrent {
                device: s.device,
                current: cur,
            },
            format!(
                "stream {:#x} belongs to device {} but device {cur} is current on this thread; \
                 enter device {}'s scope first",
                s.handle, s.device, s.device
            ),
        ));
    }
    Ok(())
}

/// How many host functions or stream callbacks have panicked in this process (each
/// panic was caught; the default panic hook printed it).
pub fn host_func_panic_count() -> u64 {
    result::stream::host_fn_panic_count()
}

/// A shared reference to a stream: what [`get_current_stream`] and
/// [`AsStream::as_stream_ref`] return. A reference to a [`Stream`] keeps it alive (it
/// is destroyed when its last owner goes); the default streams need no keeping; one
/// made by [`StreamRef::from_raw`] relies on its maker. Cloning costs one atomic
/// increment for a `Stream`'s reference, nothing for the others. Compares and hashes
/// by handle and device.
#[derive(Debug, Clone)]
pub struct StreamRef {
    handle: usize,
    device: i32,
    /// The stream this refers to, kept alive; `None` for the default streams and for
    /// handles owned elsewhere.
    keep: Option<Arc<StreamInner>>,
}

impl PartialEq for StreamRef {
    fn eq(&self, other: &Self) -> bool {
        self.handle == other.handle && self.device == other.device
    }
}
impl Eq for StreamRef {}
impl Hash for StreamRef {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.handle.hash(state);
        self.device.hash(state);
    }
}

impl StreamRef {
    /// The legacy default stream of `device` (handle 0).
    pub const fn legacy_default(device: i32) -> Self {
        StreamRef {
            handle: LEGACY_DEFAULT_HANDLE,
            device,
            keep: None,
        }
    }

    /// The per-thread default stream of `device` (handle 2).
    pub const fn per_thread_default(device: i32) -> Self {
        StreamRef {
            handle: PER_THREAD_DEFAULT_HANDLE,
            device,
            keep: None,
        }
    }

    /// A reference to a raw handle of `device`, which it does not keep alive.
    ///
    /// # Safety
    /// `handle` must be a stream of `device` (or 0/2), alive for as long as this
    /// reference, or a clone of it, is used (also by memory allocated on it, or by a
    /// thread on which it is made current). A stream a pool allocated on through it
    /// must be destroyed only once the work queued on it is done: the pool keys its
    /// cache by stream handle, and the driver may give a destroyed stream's handle to
    /// the next stream at once, whose mallocs would take blocks freed onto the old
    /// one from under that work (cuda-rt keeps its own `Stream`s until then).
    pub unsafe fn from_raw(handle: sys::CUstream, device: i32) -> Self {
        StreamRef {
            handle: handle as usize,
            device,
            keep: None,
        }
    }

    /// A reference that does not keep its stream alive, for use inside one call while
    /// something else (the thread's current-stream slot, a borrowed owner) does.
    #[inline]
    fn unretained(handle: usize, device: i32) -> Self {
        StreamRef {
            handle,
            device,
            keep: None,
        }
    }

    /// The handle as an integer (0 and 2 for the default streams).
    pub const fn handle(&self) -> usize {
        self.handle
    }

    /// Whether this is the legacy or the per-thread default stream.
    pub const fn is_default(&self) -> bool {
        self.handle == LEGACY_DEFAULT_HANDLE || self.handle == PER_THREAD_DEFAULT_HANDLE
    }

    /// Whether this is the legacy default stream (handle 0).
    pub const fn is_legacy_default(&self) -> bool {
        self.handle == LEGACY_DEFAULT_HANDLE
    }

    /// Whether this is the per-thread default stream (handle 2).
    pub const fn is_per_thread_default(&self) -> bool {
        self.handle == PER_THREAD_DEFAULT_HANDLE
    }
}

impl AsStream for StreamRef {
    #[inline]
    fn as_raw(&self) -> sys::CUstream {
        self.handle as sys::CUstream
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.device
    }
    #[inline]
    fn as_stream_ref(&self) -> StreamRef {
        self.clone()
    }
}

/// A CUDA stream this library created (or took ownership of). It is destroyed when its
/// last owner goes: this value, the [`StreamRef`]s taken from it, the threads on which
/// it is current, and the stream-ordered memory allocated on it (see the module docs).
/// A stream the caching pool allocated on that still has work queued then is destroyed
/// once that work is done (its handle could otherwise go to the next stream created,
/// and the pool would lend that stream memory the old work still uses).
/// Compares and hashes by handle and device.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::prelude::*;
/// use cuda_rt::{DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?; // no implicit synchronization with stream 0
/// let mut buf = DeviceBuffer::<u32>::empty(1 << 20)?;
/// buf.fill_async(7, &stream)?; // queued on `stream`, returns at once
/// stream.synchronize()?;
/// {
///     let _scope = stream.enter()?; // current on this thread until the scope ends
///     assert_eq!(buf.to_vec()?[0], 7); // copied on `stream`
/// }
/// # Ok(()) }
/// ```
#[derive(Debug)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

/// The owned driver stream, shared by a [`Stream`] and the references that keep it.
#[derive(Debug)]
struct StreamInner {
    handle: usize,
    device: i32,
    non_blocking: bool,
    priority: i32,
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        // Inside a host function the driver may not be called: the handle is kept
        // (leaked), as memory dropped there is (docs/soundness.md, "Host functions").
        if result::stream::in_host_function() {
            return;
        }
        // Not always at once: a pool may hold blocks freed onto it (`retire`).
        retire::retire(self.handle);
    }
}

impl Stream {
    /// A new blocking stream with default priority on the current device.
    pub fn new() -> Result<Stream> {
        Self::with_options(false, 0)
    }

    /// A new non-blocking stream (it does not synchronise with the legacy default
    /// stream) with default priority on the current device.
    pub fn non_blocking() -> Result<Stream> {
        Self::with_options(true, 0)
    }

    /// A new stream on the current device; `non_blocking` does not synchronise with the
    /// legacy default stream; lower `priority` numbers run first (clamped by CUDA to the
    /// device's range, see [`Device::stream_priority_range`](crate::Device::stream_priority_range)).
    pub fn with_options(non_blocking: bool, priority: i32) -> Result<Stream> {
        let device = get_device_id();
        make_current(device)?;
        let flags = if non_blocking {
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0
        } else {
            sys::CUstream_flags::CU_STREAM_DEFAULT.0
        };
        // Streams kept for their work (`retire`) whose work is done go first.
        retire::destroy_finished();
        let s = result::stream::create_with_priority(flags, priority)?;
        // The priority the driver asked for is clamped to the device's range; read back
        // what it kept. When the stream is at default priority, 0 is what it kept.
        let actual = if priority == 0 {
            Ok(0)
        } else {
            // SAFETY: `s` was just created and is live.
            unsafe { result::stream::get_priority(s) }
        };
        let actual = match actual {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: `s` is ours, not handed out, destroyed once here.
                let _ = unsafe { result::stream::destroy(s) };
                return Err(e.into());
            }
        };
        Ok(Stream::wrap(s, device, non_blocking, actual))
    }

    fn wrap(handle: sys::CUstream, device: i32, non_blocking: bool, priority: i32) -> Stream {
        Stream {
            inner: Arc::new(StreamInner {
                handle: handle as usize,
                device,
                non_blocking,
                priority,
            }),
        }
    }

    /// The legacy default stream of the current device (CuPy's `Stream.null`).
    pub fn null() -> StreamRef {
        StreamRef::legacy_default(get_device_id())
    }

    /// The per-thread default stream of the current device (CuPy's `Stream.ptds`).
    pub fn per_thread() -> StreamRef {
        StreamRef::per_thread_default(get_device_id())
    }

    /// Takes ownership of a stream created elsewhere; it is destroyed when the
    /// returned value drops. Its flags and priority are read from the driver.
    ///
    /// # Safety
    /// `handle` must be a live stream of `device` (not a default stream) that nobody
    /// else destroys.
    pub unsafe fn from_raw(handle: sys::CUstream, device: i32) -> Result<Stream> {
        // SAFETY: `handle` is a live stream (this function's caller promises it).
        let flags = unsafe { result::stream::get_flags(handle) }?;
        // SAFETY: as above.
        let priority = unsafe { result::stream::get_priority(handle) }?;
        let non_blocking = flags & sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0;
        Ok(Stream::wrap(handle, device, non_blocking, priority))
    }

    /// Gives up ownership: the handle is returned and no longer destroyed. An
    /// [`Error::InvalidState`] while something else still holds the stream (a
    /// [`StreamRef`], a thread on which it is current, memory allocated on it); the
    /// stream then stays owned by those holders and is destroyed when they go.
    ///
    /// A stream the caching pool allocated on is first waited for (a host
    /// synchronisation): its new owner may destroy it at once, and the driver may
    /// give its handle to the next stream created, whose mallocs would then take
    /// blocks freed onto this one from under its queued work (what dropping a
    /// `Stream` avoids by keeping it until its work is done). A wait that fails (the
    /// stream is capturing, a lost context) is returned as the error, and the stream
    /// stays owned: destroyed once its work is done, as a drop does.
    pub fn into_raw(self) -> Result<sys::CUstream> {
        let handle = self.inner.handle;
        match Arc::try_unwrap(self.inner) {
            Ok(inner) => {
                if retire::pooled(handle) {
                    // SAFETY: an owned stream, alive (`inner` holds it) on its device,
                    // whose context `make_current` made current.
                    let drained = make_current(inner.device)
                        .and_then(|()| unsafe { drain(handle as sys::CUstream) });
                    if let Err(e) = drained {
                        // Dropped as an owner: kept until its work is done.
                        drop(inner);
                        return Err(e);
                    }
                }
                std::mem::forget(inner);
                Ok(handle as sys::CUstream)
            }
            Err(shared) => Err(Error::invalid_state(
                StateKind::Shared {
                    others: Arc::strong_count(&shared) - 1,
                },
                format!(
                    "stream {handle:#x} cannot be given up: {} other owners (references, \
                     threads where it is current, memory allocated on it) still hold it",
                    Arc::strong_count(&shared) - 1
                ),
            )),
        }
    }

    /// Whether the stream does not synchronise with the legacy default stream.
    pub fn is_non_blocking(&self) -> bool {
        self.inner.non_blocking
    }

    /// The stream's priority as CUDA clamped it.
    pub fn priority(&self) -> i32 {
        self.inner.priority
    }

    /// Blocks until all work queued on the stream is done (see
    /// [`AsStream::synchronize`]).
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the stream is owned, live while `self` is; it carries its context.
        unsafe { result::stream::synchronize(self.as_raw()) }
            .map_err(|e| crate::error::explain_capture(e.into(), "synchronize"))
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.inner.handle == other.inner.handle && self.inner.device == other.inner.device
    }
}
impl Eq for Stream {}
impl Hash for Stream {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // The same as the StreamRef of the stream, so both can share a map.
        self.inner.handle.hash(state);
        self.inner.device.hash(state);
    }
}
impl PartialEq<StreamRef> for Stream {
    fn eq(&self, other: &StreamRef) -> bool {
        self.inner.handle == other.handle && self.inner.device == other.device
    }
}
impl PartialEq<Stream> for StreamRef {
    fn eq(&self, other: &Stream) -> bool {
        other == self
    }
}

impl AsStream for Stream {
    #[inline]
    fn as_raw(&self) -> sys::CUstream {
        self.inner.handle as sys::CUstream
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.inner.device
    }
    #[inline]
    fn as_stream_ref(&self) -> StreamRef {
        StreamRef {
            handle: self.inner.handle,
            device: self.inner.device,
            keep: Some(Arc::clone(&self.inner)),
        }
    }
}

/// A stream someone else owns (another library, a user's raw handle): usable like any
/// stream, never destroyed by cuda-rt. Compares and hashes by handle and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ExternalStream {
    handle: usize,
    device: i32,
}

impl ExternalStream {
    /// Wraps `handle`, a stream of `device`.
    ///
    /// # Safety
    /// `handle` must be a live stream of `device` (or 0/2 for its default streams) and
    /// stay alive for as long as this value, or a copy of it, is used; a stream a pool
    /// allocated on through it is destroyed only once its queued work is done (see
    /// [`StreamRef::from_raw`]).
    pub unsafe fn from_raw(handle: sys::CUstream, device: i32) -> ExternalStream {
        ExternalStream {
            handle: handle as usize,
            device,
        }
    }

    /// The stream's priority, asked of the driver.
    pub fn priority(&self) -> Result<i32> {
        context_for(self)?;
        // SAFETY: `from_raw`'s caller promised the stream lives as long as `self` is
        // used; its context is current (`context_for`).
        Ok(unsafe { result::stream::get_priority(self.as_raw()) }?)
    }

    /// Whether the stream is non-blocking, asked of the driver.
    pub fn is_non_blocking(&self) -> Result<bool> {
        context_for(self)?;
        // SAFETY: as in `priority`.
        let f = unsafe { result::stream::get_flags(self.as_raw()) }?;
        Ok(f & sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0 != 0)
    }
}

impl AsStream for ExternalStream {
    #[inline]
    fn as_raw(&self) -> sys::CUstream {
        self.handle as sys::CUstream
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.device
    }
    #[inline]
    fn as_stream_ref(&self) -> StreamRef {
        // SAFETY: `from_raw`'s caller promised the handle lives as long as this value
        // and its copies are used, references included.
        unsafe { StreamRef::from_raw(self.as_raw(), self.device) }
    }
}

/// Restores, when dropped, the current stream of before [`AsStream::enter`]. It
/// borrows the stream; the thread's current-stream slot keeps the stream alive too,
/// so forgetting the scope (`mem::forget`) leaves a live stream current. Not `Send`:
/// the current stream is per thread.
#[derive(Debug)]
#[must_use = "the previous stream is restored when the scope guard drops"]
pub struct StreamScope<'a> {
    prev: StreamRef,
    _borrow: PhantomData<(&'a (), *const ())>,
}

impl StreamScope<'_> {
    /// The stream that was current on entry, and is restored on drop.
    pub fn previous(&self) -> &StreamRef {
        &self.prev
    }
}

impl Drop for StreamScope<'_> {
    fn drop(&mut self) {
        // The device id was validated on entry, so this cannot fail.
        let prev = std::mem::replace(&mut self.prev, StreamRef::legacy_default(0));
        let _ = set_current_stream(prev);
    }
}

/// This thread's current stream on the current device (the legacy default stream until
/// one is set), as a reference that keeps it alive. No driver call.
#[inline]
pub fn get_current_stream() -> StreamRef {
    current_stream_of(get_device_id())
}

/// This thread's current stream on `device`, as a reference that keeps it alive.
#[inline]
pub fn current_stream_of(device: i32) -> StreamRef {
    let Some(idx) = usize::try_from(device).ok().filter(|&d| d < MAX_DEVICES) else {
        return StreamRef::legacy_default(device);
    };
    let handle = thread_state::current_stream_handle(idx);
    if is_default_handle(handle) {
        return StreamRef::unretained(handle, device);
    }
    let keep = thread_state::current_stream_keep(idx).and_then(|k| k.downcast().ok());
    match keep {
        Some(inner) => StreamRef {
            handle,
            device,
            keep: Some(inner),
        },
        // Made current through a reference that keeps nothing (external or raw):
        // its maker keeps it alive.
        None => StreamRef::unretained(handle, device),
    }
}

/// The current stream of `device` for use within one call, without touching its
/// reference count: valid while the thread's current stream of `device` is not
/// changed (which only this thread can do), i.e. for the rest of a call that does
/// not change it. The hot paths (launch, record, the pool) use this.
#[inline]
pub(crate) fn current_stream_unretained(device: i32) -> StreamRef {
    let handle = usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .map_or(LEGACY_DEFAULT_HANDLE, thread_state::current_stream_handle);
    StreamRef::unretained(handle, device)
}

/// The raw handle of this thread's current stream of `device`, for keys and
/// comparisons (the pool's per-stream bins).
#[inline]
pub(crate) fn current_stream_handle(device: i32) -> usize {
    usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .map_or(LEGACY_DEFAULT_HANDLE, thread_state::current_stream_handle)
}

/// Sets this thread's current stream for the stream's device, returning the previous
/// one. The thread keeps `s` alive while it is current.
pub(crate) fn set_current_stream(s: StreamRef) -> Result<StreamRef> {
    let idx = usize::try_from(s.device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("device id {} is out of range", s.device),
            )
        })?;
    let device = s.device;
    let keep = s.keep.map(|k| k as thread_state::StreamKeep);
    let (prev, prev_keep) =
        thread_state::replace_current_stream(idx, s.handle, keep).ok_or_else(|| {
            Error::invalid_state(
                StateKind::ThreadExit,
                "the current stream was set during thread exit",
            )
        })?;
    Ok(StreamRef {
        handle: prev,
        device,
        keep: prev_keep.and_then(|k| k.downcast().ok()),
    })
}
