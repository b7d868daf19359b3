//! The one error type of cuda-rt: every failure says what failed in words a user can act on.
//!
//! # Matching on errors
//! [`Error`] has one variant per kind of failure, and each carries what a program
//! needs to tell failures apart without reading the text:
//! - [`Error::Driver`]: the driver call and its code ([`DriverError`]); also
//!   [`Error::driver_code`], which sees through the variants that keep one.
//! - [`Error::OutOfMemory`]: an [`OutOfMemory`] with requested, in-use, cached and
//!   limit bytes and what refused ([`OutOfMemoryCause`]). One type for every
//!   allocation cuda-rt makes: the caching pools of device and pinned memory (and the
//!   [`arena`](crate::memory::arena) algorithm under them), `cuMemAlloc`, and the
//!   driver's stream-ordered pools.
//! - [`Error::NotAvailable`]: why CUDA cannot be used at all ([`Unavailable`], which
//!   [`availability`](crate::availability) returns too).
//! - [`Error::InvalidArgument`], [`Error::InvalidState`], [`Error::Capture`] and
//!   [`Error::NotSupported`] are each a `kind` and a `message`, as
//!   [`std::io::Error`] is a [`kind()`](std::io::Error::kind) and a message: the kind
//!   ([`ArgumentKind`], [`StateKind`], [`CaptureKind`], [`UnsupportedKind`]) is for
//!   programs, and carries the numbers where they are the point (the bytes asked for
//!   and the bytes there are, the two devices that differ); the message is for people,
//!   names the call and the values, and is what [`Display`](fmt::Display) prints.
//!   Kinds are `#[non_exhaustive]`: new ones may come, so match them with a wildcard
//!   arm. Messages may be reworded in any release; never parse them.
//!
//! ```
//! use cuda_rt::error::{ArgumentKind, Error};
//!
//! fn explain(e: &Error) -> String {
//!     match e {
//!         Error::InvalidArgument {
//!             kind: ArgumentKind::OutOfBounds { requested, available },
//!             ..
//!         } => format!("{requested} bytes asked for, {available} there"),
//!         Error::OutOfMemory(o) => format!("out of memory: {} bytes in use", o.in_use),
//!         other => other.to_string(),
//!     }
//! }
//! let e = Error::invalid_argument(
//!     ArgumentKind::OutOfBounds { requested: 65, available: 64 },
//!     "copy_from_host: 65 bytes do not fit",
//! );
//! assert_eq!(explain(&e), "65 bytes asked for, 64 there");
//! assert_eq!(e.to_string(), "invalid argument: copy_from_host: 65 bytes do not fit");
//! ```
//!
//! Errors are built on cold paths only: a variant with a message allocates it there,
//! never on a hot path that succeeds.

use std::fmt;

use cuda_sys::driver::CUresult;
use cuda_sys::{CudaVersion, LoadError, LoadErrorKind};

mod capture;
mod kind;

pub(crate) use capture::{explain_capture, is_capture_code};
pub use kind::{ArgumentKind, BootstrapKind, CaptureKind, StateKind, UnsupportedKind};

/// `Result` with cuda-rt's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// A CUDA driver error: the call that failed and the driver's name and description of
/// the code, e.g. `cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory`. It is
/// the checked layer's own error, [`cuda_sys::result::DriverError`].
pub use cuda_sys::result::DriverError;

/// Out of memory, with the numbers that explain it: the one out-of-memory type of
/// cuda-rt, for device and pinned pools (and the [`arena`](crate::memory::arena)
/// algorithm under them), for `cuMemAlloc` and for the driver's stream-ordered pools.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutOfMemory {
    /// What the caller asked for, in bytes.
    pub requested: u64,
    /// The request as the allocator rounds it (a pool: up to a multiple of 512 bytes;
    /// an allocator that does not round: `requested`), or `None` when rounding up
    /// overflowed.
    pub rounded: Option<u64>,
    /// The device, or `None` for host memory: pinned memory, or the memory of an
    /// arena pool over a host backend.
    pub device: Option<i32>,
    /// Bytes handed out by the pool when it failed.
    pub in_use: u64,
    /// Bytes cached (reserved but free) when it failed; for a caching pool, after it
    /// gave back what it could and retried.
    pub cached: u64,
    /// The pool's limit, if one is set.
    pub limit: Option<u64>,
    /// What refused the memory: the limit, the driver, or a pool's backend.
    pub cause: OutOfMemoryCause,
}

