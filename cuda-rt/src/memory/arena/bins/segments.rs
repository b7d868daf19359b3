//! Expandable segments in an arena's chunks: a reserved address range whose prefix
//! (its *extent*) is one chain of chunks, grown by a miss (at its end, or into a hole
//! inside it) and cut back by a release (see [`Pool::set_expandable_segments`]).
//!
//! Only misses and releases come here; the cached malloc and free never look at
//! segments: a segment's chunks are ordinary chunks, linked and merged as those of a
//! backend allocation are. The chunk at a segment's base never changes its record
//! (a split keeps the lower part in the record, a merge keeps the lower neighbour's),
//! so a segment remembers it; its last chunk moves, so the segment keeps a hint and
//! walks from the base when the hint is stale.
//!
//! The chain may hold *holes* (unmapped chunks, see `holes`): whole granules given
//! back inside the extent. The extent never ends in a hole (a hole that reaches the
//! end shortens the extent instead), so a segment with nothing mapped has no chunks.
//!
//! [`Pool::set_expandable_segments`]: super::super::Pool::set_expandable_segments

use super::{Bins, Chunk, SlabFull, State, NIL};

pub(super) use super::holes::align_up;

/// One expandable segment of an arena.
#[derive(Clone, Copy, Debug)]
pub(in crate::memory::arena) struct Segment {
    pub(super) base: u64,
    /// Address space reserved.
    pub(super) size: u64,
    /// Bytes from `base` on that the segment's chain covers: its mapped chunks and its
    /// holes. A multiple of `gran`.
    pub(super) extent: u64,
    /// The mapping unit: holes start and end on its multiples.
    pub(super) gran: u64,
    /// The chunk at `base` (NIL while the extent is empty).
    pub(super) head: u32,
    /// The last chunk, as far as known (checked before use).
    pub(super) tail: u32,
    /// A thread is growing it (between planning and recording, with no lock held):
    /// nobody else grows or cuts it meanwhile.
    pub(super) busy: bool,
}

/// A growth planned by [`Bins::plan_extend`]: map `len` bytes at `addr` in the
/// segment reserved at `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::memory::arena) struct SegmentPlan {
    pub base: u64,
    pub addr: u64,
    pub len: u64,
}

/// What a release cut from the segments, for the caller to give the backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(in crate::memory::arena) enum SegmentCut {
    /// Unmap `len` bytes at `addr`, the tail of the segment at `base`.
    Unmap { base: u64, addr: u64, len: u64 },
    /// Give back the reservation of `size` bytes at `base` (nothing mapped).
    Release { base: u64, size: u64 },
}

impl Bins {
    /// Whether chunk `i` is the base chunk of an expandable segment.
    pub(in crate::memory::arena) fn is_segment_head(&self, i: u32) -> bool {
        self.segs.iter().any(|s| s.head == i)
    }

    /// The last chunk of segment `s` (NIL when nothing is mapped), refreshing its hint.
    pub(super) fn tail_of(&mut self, s: usize) -> u32 {
        let seg = self.segs[s];
        let end = seg.base + seg.extent;
        let hint = seg.tail;
        if let Some(c) = self.chunks.get(hint as usize) {
            if c.state != State::Vacant
                && c.next == NIL
                && c.addr >= seg.base
                && c.addr + c.size == end
            {
                return hint;
            }
        }
        let mut t = seg.head;
        while t != NIL && self.c(t).next != NIL {
            t = self.c(t).next;
        }
        self.segs[s].tail = t;
        t
    }

    /// Free bytes at the end of segment `s`.
    fn free_tail(&mut self, s: usize) -> u64 {
        match self.tail_of(s) {
            NIL => 0,
            t if self.c(t).state == State::Free => self.c(t).size,
            _ => 0,
        }
    }

    /// Plans the growth that lets a request of `want` bytes be served from a segment:
    /// the placement that maps the least (a multiple of `gran`), among each segment's
    /// end (after its free tail, where its reservation has room) and each hole with
    /// its free neighbours (on a tie the hole, lower in the address space, wins). The
    /// segment is marked busy until [`extend`](Self::extend) or
    /// [`unbusy`](Self::unbusy). `None`: no segment has room (the caller reserves
    /// another and adds it with [`add_segment`](Self::add_segment)).
    pub(in crate::memory::arena) fn plan_extend(
        &mut self,
        want: u64,
        gran: u64,
    ) -> Option<SegmentPlan> {
        let mut best: Option<(usize, u64, u64)> = None;
        let mut consider = |s: usize, addr: u64, len: u64| {
            if best.is_none_or(|(_, _, n)| len < n) {
                best = Some((s, addr, len));
            }
        };
        for &h in &self.holes {
            let Some(s) = self.segment_of(self.c(h).addr) else {
                continue;
            };
            if !self.segs[s].busy {
                if let Some((addr, len)) = self.hole_plan(h, want, gran) {
                    consider(s, addr, len);
                }
            }
        }
        for s in 0..self.segs.len() {
            if self.segs[s].busy {
                continue;
            }
            let tail = self.free_tail(s);
            let Some(need) = align_up(want.saturating_sub(tail).max(1), gran) else {
                continue;
            };
            let seg = &self.segs[s];
            if seg.size - seg.extent >= need {
                consider(s, seg.base + seg.extent, need);
            }
        }
        let (s, addr, len) = best?;
        let seg = &mut self.segs[s];
        seg.busy = true;
        Some(SegmentPlan {
            base: seg.base,
            addr,
            len,
        })
    }

