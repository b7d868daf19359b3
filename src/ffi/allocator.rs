//! The device allocator: set to a C malloc/free pair, or back to the pool; and the
//! drop-in entry points PyTorch (`CUDAPluggableAllocator`) and CuPy
//! (`CFunctionAllocator`) load from a shared library.
//!
//! The drop-in entry points hand out raw addresses, so the memory behind them lives in
//! a registry keyed by address, where `free` finds it: sharded (a mutex-guarded map
//! per shard, the shard picked by a hash of the address), so threads allocating at
//! once rarely meet on one lock.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::{Mutex, PoisonError};

use cuda_rt::memory::{CAllocator, CFreeFn, CMallocFn};
use cuda_rt::prelude::*;
use cuda_rt::stream::ExternalStream;
use cuda_rt::{get_default_memory_pool, Allocator, Device, MemoryPointer};

use super::status::{bad_arg, guard, set_last_error, unwind_guard, Fail, Res};

/// Makes `malloc(ctx, size, device)` / `free(ctx, ptr, device)` the process-wide
/// allocator of `curt_alloc`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_set_allocator(
    malloc: Option<CMallocFn>,
    free: Option<CFreeFn>,
    ctx: *mut c_void,
) -> c_int {
    guard(|| {
        let malloc = malloc.ok_or_else(|| bad_arg("malloc is NULL"))?;
        let free = free.ok_or_else(|| bad_arg("free is NULL"))?;
        // SAFETY: wrapper.h's contract for curt_set_allocator: both functions may be
        // called from any thread with `ctx` while the allocator or memory from it
        // lives, and a non-zero `malloc` result is `size` bytes of `device` memory valid
        // until `free`.
        let c = unsafe { CAllocator::new(malloc, free, ctx) };
        Ok(cuda_rt::set_allocator(Some(Allocator::C(c)))?)
    })
}

/// Makes the default pool the process-wide allocator again.
#[no_mangle]
pub extern "C" fn curt_reset_allocator() -> c_int {
    guard(|| {
        Ok(cuda_rt::set_allocator(Some(Allocator::Pool(
            get_default_memory_pool(),
        )))?)
    })
}

const SHARDS: usize = 64;

/// The memory handed out by the drop-in entry points, by address.
static REGISTRY: [Mutex<Option<HashMap<u64, MemoryPointer>>>; SHARDS] =
    [const { Mutex::new(None) }; SHARDS];

fn shard(addr: u64) -> &'static Mutex<Option<HashMap<u64, MemoryPointer>>> {
    // Pool blocks are 512-byte aligned: mix the bits above.
    let h = (addr >> 9).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58;
    &REGISTRY[h as usize % SHARDS]
}

fn register(p: MemoryPointer) -> *mut c_void {
    let addr = p.ptr();
    shard(addr)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_or_insert_with(HashMap::new)
        .insert(addr, p);
    addr as *mut c_void
}

fn unregister(ptr: *mut c_void) -> Res<MemoryPointer> {
    let addr = ptr as u64;
    let p = shard(addr)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_mut()
        .and_then(|m| m.remove(&addr));
    p.ok_or_else(|| bad_arg(format!("{addr:#x} was not allocated by curt_torch_alloc or curt_cupy_malloc, or was freed already")))
}

/// How many allocations of the drop-in entry points are live (for tests and leak
/// checks).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_dropin_live_count(count: *mut usize) -> c_int {
    guard(|| {
        let count = super::status::out(count, "count")?;
        *count = REGISTRY
            .iter()
            .map(|s| {
                s.lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .as_ref()
                    .map_or(0, HashMap::len)
            })
            .sum();
        Ok(())
    })
}

/// Runs an allocation: its pointer, or NULL with the message recorded.
fn alloc_or_null(f: impl FnOnce() -> Res<*mut c_void>) -> *mut c_void {
    unwind_guard(
        || match f() {
            Ok(p) => p,
            Err(e) => {
                let (_, msg) = e.code_and_message();
                set_last_error(&msg);
                std::ptr::null_mut()
            }
        },
        std::ptr::null_mut(),
    )
}

fn pool_alloc(size: usize, device: i32, stream: Option<ExternalStream>) -> Res<*mut c_void> {
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    let _d = Device::new(device)?.enter()?;
    let p = match &stream {
        Some(s) => {
            let _s = s.enter()?;
            get_default_memory_pool().malloc_on(device, size)?
        }
        None => get_default_memory_pool().malloc_on(device, size)?,
    };
    Ok(register(p))
}

fn free_quietly(ptr: *mut c_void) {
    let _ = guard(|| {
        if ptr.is_null() {
            return Ok(());
        }
        drop(unregister(ptr)?);
        Ok::<(), Fail>(())
    });
}

/// PyTorch's `CUDAPluggableAllocator` alloc: `size` bytes from cuda-rt's pool for
/// `device`, on the arena of `stream` (a `cudaStream_t`/`CUstream`, 0 the default).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    alloc_or_null(|| {
        let size = usize::try_from(size).map_err(|_| bad_arg(format!("negative size {size}")))?;
        // SAFETY: wrapper.h's contract for curt_torch_alloc: `stream` is 0 or a live
        // stream of `device`, alive until the memory is freed. Wrapped, not owned.
        let s = unsafe { ExternalStream::from_raw(stream.cast(), device) };
        pool_alloc(size, device, Some(s))
    })
}

/// PyTorch's `CUDAPluggableAllocator` free: gives `ptr` back to the pool.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_torch_free(
    ptr: *mut c_void,
    size: isize,
    device: c_int,
    stream: *mut c_void,
) {
    let _ = (size, device, stream);
    free_quietly(ptr);
}

/// CuPy's `CFunctionAllocator` malloc: `size` bytes from cuda-rt's pool for `device`
/// on this thread's current stream of that device.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    let _ = param;
    alloc_or_null(|| pool_alloc(size, device, None))
}

/// CuPy's `CFunctionAllocator` free.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_cupy_free(param: *mut c_void, ptr: *mut c_void, device: c_int) {
    let _ = (param, device);
    free_quietly(ptr);
}

/// The memory the drop-in entry points handed out at `ptr` (a clone of its pointer,
/// so the caller works outside the registry's lock), for `record_stream.rs`.
pub(crate) fn dropin_pointer(ptr: *mut c_void) -> Res<MemoryPointer> {
    let addr = ptr as u64;
    let p = shard(addr)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .as_ref()
        .and_then(|m| m.get(&addr).cloned());
    p.ok_or_else(|| {
        bad_arg(format!(
            "{addr:#x} was not allocated by curt_torch_alloc or curt_cupy_malloc, or was \
             freed already"
        ))
    })
}
