//! Capture awareness: begin and end a capture, its status, and the process-wide
//! record of the captures cuda-rt began (what the allocation and free paths consult
//! while a capture is under way), with the state of each allocation made during a
//! capture ([`AllocState`]).
//!
//! It sits between `stream` and `memory`, so that both `memory` (which asks it on
//! every allocation and free) and `graph` (which makes a [`Graph`](crate::Graph) of
//! an ended capture, [`crate::StreamCaptureExt`]) can use it: it knows memory only as
//! [`Keepable`] objects and keep-alive handles (`Arc<dyn Any + Send + Sync>`), and
//! hands an ended capture's parts back as [`Ended`]. The errors of a capture in words
//! are [`explain_capture`](crate::error::explain_capture), in `error`.
//!
//! The record costs the allocation hot path one relaxed atomic load
//! ([`any_capture_active`]) while no capture is active; only when some capture is
//! active does [`alloc`](crate::memory::alloc) ask the driver whether the current
//! stream captures.
//!
//! Memory and captures. A capture's graph keeps alive exactly:
//! - memory that cuda-rt's own asynchronous operations (copies, memsets) enqueued on
//!   a stream of the capture read or write ([`note_use`]), whoever drops the last
//!   pointer and wherever;
//! - memory whose last pointer drops while it is under way on a thread that is in it
//!   (the current stream is in the capture, or the thread began it and has not ended
//!   it): a courtesy for kernels launched in the capture, whose pointers are the
//!   launcher's promise;
//! - its own allocations (memory nodes, see [`crate::memory::graph_memory`]).
//!
//! Kernels and captures. A capture's graph keeps loaded the module of every kernel
//! that cuda-rt's launches queued on a stream of the capture ([`launch_keeping`]),
//! whoever drops the last handle to the module: a graph node runs the module's code
//! at every launch of the graph.
//!
//! Any other memory whose last pointer drops while some capture is under way is freed
//! as usual: at once, or, while a capture in [`CaptureMode::Global`] is under way
//! (where CUDA refuses the driver calls a free may make on every thread), as soon as
//! no such capture is left. A capture that ends in error takes its allocations with
//! it: their blocks never existed outside the failed graph, so their drop frees
//! nothing.

use std::any::Any;
use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::ThreadId;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::{explain_capture, CaptureKind, Error, Result, StateKind};
use crate::event::{Event, EventFlags};
use crate::stream::{
    current_stream_of, get_current_stream, AsStream, StreamRef, LEGACY_DEFAULT_HANDLE,
    PER_THREAD_DEFAULT_HANDLE,
};

pub(crate) mod fork_join;

/// How a capture treats potentially unsafe CUDA calls (those that may synchronize
/// implicitly, such as `cuMemAlloc`) made while it is under way
/// (`CUstreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CaptureMode {
    /// Unsafe calls are refused on every thread while the capture is under way
    /// (CUDA's default).
    #[default]
    Global,
    /// Unsafe calls are refused on the thread that began the capture only.
    ThreadLocal,
    /// Unsafe calls are not refused (CuPy's choice; cuda-rt's own allocation during
    /// a capture no longer needs it, see [`crate::graph`]).
    Relaxed,
}

impl CaptureMode {
    fn as_raw(self) -> sys::CUstreamCaptureMode {
        match self {
            CaptureMode::Global => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => {
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
            }
            CaptureMode::Relaxed => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        }
    }
}

/// Where a stream stands with capturing (`cuStreamGetCaptureInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not capturing.
    None,
    /// Capturing; `id` is unique to this capture in the process (streams forked into
    /// the same capture report the same id).
    Active {
        /// The capture's id.
        id: u64,
    },
    /// Still in capture mode, but an operation not allowed during capture has
    /// invalidated it: [`end_capture`](crate::StreamCaptureExt::end_capture) will fail.
    Invalidated,
}

/// One capture begun through cuda-rt and not ended yet.
struct Entry {
    /// The origin stream's handle.
    stream: usize,
    device: i32,
    id: u64,
    mode: CaptureMode,
    /// The thread that began it.
    thread: ThreadId,
    /// Objects the graph refers to, kept for it: closures, memory its operations use,
    /// memory dropped on a thread in the capture, the modules of its kernels.
    keep: Vec<Arc<dyn Any + Send + Sync>>,
    /// The addresses of the objects in `keep` through [`note_use`] and
    /// [`launch_keeping`] (memory objects and modules, each kept once): distinct, since
    /// `keep` keeps each alive.
    used: HashSet<usize>,
    /// Allocations made during the capture (memory nodes).
    allocs: Vec<Arc<AllocState>>,
    /// The free nodes of its allocations captured on forked streams, as addresses
    /// (see [`fork_join`]).
    side_frees: Vec<fork_join::SideFree>,
    /// Whether memory in `keep` was noted by a use on a stream other than the origin
    /// (see [`Ended::forked_uses`]).
    forked_uses: bool,
    /// An event recorded on the origin stream just before the capture began (none on
    /// a default stream, or when it could not be made, see [`fence_before_capture`]):
    /// done once the work queued there before the capture is. Another thread waiting
    /// for such work (a synchronous copy queued before the capture) waits for it
    /// rather than for the stream, which refuses waits while it captures (see
    /// [`fence_of`]).
    fence: Option<Arc<Event>>,
    /// The fences of streams forked into the capture through cuda-rt (see
    /// [`wait_event_forking`]): the stream's handle, and an event recorded on it just
    /// before it joined.
    fork_fences: Vec<(usize, Arc<Event>)>,
}