/// What refused an allocation that ended as [`OutOfMemory`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutOfMemoryCause {
    /// The pool's limit: the request would take the pool's reserved bytes past it.
    /// Raising the limit (or freeing memory of the pool) can help.
    Limit,
    /// The driver has no memory left (`CUDA_ERROR_OUT_OF_MEMORY`): its error.
    Driver(DriverError),
    /// A pool's backend had no memory left and no driver error to give (the host
    /// backends of the [`arena`](crate::memory::arena) algorithm), or no memory could
    /// hold the request (rounding it up overflowed: [`OutOfMemory::rounded`] is
    /// `None`).
    Backend,
}

impl OutOfMemory {
    /// The driver's error, when the driver refused.
    pub fn driver(&self) -> Option<&DriverError> {
        match &self.cause {
            OutOfMemoryCause::Driver(d) => Some(d),
            OutOfMemoryCause::Limit | OutOfMemoryCause::Backend => None,
        }
    }
}

impl fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("out of memory allocating ")?;
        match self.rounded {
            Some(r) if r == self.requested => write!(f, "{}", human_bytes(r))?,
            Some(r) => write!(f, "{} ({} bytes asked for)", human_bytes(r), self.requested)?,
            None => write!(
                f,
                "{} bytes (too many to round up to the allocation unit)",
                self.requested
            )?,
        }
        match self.device {
            Some(d) => write!(f, " on device {d}")?,
            None => write!(f, " of host memory")?,
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
        match &self.cause {
            OutOfMemoryCause::Limit => write!(f, "; the request would pass the limit"),
            OutOfMemoryCause::Driver(d) => write!(f, " ({d})"),
            OutOfMemoryCause::Backend => write!(f, "; the backend has no more memory"),
        }
    }
}

impl std::error::Error for OutOfMemory {}

/// Why CUDA cannot be used on this machine: what [`availability`](crate::availability)
/// returns, and what [`Error::NotAvailable`] carries.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Unavailable {
    /// The driver library (`libcuda.so.1`) could not be loaded, or lacks an entry
    /// point cuda-rt needs: no NVIDIA driver is installed, or not where the loader
    /// looks. The [`LoadError`] names every path tried.
    #[error("{0}")]
    NoDriver(LoadError),
    /// The driver loaded but is older than cuda-rt supports.
    #[error("{error}")]
    DriverTooOld {
        /// The CUDA version the driver supports, `None` when it could not be asked.
        version: Option<CudaVersion>,
        /// The oldest CUDA version cuda-rt supports.
        minimum: CudaVersion,
        /// The loader's error, which names the library and its path.
        error: LoadError,
    },
    /// A driver call that starts CUDA (`cuInit`, `cuDeviceGetCount`) failed, e.g.
    /// `CUDA_ERROR_NO_DEVICE` (no GPU, or none visible) or
    /// `CUDA_ERROR_INSUFFICIENT_DRIVER` (the kernel module is older than the library).
    #[error("{0}")]
    Driver(DriverError),
    /// The driver started and reports no device.
    #[error("the CUDA driver reports no device")]
    NoDevice,
    /// Another failure while starting CUDA (none is expected: loading the driver and
    /// `cuInit` fail only in the ways above).
    #[error("{0}")]
    Other(Box<Error>),
}

impl Unavailable {
    /// Why the failure `e` of loading or starting the driver makes CUDA unusable.
    pub(crate) fn from_error(e: Error) -> Unavailable {
        match e {
            Error::Load(l) => Unavailable::from_load(l),
            Error::Driver(d) => Unavailable::Driver(d),
            other => Unavailable::Other(Box::new(other)),
        }
    }

    fn from_load(l: LoadError) -> Unavailable {
        match l.kind() {
            LoadErrorKind::DriverTooOld {
                version, minimum, ..
            } => Unavailable::DriverTooOld {
                version: version.and_then(CudaVersion::from_int),
                // The loader's minimum is a constant (12000): never negative.
                minimum: CudaVersion::from_int(*minimum)
                    .unwrap_or(CudaVersion { major: 0, minor: 0 }),
                error: l.clone(),
            },
            _ => Unavailable::NoDriver(l),
        }
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
        if let Some(hint) = missing_header_hint(&self.log) {
            write!(f, "\n{hint}")?;
        }
        Ok(())
    }
}

