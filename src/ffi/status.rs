//! Codes, the thread-local last-error message and the unwind guard every export runs in.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cuda_rt::Error;

/// Success.
pub const CURT_SUCCESS: c_int = 0;
/// A bad argument (null pointer, bad size...).
pub const CURT_ERROR_INVALID_ARGUMENT: c_int = -1;
/// A library or entry point could not be loaded.
pub const CURT_ERROR_NOT_FOUND: c_int = -2;
/// Out of memory.
pub const CURT_ERROR_OUT_OF_MEMORY: c_int = -3;
/// NVRTC compile error.
pub const CURT_ERROR_COMPILE: c_int = -4;
/// CUDA is not usable, or the operation is not supported.
pub const CURT_ERROR_NOT_SUPPORTED: c_int = -5;
/// Any other error (state, capture, math library).
pub const CURT_ERROR_OTHER: c_int = -6;
/// A handle that is NULL where one is required, destroyed already, of another kind,
/// or never returned by this library.
pub const CURT_ERROR_INVALID_HANDLE: c_int = -7;
/// A panic was caught inside cuda-rt (a bug: please report it).
pub const CURT_ERROR_PANIC: c_int = -99;

/// What [`curt_last_error`] returns when there is no message: static, so it stays valid
/// whatever happens to the thread's storage.
static EMPTY: &CStr = c"";

const PANIC_MESSAGE: &str = "internal error: a panic was caught at the C boundary";

thread_local! {
    /// The thread's last error message; `None` until a call fails on the thread.
    static LAST_ERROR: RefCell<Option<CString>> = const { RefCell::new(None) };
}

/// Records `msg` as this thread's last error. Never panics: when the thread's storage
/// is torn down (a destructor or `atexit` handler calling in) or the slot is busy, the
/// message is dropped and only the code tells the caller what happened.
pub(crate) fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    let _ = LAST_ERROR.try_with(|l| {
        if let Ok(mut slot) = l.try_borrow_mut() {
            *slot = Some(c);
        }
    });
}

/// Drops a caught panic's payload without letting a panicking `Drop` escape: a
/// second panic from it is caught too and its payload leaked.
fn discard_panic(payload: Box<dyn Any + Send>) {
    if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
        std::mem::forget(again);
    }
}

/// Runs `body` under the unwind guard: its value, or `on_panic` after recording that a
/// panic was caught. Recording happens inside the guard as well, so even a panic while
/// recording (none is expected) ends as a code. Inlined into its caller (each export's
/// closure is its own instance, so nothing is duplicated): a separate frame cost the
/// `curt_torch_alloc` + `curt_torch_free` pair ~65 instructions of argument and result
/// moves (issue 27).
#[inline(always)]
pub(crate) fn unwind_guard<T>(body: impl FnOnce() -> T, on_panic: T) -> T {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(v) => v,
        Err(payload) => {
            discard_panic(payload);
            if let Err(p) = catch_unwind(|| set_last_error(PANIC_MESSAGE)) {
                std::mem::forget(p);
            }
            on_panic
        }
    }
}

/// The code for an error: a positive CUDA driver code (`CUresult`) when the driver
/// failed, else one of the negative `CURT_ERROR_*` codes.
pub fn error_code(e: &Error) -> c_int {
    if let Some(code) = e.driver_code() {
        if !matches!(e, Error::OutOfMemory(_)) {
            return code.0 as c_int;
        }
    }
    match e {
        Error::InvalidArgument { .. } | Error::InvalidDevice { .. } => CURT_ERROR_INVALID_ARGUMENT,
        Error::Load(_) => CURT_ERROR_NOT_FOUND,
        Error::OutOfMemory(_) => CURT_ERROR_OUT_OF_MEMORY,
        Error::Compile(_) => CURT_ERROR_COMPILE,
        Error::NotAvailable(_) | Error::NotSupported { .. } => CURT_ERROR_NOT_SUPPORTED,
        _ => CURT_ERROR_OTHER,
    }
}

