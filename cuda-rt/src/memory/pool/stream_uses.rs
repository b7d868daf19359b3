//! The streams other than its own that used a block of memory (`record_stream`), and
//! the fences (events) recorded on them when the block is freed: for a pooled block,
//! fences the arena polls before it hands the block out again (see `memory::arena`'s
//! `awaiting`, [`StreamUses::fence`]); for stream-ordered memory (`MemoryAsync`),
//! fences the freeing stream waits for on the device before `cuMemFreeAsync`
//! ([`StreamUses::order_before`]), so the driver's pool reuses the memory only after
//! them.
//!
//! A block nobody recorded a stream on pays one relaxed load of [`StreamUses::any`]
//! when it is freed, nothing more: the list, its lock and the driver are reached only
//! past that test.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::{Error, Result};
use crate::event::EventFlags;
use crate::memory::arena::StreamFence;
use crate::stream::{AsStream, StreamRef, PER_THREAD_DEFAULT_HANDLE};

use super::stream_key::stream_key;

/// The fences' events: no timing, the cheapest kind.
pub(super) const FENCE_FLAGS: EventFlags = EventFlags::DISABLE_TIMING;

/// Fences of one free kept on the stack: a block used by more streams than this
/// gathers its fences in a vector instead.
const INLINE_FENCES: usize = 8;

/// A stream recorded on a block, kept alive until the block's free.
#[derive(Debug)]
struct Use {
    stream: StreamRef,
    /// Its arena key when recorded (for the per-thread default stream, the recording
    /// thread's own key).
    key: u64,
}

/// The streams recorded on one block since it was handed out. `Default` (empty) costs
/// no heap allocation.
#[derive(Debug, Default)]
pub(crate) struct StreamUses {
    /// Whether `list` may hold anything: the free's one test.
    any: AtomicBool,
    list: Mutex<Vec<Use>>,
}

impl StreamUses {
    /// Whether any stream was recorded.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        self.any.load(Ordering::Relaxed)
    }

    /// Records that `stream` uses the block of `device` allocated in arena
    /// `block_key`: nothing for the block's own stream (one key compare). A stream of
    /// another device (a peer copy's) is recorded too: the free waits for it on the
    /// host, since an event of its device cannot be polled by this device's arena.
    #[inline]
    pub(crate) fn record<S: AsStream + ?Sized>(&self, stream: &S, device: i32, block_key: u64) {
        let key = stream_key(stream.ptr());
        if key == block_key && stream.device_id() == device {
            return;
        }
        self.record_other(stream, key);
    }

    #[cold]
    #[inline(never)]
    fn record_other<S: AsStream + ?Sized>(&self, stream: &S, key: u64) {
        let mut list = self.list.lock().unwrap_or_else(PoisonError::into_inner);
        if !list
            .iter()
            .any(|u| u.key == key && u.stream.device_id() == stream.device_id())
        {
            list.push(Use {
                stream: stream.as_stream_ref(),
                key,
            });
        }
        self.any.store(true, Ordering::Relaxed);
    }

    /// Records a fence on each recorded stream of `device` and hands them to `free`
    /// (which gives the block back after them); the list is empty afterwards. A stream
    /// that cannot take a fence is waited for (`count_sync` counts each wait). One
    /// that cannot be waited for either (it is capturing a graph, or the driver
    /// failed) leaks the block: it stays in use, never handed out again, and `false`
    /// says so.
    #[cold]
    #[inline(never)]
    pub(super) fn fence(
        &self,
        device: i32,
        count_sync: impl Fn(),
        free: impl FnOnce(&[StreamFence]),
    ) -> bool {
        let uses = self.take();
        let mut inline = [StreamFence {
            stream: 0,
            fence: 0,
        }; INLINE_FENCES];
        let mut more = Vec::new();
        let mut n = 0;
        let mut leaked = false;
        for u in &uses {
            match fence_one(device, u) {
                Ok(Some(f)) => {
                    if n < INLINE_FENCES {
                        inline[n] = f;
                    } else {
                        if more.is_empty() {
                            more.extend_from_slice(&inline);
                        }
                        more.push(f);
                    }
                    n += 1;
                }
                Ok(None) => count_sync(),
                Err(_) => leaked = true,
            }
        }
        let fences = if n <= INLINE_FENCES {
            &inline[..n]
        } else {
            &more[..]
        };
        if leaked {
            for f in fences {
                crate::event::give_raw(device, FENCE_FLAGS, f.fence as usize);
            }
            return false;
        }
        free(fences);
        true
    }

    /// Orders a free on `free_stream` of `device` after every recorded stream's queued
    /// work, on the device where it can: an event recorded on each recorded stream that
    /// `free_stream` waits for (`cuStreamWaitEvent`, no host wait). A stream that cannot
    /// take a fence is waited for on the host instead, as is a fence `free_stream`
    /// refuses to wait for (`count_sync` counts each host wait). `false` when some
    /// stream could not be waited for either (it is capturing a graph, or the driver
    /// failed): the caller must not free the memory then (leak it). The list is empty
    /// afterwards.
    #[cold]
    #[inline(never)]
    pub(crate) fn order_before(
        &self,
        device: i32,
        free_stream: &StreamRef,
        count_sync: impl Fn(),
    ) -> bool {
        let mut ordered = true;
        for u in &self.take() {
            match fence_one(device, u) {
                Ok(Some(f)) => {
                    let event = f.fence as sys::CUevent;
                    // SAFETY: `free_stream` is a live stream of `device` (the caller's
                    // memory keeps it alive), `event` a live event of `device` just
                    // recorded; the context is current (`fence_one`). The wait holds the
                    // record as it is now: the event may go back to the cache at once.
                    let waited = unsafe { result::stream::wait_event(free_stream.as_raw(), event) };
                    if waited.is_err() {
                        count_sync();
                        // SAFETY: as above.
                        if unsafe { result::event::synchronize(event) }.is_err() {
                            ordered = false;
                        }
                    }
                    crate::event::give_raw(device, FENCE_FLAGS, f.fence as usize);
                }
                Ok(None) => count_sync(),
                Err(_) => ordered = false,
            }
        }
        ordered
    }

    /// Forgets every recorded stream (dropping the references that kept them alive):
    /// for a caller that waited for all of the device's work another way.
    #[cold]
    pub(crate) fn clear(&self) {
        drop(self.take());
    }

    /// The recorded uses, leaving the list empty.
    fn take(&self) -> Vec<Use> {
        let uses = std::mem::take(&mut *self.list.lock().unwrap_or_else(PoisonError::into_inner));
        self.any.store(false, Ordering::Relaxed);
        uses
    }
}

