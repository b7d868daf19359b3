//! Handles: what C holds instead of pointers to Rust objects.
//!
//! A handle's value is `kind << 56 | generation << 32 | (index + 1)`: an index into
//! the table of its kind, the generation of that slot when the object went in, and the
//! kind, so that a handle of one kind passed for another, a destroyed handle (its
//! slot's generation moved on), or a made-up value is found out by a lookup and
//! reported as `CURT_ERROR_INVALID_HANDLE`, never dereferenced. Objects sit in the
//! table behind a reference count (an `Arc`, or memory's own `MemoryPointer`): a
//! lookup clones it, so a destroy on another thread during a call only drops the
//! table's reference.
//!
//! A slot's generation is never reused: the generation has 24 bits, so a slot whose
//! generation reaches its last value is retired when that object is removed (never
//! put back on the free list) instead of wrapping to 0, where a handle destroyed
//! 2^24 reuses earlier would match again and, say, `curt_free` through it would free
//! the new owner's memory. A retired slot costs its few dozen bytes for good: one per
//! 2^24 objects of a kind.
//!
//! The table takes no lock (see [`Table`]): each slot has a state word (generation,
//! live bit, count of lookups cloning its value), so a lookup or a removal of a stale
//! or made-up handle fails on that word without touching the value, and a removal
//! waits out the lookups cloning the value before it takes it.

#![allow(non_camel_case_types)]

use std::cell::{Cell, UnsafeCell};
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, Ordering};

use super::status::{Fail, Res};

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the C shim's handles need 64-bit pointers");

macro_rules! handle_types {
    ($($s:ident, $t:ident, $what:literal;)*) => {$(
        #[doc = concat!("The opaque type behind a ", $what, " handle; never dereferenced.")]
        #[repr(C)]
        pub struct $s {
            _private: [u8; 0],
        }
        #[doc = concat!("A ", $what, " handle (`", stringify!($t), "` in wrapper.h).")]
        pub type $t = *mut $s;
    )*};
}

handle_types! {
    curt_stream_s, curt_stream_t, "stream";
    curt_event_s, curt_event_t, "event";
    curt_memory_s, curt_memory_t, "device memory";
    curt_pinned_s, curt_pinned_t, "pinned memory";
    curt_module_s, curt_module_t, "module";
    curt_function_s, curt_function_t, "kernel function";
    curt_graph_s, curt_graph_t, "graph";
    curt_recorder_s, curt_recorder_t, "graph recorder";
}

/// A slot's state word: `generation << 32 | LIVE | readers`. `LIVE` is set while the
/// slot holds a value; `readers` counts the lookups cloning that value right now (a
/// removal waits for them); the generation is that of the handle the value was put
/// in with.
const LIVE: u64 = 1 << 31;
const READERS: u64 = LIVE - 1;

struct Slot<T> {
    state: AtomicU64,
    /// The next free slot's index + 1 (0: none) while this slot is on the free list.
    next: AtomicU32,
    /// Initialized exactly while `state` has `LIVE` or a removal that took `LIVE`
    /// away has not yet read the value out.
    value: UnsafeCell<MaybeUninit<T>>,
}

impl<T> Slot<T> {
    fn empty() -> Self {
        Slot {
            state: AtomicU64::new(0),
            next: AtomicU32::new(0),
            value: UnsafeCell::new(MaybeUninit::uninit()),
        }
    }
}

/// Slots come in segments of `FIRST_SEGMENT << k` for segment `k`, allocated when
/// first needed and never moved or freed while the table lives, so a lookup reaches a
/// slot without a lock; 27 segments cover every 32-bit index.
const FIRST_SEGMENT_BITS: u32 = 6;
const SEGMENTS: usize = 27;

/// Segment and offset of slot `index`.
#[inline]
fn locate(index: u32) -> (usize, usize) {
    let j = index as u64 + (1 << FIRST_SEGMENT_BITS);
    let k = 63 - j.leading_zeros() - FIRST_SEGMENT_BITS;
    (
        k as usize,
        (j - (1u64 << (FIRST_SEGMENT_BITS + k))) as usize,
    )
}

fn segment_len(k: usize) -> usize {
    1 << (FIRST_SEGMENT_BITS as usize + k)
}

/// One kind's table, lock-free: a slot's state word says whether it is live and of
/// which generation, so insert, lookup and remove are a few atomic operations on the
/// slot and on the free list (a Treiber stack of slot indices, its head tagged
/// against ABA). Under the `RwLock` it had before, a `curt_malloc` + `curt_free`
/// pair spent about 185 instructions in the table; see issue 27.
///
/// `T` is what a lookup hands out, a clone of what the table holds: an `Arc` of the
/// object for most kinds, so a destroy on another thread during a call only drops the
/// table's reference; memory is held as its `MemoryPointer` itself, which is already a
/// reference-counted handle (an `Arc` around it cost a heap allocation and a free per
/// `curt_malloc` + `curt_free` pair).
pub(crate) struct Table<T> {
    kind: u8,
    what: &'static str,
    segments: [AtomicPtr<Slot<T>>; SEGMENTS],
    /// The free list's head: `tag << 32 | (index + 1)`, 0 in the low half when empty.
    free: AtomicU64,
    /// Slots handed out so far (the next fresh index).
    fresh: AtomicU32,
}

