//! [`DirectMap`]: the drop-in registry's first stop, a fixed array of entries indexed
//! by a hash of the address, each claimed by one atomic exchange, no lock.
//!
//! An entry's state word is 0 (empty), [`BUSY`] (one thread owns the entry's value
//! right now) or the address whose value it holds. A thread claims an entry by
//! exchanging its state for `BUSY` (from 0 to put a value in, from the address to take
//! the value out or clone it) and gives it up by storing the new state with Release;
//! the value is touched only between the two, so it is never accessed by two threads
//! at once. An address whose entry is taken by another goes to the locked maps of
//! the registry ([`AddrMap`](super::addr_map::AddrMap)), where a lookup that misses
//! here looks next. A `curt_torch_alloc` + `curt_torch_free` pair so takes two atomic
//! exchanges (a shard's mutex took four, and its map's probing and moves under it).
//!
//! One of the two goes with a [`Reservation`], a thread's hold on one entry: a take
//! through it leaves the entry [`RESERVED`] (no value, no address) instead of empty,
//! and the thread's next insert of an address of that entry fills it with plain
//! stores. No other thread changes a reserved entry (every exchange of theirs starts
//! from 0 or an address), so the holder owns it without a further atomic
//! read-modify-write. The steady pair of one thread (the pool hands back the block it
//! just took in) so costs one exchange, the free's. A reservation holds one entry at a
//! time and empties it when it moves to another entry or is dropped (its thread exits).

use std::cell::UnsafeCell;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering};

use super::handles::backoff;

/// The state of an entry owned by one thread now. Odd, so never an address: the
/// registry's addresses are the pool's blocks, 512-byte aligned.
const BUSY: u64 = 1;

/// The state of an entry held by a [`Reservation`]: no value, and no other thread
/// changes it. Odd, so never an address, and not [`BUSY`].
const RESERVED: u64 = 3;

/// Whether an entry in state `s` holds a value that no claim is moving: an address.
#[inline]
fn holds_address(s: u64) -> bool {
    s != 0 && s & 1 == 0
}

/// Entries in a map: a few thousand live allocations of a process find one here
/// (a collision sends an address to the locked maps, never fails it).
pub(crate) const ENTRIES: usize = 1 << 12;

struct Entry<V> {
    state: AtomicU64,
    /// Initialized exactly while `state` is an address, or `BUSY` in a claim made
    /// from an address (until the claimer takes the value out or puts the address
    /// back).
    value: UnsafeCell<MaybeUninit<V>>,
}

/// Address -> value for non-zero, even addresses, [`ENTRIES`] of them at most (one per
/// hash).
pub(crate) struct DirectMap<V> {
    entries: [Entry<V>; ENTRIES],
}

// SAFETY: a value moves in on one thread and out on another (`V: Send`) and is cloned
// in place on any thread (`V: Sync`); each access is made by the one thread that holds
// the entry's claim (its state exchanged to `BUSY`), ordered by Acquire on the claim
// and Release on giving it up.
unsafe impl<V: Send + Sync> Sync for DirectMap<V> {}

/// A hold on one entry of a map (see the module doc): the state word of an entry that
/// [`DirectMap::take_reserving`] emptied to [`RESERVED`], which stays so until
/// [`DirectMap::try_insert_reserved`] fills it with this reservation, or
/// [`release`](Self::release) empties it. Neither `Clone` nor `Copy`: whoever holds it
/// is the entry's one owner.
///
/// No `Drop`, so that a thread-local holding one costs nothing to reach: its holder
/// releases it when done (the drop-in registry does at its thread's exit). One
/// dropped without a release keeps its entry reserved for good, which sends the
/// addresses of that entry to the locked maps, nothing worse.
#[must_use = "a reservation dropped without `release` keeps its entry for good"]
pub(crate) struct Reservation<'m> {
    state: &'m AtomicU64,
}

impl Reservation<'_> {
    /// Empties the reserved entry (Release: the value taken out of it was read before
    /// the next claim from 0 can write another).
    #[inline]
    pub(crate) fn release(self) {
        self.state.store(0, Ordering::Release);
    }
}

/// Gives a claimed entry back with `state` when dropped: also when a clone panics, so
/// the entry is never left `BUSY` for good.
struct Release<'a>(&'a AtomicU64, u64);

impl Drop for Release<'_> {
    fn drop(&mut self) {
        self.0.store(self.1, Ordering::Release);
    }
}

