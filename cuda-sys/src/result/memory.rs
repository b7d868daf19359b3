//! Checked driver calls about memory: device allocation (`cuMemAlloc`,
//! `cuMemAllocAsync`, `cuMemAllocFromPoolAsync`, `cuMemAllocManaged`), page-locked host
//! memory (`cuMemHostAlloc`, `cuMemHostRegister`), copies and memsets, pointer
//! attributes, managed-memory prefetch and advice, and the driver's memory pools
//! (`cuMemPool*`).
//!
//! Device addresses are [`CUdeviceptr`]s (`u64`). Allocating is safe (a failure is an
//! error code, a lost allocation only a leak); everything that frees, reads or writes
//! memory, or takes a stream or a pool, is an `unsafe fn` whose `# Safety` says which
//! ranges must be valid and for how long.
//!
//! Host memory that a call reads or writes follows Rust's rules for the whole time the
//! driver uses it: readable (or writable and unaliased) and alive. Device memory must be
//! allocated for as long as the work using it runs; device work racing on the same
//! device bytes gets unspecified values, as in CUDA, but no host memory is touched.
//!
//! The allocation and free calls, synchronous and stream-ordered, are on the hot path
//! of a memory pool: inlined, one load of the cached entry point and one branch on the
//! result.

use std::ffi::c_void;

use super::{api, check, Result};
use crate::driver::{
    CUcontext, CUdeviceptr, CUmemLocation, CUmemPoolProps, CUmemPool_attribute, CUmem_advise,
    CUmemoryPool, CUmemorytype, CUpointer_attribute, CUstream,
};

// ---------------------------------------------------------------------------
// Allocation

/// `size` bytes of device memory in the current context (`cuMemAlloc`); the caller
/// frees it once with [`free`]. `size` 0 and a missing context are error codes.
#[inline]
pub fn alloc(size: usize) -> Result<CUdeviceptr> {
    let f = api()?.cuMemAlloc_v2()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer.
    check(unsafe { f(&mut p, size) }, "cuMemAlloc_v2")?;
    Ok(p)
}

/// Frees memory from [`alloc`] or [`alloc_managed`] (`cuMemFree`).
///
/// # Safety
/// `ptr` came from one of those calls and is freed once, and nothing uses it afterwards
/// (the driver waits for work already queued that uses it).
#[inline]
pub unsafe fn free(ptr: CUdeviceptr) -> Result<()> {
    let f = api()?.cuMemFree_v2()?;
    // SAFETY: an allocation the caller owns, freed once (see `# Safety`).
    check(unsafe { f(ptr) }, "cuMemFree_v2")
}

/// `size` bytes of managed (unified) memory (`cuMemAllocManaged`); `flags` is a
/// `CUmemAttach_flags` value (`CU_MEM_ATTACH_GLOBAL` to reach it from every stream).
/// The caller frees it once with [`free`].
pub fn alloc_managed(size: usize, flags: u32) -> Result<CUdeviceptr> {
    let f = api()?.cuMemAllocManaged()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; the driver checks size and flags.
    check(unsafe { f(&mut p, size, flags) }, "cuMemAllocManaged")?;
    Ok(p)
}

/// `size` bytes in stream order on `stream`, from its device's current memory pool
/// (`cuMemAllocAsync`). The memory may be used by work queued after this call on
/// `stream`; the caller frees it once with [`free_async`] (or [`free`]).
///
/// # Safety
/// `stream` is a live stream of the current context (or a default-stream handle).
#[inline]
pub unsafe fn alloc_async(size: usize, stream: CUstream) -> Result<CUdeviceptr> {
    let f = api()?.cuMemAllocAsync()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; `stream` is live (caller).
    check(unsafe { f(&mut p, size, stream) }, "cuMemAllocAsync")?;
    Ok(p)
}

/// `size` bytes in stream order on `stream`, from `pool` (`cuMemAllocFromPoolAsync`).
///
/// # Safety
/// `pool` is a live memory pool; `stream` a live stream (or a default-stream handle) of
/// the current context, which can reach the pool's device.
#[inline]
pub unsafe fn alloc_from_pool_async(
    size: usize,
    pool: CUmemoryPool,
    stream: CUstream,
) -> Result<CUdeviceptr> {
    let f = api()?.cuMemAllocFromPoolAsync()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; `pool` and `stream` are live (caller).
    check(
        unsafe { f(&mut p, size, pool, stream) },
        "cuMemAllocFromPoolAsync",
    )?;
    Ok(p)
}

