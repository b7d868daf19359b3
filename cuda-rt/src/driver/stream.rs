//! Checked driver calls about streams (`cuStream*`, `cuLaunchHostFunc`), and the
//! trampolines that run Rust closures as host functions in stream order.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{drv, sys};
use crate::error::{DriverError, Result};

/// `cuStreamCreateWithPriority`: a stream of the current context.
pub fn create(flags: u32, priority: i32) -> Result<sys::CUstream> {
    let mut s: sys::CUstream = std::ptr::null_mut();
    // SAFETY: `s` is a valid out pointer; the driver checks flags and the context.
    drv!(cuStreamCreateWithPriority(&mut s, flags, priority))?;
    Ok(s)
}

/// `cuStreamDestroy`: the driver defers the destruction until queued work is done.
pub fn destroy(s: sys::CUstream) -> Result<()> {
    // SAFETY: the caller owns `s` and destroys it once.
    drv!(cuStreamDestroy_v2(s))
}

/// `cuStreamSynchronize`.
pub fn synchronize(s: sys::CUstream) -> Result<()> {
    // SAFETY: `s` is a live stream (or a default-stream handle) of the current context.
    drv!(cuStreamSynchronize(s))
}

/// `cuStreamQuery`: `Ok(true)` when all work is done, `Ok(false)` while some is pending.
pub fn query(s: sys::CUstream) -> Result<bool> {
    let f = super::api()?.cuStreamQuery()?;
    // SAFETY: `s` is a live stream (or a default-stream handle) of the current context.
    let rc = unsafe { f(s) };
    if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    super::check(rc, "cuStreamQuery")?;
    Ok(true)
}

/// `cuStreamWaitEvent`: work queued later on `s` waits for `ev`'s last record.
pub fn wait_event(s: sys::CUstream, ev: sys::CUevent) -> Result<()> {
    // SAFETY: `s` and `ev` are live handles; flags must be 0.
    drv!(cuStreamWaitEvent(s, ev, 0))
}

/// `cuStreamGetPriority`.
pub fn priority(s: sys::CUstream) -> Result<i32> {
    let mut p = 0;
    // SAFETY: `s` is a live stream; `p` a valid out pointer.
    drv!(cuStreamGetPriority(s, &mut p))?;
    Ok(p)
}

/// `cuStreamGetFlags`.
pub fn flags(s: sys::CUstream) -> Result<u32> {
    let mut f = 0;
    // SAFETY: `s` is a live stream; `f` a valid out pointer.
    drv!(cuStreamGetFlags(s, &mut f))?;
    Ok(f)
}

/// `cuStreamIsCapturing`: whether `s` is capturing a graph now.
pub fn is_capturing(s: sys::CUstream) -> Result<bool> {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `s` is a live stream; `st` a valid out pointer.
    drv!(cuStreamIsCapturing(s, &mut st))?;
    Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Host functions and callbacks whose closure panicked (the panic was caught).
static HOST_FN_PANICS: AtomicU64 = AtomicU64::new(0);

/// How many host functions or stream callbacks have panicked in this process. The
/// panic is caught in the trampoline (the default panic hook prints it), so it never
/// unwinds into the driver.
pub fn host_fn_panic_count() -> u64 {
    HOST_FN_PANICS.load(Ordering::Relaxed)
}

/// Counts one caught panic of a host function (the graph trampolines use it too).
pub fn count_host_fn_panic() {
    HOST_FN_PANICS.fetch_add(1, Ordering::Relaxed);
}

/// Runs `f`, catching a panic (also one raised by dropping `f`).
fn run_caught(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        HOST_FN_PANICS.fetch_add(1, Ordering::Relaxed);
    }
}

/// The `CUhostFn` for a boxed closure `F`: takes the box back and runs it once.
unsafe extern "C" fn host_fn_trampoline<F: FnOnce() + Send + 'static>(data: *mut c_void) {
    run_caught(|| {
        // SAFETY: `data` is the `Box<F>` that `launch_host_func` leaked for this one
        // call; the driver calls a host function exactly once.
        let f = unsafe { Box::from_raw(data.cast::<F>()) };
        f();
    });
}

/// The `CUstreamCallback` for a boxed closure `F`, given the stream's status.
unsafe extern "C" fn callback_trampoline<F>(
    _stream: sys::CUstream,
    status: sys::CUresult,
    data: *mut c_void,
) where
    F: FnOnce(std::result::Result<(), DriverError>) + Send + 'static,
{
    run_caught(|| {
        // SAFETY: `data` is the `Box<F>` that `add_callback` leaked for this one call;
        // the driver calls a stream callback exactly once.
        let f = unsafe { Box::from_raw(data.cast::<F>()) };
        let st = if status == sys::CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(super::driver_error(status, "stream callback"))
        };
        f(st);
    });
}

/// `cuLaunchHostFunc`: queues `f` on `s`; the driver runs it once, in stream order,
/// on a driver thread. When the launch fails, `f` is dropped without running.
pub fn launch_host_func<F: FnOnce() + Send + 'static>(s: sys::CUstream, f: F) -> Result<()> {
    let data = Box::into_raw(Box::new(f)).cast::<c_void>();
    // SAFETY: `s` is a live stream; the trampoline matches `F` and owns `data` from
    // the moment the driver accepts it.
    let r = drv!(cuLaunchHostFunc(s, Some(host_fn_trampoline::<F>), data));
    if r.is_err() {
        // SAFETY: the driver refused, so it never calls the trampoline: the box is
        // still ours, taken back once here.
        drop(unsafe { Box::from_raw(data.cast::<F>()) });
    }
    r
}

/// `cuStreamAddCallback`: queues `f` on `s`; the driver runs it once, in stream
/// order, with the stream's status. When the call fails, `f` is dropped unrun.
pub fn add_callback<F>(s: sys::CUstream, f: F) -> Result<()>
where
    F: FnOnce(std::result::Result<(), DriverError>) + Send + 'static,
{
    let data = Box::into_raw(Box::new(f)).cast::<c_void>();
    // SAFETY: `s` is a live stream; the trampoline matches `F` and owns `data` from
    // the moment the driver accepts it; flags must be 0.
    let r = drv!(cuStreamAddCallback(
        s,
        Some(callback_trampoline::<F>),
        data,
        0
    ));
    if r.is_err() {
        // SAFETY: the driver refused, so it never calls the trampoline: the box is
        // still ours, taken back once here.
        drop(unsafe { Box::from_raw(data.cast::<F>()) });
    }
    r
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
            callback_trampoline::<F>(
                std::ptr::null_mut(),
                sys::CUresult::CUDA_SUCCESS,
                data.cast(),
            )
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
