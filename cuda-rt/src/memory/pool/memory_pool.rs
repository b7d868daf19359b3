//! [`MemoryPool`], its per-device pools, and the process-wide default pool.

use std::fmt;
use std::panic::Location;
use std::sync::{Arc, OnceLock};

use crate::device::context::MAX_DEVICES;
use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result};
use crate::memory::arena::parked;
use crate::memory::arena::{limit_from_fraction, PoolSnapshot, PoolStats};
use crate::memory::device_memory::check_device;
use crate::memory::hook;
use crate::memory::MemoryPointer;
use crate::stream::{current_stream_handle, current_stream_of, AsStream, StreamRef};

use super::device_backend::{DeviceBackend, PoolAllocator};
use super::device_pool::{CudaDevicePool, DevicePool, DevicePoolRef};
use super::expandable_env::{expandable_from_env, ALLOC_CONF_ENV, EXPANDABLE_ENV};
use super::limit_env::{device_total_memory, limit_from_env, LIMIT_ENV};
use super::out_of_memory::malloc_error;
use super::pooled_block::PooledBlock;
use super::pooled_memory::PooledMemory;
use super::stream_key::stream_key;

/// The per-device pools behind a [`MemoryPool`].
struct DevicePools {
    per_device: [OnceLock<DevicePoolRef>; MAX_DEVICES],
    /// Whether device pools are leaked (`'static`): the default pool's are.
    leak: bool,
    /// What every device pool caches.
    allocator: PoolAllocator,
}

impl Drop for DevicePools {
    /// The last handle of a [`MemoryPool::new`] pool went: its device pools give their
    /// cache back to the driver now (recycled objects and parking slots may keep the
    /// device pools themselves a while), and each block freed later goes back at once.
    fn drop(&mut self) {
        for core in self.per_device.iter().filter_map(OnceLock::get) {
            core.orphan();
        }
    }
}

impl DevicePools {
    const fn new(leak: bool, allocator: PoolAllocator) -> DevicePools {
        DevicePools {
            per_device: [const { OnceLock::new() }; MAX_DEVICES],
            leak,
            allocator,
        }
    }

    /// Device `device`'s pool, created (with the limit of [`LIMIT_ENV`]) on first use.
    #[inline]
    fn get_or_create(&self, device: i32) -> Result<&DevicePoolRef> {
        let slot = usize::try_from(device)
            .ok()
            .and_then(|d| self.per_device.get(d));
        match slot.and_then(OnceLock::get) {
            Some(c) => Ok(c),
            None => self.create(device),
        }
    }

    /// Device `device`'s pool if it exists (no driver call).
    #[inline]
    fn existing(&self, device: i32) -> Option<&DevicePoolRef> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.per_device.get(d))
            .and_then(OnceLock::get)
    }

    #[cold]
    fn create(&self, device: i32) -> Result<&DevicePoolRef> {
        check_device(device)?;
        let Some(slot) = usize::try_from(device)
            .ok()
            .and_then(|d| self.per_device.get(d))
        else {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("device id {device}: cuda-rt addresses at most {MAX_DEVICES} devices"),
            ));
        };
        let env = std::env::var(LIMIT_ENV).ok();
        let limit = limit_from_env(env.as_deref(), || device_total_memory(device))?;
        let expandable = expandable_from_env(
            std::env::var(EXPANDABLE_ENV).ok().as_deref(),
            std::env::var(ALLOC_CONF_ENV).ok().as_deref(),
        )?;
        Ok(slot.get_or_init(|| {
            let backend = DeviceBackend::new(device, self.allocator.clone());
            let core = DevicePool::new(backend, device);
            core.pool.set_limit(limit);
            core.pool.set_expandable_segments(expandable);
            if self.leak {
                DevicePoolRef::Static(Box::leak(Box::new(core)))
            } else {
                DevicePoolRef::Shared(Arc::new(core))
            }
        }))
    }
}

