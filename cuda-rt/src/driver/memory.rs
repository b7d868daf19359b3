//! Checked driver calls about memory: allocation (`cuMemAlloc*`, `cuMemAllocAsync`,
//! `cuMemAllocManaged`), copies and memsets, pointer attributes, managed-memory
//! prefetch and advice, and the driver's memory pools (`cuMemPool*`).
//!
//! Device pointers travel as `u64` (`CUdeviceptr`): the driver checks them and answers
//! an error code for an address it does not know. Host buffers travel as slices of
//! [`Pod`] values, so every host access stays inside memory the caller borrows.

use std::ffi::c_void;

use super::{drv, sys};
use crate::error::Result;
use crate::memory::Pod;

// ---------------------------------------------------------------------------
// Allocation

/// `cuMemAlloc`: `size` bytes of device memory in the current context. `size > 0`.
#[inline]
pub fn alloc(size: usize) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; a bad size is an error code.
    drv!(cuMemAlloc_v2(&mut p, size))?;
    Ok(p)
}

/// `cuMemFree`.
#[inline]
pub fn free(ptr: u64) -> Result<()> {
    // SAFETY: the driver checks the address; callers pass memory they own, once.
    drv!(cuMemFree_v2(ptr))
}

/// `cuMemAllocManaged(CU_MEM_ATTACH_GLOBAL)`: unified memory. `size > 0`.
pub fn alloc_managed(size: usize) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; the flag is one the driver documents.
    drv!(cuMemAllocManaged(
        &mut p,
        size,
        sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0
    ))?;
    Ok(p)
}

/// `cuMemAllocAsync` on `stream`, from the device's current memory pool.
#[inline]
pub fn alloc_async(size: usize, stream: sys::CUstream) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; `stream` is a live stream (or 0/2).
    drv!(cuMemAllocAsync(&mut p, size, stream))?;
    Ok(p)
}

/// `cuMemAllocFromPoolAsync` on `stream`, from `pool`.
#[inline]
pub fn alloc_from_pool_async(
    size: usize,
    pool: sys::CUmemoryPool,
    stream: sys::CUstream,
) -> Result<u64> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; `pool` and `stream` are live handles.
    drv!(cuMemAllocFromPoolAsync(&mut p, size, pool, stream))?;
    Ok(p)
}

/// `cuMemFreeAsync` on `stream`.
#[inline]
pub fn free_async(ptr: u64, stream: sys::CUstream) -> Result<()> {
    // SAFETY: the driver checks the address and the stream handle.
    drv!(cuMemFreeAsync(ptr, stream))
}

// ---------------------------------------------------------------------------
// Pointer attributes

/// The device ordinal that owns `ptr` (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`).
pub fn pointer_device_ordinal(ptr: u64) -> Result<i32> {
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute's value is an `int`; `ordinal` is a valid out pointer of
    // that type. An unknown address is an error code.
    drv!(cuPointerGetAttribute(
        (&mut ordinal as *mut i32).cast::<c_void>(),
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ptr
    ))?;
    Ok(ordinal)
}

/// Whether the host buffer `buf` is page-locked (allocated by `cuMemHostAlloc` or
/// registered): then an asynchronous copy really runs after the call returns.
pub fn is_page_locked<T: Pod>(buf: &[T]) -> bool {
    if buf.is_empty() {
        return false;
    }
    let mut ty: u32 = 0;
    // SAFETY: the attribute's value is a `CUmemorytype` (an unsigned int); `ty` is a
    // valid out pointer of that size. Pageable memory gives an error code.
    let r = (|| {
        drv!(cuPointerGetAttribute(
            (&mut ty as *mut u32).cast::<c_void>(),
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            buf.as_ptr() as u64
        ))
    })();
    r.is_ok() && ty == sys::CUmemorytype::CU_MEMORYTYPE_HOST.0
}

/// The bytes of a slice of plain data.
#[inline]
pub fn as_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so all `size_of_val(s)` bytes are initialised;
    // the view borrows `s` and `u8` has alignment 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of plain data.
