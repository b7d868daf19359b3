//! Pinned (page-locked) host memory from the default pinned pool.

use std::ffi::{c_int, c_void};

use cuda_rt::pinned::default_pinned_memory_pool;
use cuda_rt::pinned::PinnedBlock;

use super::handles::{curt_pinned_t, Table};
use super::memory::curt_pool_stats_t;
use super::spare::thread_spare;
use super::status::{guard, out};

/// The pinned memory C holds, as bare blocks of the default pinned pool: C reaches
/// the memory through its address alone (its copies name host memory by address and
/// are over, or staged, when they return), so no copy ever needs the fence a
/// `PinnedMemoryPointer`'s owner keeps, and the block goes back to the pool at
/// `curt_pinned_free`.
pub(crate) static PINNED: Table<PinnedBlock> = Table::new(4, "pinned memory");

// This thread's spare slot of [`PINNED`]: a `curt_pinned_free` + `curt_pinned_malloc`
// pair of one thread makes no exchange on the table's free list.
thread_spare!(SPARE, GIVE_BACK_AT_EXIT, PinnedBlock);

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
        // The slot first, so the pool's block goes from its result to the slot
        // (built before it, the block was copied through the stack twice more, each
        // copy a load waiting on its stores).
        let v = SPARE.with(|t| PINNED.vacant(t.spare()));
        match default_pinned_memory_pool().malloc_block(size) {
            Ok(p) => *mem = v.fill(p) as curt_pinned_t,
            Err(e) => {
                SPARE.with(|t| v.keep(t.spare(), t.may_keep(&GIVE_BACK_AT_EXIT)));
                return Err(e.into());
            }
        }
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
        // Dropped where it lies (back to the pool), then the slot is kept for this
        // thread's next `curt_pinned_malloc`.
        if SPARE
            .with(|t| PINNED.remove_spared(mem as u64, t.spare(), t.may_keep(&GIVE_BACK_AT_EXIT)))
        {
            Ok(())
        } else {
            Err(PINNED.refuse(mem as u64))
        }
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
        let (addr, len) = PINNED.with(mem as u64, |m| (m.ptr(), m.len()))?;
        *ptr = addr as *mut c_void;
        if let Ok(size) = out(size, "size") {
            *size = len;
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
        let s = default_pinned_memory_pool().stats();
        *stats = s.into();
        Ok(())
    })
}

/// Sets the default pinned pool's limit in bytes (0: no limit).
#[no_mangle]
pub extern "C" fn curt_pinned_pool_set_limit(bytes: u64) -> c_int {
    guard(|| {
        default_pinned_memory_pool().set_limit(bytes);
        Ok(())
    })
}

/// Releases the default pinned pool's cached free blocks.
#[no_mangle]
pub extern "C" fn curt_pinned_pool_free_all_blocks() -> c_int {
    guard(|| {
        default_pinned_memory_pool().free_all_blocks();
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
        let json = default_pinned_memory_pool().snapshot().to_json();
        super::memory::write_text(&json, buf, cap, len)
    })
}
