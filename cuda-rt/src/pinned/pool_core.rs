//! What the pinned pool and the pinned pointers share: the `cuMemHostAlloc` flags
//! ([`PinnedFlags`]), the pool's backend over `cuMemHostAlloc` / `cuMemFreeHost`, and
//! the pool's core (the caching algorithm of `memory::arena` plus the deferred list
//! of blocks freed while a copy still uses them; see [`pool`](super::pool) for the
//! waste bound and the in-flight protection).
//!
//! A pooled [`PinnedMemoryPointer`](super::PinnedMemoryPointer) (`memory.rs`) gives its
//! block back to a core, and the pool front ([`PinnedMemoryPool`](super::PinnedMemoryPool),
//! `pool.rs`) hands out pointers: the core sits below both.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::allocator::PinnedAllocator;
use super::fence::{Fence, Pending};
use crate::device::context;
use crate::error::Error;
use crate::memory::arena::parked::{self, HomeRef};
use crate::memory::arena::{Backend, BackendError, Block, MallocError, Pool, RawBlock};

bitflags::bitflags! {
    /// `cuMemHostAlloc` flags. The default is [`PORTABLE`](Self::PORTABLE) alone.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    pub struct PinnedFlags: u32 {
        /// Pinned for every CUDA context, not only the current one (the default).
        const PORTABLE = cuda_sys::driver::CU_MEMHOSTALLOC_PORTABLE;
        /// Mapped into the device's address space
        /// ([`PinnedMemory::device_ptr`] gives the device address).
        const DEVICEMAP = cuda_sys::driver::CU_MEMHOSTALLOC_DEVICEMAP;
        /// Write-combined: faster for the device to read and for the host to write,
        /// very slow for the host to read.
        const WRITECOMBINED = cuda_sys::driver::CU_MEMHOSTALLOC_WRITECOMBINED;
    }
}

impl Default for PinnedFlags {
    fn default() -> Self {
        PinnedFlags::PORTABLE
    }
}

/// A pinned pool's [`PinnedAllocator`] as a pool [`Backend`]: `cuMemHostAlloc` /
/// `cuMemFreeHost` in the current device's context (portable memory is usable from
/// every context anyway), or the user's function pair.
#[derive(Debug)]
pub(crate) struct PinnedBackend {
    /// What every allocation of the pool is made with.
    pub(super) source: PinnedAllocator,
}

impl Backend for PinnedBackend {
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        let r = match &self.source {
            PinnedAllocator::HostAlloc(flags) => {
                context::make_current(crate::device::get_device_id())
                    .and_then(|()| super::host_alloc(size, flags.bits()))
            }
            PinnedAllocator::Functions(f) => match f.malloc(size) {
                Ok(a) => Ok(a),
                // A null or out of memory: the pool releases its cache and retries.
                Err(Error::InvalidState { .. } | Error::OutOfMemory(_)) => {
                    return Err(BackendError::OutOfMemory(None))
                }
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(a) => Ok(a),
            Err(Error::Driver(d)) if d.code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(BackendError::OutOfMemory(Some(d)))
            }
            Err(e) => Err(BackendError::Other(Box::new(e))),
        }
    }

    fn free(&self, addr: u64, size: usize) {
        match &self.source {
            PinnedAllocator::HostAlloc(_) => {
                // Nothing to do about a failure at this point (a context torn down at
                // exit).
                // SAFETY: the pool frees only what `alloc` gave it (cuMemHostAlloc), once,
                // and only once no block of it is handed out and the fences of the copies
                // that used it are done (its deferred list).
                let _ =
                    unsafe { result::memory::free_host(addr as usize as *mut std::ffi::c_void) };
            }
            // As above: once, after the copies that used it.
            PinnedAllocator::Functions(f) => f.free(addr, size),
        }
    }
}

/// The pool algorithm plus the deferred list; generic so the CPU tests drive it with
/// a host backend and fake fences.
pub(crate) struct Core<B: Backend, P: Pending> {
    pool: Pool<B>,
    deferred: Mutex<Vec<(Block, P)>>,
    n_deferred: AtomicUsize,
}

