//! Stream-ordered allocation over the driver's memory pools: [`malloc_async`],
//! [`MemoryAsync`] and [`MemoryAsyncPool`] (CuPy's `cudaMallocAsync` allocator).
//!
//! Memory is freed with `cuMemFreeAsync` on the stream it was allocated on. The memory
//! holds a [`StreamRef`] to that stream, which keeps a [`Stream`](crate::Stream) alive
//! until the memory is freed on it: the user may drop the stream object first (as
//! CuPy allows), and the free still goes to a live stream, in order after the work
//! queued on it. Default streams need no keeping. An [`ExternalStream`](crate::ExternalStream)
//! is kept alive by its maker (its `from_raw` is `unsafe` and says so); should the
//! driver refuse its handle at the free, the free falls back to synchronizing the
//! device and freeing on the legacy default stream.
//!
//! # Uses by other streams
//! The driver's pool hands freed memory out again in stream order: at once to later
//! allocations on the freeing stream, to other streams once the free has run. Work
//! that another stream queued on the memory is not ordered by that, so every
//! stream-ordered operation cuda-rt queues on the memory on another stream records
//! that stream ([`BaseMemory::record_stream`]; nothing, no lock, for the memory's own
//! stream). At the free, an event is recorded on each recorded stream and the freeing
//! stream waits for it on the device (`cuStreamWaitEvent`) before `cuMemFreeAsync`:
//! no host wait. A stream that cannot be ordered so (the per-thread default stream
//! of another thread, which no handle names here; an event the driver refuses) is
//! waited for on the host; one that cannot be waited for either (capturing a graph,
//! a driver error) leaks the memory rather than free it early.
//!
//! # The per-thread default stream
//! Its handle (2) names a different stream on each thread, so memory allocated on it
//! remembers the allocating thread ([`stream_key`]). Freed on that thread, nothing
//! changes; freed on another, the free waits for the context's whole work on the host
//! first (counted by [`MemoryAsync::host_waits`]), since the handle would name the
//! freeing thread's stream instead of the allocating one's.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::{get_device_id, Device};
use crate::error::{ArgumentKind, Error, OutOfMemory, OutOfMemoryCause, Result};
use crate::memory::device_memory::{make_current_checked, BaseMemory};
use crate::memory::pool::stream_key::stream_key;
use crate::memory::pool::stream_uses::StreamUses;
use crate::memory::MemoryPointer;
use crate::stream::{
    current_stream_of, get_current_stream, AsStream, StreamRef, PER_THREAD_DEFAULT_HANDLE,
};

/// Async-pool sizes are multiples of this many bytes (as CuPy's).
pub const ROUND_SIZE: usize = 512;

/// The limit (release threshold) that means "no limit": the pool keeps everything it
/// holds at synchronization points and is never shrunk but by
/// [`MemoryAsyncPool::free_all_blocks`]. CuPy's reading of a limit of 0, reported as
/// `2**64 - 1`.
pub const NO_LIMIT: u64 = u64::MAX;

/// The release threshold a limit of `bytes` is set as: 0 is [`NO_LIMIT`], as in CuPy.
/// Pure.
pub fn threshold_for_limit(bytes: u64) -> u64 {
    if bytes == 0 {
        NO_LIMIT
    } else {
        bytes
    }
}

fn round_up(size: usize) -> Result<usize> {
    size.checked_add(ROUND_SIZE - 1)
        .map(|s| s / ROUND_SIZE * ROUND_SIZE)
        .ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("size {size} is too large"),
            )
        })
}

/// Memory from a driver memory pool, freed on the stream it was allocated on.
pub struct MemoryAsync {
    ptr: u64,
    size: usize,
    device: i32,
    /// The stream it was allocated on and is freed on, kept alive until then.
    stream: StreamRef,
    /// `stream`'s [`stream_key`] at the allocation: for the per-thread default stream,
    /// the allocating thread's key, which tells whether the free runs on another thread.
    key: u64,
    /// Other streams that used the memory ([`BaseMemory::record_stream`]), which the
    /// free waits for; empty again once freed.
    uses: StreamUses,
    /// Keeps a pool this library created alive while its memory lives.
    _pool: Option<MemoryAsyncPool>,
}