/// Frees `ptr` in stream order on `stream` (`cuMemFreeAsync`): work queued before on
/// `stream` may still use it.
///
/// # Safety
/// `ptr` is an allocation the caller owns, freed once and not used afterwards; `stream`
/// is a live stream (or a default-stream handle). Work on other streams that still uses
/// `ptr` should be ordered before the free, or it reads and writes memory that later
/// allocations may reuse (device memory only: see the [module](self) docs).
#[inline]
pub unsafe fn free_async(ptr: CUdeviceptr, stream: CUstream) -> Result<()> {
    let f = api()?.cuMemFreeAsync()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(ptr, stream) }, "cuMemFreeAsync")
}

/// Free and total memory of the current context's device, in bytes (`cuMemGetInfo`).
pub fn get_info() -> Result<(usize, usize)> {
    let f = api()?.cuMemGetInfo_v2()?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both are valid out pointers.
    check(unsafe { f(&mut free, &mut total) }, "cuMemGetInfo_v2")?;
    Ok((free, total))
}

// ---------------------------------------------------------------------------
// Page-locked host memory

/// `size` bytes of page-locked host memory (`cuMemHostAlloc`; `flags` are
/// `CU_MEMHOSTALLOC_*`) in the current context. The caller frees it once with
/// [`free_host`]. The driver may answer success with a null pointer for `size` 0.
pub fn host_alloc(size: usize, flags: u32) -> Result<*mut c_void> {
    let f = api()?.cuMemHostAlloc()?;
    let mut p: *mut c_void = std::ptr::null_mut();
    // SAFETY: `p` is a valid out pointer; the driver checks size, flags and context.
    check(unsafe { f(&mut p, size, flags) }, "cuMemHostAlloc")?;
    Ok(p)
}

/// Frees page-locked memory from [`host_alloc`] (`cuMemFreeHost`).
///
/// # Safety
/// `p` came from [`host_alloc`] and is freed once; no copy still queued uses it and
/// nothing reads or writes it afterwards.
pub unsafe fn free_host(p: *mut c_void) -> Result<()> {
    let f = api()?.cuMemFreeHost()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(p) }, "cuMemFreeHost")
}

/// The device address of mapped page-locked memory (`cuMemHostGetDevicePointer`);
/// memory that is not mapped is an error code.
// Safe: the driver only looks `p` up in its own tables; it never dereferences it.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
pub fn host_get_device_pointer(p: *mut c_void) -> Result<CUdeviceptr> {
    let f = api()?.cuMemHostGetDevicePointer_v2()?;
    let mut d: CUdeviceptr = 0;
    // SAFETY: `d` is a valid out pointer; the driver only looks `p` up (flags must be 0).
    check(unsafe { f(&mut d, p, 0) }, "cuMemHostGetDevicePointer_v2")?;
    Ok(d)
}

/// Page-locks `bytes` bytes at `p` (`cuMemHostRegister`; `flags` are
/// `CU_MEMHOSTREGISTER_*`).
///
/// # Safety
/// `p..p + bytes` is allocated host memory the caller may use (registering changes no
/// byte of it); copies that use it later follow the host-memory rule of the
/// [module](self) docs.
pub unsafe fn host_register(p: *mut c_void, bytes: usize, flags: u32) -> Result<()> {
    let f = api()?.cuMemHostRegister_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(p, bytes, flags) }, "cuMemHostRegister_v2")
}

/// Unregisters memory page-locked by [`host_register`] (`cuMemHostUnregister`).
///
/// # Safety
/// `p` is the start of a registered range; no copy still queued uses it.
pub unsafe fn host_unregister(p: *mut c_void) -> Result<()> {
    let f = api()?.cuMemHostUnregister()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(p) }, "cuMemHostUnregister")
}

// ---------------------------------------------------------------------------
// Pointer attributes

