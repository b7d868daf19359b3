//! Devices: which GPUs there are, what they are, which one is current on this thread,
//! and whether CUDA is usable at all.
//!
//! The current device is per thread (0 until set), as in CuPy. [`Device::use_device`]
//! sets it; [`Device::enter`] sets it for a scope and restores the device that was
//! current on entry when the [`DeviceScope`] drops, also after a `use_device` inside.
//! Each device's primary context is retained once and made current on a thread only
//! when it is not current already, so entering the scope of the current device makes
//! no driver call.

mod attribute;
#[rustfmt::skip]
mod attribute_table;
pub(crate) mod context;

use std::marker::PhantomData;
use std::sync::OnceLock;

pub use attribute_table::DeviceAttribute;

/// Forgets which context cuda-rt made current on this thread: call it after code
/// outside cuda-rt changed the thread's current context with the raw driver API; the
/// next cuda-rt call that needs a context asks the driver again.
pub fn forget_current_context() {
    context::forget_current();
}

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::error::{ArgumentKind, Error, Result, Unavailable};

/// Number of CUDA devices (asked once, then cached: the driver fixes it at `cuInit`).
/// An error when the driver cannot be loaded or initialised; use [`is_available`] for
/// a plain yes or no.
pub fn device_count() -> Result<i32> {
    static COUNT: OnceLock<Result<i32>> = OnceLock::new();
    COUNT
        .get_or_init(|| {
            context::init()?;
            Ok(result::device::get_count()?)
        })
        .clone()
}

/// Whether CUDA can be used: a driver loads, initialises and reports at least one
/// device. Never fails and never panics; [`availability`] says why not.
pub fn is_available() -> bool {
    availability().is_ok()
}

/// `Ok(device count)` when CUDA is usable, else why not: the driver library missing
/// (with every path tried), the driver too old (with its version), `cuInit` failing
/// (with the driver's error), or no device. [`Unavailable`] says it in words too, and
/// converts into [`Error::NotAvailable`] with `?`.
///
/// ```
/// match cuda_rt::availability() {
///     Ok(n) => println!("{n} CUDA device(s)"),
///     Err(cuda_rt::Unavailable::NoDevice) => println!("a driver, but no GPU"),
///     Err(why) => println!("CUDA is not available: {why}"),
/// }
/// ```
pub fn availability() -> std::result::Result<i32, Unavailable> {
    match device_count() {
        Ok(0) => Err(Unavailable::NoDevice),
        Ok(n) => Ok(n),
        Err(e) => Err(Unavailable::from_error(e)),
    }
}

