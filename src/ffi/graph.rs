//! Graphs: capture a stream's work, instantiate, launch, destroy.

use std::ffi::c_int;
use std::sync::{Arc, Mutex, PoisonError};

use cuda_rt::prelude::*;
use cuda_rt::{CaptureMode, Graph, InstantiateFlags};

use super::handles::{curt_graph_t, curt_stream_t, Table};
use super::status::{bad_arg, guard, out};
use super::stream::stream_or_current;

/// The graphs C holds.
pub(crate) static GRAPHS: Table<Arc<Mutex<Graph>>> = Table::new(7, "graph");

/// Capture modes (`CUstreamCaptureMode`): global.
pub const CURT_CAPTURE_MODE_GLOBAL: c_int = 0;
/// Capture mode: thread-local.
pub const CURT_CAPTURE_MODE_THREAD_LOCAL: c_int = 1;
/// Capture mode: relaxed.
pub const CURT_CAPTURE_MODE_RELAXED: c_int = 2;

/// Begins capturing the work queued on `stream` (not the legacy default stream) into
/// a graph, in `mode` (`CURT_CAPTURE_MODE_*`).
#[no_mangle]
pub extern "C" fn curt_stream_begin_capture(stream: curt_stream_t, mode: c_int) -> c_int {
    guard(|| {
        let mode = match mode {
            CURT_CAPTURE_MODE_GLOBAL => CaptureMode::Global,
            CURT_CAPTURE_MODE_THREAD_LOCAL => CaptureMode::ThreadLocal,
            CURT_CAPTURE_MODE_RELAXED => CaptureMode::Relaxed,
            m => return Err(bad_arg(format!("unknown capture mode {m}"))),
        };
        Ok(stream_or_current(stream)?.begin_capture(mode)?)
    })
}

/// Ends the capture on `stream` and writes the captured graph, instantiated, to
/// `*graph`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_stream_end_capture(
    stream: curt_stream_t,
    graph: *mut curt_graph_t,
) -> c_int {
    guard(|| {
        let graph = out(graph, "graph")?;
        let g = stream_or_current(stream)?.end_capture()?;
        *graph = GRAPHS.insert(Arc::new(Mutex::new(g))) as curt_graph_t;
        Ok(())
    })
}

/// (Re)instantiates `graph` with `flags` (`CUgraphInstantiate_flags` bits).
#[no_mangle]
pub extern "C" fn curt_graph_instantiate(graph: curt_graph_t, flags: u64) -> c_int {
    guard(|| {
        let g = GRAPHS.get(graph as u64)?;
        let flags = InstantiateFlags::from_bits(flags)
            .ok_or_else(|| bad_arg(format!("unknown instantiate flags {flags:#x}")))?;
        let mut g = g.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(g.instantiate(flags)?)
    })
}

/// Launches the instantiated `graph` on `stream` (NULL: the current stream).
#[no_mangle]
pub extern "C" fn curt_graph_launch(graph: curt_graph_t, stream: curt_stream_t) -> c_int {
    guard(|| {
        let g = GRAPHS.get(graph as u64)?;
        let s = stream_or_current(stream)?;
        let g = g.lock().unwrap_or_else(PoisonError::into_inner);
        Ok(g.launch(&s)?)
    })
}

/// Destroys `graph` (launches already queued still run); dead afterwards.
#[no_mangle]
pub extern "C" fn curt_graph_destroy(graph: curt_graph_t) -> c_int {
    guard(|| {
        drop(GRAPHS.remove(graph as u64)?);
        Ok(())
    })
}
