//! The arena key of a malloc: the handle of the thread's current stream, except the
//! per-thread default stream, which gets one key per thread.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::stream::PER_THREAD_DEFAULT_HANDLE;

/// The bit that marks a per-thread stream key (no stream handle has it).
const PER_THREAD_KEY_BIT: u64 = 1 << 63;

static NEXT_THREAD_KEY: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's key for the per-thread default stream (0: not drawn yet).
    static THREAD_KEY: Cell<u64> = const { Cell::new(0) };
}

/// The arena key of a stream handle: the handle itself, except the per-thread default
/// stream, which gets one key per thread.
#[inline]
pub(crate) fn stream_key(handle: usize) -> u64 {
    if handle == PER_THREAD_DEFAULT_HANDLE {
        per_thread_key()
    } else {
        handle as u64
    }
}

/// The stream handle that the arena key `key` names on the thread that mallocs from
/// its arena: the key itself, except a per-thread key, which names the per-thread
/// default stream (only its own thread's mallocs reach that arena).
#[inline]
pub(crate) fn handle_of_key(key: u64) -> usize {
    if key & PER_THREAD_KEY_BIT != 0 {
        PER_THREAD_DEFAULT_HANDLE
    } else {
        key as usize
    }
}

#[inline]
fn per_thread_key() -> u64 {
    THREAD_KEY.with(|k| match k.get() {
        0 => {
            let v = PER_THREAD_KEY_BIT | NEXT_THREAD_KEY.fetch_add(1, Ordering::Relaxed);
            k.set(v);
            v
        }
        v => v,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stream_keys_are_handles_except_the_per_thread_default_stream() {
        assert_eq!(stream_key(0), 0, "the legacy default stream is one arena");
        assert_eq!(stream_key(0x7f00_dead_b000), 0x7f00_dead_b000);
        let mine = stream_key(PER_THREAD_DEFAULT_HANDLE);
        assert_ne!(mine & PER_THREAD_KEY_BIT, 0);
        assert_eq!(
            stream_key(PER_THREAD_DEFAULT_HANDLE),
            mine,
            "stable per thread"
        );
        let other = std::thread::spawn(|| stream_key(PER_THREAD_DEFAULT_HANDLE))
            .join()
            .unwrap();
        assert_ne!(other, mine, "one arena per thread");
        assert_ne!(other & PER_THREAD_KEY_BIT, 0);
        // And back: a key names its stream for the arena's own mallocs.
        assert_eq!(handle_of_key(mine), PER_THREAD_DEFAULT_HANDLE);
        assert_eq!(handle_of_key(other), PER_THREAD_DEFAULT_HANDLE);
        assert_eq!(handle_of_key(0), 0);
        assert_eq!(handle_of_key(0x7f00_dead_b000), 0x7f00_dead_b000);
    }
}
