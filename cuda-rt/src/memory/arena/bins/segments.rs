//! Expandable segments in an arena's chunks: a reserved address range whose mapped
//! prefix is one chain of chunks, grown at its end by a miss and cut back at its free
//! tail by a release (see [`Pool::set_expandable_segments`]).
//!
//! Only misses and releases come here; the cached malloc and free never look at
//! segments: a segment's chunks are ordinary chunks, linked and merged as those of a
//! backend allocation are. The chunk at a segment's base never changes its record
//! (a split keeps the lower part in the record, a merge keeps the lower neighbour's),
//! so a segment remembers it; its last chunk moves, so the segment keeps a hint and
//! walks from the base when the hint is stale.
//!
//! [`Pool::set_expandable_segments`]: super::super::Pool::set_expandable_segments

use super::{Bins, Chunk, SlabFull, State, NIL};

/// One expandable segment of an arena.
#[derive(Clone, Copy, Debug)]
pub(in crate::memory::arena) struct Segment {
    base: u64,
    /// Address space reserved.
    size: u64,
    /// Bytes mapped from `base` on: the chunks of the segment cover exactly these.
    mapped: u64,
    /// The chunk at `base` (NIL while nothing is mapped).
    head: u32,
    /// The last chunk, as far as known (checked before use).
    tail: u32,
    /// A thread is growing it (between planning and recording, with no lock held):
    /// nobody else grows or cuts it meanwhile.
    busy: bool,
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

#[inline]
fn align_up(x: u64, g: u64) -> Option<u64> {
    Some(x.checked_add(g - 1)? & !(g - 1))
}

impl Bins {
    /// Whether chunk `i` is the base chunk of an expandable segment.
    pub(in crate::memory::arena) fn is_segment_head(&self, i: u32) -> bool {
        self.segs.iter().any(|s| s.head == i)
    }

    /// The last chunk of segment `s` (NIL when nothing is mapped), refreshing its hint.
    fn tail_of(&mut self, s: usize) -> u32 {
        let seg = self.segs[s];
        let end = seg.base + seg.mapped;
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
    /// the segment whose free tail leaves the least to map (a multiple of `gran`) and
    /// whose reservation has room for it. It is marked busy until
    /// [`extend`](Self::extend) or [`unbusy`](Self::unbusy). `None`: no segment has
    /// room (the caller reserves another and adds it with
    /// [`add_segment`](Self::add_segment)).
    pub(in crate::memory::arena) fn plan_extend(
        &mut self,
        want: u64,
        gran: u64,
    ) -> Option<SegmentPlan> {
        let mut best: Option<(usize, u64)> = None;
        for s in 0..self.segs.len() {
            if self.segs[s].busy {
                continue;
            }
            let tail = self.free_tail(s);
            let Some(need) = align_up(want.saturating_sub(tail).max(1), gran) else {
                continue;
            };
            let seg = &self.segs[s];
            if seg.size - seg.mapped >= need && best.is_none_or(|(_, n)| need < n) {
                best = Some((s, need));
            }
        }
        let (s, len) = best?;
        let seg = &mut self.segs[s];
        seg.busy = true;
        Some(SegmentPlan {
            base: seg.base,
            addr: seg.base + seg.mapped,
            len,
        })
    }

    /// Records a fresh reservation of `size` bytes at `base` (nothing mapped yet),
    /// busy for its first growth: the plan of mapping `len` bytes at its start. `None`
    /// when `len` does not fit in `size`.
    pub(in crate::memory::arena) fn add_segment(
        &mut self,
        base: u64,
        size: u64,
        len: u64,
    ) -> Option<SegmentPlan> {
        if len == 0 || len > size {
            return None;
        }
        self.segs.push(Segment {
            base,
            size,
            mapped: 0,
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

    /// Records that `plan`'s bytes are mapped: the segment's free tail grows by them,
    /// or a new free chunk holds them. The segment is no longer busy. On `Err` (a new
    /// chunk record was needed and the slab is full) nothing changed but that: the
    /// caller unmaps.
    pub(in crate::memory::arena) fn extend(&mut self, plan: SegmentPlan) -> Result<(), SlabFull> {
        let Some(s) = self.segs.iter().position(|s| s.base == plan.base) else {
            return Err(SlabFull);
        };
        self.segs[s].busy = false;
        let seg = self.segs[s];
        if plan.addr != seg.base + seg.mapped {
            return Err(SlabFull);
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
        self.segs[s].mapped += plan.len;
        self.counters.reserved += plan.len;
        Ok(())
    }

    /// Cuts every segment's free tail back to the granularity `gran` (the part from
    /// the first `gran` boundary at or after the free tail's start), and gives up the
    /// segments left with nothing mapped; appends what to do to `out`, in order
    /// (unmaps before the release of their segment). Busy segments are left alone, and
    /// a segment cut but kept is busy until the caller has unmapped its tail
    /// ([`unbusy_base`](Self::unbusy_base)): a growth must not map there before.
    pub(in crate::memory::arena) fn trim_segments(&mut self, gran: u64, out: &mut Vec<SegmentCut>) {
        let mut s = 0;
        while s < self.segs.len() {
            if self.segs[s].busy {
                s += 1;
                continue;
            }
            let t = self.tail_of(s);
            let seg = self.segs[s];
            let end = seg.base + seg.mapped;
            if t != NIL && self.c(t).state == State::Free {
                let c = *self.c(t);
                let cut = match align_up(c.addr - seg.base, gran) {
                    Some(off) => seg.base + off,
                    None => end,
                };
                if cut < end {
                    self.index_remove(t);
                    if cut == c.addr {
                        if c.prev == NIL {
                            self.segs[s].head = NIL;
                        } else {
                            self.cm(c.prev).next = NIL;
                        }
                        self.segs[s].tail = c.prev;
                        self.vacate(t);
                    } else {
                        self.cm(t).size = cut - c.addr;
                        self.index_insert(t);
                    }
                    let len = end - cut;
                    self.segs[s].busy = true;
                    self.segs[s].mapped -= len;
                    self.counters.reserved -= len;
                    out.push(SegmentCut::Unmap {
                        base: seg.base,
                        addr: cut,
                        len,
                    });
                }
            }
            if self.segs[s].mapped == 0 {
                out.push(SegmentCut::Release {
                    base: seg.base,
                    size: seg.size,
                });
                self.segs.swap_remove(s);
            } else {
                s += 1;
            }
        }
    }

    /// Each segment's chain runs from its base, without a gap, to its mapped end.
    pub(super) fn check_segments(&self) -> Result<(), String> {
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
                at += c.size;
                t = c.next;
            }
            if at != seg.base + seg.mapped || seg.mapped > seg.size {
                return Err(format!(
                    "segment {:#x}: chunks end at {at:#x}, mapped {} of {}",
                    seg.base, seg.mapped, seg.size
                ));
            }
        }
        Ok(())
    }
}
