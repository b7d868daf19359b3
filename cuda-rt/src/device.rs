//! Devices: which GPUs there are, what they are, and whether CUDA is usable at all.

use crate::driver::{self, sys};
use crate::error::{Error, Result};

/// Number of CUDA devices. An error when the driver cannot be loaded or initialised;
/// use [`is_available`] for a plain yes or no.
pub fn device_count() -> Result<i32> {
    driver::device::count()
}

/// Whether CUDA can be used: a driver loads, initialises and reports at least one
/// device. Never fails and never panics; [`availability`] says why not.
pub fn is_available() -> bool {
    availability().is_ok()
}

/// `Ok(device count)` when CUDA is usable, else the reason in words (driver library
/// missing and where it was looked for, `cuInit` failing, no device).
pub fn availability() -> std::result::Result<i32, String> {
    match device_count() {
        Ok(0) => Err("the CUDA driver reports no device".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.to_string()),
    }
}

/// A CUDA device, by id (ordinal). Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    id: i32,
    handle: sys::CUdevice,
}

impl Device {
    /// Device `id`; an error naming the valid range when there is no such device.
    pub fn new(id: i32) -> Result<Device> {
        let count = device_count()?;
        if id < 0 || id >= count {
            return Err(Error::InvalidDevice { id, count });
        }
        Ok(Device {
            id,
            handle: driver::device::get(id)?,
        })
    }

    /// The device id (ordinal).
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The driver's `CUdevice` handle.
    pub fn as_raw(&self) -> sys::CUdevice {
        self.handle
    }

    /// The product name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> Result<String> {
        driver::device::name(self.handle)
    }

    /// Compute capability as `(major, minor)`, e.g. `(9, 0)`.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute_raw(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
            )?,
            self.attribute_raw(
                sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
            )?,
        ))
    }

    /// Total memory in bytes.
    pub fn total_memory(&self) -> Result<usize> {
        driver::device::total_mem(self.handle)
    }

    /// `(free, total)` memory in bytes, as the driver sees it now.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        driver::context::make_current(self.id)?;
        driver::context::mem_info()
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessor_count(&self) -> Result<i32> {
        self.attribute_raw(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
    }

    /// The PCI bus id, e.g. `0000:3B:00.0`.
    pub fn pci_bus_id(&self) -> Result<String> {
        driver::device::pci_bus_id(self.handle)
    }

    /// One attribute by the driver's raw enum value.
    pub fn attribute_raw(&self, attr: sys::CUdevice_attribute) -> Result<i32> {
        driver::device::attribute(self.handle, attr)
    }
}

thread_local! {
    /// This thread's current device id (CuPy: per thread, 0 until set).
    static CURRENT_DEVICE: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

/// This thread's current device id (0 until [`set_device_id`] or a device scope sets
/// it). No driver call.
#[inline]
pub fn get_device_id() -> i32 {
    CURRENT_DEVICE.with(std::cell::Cell::get)
}

/// Makes `id` this thread's current device (validated; makes its primary context
/// current).
pub fn set_device_id(id: i32) -> Result<()> {
    if id != get_device_id() {
        Device::new(id)?;
    }
    driver::context::make_current(id)?;
    CURRENT_DEVICE.with(|c| c.set(id));
    Ok(())
}
