//! Device memory: the caching pool (on a stream's arena), plain device, managed and
//! stream-ordered allocation, and the pool's statistics and limit.

use std::ffi::{c_char, c_int};
use std::sync::Arc;

use cuda_rt::memory::{Memory, MemoryAsyncPool, PooledBlock};
use cuda_rt::prelude::*;
use cuda_rt::stream::ExternalStream;
use cuda_rt::{get_default_memory_pool, MemoryPointer};

use super::handles::{curt_memory_t, curt_stream_t, Table, Vacant};
use super::held::HeldMemory;
use super::spare::thread_spare;
use super::status::{guard, out, Fail, Res};
use super::stream::stream_or_current;

/// The device memory C holds.
pub(crate) static MEMORY: MemoryTable = MemoryTable(Table::new(3, "memory"));

/// The memory handles' table. A pooled block is held bare ([`HeldMemory`]), so a
/// `curt_malloc` + `curt_free` pair costs no memory object; a lookup turns it into a
/// pointer (once) with the table's exclusive access ([`Table::with_mut`]).
pub(crate) struct MemoryTable(Table<HeldMemory>);

impl MemoryTable {
    /// The memory behind `handle`, as a pointer.
    pub(crate) fn get(&self, handle: u64) -> Res<MemoryPointer> {
        self.0.with_mut(handle, HeldMemory::pointer)
    }

    /// Puts `p` in the table and returns its handle.
    pub(crate) fn insert(&'static self, p: MemoryPointer) -> u64 {
        self.insert_held(p.into())
    }

    /// Puts `m` in the table, into this thread's spare slot when it has one (the slot
    /// its last free emptied: no exchange on the table's free list), and returns its
    /// handle. Every door that makes a handle comes here, so each pair with
    /// `curt_free` costs the same.
    #[inline(always)]
    fn insert_held(&'static self, m: HeldMemory) -> u64 {
        self.vacant().fill(m)
    }

    /// A slot for an insert: this thread's spare when it has one, else a free one.
    #[inline(always)]
    fn vacant(&'static self) -> Vacant<HeldMemory> {
        SPARE.with(|t| self.0.vacant(t.spare()))
    }

    /// Gives `v` back unfilled (to this thread's spare when it may keep one).
    #[cold]
    fn unfill(&'static self, v: Vacant<HeldMemory>) {
        SPARE.with(|t| v.keep(t.spare(), t.may_keep(&GIVE_BACK_AT_EXIT)))
    }

    /// The handle of `size` bytes on `stream`'s arena (see [`curt_malloc`]) and their
    /// address. The slot is taken first and the steady pair's cached block written
    /// straight into it: built after the slot is known, it goes from the pool's
    /// registers to the table, never through a `Res` or a copy on the stack (each a
    /// load waiting on stores, which was a third of the C pair's extra cost).
    #[inline(always)]
    fn malloc(&'static self, size: usize, stream: curt_stream_t) -> Res<(u64, u64)> {
        self.malloc_or(size, stream, || malloc_held(size, stream))
    }

    /// [`malloc`](Self::malloc) with `general` for when there is no cached block.
    #[inline(always)]
    fn malloc_or(
        &'static self,
        size: usize,
        stream: curt_stream_t,
        general: impl FnOnce() -> Res<HeldMemory>,
    ) -> Res<(u64, u64)> {
        let v = self.vacant();
        if let Some(b) = cached_block(size, stream) {
            let addr = b.ptr();
            return Ok((v.fill(HeldMemory::Block(b)), addr));
        }
        match general() {
            Ok(m) => {
                let addr = m.ptr();
                Ok((v.fill(m), addr))
            }
            Err(e) => {
                self.unfill(v);
                Err(e)
            }
        }
    }
}

// This thread's spare slot of [`MEMORY`] (see `Spare`): a `curt_free` + `curt_malloc`
// pair of one thread makes no exchange on the table's free list.
thread_spare!(SPARE, GIVE_BACK_AT_EXIT, HeldMemory);

