//! Interprocess memory: device memory of one process opened in another
//! (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`), for plain allocations and for memory
//! of a [`MemoryPool`](crate::MemoryPool).
//!
//! CuPy's `runtime.ipcGetMemHandle` / `ipcOpenMemHandle`, with the part users trip on
//! handled: CUDA hands out a handle for a whole allocation only, while a pool's
//! pointer usually lies in the middle of a segment. [`MemoryPointer::ipc_handle`]
//! finds the allocation the pointer lies in (`cuMemGetAddressRange`) and returns an
//! [`IpcMemHandle`]: the segment's 64-byte CUDA handle plus the pointer's offset and
//! size in it. Its [`to_bytes`](IpcMemHandle::to_bytes) are plain bytes to send any
//! way (a pipe, a socket, a file, MPI); the other process rebuilds the handle with
//! [`IpcMemHandle::from_bytes`] and opens it with [`IpcMemHandle::open`], which gives
//! a [`MemoryPointer`] to exactly the exported range. The mapping is closed
//! (`cuIpcCloseMemHandle`) when the last pointer to it goes.
//!
//! Ordering between processes uses interprocess events:
//! [`Event::new(_, true, true)`](crate::Event::new), [`Event::ipc_handle`](crate::Event::ipc_handle),
//! [`Event::from_ipc_handle`](crate::Event::from_ipc_handle).
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::ipc::IpcMemHandle;
//! // Exporting process:
//! let p = cuda_rt::get_default_memory_pool().malloc(1 << 20)?;
//! let bytes = p.ipc_handle()?.to_bytes(); // send these 80 bytes
//! // Importing process:
//! let q = IpcMemHandle::from_bytes(&bytes)?.open()?;
//! assert_eq!(q.size(), 1 << 20);
//! # Ok(()) }
//! ```
//!
//! The exporting process keeps the memory alive while others use it (the driver
//! keeps the physical memory until every process has let go, so a late free is no
//! crash, but a pool would hand the bytes to someone else). Stream-ordered memory
//! (`cuMemAllocAsync`, [`MemoryAsyncPool`](crate::memory::MemoryAsyncPool)) cannot be
//! shared this way: CUDA refuses it, and the error says so. It is shared through an
//! exportable pool instead: [`MemoryAsyncPool::create_shareable`](crate::memory::MemoryAsyncPool::create_shareable),
//! its file descriptor sent with [`send_fd`] / [`recv_fd`], and [`PoolPointerHandle`].

use std::fmt;
use std::sync::Arc;

mod fd;
mod pool_pointer;

pub use fd::{recv_fd, send_fd, MAX_FD_PAYLOAD};
pub use pool_pointer::PoolPointerHandle;

use cuda_sys::driver::CUresult;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result, UnsupportedKind};
use crate::memory::{BaseMemory, MemoryPointer};

/// A pointer's interprocess handle: the CUDA handle (`CUipcMemHandle`, 64 bytes) of
/// the allocation it lies in, and the pointer's offset and size there. Plain data:
/// [`to_bytes`](Self::to_bytes) / [`from_bytes`](Self::from_bytes) round-trip it
/// through [`IpcMemHandle::BYTES`] bytes.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle {
    handle: [u8; 64],
    offset: u64,
    size: u64,
}

impl IpcMemHandle {
    /// The length of [`to_bytes`](Self::to_bytes): the 64-byte CUDA handle, then the
    /// offset and the size as little-endian `u64`s.
    pub const BYTES: usize = 80;

    /// A handle from its parts: CUDA's 64 bytes (from `cuIpcGetMemHandle`, by any
    /// route), the offset of the shared range in that allocation, and its size.
    pub fn from_parts(handle: [u8; 64], offset: u64, size: u64) -> IpcMemHandle {
        IpcMemHandle {
            handle,
            offset,
            size,
        }
    }

    /// CUDA's 64-byte handle of the whole allocation.
    pub fn cuda_handle(&self) -> &[u8; 64] {
        &self.handle
    }

    /// Where the shared range starts in the allocation, in bytes.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The shared range's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The handle as [`BYTES`](Self::BYTES) plain bytes, to send to another process.
    pub fn to_bytes(&self) -> [u8; Self::BYTES] {
        let mut out = [0u8; Self::BYTES];
        out[..64].copy_from_slice(&self.handle);
        out[64..72].copy_from_slice(&self.offset.to_le_bytes());
        out[72..80].copy_from_slice(&self.size.to_le_bytes());
        out
    }

