//! Pinned (page-locked) host memory, its pool, registration of existing memory, and
//! copies between pageable memory and the device at pinned speed (CuPy's
//! `cupy.cuda.pinned_memory`, and more).
//!
//! - [`alloc_pinned_memory`] allocates through the current pinned allocator: the
//!   default [`PinnedMemoryPool`] unless [`set_pinned_memory_allocator`] chose
//!   another pool or none.
//! - [`PinnedMemory`] owns one `cuMemHostAlloc` allocation (portable by default;
//!   mapped and write-combined on request, [`PinnedFlags`]).
//! - [`PinnedMemoryPointer`] is a handle to a range of it, with offsets, byte and
//!   typed views, and asynchronous copies to and from a device [`MemoryPointer`] that
//!   keep both the pinned and the device memory from being reused or freed until they
//!   have finished.
//! - [`PinnedBlock`] is a block of a `'static` pool held bare, for callers that hand
//!   out raw addresses ([`PinnedMemoryPool::malloc_block`]).
//! - [`PinnedMemoryPool`] caches pinned memory; it wastes at most 511 bytes per
//!   request (see [`pool`]'s doc), where CuPy rounds to a power of two.
//! - [`register`] page-locks a `&mut [u8]` the program already has, until the guard
//!   drops.
//! - [`copy_host_to_device`] / [`copy_device_to_host`] copy ordinary memory to or from
//!   a [`MemoryPointer`] through pooled pinned staging buffers with several chunks in
//!   flight and the host side spread over persistent worker threads (see [`staging`]).
//!
//! # Soundness
//! The safe copies name the device side with a [`MemoryPointer`]: its bounds are
//! checked before any CUDA call, and it keeps the device memory alive (for an
//! asynchronous copy, until the copy has completed: the copy's fence holds a clone).
//! The forms that take a raw device address (`*_raw`) are `unsafe fn`: with unified
//! addressing a raw address can be host memory behind a live Rust reference, or a
//! block an allocator has handed to someone else. Asynchronous pinned copies refuse a
//! stream that is capturing a graph ([`Error::Capture`]): the graph would use the
//! pinned block on every launch, after it went back to its pool.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::pinned;
//! let mut buf = pinned::alloc_pinned_memory(1 << 20)?;
//! buf.as_mut_slice_of::<f32>()?.fill(1.0);
//! let dev = cuda_rt::alloc(1 << 20)?;
//! buf.copy_to_device_async(&dev, &cuda_rt::get_current_stream())?;
//! // Both go back to their pools only once the copy has finished.
//! drop(buf);
//! drop(dev);
//! # Ok(()) }
//! ```

mod allocator;
mod block;
mod bytes;
mod fence;
mod host_copy;
mod memory;
pub mod pool;
mod pool_core;
mod register;
pub mod staging;

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};

pub use allocator::{
    PinnedAllocator, PinnedFreeFn, PinnedFunctions, PinnedMallocFn, PinnedMemoryAllocator,
};
pub use block::PinnedBlock;
pub use memory::{alloc_pinned_memory, PinnedMemory, PinnedMemoryPointer};
pub use pool::PinnedMemoryPool;
pub use pool_core::PinnedFlags;
/// Pool blocks are multiples of this many bytes: the most a request wastes is one less.
pub const ALLOCATION_UNIT_BYTES: usize = pool::ALLOCATION_UNIT;
pub use register::{register, register_with_flags, RegisterFlags, RegisteredMemory};
pub use staging::{
    copy_device_to_host, copy_device_to_host_raw, copy_host_to_device, copy_host_to_device_raw,
    parallel_memcpy, set_staging_threads, staging_threads, CHUNK_SIZE, PAGEABLE_THRESHOLD,
    RAMP_START, STAGING_BUFFERS,
};

use crate::error::{ArgumentKind, Error, Result, StateKind};
use crate::memory::MemoryPointer;

/// The process-wide default pinned memory pool (created on first use).
pub fn get_default_pinned_memory_pool() -> PinnedMemoryPool {
    default_pinned_memory_pool().clone()
}

/// The process-wide default pinned memory pool, borrowed: what
/// [`get_default_pinned_memory_pool`] clones (a pool handle is reference-counted, so
/// the clone and its drop are two atomic read-modify-writes, a third of a cached
/// pair's cost when taken per allocation).
///
/// ```
/// // The same pool every time, created on first use; nothing is cloned.
/// let pool = cuda_rt::pinned::default_pinned_memory_pool();
/// assert!(std::ptr::eq(pool, cuda_rt::pinned::default_pinned_memory_pool()));
/// ```
pub fn default_pinned_memory_pool() -> &'static PinnedMemoryPool {
    static DEFAULT: OnceLock<PinnedMemoryPool> = OnceLock::new();
    DEFAULT.get_or_init(PinnedMemoryPool::new)
}

