//! The caching device memory pool's algorithm (CuPy's `MemoryPool`), with no CUDA in
//! it: a [`Pool`] asks a [`Backend`] for memory, so the same code runs over
//! `cuMemAlloc` (the `memory::pool` front), over page-locked host memory, and over
//! [`HostBackend`] / [`FakeBackend`] in tests, benches and Miri.
//!
//! # Semantics (CuPy's)
//! - Sizes round up to a multiple of [`ALLOCATION_UNIT`] (512) bytes; `malloc(0)`
//!   returns a null [`Block`] of size 0 that is not pooled (its `free` does nothing).
//! - Free chunks live in *arenas* keyed by an opaque `u64` stream key chosen by the
//!   caller (the front gives the per-thread default stream one key per thread). A
//!   chunk always goes back to the arena it came from, whatever key is current when
//!   it is freed; arenas never share memory (a backend allocation belongs to the
//!   arena whose miss made it, and so do all pieces split from it).
//! - Best fit: the smallest free chunk that is large enough, ties by lowest address;
//!   a larger chunk is split, the caller gets the lower part, the rest stays free.
//! - Free merges a chunk with free neighbours of the same backend allocation (either
//!   side), then files it in its arena.
//! - [`Pool::free_all_blocks`] gives the backend every free chunk that is a whole
//!   backend allocation; with a key, only that arena's.
//! - Limit ([`Pool::set_limit`], 0 = none): a miss that would take the reserved bytes
//!   past the limit, or that the backend refuses as out of memory, releases all
//!   cached whole chunks (every arena) and retries once; then it fails with
//!   [`OutOfMemory`], which carries requested, in-use, cached and limit bytes.
//!
//! # Data structure, and why
//! Each arena is a lock (a spin lock, see `ArenaLock`) around a slab of chunk records (`Vec` + free list of
//! indices, so a hit never touches the heap) and a best-fit index:
//! - *Size classes*: exact for sizes under 32 units (16 KiB), then 32 classes per power
//!   of two (TLSF-style, 2048 classes cover every `u64` size). A two-level bitmap
//!   (32 words + 1 summary word) finds the first non-empty class at or above the
//!   request in a few instructions, whatever the number of chunks.
//! - *Inside a class*, an intrusive treap keyed by `(size, addr)` (links live in the
//!   slab records; priority = hash of the address, so no RNG state). The request's own
//!   class is searched with a lower bound; any higher class gives its leftmost node.
//!   Insert and remove are iterative (one descent, then one split or merge; no
//!   recursion, no rotations).
//!   This is exact best fit with ties by address, `O(log k)` in the chunks `k` of one
//!   class (small: classes are narrow), and never allocates — a `BTreeSet` would
//!   allocate and free nodes as it grows and shrinks, and CuPy-style exact bins by
//!   `size / 512` need an index as large as the largest size.
//! - Neighbour links (`prev`/`next` within a backend allocation) make split and merge
//!   `O(1)` plus the treap updates.
//!
//! # Concurrency
//! - No global lock on the hit path: malloc and free lock only their arena. Arenas
//!   live in an append-only table owned by the pool (segments of 64 (inline), 128,
//!   256... slots, each a [`OnceLock`](std::sync::OnceLock)), never removed while the
//!   pool lives, so an arena's `u32` index leads to it through one lock-free load
//!   (two past the 64th arena). Each thread keeps a 4-entry cache of
//!   `(pool id, key) -> index` (pool ids are never reused), so the key map behind an
//!   [`RwLock`](std::sync::RwLock) is read only on the first use of a key by a
//!   thread, and written only when a key is seen for the first time.
//! - A [`Block`] carries its pool's id and its arena's index, so free needs no
//!   lookup, and a block given to the wrong pool is recognised and refused.
//! - No `unsafe` anywhere in the module: blocks and caches hold integers, not
//!   pointers.
//! - Counters (used, peak used, hits, misses, ...) are plain integers under each
//!   arena's lock, in a 128-byte-aligned arena: no shared cache line between threads
//!   on different keys. [`Pool::stats`] sums them arena by arena.
//! - Reserved bytes (checked against the limit), backend call counts and OOM retries
//!   are atomics touched only on misses and releases, which call the backend anyway.
//! - The backend is never called with an arena lock held.
//! - *Parked frees* (crate-internal, used by the default device pools and the pinned
//!   pools; see `parked`): a thread's last freed block may wait in a per-thread slot
//!   and enter its arena under the lock of the thread's next malloc, which then takes
//!   one lock per cached pair instead of two, or none while the arena has not changed
//!   since the thread last checked that its parked block is exactly what it gets
//!   back (where the process barrier exists). Every observer ([`Pool::stats`],
//!   [`Pool::free_all_blocks`], [`Pool::check`], a malloc about to grow, the drop)
//!   settles all slots first, so figures, limits and growth are as without parking,
//!   and one thread alone sees exactly the unparked algorithm.
//!
//! # Peaks
//! `peak_total_bytes` (reserved) is exact: one atomic, updated on each growth.
//! `peak_used_bytes` is exact within one arena; across arenas it is the sum of each
//! arena's own peak, capped by the reserved peak — an upper bound that equals the
//! true peak when one key is in use (an exact cross-arena peak would need a shared
//! counter on every hit, which is what kills multi-thread scaling).
//!
//! # Growth policy
//! By default a miss asks the backend for exactly the rounded size and keeps every
//! cached chunk (CuPy). Measured on the traces of `benches/arena_traces.rs` this
//! already keeps trace B's peak reserved / peak live at 1.04 (target 1.20); trace A
//! (at most 512 live blocks) gives 1.37. [`Pool::set_release_on_miss`] adds a policy
//! that trades backend calls for memory: before growing, a miss gives back the
//! arena's whole free allocations *smaller than the request* (none could serve it)
//! when the arena's cached bytes exceed an eighth of its reserved bytes, so memory is
//! reused through the backend instead of stranded (trace A: 1.24, with 138 backend
//! frees instead of 0). It is off by default because on a GPU `cuMemFree`
//! synchronizes the device, a cost a malloc should not hide.
//!
//! # Ownership and drop
//! A [`Block`] is a plain token of integers (no reference count: an `Arc` per block
//! would put a shared atomic on every hit): give it back with [`Pool::free`]. A block
//! of another pool is refused with a [`FreeError`] that hands it back; a block cannot
//! be copied, so it cannot be freed twice. The front keeps the pool alive while its
//! memory pointers live (its pointer type holds an `Arc` of the pool). Dropping the
//! pool gives the backend every free whole allocation; an allocation that still has
//! chunks handed out (a leaked or forgotten `Block`) is leaked on purpose, never
//! freed under a user.