/// Why a call failed: an error of cuda-rt, or a bad handle (which cuda-rt never sees).
#[derive(Debug)]
pub(crate) enum Fail {
    /// An error of cuda-rt (also a bad argument found by the shim).
    Rt(Error),
    /// A bad handle, with the message.
    Handle(String),
    /// A code and message handed back as they came (a C callback's failure, whose
    /// code the callback chose).
    Code(c_int, String),
}

impl From<Error> for Fail {
    fn from(e: Error) -> Self {
        Fail::Rt(e)
    }
}

impl Fail {
    /// The code and the message.
    pub(crate) fn code_and_message(&self) -> (c_int, String) {
        match self {
            Fail::Rt(e) => (error_code(e), e.to_string()),
            Fail::Handle(m) => (CURT_ERROR_INVALID_HANDLE, m.clone()),
            Fail::Code(c, m) => (*c, m.clone()),
        }
    }
}

/// What the shim's functions return inside [`guard`].
pub(crate) type Res<T> = std::result::Result<T, Fail>;

/// A bad argument found by the shim (a NULL pointer, a bad size or flag).
pub(crate) fn bad_arg(msg: impl Into<String>) -> Fail {
    Fail::Rt(Error::invalid_argument(
        cuda_rt::ArgumentKind::Null,
        msg.into(),
    ))
}

/// Runs `f` (which must check its pointer arguments before any other work, so a bad
/// argument is reported as such), converting its outcome to a code and recording the
/// message, all inside the unwind guard.
#[inline(always)]
pub(crate) fn guard(f: impl FnOnce() -> Res<()>) -> c_int {
    unwind_guard(
        || match f() {
            Ok(()) => CURT_SUCCESS,
            Err(e) => {
                let (code, msg) = e.code_and_message();
                set_last_error(&msg);
                code
            }
        },
        CURT_ERROR_PANIC,
    )
}

/// The out-pointer `p`, or an invalid argument naming it when it is NULL.
pub(crate) fn out<T>(p: *mut T, name: &str) -> Res<&'static mut T> {
    // SAFETY: the C caller passes either null (rejected here) or a valid, aligned,
    // writable pointer, as wrapper.h documents.
    unsafe { p.as_mut() }.ok_or_else(|| bad_arg(format!("{name} is NULL")))
}

/// The NUL-terminated UTF-8 string `p`, or an invalid argument naming it.
pub(crate) fn c_str<'a>(p: *const c_char, name: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(bad_arg(format!("{name} is NULL")));
    }
    // SAFETY: non-null (checked); the C caller passes a NUL-terminated string that
    // stays valid for the call, as wrapper.h documents.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| bad_arg(format!("{name} is not valid UTF-8")))
}

/// The last error message on this thread (empty if none); valid until the next call
/// that fails on this thread, or the thread's exit. Called while the thread's storage
/// is torn down (from a destructor or an `atexit` handler), it returns `""`.
#[no_mangle]
pub extern "C" fn curt_last_error() -> *const c_char {
    unwind_guard(
        || {
            LAST_ERROR
                .try_with(|l| match l.try_borrow().as_deref() {
                    // The CString's buffer is on the heap: it stays where it is until
                    // the slot is overwritten or torn down, as documented.
                    Ok(Some(c)) => c.as_ptr(),
                    _ => EMPTY.as_ptr(),
                })
                .unwrap_or(EMPTY.as_ptr())
        },
        EMPTY.as_ptr(),
    )
}

/// This thread's last error message as a `String` (empty when there is none).
pub(crate) fn last_error_string() -> String {
    LAST_ERROR
        .try_with(|l| match l.try_borrow().as_deref() {
            Ok(Some(c)) => c.to_string_lossy().into_owned(),
            _ => String::new(),
        })
        .unwrap_or_default()
}