#[derive(Clone)]
enum DevicePoolsRef {
    Static(&'static DevicePools),
    Shared(Arc<DevicePools>),
}

/// The caching device memory pool (CuPy's `MemoryPool`): one pool per device behind
/// it, each created on the device's first use. Cheap to clone (clones share the
/// pools); `Send + Sync`. The calls that take no device use the thread's current
/// device, as in CuPy. See the [module doc] for the semantics.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::memory::MemoryPool;
/// let pool = MemoryPool::new();
/// let a = pool.malloc(1000)?; // 1024 bytes from cuMemAlloc
/// let addr = a.ptr();
/// drop(a); // back to the pool
/// assert_eq!(pool.malloc(1000)?.ptr(), addr); // reused, no driver call
/// assert_eq!(pool.used_bytes() + pool.free_bytes(), pool.total_bytes());
/// let s = pool.stats();
/// assert_eq!((s.mallocs, s.cache_hits, s.backend_allocs), (2, 1, 1));
/// pool.free_all_blocks(None); // cached blocks back to the driver
/// # Ok(()) }
/// ```
///
/// [module doc]: crate::memory::pool
#[derive(Clone)]
pub struct MemoryPool {
    pools: DevicePoolsRef,
}

static DEFAULT_POOL: DevicePools = DevicePools::new(true, PoolAllocator::Device);

/// The process-wide default pool, which [`alloc`] uses unless another allocator is set
/// (CuPy's `get_default_memory_pool`).
///
/// [`alloc`]: crate::memory::alloc
#[inline]
pub fn get_default_memory_pool() -> MemoryPool {
    MemoryPool {
        pools: DevicePoolsRef::Static(&DEFAULT_POOL),
    }
}

impl fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let devices: Vec<&CudaDevicePool> = self
            .pools()
            .per_device
            .iter()
            .filter_map(|c| c.get())
            .map(|c| &**c)
            .collect();
        f.debug_struct("MemoryPool")
            .field("default", &self.pools().leak)
            .field("allocator", &self.pools().allocator)
            .field("devices", &devices)
            .finish()
    }
}

impl Default for MemoryPool {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryPool {
    /// A new pool of device memory (`cuMemAlloc`), separate from the default one (no
    /// memory until the first malloc).
    pub fn new() -> Self {
        Self::with_allocator(PoolAllocator::Device)
    }

    /// A new pool that caches memory from `allocator` (CuPy's
    /// `MemoryPool(allocator)`): managed memory, the stream-ordered allocator, or a
    /// user function pair instead of `cuMemAlloc`. Everything else (rounding, arenas,
    /// best fit, limit, statistics, hooks, `record_stream`) is as for [`new`](Self::new).
    ///
    /// ```no_run
    /// # fn main() -> cuda_rt::Result<()> {
    /// use cuda_rt::memory::{MemoryPool, PoolAllocator};
    /// let pool = MemoryPool::with_allocator(PoolAllocator::Managed);
    /// let p = pool.malloc(1 << 20)?; // cuMemAllocManaged: the host can use it too
    /// # drop(p); Ok(()) }
    /// ```
    pub fn with_allocator(allocator: PoolAllocator) -> Self {
        MemoryPool {
            pools: DevicePoolsRef::Shared(Arc::new(DevicePools::new(false, allocator))),
        }
    }

    /// The allocator whose memory this pool caches.
    pub fn allocator(&self) -> &PoolAllocator {
        &self.pools().allocator
    }

    #[inline]
    fn pools(&self) -> &DevicePools {
        match &self.pools {
            DevicePoolsRef::Static(i) => i,
            DevicePoolsRef::Shared(i) => i,
        }
    }

    /// Whether `self` and `other` are the same pool.
    pub fn same_pool(&self, other: &MemoryPool) -> bool {
        std::ptr::eq(self.pools(), other.pools())
    }

    /// `size` bytes (rounded up to 512) on the current device, from the arena of the
    /// current stream: a cached block if one fits (best fit), else new memory from
    /// `cuMemAlloc` (see the [module doc] for the limit and out of memory).
    /// `size == 0` gives the null pointer, not pooled. The memory returns to the pool
    /// when its last pointer is dropped.
    ///
    /// [module doc]: crate::memory::pool
    #[track_caller]
    #[inline]
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer> {
        self.malloc_on(get_device_id(), size)
    }