impl<B: Backend, P: Pending> Core<B, P> {
    pub(crate) fn new(backend: B) -> Self {
        Core {
            pool: Pool::new(backend),
            deferred: Mutex::new(Vec::new()),
            n_deferred: AtomicUsize::new(0),
        }
    }

    pub(crate) fn pool(&self) -> &Pool<B> {
        &self.pool
    }

    /// Allocates from the cache (after taking back completed deferred blocks); on out
    /// of memory with blocks still deferred, waits for them and retries once.
    #[inline]
    pub(crate) fn malloc(&self, size: usize) -> std::result::Result<Block, MallocError> {
        if self.n_deferred.load(Ordering::Acquire) != 0 {
            self.reclaim(false);
        }
        match self.pool_malloc(size) {
            Err(MallocError::OutOfMemory(_)) if self.n_deferred.load(Ordering::Acquire) != 0 => {
                self.reclaim(true);
                self.pool_malloc(size)
            }
            r => r,
        }
    }

    /// The identity of this pool among a thread's parking slots.
    #[inline]
    fn home_id(&self) -> usize {
        self as *const Self as usize
    }

    /// A malloc that first takes back the block this thread parked, if any.
    #[inline]
    fn pool_malloc(&self, size: usize) -> std::result::Result<Block, MallocError> {
        let slot = parked::slot(self.home_id());
        // The cached pair: the block this thread parked, when it is exactly what
        // this malloc gets back.
        if let Some(b) = slot.and_then(|p| self.pool.malloc_reparked(size, 0, p)) {
            return Ok(b);
        }
        self.pool.malloc_parked(size, 0, slot)
    }

    /// Gives `block` back: to the cache at once, or to the deferred list while
    /// `pending` has not finished.
    #[inline]
    pub(crate) fn free(&self, block: Block, pending: Option<P>) {
        match pending {
            Some(p) if !p.is_done() => {
                self.deferred
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push((block, p));
                self.n_deferred.fetch_add(1, Ordering::AcqRel);
            }
            // Blocks reach here only from this core's pool, so free cannot refuse them.
            _ => {
                let _ = self.pool.free(block);
            }
        }
    }