impl Entry {
    /// Whether this is the capture begun on stream `handle` of `device` as this
    /// thread names it: the per-thread default stream has one handle on every thread
    /// but is a different stream on each, so its captures are told apart by thread.
    fn began_on(&self, handle: usize, device: i32) -> bool {
        self.stream == handle
            && self.device == device
            && (handle != PER_THREAD_DEFAULT_HANDLE || self.thread == std::thread::current().id())
    }

    /// Keeps the object at `identity` for the graph, once: `keep` makes the handle
    /// only the first time.
    fn keep_once(&mut self, identity: usize, keep: impl FnOnce() -> Arc<dyn Any + Send + Sync>) {
        if self.used.insert(identity) {
            self.keep.push(keep());
        }
    }

    /// Whether `ptr` is in one of the capture's own allocations.
    fn allocated(&self, ptr: u64) -> bool {
        self.allocs.iter().any(|a| a.contains(ptr))
    }

    /// The capture ended without a graph: its allocations died with it.
    fn abandon(self) {
        for a in &self.allocs {
            a.abandon();
        }
    }
}

/// The captures under way and the memory waiting for global-mode captures to end.
struct Captures {
    entries: Vec<Entry>,
    /// Memory dropped, unused by any capture, while a global-mode capture was under
    /// way: freed once none is left.
    deferred: Vec<Arc<dyn Any + Send + Sync>>,
}

impl Captures {
    /// The memory to free now that a capture ended: all that waited, once no
    /// global-mode capture is left.
    fn take_deferred(&mut self) -> Vec<Arc<dyn Any + Send + Sync>> {
        if self.entries.iter().any(|e| e.mode == CaptureMode::Global) {
            return Vec::new();
        }
        std::mem::take(&mut self.deferred)
    }
}

/// How many captures begun through cuda-rt are under way in the process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Held shared by every cuda-rt operation that enqueues work on memory, from before
/// the enqueue until its use is noted ([`enqueue_using`]), and exclusively by
/// [`begin`] and [`end`] around the driver's begin and end of a capture and the
/// update of the record: so an operation is either captured and noted in its
/// capture's record, or not captured at all, never captured unnoted.
static TRANSITION: RwLock<()> = RwLock::new(());
/// Those captures.
static CAPTURES: Mutex<Captures> = Mutex::new(Captures {
    entries: Vec::new(),
    deferred: Vec::new(),
});

fn captures() -> std::sync::MutexGuard<'static, Captures> {
    CAPTURES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether any capture begun through cuda-rt is under way (one relaxed atomic load:
/// what the allocation and free paths check first).
#[inline]
pub fn any_capture_active() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0
}

/// Whether this thread began a capture that is under way in a mode that refuses
/// waits on it (global or thread-local): a wait refused now is refused until this
/// thread ends it.
pub(crate) fn this_thread_captures() -> bool {
    if !any_capture_active() {
        return false;
    }
    let me = std::thread::current().id();
    captures()
        .entries
        .iter()
        .any(|e| e.thread == me && e.mode != CaptureMode::Relaxed)
}

/// An event recorded on `s` now, for [`Entry::fence`]: `None` on the default streams
/// (each thread names another per-thread default stream by the same handle, so no
/// other thread's wait can be for it; the legacy one never captures), or when the
/// event cannot be made or recorded (a global-mode capture elsewhere refusing the
/// creation): waits then outlast the capture, as `stream::drain` says.
fn fence_before_capture<S: AsStream + ?Sized>(s: &S) -> Option<Arc<Event>> {
    let raw = s.as_raw() as usize;
    // The legacy default stream never captures, and a record there would be an
    // implicit dependency of every blocking stream capturing meanwhile.
    if raw == PER_THREAD_DEFAULT_HANDLE || raw == LEGACY_DEFAULT_HANDLE {
        return None;
    }
    let ev = Event::on_device(s.device_id(), EventFlags::DISABLE_TIMING).ok()?;
    ev.record_on(s).ok()?;
    Some(Arc::new(ev))
}

/// The fence of the stream `raw` in capture `id` (see [`Entry::fence`] and
/// [`Entry::fork_fences`]) when another thread began that capture through cuda-rt:
/// work this thread queued on `raw` before `raw` was in the capture is done once the
/// fence is. `None` for any other capture (this thread's own, one begun outside
/// cuda-rt, one `raw` joined outside cuda-rt or with no fence).
pub(crate) fn fence_of(raw: usize, id: u64) -> Option<Arc<Event>> {
    if !any_capture_active() || raw == PER_THREAD_DEFAULT_HANDLE {
        return None;
    }
    let me = std::thread::current().id();
    let c = captures();
    let e = c.entries.iter().find(|e| e.thread != me && e.id == id)?;
    if e.stream == raw {
        return e.fence.clone();
    }
    e.fork_fences
        .iter()
        .find(|(h, _)| *h == raw)
        .map(|(_, f)| f.clone())
}

/// `StreamEventExt::wait_event` while some capture is under way: makes `s` wait for
/// `event` (`cuStreamWaitEvent`), which forks `s` into a capture when `event` was
/// recorded in one. Such a fork through cuda-rt gets a fence, as the capture's origin
/// has ([`Entry::fence`]): an event recorded on `s` just before the wait, kept in the
/// capture's record, which another thread's synchronous work queued on `s` before
/// the fork is waited through (see `stream::drain`).
///
/// All of it runs under the exclusive side of [`TRANSITION`], as a capture's begin:
/// an operation that may not be captured is queued either before the fence or after
/// the fork (and then refused, see [`enqueue_uncaptured`]). The caller made `s`'s
/// context current.
///
/// # Safety
/// `event` is a live event.
#[cold]
pub(crate) unsafe fn wait_event_forking<S: AsStream + ?Sized>(
    s: &S,
    event: sys::CUevent,
) -> Result<()> {
    let raw = s.as_raw();
    let _no_enqueue = TRANSITION.write().unwrap_or_else(|e| e.into_inner());
    let fence = match info(s) {
        Ok((CaptureStatus::None, _)) => fence_before_capture(s),
        _ => None,
    };
    // SAFETY: `s` is live while borrowed (`AsStream`), its context is current
    // (caller), and `event` is live (caller).
    unsafe { result::stream::wait_event(raw, event) }?;
    let Some(fence) = fence else {
        return Ok(());
    };
    if let Ok((CaptureStatus::Active { id }, _)) = info(s) {
        let mut c = captures();
        if let Some(e) = c
            .entries
            .iter_mut()
            .find(|e| e.id == id && e.device == s.device_id())
        {
            e.fork_fences.push((raw as usize, fence));
        }
    }
    Ok(())
}

