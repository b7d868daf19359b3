//! One arena's chunks: a slab of chunk records, address-neighbour links inside each
//! backend allocation, and the best-fit index (size classes with a two-level bitmap,
//! a treap keyed by `(size, addr)` per class, and one *hot* free chunk outside the
//! treaps). Everything here runs under the arena's mutex; nothing here allocates
//! except the slab growing past its high mark.
//!
//! The hot chunk is the last chunk filed by a free. The common cached pair (free a
//! block, malloc the same size again) then touches no treap: the free parks the chunk
//! in the slot, the malloc finds it there. It stays exact best fit: the slot is one
//! more candidate compared with the treaps' best, and the treap search is skipped
//! only when the hot chunk has exactly the wanted size and that size's class is
//! empty, so no other chunk could win or tie. A free that finds the slot taken moves
//! the previous hot chunk into its treap.

mod holes;
mod segments;

pub(super) use segments::{SegmentCut, SegmentPlan};

/// "No chunk" in every `u32` link.
pub(super) const NIL: u32 = u32::MAX;

/// Sub-classes per power of two above the exact classes (2^SUB_BITS).
const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Classes: sizes up to 2^64 bytes (2^55 units) need (55 - 5 + 1) * 32 + 32 < 2048.
/// (32 rather than 16 sub-classes halve the treaps: about 4 % fewer instructions on
/// trace B of `benches/arena_traces.rs`.)
const N_CLASSES: usize = 2048;
const N_WORDS: usize = N_CLASSES / 64;

/// Size class of a chunk of `units` allocation units (`units >= 1`): exact for
/// fewer than 32 units, then 32 classes per power of two. Monotonic in `units`.
#[inline]
fn class_of(units: u64) -> usize {
    if units < SUB {
        units as usize
    } else {
        let fl = 63 - units.leading_zeros();
        let sl = (units >> (fl - SUB_BITS)) & (SUB - 1);
        ((u64::from(fl - SUB_BITS) + 1) * SUB + sl) as usize
    }
}

