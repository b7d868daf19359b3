//! Private pools for CUDA graphs captured by PyTorch (`torch.cuda.graph`), through
//! the hooks of its pluggable allocator: `beginAllocateToPool`,
//! `endAllocateToPool` and `releasePool`.
//!
//! A graph replays into the addresses it was captured with, long after the capture:
//! memory allocated and freed during the capture must stay the graph's, or the next
//! tensor allocated after the capture would share it with every replay. So while a
//! window is open (between begin and end), an allocation on a stream that is
//! capturing comes from a pool of its own, one per PyTorch mempool id; blocks freed
//! during the capture go back to that pool (reused by later allocations of the same
//! capture, in stream order, as PyTorch's own allocator does). The pool lives until
//! PyTorch releases it as many times as it began allocating to it (graphs sharing
//! a pool through `graph_pool_handle()` each count); then its cached memory goes back
//! to the driver, and each block still held goes back when freed.
//!
//! PyTorch passes a filter (a `std::function`) telling which streams belong to the
//! capture; a C library cannot call it, so the filter used is the driver's: a stream
//! whose capture is active allocates into the window opened last on its device that
//! it was first seen in (its capture id is bound to the window at its first
//! allocation). Allocations on streams that are not capturing go to the default
//! pool as usual. With no window open, the check is one relaxed atomic load.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::cuda_sys::result;
use cuda_rt::MemoryPool;

use super::status::{guard, out, unwind_guard};

/// PyTorch's `MempoolId_t` (a pair of `unsigned long long`) on one device.
type PoolKey = (i32, u64, u64);

struct Window {
    key: PoolKey,
    /// The driver's id of the capture allocating into this window, once seen.
    capture: Option<u64>,
}

struct Pools {
    /// Each private pool and how many begins it has not been released for.
    pools: HashMap<PoolKey, (MemoryPool, usize)>,
    /// Open windows, oldest first.
    windows: Vec<Window>,
}

/// How many windows are open: the allocation path looks no further when 0.
static OPEN: AtomicUsize = AtomicUsize::new(0);
static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

fn with_pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    let mut g = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(|| Pools {
        pools: HashMap::new(),
        windows: Vec::new(),
    }))
}

/// The private pool an allocation on `stream` of `device` goes to, if a window is open
/// and the stream is capturing; `None` otherwise (the default pool's turn).
#[inline]
pub(super) fn route(device: i32, stream: *mut c_void) -> Option<MemoryPool> {
    if OPEN.load(Ordering::Relaxed) == 0 {
        return None;
    }
    route_slow(device, stream)
}

#[cold]
fn route_slow(device: i32, stream: *mut c_void) -> Option<MemoryPool> {
    // SAFETY: curt_torch_alloc's contract: `stream` is 0 or a live stream of `device`,
    // whose context PyTorch's runtime made current for this call.
    let (status, id, _) = unsafe { result::stream::get_capture_info(stream.cast()) }.ok()?;
    if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return None;
    }
    with_pools(|p| {
        let i = match p.windows.iter().rposition(|w| w.capture == Some(id)) {
            Some(i) => i,
            None => {
                let i = p
                    .windows
                    .iter()
                    .rposition(|w| w.key.0 == device && w.capture.is_none())?;
                p.windows[i].capture = Some(id);
                i
            }
        };
        let key = p.windows[i].key;
        p.pools.get(&key).map(|(pool, _)| pool.clone())
    })
}

/// Runs `f` (a malloc from a graph's pool) with this thread's capture mode relaxed:
/// a global-mode capture refuses `cuMemAlloc` on every thread and invalidates itself,
/// while a graph's pool must grow during its capture (the new memory is the graph's
/// for good). PyTorch's own allocator does the same around its `cudaMalloc`.
pub(super) fn relaxed<R>(f: impl FnOnce() -> R) -> R {
    let relaxed = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    let prev = result::stream::exchange_capture_mode(relaxed).ok();
    let r = f();
    if let Some(m) = prev {
        let _ = result::stream::exchange_capture_mode(m);
    }
    r
}