    /// Takes back the deferred blocks whose work has finished (all of them, waiting,
    /// with `wait`). Fences are waited on with no lock held. A block whose query or
    /// wait fails is not known to be done: it stays deferred for a later look.
    #[cold]
    pub(crate) fn reclaim(&self, wait: bool) {
        let taken: Vec<(Block, P)> = {
            let mut d = self.deferred.lock().unwrap_or_else(PoisonError::into_inner);
            if wait {
                std::mem::take(&mut *d)
            } else {
                let mut done = Vec::new();
                let mut i = 0;
                while i < d.len() {
                    if d[i].1.is_done() {
                        done.push(d.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
                done
            }
        };
        self.n_deferred.fetch_sub(taken.len(), Ordering::AcqRel);
        let mut kept = Vec::new();
        for (block, p) in taken {
            if wait && !p.wait() {
                kept.push((block, p));
                continue;
            }
            // Deferred blocks came from this pool: free cannot refuse them.
            let _ = self.pool.free(block);
        }
        if !kept.is_empty() {
            let n = kept.len();
            self.deferred
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .extend(kept);
            self.n_deferred.fetch_add(n, Ordering::AcqRel);
        }
    }

    /// Blocks freed while their copy ran and not taken back yet.
    pub(crate) fn n_deferred(&self) -> usize {
        self.n_deferred.load(Ordering::Acquire)
    }

    /// Waits for the deferred blocks, then gives every whole cached allocation back.
    pub(crate) fn free_all_blocks(&self) {
        self.reclaim(true);
        self.pool.free_all_blocks(None);
    }

    /// Gives back the block `raw` came from (a block of this pool, once) the way
    /// [`free`](Self::free) does, except that a block with no copy in flight waits in
    /// the calling thread's parking slot (see `arena::parked`) until the thread's next
    /// malloc. Returns [`after_free`](Self::after_free)'s answer.
    #[inline]
    pub(crate) fn free_parking(self: &Arc<Self>, raw: RawBlock, pending: Option<P>) -> bool
    where
        Self: parked::Home + 'static,
    {
        match pending {
            Some(p) if !p.is_done() => self.free(self.pool.block_from_raw(raw), Some(p)),
            // Parked even in an orphaned pool: `after_free` then settles and releases.
            _ => self.pool.park_or_free(raw, self.home_id(), || {
                let h: Arc<dyn parked::Home> = self.clone();
                HomeRef::Shared(h)
            }),
        }
        self.after_free()
    }

    /// The pool's last user handle went. Recycled handles of this thread and others
    /// may still hold the core (they keep it to refill without touching a shared
    /// count), so dropping it is not what returns the memory: everything cached goes
    /// back to the driver now (after the copies in flight), and
    /// [`after_free`](Self::after_free) does the same for each block freed later.
    pub(crate) fn orphan(&self) {
        self.pool.close();
        self.free_all_blocks();
    }

    /// Called after a block went back: for an orphaned pool, gives the cache to the
    /// driver; `true` when the pool is orphaned (a recycled handle must not be kept).
    #[inline]
    pub(crate) fn after_free(&self) -> bool {
        if !self.pool.is_closed() {
            return false;
        }
        self.free_all_blocks();
        true
    }
}

impl<B: Backend + 'static, P: Pending + 'static> parked::Home for Core<B, P> {
    fn forget(&self, p: &'static parked::Parked) {
        self.pool.forget_parked(p);
    }

    fn closed(&self) -> bool {
        self.pool.is_closed()
    }
}

impl<B: Backend, P: Pending> Drop for Core<B, P> {
    fn drop(&mut self) {
        // The arena pool's own drop (after this) gives whole free allocations back:
        // first make sure no copy still uses any of them.
        self.reclaim(true);
        // Blocks whose fences did not answer may still be under a copy: they stay
        // out of the cache (their allocations are never whole, so never freed), and
        // their fences are forgotten, not dropped, so the device memory a fence keeps
        // alive for its copy is never given back either. A leak, never a reuse.
        let left = std::mem::take(
            self.deferred
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        for (_block, p) in left {
            std::mem::forget(p);
        }
    }
}

pub(crate) type PinnedCore = Core<PinnedBackend, Fence>;

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::memory::arena::HostBackend;
    use crate::memory::arena::ALLOCATION_UNIT;

    /// A fake fence: done when its first flag is set; while its second is set every
    /// query and wait fails (as during another thread's global-mode capture).
    #[derive(Clone, Default)]
    struct FakeFence(Arc<AtomicBool>, Arc<AtomicBool>);

    impl FakeFence {
        fn failing(&self, fail: bool) {
            self.1.store(fail, Ordering::Release);
        }
    }

    impl Pending for FakeFence {
        fn is_done(&self) -> bool {
            !self.1.load(Ordering::Acquire) && self.0.load(Ordering::Acquire)
        }
        fn wait(&self) -> bool {
            if self.1.load(Ordering::Acquire) {
                return false;
            }
            self.0.store(true, Ordering::Release);
            true
        }
    }

    fn core() -> Core<Arc<HostBackend>, FakeFence> {
        Core::new(Arc::new(HostBackend::new()))
    }

    #[test]
    fn an_orphaned_core_gives_cached_and_later_freed_blocks_to_the_backend() {
        let c = core();
        let cached = c.malloc(1000).unwrap();
        let live = c.malloc(1000).unwrap();
        c.free(cached, None);
        assert!(!c.after_free(), "not orphaned yet: the block stays cached");
        assert_eq!(c.pool().total_bytes(), 2048);
        c.orphan();
        assert_eq!(c.pool().total_bytes(), 1024, "the cached block went back");
        c.free(live, None);
        assert!(
            c.after_free(),
            "orphaned: a recycled handle must not be kept"
        );
        assert_eq!(c.pool().total_bytes(), 0);
        assert_eq!(c.pool().stats().backend_frees, 2);
    }

    #[test]
    fn a_parked_block_counts_as_free_and_goes_back_when_the_pool_is_orphaned() {
        let c = Arc::new(core());
        let a = c.malloc(1000).unwrap();
        let addr = a.addr();
        assert!(
            !c.free_parking(a.into_raw(), None),
            "not orphaned: keep the handle"
        );
        let s = c.pool().stats();
        assert_eq!((s.used_bytes, s.n_free_blocks), (0, 1));
        // This thread's next malloc takes its parked block back: the same address.
        let b = c.malloc(1000).unwrap();
        assert_eq!(b.addr(), addr);
        assert!(!c.free_parking(b.into_raw(), None));
        let live = c.malloc(4096).unwrap();
        c.orphan();
        assert_eq!(
            c.pool().total_bytes(),
            4096,
            "the parked block went back to the host"
        );
        assert!(
            c.free_parking(live.into_raw(), None),
            "orphaned: drop the handle"
        );
        assert_eq!(c.pool().total_bytes(), 0);
    }

    #[test]
    fn freed_block_is_reused_for_the_same_size() {
        let c = core();
        let a = c.malloc(1000).unwrap();
        let addr = a.addr();
        c.free(a, None);
        let b = c.malloc(1000).unwrap();
        assert_eq!(b.addr(), addr);
        assert_eq!(c.pool().stats().backend_allocs, 1);
        c.free(b, None);
    }

    #[test]
    fn block_freed_with_pending_copy_is_not_handed_out_until_it_completes() {
        let c = core();
        let a = c.malloc(4096).unwrap();
        let addr = a.addr();
        let fence = FakeFence::default();
        c.free(a, Some(fence.clone()));
        assert_eq!(c.n_deferred(), 1);
        let b = c.malloc(4096).unwrap();
        assert_ne!(b.addr(), addr, "a block in flight was handed out");
        fence.0.store(true, Ordering::Release);
        let d = c.malloc(4096).unwrap();
        assert_eq!(d.addr(), addr, "the completed block is reused");
        assert_eq!(c.n_deferred(), 0);
        c.free(b, None);
        c.free(d, None);
        c.pool().check().unwrap();
    }

    #[test]
    fn block_freed_with_completed_copy_goes_straight_to_the_cache() {
        let c = core();
        let a = c.malloc(512).unwrap();
        let fence = FakeFence::default();
        fence.0.store(true, Ordering::Release);
        c.free(a, Some(fence));
        assert_eq!(c.n_deferred(), 0);
        assert_eq!(c.pool().n_free_blocks(), 1);
    }

    #[test]
    fn free_all_blocks_waits_for_deferred_blocks_then_releases() {
        let backend = Arc::new(HostBackend::new());
        let c: Core<_, FakeFence> = Core::new(backend.clone());
        let a = c.malloc(8192).unwrap();
        let fence = FakeFence::default();
        c.free(a, Some(fence.clone()));
        c.free_all_blocks();
        assert!(fence.is_done(), "the fence was waited on");
        assert_eq!(c.n_deferred(), 0);
        assert_eq!(backend.counters().live_bytes, 0);
    }

    #[test]
    fn out_of_memory_waits_for_deferred_blocks_and_retries() {
        let backend = Arc::new(HostBackend::with_capacity(4096));
        let c: Core<_, FakeFence> = Core::new(backend.clone());
        let a = c.malloc(4096).unwrap();
        let fence = FakeFence::default();
        c.free(a, Some(fence.clone()));
        let b = c.malloc(4096).unwrap();
        assert!(fence.is_done());
        c.free(b, None);
    }

    #[test]
    fn dropping_the_core_waits_for_deferred_blocks() {
        let backend = Arc::new(HostBackend::new());
        let fence = FakeFence::default();
        {
            let c: Core<_, FakeFence> = Core::new(backend.clone());
            let a = c.malloc(1 << 20).unwrap();
            c.free(a, Some(fence.clone()));
        }
        assert!(fence.is_done());
        assert_eq!(backend.counters().live_bytes, 0);
    }

    #[test]
    fn a_block_whose_fence_cannot_be_queried_is_not_handed_out() {
        let c = core();
        let a = c.malloc(4096).unwrap();
        let addr = a.addr();
        let fence = FakeFence::default();
        fence.failing(true);
        // Freed while the query fails: deferred, not cached.
        c.free(a, Some(fence.clone()));
        assert_eq!(c.n_deferred(), 1);
        // The copy finished, but no query can say so: still deferred at every poll.
        fence.0.store(true, Ordering::Release);
        let mut held = Vec::new();
        for _ in 0..3 {
            let b = c.malloc(4096).unwrap();
            assert_ne!(b.addr(), addr, "a block under a copy was handed out");
            held.push(b);
        }
        assert_eq!(c.n_deferred(), 1);
        // The capture ended: the next poll takes it back.
        fence.failing(false);
        let d = c.malloc(4096).unwrap();
        assert_eq!(d.addr(), addr);
        assert_eq!(c.n_deferred(), 0);
        for b in held.into_iter().chain([d]) {
            c.free(b, None);
        }
        c.pool().check().unwrap();
    }

    #[test]
    fn a_failed_wait_keeps_the_block_through_out_of_memory_and_free_all_blocks() {
        let backend = Arc::new(HostBackend::with_capacity(4096));
        let c: Core<_, FakeFence> = Core::new(backend.clone());
        let a = c.malloc(4096).unwrap();
        let addr = a.addr();
        let fence = FakeFence::default();
        c.free(a, Some(fence.clone()));
        fence.failing(true);
        // Out of memory waits for the deferred block; the wait fails, so the block
        // stays deferred and the malloc is out of memory.
        assert!(matches!(c.malloc(4096), Err(MallocError::OutOfMemory(_))));
        assert_eq!(c.n_deferred(), 1);
        c.free_all_blocks();
        assert_eq!(c.n_deferred(), 1);
        assert_eq!(backend.counters().live_bytes, 4096, "not given back");
        // Waits succeed again: the out-of-memory path takes it back and retries.
        fence.failing(false);
        let b = c.malloc(4096).unwrap();
        assert_eq!(b.addr(), addr);
        assert!(fence.is_done());
        assert_eq!(c.n_deferred(), 0);
        c.free(b, None);
    }

    #[test]
    // The forgotten fence is a leak by design, which Miri's leak check would report.
    #[cfg_attr(miri, ignore)]
    fn dropping_the_core_leaks_a_block_whose_fence_never_answers() {
        let backend = Arc::new(HostBackend::new());
        let fence = FakeFence::default();
        {
            let c: Core<_, FakeFence> = Core::new(backend.clone());
            let a = c.malloc(1 << 20).unwrap();
            let b = c.malloc(512).unwrap();
            fence.failing(true);
            c.free(a, Some(fence.clone()));
            c.free(b, None);
        }
        // The block under the copy is never freed; the other allocation is. The
        // fence was forgotten (what it keeps alive stays alive): two references.
        assert_eq!(backend.counters().live_bytes, 1 << 20);
        assert_eq!(backend.counters().bad_frees, 0);
        assert_eq!(Arc::strong_count(&fence.0), 2);
    }

    #[test]
    fn waste_is_at_most_511_bytes_per_request() {
        // A fake backend: 10 GiB of address ranges without memory.
        let backend = Arc::new(crate::memory::arena::FakeBackend::checked());
        let c: Core<_, FakeFence> = Core::new(backend.clone());
        for &n in &[1usize, 511, 513, (1 << 20) + 1, (10usize << 30) + 3] {
            let before = c.pool().total_bytes();
            let b = c.malloc(n).unwrap();
            let grown = c.pool().total_bytes() - before;
            assert!(b.size() >= n && b.size() - n < ALLOCATION_UNIT, "{n}");
            // A miss grows the pool by the rounded size exactly; a hit by nothing.
            assert!(
                grown == 0 || grown as usize == b.size(),
                "{n}: pool grew {grown}"
            );
            c.free(b, None);
        }
        // 10 GiB takes 10 GiB (+ rounding), not 16 GiB as with power-of-two rounding.
        let ten = 10usize << 30;
        let b = c.malloc(ten).unwrap();
        assert!(c.pool().total_bytes() < (ten as u64) * 2);
        c.free(b, None);
        // A smaller request from a cached large block splits it: the rest stays free.
        c.free_all_blocks();
        let big = c.malloc(64 << 20).unwrap();
        c.free(big, None);
        let small = c.malloc((3 << 20) + 7).unwrap();
        assert_eq!(small.size(), (3 << 20) + 512);
        assert_eq!(c.pool().used_bytes(), (3 << 20) + 512);
        assert_eq!(c.pool().free_bytes(), (64 << 20) - (3 << 20) - 512);
        c.free(small, None);
    }
}
