//! Blocks given back while other streams may still use them (PyTorch's
//! `record_stream`): the owner records a *fence* on each stream that used the block
//! (a CUDA event, an opaque `u64` here) and gives the block back with
//! [`Pool::free_after`]; the block then *awaits*: it counts as freed, but stays out
//! of the best-fit index (and unmerged) until the backend says every one of its
//! fences is done ([`Backend::fence_done`], a query that never blocks).
//!
//! # When fences are polled
//! - A malloc that misses polls its arena's awaiting blocks before growing the pool
//!   (a completed one may fit), with one query per fence at most and none for the
//!   later fences of a stream whose earlier fence is not done yet (a stream completes
//!   its work in order). A hit polls nothing.
//! - [`Pool::free_all_blocks`] polls every arena first (releasing what completed).
//! - Out of memory (limit or backend) waits for every awaiting block
//!   ([`Backend::fence_wait`], a host synchronisation counted in
//!   [`PoolStats::fence_syncs`](super::PoolStats::fence_syncs)) before it releases the
//!   cache and retries; so does the pool's drop. Nothing else waits: in the steady
//!   state there is no host synchronisation.
//!
//! # A fence that cannot be queried is not done
//! A query or a wait that fails (every `cuEventQuery` fails while another thread
//! holds a global-mode capture, though the stream work goes on) leaves its block
//! awaiting: the next poll asks again. A fence that never answers (a dead context)
//! keeps its block for good; at the pool's drop such a block is leaked (its memory is
//! never given back), never freed under work that may still use it.
//!
//! A block given back with no fence ([`Pool::free`]) never touches any of this: the
//! miss path reads one counter (`n_awaiting`, 0) and nothing else.
//!
//! # Data
//! Each arena keeps its own list behind a mutex of its own (not the arena's spin
//! lock: polls call the backend): the awaiting blocks in a slab with a count of
//! fences left, and the fences in recording order, each naming its block. Both
//! vectors keep their capacity, so the steady state allocates nothing.

use std::sync::atomic::Ordering;
use std::sync::{MutexGuard, PoisonError};

use super::stream_arena::Arena;
use super::{Backend, Block, FreeError, Pool, RawBlock};

/// A fence given with a block to [`Pool::free_after`]: a token of the pool's backend
/// (for the CUDA pools, an event recorded on the stream) and the stream key it was
/// recorded on (fences of one stream complete in the order they were recorded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StreamFence {
    /// The stream the fence was recorded on, as a stream key.
    pub stream: u64,
    /// The backend's token ([`Backend::fence_done`] takes it).
    pub fence: u64,
}

/// How many streams one poll remembers as not done yet (their later fences are
/// skipped without a query); past that, fences are queried one by one.
const BLOCKED_STREAMS: usize = 8;

#[derive(Debug)]
struct PendingFence {
    stream: u64,
    fence: u64,
    /// Index of its block in `Awaiting::blocks`.
    block: u32,
}

#[derive(Debug, Clone, Copy)]
struct WaitingBlock {
    raw: RawBlock,
    /// Fences of the block not done yet.
    left: u32,
}

/// One arena's awaiting blocks and their fences.
#[derive(Debug, Default)]
pub(super) struct Awaiting {
    fences: Vec<PendingFence>,
    blocks: Vec<WaitingBlock>,
    /// Free slots of `blocks`.
    vacant: Vec<u32>,
}

impl Arena {
    /// The addresses of the blocks waiting for other streams (for snapshots).
    pub(super) fn awaiting_addresses(&self) -> Vec<u64> {
        let list = self.awaiting_list();
        list.blocks
            .iter()
            .enumerate()
            .filter(|(i, _)| !list.vacant.contains(&(*i as u32)))
            .map(|(_, w)| w.raw.addr)
            .collect()
    }

