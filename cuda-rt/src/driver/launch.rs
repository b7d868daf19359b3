//! Checked kernel launches (`cuLaunchKernel`, `cuLaunchCooperativeKernel`,
//! `cuLaunchKernelEx`). The caller makes the function's context current first.
//!
//! These are on the launch hot path: inlined, one table load (the entry point is
//! resolved once and cached by cuda-sys) and one branch on the result.
//!
//! Unlike most of this crate-private layer, the launch functions are `unsafe fn`: they
//! run arbitrary device code with the caller's parameters, which nothing here can
//! check, so the promise travels up to the public `unsafe fn`s of `crate::launch` (see
//! each function's `# Safety`).

use std::ffi::c_void;

use super::{check, sys};
use crate::error::Result;

/// `cuLaunchKernel`.
///
/// # Safety
/// `f` is a function of a loaded module whose context is current; `stream` a stream
/// of that context (or 0/2); `params` holds one pointer per kernel parameter, each to
/// a value of the parameter's type, alive for the call (null when the kernel takes
/// none). The kernel's use of those values is sound: every pointer it follows is valid
/// for all its accesses until it completes, with no data race (see
/// `crate::module::Function::launch`).
#[inline]
pub unsafe fn launch(
    f: sys::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: sys::CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let launch = super::api()?.cuLaunchKernel()?;
    // SAFETY: the caller guarantees valid handles, parameter pointers and a sound
    // kernel (see `# Safety`).
    let rc = unsafe {
        launch(
            f,
            grid[0],
            grid[1],
            grid[2],
            block[0],
            block[1],
            block[2],
            shared,
            stream,
            params,
            std::ptr::null_mut(),
        )
    };
    check(rc, "cuLaunchKernel")
}

/// `cuLaunchCooperativeKernel`.
///
/// # Safety
/// As for [`launch`].
#[inline]
pub unsafe fn launch_cooperative(
    f: sys::CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: sys::CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let launch = super::api()?.cuLaunchCooperativeKernel()?;
    // SAFETY: the caller guarantees valid handles, parameter pointers and a sound
    // kernel (see `# Safety`).
    let rc = unsafe {
        launch(
            f, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params,
        )
    };
    check(rc, "cuLaunchCooperativeKernel")
}

/// `cuLaunchKernelEx`.
///
/// # Safety
/// As for [`launch`] (`config.hStream` is the stream); `config.attrs` points to
/// `config.numAttrs` initialised entries.
#[inline]
pub unsafe fn launch_ex(
    config: &sys::CUlaunchConfig,
    f: sys::CUfunction,
    params: *mut *mut c_void,
) -> Result<()> {
    let launch = super::api()?.cuLaunchKernelEx()?;
    // SAFETY: the caller guarantees valid handles, parameter pointers and a sound
    // kernel (see `# Safety`).
    let rc = unsafe { launch(config, f, params, std::ptr::null_mut()) };
    check(rc, "cuLaunchKernelEx")
}