impl fmt::Debug for MemoryAsync {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAsync")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("size", &self.size)
            .field("device", &self.device)
            .field("stream", &format_args!("{:#x}", self.stream.handle()))
            .field("other_streams", &self.uses.any())
            .finish()
    }
}

impl MemoryAsync {
    /// `size` bytes (rounded up to 512) from the current device's current pool, on the
    /// current stream (`cuMemAllocAsync`). Size 0 is a null pointer of size 0.
    pub fn new(size: usize) -> Result<MemoryAsync> {
        Self::alloc(size, get_current_stream(), None)
    }

    /// The same on `stream`, from its device's current pool. The memory keeps the
    /// stream alive until it is freed on it (see the module docs).
    pub fn new_on(size: usize, stream: &dyn AsStream) -> Result<MemoryAsync> {
        Self::alloc(size, stream.as_stream_ref(), None)
    }

    /// The stream the memory was allocated on, and will be freed on.
    pub fn stream(&self) -> &StreamRef {
        &self.stream
    }

    /// How many times, in this process, freeing stream-ordered memory waited on the
    /// host because the device could not order the free after another stream's use:
    /// memory of one thread's per-thread default stream freed on another thread, a
    /// recorded use of another thread's per-thread default stream, or an event the
    /// driver refused. Zero in the steady state of a well-ordered program; a figure to
    /// watch, not a correctness signal.
    pub fn host_waits() -> u64 {
        HOST_WAITS.load(Ordering::Relaxed)
    }

    fn alloc(
        size: usize,
        stream: StreamRef,
        pool: Option<&MemoryAsyncPool>,
    ) -> Result<MemoryAsync> {
        let device = stream.device_id();
        if size == 0 {
            return Ok(MemoryAsync {
                ptr: 0,
                size: 0,
                device,
                key: stream_key(stream.handle()),
                stream,
                uses: StreamUses::default(),
                _pool: None,
            });
        }
        let size = round_up(size)?;
        refuse_capture(&stream)?;
        let ptr = alloc_ptr(size, device, &stream, pool.filter(|p| p.inner.owned))?;
        Ok(MemoryAsync {
            ptr,
            size,
            device,
            key: stream_key(stream.handle()),
            stream,
            uses: StreamUses::default(),
            _pool: pool.filter(|p| p.inner.owned).cloned(),
        })
    }
}

/// `size` (rounded, non-zero) bytes on `stream` of `device`: from `pool`, or the
/// device's current pool. The hot path is one thread-local check and one driver call.
#[inline]
fn alloc_ptr(
    size: usize,
    device: i32,
    stream: &StreamRef,
    pool: Option<&MemoryAsyncPool>,
) -> Result<u64> {
    make_current_checked(device)?;
    // SAFETY: `stream`'s device (`device`) has its context current (above).
    match unsafe { alloc_on(size, stream, pool) } {
        Ok(p) => Ok(p),
        Err(e) => alloc_retry(e.into(), size, device, stream, pool),
    }
}

/// `cuMemAllocAsync` on `stream`, or `cuMemAllocFromPoolAsync` from `pool`.
///
/// # Safety
/// The context of `stream`'s device is current.
#[inline]
unsafe fn alloc_on(
    size: usize,
    stream: &StreamRef,
    pool: Option<&MemoryAsyncPool>,
) -> result::Result<u64> {
    match pool {
        // SAFETY: `stream` keeps its stream alive while borrowed (a `StreamRef` owns or
        // borrows it), and its context is current (caller).
        None => unsafe { result::memory::alloc_async(size, stream.as_raw()) },
        // SAFETY: as above; the pool is alive while its `MemoryAsyncPool` is borrowed.
        Some(p) => unsafe {
            result::memory::alloc_from_pool_async(size, p.as_raw(), stream.as_raw())
        },
    }
}

