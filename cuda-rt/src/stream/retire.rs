//! Destroying an owned stream without lending its handle to the next stream while its
//! work still runs.
//!
//! The caching pool keys its arenas by stream handle, and a block freed with its last
//! use on its own stream goes back to that stream's arena with no fence: any later
//! malloc from the arena is ordered on the stream after the use. That holds only while
//! the handle names the same stream. The driver destroys a stream that still has
//! queued work once the work is done, but it may hand the same handle value to the
//! next stream created at once; that stream's mallocs would then take the freed blocks
//! from the arena under the old work. So a stream that some pool made an arena for
//! ([`note_arena_key`]) and that still has work queued when its last owner goes is
//! not destroyed yet: it is kept, which keeps its handle from being given out again,
//! and destroyed once its work is done, looked at whenever a stream is created or
//! dropped. A stream no pool ever keyed is destroyed at once, as before. A stream
//! given up with `Stream::into_raw` leaves cuda-rt's hands (its new owner may destroy
//! it at once): one that a pool keyed is waited for first.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use cuda_sys::driver as sys;
use cuda_sys::result;

/// Arena keys that some pool made an arena for (arenas are never removed).
static POOLED: Mutex<BTreeSet<u64>> = Mutex::new(BTreeSet::new());
/// Owned streams whose last owner went while work was queued on them.
static KEPT: Mutex<Vec<usize>> = Mutex::new(Vec::new());
/// `KEPT.len()`, read without the lock.
static N_KEPT: AtomicUsize = AtomicUsize::new(0);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Notes that a pool made an arena for the stream key `key` (a stream handle, or a
/// per-thread key that names no handle): an owned stream with that handle is then
/// destroyed only once its work is done.
pub(crate) fn note_arena_key(key: u64) {
    lock(&POOLED).insert(key);
}

/// Whether some pool made an arena for the stream handle `handle`: an owned stream
/// with that handle is let go (destroyed, or given up with `Stream::into_raw`) only
/// once its queued work is done.
pub(super) fn pooled(handle: usize) -> bool {
    lock(&POOLED).contains(&(handle as u64))
}

/// Destroys the owned stream `handle`, its last owner gone: now, or once its queued
/// work is done when a pool may hold blocks freed onto it (see the module docs).
pub(super) fn retire(handle: usize) {
    destroy_finished();
    if pooled(handle) && !idle(handle) {
        let mut kept = lock(&KEPT);
        kept.push(handle);
        N_KEPT.store(kept.len(), Ordering::Relaxed);
        return;
    }
    destroy(handle);
}

/// Destroys the kept streams whose work is done.
pub(super) fn destroy_finished() {
    if N_KEPT.load(Ordering::Relaxed) == 0 {
        return;
    }
    let done: Vec<usize> = {
        let mut kept = lock(&KEPT);
        let (done, busy) = kept.iter().partition(|&&h| idle(h));
        *kept = busy;
        N_KEPT.store(kept.len(), Ordering::Relaxed);
        done
    };
    done.into_iter().for_each(destroy);
}

/// The handles of the owned streams kept until their work is done (for the tests).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub(crate) fn kept() -> Vec<usize> {
    lock(&KEPT).clone()
}

/// Whether the owned stream `handle` has no work queued. Not asked (`false`) while a
/// capture is under way, which may refuse the query; a query that fails says `false`
/// too (a stream of a dead context is then kept for good, which costs a handle).
fn idle(handle: usize) -> bool {
    if crate::capture::any_capture_active() {
        return false;
    }
    // SAFETY: an owned stream, not destroyed yet (its last owner hands it here once).
    unsafe { result::stream::query(handle as sys::CUstream) }.unwrap_or(false)
}

fn destroy(handle: usize) {
    // An error (a context torn down at exit) leaves nothing to clean up.
    // SAFETY: an owned stream (created here, or given with `from_raw`'s promise that
    // nobody else destroys it), destroyed once: by its last owner, or from `KEPT`,
    // which holds it only after its last owner went.
    let _ = unsafe { result::stream::destroy(handle as sys::CUstream) };
}
