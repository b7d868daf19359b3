//! Where pinned memory comes from: `cuMemHostAlloc` with flags (the default) or a
//! user's function pair ([`PinnedFunctions`]), for a pool ([`PinnedAllocator`]) and
//! for [`alloc_pinned_memory`](super::alloc_pinned_memory)
//! ([`PinnedMemoryAllocator`], what [`set_pinned_memory_allocator`](super::set_pinned_memory_allocator)
//! takes).

use std::fmt;
use std::sync::Arc;

use super::pool::PinnedMemoryPool;
use super::pool_core::PinnedFlags;
use crate::error::{Error, Result, StateKind};

/// A user's pinned allocation function: `malloc(size)` returns a host address.
pub type PinnedMallocFn = dyn Fn(usize) -> Result<u64> + Send + Sync;
/// The matching free function: `free(ptr, size)`.
pub type PinnedFreeFn = dyn Fn(u64, usize) + Send + Sync;

/// A pair of functions that allocate and free page-locked host memory (CuPy's
/// pinned allocator functions): for a [`PinnedMemoryPool`] to cache
/// ([`PinnedAllocator::Functions`]), or for [`alloc_pinned_memory`] to call each
/// time ([`PinnedMemoryAllocator::Functions`]). Cheap to clone.
///
/// [`alloc_pinned_memory`]: super::alloc_pinned_memory
#[derive(Clone)]
pub struct PinnedFunctions {
    malloc: Arc<PinnedMallocFn>,
    free: Arc<PinnedFreeFn>,
}

impl fmt::Debug for PinnedFunctions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PinnedFunctions")
    }
}

impl PinnedFunctions {
    /// The pair `malloc` / `free`. Both may be called from any thread; `malloc` runs
    /// with the current device's context current where there is one.
    ///
    /// # Safety
    /// A successful non-zero `malloc(size)` must be the address of at least `size`
    /// bytes of host memory that is page-locked for CUDA (`cuMemHostAlloc`, or
    /// registered with `cuMemHostRegister`), that nothing else reads or writes, and
    /// that stays valid until `free(ptr, size)` is called with it (once).
    pub unsafe fn new(
        malloc: impl Fn(usize) -> Result<u64> + Send + Sync + 'static,
        free: impl Fn(u64, usize) + Send + Sync + 'static,
    ) -> Self {
        PinnedFunctions {
            malloc: Arc::new(malloc),
            free: Arc::new(free),
        }
    }

    /// `size` bytes from the user's `malloc`; 0 is an error.
    pub(crate) fn malloc(&self, size: usize) -> Result<u64> {
        // Make the current device's context current for the user, as for cuMemHostAlloc;
        // a function that needs none runs without a driver all the same.
        let _ = crate::device::context::make_current(crate::device::get_device_id());
        match (self.malloc)(size)? {
            0 => Err(Error::invalid_state(
                StateKind::AllocatorFailed,
                format!("the pinned allocator functions returned a null pointer for {size} bytes"),
            )),
            p => Ok(p),
        }
    }

    /// Gives `ptr` (of `size` bytes, from [`malloc`](Self::malloc)) back, once.
    pub(crate) fn free(&self, ptr: u64, size: usize) {
        (self.free)(ptr, size)
    }
}

/// The memory a [`PinnedMemoryPool`] caches.
#[derive(Clone, Debug)]
pub enum PinnedAllocator {
    /// `cuMemHostAlloc` with these flags / `cuMemFreeHost` (the default: portable).
    HostAlloc(PinnedFlags),
    /// A user's function pair. The pool frees a block's memory only once the copies
    /// in flight on it have finished.
    Functions(PinnedFunctions),
}

impl Default for PinnedAllocator {
    fn default() -> Self {
        PinnedAllocator::HostAlloc(PinnedFlags::PORTABLE)
    }
}