/// The ordinal of the device that owns `ptr` (`cuPointerGetAttribute` with
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); an address CUDA does not know is an error
/// code. Nothing is dereferenced.
pub fn pointer_get_device_ordinal(ptr: CUdeviceptr) -> Result<i32> {
    let f = api()?.cuPointerGetAttribute()?;
    let mut ordinal: i32 = -1;
    // SAFETY: the attribute's value is an `int`; `ordinal` is a valid out pointer of
    // that type. The driver only looks `ptr` up.
    let rc = unsafe {
        f(
            (&mut ordinal as *mut i32).cast::<c_void>(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr,
        )
    };
    check(rc, "cuPointerGetAttribute")?;
    Ok(ordinal)
}

/// The kind of memory at `ptr`: host (page-locked), device, array or unified
/// (`cuPointerGetAttribute` with `CU_POINTER_ATTRIBUTE_MEMORY_TYPE`). Pageable host
/// memory is an error code. Nothing is dereferenced.
pub fn pointer_get_memory_type(ptr: CUdeviceptr) -> Result<CUmemorytype> {
    let f = api()?.cuPointerGetAttribute()?;
    let mut ty: u32 = 0;
    // SAFETY: the attribute's value is a `CUmemorytype` (an unsigned int); `ty` is a
    // valid out pointer of that size. The driver only looks `ptr` up.
    let rc = unsafe {
        f(
            (&mut ty as *mut u32).cast::<c_void>(),
            CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
            ptr,
        )
    };
    check(rc, "cuPointerGetAttribute")?;
    Ok(CUmemorytype(ty))
}

// ---------------------------------------------------------------------------
// Copies. Sizes are in bytes.

/// Copies all of `src` to device address `dst` (`cuMemcpyHtoD`); returns once the
/// source has been read.
///
/// # Safety
/// `dst..dst + src.len()` is allocated device (or managed, or mapped) memory.
pub unsafe fn memcpy_htod(dst: CUdeviceptr, src: &[u8]) -> Result<()> {
    let f = api()?.cuMemcpyHtoD_v2()?;
    // SAFETY: `src` is readable for its length; the destination is the caller's (see
    // `# Safety`).
    check(
        unsafe { f(dst, src.as_ptr().cast::<c_void>(), src.len()) },
        "cuMemcpyHtoD_v2",
    )
}

/// Fills all of `dst` from device address `src` (`cuMemcpyDtoH`).
///
/// # Safety
/// `src..src + dst.len()` is allocated device (or managed, or mapped) memory.
pub unsafe fn memcpy_dtoh(dst: &mut [u8], src: CUdeviceptr) -> Result<()> {
    let f = api()?.cuMemcpyDtoH_v2()?;
    // SAFETY: `dst` is writable for its length (any byte is a valid `u8`); the source
    // is the caller's (see `# Safety`).
    check(
        unsafe { f(dst.as_mut_ptr().cast::<c_void>(), src, dst.len()) },
        "cuMemcpyDtoH_v2",
    )
}

/// Queues a copy of `bytes` bytes from host address `src` to device address `dst` on
/// `stream` (`cuMemcpyHtoDAsync`). From pageable memory the driver stages the source
/// before it returns; from page-locked memory the copy reads it later, in stream order.
///
/// # Safety
/// `stream` is a live stream (or a default-stream handle) of the current context;
/// `src..src + bytes` stays readable and unwritten, and `dst..dst + bytes` allocated
/// device memory, until the copy has completed on `stream`.
pub unsafe fn memcpy_htod_async(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemcpyHtoDAsync_v2()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(dst, src, bytes, stream) },
        "cuMemcpyHtoDAsync_v2",
    )
}

/// Queues a copy of `bytes` bytes from device address `src` to host address `dst` on
/// `stream` (`cuMemcpyDtoHAsync`). Into pageable memory the copy completes before the
/// call returns; into page-locked memory it writes later, in stream order.
///
/// # Safety
/// `stream` is a live stream (or a default-stream handle) of the current context;
/// `dst..dst + bytes` stays writable, and is neither read nor written by anyone else,
/// and `src..src + bytes` allocated device memory, until the copy has completed on
/// `stream`. Every byte pattern written must be valid for what `dst` holds.
pub unsafe fn memcpy_dtoh_async(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemcpyDtoHAsync_v2()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(dst, src, bytes, stream) },
        "cuMemcpyDtoHAsync_v2",
    )
}

