//! The backends of a device's pool: its [`PoolAllocator`] on one device
//! ([`DeviceBackend`], whose fences are events), and any backend with the allocation
//! hooks around it ([`HookedBackend`]).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::{CaptureKind, Error};
use crate::memory::arena::{Backend, BackendError, SegmentSpec};
use crate::memory::device_memory::{drain_device, CAllocator, ClosureAllocator};
use crate::memory::hook;
use crate::stream::current_stream_handle;

use super::stream_key::handle_of_key;
use super::stream_uses::FENCE_FLAGS;

/// The memory a [`MemoryPool`](super::MemoryPool) caches (CuPy's
/// `MemoryPool(allocator)`): what a miss asks for and what releasing the cache gives
/// back. The pool's algorithm, statistics, limit, hooks and cross-stream safety are
/// the same whatever the allocator.
#[derive(Clone, Default)]
pub enum PoolAllocator {
    /// Device memory, `cuMemAlloc` / `cuMemFree` (the default).
    #[default]
    Device,
    /// Managed (unified) memory, `cuMemAllocManaged` (attached globally) /
    /// `cuMemFree`: the host may read and write the blocks too.
    Managed,
    /// The driver's stream-ordered allocator: `cuMemAllocAsync` on the stream of the
    /// malloc that misses (the arena's stream, where the block is first used, also
    /// for [`MemoryPool::malloc_on_stream`](super::MemoryPool::malloc_on_stream) of a
    /// stream that is not current); the cache goes back with `cuMemFreeAsync` after
    /// the context's work has completed. A miss on a stream that is capturing a graph
    /// is refused ([`Error::Capture`](crate::Error::Capture)): there the driver would
    /// allocate graph memory, not memory the pool can keep.
    StreamOrdered,
    /// A pair of Rust closures (CuPy's `PythonFunctionAllocator`), called with the
    /// device's context current. The pool calls `free` only after the context's work
    /// has completed (as `cuMemFree` waits).
    Closures(ClosureAllocator),
    /// A pair of C functions with an opaque argument (CuPy's `CFunctionAllocator`),
    /// freed as [`Closures`](Self::Closures) are.
    C(CAllocator),
}

impl fmt::Debug for PoolAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolAllocator::Device => f.write_str("PoolAllocator::Device"),
            PoolAllocator::Managed => f.write_str("PoolAllocator::Managed"),
            PoolAllocator::StreamOrdered => f.write_str("PoolAllocator::StreamOrdered"),
            PoolAllocator::Closures(_) => f.write_str("PoolAllocator::Closures"),
            PoolAllocator::C(c) => write!(f, "PoolAllocator::C(ctx {:#x})", c.ctx),
        }
    }
}

/// A device pool's backend: its [`PoolAllocator`] on one device (its primary context
/// made current for the driver's allocators).
///
/// With [`PoolAllocator::Device`] it also backs expandable segments: one address
/// reservation of the device's total memory per segment, mapped one granule
/// (`cuMemGetAllocationGranularity`, minimum) at a time, each granule its own physical
/// allocation (`cuMemCreate`), so that any granule-aligned range (a free tail, or a
/// hole punched inside a segment) can be unmapped and released on its own, and mapped
/// again later (`cuMemUnmap` takes whole mappings only).
#[derive(Debug)]
pub(crate) struct DeviceBackend {
    pub(super) device: i32,
    pub(super) source: PoolAllocator,
    /// The segment shape, asked of the driver on first use (`None`: not supported).
    spec: OnceLock<Option<SegmentSpec>>,
    /// Each mapped granule's address -> its physical allocation's handle.
    granules: Mutex<BTreeMap<u64, sys::CUmemGenericAllocationHandle>>,
}

/// A driver allocation's result as the pool's backend error.
fn driver_alloc(r: crate::error::Result<u64>) -> std::result::Result<u64, BackendError> {
    match r {
        Ok(p) => Ok(p),
        Err(Error::Driver(d)) if d.code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            Err(BackendError::OutOfMemory(Some(d)))
        }
        Err(e) => Err(BackendError::Other(Box::new(e))),
    }
}

