//! The thin checked layer over the CUDA driver API: one small function per driver call,
//! returning [`Result`], grouped by area. `unsafe` and the conversion of `CUresult` to
//! [`Error`] live here, so the safe layer reads like plain Rust.
//!
//! It is private to the crate: its functions take raw handles that the safe types own
//! and keep valid, which a caller outside the crate could not promise. Users who want
//! raw calls have `cuda_sys` and the `as_raw` accessors of the safe types.

// The layer mirrors the driver API by area; not every call has a safe user yet.
#![allow(dead_code)]

#[rustfmt::skip]
pub mod lib_status;
pub mod libs;
pub mod nvrtc;
pub mod profiler;

use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

pub use cuda_sys::driver as sys;
use sys::CUresult;

use crate::error::{DriverError, Error, Result};

/// Calls a driver entry point through the lazily resolved table and checks its result:
/// `drv!(cuCtxSynchronize())`. The caller writes the `// SAFETY:` line for the call.
macro_rules! drv {
    ($name:ident ( $($arg:expr),* $(,)? )) => {{
        let f = $crate::driver::api()?.$name()?;
        #[allow(unused_unsafe)]
        let rc = unsafe { f($($arg),*) };
        $crate::driver::check(rc, stringify!($name))
    }};
}
pub(crate) use drv;

/// The driver's entry-point table (opens `libcuda.so.1` on first use).
#[inline]
pub fn api() -> Result<&'static sys::Api> {
    sys::api().map_err(Error::Load)
}

/// `Ok(())` for `CUDA_SUCCESS`, else the driver's name and description of the code.
#[inline]
pub fn check(rc: CUresult, call: &'static str) -> Result<()> {
    if rc == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Driver(driver_error(rc, call)))
    }
}

/// Builds the [`DriverError`] for `code`, asking the driver for its name and string.
#[cold]
pub fn driver_error(code: CUresult, call: &'static str) -> DriverError {
    DriverError {
        call: strip_abi_suffix(call),
        code,
        name: error_text(code, true).unwrap_or("CUDA_ERROR_UNRECOGNIZED"),
        description: error_text(code, false).unwrap_or("unrecognized CUDA error code"),
    }
}

fn error_text(code: CUresult, name: bool) -> Option<&'static str> {
    let api = api().ok()?;
    let f = if name {
        api.cuGetErrorName().ok()?
    } else {
        api.cuGetErrorString().ok()?
    };
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `p` is a valid out pointer; the driver returns a static string.
    if unsafe { f(code, &mut p) } != CUresult::CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: the driver's error strings are NUL-terminated and live as long as the
    // library, which is never unloaded.
    unsafe { CStr::from_ptr::<'static>(p) }.to_str().ok()
}

/// `cuMemAlloc_v2` -> `cuMemAlloc`: users know the call by its documented name.
fn strip_abi_suffix(call: &'static str) -> &'static str {
    let call = call
        .strip_suffix("_ptds")
        .or_else(|| call.strip_suffix("_ptsz"))
        .unwrap_or(call);
    match call.rfind("_v") {
        Some(i) if i + 2 < call.len() && call[i + 2..].bytes().all(|b| b.is_ascii_digit()) => {
            &call[..i]
        }
        _ => call,
    }
}

/// `cuInit(0)`, once per process; later calls return the first outcome.
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: cuInit has no preconditions.
        drv!(cuInit(0))
    })
    .clone()
}

/// The CUDA version the driver supports, e.g. 13000 (`cuDriverGetVersion`).
pub fn version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer.
    drv!(cuDriverGetVersion(&mut v))?;
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::strip_abi_suffix;

    #[test]
    fn abi_suffixes_are_stripped_from_call_names() {
        assert_eq!(strip_abi_suffix("cuMemAlloc_v2"), "cuMemAlloc");
        assert_eq!(strip_abi_suffix("cuMemcpyHtoD_v2_ptds"), "cuMemcpyHtoD");
        assert_eq!(strip_abi_suffix("cuLaunchKernel_ptsz"), "cuLaunchKernel");
        assert_eq!(strip_abi_suffix("cuInit"), "cuInit");
        assert_eq!(strip_abi_suffix("cuMemAdvise_v"), "cuMemAdvise_v");
    }
}