/// A failed allocation: on out of memory, synchronize (frees queued on other streams
/// become reusable once they have run) and retry once.
#[cold]
#[inline(never)]
fn alloc_retry(
    e: Error,
    size: usize,
    device: i32,
    stream: &StreamRef,
    pool: Option<&MemoryAsyncPool>,
) -> Result<u64> {
    if e.driver_code() != Some(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY) {
        return Err(e);
    }
    result::context::synchronize()?;
    // SAFETY: the caller (`alloc_ptr`) made `stream`'s context current on this thread.
    unsafe { alloc_on(size, stream, pool) }.map_err(|e| async_oom(e.into(), size, device, pool))
}

/// The out-of-memory error for a pool, with its used and reserved bytes.
fn async_oom(e: Error, size: usize, device: i32, pool: Option<&MemoryAsyncPool>) -> Error {
    let Error::Driver(d) = e else { return e };
    if d.code != sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        return Error::Driver(d);
    }
    let pool = pool.map(|p| p.as_raw()).or_else(|| {
        let dev = Device::new(device).ok()?;
        result::device::get_mem_pool(dev.as_raw()).ok()
    });
    // SAFETY: `pool` is the caller's (alive while its `MemoryAsyncPool` is borrowed) or
    // the device's current pool, just asked for, which lives as long as its context.
    let stat = |a| pool.and_then(|p| unsafe { result::memory::pool_get_attribute_u64(p, a) }.ok());
    let used = stat(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT).unwrap_or(0);
    let reserved =
        stat(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT).unwrap_or(0);
    Error::OutOfMemory(Box::new(OutOfMemory {
        requested: size as u64,
        rounded: Some(size as u64),
        device: Some(device),
        in_use: used,
        cached: reserved.saturating_sub(used),
        limit: None,
        cause: OutOfMemoryCause::Driver(d),
    }))
}

// SAFETY: `ptr..ptr+size` is a pool allocation owned until drop or `recycle`
// (stream-ordered: work queued on the allocation stream before may use it); fields
// change only while the object is uniquely owned (`Arc::get_mut`): emptied by
// `recycle`, refilled by `malloc_async`.
unsafe impl BaseMemory for MemoryAsync {
    fn ptr(&self) -> u64 {
        self.ptr
    }
    fn size(&self) -> usize {
        self.size
    }
    fn device_id(&self) -> i32 {
        self.device
    }

    /// Marks the memory as used by work queued on `stream`: its free waits for that
    /// work (see the module docs). Nothing, and no lock, for the memory's own stream
    /// (work there is ordered before the free already); `stream` is kept alive until
    /// the free. A stream of another device is waited for on the host at the free.
    /// Never fails.
    #[inline]
    fn record_stream(&self, stream: &StreamRef) -> Result<()> {
        self.record_use(stream);
        Ok(())
    }

    #[inline]
    fn record_use(&self, stream: &StreamRef) {
        if self.size == 0 {
            // Nothing to protect: a null allocation is never freed.
            return;
        }
        self.uses.record(stream, self.device, self.key)
    }

    /// The last pointer went: the memory is freed on its stream now (as the drop
    /// would do) and an object of [`malloc_async`] (no stream or pool to keep alive)
    /// is kept, emptied, for the thread's next `malloc_async`.
    #[inline]
    fn recycle(mut self: Arc<Self>) {
        let Some(m) = Arc::get_mut(&mut self) else {
            return;
        };
        m.release();
        // Emptied, it holds no stream: a spare keeps nothing alive.
        m.stream = StreamRef::legacy_default(m.device);
        if m._pool.is_none() {
            spare::put(self);
        }
    }
}

// Recycled [`malloc_async`] objects: an emptied `Arc<MemoryAsync>` waits here for
// the thread's next `malloc_async`, so a malloc + free pair allocates nothing on the
// heap.
crate::memory::recycler::spare_list!(MemoryAsync);

impl Drop for MemoryAsync {
    fn drop(&mut self) {
        self.release();
    }
}

/// Host waits of stream-ordered frees ([`MemoryAsync::host_waits`]).
static HOST_WAITS: AtomicU64 = AtomicU64::new(0);

fn count_host_wait() {
    HOST_WAITS.fetch_add(1, Ordering::Relaxed);
}

