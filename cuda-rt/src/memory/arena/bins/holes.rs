//! Holes in expandable segments: whole granules of free chunks given back (unmapped)
//! inside a segment's extent, and growths that map into them again.
//!
//! A hole is a chunk in [`State::Unmapped`]: it keeps its place in the segment's
//! chain (so neighbours stay linked by address) but is in no index, counts in no
//! reserved bytes, never merges with free chunks (the cached free merges only free
//! neighbours, so it needs no change) and merges with the holes beside it. Punching a
//! free chunk cuts it in up to three: a free head up to its first granule boundary,
//! the hole, and a free tail from its last boundary. Only free chunks are punched:
//! handed-out chunks and those awaiting other streams' work never are.
//!
//! A miss in expandable mode punches before it maps (see `Pool::set_expandable_segments`
//! and `growth.rs`): as many free granules as the growth maps, so a growth adds to
//! reserved memory only what the free granules could not pay for; a release punches
//! every free granule. The growth itself maps where that maps the least: at a
//! segment's end, or into a hole whose free neighbours make up the rest.

use super::segments::{SegmentCut, SegmentPlan};
use super::{Bins, Chunk, SlabFull, State, NIL};

/// `x` rounded up to a multiple of `g` (a power of two); `None` on overflow.
#[inline]
pub(in crate::memory::arena) fn align_up(x: u64, g: u64) -> Option<u64> {
    Some(x.checked_add(g - 1)? & !(g - 1))
}

/// The whole granules `lo..hi` of free chunk `chunk` of segment `seg`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Span {
    seg: usize,
    chunk: u32,
    lo: u64,
    hi: u64,
}

impl Bins {
    /// Where a growth for `want` bytes would map in hole `u` so that the hole's free
    /// neighbours and the mapped bytes serve it: `(addr, len)`, mapping the least (on
    /// the side of the larger neighbour, or the whole hole when both are needed).
    /// `None` when even the whole hole with both neighbours is too small.
    pub(super) fn hole_plan(&self, u: u32, want: u64, gran: u64) -> Option<(u64, u64)> {
        let c = self.c(u);
        let free = |j: u32| match self.chunks.get(j as usize) {
            Some(n) if n.state == State::Free => n.size,
            _ => 0,
        };
        let (p, n) = (free(c.prev), free(c.next));
        if p.saturating_add(c.size).saturating_add(n) < want {
            return None;
        }
        let side = align_up(want.saturating_sub(p.max(n)).max(1), gran)?;
        Some(if side >= c.size {
            (c.addr, c.size)
        } else if p >= n {
            (c.addr, side)
        } else {
            (c.addr + c.size - side, side)
        })
    }

    /// The hole that holds `addr..addr + len`.
    pub(super) fn hole_at(&self, addr: u64, len: u64) -> Option<u32> {
        self.holes.iter().copied().find(|&h| {
            let c = self.c(h);
            c.addr <= addr && addr + len <= c.addr + c.size
        })
    }

    /// The segment whose extent holds `addr`.
    pub(super) fn segment_of(&self, addr: u64) -> Option<usize> {
        self.segs
            .iter()
            .position(|s| s.base <= addr && addr - s.base < s.extent)
    }

    /// Hole record `h` is no longer a hole (merged into another, or mapped).
    fn forget_hole(&mut self, h: u32) {
        if let Some(k) = self.holes.iter().position(|&x| x == h) {
            self.holes.swap_remove(k);
        }
    }

