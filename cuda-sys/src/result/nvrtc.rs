//! Checked NVRTC calls (`nvrtc*`): version and architectures, and a program's life
//! from `nvrtcCreateProgram` to `nvrtcDestroyProgram`. NVRTC needs no GPU, only
//! `libnvrtc`.
//!
//! Every call goes through [`api`], which counts it ([`call_count`],
//! [`thread_call_count`]: a kernel cache proves a hit made no NVRTC call with them) and,
//! the first time, opens the NVRTC builtins library that sits beside `libnvrtc` (see
//! [`api`]).
//!
//! Functions that take an [`nvrtcProgram`] are `unsafe fn`: the program must be live
//! (created by [`create_program`], not yet destroyed) and not used by another thread
//! during the call (NVRTC programs are not thread-safe).

use std::cell::Cell;
use std::ffi::{c_char, CStr};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{NvrtcError, Result};
use crate::nvrtc::{self as sys, nvrtcProgram, nvrtcResult};

static CALLS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static THREAD_CALLS: Cell<u64> = const { Cell::new(0) };
}

/// How many times this process went to NVRTC: every NVRTC entry point called (and the
/// first one opens `libnvrtc`) goes through [`api`], which counts it.
pub fn call_count() -> u64 {
    CALLS.load(Ordering::Relaxed)
}

/// Like [`call_count`], for the calling thread only: unaffected by other threads
/// compiling at the same time.
pub fn thread_call_count() -> u64 {
    THREAD_CALLS.with(|c| c.get())
}

/// The path `libnvrtc` was opened from (a bare name when the system loader found it),
/// if this layer opened it already. Opens nothing and is not counted.
pub fn loaded_path() -> Option<String> {
    if call_count() == 0 {
        return None;
    }
    sys::api().ok().map(|a| a.library().path().to_owned())
}

/// NVRTC's entry-point table, counted ([`call_count`]). On first use it opens
/// `libnvrtc`, then the builtins library beside it: NVRTC opens
/// `libnvrtc-builtins.so.X.Y` by its bare name when it compiles, which the system
/// loader finds only on its search path; when `libnvrtc` came from elsewhere (a Python
/// wheel's `nvidia/cu13/lib`, `CUDA_PATH`), the builtins beside it are opened here
/// first, by full path and for good, so that NVRTC's own lookup finds them already
/// loaded (the system loader matches loaded libraries by soname). Best effort: if none
/// is found, NVRTC's own error says what is missing.
#[inline]
pub fn api() -> Result<&'static sys::Api> {
    CALLS.fetch_add(1, Ordering::Relaxed);
    THREAD_CALLS.with(|c| c.set(c.get() + 1));
    let api = sys::api()?;
    // The system loader's matching by soname is a Unix matter.
    #[cfg(unix)]
    {
        static BUILTINS: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        BUILTINS.get_or_init(|| preload_builtins(api.library().path()));
    }
    Ok(api)
}

#[cfg(unix)]
fn preload_builtins(nvrtc_path: &str) {
    use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};
    let Some(dir) = std::path::Path::new(nvrtc_path).parent() else {
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
        // SAFETY: opening NVRTC's builtins library runs its initialisers, which have no
        // preconditions.
        if let Ok(lib) = unsafe { Library::open(Some(&p), RTLD_NOW | RTLD_GLOBAL) } {
            // Never closed: the library stays loaded for the life of the process.
            std::mem::forget(lib);
            return;
        }
    }
}

/// `Ok(())` for `NVRTC_SUCCESS`, else the [`NvrtcError`] of `code` for `call`.
#[inline]
pub fn check(code: nvrtcResult, call: &'static str) -> Result<()> {
    if code == nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(NvrtcError::new(code, call).into())
    }
}

/// NVRTC's name of a status, e.g. `NVRTC_ERROR_COMPILATION` (`nvrtcGetErrorString`);
/// `None` when `libnvrtc` cannot be opened or gives no string.
pub fn get_error_string(code: nvrtcResult) -> Option<&'static str> {
    let f = api().ok()?.nvrtcGetErrorString().ok()?;
    // SAFETY: nvrtcGetErrorString takes any value and returns a static string.
    let p = unsafe { f(code) };
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, and static (the library is never unloaded).
    unsafe { CStr::from_ptr::<'static>(p) }.to_str().ok()
}