/// Whether the capture that the stream `raw` is in (the driver's capture `id` for it,
/// 0 when unknown) is one that cuda-rt began on another thread: found by its id, or
/// as the capture begun on `raw` (not the per-thread default stream, whose handle
/// names another stream on each thread). A wait that such a capture refuses ends
/// when that thread ends it (see `stream::drain`).
pub(crate) fn begun_by_another_thread(raw: usize, id: u64) -> bool {
    if !any_capture_active() {
        return false;
    }
    let me = std::thread::current().id();
    captures().entries.iter().any(|e| {
        e.thread != me
            && ((id != 0 && e.id == id) || (raw != PER_THREAD_DEFAULT_HANDLE && e.stream == raw))
    })
}

/// The status of `s`'s capture, with the graph being captured (null unless active).
pub(crate) fn info<S: AsStream + ?Sized>(s: &S) -> Result<(CaptureStatus, sys::CUgraph)> {
    if s.as_raw() as usize == LEGACY_DEFAULT_HANDLE {
        // The legacy default stream never captures; asking may report an implicit
        // dependency error while another stream captures.
        return Ok((CaptureStatus::None, std::ptr::null_mut()));
    }
    make_current(s.device_id())?;
    // SAFETY: the stream is live while `s` is borrowed (`AsStream`); its context was
    // made current above.
    let (st, id, g) = unsafe { result::stream::get_capture_info(s.as_raw()) }
        .map_err(|e| explain_capture(e.into(), "cuStreamGetCaptureInfo"))?;
    let status = match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active { id },
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
            CaptureStatus::Invalidated
        }
        _ => CaptureStatus::None,
    };
    Ok((status, g))
}

/// Destroys a graph that a failed `cuStreamEndCapture` handed back, if there is one.
fn discard(g: sys::CUgraph) {
    if !g.is_null() {
        // SAFETY: a graph the driver handed to us with its error, owned by nobody
        // else, destroyed once here.
        let _ = unsafe { result::graph::destroy(g) };
    }
}

/// `StreamCaptureExt::begin_capture`.
pub(crate) fn begin<S: AsStream + ?Sized>(s: &S, mode: CaptureMode) -> Result<()> {
    let handle = s.as_raw() as usize;
    if handle == LEGACY_DEFAULT_HANDLE {
        return Err(Error::capture(
            CaptureKind::LegacyStream,
            format!(
                "begin_capture on the legacy default stream of device {}: CUDA cannot capture \
                 it (every other stream synchronizes with it); capture on a Stream you created \
                 (or the per-thread default stream)",
                s.device_id()
            ),
        ));
    }
    make_current(s.device_id())?;
    let _no_enqueue = TRANSITION.write().unwrap_or_else(|e| e.into_inner());
    // Recorded under the lock, after every enqueue that could not be captured: the
    // capture has not begun (were the stream capturing already, the begin below fails
    // and the fence goes with it).
    let fence = fence_before_capture(s);
    // SAFETY (the three calls below): the stream is live while `s` is borrowed
    // (`AsStream`), not the legacy default stream (refused above), and its context was
    // made current above.
    unsafe { result::stream::begin_capture(s.as_raw(), mode.as_raw()) }
        .map_err(|e| explain_capture(e.into(), "begin_capture"))?;
    let id = match unsafe { result::stream::get_capture_info(s.as_raw()) } {
        Ok((_, id, _)) => id,
        Err(e) => {
            let mut g = std::ptr::null_mut();
            let _ = unsafe { result::stream::end_capture(s.as_raw(), &mut g) };
            discard(g);
            return Err(e.into());
        }
    };
    let entry = Entry {
        stream: handle,
        device: s.device_id(),
        id,
        mode,
        thread: std::thread::current().id(),
        keep: Vec::new(),
        used: HashSet::new(),
        allocs: Vec::new(),
        side_frees: Vec::new(),
        forked_uses: false,
        fence,
        fork_fences: Vec::new(),
    };
    // A record left on this stream by a capture that ended outside cuda-rt is stale
    // (a stream is in one capture at most): its allocations died with that capture.
    let stale = take_entry(handle, s.device_id());
    captures().entries.push(entry);
    ACTIVE.fetch_add(1, Ordering::Relaxed);
    drop(_no_enqueue);
    finish(stale);
    Ok(())
}

impl Captures {
    /// Removes the record of the capture begun on `handle`, if cuda-rt began one
    /// there.
    fn take(&mut self, handle: usize, device: i32) -> Option<Entry> {
        let i = self
            .entries
            .iter()
            .position(|e| e.began_on(handle, device))?;
        let entry = self.entries.remove(i);
        ACTIVE.fetch_sub(1, Ordering::Relaxed);
        Some(entry)
    }
}

/// Removes the record of the capture begun on `handle`, if cuda-rt began one there.
fn take_entry(handle: usize, device: i32) -> Option<Entry> {
    captures().take(handle, device)
}

