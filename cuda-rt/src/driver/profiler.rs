//! The CUDA profiler switch (`cuProfilerStart`/`cuProfilerStop`) and the NVTX shim
//! compiled from `csrc/nvtx.c` (NVTX v3's header-only core API behind plain C
//! functions).

use std::ffi::{c_char, c_int, CStr};

use super::drv;
use crate::error::Result;

extern "C" {
    fn cuda_rt_nvtx_range_push(message: *const c_char, argb: u32, has_color: c_int) -> c_int;
    fn cuda_rt_nvtx_range_pop() -> c_int;
    fn cuda_rt_nvtx_mark(message: *const c_char, argb: u32, has_color: c_int);
}

/// `cuProfilerStart` for the thread's current context (the caller makes it current).
pub fn start() -> Result<()> {
    // SAFETY: no arguments; the driver checks that a context is current.
    drv!(cuProfilerStart())
}

/// `cuProfilerStop` for the thread's current context.
pub fn stop() -> Result<()> {
    // SAFETY: no arguments; the driver checks that a context is current.
    drv!(cuProfilerStop())
}

/// `nvtxRangePushEx` with an ASCII message and, if `color` is `Some`, an ARGB color.
/// Returns NVTX's answer: the depth of the new range, negative without a tool.
#[inline]
pub fn nvtx_range_push(message: &CStr, color: Option<u32>) -> i32 {
    // SAFETY: `message` is NUL-terminated and outlives the call; NVTX copies what it
    // keeps. The shim has no other preconditions and is thread-safe.
    unsafe {
        cuda_rt_nvtx_range_push(
            message.as_ptr(),
            color.unwrap_or(0),
            c_int::from(color.is_some()),
        )
    }
}

/// `nvtxRangePop`: ends the thread's innermost range. Returns NVTX's answer: the depth
/// of the range ended, negative without a tool (or with nothing to pop).
#[inline]
pub fn nvtx_range_pop() -> i32 {
    // SAFETY: no arguments; popping with no open range is reported, not undefined.
    unsafe { cuda_rt_nvtx_range_pop() }
}

/// `nvtxMarkEx` with an ASCII message and, if `color` is `Some`, an ARGB color.
#[inline]
pub fn nvtx_mark(message: &CStr, color: Option<u32>) {
    // SAFETY: as in `nvtx_range_push`.
    unsafe {
        cuda_rt_nvtx_mark(
            message.as_ptr(),
            color.unwrap_or(0),
            c_int::from(color.is_some()),
        )
    }
}