impl<V> DirectMap<V> {
    pub(crate) const fn new() -> Self {
        DirectMap {
            entries: [const {
                Entry {
                    state: AtomicU64::new(0),
                    value: UnsafeCell::new(MaybeUninit::uninit()),
                }
            }; ENTRIES],
        }
    }

    #[inline]
    fn entry(&self, addr: u64) -> &Entry<V> {
        // Blocks are 512-byte aligned: the bits above, mixed by one multiplication,
        // the top 12 taken.
        let h = (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - 12);
        &self.entries[h as usize % ENTRIES]
    }

    /// Puts `value` at `addr` when `addr`'s entry is empty; else (taken, or `addr` is 0
    /// or odd) gives `value` back, for the caller to keep elsewhere.
    #[inline]
    pub(crate) fn try_insert(&self, addr: u64, value: V) -> Result<(), V> {
        if addr == 0 || addr & 1 != 0 {
            return Err(value);
        }
        let e = self.entry(addr);
        if e.state
            .compare_exchange(0, BUSY, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Err(value);
        }
        // SAFETY: the exchange from 0 made this thread the entry's one owner, and an
        // empty entry holds no value (whoever emptied it took the value out first).
        unsafe { (*e.value.get()).write(value) };
        e.state.store(addr, Ordering::Release);
        Ok(())
    }

    /// [`try_insert`](Self::try_insert) that first looks at the reservation `r`: when it
    /// holds `addr`'s entry, `value` goes in with plain stores (the reservation owns the
    /// entry) and the reservation is used up (`r` becomes `None`).
    #[inline]
    pub(crate) fn try_insert_reserved(
        &self,
        addr: u64,
        value: V,
        r: &mut Option<Reservation<'_>>,
    ) -> Result<(), V> {
        let e = self.entry(addr);
        match r {
            Some(held) if std::ptr::eq(held.state, &e.state) && addr != 0 && addr & 1 == 0 => {
                *r = None;
                // SAFETY: the entry is `RESERVED` by the reservation just used up (one is
                // made only by a claim to `RESERVED`, no other thread changes such an
                // entry, and it is neither `Clone` nor `Copy`): this thread is the entry's
                // one owner and it holds no value.
                unsafe { (*e.value.get()).write(value) };
                e.state.store(addr, Ordering::Release);
                Ok(())
            }
            _ => self.try_insert(addr, value),
        }
    }

    /// Claims `addr`'s entry when it holds `addr`, moving its state to `to` (waiting
    /// while another thread owns it: its claims are a few instructions long); `None`
    /// when it holds another address or none.
    #[inline]
    fn claim(&self, addr: u64, to: u64) -> Option<&Entry<V>> {
        if addr == 0 || addr & 1 != 0 {
            return None;
        }
        let e = self.entry(addr);
        let mut spins = 0u32;
        loop {
            match e
                .state
                .compare_exchange_weak(addr, to, Ordering::Acquire, Ordering::Relaxed)
            {
                Ok(_) => return Some(e),
                Err(BUSY) => backoff(&mut spins),
                Err(s) if s == addr => {} // a spurious failure
                Err(_) => return None,
            }
        }
    }

    /// Takes the value at `addr` out, if it is here (the registry takes with its
    /// reservation: [`take_reserving`](Self::take_reserving)).
    #[cfg(test)]
    pub(crate) fn take(&self, addr: u64) -> Option<V> {
        let e = self.claim(addr, BUSY)?;
        // SAFETY: claimed from `addr`: the value is initialized (put in before the
        // Release store of `addr` this claim acquired) and this thread is its one
        // owner; the entry is emptied right after, so the value is read out once.
        let v = unsafe { (*e.value.get()).assume_init_read() };
        e.state.store(0, Ordering::Release);
        Some(v)
    }