/// After a record was removed: a capture that left no graph (`abandoned`) takes its
/// allocations with it, and the memory deferred for global-mode captures is freed
/// once none is left. Runs outside the lock: freeing may call the allocator.
fn finish(abandoned: Option<Entry>) {
    if let Some(e) = abandoned {
        e.abandon();
    }
    let deferred = captures().take_deferred();
    drop(deferred);
}

/// What a capture that ended well leaves for its graph.
pub(crate) struct Ended {
    /// The captured graph (owned: the caller destroys it).
    pub(crate) raw: sys::CUgraph,
    /// What the graph must keep alive.
    pub(crate) keep: Vec<Arc<dyn Any + Send + Sync>>,
    /// The allocations made in the capture.
    pub(crate) allocs: Vec<Arc<AllocState>>,
    /// Whether some memory in `keep` was noted by a use on a stream forked into the
    /// capture rather than on its origin. Work queued there just before the stream
    /// joined may have been noted as the capture's (see [`enqueue_using`]): such
    /// memory is let go only once the whole context is idle, whereas the origin's
    /// uses are ordered by the capture's begin (under [`TRANSITION`]).
    pub(crate) forked_uses: bool,
}

impl Ended {
    /// Throws the captured graph away without instantiating it: its allocations never
    /// existed outside it, the graph is destroyed, and what it kept is let go (after
    /// the context is idle when a forked stream noted a use, as a graph's drop does).
    pub(crate) fn discard(self) {
        for a in &self.allocs {
            a.abandon();
        }
        discard(self.raw);
        if self.forked_uses && !self.keep.is_empty() {
            let _ = result::context::synchronize();
        }
        drop(self.keep);
    }
}

/// Ends the capture begun on `s` (`StreamCaptureExt::end_capture_with`, which makes
/// the graph of what this returns).
pub(crate) fn end<S: AsStream + ?Sized>(s: &S) -> Result<Ended> {
    let handle = s.as_raw() as usize;
    let (status, _) = info(s)?;
    if status == CaptureStatus::None {
        // A record left by a capture that ended some other way is stale: drop it.
        finish(take_entry(handle, s.device_id()));
        return Err(Error::capture(
            CaptureKind::NotCapturing,
            format!(
                "end_capture on stream {handle:#x} of device {}: the stream is not capturing \
                 (begin_capture it first; a stream forked into a capture is ended through \
                 the stream that began it)",
                s.device_id()
            ),
        ));
    }
    // The end and the removal of the record happen under the lock, so a thread that
    // frees a capture's allocation or notes a use of memory under it (see
    // `fork_join::free_in_capture`) sees the capture either under way or ended with its
    // record gone. The failed graph, if any, is destroyed after: its user objects'
    // destructors run outside the lock.
    let (ended, entry) = {
        let _no_enqueue = TRANSITION.write().unwrap_or_else(|e| e.into_inner());
        let mut c = captures();
        if let Some(e) = c.entries.iter().find(|e| e.began_on(handle, s.device_id())) {
            // SAFETY: `s` is the live origin of this capture, which is under way (its
            // status was asked above, and only `end` removes the record, under this
            // lock); the noted nodes were captured into it.
            unsafe { fork_join::join_side_frees(s.as_raw(), &e.side_frees) };
        }
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is live while `s` is borrowed (`AsStream`), and capturing
        // (checked above); `info` made its context current. Nothing is destroyed here,
        // so no user-object destructor runs under the lock.
        let r = unsafe { result::stream::end_capture(s.as_raw(), &mut raw) };
        ((r, raw), c.take(handle, s.device_id()))
    };
    let raw = match ended {
        (Ok(()), raw) => raw,
        (Err(e), failed) => {
            discard(failed);
            // No graph: the allocations made in the capture are dead (their addresses
            // may go to another graph's memory now), so their drop frees nothing.
            finish(entry);
            return Err(explain_capture(e.into(), "end_capture"));
        }
    };
    let (keep, allocs, forked_uses) = match entry {
        Some(e) => (e.keep, e.allocs, e.forked_uses),
        None => (Vec::new(), Vec::new(), false),
    };
    finish(None);
    Ok(Ended {
        raw,
        keep,
        allocs,
        forked_uses,
    })
}

/// Runs `f` on the record of the capture `s` belongs to (also a stream forked into
/// a capture cuda-rt began): `None` when `s` is not in such a capture.
pub(crate) fn with_entry_of<R>(
    s: &StreamRef,
    f: impl FnOnce(&mut EntryRef<'_>) -> R,
) -> Result<Option<R>> {
    let (status, _) = info(s)?;
    let id = match status {
        CaptureStatus::Active { id } => id,
        CaptureStatus::Invalidated => {
            return Err(Error::capture(
                CaptureKind::Invalidated,
                format!(
                    "stream {:#x} is in an invalidated capture (an operation not allowed \
                     during a capture ran on it); end the capture and capture again",
                    s.handle()
                ),
            ))
        }
        CaptureStatus::None => return Ok(None),
    };
    let mut c = captures();
    Ok(c.entries
        .iter_mut()
        .find(|e| e.id == id && e.device == s.device_id())
        .map(|e| {
            f(&mut EntryRef {
                allocs: &mut e.allocs,
                id: e.id,
            })
        }))
}

/// What [`with_entry_of`] lends: a capture's allocations and origin stream.
pub(crate) struct EntryRef<'a> {
    pub(crate) allocs: &'a mut Vec<Arc<AllocState>>,
    /// The capture's id.
    pub(crate) id: u64,
}