// SAFETY: the table moves values between threads (inserted on one, removed on
// another: `T: Send`) and lookups clone them through a shared reference on any thread
// (`T: Sync`); every access to a value is ordered by its slot's state word.
unsafe impl<T: Send + Sync> Sync for Table<T> {}
// SAFETY: as above; the segments are owned by the table.
unsafe impl<T: Send + Sync> Send for Table<T> {}

const INDEX_BITS: u32 = 32;
const GENERATION_MASK: u64 = 0x00ff_ffff;

/// Decrements a slot's reader count when a lookup is done, also if a clone panics (a
/// reader left counted would stall the slot's removal for good).
struct ReadGuard<'a>(&'a AtomicU64);

impl Drop for ReadGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Release);
    }
}

impl<T> Table<T> {
    pub(crate) const fn new(kind: u8, what: &'static str) -> Self {
        // Kind 0 would let the NULL handle pass the kind check.
        assert!(kind != 0, "kind 0 is reserved");
        Table {
            kind,
            what,
            segments: [const { AtomicPtr::new(std::ptr::null_mut()) }; SEGMENTS],
            free: AtomicU64::new(0),
            fresh: AtomicU32::new(0),
        }
    }

    fn encode(&self, index: u32, generation: u32) -> u64 {
        ((self.kind as u64) << 56)
            | ((generation as u64 & GENERATION_MASK) << INDEX_BITS)
            | (index as u64 + 1)
    }

    /// Slot `index`, when its segment exists.
    #[inline]
    fn slot(&self, index: u32) -> Option<&Slot<T>> {
        let (k, off) = locate(index);
        let seg = self.segments[k].load(Ordering::Acquire);
        if seg.is_null() {
            return None;
        }
        // SAFETY: a non-null segment `k` is an allocation of `segment_len(k)` slots
        // (published with Release in `segment`), never freed while the table lives,
        // and `off < segment_len(k)` by `locate`.
        Some(unsafe { &*seg.add(off) })
    }

    /// Segment `k`, allocated if it is not yet.
    #[cold]
    #[inline(never)]
    fn segment(&self, k: usize) -> *mut Slot<T> {
        let seg = self.segments[k].load(Ordering::Acquire);
        if !seg.is_null() {
            return seg;
        }
        let new: Box<[Slot<T>]> = (0..segment_len(k)).map(|_| Slot::empty()).collect();
        let new = Box::into_raw(new).cast::<Slot<T>>();
        match self.segments[k].compare_exchange(
            std::ptr::null_mut(),
            new,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => new,
            Err(theirs) => {
                // SAFETY: `new` came from `Box::into_raw` of `segment_len(k)` slots
                // just above and was never published.
                drop(unsafe {
                    Box::from_raw(std::ptr::slice_from_raw_parts_mut(new, segment_len(k)))
                });
                theirs
            }
        }
    }

    /// A free slot's index, taken off the free list, else a fresh one.
    #[inline]
    fn take_free(&self) -> (u32, &Slot<T>) {
        let mut head = self.free.load(Ordering::Acquire);
        loop {
            let Some(index) = (head as u32).checked_sub(1) else {
                return self.take_fresh();
            };
            // The slot exists: only slots of allocated segments are ever pushed. Its
            // `next` may be stale when another thread popped it meanwhile; then the
            // head's tag moved on and the exchange fails.
            let slot = self.slot(index).expect("a freed slot's segment exists");
            let next = slot.next.load(Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | next as u64;
            match self
                .free
                .compare_exchange_weak(head, new, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return (index, slot),
                Err(h) => head = h,
            }
        }
    }

    #[cold]
    #[inline(never)]
    fn take_fresh(&self) -> (u32, &Slot<T>) {
        let index = self
            .fresh
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |i| {
                // Index + 1 must fit the handle's 32 bits.
                (i < u32::MAX - 1).then_some(i + 1)
            })
            .unwrap_or_else(|_| panic!("the {} table is full (2^32 - 1 slots)", self.what));
        self.segment(locate(index).0);
        (
            index,
            self.slot(index).expect("a fresh slot's segment exists"),
        )
    }

    /// Puts slot `index` (empty, owned by the caller) on the free list.
    #[inline]
    fn give_back(&self, index: u32, slot: &Slot<T>) {
        let mut head = self.free.load(Ordering::Relaxed);
        loop {
            slot.next.store(head as u32, Ordering::Relaxed);
            let new = ((head >> 32).wrapping_add(1) << 32) | (index as u64 + 1);
            match self
                .free
                .compare_exchange_weak(head, new, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(h) => head = h,
            }
        }
    }