/// A user allocator's answer: 0 or an out-of-memory error is out of memory (the pool
/// releases its cache and retries), any other error is passed on.
fn user_alloc(r: crate::error::Result<u64>) -> std::result::Result<u64, BackendError> {
    match r {
        Ok(0) => Err(BackendError::OutOfMemory(None)),
        Ok(p) => Ok(p),
        Err(Error::OutOfMemory(_)) => Err(BackendError::OutOfMemory(None)),
        Err(e) => driver_alloc(Err(e)),
    }
}

impl DeviceBackend {
    /// The backend of `source` on `device`.
    pub(super) fn new(device: i32, source: PoolAllocator) -> Self {
        DeviceBackend {
            device,
            source,
            spec: OnceLock::new(),
            granules: Mutex::new(BTreeMap::new()),
        }
    }

    /// The driver's segment shape for this device: its granularity, and its total
    /// memory (rounded up to that) reserved per segment.
    fn query_spec(&self) -> Option<SegmentSpec> {
        if !matches!(self.source, PoolAllocator::Device) {
            return None;
        }
        make_current(self.device).ok()?;
        let g = result::vmm::granularity(self.device, false).ok()? as u64;
        let total = super::limit_env::device_total_memory(self.device).ok()?;
        let reserve = total.checked_add(g - 1)? & !(g - 1);
        (g.is_power_of_two() && g.is_multiple_of(512)).then_some(SegmentSpec {
            granularity: g,
            reserve,
        })
    }

    fn granules(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<u64, sys::CUmemGenericAllocationHandle>> {
        self.granules.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Unmaps and releases the granules of `addr..addr + len` that are mapped.
    fn unmap_granules(&self, addr: u64, len: u64) {
        let taken: Vec<(u64, sys::CUmemGenericAllocationHandle)> = {
            let mut g = self.granules();
            let keys: Vec<u64> = g.range(addr..addr + len).map(|(&a, _)| a).collect();
            keys.into_iter()
                .filter_map(|a| g.remove(&a).map(|h| (a, h)))
                .collect()
        };
        let Some(gran) = self.spec.get().copied().flatten().map(|s| s.granularity) else {
            return;
        };
        for (a, h) in taken {
            // SAFETY: `a` is a granule this backend mapped with `h` (recorded at
            // `segment_map`), unmapped and released once (removed from the record
            // above); the pool unmaps only free ranges (tails and holes) that no block
            // uses, after `segment_unmap` drained the work queued on them.
            unsafe {
                let _ = result::vmm::unmap(a, gran as usize);
                let _ = result::vmm::release(h);
            }
        }
    }

    /// Unmaps the granules of `addr..addr + len` that a `segment_unmap` whose wait
    /// failed left mapped (the pool's books say unmapped), once the device's work,
    /// which may still use them, is done; an error while it cannot be waited for.
    fn unmap_left_mapped(&self, addr: u64, len: u64) -> std::result::Result<(), BackendError> {
        if self.granules().range(addr..addr + len).next().is_none() {
            return Ok(());
        }
        if !self.drain() {
            return Err(BackendError::Other(
                format!(
                    "device {}: part of {addr:#x}..{:#x} is still mapped, left by an \
                     unmap that could not wait for the device's work (a capture was \
                     active); that work cannot be waited for now either",
                    self.device,
                    addr + len
                )
                .into(),
            ));
        }
        self.unmap_granules(addr, len);
        Ok(())
    }

    /// `size` bytes of `cuMemAllocAsync` on `stream` (a live stream of this device, or
    /// a default-stream handle), which must not be capturing: there the driver would
    /// make the allocation a node of the graph, memory that exists only while a launch
    /// of that graph runs, which the pool would then cache and hand out as its own.
    fn alloc_ordered(&self, size: usize, stream: usize) -> std::result::Result<u64, BackendError> {
        let dev = self.device;
        driver_alloc(make_current(dev).and_then(|()| {
            let stream = stream as sys::CUstream;
            // SAFETY: the caller's stream is live for the call and of `dev`, whose
            // context is current.
            let status = unsafe { result::stream::is_capturing(stream) }?;
            if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
                return Err(Error::capture(
                    CaptureKind::Refused,
                    format!(
                        "the stream-ordered memory pool of device {dev} cannot grow on stream \
                         {:#x}: it is capturing a graph, where cuMemAllocAsync would make graph \
                         memory, not memory the pool can keep (allocate with alloc during a \
                         capture, or grow the pool before it)",
                        stream as usize
                    ),
                ));
            }
            // SAFETY: as above.
            Ok(unsafe { result::memory::alloc_async(size, stream) }?)
        }))
    }

    /// [`drain_device`] of this backend's device, before a user allocator or the
    /// stream-ordered one frees a block that work queued before the release may still
    /// use.
    fn drain(&self) -> bool {
        drain_device(self.device)
    }
}

impl Backend for DeviceBackend {
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        let dev = self.device;
        match &self.source {
            PoolAllocator::Device => {
                driver_alloc(make_current(dev).and_then(|()| Ok(result::memory::alloc(size)?)))
            }
            PoolAllocator::Managed => driver_alloc(make_current(dev).and_then(|()| {
                let global = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0;
                Ok(result::memory::alloc_managed(size, global)?)
            })),
            // The pool grows through `alloc_for`, on the arena's stream; this is the
            // thread's current stream (alive while current: the thread keeps it).
            PoolAllocator::StreamOrdered => self.alloc_ordered(size, current_stream_handle(dev)),
            // The device's context is made current for the user's functions (as CuPy
            // runs them under the device); without a driver they run all the same.
            PoolAllocator::Closures(c) => {
                let _ = make_current(dev);
                user_alloc((c.malloc)(size, dev))
            }
            PoolAllocator::C(c) => {
                let _ = make_current(dev);
                user_alloc(Ok((c.malloc)(c.ctx as *mut std::ffi::c_void, size, dev)))
            }
        }
    }

