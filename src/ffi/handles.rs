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
//! the new owner's memory. A retired slot costs its 16 bytes for good: one per 2^24
//! objects of a kind.

#![allow(non_camel_case_types)]

use std::sync::{PoisonError, RwLock};

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
}

struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// A table's slots and the indices of the empty ones, under one lock: an insert or a
/// remove takes it once (a second lock for the free list doubled the atomic
/// operations of a `curt_malloc` + `curt_free` pair).
struct Slots<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
}

/// One kind's table. `T` is what a lookup hands out, a clone of what the table holds:
/// an `Arc` of the object for most kinds, so a destroy on another thread during a
/// call only drops the table's reference; memory is held as its `MemoryPointer`
/// itself, which is already a reference-counted handle (an `Arc` around it cost a
/// heap allocation and a free per `curt_malloc` + `curt_free` pair).
pub(crate) struct Table<T> {
    kind: u8,
    what: &'static str,
    slots: RwLock<Slots<T>>,
}

const INDEX_BITS: u32 = 32;
const GENERATION_MASK: u64 = 0x00ff_ffff;

impl<T: Clone> Table<T> {
    pub(crate) const fn new(kind: u8, what: &'static str) -> Self {
        Table {
            kind,
            what,
            slots: RwLock::new(Slots {
                slots: Vec::new(),
                free: Vec::new(),
            }),
        }
    }

    fn encode(&self, index: u32, generation: u32) -> u64 {
        ((self.kind as u64) << 56)
            | ((generation as u64 & GENERATION_MASK) << INDEX_BITS)
            | (index as u64 + 1)
    }

    /// Puts `value` in the table and returns its handle (never 0).
    pub(crate) fn insert(&self, value: T) -> u64 {
        let mut t = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let index = match t.free.pop() {
            Some(i) => i,
            None => {
                t.slots.push(Slot {
                    generation: 0,
                    value: None,
                });
                (t.slots.len() - 1) as u32
            }
        };
        let slot = &mut t.slots[index as usize];
        slot.value = Some(value);
        let generation = slot.generation;
        self.encode(index, generation)
    }

    /// The slot index of `handle` when it is one of this table's live handles. The
    /// messages are built out of line: only a bad handle pays for them.
    #[inline]
    fn find(&self, slots: &[Slot<T>], handle: u64) -> Res<usize> {
        if handle == 0 {
            return Err(self.null());
        }
        if (handle >> 56) as u8 != self.kind {
            return Err(self.bad(handle));
        }
        let Some(index) = ((handle & 0xffff_ffff) as usize).checked_sub(1) else {
            return Err(self.bad(handle));
        };
        let generation = ((handle >> INDEX_BITS) & GENERATION_MASK) as u32;
        match slots.get(index) {
            Some(s) if s.value.is_some() && s.generation & GENERATION_MASK as u32 == generation => {
                Ok(index)
            }
            _ => Err(self.bad(handle)),
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

    #[cold]
    #[inline(never)]
    fn empty(&self) -> Fail {
        Fail::Handle(format!("the {} handle is empty", self.what))
    }

    /// The object behind `handle`.
    pub(crate) fn get(&self, handle: u64) -> Res<T> {
        let t = self.slots.read().unwrap_or_else(PoisonError::into_inner);
        let i = self.find(&t.slots, handle)?;
        t.slots[i].value.clone().ok_or_else(|| self.empty())
    }

    /// Takes the object behind `handle` out of the table (the handle is dead from now
    /// on, for good) and returns it, to be dropped by the caller outside the table's
    /// lock. The slot goes back on the free list with the next generation, or, when
    /// its generation was the last one, is retired: a generation that wrapped would
    /// bring the slot's first handle back to life.
    pub(crate) fn remove(&self, handle: u64) -> Res<T> {
        let value = {
            let mut t = self.slots.write().unwrap_or_else(PoisonError::into_inner);
            let i = self.find(&t.slots, handle)?;
            let slot = &mut t.slots[i];
            let v = slot.value.take();
            // Retired: the generation stays at the last value and the slot stays
            // empty, so no handle finds it again.
            if slot.generation < GENERATION_MASK as u32 {
                slot.generation += 1;
                t.free.push(i as u32);
            }
            v
        };
        value.ok_or_else(|| self.empty())
    }

    /// Moves the live object behind `handle` to `generation` of its slot (a test's
    /// shortcut past 2^24 reuses) and returns its new handle.
    #[cfg(test)]
    fn age(&self, handle: u64, generation: u32) -> u64 {
        let mut t = self.slots.write().unwrap_or_else(PoisonError::into_inner);
        let i = self
            .find(&t.slots, handle)
            .map_err(|_| ())
            .expect("a live handle");
        let g = generation & GENERATION_MASK as u32;
        t.slots[i].generation = g;
        self.encode(i as u32, g)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ffi::status::CURT_ERROR_INVALID_HANDLE;
    use std::sync::Arc;

    fn code(r: Res<Arc<u32>>) -> i32 {
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