    fn awaiting_list(&self) -> MutexGuard<'_, Awaiting> {
        self.awaiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<B: Backend> Pool<B> {
    /// Gives `block` back once the stream work behind `fences` is done: until then the
    /// block counts as freed but is not handed out again (see the module doc of
    /// `awaiting` for when fences are polled). With no fence it is [`free`](Self::free).
    /// The pool releases each fence ([`Backend::fence_release`]) once, whatever the
    /// outcome; fences of a refused block at once.
    ///
    /// # Errors
    /// As [`free`](Self::free): the block of another pool, or one that is not live,
    /// is handed back and the pool is unchanged.
    pub fn free_after(&self, block: Block, fences: &[StreamFence]) -> Result<(), FreeError> {
        if block.size != 0 && block.pool != self.id {
            self.release_fences(fences);
            return Err(FreeError::OtherPool(block));
        }
        let raw = RawBlock {
            addr: block.addr,
            size: block.size,
            key: block.key,
            chunk: block.chunk,
            arena: block.arena,
        };
        if self.free_raw_after(raw, fences) {
            Ok(())
        } else {
            Err(FreeError::NotLive(block))
        }
    }

    /// [`free_after`](Self::free_after) of the block `raw` came from (a block of this
    /// pool, given back once); `false` when `raw` names no live chunk.
    pub(crate) fn free_raw_after(&self, raw: RawBlock, fences: &[StreamFence]) -> bool {
        if fences.is_empty() {
            return self.free_raw(raw);
        }
        if raw.size == 0 {
            self.release_fences(fences);
            return true;
        }
        let Some(arena) = self.arenas.get(raw.arena) else {
            self.release_fences(fences);
            return false;
        };
        let Ok(n) = u32::try_from(fences.len()) else {
            // Four billion streams: wait for them rather than keep count. A wait that
            // fails leaves the block in use for good (leaked), never handed out.
            if self.wait_fences(fences) {
                return self.free_raw(raw);
            }
            return true;
        };
        // Counted before the block can be seen awaiting, so no poll sees a fence
        // released before it was counted recorded.
        self.fences_recorded
            .fetch_add(u64::from(n), Ordering::Relaxed);
        let mut list = arena.awaiting_list();
        if arena.lock().defer(raw.chunk, raw.addr, raw.size).is_err() {
            drop(list);
            self.release_fences(fences);
            return false;
        }
        let w = WaitingBlock { raw, left: n };
        let slot = match list.vacant.pop() {
            Some(i) => {
                list.blocks[i as usize] = w;
                i
            }
            None => {
                list.blocks.push(w);
                (list.blocks.len() - 1) as u32
            }
        };
        for f in fences {
            list.fences.push(PendingFence {
                stream: f.stream,
                fence: f.fence,
                block: slot,
            });
        }
        arena.n_awaiting.fetch_add(1, Ordering::Release);
        true
    }

    fn release_fences(&self, fences: &[StreamFence]) {
        for f in fences {
            self.backend.fence_release(f.fence);
        }
    }

    /// Waits for every fence and releases each; `true` when every wait succeeded.
    fn wait_fences(&self, fences: &[StreamFence]) -> bool {
        let mut all = true;
        for f in fences {
            all &= self.backend.fence_wait(f.fence);
            self.fence_waits.fetch_add(1, Ordering::Relaxed);
            self.backend.fence_release(f.fence);
        }
        all
    }

    /// Takes back into their arenas the awaiting blocks whose fences are all done
    /// (queries only, no wait); `true` if any went back.
    pub fn poll_awaiting(&self) -> bool {
        let mut any = false;
        for arena in self.arenas.iter() {
            any |= self.poll_arena(arena, false);
        }
        any
    }

    /// Waits for the fences of every awaiting block (a host synchronisation, counted
    /// in [`PoolStats::fence_syncs`](super::PoolStats::fence_syncs)) and takes the
    /// blocks back; `true` if any went back. A block with a fence whose wait failed
    /// stays awaiting (it is not known to be done).
    pub fn wait_awaiting(&self) -> bool {
        let mut any = false;
        for arena in self.arenas.iter() {
            any |= self.poll_arena(arena, true);
        }
        any
    }

    /// Counts a host synchronisation that the pool's owner made in place of a fence
    /// (a fence it could not record).
    pub(crate) fn count_sync(&self) {
        self.fence_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Polls (or, with `wait`, waits for) the fences of `arena`'s awaiting blocks and
    /// frees the blocks whose fences are all done; `true` if any was freed. No arena
    /// lock is held on entry.
    pub(super) fn poll_arena(&self, arena: &Arena, wait: bool) -> bool {
        if arena.n_awaiting.load(Ordering::Acquire) == 0 {
            return false;
        }
        let mut list = arena.awaiting_list();
        let Awaiting {
            fences,
            blocks,
            vacant,
        } = &mut *list;
        let mut blocked = [0u64; BLOCKED_STREAMS];
        let mut n_blocked = 0;
        let mut freed = 0u64;
        fences.retain(|f| {
            let done = if wait {
                self.fence_waits.fetch_add(1, Ordering::Relaxed);
                self.backend.fence_wait(f.fence)
            } else if blocked[..n_blocked].contains(&f.stream) {
                false
            } else {
                let d = self.backend.fence_done(f.fence);
                if !d && n_blocked < BLOCKED_STREAMS {
                    blocked[n_blocked] = f.stream;
                    n_blocked += 1;
                }
                d
            };
            if !done {
                return true;
            }
            self.backend.fence_release(f.fence);
            let Some(b) = blocks.get_mut(f.block as usize) else {
                return false;
            };
            b.left -= 1;
            if b.left == 0 {
                let raw = b.raw;
                // Deferred by `free_raw_after` and freed only here: it is awaiting.
                let _ = arena.lock().free_awaiting(raw.chunk, raw.addr, raw.size);
                vacant.push(f.block);
                freed += 1;
            }
            false
        });
        if freed > 0 {
            arena.n_awaiting.fetch_sub(freed, Ordering::Release);
        }
        freed > 0
    }

    /// At the pool's drop, after [`wait_awaiting`](Self::wait_awaiting): the blocks
    /// still awaiting have fences that did not answer, so their memory may still be
    /// in use. They stay deferred (their chunks are never whole, so never given to
    /// the backend: leaked), and only their fences go back, the pool being done with
    /// them. Returns how many blocks were left so.
    pub(super) fn abandon_awaiting(&mut self) -> usize {
        let mut left = 0;
        for arena in self.arenas.iter_mut() {
            let list = arena
                .awaiting
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner);
            for f in list.fences.drain(..) {
                self.backend.fence_release(f.fence);
            }
            left += list.blocks.len() - list.vacant.len();
            list.blocks.clear();
            list.vacant.clear();
        }
        left
    }

    /// Whether any block of any arena awaits its streams.
    pub(super) fn any_awaiting(&self) -> bool {
        self.arenas
            .iter()
            .any(|a| a.n_awaiting.load(Ordering::Acquire) != 0)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::{FakeBackend, HostBackend, MallocError};
    use super::*;

    fn fence(pool: &Pool<Arc<HostBackend>>, stream: u64) -> StreamFence {
        StreamFence {
            stream,
            fence: pool.backend().new_fence(),
        }
    }

    fn pool() -> Pool<Arc<HostBackend>> {
        Pool::new(Arc::new(HostBackend::new()))
    }

    #[test]
    fn a_block_awaiting_a_stream_is_not_reused_until_its_fence_is_done() {
        let pool = pool();
        let a = pool.malloc(4096, 1).unwrap();
        let addr = a.addr();
        let f = fence(&pool, 2);
        pool.free_after(a, &[f]).unwrap();
        let s = pool.stats();
        assert_eq!(
            (s.used_bytes, s.awaiting_blocks, s.awaiting_bytes),
            (0, 1, 4096)
        );
        assert_eq!((s.stream_fences, s.fence_syncs, s.frees), (1, 0, 1));
        // The snapshot shows it pending, not allocated, as the statistics count it.
        let snap = pool.snapshot();
        let block = snap
            .segments
            .iter()
            .flat_map(|s| &s.blocks)
            .find(|b| b.address == addr)
            .unwrap();
        assert!(block.in_use && block.pending_free, "{block:?}");
        assert_eq!(snap.allocated_bytes(), s.used_bytes);
        #[cfg(feature = "serde")]
        assert!(snap
            .to_json()
            .contains("\"state\": \"active_awaiting_free\""));
        // Not done: a malloc of the same size misses, polls, and grows elsewhere.
        let b = pool.malloc(4096, 1).unwrap();
        assert_ne!(
            b.addr(),
            addr,
            "a block in use by another stream was handed out"
        );
        assert_eq!(pool.backend().counters().fence_queries, 1);
        pool.backend().complete_fence(f.fence);
        // Done: the next miss takes it back and hands it out.
        let c = pool.malloc(4096, 1).unwrap();
        assert_eq!(c.addr(), addr, "the completed block is reused");
        let s = pool.stats();
        assert_eq!(
            (s.awaiting_blocks, s.awaiting_bytes, s.fence_syncs),
            (0, 0, 0)
        );
        assert_eq!((s.mallocs, s.frees, s.backend_allocs), (3, 1, 2));
        pool.free(b).unwrap();
        pool.free(c).unwrap();
        pool.check().unwrap();
        let k = pool.backend().counters();
        assert_eq!(
            (k.live_fences, k.bad_fence_releases, k.fence_waits),
            (0, 0, 0)
        );
    }

    #[test]
    fn a_block_waits_for_every_recorded_stream() {
        let pool = pool();
        let a = pool.malloc(512, 1).unwrap();
        let addr = a.addr();
        let (f2, f3) = (fence(&pool, 2), fence(&pool, 3));
        pool.free_after(a, &[f2, f3]).unwrap();
        pool.backend().complete_fence(f3.fence);
        assert!(!pool.poll_awaiting(), "stream 2 has not passed its fence");
        pool.backend().complete_fence(f2.fence);
        assert!(pool.poll_awaiting());
        assert_eq!(pool.free_chunks(1), [(addr, 512)]);
        pool.check().unwrap();
        assert_eq!(pool.backend().counters().live_fences, 0);
    }

    #[test]
    fn later_fences_of_a_stream_not_done_are_not_queried() {
        let pool = pool();
        let blocks: Vec<Block> = (0..4).map(|_| pool.malloc(512, 1).unwrap()).collect();
        let fs: Vec<StreamFence> = (0..4).map(|_| fence(&pool, 9)).collect();
        for (b, f) in blocks.into_iter().zip(&fs) {
            pool.free_after(b, &[*f]).unwrap();
        }
        assert!(!pool.poll_awaiting());
        assert_eq!(
            pool.backend().counters().fence_queries,
            1,
            "one query per stream"
        );
        for f in &fs[..2] {
            pool.backend().complete_fence(f.fence);
        }
        assert!(pool.poll_awaiting());
        // Two done, then the third not: three queries.
        assert_eq!(pool.backend().counters().fence_queries, 4);
        assert_eq!(pool.stats().awaiting_blocks, 2);
        assert!(pool.wait_awaiting());
        let s = pool.stats();
        assert_eq!((s.awaiting_blocks, s.fence_syncs), (0, 2));
        pool.check().unwrap();
    }

    #[test]
    fn out_of_memory_waits_for_awaiting_blocks_then_retries() {
        let pool = Pool::new(Arc::new(HostBackend::with_capacity(8192)));
        let a = pool.malloc(8192, 1).unwrap();
        let f = fence(&pool, 2);
        pool.free_after(a, &[f]).unwrap();
        // Another arena needs the memory: waited for, released, retried.
        let b = pool.malloc(8192, 5).unwrap();
        let s = pool.stats();
        assert_eq!((s.fence_syncs, s.oom_retries, s.awaiting_blocks), (1, 1, 0));
        pool.free(b).unwrap();
        pool.check().unwrap();
        // With nothing awaiting, out of memory is reported as before.
        let c = pool.malloc(8192, 5).unwrap();
        assert!(matches!(
            pool.malloc(512, 5),
            Err(MallocError::OutOfMemory(_))
        ));
        pool.free(c).unwrap();
    }

    #[test]
    fn dropping_the_pool_waits_for_awaiting_blocks_and_frees_everything() {
        let backend = Arc::new(HostBackend::new());
        {
            let pool = Pool::new(backend.clone());
            let a = pool.malloc(1 << 20, 1).unwrap();
            let f = StreamFence {
                stream: 2,
                fence: backend.new_fence(),
            };
            pool.free_after(a, &[f]).unwrap();
        }
        let k = backend.counters();
        assert_eq!((k.live_bytes, k.live_fences, k.fence_waits), (0, 0, 1));
    }

    #[test]
    fn free_all_blocks_releases_blocks_whose_fences_completed() {
        let pool = pool();
        let a = pool.malloc(4096, 1).unwrap();
        let f = fence(&pool, 2);
        pool.free_after(a, &[f]).unwrap();
        pool.free_all_blocks(None);
        assert_eq!(pool.stats().total_bytes, 4096, "still awaiting: kept");
        pool.backend().complete_fence(f.fence);
        pool.free_all_blocks(None);
        let s = pool.stats();
        assert_eq!((s.total_bytes, s.fence_syncs), (0, 0));
    }

    #[test]
    fn an_awaiting_block_merges_with_free_neighbours_once_done() {
        let pool = pool();
        let whole = pool.malloc(3 * 512, 1).unwrap();
        let base = whole.addr();
        pool.free(whole).unwrap();
        let (a, b, c) = (
            pool.malloc(512, 1).unwrap(),
            pool.malloc(512, 1).unwrap(),
            pool.malloc(512, 1).unwrap(),
        );
        let f = fence(&pool, 2);
        pool.free_after(b, &[f]).unwrap();
        pool.free(a).unwrap();
        pool.free(c).unwrap();
        // The neighbours did not merge across the awaiting block.
        assert_eq!(pool.free_chunks(1).len(), 2);
        pool.check().unwrap();
        pool.backend().complete_fence(f.fence);
        assert!(pool.poll_awaiting());
        assert_eq!(pool.free_chunks(1), [(base, 3 * 512)]);
        pool.check().unwrap();
    }

    #[test]
    fn a_refused_block_releases_its_fences_and_an_empty_fence_list_is_a_plain_free() {
        let pool = pool();
        let other = Pool::new(Arc::new(HostBackend::new()));
        let a = other.malloc(512, 0).unwrap();
        let f = fence(&pool, 2);
        let e = pool.free_after(a, &[f]).unwrap_err();
        assert!(matches!(e, FreeError::OtherPool(_)));
        assert_eq!(pool.backend().counters().live_fences, 0);
        if let FreeError::OtherPool(a) = e {
            other.free_after(a, &[]).unwrap();
        }
        assert_eq!(other.stats().n_free_blocks, 1);
        assert_eq!(other.stats().stream_fences, 0);
    }

    /// Threads freeing with fences, completing them, and mallocing in the same arena:
    /// no block is handed out while a fence of it is pending, and everything adds up.
    #[test]
    fn threads_free_after_fences_and_nothing_is_handed_out_early() {
        let (threads, steps) = if cfg!(miri) { (2, 40) } else { (4, 2000) };
        let backend = Arc::new(FakeBackend::checked());
        let pool = Pool::new(backend.clone());
        let pending = std::sync::Mutex::new(Vec::<(u64, u64)>::new());
        std::thread::scope(|s| {
            for t in 0..threads {
                let (pool, backend, pending) = (&pool, &backend, &pending);
                s.spawn(move || {
                    let mut rng = 0x9E37_79B9_7F4A_7C15u64 ^ t;
                    for _ in 0..steps {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let b = pool.malloc(512 << (rng % 4), 1).unwrap();
                        {
                            let p = pending.lock().unwrap();
                            assert!(
                                !p.iter().any(|&(a, _)| a == b.addr()),
                                "handed out while awaiting"
                            );
                        }
                        if rng.is_multiple_of(3) {
                            pool.free(b).unwrap();
                        } else {
                            let f = backend.new_fence();
                            pending.lock().unwrap().push((b.addr(), f));
                            pool.free_after(
                                b,
                                &[StreamFence {
                                    stream: t,
                                    fence: f,
                                }],
                            )
                            .unwrap();
                        }
                        if rng.is_multiple_of(5) {
                            // The "stream" passes the oldest fences.
                            let mut p = pending.lock().unwrap();
                            let n = p.len() / 2;
                            for (_, f) in p.drain(..n) {
                                backend.complete_fence(f);
                            }
                        }
                    }
                });
            }
        });
        pool.wait_awaiting();
        let s = pool.stats();
        assert_eq!(
            (s.used_bytes, s.awaiting_blocks, s.awaiting_bytes),
            (0, 0, 0)
        );
        assert_eq!(s.mallocs, s.frees);
        pool.check().unwrap();
        let k = backend.counters();
        assert_eq!((k.live_fences, k.bad_fence_releases), (0, 0));
        pool.free_all_blocks(None);
        assert_eq!(backend.counters().live_bytes, 0);
    }
}
