//! Checked driver calls about streams (`cuStream*`): creation, synchronisation, waits,
//! graph capture, and host functions and callbacks that run Rust closures in stream
//! order.
//!
//! A `CUstream` handle is trusted by the driver, so every call that takes one is an
//! `unsafe fn`: the stream is live (created and not destroyed) and belongs to the
//! current context, or is one of the default-stream handles (`0` legacy, `2`
//! per-thread), valid whenever a context is current.
//!
//! # Closures
//!
//! [`launch_host_func`] and [`add_callback`] take a Rust closure: it is boxed, handed to
//! the driver with a trampoline that takes the box back and runs the closure exactly
//! once on a driver thread, and dropped unrun when the driver refuses it. A panic in the
//! closure (or in its drop) is caught in the trampoline, so it never unwinds into the
//! driver; the default panic hook prints it and [`host_fn_panic_count`] counts it.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{api, check, DriverError, Result};
use crate::driver::{
    CUevent, CUgraph, CUgraphEdgeData, CUgraphNode, CUresult, CUstream, CUstreamCaptureMode,
    CUstreamCaptureStatus, CUstreamUpdateCaptureDependencies_flags,
};

/// A new stream of the current context (`cuStreamCreateWithPriority`; `flags` are
/// `CU_STREAM_*`, a lower `priority` number is a higher priority). The caller destroys
/// it once with [`destroy`].
pub fn create_with_priority(flags: u32, priority: i32) -> Result<CUstream> {
    let f = api()?.cuStreamCreateWithPriority()?;
    let mut s: CUstream = std::ptr::null_mut();
    // SAFETY: `s` is a valid out pointer; the driver checks flags and the context.
    check(
        unsafe { f(&mut s, flags, priority) },
        "cuStreamCreateWithPriority",
    )?;
    Ok(s)
}

/// Destroys a stream (`cuStreamDestroy`); the driver defers the destruction until the
/// work queued on it is done.
///
/// # Safety
/// `stream` came from [`create_with_priority`] (or another stream-creating call), is
/// destroyed once and not used afterwards.
pub unsafe fn destroy(stream: CUstream) -> Result<()> {
    let f = api()?.cuStreamDestroy_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(stream) }, "cuStreamDestroy_v2")
}

/// Blocks until all work queued on `stream` is done (`cuStreamSynchronize`).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
#[inline]
pub unsafe fn synchronize(stream: CUstream) -> Result<()> {
    let f = api()?.cuStreamSynchronize()?;
    // SAFETY: `stream` is live (caller).
    check(unsafe { f(stream) }, "cuStreamSynchronize")
}

/// Whether all work queued on `stream` is done (`cuStreamQuery`): `Ok(false)` while some
/// is pending (`CUDA_ERROR_NOT_READY`).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
#[inline]
pub unsafe fn query(stream: CUstream) -> Result<bool> {
    let f = api()?.cuStreamQuery()?;
    // SAFETY: `stream` is live (caller).
    let rc = unsafe { f(stream) };
    if rc == CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check(rc, "cuStreamQuery")?;
    Ok(true)
}

/// Makes work queued later on `stream` wait for the last record of `event`
/// (`cuStreamWaitEvent`).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle; `event` a live event.
#[inline]
pub unsafe fn wait_event(stream: CUstream, event: CUevent) -> Result<()> {
    let f = api()?.cuStreamWaitEvent()?;
    // SAFETY: both handles are live (caller); flags must be 0.
    check(unsafe { f(stream, event, 0) }, "cuStreamWaitEvent")
}

/// The stream's priority (`cuStreamGetPriority`).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
pub unsafe fn get_priority(stream: CUstream) -> Result<i32> {
    let f = api()?.cuStreamGetPriority()?;
    let mut p = 0;
    // SAFETY: `stream` is live (caller); `p` is a valid out pointer.
    check(unsafe { f(stream, &mut p) }, "cuStreamGetPriority")?;
    Ok(p)
}

/// The stream's creation flags (`cuStreamGetFlags`).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
pub unsafe fn get_flags(stream: CUstream) -> Result<u32> {
    let f = api()?.cuStreamGetFlags()?;
    let mut flags = 0;
    // SAFETY: `stream` is live (caller); `flags` is a valid out pointer.
    check(unsafe { f(stream, &mut flags) }, "cuStreamGetFlags")?;
    Ok(flags)
}