    /// The handle from bytes of [`to_bytes`](Self::to_bytes); any other length is an
    /// error saying which length was expected.
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcMemHandle> {
        if bytes.len() != Self::BYTES {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!(
                    "IpcMemHandle::from_bytes: {} bytes, expected {} (64 of CUDA's handle, \
                     then offset and size as little-endian u64s)",
                    bytes.len(),
                    Self::BYTES
                ),
            ));
        }
        let mut handle = [0u8; 64];
        handle.copy_from_slice(&bytes[..64]);
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[r]);
            u64::from_le_bytes(w)
        };
        Ok(IpcMemHandle {
            handle,
            offset: word(64..72),
            size: word(72..80),
        })
    }

    /// Opens the handle in this process on the current device: maps the other
    /// process's allocation (`cuIpcOpenMemHandle`, with lazy peer access, so a handle
    /// of another device of the same host opens too) and returns a pointer to the
    /// shared range. The mapping is closed when the last pointer to it goes. A handle
    /// exported by this same process is refused by CUDA.
    pub fn open(&self) -> Result<MemoryPointer> {
        self.open_on(get_device_id())
    }

    /// [`open`](Self::open) in device `device`'s context.
    pub fn open_on(&self, device: i32) -> Result<MemoryPointer> {
        let size = usize::try_from(self.size).map_err(|_| self.bad_range("size"))?;
        make_current(device)?;
        // SAFETY: the mapping is closed once, by `IpcMemory`'s drop, after the last
        // pointer to it; device memory shared with another process is only ever used
        // by device work (no host access), as the module doc says.
        let base = unsafe { result::ipc::ipc_open_mem_handle(&self.handle, true) }?;
        let mut mem = IpcMemory {
            base,
            ptr: base,
            size: 0,
            device,
        };
        let (_, mapped) = result::ipc::get_address_range(base)?;
        let fits = matches!(self.offset.checked_add(self.size), Some(e) if e <= mapped as u64);
        if !fits {
            // `mem` closes the mapping as it goes.
            return Err(self.bad_range(&format!("the mapped allocation of {mapped} bytes")));
        }
        mem.ptr = base + self.offset;
        mem.size = size;
        Ok(MemoryPointer::from_memory(Arc::new(mem)))
    }

    fn bad_range(&self, what: &str) -> Error {
        Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!(
                "IpcMemHandle: offset {} + size {} does not fit {what}",
                self.offset, self.size
            ),
        )
    }
}

impl fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpcMemHandle(")?;
        for b in &self.handle {
            write!(f, "{b:02x}")?;
        }
        write!(f, ", offset {}, size {})", self.offset, self.size)
    }
}

/// Device memory of another process, mapped with `cuIpcOpenMemHandle`; unmapped when
/// dropped. Reached through the [`MemoryPointer`] of [`IpcMemHandle::open`].
pub struct IpcMemory {
    base: u64,
    ptr: u64,
    size: usize,
    device: i32,
}

impl fmt::Debug for IpcMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpcMemory")
            .field("base", &format_args!("{:#x}", self.base))
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device)
            .finish()
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        if make_current(self.device).is_ok() {
            // SAFETY: `base` came from `cuIpcOpenMemHandle` and is closed here, once;
            // the driver waits for queued work using it. A failure (driver torn
            // down at exit) leaves nothing to do.
            let _ = unsafe { result::ipc::ipc_close_mem_handle(self.base) };
        }
    }
}

// SAFETY: `[ptr, ptr + size)` lies in the mapping (checked against its range when
// opened), which stays mapped until this object drops; the fields never change.
unsafe impl BaseMemory for IpcMemory {
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

impl MemoryPointer {
    /// The interprocess handle of the memory from this pointer to the end of its
    /// memory object (see the [module doc](crate::ipc)): the handle of the allocation
    /// it lies in (for pool memory, the pool's segment), and the pointer's offset in
    /// it. The null pointer, and stream-ordered memory, which CUDA cannot share this
    /// way, are errors that say so.
    pub fn ipc_handle(&self) -> Result<IpcMemHandle> {
        let ptr = self.ptr();
        if ptr == 0 {
            return Err(Error::invalid_argument(
                ArgumentKind::Null,
                "MemoryPointer::ipc_handle: the null pointer has no interprocess handle",
            ));
        }
        make_current(self.device_id())?;
        let (base, range) = result::ipc::get_address_range(ptr)?;
        let handle = result::ipc::ipc_get_mem_handle(base).map_err(|e| match Error::from(e) {
            Error::Driver(d) if d.code == CUresult::CUDA_ERROR_INVALID_VALUE => {
                Error::not_supported(
                    UnsupportedKind::Other,
                    format!(
                        "MemoryPointer::ipc_handle: CUDA cannot make an IPC handle for \
                         {ptr:#x} ({d}); stream-ordered memory (cuMemAllocAsync, \
                         MemoryAsyncPool) is shared through an exportable pool, not IPC \
                         handles"
                    ),
                )
            }
            other => other,
        })?;
        let offset = ptr - base;
        let size = (self.size() as u64).min(range as u64 - offset);
        Ok(IpcMemHandle {
            handle,
            offset,
            size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::IpcMemHandle;

    #[test]
    fn handle_bytes_round_trip() {
        let mut h = [0u8; 64];
        for (i, b) in h.iter_mut().enumerate() {
            *b = i as u8 * 3;
        }
        let x = IpcMemHandle::from_parts(h, 1 << 20, 12345);
        let bytes = x.to_bytes();
        assert_eq!(bytes.len(), IpcMemHandle::BYTES);
        assert_eq!(IpcMemHandle::from_bytes(&bytes).unwrap(), x);
        assert_eq!(&bytes[64..72], &(1u64 << 20).to_le_bytes());
    }

    #[test]
    fn handle_from_bytes_of_a_wrong_length_says_what_it_expected() {
        let e = IpcMemHandle::from_bytes(&[0u8; 64])
            .unwrap_err()
            .to_string();
        assert!(e.contains("64 bytes, expected 80"), "{e}");
    }

    #[test]
    fn handle_debug_is_hex_with_offset() {
        let s = format!("{:?}", IpcMemHandle::from_parts([0xab; 64], 512, 7));
        assert!(s.starts_with("IpcMemHandle(abab"), "{s}");
        assert!(s.ends_with("offset 512, size 7)"), "{s}");
    }
}