/// A memory object as the registry sees it: its range, an identity, and a handle
/// that keeps it alive. `memory` implements it for its memory objects, so this module
/// needs none of memory's types (it sits below `memory`).
pub(crate) trait Keepable {
    /// The start address (`CUdeviceptr`).
    fn ptr(&self) -> u64;
    /// The size in bytes (0: nothing to keep).
    fn size(&self) -> usize;
    /// An address unique to the object while a handle from [`keep`](Self::keep)
    /// lives.
    fn identity(&self) -> usize;
    /// A handle that keeps the object alive, for a keep-alive list.
    fn keep(&self) -> Arc<dyn Any + Send + Sync>;
}

/// Called when the last pointer to `mem` drops while some capture is active (see the
/// module docs): keeps `mem` for the graph of the capture this thread is in (its
/// current stream is in it, or it began it), else frees it as usual, now or, while a
/// global-mode capture is under way, once none is. Allocations made during a capture
/// (memory nodes) are left to their own drop, which frees them inside the graph.
pub(crate) fn keep_for_graph<M: Keepable + ?Sized>(mem: &M) {
    if mem.size() == 0 {
        return;
    }
    let id = match info(&get_current_stream()) {
        Ok((CaptureStatus::Active { id }, _)) => Some(id),
        _ => None,
    };
    let me = std::thread::current().id();
    let ptr = mem.ptr();
    let mut c = captures();
    if c.entries.iter().any(|e| e.allocated(ptr)) {
        return;
    }
    let mine = match id {
        Some(id) => c.entries.iter().position(|e| e.id == id),
        None => c.entries.iter().rposition(|e| e.thread == me),
    };
    match mine {
        Some(i) => c.entries[i].keep.push(mem.keep()),
        // Not this thread's capture: used by none (their uses are noted), freed as
        // usual, unless a global-mode capture would refuse the free's driver calls.
        None if c.entries.iter().any(|e| e.mode == CaptureMode::Global) => {
            c.deferred.push(mem.keep());
        }
        None => {}
    }
}