/// A CUDA device, by id (ordinal). Cheap to copy.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::{Device, DeviceBuffer};
/// for id in 0..cuda_rt::device_count()? {
///     let dev = Device::new(id)?;
///     let (major, minor) = dev.compute_capability()?;
///     let (free, total) = dev.mem_info()?;
///     println!("{id}: {} (sm_{major}{minor}), {free} of {total} bytes free", dev.name()?);
/// }
/// {
///     let _scope = Device::new(0)?.enter()?; // current on this thread until the scope ends
///     let buf = DeviceBuffer::<u8>::zeros(1 << 20)?; // on device 0
///     assert_eq!(buf.device_id(), 0);
/// } // the device current before is current again
/// # Ok(()) }
/// ```
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
            handle: result::device::get(id)?,
        })
    }

    /// This thread's current device.
    pub fn current() -> Result<Device> {
        Device::new(get_device_id())
    }

    /// The device whose PCI bus id is `bus_id` (e.g. `0000:3B:00.0`, as
    /// [`Device::pci_bus_id`] gives it; the driver also accepts `3b:00.0`).
    pub fn from_pci_bus_id(bus_id: &str) -> Result<Device> {
        context::init()?;
        let c = std::ffi::CString::new(bus_id).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("PCI bus id {bus_id:?} contains a NUL byte"),
            )
        })?;
        let handle = result::device::get_by_pci_bus_id(&c)?;
        for id in 0..device_count()? {
            let d = Device::new(id)?;
            if d.handle == handle {
                return Ok(d);
            }
        }
        Err(Error::invalid_argument(
            ArgumentKind::NotFound,
            format!("PCI bus id {bus_id:?} names no device visible to this process"),
        ))
    }

    /// The device that owns the memory at `ptr` (device memory, managed memory, or
    /// pinned host memory mapped for a device), asked of the driver with
    /// `cuPointerGetAttribute(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)`.
    pub fn from_pointer(ptr: u64) -> Result<Device> {
        context::init()?;
        let id =
            result::memory::pointer_get_device_ordinal(ptr).map_err(|e| match Error::from(e) {
                Error::Driver(d) => Error::invalid_argument(
                    ArgumentKind::NotFound,
                    format!("pointer {ptr:#x} is not memory CUDA knows ({d})"),
                ),
                other => other,
            })?;
        Device::new(id)
    }

    /// The device id (ordinal).
    pub fn id(&self) -> i32 {
        self.id
    }

    /// The driver's `CUdevice` handle.
    pub fn as_raw(&self) -> sys::CUdevice {
        self.handle
    }

    /// The device's primary context (retained once per process, never released).
    pub fn primary_context(&self) -> Result<sys::CUcontext> {
        context::primary(self.id)
    }

    /// Makes this the thread's current device (CuPy's `Device.use()`), without a
    /// scope: it stays current until something else is used.
    pub fn use_device(&self) -> Result<()> {
        context::make_current(self.id)?;
        crate::thread_state::select_device(self.id);
        Ok(())
    }

    /// Makes this the thread's current device until the returned guard drops, which
    /// restores the device current on entry (CuPy's `with device:`). Scopes nest.
    /// When the device is current already, no driver call is made.
    pub fn enter(&self) -> Result<DeviceScope> {
        let prev = get_device_id();
        context::make_current(self.id)?;
        crate::thread_state::select_device(self.id);
        Ok(DeviceScope {
            prev,
            _not_send: PhantomData,
        })
    }

    /// Blocks until all work queued on this device is done (`cuCtxSynchronize` in its
    /// primary context).
    pub fn synchronize(&self) -> Result<()> {
        context::make_current(self.id)?;
        result::context::synchronize()
            .map_err(|e| crate::error::explain_capture(e.into(), "Device::synchronize"))
    }

    /// The product name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> Result<String> {
        Ok(result::device::get_name(self.handle)?)
    }

    /// Compute capability as `(major, minor)`, e.g. `(9, 0)`.
    pub fn compute_capability(&self) -> Result<(i32, i32)> {
        Ok((
            self.attribute(DeviceAttribute::ComputeCapabilityMajor)?,
            self.attribute(DeviceAttribute::ComputeCapabilityMinor)?,
        ))
    }

    /// Compute capability as CuPy writes it, e.g. `"90"`.
    pub fn compute_capability_string(&self) -> Result<String> {
        let (major, minor) = self.compute_capability()?;
        Ok(format!("{major}{minor}"))
    }

    /// Total memory in bytes.
    pub fn total_memory(&self) -> Result<usize> {
        Ok(result::device::total_mem(self.handle)?)
    }

    /// `(free, total)` memory in bytes, as the driver sees it now.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        context::make_current(self.id)?;
        Ok(result::memory::get_info()?)
    }

    /// Number of streaming multiprocessors.
    pub fn multiprocessor_count(&self) -> Result<i32> {
        self.attribute(DeviceAttribute::MultiprocessorCount)
    }

    /// The PCI bus id, e.g. `0000:3B:00.0`.
    pub fn pci_bus_id(&self) -> Result<String> {
        Ok(result::device::get_pci_bus_id(self.handle)?)
    }

    /// One attribute's value.
    pub fn attribute(&self, attr: DeviceAttribute) -> Result<i32> {
        Ok(result::device::get_attribute(self.handle, attr.raw())?)
    }

    /// One attribute by name: CamelCase (`MaxThreadsPerBlock`), the driver's constant
    /// (`CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK`) or its suffix, any case.
    pub fn attribute_by_name(&self, name: &str) -> Result<i32> {
        let attr = DeviceAttribute::from_name(name).ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::NotFound,
                format!(
                    "{name:?} is not a device attribute (e.g. MaxThreadsPerBlock, \
                     CU_DEVICE_ATTRIBUTE_WARP_SIZE)"
                ),
            )
        })?;
        self.attribute(attr)
    }

    /// Every attribute this driver knows, with its value. Attributes newer than the
    /// driver (it answers `CUDA_ERROR_INVALID_VALUE`) are left out.
    pub fn attributes(&self) -> Result<Vec<(DeviceAttribute, i32)>> {
        let mut out = Vec::with_capacity(DeviceAttribute::ALL.len());
        for &a in DeviceAttribute::ALL {
            match self.attribute(a) {
                Ok(v) => out.push((a, v)),
                Err(e) if e.driver_code() == Some(sys::CUresult::CUDA_ERROR_INVALID_VALUE) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// One attribute by the driver's raw enum value.
    pub fn attribute_raw(&self, attr: sys::CUdevice_attribute) -> Result<i32> {
        Ok(result::device::get_attribute(self.handle, attr)?)
    }

    /// The stream priority range as `(least, greatest)`; a greater priority is a lower
    /// number, e.g. `(0, -5)`.
    pub fn stream_priority_range(&self) -> Result<(i32, i32)> {
        context::make_current(self.id)?;
        Ok(result::context::get_stream_priority_range()?)
    }

    /// Whether this device can access memory of `peer` directly.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        Ok(result::device::can_access_peer(self.handle, peer.handle)?)
    }
}

/// Restores the thread's current device of before [`Device::enter`] when dropped.
/// Not `Send`: the current device is per thread.
#[derive(Debug)]
#[must_use = "the previous device is restored when the scope guard drops"]
pub struct DeviceScope {
    prev: i32,
    _not_send: PhantomData<*const ()>,
}

impl DeviceScope {
    /// The device that was current on entry, and is restored on drop.
    pub fn previous(&self) -> i32 {
        self.prev
    }
}

impl Drop for DeviceScope {
    fn drop(&mut self) {
        // The previous device was current (its context retained) or never used: making
        // it current again can only fail if the driver is torn down, and then nothing
        // remains to restore.
        let _ = context::make_current(self.prev);
        crate::thread_state::select_device(self.prev);
    }
}

/// This thread's current device id (0 until [`set_device_id`], [`Device::use_device`]
/// or a device scope sets it). No driver call.
#[inline]
pub fn get_device_id() -> i32 {
    crate::thread_state::selected_device()
}

/// Makes `id` this thread's current device (validated; makes its primary context
/// current).
pub fn set_device_id(id: i32) -> Result<()> {
    Device::new(id)?.use_device()
}

/// Blocks until all work queued on the current device is done.
pub fn synchronize() -> Result<()> {
    context::make_current(get_device_id())?;
    result::context::synchronize()
        .map_err(|e| crate::error::explain_capture(e.into(), "synchronize"))
}