    /// Puts `value` in the table and returns its handle (never 0).
    #[inline]
    pub(crate) fn insert(&self, value: T) -> u64 {
        let (index, slot) = self.take_free();
        self.fill(index, slot, value)
    }

    /// A slot for an insert: the one `spare` holds when it is this table's (no
    /// free-list exchange; `spare` is then used up), else a free one. Two words, so
    /// that taking it from a thread-local returns it in registers, and the value, put
    /// in by [`Vacant::fill`] outside, is never moved through the thread-local's
    /// closure (a copy through the stack that the processor could not forward).
    #[inline]
    pub(crate) fn vacant(&'static self, spare: &Cell<Option<Spare<T>>>) -> Vacant<T> {
        let (index, slot) = match spare.take() {
            Some(sp) if std::ptr::eq(sp.table, self) => (sp.index, sp.slot),
            other => {
                spare.set(other);
                self.take_free()
            }
        };
        Vacant {
            table: self,
            index,
            slot,
        }
    }

    /// Puts `value` in slot `index`, empty and off the free list (the caller's), and
    /// returns its handle.
    #[inline]
    fn fill(&self, index: u32, slot: &Slot<T>, value: T) -> u64 {
        // Not live and off the free list: no other thread reads or writes the value
        // (a lookup only touches it after raising the reader count of a live slot).
        let generation = (slot.state.load(Ordering::Relaxed) >> 32) as u32;
        // SAFETY: the slot is ours alone (above) and holds no value.
        unsafe { (*slot.value.get()).write(value) };
        slot.state
            .store(((generation as u64) << 32) | LIVE, Ordering::Release);
        self.encode(index, generation)
    }

    /// The slot of `handle` when it is one of this table's handles (live or not), and
    /// the state word a live slot of the handle's generation has with no reader.
    #[inline]
    fn find(&self, handle: u64) -> Option<(&Slot<T>, u64)> {
        if (handle >> 56) as u8 != self.kind {
            return None;
        }
        let index = ((handle & 0xffff_ffff) as u32).checked_sub(1)?;
        let generation = (handle >> INDEX_BITS) & GENERATION_MASK;
        Some((self.slot(index)?, generation << 32 | LIVE))
    }

    /// Why `handle` was refused. Out of line: only a bad handle pays for the message.
    #[cold]
    #[inline(never)]
    pub(crate) fn refuse(&self, handle: u64) -> Fail {
        if handle == 0 {
            self.null()
        } else {
            self.bad(handle)
        }
    }

    #[cold]
    #[inline(never)]
    fn null(&self) -> Fail {
        Fail::Handle(format!("the {} handle is NULL", self.what))
    }

    #[cold]
    #[inline(never)]
    fn bad(&self, handle: u64) -> Fail {
        Fail::Handle(format!(
            "invalid {} handle {handle:#x}: destroyed already, of another kind, or never \
             returned by cuda-rt",
            self.what
        ))
    }

    /// The object behind `handle`.
    pub(crate) fn get(&self, handle: u64) -> Res<T>
    where
        T: Clone,
    {
        self.with(handle, T::clone)
    }

    /// `f` of the object behind `handle`, borrowed: counted as a reader meanwhile (a
    /// removal waits for it), so nothing is cloned. For a short `f` that needs the
    /// object only during the call (a stream's device and address for an
    /// allocation): an `Arc`'s clone and drop cost two more atomic read-modify-writes.
    #[inline]
    pub(crate) fn with<R>(&self, handle: u64, f: impl FnOnce(&T) -> R) -> Res<R> {
        let Some((slot, want)) = self.find(handle) else {
            return Err(self.refuse(handle));
        };
        let mut s = slot.state.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            if s & !READERS != want {
                return Err(self.refuse(handle));
            }
            if s & READERS == EXCLUSIVE {
                // A `with_mut` has the value: it is a few instructions long.
                backoff(&mut spins);
                s = slot.state.load(Ordering::Relaxed);
                continue;
            }
            match slot
                .state
                .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        let _reading = ReadGuard(&slot.state);
        // SAFETY: the slot was live with the handle's generation when the reader count
        // went up (Acquire: after the insert's Release store of the value), and a
        // removal takes the value out only once no reader is counted, so it stays
        // initialized and unmoved until `_reading` is dropped, after `f`.
        Ok(f(unsafe { (*slot.value.get()).assume_init_ref() }))
    }

    /// A probe of whether `handle` is live ([`Live::now`]), `None` when it is not one
    /// of this table's handles at all. What was read of the object behind it while
    /// it was live still describes it as long as the probe says live (a slot's
    /// generation is never reused, so a live state of the handle's generation is the
    /// same object, unless [`with_mut`](Self::with_mut) changes it in place).
    #[inline]
    pub(crate) fn live(&'static self, handle: u64) -> Option<Live> {
        let (slot, want) = self.find(handle)?;
        Some(Live {
            state: &slot.state,
            want,
        })
    }

