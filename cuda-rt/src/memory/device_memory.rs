//! The memory-object trait ([`BaseMemory`]) and plain device memory ([`Memory`],
//! `cuMemAlloc`/`cuMemFree`, or memory from a user allocator that remembers how to
//! free itself), with those user allocators ([`ClosureAllocator`], [`CAllocator`]):
//! their memory frees itself through them, so they sit here, below the allocator
//! selection (`allocator.rs`) and the pools.

use std::ffi::c_void;
use std::fmt;
use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::device_count;
use crate::error::{Error, OutOfMemory, OutOfMemoryCause, Result, StateKind};
use crate::memory::MemoryPointer;
use crate::stream::StreamRef;

/// A range of device-accessible memory that lives as long as the object:
/// what a [`MemoryPointer`](crate::memory::MemoryPointer) points into.
///
/// # Safety
/// For as long as the object lives, `[ptr(), ptr() + size())` must be memory that CUDA
/// copies and memsets may read and write (device, managed, or mapped pinned memory),
/// owned by or kept alive by the object, and the three values must never change.
/// A size of 0 may come with any pointer (0 is usual) and is never accessed.
pub unsafe trait BaseMemory: Send + Sync + fmt::Debug + 'static {
    /// The start address (`CUdeviceptr`).
    fn ptr(&self) -> u64;
    /// The size in bytes.
    fn size(&self) -> usize;
    /// The device the memory belongs to.
    fn device_id(&self) -> i32;

    /// Called by the last [`MemoryPointer`](crate::memory::MemoryPointer) to the
    /// object as it goes (outside graph capture), with what may be the last reference:
    /// the default drops it. An implementation may give its memory back and keep the
    /// emptied allocation for reuse instead.
    #[inline]
    fn recycle(self: Arc<Self>) {
        drop(self);
    }

    /// Marks the memory as used by work queued on `stream` (PyTorch's
    /// `record_stream`): once the memory is released, it is not given to anyone else
    /// before the work `stream` had queued at the release has completed. The default
    /// does nothing: right for memory whose release waits for the device anyway
    /// (`cuMemFree`); a pooled block ([`MemoryPool`](crate::memory::MemoryPool))
    /// records an event on `stream` when it is freed.
    fn record_stream(&self, stream: &StreamRef) -> Result<()> {
        let _ = stream;
        Ok(())
    }

    /// [`record_stream`](Self::record_stream) for work cuda-rt has just queued on
    /// `stream` (see `memory::uses`), which cannot be taken back: an implementation
    /// that fails to record must keep its memory from reuse rather than report. The
    /// default calls `record_stream`, whose error it can only drop: implement this
    /// where `record_stream` can fail.
    #[inline]
    fn record_use(&self, stream: &StreamRef) {
        let _ = self.record_stream(stream);
    }

    /// Whether work on `stream` (`None`: a synchronous operation on the thread's
    /// current stream) may use the memory now. Always, but for memory that exists
    /// only at times (a graph's allocation: inside its capture, and once a launch of
    /// its graph made it), which says why not.
    #[inline]
    fn check_use(&self, stream: Option<&StreamRef>) -> Result<()> {
        let _ = stream;
        Ok(())
    }
}

/// A Rust allocation function: `malloc(size, device)` returns a device address of at
/// least `size` bytes on `device`.
pub type MallocFn = dyn Fn(usize, i32) -> Result<u64> + Send + Sync;
/// The matching free function: `free(ptr, size, device)`.
pub type FreeFn = dyn Fn(u64, usize, i32) + Send + Sync;

/// A C allocation function: `malloc(ctx, size, device)` returns a device address, or 0
/// when it fails.
pub type CMallocFn = extern "C" fn(ctx: *mut c_void, size: usize, device: i32) -> u64;
/// A C free function: `free(ctx, ptr, device)`.
pub type CFreeFn = extern "C" fn(ctx: *mut c_void, ptr: u64, device: i32);

/// A pair of Rust closures used as an allocator (CuPy's `PythonFunctionAllocator`).
///
/// Memory goes back to its `free` only once the device's queued work is done (a
/// context synchronize, as `cuMemFree` waits), since the pair may hand it out again at
/// once; when that wait cannot be made (during a capture) the memory is kept instead.
#[derive(Clone)]
pub struct ClosureAllocator {
    pub(super) malloc: Arc<MallocFn>,
    pub(super) free: Arc<FreeFn>,
}

