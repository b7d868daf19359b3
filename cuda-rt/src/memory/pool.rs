//! The caching device memory pool (CuPy's `MemoryPool`): the algorithm of
//! [`arena`](super::arena) over `cuMemAlloc`/`cuMemFree`, one arena pool per device,
//! created on the device's first use.
//!
//! # Semantics
//! Those of [`arena`](super::arena) (512-byte rounding, per-stream arenas, best fit
//! with split and merge, limit with release-and-retry), plus:
//! - The stream key of a malloc is the handle of the thread's current stream on the
//!   device; the per-thread default stream (handle 2) gets one key per thread (a
//!   unique id with the high bit set), the legacy default stream (handle 0) is shared.
//!   Memory goes back to the arena it came from, whatever stream is current then.
//! - The limit starts from the environment variable [`LIMIT_ENV`]
//!   (`CUDA_RT_GPU_MEMORY_LIMIT`: `"1073741824"` bytes or `"40%"` of the device's
//!   memory), read when the device's pool is created.
//! - Out of memory (limit or driver) is [`Error::OutOfMemory`] with the rounded
//!   request, in-use, cached and limit bytes, and the driver's error if it refused.
//! - Cross-stream use: [`MemoryPointer::record_stream`](crate::memory::MemoryPointer::record_stream)
//!   (PyTorch's `record_stream`) marks a block as used by another stream; when it is
//!   freed an event is recorded on each such stream and the block is handed out
//!   again only once they have completed (polled by a malloc that misses, never
//!   waited for in the steady state; see [`arena`](super::arena)). A block with no
//!   recorded stream costs nothing more: one flag read at its free.
//! - Hooks ([`super::hook`]) registered on the calling thread run around
//!   mallocs and frees; with none, the cost is one thread-local test.
//!
//! # Hot path
//! A cache hit makes no driver call (the device id is known, no context is made
//! current) and takes only its arena's lock (a spin lock: one compare-exchange, and a
//! plain store to release). Emptied memory objects are recycled per thread and
//! refilled through relaxed atomics. Frees are *parked*: the block waits in the
//! thread's slot and goes back into its arena under the lock of the thread's next
//! malloc (any observer, and any malloc about to grow, settles every thread's parked
//! block first; a single thread sees exactly the unparked algorithm; see
//! [`arena`](super::arena)). A cached malloc + free pair so allocates nothing on the
//! heap and makes one atomic read-modify-write in all: the malloc's lock; none where
//! [`lock_free_cached_pairs`] says so (a thread's malloc then takes back the block it
//! parked without the lock while its arena has not changed since it last checked
//! under the lock that the block is exactly what the malloc gets). Memory of
//! the default pool ([`get_default_memory_pool`]) refers to its device pool by a
//! `'static` reference, so threads share no reference count; memory of a pool made
//! with [`MemoryPool::new`] holds an `Arc` of its device pool, as do its recycled
//! objects and parking slots, so that pool gives its cache back to the driver when
//! its last handle goes (and each block freed after that at once), not when the
//! device pool itself is dropped.
//!
//! # Files
//! - `memory_pool`: [`MemoryPool`] (the handle, its per-device pools, the default
//!   pool and [`get_default_memory_pool`]).
//! - `device_pool`: one device's pool (the arena pool with the hook dispatch) and
//!   how pooled memory refers to it.
//! - `pooled_memory`: [`PooledMemory`] and the recycling of emptied objects.
//! - `pooled_block`: [`PooledBlock`], a block without a memory object (the C shim's
//!   drop-in allocators hand out addresses and keep less).
//! - `device_backend`: the memory a pool caches ([`PoolAllocator`]: `cuMemAlloc` by
//!   default, managed, stream-ordered, a user function pair), and the allocation
//!   hooks around a backend.
//! - `stream_key`: the arena key of the current stream; `limit_env`: [`LIMIT_ENV`].
//! - `stream_uses`: the other streams recorded on a block
//!   ([`MemoryPointer::record_stream`](crate::memory::MemoryPointer::record_stream))
//!   and the events recorded on them when it is freed; stream-ordered memory
//!   ([`MemoryAsync`](crate::memory::MemoryAsync)) keeps its uses with it too.
//! - `out_of_memory`: a failed malloc as the crate's error (shared with the pinned
//!   pools).
//!
//! [`Error::OutOfMemory`]: crate::error::Error::OutOfMemory

mod device_backend;
mod device_pool;
mod expandable_env;
pub(crate) mod limit_env;
mod memory_pool;
mod out_of_memory;
mod pooled_block;
mod pooled_memory;
pub(crate) mod stream_key;
pub(crate) mod stream_uses;

pub use device_backend::PoolAllocator;
pub use expandable_env::{ALLOC_CONF_ENV, EXPANDABLE_ENV};
pub use limit_env::LIMIT_ENV;
pub use memory_pool::{get_default_memory_pool, MemoryPool};
pub(crate) use out_of_memory::pool_malloc_error;
pub use pooled_block::PooledBlock;
pub use pooled_memory::PooledMemory;

/// Whether a cached malloc + free pair of one thread takes no lock at all in this
/// process (see [`arena`](super::arena)'s parked frees): it needs the operating
/// system's process-wide barrier (Linux `membarrier`, 4.14 or later, not filtered by
/// a sandbox); without it the pair takes its arena's lock once. Either way the
/// semantics are the same.
pub fn lock_free_cached_pairs() -> bool {
    super::arena::barrier::ready()
}