    /// [`take`](Self::take) that leaves the entry reserved (see the module doc), its
    /// [`Reservation`] in `r` (the one `r` held before is released).
    #[inline]
    pub(crate) fn take_reserving<'m>(
        &'m self,
        addr: u64,
        r: &mut Option<Reservation<'m>>,
    ) -> Option<V> {
        let e = self.claim(addr, RESERVED)?;
        // SAFETY: claimed from `addr` (to `RESERVED`, which no other thread changes):
        // the value is initialized (put in before the Release store of `addr` this
        // claim acquired) and this thread is its one owner; the entry holds no value
        // from now on, so the value is read out once.
        let v = unsafe { (*e.value.get()).assume_init_read() };
        if let Some(old) = r.replace(Reservation { state: &e.state }) {
            old.release();
        }
        Some(v)
    }

    /// `f` of the value at `addr` (which it may change in place), if it is here.
    pub(crate) fn with<R>(&self, addr: u64, f: impl FnOnce(&mut V) -> R) -> Option<R> {
        let e = self.claim(addr, BUSY)?;
        let _give_back = Release(&e.state, addr);
        // SAFETY: claimed from `addr`: the value is initialized and only this thread
        // touches it until `_give_back` puts `addr` back.
        Some(f(unsafe { (*e.value.get()).assume_init_mut() }))
    }

    /// How many addresses the map holds (those being moved right now aside).
    pub(crate) fn len(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| holds_address(e.state.load(Ordering::Relaxed)))
            .count()
    }
}

