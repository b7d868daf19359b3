//! Stream capture: begin and end a capture, its status, the errors of a capture in
//! words, and the process-wide record of the captures cuda-rt began (what the
//! allocation and free paths consult while a capture is under way).
//!
//! The record costs the allocation hot path one relaxed atomic load
//! ([`any_capture_active`]) while no capture is active; only when some capture is
//! active does [`alloc`](crate::memory::alloc) ask the driver whether the current
//! stream captures.

use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::driver::context::make_current;
use crate::driver::{self, sys};
use crate::error::{Error, Result};
use crate::graph::memory::AllocState;
use crate::graph::{Graph, InstantiateFlags};
use crate::memory::BaseMemory;
use crate::stream::{get_current_stream, AsStream, StreamRef, LEGACY_DEFAULT_HANDLE};

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
    /// invalidated it: [`end_capture`](crate::AsStream::end_capture) will fail.
    Invalidated,
}

/// One capture begun through cuda-rt and not ended yet.
struct Entry {
    /// The origin stream's handle.
    stream: usize,
    device: i32,
    id: u64,
    /// Objects freed by their owners during the capture, kept for the graph.
    keep: Vec<Arc<dyn Any + Send + Sync>>,
    /// Allocations made during the capture (memory nodes).
    allocs: Vec<Arc<AllocState>>,
}

/// How many captures begun through cuda-rt are under way in the process.
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
/// Those captures.
static CAPTURES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());