    /// Splits chunk `i` (in no index) at `from` and `to` (`addr <= from < to <= end`):
    /// `from..to` gets a record (`i`'s own when `from` is its start), the parts below
    /// and above keep `i`'s state, the lower one in `i`'s record. Returns the middle,
    /// lower and upper records (NIL for a part that is empty). On `Err` (the slab is
    /// full) nothing changed.
    fn carve(&mut self, i: u32, from: u64, to: u64) -> Result<(u32, u32, u32), SlabFull> {
        let c = *self.c(i);
        let end = c.addr + c.size;
        debug_assert!(c.addr <= from && from < to && to <= end);
        let mid = if from > c.addr {
            self.new_slot(Chunk::VACANT).ok_or(SlabFull)?
        } else {
            i
        };
        let up = if to < end {
            match self.new_slot(Chunk::VACANT) {
                Some(j) => j,
                None => {
                    if mid != i {
                        self.vacate(mid);
                    }
                    return Err(SlabFull);
                }
            }
        } else {
            NIL
        };
        let part = |addr: u64, size: u64, prev: u32, next: u32| Chunk {
            addr,
            size,
            prev,
            next,
            state: c.state,
            ..Chunk::VACANT
        };
        let mid_next = if up != NIL { up } else { c.next };
        if up != NIL {
            *self.cm(up) = part(to, end - to, mid, c.next);
        }
        if c.next != NIL {
            self.cm(c.next).prev = if up != NIL { up } else { mid };
        }
        if mid != i {
            *self.cm(mid) = part(from, to - from, i, mid_next);
            let ci = self.cm(i);
            ci.size = from - c.addr;
            ci.next = mid;
        } else {
            let ci = self.cm(i);
            ci.size = to - from;
            ci.next = mid_next;
        }
        let lower = if mid != i { i } else { NIL };
        Ok((mid, lower, up))
    }

    /// Chunk `i` takes in its next neighbour (whose record goes; it is in no index):
    /// the merge of the cached free and of holes alike.
    #[inline]
    pub(super) fn absorb_next(&mut self, i: u32) {
        let n = self.c(i).next;
        let nc = *self.c(n);
        let ci = self.cm(i);
        ci.size += nc.size;
        ci.next = nc.next;
        if nc.next != NIL {
            self.cm(nc.next).prev = i;
        }
        self.vacate(n);
    }

    /// Maps `addr..addr + len` of hole `u`: a free chunk, merged with its free
    /// neighbours; what is left of the hole on either side stays a hole. On `Err`
    /// (the slab is full) nothing changed.
    pub(super) fn map_hole(&mut self, u: u32, addr: u64, len: u64) -> Result<(), SlabFull> {
        let (mut m, _, upper) = self.carve(u, addr, addr + len)?;
        if m == u {
            self.forget_hole(u);
        }
        if upper != NIL {
            self.holes.push(upper);
        }
        let p = self.c(m).prev;
        if p != NIL && self.c(p).state == State::Free {
            self.index_remove(p);
            self.absorb_next(p);
            m = p;
        }
        let n = self.c(m).next;
        if n != NIL && self.c(n).state == State::Free {
            self.index_remove(n);
            self.absorb_next(m);
        }
        self.index_insert(m);
        Ok(())
    }

    /// Unmaps `from..to` (whole granules) of free chunk `i` of segment `s`: its free
    /// head and tail stay free, the middle becomes a hole merged with the holes beside
    /// it; a hole that reaches the end of the extent shortens the extent instead. On
    /// `Err` (the slab is full) nothing changed.
    fn punch(&mut self, s: usize, i: u32, from: u64, to: u64) -> Result<(), SlabFull> {
        self.index_remove(i);
        let (mut h, lower, upper) = match self.carve(i, from, to) {
            Ok(parts) => parts,
            Err(e) => {
                self.index_insert(i);
                return Err(e);
            }
        };
        for j in [lower, upper] {
            if j != NIL {
                self.index_insert(j);
            }
        }
        self.cm(h).state = State::Unmapped;
        let p = self.c(h).prev;
        if p != NIL && self.c(p).state == State::Unmapped {
            self.absorb_next(p);
            h = p;
        } else {
            self.holes.push(h);
        }
        let n = self.c(h).next;
        if n != NIL && self.c(n).state == State::Unmapped {
            self.forget_hole(n);
            self.absorb_next(h);
        }
        self.counters.reserved -= to - from;
        if self.c(h).next == NIL {
            self.forget_hole(h);
            self.drop_trailing_hole(s, h);
        }
        Ok(())
    }

    /// Hole `h`, the last chunk of segment `s`, leaves the chain: the extent ends
    /// where it began.
    fn drop_trailing_hole(&mut self, s: usize, h: u32) {
        let c = *self.c(h);
        if c.prev == NIL {
            self.segs[s].head = NIL;
        } else {
            self.cm(c.prev).next = NIL;
        }
        let seg = &mut self.segs[s];
        seg.tail = c.prev;
        seg.extent = c.addr - seg.base;
        self.vacate(h);
    }