// ---------------------------------------------------------------------------
// Capture

/// Whether `stream` is capturing a graph now (`cuStreamIsCapturing`): `NONE`, `ACTIVE`
/// or `INVALIDATED` (still in capture mode, the capture failed).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
#[inline]
pub unsafe fn is_capturing(stream: CUstream) -> Result<CUstreamCaptureStatus> {
    let f = api()?.cuStreamIsCapturing()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is live (caller); `status` is a valid out pointer.
    check(unsafe { f(stream, &mut status) }, "cuStreamIsCapturing")?;
    Ok(status)
}

/// Starts capturing the work queued on `stream` into a graph (`cuStreamBeginCapture`).
///
/// # Safety
/// `stream` is a live stream (the default streams cannot capture: an error code).
pub unsafe fn begin_capture(stream: CUstream, mode: CUstreamCaptureMode) -> Result<()> {
    let f = api()?.cuStreamBeginCapture_v2()?;
    // SAFETY: `stream` is live (caller); the driver checks the mode.
    check(unsafe { f(stream, mode) }, "cuStreamBeginCapture_v2")
}

/// Ends the capture on `stream` (`cuStreamEndCapture`), writing the captured graph into
/// `*graph`. The driver may write a graph also when it answers an error (an
/// invalidated capture); either way a non-null `*graph` is the caller's to destroy with
/// [`graph::destroy`](super::graph::destroy).
///
/// # Safety
/// `stream` is a live stream.
pub unsafe fn end_capture(stream: CUstream, graph: &mut CUgraph) -> Result<()> {
    let f = api()?.cuStreamEndCapture()?;
    // SAFETY: `stream` is live (caller); `graph` is a valid out pointer.
    check(unsafe { f(stream, graph) }, "cuStreamEndCapture")
}