/// A memory pool's statistics (`curt_pool_stats_t`).
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct curt_pool_stats_t {
    /// Bytes handed out.
    pub used_bytes: u64,
    /// Bytes reserved from the device.
    pub total_bytes: u64,
    /// Bytes cached (reserved, not handed out).
    pub free_bytes: u64,
    /// Free blocks cached.
    pub n_free_blocks: u64,
    /// Peak of `used_bytes`.
    pub peak_used_bytes: u64,
    /// Peak of `total_bytes`.
    pub peak_total_bytes: u64,
    /// Mallocs served (cache hits and misses).
    pub mallocs: u64,
    /// Blocks given back.
    pub frees: u64,
    /// Mallocs served from the cache.
    pub cache_hits: u64,
    /// Mallocs that found no cached fit.
    pub cache_misses: u64,
    /// Allocations asked of the driver (`cuMemAlloc` or the pool's backend).
    pub backend_allocs: u64,
    /// Allocations given back to the driver.
    pub backend_frees: u64,
}

impl From<cuda_rt::memory::PoolStats> for curt_pool_stats_t {
    fn from(s: cuda_rt::memory::PoolStats) -> Self {
        curt_pool_stats_t {
            used_bytes: s.used_bytes,
            total_bytes: s.total_bytes,
            free_bytes: s.free_bytes,
            n_free_blocks: s.n_free_blocks,
            peak_used_bytes: s.peak_used_bytes,
            peak_total_bytes: s.peak_total_bytes,
            mallocs: s.mallocs,
            frees: s.frees,
            cache_hits: s.cache_hits,
            cache_misses: s.cache_misses,
            backend_allocs: s.backend_allocs,
            backend_frees: s.backend_frees,
        }
    }
}

fn put(mem: *mut curt_memory_t, p: Res<MemoryPointer>) -> Res<()> {
    let slot = out(mem, "mem")?;
    *slot = MEMORY.insert(p?) as curt_memory_t;
    Ok(())
}

/// Allocates `size` bytes from the default pool on `stream`'s arena (NULL: the current
/// stream), on the stream's device. Size 0 gives a handle to a null pointer.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_malloc(
    size: usize,
    stream: curt_stream_t,
    mem: *mut curt_memory_t,
) -> c_int {
    guard(|| {
        let slot = out(mem, "mem")?;
        *slot = MEMORY.malloc(size, stream)?.0 as curt_memory_t;
        Ok(())
    })
}

/// The block this thread's last free of `size` bytes on `stream`'s arena (NULL: the
/// current stream of the current device) parked, when a malloc of `size` gets it
/// back: the steady pair's malloc, with nothing to fail (`None` also for a bad
/// stream handle, refused on the general path). Nothing is made current:
/// the pool takes the arena from the stream it is given (entering the device and the
/// stream, and leaving them, were half of the pair's cost).
#[inline(always)]
fn cached_block(size: usize, stream: curt_stream_t) -> Option<PooledBlock> {
    if stream.is_null() {
        // The current stream of the current device: the arena `malloc` uses.
        let device = cuda_rt::device::get_device_id();
        get_default_memory_pool().malloc_block_on(device, size)
    } else {
        // A bad handle gets its error on the general path.
        let (device, raw) = super::stream::live_raw(stream)?;
        // SAFETY: `raw` is the stream of a handle live just now: one this shim keeps
        // alive, or one whose owner keeps it alive while the handle and memory
        // allocated on it are used (curt_stream_wrap's contract). The block path only
        // reads its address and device, as the arena's key.
        let s = unsafe { ExternalStream::from_raw(raw as *mut _, device) };
        get_default_memory_pool().malloc_block_on_stream(&s, size)
    }
}

/// `size` bytes of the default pool on `stream`'s arena (NULL: the current stream of
/// the current device), as the table holds them, when [`cached_block`] had none: a
/// cached block comes bare (see `HeldMemory`), else a pointer; a new segment goes to
/// the device's primary context. Out of line, so that the steady pair carries none of
/// its frame.
#[inline(never)]
fn malloc_held(size: usize, stream: curt_stream_t) -> Res<HeldMemory> {
    let pool = get_default_memory_pool();
    Ok(if stream.is_null() {
        // `cached_block` found no parked block for this size.
        pool.malloc_on(cuda_rt::device::get_device_id(), size)?
            .into()
    } else {
        let s = stream_or_current(stream)?;
        match pool.malloc_block_on_stream(&s, size) {
            Some(b) => HeldMemory::Block(b),
            None => pool.malloc_on_stream(&s, size)?.into(),
        }
    })
}