/// NVRTC's version `(major, minor)` (`nvrtcVersion`).
pub fn version() -> Result<(i32, i32)> {
    let f = api()?.nvrtcVersion()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: both are valid out pointers.
    check(unsafe { f(&mut major, &mut minor) }, "nvrtcVersion")?;
    Ok((major, minor))
}

/// How many architectures the loaded NVRTC compiles for (`nvrtcGetNumSupportedArchs`).
pub fn get_num_supported_archs() -> Result<i32> {
    let f = api()?.nvrtcGetNumSupportedArchs()?;
    let mut n = 0;
    // SAFETY: `n` is a valid out pointer.
    check(unsafe { f(&mut n) }, "nvrtcGetNumSupportedArchs")?;
    Ok(n)
}

/// The architectures the loaded NVRTC compiles for, e.g. `[75, 80, ..., 120]`
/// (`nvrtcGetNumSupportedArchs`, then `nvrtcGetSupportedArchs`).
pub fn get_supported_archs() -> Result<Vec<i32>> {
    let n = get_num_supported_archs()?;
    let mut archs = vec![0i32; usize::try_from(n).unwrap_or(0)];
    if !archs.is_empty() {
        let f = api()?.nvrtcGetSupportedArchs()?;
        // SAFETY: `archs` holds the `n` entries NVRTC said it writes.
        check(unsafe { f(archs.as_mut_ptr()) }, "nvrtcGetSupportedArchs")?;
    }
    Ok(archs)
}