/// The capture state of `stream`: its status, the capture's id, and the graph being
/// captured (null unless active) (`cuStreamGetCaptureInfo`, the CUDA 12.3 ABI).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
pub unsafe fn get_capture_info(stream: CUstream) -> Result<(CUstreamCaptureStatus, u64, CUgraph)> {
    let f = api()?.cuStreamGetCaptureInfo_v3()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: `stream` is live (caller); the three out pointers are valid; the optional
    // dependency outputs are null, which the driver documents as "not wanted".
    let rc = unsafe {
        f(
            stream,
            &mut status,
            &mut id,
            &mut g,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    check(rc, "cuStreamGetCaptureInfo_v3")?;
    Ok((status, id, g))
}

/// The nodes the next work captured on `stream` would depend on: the stream's capture
/// frontier (`cuStreamGetCaptureInfo`, the CUDA 12.3 ABI, its dependency outputs).
/// Empty when the stream is not capturing. The driver's array is copied at once (it
/// is valid only until the next call on the stream).
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
pub unsafe fn get_capture_dependencies(stream: CUstream) -> Result<Vec<CUgraphNode>> {
    let f = api()?.cuStreamGetCaptureInfo_v3()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut deps: *const CUgraphNode = std::ptr::null();
    // Asked for too: without it the driver refuses edges with data (a lossy query).
    let mut edges: *const CUgraphEdgeData = std::ptr::null();
    let mut n: usize = 0;
    // SAFETY: `stream` is live (caller); the out pointers are valid; the id and graph
    // outputs are null ("not wanted").
    let rc = unsafe {
        f(
            stream,
            &mut status,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            &mut deps,
            &mut edges,
            &mut n,
        )
    };
    check(rc, "cuStreamGetCaptureInfo_v3")?;
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE || deps.is_null() || n == 0
    {
        return Ok(Vec::new());
    }
    // SAFETY: the driver documents `deps` as an array of `n` nodes, valid until the
    // next call on the stream; it is copied here, before any.
    Ok(unsafe { std::slice::from_raw_parts(deps, n) }.to_vec())
}

/// Adds `nodes` to the capture frontier of `stream` (`cuStreamUpdateCaptureDependencies`
/// with `CU_STREAM_ADD_CAPTURE_DEPENDENCIES`, the CUDA 12.3 ABI, no edge data): the
/// next work captured on it (and the end of the capture, for the origin stream)
/// depends on them too, which joins them into the stream as an event wait would.
///
/// # Safety
/// `stream` is a live, capturing stream and `nodes` are nodes of its capture's graph.
pub unsafe fn add_capture_dependencies(stream: CUstream, nodes: &[CUgraphNode]) -> Result<()> {
    if nodes.is_empty() {
        return Ok(());
    }
    let f = api()?.cuStreamUpdateCaptureDependencies_v2()?;
    let mut v = nodes.to_vec();
    // SAFETY: `stream` and `nodes` as the caller guarantees; `v` holds `v.len()` nodes
    // (the driver reads them during the call); null edge data means default edges.
    let rc = unsafe {
        f(
            stream,
            v.as_mut_ptr(),
            std::ptr::null(),
            v.len(),
            CUstreamUpdateCaptureDependencies_flags::CU_STREAM_ADD_CAPTURE_DEPENDENCIES.0,
        )
    };
    check(rc, "cuStreamUpdateCaptureDependencies_v2")
}

// ---------------------------------------------------------------------------
// Host functions and callbacks

/// Host functions and callbacks whose closure panicked (the panic was caught).
static HOST_FN_PANICS: AtomicU64 = AtomicU64::new(0);

/// How many host functions, stream callbacks or graph host nodes have panicked in this
/// process. The panic is caught in the trampoline (the default panic hook prints it),
/// so it never unwinds into the driver.
pub fn host_fn_panic_count() -> u64 {
    HOST_FN_PANICS.load(Ordering::Relaxed)
}

thread_local! {
    /// How many host functions (or stream callbacks, or host nodes) run on this
    /// thread now: see [`in_host_function`].
    static IN_HOST_FN: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Whether this thread is running a host function, stream callback or graph host
/// node queued through this crate, where CUDA forbids every CUDA call (it may fail
/// with `CUDA_ERROR_NOT_PERMITTED`, or deadlock). Safe layers refuse their calls
/// there with an error.
pub fn in_host_function() -> bool {
    IN_HOST_FN.try_with(|n| n.get() > 0).unwrap_or(false)
}

/// Runs `f`, catching a panic (also one raised by dropping what `f` owns), and counts
/// it; [`in_host_function`] says `true` meanwhile.
pub(crate) fn run_caught(f: impl FnOnce()) {
    let _ = IN_HOST_FN.try_with(|n| n.set(n.get() + 1));
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        HOST_FN_PANICS.fetch_add(1, Ordering::Relaxed);
    }
    let _ = IN_HOST_FN.try_with(|n| n.set(n.get().saturating_sub(1)));
}

/// The `CUhostFn` for a boxed closure `F`: takes the box back and runs it once.
///
/// # Safety
/// `data` is a `Box<F>` leaked for this one call, and the function is called once.
unsafe extern "C" fn host_fn_trampoline<F: FnOnce() + Send + 'static>(data: *mut c_void) {
    run_caught(|| {
        // SAFETY: `data` is the `Box<F>` that `launch_host_func` leaked for this one
        // call; the driver calls a host function exactly once.
        let f = unsafe { Box::from_raw(data.cast::<F>()) };
        f();
    });
}

/// The `CUstreamCallback` for a boxed closure `F`, given the stream's status.
///
/// # Safety
/// As for `host_fn_trampoline`.
unsafe extern "C" fn callback_trampoline<F>(_stream: CUstream, status: CUresult, data: *mut c_void)
where
    F: FnOnce(std::result::Result<(), DriverError>) + Send + 'static,
{
    run_caught(|| {
        // SAFETY: `data` is the `Box<F>` that `add_callback` leaked for this one call;
        // the driver calls a stream callback exactly once.
        let f = unsafe { Box::from_raw(data.cast::<F>()) };
        let st = if status == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(DriverError::new(status, "stream callback"))
        };
        f(st);
    });
}

