//! Parked frees: the last block a thread gave back to a pool waits in the thread's
//! slot for that pool, and enters its arena under the lock of the thread's next
//! malloc there. A cached malloc + free pair then takes one arena lock instead of two
//! (on the GPU host a locked instruction costs about 9 ns, a fifth of the pair), and
//! none at all in the steady state (below).
//!
//! # What stays exact
//! A parked block is free as far as the pool's figures and policies go: every
//! observer gives all parked blocks back first (statistics, `free_all_blocks`, the
//! invariant checks, the pool's drop) and so does every malloc that would otherwise
//! miss, before it grows or releases anything, so no parked block causes a backend
//! call, a limit error or an out-of-memory. The parking thread's own mallocs take its
//! parked block back into the arena before searching, so a single thread sees
//! exactly the unparked algorithm (best fit, ties by address, merges). The one
//! difference: a cache *hit* on another thread that shares the arena (the same
//! stream) does not see a block parked by this thread until this thread's next call
//! to the pool, or any observer's, gives it back; it picks among the other free
//! chunks, as if the free had happened a little later.
//!
//! # Concurrency
//! A slot is written by its thread only, and only while empty ([`Parked::put`]);
//! any thread may take it, but only while holding the lock of the arena the parked
//! block belongs to ([`Parked::take_in`]), so takers never race one another. All
//! fields are atomics (plain loads and stores on the hot path): no `unsafe`, and a
//! stale read can only make a taker find nothing or the wrong arena and retry.
//!
//! # The cached pair without a lock
//! Each arena counts the holders of its lock that may change it. When a thread's
//! malloc finds, under the lock, that its parked block is exactly what it gets back
//! (the free and the malloc fused), the slot remembers the block and the count. The
//! next time the same block is parked and the count has not moved, nothing in the
//! arena has changed, so the answer is the same: the thread takes the block back with
//! plain loads and stores and counts the pair in its slot ([`Parked::take_unlocked`];
//! the pool adds those counts to its statistics). Another thread that takes a parked
//! block (an observer, or a malloc about to grow) claims the slot first and runs one
//! process-wide barrier ([`barrier::heavy`], Linux `membarrier`), then waits until
//! the slot's thread is not inside its lock-free take: Dekker's exclusion, with the
//! hardware barrier on the rare side only. Where the barrier is missing the pair
//! keeps its one lock.
//!
//! Each pool keeps the slots of the threads that parked in it (to settle them); each
//! thread keeps its slots in a thread-local list with a handle to the pool ([`Home`]),
//! and settles them when it exits. Slots are `'static` (leaked once, reused after
//! their thread exits), so the hot path reaches its slot through one thread-local
//! read, with no reference count.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{compiler_fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::barrier;
use super::{AtomicBlock, RawBlock};

/// One thread's parked block for one pool (empty or one block). Padded so that two
/// threads' slots never share a cache line.
#[repr(align(128))]
#[derive(Debug)]
pub(crate) struct Parked {
    /// Set after `block` is written, cleared after it is read.
    full: AtomicBool,
    block: AtomicBlock,
    /// The slot's thread is in [`Parked::take_unlocked`].
    busy: AtomicBool,
    /// Other threads about to take the block (see [`Parked::claim`]).
    claims: AtomicU32,
    /// The block the slot's thread last found reusable under its arena's lock (its
    /// address, and chunk and arena as in `AtomicBlock`), and the arena's change
    /// count then (`u64::MAX`: none). Its thread's alone.
    verified_addr: AtomicU64,
    verified_loc: AtomicU64,
    verified_at: AtomicU64,
    /// Cached pairs done without the lock, not yet in the arena's counters (each is
    /// a malloc, a free and a cache hit). Written by the slot's thread only.
    pairs: AtomicU64,
}

impl Default for Parked {
    fn default() -> Self {
        Parked {
            full: AtomicBool::new(false),
            block: AtomicBlock::empty(),
            busy: AtomicBool::new(false),
            claims: AtomicU32::new(0),
            verified_addr: AtomicU64::new(0),
            verified_loc: AtomicU64::new(0),
            verified_at: AtomicU64::new(u64::MAX),
            pairs: AtomicU64::new(0),
        }
    }
}

