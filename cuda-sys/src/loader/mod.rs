//! Opening CUDA libraries at run time and resolving their entry points.
//!
//! Nothing is linked at build time. Each library is found by the search of [`search`],
//! opened once per process and kept open for the life of the process (unloading CUDA
//! while handles may still exist is never safe). Driver entry points are resolved with
//! `cuGetProcAddress`, asking for the exact ABI version the 13.0 headers declare, so one
//! build runs against 12.x and 13.x drivers: a function whose signature changed in a
//! newer CUDA than the driver supports is an error naming it, never a mismatched call.
//!
//! Two things are refused before they can hurt:
//! - a candidate path that exists but is not a regular file (a FIFO, a socket, a
//!   device, a folder where a file is expected): the system loader would open it and
//!   could block forever on a FIFO. Override variables must name a library file or a
//!   folder holding one ([`search`]);
//! - a driver older than CUDA 12.0 ([`MIN_DRIVER_VERSION`]): it has no
//!   `cuGetProcAddress_v2`, so entry points could not be asked for by ABI version.

mod error;
pub mod search;
pub mod specs;

use std::ffi::{c_char, c_int, c_void, CString};
use std::path::Path;

pub use error::{Attempt, LoadError, LoadErrorKind};
use search::{Candidate, SearchEnv, Source};

/// How a library's entry points are resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `dlsym` by name.
    Plain,
    /// The CUDA driver: `cuGetProcAddress` with an explicit version.
    Driver,
}

/// Static description of a library: its file names and where to look.
#[derive(Debug)]
pub struct LibrarySpec {
    /// The library in words, e.g. `NVRTC`.
    pub name: &'static str,
    /// File names to try, newest soname first.
    pub files: &'static [&'static str],
    /// The environment variable naming the library's file (or a folder holding it).
    pub override_var: &'static str,
    /// Folders under a site-packages folder where the Python wheels put the library.
    pub wheel_dirs: &'static [&'static str],
    /// How entry points are resolved.
    pub kind: Kind,
    /// The pip package that installs the library (`nvidia-cuda-nvrtc`), named by the
    /// "not found" error; `None` when pip does not provide it (the driver).
    pub pip_package: Option<&'static str>,
}

impl LibrarySpec {
    fn label(&self) -> String {
        format!("{} ({})", self.name, self.files.join(" or "))
    }
}

/// `cuGetProcAddress_v2`, declared by hand because the loader must not depend on the
/// generated driver module (which a user may turn off).
type GetProcAddress =
    unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut u32) -> u32;
type DriverGetVersion = unsafe extern "C" fn(*mut c_int) -> u32;

/// CUDA version of the 13.0 headers, asked for entry points not in the version table.
pub const HEADER_CUDA_VERSION: i32 = 13000;
/// The oldest driver accepted: CUDA 12.0, the first with `cuGetProcAddress_v2`
/// (cuda-rt supports CUDA 12.x and 13.x).
pub const MIN_DRIVER_VERSION: i32 = 12000;
const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// An opened library.
pub struct Library {
    spec: &'static LibrarySpec,
    path: String,
    lib: libloading::Library,
    get_proc: Option<GetProcAddress>,
    driver_version: Option<i32>,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("name", &self.spec.name)
            .field("path", &self.path)
            .finish()
    }
}

impl Library {
    /// Finds and opens `spec` with the process's environment, and keeps it open for the
    /// life of the process. Each call opens anew: callers cache the result (every
    /// generated module's `api()` does).
    pub fn open(spec: &'static LibrarySpec) -> Result<&'static Library, LoadError> {
        let lib = Self::open_with(spec, &SearchEnv::from_process(spec))?;
        Ok(Box::leak(Box::new(lib)))
    }

    /// Finds and opens `spec` with the given environment (tests use fake folders).
    pub fn open_with(spec: &'static LibrarySpec, env: &SearchEnv) -> Result<Library, LoadError> {
        let mut tried = Vec::new();
        for Candidate { path, source } in search::candidates(spec, env) {
            let shown = path.display().to_string();
            // A bare name is the system loader's to find; a path is checked first, so
            // that a FIFO (or another special file) is never handed to dlopen.
            if source != Source::SystemLoader {
                if let Some(reason) = not_a_regular_file(&path, source, spec) {
                    tried.push(Attempt {
                        path: shown,
                        reason,
                    });
                    continue;
                }
            }
            // SAFETY: opening a CUDA library runs its initialisers, which have no
            // preconditions; the handle is kept for as long as symbols are used.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => return Self::from_parts(spec, shown, lib).supported(),
                Err(e) => {
                    let reason = loader_reason(&e);
                    // dlerror repeats the path; say it once.
                    let reason = match reason.strip_prefix(shown.as_str()) {
                        Some(r) => r.trim_start_matches(": ").to_string(),
                        None => reason,
                    };
                    tried.push(Attempt {
                        path: shown,
                        reason,
                    })
                }
            }
        }
        Err(LoadError::new(LoadErrorKind::LibraryNotFound {
            library: spec.label(),
            override_var: spec.override_var,
            pip_package: spec.pip_package,
            tried,
        }))
    }

