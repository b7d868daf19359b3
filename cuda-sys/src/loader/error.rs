//! The loader's error: which library or symbol is missing, and where it was looked for.

use std::fmt;
use std::sync::Arc;

/// One place the loader tried, and why it did not work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// The path handed to the system loader (a bare file name means "the system loader's
    /// own search path").
    pub path: String,
    /// Why it failed, as the system loader said.
    pub reason: String,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadErrorKind {
    /// No candidate file could be opened.
    LibraryNotFound {
        /// The library, in words (e.g. `NVRTC (libnvrtc.so.13)`).
        library: String,
        /// The environment variable that names the library's path explicitly.
        override_var: &'static str,
        /// The pip package that installs the library, if pip provides it.
        pip_package: Option<&'static str>,
        /// Every path tried, in order.
        tried: Vec<Attempt>,
    },
    /// The library opened but lacks an entry point.
    SymbolNotFound {
        /// The library, in words.
        library: String,
        /// The file that was opened.
        path: String,
        /// The entry point asked for.
        symbol: String,
        /// What the system loader or `cuGetProcAddress` said.
        detail: String,
    },
    /// The CUDA driver opened but is older than the oldest one supported (CUDA 12.0):
    /// it lacks `cuGetProcAddress_v2`, or reports an older version.
    DriverTooOld {
        /// The library, in words.
        library: String,
        /// The file that was opened.
        path: String,
        /// The CUDA version the driver supports (`cuDriverGetVersion`, e.g. 11080),
        /// `None` when it could not be asked.
        version: Option<i32>,
        /// The oldest CUDA version accepted (12000).
        minimum: i32,
        /// Whether the driver exports `cuGetProcAddress_v2`.
        has_get_proc_address: bool,
    },
}

/// A library or an entry point could not be loaded. Cheap to clone; the loader caches it.
#[derive(Clone)]
pub struct LoadError(Arc<LoadErrorKind>);

impl LoadError {
    pub(crate) fn new(kind: LoadErrorKind) -> Self {
        LoadError(Arc::new(kind))
    }

    /// What went wrong, for callers that want the parts.
    pub fn kind(&self) -> &LoadErrorKind {
        &self.0
    }

    /// The entry point that was missing, if that is the error.
    pub fn symbol(&self) -> Option<&str> {
        match &*self.0 {
            LoadErrorKind::SymbolNotFound { symbol, .. } => Some(symbol),
            LoadErrorKind::LibraryNotFound { .. } | LoadErrorKind::DriverTooOld { .. } => None,
        }
    }
}

impl fmt::Debug for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            LoadErrorKind::LibraryNotFound {
                library,
                override_var,
                pip_package,
                tried,
            } => {
                // The remedy on the first line: it is the line a one-line report keeps.
                let install = match pip_package {
                    Some(p) => format!("pip install {p}, or "),
                    None => String::new(),
                };
                write!(
                    f,
                    "{library} not found ({install}set {override_var} to its file or folder); tried {} path{}:",
                    tried.len(),
                    if tried.len() == 1 { "" } else { "s" }
                )?;
                for a in tried {
                    write!(f, "\n  {}: {}", a.path, a.reason)?;
                }
                Ok(())
            }
            LoadErrorKind::SymbolNotFound {
                library,
                path,
                symbol,
                detail,
            } => write!(
                f,
                "symbol {symbol} not found in {library} ({path}): {detail}"
            ),
            LoadErrorKind::DriverTooOld {
                library,
                path,
                version,
                minimum,
                has_get_proc_address,
            } => {
                let version = match version {
                    Some(v) => format!("CUDA {}", crate::version::format_version(*v)),
                    None => "an unknown CUDA version (cuDriverGetVersion failed)".into(),
                };
                write!(
                    f,
                    "{library} at {path} is too old: it supports {version}, and cuda-rt needs a driver for CUDA {} or newer",
                    crate::version::format_version(*minimum)
                )?;
                if !has_get_proc_address {
                    write!(f, " (it lacks cuGetProcAddress_v2)")?;
                }
                write!(f, "; update the NVIDIA driver")
            }
        }
    }
}

impl std::error::Error for LoadError {}
