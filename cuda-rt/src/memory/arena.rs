//! The caching device memory pool's algorithm (CuPy's `MemoryPool`), with no CUDA in
//! it: a [`Pool`] asks a [`Backend`] for memory, so the same code runs over
//! `cuMemAlloc` (the `memory::pool` front), over page-locked host memory, and over
//! `HostBackend` / `FakeBackend` in tests, benches and Miri (feature `test-util`).
//!
//! # Semantics (CuPy's)
//! - Sizes round up to a multiple of [`ALLOCATION_UNIT`] (512) bytes; `malloc(0)`
//!   returns a null [`Block`] of size 0 that is not pooled (its `free` does nothing).
//! - Free chunks live in *arenas* keyed by an opaque `u64` stream key chosen by the
//!   caller (the front gives the per-thread default stream one key per thread). A
//!   chunk always goes back to the arena it came from, whatever key is current when
//!   it is freed; arenas never share memory (a backend allocation belongs to the
//!   arena whose miss made it, and so do all pieces split from it).
//! - Best fit: the smallest free chunk that is large enough, ties by lowest address;
//!   a larger chunk is split, the caller gets the lower part, the rest stays free.
//! - Free merges a chunk with free neighbours of the same backend allocation (either
//!   side), then files it in its arena.
//! - [`Pool::free_all_blocks`] gives the backend every free chunk that is a whole
//!   backend allocation; with a key, only that arena's.
//! - Limit ([`Pool::set_limit`], 0 = none): a miss that would take the reserved bytes
//!   past the limit, or that the backend refuses as out of memory, releases all
//!   cached whole chunks (every arena) and retries once; then it fails with the
//!   crate's [`OutOfMemory`](crate::OutOfMemory), which carries requested, in-use,
//!   cached and limit bytes and what refused (the limit, or the backend with the
//!   driver's error it gave).
//!
//! # Data structure, and why
//! Each arena is a lock (a spin lock, see `ArenaLock`) around a slab of chunk records (`Vec` + free list of
//! indices, so a hit never touches the heap) and a best-fit index:
//! - *Size classes*: exact for sizes under 32 units (16 KiB), then 32 classes per power
//!   of two (TLSF-style, 2048 classes cover every `u64` size). A two-level bitmap
//!   (32 words + 1 summary word) finds the first non-empty class at or above the
//!   request in a few instructions, whatever the number of chunks.
//! - *Inside a class*, an intrusive treap keyed by `(size, addr)` (links live in the
//!   slab records; priority = hash of the address, so no RNG state). The request's own
//!   class is searched with a lower bound; any higher class gives its leftmost node.
//!   Insert and remove are iterative (one descent, then one split or merge; no
//!   recursion, no rotations).
//!   This is exact best fit with ties by address, `O(log k)` in the chunks `k` of one
//!   class (small: classes are narrow), and never allocates — a `BTreeSet` would
//!   allocate and free nodes as it grows and shrinks, and CuPy-style exact bins by
//!   `size / 512` need an index as large as the largest size.
//! - Neighbour links (`prev`/`next` within a backend allocation) make split and merge
//!   `O(1)` plus the treap updates.
//!
//! # Concurrency
//! - No global lock on the hit path: malloc and free lock only their arena. Arenas
//!   live in an append-only table owned by the pool (segments of 64 (inline), 128,
//!   256... slots, each a [`OnceLock`](std::sync::OnceLock)), never removed while the
//!   pool lives, so an arena's `u32` index leads to it through one lock-free load
//!   (two past the 64th arena). Each thread keeps a 4-entry cache of
//!   `(pool id, key) -> index` (pool ids are never reused), so the key map behind an
//!   [`RwLock`](std::sync::RwLock) is read only on the first use of a key by a
//!   thread, and written only when a key is seen for the first time.
//! - A [`Block`] carries its pool's id and its arena's index, so free needs no
//!   lookup, and a block given to the wrong pool is recognised and refused.
//! - No `unsafe` anywhere in the module: blocks and caches hold integers, not
//!   pointers.
//! - Counters (used, peak used, hits, misses, ...) are plain integers under each
//!   arena's lock, in a 128-byte-aligned arena: no shared cache line between threads
//!   on different keys. [`Pool::stats`] sums them arena by arena.
//! - Reserved bytes (checked against the limit), backend call counts and OOM retries
//!   are atomics touched only on misses and releases, which call the backend anyway.
//! - The backend is never called with an arena lock held.
//! - *Parked frees* (crate-internal, used by the default device pools and the pinned
//!   pools; see `parked`): a thread's last freed block may wait in a per-thread slot
//!   and enter its arena under the lock of the thread's next malloc, which then takes
//!   one lock per cached pair instead of two, or none while the arena has not changed
//!   since the thread last checked that its parked block is exactly what it gets
//!   back (where the process barrier exists). Every observer ([`Pool::stats`],
//!   [`Pool::free_all_blocks`], [`Pool::check`], a malloc about to grow, the drop)
//!   settles all slots first, so figures, limits and growth are as without parking,
//!   and one thread alone sees exactly the unparked algorithm.
//!
//! # Peaks
//! `peak_total_bytes` (reserved) is exact: one atomic, updated on each growth.
//! `peak_used_bytes` is exact within one arena; across arenas it is the sum of each
//! arena's own peak, capped by the reserved peak — an upper bound that equals the
//! true peak when one key is in use (an exact cross-arena peak would need a shared
//! counter on every hit, which is what kills multi-thread scaling).
//!
//! # Growth policy
//! By default a miss asks the backend for exactly the rounded size and keeps every
//! cached chunk (CuPy). Measured on the traces of `benches/arena_traces.rs` this
//! already keeps trace B's peak reserved / peak live at 1.04 (target 1.20); trace A
//! (at most 512 live blocks) gives 1.37. [`Pool::set_release_on_miss`] adds a policy
//! that trades backend calls for memory: before growing, a miss gives back the
//! arena's whole free allocations *smaller than the request* (none could serve it)
//! when the arena's cached bytes exceed an eighth of its reserved bytes, so memory is
//! reused through the backend instead of stranded (trace A: 1.24, with 138 backend
//! frees instead of 0). It is off by default because on a GPU `cuMemFree`
//! synchronizes the device, a cost a malloc should not hide.
//!
//! # Blocks used by other streams
//! An arena hands a freed block out again to work ordered on its own stream. A block
//! that other streams used goes back with [`Pool::free_after`] and the fences the
//! owner recorded on them (events): it *awaits* (counted as freed, not reusable,
//! not merged) until the backend says every fence is done. A miss polls its arena's
//! awaiting blocks before growing (queries, no wait); only out of memory and the
//! pool's drop wait for them. A block freed without fences never meets this code.
//!
//! # Ownership and drop
//! A [`Block`] is a plain token of integers (no reference count: an `Arc` per block
//! would put a shared atomic on every hit): give it back with [`Pool::free`]. A block
//! of another pool is refused with a [`FreeError`] that hands it back; a block cannot
//! be copied, so it cannot be freed twice. The front keeps the pool alive while its
//! memory pointers live (its pointer type holds an `Arc` of the pool). Dropping the
//! pool gives the backend every free whole allocation; an allocation that still has
//! chunks handed out (a leaked or forgotten `Block`) is leaked on purpose, never
//! freed under a user.
//!
//! # Files
//! - `pool`: the [`Pool`] itself (state, malloc, free, releasing the cache, drop);
//!   `growth`: a miss that grows it; `stats`: [`PoolStats`]; `arena_lookup`: stream
//!   key -> arena, through each thread's small cache.
//! - `stream_arena`: one key's arena and its spin lock; `bins`: the chunks and the
//!   best-fit index inside it; `table`: the pool's arenas by index.
//! - `block`: [`Block`] and its integer forms; `error`: what can go wrong.
//! - `parked`: the per-thread parking slots; `parking`: the pool's side of them.
//! - `awaiting`: blocks given back while other streams may still use them
//!   ([`Pool::free_after`], PyTorch's `record_stream`), reused once their fences
//!   are done.
//! - `backend`: [`Backend`] and the host and fake backends; `limit`: parsing and
//!   printing limits.
//! - `barrier`: the process-wide memory barrier (`membarrier`) that lets a parked free
//!   skip the lock.

