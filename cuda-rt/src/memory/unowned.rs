//! [`UnownedMemory`]: device memory someone else owns, kept alive by an owner value.

use std::any::Any;
use std::fmt;

use crate::error::{ArgumentKind, Error, Result};
use crate::memory::device_memory::{check_device, BaseMemory};

/// Memory that another library owns (a framework's tensor, a foreign allocation):
/// never freed by cuda-rt; `owner` is kept alive as long as this object.
pub struct UnownedMemory {
    ptr: u64,
    size: usize,
    device: i32,
    owner: Box<dyn Any + Send + Sync>,
}

impl fmt::Debug for UnownedMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UnownedMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl UnownedMemory {
    /// Wraps `size` bytes at `ptr`, keeping `owner` alive. Without `device`, the device
    /// is asked of the driver (`CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL`); a null pointer or
    /// one CUDA does not know (plain host memory) is then an error that says so. A
    /// given device must exist.
    ///
    /// # Safety
    /// `[ptr, ptr + size)` must be device-accessible memory that stays valid, and that
    /// nothing else frees, for as long as `owner` lives. `owner` is dropped when the
    /// last pointer to the memory goes, which may be while work queued on a stream
    /// still uses the memory: its drop must not let the memory be reused before that
    /// work is done (leave it to `cuMemFree`, which waits, or wait for the device
    /// first, as the C ABI's DLPack import does before the producer's deleter).
    pub unsafe fn new(
        ptr: u64,
        size: usize,
        owner: impl Any + Send + Sync,
        device: Option<i32>,
    ) -> Result<UnownedMemory> {
        let device = match device {
            Some(d) => {
                check_device(d)?;
                d
            }
            None if ptr == 0 => {
                return Err(Error::invalid_argument(
                    ArgumentKind::Null,
                    "UnownedMemory: a null pointer with no device given: the device cannot \
                     be found from the pointer; pass the device",
                ))
            }
            None => {
                crate::device::context::init()?;
                cuda_sys::result::memory::pointer_get_device_ordinal(ptr).map_err(|e| {
                    Error::invalid_argument(
                        ArgumentKind::NotFound,
                        format!(
                            "UnownedMemory: CUDA does not know the pointer {ptr:#x} (plain host \
                             memory, or freed?), so its device cannot be found; pass the device \
                             ({e})"
                        ),
                    )
                })?
            }
        };
        Ok(UnownedMemory {
            ptr,
            size,
            device,
            owner: Box::new(owner),
        })
    }

    /// The owner kept alive, to downcast.
    pub fn owner(&self) -> &(dyn Any + Send + Sync) {
        &*self.owner
    }
}

// SAFETY: the constructor's caller promised that the range stays valid while `owner`
// (a field of this object) lives; the fields never change.
unsafe impl BaseMemory for UnownedMemory {
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
