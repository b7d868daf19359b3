//! Checked driver calls that share device memory between processes: legacy IPC memory
//! handles (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`, `cuIpcCloseMemHandle`), the
//! allocation an address belongs to (`cuMemGetAddressRange`), and stream-ordered pools
//! shared through a POSIX file descriptor (`cuMemPoolExportToShareableHandle`,
//! `cuMemPoolImportFromShareableHandle`, `cuMemPoolExportPointer`,
//! `cuMemPoolImportPointer`, `cuMemPoolSetAccess`).
//!
//! Handles are plain bytes (64 of them for memory handles and exported pointers), to
//! be sent to the other process by any means. IPC event handles are in
//! [`event`](super::event).

use std::ffi::{c_char, c_int, c_void};

use super::{api, check, Result};
use crate::driver::{
    CUdeviceptr, CUipcMemHandle, CUipcMem_flags, CUmemAccessDesc, CUmemAllocationHandleType,
    CUmemPoolPtrExportData, CUmemoryPool,
};

/// The allocation `ptr` lies in, as `(base, size)` (`cuMemGetAddressRange`): for a
/// pointer into the middle of a pool's segment, the segment. An address CUDA does not
/// know is an error code; nothing is dereferenced.
pub fn get_address_range(ptr: CUdeviceptr) -> Result<(CUdeviceptr, usize)> {
    let f = api()?.cuMemGetAddressRange_v2()?;
    let (mut base, mut size): (CUdeviceptr, usize) = (0, 0);
    // SAFETY: both are valid out pointers; the driver only looks `ptr` up.
    check(
        unsafe { f(&mut base, &mut size, ptr) },
        "cuMemGetAddressRange_v2",
    )?;
    Ok((base, size))
}

/// The 64 bytes another process opens the allocation at `base` with
/// (`cuIpcGetMemHandle`). `base` must be the start of a `cuMemAlloc` allocation (see
/// [`get_address_range`]); stream-ordered (pool) memory is an error code.
///
/// The handle does not keep the allocation alive: freeing it while another process
/// has it open is undefined there, which is why only opening it is `unsafe`.
pub fn ipc_get_mem_handle(base: CUdeviceptr) -> Result<[u8; 64]> {
    let f = api()?.cuIpcGetMemHandle()?;
    let mut h = CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: `h` is a valid out pointer; the driver looks `base` up and answers an
    // error code for an address it does not know.
    check(unsafe { f(&mut h, base) }, "cuIpcGetMemHandle")?;
    Ok(h.reserved.map(|c| c as u8))
}

/// Maps another process's allocation into the current context from its handle's
/// bytes (`cuIpcOpenMemHandle`, with `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS` when `lazy`
/// is true), returning the mapping's base address. The caller closes it once with
/// [`ipc_close_mem_handle`]. A handle of this same process is an error code.
///
/// # Safety
/// The exporting process keeps the allocation alive for as long as the mapping is
/// used; what the two processes read and write concurrently is their concern.
pub unsafe fn ipc_open_mem_handle(bytes: &[u8; 64], lazy: bool) -> Result<CUdeviceptr> {
    let f = api()?.cuIpcOpenMemHandle_v2()?;
    let h = CUipcMemHandle {
        reserved: bytes.map(|b| b as c_char),
    };
    let flags = if lazy {
        CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.0
    } else {
        0
    };
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; the driver validates the handle's bytes.
    check(unsafe { f(&mut p, h, flags) }, "cuIpcOpenMemHandle_v2")?;
    Ok(p)
}

/// Unmaps memory opened with [`ipc_open_mem_handle`] (`cuIpcCloseMemHandle`).
///
/// # Safety
/// `base` came from [`ipc_open_mem_handle`], is closed once, and no work still queued
/// uses it.
pub unsafe fn ipc_close_mem_handle(base: CUdeviceptr) -> Result<()> {
    let f = api()?.cuIpcCloseMemHandle()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(base) }, "cuIpcCloseMemHandle")
}

/// A POSIX file descriptor for `pool` (`cuMemPoolExportToShareableHandle` with
/// `CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR`); the pool must have been created with
/// that handle type. The caller owns (and closes) the descriptor.
///
/// # Safety
/// `pool` is a live pool.
pub unsafe fn pool_export_to_fd(pool: CUmemoryPool) -> Result<c_int> {
    let f = api()?.cuMemPoolExportToShareableHandle()?;
    let mut fd: c_int = -1;
    // SAFETY: for a POSIX descriptor the out value is an `int`; `fd` is one. `pool` is
    // live (caller).
    check(
        unsafe {
            f(
                (&mut fd as *mut c_int).cast::<c_void>(),
                pool,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemPoolExportToShareableHandle",
    )?;
    Ok(fd)
}

/// Imports a pool another process exported as a POSIX file descriptor
/// (`cuMemPoolImportFromShareableHandle`); the caller destroys it once with
/// [`pool_destroy`](super::memory::pool_destroy). The descriptor stays the caller's.
pub fn pool_import_from_fd(fd: c_int) -> Result<CUmemoryPool> {
    let f = api()?.cuMemPoolImportFromShareableHandle()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // For POSIX descriptors the handle is the descriptor's value cast to a pointer.
    let handle = fd as isize as *mut c_void;
    // SAFETY: `pool` is a valid out pointer; the driver validates the descriptor (a
    // plain integer here, never dereferenced).
    check(
        unsafe {
            f(
                &mut pool,
                handle,
                CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
                0,
            )
        },
        "cuMemPoolImportFromShareableHandle",
    )?;
    Ok(pool)
}

/// The 64 bytes another process imports `ptr` (allocated from an exportable pool) with
/// (`cuMemPoolExportPointer`).
pub fn pool_export_pointer(ptr: CUdeviceptr) -> Result<[u8; 64]> {
    let f = api()?.cuMemPoolExportPointer()?;
    let mut d = CUmemPoolPtrExportData { reserved: [0; 64] };
    // SAFETY: `d` is a valid out pointer; the driver looks `ptr` up.
    check(unsafe { f(&mut d, ptr) }, "cuMemPoolExportPointer")?;
    Ok(d.reserved)
}

/// Maps a pointer another process exported ([`pool_export_pointer`]) from `pool`
/// (imported with [`pool_import_from_fd`]) (`cuMemPoolImportPointer`). The mapping is
/// given back with `cuMemFree`/`cuMemFreeAsync` once the exporter's use is ordered
/// before it.
///
/// # Safety
/// `pool` is a live imported pool; the exporter keeps the allocation alive while the
/// import is used.
pub unsafe fn pool_import_pointer(pool: CUmemoryPool, bytes: &[u8; 64]) -> Result<CUdeviceptr> {
    let f = api()?.cuMemPoolImportPointer()?;
    let mut d = CUmemPoolPtrExportData { reserved: *bytes };
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` and `d` are valid pointers; `pool` is live (caller).
    check(unsafe { f(&mut p, pool, &mut d) }, "cuMemPoolImportPointer")?;
    Ok(p)
}

/// Sets which devices may access `pool`'s memory and how (`cuMemPoolSetAccess`).
///
/// # Safety
/// `pool` is a live pool.
pub unsafe fn pool_set_access(pool: CUmemoryPool, map: &[CUmemAccessDesc]) -> Result<()> {
    let f = api()?.cuMemPoolSetAccess()?;
    // SAFETY: `map` is `map.len()` initialised descriptors; `pool` is live (caller).
    check(
        unsafe { f(pool, map.as_ptr(), map.len()) },
        "cuMemPoolSetAccess",
    )
}