/// For a log where NVRTC could not open a CUDA toolkit or CCCL header: which pip package
/// brings it, since "not found" alone does not say what to install.
fn missing_header_hint(log: &str) -> Option<String> {
    // NVRTC 12 and 13 say "could not", older ones "cannot".
    let after = [
        "could not open source file \"",
        "cannot open source file \"",
    ]
    .iter()
    .find_map(|m| log.split_once(m))?
    .1;
    let header = after.split('"').next()?;
    // CCCL: CUB, Thrust, libcu++ (`cuda/std/...`, `cuda/...`), nv/target.
    let cccl = ["cub/", "thrust/", "cuda/", "nv/"]
        .iter()
        .any(|p| header.starts_with(p));
    let toolkit = header.starts_with("cooperative_groups")
        || header.starts_with("cuda_")
        || header.starts_with("cuda.h")
        || header.starts_with("crt/")
        || header.starts_with("sm_")
        || header.starts_with("vector_")
        || header.starts_with("curand");
    let package = if cccl {
        "nvidia-cuda-cccl"
    } else if toolkit {
        "nvidia-cuda-runtime"
    } else {
        return None;
    };
    Some(format!(
        "note: {header:?} is a CUDA header NVRTC did not find: install the CUDA toolkit, or \
         pip install {package} (and nvidia-cuda-runtime, which it builds on), or name the \
         folders in {}",
        crate::compiler::toolkit::INCLUDE_PATH_VAR
    ))
}

/// Everything that can go wrong in cuda-rt. See the [module documentation](self) for
/// how to match on it.
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
    /// A math library (cuBLAS, cuSOLVER, cuSPARSE, cuRAND) call failed, e.g.
    /// `cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1): initialization
    /// error`.
    #[error("{call} failed: {name} ({status}){}", description_suffix(*.description))]
    Library {
        /// The call that failed.
        call: &'static str,
        /// The library's status code.
        status: i32,
        /// The status's name.
        name: &'static str,
        /// The library's words for the status (see
        /// [`LibraryError::description`](cuda_sys::result::LibraryError::description));
        /// `None` when it cannot say.
        description: Option<&'static str>,
    },
    /// An NCCL call failed: the call, NCCL's status name and words, and its last error
    /// message.
    #[error("{0}")]
    Nccl(cuda_sys::result::NcclError),
    /// Ranks could not exchange a communicator's id
    /// ([`nccl::bootstrap`](crate::nccl::bootstrap)).
    #[error("NCCL bootstrap: {message}")]
    Bootstrap {
        /// What went wrong, for programs.
        kind: BootstrapKind,
        /// The rank, the address, the deadline and what happened, for people.
        message: String,
    },
    /// Out of memory, with requested, in-use, cached and limit bytes.
    #[error("{0}")]
    OutOfMemory(Box<OutOfMemory>),
    /// A bad argument.
    #[error("invalid argument: {message}")]
    InvalidArgument {
        /// What is wrong with it, for programs.
        kind: ArgumentKind,
        /// The call, the argument and its value, for people.
        message: String,
    },
    /// A device id that does not exist.
    #[error("invalid device id {id}: {count} CUDA device(s) present (valid ids 0..{count})")]
    InvalidDevice {
        /// The id asked for.
        id: i32,
        /// How many devices there are.
        count: i32,
    },
    /// CUDA is not usable on this machine.
    #[error("CUDA is not available: {0}")]
    NotAvailable(#[from] Unavailable),
    /// The operation is not supported (by CUDA, this driver, this device or this
    /// build).
    #[error("not supported: {message}")]
    NotSupported {
        /// What is missing, for programs.
        kind: UnsupportedKind,
        /// What was asked and why it cannot be done, for people.
        message: String,
    },
    /// The operation is not allowed while a stream captures a graph, or a capture
    /// went wrong.
    #[error("{message}")]
    Capture {
        /// What went wrong, for programs.
        kind: CaptureKind,
        /// The call, the stream and what to do, for people.
        message: String,
    },
    /// A state error (an object shared that must be unique, an event not recorded, a
    /// scope misuse...).
    #[error("{message}")]
    InvalidState {
        /// What is wrong, for programs.
        kind: StateKind,
        /// The call and the state it found, for people.
        message: String,
    },
}

impl Error {
    /// An [`Error::InvalidArgument`].
    #[cold]
    pub fn invalid_argument(kind: ArgumentKind, message: impl Into<String>) -> Error {
        Error::InvalidArgument {
            kind,
            message: message.into(),
        }
    }

    /// An [`Error::InvalidState`].
    #[cold]
    pub fn invalid_state(kind: StateKind, message: impl Into<String>) -> Error {
        Error::InvalidState {
            kind,
            message: message.into(),
        }
    }