#[inline]
pub fn as_bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; any bytes written are a valid `T` (`Pod`: every bit
    // pattern is a value), and the view borrows `s` mutably.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

// ---------------------------------------------------------------------------
// Copies. Sizes are in bytes and were checked against both buffers by the caller;
// host buffers are borrowed slices, whose byte length bounds every host access.

/// `cuMemcpyHtoD`: all of `src` to `dst`.
pub fn htod<T: Pod>(dst: u64, src: &[T]) -> Result<()> {
    // SAFETY: `src` is readable for `size_of_val(src)` bytes; the driver checks `dst`.
    drv!(cuMemcpyHtoD_v2(
        dst,
        src.as_ptr().cast::<c_void>(),
        std::mem::size_of_val(src)
    ))
}

/// `cuMemcpyHtoDAsync`: all of `src` to `dst` on `stream`. The caller makes sure the
/// copy has read `src` before the borrow ends (pageable memory is staged before the
/// call returns; for page-locked memory the caller synchronizes).
pub fn htod_async<T: Pod>(dst: u64, src: &[T], stream: sys::CUstream) -> Result<()> {
    // SAFETY: `src` is readable for its byte length; see the contract above for the
    // time it is read.
    drv!(cuMemcpyHtoDAsync_v2(
        dst,
        src.as_ptr().cast::<c_void>(),
        std::mem::size_of_val(src),
        stream
    ))
}

/// `cuMemcpyDtoH`: fills all of `dst` from `src`.
pub fn dtoh<T: Pod>(dst: &mut [T], src: u64) -> Result<()> {
    // SAFETY: `dst` is writable for its byte length and any bit pattern is a valid
    // `T` (`Pod`); the driver checks `src`.
    drv!(cuMemcpyDtoH_v2(
        dst.as_mut_ptr().cast::<c_void>(),
        src,
        std::mem::size_of_val(dst)
    ))
}

/// `cuMemcpyDtoHAsync` on `stream`. Pageable destinations complete before the call
/// returns; for page-locked ones the caller synchronizes before the borrow ends.
pub fn dtoh_async<T: Pod>(dst: &mut [T], src: u64, stream: sys::CUstream) -> Result<()> {
    // SAFETY: `dst` is writable for its byte length, any bit pattern is a valid `T`;
    // see the contract above for the time it is written.
    drv!(cuMemcpyDtoHAsync_v2(
        dst.as_mut_ptr().cast::<c_void>(),
        src,
        std::mem::size_of_val(dst),
        stream
    ))
}

/// `cuMemcpyDtoD`.
pub fn dtod(dst: u64, src: u64, size: usize) -> Result<()> {
    // SAFETY: device addresses only; the driver checks them.
    drv!(cuMemcpyDtoD_v2(dst, src, size))
}

/// `cuMemcpyDtoDAsync` on `stream`.
pub fn dtod_async(dst: u64, src: u64, size: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: device addresses only; the driver checks them and the stream.
    drv!(cuMemcpyDtoDAsync_v2(dst, src, size, stream))
}

/// `cuMemcpyPeer` between the primary contexts of two devices.
pub fn peer(
    dst: u64,
    dst_ctx: sys::CUcontext,
    src: u64,
    src_ctx: sys::CUcontext,
    size: usize,
) -> Result<()> {
    // SAFETY: device addresses and retained contexts; the driver checks them.
    drv!(cuMemcpyPeer(dst, dst_ctx, src, src_ctx, size))
}

/// `cuMemcpyPeerAsync` on `stream`.
pub fn peer_async(
    dst: u64,
    dst_ctx: sys::CUcontext,
    src: u64,
    src_ctx: sys::CUcontext,
    size: usize,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: device addresses, retained contexts and a live stream.
    drv!(cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, size, stream))
}

// ---------------------------------------------------------------------------
// Memset. `count` is in elements of the width.

/// `cuMemsetD8`.
pub fn memset_d8(dst: u64, value: u8, count: usize) -> Result<()> {
    // SAFETY: device address only; the driver checks it.
    drv!(cuMemsetD8_v2(dst, value, count))
}

/// `cuMemsetD16` (`dst` 2-byte aligned).
pub fn memset_d16(dst: u64, value: u16, count: usize) -> Result<()> {
    // SAFETY: device address only; the driver checks it and its alignment.
    drv!(cuMemsetD16_v2(dst, value, count))
}

/// `cuMemsetD32` (`dst` 4-byte aligned).
pub fn memset_d32(dst: u64, value: u32, count: usize) -> Result<()> {
    // SAFETY: device address only; the driver checks it and its alignment.
    drv!(cuMemsetD32_v2(dst, value, count))
}

/// `cuMemsetD8Async` on `stream`.
pub fn memset_d8_async(dst: u64, value: u8, count: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: device address and a live stream; the driver checks them.
    drv!(cuMemsetD8Async(dst, value, count, stream))
}

/// `cuMemsetD16Async` on `stream`.
pub fn memset_d16_async(dst: u64, value: u16, count: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: device address and a live stream; the driver checks them.
    drv!(cuMemsetD16Async(dst, value, count, stream))
}

/// `cuMemsetD32Async` on `stream`.
pub fn memset_d32_async(dst: u64, value: u32, count: usize, stream: sys::CUstream) -> Result<()> {
    // SAFETY: device address and a live stream; the driver checks them.
    drv!(cuMemsetD32Async(dst, value, count, stream))
}

// ---------------------------------------------------------------------------
// Streams, as far as memory needs them.

