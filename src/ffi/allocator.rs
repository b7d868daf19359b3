//! The device allocator: set to a C malloc/free pair, or back to the pool; and the
//! drop-in entry points PyTorch (`CUDAPluggableAllocator`) and CuPy
//! (`CFunctionAllocator`) load from a shared library.
//!
//! The drop-in entry points hand out raw addresses, so the memory behind them lives in
//! a registry keyed by address, where `free` finds it: first a lock-free entry picked
//! by a hash of the address ([`DirectMap`]: one atomic exchange to put the memory in,
//! one to take it out), else, when another address holds that entry, a sharded map (a
//! mutex-guarded map per shard, the shard picked by another hash, see [`AddrMap`]), so
//! threads allocating at once rarely meet, and an allocation freed on another thread
//! is found the same way. PyTorch passes its stream with each request, so its
//! memory comes from that stream's arena without touching the thread's current
//! device or stream (`MemoryPool::malloc_on_stream`).

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void};
use std::sync::{Mutex, PoisonError};

use cuda_rt::memory::{CAllocator, CFreeFn, CMallocFn};
use cuda_rt::stream::ExternalStream;
use cuda_rt::{get_default_memory_pool, Allocator, MemoryPointer};

use super::addr_map::AddrMap;
use super::direct_map::{DirectMap, Reservation};
use super::held::HeldMemory;
use super::status::{
    bad_arg, guard, set_last_error, unwind_guard, Fail, Res, CURT_ERROR_OUT_OF_MEMORY,
};

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

type Registry = AddrMap<HeldMemory>;

/// The memory handed out by the drop-in entry points, by address: first the entry of
/// the address's hash (lock-free, see [`DirectMap`]), else, when another address
/// holds that entry, the locked map of its shard.
static DIRECT: DirectMap<HeldMemory> = DirectMap::new();

/// The addresses whose [`DIRECT`] entry was taken.
static REGISTRY: [Mutex<Registry>; SHARDS] = [const { Mutex::new(Registry::new()) }; SHARDS];

/// This thread's [`Reservation`] of a [`DIRECT`] entry, and whether [`RELEASE_AT_EXIT`]
/// is registered to release it.
struct ThreadReservation {
    r: Cell<Option<Reservation<'static>>>,
    armed: Cell<bool>,
}

/// Releases the thread's reservation when the thread exits.
struct ReleaseAtExit;

impl Drop for ReleaseAtExit {
    fn drop(&mut self) {
        let _ = RESERVED.try_with(|t| {
            t.armed.set(false);
            if let Some(r) = t.r.take() {
                r.release();
            }
        });
    }
}

thread_local! {
    /// The [`DIRECT`] entry this thread's last free left reserved for its next
    /// allocation (see [`Reservation`]): a free + allocation pair of one thread so takes
    /// one atomic exchange in the map, not two. No destructor, so reaching it costs
    /// nothing; [`RELEASE_AT_EXIT`] empties it when the thread exits.
    static RESERVED: ThreadReservation = const {
        ThreadReservation {
            r: Cell::new(None),
            armed: Cell::new(false),
        }
    };
    static RELEASE_AT_EXIT: ReleaseAtExit = const { ReleaseAtExit };
}

/// Keeps `r` as this thread's reservation, registering [`RELEASE_AT_EXIT`] the first
/// time.
#[inline]
fn keep_reservation(r: Reservation<'static>) {
    RESERVED.with(|t| {
        if t.armed.get() {
            t.r.set(Some(r));
        } else {
            arm(t, r);
        }
    });
}

#[cold]
#[inline(never)]
fn arm(t: &ThreadReservation, r: Reservation<'static>) {
    if RELEASE_AT_EXIT.try_with(|_| ()).is_ok() {
        t.armed.set(true);
        t.r.set(Some(r));
    } else {
        // The thread is exiting: nothing would release it later.
        r.release();
    }
}

fn shard(addr: u64) -> &'static Mutex<Registry> {
    // Another mix than the map's, so that one shard's keys still spread in its map.
    let h = (addr >> 9).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> 58;
    &REGISTRY[h as usize % SHARDS]
}

#[inline]
fn register(p: HeldMemory) -> *mut c_void {
    let addr = p.ptr();
    let mut r = RESERVED.with(|t| t.r.take());
    let inserted = DIRECT.try_insert_reserved(addr, p, &mut r);
    if let Some(r) = r {
        // Another entry's: kept for a later allocation.
        RESERVED.with(|t| t.r.set(Some(r)));
    }
    if let Err(p) = inserted {
        register_locked(addr, p);
    }
    addr as *mut c_void
}

#[cold]
#[inline(never)]
fn register_locked(addr: u64, p: HeldMemory) {
    // What comes back is dropped outside the lock: an address already registered
    // (none is: the pool hands a block out once) has its old memory freed, and
    // address 0 (never handed out for a size > 0) is refused, freed, and NULL returned.
    let refused = shard(addr)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(addr, p);
    drop(refused);
}

