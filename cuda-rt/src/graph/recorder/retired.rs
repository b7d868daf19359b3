//! What a recording kept alive, let go once the launches that may use it are done.
//!
//! An executable updated in place, or evicted, may still have launches queued that use
//! the old parameters: the memory and objects its graph kept stay alive until then.
//! Launches of one executable run one after the other (`cuGraphLaunch` orders each
//! behind the previous launches of the same executable, on any stream), so one event
//! recorded on the stream of the last launch is a fence for all of them. The fence is
//! polled without waiting at the recorder's next call, and waited for when the recorder
//! goes.
//!
//! A fence says nothing about work queued outside the capture, on a stream forked into
//! it, whose use was noted as the capture's (`capture::Ended::forked_uses`), nor about
//! another thread's per-thread default stream (its handle names this thread's stream
//! here): then the whole context is waited for, as a [`Graph`](super::super::Graph)
//! does when it goes. Where no wait is possible (this thread is capturing), the objects
//! are leaked rather than let go while they may be in use, as `memory::uses` does.

use std::any::Any;
use std::sync::Arc;

use cuda_sys::result;

use super::super::Kept;
use crate::capture::{info as capture_info, this_thread_captures, CaptureStatus};
use crate::device::context::make_current;
use crate::event::{Event, EventFlags};
use crate::stream::{StreamRef, PER_THREAD_DEFAULT_HANDLE};

type Items = Vec<Arc<dyn Any + Send + Sync>>;

/// Kept objects and the fence after the last launch that may use them.
#[derive(Debug)]
struct Fenced {
    fence: Event,
    items: Items,
}

/// The kept objects of retired recordings, waiting for their fences.
#[derive(Debug, Default)]
pub(crate) struct Retired {
    list: Vec<Fenced>,
}

impl Retired {
    /// Whether nothing is waiting.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// How many lists of kept objects are waiting for their fences.
    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// Lets `kept` (what an executable of `device` used, last launched on `last`) go
    /// once those launches are done: now when it never ran, else after a fence.
    pub(crate) fn retire(&mut self, kept: Kept, device: i32, last: Option<&StreamRef>) {
        if kept.items.is_empty() {
            return;
        }
        // (`Option::is_none_or` is newer than the workspace's Rust 1.80.)
        let per_thread = last.is_some_and(|s| s.handle() == PER_THREAD_DEFAULT_HANDLE);
        let fence_will_do = !kept.forked_uses && !per_thread;
        if fence_will_do {
            let Some(s) = last else {
                // Never launched, and no work outside the capture uses it.
                drop(kept.items);
                return;
            };
            if let Some(fence) = fence_on(device, s) {
                self.list.push(Fenced {
                    fence,
                    items: kept.items,
                });
                return;
            }
        }
        if context_idle(device) {
            drop(kept.items);
        } else {
            leak(kept.items);
        }
    }

    /// Lets go of the objects whose fences are done (a fence that cannot be asked is
    /// not done).
    pub(crate) fn poll(&mut self) {
        self.list.retain(|f| !matches!(f.fence.query(), Ok(true)));
    }
}

impl Drop for Retired {
    fn drop(&mut self) {
        for f in self.list.drain(..) {
            if f.fence.synchronize().is_ok() {
                drop(f.items);
            } else {
                leak(f.items);
            }
        }
    }
}

/// An event recorded on `s` now, after the launches queued there; `None` when `s` is
/// capturing (a record would be a node of that graph, not a fence) or the driver
/// refuses.
fn fence_on(device: i32, s: &StreamRef) -> Option<Event> {
    if !matches!(capture_info(s), Ok((CaptureStatus::None, _))) {
        return None;
    }
    let fence = Event::on_device(device, EventFlags::DISABLE_TIMING).ok()?;
    fence.record_on(s).ok()?;
    Some(fence)
}

/// Waits for all work of `device`'s context; `false` when it cannot (this thread is
/// capturing, where a wait is refused and would invalidate the capture; or the driver
/// refuses).
fn context_idle(device: i32) -> bool {
    !this_thread_captures()
        && make_current(device).is_ok()
        && result::context::synchronize().is_ok()
}

/// Keeps `items` forever: they may be in use by work that nothing here can wait for.
#[cold]
fn leak(items: Items) {
    log::warn!(
        target: "cuda_rt::graph",
        "a graph recorder could not wait for the launches of a retired executable; the \
         {} object(s) it kept are leaked rather than let go while they may be in use",
        items.len()
    );
    std::mem::forget(items);
}
