//! Page-locking memory the program already has (`cuMemHostRegister`), undone when the
//! guard is dropped (`cuMemHostUnregister`). The guard borrows the memory mutably, so
//! nothing else can touch or free it while it is registered. Its copies are
//! synchronous and name the device side with a bounds-checked [`MemoryPointer`].

use std::ffi::c_void;

use cuda_sys::result;

use crate::device::context;
use crate::error::Result;
use crate::memory::pointer::refuse_own_capture;
use crate::memory::MemoryPointer;
use crate::stream::AsStream;

bitflags::bitflags! {
    /// `cuMemHostRegister` flags. The default is [`PORTABLE`](Self::PORTABLE).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct RegisterFlags: u32 {
        /// Pinned for every CUDA context (the default).
        const PORTABLE = cuda_sys::driver::CU_MEMHOSTREGISTER_PORTABLE;
        /// Mapped into the device's address space
        /// ([`RegisteredMemory::device_ptr`]).
        const DEVICEMAP = cuda_sys::driver::CU_MEMHOSTREGISTER_DEVICEMAP;
    }
}

impl Default for RegisterFlags {
    fn default() -> Self {
        RegisterFlags::PORTABLE
    }
}

/// Host memory registered with CUDA (page-locked) for as long as this guard lives;
/// it borrows the memory. Copies from and to it run at pinned speed.
#[derive(Debug)]
pub struct RegisteredMemory<'a> {
    bytes: &'a mut [u8],
    flags: RegisterFlags,
}

/// Page-locks `bytes` (portable) until the returned guard is dropped. An empty slice
/// registers nothing.
pub fn register(bytes: &mut [u8]) -> Result<RegisteredMemory<'_>> {
    register_with_flags(bytes, RegisterFlags::PORTABLE)
}

/// Page-locks `bytes` with `flags` until the returned guard is dropped.
pub fn register_with_flags(bytes: &mut [u8], flags: RegisterFlags) -> Result<RegisteredMemory<'_>> {
    if !bytes.is_empty() {
        context::make_current(crate::device::get_device_id())?;
        // SAFETY: `bytes` is allocated host memory, borrowed mutably by the guard for as
        // long as it is registered; the guard's copies are synchronous.
        unsafe {
            result::memory::host_register(bytes.as_mut_ptr().cast(), bytes.len(), flags.bits())
        }?;
    }
    Ok(RegisteredMemory { bytes, flags })
}

impl RegisteredMemory<'_> {
    /// The host address.
    pub fn ptr(&self) -> u64 {
        self.bytes.as_ptr() as u64
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The flags it was registered with.
    pub fn flags(&self) -> RegisterFlags {
        self.flags
    }

    /// The registered bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.bytes
    }

    /// The registered bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.bytes
    }

    /// The device address of mapped memory ([`RegisterFlags::DEVICEMAP`]).
    pub fn device_ptr(&self) -> Result<u64> {
        context::make_current(crate::device::get_device_id())?;
        Ok(result::memory::host_get_device_pointer(
            self.bytes.as_ptr() as *mut c_void,
        )?)
    }

    /// Copies the bytes to the device memory at `dst` on `stream` and waits for the
    /// copy. More bytes than the room left behind `dst` ([`MemoryPointer::size`]) is an
    /// error, and nothing is copied. (Memory known only by a raw address can be wrapped
    /// in a [`MemoryPointer`] with the `unsafe`
    /// [`UnownedMemory::new`](crate::memory::UnownedMemory::new).)
    pub fn copy_to_device(
        &self,
        dst: &MemoryPointer,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        super::check_room("copy_to_device", "destination", dst, self.bytes.len())?;
        if self.bytes.is_empty() {
            return Ok(());
        }
        // Before anything is queued: the copy must be waited for before the bytes are
        // given back, and this thread's own capture would refuse that wait.
        refuse_own_capture("RegisteredMemory::copy_to_device")?;
        context::make_current(stream.device_id())?;
        let s = stream.as_raw();
        // Not into a capture: the copy is waited for before the bytes are given back.
        crate::capture::enqueue_uncaptured(stream, "RegisteredMemory::copy_to_device", || {
            // SAFETY: the bytes fit behind `dst` (`check_room`), which keeps the device
            // memory allocated for the whole call; `self.bytes` is borrowed until the
            // copy is waited for below; `s` is live while `stream` is borrowed
            // (`AsStream`), its context made current above.
            Ok(unsafe {
                result::memory::memcpy_htod_async(
                    dst.ptr(),
                    self.bytes.as_ptr().cast(),
                    self.bytes.len(),
                    s,
                )
            }?)
        })?;
        // SAFETY: as above.
        unsafe { crate::stream::drain(s) }
    }

    /// Fills the memory from the device memory at `src` on `stream` and waits for the
    /// copy. More bytes than the room left behind `src` ([`MemoryPointer::size`]) is an
    /// error, and nothing is copied.
    pub fn copy_from_device(
        &mut self,
        src: &MemoryPointer,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        super::check_room("copy_from_device", "source", src, self.bytes.len())?;
        if self.bytes.is_empty() {
            return Ok(());
        }
        // Before anything is queued: the copy must be waited for before the bytes are
        // given back, and this thread's own capture would refuse that wait.
        refuse_own_capture("RegisteredMemory::copy_from_device")?;
        context::make_current(stream.device_id())?;
        let s = stream.as_raw();
        let (bytes, len) = (self.bytes.as_mut_ptr(), self.bytes.len());
        // Not into a capture: the copy is waited for before the bytes are given back.
        crate::capture::enqueue_uncaptured(stream, "RegisteredMemory::copy_from_device", || {
            // SAFETY: the bytes fit behind `src` (`check_room`), which keeps the device
            // memory allocated for the whole call; `self.bytes` is borrowed mutably
            // until the copy is waited for below, and any byte is a valid `u8`; `s` is
            // live while `stream` is borrowed (`AsStream`), its context made current
            // above.
            Ok(unsafe { result::memory::memcpy_dtoh_async(bytes.cast(), src.ptr(), len, s) }?)
        })?;
        // SAFETY: as above.
        unsafe { crate::stream::drain(s) }
    }

    /// Unregisters now, returning the driver's error if there is one (drop ignores it).
    pub fn unregister(self) -> Result<()> {
        let r = self.unregister_inner();
        std::mem::forget(self);
        r
    }

    fn unregister_inner(&self) -> Result<()> {
        if self.bytes.is_empty() {
            return Ok(());
        }
        // SAFETY: the start of the range registered by `register_with_flags`; the
        // guard's copies were synchronous, so none is still queued.
        Ok(unsafe { result::memory::host_unregister(self.bytes.as_ptr() as *mut c_void) }?)
    }
}

impl Drop for RegisteredMemory<'_> {
    fn drop(&mut self) {
        let _ = self.unregister_inner();
    }
}