/// What [`Parked::take_in`] found.
#[derive(Debug)]
pub(crate) enum Taken {
    /// No parked block.
    Empty,
    /// A block of another arena (the caller holds the wrong lock).
    Elsewhere,
    /// The block, now out of the slot.
    Block(RawBlock),
}

impl Parked {
    /// Whether a block is parked (a hint when read by another thread).
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    /// The arena index of the parked block (meaningful while full).
    #[inline]
    pub(crate) fn arena(&self) -> u32 {
        self.block.arena()
    }

    /// The parked block, read in place (meaningful to the slot's thread while full:
    /// only that thread fills the slot).
    #[inline]
    pub(crate) fn peek(&self) -> RawBlock {
        self.block.load()
    }

    /// Empties the slot if it is full, for its own thread, which [`peek`](Self::peek)ed
    /// the block before (only that thread fills the slot, so a full slot still holds
    /// what it read) and holds the lock of the block's arena. `true` if it was full.
    #[inline]
    pub(crate) fn take_peeked(&self) -> bool {
        if !self.full.load(Ordering::Acquire) {
            return false;
        }
        self.full.store(false, Ordering::Release);
        true
    }

    /// Remembers, for its thread, that `raw` was found reusable under its arena's
    /// lock when the arena's change count was `at` (see [`take_unlocked`](Self::take_unlocked)).
    /// Nothing is remembered where the process barrier is missing, so the lock-free
    /// take never applies there.
    #[inline]
    pub(crate) fn set_verified(&self, raw: RawBlock, at: u64) {
        if !barrier::ready_hint() {
            return;
        }
        self.verified_addr.store(raw.addr, Ordering::Relaxed);
        self.verified_loc.store(loc_of(&raw), Ordering::Relaxed);
        self.verified_at.store(at, Ordering::Relaxed);
    }

    /// The cached pair without any lock, for the slot's thread, which
    /// [`peek`](Self::peek)ed `hint`: empties the slot and counts a pair when the
    /// parked block is the one last found reusable and its arena's change count
    /// (read from `changes`) has not moved since, so the arena is exactly as it was
    /// then and the fused free + malloc gives this block back again. `false`
    /// (nothing done) when that is not so, when the process barrier is not
    /// available, or when another thread has claimed the slot.
    ///
    /// Exclusion with a claiming thread is Dekker's: this thread stores `busy` then
    /// loads `claims`, the claimer stores `claims` then loads `busy`; the compiler
    /// fence here and the claimer's process-wide barrier order both (see
    /// [`claim`](Self::claim)).
    #[inline]
    pub(crate) fn take_unlocked(&self, hint: &RawBlock, changes: &AtomicU64) -> bool {
        // The same chunk of the same arena at the same address, in an arena that has
        // not changed: the same block (its size is the chunk's).
        if self.verified_addr.load(Ordering::Relaxed) != hint.addr
            || self.verified_loc.load(Ordering::Relaxed) != loc_of(hint)
        {
            return false;
        }
        let at = self.verified_at.load(Ordering::Relaxed);
        self.busy.store(true, Ordering::Relaxed);
        compiler_fence(Ordering::SeqCst);
        let ok = self.claims.load(Ordering::Acquire) == 0
            && self.full.load(Ordering::Relaxed)
            && changes.load(Ordering::Relaxed) == at;
        if ok {
            self.full.store(false, Ordering::Relaxed);
            let n = self.pairs.load(Ordering::Relaxed);
            self.pairs.store(n + 1, Ordering::Relaxed);
        }
        self.busy.store(false, Ordering::Release);
        ok
    }

    /// Stops the slot's thread from taking its block without a lock until
    /// [`unclaim`](Self::unclaim). Claim every slot to be settled, then run
    /// [`barrier::heavy`] once, then [`wait_idle`](Self::wait_idle) on each before
    /// taking its block.
    pub(crate) fn claim(&self) {
        self.claims.fetch_add(1, Ordering::SeqCst);
    }

    /// Ends a [`claim`](Self::claim).
    pub(crate) fn unclaim(&self) {
        self.claims.fetch_sub(1, Ordering::Release);
    }

    /// After a claim and the barrier: waits while the slot's thread is inside a
    /// lock-free take it began before it could see the claim (a few instructions).
    pub(crate) fn wait_idle(&self) {
        while self.busy.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
    }