/// [`free_quietly`] of an address that is not in [`DIRECT`]: from its shard's map, or
/// an error recorded.
#[cold]
#[inline(never)]
fn free_locked(addr: u64) {
    match unregister_locked(addr) {
        Ok(p) => drop(p),
        Err(e) => drop(record_failure(e)),
    }
}

#[cold]
#[inline(never)]
fn unregister_locked(addr: u64) -> Res<HeldMemory> {
    let p = shard(addr)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(addr);
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
        *count = DIRECT.len()
            + REGISTRY
                .iter()
                .map(|s| s.lock().unwrap_or_else(PoisonError::into_inner).len())
                .sum::<usize>();
        Ok(())
    })
}

/// Runs an allocation: its pointer, or NULL with the message recorded (and returned).
/// Inlined, with the failure out of line: the entry points' hot path is one frame.
#[inline(always)]
fn alloc_or_null(f: impl FnOnce() -> Res<*mut c_void>) -> (*mut c_void, Option<(c_int, String)>) {
    unwind_guard(
        || match f() {
            Ok(p) => (p, None),
            Err(e) => (std::ptr::null_mut(), Some(record_failure(e))),
        },
        (std::ptr::null_mut(), None),
    )
}

/// Records `e` as the thread's last error: its code and message.
#[cold]
#[inline(never)]
fn record_failure(e: Fail) -> (c_int, String) {
    let (code, msg) = e.code_and_message();
    set_last_error(&msg);
    (code, msg)
}

/// `size` bytes from the pool on `stream`'s arena (0: the legacy default stream;
/// `None`: this thread's current stream of `device`): a graph's private pool while
/// PyTorch captures on that stream (see [`graph_pools`](super::graph_pools)), else
/// the default pool.
#[inline(always)]
fn pool_alloc(size: usize, device: i32, stream: Option<*mut c_void>) -> Res<*mut c_void> {
    if size == 0 {
        return Ok(std::ptr::null_mut());
    }
    let pool = get_default_memory_pool();
    let p = match stream {
        Some(raw) => {
            // SAFETY: the entry points' contract (wrapper.h): `raw` is 0 or a live
            // stream of `device`, alive until the memory is freed. Wrapped, not owned.
            let s = unsafe { ExternalStream::from_raw(raw.cast(), device) };
            match super::graph_pools::route(device, raw) {
                Some(pool) => {
                    let p = super::graph_pools::relaxed(|| pool.malloc_on_stream(&s, size))?;
                    super::graph_pools::after_graph_alloc(device);
                    HeldMemory::Pointer(p)
                }
                None => match pool.malloc_block_on_stream(&s, size) {
                    Some(b) => HeldMemory::Block(b),
                    None => HeldMemory::Pointer(pool.malloc_on_stream(&s, size)?),
                },
            }
        }
        None => match pool.malloc_block_on(device, size) {
            Some(b) => HeldMemory::Block(b),
            None => HeldMemory::Pointer(pool.malloc_on(device, size)?),
        },
    };
    Ok(register(p))
}

/// Gives the memory at `ptr` back; an unknown `ptr` records an error, nothing else.
#[inline(always)]
fn free_quietly(ptr: *mut c_void) {
    unwind_guard(
        || {
            if ptr.is_null() {
                return;
            }
            let addr = ptr as u64;
            let mut r = RESERVED.with(|t| t.r.take());
            let direct = DIRECT.take_reserving(addr, &mut r);
            if let Some(r) = r {
                keep_reservation(r);
            }
            match direct {
                Some(p) => drop(p),
                None => free_locked(addr),
            }
        },
        (),
    )
}

/// PyTorch's `CUDAPluggableAllocator` alloc: `size` bytes from cuda-rt's pool for
/// `device`, on the arena of `stream` (a `cudaStream_t`/`CUstream`, 0 the default),
/// or from a graph's private pool while PyTorch captures on `stream`. On failure,
/// inside a process where PyTorch is loaded, PyTorch's own error is thrown (out of
/// memory as `c10::OutOfMemoryError`, Python's `torch.cuda.OutOfMemoryError`, with
/// PyTorch's "CUDA out of memory. Tried to allocate ..." and cuda-rt's figures; any
/// other failure a `RuntimeError` with cuda-rt's message; see `torch_error`);
/// elsewhere NULL with the message in `curt_last_error()`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C-unwind" fn curt_torch_alloc(
    size: isize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    let (p, failure) = alloc_or_null(|| {
        let size = usize::try_from(size).map_err(|_| bad_arg(format!("negative size {size}")))?;
        pool_alloc(size, device, Some(stream))
    });
    if let Some((code, msg)) = failure {
        // Outside the unwind guard: in PyTorch this throws (see `torch_error`), out of
        // memory as torch's own OutOfMemoryError.
        if code == CURT_ERROR_OUT_OF_MEMORY {
            let text = super::torch_error::out_of_memory_message(size as usize, device, &msg);
            super::torch_error::raise_oom_in_torch(&text);
        } else {
            super::torch_error::raise_in_torch(&msg);
        }
    }
    p
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