/// The name of a status code, as a static string: `"CURT_SUCCESS"`,
/// `"CURT_ERROR_OUT_OF_MEMORY"`... for cuda-rt's codes, the driver's name
/// (`"CUDA_ERROR_ILLEGAL_ADDRESS"`...) for a positive CUDA code, and
/// `"CURT_ERROR_UNRECOGNIZED"` for a code neither knows (a positive code when no driver
/// can be loaded to name it). Never NULL.
#[no_mangle]
pub extern "C" fn curt_status_name(code: c_int) -> *const c_char {
    unwind_guard(|| status_name(code).as_ptr(), UNRECOGNIZED.as_ptr())
}

const UNRECOGNIZED: &CStr = c"CURT_ERROR_UNRECOGNIZED";

fn status_name(code: c_int) -> &'static CStr {
    match code {
        CURT_SUCCESS => c"CURT_SUCCESS",
        CURT_ERROR_INVALID_ARGUMENT => c"CURT_ERROR_INVALID_ARGUMENT",
        CURT_ERROR_NOT_FOUND => c"CURT_ERROR_NOT_FOUND",
        CURT_ERROR_OUT_OF_MEMORY => c"CURT_ERROR_OUT_OF_MEMORY",
        CURT_ERROR_COMPILE => c"CURT_ERROR_COMPILE",
        CURT_ERROR_NOT_SUPPORTED => c"CURT_ERROR_NOT_SUPPORTED",
        CURT_ERROR_OTHER => c"CURT_ERROR_OTHER",
        CURT_ERROR_INVALID_HANDLE => c"CURT_ERROR_INVALID_HANDLE",
        CURT_ERROR_PANIC => c"CURT_ERROR_PANIC",
        c if c > 0 => driver_name(c as u32).unwrap_or(UNRECOGNIZED),
        _ => UNRECOGNIZED,
    }
}

/// The driver's name of a `CUresult`, NUL-terminated and static: the driver's own
/// strings are, and the loader never unloads the driver.
fn driver_name(code: u32) -> Option<&'static CStr> {
    use cuda_rt::cuda_sys::driver as sys;
    let api = sys::api().ok()?;
    let f = api.cuGetErrorName().ok()?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `p` is a valid out-pointer; the driver writes a pointer to a static string
    // or fails (an unknown code), leaving it NULL.
    let rc = unsafe { f(sys::CUresult(code), &mut p) };
    if rc != sys::CUresult::CUDA_SUCCESS || p.is_null() {
        return None;
    }
    // SAFETY: non-null, NUL-terminated, alive as long as the driver, which stays loaded.
    Some(unsafe { CStr::from_ptr::<'static>(p) })
}

/// This library's version as `major * 10000 + minor * 100 + patch` (0.1.0 is 100), to
/// compare with `CURT_VERSION` from the header it was compiled with.
#[no_mangle]
pub extern "C" fn curt_version() -> c_int {
    unwind_guard(|| VERSION, VERSION)
}

/// This library's version as `major * 10000 + minor * 100 + patch`.
const VERSION: c_int = {
    let (major, minor, patch) = (
        parse(env!("CARGO_PKG_VERSION_MAJOR")),
        parse(env!("CARGO_PKG_VERSION_MINOR")),
        parse(env!("CARGO_PKG_VERSION_PATCH")),
    );
    major * 10000 + minor * 100 + patch
};

/// A decimal number known at compile time (`str::parse` is not `const`).
const fn parse(s: &str) -> c_int {
    let b = s.as_bytes();
    let mut i = 0;
    let mut n = 0;
    while i < b.len() {
        n = n * 10 + (b[i] - b'0') as c_int;
        i += 1;
    }
    n
}

/// This library's version as text, e.g. `"0.1.0"` (static, never NULL).
#[no_mangle]
pub extern "C" fn curt_version_string() -> *const c_char {
    const TEXT: &CStr =
        match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
            Ok(s) => s,
            Err(_) => panic!("the package version has a NUL"),
        };
    TEXT.as_ptr()
}