    /// `f` of the object behind `handle`, which it may change in place: the one
    /// reader meanwhile (it waits for the lookups cloning the object, and they and a
    /// removal wait for it). One exchange to begin, a store to end: fewer atomic
    /// read-modify-writes than [`get`](Self::get), for values that are not a plain
    /// clone.
    pub(crate) fn with_mut<R>(&self, handle: u64, f: impl FnOnce(&mut T) -> R) -> Res<R> {
        let Some((slot, want)) = self.find(handle) else {
            return Err(self.refuse(handle));
        };
        let mut s = slot.state.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            if s & !READERS != want {
                return Err(self.refuse(handle));
            }
            if s & READERS != 0 {
                backoff(&mut spins);
                s = slot.state.load(Ordering::Relaxed);
                continue;
            }
            match slot.state.compare_exchange_weak(
                s,
                s | EXCLUSIVE,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        // Back to live with no reader when done, also if `f` panics. A plain store:
        // while `EXCLUSIVE` is set no other thread changes the state (lookups and
        // removals wait for the count to fall, and it is not theirs to lower).
        struct Done<'a>(&'a AtomicU64, u64);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(self.1, Ordering::Release);
            }
        }
        let _done = Done(&slot.state, want);
        // SAFETY: the slot was live with the handle's generation and no reader when
        // this call set `EXCLUSIVE` (Acquire: after the insert's Release store of the
        // value); no lookup reads and no removal takes the value until `_done` clears
        // it, so this is its one access.
        Ok(f(unsafe { (*slot.value.get()).assume_init_mut() }))
    }

    /// Takes the object behind `handle` out of the table (the handle is dead from now
    /// on, for good) and returns it, to be dropped by the caller. The slot goes back on
    /// the free list with the next generation, or, when its generation was the last
    /// one, is retired: a generation that wrapped would bring the slot's first handle
    /// back to life. A lookup cloning the value right now is waited for (a clone is a
    /// reference count's increment).
    #[inline]
    pub(crate) fn remove(&self, handle: u64) -> Res<T> {
        match self.take(handle) {
            Some((v, freed)) => {
                if let Some((index, slot)) = freed {
                    self.give_back(index, slot);
                }
                Ok(v)
            }
            None => Err(self.refuse(handle)),
        }
    }

    /// [`remove`](Self::remove) without the message (false for a bad handle: see
    /// [`refuse`](Self::refuse)) that drops the object where it lies (moving it out
    /// first cost a copy through the stack that the drop then read back), then keeps
    /// the freed slot in `spare` when `keep` and `spare` holds none (for this thread's
    /// next [`vacant`](Self::vacant)), else puts it on the free list.
    /// The slot is reused only after the drop: dropping may run code that inserts
    /// through the same `spare` (a memory hook allocating through the C ABI). If the
    /// drop panics, the slot is lost, nothing worse.
    #[inline]
    pub(crate) fn remove_spared(
        &'static self,
        handle: u64,
        spare: &Cell<Option<Spare<T>>>,
        keep: bool,
    ) -> bool {
        let Some((index, slot, reusable)) = self.claim(handle) else {
            return false;
        };
        // SAFETY: `claim` took `LIVE` away from the handle's generation with no reader
        // counted: the value is initialized and this call's alone; it is dropped once
        // and the slot, not live, is never read as holding it again.
        unsafe { (*slot.value.get()).assume_init_drop() };
        if reusable {
            self.spare_or_give_back(index, slot, spare, keep);
        }
        true
    }

    /// Keeps the empty slot `index` (off the free list, the caller's) in `spare` when
    /// `keep` and `spare` holds none, else puts it on the free list.
    #[inline]
    fn spare_or_give_back(
        &'static self,
        index: u32,
        slot: &'static Slot<T>,
        spare: &Cell<Option<Spare<T>>>,
        keep: bool,
    ) {
        match spare.take() {
            None if keep => spare.set(Some(Spare {
                table: self,
                index,
                slot,
            })),
            other => {
                spare.set(other);
                self.give_back(index, slot);
            }
        }
    }

    /// [`remove`](Self::remove) without the message (`None` for a bad handle) and
    /// without the free list: the value, and the emptied slot for the caller to put
    /// back (`None` when it is retired).
    #[inline]
    #[allow(clippy::type_complexity)]
    fn take(&self, handle: u64) -> Option<(T, Option<(u32, &Slot<T>)>)> {
        let (index, slot, reusable) = self.claim(handle)?;
        // SAFETY: `claim` took `LIVE` away from the handle's generation with no reader
        // counted: the value is initialized and this call's alone to take.
        let value = unsafe { (*slot.value.get()).assume_init_read() };
        Some((value, reusable.then_some((index, slot))))
    }

    /// Makes `handle`'s slot not live (the handle dead for good), waiting for lookups
    /// cloning its value: the slot, its index and whether it may be reused (a slot
    /// whose generation was the last one is retired: the generation stays and the
    /// slot stays empty, so no handle finds it again). The value is left initialized,
    /// the caller's to read out. `None` for a bad handle.
    #[inline]
    fn claim(&self, handle: u64) -> Option<(u32, &Slot<T>, bool)> {
        let (slot, want) = self.find(handle)?;
        let generation = want >> 32;
        let reusable = generation < GENERATION_MASK;
        let next = if reusable { generation + 1 } else { generation };
        let mut s = slot.state.load(Ordering::Relaxed);
        let mut spins = 0u32;
        loop {
            if s & !READERS != want {
                return None;
            }
            if s & READERS != 0 {
                backoff(&mut spins);
                s = slot.state.load(Ordering::Relaxed);
                continue;
            }
            match slot.state.compare_exchange_weak(
                s,
                next << 32,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                // Only one exchange from a live state of this generation succeeds, and
                // no reader counts itself on a slot that is not live.
                Ok(_) => break,
                Err(now) => s = now,
            }
        }
        Some(((handle & 0xffff_ffff) as u32 - 1, slot, reusable))
    }

    /// Moves the live object behind `handle` to `generation` of its slot (a test's
    /// shortcut past 2^24 reuses) and returns its new handle.
    #[cfg(test)]
    fn age(&self, handle: u64, generation: u32) -> u64 {
        let (slot, want) = self.find(handle).expect("a handle");
        let g = generation as u64 & GENERATION_MASK;
        slot.state
            .compare_exchange(want, g << 32 | LIVE, Ordering::AcqRel, Ordering::Relaxed)
            .expect("a live handle, no reader");
        self.encode((handle & 0xffff_ffff) as u32 - 1, g as u32)
    }
}

