//! The checked layer's errors: a driver call's code with the driver's words for it, an
//! NVRTC status, a math library status, or a library that could not be loaded.

use std::fmt;

use crate::LoadError;

/// A CUDA driver call returned an error: the call and the driver's name and description
/// of the code, e.g. `cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory`.
///
/// `call` is the function's documented name: the ABI suffixes of the entry point
/// (`cuMemAlloc_v2`, `cuMemcpyHtoD_v2_ptds`) are stripped.
#[cfg(feature = "driver")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverError {
    /// The driver call that failed.
    pub call: &'static str,
    /// The raw result code.
    pub code: crate::driver::CUresult,
    /// `CUDA_ERROR_...`.
    pub name: &'static str,
    /// The driver's description, e.g. `out of memory`.
    pub description: &'static str,
}

#[cfg(feature = "driver")]
impl DriverError {
    /// The error for `code` returned by `call`, with the driver's name and description
    /// of the code (`cuGetErrorName`, `cuGetErrorString`), or `CUDA_ERROR_UNRECOGNIZED`
    /// and `unrecognized CUDA error code` when the driver does not know it.
    #[cold]
    pub fn new(code: crate::driver::CUresult, call: &'static str) -> DriverError {
        DriverError {
            call: strip_abi_suffix(call),
            code,
            name: super::driver_calls::error_text(code, true).unwrap_or("CUDA_ERROR_UNRECOGNIZED"),
            description: super::driver_calls::error_text(code, false)
                .unwrap_or("unrecognized CUDA error code"),
        }
    }
}

#[cfg(feature = "driver")]
impl fmt::Display for DriverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {}: {}",
            self.call, self.name, self.description
        )
    }
}

#[cfg(feature = "driver")]
impl std::error::Error for DriverError {}

/// An NVRTC call returned an error: the call and NVRTC's name of the status, e.g.
/// `nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION`. (The compile log is the
/// program's: [`nvrtc::get_program_log`](super::nvrtc::get_program_log).)
#[cfg(feature = "nvrtc")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvrtcError {
    /// The NVRTC call that failed.
    pub call: &'static str,
    /// NVRTC's status.
    pub code: crate::nvrtc::nvrtcResult,
    /// NVRTC's name of the status (`nvrtcGetErrorString`), e.g.
    /// `NVRTC_ERROR_COMPILATION`; `None` when NVRTC gave none.
    pub name: Option<&'static str>,
}

#[cfg(feature = "nvrtc")]
impl NvrtcError {
    /// The error for `code` returned by `call`, with NVRTC's name of it.
    #[cold]
    pub fn new(code: crate::nvrtc::nvrtcResult, call: &'static str) -> NvrtcError {
        NvrtcError {
            call,
            code,
            name: super::nvrtc::get_error_string(code),
        }
    }
}

#[cfg(feature = "nvrtc")]
impl fmt::Display for NvrtcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name {
            Some(name) => write!(f, "{} failed: {name}", self.call),
            None => write!(f, "{} failed: NVRTC error {}", self.call, self.code.0),
        }
    }
}

#[cfg(feature = "nvrtc")]
impl std::error::Error for NvrtcError {}

/// A math library call (cuBLAS, cuSOLVER, cuSPARSE, cuRAND) returned a status other
/// than success, e.g. `cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1):
/// initialization error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LibraryError {
    /// The call that failed.
    pub call: &'static str,
    /// The library's status code.
    pub status: i32,
    /// The status's name ([`cublas_status_name`](super::cublas_status_name) and the
    /// like).
    pub name: &'static str,
    /// The library's words for the status, as CuPy's messages carry them: from the
    /// library (`cublasGetStatusString`, `cusparseGetErrorString`) or, for cuSOLVER and
    /// cuRAND, which have no such function, from their documentation. `None` when the
    /// library cannot say (an older one without the function).
    pub description: Option<&'static str>,
}