// The pool algorithm is pure Rust: no `unsafe` here or in the submodules, except the
// one system call of `barrier` (Linux `membarrier`), allowed on that function alone.
#![deny(unsafe_code)]

mod arena_lookup;
mod awaiting;
mod backend;
pub(crate) mod barrier;
mod bins;
mod block;
mod error;
mod growth;
mod limit;
pub(crate) mod parked;
mod parking;
mod pool;
mod snapshot;
mod stats;
mod stream_arena;
mod table;

pub use awaiting::StreamFence;
pub use backend::{Backend, BackendError, SegmentSpec};
#[cfg(any(test, feature = "test-util"))]
pub use backend::{BackendCounters, FakeBackend, HostBackend};
pub use block::Block;
pub(crate) use block::{AtomicBlock, RawBlock};
pub use error::{FreeError, MallocError};
pub use limit::{limit_from_fraction, parse_limit};
pub use pool::Pool;
pub use snapshot::{BlockSnapshot, PoolSnapshot, SegmentSnapshot};
pub use stats::PoolStats;

/// Every size is rounded up to a multiple of this many bytes (CuPy's 512).
pub const ALLOCATION_UNIT: usize = 512;

/// `size` rounded up to a multiple of [`ALLOCATION_UNIT`], or `None` on overflow.
#[inline]
pub fn round_size(size: usize) -> Option<usize> {
    Some(size.checked_add(ALLOCATION_UNIT - 1)? & !(ALLOCATION_UNIT - 1))
}