/// Treap priority of a free chunk: a multiplicative hash of its address, so the
/// tree shape is deterministic and needs no random state.
#[inline]
fn priority(addr: u64) -> u32 {
    (addr.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as u32
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum State {
    /// Slab slot not in use; `next` links the vacant list.
    Vacant,
    /// In the best-fit index (a treap, or the hot slot).
    Free,
    /// Handed out.
    Used,
    /// Given back while stream work recorded on it may still use it: neither handed
    /// out nor free until its fences are done ([`Bins::defer`], then
    /// [`Bins::free_awaiting`]).
    Awaiting,
    /// A hole: whole granules of an expandable segment given back to the backend,
    /// linked in the segment's chain but in no index and not reserved (see `holes`).
    Unmapped,
}

#[derive(Clone, Copy, Debug)]
struct Chunk {
    addr: u64,
    size: u64,
    /// Address neighbours inside the same backend allocation.
    prev: u32,
    next: u32,
    /// Treap children while free.
    left: u32,
    right: u32,
    prio: u32,
    state: State,
}

impl Chunk {
    const VACANT: Chunk = Chunk {
        addr: 0,
        size: 0,
        prev: NIL,
        next: NIL,
        left: NIL,
        right: NIL,
        prio: 0,
        state: State::Vacant,
    };
}

/// Why [`Bins::free`] refused a chunk.
#[derive(Debug)]
pub(super) struct NotLive;

/// The slab has no room for one more chunk record (`u32::MAX - 1` of them).
#[derive(Debug)]
pub(super) struct SlabFull;

/// Per-arena counters, kept under the arena's lock (no atomics on the hot path).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ArenaCounters {
    pub used: u64,
    pub peak_used: u64,
    pub reserved: u64,
    pub n_free: u64,
    pub mallocs: u64,
    pub frees: u64,
    pub hits: u64,
    pub misses: u64,
    /// Bytes and chunks given back but awaiting their streams (not in `used`).
    pub awaiting: u64,
    pub n_awaiting: u64,
}

/// A segment's address and its chunks as `(address, size, in use)`.
pub(super) type SegmentChunks = (u64, bool, Vec<(u64, u64, bool)>);

/// The chunks of one arena.
#[derive(Debug)]
pub(super) struct Bins {
    chunks: Vec<Chunk>,
    vacant: u32,
    roots: [u32; N_CLASSES],
    words: [u64; N_WORDS],
    summary: u64,
    /// The hot free chunk, in no treap (NIL: none). See the module doc.
    hot: u32,
    pub counters: ArenaCounters,
    /// The arena's expandable segments (empty unless the pool uses them): touched
    /// only by misses and releases, never by the cached paths.
    segs: Vec<segments::Segment>,
    /// The records of the segments' holes ([`State::Unmapped`]), in no order: misses
    /// look for a place to map among them without walking the chains.
    holes: Vec<u32>,
}

impl Bins {
    pub fn new() -> Self {
        Bins {
            chunks: Vec::new(),
            vacant: NIL,
            roots: [NIL; N_CLASSES],
            words: [0; N_WORDS],
            summary: 0,
            hot: NIL,
            counters: ArenaCounters::default(),
            segs: Vec::new(),
            holes: Vec::new(),
        }
    }

    // ---- slab ----

    /// A slot holding `chunk`, or `None` when the slab already has `NIL` (u32::MAX)
    /// records and none vacant (indices are `u32`, `NIL` excluded).
    fn new_slot(&mut self, chunk: Chunk) -> Option<u32> {
        if self.vacant != NIL {
            let i = self.vacant;
            self.vacant = self.chunks[i as usize].next;
            self.chunks[i as usize] = chunk;
            Some(i)
        } else {
            let i = u32::try_from(self.chunks.len())
                .ok()
                .filter(|&i| i != NIL)?;
            self.chunks.push(chunk);
            Some(i)
        }
    }

    fn vacate(&mut self, i: u32) {
        self.chunks[i as usize] = Chunk {
            next: self.vacant,
            ..Chunk::VACANT
        };
        self.vacant = i;
    }

    #[inline]
    fn c(&self, i: u32) -> &Chunk {
        &self.chunks[i as usize]
    }

    #[inline]
    fn cm(&mut self, i: u32) -> &mut Chunk {
        &mut self.chunks[i as usize]
    }

    #[inline]
    fn key(&self, i: u32) -> (u64, u64) {
        let c = self.c(i);
        (c.size, c.addr)
    }

    // ---- treap ----
    //
    // Iterative forms (no recursion, no rotations): a node is linked in by one descent
    // plus one split, and taken out by one descent plus one merge of its children. The
    // shape is the treap's (heap order on `prio`, search order on `(size, addr)`).

    /// Points the link `(parent, left)` at `v`; `parent == NIL` is the root itself.
    #[inline]
    fn set_link(&mut self, root: &mut u32, parent: u32, left: bool, v: u32) {
        if parent == NIL {
            *root = v;
        } else if left {
            self.cm(parent).left = v;
        } else {
            self.cm(parent).right = v;
        }
    }

    /// Inserts node `n` (children NIL, `prio` set) and returns the new root.
    fn tree_insert(&mut self, mut root: u32, n: u32) -> u32 {
        let key = self.key(n);
        let prio = self.c(n).prio;
        // Down to the first node that `n` outranks (or the end of the path).
        let (mut parent, mut left) = (NIL, false);
        let mut t = root;
        while t != NIL && self.c(t).prio >= prio {
            parent = t;
            left = key < self.key(t);
            t = if left {
                self.c(t).left
            } else {
                self.c(t).right
            };
        }
        self.set_link(&mut root, parent, left, n);
        // Split the subtree at `t` by `key`: smaller keys to `n`'s left, larger to its
        // right (keys are unique: addresses differ).
        let (mut lp, mut ll) = (n, true);
        let (mut rp, mut rl) = (n, false);
        while t != NIL {
            if self.key(t) < key {
                self.set_link(&mut root, lp, ll, t);
                (lp, ll) = (t, false);
                t = self.c(t).right;
            } else {
                self.set_link(&mut root, rp, rl, t);
                (rp, rl) = (t, true);
                t = self.c(t).left;
            }
        }
        self.set_link(&mut root, lp, ll, NIL);
        self.set_link(&mut root, rp, rl, NIL);
        root
    }

    /// Removes the node with `key` (which must be in the tree) and returns the new root.
    fn tree_remove(&mut self, mut root: u32, key: (u64, u64)) -> u32 {
        let (mut parent, mut left) = (NIL, false);
        let mut t = root;
        loop {
            if t == NIL {
                debug_assert!(false, "key not in tree");
                return root;
            }
            let k = self.key(t);
            if key == k {
                break;
            }
            parent = t;
            left = key < k;
            t = if left {
                self.c(t).left
            } else {
                self.c(t).right
            };
        }
        // Merge the children into the freed link: the higher priority goes up.
        let (mut a, mut b) = (self.c(t).left, self.c(t).right);
        loop {
            if a == NIL {
                self.set_link(&mut root, parent, left, b);
                return root;
            }
            if b == NIL {
                self.set_link(&mut root, parent, left, a);
                return root;
            }
            if self.c(a).prio > self.c(b).prio {
                self.set_link(&mut root, parent, left, a);
                (parent, left) = (a, false);
                a = self.c(a).right;
            } else {
                self.set_link(&mut root, parent, left, b);
                (parent, left) = (b, true);
                b = self.c(b).left;
            }
        }
    }

    /// The smallest node with key >= `key`, or NIL.
    fn tree_lower_bound(&self, mut t: u32, key: (u64, u64)) -> u32 {
        let mut best = NIL;
        while t != NIL {
            if self.key(t) >= key {
                best = t;
                t = self.c(t).left;
            } else {
                t = self.c(t).right;
            }
        }
        best
    }

    fn tree_leftmost(&self, mut t: u32) -> u32 {
        while t != NIL && self.c(t).left != NIL {
            t = self.c(t).left;
        }
        t
    }

    // ---- best-fit index ----

    /// Files free chunk `i` as the hot chunk; the previous hot chunk goes to its treap.
    #[inline]
    fn index_insert_hot(&mut self, i: u32) {
        let old = self.hot;
        if old != NIL {
            self.counters.n_free -= 1;
            self.index_insert(old);
        }
        self.cm(i).state = State::Free;
        self.hot = i;
        self.counters.n_free += 1;
    }

    /// Files free chunk `i` in its class's treap.
    fn index_insert(&mut self, i: u32) {
        let (size, addr) = self.key(i);
        let class = class_of(size / super::ALLOCATION_UNIT as u64);
        let c = self.cm(i);
        c.state = State::Free;
        c.left = NIL;
        c.right = NIL;
        c.prio = priority(addr);
        self.roots[class] = self.tree_insert(self.roots[class], i);
        self.words[class / 64] |= 1 << (class % 64);
        self.summary |= 1 << (class / 64);
        self.counters.n_free += 1;
    }

    #[inline]
    fn index_remove(&mut self, i: u32) {
        if i == self.hot {
            self.hot = NIL;
            self.counters.n_free -= 1;
            return;
        }
        self.tree_remove_chunk(i);
    }

    fn tree_remove_chunk(&mut self, i: u32) {
        let key = self.key(i);
        let class = class_of(key.0 / super::ALLOCATION_UNIT as u64);
        self.roots[class] = self.tree_remove(self.roots[class], key);
        if self.roots[class] == NIL {
            self.words[class / 64] &= !(1 << (class % 64));
            if self.words[class / 64] == 0 {
                self.summary &= !(1 << (class / 64));
            }
        }
        self.counters.n_free -= 1;
    }

    /// First non-empty class >= `from`.
    #[inline]
    fn next_class(&self, from: usize) -> Option<usize> {
        if from >= N_CLASSES {
            return None;
        }
        let w = from / 64;
        let m = self.words[w] & (!0u64 << (from % 64));
        if m != 0 {
            return Some(w * 64 + m.trailing_zeros() as usize);
        }
        let s = if w + 1 < 64 {
            self.summary & (!0u64 << (w + 1))
        } else {
            0
        };
        if s == 0 {
            return None;
        }
        let w = s.trailing_zeros() as usize;
        Some(w * 64 + self.words[w].trailing_zeros() as usize)
    }

    /// Best fit: the free chunk with the smallest `(size, addr)` among those with
    /// `size >= want`, or NIL.
    #[inline]
    fn find(&self, want: u64) -> u32 {
        let class = class_of(want / super::ALLOCATION_UNIT as u64);
        let hot = self.hot;
        if hot != NIL && self.c(hot).size == want && self.roots[class] == NIL {
            // Nothing smaller fits and nothing else of this size exists.
            return hot;
        }
        let best = self.find_in_trees(class, want);
        if hot == NIL || self.c(hot).size < want {
            return best;
        }
        if best == NIL || self.key(hot) < self.key(best) {
            hot
        } else {
            best
        }
    }

    /// [`find`](Self::find) among the treaps only; `class` is `want`'s.
    fn find_in_trees(&self, class: usize, want: u64) -> u32 {
        let root = self.roots[class];
        if root != NIL {
            let i = self.tree_lower_bound(root, (want, 0));
            if i != NIL {
                return i;
            }
        }
        match self.next_class(class + 1) {
            Some(c) => self.tree_leftmost(self.roots[c]),
            None => NIL,
        }
    }

    // ---- operations ----

    /// Serves `size` (a rounded, positive size) from the free chunks: best fit,
    /// split, the caller gets the lower part. Returns `(chunk, addr)`; counts a hit.
    /// On `Ok(None)` (no fit) and on `Err` (a split needs a record and the slab is
    /// full) nothing changed.
    #[inline]
    pub fn malloc_cached(&mut self, size: u64) -> Result<Option<(u32, u64)>, SlabFull> {
        if let Some(hit) = self.take_hot_exact(size) {
            return Ok(Some(hit));
        }
        let i = self.find(size);
        if i == NIL {
            return Ok(None);
        }
        let c = *self.c(i);
        if c.size > size {
            // Take the record of the upper part first: the only step that can fail.
            let j = self
                .new_slot(Chunk {
                    addr: c.addr + size,
                    size: c.size - size,
                    prev: i,
                    next: c.next,
                    ..Chunk::VACANT
                })
                .ok_or(SlabFull)?;
            self.index_remove(i);
            if c.next != NIL {
                self.cm(c.next).prev = j;
            }
            let ci = self.cm(i);
            ci.next = j;
            ci.size = size;
            self.index_insert(j);
        } else {
            self.index_remove(i);
        }
        self.cm(i).state = State::Used;
        self.count_malloc(size);
        self.counters.hits += 1;
        Ok(Some((i, c.addr)))
    }

    /// The cached pair's path: the hot chunk, when it has exactly `size` bytes and
    /// its class treap is empty (so it is the best fit, see the module doc), handed
    /// out with no search and no split.
    #[inline]
    fn take_hot_exact(&mut self, size: u64) -> Option<(u32, u64)> {
        let i = self.hot;
        let c = self.chunks.get(i as usize)?;
        if c.size != size || self.roots[class_of(size / super::ALLOCATION_UNIT as u64)] != NIL {
            return None;
        }
        let addr = c.addr;
        self.hot = NIL;
        self.counters.n_free -= 1;
        self.cm(i).state = State::Used;
        self.count_malloc(size);
        self.counters.hits += 1;
        Some((i, addr))
    }

    #[inline]
    fn count_malloc(&mut self, size: u64) {
        let k = &mut self.counters;
        k.used += size;
        k.peak_used = k.peak_used.max(k.used);
        k.mallocs += 1;
    }

    /// A free of chunk `i` (handed out at `addr` with `size`) followed by a malloc of
    /// the same `size`, fused: when the free would file the chunk unmerged as the hot
    /// chunk and the malloc would then take it (no free neighbour, no other hot chunk,
    /// nothing else in its class), the chunk simply stays handed out and only the
    /// counters move. `false` (nothing changed) otherwise.
    #[inline]
    pub fn reuse_exact(&mut self, i: u32, addr: u64, size: u64) -> bool {
        if !self.reusable(i, addr, size) {
            return false;
        }
        let k = &mut self.counters;
        k.frees += 1;
        k.mallocs += 1;
        k.hits += 1;
        true
    }

    /// Whether chunk `i` is handed out at `addr` with `size`, and a free of it would
    /// file it unmerged as the hot chunk that a malloc of `size` then takes.
    fn reusable(&self, i: u32, addr: u64, size: u64) -> bool {
        let Some(c) = self.chunks.get(i as usize) else {
            return false;
        };
        let free = |j: u32| j != NIL && self.c(j).state == State::Free;
        c.state == State::Used
            && c.addr == addr
            && c.size == size
            && self.hot == NIL
            && !free(c.prev)
            && !free(c.next)
            && self.roots[class_of(size / super::ALLOCATION_UNIT as u64)] == NIL
    }

    /// Records a fresh backend allocation of `size` bytes at `addr`, handed out whole.
    /// On `Err` (slab full) nothing changed: the caller gives the memory back.
    pub fn add_allocation(&mut self, addr: u64, size: u64) -> Result<u32, SlabFull> {
        let i = self
            .new_slot(Chunk {
                addr,
                size,
                state: State::Used,
                ..Chunk::VACANT
            })
            .ok_or(SlabFull)?;
        self.counters.reserved += size;
        self.count_malloc(size);
        Ok(i)
    }

    /// Whether chunk `i` is in `state` at `addr` with `size`.
    #[inline]
    fn is(&self, i: u32, state: State, addr: u64, size: u64) -> bool {
        matches!(self.chunks.get(i as usize),
            Some(c) if c.state == state && c.addr == addr && c.size == size)
    }

    /// Takes back chunk `i` handed out at `addr` with `size` while stream work may
    /// still use it: it counts as freed (not in `used`) but stays out of the best-fit
    /// index, unmerged, until [`free_awaiting`](Self::free_awaiting).
    pub fn defer(&mut self, i: u32, addr: u64, size: u64) -> Result<(), NotLive> {
        if !self.is(i, State::Used, addr, size) {
            return Err(NotLive);
        }
        self.cm(i).state = State::Awaiting;
        let k = &mut self.counters;
        k.used -= size;
        k.frees += 1;
        k.awaiting += size;
        k.n_awaiting += 1;
        Ok(())
    }

    /// The stream work on awaiting chunk `i` ([`defer`](Self::defer)) is done: it
    /// merges with its free neighbours and is filed as free.
    pub fn free_awaiting(&mut self, i: u32, addr: u64, size: u64) -> Result<(), NotLive> {
        if !self.is(i, State::Awaiting, addr, size) {
            return Err(NotLive);
        }
        self.cm(i).state = State::Used;
        let k = &mut self.counters;
        k.awaiting -= size;
        k.n_awaiting -= 1;
        // Back through `free` as a used chunk; its free was counted at `defer`.
        k.used += size;
        k.frees -= 1;
        self.free(i, addr, size)
    }

    /// Takes back chunk `i` handed out at `addr` with `size`, merges it with free
    /// neighbours of the same backend allocation and files it as free.
    #[inline]
    pub fn free(&mut self, mut i: u32, addr: u64, size: u64) -> Result<(), NotLive> {
        if !self.is(i, State::Used, addr, size) {
            return Err(NotLive);
        }
        self.counters.used -= size;
        self.counters.frees += 1;
        let p = self.c(i).prev;
        if p != NIL && self.c(p).state == State::Free {
            self.index_remove(p);
            self.absorb_next(p);
            i = p;
        }
        let n = self.c(i).next;
        if n != NIL && self.c(n).state == State::Free {
            self.index_remove(n);
            self.absorb_next(i);
        }
        self.index_insert_hot(i);
        Ok(())
    }

    /// Removes every free chunk that is a whole backend allocation (not split) and
    /// appends `(addr, size)` of each to `out`, for the caller to give back.
    pub fn release_whole(&mut self, out: &mut Vec<(u64, u64)>) {
        self.release_whole_where(out, |_| true);
    }

    /// As [`release_whole`](Self::release_whole), for the chunks whose size passes `pick`.
    pub fn release_whole_where(&mut self, out: &mut Vec<(u64, u64)>, pick: impl Fn(u64) -> bool) {
        for i in 0..self.chunks.len() as u32 {
            let c = *self.c(i);
            if c.state == State::Free
                && c.prev == NIL
                && c.next == NIL
                && pick(c.size)
                && !self.is_segment_head(i)
            {
                self.index_remove(i);
                self.vacate(i);
                self.counters.reserved -= c.size;
                out.push((c.addr, c.size));
            }
        }
    }

    /// Every backend allocation of the arena (a segment) with its chunks in address
    /// order: `(segment address, expandable, [(chunk address, size, in use)])`, sorted
    /// by address (a chunk awaiting its streams counts as in use). An expandable
    /// segment with holes shows as one segment per mapped run, as PyTorch's snapshot
    /// does: only mapped chunks are listed.
    pub fn segments(&self) -> Vec<SegmentChunks> {
        let mut out = Vec::new();
        for (i, c) in self.chunks.iter().enumerate() {
            if c.state == State::Vacant || c.prev != NIL {
                continue;
            }
            let expandable = self.is_segment_head(i as u32);
            let mut blocks = Vec::new();
            let mut j = i as u32;
            while j != NIL {
                let b = self.c(j);
                if b.state == State::Unmapped {
                    if let Some(&(addr, _, _)) = blocks.first() {
                        out.push((addr, expandable, std::mem::take(&mut blocks)));
                    }
                } else {
                    blocks.push((b.addr, b.size, b.state != State::Free));
                }
                j = b.next;
            }
            if let Some(&(addr, _, _)) = blocks.first() {
                out.push((addr, expandable, blocks));
            }
        }
        out.sort_unstable_by_key(|(a, _, _)| *a);
        out
    }

    /// Free chunks as `(addr, size)`, for tests and debugging.
    pub fn free_chunks(&self) -> Vec<(u64, u64)> {
        self.chunks
            .iter()
            .filter(|c| c.state == State::Free)
            .map(|c| (c.addr, c.size))
            .collect()
    }

    /// Checks every structural invariant; `Err` names the first one broken.
    pub fn check(&self) -> Result<(), String> {
        let unit = super::ALLOCATION_UNIT as u64;
        let (mut total, mut used, mut n_free) = (0u64, 0u64, 0u64);
        let (mut awaiting, mut n_awaiting) = (0u64, 0u64);
        for (i, c) in self.chunks.iter().enumerate() {
            let i = i as u32;
            match c.state {
                State::Vacant => continue,
                State::Free => n_free += 1,
                State::Used => used += c.size,
                State::Awaiting => {
                    awaiting += c.size;
                    n_awaiting += 1;
                }
                State::Unmapped => {}
            }
            if c.state != State::Unmapped {
                total += c.size;
            }
            if c.size == 0 || c.size % unit != 0 || c.addr % unit != 0 {
                return Err(format!("chunk {i} has addr {:#x} size {}", c.addr, c.size));
            }
            if c.prev != NIL {
                let p = self.c(c.prev);
                if p.state == State::Vacant || p.next != i || p.addr + p.size != c.addr {
                    return Err(format!("chunk {i}: broken prev link"));
                }
                if p.state == c.state && matches!(c.state, State::Free | State::Unmapped) {
                    return Err(format!(
                        "chunk {i}: two adjacent free chunks or holes not merged"
                    ));
                }
            }
            if c.next != NIL {
                let n = self.c(c.next);
                if n.state == State::Vacant || n.prev != i || c.addr + c.size != n.addr {
                    return Err(format!("chunk {i}: broken next link"));
                }
            }
        }
        if total != self.counters.reserved {
            return Err(format!(
                "chunks sum to {total}, reserved is {}",
                self.counters.reserved
            ));
        }
        if used != self.counters.used {
            return Err(format!(
                "used chunks sum to {used}, used is {}",
                self.counters.used
            ));
        }
        if (awaiting, n_awaiting) != (self.counters.awaiting, self.counters.n_awaiting) {
            return Err(format!(
                "{n_awaiting} awaiting chunks of {awaiting} bytes, counters say {} of {}",
                self.counters.n_awaiting, self.counters.awaiting
            ));
        }
        if n_free != self.counters.n_free {
            return Err(format!(
                "{n_free} free chunks, counter says {}",
                self.counters.n_free
            ));
        }
        let mut in_trees = 0u64;
        if self.hot != NIL {
            if self.c(self.hot).state != State::Free {
                return Err(format!("hot chunk {} is not free", self.hot));
            }
            in_trees += 1;
        }
        for class in 0..N_CLASSES {
            let root = self.roots[class];
            let bit = self.words[class / 64] >> (class % 64) & 1 == 1;
            if bit != (root != NIL) {
                return Err(format!("class {class}: bitmap disagrees with tree"));
            }
            in_trees += self.check_tree(root, class, None, None)?;
        }
        for w in 0..N_WORDS {
            if (self.words[w] != 0) != (self.summary >> w & 1 == 1) {
                return Err(format!("summary bit {w} wrong"));
            }
        }
        if in_trees != n_free {
            return Err(format!("{in_trees} chunks in trees, {n_free} free"));
        }
        self.check_segments()
    }

    fn check_tree(
        &self,
        t: u32,
        class: usize,
        lo: Option<(u64, u64)>,
        hi: Option<(u64, u64)>,
    ) -> Result<u64, String> {
        if t == NIL {
            return Ok(0);
        }
        let c = self.c(t);
        let k = self.key(t);
        if c.state != State::Free
            || class_of(c.size / super::ALLOCATION_UNIT as u64) != class
            || lo.is_some_and(|lo| k <= lo)
            || hi.is_some_and(|hi| k >= hi)
        {
            return Err(format!("tree of class {class}: bad node {t}"));
        }
        for child in [c.left, c.right] {
            if child != NIL && self.c(child).prio > c.prio {
                return Err(format!("tree of class {class}: heap order broken at {t}"));
            }
        }
        Ok(1 + self.check_tree(c.left, class, lo, Some(k))?
            + self.check_tree(c.right, class, Some(k), hi)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_monotonic_and_bounded() {
        let mut units: Vec<u64> = (1..5000).collect();
        for shift in 12..55 {
            let u = 1u64 << shift;
            units.extend([u - 1, u, u + 1, u + u / 3, u + u / 2]);
        }
        units.sort_unstable();
        for w in units.windows(2) {
            assert!(
                class_of(w[0]) <= class_of(w[1]),
                "class_of({}) > class_of({})",
                w[0],
                w[1]
            );
        }
        assert_eq!(class_of(15), 15);
        assert_eq!(class_of(16), 16);
        assert!(class_of(u64::MAX / 512) < N_CLASSES);
    }

    /// `reuse_exact` says yes only while the fused free + malloc gives the chunk back
    /// exactly: a neighbour freed, or a chunk of the same class filed, ends it.
    #[test]
    fn a_reuse_is_refused_once_a_free_would_merge_or_a_better_fit_exists() {
        let mut b = Bins::new();
        // One allocation of 4 KiB split in four 1 KiB blocks, all handed out.
        let whole = b.add_allocation(0x10000, 4096).unwrap();
        b.free(whole, 0x10000, 4096).unwrap();
        let blocks: Vec<(u32, u64)> = (0..4)
            .map(|_| b.malloc_cached(1024).unwrap().unwrap())
            .collect();
        let (i, addr) = blocks[1];
        // Reusable, twice.
        assert!(b.reuse_exact(i, addr, 1024));
        assert!(b.reuse_exact(i, addr, 1024));
        // Another size is refused; another chunk of the same size is reusable too.
        assert!(!b.reuse_exact(i, addr, 1536));
        assert!(b.reuse_exact(blocks[3].0, blocks[3].1, 1024));
        assert!(b.reuse_exact(i, addr, 1024));
        // A free neighbour: the free would merge, so no reuse.
        let (p, paddr) = blocks[0];
        b.free(p, paddr, 1024).unwrap();
        assert!(!b.reuse_exact(i, addr, 1024));
        // Taken again: reusable again.
        assert_eq!(b.malloc_cached(1024).unwrap(), Some((p, paddr)));
        assert!(b.reuse_exact(i, addr, 1024));
        // A free chunk of the same class elsewhere (another allocation): it may be
        // the better fit, so no reuse.
        let other = b.add_allocation(0x20000, 1024).unwrap();
        assert!(b.reuse_exact(i, addr, 1024));
        b.free(other, 0x20000, 1024).unwrap();
        assert!(!b.reuse_exact(i, addr, 1024));
        b.check().unwrap();
        let k = &b.counters;
        assert_eq!(k.mallocs - k.frees, 4, "four blocks still handed out");
    }
}
