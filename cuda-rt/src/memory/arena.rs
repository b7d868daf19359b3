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
//! Each arena is a [`Mutex`] around a slab of chunk records (`Vec` + free list of
//! indices, so a hit never touches the heap) and a best-fit index:
//! - *Size classes*: exact for sizes under 16 units (8 KiB), then 16 classes per power
//!   of two (TLSF-style, 1024 classes cover every `u64` size). A two-level bitmap
//!   (16 words + 1 summary word) finds the first non-empty class at or above the
//!   request in a few instructions, whatever the number of chunks.
//! - *Inside a class*, an intrusive treap keyed by `(size, addr)` (links live in the
//!   slab records; priority = hash of the address, so no RNG state). The request's own
//!   class is searched with a lower bound; any higher class gives its leftmost node.
//!   This is exact best fit with ties by address, `O(log k)` in the chunks `k` of one
//!   class (small: classes are narrow), and never allocates — a `BTreeSet` would
//!   allocate and free nodes as it grows and shrinks, and CuPy-style exact bins by
//!   `size / 512` need an index as large as the largest size.
//! - Neighbour links (`prev`/`next` within a backend allocation) make split and merge
//!   `O(1)` plus the treap updates.
//!
//! # Concurrency
//! - No global lock on the hit path: malloc and free lock only their arena. Arenas are
//!   [`Arc`]s in a registry behind an [`RwLock`], never removed while the pool lives;
//!   each thread keeps a 4-entry cache of `(pool id, key) -> arena` (pool ids are
//!   never reused), so the registry is read only on the first use of a key by a
//!   thread, and written only when a key is seen for the first time.
//! - A [`Block`] carries its arena, so free needs no lookup.
//! - Counters (used, peak used, hits, misses, ...) are plain integers under each
//!   arena's lock, in a 128-byte-aligned arena: no shared cache line between threads
//!   on different keys. [`Pool::stats`] sums them arena by arena.
//! - Reserved bytes (checked against the limit), backend call counts and OOM retries
//!   are atomics touched only on misses and releases, which call the backend anyway.
//! - The backend is never called with an arena lock held.
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
//! A [`Block`] is a plain token (no reference count: an `Arc` per block would put a
//! shared atomic on every hit): give it back with [`Pool::free`]. The front keeps the
//! pool alive while its memory pointers live (its pointer type holds an `Arc` of the
//! pool). Dropping the pool gives the backend every free whole allocation; an
//! allocation that still has chunks handed out (a leaked or forgotten `Block`) is
//! leaked on purpose, never freed under a user.

mod backend;
mod bins;
mod limit;

use std::cell::Cell;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

pub use backend::{Backend, BackendCounters, BackendError, FakeBackend, HostBackend};
pub use limit::{format_bytes, limit_from_fraction, parse_limit};

use bins::{Bins, NIL};

/// Every size is rounded up to a multiple of this many bytes (CuPy's 512).
pub const ALLOCATION_UNIT: usize = 512;

/// `size` rounded up to a multiple of [`ALLOCATION_UNIT`], or `None` on overflow.
#[inline]
pub fn round_size(size: usize) -> Option<usize> {
    Some(size.checked_add(ALLOCATION_UNIT - 1)? & !(ALLOCATION_UNIT - 1))
}

/// Out of memory: what was asked for and where the pool stood. The front turns it
/// into the crate's `Error` (adding the device); [`Display`](fmt::Display) already
/// says it in words.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// Bytes requested by the caller.
    pub requested: u64,
    /// The request rounded up to [`ALLOCATION_UNIT`] (`u64::MAX` if it overflowed).
    pub rounded: u64,
    /// Bytes handed out by the pool (all arenas) when it gave up.
    pub in_use: u64,
    /// Bytes reserved from the backend but not handed out (split pieces that could
    /// not be released) when it gave up.
    pub cached: u64,
    /// The limit in force, if any.
    pub limit: Option<u64>,
    /// `true` when the backend refused; `false` when the limit did.
    pub backend_refused: bool,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory allocating {} ({} bytes): {} in use, {} cached (released and retried)",
            format_bytes(self.rounded),
            self.requested,
            format_bytes(self.in_use),
            format_bytes(self.cached),
        )?;
        match self.limit {
            Some(l) => write!(f, ", limit {}", format_bytes(l))?,
            None => write!(f, ", no limit")?,
        }
        if self.backend_refused {
            write!(f, "; the backend has no more memory")?;
        } else {
            write!(f, "; the request would pass the limit")?;
        }
        Ok(())
    }
}

