//! # cuda-rt
//!
//! CuPy's `cupy.cuda` layer for Rust: devices, memory and pools, streams, events,
//! graphs, modules and NVRTC, with raw access to the driver and the CUDA libraries
//! through [`cuda_sys`]. CUDA is loaded at run time, so a program builds and starts on a
//! machine without a GPU; [`is_available`] says whether CUDA can be used and
//! [`availability`] why not.
//!
//! # Getting started
//!
//! Allocate a buffer on the GPU with the host's data, set part of it on the device,
//! and copy it back:
//!
//! ```no_run
//! use cuda_rt::DeviceBuffer;
//!
//! fn main() -> cuda_rt::Result<()> {
//!     if let Err(why) = cuda_rt::availability() {
//!         println!("no GPU: {why}");
//!         return Ok(());
//!     }
//!     let host: Vec<f32> = (0..1024).map(|i| i as f32).collect();
//!     let mut buf = DeviceBuffer::from_slice(&host)?; // from the pool, copied in
//!     buf.slice_mut(..512)?.fill(0.0)?; // on the device, on the current stream
//!     let back = buf.to_vec()?; // copied out once the fill is done
//!     assert!(back[..512].iter().all(|&v| v == 0.0) && back[512..] == host[512..]);
//!     Ok(())
//! }
//! ```
//!
//! A kernel of your own is compiled at run time by NVRTC (`pip install
//! nvidia-cuda-nvrtc`, no GPU needed to compile) and launched with [`launch!`] on the
//! buffers:
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::{DeviceBuffer, LaunchConfig, RawKernel};
//! let double = RawKernel::new(
//!     r#"extern "C" __global__ void double_it(float* x, int n) {
//!            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 2.0f; }"#,
//!     "double_it",
//!     &[],
//! )?; // compiled once, then from the kernel cache
//! let mut x = DeviceBuffer::from_slice(&[1.5f32; 1000])?;
//! let n = x.len() as i32;
//! let cfg = LaunchConfig::for_num_elems_occupancy(&double, n as u32)?;
//! // SAFETY: double_it(float* x, int n): x holds n floats on this device, and nothing
//! // else uses it until `to_vec` (on the same stream) has read it.
//! unsafe { cuda_rt::launch!(double, &cfg, (&mut x, n))? }; // the kernel writes x
//! assert_eq!(x.to_vec()?, vec![3.0f32; 1000]);
//! # Ok(()) }
//! ```
//!
//! The examples (`cargo run -p cuda-rt-safe --example tour`, then `01_devices` ...
//! `11_libraries`, one per section of the spec, `12_graphs_made_easy`, and `13_async`, a
//! GPU awaited beside file reads) show each area at length; without a GPU they say why
//! and exit.
//!
//! # Map
//!
//! One module per section of the spec, CuPy's `cupy.cuda` reference; the main types
//! are re-exported at the crate root.
//!
//! | area | module | start with |
//! |---|---|---|
//! | devices | [`device`] | [`Device`], [`availability`], [`synchronize`] |
//! | typed memory | [`buffer`] | [`DeviceBuffer`], [`PinnedBuffer`], [`Transfer`] |
//! | untyped memory, pools, hooks | [`memory`] | [`alloc`], [`MemoryPointer`], [`MemoryPool`] |
//! | pinned host memory | [`pinned`] | [`PinnedMemoryPool`], [`alloc_pinned_memory`] |
//! | streams | [`stream`] | [`Stream`], [`get_current_stream`], [`AsStream`], [`Completion`] (async) |
//! | events | [`event`] | [`Event`], [`get_elapsed_time`] |
//! | graphs | [`graph`] | [`Graph`], [`StreamCaptureExt`], [`Recorder`] (record once, replay, update in place) |
//! | kernels | [`compiler`], [`module`], [`launch`](mod@launch) | [`RawKernel`], [`RawModule`], [`launch!`], [`LaunchConfig`] |
//! | libraries | [`libs`], [`cuda_sys`] | [`get_cublas_handle`], [`cuda_sys::result`] |
//! | profiling | [`profiler`] | [`profiler::profile`], [`profiler::range`] |
//! | environment | [`env`](mod@env) | [`env::get_cuda_path`] |
//! | several GPUs and processes | [`peer`], [`ipc`], [`nccl`] | [`nccl::Communicator`] |
//! | errors | [`error`] | [`Error`], [`OutOfMemory`] |
//!
//! `use cuda_rt::prelude::*;` brings the stream traits into scope ([`prelude`]).
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
// The docs link the JSON items (`to_json`, `DebugPrintHook`...), which exist with the
// `serde` feature, on by default: without it those links have nothing to point to.
#![cfg_attr(not(feature = "serde"), allow(rustdoc::broken_intra_doc_links))]

// cuda-rt is for Linux (see cuda-rt-sys, whose build stops first with the same
// message): this crate uses Unix file descriptors and sockets (IPC), Linux's
// `madvise`, and the Linux sonames of the CUDA libraries.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "cuda-rt supports Linux (x86_64, aarch64) only: CUDA's libraries are found and \
     opened the Linux way (libcuda.so.1, dlopen). See the README's Platforms section."
);

/// The crate README's example (the crates.io page), compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

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
pub use graph::{
    CaptureMode, CaptureStatus, DotFlags, Graph, InstantiateFlags, Recorder, StreamCaptureExt,
};
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
    current_stream_of, get_current_stream, AsStream, Completion, ExternalStream, Stream, StreamRef,
    StreamScope,
};