/// The allocator [`alloc_pinned_memory`] uses: `None` before any call to
/// [`set_pinned_memory_allocator`] (meaning the default pool).
static ALLOCATOR: RwLock<Option<PinnedMemoryAllocator>> = RwLock::new(None);
/// Bumped by each [`set_pinned_memory_allocator`]; threads cache the allocator of the
/// generation they last saw, so an allocation takes no lock.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CACHED: RefCell<(u64, Option<PinnedMemoryAllocator>)> = const { RefCell::new((0, None)) };
}

/// Sets the allocator of [`alloc_pinned_memory`] for every thread (CuPy's
/// `set_pinned_memory_allocator`): a pool (`pool` or `Some(pool)`) allocates from
/// it, `None` allocates each time with `cuMemHostAlloc` (no pooling), and a
/// [`PinnedFunctions`] pair allocates each time with the user's functions.
///
/// ```no_run
/// use cuda_rt::pinned::{self, PinnedMemoryPool};
/// pinned::set_pinned_memory_allocator(PinnedMemoryPool::new());
/// pinned::set_pinned_memory_allocator(None); // no pooling
/// ```
pub fn set_pinned_memory_allocator(allocator: impl Into<PinnedMemoryAllocator>) {
    let mut a = ALLOCATOR.write().unwrap_or_else(PoisonError::into_inner);
    *a = Some(allocator.into());
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The pool [`alloc_pinned_memory`] allocates from now (`None`: no pooling, or a
/// user's function pair; see [`get_pinned_memory_allocator_kind`]).
pub fn get_pinned_memory_allocator() -> Option<PinnedMemoryPool> {
    with_current_allocator(|a| match a {
        PinnedMemoryAllocator::Pool(p) => Some(p.clone()),
        _ => None,
    })
}

/// What [`alloc_pinned_memory`] allocates with now.
pub fn get_pinned_memory_allocator_kind() -> PinnedMemoryAllocator {
    with_current_allocator(PinnedMemoryAllocator::clone)
}

fn read_allocator() -> PinnedMemoryAllocator {
    let a = ALLOCATOR.read().unwrap_or_else(PoisonError::into_inner);
    match &*a {
        None => PinnedMemoryAllocator::Pool(get_default_pinned_memory_pool()),
        Some(p) => p.clone(),
    }
}

/// Runs `f` with the current allocator, from this thread's cache when no
/// [`set_pinned_memory_allocator`] happened since it was filled.
pub(crate) fn with_current_allocator<R>(f: impl Fn(&PinnedMemoryAllocator) -> R) -> R {
    let generation = GENERATION.load(Ordering::Acquire);
    let r = CACHED.try_with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        if c.0 != generation {
            *c = (generation, Some(read_allocator()));
        }
        // No clone of the pool (a shared atomic count): `f` runs on the cached one.
        c.1.as_ref().map(&f)
    });
    match r {
        Ok(Some(r)) => r,
        // Thread exiting, or `f` re-entered: read the shared setting.
        _ => f(&read_allocator()),
    }
}

/// Checks that `bytes` bytes fit in the room left behind the device pointer `p` (the
/// `side` of the copy `what`), before any CUDA call.
#[inline]
/// `cuMemHostAlloc(size, flags)` in the current context: page-locked host memory, its
/// address as an integer; the caller frees it once with `cuMemFreeHost`.
pub(crate) fn host_alloc(size: usize, flags: u32) -> Result<u64> {
    let p = cuda_sys::result::memory::host_alloc(size, flags)?;
    if p.is_null() {
        return Err(Error::invalid_state(
            StateKind::Unexpected,
            format!("cuMemHostAlloc({size}) succeeded but returned a null pointer"),
        ));
    }
    Ok(p as u64)
}

pub(crate) fn check_room(what: &str, side: &str, p: &MemoryPointer, bytes: usize) -> Result<()> {
    if bytes > p.size() {
        return Err(no_room(what, side, p, bytes));
    }
    // Pinned copies are never captured: the memory must exist outside any graph.
    if bytes != 0 {
        p.mem().check_use(None)?;
    }
    Ok(())
}

#[cold]
fn no_room(what: &str, side: &str, p: &MemoryPointer, bytes: usize) -> Error {
    Error::invalid_argument(
        ArgumentKind::OutOfBounds {
            requested: bytes as u64,
            available: p.size() as u64,
        },
        format!(
            "{what}: {bytes} bytes do not fit: the device {side} has only {} bytes left behind \
             the pointer {:#x} (offset {} of a memory of {} bytes)",
            p.size(),
            p.ptr(),
            p.offset(),
            p.mem().size()
        ),
    )
}