    /// [`malloc`](Self::malloc) on device `device` (its current stream's arena).
    #[track_caller]
    #[inline]
    pub fn malloc_on(&self, device: i32, size: usize) -> Result<MemoryPointer> {
        self.malloc_from(device, size, Location::caller())
    }

    /// [`malloc_on`](Self::malloc_on) for the call site `site` (what the memory hooks
    /// report): for callers that reach the pool through a closure, where
    /// `#[track_caller]` does not carry.
    #[inline]
    pub(crate) fn malloc_from(
        &self,
        device: i32,
        size: usize,
        site: &'static Location<'static>,
    ) -> Result<MemoryPointer> {
        if crate::capture::any_capture_active() && size != 0 {
            if let Some(r) = self.malloc_in_capture(&current_stream_of(device), size) {
                return r;
            }
        }
        let key = stream_key(current_stream_handle(device));
        if let Some(p) = self.malloc_reparked(device, size, key) {
            return Ok(p);
        }
        self.malloc_general(device, size, key, site)
    }

    /// A malloc from the arena of `s` while some capture is active: `None` unless `s`
    /// is in a capture cuda-rt began (see `graph_memory::pool_malloc_in_capture`:
    /// the default pool makes the graph's own memory there, another pool refuses).
    #[cold]
    #[inline(never)]
    fn malloc_in_capture(&self, s: &StreamRef, size: usize) -> Option<Result<MemoryPointer>> {
        let default_pool =
            matches!(self.pools, DevicePoolsRef::Static(p) if std::ptr::eq(p, &DEFAULT_POOL));
        crate::memory::graph_memory::pool_malloc_in_capture(s, size, default_pool)
    }

    /// [`malloc`](Self::malloc) from the arena of `stream` on the stream's device,
    /// whatever this thread's current device and stream are: for callers that are
    /// handed a stream with each request, as PyTorch's pluggable allocator is. Nothing
    /// is made current for a cached block; a new segment is allocated in the device's
    /// primary context. CuPy's `MemoryPool.malloc` has no stream argument; this is
    /// `malloc` inside `with stream:` without entering it.
    ///
    /// ```no_run
    /// use cuda_rt::{get_default_memory_pool, Stream};
    /// let stream = Stream::non_blocking()?;
    /// let p = get_default_memory_pool().malloc_on_stream(&stream, 1 << 20)?;
    /// # Ok::<(), cuda_rt::Error>(())
    /// ```
    #[track_caller]
    #[inline]
    pub fn malloc_on_stream(&self, stream: &dyn AsStream, size: usize) -> Result<MemoryPointer> {
        if crate::capture::any_capture_active() && size != 0 {
            if let Some(r) = self.malloc_in_capture(&stream.as_stream_ref(), size) {
                return r;
            }
        }
        let (device, key) = (stream.device_id(), stream_key(stream.ptr()));
        if let Some(p) = self.malloc_reparked(device, size, key) {
            return Ok(p);
        }
        self.malloc_general(device, size, key, Location::caller())
    }

    /// The cached pair's malloc of [`malloc_on_stream`](Self::malloc_on_stream) as a
    /// [`PooledBlock`] (no memory object): the block this thread parked when it is
    /// exactly what that malloc would hand out; `None` where that does not apply (a
    /// pool other than the default one, memory hooks on this thread, no such parked
    /// block), with nothing changed, for the caller to call `malloc_on_stream`. For
    /// allocators that hand out raw addresses and free them by address.
    #[inline]
    pub fn malloc_block_on_stream(
        &self,
        stream: &dyn AsStream,
        size: usize,
    ) -> Option<PooledBlock> {
        self.malloc_block(stream.device_id(), size, stream_key(stream.ptr()))
    }

    /// [`malloc_block_on_stream`](Self::malloc_block_on_stream) on the current stream of
    /// `device` (the arena [`malloc_on`](Self::malloc_on) uses).
    #[inline]
    pub fn malloc_block_on(&self, device: i32, size: usize) -> Option<PooledBlock> {
        self.malloc_block(device, size, stream_key(current_stream_handle(device)))
    }

