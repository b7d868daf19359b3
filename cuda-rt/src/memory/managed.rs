//! Managed (unified) memory: `cuMemAllocManaged`, readable and writable from the host
//! and every device, with prefetch and advice.

use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::Result;
use crate::memory::device_memory::{check_device, make_current_checked, out_of_memory, BaseMemory};
use crate::memory::MemoryPointer;
use crate::stream::{get_current_stream, AsStream};

/// Where managed memory should live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Location {
    /// Host memory.
    Host,
    /// Device `id`'s memory.
    Device(i32),
}

impl Location {
    fn checked(self) -> Result<Option<i32>> {
        match self {
            Location::Host => Ok(None),
            Location::Device(id) => {
                check_device(id)?;
                Ok(Some(id))
            }
        }
    }
}

/// Advice about how managed memory will be used (`cuMemAdvise`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Advice {
    /// Mostly read: devices may keep read-only copies.
    SetReadMostly,
    /// Undo [`Advice::SetReadMostly`].
    UnsetReadMostly,
    /// Prefer to keep the pages at the location.
    SetPreferredLocation,
    /// Undo [`Advice::SetPreferredLocation`].
    UnsetPreferredLocation,
    /// The location will access the memory: keep it mapped there.
    SetAccessedBy,
    /// Undo [`Advice::SetAccessedBy`].
    UnsetAccessedBy,
}

impl Advice {
    fn raw(self) -> sys::CUmem_advise {
        use sys::CUmem_advise as A;
        match self {
            Advice::SetReadMostly => A::CU_MEM_ADVISE_SET_READ_MOSTLY,
            Advice::UnsetReadMostly => A::CU_MEM_ADVISE_UNSET_READ_MOSTLY,
            Advice::SetPreferredLocation => A::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
            Advice::UnsetPreferredLocation => A::CU_MEM_ADVISE_UNSET_PREFERRED_LOCATION,
            Advice::SetAccessedBy => A::CU_MEM_ADVISE_SET_ACCESSED_BY,
            Advice::UnsetAccessedBy => A::CU_MEM_ADVISE_UNSET_ACCESSED_BY,
        }
    }
}

/// A `CUmemLocation` for device `id`, or the host when `device` is `None`.
pub(crate) fn mem_location(device: Option<i32>) -> sys::CUmemLocation {
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

/// Managed memory (`cuMemAllocManaged`, attached globally), freed when dropped.
#[derive(Debug)]
pub struct ManagedMemory {
    ptr: u64,
    size: usize,
    device: i32,
}

impl ManagedMemory {
    /// `size` bytes of managed memory, associated with the current device. Size 0 is
    /// a null pointer of size 0.
    pub fn new(size: usize) -> Result<ManagedMemory> {
        let device = get_device_id();
        if size == 0 {
            return Ok(ManagedMemory {
                ptr: 0,
                size: 0,
                device,
            });
        }
        make_current_checked(device)?;
        let ptr =
            result::memory::alloc_managed(size, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0)
                .map_err(|e| out_of_memory(e.into(), size as u64, device, None))?;
        Ok(ManagedMemory { ptr, size, device })
    }

    /// Moves the pages to `to` on `stream` (`None`: the current stream). A device that
    /// does not exist is [`Error::InvalidDevice`](crate::Error::InvalidDevice), before
    /// any driver call. Needs a CUDA 12.2 or newer driver.
    pub fn prefetch(&self, to: Location, stream: Option<&dyn AsStream>) -> Result<()> {
        let loc = to.checked()?;
        if self.size == 0 {
            return Ok(());
        }
        let s = match stream {
            Some(s) => s.as_stream_ref(),
            None => get_current_stream(),
        };
        make_current(s.device_id())?;
        // SAFETY: the range is this object's managed allocation, alive while `self` is,
        // and its free (cuMemFree in drop) waits for work still using it; `s` keeps its
        // stream alive for the call, and its device's context was made current above.
        Ok(unsafe {
            result::memory::prefetch_async(self.ptr, self.size, mem_location(loc), s.as_raw())
        }?)
    }

    /// Gives `advice` about the whole memory for `location`. Needs a CUDA 12.2 or newer
    /// driver.
    pub fn advise(&self, advice: Advice, location: Location) -> Result<()> {
        let loc = location.checked()?;
        if self.size == 0 {
            return Ok(());
        }
        make_current(self.device)?;
        // SAFETY: the range is this object's managed allocation, alive while `self` is
        // borrowed.
        Ok(
            unsafe {
                result::memory::advise(self.ptr, self.size, advice.raw(), mem_location(loc))
            }?,
        )
    }
}

// SAFETY: `ptr..ptr+size` is a managed allocation owned until drop; fields never change.
unsafe impl BaseMemory for ManagedMemory {
    fn ptr(&self) -> u64 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> i32 {
        self.device
    }
}

impl Drop for ManagedMemory {
    fn drop(&mut self) {
        if self.size != 0 && make_current(self.device).is_ok() {
            // SAFETY: `ptr` came from cuMemAllocManaged with this device's context
            // current (made current again above) and is freed once, here.
            let _ = unsafe { result::memory::free(self.ptr) };
        }
    }
}

/// `size` bytes of managed memory on the current device, as a pointer to its start.
/// Keep an `Arc<ManagedMemory>` ([`ManagedMemory::new`]) to prefetch or advise it.
pub fn malloc_managed(size: usize) -> Result<MemoryPointer> {
    Ok(MemoryPointer::from_memory(Arc::new(ManagedMemory::new(
        size,
    )?)))
}
