//! The pinned memory pool: the caching algorithm of `memory::arena` over page-locked
//! host memory, plus a deferred list for blocks freed while a copy still uses them.
//!
//! # Waste bound
//! A request of `n` bytes takes a block of `n` rounded up to a multiple of 512 bytes
//! ([`ALLOCATION_UNIT`]), so **at most 511 bytes per request are wasted** (under 0.05 %
//! of any request of 1 MiB or more). A miss asks `cuMemHostAlloc` for exactly that
//! rounded size; a hit takes the smallest cached chunk that fits and splits off the
//! rest, which stays in the pool, free for other requests. CuPy rounds to the next
//! power of two instead: a 10 GiB request takes 16 GiB there, 10 GiB here.
//!
//! # In-flight protection
//! A block whose memory an asynchronous copy still uses (see
//! [`PinnedMemoryPointer::copy_to_device_async`](super::PinnedMemoryPointer::copy_to_device_async))
//! carries the event recorded after the copy. When its last handle goes, the block
//! waits in a deferred list instead of going back to the cache; each `malloc` first
//! takes back the deferred blocks whose events have completed (a query, no wait), and
//! [`PinnedMemoryPool::free_all_blocks`] and the pool's drop wait for all of them
//! before giving memory back to the driver.
//!
//! # Hot path
//! A cached malloc + free pair allocates nothing on the heap (the emptied handle
//! owner is kept per thread and refilled through relaxed atomics) and makes at most
//! one atomic read-modify-write: a block with no copy in flight is *parked* in the
//! thread's slot and goes back into the cache under the lock of the thread's next
//! malloc, or without it while nothing else changed the cache (statistics,
//! `free_all_blocks` and a malloc about to grow settle every thread's parked block
//! first; see `memory::arena`).
//!
//! # Dropping the pool
//! Recycled handle owners and parking slots keep the pool's core alive, so the pool
//! does not wait for them: when its last user handle goes, everything cached goes
//! back to the driver (after the copies in flight), and so does each block freed
//! after that.

use std::sync::Arc;

use super::allocator::PinnedAllocator;
use super::block::PinnedBlock;
use super::memory::PinnedMemoryPointer;
use super::pool_core::{Core, PinnedBackend, PinnedCore, PinnedFlags};
use crate::error::{Error, Result};
use crate::memory::arena::{MallocError, PoolStats};
use crate::memory::pool::pool_malloc_error;

pub use crate::memory::arena::ALLOCATION_UNIT;

/// A caching pool of pinned host memory (CuPy's `PinnedMemoryPool`): freed memory is
/// kept and reused instead of going back to `cuMemHostAlloc` / `cuMemFreeHost`, which
/// take about a millisecond each. Cheap to clone (clones share the pool); `Send +
/// Sync`. See the [module doc](self) for the waste bound (at most 511 bytes per
/// request) and the protection of memory used by copies in flight.
#[derive(Clone)]
pub struct PinnedMemoryPool {
    handle: Arc<Handle>,
}

/// What the user's pool handles share: its drop (the last handle) orphans the core.
struct Handle {
    core: Arc<PinnedCore>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.core.orphan();
    }
}

impl std::fmt::Debug for PinnedMemoryPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMemoryPool")
            .field("stats", &self.stats())
            .field("deferred", &self.core().n_deferred())
            .finish()
    }
}

impl Default for PinnedMemoryPool {
    fn default() -> Self {
        Self::new()
    }
}

impl PinnedMemoryPool {
    /// An empty pool of portable pinned memory (`CU_MEMHOSTALLOC_PORTABLE`).
    pub fn new() -> Self {
        Self::with_flags(PinnedFlags::PORTABLE)
    }

    #[inline]
    fn core(&self) -> &Arc<PinnedCore> {
        &self.handle.core
    }

    /// An empty pool whose memory is allocated with `flags`.
    pub fn with_flags(flags: PinnedFlags) -> Self {
        Self::with_allocator(PinnedAllocator::HostAlloc(flags))
    }

    /// An empty pool that caches memory from `allocator` (CuPy's
    /// `PinnedMemoryPool(allocator)`): `cuMemHostAlloc` with flags, or a user's
    /// function pair. Rounding, waste bound, in-flight protection and statistics are
    /// the same.
    pub fn with_allocator(allocator: PinnedAllocator) -> Self {
        PinnedMemoryPool {
            handle: Arc::new(Handle {
                core: Arc::new(Core::new(PinnedBackend { source: allocator })),
            }),
        }
    }

    /// The allocator whose memory the pool caches.
    pub fn allocator(&self) -> &PinnedAllocator {
        &self.core().pool().backend().source
    }