/// Whether memory allocated on `handle` under stream key `alloc_key` is being freed on
/// another thread's per-thread default stream: the handle names the current thread's
/// stream, the key says which thread allocated. Pure but for the thread's key.
#[inline]
fn freed_on_another_thread(handle: usize, alloc_key: u64) -> bool {
    handle == PER_THREAD_DEFAULT_HANDLE && stream_key(handle) != alloc_key
}

impl MemoryAsync {
    /// Frees the memory on its stream (once: the object is empty afterwards), after
    /// the work of the streams recorded on it. The hot path (no other stream, freed
    /// where it was allocated) adds a compare and one relaxed load to the free.
    #[inline]
    fn release(&mut self) {
        let size = std::mem::replace(&mut self.size, 0);
        if size == 0 {
            return;
        }
        if make_current(self.stream.device_id()).is_err() {
            return;
        }
        if (self.uses.any() || freed_on_another_thread(self.stream.handle(), self.key))
            && !self.order_free()
        {
            // Freeing now could hand the memory out under another stream's work:
            // leaked instead (it stays allocated; a destroyed pool of its own is
            // kept by the driver until then).
            return;
        }
        // SAFETY: `ptr` came from the allocation on this stream and is freed once
        // (`size` was set to 0 above), its last pointer gone, after the work of every
        // other stream that used it (`order_free`; for another thread's per-thread
        // default stream, the handle names this thread's, after a context-wide wait);
        // `self.stream` keeps the stream alive, and its device's context was made
        // current above.
        if unsafe { result::memory::free_async(self.ptr, self.stream.as_raw()) }.is_err() {
            free_on_stale_stream(self.ptr);
        }
    }
}

impl MemoryAsync {
    /// Orders the coming free after the work of the other streams that used the memory
    /// (see the module docs); `false` when that is impossible and the memory must not
    /// be freed. The context of the memory's device is current.
    #[cold]
    #[inline(never)]
    fn order_free(&self) -> bool {
        if freed_on_another_thread(self.stream.handle(), self.key) {
            // The allocating thread's per-thread default stream has no handle here:
            // wait for the context's whole work, which holds the recorded uses too.
            return self.wait_for_context();
        }
        // SAFETY: `self.stream` keeps its stream alive (or is a default stream, or a
        // handle its maker keeps alive); its context is current (caller).
        match unsafe { result::stream::is_capturing(self.stream.as_raw()) } {
            Ok(sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE) => {}
            Ok(_) => {
                // Capturing (a `MemoryAsync` owned directly and dropped inside a
                // capture): the free would become a node of the graph, a wait for an
                // event recorded outside the capture cannot join it, and a host wait
                // would break the capture. Leaked.
                self.uses.clear();
                return false;
            }
            Err(_) => {
                // The driver refuses the handle (an external stream gone): wait for
                // the context's work; `release` then frees on the legacy default
                // stream (`free_on_stale_stream`).
                return self.wait_for_context();
            }
        }
        let ordered = self
            .uses
            .order_before(self.device, &self.stream, count_host_wait);
        // A peer's use (a stream of another device) was waited for with that device's
        // context made current: the free that follows goes to this memory's stream,
        // in its own context again (with the peer's context current the driver
        // refused the stream, and the fallback then freed on the peer's legacy
        // stream, not after the work still queued on this memory's own stream).
        ordered && make_current(self.stream.device_id()).is_ok()
    }
}

impl MemoryAsync {
    /// Waits on the host for all the work of the current context (the memory's
    /// device's), which orders the free after every use; `false` when the driver
    /// refused. The recorded uses are forgotten either way.
    #[cold]
    fn wait_for_context(&self) -> bool {
        count_host_wait();
        let done = result::context::synchronize().is_ok();
        self.uses.clear();
        done
    }
}

/// The stream is gone (see the module docs): finish all queued work, then free on the
/// legacy default stream.
#[cold]
#[inline(never)]
fn free_on_stale_stream(ptr: u64) {
    if result::context::synchronize().is_ok() {
        // SAFETY: the allocation is freed once (its owner emptied itself); all work of
        // the context has finished (synchronised above), and the legacy default stream
        // (null) is valid whenever a context is current (the caller made it current).
        let _ = unsafe { result::memory::free_async(ptr, std::ptr::null_mut()) };
    }
}