/// Whether one handle of a `'static` table is live ([`Table::live`]): its slot's
/// state word and the state it has while the handle is live. One load to ask, no
/// read-modify-write.
#[derive(Clone, Copy)]
pub(crate) struct Live {
    state: &'static AtomicU64,
    want: u64,
}

impl Live {
    /// Whether the handle is live right now (lookups under way count as live).
    #[inline]
    pub(crate) fn now(&self) -> bool {
        self.state.load(Ordering::Acquire) & !READERS == self.want
    }
}

/// A free slot of a `'static` table held by one thread: freed by its
/// [`remove_spared`](Table::remove_spared), empty and off the free list, kept for its
/// next [`vacant`](Table::vacant), so that a remove + insert pair of one
/// thread makes no free-list exchange. Neither `Clone` nor `Copy`: whoever holds it owns
/// the slot. [`give_back`](Self::give_back) puts it on the free list; one dropped
/// without that costs its slot for good, nothing worse.
#[must_use = "a spare slot dropped without `give_back` is lost to its table"]
pub(crate) struct Spare<T: 'static> {
    table: &'static Table<T>,
    index: u32,
    slot: &'static Slot<T>,
}

impl<T> Spare<T> {
    /// Puts the slot on its table's free list.
    pub(crate) fn give_back(self) {
        self.table.give_back(self.index, self.slot);
    }
}

/// A slot of a `'static` table taken for one insert ([`Table::vacant`]): empty, off
/// the free list, the holder's. [`fill`](Self::fill) puts the value in;
/// [`keep`](Self::keep) hands it back unfilled.
#[must_use = "a vacant slot dropped without `fill` or `keep` is lost to its table"]
pub(crate) struct Vacant<T: 'static> {
    table: &'static Table<T>,
    index: u32,
    slot: &'static Slot<T>,
}

impl<T> Vacant<T> {
    /// Puts `value` in the slot and returns its handle.
    #[inline]
    pub(crate) fn fill(self, value: T) -> u64 {
        self.table.fill(self.index, self.slot, value)
    }

    /// Gives the slot back unfilled: kept in `spare` when `keep` and `spare` holds
    /// none (as [`Table::remove_spared`] keeps a freed one), else on the free list.
    #[inline]
    pub(crate) fn keep(self, spare: &Cell<Option<Spare<T>>>, keep: bool) {
        self.table
            .spare_or_give_back(self.index, self.slot, spare, keep);
    }
}

/// The reader count that marks a [`Table::with_mut`] under way (every bit of the
/// count: never reached by lookups, each a clone long).
const EXCLUSIVE: u64 = READERS;

/// Backs off while another thread holds what this one waits for (a lookup cloning the
/// value a removal waits for here; an entry of the drop-in's direct map): spins a
/// little, then yields.
#[cold]
pub(crate) fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

