//! Checked driver calls about events (`cuEvent*`, `cuIpc*EventHandle`).

use std::ffi::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use super::{drv, sys};
use crate::error::{Error, Result};

/// `cuEventCreate` in the current context.
pub fn create(flags: u32) -> Result<sys::CUevent> {
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out pointer; the driver checks the flags.
    drv!(cuEventCreate(&mut e, flags))?;
    Ok(e)
}

/// `cuEventDestroy`.
pub fn destroy(e: sys::CUevent) -> Result<()> {
    // SAFETY: the caller owns `e` and destroys it once.
    drv!(cuEventDestroy_v2(e))
}

/// `cuEventRecord` of `e` on `s`.
#[inline]
pub fn record(e: sys::CUevent, s: sys::CUstream) -> Result<()> {
    // SAFETY: `e` and `s` are live handles of the same context.
    drv!(cuEventRecord(e, s))
}

/// `cuEventQuery`: `Ok(true)` when the last record has completed.
#[inline]
pub fn query(e: sys::CUevent) -> Result<bool> {
    let f = super::api()?.cuEventQuery()?;
    // SAFETY: `e` is a live event.
    let rc = unsafe { f(e) };
    if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    super::check(rc, "cuEventQuery")?;
    Ok(true)
}

/// `cuEventSynchronize`.
pub fn synchronize(e: sys::CUevent) -> Result<()> {
    // SAFETY: `e` is a live event.
    drv!(cuEventSynchronize(e))
}

type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;
static ELAPSED: AtomicPtr<c_void> = AtomicPtr::new(std::ptr::null_mut());

/// `cuEventElapsedTime` in milliseconds. The entry point is asked for by its plain
/// name, so a CUDA 12.0-12.7 driver gives its first version and a newer one its
/// latest; both take `(float*, CUevent, CUevent)`.
pub fn elapsed_ms(start: sys::CUevent, end: sys::CUevent) -> Result<f32> {
    let mut p = ELAPSED.load(Ordering::Acquire);
    if p.is_null() {
        p = super::api()?
            .library()
            .resolve("cuEventElapsedTime")
            .map_err(Error::Load)?;
        ELAPSED.store(p, Ordering::Release);
    }
    // SAFETY: `p` is the driver's non-null `cuEventElapsedTime` (any version), whose C
    // signature is `CUresult (float*, CUevent, CUevent)` in every CUDA release.
    let f = unsafe { std::mem::transmute::<*mut c_void, ElapsedFn>(p) };
    let mut ms = 0f32;
    // SAFETY: `ms` is a valid out pointer; `start` and `end` are live events.
    let rc = unsafe { f(&mut ms, start, end) };
    super::check(rc, "cuEventElapsedTime")?;
    Ok(ms)
}

/// `cuIpcGetEventHandle`: the 64 bytes another process opens the event with.
pub fn ipc_get_handle(e: sys::CUevent) -> Result<[u8; 64]> {
    let mut h = sys::CUipcEventHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out pointer; `e` is a live interprocess event.
    drv!(cuIpcGetEventHandle(&mut h, e))?;
    Ok(h.reserved.map(|c| c as u8))
}

/// `cuIpcOpenEventHandle` in the current context.
pub fn ipc_open_handle(bytes: &[u8; 64]) -> Result<sys::CUevent> {
    let h = sys::CUipcEventHandle {
        reserved: bytes.map(|b| b as std::ffi::c_char),
    };
    let mut e: sys::CUevent = std::ptr::null_mut();
    // SAFETY: `e` is a valid out pointer; the driver validates the handle's bytes.
    drv!(cuIpcOpenEventHandle(&mut e, h))?;
    Ok(e)
}