    /// Pairs done without the lock so far.
    pub(crate) fn pairs(&self) -> u64 {
        self.pairs.load(Ordering::Relaxed)
    }

    /// Hands the pair count over (to the pool's total) and forgets what was
    /// verified: the slot is leaving its pool.
    pub(crate) fn retire(&self) -> u64 {
        self.verified_at.store(u64::MAX, Ordering::Relaxed);
        self.pairs.swap(0, Ordering::Relaxed)
    }

    /// Parks `raw`. Only the slot's thread calls it, and only when the slot is empty.
    #[inline]
    pub(crate) fn put(&self, raw: RawBlock) {
        debug_assert!(!self.is_full());
        self.block.store(raw);
        self.full.store(true, Ordering::Release);
    }

    /// Takes the parked block if it belongs to arena `arena`. The caller holds that
    /// arena's lock.
    #[inline]
    pub(crate) fn take_in(&self, arena: u32) -> Taken {
        if !self.full.load(Ordering::Acquire) {
            return Taken::Empty;
        }
        if self.block.arena() != arena {
            return Taken::Elsewhere;
        }
        let raw = self.block.load();
        self.full.store(false, Ordering::Release);
        Taken::Block(raw)
    }
}

/// A block's chunk and arena in one word.
#[inline]
fn loc_of(raw: &RawBlock) -> u64 {
    u64::from(raw.chunk) | u64::from(raw.arena) << 32
}

/// A pool as a thread's slot list sees it.
pub(crate) trait Home: Send + Sync {
    /// `p`'s thread is done with it (exiting, or dropping its entry): settle it and
    /// stop tracking it.
    fn forget(&self, p: &'static Parked);
    /// Whether the pool parks no more (a pinned pool whose user handles are gone):
    /// a thread may drop its entry to make room.
    fn closed(&self) -> bool {
        false
    }
}

/// How a thread's entry holds its pool.
pub(crate) enum HomeRef {
    /// A pool that lives for the whole process (the default device pools).
    Static(&'static dyn Home),
    /// A pool kept alive by the entry (pinned pools, which release their memory when
    /// their user handles go, whoever still holds them).
    Shared(Arc<dyn Home>),
}

impl HomeRef {
    fn get(&self) -> &dyn Home {
        match self {
            HomeRef::Static(h) => *h,
            HomeRef::Shared(h) => &**h,
        }
    }
}

struct Entry {
    /// The pool's address, its identity while the entry keeps it alive.
    id: usize,
    home: HomeRef,
    parked: &'static Parked,
}

/// Most pools a thread parks in at once; past that its frees go straight back.
const MAX_HOMES: usize = 8;

/// Slots whose threads exited, for reuse: slots are never freed (a thread's hot path
/// holds a `&'static` to its own without any count), so at most as many exist as
/// threads ever parked at once, per pool.
static SPARE_SLOTS: Mutex<Vec<&'static Parked>> = Mutex::new(Vec::new());

fn new_slot() -> &'static Parked {
    let reused = SPARE_SLOTS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    reused.unwrap_or_else(|| Box::leak(Box::default()))
}

struct Entries(RefCell<Vec<Entry>>);

impl Drop for Entries {
    fn drop(&mut self) {
        // The fast entry must not outlive the slots: they are about to be reused.
        FAST.with(|f| f.set(FastEntry::NONE));
        let entries: Vec<Entry> = self.0.get_mut().drain(..).collect();
        for e in entries {
            e.home.get().forget(e.parked);
            SPARE_SLOTS
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(e.parked);
        }
    }
}

/// The thread's last looked-up slot: a plain `Copy` thread-local (no destructor, so
/// always accessible), checked before the list.
#[derive(Clone, Copy)]
struct FastEntry {
    id: usize,
    slot: Option<&'static Parked>,
}

impl FastEntry {
    /// Matches no pool (pool ids are addresses, never 0).
    const NONE: FastEntry = FastEntry { id: 0, slot: None };
}

thread_local! {
    static FAST: Cell<FastEntry> = const { Cell::new(FastEntry::NONE) };
    static MINE: Entries = const { Entries(RefCell::new(Vec::new())) };
}

/// This thread's slot for the pool `id`, if it has one (and is not exiting).
#[inline]
pub(crate) fn slot(id: usize) -> Option<&'static Parked> {
    let f = FAST.with(Cell::get);
    if f.id == id {
        return f.slot;
    }
    slot_slow(id)
}

