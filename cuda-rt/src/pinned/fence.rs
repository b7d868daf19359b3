//! In-flight fences: an event recorded after an asynchronous copy that uses pinned
//! memory, so the memory is neither reused nor freed before the copy has finished;
//! the fence also holds the device side of the copy (a [`MemoryPointer`] clone) until
//! then.
//! Events are recycled through the thread's event cache (the one `Event`s use), so
//! recording a fence costs one `cuEventRecord` after the first use on a device.

use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::error::Result;
use crate::event::EventFlags;
use crate::memory::MemoryPointer;

/// The fences' events: no timing, the cheapest kind.
const FENCE_FLAGS: EventFlags = EventFlags::DISABLE_TIMING;

/// An event of `device` (whose context the caller made current), from the thread's
/// event cache (the one [`Event`](crate::Event)s use) or new.
pub(crate) fn take_event(device: i32) -> Result<usize> {
    crate::event::take_raw(device, FENCE_FLAGS)
}

/// Gives an event back to the thread's event cache (or destroys it when full).
pub(crate) fn give_event(device: i32, event: usize) {
    crate::event::give_raw(device, FENCE_FLAGS, event);
}

/// Something that finishes later: the pool's deferred list holds blocks until theirs
/// is done. [`Fence`] is the CUDA one; tests use fakes.
///
/// A fence that cannot be queried is not a finished fence: while another thread holds
/// a global-mode capture every `cuEventQuery` and `cuEventSynchronize` fails though
/// the copy still runs, so an error says "not done" and the block is kept until a
/// later query succeeds. On a dead context that never happens: the block is leaked.
pub(crate) trait Pending: Send + 'static {
    /// Whether the work is known to have finished (`false` on an error).
    fn is_done(&self) -> bool;
    /// Blocks until the work has finished; `false` when the wait failed (not known
    /// to be done, as in `is_done`).
    fn wait(&self) -> bool;
}

/// An event recorded on a stream after a copy; gives its event back when dropped.
///
/// It also keeps alive the device memory of the copies it covers (a clone of each
/// [`MemoryPointer`], a reference count): the memory goes back to its allocator only
/// when the fence is dropped, which happens once the fence is done (or waited for),
/// so a copy never writes or reads device memory that someone else was given.
#[derive(Debug)]
pub(crate) struct Fence {
    event: usize,
    device: i32,
    /// The copy writes the pinned memory (device to host): readers must wait too.
    writes: bool,
    /// The device memory of the fenced copy (`None` for a copy to or from a raw
    /// address, whose caller keeps it alive).
    keep: Option<MemoryPointer>,
    /// The device memory of earlier copies on the same pinned memory that had not
    /// finished when this fence replaced theirs ([`inherit`](Self::inherit)). Empty
    /// (no heap allocation) unless copies to distinct memory overlap.
    earlier: Vec<MemoryPointer>,
}

impl Fence {
    /// A fence of `device` (whose context is current) not recorded yet: its event is
    /// taken now, so that once the copy is queued only the record is left to do.
    pub(crate) fn new(device: i32, writes: bool, keep: Option<MemoryPointer>) -> Result<Fence> {
        let event = take_event(device)?;
        Ok(Fence {
            event,
            device,
            writes,
            keep,
            earlier: Vec::new(),
        })
    }

    /// Records the fence on `stream`, after the copy.
    ///
    /// # Safety
    /// `stream` is a live stream (or a default-stream handle) of the fence's device.
    pub(crate) unsafe fn record(&self, stream: sys::CUstream) -> Result<()> {
        // SAFETY: the event is the fence's own, live until its drop; `stream` is live
        // and of the event's device (caller).
        Ok(unsafe { result::event::record(self.event as sys::CUevent, stream) }?)
    }

    /// Takes over what `older` keeps alive: `older` fences copies on the same pinned
    /// memory that have not finished, and the stream of this fence waits for `older`'s
    /// event before its own copy, so this fence is done only after them.
    pub(crate) fn inherit(&mut self, older: &mut Fence) {
        if older.writes {
            self.writes = true;
        }
        let earlier = std::mem::take(&mut older.earlier);
        for m in earlier.into_iter().chain(older.keep.take()) {
            let held = self
                .keep
                .iter()
                .chain(&self.earlier)
                .any(|k| same_memory(k, &m));
            if !held {
                self.earlier.push(m);
            }
        }
    }

    /// The raw event.
    pub(crate) fn event(&self) -> usize {
        self.event
    }

    /// Whether the fenced copy writes the pinned memory.
    pub(crate) fn writes(&self) -> bool {
        self.writes
    }

    /// Waits, returning the driver's error if there is one.
    pub(crate) fn synchronize(&self) -> Result<()> {
        // SAFETY: the event is the fence's own, live until its drop.
        unsafe { result::event::synchronize(self.event as sys::CUevent) }.map_err(Into::into)
    }
}

/// Whether two pointers keep the same memory object alive (one of them is enough).
fn same_memory(a: &MemoryPointer, b: &MemoryPointer) -> bool {
    Arc::ptr_eq(a.mem(), b.mem())
}

impl Pending for Fence {
    fn is_done(&self) -> bool {
        // SAFETY: the event is the fence's own, live until its drop.
        let r = unsafe { result::event::query(self.event as sys::CUevent) };
        matches!(r, Ok(true))
    }
    fn wait(&self) -> bool {
        self.synchronize().is_ok()
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        give_event(self.device, self.event);
    }
}