    #[inline]
    fn malloc_block(&self, device: i32, size: usize, key: u64) -> Option<PooledBlock> {
        let DevicePoolRef::Static(core) = self.pools().existing(device)? else {
            return None;
        };
        // During a capture the caller's `malloc_on_stream` decides (a capturing
        // stream gets no cached block).
        if hook::has_hooks() || crate::capture::any_capture_active() {
            return None;
        }
        let slot = parked::slot(core.home_id())?;
        let block = core.pool.malloc_reparked(size, key, slot)?;
        Some(PooledBlock::new(core, block.into_raw()))
    }

    /// The cached pair's malloc (see [`Pool::malloc_reparked`]): the block this thread
    /// parked when it is exactly what this malloc gets, in a recycled object; `None`
    /// when that does not apply (hooks, no parked block, another size or stream), with
    /// nothing changed that [`malloc_general`](Self::malloc_general) would see
    /// differently. Kept apart so the hot path carries none of the general path's
    /// frame.
    ///
    /// [`Pool::malloc_reparked`]: crate::memory::arena::Pool::malloc_reparked
    #[inline]
    fn malloc_reparked(&self, device: i32, size: usize, key: u64) -> Option<MemoryPointer> {
        let core = self.pools().existing(device)?;
        if hook::has_hooks() {
            return None;
        }
        let slot = parked::slot(core.home_id())?;
        let block = core.pool.malloc_reparked(size, key, slot)?;
        let ptr = block.addr();
        Some(MemoryPointer::from_memory_at(
            PooledMemory::wrap(core, block),
            ptr,
        ))
    }

    #[inline(never)]
    fn malloc_general(
        &self,
        device: i32,
        size: usize,
        key: u64,
        site: &'static Location<'static>,
    ) -> Result<MemoryPointer> {
        if size == 0 {
            return Ok(MemoryPointer::null(device));
        }
        let core = self.pools().get_or_create(device)?;
        let r = core.malloc(
            size,
            key,
            site,
            |block| {
                let ptr = block.addr();
                (PooledMemory::wrap(core, block), ptr)
            },
            |(m, _)| Arc::as_ptr(m) as usize,
        );
        match r {
            Ok((mem, ptr)) => Ok(MemoryPointer::from_memory_at(mem, ptr)),
            Err(e) => Err(malloc_error(e, device)),
        }
    }

    /// Gives `ptr` back (CuPy's `free`): the same as dropping it; the memory returns
    /// to the pool when its last pointer is gone.
    pub fn free(&self, ptr: MemoryPointer) {
        drop(ptr);
    }

    /// Gives the driver every cached block that is a whole `cuMemAlloc` allocation
    /// (split pieces stay): of every arena of the current device's pool with `None`,
    /// else only of `stream`'s arena (on the stream's device; for the per-thread
    /// default stream, the calling thread's arena).
    pub fn free_all_blocks(&self, stream: Option<&dyn AsStream>) {
        match stream {
            None => {
                if let Some(c) = self.pools().existing(get_device_id()) {
                    c.pool.free_all_blocks(None);
                }
            }
            Some(s) => {
                if let Some(c) = self.pools().existing(s.device_id()) {
                    c.pool.free_all_blocks(Some(stream_key(s.ptr())));
                }
            }
        }
    }

    /// CuPy's deprecated name for `free_all_blocks(None)`.
    pub fn free_all_free(&self) {
        self.free_all_blocks(None);
    }

    fn current(&self) -> Option<&DevicePoolRef> {
        self.pools().existing(get_device_id())
    }

    /// Cached (free) blocks of the current device's pool, all arenas.
    pub fn n_free_blocks(&self) -> u64 {
        self.current().map_or(0, |c| c.pool.n_free_blocks())
    }

    /// Bytes handed out by the current device's pool (rounded sizes).
    pub fn used_bytes(&self) -> u64 {
        self.current().map_or(0, |c| c.pool.used_bytes())
    }

    /// Bytes cached by the current device's pool: `total_bytes - used_bytes`.
    pub fn free_bytes(&self) -> u64 {
        self.current().map_or(0, |c| c.pool.free_bytes())
    }

    /// Bytes the current device's pool holds from the driver.
    pub fn total_bytes(&self) -> u64 {
        self.current().map_or(0, |c| c.pool.total_bytes())
    }

