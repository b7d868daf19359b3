//! Copies and memset between host addresses and device memory handles, synchronous
//! and on a stream. Device sides are handles with an offset, checked against the
//! allocation's size; host sides are raw addresses the caller vouches for.

use std::ffi::{c_int, c_void};

use cuda_rt::MemoryPointer;

use super::handles::{curt_memory_t, curt_stream_t};
use super::memory::MEMORY;
use super::status::{bad_arg, guard, Res};
use super::stream::stream_or_current;

fn at(mem: curt_memory_t, offset: usize) -> Res<MemoryPointer> {
    Ok(MEMORY.get(mem as u64)?.checked_add(offset)?)
}

fn host<'a>(p: *const c_void, bytes: usize, name: &str) -> Res<&'a [u8]> {
    if bytes == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(bad_arg(format!("{name} is NULL")));
    }
    // SAFETY: non-null (checked); wrapper.h requires `bytes` readable bytes at `p`,
    // not written during the call.
    Ok(unsafe { std::slice::from_raw_parts(p.cast::<u8>(), bytes) })
}

fn host_mut<'a>(p: *mut c_void, bytes: usize, name: &str) -> Res<&'a mut [u8]> {
    if bytes == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return Err(bad_arg(format!("{name} is NULL")));
    }
    // SAFETY: non-null (checked); wrapper.h requires `bytes` writable bytes at `p`,
    // used by nothing else during the call.
    Ok(unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), bytes) })
}

/// Copies `bytes` from host `src` to `dst` + `dst_offset`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_memcpy_htod(
    dst: curt_memory_t,
    dst_offset: usize,
    src: *const c_void,
    bytes: usize,
) -> c_int {
    guard(|| Ok(at(dst, dst_offset)?.copy_from_host(host(src, bytes, "src")?)?))
}

/// Copies `bytes` from `src` + `src_offset` to host `dst`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_memcpy_dtoh(
    dst: *mut c_void,
    src: curt_memory_t,
    src_offset: usize,
    bytes: usize,
) -> c_int {
    guard(|| Ok(at(src, src_offset)?.copy_to_host(host_mut(dst, bytes, "dst")?)?))
}

/// Copies `bytes` between device memory.
#[no_mangle]
pub extern "C" fn curt_memcpy_dtod(
    dst: curt_memory_t,
    dst_offset: usize,
    src: curt_memory_t,
    src_offset: usize,
    bytes: usize,
) -> c_int {
    guard(|| Ok(at(dst, dst_offset)?.copy_from_device(&at(src, src_offset)?, bytes)?))
}

/// `curt_memcpy_htod` on `stream` (NULL: the current stream).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_memcpy_htod_async(
    dst: curt_memory_t,
    dst_offset: usize,
    src: *const c_void,
    bytes: usize,
    stream: curt_stream_t,
) -> c_int {
    guard(|| {
        let (d, src) = (at(dst, dst_offset)?, host(src, bytes, "src")?);
        let s = stream_or_current(stream)?;
        Ok(d.copy_from_host_async(src, Some(&s))?)
    })
}

/// `curt_memcpy_dtoh` on `stream` (NULL: the current stream).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_memcpy_dtoh_async(
    dst: *mut c_void,
    src: curt_memory_t,
    src_offset: usize,
    bytes: usize,
    stream: curt_stream_t,
) -> c_int {
    guard(|| {
        let (sp, dst) = (at(src, src_offset)?, host_mut(dst, bytes, "dst")?);
        let s = stream_or_current(stream)?;
        Ok(sp.copy_to_host_async(dst, Some(&s))?)
    })
}

/// `curt_memcpy_dtod` on `stream` (NULL: the current stream).
#[no_mangle]
pub extern "C" fn curt_memcpy_dtod_async(
    dst: curt_memory_t,
    dst_offset: usize,
    src: curt_memory_t,
    src_offset: usize,
    bytes: usize,
    stream: curt_stream_t,
) -> c_int {
    guard(|| {
        let s = stream_or_current(stream)?;
        Ok(at(dst, dst_offset)?.copy_from_device_async(&at(src, src_offset)?, bytes, Some(&s))?)
    })
}

/// Sets `bytes` bytes at `mem` + `offset` to `value` (its low 8 bits).
#[no_mangle]
pub extern "C" fn curt_memset(
    mem: curt_memory_t,
    offset: usize,
    value: c_int,
    bytes: usize,
) -> c_int {
    guard(|| Ok(at(mem, offset)?.memset(value as u8, bytes)?))
}

/// `curt_memset` on `stream` (NULL: the current stream).
#[no_mangle]
pub extern "C" fn curt_memset_async(
    mem: curt_memory_t,
    offset: usize,
    value: c_int,
    bytes: usize,
    stream: curt_stream_t,
) -> c_int {
    guard(|| {
        let s = stream_or_current(stream)?;
        Ok(at(mem, offset)?.memset_async(value as u8, bytes, Some(&s))?)
    })
}
