//! In-flight fences: an event recorded after an asynchronous copy that uses pinned
//! memory, so the memory is neither reused nor freed before the copy has finished.
//! Events are recycled through a small per-device cache, so recording a fence costs
//! one `cuEventRecord` after the first use on a device.

use std::sync::{Mutex, PoisonError};

use crate::driver::context::MAX_DEVICES;
use crate::driver::{host, sys};
use crate::error::{Error, Result};

/// Most idle events kept per device; more are destroyed.
const CACHE_CAP: usize = 64;

static EVENTS: [Mutex<Vec<usize>>; MAX_DEVICES] = [const { Mutex::new(Vec::new()) }; MAX_DEVICES];

fn cache(device: i32) -> Result<&'static Mutex<Vec<usize>>> {
    usize::try_from(device)
        .ok()
        .and_then(|d| EVENTS.get(d))
        .ok_or_else(|| Error::InvalidArgument(format!("device id {device} is out of range")))
}

/// An event of `device` (whose context the caller made current), from the cache or new.
pub(crate) fn take_event(device: i32) -> Result<usize> {
    let cached = cache(device)?
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .pop();
    match cached {
        Some(e) => Ok(e),
        None => host::event_create(),
    }
}

/// Gives an event back to `device`'s cache (or destroys it when the cache is full).
pub(crate) fn give_event(device: i32, event: usize) {
    if let Ok(c) = cache(device) {
        let mut v = c.lock().unwrap_or_else(PoisonError::into_inner);
        if v.len() < CACHE_CAP {
            v.push(event);
            return;
        }
    }
    let _ = host::event_destroy(event);
}

/// Something that finishes later: the pool's deferred list holds blocks until theirs
/// is done. [`Fence`] is the CUDA one; tests use fakes.
pub(crate) trait Pending: Send + 'static {
    /// Whether the work has finished (an error counts as finished: a failed context
    /// runs no more copies).
    fn is_done(&self) -> bool;
    /// Blocks until the work has finished (errors as in `is_done`).
    fn wait(&self);
}

/// An event recorded on a stream after a copy; gives its event back when dropped.
#[derive(Debug)]
pub(crate) struct Fence {
    event: usize,
    device: i32,
    /// The copy writes the pinned memory (device to host): readers must wait too.
    writes: bool,
}

impl Fence {
    /// Records a fence on `stream` (of `device`, whose context is current).
    pub(crate) fn record(stream: sys::CUstream, device: i32, writes: bool) -> Result<Fence> {
        let event = take_event(device)?;
        if let Err(e) = host::event_record(event, stream) {
            give_event(device, event);
            return Err(e);
        }
        Ok(Fence {
            event,
            device,
            writes,
        })
    }

    /// The raw event.
    pub(crate) fn event(&self) -> usize {
        self.event
    }

    /// Whether the fenced copy writes the pinned memory.
    pub(crate) fn writes(&self) -> bool {
        self.writes
    }

    /// Marks that a copy covered by this fence writes the pinned memory.
    pub(crate) fn set_writes(&mut self) {
        self.writes = true;
    }

    /// Waits, returning the driver's error if there is one.
    pub(crate) fn synchronize(&self) -> Result<()> {
        host::event_synchronize(self.event)
    }
}

impl Pending for Fence {
    fn is_done(&self) -> bool {
        host::event_query(self.event).unwrap_or(true)
    }
    fn wait(&self) {
        let _ = host::event_synchronize(self.event);
    }
}

impl Drop for Fence {
    fn drop(&mut self) {
        give_event(self.device, self.event);
    }
}
