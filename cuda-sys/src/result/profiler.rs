//! The CUDA profiler switch (`cuProfilerStart`, `cuProfilerStop`): a profiler started
//! with collection off records only between the two. Both act on the current context
//! (an error code without one).

use super::{api, check, Result};

/// Starts profile collection for the current context (`cuProfilerStart`).
pub fn start() -> Result<()> {
    let f = api()?.cuProfilerStart()?;
    // SAFETY: no arguments; the driver checks that a context is current.
    check(unsafe { f() }, "cuProfilerStart")
}

/// Stops profile collection for the current context (`cuProfilerStop`).
pub fn stop() -> Result<()> {
    let f = api()?.cuProfilerStop()?;
    // SAFETY: no arguments; the driver checks that a context is current.
    check(unsafe { f() }, "cuProfilerStop")
}