    fn from_parts(spec: &'static LibrarySpec, path: String, lib: libloading::Library) -> Self {
        let mut me = Library {
            spec,
            path,
            lib,
            get_proc: None,
            driver_version: None,
        };
        if spec.kind == Kind::Driver {
            if let Ok(p) = me.dlsym("cuGetProcAddress_v2") {
                // SAFETY: cuGetProcAddress_v2 has this C signature in every driver that
                // exports it (CUDA 12.0 and later).
                me.get_proc =
                    Some(unsafe { std::mem::transmute::<*mut c_void, GetProcAddress>(p) });
            }
            if let Ok(p) = me.dlsym("cuDriverGetVersion") {
                // SAFETY: cuDriverGetVersion(int*) has had this signature since CUDA 2.2.
                let f = unsafe { std::mem::transmute::<*mut c_void, DriverGetVersion>(p) };
                let mut v: c_int = 0;
                // SAFETY: `v` is a valid out pointer; the call needs no initialisation.
                if unsafe { f(&mut v) } == 0 {
                    me.driver_version = Some(v);
                }
            }
        }
        me
    }

    /// The library itself, or the error that refuses it: a driver without
    /// `cuGetProcAddress_v2`, or reporting a version older than
    /// [`MIN_DRIVER_VERSION`].
    fn supported(self) -> Result<Library, LoadError> {
        if self.spec.kind != Kind::Driver {
            return Ok(self);
        }
        let has_get_proc_address = self.get_proc.is_some();
        match self.driver_version {
            Some(v) if has_get_proc_address && v >= MIN_DRIVER_VERSION => Ok(self),
            // cuDriverGetVersion failed: cuGetProcAddress_v2 says 12.0 or newer.
            None if has_get_proc_address => Ok(self),
            version => Err(LoadError::new(LoadErrorKind::DriverTooOld {
                library: self.spec.label(),
                path: self.path.clone(),
                version,
                minimum: MIN_DRIVER_VERSION,
                has_get_proc_address,
            })),
        }
    }

    /// The file that was opened (a bare name when the system loader found it).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file the library was loaded from: [`path`](Self::path) when that names a
    /// file, and for a bare name the path the system loader found for it (as the
    /// loader recorded it, e.g. `/lib/x86_64-linux-gnu/libcuda.so.1`), or the bare
    /// name when that cannot be told.
    pub fn file(&self) -> String {
        if self.path.contains('/') {
            return self.path.clone();
        }
        loaded_object_named(&self.path).unwrap_or_else(|| self.path.clone())
    }

    /// The library's description.
    pub fn spec(&self) -> &'static LibrarySpec {
        self.spec
    }

    /// For the driver: the CUDA version it supports (`cuDriverGetVersion`), e.g. 13000.
    pub fn driver_version(&self) -> Option<i32> {
        self.driver_version
    }

    /// The address of entry point `name` (non-null), or an error naming it.
    pub fn resolve(&self, name: &str) -> Result<*mut c_void, LoadError> {
        match (self.spec.kind, self.get_proc) {
            (Kind::Driver, Some(gpa)) if name != "cuGetProcAddress_v2" => {
                self.driver_proc_address(gpa, name)
            }
            _ => self.dlsym(name),
        }
    }

    fn dlsym(&self, name: &str) -> Result<*mut c_void, LoadError> {
        // SAFETY: the symbol is read as an untyped address; the caller gives it its type.
        let found = unsafe { self.lib.get::<*mut c_void>(name.as_bytes()) };
        match found {
            Ok(sym) if !(*sym).is_null() => Ok(*sym),
            Ok(_) => Err(self.missing(name, "the symbol's address is null".into())),
            Err(e) => Err(self.missing(name, loader_reason(&e))),
        }
    }

    fn driver_proc_address(
        &self,
        gpa: GetProcAddress,
        name: &str,
    ) -> Result<*mut c_void, LoadError> {
        let sym = DriverSymbol::parse(name);
        let c_base = CString::new(sym.base)
            .map_err(|_| self.missing(name, "the name contains a NUL byte".into()))?;
        let mut pfn: *mut c_void = std::ptr::null_mut();
        let mut status: u32 = 0;
        let flags = if sym.per_thread {
            CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
        } else {
            CU_GET_PROC_ADDRESS_LEGACY_STREAM
        };
        // SAFETY: `c_base` is NUL-terminated, `pfn` and `status` are valid out pointers.
        let rc = unsafe { gpa(c_base.as_ptr(), &mut pfn, sym.version, flags, &mut status) };
        if rc == 0 && !pfn.is_null() {
            return Ok(pfn);
        }
        let detail = match status {
            2 => format!(
                "this ABI version needs a CUDA {} driver; this driver supports CUDA {}",
                crate::version::format_version(sym.version),
                self.driver_version
                    .map(crate::version::format_version)
                    .unwrap_or_else(|| "(unknown)".into())
            ),
            1 => "the driver does not export it".into(),
            _ => format!(
                "cuGetProcAddress({}, version {}) returned {rc}",
                sym.base, sym.version
            ),
        };
        Err(self.missing(name, detail))
    }

    fn missing(&self, symbol: &str, detail: String) -> LoadError {
        LoadError::new(LoadErrorKind::SymbolNotFound {
            library: self.spec.label(),
            path: self.path.clone(),
            symbol: symbol.to_string(),
            detail,
        })
    }
}