    fn alloc_for(&self, size: usize, key: u64) -> std::result::Result<u64, BackendError> {
        match self.source {
            // Stream-ordered memory is valid only for work ordered after its
            // allocation on the stream it was allocated on, and the driver may give
            // memory freed on that stream under work still queued there: allocated on
            // the thread's current stream, a block of another stream's arena
            // (`malloc_on_stream`) was used on that other stream with no order at all.
            // The arena's key names its stream for the malloc that grows it (the
            // malloc's own stream, alive for the call).
            PoolAllocator::StreamOrdered => self.alloc_ordered(size, handle_of_key(key)),
            _ => self.alloc(size),
        }
    }

    fn free(&self, addr: u64, size: usize) {
        // Nothing to do about a failure here (a context torn down at exit).
        match &self.source {
            PoolAllocator::Device | PoolAllocator::Managed => {
                if make_current(self.device).is_ok() {
                    // SAFETY: the arena frees only what `alloc` above gave it (cuMemAlloc
                    // or cuMemAllocManaged in this device's primary context, made current
                    // above), once, when no block of it is handed out any more.
                    let _ = unsafe { result::memory::free(addr) };
                }
            }
            PoolAllocator::StreamOrdered => {
                if self.drain() {
                    // SAFETY: as above, for cuMemAllocAsync memory; the context's work
                    // has completed, so no stream uses it any more.
                    let _ = unsafe { result::memory::free_async(addr, std::ptr::null_mut()) };
                }
            }
            // Not drained: leaked (see `drain`), never handed back under queued work.
            PoolAllocator::Closures(c) => {
                if self.drain() {
                    c.free(addr, size, self.device);
                }
            }
            PoolAllocator::C(c) => {
                if self.drain() {
                    c.free(addr, self.device);
                }
            }
        }
    }