// The pool algorithm is pure Rust: no `unsafe` here or in the submodules.
#![forbid(unsafe_code)]

mod backend;
mod bins;
mod limit;
pub(crate) mod parked;
mod table;

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

pub use backend::{Backend, BackendCounters, BackendError, FakeBackend, HostBackend};
pub use limit::{format_bytes, limit_from_fraction, parse_limit};

use bins::{Bins, SlabFull};
use parked::Parked;
use table::Table;
mod error;
use error::TOO_MANY_CHUNKS;
pub use error::{FreeError, MallocError, OutOfMemory};
mod block;
pub use block::Block;
pub(crate) use block::{AtomicBlock, RawBlock};
mod arena_lookup;
mod stream_arena;
use stream_arena::Arena;
mod growth;
mod parking;
mod stats;
pub use stats::PoolStats;

use crate::driver::barrier;

/// Every size is rounded up to a multiple of this many bytes (CuPy's 512).
pub const ALLOCATION_UNIT: usize = 512;

/// `size` rounded up to a multiple of [`ALLOCATION_UNIT`], or `None` on overflow.
#[inline]
pub fn round_size(size: usize) -> Option<usize> {
    Some(size.checked_add(ALLOCATION_UNIT - 1)? & !(ALLOCATION_UNIT - 1))
}

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// The caching pool: CuPy's `MemoryPool` algorithm over a [`Backend`]. `Send + Sync`;
/// share it with an `Arc`. See the module doc for semantics and design.
pub struct Pool<B: Backend> {
    id: u64,
    backend: B,
    arenas: Table<Arena>,
    /// Reserved bytes including in-flight growths (what the limit is checked against).
    reserved: AtomicU64,
    peak_reserved: AtomicU64,
    limit: AtomicU64,
    backend_allocs: AtomicU64,
    backend_frees: AtomicU64,
    oom_retries: AtomicU64,
    release_on_miss: AtomicBool,
    /// The slots of the threads that park blocks of this pool (see [`parked`]).
    parked: Mutex<Vec<&'static Parked>>,
    /// Set by [`close`](Self::close): the pool's owner is gone.
    closed: AtomicBool,
    /// Lock-free cached pairs of threads whose slots left the pool.
    retired_pairs: AtomicU64,
}

