//! Checked driver calls about host memory (`cuMemHost*`, host<->device copies) and the
//! few event calls the pinned module needs. Addresses are integers (`u64`/`usize`): the safe types that own
//! the memory keep it valid, as each function's contract says.

use std::ffi::c_void;

use super::{drv, sys};
use crate::error::{Error, Result};

/// `cuMemHostAlloc(size, flags)`: page-locked host memory; the address as an integer.
/// A context must be current.
pub fn alloc(size: usize, flags: u32) -> Result<u64> {
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out pointer; a context is current (caller).
    drv!(cuMemHostAlloc(&mut p, size, flags))?;
    if p.is_null() {
        return Err(Error::InvalidState(format!(
            "cuMemHostAlloc({size}) succeeded but returned a null pointer"
        )));
    }
    Ok(p as u64)
}

/// `cuMemFreeHost`: `addr` must come from [`alloc`] and be freed once, with no copy
/// still using it.
pub fn free(addr: u64) -> Result<()> {
    // SAFETY: the caller passes an address from cuMemHostAlloc, freed once.
    drv!(cuMemFreeHost(addr as usize as *mut c_void))
}

/// `cuMemHostGetDevicePointer`: the device address of mapped pinned memory.
pub fn device_pointer(addr: u64) -> Result<u64> {
    let mut d: sys::CUdeviceptr = 0;
    // SAFETY: `d` is a valid out pointer; an unmapped address is an error code.
    drv!(cuMemHostGetDevicePointer_v2(
        &mut d,
        addr as usize as *mut c_void,
        0
    ))?;
    Ok(d)
}

/// `cuMemHostRegister(bytes, flags)`: page-locks memory the caller borrows mutably for
/// as long as it stays registered (the caller unregisters before the borrow ends).
pub fn register(bytes: &mut [u8], flags: u32) -> Result<()> {
    // SAFETY: `bytes` is valid for its length; the caller unregisters it before the
    // borrow ends.
    drv!(cuMemHostRegister_v2(
        bytes.as_mut_ptr().cast(),
        bytes.len(),
        flags
    ))
}

/// `cuMemHostUnregister`: `addr` is the start of a range given to [`register`].
pub fn unregister(addr: u64) -> Result<()> {
    // SAFETY: the driver checks that the address was registered.
    drv!(cuMemHostUnregister(addr as usize as *mut c_void))
}

/// `cuMemcpyHtoDAsync(dst, src, len, stream)`. The caller keeps `src..src+len` valid
/// and unwritten until the copy has completed on `stream`; `dst` is device memory of
/// at least `len` bytes (the driver refuses a bad address).
pub fn htod_async(dst: u64, src: u64, len: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller keeps the source valid until the copy completes (contract).
    drv!(cuMemcpyHtoDAsync_v2(
        dst,
        src as usize as *const c_void,
        len,
        stream
    ))
}

/// `cuMemcpyDtoHAsync(dst, src, len, stream)`. The caller keeps `dst..dst+len` valid
/// and unread until the copy has completed on `stream`.
pub fn dtoh_async(dst: u64, src: u64, len: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the caller keeps the destination valid and unaliased until the copy
    // completes (contract).
    drv!(cuMemcpyDtoHAsync_v2(
        dst as usize as *mut c_void,
        src,
        len,
        stream
    ))
}

/// Copies `src` to device address `dst` on `stream` and waits for the copy.
pub fn htod_sync(dst: u64, src: &[u8], stream: sys::CUstream) -> Result<()> {
    htod_async(dst, src.as_ptr() as u64, src.len(), stream)?;
    stream_synchronize(stream)
}

/// Copies device address `src` into `dst` on `stream` and waits for the copy.
pub fn dtoh_sync(dst: &mut [u8], src: u64, stream: sys::CUstream) -> Result<()> {
    dtoh_async(dst.as_mut_ptr() as u64, src, dst.len(), stream)?;
    stream_synchronize(stream)
}

/// `cuStreamSynchronize`.
pub fn stream_synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: a stream handle (or 0/2); the driver rejects invalid ones.
    drv!(cuStreamSynchronize(stream))
}

/// `cuStreamWaitEvent(stream, event, 0)`.
pub fn stream_wait_event(stream: sys::CUstream, event: usize) -> Result<()> {
    // SAFETY: handles owned by the caller.
    drv!(cuStreamWaitEvent(stream, event as sys::CUevent, 0))
}

/// `cuEventRecord(event, stream)`.
pub fn event_record(event: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: a live event handle (the caller holds it).
    drv!(cuEventRecord(event as sys::CUevent, stream))
}

/// `cuEventQuery`: `Ok(true)` when the work before the record has completed,
/// `Ok(false)` while it is pending.
pub fn event_query(event: usize) -> Result<bool> {
    let f = super::api()?.cuEventQuery()?;
    // SAFETY: a live event handle (the caller holds it).
    let rc = unsafe { f(event as sys::CUevent) };
    if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    super::check(rc, "cuEventQuery").map(|()| true)
}

/// `cuEventSynchronize`.
pub fn event_synchronize(event: usize) -> Result<()> {
    // SAFETY: a live event handle (the caller holds it).
    drv!(cuEventSynchronize(event as sys::CUevent))
}
