//! Pinned (page-locked) host memory from the default pinned pool.

use std::ffi::{c_int, c_void};
use std::sync::{Arc, Mutex};

use cuda_rt::{get_default_pinned_memory_pool, PinnedMemoryPointer};

use super::handles::{curt_pinned_t, Table};
use super::memory::curt_pool_stats_t;
use super::status::{guard, out};

/// The pinned memory C holds.
pub(crate) static PINNED: Table<Arc<Mutex<PinnedMemoryPointer>>> = Table::new(4, "pinned memory");

/// Allocates `size` bytes of pinned host memory from the default pinned pool.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pinned_malloc(size: usize, mem: *mut curt_pinned_t) -> c_int {
    guard(|| {
        let mem = out(mem, "mem")?;
        let p = get_default_pinned_memory_pool().malloc(size)?;
        *mem = PINNED.insert(Arc::new(Mutex::new(p))) as curt_pinned_t;
        Ok(())
    })
}

/// Frees `mem` (back to the pool once copies using it are done); the handle is dead
/// afterwards, and so is its address. NULL is a no-op that succeeds, as C's
/// `free(NULL)`.
#[no_mangle]
pub extern "C" fn curt_pinned_free(mem: curt_pinned_t) -> c_int {
    guard(|| {
        if mem.is_null() {
            return Ok(());
        }
        drop(PINNED.remove(mem as u64)?);
        Ok(())
    })
}

/// Writes `mem`'s host address to `*ptr` (valid until `curt_pinned_free`) and its
/// size in bytes to `*size` (when not NULL).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pinned_ptr(
    mem: curt_pinned_t,
    ptr: *mut *mut c_void,
    size: *mut usize,
) -> c_int {
    guard(|| {
        let ptr = out(ptr, "ptr")?;
        let m = PINNED.get(mem as u64)?;
        let m = m.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *ptr = m.ptr() as *mut c_void;
        if let Ok(size) = out(size, "size") {
            *size = m.len();
        }
        Ok(())
    })
}

/// Writes the default pinned pool's statistics to `*stats` (peaks as in
/// `curt_pool_stats`).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pinned_pool_stats(stats: *mut curt_pool_stats_t) -> c_int {
    guard(|| {
        let stats = out(stats, "stats")?;
        let s = get_default_pinned_memory_pool().stats();
        *stats = s.into();
        Ok(())
    })
}

/// Sets the default pinned pool's limit in bytes (0: no limit).
#[no_mangle]
pub extern "C" fn curt_pinned_pool_set_limit(bytes: u64) -> c_int {
    guard(|| {
        get_default_pinned_memory_pool().set_limit(bytes);
        Ok(())
    })
}

/// Releases the default pinned pool's cached free blocks.
#[no_mangle]
pub extern "C" fn curt_pinned_pool_free_all_blocks() -> c_int {
    guard(|| {
        get_default_pinned_memory_pool().free_all_blocks();
        Ok(())
    })
}

/// The default pinned pool's snapshot as JSON (PyTorch's `_snapshot()` shape).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pinned_pool_snapshot_json(
    buf: *mut std::ffi::c_char,
    cap: usize,
    len: *mut usize,
) -> c_int {
    super::status::guard(|| {
        let json = cuda_rt::pinned::get_default_pinned_memory_pool()
            .snapshot()
            .to_json();
        super::memory::write_text(&json, buf, cap, len)
    })
}