    /// All statistics of the current device's pool: CuPy's four numbers, current and
    /// peak in-use and reserved bytes, malloc and free counts, cache hits and misses,
    /// driver allocations and frees, out-of-memory retries (all zero before the
    /// device's first malloc).
    pub fn stats(&self) -> PoolStats {
        self.current().map(|c| c.pool.stats()).unwrap_or_default()
    }

    /// The statistics of device `device`'s pool (zero if it has none yet).
    pub fn device_stats(&self, device: i32) -> PoolStats {
        self.pools()
            .existing(device)
            .map(|c| c.pool.stats())
            .unwrap_or_default()
    }

    /// Every segment and block of device `device`'s pool now, with its stream
    /// ([`PoolSnapshot::to_json`] gives PyTorch's snapshot shape). Empty if the device
    /// has no pool yet. For inspection: it takes each arena's lock in turn.
    pub fn snapshot(&self, device: i32) -> PoolSnapshot {
        let mut snap = self
            .pools()
            .existing(device)
            .map(|c| c.pool.snapshot())
            .unwrap_or_default();
        snap.device = Some(device);
        snap
    }

    /// Resets the peaks of the current device's pool to the current values.
    pub fn reset_peaks(&self) {
        if let Some(c) = self.current() {
            c.pool.reset_peaks();
        }
    }

    /// Resets the peaks of device `device`'s pool to the current values (nothing if it
    /// has no pool yet); [`reset_peaks`](Self::reset_peaks) for any device, with no
    /// driver call.
    pub fn reset_device_peaks(&self, device: i32) {
        if let Some(c) = self.pools().existing(device) {
            c.pool.reset_peaks();
        }
    }

    /// Limits the bytes the current device's pool holds from the driver (0: no limit).
    /// Lowering it releases nothing by itself; the next malloc that misses does.
    pub fn set_limit(&self, bytes: u64) -> Result<()> {
        self.pools()
            .get_or_create(get_device_id())?
            .pool
            .set_limit(bytes);
        Ok(())
    }

    /// Sets the limit to `fraction` (0.0 ..= 1.0) of the current device's total
    /// memory (0: no limit); another fraction is [`Error::InvalidArgument`].
    pub fn set_limit_fraction(&self, fraction: f64) -> Result<()> {
        let dev = get_device_id();
        let core = self.pools().get_or_create(dev)?;
        let bytes = limit_from_fraction(fraction, device_total_memory(dev)?).map_err(|e| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("set_limit_fraction: {e}"),
            )
        })?;
        core.pool.set_limit(bytes);
        Ok(())
    }

    /// Turns expandable segments on or off for the current device's pool (see
    /// [`Pool::set_expandable_segments`](crate::memory::arena::Pool::set_expandable_segments)):
    /// the pool grows by mapping memory at the end of a reserved address range
    /// (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`) instead of
    /// `cuMemAlloc`ing each miss, and releasing the cache unmaps free tails. Only pools
    /// over [`PoolAllocator::Device`] on a driver with virtual memory management use
    /// them; the others keep growing with their allocator. The default comes from
    /// [`EXPANDABLE_ENV`] and [`ALLOC_CONF_ENV`].
    ///
    /// [`EXPANDABLE_ENV`]: super::EXPANDABLE_ENV
    /// [`ALLOC_CONF_ENV`]: super::ALLOC_CONF_ENV
    pub fn set_expandable_segments(&self, on: bool) -> Result<()> {
        self.pools()
            .get_or_create(get_device_id())?
            .pool
            .set_expandable_segments(on);
        Ok(())
    }

    /// Whether the current device's pool grows with expandable segments (asked for
    /// and supported), creating the pool if needed.
    pub fn expandable_segments(&self) -> Result<bool> {
        Ok(self
            .pools()
            .get_or_create(get_device_id())?
            .pool
            .expandable_segments())
    }

    /// The limit of the current device's pool in bytes (0: none), creating the pool
    /// (and reading [`LIMIT_ENV`]) if needed.
    pub fn get_limit(&self) -> Result<u64> {
        Ok(self.pools().get_or_create(get_device_id())?.pool.limit())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<MemoryPool>();
        check::<PooledMemory>();
    }
}