/// `nvrtcCreateProgram` for `source` under the name `name`, with no headers. The
/// caller destroys the program once with [`destroy_program`].
pub fn create_program(source: &CStr, name: &CStr) -> Result<nvrtcProgram> {
    let f = api()?.nvrtcCreateProgram()?;
    let mut prog: nvrtcProgram = std::ptr::null_mut();
    // SAFETY: both strings are NUL-terminated (NVRTC copies them); no headers (null
    // arrays, count 0); `prog` is a valid out pointer.
    let rc = unsafe {
        f(
            &mut prog,
            source.as_ptr(),
            name.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(rc, "nvrtcCreateProgram")?;
    Ok(prog)
}

/// `nvrtcDestroyProgram`; `*prog` is null afterwards.
///
/// # Safety
/// `*prog` is a live program, not used again (nor by another thread during the call).
pub unsafe fn destroy_program(prog: &mut nvrtcProgram) -> Result<()> {
    let f = api()?.nvrtcDestroyProgram()?;
    // SAFETY: `prog` is a valid pointer to a live program (caller).
    check(unsafe { f(prog) }, "nvrtcDestroyProgram")
}

/// `nvrtcAddNameExpression` (before compiling).
///
/// # Safety
/// `prog` is a live program (see the [module](self) docs).
pub unsafe fn add_name_expression(prog: nvrtcProgram, expr: &CStr) -> Result<()> {
    let f = api()?.nvrtcAddNameExpression()?;
    // SAFETY: `prog` is live (caller); `expr` is NUL-terminated (NVRTC copies it).
    check(unsafe { f(prog, expr.as_ptr()) }, "nvrtcAddNameExpression")
}

/// `nvrtcCompileProgram` with `options`. The log, also on failure, comes from
/// [`get_program_log`].
///
/// # Safety
/// `prog` is a live program (see the [module](self) docs).
pub unsafe fn compile_program(prog: nvrtcProgram, options: &[&CStr]) -> Result<()> {
    let ptrs: Vec<*const c_char> = options.iter().map(|c| c.as_ptr()).collect();
    let Ok(n) = i32::try_from(ptrs.len()) else {
        // More options than NVRTC can be told of.
        return check(
            nvrtcResult::NVRTC_ERROR_INVALID_INPUT,
            "nvrtcCompileProgram",
        );
    };
    let f = api()?.nvrtcCompileProgram()?;
    // SAFETY: `prog` is live (caller); `ptrs` holds `n` NUL-terminated strings that
    // outlive the call.
    check(unsafe { f(prog, n, ptrs.as_ptr()) }, "nvrtcCompileProgram")
}

type SizeFn = unsafe extern "C" fn(nvrtcProgram, *mut usize) -> nvrtcResult;
type GetFn = unsafe extern "C" fn(nvrtcProgram, *mut c_char) -> nvrtcResult;
type Entry<F> = fn(&sys::Api) -> std::result::Result<F, crate::LoadError>;

/// Reads one of the program's outputs: asks its size (`size`, an entry point of
/// [`sys::Api`] named `size_call`), then fills a buffer of that size (`get`).
///
/// # Safety
/// `prog` is a live program.
unsafe fn read_output(
    prog: nvrtcProgram,
    (size, size_call): (Entry<SizeFn>, &'static str),
    (get, get_call): (Entry<GetFn>, &'static str),
) -> Result<Vec<u8>> {
    let size_fn = size(api()?)?;
    let mut n = 0usize;
    // SAFETY: `prog` is live (caller); `n` is a valid out pointer.
    check(unsafe { size_fn(prog, &mut n) }, size_call)?;
    let mut buf = vec![0u8; n];
    if n > 0 {
        let get_fn = get(api()?)?;
        // SAFETY: `buf` holds the `n` bytes NVRTC writes.
        check(unsafe { get_fn(prog, buf.as_mut_ptr().cast()) }, get_call)?;
    }
    Ok(buf)
}

/// The program log, without its NUL byte (`nvrtcGetProgramLogSize`,
/// `nvrtcGetProgramLog`); empty when there is none.
///
/// # Safety
/// `prog` is a live program (see the [module](self) docs).
pub unsafe fn get_program_log(prog: nvrtcProgram) -> Result<String> {
    // SAFETY: `prog` is live (caller).
    let buf = unsafe {
        read_output(
            prog,
            (sys::Api::nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
            (sys::Api::nvrtcGetProgramLog, "nvrtcGetProgramLog"),
        )
    }?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// The compiled cubin (`nvrtcGetCUBINSize`, `nvrtcGetCUBIN`).
///
/// # Safety
/// `prog` is a live program (see the [module](self) docs).
pub unsafe fn get_cubin(prog: nvrtcProgram) -> Result<Vec<u8>> {
    // SAFETY: `prog` is live (caller).
    unsafe {
        read_output(
            prog,
            (sys::Api::nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
            (sys::Api::nvrtcGetCUBIN, "nvrtcGetCUBIN"),
        )
    }
}

/// The compiled PTX, NUL byte included (`nvrtcGetPTXSize`, `nvrtcGetPTX`).
///
/// # Safety
/// `prog` is a live program (see the [module](self) docs).
pub unsafe fn get_ptx(prog: nvrtcProgram) -> Result<Vec<u8>> {
    // SAFETY: `prog` is live (caller).
    unsafe {
        read_output(
            prog,
            (sys::Api::nvrtcGetPTXSize, "nvrtcGetPTXSize"),
            (sys::Api::nvrtcGetPTX, "nvrtcGetPTX"),
        )
    }
}

/// The lowered (mangled) name of a name expression added before compiling
/// (`nvrtcGetLoweredName`), copied out of the program; `None` when NVRTC gives a null
/// name.
///
/// # Safety
/// `prog` is a live, compiled program (see the [module](self) docs).
pub unsafe fn get_lowered_name(prog: nvrtcProgram, expr: &CStr) -> Result<Option<String>> {
    let f = api()?.nvrtcGetLoweredName()?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `prog` is live (caller); `expr` is NUL-terminated; `p` is a valid out
    // pointer to a string the program owns.
    check(
        unsafe { f(prog, expr.as_ptr(), &mut p) },
        "nvrtcGetLoweredName",
    )?;
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-null and NUL-terminated, alive while the program is (copied here).
    Ok(Some(
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned(),
    ))
}