    /// An [`Error::Capture`].
    #[cold]
    pub fn capture(kind: CaptureKind, message: impl Into<String>) -> Error {
        Error::Capture {
            kind,
            message: message.into(),
        }
    }

    /// An [`Error::NotSupported`].
    #[cold]
    pub fn not_supported(kind: UnsupportedKind, message: impl Into<String>) -> Error {
        Error::NotSupported {
            kind,
            message: message.into(),
        }
    }

    /// The driver result code, when the error came from a driver call.
    pub fn driver_code(&self) -> Option<CUresult> {
        match self {
            Error::Driver(d) => Some(d.code),
            Error::OutOfMemory(o) => o.driver().map(|d| d.code),
            Error::NotAvailable(Unavailable::Driver(d)) => Some(d.code),
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

/// `": <description>"`, or nothing: how [`Error::Library`] shows its description.
fn description_suffix(description: Option<&'static str>) -> String {
    description.map(|d| format!(": {d}")).unwrap_or_default()
}

impl From<cuda_sys::result::LibraryError> for Error {
    fn from(e: cuda_sys::result::LibraryError) -> Self {
        Error::Library {
            call: e.call,
            status: e.status,
            name: e.name,
            description: e.description,
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
            cuda_sys::result::Error::Nccl(n) => Error::Nccl(n),
            // `non_exhaustive`: an error of a later cuda-sys, in its own words.
            other => Error::invalid_state(StateKind::Unexpected, other.to_string()),
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
    fn a_library_error_carries_the_librarys_words_when_it_has_them() {
        let mut e = cuda_sys::result::LibraryError {
            call: "cusparseCreate",
            status: 1,
            name: "CUSPARSE_STATUS_NOT_INITIALIZED",
            description: Some("initialization error"),
        };
        assert_eq!(
            Error::from(e).to_string(),
            "cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1): initialization error"
        );
        e.description = None;
        assert_eq!(
            Error::from(e).to_string(),
            "cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1)"
        );
    }

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
            rounded: Some(3 << 29),
            device: Some(0),
            in_use: 78 << 30,
            cached: 2 << 30,
            limit: Some(80 << 30),
            cause: OutOfMemoryCause::Limit,
        }));
        assert_eq!(
            e.to_string(),
            "out of memory allocating 1.50 GiB on device 0: 78.00 GiB in use, 2.00 GiB cached \
             (released and retried), limit 80.00 GiB; the request would pass the limit"
        );
        assert!(e.is_out_of_memory());
        assert_eq!(e.driver_code(), None);
    }

    #[test]
    fn out_of_memory_names_the_rounding_the_host_and_the_driver() {
        let driver = DriverError {
            call: "cuMemHostAlloc",
            code: CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY",
            description: "out of memory",
        };
        let o = OutOfMemory {
            requested: 1000,
            rounded: Some(1024),
            device: None,
            in_use: 0,
            cached: 0,
            limit: None,
            cause: OutOfMemoryCause::Driver(driver),
        };
        assert_eq!(o.driver(), Some(&driver));
        assert_eq!(
            o.to_string(),
            "out of memory allocating 1.00 KiB (1000 bytes asked for) of host memory: 0 B in \
             use, 0 B cached (released and retried), no limit set (cuMemHostAlloc failed: \
             CUDA_ERROR_OUT_OF_MEMORY: out of memory)"
        );
        let e = Error::OutOfMemory(Box::new(o));
        assert_eq!(e.driver_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        let huge = OutOfMemory {
            requested: u64::MAX,
            rounded: None,
            device: Some(1),
            in_use: 0,
            cached: 0,
            limit: None,
            cause: OutOfMemoryCause::Backend,
        };
        let s = huge.to_string();
        assert!(
            s.contains("18446744073709551615 bytes (too many to round up"),
            "{s}"
        );
        assert!(s.ends_with("; the backend has no more memory"), "{s}");
    }

    #[test]
    fn kinds_are_matched_and_messages_displayed() {
        let e = Error::invalid_argument(
            ArgumentKind::WrongDevice {
                expected: 0,
                found: 1,
            },
            "stream of device 1 used with the async pool of device 0",
        );
        assert!(matches!(
            e,
            Error::InvalidArgument {
                kind: ArgumentKind::WrongDevice {
                    expected: 0,
                    found: 1
                },
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "invalid argument: stream of device 1 used with the async pool of device 0"
        );
        let e = Error::invalid_state(StateKind::NotReady, "an event has not completed");
        assert_eq!(e.to_string(), "an event has not completed");
        let e = Error::capture(CaptureKind::Refused, "x: the stream is capturing");
        assert_eq!(e.to_string(), "x: the stream is capturing");
        let e = Error::not_supported(UnsupportedKind::Removed, "texture references");
        assert_eq!(e.to_string(), "not supported: texture references");
    }

    #[test]
    fn unavailable_says_why_and_keeps_the_driver_code() {
        let e = Error::from(Unavailable::NoDevice);
        assert_eq!(
            e.to_string(),
            "CUDA is not available: the CUDA driver reports no device"
        );
        let d = DriverError {
            call: "cuInit",
            code: CUresult::CUDA_ERROR_NO_DEVICE,
            name: "CUDA_ERROR_NO_DEVICE",
            description: "no CUDA-capable device is detected",
        };
        let u = Unavailable::from_error(Error::Driver(d));
        assert!(matches!(u, Unavailable::Driver(x) if x == d), "{u:?}");
        assert_eq!(
            Error::from(u).driver_code(),
            Some(CUresult::CUDA_ERROR_NO_DEVICE)
        );
        let other = Unavailable::from_error(Error::invalid_state(StateKind::Other, "odd"));
        assert_eq!(other.to_string(), "odd");
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
    fn a_missing_cccl_or_toolkit_header_names_the_pip_package() {
        let log =
            |h: &str| format!("k.cu(1): catastrophic error: cannot open source file \"{h}\"\n");
        let e = |h: &str| {
            Error::Compile(CompileError {
                call: "nvrtcCompileProgram",
                code: 6,
                name: "NVRTC_ERROR_COMPILATION".into(),
                source_name: Some("k.cu".into()),
                log: log(h),
            })
            .to_string()
        };
        let cub = e("cub/cub.cuh");
        assert!(
            cub.ends_with(
                "note: \"cub/cub.cuh\" is a CUDA header NVRTC did not find: install the CUDA \
             toolkit, or pip install nvidia-cuda-cccl (and nvidia-cuda-runtime, which it \
             builds on), or name the folders in CUDA_RT_INCLUDE_PATH"
            ),
            "{cub}"
        );
        assert!(e("cuda/std/array").contains("pip install nvidia-cuda-cccl"));
        let newer = CompileError {
            call: "nvrtcCompileProgram",
            code: 6,
            name: "NVRTC_ERROR_COMPILATION".into(),
            source_name: None,
            log: "k.cu(1): catastrophic error: could not open source file \"thrust/sort.h\" \
                  (no directories in search list)\n"
                .into(),
        };
        assert!(newer.to_string().contains("pip install nvidia-cuda-cccl"));
        assert!(e("cooperative_groups.h").contains("pip install nvidia-cuda-runtime "));
        // A user's own header: no hint.
        assert!(!e("my_kernels.cuh").contains("note:"));
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

    fn capture_driver_error(code: CUresult) -> Error {
        Error::Driver(DriverError {
            call: "cuStreamSynchronize",
            code,
            name: "CUDA_ERROR_X",
            description: "x",
        })
    }

    #[test]
    fn capture_errors_are_explained_in_words() {
        let e = explain_capture(
            capture_driver_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
            "synchronize",
        );
        assert!(matches!(
            e,
            Error::Capture {
                kind: CaptureKind::Invalidated,
                ..
            }
        ));
        let s = e.to_string();
        assert!(s.starts_with("synchronize: "), "{s}");
        assert!(s.contains("capture is now invalid"), "{s}");
        let e = explain_capture(
            capture_driver_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNJOINED),
            "end_capture",
        );
        assert!(e.to_string().contains("never joined back"), "{e}");
        assert!(matches!(
            e,
            Error::Capture {
                kind: CaptureKind::Unjoined,
                ..
            }
        ));
        let e = explain_capture(
            capture_driver_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED),
            "end_capture",
        );
        assert!(e.to_string().contains("invalidated"), "{e}");
        assert!(matches!(
            e,
            Error::Capture {
                kind: CaptureKind::Invalidated,
                ..
            }
        ));
        let e = explain_capture(
            capture_driver_error(CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT),
            "memcpy",
        );
        assert!(matches!(
            e,
            Error::Capture {
                kind: CaptureKind::LegacyStream,
                ..
            }
        ));
    }

    #[test]
    fn other_errors_pass_unchanged() {
        let e = explain_capture(
            capture_driver_error(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            "x",
        );
        assert!(matches!(e, Error::Driver(_)));
        let e = explain_capture(Error::invalid_argument(ArgumentKind::Other, "y"), "x");
        assert!(matches!(e, Error::InvalidArgument { .. }));
    }
}