/// A fence recorded on `u`'s stream, or `None` when the stream was waited for
/// instead (another thread's per-thread default stream, which no handle names here,
/// or a stream that refused the event); `Err` when it could not be waited for.
fn fence_one(device: i32, u: &Use) -> Result<Option<StreamFence>> {
    if u.stream.device_id() != device {
        // A peer's stream: its events belong to its own device.
        make_current(u.stream.device_id())?;
        // SAFETY: `u.stream` keeps its stream alive (as below); its device's context
        // was made current above.
        unsafe { result::stream::synchronize(u.stream.as_raw()) }?;
        return Ok(None);
    }
    make_current(device)?;
    let handle = u.stream.handle();
    if handle == PER_THREAD_DEFAULT_HANDLE && stream_key(handle) != u.key {
        // Another thread's per-thread default stream: the context's whole work.
        result::context::synchronize()?;
        return Ok(None);
    }
    let raw = u.stream.as_raw();
    // SAFETY: `u.stream` keeps its stream alive (or is a default stream, or a handle
    // whose maker keeps it alive: `StreamRef::from_raw`'s contract).
    let capturing = unsafe { result::stream::is_capturing(raw) }?;
    if capturing != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        // An event recorded into a capture says nothing about when the memory is free,
        // and a capturing stream cannot be waited for.
        return Err(Error::invalid_state(
            crate::error::StateKind::AllocatorFailed,
            "record_stream: the recorded stream is capturing a graph at the free",
        ));
    }
    let event = crate::event::take_raw(device, FENCE_FLAGS)?;
    // SAFETY: `event` is a live event of `device` (taken from the cache or created in
    // its context), `raw` a live stream of `device` (as above).
    match unsafe { result::event::record(event as sys::CUevent, raw) } {
        Ok(()) => Ok(Some(StreamFence {
            stream: u.key,
            fence: event as u64,
        })),
        Err(_) => {
            crate::event::give_raw(device, FENCE_FLAGS, event);
            // SAFETY: as above.
            unsafe { result::stream::synchronize(raw) }?;
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_own_stream_is_not_recorded_and_others_are_recorded_once() {
        let uses = StreamUses::default();
        let legacy = StreamRef::legacy_default(0);
        let own = stream_key(legacy.handle());
        uses.record(&legacy, 0, own);
        assert!(!uses.any(), "the block's own stream needs no fence");
        let per_thread = StreamRef::per_thread_default(0);
        uses.record(&per_thread, 0, own);
        uses.record(&per_thread, 0, own);
        assert!(uses.any());
        assert_eq!(uses.take().len(), 1, "one use a stream");
        assert!(!uses.any(), "taken: empty again");
    }

    #[test]
    fn the_per_thread_default_stream_of_another_thread_is_another_use() {
        let uses = StreamUses::default();
        let mine = stream_key(PER_THREAD_DEFAULT_HANDLE);
        uses.record(&StreamRef::per_thread_default(0), 0, mine);
        assert!(
            !uses.any(),
            "this thread's per-thread stream is the block's own"
        );
        std::thread::scope(|s| {
            s.spawn(|| uses.record(&StreamRef::per_thread_default(0), 0, mine));
        });
        assert!(
            uses.any(),
            "the other thread's per-thread stream is another stream"
        );
        let taken = uses.take();
        assert_eq!(taken.len(), 1);
        assert_ne!(taken[0].key, mine, "keyed by the recording thread");
        uses.record(&StreamRef::legacy_default(0), 0, mine);
        uses.clear();
        assert!(!uses.any(), "cleared");
    }

    #[test]
    fn a_stream_of_another_device_is_recorded_even_with_the_same_key() {
        let uses = StreamUses::default();
        let legacy = StreamRef::legacy_default(1);
        uses.record(&legacy, 0, stream_key(legacy.handle()));
        assert!(uses.any(), "a peer's use: waited for at the free");
    }
}