    /// Appends to `out` the whole-granule spans of the free chunks of the segments
    /// that `pick` accepts (by index), but for the chunks that touch `guard` (a
    /// growth's hole, or its end of the extent, whose free neighbours the growth
    /// counts on). Looks only at free chunks of a granule or more (the hot chunk and
    /// the treaps of their classes), not at the chains.
    pub(super) fn free_spans(
        &self,
        pick: impl Fn(usize) -> bool,
        guard: Option<(u64, u64)>,
        out: &mut Vec<Span>,
    ) {
        let Some(gran) = self.segs.iter().map(|s| s.gran).min() else {
            return;
        };
        let mut consider = |t: u32| {
            let c = *self.c(t);
            let end = c.addr + c.size;
            if c.size < gran || guard.is_some_and(|(g0, g1)| end == g0 || c.addr == g1) {
                return;
            }
            let Some(s) = self.segment_of(c.addr).filter(|&s| pick(s)) else {
                return;
            };
            let seg = self.segs[s];
            let lo = align_up(c.addr - seg.base, seg.gran).map(|o| seg.base + o);
            let hi = seg.base + ((end - seg.base) & !(seg.gran - 1));
            if let Some(lo) = lo.filter(|&lo| lo < hi) {
                out.push(Span {
                    seg: s,
                    chunk: t,
                    lo,
                    hi,
                });
            }
        };
        if self.hot != NIL {
            consider(self.hot);
        }
        let first = super::class_of(gran / super::super::ALLOCATION_UNIT as u64);
        let mut stack = Vec::new();
        let mut class = self.next_class(first);
        while let Some(k) = class {
            stack.push(self.roots[k]);
            while let Some(t) = stack.pop() {
                if t != NIL {
                    consider(t);
                    stack.push(self.c(t).left);
                    stack.push(self.c(t).right);
                }
            }
            class = self.next_class(k + 1);
        }
    }

    /// Punches `spans` in order, each from its top, until `budget` bytes (rounded up
    /// to whole granules) are unmapped; appends the unmaps to `out` and returns their
    /// bytes. Stops early if the slab is full.
    pub(super) fn punch_spans(
        &mut self,
        spans: &[Span],
        budget: u64,
        out: &mut Vec<SegmentCut>,
    ) -> u64 {
        let mut done = 0u64;
        for sp in spans {
            let left = budget - done;
            if left == 0 {
                break;
            }
            let gran = self.segs[sp.seg].gran;
            let take = (sp.hi - sp.lo).min(align_up(left, gran).unwrap_or(u64::MAX));
            let from = sp.hi - take;
            if self.punch(sp.seg, sp.chunk, from, sp.hi).is_err() {
                break;
            }
            out.push(SegmentCut::Unmap {
                base: self.segs[sp.seg].base,
                addr: from,
                len: take,
            });
            done = done.saturating_add(take).min(budget);
        }
        done
    }

