//! The exported functions, one file per area. Each one goes through
//! [`status::guard`] (or [`status::unwind_guard`]), which turns a `Result` into a
//! code, records the message and catches panics.
//!
//! The promise of `wrapper.h` is that no function unwinds or aborts, whenever it is
//! called: also from a thread-local or `pthread_key_create` destructor while the thread
//! exits, or from an `atexit` handler after the main thread's thread-locals are gone.
//! So the last-error slot is reached only through `try_with` and `try_borrow*` (a slot
//! that is torn down, or busy, is skipped, never a panic), every message is recorded
//! inside the unwind guard, and [`curt_last_error`] answers `""` (a static string) when
//! the thread has no slot any more.
//!
//! Objects cross the boundary as handles ([`handles`]): generation-checked indices
//! into one table per kind, so a destroyed, foreign or made-up handle is
//! `CURT_ERROR_INVALID_HANDLE`, never a dangling pointer.

// An export that takes a raw pointer (out-pointers, buffers, strings, C function
// pointers) is an `unsafe extern "C" fn`: what the caller guarantees about it is
// wrapper.h's contract, written in its `# Safety` section (C callers see no
// difference; a Rust caller of the rlib writes `unsafe`). Exports that take only
// handles and integers stay safe: handles are table-checked, never dereferenced.

mod addr_map;
mod allocator;
mod copy;
mod device;
mod direct_map;
mod dlpack;
mod event;
mod graph;
mod graph_pools;
mod graph_recorder;
mod handles;
mod held;
mod memory;
mod module;
mod pinned;
mod record_stream;
mod spare;
mod status;
mod stream;
mod torch_error;
mod torch_hooks;

pub use allocator::*;
pub use copy::*;
pub use device::*;
pub use dlpack::*;
pub use event::*;
pub use graph::*;
pub use graph_pools::*;
pub use graph_recorder::*;
pub use handles::{
    curt_event_s, curt_event_t, curt_function_s, curt_function_t, curt_graph_s, curt_graph_t,
    curt_memory_s, curt_memory_t, curt_module_s, curt_module_t, curt_pinned_s, curt_pinned_t,
    curt_recorder_s, curt_recorder_t, curt_stream_s, curt_stream_t,
};
pub use memory::*;
pub use module::*;
pub use pinned::*;
pub use record_stream::*;
pub use status::*;
pub use stream::*;
pub use torch_hooks::*;
