//! Checked NVRTC calls: a [`Program`] that destroys itself, and the version and
//! architecture queries. NVRTC needs no GPU, only `libnvrtc`.

use std::ffi::{c_char, CStr, CString};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cuda_sys::nvrtc::{self as nv, nvrtcProgram, nvrtcResult};

use crate::error::{ArgumentKind, CompileError, Error, Result, StateKind};

/// Calls an NVRTC entry point and checks its result:
/// `nvrtc!(nvrtcVersion(&mut a, &mut b))`. The caller writes the `// SAFETY:` line.
macro_rules! nvrtc {
    ($name:ident ( $($arg:expr),* $(,)? )) => {{
        let f = api()?.$name()?;
        #[allow(unused_unsafe)]
        let rc = unsafe { f($($arg),*) };
        check(rc, stringify!($name), None, String::new())
    }};
}

static CALLS: AtomicU64 = AtomicU64::new(0);

/// How many times this process went to NVRTC: every NVRTC entry point called (and the
/// first one opens `libnvrtc`) goes through [`api`], which counts it.
pub fn call_count() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

thread_local! {
    static THREAD_CALLS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Like [`call_count`], for the calling thread only: unaffected by other threads
/// compiling at the same time.
pub fn thread_call_count() -> u64 {
    THREAD_CALLS.with(|c| c.get())
}

/// The path `libnvrtc` was opened from (a bare name when the system loader found it),
/// if it is open already. Opens nothing and is not counted.
pub fn loaded_path() -> Option<String> {
    if call_count() == 0 {
        return None;
    }
    nv::api().ok().map(|a| a.library().path().to_owned())
}

/// NVRTC's entry-point table (opens `libnvrtc` on first use, and preloads its
/// builtins library, see [`preload_builtins`]). Each call is counted ([`call_count`]).
#[inline]
pub fn api() -> Result<&'static nv::Api> {
    CALLS.fetch_add(1, Ordering::Relaxed);
    THREAD_CALLS.with(|c| c.set(c.get() + 1));
    let api = nv::api().map_err(Error::Load)?;
    static BUILTINS: OnceLock<()> = OnceLock::new();
    BUILTINS.get_or_init(|| preload_builtins(api.library().path()));
    Ok(api)
}

/// NVRTC opens `libnvrtc-builtins.so.X.Y` by its bare name when it compiles, which the
/// system loader finds only on its search path. When libnvrtc came from elsewhere (a
/// Python wheel's `nvidia/cu13/lib`, `CUDA_PATH`), the builtins beside it are opened
/// here first, by full path and for good, so that NVRTC's own lookup finds them
/// already loaded (the loader matches loaded libraries by soname). Best effort: if
/// none is found, NVRTC's own error says what is missing.
fn preload_builtins(nvrtc_path: &str) {
    let Some(dir) = Path::new(nvrtc_path).parent() else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let mut found: Vec<_> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libnvrtc-builtins.so"))
        })
        // dlopen blocks forever on a FIFO: only regular files (links followed).
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file()))
        .collect();
    // Most specific name first (`.so.13.0` before `.so`); loading one is enough.
    found.sort_by_key(|p| std::cmp::Reverse(p.as_os_str().len()));
    for p in found {
        let Ok(c) = CString::new(p.as_os_str().as_encoded_bytes()) else {
            continue;
        };
        // SAFETY: `c` is a NUL-terminated path; the handle is deliberately never
        // closed, so the library stays loaded for the life of the process.
        let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if !h.is_null() {
            return;
        }
    }
}

/// NVRTC's name of a result code, e.g. `NVRTC_ERROR_COMPILATION`.
pub fn error_name(rc: nvrtcResult) -> String {
    let text = api()
        .ok()
        .and_then(|a| a.nvrtcGetErrorString().ok())
        .and_then(|f| {
            // SAFETY: nvrtcGetErrorString returns a static NUL-terminated string.
            let p = unsafe { f(rc) };
            if p.is_null() {
                None
            } else {
                // SAFETY: non-null, NUL-terminated, static.
                Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
            }
        });
    text.unwrap_or_else(|| format!("NVRTC error {}", rc.0))
}

fn check(rc: nvrtcResult, call: &'static str, source: Option<&str>, log: String) -> Result<()> {
    if rc == nvrtcResult::NVRTC_SUCCESS {
        return Ok(());
    }
    Err(Error::Compile(CompileError {
        call,
        code: rc.0 as i32,
        name: error_name(rc),
        source_name: source.map(str::to_owned),
        log,
    }))
}

/// NVRTC's version `(major, minor)` (`nvrtcVersion`).
pub fn version() -> Result<(i32, i32)> {
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid out pointers.
    nvrtc!(nvrtcVersion(&mut major, &mut minor))?;
    Ok((major, minor))
}

/// The architectures the loaded NVRTC can compile for, e.g. `[75, 80, ..., 120]`
/// (`nvrtcGetNumSupportedArchs`, `nvrtcGetSupportedArchs`).
pub fn supported_archs() -> Result<Vec<i32>> {
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer.
    nvrtc!(nvrtcGetNumSupportedArchs(&mut n))?;
    let mut archs = vec![0i32; usize::try_from(n).unwrap_or(0)];
    if !archs.is_empty() {
        // SAFETY: `archs` holds the `n` entries NVRTC said it writes.
        nvrtc!(nvrtcGetSupportedArchs(archs.as_mut_ptr()))?;
    }
    Ok(archs)
}