    // Fences are events of this device recorded by `stream_uses`, owned by the pool
    // from `free_raw_after` until `fence_release`.

    fn fence_done(&self, fence: u64) -> bool {
        // CUDA forbids CUDA calls in a host function (they may fail or deadlock), where
        // the last memory of an orphaned pool may be dropped, which releases its cache
        // (a poll) or drops the pool (a wait, for a fence that may be queued behind the
        // very function: a deadlock). Not known to be done, as a failed query.
        if result::stream::in_host_function() {
            return false;
        }
        // An error is not done: while another thread holds a global-mode capture every
        // query fails though the stream still uses the block, so the block stays
        // awaiting until a later query succeeds. A dead context fails for good: its
        // blocks are never reused (leaked), which is safe.
        // SAFETY: the fence is a live event (above) until its release.
        let r = unsafe { result::event::query(fence as usize as sys::CUevent) };
        matches!(r, Ok(true))
    }

    fn fence_wait(&self, fence: u64) -> bool {
        // Never in a host function (see `fence_done`).
        if result::stream::in_host_function() {
            return false;
        }
        // A failed wait is not done either (as in `fence_done`).
        // SAFETY: as in `fence_done`.
        unsafe { result::event::synchronize(fence as usize as sys::CUevent) }.is_ok()
    }

    fn fence_release(&self, fence: u64) {
        crate::event::give_raw(self.device, FENCE_FLAGS, fence as usize);
    }

    fn arena_made(&self, key: u64) {
        crate::stream::retire::note_arena_key(key);
    }

    fn segment_spec(&self) -> Option<SegmentSpec> {
        *self.spec.get_or_init(|| self.query_spec())
    }

    fn segment_reserve(&self, size: u64) -> std::result::Result<u64, BackendError> {
        let Some(spec) = self.segment_spec() else {
            return Err(BackendError::Other(
                "no expandable segments on this device".into(),
            ));
        };
        let len = usize::try_from(size).map_err(|_| BackendError::OutOfMemory(None))?;
        let align = spec.granularity as usize;
        driver_alloc(
            make_current(self.device).and_then(|()| Ok(result::vmm::address_reserve(len, align)?)),
        )
    }

    fn segment_map(&self, base: u64, addr: u64, len: u64) -> std::result::Result<(), BackendError> {
        let _ = base;
        let Some(spec) = self.segment_spec() else {
            return Err(BackendError::Other(
                "no expandable segments on this device".into(),
            ));
        };
        let g = spec.granularity;
        if let Err(e) = make_current(self.device) {
            return Err(BackendError::Other(Box::new(e)));
        }
        self.unmap_left_mapped(addr, len)?;
        let mut at = addr;
        let mapped = loop {
            if at >= addr + len {
                break Ok(());
            }
            let handle = match result::vmm::create(g as usize, self.device) {
                Ok(h) => h,
                Err(e) => break Err(Error::from(e)),
            };
            // SAFETY: `at..at + g` lies in the reservation at `base` and is not mapped
            // (the pool's contract: past its mapped end, or in a hole unmapped
            // before); `handle` is live, of `g` bytes.
            if let Err(e) = unsafe { result::vmm::map(at, g as usize, handle) } {
                // SAFETY: the handle was created above, never mapped, released once.
                let _ = unsafe { result::vmm::release(handle) };
                break Err(Error::from(e));
            }
            self.granules().insert(at, handle);
            at += g;
        };
        // SAFETY: `addr..at` was mapped above.
        let access = mapped.and_then(|()| {
            Ok(unsafe { result::vmm::set_access(addr, len as usize, self.device) }?)
        });
        match access {
            Ok(()) => Ok(()),
            Err(e) => {
                // Nothing stays mapped on failure.
                self.unmap_granules(addr, at - addr);
                driver_alloc(Err(e)).map(|_| ())
            }
        }
    }

