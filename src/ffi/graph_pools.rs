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
//! whose capture is active allocates into the window it was bound to at its first
//! allocation: the latest unbound window of its device opened by the allocating
//! thread (PyTorch opens it on the thread that begins the capture), else the latest
//! unbound one of its device. Allocations on streams that are not capturing go to
//! the default pool as usual. With no window open, the check is one relaxed atomic
//! load.
//!
//! # Peaks with the graph pools
//! PyTorch's `max_memory_reserved()` counts its graphs' private pools; so does
//! `curt_torch_memory_peaks`. The reserved bytes of the graph pools of a device (`G`)
//! change only here: when a graph pool grows during a capture, and when one is
//! released. At each such change the book of the device is folded: the interval since
//! the last fold had the graph pools at the `G` recorded then, so its combined peak is
//! the default pool's peak since the last fold plus that `G`; then the new `G` is
//! recorded and the default pool's peaks restart from its current values (what
//! `curt_pool_stats` reports keeps the larger of the folded and the running peak). So
//! the combined peak is exact for reserved bytes; for bytes in use, memory of the
//! graph pools freed between two folds still counts until the next (an upper bound),
//! as the default pool's own in-use peak across its arenas already is. A device whose
//! graph pools never existed has no book: its peaks are the default pool's.

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::thread::ThreadId;

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::cuda_sys::result;
use cuda_rt::memory::PoolStats;
use cuda_rt::{get_default_memory_pool, MemoryPool};

use super::memory::existing_device;
use super::status::{guard, out, unwind_guard};

/// PyTorch's `MempoolId_t` (a pair of `unsigned long long`) on one device.
type PoolKey = (i32, u64, u64);

struct Window {
    key: PoolKey,
    /// The driver's id of the capture allocating into this window, once seen.
    capture: Option<u64>,
    /// The thread that opened it: PyTorch begins allocating to a graph's pool on the
    /// thread that then begins the capture (`CUDAGraph::capture_begin`).
    thread: ThreadId,
}

/// The window that capture `id`'s allocation on `device`, made on `thread`, goes to:
/// the one bound to `id` already, else an unbound one of the device opened by
/// `thread` (the latest), else any unbound one of the device (the latest); `bind`
/// says whether the capture is to be bound to it now.
///
/// The thread comes first: two threads capturing at once (each in its window, as
/// `torch.cuda.graph` does with its own pool) would otherwise bind each capture to
/// the window opened last, the other thread's, and each graph's memory would live in
/// the other graph's pool: releasing one graph's pool then gives back memory the
/// other graph still replays into.
fn pick_window(
    windows: &[Window],
    device: i32,
    id: u64,
    thread: ThreadId,
) -> Option<(usize, bool)> {
    if let Some(i) = windows.iter().rposition(|w| w.capture == Some(id)) {
        return Some((i, false));
    }
    let unbound = |w: &&Window| w.key.0 == device && w.capture.is_none();
    windows
        .iter()
        .rposition(|w| unbound(&w) && w.thread == thread)
        .or_else(|| windows.iter().rposition(|w| unbound(&w)))
        .map(|i| (i, true))
}

struct Pools {
    /// Each private pool and how many begins it has not been released for.
    pools: HashMap<PoolKey, (MemoryPool, usize)>,
    /// Open windows, oldest first.
    windows: Vec<Window>,
    /// The peaks of each device that has had graph pools (see the module docs).
    peaks: HashMap<i32, Peaks>,
}

/// A device's peaks with its graph pools, as of the last fold.
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    /// The default pool's peaks before its counters last restarted.
    default_used: u64,
    default_total: u64,
    /// The peaks of the default pool and the graph pools together.
    all_used: u64,
    all_total: u64,
    /// What the graph pools held (in use, reserved) at the last fold.
    graphs_used: u64,
    graphs_total: u64,
}

