//! [`AddrMap`]: the drop-in registry's map from a device address to its memory, one per
//! shard (under the shard's lock).
//!
//! Open addressing with linear probing over the address itself: a steady
//! `curt_torch_alloc` + `curt_torch_free` pair inserts and removes one key, and a
//! general-purpose map (hashbrown, with its group probing and 32-byte value moves)
//! spent about 150 instructions a pair on that, more than half of the pool's whole
//! pair. Removal shifts the following entries back (no tombstones), so a lookup stops
//! at the first empty slot and the table never fills with dead entries. Address 0 is
//! the empty key: the registry never holds it (a size-0 request is the null pointer
//! and is not registered, and the pool hands out no block at address 0).

/// Address -> value, for non-zero addresses.
pub(crate) struct AddrMap<V> {
    /// `(0, None)` for an empty slot; the length is 0 or a power of two.
    slots: Vec<(u64, Option<V>)>,
    len: usize,
}

/// The slots of a map's first growth: a shard seldom holds more than a few dozen
/// live allocations.
const FIRST_CAPACITY: usize = 64;

impl<V> AddrMap<V> {
    pub(crate) const fn new() -> Self {
        AddrMap {
            slots: Vec::new(),
            len: 0,
        }
    }

    /// How many entries the map holds.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The slot where `addr`'s probe starts: blocks are 512-byte aligned, so the bits
    /// above are mixed by one multiplication and the top bits taken.
    #[inline]
    fn home(&self, addr: u64) -> usize {
        let x = (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (x ^ (x >> 32)) as usize & (self.slots.len() - 1)
    }

    /// The slot holding `addr`, if any.
    #[inline]
    fn find(&self, addr: u64) -> Option<usize> {
        if self.slots.is_empty() || addr == 0 {
            return None;
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            match self.slots[i].0 {
                0 => return None,
                k if k == addr => return Some(i),
                _ => i = (i + 1) & mask,
            }
        }
    }

    /// Puts `value` at `addr`, returning the value it replaces; address 0 (the empty
    /// key, never registered) is refused: `value` comes back.
    #[inline]
    pub(crate) fn insert(&mut self, addr: u64, value: V) -> Option<V> {
        if addr == 0 {
            return Some(value);
        }
        // At most half full, so probes stay short and one slot is always empty.
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            let slot = &mut self.slots[i];
            if slot.0 == 0 {
                *slot = (addr, Some(value));
                self.len += 1;
                return None;
            }
            if slot.0 == addr {
                return slot.1.replace(value);
            }
            i = (i + 1) & mask;
        }
    }

    /// Takes the value at `addr` out, if any.
    #[inline]
    pub(crate) fn remove(&mut self, addr: u64) -> Option<V> {
        let mut hole = self.find(addr)?;
        let value = self.slots[hole].1.take();
        self.slots[hole].0 = 0;
        self.len -= 1;
        // Backward shift: each following entry of the run moves into the hole when
        // its home is not between the hole and itself, so no probe that passed
        // through the hole stops short of it.
        let mask = self.slots.len() - 1;
        let mut j = hole;
        loop {
            j = (j + 1) & mask;
            let k = self.slots[j].0;
            if k == 0 {
                break;
            }
            let home = self.home(k);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots.swap(hole, j);
                hole = j;
            }
        }
        value
    }

    /// The value at `addr`, if any.
    #[cfg(test)]
    pub(crate) fn get(&self, addr: u64) -> Option<&V> {
        self.find(addr).and_then(|i| self.slots[i].1.as_ref())
    }

    /// The value at `addr`, if any, to change in place.
    pub(crate) fn get_mut(&mut self, addr: u64) -> Option<&mut V> {
        self.find(addr).and_then(|i| self.slots[i].1.as_mut())
    }

    /// Doubles the slots (the first time: [`FIRST_CAPACITY`]) and puts every entry
    /// back. Out of line: a shard grows a handful of times in a process.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let cap = (self.slots.len() * 2).max(FIRST_CAPACITY);
        let old = std::mem::replace(
            &mut self.slots,
            std::iter::repeat_with(|| (0, None)).take(cap).collect(),
        );
        self.len = 0;
        for (addr, value) in old {
            if let Some(v) = value {
                self.insert(addr, v);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn inserted_addresses_are_found_until_removed() {
        let mut m = AddrMap::new();
        assert_eq!(m.remove(0x1000), None);
        assert_eq!(m.insert(0, 9), Some(9), "address 0 is refused");
        assert_eq!(m.insert(0x1000, 1), None);
        assert_eq!(m.insert(0x1200, 2), None);
        assert_eq!(m.get(0x1000), Some(&1));
        assert_eq!(m.insert(0x1000, 3), Some(1), "a second insert replaces");
        assert_eq!(m.len(), 2);
        assert_eq!(m.remove(0x1000), Some(3));
        assert_eq!(m.remove(0x1000), None);
        assert_eq!(m.get(0x1200), Some(&2));
        assert_eq!(m.len(), 1);
    }

    /// A random sequence of inserts and removes over few addresses (long probe runs,
    /// wrap-around at the table's end, growth), checked against a `HashMap`.
    #[test]
    fn agrees_with_a_hash_map_over_random_inserts_and_removes() {
        let mut m = AddrMap::new();
        let mut model = HashMap::new();
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for step in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // 300 distinct 512-byte aligned addresses, some only 512 bytes apart.
            let addr = 0x7f00_0000_0000 + (x % 300) * 512;
            if x >> 62 == 0 {
                assert_eq!(m.remove(addr), model.remove(&addr), "step {step}");
            } else {
                assert_eq!(
                    m.insert(addr, step),
                    model.insert(addr, step),
                    "step {step}"
                );
            }
            assert_eq!(m.len(), model.len());
        }
        for (addr, v) in &model {
            assert_eq!(m.get(*addr), Some(v));
        }
        for addr in model.keys().copied().collect::<Vec<_>>() {
            assert_eq!(m.remove(addr), model.remove(&addr));
        }
        assert_eq!(m.len(), 0);
    }
}