    fn segment_unmap(&self, base: u64, addr: u64, len: u64) {
        let _ = base;
        // Work queued before the release may still use the range (a free tail, or
        // a hole a growth punches): `cuMemUnmap` does not wait for it as `cuMemFree`
        // does. A wait that fails (this thread's capture, another thread's
        // global-mode capture, a dead context) says nothing about that work: the
        // range then stays mapped rather than unmapped under a kernel, and a later
        // growth over it waits again and unmaps it first (`unmap_left_mapped`).
        if self.drain() {
            self.unmap_granules(addr, len);
        }
    }

    fn segment_release(&self, base: u64, size: u64) {
        // Granules an unmap left mapped go first (a reservation with mappings in it
        // cannot be freed); while they cannot, the reservation stays (leaked).
        if make_current(self.device).is_ok() && self.unmap_left_mapped(base, size).is_ok() {
            // SAFETY: a reservation of `segment_reserve` of `size` bytes, released once
            // by the pool after unmapping all of it.
            let _ = unsafe { result::vmm::address_free(base, size as usize) };
        }
    }
}

/// A backend with the `alloc_pre` / `alloc_post` hooks around its `alloc` (the arena
/// calls its backend on the thread that mallocs).
#[derive(Debug)]
pub(crate) struct HookedBackend<B> {
    pub(super) backend: B,
    pub(super) device: i32,
}

impl<B: Backend> Backend for HookedBackend<B> {
    #[inline]
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        if !hook::has_hooks() {
            return self.backend.alloc(size);
        }
        let dev = self.device;
        hook::each(|h| h.alloc_pre(dev, size));
        let r = self.backend.alloc(size);
        if let Ok(p) = r {
            hook::each(|h| h.alloc_post(dev, size, p));
        }
        r
    }

    #[inline]
    fn alloc_for(&self, size: usize, key: u64) -> std::result::Result<u64, BackendError> {
        if !hook::has_hooks() {
            return self.backend.alloc_for(size, key);
        }
        let dev = self.device;
        hook::each(|h| h.alloc_pre(dev, size));
        let r = self.backend.alloc_for(size, key);
        if let Ok(p) = r {
            hook::each(|h| h.alloc_post(dev, size, p));
        }
        r
    }

    #[inline]
    fn free(&self, addr: u64, size: usize) {
        self.backend.free(addr, size)
    }

    fn fence_done(&self, fence: u64) -> bool {
        self.backend.fence_done(fence)
    }

    fn fence_wait(&self, fence: u64) -> bool {
        self.backend.fence_wait(fence)
    }

    fn fence_release(&self, fence: u64) {
        self.backend.fence_release(fence)
    }

    fn arena_made(&self, key: u64) {
        self.backend.arena_made(key)
    }

    fn segment_spec(&self) -> Option<SegmentSpec> {
        self.backend.segment_spec()
    }

    fn segment_reserve(&self, size: u64) -> std::result::Result<u64, BackendError> {
        self.backend.segment_reserve(size)
    }

    fn segment_map(&self, base: u64, addr: u64, len: u64) -> std::result::Result<(), BackendError> {
        // A map is the allocation of an expandable pool: the hooks see its bytes.
        let (dev, size) = (self.device, len as usize);
        let hooks = hook::has_hooks();
        if hooks {
            hook::each(|h| h.alloc_pre(dev, size));
        }
        let r = self.backend.segment_map(base, addr, len);
        if hooks && r.is_ok() {
            hook::each(|h| h.alloc_post(dev, size, addr));
        }
        r
    }

    fn segment_unmap(&self, base: u64, addr: u64, len: u64) {
        self.backend.segment_unmap(base, addr, len)
    }

    fn segment_release(&self, base: u64, size: u64) {
        self.backend.segment_release(base, size)
    }
}