#[cold]
#[inline(never)]
fn slot_slow(id: usize) -> Option<&'static Parked> {
    MINE.try_with(|m| {
        let list = m.0.try_borrow().ok()?;
        let e = list.iter().find(|e| e.id == id)?;
        FAST.with(|f| {
            f.set(FastEntry {
                id,
                slot: Some(e.parked),
            })
        });
        Some(e.parked)
    })
    .ok()
    .flatten()
}

/// This thread's slot for the pool `id`, registering one if there is none:
/// `register` gets the new slot, starts tracking it in the pool and gives the pool
/// handle. `None` when the thread cannot park (exiting, list in use further up the
/// stack, or full of live pools): the caller gives its block back directly.
#[inline]
pub(crate) fn slot_or_register(
    id: usize,
    register: impl FnOnce(&'static Parked) -> HomeRef,
) -> Option<&'static Parked> {
    if let Some(s) = slot(id) {
        return Some(s);
    }
    register_slot(id, register)
}

#[cold]
#[inline(never)]
fn register_slot(
    id: usize,
    register: impl FnOnce(&'static Parked) -> HomeRef,
) -> Option<&'static Parked> {
    MINE.try_with(|m| {
        let mut list = m.0.try_borrow_mut().ok()?;
        if list.len() >= MAX_HOMES {
            // Make room by dropping the entries of closed pools.
            let (closed, open): (Vec<Entry>, Vec<Entry>) =
                list.drain(..).partition(|e| e.home.get().closed());
            *list = open;
            for e in closed {
                if FAST.with(Cell::get).id == e.id {
                    FAST.with(|f| f.set(FastEntry::NONE));
                }
                e.home.get().forget(e.parked);
                SPARE_SLOTS
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(e.parked);
            }
            if list.len() >= MAX_HOMES {
                return None;
            }
        }
        let parked = new_slot();
        let home = register(parked);
        list.push(Entry { id, home, parked });
        FAST.with(|f| {
            f.set(FastEntry {
                id,
                slot: Some(parked),
            })
        });
        Some(parked)
    })
    .ok()
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::super::{Block, FakeBackend, Pool};
    use super::*;

    type TestPool = Pool<FakeBackend>;

    /// A pool that lives for the process, as the default device pools do (kept
    /// reachable from a static, as theirs are, so Miri's leak check is content).
    fn leaked() -> &'static TestPool {
        static KEEP: Mutex<Vec<&'static TestPool>> = Mutex::new(Vec::new());
        let pool = Box::leak(Box::new(Pool::new(FakeBackend::checked())));
        KEEP.lock().unwrap().push(pool);
        pool
    }

    /// The pool's statistics once every thread of a finished `thread::scope` is gone.
    /// The scope returns when the threads' closures have, but each thread's TLS
    /// destructors (which give its parked block back) may still be running: ask again
    /// until nothing is in use (a block lost for good still fails the caller's checks,
    /// after 10 s).
    fn stats_after_threads(pool: &'static TestPool) -> crate::memory::arena::PoolStats {
        let t0 = std::time::Instant::now();
        loop {
            let s = pool.stats();
            if s.used_bytes == 0 || t0.elapsed() > std::time::Duration::from_secs(10) {
                return s;
            }
            std::thread::yield_now();
        }
    }

    fn id(pool: &'static TestPool) -> usize {
        pool as *const TestPool as usize
    }

    /// What the device front does with a block given back: park it.
    fn park(pool: &'static TestPool, b: Block) {
        let raw = b.into_raw();
        match slot_or_register(id(pool), |p| {
            pool.register_parked(p);
            HomeRef::Static(pool)
        }) {
            Some(p) => pool.park(p, raw),
            None => assert!(pool.free_raw(raw)),
        }
    }

    /// What the device front does to malloc: the cached pair's path when this
    /// thread's parked block is exactly what it gets, else the general one (which
    /// takes the parked block back first).
    fn malloc(pool: &'static TestPool, size: usize, key: u64) -> Block {
        let slot = slot(id(pool));
        if let Some(b) = slot.and_then(|p| pool.malloc_reparked(size, key, p)) {
            return b;
        }
        pool.malloc_parked(size, key, slot).unwrap()
    }

    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    /// One thread sees exactly the unparked algorithm: the same random steps on a
    /// pool that frees at once and on one that parks give the same address for every
    /// malloc and, whenever looked at, the same statistics.
    #[test]
    fn a_thread_that_parks_sees_exactly_what_plain_frees_give() {
        let steps = if cfg!(miri) { 300 } else { 20_000 };
        let plain = Pool::new(FakeBackend::checked());
        let parked = leaked();
        let sizes = [512usize, 1024, 1536, 4096, 8192, 64 * 1024, 1 << 20];
        let (mut live_a, mut live_b): (Vec<Block>, Vec<Block>) = (Vec::new(), Vec::new());
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut last_freed = (sizes[0], 0u64);
        for step in 0..steps {
            let r = xorshift(&mut rng);
            let mut key = (r >> 40) % 2;
            if live_a.len() < 48 && (live_a.is_empty() || r % 100 < 55) {
                let mut size = sizes[(r >> 8) as usize % sizes.len()];
                if r.is_multiple_of(3) {
                    // The cached pair: the size and stream of the last free.
                    (size, key) = last_freed;
                }
                let a = plain.malloc(size, key).unwrap();
                let b = malloc(parked, size, key);
                assert_eq!(a.addr(), b.addr(), "step {step}: malloc({size}) differs");
                live_a.push(a);
                live_b.push(b);
            } else {
                let i = (r >> 8) as usize % live_a.len();
                let a = live_a.swap_remove(i);
                last_freed = (a.size(), a.stream_key());
                plain.free(a).unwrap();
                park(parked, live_b.swap_remove(i));
            }
            if r.is_multiple_of(97) {
                assert_eq!(plain.stats(), parked.stats(), "step {step}");
                parked.check().unwrap();
            }
            if r.is_multiple_of(1009) {
                plain.free_all_blocks(None);
                parked.free_all_blocks(None);
            }
        }
        for (a, b) in live_a.into_iter().zip(live_b) {
            plain.free(a).unwrap();
            park(parked, b);
        }
        assert_eq!(plain.stats(), parked.stats());
        assert_eq!(parked.stats().used_bytes, 0);
    }

    #[test]
    fn other_threads_observers_and_misses_see_a_parked_block_as_free() {
        let pool = leaked();
        let (a, b) = std::thread::scope(|s| {
            s.spawn(|| {
                let a = malloc(pool, 4096, 1);
                let b = malloc(pool, 4096, 1);
                let (aa, ba) = (a.addr(), b.addr());
                park(pool, a);
                // Parked, not yet in the arena: statistics still count it as free.
                let s = std::thread::scope(|s2| s2.spawn(|| pool.stats()).join().unwrap());
                assert_eq!((s.used_bytes, s.n_free_blocks), (4096, 1));
                // A miss on another thread takes it rather than growing.
                let grown = pool.backend().counters().allocs;
                let c = std::thread::scope(|s2| {
                    s2.spawn(|| {
                        let c = pool.malloc(2048, 1).unwrap();
                        let addr = c.addr();
                        pool.free(c).unwrap();
                        addr
                    })
                    .join()
                    .unwrap()
                });
                assert_eq!(c, aa, "the miss settled the parked block and split it");
                assert_eq!(pool.backend().counters().allocs, grown);
                park(pool, b);
                (aa, ba)
            })
            .join()
            .unwrap()
        });
        // The parking thread exited: its slot was settled.
        let s = pool.stats();
        assert_eq!(s.used_bytes, 0);
        assert_eq!(s.n_free_blocks, 2);
        assert!(a != b);
        pool.free_all_blocks(None);
        assert_eq!(pool.stats().total_bytes, 0);
        pool.check().unwrap();
    }

    #[test]
    fn free_all_blocks_releases_a_block_parked_by_a_thread_still_running() {
        let pool = leaked();
        let (parked_tx, parked_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        std::thread::scope(|s| {
            s.spawn(move || {
                park(pool, malloc(pool, 1 << 20, 3));
                parked_tx.send(()).unwrap();
                done_rx.recv().unwrap();
            });
            parked_rx.recv().unwrap();
            pool.free_all_blocks(None);
            let s = pool.stats();
            assert_eq!((s.total_bytes, s.backend_frees), (0, 1));
            done_tx.send(()).unwrap();
        });
        assert_eq!(pool.backend().counters().live_bytes, 0);
    }

    /// The lock-free cached pair against a thread that settles, releases and mallocs
    /// in the same arena all the while: no block is ever handed out twice (a set of
    /// live addresses), the invariants hold, and the counts add up.
    #[test]
    fn lock_free_pairs_and_observers_never_share_a_block() {
        let (owners, looks) = if cfg!(miri) { (2, 12) } else { (3, 4_000) };
        let pool = leaked();
        let live = Mutex::new(std::collections::HashSet::new());
        let take = |b: &Block| assert!(live.lock().unwrap().insert(b.addr()), "handed out twice");
        let give = |b: &Block| assert!(live.lock().unwrap().remove(&b.addr()));
        let stop = AtomicBool::new(false);
        let settled = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for t in 0..owners {
                let (take, give, stop) = (&take, &give, &stop);
                s.spawn(move || {
                    // Owners share key 0 with the observer; each keeps one block of
                    // its own size live beside its pairs.
                    let size = 4096 << t;
                    let keep = malloc(pool, size, 0);
                    take(&keep);
                    while !stop.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            let b = malloc(pool, size, 0);
                            take(&b);
                            give(&b);
                            park(pool, b);
                        }
                    }
                    give(&keep);
                    park(pool, keep);
                });
            }
            s.spawn(|| {
                for i in 0..looks {
                    let st = pool.stats();
                    assert_eq!(st.used_bytes + st.free_bytes, st.total_bytes);
                    match i % 3 {
                        0 => pool.free_all_blocks(None),
                        1 => {
                            let b = pool.malloc(4096, 0).unwrap();
                            take(&b);
                            give(&b);
                            pool.free(b).unwrap();
                        }
                        _ => {
                            if pool.settle_all() {
                                settled.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                stop.store(true, Ordering::Relaxed);
            });
        });
        let st = stats_after_threads(pool);
        assert_eq!(st.used_bytes, 0);
        assert_eq!(st.mallocs, st.frees);
        assert!(st.cache_hits <= st.mallocs);
        pool.check().unwrap();
        if barrier::ready() {
            assert!(pool.unlocked_pairs() > 0, "the lock-free path never ran");
        }
        eprintln!(
            "lock-free pairs {}, of {} mallocs; observer settled a block {} times",
            pool.unlocked_pairs(),
            st.mallocs,
            settled.load(Ordering::Relaxed)
        );
        pool.free_all_blocks(None);
        assert_eq!(pool.stats().total_bytes, 0);
        assert_eq!(pool.backend().counters().bad_frees, 0);
    }

    #[test]
    fn threads_parking_at_random_keep_every_invariant() {
        let (threads, steps) = if cfg!(miri) { (2, 60) } else { (4, 3000) };
        let pool = leaked();
        std::thread::scope(|s| {
            for t in 0..threads {
                s.spawn(move || {
                    let mut rng = 0x2545_F491_4F6C_DD1Du64 ^ t as u64;
                    let mut live: Vec<Block> = Vec::new();
                    for _ in 0..steps {
                        let r = xorshift(&mut rng);
                        // Keys shared between threads, so blocks cross arenas' users.
                        let key = (r >> 40) % 3;
                        if live.len() < 16 && (live.is_empty() || r % 100 < 55) {
                            let size = 512 << ((r >> 8) % 8);
                            live.push(malloc(pool, size as usize, key));
                        } else {
                            let b = live.swap_remove((r >> 8) as usize % live.len());
                            park(pool, b);
                        }
                        if r.is_multiple_of(211) {
                            let s = pool.stats();
                            assert_eq!(s.used_bytes + s.free_bytes, s.total_bytes);
                        }
                    }
                    for b in live {
                        park(pool, b);
                    }
                });
            }
        });
        let s = stats_after_threads(pool);
        assert_eq!(s.used_bytes, 0);
        assert_eq!(s.mallocs, s.frees);
        pool.check().unwrap();
        pool.free_all_blocks(None);
        assert_eq!(pool.stats().total_bytes, 0);
        assert_eq!(pool.backend().counters().bad_frees, 0);
    }
}
