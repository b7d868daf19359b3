//! Raw CUDA declarations, loaded at run time.
//!
//! `cuda-sys` holds the types, constants and function signatures that bindgen read from
//! the CUDA 13.0 headers (committed under `src/generated/`, never edited by hand;
//! `scripts/regen-bindings.sh` rewrites them) and a loader that opens each library with
//! `dlopen` the first time it is used. Nothing is linked at build time, so a program
//! using this crate builds and starts on a machine with no GPU, no driver and no CUDA
//! toolkit; a missing library or entry point is an [`LoadError`] that says what was
//! missing and every path tried. Nothing here panics.
//!
//! Each library is a module behind a cargo feature (`driver` and `nvrtc` by default):
//!
//! | module | library | feature |
//! |---|---|---|
//! | [`driver`] | `libcuda.so.1` (driver API and profiler API), through `cuGetProcAddress` | `driver` |
//! | [`runtime`] | `libcudart.so.13` / `.12` | `runtime` |
//! | [`nvrtc`] | `libnvrtc.so.13` / `.12` | `nvrtc` |
//! | [`cublas`] | `libcublas.so.13` / `.12` | `cublas` |
//! | [`cusolver`] | `libcusolver.so.12` / `.11` (dense API) | `cusolver` |
//! | [`cusparse`] | `libcusparse.so.12` | `cusparse` |
//! | [`curand`] | `libcurand.so.10` | `curand` |
//! | [`nccl`] | `libnccl.so.2` (declared by hand, see the module) | `nccl` |
//!
//! In each module, `api()` opens the library and returns its table; `api()?.cuInit()?`
//! is the entry point as a function pointer (resolved once, then one atomic load), and
//! the module-level `unsafe fn cuInit(..) -> Result<CUresult, LoadError>` calls it.
//!
//! ```no_run
//! use cuda_sys::driver;
//! # fn main() -> Result<(), cuda_sys::LoadError> {
//! let init = driver::api()?.cuInit()?;
//! // SAFETY: cuInit has no preconditions.
//! let rc = unsafe { init(0) };
//! assert_eq!(rc, driver::CUresult::CUDA_SUCCESS);
//! # Ok(()) }
//! ```
//!
//! On top of the raw declarations, [`result`] is the checked layer: one thin function
//! per call, named after it and grouped by area (`result::stream::synchronize`,
//! `result::memory::alloc_async`), returning `Result` with an error that names the call
//! and says what its status means. It is what cuda-rt is built on, and what other
//! bindings layered on cuda-sys can use.
//!
//! Enums are bindgen's new-type style (`CUresult(u32)` with associated constants), so a
//! value a newer library returns that these headers do not know is still valid.

#![warn(missing_docs)]

// cuda-rt is for Linux: the CUDA libraries are found and opened the Linux way
// (`libcuda.so.1` and the other sonames, `dlopen`, the Python wheels' `nvidia/*/lib`
// folders), and the crates above use Unix file descriptors and sockets. Elsewhere the
// build stops here, with this one message, rather than with a page of errors.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "cuda-rt supports Linux (x86_64, aarch64) only: CUDA's libraries are found and \
     opened the Linux way (libcuda.so.1, dlopen). See the README's Platforms section."
);

#[macro_use]
mod dylib;
pub mod loader;
pub mod result;
mod version;

#[cfg(feature = "nccl")]
pub mod nccl;

#[path = "generated/driver_versions.rs"]
#[rustfmt::skip]
mod generated_versions;

pub use loader::{LoadError, LoadErrorKind};

/// The README's example, compiled as a doc test.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub use version::{format_version, CudaVersion};

macro_rules! generated_module {
    ($feature:literal, $name:ident, $spec:ident, $doc:literal) => {
        #[cfg(feature = $feature)]
        #[doc = $doc]
        #[allow(
            non_camel_case_types,
            non_snake_case,
            non_upper_case_globals,
            missing_docs,
            dead_code,
            unpredictable_function_pointer_comparisons,
            clippy::all
        )]
        #[rustfmt::skip]
        pub mod $name {
            /// Where this module's functions are loaded from.
            pub static LIBRARY: &$crate::loader::LibrarySpec = &$crate::loader::specs::$spec;
            include!(concat!("generated/", stringify!($name), ".rs"));
        }
    };
}

generated_module!(
    "driver",
    driver,
    DRIVER,
    "The CUDA driver API (`cuda.h`) and profiler API (`cudaProfiler.h`)."
);
generated_module!(
    "runtime",
    runtime,
    RUNTIME,
    "The CUDA runtime API (`cuda_runtime_api.h`)."
);
generated_module!(
    "nvrtc",
    nvrtc,
    NVRTC,
    "NVRTC, the run-time compiler (`nvrtc.h`)."
);
generated_module!("cublas", cublas, CUBLAS, "cuBLAS, v2 API (`cublas_v2.h`).");
generated_module!(
    "cusolver",
    cusolver,
    CUSOLVER,
    "cuSOLVER, dense API (`cusolverDn.h`)."
);
generated_module!("cusparse", cusparse, CUSPARSE, "cuSPARSE (`cusparse.h`).");
generated_module!("curand", curand, CURAND, "cuRAND, host API (`curand.h`).");