/// In-use and reserved bytes of the graph pools of `device` now.
fn graph_bytes(p: &Pools, device: i32) -> (u64, u64) {
    p.pools
        .iter()
        .filter(|(k, _)| k.0 == device)
        .map(|(_, (pool, _))| pool.device_stats(device))
        .fold((0, 0), |(u, t), s| (u + s.used_bytes, t + s.total_bytes))
}

/// Folds the peaks of `device` (the graph pools changed: see the module docs) and
/// restarts the default pool's peak counters there.
fn fold(device: i32) {
    let pool = get_default_memory_pool();
    with_pools(|p| {
        let (gu, gt) = graph_bytes(p, device);
        // Read under the lock, so that two folds do not interleave between the read
        // and the restart.
        let s = pool.device_stats(device);
        let e = p.peaks.entry(device).or_default();
        e.default_used = e.default_used.max(s.peak_used_bytes);
        e.default_total = e.default_total.max(s.peak_total_bytes);
        e.all_used = e
            .all_used
            .max(s.peak_used_bytes + e.graphs_used)
            .max(s.used_bytes + gu);
        e.all_total = e
            .all_total
            .max(s.peak_total_bytes + e.graphs_total)
            .max(s.total_bytes + gt);
        e.graphs_used = gu;
        e.graphs_total = gt;
        pool.reset_device_peaks(device);
    });
}

/// A graph's pool on `device` has just served an allocation (it may have grown).
pub(super) fn after_graph_alloc(device: i32) {
    fold(device);
}

/// The default pool's statistics on `device`, its peaks since the last
/// `curt_pool_reset_peaks` (folds included).
pub(super) fn default_pool_stats(device: i32) -> PoolStats {
    let mut s = get_default_memory_pool().device_stats(device);
    if let Some(e) = with_pools(|p| p.peaks.get(&device).copied()) {
        s.peak_used_bytes = s.peak_used_bytes.max(e.default_used);
        s.peak_total_bytes = s.peak_total_bytes.max(e.default_total);
    }
    s
}

/// Peak (in use, reserved) bytes of the default pool and the graph pools of `device`
/// together, since the last reset.
fn peaks_with_graphs(device: i32) -> (u64, u64) {
    let s = get_default_memory_pool().device_stats(device);
    match with_pools(|p| p.peaks.get(&device).copied()) {
        Some(e) => (
            e.all_used.max(s.peak_used_bytes + e.graphs_used),
            e.all_total.max(s.peak_total_bytes + e.graphs_total),
        ),
        None => (s.peak_used_bytes, s.peak_total_bytes),
    }
}

/// Restarts every peak of `device` (the default pool's, and with the graph pools)
/// from the current values.
pub(super) fn reset_peaks(device: i32) {
    let pool = get_default_memory_pool();
    with_pools(|p| {
        let (gu, gt) = graph_bytes(p, device);
        pool.reset_device_peaks(device);
        if let Some(e) = p.peaks.get_mut(&device) {
            let s = pool.device_stats(device);
            *e = Peaks {
                default_used: 0,
                default_total: 0,
                all_used: s.used_bytes + gu,
                all_total: s.total_bytes + gt,
                graphs_used: gu,
                graphs_total: gt,
            };
        }
    });
}

/// How many windows are open: the allocation path looks no further when 0.
static OPEN: AtomicUsize = AtomicUsize::new(0);
static POOLS: Mutex<Option<Pools>> = Mutex::new(None);

