//! Device memory: allocation, memory objects, pointers, allocator selection and the
//! driver's stream-ordered pools (CuPy's `cupy.cuda.memory`); [`arena`] is the caching
//! pool's algorithm.
//!
//! - [`alloc`] allocates through the allocator in effect ([`set_allocator`],
//!   [`using_allocator`]; by default the caching [`MemoryPool`] of
//!   [`get_default_memory_pool`]); [`hook`] has the memory hooks; [`malloc_managed`] and [`malloc_async`] allocate managed and
//!   stream-ordered memory. Each returns a [`MemoryPointer`].
//! - Memory objects implement [`BaseMemory`]: [`Memory`] (`cuMemAlloc`, or a user
//!   allocator's), [`PooledMemory`], [`ManagedMemory`], [`MemoryAsync`], [`UnownedMemory`].
//! - Host data crosses as slices of [`Pod`] values (primitives, arrays, [`F16`],
//!   [`Bf16`]).
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::memory;
//! let p = memory::alloc(4 * 1024)?;
//! p.copy_from_host(&[1.0f32; 1024])?;
//! let mut back = vec![0.0f32; 1024];
//! p.copy_to_host(&mut back)?;
//! assert_eq!(back, vec![1.0; 1024]);
//! # Ok(()) }
//! ```
//!
//! `unsafe` appears here as promises (`unsafe trait`/`unsafe fn` for what the compiler
//! cannot check: a raw pointer being valid device memory, a type being plain data), and
//! at each call of the checked layer ([`cuda_sys::result`]) that takes an address or a
//! handle, with a `SAFETY` line that says which of the types' invariants makes it hold.

mod allocator;
pub mod arena;
mod async_pool;
mod device_memory;
pub(crate) mod graph_memory;
pub mod history;
pub mod hook;
mod managed;
mod memset;
pub(crate) mod pod;
pub(crate) mod pointer;
pub mod pool;
pub(crate) mod recycler;
#[cfg(feature = "serde")]
pub(crate) mod snapshot_json;
mod unowned;
pub(crate) mod uses;

pub use allocator::{
    alloc, alloc_takes_default_pool, get_allocator, set_allocator, using_allocator, Allocate,
    Allocator,
};
pub use arena::PoolStats;
pub use async_pool::{
    malloc_async, threshold_for_limit, MemoryAsync, MemoryAsyncPool, NO_LIMIT, ROUND_SIZE,
};
pub use device_memory::{
    BaseMemory, CAllocator, CFreeFn, CMallocFn, ClosureAllocator, FreeFn, MallocFn, Memory,
};
pub use managed::{malloc_managed, Advice, Location, ManagedMemory};
#[cfg(feature = "bytemuck")]
pub use pod::BytemuckPod;
pub use pod::{Bf16, Pod, F16};
pub use pointer::MemoryPointer;
pub use pool::{
    get_default_memory_pool, lock_free_cached_pairs, MemoryPool, PoolAllocator, PooledBlock,
    PooledMemory, LIMIT_ENV,
};
pub use unowned::UnownedMemory;