    /// Before the growth `plan` maps (its segment busy for it): punches free granules
    /// of the arena's segments, up to `budget` bytes, highest addresses first, but
    /// none next to where the growth maps. Appends the unmaps to `out` (each segment
    /// other than the plan's that is cut is busy until the caller has unmapped, see
    /// [`unbusy_base`](Self::unbusy_base)); returns the bytes punched.
    pub(in crate::memory::arena) fn punch_for(
        &mut self,
        plan: SegmentPlan,
        budget: u64,
        out: &mut Vec<SegmentCut>,
    ) -> u64 {
        let guard = match self.hole_at(plan.addr, plan.len) {
            Some(u) => (self.c(u).addr, self.c(u).addr + self.c(u).size),
            None => (plan.addr, plan.addr),
        };
        let mut spans = Vec::new();
        let segs = &self.segs;
        let pick = |s: usize| segs[s].base == plan.base || !segs[s].busy;
        self.free_spans(pick, Some(guard), &mut spans);
        spans.sort_unstable_by_key(|sp| std::cmp::Reverse(sp.hi));
        let n = out.len();
        let done = self.punch_spans(&spans, budget, out);
        for cut in &out[n..] {
            if let SegmentCut::Unmap { base, .. } = *cut {
                if base != plan.base {
                    if let Some(seg) = self.segs.iter_mut().find(|s| s.base == base) {
                        seg.busy = true;
                    }
                }
            }
        }
        done
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::memory::arena::{Block, FakeBackend, Pool, SegmentSpec, StreamFence};

    const MIB: u64 = 1 << 20;

    /// A pool with expandable segments over a checked fake backend: 2 MiB granules.
    fn pool() -> (Arc<FakeBackend>, Pool<Arc<FakeBackend>>) {
        let b = Arc::new(FakeBackend::checked().with_segments(SegmentSpec {
            granularity: 2 * MIB,
            reserve: 1 << 30,
        }));
        let p = Pool::new(b.clone());
        p.set_expandable_segments(true);
        (b, p)
    }

    fn malloc(p: &Pool<Arc<FakeBackend>>, mib: f64) -> Block {
        p.malloc((mib * MIB as f64) as usize, 0).unwrap()
    }

    /// Which MiB of `base.. base + n MiB` are mapped, as a string of `#` and `.`.
    fn map_of(b: &FakeBackend, base: u64, n: u64) -> String {
        (0..n)
            .map(|k| {
                if b.is_mapped(base + k * MIB) {
                    '#'
                } else {
                    '.'
                }
            })
            .collect()
    }

    fn consistent(b: &FakeBackend, p: &Pool<Arc<FakeBackend>>) {
        p.check().unwrap();
        let k = b.counters();
        assert_eq!(k.bad_segment_calls, 0);
        assert_eq!(p.stats().total_bytes, k.live_bytes);
    }

    /// `x` at 0..1 MiB, a free 1..7 MiB, `y` at 7..8 MiB: one segment of 8 MiB.
    fn gap_of_six(p: &Pool<Arc<FakeBackend>>) -> (Block, Block, u64) {
        let x = malloc(p, 1.0);
        let m = malloc(p, 6.0);
        let y = malloc(p, 1.0);
        let base = x.addr();
        assert_eq!((m.addr(), y.addr()), (base + MIB, base + 7 * MIB));
        p.free(m).unwrap();
        (x, y, base)
    }

    #[test]
    fn a_growth_punches_whole_free_granules_only_and_keeps_the_partial_ones() {
        let (b, p) = pool();
        let (x, y, base) = gap_of_six(&p);
        assert_eq!(map_of(&b, base, 8), "########");
        // Nothing cached fits 10 MiB: the growth maps 10 MiB at the end, and first
        // unmaps the free chunk's whole granules 2..6 MiB; its partial ones stay.
        let z = malloc(&p, 10.0);
        assert_eq!(z.addr(), base + 8 * MIB);
        assert_eq!(map_of(&b, base, 18), "##....############");
        assert_eq!(
            p.free_chunks(0),
            [(base + MIB, MIB), (base + 6 * MIB, MIB)],
            "the free head and tail stay cached"
        );
        let s = p.stats();
        assert_eq!((s.total_bytes, s.holes_punched), (14 * MIB, 1));
        assert_eq!(
            s.peak_total_bytes,
            14 * MIB,
            "the growth added 6 MiB, not 10"
        );
        consistent(&b, &p);
        for blk in [x, y, z] {
            p.free(blk).unwrap();
        }
        consistent(&b, &p);
    }

    #[test]
    fn a_growth_that_stays_under_the_peak_punches_nothing() {
        let (b, p) = pool();
        // A peak of 16 MiB, then everything given back.
        let a = malloc(&p, 16.0);
        p.free(a).unwrap();
        p.free_all_blocks(None);
        assert_eq!(p.stats().total_bytes, 0);
        let (x, y, base) = gap_of_six(&p);
        // 7 MiB fits nowhere cached: 8 MiB more are mapped, 16 MiB reserved in all,
        // not past the peak: the free granules of 1..7 MiB stay mapped and cached.
        let z = malloc(&p, 7.0);
        assert_eq!(z.addr(), base + 8 * MIB);
        assert_eq!(map_of(&b, base, 16), "################");
        assert_eq!(p.stats().holes_punched, 0);
        assert_eq!(
            p.free_chunks(0),
            [(base + MIB, 6 * MIB), (base + 15 * MIB, MIB)]
        );
        consistent(&b, &p);
        for blk in [x, y, z] {
            p.free(blk).unwrap();
        }
        consistent(&b, &p);
    }

    #[test]
    fn a_growth_maps_into_a_hole_when_that_maps_less_than_the_tail() {
        let (b, p) = pool();
        let (x, y, base) = gap_of_six(&p);
        let z = malloc(&p, 10.0);
        assert_eq!(map_of(&b, base, 18), "##....############");
        // 2.5 MiB: the hole's lower granule with the free 1 MiB below it maps 2 MiB;
        // the end would map 4.
        let v = malloc(&p, 2.5);
        assert_eq!(v.addr(), base + MIB);
        assert_eq!(map_of(&b, base, 18), "####..############");
        assert_eq!(p.stats().total_bytes, 16 * MIB);
        consistent(&b, &p);
        p.free(v).unwrap();
        // 5 MiB needs the free 1..4 MiB, the last granule of the hole and the free
        // 6..7 MiB: it maps the hole's 2 MiB and spans free, hole and free.
        assert_eq!(
            p.free_chunks(0),
            [(base + MIB, 3 * MIB), (base + 6 * MIB, MIB)]
        );
        let w = malloc(&p, 5.0);
        assert_eq!(w.addr(), base + MIB);
        assert_eq!(map_of(&b, base, 18), "##################");
        assert!((0..5).all(|k| b.is_mapped(w.addr() + k * MIB)));
        assert_eq!(p.stats().holes_punched, 1, "nothing else was punched");
        consistent(&b, &p);
        for blk in [x, y, z, w] {
            p.free(blk).unwrap();
        }
        consistent(&b, &p);
    }

    #[test]
    fn a_release_unmaps_holes_and_free_granules_and_gives_back_an_empty_segment() {
        let (b, p) = pool();
        let (x, y, base) = gap_of_six(&p);
        let z = malloc(&p, 10.0);
        p.free(z).unwrap();
        // y is live at 7..8 MiB: everything free above it goes, and the free 1..7 MiB
        // keeps only its partial granules.
        p.free_all_blocks(None);
        assert_eq!(map_of(&b, base, 18), "##....##..........");
        assert_eq!(p.stats().total_bytes, 4 * MIB);
        consistent(&b, &p);
        p.free(y).unwrap();
        p.free_all_blocks(None);
        assert_eq!(map_of(&b, base, 8), "##......");
        consistent(&b, &p);
        p.free(x).unwrap();
        p.free_all_blocks(None);
        assert_eq!(b.mapped(base), None, "the segment was released");
        let k = b.counters();
        assert_eq!(
            (k.live_bytes, k.live_segments, k.bad_segment_calls),
            (0, 0, 0)
        );
        // And it grows again from nothing.
        p.free(malloc(&p, 3.0)).unwrap();
        consistent(&b, &p);
    }

    #[test]
    fn dropping_a_pool_with_holes_unmaps_and_releases_everything() {
        let (b, p) = pool();
        let (x, y, _) = gap_of_six(&p);
        let z = malloc(&p, 10.0);
        for blk in [x, y, z] {
            p.free(blk).unwrap();
        }
        drop(p);
        let k = b.counters();
        assert_eq!(
            (k.live_bytes, k.live_segments, k.bad_segment_calls),
            (0, 0, 0)
        );
    }

    #[test]
    fn live_and_awaiting_chunks_are_never_punched() {
        let (b, p) = pool();
        let x = malloc(&p, 1.0);
        let live = malloc(&p, 6.0);
        let waiting = malloc(&p, 6.0);
        let base = x.addr();
        let fence = StreamFence {
            stream: 2,
            fence: b.new_fence(),
        };
        p.free_after(waiting, &[fence]).unwrap();
        assert_eq!(map_of(&b, base, 14), "##############");
        // A growth with nothing free to punch but the 1 MiB partial granule left of
        // the 14 MiB extent: nothing is unmapped.
        let z = malloc(&p, 10.0);
        assert_eq!(map_of(&b, base, 24), "########################");
        assert_eq!(p.stats().holes_punched, 0);
        assert_eq!(p.stats().awaiting_bytes, 6 * MIB);
        // Once its stream is done the block is free (7..13 MiB; z took 13..23), and
        // the next growth punches its whole granules.
        b.complete_fence(fence.fence);
        let big = malloc(&p, 30.0);
        assert_eq!(p.stats().holes_punched, 1);
        assert_eq!(map_of(&b, base, 24), "########....############");
        assert!((0..30).all(|k| b.is_mapped(big.addr() + k * MIB)));
        consistent(&b, &p);
        for blk in [x, live, z, big] {
            p.free(blk).unwrap();
        }
        consistent(&b, &p);
    }
}