impl StdError for OutOfMemory {}

/// Why [`Pool::malloc`] failed.
#[derive(Debug)]
pub enum MallocError {
    /// Out of memory after releasing the cache and retrying.
    OutOfMemory(OutOfMemory),
    /// The backend failed for another reason (not retried).
    Backend(Box<dyn StdError + Send + Sync + 'static>),
}

impl fmt::Display for MallocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MallocError::OutOfMemory(e) => e.fmt(f),
            MallocError::Backend(e) => write!(f, "the pool's backend failed: {e}"),
        }
    }
}

impl StdError for MallocError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            MallocError::OutOfMemory(e) => Some(e),
            MallocError::Backend(e) => Some(&**e),
        }
    }
}

/// Statistics of a [`Pool`]: CuPy's four numbers and more. Under concurrent use each
/// arena's figures are exact and the sums are of per-arena snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes handed out (rounded sizes). CuPy's `used_bytes`.
    pub used_bytes: u64,
    /// Bytes reserved from the backend. CuPy's `total_bytes`.
    pub total_bytes: u64,
    /// `total_bytes - used_bytes`: cached. CuPy's `free_bytes`.
    pub free_bytes: u64,
    /// Free chunks in all arenas. CuPy's `n_free_blocks`.
    pub n_free_blocks: u64,
    /// Peak of `used_bytes` since creation or [`Pool::reset_peaks`] (see the module
    /// doc: exact for one arena, an upper bound across arenas).
    pub peak_used_bytes: u64,
    /// Peak of `total_bytes` since creation or [`Pool::reset_peaks`] (exact).
    pub peak_total_bytes: u64,
    /// Successful non-zero mallocs.
    pub mallocs: u64,
    /// Frees of non-null blocks.
    pub frees: u64,
    /// Mallocs served from cached chunks.
    pub cache_hits: u64,
    /// Mallocs that found no cached chunk (each then grew or failed).
    pub cache_misses: u64,
    /// Successful backend allocations.
    pub backend_allocs: u64,
    /// Backend frees.
    pub backend_frees: u64,
    /// Times an out-of-memory (limit or backend) made the pool release its cache and
    /// retry.
    pub oom_retries: u64,
    /// The limit (0: none).
    pub limit: u64,
    /// Arenas (stream keys seen).
    pub n_arenas: u64,
}

/// One arena: a stream key's chunks, padded so two arenas never share a cache line.
#[repr(align(128))]
#[derive(Debug)]
struct Arena {
    key: u64,
    bins: Mutex<Bins>,
}

#[derive(Debug, Default)]
struct Registry {
    list: Vec<Arc<Arena>>,
    by_key: HashMap<u64, usize>,
}

/// Memory handed out by a [`Pool`]: a token to give back with [`Pool::free`]. Not
/// `Clone` (a chunk is freed once); dropping it without `free` leaks the chunk (see
/// the module doc).
#[must_use = "a Block must be given back with Pool::free, or its chunk stays in use"]
pub struct Block {
    addr: u64,
    size: u64,
    key: u64,
    pool: u64,
    chunk: u32,
    arena: *const Arena,
}

// SAFETY: `arena` is only dereferenced by `Pool::free` of the pool whose id is `pool`
// (checked first); that pool is alive (borrowed) and never drops an arena while alive.
// The arena itself is `Sync` (a `Mutex`).
unsafe impl Send for Block {}
// SAFETY: `&Block` only exposes plain integers.
unsafe impl Sync for Block {}

impl Block {
    /// The null block of `malloc(0)`.
    fn null(key: u64) -> Block {
        Block {
            addr: 0,
            size: 0,
            key,
            pool: 0,
            chunk: NIL,
            arena: std::ptr::null(),
        }
    }

    /// Start address (0 for the null block).
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes, rounded up to [`ALLOCATION_UNIT`] (0 for the null block).
    #[inline]
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// The stream key of the arena the block came from (and goes back to).
    #[inline]
    pub fn stream_key(&self) -> u64 {
        self.key
    }