/// The drop-in allocation for callers that pass the stream and check the result
/// themselves (`python/cuda_rt_alloc.py`'s CuPy allocator): `size` bytes on the arena of
/// `stream` (0: the legacy default stream) of `device`; NULL with the message in
/// `curt_last_error()` on failure (never thrown, whatever is loaded). Freed by
/// `curt_cupy_free` or `curt_torch_free`.
///
/// # Safety
/// `stream` is 0 or a live stream of `device`, alive until the memory is freed.
#[no_mangle]
pub unsafe extern "C" fn curt_dropin_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    alloc_or_null(|| pool_alloc(size, device, Some(stream))).0
}

/// What `curt_cupy_malloc`'s `param` points to (`curt_cupy_param_t` in wrapper.h):
/// how to read CuPy's current stream and how to raise a Python exception, both called
/// with the GIL held, as CuPy's `CFunctionAllocator` calls the malloc.
#[repr(C)]
#[allow(non_camel_case_types)]
pub struct curt_cupy_param_t {
    /// CuPy's `get_current_stream_ptr` (its C API): the current `cudaStream_t`, or -1
    /// with a Python exception set. NULL: cuda-rt's current stream.
    pub current_stream: Option<unsafe extern "C" fn() -> isize>,
    /// `PyErr_SetString`: sets the exception a failed allocation raises. NULL: none.
    pub set_error: Option<unsafe extern "C" fn(*mut c_void, *const c_char)>,
    /// The exception type (a `PyObject*`) raised when the pool is out of memory.
    pub out_of_memory: *mut c_void,
    /// The exception type raised on any other failure.
    pub error: *mut c_void,
}

/// CuPy's `CFunctionAllocator` malloc: `size` bytes from cuda-rt's pool for `device`,
/// on the arena of CuPy's current stream when `param` (a `curt_cupy_param_t`) says how
/// to read it, else of cuda-rt's current stream. A failure sets the Python exception
/// `param` names and returns `(void*)-1`, the value after which CuPy's Cython code
/// raises it (NULL where no exception was set), with the message in
/// `curt_last_error()`.
///
/// # Safety
/// `param` is NULL or points to a `curt_cupy_param_t` whose functions may be called on
/// this thread now (CuPy holds the GIL while it calls this) and whose exception types
/// are live Python types; a stream it reports is a live stream of `device`, alive until
/// the memory is freed.
#[no_mangle]
pub unsafe extern "C" fn curt_cupy_malloc(
    param: *mut c_void,
    size: usize,
    device: c_int,
) -> *mut c_void {
    // SAFETY: NULL or a live `curt_cupy_param_t` (the caller's contract).
    let param = unsafe { param.cast::<curt_cupy_param_t>().as_ref() };
    let stream = match param.and_then(|p| p.current_stream) {
        // SAFETY: callable now (the caller's contract); it takes no argument.
        Some(current) => match unsafe { current() } {
            // CuPy's error is set: CuPy raises it once this returns.
            -1 => {
                set_last_error("CuPy's current stream could not be read");
                return CUPY_RAISE;
            }
            s => Some(s as *mut c_void),
        },
        None => None,
    };
    let (p, failure) = alloc_or_null(|| pool_alloc(size, device, stream));
    if let (Some((code, msg)), Some(param)) = (failure, param) {
        let kind = if code == CURT_ERROR_OUT_OF_MEMORY {
            param.out_of_memory
        } else {
            param.error
        };
        if let (Some(set), false) = (param.set_error, kind.is_null()) {
            // A message with a NUL inside (none is made so) would be cut there.
            let text = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
            // SAFETY: `set` and `kind` are live (the caller's contract); `text` is a
            // NUL-terminated string alive for the call (Python copies it).
            unsafe { set(kind, text.as_ptr()) };
            return CUPY_RAISE;
        }
    }
    p
}

/// What `curt_cupy_malloc` returns once it has set a Python exception: CuPy's Cython
/// `_call_malloc` is `except? -1` (Cython 3's default), so it looks for an exception
/// only when the result is -1; NULL with an exception set would surface as a
/// `SystemError` instead.
const CUPY_RAISE: *mut c_void = usize::MAX as *mut c_void;

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
    if let Some(p) = DIRECT.with(addr, HeldMemory::pointer) {
        return Ok(p);
    }
    let p = shard(addr)
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get_mut(addr)
        .map(HeldMemory::pointer);
    p.ok_or_else(|| {
        bad_arg(format!(
            "{addr:#x} was not allocated by curt_torch_alloc or curt_cupy_malloc, or was \
             freed already"
        ))
    })
}
