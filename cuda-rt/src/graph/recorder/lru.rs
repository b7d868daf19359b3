//! The recorder's bounded map: at most `capacity` entries, the least recently used one
//! evicted to make room. Pure Rust, no CUDA, so its rules are tested on any machine.
//!
//! Each entry carries the tick of its last use. A lookup (the replay path) is one hash
//! lookup and a tick store, nothing allocated; finding the oldest entry scans the map,
//! but that happens only when an entry is inserted into a full map, right after a
//! capture and an instantiation that cost thousands of times more, and capacities are
//! small (tens of executables). A linked list would make eviction O(1) at the price of
//! two more pointers to keep right on every lookup.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::num::NonZeroUsize;

/// A value and the tick of its last use. The value is `Some` for as long as the slot
/// is in the map: eviction takes it out from inside `HashMap::retain`, which finds an
/// entry without a key to remove it by (keys need not be `Clone`).
#[derive(Debug)]
struct Slot<V> {
    value: Option<V>,
    used: u64,
}

/// A map of at most `capacity` entries that evicts its least recently used one.
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    map: HashMap<K, Slot<V>>,
    capacity: NonZeroUsize,
    /// Counts uses; every insert and lookup takes the next tick, so ticks are unique.
    clock: u64,
}

/// What an insert pushed out.
#[derive(Debug)]
pub(crate) struct Displaced<V> {
    /// The value the key had before.
    pub(crate) replaced: Option<V>,
    /// The least recently used entry, evicted to make room.
    pub(crate) evicted: Option<V>,
}

impl<K, V> Lru<K, V> {
    /// An empty map of `capacity` entries at most.
    pub(crate) fn new(capacity: NonZeroUsize) -> Self {
        Lru {
            map: HashMap::new(),
            capacity,
            clock: 0,
        }
    }

    /// How many entries it holds at most.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity.get()
    }

    /// How many entries it holds.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Takes every value out, least recently used first.
    pub(crate) fn drain(&mut self) -> Vec<V> {
        let mut all: Vec<Slot<V>> = self.map.drain().map(|(_, s)| s).collect();
        all.sort_by_key(|s| s.used);
        all.into_iter().filter_map(|s| s.value).collect()
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }
}

impl<K: Hash + Eq, V> Lru<K, V> {
    /// The value of `key`, marked as used now.
    #[inline]
    pub(crate) fn get_mut<Q>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let now = self.tick();
        let slot = self.map.get_mut(key)?;
        slot.used = now;
        slot.value.as_mut()
    }

    /// Whether `key` has a value (not counted as a use).
    pub(crate) fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.contains_key(key)
    }

    /// Takes the value of `key` out.
    pub(crate) fn remove<Q>(&mut self, key: &Q) -> Option<V>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.map.remove(key).and_then(|s| s.value)
    }

    /// Puts `value` in as `key`'s, used now; returns what it displaced: the key's old
    /// value, or, when the map was full, its least recently used entry.
    pub(crate) fn insert(&mut self, key: K, value: V) -> Displaced<V> {
        let used = self.tick();
        if let Some(slot) = self.map.get_mut(&key) {
            slot.used = used;
            return Displaced {
                replaced: slot.value.replace(value),
                evicted: None,
            };
        }
        let evicted = if self.map.len() >= self.capacity.get() {
            self.pop_oldest()
        } else {
            None
        };
        self.map.insert(
            key,
            Slot {
                value: Some(value),
                used,
            },
        );
        Displaced {
            replaced: None,
            evicted,
        }
    }

    /// Sets the capacity; returns the entries evicted to fit it, least recently used
    /// first.
    pub(crate) fn set_capacity(&mut self, capacity: NonZeroUsize) -> Vec<V> {
        self.capacity = capacity;
        let mut out = Vec::new();
        while self.map.len() > capacity.get() {
            match self.pop_oldest() {
                Some(v) => out.push(v),
                None => break,
            }
        }
        out
    }

    /// Takes out the least recently used entry.
    fn pop_oldest(&mut self) -> Option<V> {
        let oldest = self.map.values().map(|s| s.used).min()?;
        // Ticks are unique: exactly one entry carries the oldest.
        let mut taken = None;
        self.map.retain(|_, s| {
            if s.used == oldest {
                taken = s.value.take();
                false
            } else {
                true
            }
        });
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cap(n: usize) -> NonZeroUsize {
        NonZeroUsize::new(n).unwrap()
    }

    #[test]
    fn the_least_recently_used_entry_goes_first() {
        let mut m = Lru::new(cap(3));
        for k in 1..=3 {
            let d = m.insert(k, k * 10);
            assert!(d.replaced.is_none() && d.evicted.is_none());
        }
        // 1 is used again: 2 is now the oldest.
        assert_eq!(m.get_mut(&1), Some(&mut 10));
        let d = m.insert(4, 40);
        assert_eq!(d.evicted, Some(20));
        assert!(d.replaced.is_none());
        assert!(!m.contains(&2) && m.contains(&1) && m.contains(&3) && m.contains(&4));
        assert_eq!(m.len(), 3);
        // Then 3 (inserted before 1 was used again, never used since).
        assert_eq!(m.insert(5, 50).evicted, Some(30));
        assert_eq!(m.drain(), vec![10, 40, 50]);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn contains_is_not_a_use_but_get_is() {
        let mut m = Lru::new(cap(2));
        m.insert("a", 1);
        m.insert("b", 2);
        assert!(m.contains("a")); // not a use: "a" stays the oldest
        assert_eq!(m.insert("c", 3).evicted, Some(1));
        m.get_mut("b");
        assert_eq!(m.insert("d", 4).evicted, Some(3));
        assert!(m.get_mut("zzz").is_none());
    }

    #[test]
    fn inserting_a_known_key_replaces_its_value_and_evicts_nothing() {
        let mut m = Lru::new(cap(1));
        m.insert(7u64, "old");
        let d = m.insert(7, "new");
        assert_eq!(d.replaced, Some("old"));
        assert!(d.evicted.is_none());
        assert_eq!(m.len(), 1);
        assert_eq!(m.get_mut(&7), Some(&mut "new"));
    }

    #[test]
    fn borrowed_keys_look_up_owned_ones() {
        let mut m: Lru<Vec<u8>, u32> = Lru::new(cap(4));
        m.insert(b"key".to_vec(), 1);
        assert_eq!(m.get_mut(&b"key"[..]), Some(&mut 1));
        assert!(m.contains(&b"key"[..]));
        assert_eq!(m.remove(&b"key"[..]), Some(1));
        assert!(m.remove(&b"key"[..]).is_none());
    }

    #[test]
    fn shrinking_evicts_oldest_first_and_growing_evicts_nothing() {
        let mut m = Lru::new(cap(4));
        for k in 0..4 {
            m.insert(k, k);
        }
        m.get_mut(&0);
        assert_eq!(m.set_capacity(cap(2)), vec![1, 2]);
        assert_eq!(m.capacity(), 2);
        assert!(m.set_capacity(cap(8)).is_empty());
        assert_eq!(m.drain(), vec![3, 0]);
    }

    #[test]
    fn a_capacity_of_one_keeps_the_last_entry() {
        let mut m = Lru::new(cap(1));
        for k in 0..100u32 {
            let d = m.insert(k, k);
            assert_eq!(d.evicted, k.checked_sub(1));
        }
        assert_eq!(m.len(), 1);
        assert!(m.contains(&99));
    }
}
