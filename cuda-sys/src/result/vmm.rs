//! Checked driver calls of virtual memory management: address reservations
//! (`cuMemAddressReserve` / `cuMemAddressFree`), physical allocations
//! (`cuMemCreate` / `cuMemRelease`), mapping (`cuMemMap` / `cuMemUnmap`), access
//! (`cuMemSetAccess`) and the allocation granularity (`cuMemGetAllocationGranularity`).
//! What expandable segments of a memory pool are built from.
//!
//! Reserving and creating are safe (a failure is an error code, a lost reservation or
//! handle only a leak); freeing, releasing, mapping, unmapping and changing access are
//! `unsafe fn`s whose `# Safety` says which ranges and handles must be valid.

use super::{api, check, Result};
use crate::driver::{
    CUdeviceptr, CUmemAccessDesc, CUmemAccess_flags, CUmemAllocationGranularity_flags,
    CUmemAllocationProp, CUmemAllocationType, CUmemGenericAllocationHandle, CUmemLocation,
    CUmemLocationType,
};

/// The properties of pinned device memory on `device` (no shareable handle).
fn device_prop(device: i32) -> CUmemAllocationProp {
    CUmemAllocationProp {
        type_: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        ..Default::default()
    }
}

/// The granularity of physical allocations of device memory on `device`
/// (`cuMemGetAllocationGranularity`): the minimum (`recommended` false) or the
/// recommended one. Sizes and map offsets are multiples of it.
pub fn granularity(device: i32, recommended: bool) -> Result<usize> {
    let f = api()?.cuMemGetAllocationGranularity()?;
    let prop = device_prop(device);
    let option = if recommended {
        CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    } else {
        CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
    };
    let mut g = 0usize;
    // SAFETY: `g` is a valid out pointer and `prop` a valid property struct.
    check(
        unsafe { f(&mut g, &prop, option) },
        "cuMemGetAllocationGranularity",
    )?;
    Ok(g)
}

/// Reserves `size` bytes of device address space aligned to `alignment` (0: the
/// granularity) with nothing behind it (`cuMemAddressReserve`); the caller gives it
/// back once with [`address_free`].
pub fn address_reserve(size: usize, alignment: usize) -> Result<CUdeviceptr> {
    let f = api()?.cuMemAddressReserve()?;
    let mut p: CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; no fixed address is asked for.
    check(
        unsafe { f(&mut p, size, alignment, 0, 0) },
        "cuMemAddressReserve",
    )?;
    Ok(p)
}

/// Gives back a reservation (`cuMemAddressFree`).
///
/// # Safety
/// `ptr` and `size` are those of one [`address_reserve`], given back once, with
/// nothing mapped in it any more.
pub unsafe fn address_free(ptr: CUdeviceptr, size: usize) -> Result<()> {
    let f = api()?.cuMemAddressFree()?;
    // SAFETY: a reservation the caller owns, given back once (see `# Safety`).
    check(unsafe { f(ptr, size) }, "cuMemAddressFree")
}

/// `size` bytes of physical device memory on `device` (`cuMemCreate`), a multiple of
/// the [`granularity`]; the caller releases the handle once with [`release`].
pub fn create(size: usize, device: i32) -> Result<CUmemGenericAllocationHandle> {
    let f = api()?.cuMemCreate()?;
    let prop = device_prop(device);
    let mut h: CUmemGenericAllocationHandle = 0;
    // SAFETY: `h` is a valid out pointer and `prop` a valid property struct.
    check(unsafe { f(&mut h, size, &prop, 0) }, "cuMemCreate")?;
    Ok(h)
}

/// Releases a physical allocation's handle (`cuMemRelease`); its memory goes once it
/// is unmapped everywhere.
///
/// # Safety
/// `handle` came from [`create`] and is released once.
pub unsafe fn release(handle: CUmemGenericAllocationHandle) -> Result<()> {
    let f = api()?.cuMemRelease()?;
    // SAFETY: a handle the caller owns, released once (see `# Safety`).
    check(unsafe { f(handle) }, "cuMemRelease")
}

/// Maps the whole of `handle` (`size` bytes) at `ptr` (`cuMemMap`).
///
/// # Safety
/// `ptr..ptr + size` lies inside a live reservation and is not mapped; `handle` is a
/// live handle of `size` bytes.
pub unsafe fn map(
    ptr: CUdeviceptr,
    size: usize,
    handle: CUmemGenericAllocationHandle,
) -> Result<()> {
    let f = api()?.cuMemMap()?;
    // SAFETY: an unmapped range of a reservation and a live handle (see `# Safety`).
    check(unsafe { f(ptr, size, 0, handle, 0) }, "cuMemMap")
}

/// Unmaps `ptr..ptr + size` (`cuMemUnmap`).
///
/// # Safety
/// The range covers whole mappings made by [`map`], and no work still uses it.
pub unsafe fn unmap(ptr: CUdeviceptr, size: usize) -> Result<()> {
    let f = api()?.cuMemUnmap()?;
    // SAFETY: whole mappings no work uses any more (see `# Safety`).
    check(unsafe { f(ptr, size) }, "cuMemUnmap")
}

/// Makes `ptr..ptr + size` readable and writable from `device` (`cuMemSetAccess`).
///
/// # Safety
/// The range is mapped (by [`map`]).
pub unsafe fn set_access(ptr: CUdeviceptr, size: usize, device: i32) -> Result<()> {
    let f = api()?.cuMemSetAccess()?;
    let desc = CUmemAccessDesc {
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: a mapped range (see `# Safety`); `desc` is one valid descriptor.
    check(unsafe { f(ptr, size, &desc, 1) }, "cuMemSetAccess")
}