/// Copies `bytes` bytes between device addresses (`cuMemcpyDtoD`).
///
/// # Safety
/// Both ranges are allocated device (or managed, or mapped) memory.
pub unsafe fn memcpy_dtod(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> Result<()> {
    let f = api()?.cuMemcpyDtoD_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, src, bytes) }, "cuMemcpyDtoD_v2")
}

/// Queues a copy of `bytes` bytes between device addresses on `stream`
/// (`cuMemcpyDtoDAsync`).
///
/// # Safety
/// `stream` is a live stream (or a default-stream handle) of the current context; both
/// ranges are allocated device memory until the copy has completed on `stream`.
pub unsafe fn memcpy_dtod_async(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemcpyDtoDAsync_v2()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(dst, src, bytes, stream) },
        "cuMemcpyDtoDAsync_v2",
    )
}

/// Copies `bytes` bytes from `src` in context `src_ctx` to `dst` in context `dst_ctx`
/// (`cuMemcpyPeer`).
///
/// # Safety
/// Both contexts are live; both ranges are allocated memory of their context.
pub unsafe fn memcpy_peer(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
) -> Result<()> {
    let f = api()?.cuMemcpyPeer()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(dst, dst_ctx, src, src_ctx, bytes) },
        "cuMemcpyPeer",
    )
}

/// Queues a peer copy on `stream` (`cuMemcpyPeerAsync`).
///
/// # Safety
/// As for [`memcpy_peer`], until the copy has completed on `stream`, which is a live
/// stream (or a default-stream handle).
pub unsafe fn memcpy_peer_async(
    dst: CUdeviceptr,
    dst_ctx: CUcontext,
    src: CUdeviceptr,
    src_ctx: CUcontext,
    bytes: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemcpyPeerAsync()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(dst, dst_ctx, src, src_ctx, bytes, stream) },
        "cuMemcpyPeerAsync",
    )
}

// ---------------------------------------------------------------------------
// Memset. `count` is in elements of the width.

/// Sets `count` bytes at `dst` to `value` (`cuMemsetD8`).
///
/// # Safety
/// `dst..dst + count` is allocated device (or managed, or mapped) memory.
pub unsafe fn memset_d8(dst: CUdeviceptr, value: u8, count: usize) -> Result<()> {
    let f = api()?.cuMemsetD8_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, value, count) }, "cuMemsetD8_v2")
}

/// Sets `count` 2-byte words at `dst` (2-byte aligned) to `value` (`cuMemsetD16`).
///
/// # Safety
/// As for [`memset_d8`], for `2 * count` bytes.
pub unsafe fn memset_d16(dst: CUdeviceptr, value: u16, count: usize) -> Result<()> {
    let f = api()?.cuMemsetD16_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, value, count) }, "cuMemsetD16_v2")
}

/// Sets `count` 4-byte words at `dst` (4-byte aligned) to `value` (`cuMemsetD32`).
///
/// # Safety
/// As for [`memset_d8`], for `4 * count` bytes.
pub unsafe fn memset_d32(dst: CUdeviceptr, value: u32, count: usize) -> Result<()> {
    let f = api()?.cuMemsetD32_v2()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, value, count) }, "cuMemsetD32_v2")
}

/// Queues [`memset_d8`] on `stream` (`cuMemsetD8Async`).
///
/// # Safety
/// As for [`memset_d8`], until the set has completed on `stream`, which is a live
/// stream (or a default-stream handle) of the current context.
pub unsafe fn memset_d8_async(
    dst: CUdeviceptr,
    value: u8,
    count: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemsetD8Async()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, value, count, stream) }, "cuMemsetD8Async")
}

/// Queues [`memset_d16`] on `stream` (`cuMemsetD16Async`).
///
/// # Safety
/// As for [`memset_d8_async`], for `2 * count` bytes.
pub unsafe fn memset_d16_async(
    dst: CUdeviceptr,
    value: u16,
    count: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemsetD16Async()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, value, count, stream) }, "cuMemsetD16Async")
}

/// Queues [`memset_d32`] on `stream` (`cuMemsetD32Async`).
///
/// # Safety
/// As for [`memset_d8_async`], for `4 * count` bytes.
pub unsafe fn memset_d32_async(
    dst: CUdeviceptr,
    value: u32,
    count: usize,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemsetD32Async()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(dst, value, count, stream) }, "cuMemsetD32Async")
}

// ---------------------------------------------------------------------------
// Managed memory