/// A `MemoryAsync` on a capturing stream would be a graph's memory node freed by a
/// plain `cuMemFreeAsync` outside the graph, whatever became of the graph: refused
/// (one relaxed atomic load while no capture is active).
#[inline]
fn refuse_capture(stream: &StreamRef) -> Result<()> {
    if !crate::capture::any_capture_active()
        || stream.handle() == crate::stream::LEGACY_DEFAULT_HANDLE
    {
        return Ok(());
    }
    match crate::capture::info(stream)? {
        (crate::capture::CaptureStatus::None, _) => Ok(()),
        _ => Err(Error::capture(
            crate::error::CaptureKind::Refused,
            format!(
                "a stream-ordered allocation on stream {:#x}, which is capturing a graph: \
                 allocate with malloc_async or alloc on the capturing stream (current), whose \
                 memory becomes the graph's",
                stream.handle()
            ),
        )),
    }
}

/// `size` bytes (rounded up to 512) from the current device's current memory pool, on
/// the current stream. Size 0 is a null pointer of size 0. While the current stream
/// captures a graph (a capture begun through cuda-rt), the memory is the graph's
/// allocation, as [`alloc`](crate::memory::alloc)'s is then.
pub fn malloc_async(size: usize) -> Result<MemoryPointer> {
    // While the current stream captures, the allocation is the graph's (a memory node,
    // as for `alloc`): freed inside the graph or owned by it, never by a free outside.
    if size != 0 {
        if let Some(r) = crate::memory::graph_memory::capture_aware_alloc(size) {
            return r;
        }
    }
    let stream = get_current_stream();
    if size == 0 {
        return Ok(MemoryPointer::from_memory(Arc::new(MemoryAsync::alloc(
            0, stream, None,
        )?)));
    }
    let size = round_up(size)?;
    let device = stream.device_id();
    let ptr = alloc_ptr(size, device, &stream, None)?;
    if let Some(mut o) = spare::take() {
        if let Some(m) = Arc::get_mut(&mut o) {
            // An emptied object (size 0, nothing held, no uses): refill it in place.
            m.key = stream_key(stream.handle());
            (m.ptr, m.size, m.device, m.stream) = (ptr, size, device, stream);
            return Ok(MemoryPointer::from_memory_at(o, ptr));
        }
    }
    // Built in place in its `Arc`: no `Result<MemoryAsync>` to move around.
    Ok(MemoryPointer::from_memory(Arc::new(MemoryAsync {
        ptr,
        size,
        device,
        key: stream_key(stream.handle()),
        stream,
        uses: StreamUses::default(),
        _pool: None,
    })))
}

struct PoolInner {
    /// `CUmemoryPool` as an address.
    pool: usize,
    device: i32,
    /// Created by this library (destroyed on drop), or the device's pool.
    owned: bool,
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        if self.owned {
            // The driver defers destruction until outstanding allocations are freed.
            // SAFETY: a pool this library created, destroyed once, here, when the last
            // clone and the last memory from it (which keeps a clone) are gone.
            let _ = unsafe { result::memory::pool_destroy(self.pool as sys::CUmemoryPool) };
        }
    }
}

/// A driver memory pool used as an allocator: the device's current pool
/// ([`MemoryAsyncPool::new`], [`MemoryAsyncPool::current`]) or one of its own
/// ([`MemoryAsyncPool::create`]). Clones share the pool.
#[derive(Clone)]
pub struct MemoryAsyncPool {
    inner: Arc<PoolInner>,
}

impl fmt::Debug for MemoryAsyncPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryAsyncPool")
            .field("pool", &format_args!("{:#x}", self.inner.pool))
            .field("device", &self.inner.device)
            .field("owned", &self.inner.owned)
            .finish()
    }
}

impl MemoryAsyncPool {
    /// The current device's current pool (CuPy's default), with its limit set as
    /// CuPy's `MemoryAsyncPool()` sets it: from `CUDA_RT_GPU_MEMORY_LIMIT`
    /// ([`LIMIT_ENV`], bytes or a percentage of the device's memory, as for the
    /// caching pool), else none ([`NO_LIMIT`]). The driver's own default threshold is
    /// 0 (give every free byte back at each synchronization), which CuPy, and so
    /// cuda-rt, replace. An error when the variable does not parse.
    ///
    /// [`LIMIT_ENV`]: crate::memory::pool::LIMIT_ENV
    pub fn new() -> Result<MemoryAsyncPool> {
        let pool = Self::current(get_device_id())?;
        pool.set_limit_from_env()?;
        Ok(pool)
    }

