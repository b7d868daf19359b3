//! Allocation while a stream captures: memory nodes.
//!
//! [`alloc`](crate::memory::alloc) on a thread whose current stream captures (a
//! capture begun through cuda-rt, or a stream forked into one) does not go to the
//! allocator in effect: it calls [`capture_aware_alloc`], which allocates with
//! `cuMemAllocAsync` on the capturing stream. The driver records that as a
//! memory-allocation node of the graph, and the returned pointer is the address the
//! node gives on every launch of the graph (graph memory has a fixed address for the
//! life of the executable graph).
//!
//! Why memory nodes rather than a graph-private pool: the driver knows the graph's
//! dependencies, so it may reuse physical memory between nodes that can never run at
//! the same time, and never between nodes that can (a private pool cannot see forks
//! and joins: a block freed on one branch and reused on another would be raced on);
//! no plain `cuMemAlloc`, which a global-mode capture refuses, runs during a capture;
//! and nothing outside the graph can be handed that memory while the graph lives.
//!
//! What happens to such memory depends on when its last pointer drops:
//! - during the capture: it is freed inside the graph (`cuMemFreeAsync`, a
//!   memory-free node) on the current stream when that stream is in the same capture,
//!   else on the stream it was allocated on while that one still is. The free node
//!   depends on every captured use cuda-rt made of the block, on any stream of the
//!   capture (a fork's memset not joined back yet included), so the graph never
//!   hands the block to a later allocation node while a use may still run. A free captured on a forked stream after its
//!   join event (a temporary going out of scope at the end of the fork's block) adds
//!   no unjoined work: `end_capture` joins such free nodes into the origin stream
//!   (see [`crate::capture::fork_join`]). When neither stream is in the capture any
//!   more (it was invalidated, say), nothing is freed: the capture's end decides, as
//!   for memory still referred to then.
//! - if the capture ends in error, or its graph goes (or fails to instantiate) before
//!   any launch: the block never existed outside it; its address may be given to
//!   another graph's memory, so every cuda-rt operation on it is refused
//!   ([`StateKind::GraphMemoryGone`]) and the drop
//!   frees nothing. The same error refuses its use outside the capture before the
//!   graph's first launch, when the address holds nothing yet.
//! - after the capture: the graph owns it. Its graph is instantiated with
//!   [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`](crate::graph::InstantiateFlags), so each
//!   launch frees the previous launch's block before allocating it again, and the
//!   pointer reads what the last launch wrote (synchronize before reading it). Once
//!   both the graph and the last pointer are gone, the block of the last launch is
//!   freed on the stream of that launch.
//!
//! Memory allocated before a capture and dropped during it is kept alive by the
//! graph (see [`crate::graph`]), so no pool reuses it while the graph can run.

use std::fmt;
use std::sync::Arc;

use cuda_sys::result;

use crate::capture::{self, AllocState};
use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::Result;
use crate::memory::pool::stream_uses::StreamUses;
use crate::memory::{BaseMemory, MemoryPointer};
use crate::stream::{current_stream_of, AsStream, StreamRef, LEGACY_DEFAULT_HANDLE};

/// Memory allocated during a capture: a memory-allocation node's block.
pub(crate) struct GraphMemory {
    state: Arc<AllocState>,
    /// The streams that used the block outside its graph (after a launch made it):
    /// its free, on the stream of the graph's last launch, is ordered after that
    /// launch only, and a later launch of the graph on another stream frees and
    /// allocates it again without waiting for them either; so when the last pointer
    /// goes, their work is waited for (see `Drop`). Empty costs nothing.
    uses: StreamUses,
}

/// A stream key no stream has: every stream that uses a graph's block is recorded
/// (the graph's launch stream changes with its launches, so no stream is the block's
/// own).
const NO_STREAM_KEY: u64 = u64::MAX;

impl fmt::Debug for GraphMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GraphMemory")
            .field("ptr", &format_args!("{:#x}", self.state.ptr))
            .field("size", &self.state.size)
            .field("device", &self.state.device)
            .finish()
    }
}

// SAFETY: the block is a graph memory node's: its address is fixed for the life of the
// graph, and the state (shared with the graph) frees it only after both the pointers
// and the graph are gone; fields never change. Where the block does not exist (before
// the graph's first launch, outside its capture, after its capture failed or its
// graph went unlaunched), `check_use` refuses every cuda-rt operation on it.
unsafe impl BaseMemory for GraphMemory {
    fn ptr(&self) -> u64 {
        self.state.ptr
    }
    fn size(&self) -> usize {
        self.state.size
    }
    fn device_id(&self) -> i32 {
        self.state.device
    }
    /// During its capture: only work captured into it (on a stream in the capture).
    /// After: once a launch of its graph allocated it, never if its capture failed or
    /// its graph went without a launch.
    fn check_use(&self, stream: Option<&StreamRef>) -> Result<()> {
        self.state.check_use(stream)
    }
    /// Records `stream` (a use outside the graph, after a launch made the block): the
    /// last pointer's drop waits for its work. Uses captured into a graph are the
    /// capture's (see [`capture`]), never recorded here.
    fn record_stream(&self, stream: &StreamRef) -> Result<()> {
        self.record_use(stream);
        Ok(())
    }
    fn record_use(&self, stream: &StreamRef) {
        self.uses.record(stream, self.state.device, NO_STREAM_KEY);
    }
}