/// Runs `enqueue`, which queues work on `s` that reads or writes the memory objects
/// `mems`, and notes that use where a capture takes it: while `s` is in a capture
/// cuda-rt began, that capture's graph keeps them alive (once each), so no pool
/// reuses them while the graph can run, whichever thread drops their last pointer;
/// the capture's own allocations remember the node of the use instead, so that
/// their free inside the graph depends on it (see [`AllocState`]). Returns what
/// `enqueue` returned and whether a capture took the use (`false`: the work was not
/// captured, and the caller records the use for the memory's free).
///
/// The enqueue and the note happen under [`TRANSITION`], which [`begin`] and [`end`]
/// hold exclusively: an operation is never captured without being noted. While no
/// capture is active that costs a shared lock and one relaxed atomic load.
#[inline]
pub(crate) fn enqueue_using<S: AsStream + ?Sized, M: Keepable, R>(
    s: &S,
    mems: &[&M],
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<(R, bool)> {
    let _steady = TRANSITION.read().unwrap_or_else(|e| e.into_inner());
    let r = enqueue()?;
    if !any_capture_active() {
        return Ok((r, false));
    }
    Ok((r, note_use_slow(s, mems)))
}

/// Runs `enqueue`, which queues work on `s` that the caller waits for
/// (`stream::drain`, an event) before it gives back what the work uses: a borrowed
/// host slice, staging buffers, memory a synchronous call lent. No capture may take
/// such work. A capture another thread began through cuda-rt on `s` (or into which `s`
/// was forked) would put it in a graph that runs it at each launch, long after the
/// caller took back what it lent and noted no use; and were that capture begun and
/// ended around the enqueue, the caller's wait would find an idle stream and report the
/// work done.
///
/// Under [`TRANSITION`] no such capture can begin or end between the enqueue and the
/// check after it. A capture that took the work is invalidated on the spot (the
/// driver refuses a wait on a capturing stream and invalidates its capture, so no
/// graph comes of it and the work never runs) and an `Invalidated` capture error is
/// returned. While no capture is active this costs a shared lock and one relaxed load.
/// `enqueue` must not wait (the lock is held), nor run under the lock already.
#[inline]
pub(crate) fn enqueue_uncaptured<S: AsStream + ?Sized, R>(
    s: &S,
    what: &str,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let _steady = TRANSITION.read().unwrap_or_else(|e| e.into_inner());
    let r = enqueue()?;
    if any_capture_active() {
        refuse_taken_work(s, what)?;
    }
    Ok(r)
}

/// [`enqueue_uncaptured`]'s check while some capture is active.
#[cold]
fn refuse_taken_work<S: AsStream + ?Sized>(s: &S, what: &str) -> Result<()> {
    if matches!(info(s), Ok((CaptureStatus::None, _))) {
        return Ok(());
    }
    // SAFETY: the stream is live while `s` is borrowed, and its context is current
    // (the caller just queued work on it). Refused on a capturing stream, which
    // invalidates its capture: the point of the call.
    let _ = unsafe { result::stream::synchronize(s.as_raw()) };
    Err(Error::capture(
        CaptureKind::Invalidated,
        format!(
            "{what} on stream {:#x}: a capture under way on the stream took this call's \
             work, which the call must wait for before it returns; that capture is \
             invalidated (no graph comes of it, and the work never runs). Capture on a \
             stream no other thread queues synchronous work on meanwhile",
            s.as_raw() as usize
        ),
    ))
}

/// [`enqueue_using`]'s note while some capture is active: `true` when `s` captures
/// (into a capture cuda-rt began, or any other: then nothing can be noted, and an
/// event recorded on it for a free would say nothing, see `memory::uses`).
#[cold]
fn note_use_slow<S: AsStream + ?Sized, M: Keepable>(s: &S, mems: &[&M]) -> bool {
    // Asked under the lock: the capture cannot end between the answer and the note.
    let mut c = captures();
    let id = match info(s) {
        Ok((CaptureStatus::Active { id }, _)) => id,
        Ok((CaptureStatus::None, _)) => return false,
        // Invalidated, or the driver cannot say: the work may sit in a graph.
        _ => return true,
    };
    let Some(e) = c
        .entries
        .iter_mut()
        .find(|e| e.id == id && e.device == s.device_id())
    else {
        return true;
    };
    for &m in mems {
        if m.size() == 0 {
            continue;
        }
        if let Some(a) = e.allocs.iter().find(|a| a.contains(m.ptr())) {
            // SAFETY: the stream is live while `s` is borrowed and captures (asked
            // above, under the lock that `end` takes to end it).
            if let Ok(nodes) = unsafe { result::stream::get_capture_dependencies(s.as_raw()) } {
                a.used_by(s.as_raw() as usize, nodes);
            }
            continue;
        }
        // The address of a kept object is unique while the entry keeps it.
        e.keep_once(m.identity(), || m.keep());
        if !e.began_on(s.as_raw() as usize, s.device_id()) {
            e.forked_uses = true;
        }
    }
    true
}

/// Runs `launch`, which queues a kernel on `s` whose code `module` keeps loaded, and,
/// when a capture cuda-rt began takes the launch, keeps `module` for that capture's
/// graph (once per capture): the graph's kernel node runs the module's code at every
/// launch of the graph, its clones and executables, whoever drops the module's last
/// handle meanwhile. Returns what `launch` returned; an error from it queued nothing.
/// A capture begun outside cuda-rt (a raw `cuStreamBeginCapture`) is unknown here:
/// nothing is kept for it (the launch's `# Safety` says so).
///
/// While no capture is active this costs the launch a shared lock of [`TRANSITION`]
/// (one atomic read-modify-write to take it and one to release it, uncontended
/// unless a capture begins or ends) and one relaxed load: no allocation, no driver
/// call. The lock is what makes the note certain, as for [`enqueue_using`]; a check
/// after the launch without it is not enough:
/// - a capture begun by another thread between the launch and the check: the launch
///   landed in it, but [`begin`] raises [`ACTIVE`] only after the driver began the
///   capture, so the check may still read 0 (and moving the raise before the driver's
///   begin does not help with the next case);
/// - a capture ended between the launch and the note: its record, and the keep-alive
///   list that becomes the graph's, are gone by the time the launch could note
///   anything, and the graph runs the kernel without its module.
///
/// Under the shared lock neither [`begin`] nor [`end`] (which hold it exclusively
/// around the driver's begin and end and the record's update) can fall between the
/// launch and the check, so a launch is either captured and noted, or not captured.
/// A launch that lands in a capture through a stream forked into it (one that waited
/// on an event recorded on a capturing stream) finds [`ACTIVE`] raised as well: the
/// capture began, and raised it, before that event was recorded. Only the driver's
/// launch and the note run under the lock, and it is never taken twice on one thread
/// (std's lock would deadlock on a nested read while a writer waits).
#[inline]
pub(crate) fn launch_keeping<S, T, R>(
    s: &S,
    module: &Arc<T>,
    launch: impl FnOnce() -> Result<R>,
) -> Result<R>
where
    S: AsStream + ?Sized,
    T: Any + Send + Sync,
{
    let _steady = TRANSITION.read().unwrap_or_else(|e| e.into_inner());
    let r = launch()?;
    keep_module(s, module);
    Ok(r)
}

/// Keeps `module` for the capture cuda-rt began that `s` is in, if any: after a launch
/// queued on `s`, or one a recorder's update took instead.
#[inline]
pub(crate) fn keep_module<S, T>(s: &S, module: &Arc<T>)
where
    S: AsStream + ?Sized,
    T: Any + Send + Sync,
{
    if any_capture_active() {
        keep_module_slow(s, module);
    }
}

/// [`launch_keeping`]'s note while some capture is active: keeps `module` for the
/// capture `s` is in, if cuda-rt began it.
#[cold]
fn keep_module_slow<S, T>(s: &S, module: &Arc<T>)
where
    S: AsStream + ?Sized,
    T: Any + Send + Sync,
{
    let mut c = captures();
    let device = s.device_id();
    // The module's address is unique while an entry keeps it.
    let identity = Arc::as_ptr(module).cast::<()>() as usize;
    // Every capture of the device keeps it already (a recorded step's kernels come
    // from a few modules): whichever capture took the launch, there is nothing to
    // add, so the driver is not asked which (a call per captured launch).
    if c.entries
        .iter()
        .filter(|e| e.device == device)
        .all(|e| e.used.contains(&identity))
    {
        return;
    }
    let id = match info(s) {
        Ok((CaptureStatus::Active { id }, _)) => Some(id),
        // Not capturing: the kernel runs once, now, as any launch. Invalidated: the
        // capture makes no graph.
        Ok(_) => return,
        // The driver cannot say which capture, if any, took the launch: every capture
        // of the device keeps the module (kept longer than needed, never too short).
        Err(_) => None,
    };
    for e in c
        .entries
        .iter_mut()
        .filter(|e| e.device == device && (id.is_none() || id == Some(e.id)))
    {
        e.keep_once(identity, || {
            Arc::clone(module) as Arc<dyn Any + Send + Sync>
        });
    }
}

/// Adds `obj` to the keep-alive list of the capture `s` belongs to; `false` when `s`
/// is not in a capture cuda-rt began.
pub(crate) fn keep_in_capture<S: AsStream + ?Sized>(
    s: &S,
    obj: Arc<dyn Any + Send + Sync>,
) -> Result<bool> {
    let (status, _) = info(s)?;
    let CaptureStatus::Active { id } = status else {
        return Ok(false);
    };
    let mut c = captures();
    match c.entries.iter_mut().find(|e| e.id == id) {
        Some(e) => {
            e.keep.push(obj);
            Ok(true)
        }
        None => Ok(false),
    }
}

/// The launches of one graph, as the allocations it owns need them.
#[derive(Debug, Default)]
pub(crate) struct LaunchRecord {
    /// The stream of the graph's last launch, if it was launched.
    last: Mutex<Option<StreamRef>>,
}

impl LaunchRecord {
    /// Notes a launch on `s`.
    #[inline]
    pub(crate) fn launched_on(&self, s: StreamRef) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// Runs `f` on the stream of the last launch, if there was one.
    fn with_last<R>(&self, f: impl FnOnce(&StreamRef) -> R) -> Option<R> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }
}