impl<B: Backend> fmt::Debug for Pool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("id", &self.id)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<B: Backend> Pool<B> {
    /// An empty pool over `backend`, with no limit.
    pub fn new(backend: B) -> Self {
        // Registers the process barrier of the lock-free cached pair (once).
        barrier::ready();
        Pool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            arenas: Table::default(),
            reserved: AtomicU64::new(0),
            peak_reserved: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            backend_allocs: AtomicU64::new(0),
            backend_frees: AtomicU64::new(0),
            oom_retries: AtomicU64::new(0),
            release_on_miss: AtomicBool::new(false),
            parked: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            retired_pairs: AtomicU64::new(0),
        }
    }

    /// The block `raw` came from ([`Block::into_raw`] of a block of this pool); give it
    /// back once. A `raw` of another pool, or one already freed, is refused by
    /// [`free`](Self::free) like any stray block.
    #[inline]
    pub(crate) fn block_from_raw(&self, raw: RawBlock) -> Block {
        Block {
            addr: raw.addr,
            size: raw.size,
            key: raw.key,
            pool: if raw.size == 0 { 0 } else { self.id },
            chunk: raw.chunk,
            arena: raw.arena,
        }
    }

    /// The backend.
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// Allocates `size` bytes (rounded up to [`ALLOCATION_UNIT`]) from the arena of
    /// `stream`: best fit from the cache, else new backend memory (see the module doc
    /// for the limit and out-of-memory retries). `size == 0` gives the null block.
    #[inline]
    pub fn malloc(&self, size: usize, stream: u64) -> Result<Block, MallocError> {
        self.malloc_parked(size, stream, None)
    }

    /// [`malloc`](Self::malloc) by a thread whose slot `parked` may hold a block of
    /// this pool: under the arena's lock the parked block (if it is of this arena)
    /// goes back first, so the malloc sees what the unparked algorithm would.
    #[inline]
    pub(crate) fn malloc_parked(
        &self,
        size: usize,
        stream: u64,
        parked: Option<&Parked>,
    ) -> Result<Block, MallocError> {
        if size == 0 {
            return Ok(Block::null(stream));
        }
        let Some(rounded) = round_size(size) else {
            return Err(MallocError::OutOfMemory(self.oom(
                size,
                u64::MAX,
                false,
                self.limit(),
            )));
        };
        let rounded = rounded as u64;
        let arena = self.arena(stream)?;
        {
            let mut bins = arena.lock();
            if let Some(p) = parked {
                if let Some(b) = self.take_back(&mut bins, arena, rounded, p) {
                    return Ok(b);
                }
            }
            if let Some(b) = self.hit(&mut bins, arena, rounded)? {
                return Ok(b);
            }
        }
        self.missed(arena, size, rounded)
    }

    /// A cache hit of `rounded` bytes in `arena` (whose lock `bins` is), if any.
    #[inline]
    fn hit(
        &self,
        bins: &mut Bins,
        arena: &Arena,
        rounded: u64,
    ) -> Result<Option<Block>, MallocError> {
        match bins.malloc_cached(rounded) {
            Ok(Some((chunk, addr))) => Ok(Some(self.block(arena, chunk, addr, rounded))),
            Ok(None) => Ok(None),
            Err(SlabFull) => Err(MallocError::TooMany(TOO_MANY_CHUNKS)),
        }
    }

    /// The cache had no fit: blocks parked by any thread go back first (one may fit),
    /// then the pool grows.
    #[cold]
    fn missed(&self, arena: &Arena, size: usize, rounded: u64) -> Result<Block, MallocError> {
        let settled = self.settle_all();
        let release = {
            let mut bins = arena.lock();
            if settled {
                if let Some(b) = self.hit(&mut bins, arena, rounded)? {
                    return Ok(b);
                }
            }
            bins.counters.misses += 1;
            self.release_on_miss.load(Ordering::Relaxed) && {
                // Cached bytes over an eighth of reserved (reserved >= used under the
                // lock; written without `* 8` so it cannot overflow).
                let k = &bins.counters;
                k.reserved - k.used > k.reserved / 8
            }
        };
        self.grow(arena, size, rounded, release)
    }

    #[inline]
    fn block(&self, arena: &Arena, chunk: u32, addr: u64, size: u64) -> Block {
        Block {
            addr,
            size,
            key: arena.key,
            pool: self.id,
            chunk,
            arena: arena.index,
        }
    }

    /// Gives `block` back to the arena it came from (merging with free neighbours).
    /// The null block is ignored (`Ok`).
    ///
    /// # Errors
    /// [`FreeError::OtherPool`] if `block` came from another pool, and
    /// [`FreeError::NotLive`] if it names no chunk this pool handed out; either way
    /// the pool is unchanged and the error hands the block back.
    #[inline]
    pub fn free(&self, block: Block) -> Result<(), FreeError> {
        if block.size == 0 {
            return Ok(());
        }
        if block.pool != self.id {
            return Err(FreeError::OtherPool(block));
        }
        let Some(arena) = self.arenas.get(block.arena) else {
            return Err(FreeError::NotLive(block));
        };
        match arena.lock().free(block.chunk, block.addr, block.size) {
            Ok(()) => Ok(()),
            Err(bins::NotLive) => Err(FreeError::NotLive(block)),
        }
    }

    /// [`free`](Self::free) of the block `raw` came from, without rebuilding it: for an
    /// owner that knows `raw` is a block of this pool ([`Block::into_raw`]) that it
    /// gives back once. A `raw` that names no live chunk is ignored (`false`).
    #[inline]
    pub(crate) fn free_raw(&self, raw: RawBlock) -> bool {
        if raw.size == 0 {
            return true;
        }
        match self.arenas.get(raw.arena) {
            Some(arena) => arena.lock().free(raw.chunk, raw.addr, raw.size).is_ok(),
            None => false,
        }
    }

    /// Gives the backend every cached chunk that is a whole backend allocation (split
    /// pieces stay): in every arena with `None`, else only in `stream`'s arena.
    pub fn free_all_blocks(&self, stream: Option<u64>) {
        self.settle_all();
        let mut out = Vec::new();
        let mut release = |arena: &Arena| {
            arena.lock().release_whole(&mut out);
            self.give_back(&mut out);
        };
        match stream {
            None => self.arenas.iter().for_each(release),
            Some(k) => {
                if let Some(arena) = self.arenas.find(k).and_then(|i| self.arenas.get(i)) {
                    release(arena);
                }
            }
        }
    }

    fn give_back(&self, out: &mut Vec<(u64, u64)>) {
        for (addr, size) in out.drain(..) {
            self.backend.free(addr, size as usize);
            self.reserved.fetch_sub(size, Ordering::AcqRel);
            self.backend_frees.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sets the limit on reserved bytes (0: none). Lowering it below what is reserved
    /// releases nothing by itself; the next miss does.
    pub fn set_limit(&self, bytes: u64) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// The limit on reserved bytes (0: none).
    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    /// Turns the release-on-miss growth policy (module doc) on, or off (the default,
    /// CuPy's: a miss always grows by exactly the request and releases nothing).
    pub fn set_release_on_miss(&self, on: bool) {
        self.release_on_miss.store(on, Ordering::Relaxed);
    }

    /// The free chunks of `stream`'s arena as `(addr, size)`, sorted by address
    /// (empty if the key was never used). For tests and debugging.
    pub fn free_chunks(&self, stream: u64) -> Vec<(u64, u64)> {
        self.settle_all();
        let arena = self.arenas.find(stream).and_then(|i| self.arenas.get(i));
        let mut v = arena
            .map(|a| a.lock_unchanged().free_chunks())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Checks every internal invariant of every arena (links, merge state, best-fit
    /// index, counters: used + cached chunks == reserved). `O(chunks)`; for tests.
    pub fn check(&self) -> Result<(), String> {
        self.settle_all();
        for arena in self.arenas.iter() {
            arena
                .lock_unchanged()
                .check()
                .map_err(|e| format!("arena of stream key {}: {e}", arena.key))?;
        }
        Ok(())
    }
}

impl<B: Backend> Drop for Pool<B> {
    fn drop(&mut self) {
        self.settle_all();
        let mut out = Vec::new();
        for arena in self.arenas.iter_mut() {
            arena.bins.get_mut().release_whole(&mut out);
        }
        for (addr, size) in out {
            self.backend.free(addr, size as usize);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bins::NIL;
    use super::*;

    /// A copy of `b`'s fields: what only this module can make (a `Block` is not
    /// `Clone` and its fields are private), to reach the `NotLive` checks.
    fn forge(b: &Block) -> Block {
        Block { ..*b }
    }

    #[test]
    fn a_forged_double_free_or_unknown_chunk_is_an_error_and_the_pool_keeps_working() {
        let pool = Pool::new(FakeBackend::checked());
        let a = pool.malloc(1024, 0).unwrap();
        let b = pool.malloc(2048, 0).unwrap();
        let twin = forge(&a);
        pool.free(a).unwrap();
        assert!(matches!(pool.free(twin), Err(FreeError::NotLive(_))));
        for bad in [
            Block {
                chunk: 999,
                ..forge(&b)
            },
            Block {
                chunk: NIL,
                ..forge(&b)
            },
            Block {
                addr: b.addr + 512,
                ..forge(&b)
            },
            Block {
                size: 512,
                ..forge(&b)
            },
            Block {
                arena: 7,
                ..forge(&b)
            },
            Block {
                arena: u32::MAX,
                ..forge(&b)
            },
        ] {
            let e = pool.free(bad).unwrap_err();
            assert!(matches!(e, FreeError::NotLive(_)), "{e}");
            assert!(e.to_string().contains("not a live block"), "{e}");
        }
        pool.check().unwrap();
        let s = pool.stats();
        assert_eq!((s.used_bytes, s.frees), (2048, 1));
        pool.free(b).unwrap();
        pool.free(pool.malloc(1024, 0).unwrap()).unwrap();
        pool.check().unwrap();
        assert_eq!(pool.stats().used_bytes, 0);
        assert_eq!(pool.backend().counters().bad_frees, 0);
    }
}