impl<V> Drop for DirectMap<V> {
    fn drop(&mut self) {
        for e in self.entries.iter_mut() {
            if holds_address(*e.state.get_mut()) {
                // SAFETY: an entry holding an address holds an initialized value, and
                // `&mut self` rules out any claim.
                unsafe { e.value.get_mut().assume_init_drop() };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;

    #[test]
    fn an_address_is_found_until_taken_and_a_taken_entry_refuses_others() {
        let m: Box<DirectMap<u32>> = Box::new(DirectMap::new());
        assert_eq!(m.try_insert(0, 1), Err(1), "address 0 is refused");
        assert_eq!(m.try_insert(0x1001, 1), Err(1), "an odd address is refused");
        assert_eq!(m.try_insert(0x1000, 7), Ok(()));
        assert_eq!(m.try_insert(0x1000, 8), Err(8), "the entry is taken");
        assert_eq!(m.with(0x1000, |v| *v), Some(7));
        assert_eq!(m.take(0x1200), None);
        assert_eq!(m.len(), 1);
        assert_eq!(m.take(0x1000), Some(7));
        assert_eq!(m.take(0x1000), None);
        assert_eq!(m.with(0x1000, |v| *v), None);
        assert_eq!(m.len(), 0);
    }

    #[test]
    fn a_reserved_entry_is_refilled_by_its_holder_alone_and_released() {
        let m: Box<DirectMap<u32>> = Box::new(DirectMap::new());
        // Two addresses of one entry (the same hash): find one that collides.
        let a = 0x7f00_0000_0000u64;
        let b = (1..u64::MAX)
            .map(|i| a + i * 512)
            .find(|&b| std::ptr::eq(m.entry(a), m.entry(b)))
            .unwrap();
        let mut r = None;
        assert_eq!(m.try_insert(a, 1), Ok(()));
        assert_eq!(m.take_reserving(a, &mut r), Some(1));
        assert!(r.is_some());
        assert_eq!(m.len(), 0, "a reserved entry holds nothing");
        assert_eq!(m.take(a), None);
        assert_eq!(m.with(a, |v| *v), None);
        // Others cannot fill it: neither through no reservation nor another one.
        assert_eq!(m.try_insert(b, 2), Err(2));
        let mut none = None;
        assert_eq!(m.try_insert_reserved(b, 2, &mut none), Err(2));
        // Its holder can, with any address of the entry.
        assert_eq!(m.try_insert_reserved(b, 3, &mut r), Ok(()));
        assert!(r.is_none(), "used up");
        assert_eq!(m.with(b, |v| *v), Some(3));
        assert_eq!(m.len(), 1);
        // A reservation moves: the entry it held is emptied.
        let c = a + 512;
        assert_eq!(m.try_insert(c, 4), Ok(()));
        assert_eq!(m.take_reserving(b, &mut r), Some(3));
        assert_eq!(m.take_reserving(c, &mut r), Some(4));
        assert_eq!(m.try_insert(a, 5), Ok(()), "the first entry was released");
        r.take().unwrap().release();
        assert_eq!(m.try_insert(c, 6), Ok(()), "the second entry was released");
        assert_eq!(m.len(), 2);
        // An odd address never matches a reservation.
        assert_eq!(m.take_reserving(a, &mut r), Some(5));
        assert_eq!(m.try_insert_reserved(a | 1, 7, &mut r), Err(7));
        r.take().unwrap().release();
    }

    /// Threads free (take with their reservation) their own and each other's addresses
    /// and allocate (insert with it) again, over few entries, with a thread cloning
    /// whatever it finds in place: every value is taken out once, never reached through
    /// another address, none leaks, and a reservation never lets two threads at one
    /// entry (Miri checks the accesses).
    #[test]
    fn concurrent_reserving_takes_and_refills_move_each_value_once() {
        let m: Arc<DirectMap<Arc<u64>>> = Arc::new(DirectMap::new());
        let taken = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        const THREADS: u64 = 3;
        const ROUNDS: u64 = if cfg!(miri) { 200 } else { 20_000 };
        // Few distinct addresses per thread, so entries are reused and reserved often.
        let addr = |t: u64, r: u64| 0x7f00_0000_0000 + (r % 5) * 512 + t * (512 << 20);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (m, taken, refused) = (&m, &taken, &refused);
                s.spawn(move || {
                    let mut res = None;
                    for r in 0..ROUNDS {
                        let a = addr(t, r);
                        match m.try_insert_reserved(a, Arc::new(a), &mut res) {
                            Ok(()) => {
                                if r % 3 != 0 {
                                    if let Some(v) = m.take_reserving(a, &mut res) {
                                        assert_eq!(*v, a);
                                        taken.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            Err(v) => {
                                assert_eq!(*v, a);
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        // Left by the next thread (a round in three): taken here.
                        let other = addr((t + 1) % THREADS, r.saturating_sub(1));
                        if let Some(v) = m.take_reserving(other, &mut res) {
                            assert_eq!(*v, other, "a value reached through another address");
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    if let Some(res) = res {
                        res.release();
                    }
                });
            }
            let m = &m;
            s.spawn(move || {
                for r in 0..ROUNDS {
                    let a = addr(r % THREADS, r);
                    if let Some(v) = m.with(a, |v| v.clone()) {
                        assert_eq!(*v, a);
                    }
                }
            });
        });
        let left = m.len();
        let m = Arc::into_inner(m).expect("the threads are done");
        drop(m);
        assert_eq!(
            taken.load(Ordering::Relaxed) + refused.load(Ordering::Relaxed) + left,
            (THREADS * ROUNDS) as usize
        );
    }

    /// Threads put addresses in, clone and take their own and each other's out, over
    /// few entries (many collisions, so many refused inserts), with a thread cloning
    /// whatever it finds: every value is taken out exactly once and never reached
    /// through another address, and none leaks (counted by the `Arc`s).
    #[test]
    fn concurrent_inserts_clones_and_takes_move_each_value_once() {
        let m: Arc<DirectMap<Arc<u64>>> = Arc::new(DirectMap::new());
        let taken = Arc::new(AtomicUsize::new(0));
        let refused = Arc::new(AtomicUsize::new(0));
        const THREADS: u64 = 4;
        const ROUNDS: u64 = if cfg!(miri) { 300 } else { 20_000 };
        let addr =
            |t: u64, r: u64| 0x7f00_0000_0000 + ((t * ROUNDS + r) % 97) * 512 + t * (512 << 20);
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (m, taken, refused) = (&m, &taken, &refused);
                s.spawn(move || {
                    for r in 0..ROUNDS {
                        let a = addr(t, r);
                        match m.try_insert(a, Arc::new(a)) {
                            Ok(()) => {
                                // The previous thread may take it out at any time (its
                                // `other` is this thread's address of a round before).
                                if let Some(v) = m.with(a, |v| **v) {
                                    assert_eq!(v, a);
                                }
                                // Taken by this thread or, half of the time, left for
                                // the previous thread, which takes it below.
                                if r % 2 == 0 {
                                    if let Some(v) = m.take(a) {
                                        assert_eq!(*v, a);
                                        taken.fetch_add(1, Ordering::Relaxed);
                                    }
                                }
                            }
                            Err(v) => {
                                assert_eq!(*v, a);
                                refused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        let other = addr((t + 1) % THREADS, r.saturating_sub(1));
                        // Each address is taken once at most: by its thread or here.
                        if let Some(v) = m.take(other) {
                            assert_eq!(*v, other, "a value reached through another address");
                            taken.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
            let m = &m;
            s.spawn(move || {
                for r in 0..ROUNDS {
                    let a = addr(r % THREADS, r);
                    if let Some(v) = m.with(a, |v| v.clone()) {
                        assert_eq!(*v, a);
                    }
                }
            });
        });
        let left = m.len();
        let m = Arc::into_inner(m).expect("the threads are done");
        drop(m);
        assert_eq!(
            taken.load(Ordering::Relaxed) + refused.load(Ordering::Relaxed) + left,
            (THREADS * ROUNDS) as usize
        );
    }
}
