//! A pool's arenas by index: an append-only table that the hot path reads without a
//! lock and without `unsafe`, plus the stream key -> index map used on first use.
//!
//! Segment `s` holds `64 << s` slots, so index `i` lives in segment
//! `log2(i + 64) - 6` at offset `i + 64 - (64 << s)`: at most two [`OnceLock::get`]s
//! (one acquire load each, a plain load on x86) from an index to an arena, and no
//! limit on the number of arenas short of `u32` indices. Segment 0 (the first 64
//! arenas, the common case) is inline, so its indices need one `get` and no
//! segment pointer; the others are allocated when the first index in them is
//! created. Nothing is ever removed while the pool lives: an index, once handed out,
//! names the same arena for the pool's whole life.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{OnceLock, PoisonError, RwLock};

/// Slots of segment 0.
const FIRST: u64 = 64;
/// 26 segments hold `64 * (2^26 - 1)` = 4,294,967,232 indices, every one below
/// `u32::MAX`.
const SEGMENTS: usize = 26;
/// Indices the table can hold.
pub(super) const CAPACITY: u64 = FIRST * ((1 << SEGMENTS) - 1);

type Segment<T> = Box<[OnceLock<Box<T>>]>;

/// `(segment, offset)` of index `i`.
#[inline]
fn locate(i: u32) -> (usize, usize) {
    let j = u64::from(i) + FIRST;
    let seg = (63 - j.leading_zeros() - FIRST.trailing_zeros()) as usize;
    (seg, (j - (FIRST << seg)) as usize)
}

/// The table is full (more than [`CAPACITY`] entries).
#[derive(Debug)]
pub(super) struct Full;

/// Entries of type `T` (arenas) by `u32` index, and a key -> index map.
#[derive(Debug)]
pub(super) struct Table<T> {
    /// Segment 0.
    first: [OnceLock<Box<T>>; FIRST as usize],
    /// Segments 1.. (index 0 unused).
    segments: [OnceLock<Segment<T>>; SEGMENTS],
    /// Entries published: every index below it is set. Stored under `by_key`'s write
    /// lock, after the entry.
    len: AtomicU32,
    /// Key -> index; its write lock serializes the creation of entries.
    by_key: RwLock<HashMap<u64, u32>>,
}

impl<T> Default for Table<T> {
    fn default() -> Self {
        Table {
            first: std::array::from_fn(|_| OnceLock::new()),
            segments: std::array::from_fn(|_| OnceLock::new()),
            len: AtomicU32::new(0),
            by_key: RwLock::new(HashMap::new()),
        }
    }
}

impl<T> Table<T> {
    /// The entry at `i`, or `None` if `i` was never handed out by
    /// [`get_or_create`](Self::get_or_create).
    #[inline]
    pub fn get(&self, i: u32) -> Option<&T> {
        if let Some(slot) = self.first.get(i as usize) {
            return slot.get().map(|b| &**b);
        }
        self.get_far(i)
    }

    #[cold]
    fn get_far(&self, i: u32) -> Option<&T> {
        let (seg, off) = locate(i);
        let entry = self.segments.get(seg)?.get()?.get(off)?.get()?;
        Some(entry)
    }

    /// The slot of index `i`, allocating its segment if needed.
    fn slot(&self, i: u32) -> Option<&OnceLock<Box<T>>> {
        let (seg, off) = locate(i);
        if seg == 0 {
            return self.first.get(off);
        }
        let segment = self.segments.get(seg)?.get_or_init(|| {
            (0..FIRST << seg)
                .map(|_| OnceLock::new())
                .collect::<Segment<T>>()
        });
        segment.get(off)
    }

    /// Number of entries.
    pub fn len(&self) -> u32 {
        self.len.load(Ordering::Acquire)
    }

    /// Every entry, in creation order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        (0..self.len()).filter_map(move |i| self.get(i))
    }

    /// The index of `key`'s entry, if it has one.
    pub fn find(&self, key: u64) -> Option<u32> {
        let map = self.by_key.read().unwrap_or_else(PoisonError::into_inner);
        map.get(&key).copied()
    }

    /// The index of `key`'s entry, creating it with `make(index)` if there is none.
    pub fn get_or_create(&self, key: u64, make: impl FnOnce(u32) -> T) -> Result<u32, Full> {
        if let Some(i) = self.find(key) {
            return Ok(i);
        }
        let mut map = self.by_key.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(&i) = map.get(&key) {
            return Ok(i);
        }
        let i = self.len.load(Ordering::Relaxed);
        if u64::from(i) >= CAPACITY {
            return Err(Full);
        }
        // Slot `i` is empty: `len` only grows here, under the write lock. Were it set,
        // `get_or_init` would keep the old entry and nothing would break.
        self.slot(i).ok_or(Full)?.get_or_init(|| Box::new(make(i)));
        self.len.store(i + 1, Ordering::Release);
        map.insert(key, i);
        Ok(i)
    }

    /// Every entry, mutably (for the pool's drop).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        let far = self
            .segments
            .iter_mut()
            .filter_map(OnceLock::get_mut)
            .flat_map(|s| s.iter_mut());
        self.first
            .iter_mut()
            .chain(far)
            .filter_map(OnceLock::get_mut)
            .map(|b| &mut **b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn indices_map_to_consecutive_slots_of_growing_segments() {
        assert_eq!(locate(0), (0, 0));
        assert_eq!(locate(63), (0, 63));
        assert_eq!(locate(64), (1, 0));
        assert_eq!(locate(191), (1, 127));
        assert_eq!(locate(192), (2, 0));
        assert_eq!(
            locate((CAPACITY - 1) as u32),
            (SEGMENTS - 1, (FIRST << 25) as usize - 1)
        );
        assert!(CAPACITY <= u64::from(u32::MAX));
        // u32::MAX itself is past the last segment: `get` says None, never panics.
        assert_eq!(locate(u32::MAX).0, SEGMENTS);
    }

    #[test]
    fn entries_are_created_once_per_key_and_found_by_index() {
        let t: Table<u64> = Table::default();
        for k in 0..200u64 {
            assert_eq!(
                t.get_or_create(k * 7, |i| u64::from(i) * 10).ok(),
                Some(k as u32)
            );
        }
        assert_eq!(t.get_or_create(7, |_| 999).ok(), Some(1));
        assert_eq!(t.len(), 200);
        assert_eq!(t.get(150), Some(&1500));
        assert_eq!(t.get(63), Some(&630));
        assert_eq!(t.get(64), Some(&640));
        assert_eq!(t.get(200), None);
        assert_eq!(t.get(u32::MAX), None);
        assert_eq!(t.find(14), Some(2));
        assert_eq!(t.find(15), None);
        assert_eq!(t.iter().count(), 200);
        let mut t = t;
        let all: Vec<u64> = t.iter_mut().map(|v| *v).collect();
        assert_eq!(all, (0..200).map(|i| i * 10).collect::<Vec<u64>>());
    }
}