    /// Records a fresh reservation of `size` bytes at `base` (nothing mapped yet),
    /// mapped in units of `gran`, busy for its first growth: the plan of mapping `len`
    /// bytes at its start. `None` when `len` does not fit in `size`.
    pub(in crate::memory::arena) fn add_segment(
        &mut self,
        base: u64,
        size: u64,
        gran: u64,
        len: u64,
    ) -> Option<SegmentPlan> {
        if len == 0 || len > size {
            return None;
        }
        self.segs.push(Segment {
            base,
            size,
            extent: 0,
            gran,
            head: NIL,
            tail: NIL,
            busy: true,
        });
        Some(SegmentPlan {
            base,
            addr: base,
            len,
        })
    }

    /// The growth `plan` did not happen: the segment is no longer busy.
    pub(in crate::memory::arena) fn unbusy(&mut self, plan: SegmentPlan) {
        self.unbusy_base(plan.base);
    }

    /// The segment at `base` is no longer busy (its growth or its cut is done).
    pub(in crate::memory::arena) fn unbusy_base(&mut self, base: u64) {
        if let Some(seg) = self.segs.iter_mut().find(|s| s.base == base) {
            seg.busy = false;
        }
    }

    /// Records that `plan`'s bytes are mapped: at the segment's end they extend its
    /// free tail, or make a new free chunk; in a hole they make a free chunk merged
    /// with its free neighbours. The segment is no longer busy. On `Err` (no such
    /// segment or hole, or a new chunk record was needed and the slab is full) nothing
    /// changed but that: the caller unmaps.
    pub(in crate::memory::arena) fn extend(&mut self, plan: SegmentPlan) -> Result<(), SlabFull> {
        let Some(s) = self.segs.iter().position(|s| s.base == plan.base) else {
            return Err(SlabFull);
        };
        self.segs[s].busy = false;
        let seg = self.segs[s];
        if plan.addr != seg.base + seg.extent {
            let u = self.hole_at(plan.addr, plan.len).ok_or(SlabFull)?;
            self.map_hole(u, plan.addr, plan.len)?;
            self.counters.reserved += plan.len;
            return Ok(());
        }
        let t = self.tail_of(s);
        if t != NIL && self.c(t).state == State::Free {
            self.index_remove(t);
            self.cm(t).size += plan.len;
            self.index_insert(t);
        } else {
            let j = self
                .new_slot(Chunk {
                    addr: plan.addr,
                    size: plan.len,
                    prev: t,
                    ..Chunk::VACANT
                })
                .ok_or(SlabFull)?;
            if t == NIL {
                self.segs[s].head = j;
            } else {
                self.cm(t).next = j;
            }
            self.segs[s].tail = j;
            self.index_insert(j);
        }
        self.segs[s].extent += plan.len;
        self.counters.reserved += plan.len;
        Ok(())
    }

    /// Gives back every whole granule of every free chunk of the segments (tails and
    /// holes alike: see `holes`), and gives up the segments left with nothing mapped;
    /// appends what to do to `out`, in order (unmaps before the release of their
    /// segment). Busy segments are left alone, and a segment cut but kept is busy
    /// until the caller has unmapped its cuts ([`unbusy_base`](Self::unbusy_base)): a
    /// growth must not map there before.
    pub(in crate::memory::arena) fn trim_segments(&mut self, out: &mut Vec<SegmentCut>) {
        let mut spans = Vec::new();
        let mut s = 0;
        while s < self.segs.len() {
            if self.segs[s].busy {
                s += 1;
                continue;
            }
            spans.clear();
            self.free_spans(|k| k == s, None, &mut spans);
            let cut = self.punch_spans(&spans, u64::MAX, out);
            let seg = self.segs[s];
            if seg.extent == 0 {
                out.push(SegmentCut::Release {
                    base: seg.base,
                    size: seg.size,
                });
                self.segs.swap_remove(s);
            } else {
                self.segs[s].busy = cut > 0;
                s += 1;
            }
        }
    }

    /// Each segment's chain runs from its base, without a gap, to the end of its
    /// extent; its holes are whole granules, merged, never last; no hole lies outside
    /// a segment.
    pub(super) fn check_segments(&self) -> Result<(), String> {
        let mut holes = 0usize;
        for seg in &self.segs {
            let (mut t, mut at) = (seg.head, seg.base);
            if t != NIL && self.c(t).prev != NIL {
                return Err(format!("segment {:#x}: head has a prev", seg.base));
            }
            while t != NIL {
                let c = self.c(t);
                if c.state == State::Vacant || c.addr != at {
                    return Err(format!("segment {:#x}: gap at {at:#x}", seg.base));
                }
                if c.state == State::Unmapped {
                    holes += 1;
                    let whole = (c.addr - seg.base).is_multiple_of(seg.gran)
                        && c.size.is_multiple_of(seg.gran);
                    if !whole || c.next == NIL {
                        return Err(format!(
                            "segment {:#x}: hole at {:#x} of {} bytes (granule {}) \
                             is not whole granules, or ends the extent",
                            seg.base, c.addr, c.size, seg.gran
                        ));
                    }
                }
                at += c.size;
                t = c.next;
            }
            if at != seg.base + seg.extent
                || seg.extent > seg.size
                || !seg.extent.is_multiple_of(seg.gran)
            {
                return Err(format!(
                    "segment {:#x}: chunks end at {at:#x}, extent {} of {}",
                    seg.base, seg.extent, seg.size
                ));
            }
        }
        let all = self
            .chunks
            .iter()
            .filter(|c| c.state == State::Unmapped)
            .count();
        let listed = self.holes.iter().all(|&h| {
            self.chunks
                .get(h as usize)
                .is_some_and(|c| c.state == State::Unmapped)
        });
        if all != holes || self.holes.len() != all || !listed {
            return Err(format!(
                "{all} holes, {holes} of them in segments, {} listed",
                self.holes.len()
            ));
        }
        Ok(())
    }
}
