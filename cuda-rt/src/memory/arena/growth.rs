//! A miss that grows the pool: new backend memory, checked against the limit, with
//! the release-and-retry on out of memory and the error that reports it.

use std::sync::atomic::Ordering;

use super::bins::{SegmentCut, SegmentPlan, SlabFull};
use super::error::TOO_MANY_CHUNKS;
use super::stream_arena::Arena;
use super::{Backend, BackendError, Block, MallocError, Pool, SegmentSpec};
use crate::error::{OutOfMemory, OutOfMemoryCause};

impl<B: Backend> Pool<B> {
    /// A miss: new backend memory for `rounded` bytes, with the growth policy and the
    /// limit / out-of-memory retries. No arena lock is held on entry.
    #[cold]
    pub(super) fn grow(
        &self,
        arena: &Arena,
        requested: usize,
        rounded: u64,
        release_smaller: bool,
    ) -> Result<Block, MallocError> {
        if release_smaller {
            let mut out = Vec::new();
            arena
                .lock()
                .release_whole_where(&mut out, |size| size < rounded);
            self.give_back(&mut out);
        }
        let spec = if self.expandable.load(Ordering::Relaxed) {
            self.backend.segment_spec()
        } else {
            None
        };
        let mut retried = false;
        loop {
            let grown = match spec {
                Some(spec) => match self.try_extend(arena, rounded, spec) {
                    Ok(r) => return r,
                    Err(g) => Err(g),
                },
                None => self.try_grow(rounded, arena.key),
            };
            let (cause, limit) = match grown {
                Ok(addr) => {
                    let added = arena.lock().add_allocation(addr, rounded);
                    return match added {
                        Ok(chunk) => Ok(self.block(arena, chunk, addr, rounded)),
                        Err(SlabFull) => {
                            self.give_back(&mut vec![(addr, rounded)]);
                            Err(MallocError::TooMany(TOO_MANY_CHUNKS))
                        }
                    };
                }
                Err(Growth::Limit(limit)) => (OutOfMemoryCause::Limit, limit),
                Err(Growth::Backend(BackendError::OutOfMemory(driver))) => {
                    let cause = match driver {
                        Some(d) => OutOfMemoryCause::Driver(d),
                        None => OutOfMemoryCause::Backend,
                    };
                    (cause, self.limit())
                }
                Err(Growth::Backend(BackendError::Other(e))) => {
                    return Err(MallocError::Backend(e));
                }
            };
            if retried {
                return Err(MallocError::OutOfMemory(self.oom(
                    requested,
                    Some(rounded),
                    cause,
                    limit,
                )));
            }
            retried = true;
            self.oom_retries.fetch_add(1, Ordering::Relaxed);
            // Blocks awaiting other streams are memory too: wait for them (a host
            // synchronisation, the only one) so the release below can give them back.
            // A block whose wait failed stays awaiting (not known to be done): the
            // retry then does without it.
            if self.any_awaiting() {
                self.wait_awaiting();
            }
            self.free_all_blocks(None);
        }
    }

