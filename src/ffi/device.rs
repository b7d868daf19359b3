//! Device queries and selection.

use std::ffi::{c_char, c_int};

use cuda_rt::Device;

use super::status::{bad_arg, guard, out, set_last_error, unwind_guard};

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
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_device_count(count: *mut c_int) -> c_int {
    guard(|| {
        let count = out(count, "count")?;
        *count = cuda_rt::device_count()?;
        Ok(())
    })
}

/// Writes the driver's CUDA version (e.g. 13000) to `*version`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_driver_version(version: *mut c_int) -> c_int {
    guard(|| {
        let version = out(version, "version")?;
        *version = cuda_rt::env::driver_version()?.to_int();
        Ok(())
    })
}

/// Writes device `id`'s compute capability to `*major` and `*minor`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_device_compute_capability(
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
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_device_total_memory(id: c_int, bytes: *mut usize) -> c_int {
    guard(|| {
        let bytes = out(bytes, "bytes")?;
        *bytes = Device::new(id)?.total_memory()?;
        Ok(())
    })
}

/// Makes device `id` current on this thread.
#[no_mangle]
pub extern "C" fn curt_set_device(id: c_int) -> c_int {
    guard(|| Ok(cuda_rt::set_device_id(id)?))
}

/// Writes this thread's current device to `*id`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_get_device(id: *mut c_int) -> c_int {
    guard(|| {
        *out(id, "id")? = cuda_rt::get_device_id();
        Ok(())
    })
}

/// Blocks until all work on the current device is done.
#[no_mangle]
pub extern "C" fn curt_device_synchronize() -> c_int {
    guard(|| Ok(cuda_rt::synchronize()?))
}

/// Writes device `id`'s free and total memory in bytes.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_device_mem_info(
    id: c_int,
    free: *mut usize,
    total: *mut usize,
) -> c_int {
    guard(|| {
        let (free, total) = (out(free, "free")?, out(total, "total")?);
        (*free, *total) = Device::new(id)?.mem_info()?;
        Ok(())
    })
}

/// Writes device `id`'s name, NUL-terminated and cut to fit, into `buf` (`len` bytes).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_device_name(id: c_int, buf: *mut c_char, len: usize) -> c_int {
    guard(|| {
        if buf.is_null() {
            return Err(bad_arg("buf is NULL"));
        }
        if len == 0 {
            return Err(bad_arg("len is 0"));
        }
        let name = Device::new(id)?.name()?;
        let n = name.len().min(len - 1);
        // SAFETY: `buf` is non-null (checked) and, as wrapper.h requires, `len`
        // writable bytes; `n + 1 <= len`.
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), buf, n);
            *buf.add(n) = 0;
        }
        Ok(())
    })
}