impl ClosureAllocator {
    /// The allocator `malloc` / `free`.
    ///
    /// # Safety
    /// A successful `malloc(size, device)` must return the address of at least `size`
    /// bytes of device-accessible memory of `device` that stays valid until `free` is
    /// called with it (and no memory that anything else writes to meanwhile).
    pub unsafe fn new(
        malloc: impl Fn(usize, i32) -> Result<u64> + Send + Sync + 'static,
        free: impl Fn(u64, usize, i32) + Send + Sync + 'static,
    ) -> Self {
        ClosureAllocator {
            malloc: Arc::new(malloc),
            free: Arc::new(free),
        }
    }

    pub(super) fn malloc(&self, size: usize, device: i32) -> Result<MemoryPointer> {
        let ptr = (self.malloc)(size, device)?;
        if ptr == 0 {
            return Err(Error::invalid_state(
                StateKind::AllocatorFailed,
                format!(
                    "the closure allocator returned a null pointer for {size} bytes on device \
                     {device}"
                ),
            ));
        }
        let mem = Memory::from_parts(ptr, size, device, Release::Closure(self.clone()));
        Ok(MemoryPointer::from_memory(Arc::new(mem)))
    }

    pub(crate) fn free(&self, ptr: u64, size: usize, device: i32) {
        (self.free)(ptr, size, device)
    }
}

/// A C function pair with an opaque argument used as an allocator (CuPy's
/// `CFunctionAllocator`; the C shim builds these).
///
/// Memory goes back to its `free` only once the device's queued work is done (a
/// context synchronize, as `cuMemFree` waits), since the pair may hand it out again at
/// once; when that wait cannot be made (during a capture) the memory is kept instead.
#[derive(Clone, Copy)]
pub struct CAllocator {
    pub(super) malloc: CMallocFn,
    pub(super) free: CFreeFn,
    /// The opaque argument, as an address (it crosses threads with the allocator).
    pub(super) ctx: usize,
}

impl CAllocator {
    /// The allocator `malloc(ctx, ..)` / `free(ctx, ..)`.
    ///
    /// # Safety
    /// Both functions may be called from any thread with `ctx`, for as long as the
    /// allocator or memory from it lives. A non-zero `malloc(ctx, size, device)` must be
    /// the address of at least `size` bytes of device-accessible memory of `device`,
    /// valid until `free(ctx, ptr, device)`.
    pub unsafe fn new(malloc: CMallocFn, free: CFreeFn, ctx: *mut c_void) -> Self {
        CAllocator {
            malloc,
            free,
            ctx: ctx as usize,
        }
    }

    pub(super) fn malloc(&self, size: usize, device: i32) -> Result<MemoryPointer> {
        let ptr = (self.malloc)(self.ctx as *mut c_void, size, device);
        if ptr == 0 {
            return Err(Error::invalid_state(
                StateKind::AllocatorFailed,
                format!(
                    "the C allocator failed to allocate {size} bytes on device {device} (it \
                     returned 0)"
                ),
            ));
        }
        let mem = Memory::from_parts(ptr, size, device, Release::C(*self));
        Ok(MemoryPointer::from_memory(Arc::new(mem)))
    }

    pub(crate) fn free(&self, ptr: u64, device: i32) {
        (self.free)(self.ctx as *mut c_void, ptr, device)
    }
}

/// How a [`Memory`] gives its bytes back.
pub(crate) enum Release {
    /// Nothing to release (size 0).
    Nothing,
    /// `cuMemFree`.
    Driver,
    /// A user closure pair's `free`.
    Closure(ClosureAllocator),
    /// A C function pair's `free`.
    C(CAllocator),
}

/// Device memory: from `cuMemAlloc` ([`Memory::new`]) or from a user allocator, freed
/// when dropped by whichever allocated it. Size 0 is a null pointer that owns nothing.
pub struct Memory {
    ptr: u64,
    size: usize,
    device: i32,
    release: Release,
}

impl fmt::Debug for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let by = match self.release {
            Release::Nothing => "nothing",
            Release::Driver => "cuMemFree",
            Release::Closure(_) => "closure allocator",
            Release::C(_) => "C allocator",
        };
        f.debug_struct("Memory")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device)
            .field("freed_by", &by)
            .finish()
    }
}

impl Memory {
    /// `size` bytes of device memory on the current device (`cuMemAlloc`). Size 0 gives
    /// a null pointer of size 0 and makes no driver call. Asking for more than the device
    /// has is [`Error::OutOfMemory`] with the requested size.
    pub fn new(size: usize) -> Result<Memory> {
        Self::new_on(crate::device::get_device_id(), size)
    }

