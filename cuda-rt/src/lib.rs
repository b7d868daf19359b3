//! # cuda-rt
//!
//! CuPy's `cupy.cuda` layer for Rust: devices, memory and pools, streams, events,
//! graphs, modules and NVRTC, with raw access to the driver and the CUDA libraries
//! through [`cuda_sys`]. CUDA is loaded at run time, so a program builds and starts on a
//! machine without a GPU; [`is_available`] says whether CUDA can be used and
//! [`availability`] why not.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! if cuda_rt::is_available() {
//!     let dev = cuda_rt::Device::new(0)?;
//!     println!("{} (sm_{}{})", dev.name()?, dev.compute_capability()?.0, dev.compute_capability()?.1);
//! }
//! # Ok(()) }
//! ```
//!
//! # Layers
//!
//! Each module uses only the modules on its own floor or below, never one above, so
//! there is no import circle (`scripts/module-cycles.py` checks it, also among the
//! submodules of each directory module). From the bottom:
//!
//! 1. [`error`], `thread_state` (what is current on a thread), [`env`](mod@env):
//!    nothing of CUDA's objects. The translation of capture errors into words
//!    ([`Error::Capture`]) is here, since every floor above can meet one.
//! 2. [`device`]: devices, contexts, per-thread library handles; [`peer`]: peer
//!    access between devices.
//! 3. [`stream`]: streams and the current stream ([`AsStream`]).
//! 4. [`event`] (events, and [`StreamEventExt`]: `record`, `wait_event` on every
//!    stream) and `capture`, a small private module: beginning and ending a capture,
//!    the "any capture active" flag, and the registry that keeps memory alive for a
//!    capture's graph. The registry sees memory only through a small trait and
//!    type-erased keep-alive handles, so it needs nothing from [`memory`].
//! 5. [`memory`]: memory objects, [`MemoryPointer`], pools, allocators, hooks,
//!    allocation during a capture (memory nodes), and the per-thread recycler of
//!    emptied memory objects that pinned memory uses too.
//! 6. [`pinned`]: pinned memory, its pool, staging copies, and
//!    [`MemoryPointer`]'s synchronous host copies (which stage through pinned memory,
//!    so they are defined here).
//! 7. [`module`] (modules and functions; `image_extent` checks the cubins and
//!    fatbins it loads), then [`launch`](mod@launch) (launch
//!    shapes, kernel arguments, the launch methods of [`Function`]), then
//!    [`compiler`] (NVRTC and the kernel cache).
//! 8. [`graph`]: graphs, nodes, and [`StreamCaptureExt`] (`begin_capture`,
//!    `end_capture`, ... on every stream).
//! 9. [`buffer`], [`libs`], [`profiler`], [`prelude`], [`ipc`] (interprocess memory),
//!    [`nccl`] (communicators).
//!
//! A method whose signature needs a higher floor's type is defined on that floor:
//! `impl MemoryPointer` blocks in `pinned` and `launch`, `impl Function` in `launch`,
//! and the stream extension traits. [`prelude`] imports [`AsStream`] and those traits
//! at once (`use cuda_rt::prelude::*;`).

#![warn(missing_docs)]

pub mod buffer;
mod capture;
pub mod compiler;
pub mod device;
pub mod env;
pub mod error;
pub mod event;
pub mod graph;
mod image_extent;
pub mod ipc;
pub mod launch;
pub mod libs;
pub mod memory;
pub mod module;
pub mod nccl;
pub mod peer;
pub mod pinned;
pub mod prelude;
pub mod profiler;
pub mod stream;
#[cfg(any(test, feature = "test-util"))]
pub mod testing;
mod thread_state;

pub use buffer::{DeviceBuffer, DeviceSlice, DeviceSliceMut, PinnedBuffer, Transfer};
pub use compiler::{KernelCache, RawKernel, RawModule};
pub use cuda_sys;
pub use device::{
    availability, device_count, get_device_id, is_available, set_device_id, synchronize, Device,
    DeviceAttribute, DeviceScope,
};
pub use error::{
    ArgumentKind, BootstrapKind, CaptureKind, Error, OutOfMemory, OutOfMemoryCause, Result,
    StateKind, Unavailable, UnsupportedKind,
};
pub use event::{get_elapsed_time, Event, EventFlags, IpcEventHandle, StreamEventExt};
pub use graph::{CaptureMode, CaptureStatus, DotFlags, Graph, InstantiateFlags, StreamCaptureExt};
pub use launch::{CooperativeGrid, Dim3, KernelArg, LaunchAttribute, LaunchConfig, PlainData};
pub use libs::{get_cublas_handle, get_curand_generator, get_cusolver_handle, get_cusparse_handle};
pub use memory::{
    alloc, get_allocator, get_default_memory_pool, malloc_async, malloc_managed, set_allocator,
    using_allocator, Allocator, MemoryPointer, MemoryPool,
};
pub use module::{Function, FunctionAttributes, Module};
pub use pinned::{
    alloc_pinned_memory, get_default_pinned_memory_pool, set_pinned_memory_allocator, PinnedMemory,
    PinnedMemoryPointer, PinnedMemoryPool,
};
pub use stream::{
    current_stream_of, get_current_stream, AsStream, ExternalStream, Stream, StreamRef, StreamScope,
};
