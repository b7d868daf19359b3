//! [`HeldMemory`]: pool memory as the C shim holds it for C (behind a `curt_memory_t`
//! handle, or an address of the drop-in entry points).

use cuda_rt::memory::PooledBlock;
use cuda_rt::MemoryPointer;

/// A cached block of the default pool as the pool's bare block (what a steady
/// allocation + free pair gets: no memory object to fill and recycle, see
/// [`PooledBlock`]), else as a pointer (a cache miss, another pool, memory hooks, or a
/// block a lookup turned into a pointer for good).
pub(crate) enum HeldMemory {
    Block(PooledBlock),
    Pointer(MemoryPointer),
}

impl HeldMemory {
    /// The device address.
    #[inline]
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            HeldMemory::Block(b) => b.ptr(),
            HeldMemory::Pointer(p) => p.ptr(),
        }
    }

    /// The size in bytes.
    #[inline]
    pub(crate) fn size(&self) -> usize {
        match self {
            HeldMemory::Block(b) => b.size(),
            HeldMemory::Pointer(p) => p.size(),
        }
    }

    /// The memory as a pointer, cloned: a block becomes one in place, for good (the
    /// same block: nothing is allocated or freed on the device; a memory object is
    /// made once).
    pub(crate) fn pointer(&mut self) -> MemoryPointer {
        if let HeldMemory::Block(_) = self {
            // Swapped out through a pointer of size 0, which holds no device memory.
            if let HeldMemory::Block(b) =
                std::mem::replace(self, HeldMemory::Pointer(MemoryPointer::null(0)))
            {
                *self = HeldMemory::Pointer(b.into_pointer());
            }
        }
        match self {
            HeldMemory::Pointer(p) => p.clone(),
            // Made a pointer just above.
            HeldMemory::Block(b) => unreachable!("a block at {:#x} was not converted", b.ptr()),
        }
    }
}

impl From<MemoryPointer> for HeldMemory {
    fn from(p: MemoryPointer) -> Self {
        HeldMemory::Pointer(p)
    }
}