    /// `size` bytes of device memory on device `device`.
    pub fn new_on(device: i32, size: usize) -> Result<Memory> {
        if size == 0 {
            return Ok(Memory::null(device));
        }
        make_current_checked(device)?;
        let ptr = result::memory::alloc(size)
            .map_err(|e| out_of_memory(e.into(), size as u64, device, None))?;
        Ok(Memory {
            ptr,
            size,
            device,
            release: Release::Driver,
        })
    }

    /// The null memory of size 0 on `device`: owns nothing, frees nothing.
    pub fn null(device: i32) -> Memory {
        Memory {
            ptr: 0,
            size: 0,
            device,
            release: Release::Nothing,
        }
    }

    /// Memory that `release` frees when dropped.
    pub(crate) fn from_parts(ptr: u64, size: usize, device: i32, release: Release) -> Memory {
        Memory {
            ptr,
            size,
            device,
            release,
        }
    }
}

// SAFETY: `ptr..ptr+size` is an allocation the object owns until drop (from cuMemAlloc,
// or from an allocator whose constructor's caller promised the same); the fields never
// change.
unsafe impl BaseMemory for Memory {
    #[inline]
    fn ptr(&self) -> u64 {
        self.ptr
    }
    #[inline]
    fn size(&self) -> usize {
        self.size
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.device
    }
}

impl Drop for Memory {
    fn drop(&mut self) {
        match &self.release {
            Release::Nothing => {}
            Release::Driver => {
                // An error here (a context torn down at exit) leaves nothing to do.
                if make_current(self.device).is_ok() {
                    // SAFETY: `ptr` came from cuMemAlloc in this device's primary
                    // context (made current above) and is freed once, here, when the
                    // last owner drops it.
                    let _ = unsafe { result::memory::free(self.ptr) };
                }
            }
            // A user's allocator may hand the memory out again at once (`cuMemFree`
            // waits for the device): the work queued before the release goes first,
            // and memory whose work cannot be waited for is leaked, not freed under it.
            Release::Closure(c) => {
                if drain_device(self.device) {
                    c.free(self.ptr, self.size, self.device)
                }
            }
            Release::C(c) => {
                if drain_device(self.device) {
                    c.free(self.ptr, self.device)
                }
            }
        }
    }
}

/// Waits for the work of `device`'s context, before memory goes back to an allocator
/// that may hand it out at once; `false` when the wait failed or cannot be made
/// (during this thread's or another thread's global-mode capture, or on a dead context): the work is then not known to
/// be done, and the caller leaks the memory rather than free it under that work.
pub(crate) fn drain_device(device: i32) -> bool {
    if crate::capture::this_thread_captures() {
        // This thread's capture refuses the wait (and asking could break it).
        return false;
    }
    if make_current(device).is_err() {
        // With no driver at all, or no such device (user pairs run without one), no
        // device work can use the memory; a context of a real device that cannot be
        // made current cannot be waited for.
        let no_device = device_count().map_or(true, |n| device >= n);
        return sys::api().is_err() || no_device;
    }
    result::context::synchronize().is_ok()
}

/// Checks that device `id` exists ([`Error::InvalidDevice`] otherwise).
pub(crate) fn check_device(id: i32) -> Result<()> {
    let count = device_count()?;
    if id < 0 || id >= count {
        return Err(Error::InvalidDevice { id, count });
    }
    Ok(())
}

/// Makes `device`'s primary context current; an unknown device is
/// [`Error::InvalidDevice`] rather than a raw driver code.
#[inline]
pub(crate) fn make_current_checked(device: i32) -> Result<()> {
    match make_current(device) {
        Ok(()) => Ok(()),
        Err(e) => {
            check_device(device)?;
            Err(e)
        }
    }
}

/// Turns a driver out-of-memory error into [`Error::OutOfMemory`] with the numbers;
/// any other error passes through.
pub(crate) fn out_of_memory(
    e: Error,
    requested: u64,
    device: i32,
    stats: Option<(u64, u64, Option<u64>)>,
) -> Error {
    match e {
        Error::Driver(d) if d.code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            let (in_use, cached, limit) = stats.unwrap_or((0, 0, None));
            Error::OutOfMemory(Box::new(OutOfMemory {
                requested,
                rounded: Some(requested),
                device: Some(device),
                in_use,
                cached,
                limit,
                cause: OutOfMemoryCause::Driver(d),
            }))
        }
        other => other,
    }
}
