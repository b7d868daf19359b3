//! [`PinnedBlock`]: a cached block of a `'static` pinned pool held without a handle
//! owner, for callers that hand out raw addresses (the C shim's `curt_pinned_malloc`),
//! where a [`PinnedMemoryPointer`]'s shared owner is more than they need.

use std::fmt;
use std::sync::Arc;

use crate::memory::arena::{Block, RawBlock};

use super::memory::PinnedMemoryPointer;
use super::pool_core::PinnedCore;

/// A block of a `'static` [`PinnedMemoryPool`](super::PinnedMemoryPool) (the default
/// one, [`default_pinned_memory_pool`](super::default_pinned_memory_pool)) owned by
/// this value alone: no reference-counted owner, so taking one and giving it back
/// cost the pool's cached pair and nothing more (see
/// [`PinnedMemoryPool::malloc_block`](super::PinnedMemoryPool::malloc_block)).
/// Dropping it gives the block back at once, parked for this thread's next malloc, as
/// dropping the last [`PinnedMemoryPointer`] to a block no copy used would. It offers
/// no copies (which must keep the block from the pool until they finish): for those,
/// [`into_pointer`](Self::into_pointer).
///
/// A size of 0 gives an empty block (address 0) that holds nothing.
#[must_use = "dropping a PinnedBlock gives its memory back at once"]
pub struct PinnedBlock {
    core: &'static Arc<PinnedCore>,
    /// Address 0: the empty block, nothing to give back.
    raw: RawBlock,
}

impl fmt::Debug for PinnedBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBlock")
            .field("ptr", &format_args!("{:#x}", self.raw.addr))
            .field("len", &self.raw.size)
            .finish()
    }
}

impl PinnedBlock {
    /// `block`, handed out by `core`'s pool to this value alone.
    #[inline]
    pub(super) fn new(core: &'static Arc<PinnedCore>, block: Block) -> PinnedBlock {
        if block.is_null() {
            // What the pool gives for 0 bytes: nothing to hold.
            core.free(block, None);
            return PinnedBlock {
                core,
                raw: RawBlock {
                    addr: 0,
                    size: 0,
                    key: 0,
                    chunk: 0,
                    arena: 0,
                },
            };
        }
        PinnedBlock {
            core,
            raw: block.into_raw(),
        }
    }

    /// The host address (0 for an empty block).
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.raw.addr
    }

    /// The size in bytes (the request rounded up to 512; 0 for an empty block).
    #[inline]
    pub fn len(&self) -> usize {
        self.raw.size as usize
    }

    /// Whether this is the empty block (0 bytes).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.raw.size == 0
    }

    /// The block as a [`PinnedMemoryPointer`] (its views, offsets and copies), which
    /// then owns it.
    pub fn into_pointer(self) -> PinnedMemoryPointer {
        let this = std::mem::ManuallyDrop::new(self);
        if this.raw.addr == 0 {
            return PinnedMemoryPointer::empty();
        }
        let block = this.core.pool().block_from_raw(this.raw);
        PinnedMemoryPointer::pooled(this.core, block)
    }
}

impl Drop for PinnedBlock {
    #[inline]
    fn drop(&mut self) {
        if self.raw.addr != 0 {
            // No copy can be in flight on it: a block records none (`into_pointer`
            // hands it to an owner that does). Whether the pool is orphaned needs no
            // answer here: nothing is kept for reuse.
            let _ = self.core.free_parking(self.raw, None);
        }
    }
}