impl<T> Drop for Table<T> {
    fn drop(&mut self) {
        for (k, seg) in self.segments.iter_mut().enumerate() {
            let seg = *seg.get_mut();
            if seg.is_null() {
                continue;
            }
            // SAFETY: a non-null segment came from `Box::into_raw` of
            // `segment_len(k)` slots; the table is dropped, so nothing else uses it.
            let mut slots =
                unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(seg, segment_len(k))) };
            for slot in slots.iter_mut() {
                if *slot.state.get_mut() & LIVE != 0 {
                    // SAFETY: a live slot holds an initialized value.
                    unsafe { slot.value.get_mut().assume_init_drop() };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::status::CURT_ERROR_INVALID_HANDLE;
    use std::sync::Arc;

    fn code<T>(r: Res<T>) -> i32 {
        match r {
            Ok(_) => 0,
            Err(e) => e.code_and_message().0,
        }
    }

    #[test]
    fn a_destroyed_handle_is_invalid_also_after_its_slot_is_reused() {
        static T: Table<Arc<u32>> = Table::new(9, "test");
        let h = T.insert(Arc::new(7));
        assert_eq!(*T.get(h).unwrap(), 7);
        assert_eq!(*T.remove(h).unwrap(), 7);
        assert_eq!(code(T.get(h)), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(code(T.remove(h)), CURT_ERROR_INVALID_HANDLE);
        let h2 = T.insert(Arc::new(8));
        assert_ne!(h, h2, "the reused slot has a new generation");
        assert_eq!(code(T.get(h)), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(*T.get(h2).unwrap(), 8);
    }

    #[test]
    fn a_slot_whose_generation_would_wrap_is_retired_and_its_old_handles_stay_invalid() {
        static T: Table<Arc<u32>> = Table::new(12, "test");
        let first = T.insert(Arc::new(1));
        assert_eq!(*T.remove(first).unwrap(), 1);
        // The slot is reused with the next generation; then 2^24 - 2 more reuses
        // later it holds an object of the last generation.
        let reused = T.insert(Arc::new(2));
        assert_eq!(reused & 0xffff_ffff, first & 0xffff_ffff, "the same slot");
        let last = T.age(reused, GENERATION_MASK as u32);
        assert_eq!(code(T.get(reused)), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(*T.get(last).unwrap(), 2);
        assert_eq!(*T.remove(last).unwrap(), 2);
        // Wrapping would give generation 0 again, the first handle's: the slot is
        // retired instead, and no later object lands in it.
        let later: Vec<u64> = (0..4).map(|n| T.insert(Arc::new(10 + n))).collect();
        for &h in &later {
            assert_ne!(
                h & 0xffff_ffff,
                first & 0xffff_ffff,
                "a retired slot reused"
            );
        }
        for old in [first, reused, last] {
            assert_eq!(code(T.get(old)), CURT_ERROR_INVALID_HANDLE, "{old:#x}");
            assert_eq!(code(T.remove(old)), CURT_ERROR_INVALID_HANDLE, "{old:#x}");
        }
        for (n, &h) in later.iter().enumerate() {
            assert_eq!(*T.get(h).unwrap(), 10 + n as u32);
        }
    }

    /// Several threads insert, look up and remove at once, each also removing and
    /// looking up handles the others inserted, and every thread keeps trying stale
    /// handles: each value is removed exactly once, by whichever thread wins, and a
    /// dead handle never reaches a later value of its slot.
    #[test]
    fn concurrent_inserts_lookups_and_removes_keep_every_handle_exact() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Mutex;
        static T: Table<Arc<u64>> = Table::new(13, "test");
        const THREADS: u64 = 4;
        const ROUNDS: u64 = if cfg!(miri) { 300 } else { 20_000 };
        let shared: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
        let removed = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let shared = &shared;
                let removed = &removed;
                scope.spawn(move || {
                    let mut dead = Vec::new();
                    for r in 0..ROUNDS {
                        let v = t << 32 | r;
                        let h = T.insert(Arc::new(v));
                        assert_eq!(*T.get(h).unwrap(), v);
                        if r % 3 == 0 {
                            // Left for any thread to remove.
                            shared.lock().unwrap().push((h, v));
                        } else {
                            assert_eq!(*T.remove(h).unwrap(), v);
                            removed.fetch_add(1, Ordering::Relaxed);
                            dead.push(h);
                        }
                        let theirs = shared.lock().unwrap().pop();
                        if let Some((h, v)) = theirs {
                            // Another thread may look it up at the same time.
                            assert_eq!(*T.get(h).unwrap(), v);
                            assert_eq!(*T.remove(h).unwrap(), v);
                            removed.fetch_add(1, Ordering::Relaxed);
                            dead.push(h);
                        }
                        if let Some(&old) = dead.get((r as usize * 7) % dead.len().max(1)) {
                            assert_eq!(code(T.get(old)), CURT_ERROR_INVALID_HANDLE);
                            assert_eq!(code(T.remove(old)), CURT_ERROR_INVALID_HANDLE);
                        }
                    }
                });
            }
            // Lookups racing the removals of whatever is shared.
            scope.spawn(|| {
                for _ in 0..ROUNDS {
                    let h = shared.lock().unwrap().last().copied();
                    if let Some((h, v)) = h {
                        if let Ok(got) = T.get(h) {
                            assert_eq!(*got, v, "a handle reached another value");
                        }
                    }
                }
            });
        });
        for (h, v) in shared.into_inner().unwrap() {
            assert_eq!(*T.remove(h).unwrap(), v);
            removed.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(removed.into_inner() as u64, THREADS * ROUNDS);
    }

    #[test]
    fn a_vacant_slot_given_back_unfilled_is_taken_again_and_never_live() {
        static T: Table<Arc<u32>> = Table::new(19, "unfilled");
        let spare = Cell::new(None);
        // Taken for an insert that then failed (a malloc's error): kept as the spare.
        let v = T.vacant(&spare);
        let index = v.index;
        v.keep(&spare, true);
        let s = spare.take().expect("kept as the spare");
        assert_eq!(s.index, index);
        spare.set(Some(s));
        // The next insert takes that slot, and a handle made up for it with its
        // generation was never live meanwhile.
        let h = T.vacant(&spare).fill(Arc::new(7));
        assert_eq!((h & 0xffff_ffff) as u32, index + 1);
        assert!(spare.take().is_none(), "used up");
        assert_eq!(*T.get(h).unwrap(), 7);
        // Not kept when told not to, nor when a spare is held already: the free list
        // has it, and the next inserts take it before any fresh slot.
        let v = T.vacant(&spare);
        let other = v.index;
        v.keep(&spare, false);
        assert!(spare.take().is_none());
        let fresh_before = T.fresh.load(Ordering::Relaxed);
        let h2 = T.insert(Arc::new(8));
        assert_eq!((h2 & 0xffff_ffff) as u32, other + 1);
        assert_eq!(T.fresh.load(Ordering::Relaxed), fresh_before);
        assert_eq!(*T.remove(h).unwrap(), 7);
        assert_eq!(*T.remove(h2).unwrap(), 8);
    }

    #[test]
    fn a_spare_slot_is_reused_by_its_holder_and_given_back() {
        static T: Table<Arc<u32>> = Table::new(15, "spared");
        static OTHER: Table<Arc<u32>> = Table::new(16, "other");
        let spare = Cell::new(None);
        let kept = |spare: &Cell<Option<Spare<Arc<u32>>>>| {
            let s = spare.take();
            let some = s.is_some();
            spare.set(s);
            some
        };
        let one = Arc::new(1);
        let h = T.vacant(&spare).fill(one.clone());
        assert!(T.remove_spared(h, &spare, true));
        assert_eq!(Arc::strong_count(&one), 1, "dropped by the removal");
        assert!(kept(&spare), "the freed slot is kept");
        assert_eq!(code(T.get(h)), CURT_ERROR_INVALID_HANDLE);
        assert!(!T.remove_spared(h, &spare, true), "freed already");
        assert_eq!(code(Err::<(), _>(T.refuse(h))), CURT_ERROR_INVALID_HANDLE);
        // Another table does not take it.
        let o = OTHER.vacant(&spare).fill(Arc::new(9));
        assert!(kept(&spare));
        assert_eq!(*OTHER.remove(o).unwrap(), 9);
        // Its own table does, with the next generation.
        let h2 = T.vacant(&spare).fill(Arc::new(2));
        assert!(!kept(&spare), "used up");
        assert_eq!(h2 & 0xffff_ffff, h & 0xffff_ffff, "the same slot");
        assert_ne!(h2, h);
        assert_eq!(*T.get(h2).unwrap(), 2);
        assert_eq!(code(T.get(h)), CURT_ERROR_INVALID_HANDLE);
        // A second free while one is kept goes to the free list.
        let h3 = T.insert(Arc::new(3));
        assert!(T.remove_spared(h2, &spare, true));
        assert!(T.remove_spared(h3, &spare, true));
        spare.take().unwrap().give_back();
        // Not kept when told not to (a thread that is exiting): the free list has it.
        let h4 = T.insert(Arc::new(6));
        assert!(T.remove_spared(h4, &spare, false));
        assert!(!kept(&spare));
        // Both slots are free again: two inserts take them, no fresh one.
        let (a, b) = (T.insert(Arc::new(4)), T.insert(Arc::new(5)));
        let mut slots = [a & 0xffff_ffff, b & 0xffff_ffff];
        slots.sort();
        let mut want = [h & 0xffff_ffff, h3 & 0xffff_ffff];
        want.sort();
        assert_eq!(slots, want);
    }

    #[test]
    fn with_mut_changes_the_value_in_place_for_later_lookups() {
        static T: Table<Vec<u32>> = Table::new(17, "mutable");
        let h = T.insert(vec![1]);
        assert_eq!(
            T.with_mut(h, |v| {
                v.push(2);
                v.len()
            })
            .unwrap(),
            2
        );
        assert_eq!(T.get(h).unwrap(), [1, 2]);
        // A panic inside leaves the slot usable.
        let r = std::panic::catch_unwind(|| T.with_mut(h, |_| panic!("inside")));
        assert!(r.is_err());
        assert_eq!(T.get(h).unwrap(), [1, 2]);
        assert_eq!(T.remove(h).unwrap(), [1, 2]);
        assert_eq!(code(T.with_mut(h, |v| v.len())), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(code(T.with_mut(0, |v| v.len())), CURT_ERROR_INVALID_HANDLE);
    }

    /// Threads insert and remove through their spare slots while others look the same
    /// handles up, clone them and change them in place: a value is reached only through
    /// its own handle, each changed value is seen whole, every value is removed once,
    /// and a spare slot never serves two threads (Miri checks the accesses).
    #[test]
    fn concurrent_spared_inserts_in_place_changes_and_removes_stay_exact() {
        use std::sync::atomic::AtomicUsize;
        use std::sync::Mutex;
        static T: Table<Arc<(u64, u64)>> = Table::new(18, "spared concurrent");
        const THREADS: u64 = 3;
        const ROUNDS: u64 = if cfg!(miri) { 200 } else { 20_000 };
        let shared: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
        let removed = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let (shared, removed) = (&shared, &removed);
                scope.spawn(move || {
                    let spare = Cell::new(None);
                    for r in 0..ROUNDS {
                        let v = t << 32 | r;
                        let h = T.vacant(&spare).fill(Arc::new((v, v)));
                        if r % 2 == 0 {
                            shared.lock().unwrap().push((h, v));
                        } else {
                            // Only this thread removes `h`: the lookup sees its value.
                            assert_eq!(T.get(h).unwrap().0, v);
                            assert!(T.remove_spared(h, &spare, true));
                            removed.fetch_add(1, Ordering::Relaxed);
                        }
                        let theirs = shared.lock().unwrap().pop();
                        if let Some((h, v)) = theirs {
                            // Popped: this thread alone removes it now.
                            assert_eq!(T.get(h).unwrap().0, v);
                            assert!(T.remove_spared(h, &spare, true));
                            removed.fetch_add(1, Ordering::Relaxed);
                            assert_eq!(code(T.get(h)), CURT_ERROR_INVALID_HANDLE);
                        }
                    }
                    if let Some(spare) = spare.take() {
                        spare.give_back();
                    }
                });
            }
            // Lookups and in-place changes racing the removals of whatever is shared.
            for _ in 0..2 {
                scope.spawn(|| {
                    for _ in 0..ROUNDS {
                        let h = shared.lock().unwrap().last().copied();
                        if let Some((h, v)) = h {
                            if let Ok(got) = T.get(h) {
                                assert_eq!(got.0, v, "a handle reached another value");
                                assert_eq!(got.0, got.1, "a change seen half done");
                            }
                            let _ = T.with_mut(h, |x| {
                                assert_eq!(x.0, v, "a handle reached another value");
                                // Replaced whole (a new allocation), as a block
                                // becomes a pointer.
                                *x = Arc::new((x.0, x.1));
                            });
                        }
                    }
                });
            }
        });
        for (h, v) in shared.into_inner().unwrap() {
            assert_eq!(T.remove(h).unwrap().0, v);
            removed.fetch_add(1, Ordering::Relaxed);
        }
        assert_eq!(removed.into_inner() as u64, THREADS * ROUNDS);
    }