/// Queues a move of `size` bytes of managed memory at `ptr` to `location` on `stream`
/// (`cuMemPrefetchAsync`, the CUDA 12.2 form with a `CUmemLocation`).
///
/// # Safety
/// `ptr..ptr + size` is managed memory the caller owns, alive until the prefetch has
/// completed; `stream` is a live stream (or a default-stream handle).
pub unsafe fn prefetch_async(
    ptr: CUdeviceptr,
    size: usize,
    location: CUmemLocation,
    stream: CUstream,
) -> Result<()> {
    let f = api()?.cuMemPrefetchAsync_v2()?;
    // SAFETY: see `# Safety`; flags must be 0.
    check(
        unsafe { f(ptr, size, location, 0, stream) },
        "cuMemPrefetchAsync_v2",
    )
}

/// Advises the driver about `size` bytes of managed memory at `ptr` (`cuMemAdvise`, the
/// CUDA 12.2 form with a `CUmemLocation`).
///
/// # Safety
/// `ptr..ptr + size` is managed memory the caller owns.
pub unsafe fn advise(
    ptr: CUdeviceptr,
    size: usize,
    advice: CUmem_advise,
    location: CUmemLocation,
) -> Result<()> {
    let f = api()?.cuMemAdvise_v2()?;
    // SAFETY: see `# Safety`; the driver checks the advice and the location.
    check(unsafe { f(ptr, size, advice, location) }, "cuMemAdvise_v2")
}

// ---------------------------------------------------------------------------
// Memory pools

/// A new memory pool with `props` (`cuMemPoolCreate`); the caller destroys it once with
/// [`pool_destroy`].
pub fn pool_create(props: &CUmemPoolProps) -> Result<CUmemoryPool> {
    let f = api()?.cuMemPoolCreate()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: both pointers are valid; `props` is an initialised value (the driver
    // checks its fields; an all-zero value is its documented default).
    check(unsafe { f(&mut pool, props) }, "cuMemPoolCreate")?;
    Ok(pool)
}

/// Destroys a pool from [`pool_create`] (`cuMemPoolDestroy`); memory still allocated
/// from it is freed when it is freed.
///
/// # Safety
/// `pool` came from [`pool_create`], is destroyed once and not used afterwards.
pub unsafe fn pool_destroy(pool: CUmemoryPool) -> Result<()> {
    let f = api()?.cuMemPoolDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(pool) }, "cuMemPoolDestroy")
}

/// Gives memory the pool holds back to the system, keeping at least `keep` bytes
/// (`cuMemPoolTrimTo`).
///
/// # Safety
/// `pool` is a live pool.
pub unsafe fn pool_trim_to(pool: CUmemoryPool, keep: usize) -> Result<()> {
    let f = api()?.cuMemPoolTrimTo()?;
    // SAFETY: `pool` is live (caller).
    check(unsafe { f(pool, keep) }, "cuMemPoolTrimTo")
}

/// A pool attribute whose value is a `cuuint64_t`: the release threshold and the byte
/// counters (`cuMemPoolGetAttribute`).
///
/// # Safety
/// `pool` is a live pool.
pub unsafe fn pool_get_attribute_u64(pool: CUmemoryPool, attr: CUmemPool_attribute) -> Result<u64> {
    let f = api()?.cuMemPoolGetAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: `pool` is live (caller); `v` is a valid out pointer of 8 bytes, as big as
    // any attribute's value.
    check(
        unsafe { f(pool, attr, (&mut v as *mut u64).cast::<c_void>()) },
        "cuMemPoolGetAttribute",
    )?;
    Ok(v)
}

/// Sets a pool attribute whose value is a `cuuint64_t` (`cuMemPoolSetAttribute`).
///
/// # Safety
/// `pool` is a live pool.
pub unsafe fn pool_set_attribute_u64(
    pool: CUmemoryPool,
    attr: CUmemPool_attribute,
    value: u64,
) -> Result<()> {
    let f = api()?.cuMemPoolSetAttribute()?;
    let mut v = value;
    // SAFETY: `pool` is live (caller); `v` holds 8 bytes and lives across the call.
    check(
        unsafe { f(pool, attr, (&mut v as *mut u64).cast::<c_void>()) },
        "cuMemPoolSetAttribute",
    )
}
