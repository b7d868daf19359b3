//! The checked layer: one thin function per CUDA call, returning [`Result`].
//!
//! Each function is named after the call it makes, grouped by area
//! ([`stream::synchronize`] is `cuStreamSynchronize`, [`memory::alloc_async`] is
//! `cuMemAllocAsync`), opens the library on first use, checks the status and turns a
//! failure into an [`Error`] that names the call and says what the code means:
//! `cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory`. A missing library or
//! entry point is an [`Error::Load`], never a panic. cudarc calls its equivalent layer
//! `result`; this one knows nothing of the safe types built on it.
//!
//! | module | calls | feature |
//! |---|---|---|
//! | this one | `cuInit`, `cuDriverGetVersion`, `cuGetErrorName`, `cuGetErrorString` | `driver` |
//! | [`context`] | `cuCtx*`, primary contexts, `cuMemGetInfo` | `driver` |
//! | [`device`] | `cuDevice*` | `driver` |
//! | [`memory`] | `cuMem*` (device, managed, host and pool memory), copies, memsets, `cuPointerGetAttribute` | `driver` |
//! | [`stream`] | `cuStream*`, capture, `cuLaunchHostFunc` with Rust closures | `driver` |
//! | [`event`] | `cuEvent*`, `cuIpc*EventHandle` | `driver` |
//! | [`ipc`] | `cuIpc*MemHandle`, `cuMemGetAddressRange`, pool export and import | `driver` |
//! | [`module`] | `cuModule*`, `cuFunc*`, `cuOccupancy*` | `driver` |
//! | [`launch`] | `cuLaunchKernel`, `cuLaunchCooperativeKernel`, `cuLaunchKernelEx` | `driver` |
//! | [`link`] | `cuLink*`: the JIT linker (relocatable device code, the device runtime) | `driver` |
//! | [`graph`] | `cuGraph*`, user objects, repeatable host nodes with Rust closures | `driver` |
//! | [`profiler`] | `cuProfilerStart`, `cuProfilerStop` | `driver` |
//! | [`nvrtc`] | `nvrtc*` | `nvrtc` |
//! | [`cublas`], [`cusolver`], [`cusparse`], [`curand`] | handle create, destroy, set stream | `cublas`, ... |
//! | [`nccl`] | unique ids, communicators, collectives, send/recv, groups | `nccl` |
//!
//! # Safety
//!
//! A function is safe when nothing the caller passes can make it undefined behaviour:
//! [`init`], [`version`], device queries by ordinal, and calls that create an object
//! into an out-pointer of their own (the driver answers an error code for a missing
//! context or a bad flag). Every function that takes a handle (a stream, an event, a
//! module...), a device or host address, or runs device code is an `unsafe fn`; its
//! `# Safety` section says what the caller guarantees: in short, handles are live and
//! belong to the current context, addresses are valid for the bytes the call touches
//! for as long as the work runs, and what is destroyed is destroyed once. The layers
//! above (cuda-rt's owning types) hold those promises in their types.
//!
//! # Cost
//!
//! Each call is `#[inline]`: after the first use, one load of the cached entry point,
//! the call, and one branch on the status; building the error is out of line (`#[cold]`).
//!
//! # Example
//!
//! ```
//! use cuda_sys::result::{self, context, device, memory, stream};
//!
//! fn main() -> Result<(), result::Error> {
//!     if let Err(e) = result::init() {
//!         println!("no CUDA driver here: {e}");
//!         return Ok(());
//!     }
//!     if device::get_count()? == 0 {
//!         println!("no CUDA device");
//!         return Ok(());
//!     }
//!     let dev = device::get(0)?;
//!     let ctx = context::primary_ctx_retain(dev)?;
//!     // SAFETY: `ctx` was just retained and stays retained until the release below.
//!     unsafe { context::set_current(ctx) }?;
//!     let data = [1u8, 2, 3, 4];
//!     let mut back = [0u8; 4];
//!     let d = memory::alloc(data.len())?;
//!     // SAFETY: `d` holds 4 bytes; the copies are synchronous and the stream is the
//!     // legacy default one (null), always valid while a context is current.
//!     unsafe {
//!         memory::memcpy_htod(d, &data)?;
//!         stream::synchronize(std::ptr::null_mut())?;
//!         memory::memcpy_dtoh(&mut back, d)?;
//!         memory::free(d)?;
//!     }
//!     assert_eq!(back, data);
//!     // SAFETY: the retain taken above, given back once; nothing of the context is
//!     // used after it.
//!     unsafe { context::primary_ctx_release(dev) }?;
//!     Ok(())
//! }
//! ```

mod error;
#[rustfmt::skip]
mod lib_status;

#[cfg(feature = "driver")]
pub mod context;
#[cfg(feature = "driver")]
pub mod device;
#[cfg(feature = "driver")]
pub mod event;
#[cfg(feature = "driver")]
pub mod graph;
#[cfg(feature = "driver")]
pub mod ipc;
#[cfg(feature = "driver")]
pub mod launch;
#[cfg(feature = "driver")]
pub mod link;
#[cfg(feature = "driver")]
pub mod memory;
#[cfg(feature = "driver")]
pub mod module;
#[cfg(feature = "driver")]
pub mod profiler;
#[cfg(feature = "driver")]
pub mod stream;
#[cfg(feature = "driver")]
pub mod vmm;

#[cfg(feature = "nvrtc")]
pub mod nvrtc;