fn captures() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    CAPTURES.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether any capture begun through cuda-rt is under way (one relaxed atomic load:
/// what the allocation and free paths check first).
#[inline]
pub fn any_capture_active() -> bool {
    ACTIVE.load(Ordering::Relaxed) != 0
}

/// A driver error about capturing, in words: what happened and what to do.
/// Other errors are returned unchanged.
pub(crate) fn explain(e: Error, what: &str) -> Error {
    use sys::CUresult as R;
    let Some(code) = e.driver_code() else {
        return e;
    };
    let why = match code {
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => {
            "this operation is not allowed while a stream captures a graph (a synchronize, \
             a synchronous copy or memset, a stream or event query, ...); the capture is \
             now invalid: end it (which fails) and capture again without the operation"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => {
            "the capture was invalidated by an earlier operation not allowed during a \
             capture (a synchronize, a synchronous copy, ...); no graph can come of it: end \
             it and capture again"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_MERGE => {
            "two independent captures would be merged (a capturing stream waited on an \
             event recorded in another capture)"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => {
            "the capture was not begun on this stream: end a capture on the stream that \
             began it"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED => {
            "a stream forked from the capture (it waited on an event recorded during the \
             capture) has work that was never joined back: record an event on the forked \
             stream and make the origin stream wait on it before ending the capture"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION => {
            "a dependency would cross the capture's boundary (work outside the capture \
             cannot depend on captured work)"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => {
            "the operation would wait on the legacy default stream, which is not allowed \
             while a stream captures: use non-blocking streams, or a stream other than \
             the legacy default one"
        }
        R::CUDA_ERROR_CAPTURED_EVENT => {
            "the event was recorded during a capture: it cannot be queried or waited for \
             from the host before the capture ends"
        }
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => {
            "the capture was begun in global or thread-local mode on another thread: end \
             it on that thread"
        }
        _ => return e,
    };
    Error::Capture(format!("{what}: {why} ({e})"))
}

/// The status of `s`'s capture, with the graph being captured (null unless active).
pub(crate) fn info<S: AsStream + ?Sized>(s: &S) -> Result<(CaptureStatus, sys::CUgraph)> {
    if s.as_raw() as usize == LEGACY_DEFAULT_HANDLE {
        // The legacy default stream never captures; asking may report an implicit
        // dependency error while another stream captures.
        return Ok((CaptureStatus::None, std::ptr::null_mut()));
    }
    make_current(s.device_id())?;
    let (st, id, g) = driver::graph::capture_info(s.as_raw())
        .map_err(|e| explain(e, "cuStreamGetCaptureInfo"))?;
    let status = match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE => CaptureStatus::Active { id },
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
            CaptureStatus::Invalidated
        }
        _ => CaptureStatus::None,
    };
    Ok((status, g))
}

/// `AsStream::begin_capture`.
pub(crate) fn begin<S: AsStream + ?Sized>(s: &S, mode: CaptureMode) -> Result<()> {
    let handle = s.as_raw() as usize;
    if handle == LEGACY_DEFAULT_HANDLE {
        return Err(Error::Capture(format!(
            "begin_capture on the legacy default stream of device {}: CUDA cannot capture \
             it (every other stream synchronizes with it); capture on a Stream you created \
             (or the per-thread default stream)",
            s.device_id()
        )));
    }
    make_current(s.device_id())?;
    driver::graph::begin_capture(s.as_raw(), mode.as_raw())
        .map_err(|e| explain(e, "begin_capture"))?;
    let id = match driver::graph::capture_info(s.as_raw()) {
        Ok((_, id, _)) => id,
        Err(e) => {
            let _ = driver::graph::end_capture(s.as_raw()).map(driver::graph::destroy);
            return Err(e);
        }
    };
    captures().push(Entry {
        stream: handle,
        device: s.device_id(),
        id,
        keep: Vec::new(),
        allocs: Vec::new(),
    });
    ACTIVE.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Removes the record of the capture begun on `handle`, if cuda-rt began one there.
fn take_entry(handle: usize, device: i32) -> Option<Entry> {
    let mut c = captures();
    let i = c
        .iter()
        .position(|e| e.stream == handle && e.device == device)?;
    let entry = c.remove(i);
    ACTIVE.fetch_sub(1, Ordering::Relaxed);
    Some(entry)
}

/// `AsStream::end_capture_with`.
pub(crate) fn end<S: AsStream + ?Sized>(s: &S, flags: InstantiateFlags) -> Result<Graph> {
    let handle = s.as_raw() as usize;
    let (status, _) = info(s)?;
    if status == CaptureStatus::None {
        // A record left by a capture that ended some other way is stale: drop it.
        drop(take_entry(handle, s.device_id()));
        return Err(Error::Capture(format!(
            "end_capture on stream {handle:#x} of device {}: the stream is not capturing \
             (begin_capture it first; a stream forked into a capture is ended through \
             the stream that began it)",
            s.device_id()
        )));
    }
    let ended = driver::graph::end_capture(s.as_raw());
    let entry = take_entry(handle, s.device_id());
    let raw = ended.map_err(|e| explain(e, "end_capture"))?;
    let (keep, allocs) = match entry {
        Some(e) => (e.keep, e.allocs),
        None => (Vec::new(), Vec::new()),
    };
    Graph::from_capture(raw, s.device_id(), keep, allocs, flags)
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
            return Err(Error::Capture(format!(
                "stream {:#x} is in an invalidated capture (an operation not allowed \
                 during a capture ran on it); end the capture and capture again",
                s.handle()
            )))
        }
        CaptureStatus::None => return Ok(None),
    };
    let mut c = captures();
    Ok(c.iter_mut()
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

/// Wraps a memory object so it can sit in a keep-alive list.
#[derive(Debug)]
struct KeptMemory(#[allow(dead_code)] Arc<dyn BaseMemory>);

/// Called when the last pointer to `mem` drops while some capture is active: keeps
/// `mem` alive for the graph of the capture the current stream belongs to (else the
/// capture begun last), so a graph that may use it never sees it reused by a pool or
/// freed. Allocations made during the capture (memory nodes) are not kept: they are
/// freed inside the graph.
pub(crate) fn keep_for_graph(mem: &Arc<dyn BaseMemory>) {
    if mem.size() == 0 {
        return;
    }
    let s = get_current_stream();
    let id = match info(&s) {
        Ok((CaptureStatus::Active { id }, _)) => Some(id),
        _ => None,
    };
    let ptr = mem.ptr();
    let mut c = captures();
    let pos = id
        .and_then(|id| c.iter().position(|e| e.id == id))
        .or_else(|| c.len().checked_sub(1));
    let Some(i) = pos else { return };
    let e = &mut c[i];
    if e.allocs.iter().any(|a| a.contains(ptr)) {
        return;
    }
    e.keep.push(Arc::new(KeptMemory(Arc::clone(mem))));
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
    match c.iter_mut().find(|e| e.id == id) {
        Some(e) => {
            e.keep.push(obj);
            Ok(true)
        }
        None => Ok(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::DriverError;

    fn driver(code: sys::CUresult) -> Error {
        Error::Driver(DriverError {
            call: "cuStreamSynchronize",
            code,
            name: "CUDA_ERROR_X",
            description: "x",
        })
    }

    #[test]
    fn capture_errors_are_explained_in_words() {
        let e = explain(
            driver(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
            "synchronize",
        );
        assert!(matches!(e, Error::Capture(_)));
        let s = e.to_string();
        assert!(s.starts_with("synchronize: "), "{s}");
        assert!(s.contains("capture is now invalid"), "{s}");
        let e = explain(
            driver(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
            "end_capture",
        );
        assert!(e.to_string().contains("never joined back"), "{e}");
        let e = explain(
            driver(sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
            "end_capture",
        );
        assert!(e.to_string().contains("invalidated"), "{e}");
    }

    #[test]
    fn other_errors_pass_unchanged() {
        let e = explain(driver(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY), "x");
        assert!(matches!(e, Error::Driver(_)));
        let e = explain(Error::InvalidArgument("y".into()), "x");
        assert!(matches!(e, Error::InvalidArgument(_)));
    }

    #[test]
    fn no_capture_is_active_by_default() {
        // Other tests in this binary may capture on a GPU; without one nothing does.
        if crate::device::availability().is_err() {
            assert!(!any_capture_active());
        }
    }

    #[test]
    fn capture_modes_map_to_the_driver_values() {
        assert_eq!(CaptureMode::default(), CaptureMode::Global);
        assert_eq!(CaptureMode::Global.as_raw().0, 0);
        assert_eq!(CaptureMode::ThreadLocal.as_raw().0, 1);
        assert_eq!(CaptureMode::Relaxed.as_raw().0, 2);
    }
}