fn with_pools<R>(f: impl FnOnce(&mut Pools) -> R) -> R {
    let mut g = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
    f(g.get_or_insert_with(|| Pools {
        pools: HashMap::new(),
        windows: Vec::new(),
        peaks: HashMap::new(),
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
    let me = std::thread::current().id();
    with_pools(|p| {
        let (i, bind) = pick_window(&p.windows, device, id, me)?;
        if bind {
            p.windows[i].capture = Some(id);
        }
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
                p.windows.push(Window {
                    key,
                    capture: None,
                    thread: std::thread::current().id(),
                });
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
            if let Some(pool) = dropped {
                drop(pool);
                fold(device);
            }
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
        let device = existing_device(device)?;
        *out = with_pools(|p| graph_bytes(p, device).1);
        Ok(())
    })
}

/// Writes the peak in-use and reserved bytes of `device` to `*peak_used` and
/// `*peak_reserved`: the default pool and the private graph pools of PyTorch's
/// captured graphs together (what torch's `max_memory_allocated` and
/// `max_memory_reserved` count), since the last `curt_pool_reset_peaks`. An error for a
/// device that does not exist.
///
/// # Safety
/// Each pointer is NULL (refused with an error) or valid for a write of a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn curt_torch_memory_peaks(
    device: c_int,
    peak_used: *mut u64,
    peak_reserved: *mut u64,
) -> c_int {
    guard(|| {
        let peak_used = out(peak_used, "peak_used")?;
        let peak_reserved = out(peak_reserved, "peak_reserved")?;
        let device = existing_device(device)?;
        (*peak_used, *peak_reserved) = peaks_with_graphs(device);
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
        let rc = unsafe { curt_torch_graph_pools_reserved(0, &mut bytes) };
        if existing_device(0).is_ok() {
            assert_eq!(rc, 0);
            assert_eq!(bytes, 0);
        } else {
            // No device 0 on this machine: an error, not zeros.
            assert_ne!(rc, 0);
            assert_eq!(bytes, u64::MAX, "nothing written on error");
        }
    }

    #[test]
    fn concurrent_captures_bind_to_the_windows_their_threads_opened() {
        // Thread A opens its window, then thread B opens its own; both capture. A's
        // first allocation must go to A's pool, not to the window opened last.
        let a = std::thread::current().id();
        let b = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        let window = |id1, thread| Window {
            key: (0, 1, id1),
            capture: None,
            thread,
        };
        let mut w = vec![window(10, a), window(20, b)];
        assert_eq!(
            pick_window(&w, 0, 111, a),
            Some((0, true)),
            "A's own window"
        );
        w[0].capture = Some(111);
        assert_eq!(
            pick_window(&w, 0, 222, b),
            Some((1, true)),
            "B's own window"
        );
        w[1].capture = Some(222);
        // Bound: found by the capture, from any thread.
        assert_eq!(pick_window(&w, 0, 111, b), Some((0, false)));
        assert_eq!(pick_window(&w, 0, 222, a), Some((1, false)));
        // An unknown capture with every window bound: none.
        assert_eq!(pick_window(&w, 0, 333, a), None);
        // A capture on a thread that opened no window takes the latest unbound one of
        // its device (PyTorch's filter cannot be called).
        let c = std::thread::spawn(|| std::thread::current().id())
            .join()
            .unwrap();
        let w = vec![
            window(10, a),
            window(20, b),
            Window {
                key: (1, 1, 30),
                capture: None,
                thread: c,
            },
        ];
        assert_eq!(pick_window(&w, 0, 444, c), Some((1, true)));
        assert_eq!(pick_window(&w, 1, 444, a), Some((2, true)));
    }

    #[test]
    fn folding_adds_the_graph_pools_to_the_peaks_of_their_interval() {
        // A device id no test allocates on: the default pool has no pool there, so
        // every default figure is 0 and the book holds only what is set here.
        let d = 77;
        with_pools(|p| {
            p.peaks.insert(
                d,
                Peaks {
                    all_total: 10,
                    graphs_total: 6,
                    graphs_used: 4,
                    ..Peaks::default()
                },
            )
        });
        // The graph pools left (no pool of `d` exists now): the fold keeps the old
        // interval's peak and records G = 0.
        fold(d);
        let e = with_pools(|p| p.peaks[&d]);
        assert_eq!((e.all_total, e.graphs_total, e.graphs_used), (10, 0, 0));
        assert_eq!(peaks_with_graphs(d), (4, 10));
        reset_peaks(d);
        assert_eq!(peaks_with_graphs(d), (0, 0), "a reset restarts from now");
        with_pools(|p| p.peaks.remove(&d));
    }
}