/// PyTorch's `beginAllocateToPool(device, mempool_id, filter)`: from now until the
/// matching end, allocations on capturing streams of `device` go to the private pool
/// of `(id0, id1)`, made on first use. `filter` (a `std::function*`) is not called;
/// see the module docs.
///
/// # Safety
/// None beyond the C signature: the arguments are plain values and `filter` is
/// never dereferenced. (An `unsafe` export for symmetry with PyTorch's other hooks:
/// it is called through a function pointer cast from PyTorch.)
#[no_mangle]
pub unsafe extern "C" fn curt_torch_begin_allocate_to_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    filter: *mut c_void,
) {
    let _ = filter;
    unwind_guard(
        || {
            with_pools(|p| {
                let key = (device, id0, id1);
                p.pools
                    .entry(key)
                    .or_insert_with(|| (MemoryPool::new(), 0))
                    .1 += 1;
                p.windows.push(Window { key, capture: None });
                OPEN.store(p.windows.len(), Ordering::Relaxed);
            })
        },
        (),
    )
}

/// PyTorch's `endAllocateToPool(device, mempool_id)`: the window of `(id0, id1)`
/// closes; the pool stays the graph's until released.
#[no_mangle]
pub extern "C" fn curt_torch_end_allocate_to_pool(device: c_int, id0: u64, id1: u64) {
    unwind_guard(
        || {
            with_pools(|p| {
                if let Some(i) = p.windows.iter().rposition(|w| w.key == (device, id0, id1)) {
                    p.windows.remove(i);
                }
                OPEN.store(p.windows.len(), Ordering::Relaxed);
            })
        },
        (),
    )
}

/// PyTorch's `releasePool(device, mempool_id)` (a graph using the pool was reset or
/// destroyed): once released as often as begun, the private pool is dropped: its
/// cached memory goes back to the driver now, blocks still held when they are freed.
#[no_mangle]
pub extern "C" fn curt_torch_release_pool(device: c_int, id0: u64, id1: u64) {
    unwind_guard(
        || {
            let dropped = with_pools(|p| {
                let key = (device, id0, id1);
                match p.pools.get_mut(&key) {
                    Some((_, uses)) if *uses > 1 => {
                        *uses -= 1;
                        None
                    }
                    Some(_) => p.pools.remove(&key).map(|(pool, _)| pool),
                    None => None,
                }
            });
            // Outside the lock: giving memory back calls the driver.
            drop(dropped);
        },
        (),
    )
}

/// Writes the bytes reserved now by the private graph pools of `device` (PyTorch's
/// captured graphs) to `*bytes`.
///
/// # Safety
/// `bytes` is NULL (refused with an error) or valid for a write of a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn curt_torch_graph_pools_reserved(device: c_int, bytes: *mut u64) -> c_int {
    guard(|| {
        let out = out(bytes, "bytes")?;
        *out = with_pools(|p| {
            p.pools
                .iter()
                .filter(|(k, _)| k.0 == device)
                .map(|(_, (pool, _))| pool.device_stats(device).total_bytes)
                .sum()
        });
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uses(key: PoolKey) -> Option<usize> {
        with_pools(|p| p.pools.get(&key).map(|(_, n)| *n))
    }

    #[test]
    fn a_pool_lives_until_released_as_often_as_begun() {
        let k = (0, 0xfeed, 1);
        // SAFETY: plain values; the filter is never read.
        unsafe { curt_torch_begin_allocate_to_pool(0, k.1, k.2, std::ptr::null_mut()) };
        assert!(OPEN.load(Ordering::Relaxed) >= 1);
        curt_torch_end_allocate_to_pool(0, k.1, k.2);
        // SAFETY: as above.
        unsafe { curt_torch_begin_allocate_to_pool(0, k.1, k.2, std::ptr::null_mut()) };
        curt_torch_end_allocate_to_pool(0, k.1, k.2);
        assert_eq!(uses(k), Some(2), "two graphs share the pool");
        curt_torch_release_pool(0, k.1, k.2);
        assert_eq!(uses(k), Some(1));
        curt_torch_release_pool(0, k.1, k.2);
        assert_eq!(uses(k), None, "released by both graphs");
        curt_torch_release_pool(0, k.1, k.2); // unknown: ignored
        let mut bytes = u64::MAX;
        // SAFETY: a valid out-pointer.
        assert_eq!(unsafe { curt_torch_graph_pools_reserved(0, &mut bytes) }, 0);
        assert_eq!(bytes, 0);
    }
}