/// [`curt_malloc`] that also writes the device address to `*ptr`, so that the buffer
/// needs no `curt_memory_ptr` call (size 0: a null address).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_malloc_ptr(
    size: usize,
    stream: curt_stream_t,
    mem: *mut curt_memory_t,
    ptr: *mut u64,
) -> c_int {
    guard(|| {
        // Both out-pointers checked before anything is allocated: nothing to undo.
        let ptr = out(ptr, "ptr")?;
        let slot = out(mem, "mem")?;
        let (handle, addr) = MEMORY.malloc(size, stream)?;
        *slot = handle as curt_memory_t;
        *ptr = addr;
        Ok(())
    })
}

/// Allocates `size` bytes with the current allocator (`curt_set_allocator`; the
/// default pool unless set) on the current device and stream.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_alloc(size: usize, mem: *mut curt_memory_t) -> c_int {
    guard(|| {
        let slot = out(mem, "mem")?;
        if cuda_rt::memory::alloc_takes_default_pool() {
            // The default pool on the current stream: `curt_malloc`'s door (the cached
            // block bare), `alloc` itself when there is none.
            let general = || Ok(cuda_rt::alloc(size)?.into());
            *slot = MEMORY.malloc_or(size, std::ptr::null_mut(), general)?.0 as curt_memory_t;
            return Ok(());
        }
        put(mem, Ok(cuda_rt::alloc(size)?))
    })
}

/// Allocates `size` bytes of plain device memory (`cuMemAlloc`, no pool) on `device`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_malloc_device(
    device: c_int,
    size: usize,
    mem: *mut curt_memory_t,
) -> c_int {
    guard(|| {
        out(mem, "mem")?;
        let m = Memory::new_on(device, size)?;
        put(mem, Ok(MemoryPointer::from_memory(Arc::new(m))))
    })
}

/// Allocates `size` bytes of managed (unified) memory on the current device.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_malloc_managed(size: usize, mem: *mut curt_memory_t) -> c_int {
    guard(|| {
        out(mem, "mem")?;
        put(mem, Ok(cuda_rt::malloc_managed(size)?))
    })
}

/// Allocates `size` bytes from the driver's stream-ordered pool of `stream`'s device,
/// ordered on `stream` (NULL: the current stream); freed in order on that stream.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_malloc_async(
    size: usize,
    stream: curt_stream_t,
    mem: *mut curt_memory_t,
) -> c_int {
    guard(|| {
        out(mem, "mem")?;
        let s = stream_or_current(stream)?;
        let pool = MemoryAsyncPool::current(s.device_id())?;
        put(mem, Ok(pool.malloc_on(size, &s)?))
    })
}

/// Frees `mem` (back to its pool or allocator once queued work using it is done); the
/// handle is dead afterwards. NULL is a no-op that succeeds, as C's `free(NULL)`.
#[no_mangle]
pub extern "C" fn curt_free(mem: curt_memory_t) -> c_int {
    guard(|| {
        if mem.is_null() {
            return Ok(());
        }
        // The memory is dropped (back to its pool) before the slot is kept for this
        // thread's next `curt_malloc`, in one visit to the thread's spare.
        if SPARE.with(|t| {
            MEMORY
                .0
                .remove_spared(mem as u64, t.spare(), t.may_keep(&GIVE_BACK_AT_EXIT))
        }) {
            Ok(())
        } else {
            Err(MEMORY.0.refuse(mem as u64))
        }
    })
}

/// Writes `mem`'s device address to `*ptr`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_memory_ptr(mem: curt_memory_t, ptr: *mut u64) -> c_int {
    guard(|| {
        let ptr = out(ptr, "ptr")?;
        *ptr = MEMORY.0.with_mut(mem as u64, |m| m.ptr())?;
        Ok(())
    })
}

