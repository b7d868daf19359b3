//! One stream key's arena ([`Arena`]: its chunks behind a spin lock, a change count,
//! and the blocks awaiting their streams) and that lock ([`ArenaLock`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use spin::mutex::{SpinMutex, SpinMutexGuard};

use super::awaiting::Awaiting;
use super::bins::Bins;

/// One arena: a stream key's chunks, padded so two arenas never share a cache line.
#[repr(align(128))]
#[derive(Debug)]
pub(super) struct Arena {
    pub(super) key: u64,
    /// Its index in the pool's table.
    pub(super) index: u32,
    pub(super) bins: ArenaLock<Bins>,
    /// Bumped by every holder of the lock ([`Arena::lock`]): while it has not moved,
    /// nothing in `bins` has changed (what a thread's lock-free cached pair relies on,
    /// see [`Parked::take_unlocked`](super::parked::Parked::take_unlocked)).
    pub(super) changes: AtomicU64,
    /// Blocks given back while recorded streams may still use them, with their
    /// fences (see `awaiting`); locked only by those frees and by polls.
    pub(super) awaiting: Mutex<Awaiting>,
    /// Blocks in `awaiting`: a miss polls the list only when it is not 0.
    pub(super) n_awaiting: AtomicU64,
}

impl Arena {
    /// An empty arena for stream key `key` at `index` in the pool's table.
    pub(super) fn new(key: u64, index: u32) -> Arena {
        Arena {
            key,
            index,
            bins: ArenaLock::new(Bins::new()),
            changes: AtomicU64::new(0),
            awaiting: Mutex::new(Awaiting::default()),
            n_awaiting: AtomicU64::new(0),
        }
    }

    /// The arena's lock; counts a change, as any holder may change the chunks.
    #[inline]
    pub(super) fn lock(&self) -> SpinMutexGuard<'_, Bins> {
        let g = lock(&self.bins);
        // Under the lock: a plain store, no read-modify-write.
        let n = self.changes.load(Ordering::Relaxed);
        self.changes.store(n.wrapping_add(1), Ordering::Relaxed);
        g
    }

    /// The arena's lock for a holder that changes no chunk (it reads, or moves
    /// counters only): counts no change.
    #[inline]
    pub(super) fn lock_unchanged(&self) -> SpinMutexGuard<'_, Bins> {
        lock(&self.bins)
    }
}

/// An arena's lock: a spin lock, taken with one compare-exchange and released with a
/// plain store. `std::sync::Mutex` releases with an atomic swap (it must look for
/// parked waiters), so a cached malloc + free pair paid four atomic read-modify-writes
/// for its two lock pairs; this pays two. Critical sections are short (tens of
/// nanoseconds, never a backend call), so a waiter spins a little, then yields its
/// time slice in case the holder was preempted ([`lock_contended`]).
pub(super) type ArenaLock<T> = SpinMutex<T>;

#[inline]
fn lock<T>(m: &ArenaLock<T>) -> SpinMutexGuard<'_, T> {
    match m.try_lock() {
        Some(g) => g,
        None => lock_contended(m),
    }
}

#[cold]
#[inline(never)]
fn lock_contended<T>(m: &ArenaLock<T>) -> SpinMutexGuard<'_, T> {
    let mut spins = 0u32;
    loop {
        if !m.is_locked() {
            if let Some(g) = m.try_lock() {
                return g;
            }
        }
        if spins < 128 {
            spins += 1;
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}