/// An NVRTC program, destroyed on drop.
pub struct Program {
    prog: nvrtcProgram,
    name: String,
}

impl Program {
    /// `nvrtcCreateProgram` for `source` under the name `name` (no headers).
    pub fn new(source: &str, name: &str) -> Result<Program> {
        let src = CString::new(source).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("the source of {name} contains a NUL byte"),
            )
        })?;
        let cname = CString::new(name).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("source name {name:?} contains a NUL byte"),
            )
        })?;
        let mut prog: nvrtcProgram = std::ptr::null_mut();
        // SAFETY: both strings are NUL-terminated; no headers (null arrays, count 0).
        nvrtc!(nvrtcCreateProgram(
            &mut prog,
            src.as_ptr(),
            cname.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null()
        ))?;
        Ok(Program {
            prog,
            name: name.to_owned(),
        })
    }

    /// `nvrtcAddNameExpression` (before compiling).
    pub fn add_name_expression(&mut self, expr: &str) -> Result<()> {
        let c = CString::new(expr).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("name expression {expr:?} contains a NUL byte"),
            )
        })?;
        // SAFETY: the program is alive; `c` is NUL-terminated (NVRTC copies it).
        nvrtc!(nvrtcAddNameExpression(self.prog, c.as_ptr()))
    }

    /// `nvrtcCompileProgram`, then the log. `Ok(log)` on success (warnings, often
    /// empty); on failure an [`Error::Compile`] with the source name and the whole log.
    pub fn compile(&mut self, options: &[String]) -> Result<String> {
        let owned: Vec<CString> = options
            .iter()
            .map(|o| {
                CString::new(o.as_str()).map_err(|_| {
                    Error::invalid_argument(
                        ArgumentKind::InteriorNul,
                        format!("compile option {o:?} contains a NUL byte"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        let ptrs: Vec<*const c_char> = owned.iter().map(|c| c.as_ptr()).collect();
        let n = i32::try_from(ptrs.len()).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("{} compile options", ptrs.len()),
            )
        })?;
        let f = api()?.nvrtcCompileProgram()?;
        // SAFETY: the program is alive; `ptrs` holds `n` NUL-terminated strings that
        // outlive the call.
        let rc = unsafe { f(self.prog, n, ptrs.as_ptr()) };
        let log = self.log().unwrap_or_default();
        check(rc, "nvrtcCompileProgram", Some(&self.name), log.clone())?;
        Ok(log)
    }

    /// The program log (`nvrtcGetProgramLogSize`, `nvrtcGetProgramLog`).
    pub fn log(&self) -> Result<String> {
        let mut size = 0usize;
        // SAFETY: the program is alive, `size` a valid out pointer.
        nvrtc!(nvrtcGetProgramLogSize(self.prog, &mut size))?;
        if size == 0 {
            return Ok(String::new());
        }
        let mut buf = vec![0u8; size];
        // SAFETY: `buf` holds the `size` bytes NVRTC writes (NUL included).
        nvrtc!(nvrtcGetProgramLog(self.prog, buf.as_mut_ptr().cast()))?;
        Ok(c_bytes_to_string(&buf))
    }

    /// The compiled cubin (`nvrtcGetCUBINSize`, `nvrtcGetCUBIN`).
    pub fn cubin(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: the program is alive, `size` a valid out pointer.
        nvrtc!(nvrtcGetCUBINSize(self.prog, &mut size))?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` holds the `size` bytes NVRTC writes.
            nvrtc!(nvrtcGetCUBIN(self.prog, buf.as_mut_ptr().cast()))?;
        }
        Ok(buf)
    }

    /// The compiled PTX, NUL byte included (`nvrtcGetPTXSize`, `nvrtcGetPTX`).
    pub fn ptx(&self) -> Result<Vec<u8>> {
        let mut size = 0usize;
        // SAFETY: the program is alive, `size` a valid out pointer.
        nvrtc!(nvrtcGetPTXSize(self.prog, &mut size))?;
        let mut buf = vec![0u8; size];
        if size > 0 {
            // SAFETY: `buf` holds the `size` bytes NVRTC writes.
            nvrtc!(nvrtcGetPTX(self.prog, buf.as_mut_ptr().cast()))?;
        }
        Ok(buf)
    }

    /// The lowered (mangled) name of a name expression added before compiling
    /// (`nvrtcGetLoweredName`).
    pub fn lowered_name(&self, expr: &str) -> Result<String> {
        let c = CString::new(expr).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("name expression {expr:?} contains a NUL byte"),
            )
        })?;
        let mut p: *const c_char = std::ptr::null();
        // SAFETY: the program is alive and compiled; `c` NUL-terminated; `p` a valid
        // out pointer to a string the program owns.
        nvrtc!(nvrtcGetLoweredName(self.prog, c.as_ptr(), &mut p))?;
        if p.is_null() {
            return Err(Error::invalid_state(
                StateKind::Unexpected,
                format!("NVRTC gave no lowered name for {expr:?}"),
            ));
        }
        // SAFETY: non-null and NUL-terminated, alive while the program is (we copy).
        Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // An error here leaves nothing to clean up.
        // SAFETY: the program is owned and destroyed once.
        let _ = (|| nvrtc!(nvrtcDestroyProgram(&mut self.prog)))();
    }
}

fn c_bytes_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