    /// `true` for the size-0 block of `malloc(0)`.
    #[inline]
    pub fn is_null(&self) -> bool {
        self.size == 0
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("stream_key", &self.key)
            .finish()
    }
}

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

const CACHE_SLOTS: usize = 4;

#[derive(Clone, Copy)]
struct CacheEntry {
    pool: u64,
    key: u64,
    arena: *const Arena,
}

const EMPTY_ENTRY: CacheEntry = CacheEntry {
    pool: 0,
    key: 0,
    arena: std::ptr::null(),
};

thread_local! {
    /// Last arenas this thread used: `(pool id, key) -> arena`. Entries of dropped
    /// pools are never matched again (ids are unique).
    static ARENA_CACHE: [Cell<CacheEntry>; CACHE_SLOTS] =
        const { [const { Cell::new(EMPTY_ENTRY) }; CACHE_SLOTS] };
    static ARENA_CACHE_NEXT: Cell<usize> = const { Cell::new(0) };
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic under an arena lock can only come from a bug in this module or the slab
    // passing u32::MAX chunks; the state is still memory-safe to use.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The caching pool: CuPy's `MemoryPool` algorithm over a [`Backend`]. `Send + Sync`;
/// share it with an `Arc`. See the module doc for semantics and design.
pub struct Pool<B: Backend> {
    id: u64,
    backend: B,
    registry: RwLock<Registry>,
    /// Reserved bytes including in-flight growths (what the limit is checked against).
    reserved: AtomicU64,
    peak_reserved: AtomicU64,
    limit: AtomicU64,
    backend_allocs: AtomicU64,
    backend_frees: AtomicU64,
    oom_retries: AtomicU64,
    release_on_miss: AtomicBool,
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
        Pool {
            id: NEXT_POOL_ID.fetch_add(1, Ordering::Relaxed),
            backend,
            registry: RwLock::new(Registry::default()),
            reserved: AtomicU64::new(0),
            peak_reserved: AtomicU64::new(0),
            limit: AtomicU64::new(0),
            backend_allocs: AtomicU64::new(0),
            backend_frees: AtomicU64::new(0),
            oom_retries: AtomicU64::new(0),
            release_on_miss: AtomicBool::new(false),
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
        let arena = self.arena(stream);
        let release = {
            let mut bins = lock(&arena.bins);
            if let Some((chunk, addr)) = bins.malloc_cached(rounded) {
                return Ok(self.block(arena, chunk, addr, rounded));
            }
            bins.counters.misses += 1;
            self.release_on_miss.load(Ordering::Relaxed) && {
                let k = &bins.counters;
                (k.reserved - k.used) * 8 > k.reserved
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
            arena,
        }
    }

    /// Gives `block` back to the arena it came from (merging with free neighbours).
    /// The null block is ignored.
    ///
    /// # Panics
    /// If `block` came from another pool.
    #[inline]
    pub fn free(&self, block: Block) {
        if block.size == 0 {
            return;
        }
        assert_eq!(
            block.pool, self.id,
            "Pool::free: the block belongs to another pool"
        );
        // SAFETY: the block came from this pool (checked above), which is alive for
        // the duration of `&self` and never drops an arena before its own drop.
        let arena = unsafe { &*block.arena };
        let res = lock(&arena.bins).free(block.chunk, block.addr, block.size);
        assert!(
            res.is_ok(),
            "Pool::free: {block:?} is not a live block of this pool"
        );
    }

    /// Gives the backend every cached chunk that is a whole backend allocation (split
    /// pieces stay): in every arena with `None`, else only in `stream`'s arena.
    pub fn free_all_blocks(&self, stream: Option<u64>) {
        let arenas: Vec<Arc<Arena>> = {
            let reg = self.registry.read().unwrap_or_else(PoisonError::into_inner);
            match stream {
                None => reg.list.clone(),
                Some(k) => reg
                    .by_key
                    .get(&k)
                    .map(|&i| reg.list[i].clone())
                    .into_iter()
                    .collect(),
            }
        };
        let mut out = Vec::new();
        for arena in arenas {
            lock(&arena.bins).release_whole(&mut out);
            self.give_back(&mut out);
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

    /// Statistics, summed over arenas.
    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats::default();
        let mut peak_used = 0;
        {
            let reg = self.registry.read().unwrap_or_else(PoisonError::into_inner);
            for arena in &reg.list {
                let k = lock(&arena.bins).counters;
                s.used_bytes += k.used;
                s.total_bytes += k.reserved;
                s.n_free_blocks += k.n_free;
                s.mallocs += k.mallocs;
                s.frees += k.frees;
                s.cache_hits += k.hits;
                s.cache_misses += k.misses;
                peak_used += k.peak_used;
            }
            s.n_arenas = reg.list.len() as u64;
        }
        s.free_bytes = s.total_bytes - s.used_bytes;
        s.peak_total_bytes = self
            .peak_reserved
            .load(Ordering::Relaxed)
            .max(s.total_bytes);
        s.peak_used_bytes = peak_used.min(s.peak_total_bytes);
        s.backend_allocs = self.backend_allocs.load(Ordering::Relaxed);
        s.backend_frees = self.backend_frees.load(Ordering::Relaxed);
        s.oom_retries = self.oom_retries.load(Ordering::Relaxed);
        s.limit = self.limit();
        s
    }

    /// Bytes handed out (CuPy's `used_bytes`).
    pub fn used_bytes(&self) -> u64 {
        self.stats().used_bytes
    }

    /// Bytes reserved from the backend (CuPy's `total_bytes`).
    pub fn total_bytes(&self) -> u64 {
        self.stats().total_bytes
    }

    /// Cached bytes, `total - used` (CuPy's `free_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.stats().free_bytes
    }

    /// Free chunks in all arenas (CuPy's `n_free_blocks`).
    pub fn n_free_blocks(&self) -> u64 {
        self.stats().n_free_blocks
    }

    /// Resets both peaks to the current values.
    pub fn reset_peaks(&self) {
        let mut total = 0;
        {
            let reg = self.registry.read().unwrap_or_else(PoisonError::into_inner);
            for arena in &reg.list {
                let mut bins = lock(&arena.bins);
                bins.counters.peak_used = bins.counters.used;
                total += bins.counters.reserved;
            }
        }
        self.peak_reserved.store(total, Ordering::Relaxed);
    }

    /// The free chunks of `stream`'s arena as `(addr, size)`, sorted by address
    /// (empty if the key was never used). For tests and debugging.
    pub fn free_chunks(&self, stream: u64) -> Vec<(u64, u64)> {
        let arena = {
            let reg = self.registry.read().unwrap_or_else(PoisonError::into_inner);
            reg.by_key.get(&stream).map(|&i| reg.list[i].clone())
        };
        let mut v = arena
            .map(|a| lock(&a.bins).free_chunks())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// Checks every internal invariant of every arena (links, merge state, best-fit
    /// index, counters: used + cached chunks == reserved). `O(chunks)`; for tests.
    pub fn check(&self) -> Result<(), String> {
        let reg = self.registry.read().unwrap_or_else(PoisonError::into_inner);
        for arena in &reg.list {
            lock(&arena.bins)
                .check()
                .map_err(|e| format!("arena of stream key {}: {e}", arena.key))?;
        }
        Ok(())
    }

    // ---- internals ----

    /// The arena of `key`, created on first use.
    #[inline]
    fn arena(&self, key: u64) -> &Arena {
        let hit = ARENA_CACHE.with(|slots| {
            for s in slots {
                let e = s.get();
                if e.pool == self.id && e.key == key {
                    return e.arena;
                }
            }
            std::ptr::null()
        });
        if !hit.is_null() {
            // SAFETY: the entry was stored by this pool (same id, ids are unique) and
            // points into an `Arc<Arena>` held by `self.registry`, which never removes
            // arenas before the pool drops; `&self` keeps the pool alive.
            return unsafe { &*hit };
        }
        self.arena_slow(key)
    }

    #[cold]
    fn arena_slow(&self, key: u64) -> &Arena {
        let found = {
            let reg = self.registry.read().unwrap_or_else(PoisonError::into_inner);
            reg.by_key.get(&key).map(|&i| Arc::as_ptr(&reg.list[i]))
        };
        let ptr = found.unwrap_or_else(|| {
            let mut reg = self
                .registry
                .write()
                .unwrap_or_else(PoisonError::into_inner);
            if let Some(&i) = reg.by_key.get(&key) {
                return Arc::as_ptr(&reg.list[i]);
            }
            let arena = Arc::new(Arena {
                key,
                bins: Mutex::new(Bins::new()),
            });
            let ptr = Arc::as_ptr(&arena);
            let i = reg.list.len();
            reg.list.push(arena);
            reg.by_key.insert(key, i);
            ptr
        });
        ARENA_CACHE.with(|slots| {
            ARENA_CACHE_NEXT.with(|next| {
                let n = next.get();
                slots[n].set(CacheEntry {
                    pool: self.id,
                    key,
                    arena: ptr,
                });
                next.set((n + 1) % CACHE_SLOTS);
            })
        });
        // SAFETY: as in `arena`: an arena of this live pool, never dropped before it.
        unsafe { &*ptr }
    }

    /// A miss: new backend memory for `rounded` bytes, with the growth policy and the
    /// limit / out-of-memory retries. No arena lock is held on entry.
    #[cold]
    fn grow(
        &self,
        arena: &Arena,
        requested: usize,
        rounded: u64,
        release_smaller: bool,
    ) -> Result<Block, MallocError> {
        if release_smaller {
            let mut out = Vec::new();
            lock(&arena.bins).release_whole_where(&mut out, |size| size < rounded);
            self.give_back(&mut out);
        }
        let mut retried = false;
        loop {
            let (backend_refused, limit) = match self.try_grow(rounded) {
                Ok(addr) => {
                    let chunk = lock(&arena.bins).add_allocation(addr, rounded);
                    return Ok(self.block(arena, chunk, addr, rounded));
                }
                Err(Growth::Limit(limit)) => (false, limit),
                Err(Growth::Backend(BackendError::OutOfMemory)) => (true, self.limit()),
                Err(Growth::Backend(BackendError::Other(e))) => {
                    return Err(MallocError::Backend(e));
                }
            };
            if retried {
                return Err(MallocError::OutOfMemory(self.oom(
                    requested,
                    rounded,
                    backend_refused,
                    limit,
                )));
            }
            retried = true;
            self.oom_retries.fetch_add(1, Ordering::Relaxed);
            self.free_all_blocks(None);
        }
    }

    /// Reserves `size` against the limit, then asks the backend.
    fn try_grow(&self, size: u64) -> Result<u64, Growth> {
        let limit = self.limit();
        let old = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                let new = r.checked_add(size)?;
                (limit == 0 || new <= limit).then_some(new)
            })
            .map_err(|_| Growth::Limit(limit))?;
        let Ok(len) = usize::try_from(size) else {
            self.reserved.fetch_sub(size, Ordering::AcqRel);
            return Err(Growth::Backend(BackendError::OutOfMemory));
        };
        match self.backend.alloc(len) {
            Ok(addr) => {
                self.peak_reserved.fetch_max(old + size, Ordering::Relaxed);
                self.backend_allocs.fetch_add(1, Ordering::Relaxed);
                Ok(addr)
            }
            Err(e) => {
                self.reserved.fetch_sub(size, Ordering::AcqRel);
                Err(Growth::Backend(e))
            }
        }
    }

    /// The error for a request that failed under `limit` (0: none).
    fn oom(
        &self,
        requested: usize,
        rounded: u64,
        backend_refused: bool,
        limit: u64,
    ) -> OutOfMemory {
        let s = self.stats();
        OutOfMemory {
            requested: requested as u64,
            rounded,
            in_use: s.used_bytes,
            cached: s.free_bytes,
            limit: (limit != 0).then_some(limit),
            backend_refused,
        }
    }
}

enum Growth {
    /// The limit in force refused.
    Limit(u64),
    Backend(BackendError),
}

impl<B: Backend> Drop for Pool<B> {
    fn drop(&mut self) {
        let reg = self
            .registry
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for arena in &reg.list {
            lock(&arena.bins).release_whole(&mut out);
        }
        for (addr, size) in out {
            self.backend.free(addr, size as usize);
        }
    }
}