impl Drop for GraphMemory {
    fn drop(&mut self) {
        self.state.last_pointer_gone();
        if self.uses.any() {
            self.wait_for_uses();
        }
    }
}

impl GraphMemory {
    /// The last pointer went after work on other streams used the block (a copy or
    /// memset queued on a stream other than the launch's, `record_stream`): that work
    /// is waited for now. Without it the block would be freed (once the graph goes too)
    /// on the stream of the graph's last launch, or freed and allocated again by a
    /// later launch on any stream, while that work still writes it: the graph memory
    /// pool then hands it to another graph's allocation. Where no wait is possible
    /// (this thread is capturing, a host function, the driver refuses) the block is
    /// never freed (leaked).
    #[cold]
    #[inline(never)]
    fn wait_for_uses(&self) {
        let device = self.state.device;
        let waited = match self.state.last_launch() {
            Some(last)
                if !result::stream::in_host_function()
                    && !capture::this_thread_captures()
                    && make_current(device).is_ok() =>
            {
                // The launch stream waits for every recorded stream's work (events,
                // or host waits where an event cannot tell), then the host for it.
                self.uses.order_before(device, &last, || ())
                    // SAFETY: `last` keeps the stream of the graph's last launch alive
                    // (or is a default stream); its device's context was made current
                    // above.
                    && unsafe { result::stream::synchronize(last.as_raw()) }.is_ok()
            }
            _ => false,
        };
        if !waited {
            self.uses.clear();
            // The state's drop frees the block: it never runs.
            std::mem::forget(Arc::clone(&self.state));
        }
    }
}

/// What [`alloc`](crate::memory::alloc) calls first: `None` when no capture begun
/// through cuda-rt involves the current stream (one relaxed atomic load while no
/// capture is active anywhere), else the allocation as a memory node of the graph
/// being captured (see the module docs). Size 0 is never asked for.
#[inline]
pub fn capture_aware_alloc(size: usize) -> Option<Result<MemoryPointer>> {
    if !capture::any_capture_active() {
        return None;
    }
    capture_alloc(size)
}

#[cold]
fn capture_alloc(size: usize) -> Option<Result<MemoryPointer>> {
    capture_alloc_on(&current_stream_of(get_device_id()), size)
}

/// What a [`MemoryPool`](crate::memory::MemoryPool)'s malloc from the arena of `s`
/// calls while some capture is active: `None` when `s` is not in a capture cuda-rt
/// began (the pool serves it as usual), else the default pool's allocation as a memory
/// node of that graph, as [`alloc`](crate::memory::alloc) makes it, and for any other
/// pool a `Refused` capture error. A cached block must not go into a graph: its
/// previous owner's work may still be queued on `s` from before the capture, and the
/// graph, launched on any stream, would not be ordered after that work. `size` is not
/// 0.
#[cold]
#[inline(never)]
pub(crate) fn pool_malloc_in_capture(
    s: &StreamRef,
    size: usize,
    default_pool: bool,
) -> Option<Result<MemoryPointer>> {
    if default_pool {
        return capture_alloc_on(s, size);
    }
    match capture::with_entry_of(s, |_| ()) {
        Ok(None) => None,
        Ok(Some(())) => Some(Err(crate::error::Error::capture(
            crate::error::CaptureKind::Refused,
            format!(
                "MemoryPool::malloc on stream {:#x} of device {}: the stream is capturing a                  graph, and a pool's cached block may still be used by work queued before                  the capture, which the graph would not wait for; allocate with                  cuda_rt::alloc (or the default pool) during a capture, which makes the                  graph's own memory",
                s.handle(),
                s.device_id()
            ),
        ))),
        Err(e) => Some(Err(e)),
    }
}

/// [`capture_alloc`] on the stream `s` (the allocation's arena): `None` when `s` is
/// not in a capture cuda-rt began.
fn capture_alloc_on(s: &StreamRef, size: usize) -> Option<Result<MemoryPointer>> {
    if s.handle() == LEGACY_DEFAULT_HANDLE {
        return None;
    }
    let r = capture::with_entry_of(s, |entry| -> Result<MemoryPointer> {
        let device = s.device_id();
        make_current(device)?;
        // SAFETY: `s` keeps the current stream alive; its device's context was made
        // current above.
        let ptr = unsafe { result::memory::alloc_async(size, s.as_raw()) }
            .map_err(|e| crate::error::explain_capture(e.into(), "allocation during a capture"))?;
        let id = entry.id;
        let state = Arc::new(AllocState::capturing(ptr, size, device, s.clone(), id));
        entry.allocs.push(Arc::clone(&state));
        Ok(MemoryPointer::from_memory(Arc::new(GraphMemory {
            state,
            uses: StreamUses::default(),
        })))
    });
    match r {
        Ok(Some(r)) => Some(r),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}