/// Queues `f` on `stream` (`cuLaunchHostFunc`): the driver runs it once, in stream
/// order, on a driver thread. When the launch fails, `f` is dropped without running.
///
/// # Safety
/// `stream` is a live stream or a default-stream handle (see the [module](self) docs).
/// CUDA forbids CUDA calls inside `f`; they may fail.
pub unsafe fn launch_host_func<F: FnOnce() + Send + 'static>(stream: CUstream, f: F) -> Result<()> {
    let launch = api()?.cuLaunchHostFunc()?;
    let data = Box::into_raw(Box::new(f)).cast::<c_void>();
    // SAFETY: `stream` is live (caller); the trampoline matches `F` and owns `data` from
    // the moment the driver accepts it.
    let rc = unsafe { launch(stream, Some(host_fn_trampoline::<F>), data) };
    let r = check(rc, "cuLaunchHostFunc");
    if r.is_err() {
        // SAFETY: the driver refused, so it never calls the trampoline: the box is still
        // ours, taken back once here.
        drop(unsafe { Box::from_raw(data.cast::<F>()) });
    }
    r
}

/// Queues `f` on `stream` (`cuStreamAddCallback`): the driver runs it once, in stream
/// order, with the stream's status (`Err` when earlier work failed). When the call
/// fails, `f` is dropped unrun.
///
/// # Safety
/// As for [`launch_host_func`].
pub unsafe fn add_callback<F>(stream: CUstream, f: F) -> Result<()>
where
    F: FnOnce(std::result::Result<(), DriverError>) + Send + 'static,
{
    let add = api()?.cuStreamAddCallback()?;
    let data = Box::into_raw(Box::new(f)).cast::<c_void>();
    // SAFETY: `stream` is live (caller); the trampoline matches `F` and owns `data` from
    // the moment the driver accepts it; flags must be 0.
    let rc = unsafe { add(stream, Some(callback_trampoline::<F>), data, 0) };
    let r = check(rc, "cuStreamAddCallback");
    if r.is_err() {
        // SAFETY: the driver refused, so it never calls the trampoline: the box is still
        // ours, taken back once here.
        drop(unsafe { Box::from_raw(data.cast::<F>()) });
    }
    r
}

/// Sets this thread's stream-capture mode (`cuThreadExchangeStreamCaptureMode`) and
/// returns the previous one, to restore with a second call. Relaxed mode lets a
/// thread make calls that a global-mode capture elsewhere would refuse (`cuMemAlloc`,
/// say), as PyTorch's allocator does for a graph's private pool.
pub fn exchange_capture_mode(mode: CUstreamCaptureMode) -> Result<CUstreamCaptureMode> {
    let f = api()?.cuThreadExchangeStreamCaptureMode()?;
    let mut m = mode;
    // SAFETY: `m` is a valid in/out pointer for the call; no other memory is touched.
    check(unsafe { f(&mut m) }, "cuThreadExchangeStreamCaptureMode")?;
    Ok(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    /// Calls the host-function trampoline once, as the driver would.
    fn drive_host_fn<F: FnOnce() + Send + 'static>(f: F) {
        let data = Box::into_raw(Box::new(f));
        // SAFETY: called once with the box it expects, as the driver would.
        unsafe { host_fn_trampoline::<F>(data.cast()) };
    }

    /// Calls the callback trampoline once with a success status, as the driver would.
    fn drive_callback<F>(f: F)
    where
        F: FnOnce(std::result::Result<(), DriverError>) + Send + 'static,
    {
        let data = Box::into_raw(Box::new(f));
        // SAFETY: called once with the box it expects, as the driver would.
        unsafe {
            callback_trampoline::<F>(std::ptr::null_mut(), CUresult::CUDA_SUCCESS, data.cast())
        };
    }

    #[test]
    fn host_fn_trampoline_runs_the_closure_once() {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let f = move || {
            m.fetch_add(1, Ordering::SeqCst);
        };
        drive_host_fn(f);
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(Arc::strong_count(&n), 1, "the closure was dropped");
    }

    #[test]
    fn host_fn_trampoline_catches_a_panic() {
        let before = host_fn_panic_count();
        let f = || panic!("boom in a host function");
        drive_host_fn(f);
        assert!(host_fn_panic_count() > before);
    }

    #[test]
    fn callback_trampoline_passes_success_and_catches_a_panic() {
        let seen = Arc::new(std::sync::Mutex::new(None));
        let s2 = seen.clone();
        let f = move |st: std::result::Result<(), DriverError>| {
            *s2.lock().unwrap() = Some(st.is_ok());
            panic!("boom in a callback");
        };
        let before = host_fn_panic_count();
        drive_callback(f);
        assert_eq!(*seen.lock().unwrap(), Some(true));
        assert!(host_fn_panic_count() > before);
    }
}
