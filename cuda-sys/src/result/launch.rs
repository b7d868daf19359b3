//! Checked kernel launches (`cuLaunchKernel`, `cuLaunchCooperativeKernel`,
//! `cuLaunchKernelEx`).
//!
//! Launching runs arbitrary device code with the caller's parameters, which nothing
//! here can check, so every launch is an `unsafe fn` (see each `# Safety`). They are on
//! the launch hot path: inlined, one load of the cached entry point, the call and one
//! branch on the result.

use std::ffi::c_void;

use super::{api, check, Result};
use crate::driver::{CUfunction, CUlaunchConfig, CUstream};

/// Launches `func` on a `grid` of blocks of `block` threads, with `shared` bytes of
/// dynamic shared memory per block, on `stream` (`cuLaunchKernel`).
///
/// # Safety
/// - `func` is a function of a loaded module whose context is current; `stream` is a
///   live stream of that context or a default-stream handle.
/// - `params` holds one pointer per kernel parameter, each to a value of the
///   parameter's type and size, alive for the call (null when the kernel takes none).
/// - The kernel's use of those values is sound: every address it follows is valid for
///   all its accesses until it completes, with no data race with the host or other
///   work.
#[inline]
pub unsafe fn launch_kernel(
    func: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let launch = api()?.cuLaunchKernel()?;
    // SAFETY: the caller guarantees valid handles, parameter pointers and a sound
    // kernel (see `# Safety`); no `extra` array.
    let rc = unsafe {
        launch(
            func,
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

/// Launches `func` as a cooperative kernel: all blocks resident at once, grid-wide
/// synchronisation allowed (`cuLaunchCooperativeKernel`).
///
/// # Safety
/// As for [`launch_kernel`].
#[inline]
pub unsafe fn launch_cooperative_kernel(
    func: CUfunction,
    grid: [u32; 3],
    block: [u32; 3],
    shared: u32,
    stream: CUstream,
    params: *mut *mut c_void,
) -> Result<()> {
    let launch = api()?.cuLaunchCooperativeKernel()?;
    // SAFETY: the caller guarantees valid handles, parameter pointers and a sound
    // kernel (see `# Safety`).
    let rc = unsafe {
        launch(
            func, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared, stream, params,
        )
    };
    check(rc, "cuLaunchCooperativeKernel")
}

/// Launches `func` with a launch configuration: grid, block, shared memory, stream
/// and attributes such as cluster dimensions (`cuLaunchKernelEx`).
///
/// # Safety
/// As for [`launch_kernel`], with `config.hStream` as the stream; `config.attrs`
/// points to `config.numAttrs` initialised attributes (or is null with `numAttrs` 0).
#[inline]
pub unsafe fn launch_kernel_ex(
    config: &CUlaunchConfig,
    func: CUfunction,
    params: *mut *mut c_void,
) -> Result<()> {
    let launch = api()?.cuLaunchKernelEx()?;
    // SAFETY: the caller guarantees valid handles, parameter pointers and a sound
    // kernel (see `# Safety`); no `extra` array.
    let rc = unsafe { launch(config, func, params, std::ptr::null_mut()) };
    check(rc, "cuLaunchKernelEx")
}