/// Why `path` must not be handed to the system loader, if it exists but is not a
/// regular file (after following links). A missing file is left to the loader, whose
/// message says so.
fn not_a_regular_file(path: &Path, source: Source, spec: &LibrarySpec) -> Option<String> {
    let t = std::fs::metadata(path).ok()?.file_type();
    let what = if t.is_file() {
        return None;
    } else if t.is_dir() {
        "a folder"
    } else {
        special_file_kind(&t)
    };
    let mut reason = format!("{what}, not a regular file, so it was not opened");
    if source == Source::Override {
        reason.push_str(&format!(
            " ({} must name the library file or a folder holding it)",
            spec.override_var
        ));
    }
    Some(reason)
}

/// What a file that is neither a regular file nor a folder is, in words.
#[cfg(unix)]
fn special_file_kind(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else {
        "not a file"
    }
}

/// What a file that is neither a regular file nor a folder is, in words (the kinds
/// of special file are Unix's).
#[cfg(not(unix))]
fn special_file_kind(_: &std::fs::FileType) -> &'static str {
    "not a file"
}

fn loader_reason(e: &libloading::Error) -> String {
    let s = e.to_string();
    // libloading prefixes its own words; keep the system loader's message.
    match s.find(": ") {
        Some(i) if s.starts_with("Dl") || s.starts_with("Get") => s[i + 2..].to_string(),
        _ => s,
    }
}

/// A driver entry point's name split into what `cuGetProcAddress` wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverSymbol<'a> {
    /// The name without `_vN`, `_ptds` or `_ptsz`.
    pub base: &'a str,
    /// The CUDA version whose ABI the 13.0 headers declare for it.
    pub version: i32,
    /// Whether the per-thread-default-stream variant was asked for.
    pub per_thread: bool,
}

impl<'a> DriverSymbol<'a> {
    /// Looks `name` up in the table generated from `cudaTypedefs.h`:
    /// `cuMemcpyHtoD_v2_ptds` is `cuMemcpyHtoD` at ABI 3020, per-thread;
    /// `cuCtxSynchronize` is ABI 2000 while `cuCtxSynchronize_v2` is 13000. A name the
    /// table does not know keeps its name and asks for the headers' version.
    pub fn parse(name: &'a str) -> Self {
        let (declared, per_thread) = match name
            .strip_suffix("_ptds")
            .or_else(|| name.strip_suffix("_ptsz"))
        {
            Some(r) => (r, true),
            None => (name, false),
        };
        let table = crate::generated_versions::DRIVER_SYMBOL_VERSIONS;
        match table.binary_search_by(|(n, _, _)| (*n).cmp(declared)) {
            Ok(i) => DriverSymbol {
                base: table[i].1,
                version: table[i].2 as i32,
                per_thread,
            },
            Err(_) => DriverSymbol {
                base: declared,
                version: HEADER_CUDA_VERSION,
                per_thread,
            },
        }
    }
}

/// The path of the loaded object whose file name is `name` (what the system loader
/// found for a bare name), from the loader's list of loaded objects.
#[cfg(target_os = "linux")]
fn loaded_object_named(name: &str) -> Option<String> {
    struct Search<'a> {
        name: &'a [u8],
        found: Option<String>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: usize,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed below, alive for the whole iteration;
        // `info` is the loader's record, valid during this call, and `dlpi_name` is
        // null or NUL-terminated.
        let (search, name) = unsafe { (&mut *data.cast::<Search<'_>>(), (*info).dlpi_name) };
        if name.is_null() {
            return 0;
        }
        // SAFETY: as above, a NUL-terminated string owned by the loader.
        let path = unsafe { std::ffi::CStr::from_ptr(name) }.to_bytes();
        let file = path.rsplit(|&b| b == b'/').next().unwrap_or(path);
        if file == search.name && path.contains(&b'/') {
            search.found = Some(String::from_utf8_lossy(path).into_owned());
            return 1;
        }
        0
    }
    let mut search = Search {
        name: name.as_bytes(),
        found: None,
    };
    // SAFETY: `visit` matches the callback's signature and only reads what it is given;
    // the data pointer is `search`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&mut search as *mut Search<'_>).cast()) };
    search.found
}

#[cfg(not(target_os = "linux"))]
fn loaded_object_named(_name: &str) -> Option<String> {
    None
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::loaded_object_named;

    #[test]
    fn a_bare_name_is_found_where_the_system_loader_put_it() {
        // glibc is loaded in every process of this target, by its soname.
        let path = loaded_object_named("libc.so.6").expect("libc.so.6 is loaded");
        assert!(path.ends_with("/libc.so.6"), "{path}");
        assert!(std::path::Path::new(&path).is_file(), "{path}");
        assert_eq!(loaded_object_named("libnot-loaded-here.so.1"), None);
    }
}