impl fmt::Display for LibraryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.status)?;
        if let Some(d) = self.description {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

impl std::error::Error for LibraryError {}

/// An NCCL call returned a status other than success, e.g. `ncclCommInitRank failed:
/// ncclInvalidArgument (4): invalid argument (run with NCCL_DEBUG=WARN for details);
/// last error: Invalid rank requested : 3/2`.
#[cfg(feature = "nccl")]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The NCCL call that failed.
    pub call: &'static str,
    /// NCCL's status (`ncclResult_t`).
    pub status: u32,
    /// The status's name, e.g. `ncclInvalidArgument`
    /// ([`nccl::status_name`](super::nccl::status_name)).
    pub name: &'static str,
    /// NCCL's words for the status (`ncclGetErrorString`), when NCCL gave them.
    pub description: Option<&'static str>,
    /// The thread's last NCCL error message (`ncclGetLastError`), when there was one.
    pub last_error: Option<String>,
}

#[cfg(feature = "nccl")]
impl NcclError {
    /// The error for `status` returned by `call`, with NCCL's words for it and the
    /// thread's last error message.
    #[cold]
    pub fn new(status: u32, call: &'static str) -> NcclError {
        NcclError {
            call,
            status,
            name: super::nccl::status_name(status),
            description: super::nccl::get_error_string(status),
            last_error: super::nccl::get_last_error(),
        }
    }
}

#[cfg(feature = "nccl")]
impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {} ({})", self.call, self.name, self.status)?;
        if let Some(d) = self.description {
            write!(f, ": {d}")?;
        }
        if let Some(l) = &self.last_error {
            write!(f, "; last error: {l}")?;
        }
        Ok(())
    }
}

#[cfg(feature = "nccl")]
impl std::error::Error for NcclError {}

/// Everything a call of the checked layer can return: the call's own error, or the
/// library (or entry point) that could not be loaded.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA driver call returned an error.
    #[cfg(feature = "driver")]
    Driver(DriverError),
    /// An NVRTC call returned an error.
    #[cfg(feature = "nvrtc")]
    Nvrtc(NvrtcError),
    /// A math library call returned an error status.
    Library(LibraryError),
    /// An NCCL call returned an error status.
    #[cfg(feature = "nccl")]
    Nccl(NcclError),
    /// The library or the entry point could not be loaded (names every path tried).
    Load(LoadError),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            #[cfg(feature = "driver")]
            Error::Driver(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "nvrtc")]
            Error::Nvrtc(e) => fmt::Display::fmt(e, f),
            Error::Library(e) => fmt::Display::fmt(e, f),
            #[cfg(feature = "nccl")]
            Error::Nccl(e) => fmt::Display::fmt(e, f),
            Error::Load(e) => fmt::Display::fmt(e, f),
        }
    }
}

impl std::error::Error for Error {}

impl From<LoadError> for Error {
    #[inline]
    fn from(e: LoadError) -> Self {
        Error::Load(e)
    }
}

#[cfg(feature = "driver")]
impl From<DriverError> for Error {
    #[inline]
    fn from(e: DriverError) -> Self {
        Error::Driver(e)
    }
}

#[cfg(feature = "nvrtc")]
impl From<NvrtcError> for Error {
    #[inline]
    fn from(e: NvrtcError) -> Self {
        Error::Nvrtc(e)
    }
}

#[cfg(feature = "nccl")]
impl From<NcclError> for Error {
    #[inline]
    fn from(e: NcclError) -> Self {
        Error::Nccl(e)
    }
}

impl From<LibraryError> for Error {
    #[inline]
    fn from(e: LibraryError) -> Self {
        Error::Library(e)
    }
}

/// `cuMemAlloc_v2` -> `cuMemAlloc`, `cuMemcpyHtoD_v2_ptds` -> `cuMemcpyHtoD`: users
/// know a call by its documented name, not by its entry point's ABI suffix.
pub fn strip_abi_suffix(call: &'static str) -> &'static str {
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