#[cfg(feature = "cublas")]
pub mod cublas;
#[cfg(feature = "curand")]
pub mod curand;
#[cfg(feature = "cusolver")]
pub mod cusolver;
#[cfg(feature = "cusparse")]
pub mod cusparse;
#[cfg(feature = "nccl")]
pub mod nccl;

#[cfg(feature = "driver")]
pub use error::DriverError;
#[cfg(feature = "nccl")]
pub use error::NcclError;
#[cfg(feature = "nvrtc")]
pub use error::NvrtcError;
pub use error::{strip_abi_suffix, Error, LibraryError};
pub use lib_status::{
    cublas_status_name, curand_status_name, cusolver_status_name, cusparse_status_name,
};

/// `Result` with the checked layer's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Ok(())` for a math library's success status (0), else the [`LibraryError`] of
/// `status` for `call`, named by `name` (e.g. [`cublas_status_name`]).
#[inline]
pub fn library_check(status: u32, call: &'static str, name: fn(u32) -> &'static str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(library_error(status, call, name).into())
    }
}

/// [`library_check`] with the library's words for the status: `describe` (e.g.
/// `cublas::status_description`) gives them, `None` when it cannot.
#[inline]
pub fn library_check_described(
    status: u32,
    call: &'static str,
    name: fn(u32) -> &'static str,
    describe: fn(u32) -> Option<&'static str>,
) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        let mut e = library_error(status, call, name);
        e.description = describe(status);
        Err(e.into())
    }
}

#[cold]
fn library_error(status: u32, call: &'static str, name: fn(u32) -> &'static str) -> LibraryError {
    LibraryError {
        call,
        status: status as i32,
        name: name(status),
        description: None,
    }
}

/// A NUL-terminated string a math library returned for a status, if it is one and is
/// UTF-8.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string that lives as long as the process
/// (the libraries' status strings are static, and the loader never unloads them).
#[cfg(any(feature = "cublas", feature = "cusparse"))]
unsafe fn static_status_string(p: *const std::os::raw::c_char) -> Option<&'static str> {
    if p.is_null() {
        return None;
    }
    // SAFETY: see `# Safety`.
    let s = unsafe { std::ffi::CStr::from_ptr::<'static>(p) }
        .to_str()
        .ok()?;
    (!s.is_empty()).then_some(s)
}

#[cfg(feature = "driver")]
pub use driver_calls::*;

#[cfg(feature = "driver")]
mod driver_calls {
    use std::ffi::{c_char, CStr};

    use super::{DriverError, Result};
    use crate::driver::{self as sys, CUresult};

    /// The driver's entry-point table (opens `libcuda.so.1` on first use).
    #[inline]
    pub fn api() -> Result<&'static sys::Api> {
        Ok(sys::api()?)
    }

    /// `Ok(())` for `CUDA_SUCCESS`, else the [`DriverError`] of `code` for `call` (the
    /// entry point's name; its ABI suffix is stripped).
    #[inline]
    pub fn check(code: CUresult, call: &'static str) -> Result<()> {
        if code == CUresult::CUDA_SUCCESS {
            Ok(())
        } else {
            Err(DriverError::new(code, call).into())
        }
    }

    /// `cuGetErrorName` / `cuGetErrorString`, `None` when the driver is missing or
    /// does not know the code.
    pub(crate) fn error_text(code: CUresult, name: bool) -> Option<&'static str> {
        let api = sys::api().ok()?;
        let f = if name {
            api.cuGetErrorName().ok()?
        } else {
            api.cuGetErrorString().ok()?
        };
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out pointer; the driver writes a static string.
        if unsafe { f(code, &mut p) } != CUresult::CUDA_SUCCESS || p.is_null() {
            return None;
        }
        // SAFETY: the driver's error strings are NUL-terminated and live as long as the
        // library, which the loader never unloads.
        unsafe { CStr::from_ptr::<'static>(p) }.to_str().ok()
    }

    /// The driver's name of `code`, e.g. `CUDA_ERROR_OUT_OF_MEMORY` (`cuGetErrorName`).
    pub fn get_error_name(code: CUresult) -> Result<&'static str> {
        text(code, true, "cuGetErrorName")
    }

    /// The driver's description of `code`, e.g. `out of memory` (`cuGetErrorString`).
    pub fn get_error_string(code: CUresult) -> Result<&'static str> {
        text(code, false, "cuGetErrorString")
    }

    fn text(code: CUresult, name: bool, call: &'static str) -> Result<&'static str> {
        let api = api()?;
        let f = if name {
            api.cuGetErrorName()?
        } else {
            api.cuGetErrorString()?
        };
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: `p` is a valid out pointer; the driver writes a static string.
        check(unsafe { f(code, &mut p) }, call)?;
        if p.is_null() {
            return Ok("");
        }
        // SAFETY: as in `error_text`.
        Ok(unsafe { CStr::from_ptr::<'static>(p) }
            .to_str()
            .unwrap_or_default())
    }

    /// `cuInit(0)`: initialises the driver (again: later calls are cheap).
    pub fn init() -> Result<()> {
        let f = api()?.cuInit()?;
        // SAFETY: cuInit has no preconditions.
        check(unsafe { f(0) }, "cuInit")
    }

    /// The CUDA version the driver supports, e.g. 13000 (`cuDriverGetVersion`).
    pub fn version() -> Result<i32> {
        let f = api()?.cuDriverGetVersion()?;
        let mut v = 0;
        // SAFETY: `v` is a valid out pointer.
        check(unsafe { f(&mut v) }, "cuDriverGetVersion")?;
        Ok(v)
    }
}
