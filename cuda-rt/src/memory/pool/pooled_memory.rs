//! [`PooledMemory`], the memory object of a pool's block, and the per-thread spare
//! list that recycles emptied objects.

use std::fmt;
use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use crate::memory::arena::{AtomicBlock, Block, RawBlock};
use crate::memory::device_memory::BaseMemory;

use super::device_pool::DevicePoolRef;
use super::stream_uses::StreamUses;
use crate::error::Result;
use crate::stream::StreamRef;

/// Memory from a [`MemoryPool`]: a block of a device pool, which goes back to the
/// arena it came from when the object is dropped (when its last [`MemoryPointer`]
/// goes), whatever stream is current then. Its size is the request rounded up to 512
/// bytes.
///
/// [`MemoryPool`]: super::MemoryPool
/// [`MemoryPointer`]: crate::memory::MemoryPointer
pub struct PooledMemory {
    // In atomics so that a recycled object is emptied and refilled through `&self`;
    // written only while the object is provably unreachable from anywhere else (see
    // `recycle` and `wrap`). Size 0: emptied, waiting in a spare list.
    block: AtomicBlock,
    core: DevicePoolRef,
    /// Other streams recorded on the block ([`MemoryPointer::record_stream`]); empty
    /// again once the block is given back.
    ///
    /// [`MemoryPointer::record_stream`]: crate::memory::MemoryPointer::record_stream
    uses: StreamUses,
}

impl fmt::Debug for PooledMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("size", &self.size())
            .field("device", &self.core.device)
            .field("stream_key", &self.stream_key())
            .finish()
    }
}

impl PooledMemory {
    /// The arena key of the stream the memory was allocated under (the stream handle,
    /// or a per-thread key for the per-thread default stream).
    pub fn stream_key(&self) -> u64 {
        self.block.key()
    }

    fn new(core: DevicePoolRef, raw: RawBlock) -> PooledMemory {
        let m = PooledMemory {
            block: AtomicBlock::empty(),
            core,
            uses: StreamUses::default(),
        };
        m.block.store(raw);
        m
    }

    /// Gives the block back to its arena, if the object still has one.
    #[inline]
    fn release(&self) {
        if let Some(raw) = self.block.take() {
            let id = self as *const PooledMemory as usize;
            if self.uses.any() {
                self.core.free_after_streams(raw, id, &self.uses);
            } else {
                self.core.free_raw(raw, id);
            }
        }
    }
}

// SAFETY: the block is `size` bytes of `cuMemAlloc` memory of the device, handed out
// by the pool to this object alone until its drop (or `recycle`) gives it back; the
// fields change only while nothing else can reach the object: in `recycle` (the last
// strong reference, no weak one), in a thread's spare list, and in `wrap` before the
// object is handed out again.
unsafe impl BaseMemory for PooledMemory {
    #[inline]
    fn ptr(&self) -> u64 {
        self.block.addr()
    }
    #[inline]
    fn size(&self) -> usize {
        self.block.size() as usize
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.core.device
    }

    /// Marks the block as used by `stream`: when it is freed, an event is recorded on
    /// `stream` and the block is handed out again only once it has completed (a
    /// stream of another device is waited for at the free). Nothing for the block's
    /// own stream. `stream` is kept alive until then. Never fails.
    fn record_stream(&self, stream: &StreamRef) -> Result<()> {
        self.record_use(stream);
        Ok(())
    }

    #[inline]
    fn record_use(&self, stream: &StreamRef) {
        self.uses.record(stream, self.core.device, self.block.key())
    }

    /// The last pointer went: the block goes back to its arena now (as the drop would
    /// do) and, for the default pool, the emptied object is kept for the thread's next
    /// malloc.
    #[inline]
    fn recycle(self: Arc<Self>) {
        // The caller's reference is the only strong one; with no weak one either,
        // nothing else can reach the object or get to it (plain loads, where
        // `Arc::get_mut` would pay a compare-exchange).
        if Arc::strong_count(&self) != 1 || Arc::weak_count(&self) != 0 {
            return;
        }
        fence(Ordering::Acquire);
        if self.uses.any() {
            return self.recycle_after_streams();
        }
        if let Some(raw) = self.block.take() {
            let id = Arc::as_ptr(&self) as usize;
            if self.core.park_raw(raw, id, || self.core.home()) {
                // The pool's handles are gone: let the object (and the device pool) go.
                return;
            }
        }
        spare::put(self);
    }
}

impl PooledMemory {
    /// [`recycle`](BaseMemory::recycle) of a block that other streams used: kept off
    /// the hot path, which pays only the test of `uses`.
    #[cold]
    #[inline(never)]
    fn recycle_after_streams(self: Arc<Self>) {
        if let Some(raw) = self.block.take() {
            let id = Arc::as_ptr(&self) as usize;
            self.core.free_after_streams(raw, id, &self.uses);
        }
        if !self.core.after_free() {
            spare::put(self);
        }
    }
}

// Recycled memory objects: when the last pointer to one goes, its block goes back
// (parked) and the emptied `Arc<PooledMemory>` waits here for the thread's next malloc
// from the same device pool, so a cached malloc + free pair allocates nothing on the
// heap.
crate::memory::recycler::spare_list!(PooledMemory);

impl PooledMemory {
    /// `block` of `core` as a memory object: a recycled one of this thread's for the
    /// same device pool when there is one (default pool only), else a new one.
    #[inline]
    pub(super) fn wrap(core: &DevicePoolRef, block: Block) -> Arc<PooledMemory> {
        let raw = block.into_raw();
        if let Some(o) = spare::take_where(|o| o.core.same(core)) {
            // Emptied by `recycle` and held by this thread's list alone since.
            o.block.store(raw);
            return o;
        }
        Arc::new(PooledMemory::new(core.clone(), raw))
    }
}

impl Drop for PooledMemory {
    #[inline]
    fn drop(&mut self) {
        self.release();
        self.core.after_free();
    }
}
