//! The uses of memory by stream-ordered work: one mechanism for every operation
//! cuda-rt enqueues on memory (copies, memsets, fills, NCCL calls, the C ABI's
//! asynchronous calls), so that a block is handed out again only once every stream
//! that used it has passed that use.
//!
//! An operation checks the memory may be used on its stream ([`check`]), then
//! enqueues its work through [`enqueue`], which notes the use:
//! - on a stream in a capture, the capture takes it: its graph keeps the memory
//!   alive, and for the capture's own allocations the free node inside the graph
//!   depends on the use (see [`crate::capture`]);
//! - otherwise the memory object records the stream ([`BaseMemory::record_stream`]):
//!   nothing for the stream the memory is freed in order with (the pool's test of one
//!   stream key), else the stream is remembered and the free waits for it (an event
//!   the arena polls, or, for stream-ordered memory, a wait queued before
//!   `cuMemFreeAsync`).
//!
//! Memory whose free waits for the device anyway (`cuMemFree`) records nothing.

use std::sync::Arc;

use crate::error::Result;
use crate::memory::device_memory::BaseMemory;
use crate::stream::StreamRef;

/// Checks that work on `stream` (`None`: a synchronous operation) may use each of
/// `mems` now (see [`BaseMemory::check_use`]).
#[inline]
pub(crate) fn check(stream: Option<&StreamRef>, mems: &[&Arc<dyn BaseMemory>]) -> Result<()> {
    for m in mems {
        m.check_use(stream)?;
    }
    Ok(())
}

/// Runs `enqueue`, which queues work on `s` that reads or writes `mems`, and notes
/// those uses (see the module docs). The work is queued when this returns `Ok`; an
/// error from `enqueue` queued nothing.
#[inline]
pub(crate) fn enqueue<R>(
    s: &StreamRef,
    mems: &[&Arc<dyn BaseMemory>],
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let (r, captured) = crate::capture::enqueue_using(s, mems, enqueue)?;
    if !captured {
        record(s, mems);
    }
    Ok(r)
}

/// Records `s` on each of `mems` for their frees. The work is queued already, so a
/// failure cannot undo it: the memory objects keep what they could not record
/// (see [`BaseMemory::record_stream`]).
#[inline]
pub(crate) fn record(s: &StreamRef, mems: &[&Arc<dyn BaseMemory>]) {
    for m in mems {
        m.record_use(s);
    }
}