/// Where an allocation made during a capture stands.
#[derive(Debug)]
enum Phase {
    /// The capture is under way; the block is live in the graph being captured.
    Capturing {
        /// The stream it was allocated on.
        stream: StreamRef,
        /// The capture's id.
        id: u64,
    },
    /// Freed inside the graph: nothing to do outside it.
    FreedInGraph,
    /// Its capture ended in error: the block died with the graph that never was (its
    /// address may belong to another graph's memory by now): nothing to free.
    Abandoned,
    /// The graph owns it: after each launch the block is live until the next launch.
    GraphOwned(Arc<LaunchRecord>),
}

/// One allocation made during a capture, shared by its pointers and its graph.
#[derive(Debug)]
pub(crate) struct AllocState {
    /// The block's address.
    pub(crate) ptr: u64,
    /// Its size in bytes, as allocated.
    pub(crate) size: usize,
    /// Its device.
    pub(crate) device: i32,
    phase: Mutex<Phase>,
    /// The nodes of the captured work that used the block, the latest per stream (as
    /// addresses): its free inside the graph depends on all of them, so that a use
    /// on a forked stream, not joined yet, is never raced by the memory's next owner
    /// in the graph.
    uses: Mutex<Vec<(usize, Vec<usize>)>>,
}

impl AllocState {
    /// The record of a block just allocated on `stream` in the capture `id`.
    pub(crate) fn capturing(
        ptr: u64,
        size: usize,
        device: i32,
        stream: StreamRef,
        id: u64,
    ) -> Self {
        AllocState {
            ptr,
            size,
            device,
            phase: Mutex::new(Phase::Capturing { stream, id }),
            uses: Mutex::new(Vec::new()),
        }
    }

    /// Whether work on `stream` (`None`: synchronous) may use the block now: during
    /// its capture, work on a stream of that capture; after it, once a launch of its
    /// graph allocated the block; never once its capture failed or its graph went
    /// without a launch (the address may belong to another graph's memory then).
    pub(crate) fn check_use(&self, stream: Option<&StreamRef>) -> Result<()> {
        let id = match &*self.phase() {
            Phase::Capturing { id, .. } => *id,
            Phase::GraphOwned(rec) if rec.with_last(|_| ()).is_some() => return Ok(()),
            Phase::GraphOwned(_) => {
                return Err(self.gone(
                    "is not allocated outside its graph yet: only work captured into the \
                     graph may use it until the graph's first launch",
                ))
            }
            Phase::Abandoned | Phase::FreedInGraph => {
                return Err(self.gone(
                    "was never allocated: its capture failed, or its graph was dropped or \
                     failed to instantiate before any launch; its address may belong to \
                     another graph's memory",
                ))
            }
        };
        if let Some(s) = stream {
            if matches!(info(s), Ok((CaptureStatus::Active { id: now }, _)) if now == id) {
                return Ok(());
            }
        }
        Err(self.gone(
            "was made during a capture that is still under way: only work queued on a \
             stream of that capture may use it until the graph's first launch",
        ))
    }

    fn gone(&self, why: &str) -> Error {
        Error::invalid_state(
            StateKind::GraphMemoryGone,
            format!(
                "the graph allocation at {:#x} ({} bytes) {why}",
                self.ptr, self.size
            ),
        )
    }

    /// Notes the frontier `nodes` of `stream` just after captured work used the block.
    fn used_by(&self, stream: usize, nodes: Vec<sys::CUgraphNode>) {
        let nodes: Vec<usize> = nodes.into_iter().map(|n| n as usize).collect();
        let mut u = self.uses.lock().unwrap_or_else(|e| e.into_inner());
        match u.iter_mut().find(|(s, _)| *s == stream) {
            Some((_, n)) => *n = nodes,
            None => u.push((stream, nodes)),
        }
    }

    /// Its graph goes: if no launch of it ever allocated the block, the block never
    /// existed, and its pointers are refused from now on.
    pub(crate) fn graph_gone(&self) {
        let mut p = self.phase();
        if matches!(&*p, Phase::GraphOwned(rec) if rec.with_last(|_| ()).is_none()) {
            *p = Phase::Abandoned;
        }
    }

    /// The stream of its graph's last launch, when the graph owns the block and was
    /// launched (the block exists outside the graph only then).
    pub(crate) fn last_launch(&self) -> Option<StreamRef> {
        match &*self.phase() {
            Phase::GraphOwned(rec) => rec.with_last(StreamRef::clone),
            _ => None,
        }
    }

    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `ptr` is inside this allocation.
    pub(crate) fn contains(&self, ptr: u64) -> bool {
        ptr >= self.ptr && ptr < self.ptr + self.size as u64
    }

    /// The capture ended without a graph: the block is gone with it.
    pub(crate) fn abandon(&self) {
        let mut p = self.phase();
        if matches!(*p, Phase::Capturing { .. }) {
            *p = Phase::Abandoned;
        }
    }