#[cfg(test)]
mod tests {
    use std::ffi::c_void;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Arc, Mutex};

    use super::*;
    use crate::memory::arena::{MallocError, Pool};

    /// A user function pair handing out address ranges (no memory: the pool never
    /// touches it), logging each call.
    fn logging_pair(log: Arc<Mutex<Vec<String>>>, capacity: u64) -> ClosureAllocator {
        let next = Arc::new(AtomicU64::new(1 << 40));
        let (log_m, log_f) = (log.clone(), log);
        // SAFETY: the pool only keeps and compares the addresses; nothing dereferences
        // them (no GPU and no copy in this test).
        unsafe {
            ClosureAllocator::new(
                move |size, dev| {
                    log_m.lock().unwrap().push(format!("malloc({size},{dev})"));
                    let a = next.fetch_add(size as u64, Ordering::Relaxed);
                    Ok(if a + size as u64 > (1 << 40) + capacity {
                        0
                    } else {
                        a
                    })
                },
                move |ptr, size, dev| {
                    log_f
                        .lock()
                        .unwrap()
                        .push(format!("free({:#x},{size},{dev})", ptr));
                },
            )
        }
    }

    fn pool_over(source: PoolAllocator) -> Pool<DeviceBackend> {
        Pool::new(DeviceBackend::new(3, source))
    }

    #[test]
    fn a_pool_over_a_closure_pair_caches_its_memory_and_frees_it_through_the_pair() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let pool = pool_over(PoolAllocator::Closures(logging_pair(log.clone(), 1 << 30)));
        let a = pool.malloc(1000, 0).unwrap();
        let addr = a.addr();
        pool.free(a).unwrap();
        let b = pool.malloc(700, 0).unwrap();
        assert_eq!(b.addr(), addr, "cached and reused");
        pool.free(b).unwrap();
        assert_eq!(*log.lock().unwrap(), ["malloc(1024,3)"]);
        pool.free_all_blocks(None);
        assert_eq!(
            *log.lock().unwrap(),
            [
                "malloc(1024,3)".to_string(),
                format!("free({addr:#x},1024,3)")
            ]
        );
        let s = pool.stats();
        assert_eq!(
            (s.backend_allocs, s.backend_frees, s.total_bytes),
            (1, 1, 0)
        );
    }

    #[test]
    fn a_null_from_the_user_pair_is_out_of_memory_after_one_release_and_retry() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let pool = pool_over(PoolAllocator::Closures(logging_pair(log.clone(), 4096)));
        let a = pool.malloc(4096, 0).unwrap();
        pool.free(a).unwrap();
        let e = pool.malloc(8192, 1).unwrap_err();
        assert!(matches!(e, MallocError::OutOfMemory(_)), "{e}");
        // The cached block went back through the pair before the retry.
        let log = log.lock().unwrap();
        assert_eq!(log.len(), 4, "{log:?}");
        assert!(log[2].starts_with("free("), "{log:?}");
        assert_eq!(pool.stats().oom_retries, 1);
    }

    static C_CALLS: Mutex<Vec<(usize, u64, usize)>> = Mutex::new(Vec::new());

    extern "C" fn c_malloc(ctx: *mut c_void, size: usize, _device: i32) -> u64 {
        C_CALLS.lock().unwrap().push((ctx as usize, 0, size));
        0x7000_0000 + size as u64 * 2
    }

    extern "C" fn c_free(ctx: *mut c_void, ptr: u64, _device: i32) {
        C_CALLS.lock().unwrap().push((ctx as usize, ptr, 0));
    }

    #[test]
    fn a_pool_over_a_c_pair_passes_its_context_to_both_functions() {
        // SAFETY: the functions only log; the pool never dereferences the addresses.
        let c = unsafe { CAllocator::new(c_malloc, c_free, 0xc0ffee as *mut c_void) };
        let pool = pool_over(PoolAllocator::C(c));
        let a = pool.malloc(512, 0).unwrap();
        let addr = a.addr();
        pool.free(a).unwrap();
        drop(pool);
        assert_eq!(
            *C_CALLS.lock().unwrap(),
            [(0xc0ffee, 0, 512), (0xc0ffee, addr, 0)]
        );
    }
}
