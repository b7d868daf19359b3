//! Checked driver calls about events (`cuEvent*`, `cuIpc*EventHandle`).
//!
//! Every call that takes a `CUevent` is an `unsafe fn`: the event is live (created and
//! not destroyed). Recording and querying are on the hot path of stream-ordered
//! lifetimes: inlined, one load of the cached entry point and one branch on the result.

use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use super::{api, check, Result};
use crate::driver::{CUevent, CUipcEventHandle, CUresult, CUstream};

/// A new event of the current context (`cuEventCreate`; `flags` are `CU_EVENT_*`). The
/// caller destroys it once with [`destroy`].
pub fn create(flags: u32) -> Result<CUevent> {
    let f = api()?.cuEventCreate()?;
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out pointer; the driver checks the flags and the context.
    check(unsafe { f(&mut e, flags) }, "cuEventCreate")?;
    Ok(e)
}

/// Destroys an event (`cuEventDestroy`); a record still pending completes first.
///
/// # Safety
/// `event` came from [`create`] (or [`ipc_open_event_handle`]), is destroyed once and not
/// used afterwards.
pub unsafe fn destroy(event: CUevent) -> Result<()> {
    let f = api()?.cuEventDestroy_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(event) }, "cuEventDestroy_v2")
}

/// Records `event` on `stream` (`cuEventRecord`): it completes when the work queued on
/// `stream` before it has.
///
/// # Safety
/// `event` is a live event; `stream` a live stream or a default-stream handle, of the
/// event's context.
#[inline]
pub unsafe fn record(event: CUevent, stream: CUstream) -> Result<()> {
    let f = api()?.cuEventRecord()?;
    // SAFETY: both handles are live (caller).
    check(unsafe { f(event, stream) }, "cuEventRecord")
}

/// Whether the work before the event's last record has completed (`cuEventQuery`):
/// `Ok(false)` while it is pending (`CUDA_ERROR_NOT_READY`); `Ok(true)` for an event
/// never recorded.
///
/// # Safety
/// `event` is a live event.
#[inline]
pub unsafe fn query(event: CUevent) -> Result<bool> {
    let f = api()?.cuEventQuery()?;
    // SAFETY: `event` is live (caller).
    let rc = unsafe { f(event) };
    if rc == CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    check(rc, "cuEventQuery")?;
    Ok(true)
}

/// Blocks until the work before the event's last record has completed
/// (`cuEventSynchronize`).
///
/// # Safety
/// `event` is a live event.
pub unsafe fn synchronize(event: CUevent) -> Result<()> {
    let f = api()?.cuEventSynchronize()?;
    // SAFETY: `event` is live (caller).
    check(unsafe { f(event) }, "cuEventSynchronize")
}

type ElapsedFn = unsafe extern "C" fn(*mut f32, CUevent, CUevent) -> CUresult;
static ELAPSED: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// Milliseconds between two recorded events (`cuEventElapsedTime`). The entry point is
/// asked for by its plain name, so a CUDA 12.0-12.7 driver gives its first version and
/// a newer one its latest; both take `(float*, CUevent, CUevent)`.
///
/// # Safety
/// `start` and `end` are live events of the same context.
pub unsafe fn elapsed_time(start: CUevent, end: CUevent) -> Result<f32> {
    let mut p = ELAPSED.load(Ordering::Acquire);
    if p.is_null() {
        p = api()?.library().resolve("cuEventElapsedTime")?;
        ELAPSED.store(p, Ordering::Release);
    }
    // SAFETY: `p` is the driver's non-null `cuEventElapsedTime` (any version), whose C
    // signature is `CUresult (float*, CUevent, CUevent)` in every CUDA release.
    let f = unsafe { std::mem::transmute::<*mut c_void, ElapsedFn>(p) };
    let mut ms = 0f32;
    // SAFETY: `ms` is a valid out pointer; `start` and `end` are live (caller).
    check(unsafe { f(&mut ms, start, end) }, "cuEventElapsedTime")?;
    Ok(ms)
}

/// The 64 bytes another process opens `event` with (`cuIpcGetEventHandle`).
///
/// # Safety
/// `event` is a live event (created with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`,
/// else an error code).
pub unsafe fn ipc_get_event_handle(event: CUevent) -> Result<[u8; 64]> {
    let f = api()?.cuIpcGetEventHandle()?;
    let mut h = CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out pointer; `event` is live (caller).
    check(unsafe { f(&mut h, event) }, "cuIpcGetEventHandle")?;
    Ok(h.reserved.map(|c| c as u8))
}

/// Opens an event of another process from its handle's bytes, in the current context
/// (`cuIpcOpenEventHandle`). The caller destroys it once with [`destroy`].
pub fn ipc_open_event_handle(bytes: &[u8; 64]) -> Result<CUevent> {
    let f = api()?.cuIpcOpenEventHandle()?;
    let h = CUipcEventHandle {
        reserved: bytes.map(|b| b as c_char),
    };
    let mut e: CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out pointer; the driver validates the handle's bytes.
    check(unsafe { f(&mut e, h) }, "cuIpcOpenEventHandle")?;
    Ok(e)
}