    /// At the end of the capture: `true` (and the graph owns it from now) when it was
    /// not freed inside the graph.
    pub(crate) fn hand_to_graph(&self, rec: &Arc<LaunchRecord>) -> bool {
        let mut p = self.phase();
        match *p {
            Phase::Capturing { .. } => {
                *p = Phase::GraphOwned(Arc::clone(rec));
                true
            }
            _ => false,
        }
    }
}

impl Drop for AllocState {
    fn drop(&mut self) {
        let p = std::mem::replace(
            self.phase.get_mut().unwrap_or_else(|e| e.into_inner()),
            Phase::FreedInGraph,
        );
        // Only a block the graph owns, after a launch, is live outside the graph. A
        // capture that ended some other way took its nodes with it.
        let Phase::GraphOwned(rec) = p else { return };
        rec.with_last(|s| {
            if make_current(self.device).is_err() {
                return;
            }
            // SAFETY: the block belongs to the graph's executable (its capture's memory
            // node, freed once, here, after both its pointers and the graph are gone);
            // `s` keeps the stream of the last launch alive, whose work is ordered
            // before this free; the device's context was made current above.
            if unsafe { result::memory::free_async(self.ptr, s.as_raw()) }.is_err()
                // The launch stream is gone: finish all work, free in order with it.
                && result::context::synchronize().is_ok()
            {
                // SAFETY: as above, on the legacy default stream (always valid with a
                // current context) after all work of the context has finished.
                let _ = unsafe { result::memory::free_async(self.ptr, std::ptr::null_mut()) };
            }
        });
    }
}

impl AllocState {
    /// The last pointer to the block dropped: during its capture the block is freed
    /// inside the graph (see [`GraphMemory`](crate::memory::graph_memory)); at any
    /// other time its capture's end decided already, and nothing is done here.
    pub(crate) fn last_pointer_gone(&self) {
        let mut p = self.phase();
        let freed = match &*p {
            Phase::Capturing { stream, id } => {
                // Free on the current stream when it is in the same capture (the
                // user's place in the work), else on the stream that allocated while it
                // still is: never on a stream outside the capture, where the address
                // may belong to another graph's memory. A free on a forked stream is
                // joined back at the capture's end (`fork_join`). The block is freed
                // once: the phase becomes `FreedInGraph` below.
                let cur = current_stream_of(stream.device_id());
                let uses =
                    std::mem::take(&mut *self.uses.lock().unwrap_or_else(|e| e.into_inner()));
                let after: Vec<usize> = uses.into_iter().flat_map(|(_, n)| n).collect();
                fork_join::free_in_capture(&cur, *id, self.ptr, &after)
                    || fork_join::free_in_capture(stream, *id, self.ptr, &after)
            }
            _ => return,
        };
        if freed {
            *p = Phase::FreedInGraph;
        }
        // Otherwise (the capture was invalidated, or ended outside cuda-rt) the end of
        // the capture decides: the graph owns the block, or it died with the capture.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_capture_is_active_by_default() {
        // Other tests in this binary may capture on a GPU; without one nothing does.
        if crate::device::availability().is_err() {
            assert!(!any_capture_active());
        }
    }

    fn entry() -> Entry {
        Entry {
            stream: 0x1000,
            device: 0,
            id: 7,
            mode: CaptureMode::ThreadLocal,
            thread: std::thread::current().id(),
            keep: Vec::new(),
            used: HashSet::new(),
            allocs: Vec::new(),
            side_frees: Vec::new(),
            forked_uses: false,
            fence: None,
            fork_fences: Vec::new(),
        }
    }

    #[test]
    fn a_capture_keeps_each_object_once_however_often_it_is_used() {
        let mut e = entry();
        let module = Arc::new(42u32);
        let other = Arc::new(43u32);
        let id = |a: &Arc<u32>| Arc::as_ptr(a) as usize;
        for _ in 0..3 {
            e.keep_once(id(&module), || module.clone());
        }
        e.keep_once(id(&other), || other.clone());
        // A second launch of the same module makes no handle at all.
        e.keep_once(id(&module), || unreachable!("kept already"));
        assert_eq!(e.keep.len(), 2);
        assert_eq!(Arc::strong_count(&module), 2);
        assert_eq!(Arc::strong_count(&other), 2);
        // The graph that takes the list holds the only other handle: when it goes,
        // the object goes with the caller's last handle.
        drop(e);
        assert_eq!(Arc::strong_count(&module), 1);
    }

    #[test]
    fn a_launch_outside_any_capture_runs_once_and_keeps_nothing() {
        let module = Arc::new(String::from("module"));
        let s = StreamRef::legacy_default(0);
        let mut runs = 0;
        let r = launch_keeping(&s, &module, || {
            runs += 1;
            Ok(5)
        });
        assert_eq!(r.unwrap(), 5);
        assert_eq!(runs, 1);
        assert_eq!(Arc::strong_count(&module), 1);
        // A failed launch queued nothing: its error comes back as it is.
        let e = launch_keeping(&s, &module, || -> Result<()> {
            Err(Error::invalid_state(StateKind::Other, "refused"))
        })
        .unwrap_err();
        assert!(e.to_string().contains("refused"), "{e}");
        assert_eq!(Arc::strong_count(&module), 1);
    }

    #[test]
    fn capture_modes_map_to_the_driver_values() {
        assert_eq!(CaptureMode::default(), CaptureMode::Global);
        assert_eq!(CaptureMode::Global.as_raw().0, 0);
        assert_eq!(CaptureMode::ThreadLocal.as_raw().0, 1);
        assert_eq!(CaptureMode::Relaxed.as_raw().0, 2);
    }
}
