//! Stream-ordered memory shared between processes: a pointer of an exportable
//! [`MemoryAsyncPool`] (made by [`MemoryAsyncPool::create_shareable`]) travels as a
//! [`PoolPointerHandle`] (`cuMemPoolExportPointer`, 64 bytes, plus the size); the other
//! process imports the pool once from its file descriptor
//! ([`MemoryAsyncPool::import_fd`], the descriptor sent with [`send_fd`](super::send_fd))
//! and each pointer with [`PoolPointerHandle::import`] (`cuMemPoolImportPointer`).
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::ipc::{recv_fd, send_fd, PoolPointerHandle};
//! use cuda_rt::memory::MemoryAsyncPool;
//! use std::os::fd::AsFd;
//! # let (socket, other) = std::os::unix::net::UnixStream::pair().unwrap();
//! // Exporting process:
//! let pool = MemoryAsyncPool::create_shareable(0)?;
//! let p = pool.malloc(1 << 20)?;
//! let h = PoolPointerHandle::export(&p)?;
//! send_fd(&socket, pool.export_fd()?.as_fd(), &h.to_bytes())?;
//! // Importing process:
//! let (fd, bytes) = recv_fd(&other)?;
//! let imported = MemoryAsyncPool::import_fd(fd.as_fd(), 0)?;
//! let q = PoolPointerHandle::from_bytes(&bytes)?.import(&imported)?;
//! assert_eq!(q.size(), 1 << 20);
//! # Ok(()) }
//! ```
//!
//! The exporting process keeps the allocation alive, and orders its own use before the
//! importer's (an interprocess event), as with [`IpcMemHandle`](super::IpcMemHandle);
//! the importer frees its mapping (when the last pointer goes) before the exporter
//! frees the allocation.

use std::fmt;
use std::sync::Arc;

use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::{ArgumentKind, Error, Result};
use crate::memory::{BaseMemory, MemoryAsyncPool, MemoryPointer};

/// A pointer of an exportable stream-ordered pool, as plain data: the driver's export
/// data (64 bytes) and the allocation's size. [`to_bytes`](Self::to_bytes) /
/// [`from_bytes`](Self::from_bytes) round-trip it through [`PoolPointerHandle::BYTES`]
/// bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolPointerHandle {
    data: [u8; 64],
    size: u64,
}

impl fmt::Debug for PoolPointerHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PoolPointerHandle")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

impl PoolPointerHandle {
    /// The length of [`to_bytes`](Self::to_bytes).
    pub const BYTES: usize = 72;

    /// The handle of `ptr`, which must be the start of an allocation from a pool made
    /// by [`MemoryAsyncPool::create_shareable`] (the driver refuses other memory, and
    /// the error says so; a pointer offset into an allocation is refused here).
    pub fn export(ptr: &MemoryPointer) -> Result<PoolPointerHandle> {
        if ptr.ptr() == 0 || ptr.offset() != 0 {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!(
                    "PoolPointerHandle::export: {:#x} is not the start of a stream-ordered \
                     allocation (offset {}); export the allocation's own pointer",
                    ptr.ptr(),
                    ptr.offset()
                ),
            ));
        }
        make_current(ptr.device_id())?;
        let data = result::ipc::pool_export_pointer(ptr.ptr())?;
        Ok(PoolPointerHandle {
            data,
            size: ptr.size() as u64,
        })
    }

    /// The allocation's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The handle as [`BYTES`](Self::BYTES) plain bytes: the export data, then the
    /// size (little-endian).
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..64].copy_from_slice(&self.data);
        out[64..].copy_from_slice(&self.size.to_le_bytes());
        out
    }

    /// The handle [`to_bytes`](Self::to_bytes) wrote; any other length is an error.
    pub fn from_bytes(bytes: &[u8]) -> Result<PoolPointerHandle> {
        if bytes.len() != Self::BYTES {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!(
                    "PoolPointerHandle::from_bytes: {} bytes, expected {}",
                    bytes.len(),
                    Self::BYTES
                ),
            ));
        }
        let mut data = [0u8; 64];
        data.copy_from_slice(&bytes[..64]);
        let mut size = [0u8; 8];
        size.copy_from_slice(&bytes[64..]);
        Ok(PoolPointerHandle {
            data,
            size: u64::from_le_bytes(size),
        })
    }

    /// The exported allocation mapped in this process from `pool` (the exporter's pool,
    /// imported with [`MemoryAsyncPool::import_fd`]): a pointer to the whole allocation,
    /// freed (`cuMemFree`) when its last pointer goes; the pool stays alive until then.
    pub fn import(&self, pool: &MemoryAsyncPool) -> Result<MemoryPointer> {
        let size = usize::try_from(self.size).map_err(|_| {
            Error::invalid_argument(ArgumentKind::InvalidValue, "PoolPointerHandle: size")
        })?;
        make_current(pool.device_id())?;
        // SAFETY: the pool is live while `pool` is (and the memory object keeps a clone);
        // that the exporter keeps the allocation alive is the cross-process contract of
        // the module docs, as for IPC handles.
        let ptr = unsafe { result::ipc::pool_import_pointer(pool.as_raw(), &self.data) }?;
        Ok(MemoryPointer::from_memory(Arc::new(ImportedPoolMemory {
            ptr,
            size,
            pool: pool.clone(),
        })))
    }
}

/// An allocation of another process's stream-ordered pool, mapped here.
struct ImportedPoolMemory {
    ptr: u64,
    size: usize,
    pool: MemoryAsyncPool,
}

impl fmt::Debug for ImportedPoolMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportedPoolMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .finish()
    }
}

impl Drop for ImportedPoolMemory {
    fn drop(&mut self) {
        if make_current(self.pool.device_id()).is_ok() {
            // SAFETY: `ptr` came from cuMemPoolImportPointer and is freed once, here (the
            // driver's documented way to release an imported pointer; it waits for the
            // work queued on it). A failure at exit leaves nothing to do.
            let _ = unsafe { result::memory::free(self.ptr) };
        }
    }
}

// SAFETY: `[ptr, ptr + size)` is the imported allocation, mapped until this object
// drops; the fields never change.
unsafe impl BaseMemory for ImportedPoolMemory {
    fn ptr(&self) -> u64 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> i32 {
        self.pool.device_id()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_through_bytes_and_other_lengths_are_refused() {
        let h = PoolPointerHandle {
            data: [7; 64],
            size: 1 << 20,
        };
        let b = h.to_bytes();
        assert_eq!(PoolPointerHandle::from_bytes(&b).unwrap(), h);
        assert!(PoolPointerHandle::from_bytes(&b[..71]).is_err());
        assert_eq!(h.size(), 1 << 20);
    }

    #[test]
    fn only_the_start_of_an_allocation_is_exported() {
        let e = PoolPointerHandle::export(&MemoryPointer::null(0)).unwrap_err();
        assert!(e.to_string().contains("not the start"), "{e}");
    }
}