    /// The flags the pool allocates with (empty for a user's function pair, whose
    /// flags the pool does not know).
    pub fn flags(&self) -> PinnedFlags {
        match self.allocator() {
            PinnedAllocator::HostAlloc(f) => *f,
            PinnedAllocator::Functions(_) => PinnedFlags::empty(),
        }
    }

    /// `size` bytes of pinned memory (a block of `size` rounded up to 512 bytes).
    /// The memory returns to the pool when the last handle to it is dropped (or given
    /// to [`free`](Self::free)), and not before any copy in flight on it has finished.
    /// `size == 0` gives an empty pointer (address 0) that holds nothing.
    #[inline]
    pub fn malloc(&self, size: usize) -> Result<PinnedMemoryPointer> {
        match self.core().malloc(size) {
            Ok(block) => Ok(PinnedMemoryPointer::pooled(self.core(), block)),
            Err(e) => Err(self.malloc_error(e)),
        }
    }

    /// `size` bytes as a bare [`PinnedBlock`] of this `'static` pool (the default one,
    /// [`default_pinned_memory_pool`](super::default_pinned_memory_pool)): the same
    /// memory [`malloc`](Self::malloc) would give, without the handle owner a
    /// [`PinnedMemoryPointer`] keeps for its clones, offsets and copies, so a cached
    /// pair costs the pool's own work alone. For callers that hand out raw addresses.
    ///
    /// ```no_run
    /// let pool = cuda_rt::pinned::default_pinned_memory_pool();
    /// let block = pool.malloc_block(1000)?;
    /// assert_eq!(block.len(), 1024); // rounded up to 512 bytes
    /// let again = block.ptr();
    /// drop(block);
    /// // The block this thread gave back is the next one of its size.
    /// assert_eq!(pool.malloc_block(1000)?.ptr(), again);
    /// # Ok::<(), cuda_rt::Error>(())
    /// ```
    #[inline]
    pub fn malloc_block(&'static self, size: usize) -> Result<PinnedBlock> {
        match self.core().malloc(size) {
            Ok(block) => Ok(PinnedBlock::new(self.core(), block)),
            Err(e) => Err(self.malloc_error(e)),
        }
    }

    #[cold]
    fn malloc_error(&self, e: MallocError) -> Error {
        pool_malloc_error(e, None, "pinned memory pool")
    }

    /// Gives `ptr` back (CuPy's `free`): the same as dropping it. The block returns
    /// to the pool when its last handle (clones and offsets included) is gone.
    pub fn free(&self, ptr: PinnedMemoryPointer) {
        drop(ptr);
    }

    /// Gives every cached block that is a whole `cuMemHostAlloc` allocation back to
    /// the driver, after waiting for copies in flight on deferred blocks.
    pub fn free_all_blocks(&self) {
        self.core().free_all_blocks();
    }

    /// Every segment and block of the pool now (`device` is `None`: host memory); see
    /// [`PoolSnapshot::to_json`](crate::memory::arena::PoolSnapshot::to_json).
    pub fn snapshot(&self) -> crate::memory::arena::PoolSnapshot {
        self.core().pool().snapshot()
    }

    /// Free (cached) chunks, CuPy's `n_free_blocks`.
    pub fn n_free_blocks(&self) -> u64 {
        self.core().pool().n_free_blocks()
    }

    /// Bytes handed out (rounded sizes; deferred blocks count until taken back).
    pub fn used_bytes(&self) -> u64 {
        self.core().pool().used_bytes()
    }

    /// Bytes of pinned memory the pool holds from the driver.
    pub fn total_bytes(&self) -> u64 {
        self.core().pool().total_bytes()
    }

    /// Cached bytes: `total_bytes - used_bytes`.
    pub fn free_bytes(&self) -> u64 {
        self.core().pool().free_bytes()
    }

    /// Blocks freed while a copy still used them, not yet back in the cache.
    pub fn n_deferred_blocks(&self) -> usize {
        self.core().n_deferred()
    }

    /// All statistics (hits, misses, peaks, driver calls...).
    pub fn stats(&self) -> PoolStats {
        self.core().pool().stats()
    }

    /// Limits the bytes held from the driver (0: no limit).
    pub fn set_limit(&self, bytes: u64) {
        self.core().pool().set_limit(bytes);
    }

    /// The limit on bytes held from the driver (0: none).
    pub fn limit(&self) -> u64 {
        self.core().pool().limit()
    }

    /// Whether `self` and `other` are the same pool.
    pub fn same_pool(&self, other: &PinnedMemoryPool) -> bool {
        Arc::ptr_eq(self.core(), other.core())
    }
}
