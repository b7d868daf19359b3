//! Profiling: CuPy's `profile()` scope around the CUDA profiler, and NVTX ranges and
//! marks that show up in Nsight Systems.
//!
//! The CUDA profiler switch (`cuProfilerStart`/`cuProfilerStop`) marks what a tool
//! such as `nsys profile --capture-range=cudaProfilerApi` records. [`profile`] and
//! [`ProfileGuard`] start it and always stop it again, also when the scope returns an
//! error or panics. Scopes nest: the profiler stops when the outermost scope on that
//! device ends.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::profiler;
//!
//! let total = profiler::profile(|| -> cuda_rt::Result<u64> {
//!     let _r = profiler::range("setup")?;
//!     // ... launch work ...
//!     Ok(42)
//! })?;
//! # let _ = total;
//! # Ok(()) }
//! ```
//!
//! NVTX calls ([`range_push`], [`range`], [`mark`]...) need neither a GPU nor a tool:
//! without a tool attached they return at once.

mod nvtx;

pub use nvtx::{
    mark, mark_color, range, range_color, range_pop, range_push, range_push_color, Color, Message,
    Range,
};

use std::sync::{Mutex, PoisonError};

use cuda_sys::result::profiler as raw;

use crate::device::context::{make_current, MAX_DEVICES};
use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result};

/// Open [`ProfileGuard`]s per device, process-wide. The profiler is started when a
/// device's count leaves 0 and stopped when it returns to 0, so scopes nest.
static OPEN_SCOPES: Mutex<[u32; MAX_DEVICES]> = Mutex::new([0; MAX_DEVICES]);

/// Starts the CUDA profiler for this thread's current device (`cuProfilerStart`).
///
/// The raw switch: it does not nest and nothing stops it for you. Prefer [`profile`]
/// or [`ProfileGuard`]. Without a usable driver this is the loader's or driver's error.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// cuda_rt::profiler::start()?;
/// // ... work to profile ...
/// cuda_rt::profiler::stop()?;
/// # Ok(()) }
/// ```
pub fn start() -> Result<()> {
    make_current(get_device_id())?;
    Ok(raw::start()?)
}

/// Stops the CUDA profiler for this thread's current device (`cuProfilerStop`), even
/// inside an open [`profile`] scope. See [`start`].
pub fn stop() -> Result<()> {
    make_current(get_device_id())?;
    Ok(raw::stop()?)
}

/// How many [`profile`] scopes ([`ProfileGuard`]s) are open in the process, over all
/// devices. `0` means every scope has stopped the profiler it started.
///
/// ```
/// assert_eq!(cuda_rt::profiler::open_scopes(), 0);
/// ```
pub fn open_scopes() -> usize {
    let counts = OPEN_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
    counts.iter().map(|&n| n as usize).sum()
}

/// A profiling scope: the CUDA profiler runs from [`ProfileGuard::start`] until the
/// guard is dropped (or [`ProfileGuard::stop`]ped), also when the scope is left by `?`
/// or a panic. CuPy's `with cupy.cuda.profile():` as a value.
///
/// The guard belongs to the device that was current when it started; it stops the
/// profiler there even if the thread's current device changed meanwhile. Scopes nest:
/// only the outermost scope of a device starts and stops the profiler.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// let scope = cuda_rt::profiler::ProfileGuard::start()?;
/// // ... work to profile ...
/// scope.stop()?; // or let it drop, which ignores a failure to stop
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "the profiler stops as soon as the guard is dropped"]
pub struct ProfileGuard {
    device: i32,
    stopped: bool,
}

impl ProfileGuard {
    /// Starts the profiler on this thread's current device (unless a scope on that
    /// device already runs it). An error, and no scope, when the driver cannot start it.
    pub fn start() -> Result<ProfileGuard> {
        let device = get_device_id();
        let slot = device_slot(device)?;
        let mut counts = OPEN_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        if counts[slot] == 0 {
            make_current(device)?;
            raw::start()?;
        }
        counts[slot] += 1;
        Ok(ProfileGuard {
            device,
            stopped: false,
        })
    }

    /// The device whose profiler this scope runs.
    pub fn device(&self) -> i32 {
        self.device
    }

    /// Ends the scope now and reports whether the profiler stopped cleanly (dropping
    /// the guard does the same but cannot report).
    pub fn stop(mut self) -> Result<()> {
        self.end()
    }

    fn end(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.stopped, true) {
            return Ok(());
        }
        // `device` was checked in `start`.
        let slot = self.device as usize;
        let mut counts = OPEN_SCOPES.lock().unwrap_or_else(PoisonError::into_inner);
        counts[slot] = counts[slot].saturating_sub(1);
        if counts[slot] > 0 {
            return Ok(());
        }
        make_current(self.device)?;
        let stopped = raw::stop().map_err(Error::from);
        // Give the thread back its own device's context if it moved on meanwhile.
        let current = get_device_id();
        if current != self.device {
            make_current(current)?;
        }
        stopped
    }
}

impl Drop for ProfileGuard {
    fn drop(&mut self) {
        // A failure to stop cannot be reported from `drop`; `stop()` reports it.
        let _ = self.end();
    }
}

fn device_slot(device: i32) -> Result<usize> {
    usize::try_from(device)
        .ok()
        .filter(|&i| i < MAX_DEVICES)
        .ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("device id {device} is out of range"),
            )
        })
}

/// Runs `body` with the CUDA profiler on (CuPy's `with cupy.cuda.profile():`) and
/// always stops it afterwards: when `body` returns `Ok`, when it returns `Err`, and
/// when it panics (the panic then continues).
///
/// Returns `body`'s result. A failure to start is returned without running `body`; a
/// failure to stop is returned when `body` succeeded (when `body` failed, its error
/// wins). The error type is any `E: From<cuda_rt::Error>`, so `body` may use its own.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::profiler::{profile, range};
///
/// profile(|| -> cuda_rt::Result<()> {
///     let _step = range("step 1")?;
///     // ... kernels, copies ...
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub fn profile<T, E, F>(body: F) -> Result<T, E>
where
    F: FnOnce() -> Result<T, E>,
    E: From<Error>,
{
    let guard = ProfileGuard::start()?;
    let out = body();
    let stopped = guard.stop();
    match (out, stopped) {
        (Ok(v), Ok(())) => Ok(v),
        (Ok(_), Err(e)) => Err(e.into()),
        (Err(e), _) => Err(e),
    }
}
