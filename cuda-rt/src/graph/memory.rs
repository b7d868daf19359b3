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
//!   else on the stream it was allocated on while that one still is. Drop a buffer
//!   used on a forked stream after the fork is joined back. When neither stream is in
//!   the capture any more (it was invalidated, say), nothing is freed: the capture's
//!   end decides, as for memory still referred to then.
//! - if the capture ends in error: no graph comes of it and the block never existed
//!   outside it; its address may be given to another graph's memory, so the drop
//!   frees nothing.
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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::Result;
use crate::graph::capture;
use crate::memory::{BaseMemory, MemoryPointer};
use crate::stream::{current_stream_of, AsStream, StreamRef, LEGACY_DEFAULT_HANDLE};

/// The launches of one graph, as the allocations it owns need them.
#[derive(Debug, Default)]
pub(crate) struct LaunchRecord {
    /// The stream of the graph's last launch, if it was launched.
    last: Mutex<Option<StreamRef>>,
}

impl LaunchRecord {
    /// Notes a launch on `s`.
    #[inline]
    pub(crate) fn launched_on(&self, s: StreamRef) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
    }

    /// Runs `f` on the stream of the last launch, if there was one.
    fn with_last<R>(&self, f: impl FnOnce(&StreamRef) -> R) -> Option<R> {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }
}

/// Where an allocation made during a capture stands.
#[derive(Debug)]
enum Phase {
    /// The capture is under way; the block is live in the graph being captured.
    Capturing {
        /// The stream it was allocated on.
        stream: StreamRef,
        /// The capture's id.
        id: u64,
    },
    /// Freed inside the graph: nothing to do outside it.
    FreedInGraph,
    /// Its capture ended in error: the block died with the graph that never was (its
    /// address may belong to another graph's memory by now): nothing to free.
    Abandoned,
    /// The graph owns it: after each launch the block is live until the next launch.
    GraphOwned(Arc<LaunchRecord>),
}

/// One allocation made during a capture, shared by its pointers and its graph.
#[derive(Debug)]
pub(crate) struct AllocState {
    ptr: u64,
    size: usize,
    device: i32,
    phase: Mutex<Phase>,
    /// Set with the phase's move to `Abandoned`, so that `size` (asked on every
    /// bounds check, possibly under other locks) reads it without taking `phase`.
    abandoned: AtomicBool,
}

impl AllocState {
    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `ptr` is inside this allocation.
    pub(crate) fn contains(&self, ptr: u64) -> bool {
        ptr >= self.ptr && ptr < self.ptr + self.size as u64
    }

    /// The capture ended without a graph: the block is gone with it.
    pub(crate) fn abandon(&self) {
        let mut p = self.phase();
        if matches!(*p, Phase::Capturing { .. }) {
            *p = Phase::Abandoned;
            self.abandoned.store(true, Ordering::Release);
        }
    }

    /// At the end of the capture: `true` (and the graph owns it from now) when it was
    /// not freed inside the graph.
    pub(crate) fn hand_to_graph(&self, rec: &Arc<LaunchRecord>) -> bool {
        let mut p = self.phase();
        match *p {
            Phase::Capturing { .. } => {
                *p = Phase::GraphOwned(Arc::clone(rec));
                true
            }
            _ => false,
        }
    }
}

impl Drop for AllocState {
    fn drop(&mut self) {
        let p = std::mem::replace(
            self.phase.get_mut().unwrap_or_else(|e| e.into_inner()),
            Phase::FreedInGraph,
        );
        // Only a block the graph owns, after a launch, is live outside the graph. A
        // capture that ended some other way took its nodes with it.
        let Phase::GraphOwned(rec) = p else { return };
        rec.with_last(|s| {
            if make_current(self.device).is_err() {
                return;
            }
            // SAFETY: the block belongs to the graph's executable (its capture's memory
            // node, freed once, here, after both its pointers and the graph are gone);
            // `s` keeps the stream of the last launch alive, whose work is ordered
            // before this free; the device's context was made current above.
            if unsafe { result::memory::free_async(self.ptr, s.as_raw()) }.is_err()
                // The launch stream is gone: finish all work, free in order with it.
                && result::context::synchronize().is_ok()
            {
                // SAFETY: as above, on the legacy default stream (always valid with a
                // current context) after all work of the context has finished.
                let _ = unsafe { result::memory::free_async(self.ptr, std::ptr::null_mut()) };
            }
        });
    }
}

/// Memory allocated during a capture: a memory-allocation node's block.
pub(crate) struct GraphMemory {
    state: Arc<AllocState>,
}

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
// and the graph are gone; fields never change.
unsafe impl BaseMemory for GraphMemory {
    fn ptr(&self) -> u64 {
        self.state.ptr
    }
    /// 0 once its capture failed: the address may belong to another graph's memory
    /// by then, so every bounds-checked operation on it is refused.
    fn size(&self) -> usize {
        if self.state.abandoned.load(Ordering::Acquire) {
            return 0;
        }
        self.state.size
    }
    fn device_id(&self) -> i32 {
        self.state.device
    }
}

impl Drop for GraphMemory {
    fn drop(&mut self) {
        let mut p = self.state.phase();
        let freed = match &*p {
            Phase::Capturing { stream, id } => {
                // Free on the current stream when it is in the same capture (the
                // user's place in the work), else on the stream that allocated while it
                // still is: never on a stream outside the capture, where the address
                // may belong to another graph's memory.
                // The checks and the free run under the lock `end_capture` takes, so
                // the capture cannot end in between.
                let free_on = |s: &StreamRef| {
                    capture::in_capture_locked(s, *id, |now| {
                        // SAFETY: the block was allocated in this capture and is freed
                        // once (the phase becomes `FreedInGraph`), its last pointer
                        // gone; the free is captured on `s`, a live stream (kept by the
                        // `StreamRef`) in the same capture, which cannot end meanwhile
                        // (the lock is held).
                        now && unsafe { result::memory::free_async(self.state.ptr, s.as_raw()) }
                            .is_ok()
                    })
                };
                let cur = current_stream_of(stream.device_id());
                free_on(&cur) || free_on(stream)
            }
            _ => return,
        };
        if freed {
            *p = Phase::FreedInGraph;
        }
        // Otherwise (the capture was invalidated, or ended outside cuda-rt) the end of
        // the capture decides: the graph owns the block, or it died with the capture.
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
    let s = current_stream_of(get_device_id());
    if s.handle() == LEGACY_DEFAULT_HANDLE {
        return None;
    }
    let r = capture::with_entry_of(&s, |entry| -> Result<MemoryPointer> {
        let device = s.device_id();
        make_current(device)?;
        // SAFETY: `s` keeps the current stream alive; its device's context was made
        // current above.
        let ptr = unsafe { result::memory::alloc_async(size, s.as_raw()) }
            .map_err(|e| crate::error::explain_capture(e.into(), "allocation during a capture"))?;
        let id = entry.id;
        let state = Arc::new(AllocState {
            ptr,
            size,
            device,
            phase: Mutex::new(Phase::Capturing {
                // The same current stream as `s`, owned.
                stream: current_stream_of(device),
                id,
            }),
            abandoned: AtomicBool::new(false),
        });
        entry.allocs.push(Arc::clone(&state));
        Ok(MemoryPointer::from_memory(Arc::new(GraphMemory { state })))
    });
    match r {
        Ok(Some(r)) => Some(r),
        Ok(None) => None,
        Err(e) => Some(Err(e)),
    }
}