/// What [`alloc_pinned_memory`](super::alloc_pinned_memory) allocates with (CuPy's
/// `set_pinned_memory_allocator` argument). `set_pinned_memory_allocator` takes
/// anything that converts: a pool, `Some(pool)`, `None` (no pooling), or a
/// [`PinnedFunctions`] pair.
#[derive(Clone, Debug)]
pub enum PinnedMemoryAllocator {
    /// Blocks of a pool.
    Pool(PinnedMemoryPool),
    /// One `cuMemHostAlloc` per call, freed with its last handle (no pooling).
    Unpooled,
    /// One call of the user's `malloc` per allocation, its `free` with the last
    /// handle (after the copies in flight on it).
    Functions(PinnedFunctions),
}

impl From<PinnedMemoryPool> for PinnedMemoryAllocator {
    fn from(p: PinnedMemoryPool) -> Self {
        PinnedMemoryAllocator::Pool(p)
    }
}

impl From<Option<PinnedMemoryPool>> for PinnedMemoryAllocator {
    /// `Some(pool)`: the pool; `None`: no pooling (CuPy's `None`).
    fn from(p: Option<PinnedMemoryPool>) -> Self {
        p.map_or(PinnedMemoryAllocator::Unpooled, PinnedMemoryAllocator::Pool)
    }
}

impl From<PinnedFunctions> for PinnedMemoryAllocator {
    fn from(f: PinnedFunctions) -> Self {
        PinnedMemoryAllocator::Functions(f)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Mutex;

    use super::super::pool_core::PinnedBackend;
    use super::*;
    use crate::memory::arena::Pool;

    /// A pair handing out address ranges (never dereferenced here), logging calls.
    fn logging_pair(log: Arc<Mutex<Vec<String>>>) -> PinnedFunctions {
        let next = AtomicU64::new(1 << 40);
        let log2 = log.clone();
        let malloc = move |size: usize| {
            log.lock().unwrap().push(format!("malloc({size})"));
            Ok(next.fetch_add(size as u64, Ordering::Relaxed))
        };
        let free = move |ptr: u64, size: usize| {
            log2.lock().unwrap().push(format!("free({ptr:#x},{size})"));
        };
        // SAFETY: the pool only keeps and compares the addresses (no copy, no view).
        unsafe { PinnedFunctions::new(malloc, free) }
    }

    #[test]
    fn a_pinned_pool_over_a_user_pair_calls_it_on_misses_and_releases_only() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let pool = Pool::new(PinnedBackend {
            source: PinnedAllocator::Functions(logging_pair(log.clone())),
        });
        let a = pool.malloc(3000, 0).unwrap();
        let addr = a.addr();
        pool.free(a).unwrap();
        let b = pool.malloc(2000, 0).unwrap();
        assert_eq!(b.addr(), addr);
        pool.free(b).unwrap();
        assert_eq!(*log.lock().unwrap(), ["malloc(3072)"]);
        pool.free_all_blocks(None);
        assert_eq!(
            *log.lock().unwrap(),
            ["malloc(3072)".to_string(), format!("free({addr:#x},3072)")]
        );
    }

    #[test]
    fn a_null_from_the_pair_is_an_error_naming_the_size() {
        // SAFETY: nothing is ever allocated.
        let f = unsafe { PinnedFunctions::new(|_| Ok(0), |_, _| {}) };
        let e = f.malloc(4096).unwrap_err();
        assert!(e.to_string().contains("null pointer for 4096 bytes"), "{e}");
    }

    #[test]
    fn options_pools_and_pairs_convert_to_an_allocator_choice() {
        assert!(matches!(
            PinnedMemoryAllocator::from(None),
            PinnedMemoryAllocator::Unpooled
        ));
        // SAFETY: nothing is ever allocated.
        let f = unsafe { PinnedFunctions::new(|_| Ok(0), |_, _| {}) };
        assert!(matches!(
            PinnedMemoryAllocator::from(f),
            PinnedMemoryAllocator::Functions(_)
        ));
        assert!(matches!(
            PinnedAllocator::default(),
            PinnedAllocator::HostAlloc(fl) if fl == PinnedFlags::PORTABLE
        ));
    }
}