    /// Counts `size` more reserved bytes, refused past the limit; returns the old count.
    fn reserve(&self, size: u64) -> Result<u64, Growth> {
        let limit = self.limit();
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                let new = r.checked_add(size)?;
                (limit == 0 || new <= limit).then_some(new)
            })
            .map_err(|_| Growth::Limit(limit))
    }

    /// A miss with expandable segments: maps more memory at the end of one of the
    /// arena's segments (reserving a new segment when none has room), then serves the
    /// request from the cache. The outer `Err` is a growth the caller may retry after
    /// releasing the cache; the inner one is final.
    fn try_extend(
        &self,
        arena: &Arena,
        rounded: u64,
        spec: SegmentSpec,
    ) -> Result<Result<Block, MallocError>, Growth> {
        // Between planning and mapping no lock is held: another thread's cache hit may
        // take the free tail the plan counted on, leaving the growth too short. What
        // was mapped stays cached; plan again (each round maps memory, so a few do).
        for _ in 0..8 {
            if let Some(r) = self.try_extend_once(arena, rounded, spec)?.transpose() {
                return Ok(r);
            }
        }
        Ok(Err(MallocError::Backend(
            "an expandable segment grew but other threads kept taking its tail".into(),
        )))
    }

    /// One round of [`try_extend`](Self::try_extend); `Ok(Ok(None))`: the growth was
    /// too short (see there).
    fn try_extend_once(
        &self,
        arena: &Arena,
        rounded: u64,
        spec: SegmentSpec,
    ) -> Result<Result<Option<Block>, MallocError>, Growth> {
        let gran = spec.granularity.max(1);
        let planned = {
            let mut bins = arena.lock();
            // Another thread may have grown the arena meanwhile.
            match self.hit(&mut bins, arena, rounded) {
                Ok(Some(b)) => return Ok(Ok(Some(b))),
                Ok(None) => {}
                Err(e) => return Ok(Err(e)),
            }
            bins.plan_extend(rounded, gran)
        };
        let plan = match planned {
            Some(p) => p,
            None => {
                let too_big = || Growth::Backend(BackendError::OutOfMemory(None));
                let len = rounded.checked_add(gran - 1).ok_or_else(too_big)? & !(gran - 1);
                let size = spec.reserve.max(len);
                let base = self
                    .backend
                    .segment_reserve(size)
                    .map_err(Growth::Backend)?;
                match arena.lock().add_segment(base, size, gran, len) {
                    Some(p) => p,
                    None => {
                        self.backend.segment_release(base, size);
                        return Err(too_big());
                    }
                }
            }
        };
        self.punch_for(arena, plan);
        let fail = |g: Growth| {
            arena.lock().unbusy(plan);
            Err(g)
        };
        let old = match self.reserve(plan.len) {
            Ok(old) => old,
            Err(g) => return fail(g),
        };
        if let Err(e) = self.backend.segment_map(plan.base, plan.addr, plan.len) {
            self.reserved.fetch_sub(plan.len, Ordering::AcqRel);
            return fail(Growth::Backend(e));
        }
        self.peak_reserved
            .fetch_max(old + plan.len, Ordering::Relaxed);
        self.backend_allocs.fetch_add(1, Ordering::Relaxed);
        let mut bins = arena.lock();
        if bins.extend(plan).is_err() {
            drop(bins);
            self.unmap(plan);
            return Ok(Err(MallocError::TooMany(TOO_MANY_CHUNKS)));
        }
        Ok(self.hit(&mut bins, arena, rounded))
    }

    /// Before `plan` maps: unmaps as many whole free granules of `arena`'s segments as
    /// the growth would add past the peak of reserved memory (none next to where it
    /// maps), so that the peak rises only by what the cache's free granules cannot pay
    /// for. A growth that stays under the peak punches nothing: the cached granules
    /// stay mapped for later hits, and no unmap waits for queued work. Cold: only a
    /// growth that maps comes here.
    #[cold]
    fn punch_for(&self, arena: &Arena, plan: SegmentPlan) {
        let after = self
            .reserved
            .load(Ordering::Acquire)
            .saturating_add(plan.len);
        let past_peak = after.saturating_sub(self.peak_reserved.load(Ordering::Relaxed));
        if past_peak == 0 {
            return;
        }
        let mut cuts = Vec::new();
        arena.lock().punch_for(plan, past_peak, &mut cuts);
        if !cuts.is_empty() {
            self.holes_punched
                .fetch_add(cuts.len() as u64, Ordering::Relaxed);
            self.give_back_segments(&mut cuts, Some(arena), Some(plan.base));
        }
    }

    /// Unmaps what `plan` mapped (a growth that could not be recorded).
    #[cold]
    fn unmap(&self, plan: SegmentPlan) {
        self.backend.segment_unmap(plan.base, plan.addr, plan.len);
        self.reserved.fetch_sub(plan.len, Ordering::AcqRel);
        self.backend_frees.fetch_add(1, Ordering::Relaxed);
    }

    /// Unmaps every whole free granule of `arena`'s expandable segments (free tails and
    /// holes alike) and gives back the segments left empty (`cuts` is scratch space,
    /// left empty).
    pub(super) fn trim_segments(&self, arena: &Arena, cuts: &mut Vec<SegmentCut>) {
        if self.backend.segment_spec().is_some() {
            arena.lock().trim_segments(cuts);
            self.give_back_segments(cuts, Some(arena), None);
        }
    }

    /// Gives the backend what [`trim_segments`](Self::trim_segments) or a punch cut,
    /// then marks the cut segments of `arena` (`None`: the pool is being dropped)
    /// growable again, but for the one at `keep` (a growth still holds it).
    pub(super) fn give_back_segments(
        &self,
        cuts: &mut Vec<SegmentCut>,
        arena: Option<&Arena>,
        keep: Option<u64>,
    ) {
        for cut in cuts.iter() {
            match *cut {
                SegmentCut::Unmap { base, addr, len } => {
                    self.backend.segment_unmap(base, addr, len);
                    self.reserved.fetch_sub(len, Ordering::AcqRel);
                    self.backend_frees.fetch_add(1, Ordering::Relaxed);
                }
                SegmentCut::Release { base, size } => self.backend.segment_release(base, size),
            }
        }
        if let Some(arena) = arena.filter(|_| !cuts.is_empty()) {
            let mut bins = arena.lock();
            for cut in cuts.iter() {
                match *cut {
                    SegmentCut::Unmap { base, .. } if Some(base) != keep => bins.unbusy_base(base),
                    _ => {}
                }
            }
        }
        cuts.clear();
    }

    /// Reserves `size` against the limit, then asks the backend for memory of the
    /// arena of stream key `key` (where the block is first used).
    fn try_grow(&self, size: u64, key: u64) -> Result<u64, Growth> {
        let old = self.reserve(size)?;
        let Ok(len) = usize::try_from(size) else {
            self.reserved.fetch_sub(size, Ordering::AcqRel);
            return Err(Growth::Backend(BackendError::OutOfMemory(None)));
        };
        match self.backend.alloc_for(len, key) {
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

    /// The error for a request of `requested` bytes (`rounded` up, `None` when
    /// rounding overflowed) that `cause` refused under `limit` (0: none). The pool
    /// does not know its device: `device` is `None` until a front fills it in.
    #[cold]
    pub(super) fn oom(
        &self,
        requested: usize,
        rounded: Option<u64>,
        cause: OutOfMemoryCause,
        limit: u64,
    ) -> Box<OutOfMemory> {
        let s = self.stats();
        Box::new(OutOfMemory {
            requested: requested as u64,
            rounded,
            device: None,
            in_use: s.used_bytes,
            cached: s.free_bytes,
            limit: (limit != 0).then_some(limit),
            cause,
        })
    }
}

enum Growth {
    /// The limit in force refused.
    Limit(u64),
    Backend(BackendError),
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::super::FakeBackend;
    use super::*;

    const MIB: usize = 1 << 20;

    /// A checked fake backend with 2 MiB granules and `reserve` bytes per segment.
    fn backend(reserve: u64) -> Arc<FakeBackend> {
        Arc::new(FakeBackend::checked().with_segments(SegmentSpec {
            granularity: 2 << 20,
            reserve,
        }))
    }

    fn pool(b: &Arc<FakeBackend>) -> Pool<Arc<FakeBackend>> {
        let p = Pool::new(b.clone());
        p.set_expandable_segments(true);
        assert!(p.expandable_segments());
        p
    }

    /// A backend that records the arena key of each growth (its memory from a
    /// counting fake backend).
    #[derive(Default)]
    struct Keyed {
        inner: FakeBackend,
        keys: std::sync::Mutex<Vec<u64>>,
    }

    impl Backend for Keyed {
        fn alloc(&self, _: usize) -> Result<u64, BackendError> {
            Err(BackendError::Other(
                "the pool grows through alloc_for".into(),
            ))
        }
        fn alloc_for(&self, size: usize, key: u64) -> Result<u64, BackendError> {
            self.keys.lock().unwrap().push(key);
            self.inner.alloc(size)
        }
        fn free(&self, addr: u64, size: usize) {
            self.inner.free(addr, size)
        }
    }

    /// A stream-ordered backend allocates on a stream: the pool names the arena that
    /// grows (the malloc's stream), whatever thread or stream is current, also on
    /// the retry after out of memory.
    #[test]
    fn a_miss_asks_the_backend_for_memory_of_its_own_arena() {
        let p = Pool::new(Keyed::default());
        let per_thread = 1 << 63 | 3;
        let a = p.malloc(MIB, 7).unwrap();
        let b = p.malloc(MIB, per_thread).unwrap();
        p.free(a).unwrap();
        p.set_limit(2 * MIB as u64);
        // Over the limit: the cached block of arena 7 goes back, and the retry grows
        // arena 9.
        let c = p.malloc(MIB, 9).unwrap();
        assert_eq!(p.stats().oom_retries, 1);
        assert_eq!(*p.backend().keys.lock().unwrap(), [7, per_thread, 9]);
        p.free(b).unwrap();
        p.free(c).unwrap();
        p.check().unwrap();
    }

    #[test]
    fn a_growing_request_extends_its_segment_in_place() {
        let b = backend(1 << 30);
        let p = pool(&b);
        let a = p.malloc(3 * MIB, 0).unwrap();
        let base = a.addr();
        assert_eq!(b.mapped(base), Some(4 << 20), "mapped at the granularity");
        p.free(a).unwrap();
        // Larger than anything cached: the free 4 MiB grow by one granule in place.
        let a = p.malloc(5 * MIB, 0).unwrap();
        assert_eq!(a.addr(), base, "served from the same segment, same start");
        assert_eq!(b.mapped(base), Some(6 << 20));
        let k = b.counters();
        assert_eq!((k.live_segments, k.segment_maps, k.allocs), (1, 2, 0));
        assert_eq!(p.stats().total_bytes, 6 << 20);
        p.free(a).unwrap();
        p.check().unwrap();
    }

    #[test]
    fn a_request_that_fits_the_mapped_granule_maps_nothing_more() {
        let b = backend(1 << 30);
        let p = pool(&b);
        let x = p.malloc(MIB, 0).unwrap();
        let y = p.malloc(MIB / 2, 0).unwrap();
        assert_eq!(y.addr(), x.addr() + MIB as u64);
        assert_eq!(b.counters().segment_maps, 1);
        p.free(x).unwrap();
        p.free(y).unwrap();
        p.check().unwrap();
    }

    #[test]
    fn releasing_unmaps_free_tails_from_a_granule_boundary_and_gives_back_empty_segments() {
        let b = backend(1 << 30);
        let p = pool(&b);
        let x = p.malloc(3 * MIB, 0).unwrap();
        let y = p.malloc(3 * MIB, 0).unwrap();
        let base = x.addr();
        assert_eq!(y.addr(), base + 3 * MIB as u64, "the segment grew under y");
        assert_eq!(b.mapped(base), Some(6 << 20));
        p.free(y).unwrap();
        p.free_all_blocks(None);
        // x ends at 3 MiB: the granule 2..4 MiB stays, 4..6 MiB goes.
        assert_eq!(b.mapped(base), Some(4 << 20));
        assert_eq!(p.stats().total_bytes, 4 << 20);
        p.check().unwrap();
        p.free(x).unwrap();
        p.free_all_blocks(None);
        assert_eq!(b.mapped(base), None, "the empty segment was released");
        let k = b.counters();
        assert_eq!(
            (k.live_bytes, k.live_segments, k.bad_segment_calls),
            (0, 0, 0)
        );
        assert_eq!(p.stats().total_bytes, 0);
        // And the pool grows again from nothing.
        p.free(p.malloc(MIB, 0).unwrap()).unwrap();
        p.check().unwrap();
    }

    #[test]
    fn a_request_larger_than_the_reserve_gets_a_segment_of_its_own() {
        let b = backend(8 << 20);
        let p = pool(&b);
        let big = p.malloc(20 * MIB, 0).unwrap();
        let small = p.malloc(MIB, 0).unwrap();
        assert_eq!(b.counters().live_segments, 2);
        assert_eq!(b.mapped(big.addr()), Some(20 << 20));
        p.free(big).unwrap();
        p.free(small).unwrap();
        p.check().unwrap();
    }

    #[test]
    fn a_map_out_of_memory_releases_other_arenas_tails_and_retries_once() {
        let b = backend(1 << 30);
        b.set_capacity(8 << 20);
        let p = pool(&b);
        p.free(p.malloc(6 * MIB, 1).unwrap()).unwrap();
        let x = p.malloc(4 * MIB, 2).unwrap();
        assert_eq!(p.stats().oom_retries, 1);
        assert_eq!(b.counters().live_bytes, 4 << 20);
        let e = p.malloc(6 * MIB, 3).unwrap_err();
        assert!(matches!(e, MallocError::OutOfMemory(_)), "{e}");
        p.free(x).unwrap();
        p.check().unwrap();
        assert_eq!(b.counters().bad_segment_calls, 0);
    }

    #[test]
    fn the_limit_counts_mapped_granules() {
        let b = backend(1 << 30);
        let p = pool(&b);
        p.set_limit(4 << 20);
        let x = p.malloc(3 * MIB, 0).unwrap();
        let e = p.malloc(2 * MIB, 0).unwrap_err();
        match e {
            MallocError::OutOfMemory(o) => assert!(matches!(o.cause, OutOfMemoryCause::Limit)),
            e => panic!("{e}"),
        }
        // The failed growth left the segment usable.
        let y = p.malloc(MIB, 0).unwrap();
        p.free(x).unwrap();
        p.free(y).unwrap();
        p.check().unwrap();
    }

    #[test]
    fn a_backend_without_segments_ignores_the_option() {
        let p = Pool::new(FakeBackend::checked());
        p.set_expandable_segments(true);
        assert!(!p.expandable_segments());
        p.free(p.malloc(MIB, 0).unwrap()).unwrap();
        assert_eq!(p.backend().counters().allocs, 1);
    }

    #[test]
    fn dropping_the_pool_unmaps_and_releases_every_segment() {
        let b = backend(16 << 20);
        let p = pool(&b);
        for k in 0..3 {
            let x = p.malloc(5 * MIB, k).unwrap();
            let y = p.malloc(7 * MIB, k).unwrap();
            p.free(x).unwrap();
            p.free(y).unwrap();
        }
        drop(p);
        let k = b.counters();
        assert_eq!(
            (k.live_bytes, k.live_segments, k.bad_segment_calls),
            (0, 0, 0)
        );
    }

    /// A batch that drifts by one around 32 with activations proportional to it:
    /// expandable segments stay within 10 % of the live peak, the plain pool does not.
    #[test]
    fn a_drifting_batch_stays_near_peak_live_with_segments_only() {
        let run = |expandable: bool| {
            let b = backend(1 << 40);
            let p = Pool::new(b.clone());
            p.set_expandable_segments(expandable);
            let mut batch = 32usize;
            let mut peak_live = 0u64;
            for step in 0..40usize {
                batch = if step % 3 == 0 {
                    batch + 1
                } else {
                    batch - 1 + step % 2 * 2
                };
                let sizes = [batch * MIB, batch * 3 * MIB, batch * MIB / 2];
                let blocks: Vec<_> = sizes.iter().map(|&s| p.malloc(s, 0).unwrap()).collect();
                peak_live = peak_live.max(sizes.iter().map(|&s| s as u64).sum());
                blocks.into_iter().for_each(|x| p.free(x).unwrap());
            }
            p.check().unwrap();
            p.stats().peak_total_bytes as f64 / peak_live as f64
        };
        let (plain, seg) = (run(false), run(true));
        assert!(seg <= 1.10, "expandable: {seg:.3}");
        assert!(plain > seg, "plain {plain:.3} vs expandable {seg:.3}");
    }

    #[test]
    fn threads_growing_one_arena_keep_it_consistent() {
        let b = backend(64 << 20);
        let p = Arc::new(pool(&b));
        let n = if cfg!(miri) { 20 } else { 400 };
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let p = p.clone();
                std::thread::spawn(move || {
                    let mut live = Vec::new();
                    for i in 0..n {
                        let s = ((i * 7 + t as usize * 13) % 23 + 1) * MIB / 4;
                        live.push(p.malloc(s, 0).unwrap());
                        if live.len() > 3 {
                            p.free(live.swap_remove(i % live.len())).unwrap();
                        }
                        if i % 50 == 49 {
                            p.free_all_blocks(None);
                        }
                    }
                    live.into_iter().for_each(|x| p.free(x).unwrap());
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        p.check().unwrap();
        p.free_all_blocks(None);
        let k = b.counters();
        assert_eq!(
            (k.live_bytes, k.live_segments, k.bad_segment_calls),
            (0, 0, 0)
        );
        assert_eq!(p.stats().total_bytes, 0);
    }
}
