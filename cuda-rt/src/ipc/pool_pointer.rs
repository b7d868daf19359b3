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
//!
//! # One mapping, many imports
//! Importing one allocation twice in a process gives the same mapping (the same
//! address) from the driver, and one `cuMemFree` unmaps it for both. So imports are
//! counted per mapping, process-wide: the mapping is freed when the last memory object
//! of any import of it goes. Counting, importing, checking and freeing happen under one
//! lock, so an import never meets a mapping that a drop is about to free.
//!
//! # The size is checked
//! A handle's size is plain data ([`PoolPointerHandle::from_bytes`] takes any): the
//! import asks the driver for the mapped range (`cuMemGetAddressRange`) and refuses a
//! handle whose pointer is not the start of it or whose size is larger than it; when
//! the driver cannot tell, the import is refused too (a size that cannot be checked
//! is not trusted). The import is undone on refusal.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

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
    /// freed (`cuMemFree`) when the last pointer of every import of it goes (see the
    /// module docs); the pool stays alive until then. A handle whose size is larger
    /// than the mapping the driver made, or that the driver cannot measure, is refused
    /// ([`Error::InvalidArgument`]).
    pub fn import(&self, pool: &MemoryAsyncPool) -> Result<MemoryPointer> {
        let size = usize::try_from(self.size).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!(
                    "PoolPointerHandle::import: size {} does not fit this process's \
                     address space",
                    self.size
                ),
            )
        })?;
        make_current(pool.device_id())?;
        let mut live = IMPORTS.lock().unwrap_or_else(PoisonError::into_inner);
        // SAFETY: the pool is live while `pool` is (and the memory object keeps a clone);
        // that the exporter keeps the allocation alive is the cross-process contract of
        // the module docs, as for IPC handles. The mapping is freed by the last import
        // of it alone (`live` counts them; its lock is held).
        let ptr = unsafe { result::ipc::pool_import_pointer(pool.as_raw(), &self.data) }?;
        live.acquire(ptr);
        let range = result::ipc::get_address_range(ptr);
        if let Err(e) = check_mapping(ptr, size, range.map_err(Error::from)) {
            if live.release(ptr) {
                // SAFETY: mapped by the import above and by no other live import (the
                // count says so, under its lock): freed once, here.
                let _ = unsafe { result::memory::free(ptr) };
            }
            return Err(e);
        }
        drop(live);
        Ok(MemoryPointer::from_memory(Arc::new(ImportedPoolMemory {
            ptr,
            size,
            pool: pool.clone(),
        })))
    }
}

/// Whether a handle's `size` bytes at `ptr` fit the mapping the driver reports for
/// `ptr` (`range`: its base and size, or why it could not tell). Pure.
fn check_mapping(ptr: u64, size: usize, range: Result<(u64, usize)>) -> Result<()> {
    let refuse = |why: String| {
        Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!("PoolPointerHandle::import: {why}; the import was undone"),
        ))
    };
    match range {
        Err(e) => refuse(format!(
            "the driver cannot tell the size of the imported allocation at {ptr:#x} \
             ({e}), so the handle's size of {size} bytes cannot be checked"
        )),
        Ok((base, _)) if base != ptr => refuse(format!(
            "the imported pointer {ptr:#x} is not the start of its mapping (which starts \
             at {base:#x})"
        )),
        Ok((_, mapped)) if size > mapped => refuse(format!(
            "the handle claims {size} bytes, the imported allocation has {mapped} (a \
             handle's size is plain data: from_bytes takes any)"
        )),
        Ok(_) => Ok(()),
    }
}

/// The live imports of each mapping, by address (one address is one mapping in a
/// process), guarded by one lock with the driver calls that map and unmap them.
#[derive(Debug, Default)]
struct LiveImports {
    count: HashMap<u64, usize>,
}

impl LiveImports {
    /// One more import of the mapping at `ptr`.
    fn acquire(&mut self, ptr: u64) {
        *self.count.entry(ptr).or_insert(0) += 1;
    }

    /// One import of the mapping at `ptr` less; `true` when it was the last (the
    /// caller frees the mapping). An address never acquired is `false`: not ours.
    fn release(&mut self, ptr: u64) -> bool {
        match self.count.get_mut(&ptr) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.count.remove(&ptr);
                true
            }
            None => false,
        }
    }
}

/// The process's imported mappings (see the module docs).
static IMPORTS: LazyLock<Mutex<LiveImports>> = LazyLock::new(Mutex::default);

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
        // Under the lock until the mapping is freed: an import of the same allocation
        // waits, and maps it anew, rather than share a mapping about to go.
        let mut live = IMPORTS.lock().unwrap_or_else(PoisonError::into_inner);
        if live.release(self.ptr) && make_current(self.pool.device_id()).is_ok() {
            // SAFETY: `ptr` came from cuMemPoolImportPointer and this was its last live
            // import (the count, under its lock): freed once, here (the driver's
            // documented way to release an imported pointer; it waits for the work
            // queued on it). A failure at exit leaves nothing to do.
            let _ = unsafe { result::memory::free(self.ptr) };
        }
        drop(live);
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
    fn a_mapping_is_freed_by_its_last_import_only() {
        let mut live = LiveImports::default();
        live.acquire(0x1000);
        live.acquire(0x1000);
        live.acquire(0x2000);
        assert!(!live.release(0x1000), "another import still uses it");
        assert!(live.release(0x1000), "the last import frees it");
        assert!(!live.release(0x1000), "freed once");
        assert!(live.release(0x2000));
        assert!(!live.release(0x3000), "never imported: not ours to free");
        assert!(live.count.is_empty());
    }

    #[test]
    fn a_handle_larger_than_its_mapping_or_not_at_its_start_is_refused() {
        check_mapping(0x1000, 4096, Ok((0x1000, 4096))).unwrap();
        check_mapping(0x1000, 512, Ok((0x1000, 2 << 20))).unwrap();
        let e = check_mapping(0x1000, 8192, Ok((0x1000, 4096))).unwrap_err();
        assert!(e.to_string().contains("claims 8192 bytes"), "{e}");
        let e = check_mapping(0x1200, 512, Ok((0x1000, 4096))).unwrap_err();
        assert!(e.to_string().contains("not the start"), "{e}");
        let unknown = Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            "no range",
        ));
        let e = check_mapping(0x1000, 512, unknown).unwrap_err();
        assert!(e.to_string().contains("cannot tell"), "{e}");
        assert!(e.to_string().contains("undone"), "{e}");
    }

    #[test]
    fn only_the_start_of_an_allocation_is_exported() {
        let e = PoolPointerHandle::export(&MemoryPointer::null(0)).unwrap_err();
        assert!(e.to_string().contains("not the start"), "{e}");
    }
}