    /// The limit from `CUDA_RT_GPU_MEMORY_LIMIT`, else none (see [`MemoryAsyncPool::new`]).
    fn set_limit_from_env(&self) -> Result<()> {
        use crate::memory::pool::limit_env::{device_total_memory, limit_from_env, LIMIT_ENV};
        let value = std::env::var(LIMIT_ENV).ok();
        let device = self.inner.device;
        let bytes = limit_from_env(value.as_deref(), || device_total_memory(device))?;
        self.set_limit(bytes)
    }

    /// Device `device`'s current pool (`cuDeviceGetMemPool`), as it is: its settings
    /// (the limit among them) are left alone.
    pub fn current(device: i32) -> Result<MemoryAsyncPool> {
        let dev = Device::new(device)?;
        make_current(device)?;
        let pool = result::device::get_mem_pool(dev.as_raw())?;
        Ok(Self::wrap(pool, device, false))
    }

    /// A new pool on device `device` (`cuMemPoolCreate`), destroyed when the last clone
    /// and the last memory from it are gone. Its limit is set as by
    /// [`MemoryAsyncPool::new`]: `CUDA_RT_GPU_MEMORY_LIMIT`, else none.
    pub fn create(device: i32) -> Result<MemoryAsyncPool> {
        Self::create_with(
            device,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        )
    }

