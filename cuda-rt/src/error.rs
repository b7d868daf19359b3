//! The one error type of cuda-rt: every failure says what failed in words a user can act on.

use std::fmt;

use cuda_sys::driver::CUresult;
use cuda_sys::LoadError;

/// `Result` with cuda-rt's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A CUDA driver error: the call that failed and the driver's name and description of
/// the code, e.g. `cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory`. It is
/// the checked layer's own error, [`cuda_sys::result::DriverError`].
pub use cuda_sys::result::DriverError;

/// Out of device (or pinned) memory, with the numbers that explain it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// What was asked for, in bytes (after rounding).
    pub requested: u64,
    /// The device, or `None` for host (pinned) memory.
    pub device: Option<i32>,
    /// Bytes handed out by the pool when it failed.
    pub in_use: u64,
    /// Bytes cached (free in the pool) when it failed, after release and retry.
    pub cached: u64,
    /// The pool's limit, if one is set.
    pub limit: Option<u64>,
    /// What the driver said, if the driver refused (rather than the limit).
    pub driver: Option<DriverError>,
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "out of memory allocating {}",
            human_bytes(self.requested)
        )?;
        match self.device {
            Some(d) => write!(f, " on device {d}")?,
            None => write!(f, " of pinned host memory")?,
        }
        write!(
            f,
            ": {} in use, {} cached (released and retried)",
            human_bytes(self.in_use),
            human_bytes(self.cached)
        )?;
        match self.limit {
            Some(l) => write!(f, ", limit {}", human_bytes(l))?,
            None => write!(f, ", no limit set")?,
        }
        if let Some(d) = &self.driver {
            write!(f, " ({d})")?;
        }
        Ok(())
    }
}

/// A failure in NVRTC: the call, NVRTC's name of the code and, for a failed compile,
/// the source name and the whole log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompileError {
    /// The NVRTC call that failed.
    pub call: &'static str,
    /// NVRTC's result code.
    pub code: i32,
    /// NVRTC's name of the code, e.g. `NVRTC_ERROR_COMPILATION`.
    pub name: String,
    /// The name the source was compiled under (e.g. `saxpy.cu`), if any.
    pub source_name: Option<String>,
    /// The compiler's log, empty if there was none.
    pub log: String,
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.name)?;
        if let Some(s) = &self.source_name {
            write!(f, " (source {s})")?;
        }
        if !self.log.trim().is_empty() {
            write!(f, "\n{}", self.log.trim_end())?;
        }
        Ok(())
    }
}

/// Everything that can go wrong in cuda-rt.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call returned an error.
    #[error("{0}")]
    Driver(DriverError),
    /// A library or entry point could not be loaded (names every path tried).
    #[error("{0}")]
    Load(#[from] LoadError),
    /// NVRTC failed; a compile failure carries the log.
    #[error("{0}")]
    Compile(CompileError),
    /// A math library (cuBLAS, cuSOLVER, cuSPARSE, cuRAND) call failed.
    #[error("{call} failed: {name} ({status})")]
    Library {
        /// The call that failed.
        call: &'static str,
        /// The library's status code.
        status: i32,
        /// The status's name.
        name: &'static str,
    },
    /// Out of memory, with requested, in-use, cached and limit bytes.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// A bad argument; the message names it and its value.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A device id that does not exist.
    #[error("invalid device id {id}: {count} CUDA device(s) present (valid ids 0..{count})")]
    InvalidDevice {
        /// The id asked for.
        id: i32,
        /// How many devices there are.
        count: i32,
    },
    /// CUDA is not usable on this machine; the reason says why.
    #[error("CUDA is not available: {0}")]
    NotAvailable(String),
    /// The operation is not supported (by CUDA, this device or this build).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The operation is not allowed while a stream captures a graph.
    #[error("{0}")]
    Capture(String),
    /// A state error (a scope misuse, a handle used after its owner ended...).
    #[error("{0}")]
    InvalidState(String),
}

