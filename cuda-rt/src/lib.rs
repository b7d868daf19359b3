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

#![warn(missing_docs)]

pub mod compiler;
pub mod device;
pub(crate) mod driver;
pub mod env;
pub mod error;
pub mod launch;
pub mod memory;
pub mod module;
pub mod stream;
#[doc(hidden)]
pub mod testing;

pub use compiler::{KernelCache, RawKernel, RawModule};
pub use cuda_sys;
pub use device::{availability, device_count, get_device_id, is_available, Device};
pub use error::{Error, Result};
pub use launch::{Dim3, KernelArg, LaunchAttribute, LaunchConfig, PlainData};
pub use module::{Function, FunctionAttributes, Module};
pub use stream::{get_current_stream, AsStream, Stream, StreamRef};