    /// [`create`](Self::create) a pool that other processes can import: its handle
    /// type is a POSIX file descriptor ([`export_fd`](Self::export_fd); send it with
    /// [`ipc::send_fd`](crate::ipc::send_fd)), and pointers from it are shared with
    /// [`ipc::PoolPointerHandle`](crate::ipc::PoolPointerHandle).
    pub fn create_shareable(device: i32) -> Result<MemoryAsyncPool> {
        Self::create_with(
            device,
            sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    }

    fn create_with(
        device: i32,
        handles: sys::CUmemAllocationHandleType,
    ) -> Result<MemoryAsyncPool> {
        Device::new(device)?;
        make_current(device)?;
        let props = sys::CUmemPoolProps {
            allocType: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            handleTypes: handles,
            location: crate::memory::managed::mem_location(Some(device)),
            // All other fields zero: no size cap, reserved bytes zero (the driver's
            // documented default).
            ..Default::default()
        };
        let pool = Self::wrap(result::memory::pool_create(&props)?, device, true);
        if handles != sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE {
            // `cuMemPoolExportPointer` shares allocations "from an already shared memory
            // pool" and refuses others with CUDA_ERROR_INVALID_VALUE: exported once here
            // (the descriptor closed at once), a pointer can be exported before or
            // without `export_fd`.
            drop(pool.export_fd()?);
        }
        pool.set_limit_from_env()?;
        Ok(pool)
    }

    /// A POSIX file descriptor another process imports this pool with
    /// ([`import_fd`](Self::import_fd)), `cuMemPoolExportToShareableHandle`. Only a pool
    /// made by [`create_shareable`](Self::create_shareable) can be exported; others are
    /// an error from the driver. The descriptor is closed when dropped.
    pub fn export_fd(&self) -> Result<std::os::fd::OwnedFd> {
        use std::os::fd::FromRawFd;
        make_current(self.inner.device)?;
        // SAFETY: the pool is live while `self` is.
        let fd = unsafe { result::ipc::pool_export_to_fd(self.as_raw()) }?;
        // SAFETY: the driver handed out a new descriptor that nothing else owns.
        Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
    }

    /// The pool another process exported ([`export_fd`](Self::export_fd)), imported on
    /// `device` (`cuMemPoolImportFromShareableHandle`); destroyed when the last clone
    /// and the last memory imported from it are gone. The descriptor stays the
    /// caller's. Pointers come from it with
    /// [`PoolPointerHandle::import`](crate::ipc::PoolPointerHandle::import).
    pub fn import_fd(fd: std::os::fd::BorrowedFd<'_>, device: i32) -> Result<MemoryAsyncPool> {
        use std::os::fd::AsRawFd;
        Device::new(device)?;
        make_current(device)?;
        let pool = result::ipc::pool_import_from_fd(fd.as_raw_fd())?;
        Ok(Self::wrap(pool, device, true))
    }

    fn wrap(pool: sys::CUmemoryPool, device: i32, owned: bool) -> MemoryAsyncPool {
        MemoryAsyncPool {
            inner: Arc::new(PoolInner {
                pool: pool as usize,
                device,
                owned,
            }),
        }
    }

    /// The raw `CUmemoryPool`.
    pub fn as_raw(&self) -> sys::CUmemoryPool {
        self.inner.pool as sys::CUmemoryPool
    }

    /// The pool's device.
    pub fn device_id(&self) -> i32 {
        self.inner.device
    }

    /// Whether both are the same driver pool.
    pub fn same_as(&self, other: &MemoryAsyncPool) -> bool {
        self.inner.pool == other.inner.pool
    }

    /// `size` bytes (rounded up to 512) on the pool device's current stream. On out of
    /// memory: synchronize the device and retry once, then
    /// [`Error::OutOfMemory`] with the pool's used and cached bytes.
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer> {
        let s = current_stream_of(self.inner.device);
        self.malloc_on(size, &s)
    }

    /// `size` bytes on `stream`, which must belong to the pool's device. The memory
    /// keeps the stream alive until it is freed on it.
    pub fn malloc_on(&self, size: usize, stream: &dyn AsStream) -> Result<MemoryPointer> {
        if stream.device_id() != self.inner.device {
            return Err(Error::invalid_argument(
                ArgumentKind::WrongDevice {
                    expected: self.inner.device,
                    found: stream.device_id(),
                },
                format!(
                    "stream of device {} used with the async pool of device {}",
                    stream.device_id(),
                    self.inner.device
                ),
            ));
        }
        let m = MemoryAsync::alloc(size, stream.as_stream_ref(), Some(self))?;
        Ok(MemoryPointer::from_memory(Arc::new(m)))
    }

    fn get(&self, attr: sys::CUmemPool_attribute) -> Result<u64> {
        make_current(self.inner.device)?;
        // SAFETY: the pool is alive while `self` is (a pool of its own is destroyed
        // with the last clone; the device's current pool lives with its context).
        Ok(unsafe { result::memory::pool_get_attribute_u64(self.as_raw(), attr) }?)
    }

    /// Bytes handed out now (`CU_MEMPOOL_ATTR_USED_MEM_CURRENT`).
    pub fn used_bytes(&self) -> Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT)
    }

    /// Bytes the pool holds from the device now (`CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT`).
    pub fn total_bytes(&self) -> Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)
    }

    /// Bytes held but not handed out: `total_bytes - used_bytes`.
    pub fn free_bytes(&self) -> Result<u64> {
        Ok(self.total_bytes()?.saturating_sub(self.used_bytes()?))
    }

    /// The limit: the release threshold, bytes the pool keeps cached at
    /// synchronization points (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`, CuPy's
    /// `get_limit()`); [`NO_LIMIT`] (`2**64 - 1`) when there is none, as CuPy
    /// reports it. A soft limit, as in CuPy: the driver may hold more while memory is
    /// in use, and other users of the same pool are not bound by it.
    pub fn limit(&self) -> Result<u64> {
        self.get(sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD)
    }

    /// Sets the limit, the release threshold (`CU_MEMPOOL_ATTR_RELEASE_THRESHOLD`),
    /// CuPy's `set_limit(size=...)`: 0 means no limit and sets [`NO_LIMIT`] (the pool
    /// is never shrunk at synchronization points), as in CuPy.
    pub fn set_limit(&self, bytes: u64) -> Result<()> {
        make_current(self.inner.device)?;
        // SAFETY: the pool is alive while `self` is (see `get`).
        Ok(unsafe {
            result::memory::pool_set_attribute_u64(
                self.as_raw(),
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                threshold_for_limit(bytes),
            )
        }?)
    }

    /// Sets the limit to a fraction (0 to 1) of the device's memory; 0 is no limit, as
    /// in CuPy.
    pub fn set_limit_fraction(&self, fraction: f64) -> Result<()> {
        if !(0.0..=1.0).contains(&fraction) {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("limit fraction {fraction} is not between 0 and 1"),
            ));
        }
        let total = Device::new(self.inner.device)?.total_memory()?;
        self.set_limit((total as f64 * fraction) as u64)
    }

    /// Synchronizes the device, then trims the pool to 0 bytes
    /// (`cuMemPoolTrimTo(pool, 0)`): every cached byte goes back to the device.
    pub fn free_all_blocks(&self) -> Result<()> {
        make_current(self.inner.device)?;
        result::context::synchronize()?;
        // SAFETY: the pool is alive while `self` is (see `get`).
        Ok(unsafe { result::memory::pool_trim_to(self.as_raw(), 0) }?)
    }
}

