//! The exported functions. Each one goes through [`guard`], which turns a `Result` into
//! a code, records the message and catches panics.
//!
//! The promise of `wrapper.h` is that no function unwinds or aborts, whenever it is
//! called: also from a thread-local or `pthread_key_create` destructor while the thread
//! exits, or from an `atexit` handler after the main thread's thread-locals are gone.
//! So the last-error slot is reached only through `try_with` and `try_borrow*` (a slot
//! that is torn down, or busy, is skipped, never a panic), every message is recorded
//! inside the unwind guard, and [`curt_last_error`] answers `""` (a static string) when
//! the thread has no slot any more.

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cuda_rt::{Device, Error};

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
fn set_last_error(msg: &str) {
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
/// recording (none is expected) ends as a code.
fn unwind_guard<T>(body: impl FnOnce() -> T, on_panic: T) -> T {
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

/// Runs `f` (which must check its pointer arguments before any other work, so a bad
/// argument is reported as such), converting its outcome to a code and recording the
/// message, all inside the unwind guard.
fn guard(f: impl FnOnce() -> cuda_rt::Result<()>) -> c_int {
    unwind_guard(
        || match f() {
            Ok(()) => CURT_SUCCESS,
            Err(e) => {
                set_last_error(&e.to_string());
                error_code(&e)
            }
        },
        CURT_ERROR_PANIC,
    )
}

fn out<T>(p: *mut T, name: &str) -> cuda_rt::Result<&'static mut T> {
    // SAFETY: the C caller passes either null (rejected here) or a valid, aligned,
    // writable pointer, as wrapper.h documents.
    unsafe { p.as_mut() }.ok_or_else(|| {
        Error::invalid_argument(cuda_rt::ArgumentKind::Null, format!("{name} is NULL"))
    })
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

/// 1 if CUDA is usable, else 0 (the reason is then in `curt_last_error`).
#[no_mangle]
pub extern "C" fn curt_is_available() -> c_int {
    unwind_guard(
        || match cuda_rt::availability() {
            Ok(_) => 1,
            Err(reason) => {
                set_last_error(&reason.to_string());
                0
            }
        },
        0,
    )
}

/// Writes the number of CUDA devices to `*count`.
#[no_mangle]
pub extern "C" fn curt_device_count(count: *mut c_int) -> c_int {
    guard(|| {
        let count = out(count, "count")?;
        *count = cuda_rt::device_count()?;
        Ok(())
    })
}

/// Writes the driver's CUDA version (e.g. 13000) to `*version`.
#[no_mangle]
pub extern "C" fn curt_driver_version(version: *mut c_int) -> c_int {
    guard(|| {
        let version = out(version, "version")?;
        *version = cuda_rt::env::driver_version()?.to_int();
        Ok(())
    })
}

/// Writes device `id`'s compute capability to `*major` and `*minor`.
#[no_mangle]
pub extern "C" fn curt_device_compute_capability(
    id: c_int,
    major: *mut c_int,
    minor: *mut c_int,
) -> c_int {
    guard(|| {
        let (major, minor) = (out(major, "major")?, out(minor, "minor")?);
        (*major, *minor) = Device::new(id)?.compute_capability()?;
        Ok(())
    })
}

/// Writes device `id`'s total memory in bytes to `*bytes`.
#[no_mangle]
pub extern "C" fn curt_device_total_memory(id: c_int, bytes: *mut usize) -> c_int {
    guard(|| {
        let bytes = out(bytes, "bytes")?;
        *bytes = Device::new(id)?.total_memory()?;
        Ok(())
    })
}