/// Whether `stream` is capturing a graph now (`cuStreamIsCapturing`; an invalidated
/// capture counts as capturing: the stream is still in capture mode).
pub fn stream_is_capturing(stream: sys::CUstream) -> Result<bool> {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out pointer; the driver checks the stream.
    drv!(cuStreamIsCapturing(stream, &mut status))?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// `cuStreamSynchronize`.
pub fn stream_synchronize(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the driver checks the stream handle.
    drv!(cuStreamSynchronize(stream))
}

/// `cuStreamBeginCapture` in relaxed mode (tests use it to prove that synchronous
/// copies are refused during a capture).
pub fn stream_begin_capture(stream: sys::CUstream) -> Result<()> {
    // SAFETY: the driver checks the stream; the mode is a documented value.
    drv!(cuStreamBeginCapture_v2(
        stream,
        sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED
    ))
}

/// `cuStreamEndCapture`, destroying the captured graph at once.
pub fn stream_end_capture_and_discard(stream: sys::CUstream) -> Result<()> {
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `graph` is a valid out pointer; the driver checks the stream.
    let r = drv!(cuStreamEndCapture(stream, &mut graph));
    if !graph.is_null() {
        // SAFETY: the graph was just created by the capture and is destroyed once.
        drv!(cuGraphDestroy(graph))?;
    }
    r
}

// ---------------------------------------------------------------------------
// Managed memory

/// A `CUmemLocation` for device `id`, or the host when `id` is `None`.
fn location(device: Option<i32>) -> sys::CUmemLocation {
    match device {
        Some(id) => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id,
        },
        None => sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    }
}

/// `cuMemPrefetchAsync` (the CUDA 12.2 form, with a `CUmemLocation`): moves
/// `[ptr, ptr + size)` of managed memory to `device` (`None`: the host) on `stream`.
pub fn prefetch_async(
    ptr: u64,
    size: usize,
    device: Option<i32>,
    stream: sys::CUstream,
) -> Result<()> {
    // SAFETY: managed range owned by the caller; location by value; the driver checks
    // the range, the location and the stream.
    drv!(cuMemPrefetchAsync_v2(
        ptr,
        size,
        location(device),
        0,
        stream
    ))
}

/// `cuMemAdvise` (the CUDA 12.2 form, with a `CUmemLocation`).
pub fn advise(ptr: u64, size: usize, advice: sys::CUmem_advise, device: Option<i32>) -> Result<()> {
    // SAFETY: managed range owned by the caller; the driver checks every argument.
    drv!(cuMemAdvise_v2(ptr, size, advice, location(device)))
}

// ---------------------------------------------------------------------------
// Memory pools

/// The device's current memory pool (`cuDeviceGetMemPool`).
pub fn device_mem_pool(dev: sys::CUdevice) -> Result<sys::CUmemoryPool> {
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out pointer; `dev` came from cuDeviceGet.
    drv!(cuDeviceGetMemPool(&mut pool, dev))?;
    Ok(pool)
}

/// A new pool of pinned device memory on device `id` (`cuMemPoolCreate`).
pub fn pool_create(id: i32) -> Result<sys::CUmemoryPool> {
    // SAFETY: an all-zero `CUmemPoolProps` is its documented default (no handle
    // types, no size cap, reserved bytes zero).
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.location = location(Some(id));
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: both pointers are valid; `props` is fully initialised.
    drv!(cuMemPoolCreate(&mut pool, &props))?;
    Ok(pool)
}

/// `cuMemPoolDestroy`.
pub fn pool_destroy(pool: sys::CUmemoryPool) -> Result<()> {
    // SAFETY: the pool was created by `pool_create` and is destroyed once.
    drv!(cuMemPoolDestroy(pool))
}

/// `cuMemPoolTrimTo`.
pub fn pool_trim_to(pool: sys::CUmemoryPool, keep: usize) -> Result<()> {
    // SAFETY: a live pool handle.
    drv!(cuMemPoolTrimTo(pool, keep))
}

/// A 64-bit pool attribute (`cuMemPoolGetAttribute`): thresholds and byte counters.
pub fn pool_get_u64(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute) -> Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the callers ask only for `cuuint64_t` attributes; `v` is a valid out
    // pointer of that type.
    drv!(cuMemPoolGetAttribute(
        pool,
        attr,
        (&mut v as *mut u64).cast::<c_void>()
    ))?;
    Ok(v)
}

/// Sets a 64-bit pool attribute (`cuMemPoolSetAttribute`).
pub fn pool_set_u64(
    pool: sys::CUmemoryPool,
    attr: sys::CUmemPool_attribute,
    value: u64,
) -> Result<()> {
    let mut v = value;
    // SAFETY: the callers set only `cuuint64_t` attributes; `v` lives across the call.
    drv!(cuMemPoolSetAttribute(
        pool,
        attr,
        (&mut v as *mut u64).cast::<c_void>()
    ))
}
