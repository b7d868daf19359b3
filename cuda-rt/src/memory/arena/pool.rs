//! The [`Pool`] itself: its state, malloc (cache hit, else a miss), free, releasing
//! the cache, the limit, and the drop that gives the backend its memory back.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use super::barrier;
use super::bins::{self, Bins, SlabFull};
use super::error::TOO_MANY_CHUNKS;
use super::parked::Parked;
use super::stream_arena::Arena;
use super::table::Table;
use super::{round_size, Backend, Block, FreeError, MallocError, RawBlock};
use crate::error::OutOfMemoryCause;

static NEXT_POOL_ID: AtomicU64 = AtomicU64::new(1);

/// The caching pool: CuPy's `MemoryPool` algorithm over a [`Backend`]. `Send + Sync`;
/// share it with an `Arc`. See the module doc for semantics and design.
pub struct Pool<B: Backend> {
    pub(super) id: u64,
    pub(super) backend: B,
    pub(super) arenas: Table<Arena>,
    /// Reserved bytes including in-flight growths (what the limit is checked against).
    pub(super) reserved: AtomicU64,
    pub(super) peak_reserved: AtomicU64,
    pub(super) limit: AtomicU64,
    pub(super) backend_allocs: AtomicU64,
    pub(super) backend_frees: AtomicU64,
    pub(super) oom_retries: AtomicU64,
    pub(super) release_on_miss: AtomicBool,
    /// Grow with expandable segments (see [`set_expandable_segments`]).
    ///
    /// [`set_expandable_segments`]: Self::set_expandable_segments
    pub(super) expandable: AtomicBool,
    /// The slots of the threads that park blocks of this pool (see [`parked`]).
    ///
    /// [`parked`]: super::parked
    pub(super) parked: Mutex<Vec<&'static Parked>>,
    /// Set by [`close`](Self::close): the pool's owner is gone.
    pub(super) closed: AtomicBool,
    /// Lock-free cached pairs of threads whose slots left the pool.
    pub(super) retired_pairs: AtomicU64,
    /// Fences given with blocks ([`free_after`](Self::free_after)), and host waits on
    /// fences (or in their place).
    pub(super) fences_recorded: AtomicU64,
    pub(super) fence_waits: AtomicU64,
    /// Ranges of free granules a growth unmapped inside expandable segments.
    pub(super) holes_punched: AtomicU64,
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
            expandable: AtomicBool::new(false),
            parked: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            retired_pairs: AtomicU64::new(0),
            fences_recorded: AtomicU64::new(0),
            fence_waits: AtomicU64::new(0),
            holes_punched: AtomicU64::new(0),
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
    ///
    /// [`ALLOCATION_UNIT`]: super::ALLOCATION_UNIT
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
                None,
                OutOfMemoryCause::Backend,
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
    pub(super) fn hit(
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
    /// and so do the arena's blocks whose streams are done (see `awaiting`), then the
    /// pool grows.
    #[cold]
    fn missed(&self, arena: &Arena, size: usize, rounded: u64) -> Result<Block, MallocError> {
        let settled = self.settle_all() | self.poll_arena(arena, false);
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
    pub(super) fn block(&self, arena: &Arena, chunk: u32, addr: u64, size: u64) -> Block {
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
    /// Blocks awaiting their streams whose fences are done go back first (a poll, no
    /// wait); those still awaiting stay.
    pub fn free_all_blocks(&self, stream: Option<u64>) {
        self.settle_all();
        self.poll_awaiting();
        let mut out = Vec::new();
        let mut cuts = Vec::new();
        let mut release = |arena: &Arena| {
            arena.lock().release_whole(&mut out);
            self.give_back(&mut out);
            self.trim_segments(arena, &mut cuts);
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

    pub(super) fn give_back(&self, out: &mut Vec<(u64, u64)>) {
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

    /// Turns expandable segments on or off (off by default; a backend without them,
    /// [`Backend::segment_spec`] `None`, ignores this). With them on, a miss grows the
    /// arena in place: it maps more memory at the end of one of the arena's segments
    /// (address space reserved once per segment, [`SegmentSpec::reserve`] bytes),
    /// where the segment's free tail and the new memory merge into one free chunk,
    /// instead of adding a separate allocation of exactly the request. Memory is
    /// mapped at the backend's granularity ([`SegmentSpec::granularity`]), so a
    /// request may map up to one granule more than it needs; the rest stays cached.
    /// Releasing the cache ([`free_all_blocks`](Self::free_all_blocks), and the
    /// release before an out-of-memory retry) unmaps every whole granule of every
    /// free chunk of the segments, and gives back segments left empty.
    ///
    /// With them on, a miss also *punches holes*: before a growth that would take
    /// reserved memory past its peak maps, it unmaps as many whole free granules
    /// inside the arena's segments as the growth adds past the peak (their partial
    /// granules stay cached, as do the free chunks next to where it maps), so the peak
    /// grows only by what the cache's free granules cannot pay for (a growth under the
    /// peak punches nothing: the cache stays mapped for later hits); and a growth maps where that maps the least, at a segment's end or
    /// into a hole whose free neighbours make up the rest. Only free chunks are
    /// punched, never blocks handed out or awaiting other streams' work. A CUDA
    /// backend waits for the device's queued work before it unmaps, so this costs a
    /// host synchronisation per growth that punches; growths are misses, never the
    /// cached malloc and free. [`PoolStats::holes_punched`] counts the ranges unmapped.
    ///
    /// This is PyTorch's `expandable_segments:True`: a workload whose sizes drift
    /// upward (a serving batch growing by one) reuses the memory it freed instead of
    /// leaving a cached block just too small for each new size. Turning it off keeps
    /// the segments already made (they are released like any cache); turning it on
    /// leaves earlier allocations as they are. The cached malloc and free do not look
    /// at this setting.
    ///
    /// [`SegmentSpec::reserve`]: super::SegmentSpec::reserve
    /// [`SegmentSpec::granularity`]: super::SegmentSpec::granularity
    /// [`PoolStats::holes_punched`]: super::PoolStats::holes_punched
    pub fn set_expandable_segments(&self, on: bool) {
        self.expandable.store(on, Ordering::Relaxed);
    }

    /// Whether misses grow expandable segments: turned on
    /// ([`set_expandable_segments`](Self::set_expandable_segments)) and supported by
    /// the backend.
    pub fn expandable_segments(&self) -> bool {
        self.expandable.load(Ordering::Relaxed) && self.backend.segment_spec().is_some()
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
        // Blocks still used by other streams: wait for them, then they are free. Those
        // whose waits failed may still be in use: they stay deferred, and their
        // chunks (never whole) are leaked below rather than freed.
        self.wait_awaiting();
        self.abandon_awaiting();
        let mut out = Vec::new();
        let mut cuts = Vec::new();
        let segments = self.backend.segment_spec().is_some();
        for arena in self.arenas.iter_mut() {
            let bins = arena.bins.get_mut();
            bins.release_whole(&mut out);
            if segments {
                bins.trim_segments(&mut cuts);
            }
        }
        for (addr, size) in out {
            self.backend.free(addr, size as usize);
        }
        self.give_back_segments(&mut cuts, None, None);
    }
}

#[cfg(test)]
mod tests {
    use super::super::bins::NIL;
    use super::super::FakeBackend;
    use super::*;

    /// A copy of `b`'s fields: what only the `arena` module can make (a `Block` is not
    /// `Clone` and its fields are private to `arena`), to reach the `NotLive` checks.
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
