//! [`PooledBlock`]: a cached block of the default pool held without a memory object,
//! for allocators that hand out raw addresses (the C shim's PyTorch and CuPy entry
//! points), where a [`MemoryPointer`]'s shared object is more than the caller needs.

use std::fmt;

use crate::memory::arena::RawBlock;
use crate::memory::MemoryPointer;

use super::device_pool::{CudaDevicePool, DevicePoolRef};
use super::pooled_memory::PooledMemory;

/// A block of the default pool ([`get_default_memory_pool`]) owned by this value alone:
/// no reference count and no memory object, so taking one and giving it back cost
/// the pool's cached pair without a [`MemoryPointer`]'s recycling (see
/// [`MemoryPool::malloc_block_on_stream`]). Dropping it gives the block back as
/// dropping the last [`MemoryPointer`] to it would: parked for this thread's next
/// malloc, with the memory hooks of the dropping thread seeing the free, and kept for
/// a graph while a capture that may use it is under way. Anything more (recording
/// another stream, copies) goes through [`into_pointer`](Self::into_pointer).
///
/// [`get_default_memory_pool`]: super::get_default_memory_pool
/// [`MemoryPool::malloc_block_on_stream`]: super::MemoryPool::malloc_block_on_stream
#[must_use = "dropping a PooledBlock gives its memory back at once"]
pub struct PooledBlock {
    core: &'static CudaDevicePool,
    raw: RawBlock,
}

impl fmt::Debug for PooledBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledBlock")
            .field("ptr", &format_args!("{:#x}", self.raw.addr))
            .field("size", &self.raw.size)
            .field("device", &self.core.device)
            .finish()
    }
}

impl PooledBlock {
    /// `raw`, a block of `core` handed out by its pool to this value alone.
    #[inline]
    pub(super) fn new(core: &'static CudaDevicePool, raw: RawBlock) -> PooledBlock {
        PooledBlock { core, raw }
    }

    /// The device address.
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.raw.addr
    }

    /// The size in bytes (the request rounded up to 512).
    #[inline]
    pub fn size(&self) -> usize {
        self.raw.size as usize
    }

    /// The device of the memory.
    #[inline]
    pub fn device_id(&self) -> i32 {
        self.core.device
    }

    /// The block as pooled memory behind a [`MemoryPointer`], which gives it back when
    /// its last pointer goes (the same block: nothing is freed or allocated on the
    /// device).
    pub fn into_pointer(self) -> MemoryPointer {
        let (core, raw) = (self.core, self.raw);
        std::mem::forget(self);
        Self::pointer_of(core, raw)
    }

    fn pointer_of(core: &'static CudaDevicePool, raw: RawBlock) -> MemoryPointer {
        let block = core.pool.block_from_raw(raw);
        MemoryPointer::from_memory_at(
            PooledMemory::wrap(&DevicePoolRef::Static(core), block),
            raw.addr,
        )
    }

    /// The drop while a capture is under way: as the last pointer's drop, which keeps
    /// the memory for the graph of a capture this thread is in.
    #[cold]
    #[inline(never)]
    fn drop_in_capture(core: &'static CudaDevicePool, raw: RawBlock) {
        drop(Self::pointer_of(core, raw));
    }
}

impl Drop for PooledBlock {
    #[inline]
    fn drop(&mut self) {
        if crate::capture::any_capture_active() {
            return Self::drop_in_capture(self.core, self.raw);
        }
        // The hooks name a block by its memory object; this one has none, so its
        // address stands in.
        let core = self.core;
        core.park_raw(self.raw, self.raw.addr as usize, || {
            DevicePoolRef::Static(core).home()
        });
    }
}