    #[test]
    fn slots_are_located_across_segments() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(63), (0, 63));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(191), (1, 127));
        assert_eq!(locate(192), (2, 0));
        let (k, off) = locate(u32::MAX - 1);
        assert!(k < SEGMENTS && off < segment_len(k));
        // Enough inserts to fill the first segments, then every value found back.
        let t: Table<Arc<u32>> = Table::new(14, "test");
        let hs: Vec<u64> = (0..1000).map(|n| t.insert(Arc::new(n))).collect();
        for (n, &h) in hs.iter().enumerate() {
            assert_eq!(*t.get(h).unwrap(), n as u32);
        }
        drop(t);
    }

    #[test]
    fn null_foreign_and_made_up_handles_are_invalid() {
        static A: Table<Arc<u32>> = Table::new(10, "first");
        static B: Table<Arc<u32>> = Table::new(11, "second");
        let h = A.insert(Arc::new(1));
        assert_eq!(code(B.get(h)), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(code(A.get(0)), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(code(A.get(0xdead_beef)), CURT_ERROR_INVALID_HANDLE);
        assert_eq!(code(A.get(h + 1)), CURT_ERROR_INVALID_HANDLE);
        let msg = B.get(h).unwrap_err().code_and_message().1;
        assert!(msg.contains("invalid second handle"), "{msg}");
    }
}
