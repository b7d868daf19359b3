//! Checked driver calls about devices (`cuDevice*`). Each initialises the driver first.

use std::ffi::c_char;

use super::{drv, init, sys};
use crate::error::Result;

/// Number of CUDA devices (`cuDeviceGetCount`).
pub fn count() -> Result<i32> {
    init()?;
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer.
    drv!(cuDeviceGetCount(&mut n))?;
    Ok(n)
}

/// The driver's handle of device `ordinal` (`cuDeviceGet`).
pub fn get(ordinal: i32) -> Result<sys::CUdevice> {
    init()?;
    let mut d: sys::CUdevice = 0;
    // SAFETY: `d` is a valid out pointer; a bad ordinal is an error code.
    drv!(cuDeviceGet(&mut d, ordinal))?;
    Ok(d)
}

/// The device's name (`cuDeviceGetName`).
pub fn name(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 256];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
    drv!(cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, dev))?;
    Ok(c_buf_to_string(&buf))
}

/// Total memory in bytes (`cuDeviceTotalMem`).
pub fn total_mem(dev: sys::CUdevice) -> Result<usize> {
    let mut n = 0usize;
    // SAFETY: `n` is a valid out pointer.
    drv!(cuDeviceTotalMem_v2(&mut n, dev))?;
    Ok(n)
}

/// One attribute's value (`cuDeviceGetAttribute`).
pub fn attribute(dev: sys::CUdevice, attr: sys::CUdevice_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer; an unknown attribute is an error code.
    drv!(cuDeviceGetAttribute(&mut v, attr, dev))?;
    Ok(v)
}

/// The PCI bus id, e.g. `0000:3B:00.0` (`cuDeviceGetPCIBusId`).
pub fn pci_bus_id(dev: sys::CUdevice) -> Result<String> {
    let mut buf = [0 as c_char; 64];
    // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
    drv!(cuDeviceGetPCIBusId(buf.as_mut_ptr(), buf.len() as i32, dev))?;
    Ok(c_buf_to_string(&buf))
}

/// The device with PCI bus id `id` (`cuDeviceGetByPCIBusId`).
pub fn by_pci_bus_id(id: &str) -> Result<sys::CUdevice> {
    init()?;
    let c = std::ffi::CString::new(id).map_err(|_| {
        crate::Error::invalid_argument(
            crate::error::ArgumentKind::InteriorNul,
            format!("PCI bus id {id:?} contains a NUL byte"),
        )
    })?;
    let mut d: sys::CUdevice = 0;
    // SAFETY: `c` is NUL-terminated, `d` a valid out pointer.
    drv!(cuDeviceGetByPCIBusId(&mut d, c.as_ptr()))?;
    Ok(d)
}

pub(crate) fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The ordinal of the device that owns `ptr` (`cuPointerGetAttribute` with
/// `CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); an error for memory CUDA does not know.
pub fn pointer_device_ordinal(ptr: sys::CUdeviceptr) -> Result<i32> {
    init()?;
    let mut ord: i32 = -1;
    // SAFETY: the attribute writes one `int` into `ord`; the driver validates `ptr`.
    drv!(cuPointerGetAttribute(
        (&mut ord as *mut i32).cast(),
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        ptr
    ))?;
    Ok(ord)
}