impl Error {
    /// The driver result code, when the error came from a driver call.
    pub fn driver_code(&self) -> Option<CUresult> {
        match self {
            Error::Driver(d) => Some(d.code),
            Error::OutOfMemory(o) => o.driver.map(|d| d.code),
            _ => None,
        }
    }

    /// Whether this is an out-of-memory error (from a pool or from the driver).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory(_))
            || self.driver_code() == Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY)
    }
}

impl From<DriverError> for Error {
    #[inline]
    fn from(e: DriverError) -> Self {
        Error::Driver(e)
    }
}

impl From<cuda_sys::result::NvrtcError> for Error {
    fn from(e: cuda_sys::result::NvrtcError) -> Self {
        Error::Compile(CompileError {
            call: e.call,
            code: e.code.0 as i32,
            name: match e.name {
                Some(name) => name.to_owned(),
                None => format!("NVRTC error {}", e.code.0),
            },
            source_name: None,
            log: String::new(),
        })
    }
}

impl From<cuda_sys::result::LibraryError> for Error {
    fn from(e: cuda_sys::result::LibraryError) -> Self {
        Error::Library {
            call: e.call,
            status: e.status,
            name: e.name,
        }
    }
}

/// The checked layer's errors (`cuda_sys::result`) as cuda-rt's, so that `?` works on
/// its calls.
impl From<cuda_sys::result::Error> for Error {
    #[inline]
    fn from(e: cuda_sys::result::Error) -> Self {
        match e {
            cuda_sys::result::Error::Driver(d) => Error::Driver(d),
            cuda_sys::result::Error::Load(l) => Error::Load(l),
            cuda_sys::result::Error::Nvrtc(n) => n.into(),
            cuda_sys::result::Error::Library(l) => l.into(),
            // `non_exhaustive`: an error of a later cuda-sys, in its own words.
            other => Error::InvalidState(other.to_string()),
        }
    }
}

/// `1536` as `1.50 KiB`, `0` as `0 B`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.2} {}", UNITS[u])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_error_says_call_name_and_description() {
        let e = Error::Driver(DriverError {
            call: "cuMemAlloc",
            code: CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY",
            description: "out of memory",
        });
        assert_eq!(
            e.to_string(),
            "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
        );
        assert!(e.is_out_of_memory());
    }

    #[test]
    fn out_of_memory_message_has_every_number() {
        let e = Error::OutOfMemory(Box::new(OutOfMemory {
            requested: 3 << 29,
            device: Some(0),
            in_use: 78 << 30,
            cached: 2 << 30,
            limit: Some(80 << 30),
            driver: None,
        }));
        assert_eq!(
            e.to_string(),
            "out of memory allocating 1.50 GiB on device 0: 78.00 GiB in use, 2.00 GiB cached \
             (released and retried), limit 80.00 GiB"
        );
    }

    #[test]
    fn compile_error_carries_source_name_and_log() {
        let e = Error::Compile(CompileError {
            call: "nvrtcCompileProgram",
            code: 6,
            name: "NVRTC_ERROR_COMPILATION".into(),
            source_name: Some("saxpy.cu".into()),
            log: "saxpy.cu(3): error: identifier \"y\" is undefined\n".into(),
        });
        assert_eq!(
            e.to_string(),
            "nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION (source saxpy.cu)\n\
             saxpy.cu(3): error: identifier \"y\" is undefined"
        );
    }

    #[test]
    fn invalid_device_names_the_valid_range() {
        let e = Error::InvalidDevice { id: 7, count: 1 };
        assert_eq!(
            e.to_string(),
            "invalid device id 7: 1 CUDA device(s) present (valid ids 0..1)"
        );
    }

    #[test]
    fn human_bytes_picks_the_unit() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.50 KiB");
        assert_eq!(human_bytes(141 << 30), "141.00 GiB");
    }
}