/// Writes `mem`'s size in bytes to `*size`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_memory_size(mem: curt_memory_t, size: *mut usize) -> c_int {
    guard(|| {
        let size = out(size, "size")?;
        *size = MEMORY.0.with_mut(mem as u64, |m| m.size())?;
        Ok(())
    })
}

/// `device` when it is a device of this machine, else the error that says why not
/// (no driver, or an id out of range): statistics of a device that does not exist
/// are an error, not zeros.
pub(crate) fn existing_device(device: c_int) -> Res<c_int> {
    Ok(cuda_rt::Device::new(device)?.id())
}

/// Writes the default pool's statistics for `device` to `*stats` (an error for a
/// device that does not exist). The peaks are the pool's since its last
/// `curt_pool_reset_peaks`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pool_stats(device: c_int, stats: *mut curt_pool_stats_t) -> c_int {
    guard(|| {
        let stats = out(stats, "stats")?;
        let device = existing_device(device)?;
        let s = super::graph_pools::default_pool_stats(device);
        *stats = s.into();
        Ok(())
    })
}

/// Restarts the peaks of `device` from the current values: the default pool's (what
/// `curt_pool_stats` reports) and those with PyTorch's graph pools
/// (`curt_torch_memory_peaks`). torch's `reset_peak_memory_stats()` is refused under a
/// pluggable allocator; this is the call to make instead. An error for a device that
/// does not exist.
#[no_mangle]
pub extern "C" fn curt_pool_reset_peaks(device: c_int) -> c_int {
    guard(|| {
        let device = existing_device(device)?;
        super::graph_pools::reset_peaks(device);
        Ok(())
    })
}

/// Sets the default pool's limit in bytes per device (0: no limit).
#[no_mangle]
pub extern "C" fn curt_pool_set_limit(bytes: u64) -> c_int {
    guard(|| Ok(get_default_memory_pool().set_limit(bytes)?))
}

/// Writes the default pool's limit in bytes (0: none) to `*bytes`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pool_get_limit(bytes: *mut u64) -> c_int {
    guard(|| {
        let bytes = out(bytes, "bytes")?;
        *bytes = get_default_memory_pool().get_limit()?;
        Ok(())
    })
}

/// Writes `json` NUL-terminated into `buf` of `cap` bytes and its length (without the
/// NUL) to `*len`; when `cap` is too small (or `buf` is NULL) only `*len` is written
/// and the call fails with CURT_ERROR_INVALID_ARGUMENT, so the caller can retry with
/// `*len + 1` bytes.
pub(crate) fn write_text(json: &str, buf: *mut c_char, cap: usize, len: *mut usize) -> Res<()> {
    let len = out(len, "len")?;
    *len = json.len();
    if buf.is_null() || cap <= json.len() {
        return Err(Fail::Rt(cuda_rt::Error::invalid_argument(
            cuda_rt::ArgumentKind::OutOfBounds {
                requested: json.len() as u64 + 1,
                available: if buf.is_null() { 0 } else { cap as u64 },
            },
            format!(
                "the text needs {} bytes (with its NUL) and the buffer holds {}",
                json.len() + 1,
                if buf.is_null() { 0 } else { cap }
            ),
        )));
    }
    // SAFETY: `buf` is non-null and, as wrapper.h documents, valid for `cap` bytes,
    // more than the text and its NUL (checked above); the text does not overlap it.
    unsafe {
        std::ptr::copy_nonoverlapping(json.as_ptr(), buf.cast::<u8>(), json.len());
        *buf.add(json.len()) = 0;
    }
    Ok(())
}

/// The default pool's snapshot on `device` as JSON (PyTorch's `_snapshot()` shape).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_pool_snapshot_json(
    device: c_int,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> c_int {
    guard(|| {
        out(len, "len")?;
        let device = existing_device(device)?;
        let json = get_default_memory_pool().snapshot(device).to_json();
        write_text(&json, buf, cap, len)
    })
}

/// Releases the default pool's cached free blocks on every device.
#[no_mangle]
pub extern "C" fn curt_pool_free_all_blocks() -> c_int {
    guard(|| {
        get_default_memory_pool().free_all_blocks(None);
        Ok(())
    })
}