#[cfg(test)]
mod tests {
    use super::{
        freed_on_another_thread, round_up, stream_key, threshold_for_limit, MemoryAsync,
        StreamUses, NO_LIMIT, PER_THREAD_DEFAULT_HANDLE,
    };
    use crate::memory::BaseMemory;
    use crate::stream::StreamRef;

    #[test]
    fn only_the_per_thread_default_stream_freed_on_another_thread_needs_a_host_wait() {
        let mine = stream_key(PER_THREAD_DEFAULT_HANDLE);
        assert!(!freed_on_another_thread(PER_THREAD_DEFAULT_HANDLE, mine));
        let theirs = std::thread::spawn(|| stream_key(PER_THREAD_DEFAULT_HANDLE))
            .join()
            .unwrap();
        assert!(freed_on_another_thread(PER_THREAD_DEFAULT_HANDLE, theirs));
        // Other handles name one stream on every thread.
        assert!(!freed_on_another_thread(0, 0));
        assert!(!freed_on_another_thread(0x7f00_0000, 0x7f00_0000));
    }

    /// A `MemoryAsync` that owns nothing real: dropped without a driver, `release`
    /// stops at `make_current`.
    fn fake(size: usize, stream: StreamRef) -> MemoryAsync {
        MemoryAsync {
            ptr: if size == 0 { 0 } else { 0x1000 },
            size,
            device: 0,
            key: stream_key(stream.handle()),
            stream,
            uses: StreamUses::default(),
            _pool: None,
        }
    }

    #[test]
    fn record_stream_keeps_other_streams_only() {
        let m = fake(512, StreamRef::per_thread_default(0));
        m.record_stream(&StreamRef::per_thread_default(0)).unwrap();
        assert!(!m.uses.any(), "its own stream: nothing to do");
        m.record_stream(&StreamRef::legacy_default(0)).unwrap();
        assert!(m.uses.any(), "another stream is waited for at the free");
        m.uses.clear();
        // A peer's stream, even with the same handle: recorded (waited for on the host).
        m.record_stream(&StreamRef::per_thread_default(3)).unwrap();
        assert!(m.uses.any(), "a stream of another device is a use");
        let empty = fake(0, StreamRef::per_thread_default(0));
        empty.record_stream(&StreamRef::legacy_default(0)).unwrap();
        assert!(!empty.uses.any(), "a null allocation is never freed");
    }

    #[test]
    fn a_limit_of_zero_is_no_limit_as_in_cupy() {
        assert_eq!(NO_LIMIT, u64::MAX, "CuPy reports 2**64 - 1");
        assert_eq!(threshold_for_limit(0), NO_LIMIT);
        assert_eq!(threshold_for_limit(1), 1);
        assert_eq!(threshold_for_limit(64 << 20), 64 << 20);
        assert_eq!(threshold_for_limit(NO_LIMIT), NO_LIMIT);
    }

    #[test]
    fn sizes_round_up_to_512() {
        assert_eq!(round_up(1).unwrap(), 512);
        assert_eq!(round_up(512).unwrap(), 512);
        assert_eq!(round_up(513).unwrap(), 1024);
        assert!(round_up(usize::MAX).is_err());
    }
}
