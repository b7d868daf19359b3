//! Checked driver calls about devices (`cuDevice*`). A `CUdevice` is an ordinal that the
//! driver checks, so these calls are safe; all but [`get_count`] and [`get`] need
//! [`init`](super::init) first (else `CUDA_ERROR_NOT_INITIALIZED`).

use std::ffi::{c_char, CStr};

use super::{api, check, Result};
use crate::driver::{CUdevice, CUdevice_attribute, CUgraphMem_attribute, CUmemoryPool};

/// Number of CUDA devices (`cuDeviceGetCount`).
pub fn get_count() -> Result<i32> {
    let f = api()?.cuDeviceGetCount()?;
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer.
    check(unsafe { f(&mut n) }, "cuDeviceGetCount")?;
    Ok(n)
}

/// The driver's handle of device `ordinal` (`cuDeviceGet`); a bad ordinal is an error
/// code.
pub fn get(ordinal: i32) -> Result<CUdevice> {
    let f = api()?.cuDeviceGet()?;
    let mut d: CUdevice = 0;
    // SAFETY: `d` is a valid out pointer.
    check(unsafe { f(&mut d, ordinal) }, "cuDeviceGet")?;
    Ok(d)
}

/// The device's name, e.g. `NVIDIA H100 80GB HBM3` (`cuDeviceGetName`).
pub fn get_name(dev: CUdevice) -> Result<String> {
    let f = api()?.cuDeviceGetName()?;
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
    check(
        unsafe { f(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "cuDeviceGetName",
    )?;
    Ok(c_buf_to_string(&buf))
}

/// Total memory in bytes (`cuDeviceTotalMem`).
pub fn total_mem(dev: CUdevice) -> Result<usize> {
    let f = api()?.cuDeviceTotalMem_v2()?;
    let mut n = 0usize;
    // SAFETY: `n` is a valid out pointer.
    check(unsafe { f(&mut n, dev) }, "cuDeviceTotalMem_v2")?;
    Ok(n)
}

/// One attribute's value (`cuDeviceGetAttribute`); an attribute the driver does not
/// know is an error code.
pub fn get_attribute(dev: CUdevice, attr: CUdevice_attribute) -> Result<i32> {
    let f = api()?.cuDeviceGetAttribute()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer.
    check(unsafe { f(&mut v, attr, dev) }, "cuDeviceGetAttribute")?;
    Ok(v)
}

/// The PCI bus id, e.g. `0000:3B:00.0` (`cuDeviceGetPCIBusId`).
pub fn get_pci_bus_id(dev: CUdevice) -> Result<String> {
    let f = api()?.cuDeviceGetPCIBusId()?;
    let mut buf = [0 as c_char; 64];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
    check(
        unsafe { f(buf.as_mut_ptr(), buf.len() as i32, dev) },
        "cuDeviceGetPCIBusId",
    )?;
    Ok(c_buf_to_string(&buf))
}

/// The device with PCI bus id `id` (`cuDeviceGetByPCIBusId`).
pub fn get_by_pci_bus_id(id: &CStr) -> Result<CUdevice> {
    let f = api()?.cuDeviceGetByPCIBusId()?;
    let mut d: CUdevice = 0;
    // SAFETY: `id` is NUL-terminated, `d` a valid out pointer.
    check(unsafe { f(&mut d, id.as_ptr()) }, "cuDeviceGetByPCIBusId")?;
    Ok(d)
}

/// Whether device `dev` can access memory of device `peer` (`cuDeviceCanAccessPeer`).
pub fn can_access_peer(dev: CUdevice, peer: CUdevice) -> Result<bool> {
    let f = api()?.cuDeviceCanAccessPeer()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer.
    check(unsafe { f(&mut v, dev, peer) }, "cuDeviceCanAccessPeer")?;
    Ok(v != 0)
}

/// The device's current memory pool, the one `cuMemAllocAsync` takes from
/// (`cuDeviceGetMemPool`).
pub fn get_mem_pool(dev: CUdevice) -> Result<CUmemoryPool> {
    let f = api()?.cuDeviceGetMemPool()?;
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out pointer.
    check(unsafe { f(&mut pool, dev) }, "cuDeviceGetMemPool")?;
    Ok(pool)
}

/// Gives back the device's graph memory that no graph uses (`cuDeviceGraphMemTrim`).
pub fn graph_mem_trim(dev: CUdevice) -> Result<()> {
    let f = api()?.cuDeviceGraphMemTrim()?;
    // SAFETY: the driver checks `dev`.
    check(unsafe { f(dev) }, "cuDeviceGraphMemTrim")
}

/// A figure of the device's graph memory, in bytes (`cuDeviceGetGraphMemAttribute`):
/// `attr` is one of the `CU_GRAPH_MEM_ATTR_*` values (memory graphs use or the graph
/// allocator reserves, now or at its high-water mark).
pub fn get_graph_mem_attribute(dev: CUdevice, attr: CUgraphMem_attribute) -> Result<u64> {
    let f = api()?.cuDeviceGetGraphMemAttribute()?;
    let mut v: u64 = 0;
    // SAFETY: every `CU_GRAPH_MEM_ATTR_*` query writes one 64-bit value, and `v` is a
    // valid out pointer to one; the driver checks `dev` and `attr`.
    check(
        unsafe { f(dev, attr, (&mut v as *mut u64).cast()) },
        "cuDeviceGetGraphMemAttribute",
    )?;
    Ok(v)
}

/// The text of a NUL-terminated C buffer (lossy UTF-8), up to its first NUL.
fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
