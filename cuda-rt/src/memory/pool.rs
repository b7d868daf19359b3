//! The caching device memory pool (CuPy's `MemoryPool`): the algorithm of
//! [`arena`](super::arena) over `cuMemAlloc`/`cuMemFree`, one arena pool per device,
//! created on the device's first use.
//!
//! # Semantics
//! Those of [`arena`](super::arena) (512-byte rounding, per-stream arenas, best fit
//! with split and merge, limit with release-and-retry), plus:
//! - The stream key of a malloc is the handle of the thread's current stream on the
//!   device; the per-thread default stream (handle 2) gets one key per thread (a
//!   unique id with the high bit set), the legacy default stream (handle 0) is shared.
//!   Memory goes back to the arena it came from, whatever stream is current then.
//! - The limit starts from the environment variable [`LIMIT_ENV`]
//!   (`CUDA_RT_GPU_MEMORY_LIMIT`: `"1073741824"` bytes or `"40%"` of the device's
//!   memory), read when the device's pool is created.
//! - Out of memory (limit or driver) is [`Error::OutOfMemory`] with the rounded
//!   request, in-use, cached and limit bytes, and the driver's error if it refused.
//! - Hooks ([`super::hook`]) registered on the calling thread run around
//!   mallocs and frees; with none, the cost is one thread-local test.
//!
//! # Hot path
//! A cache hit makes no driver call (the device id is known, no context is made
//! current) and takes only its arena's lock (a spin lock: one compare-exchange, and a
//! plain store to release). Emptied memory objects are recycled per thread and
//! refilled through relaxed atomics. Frees are *parked*: the block waits in the
//! thread's slot and goes back into its arena under the lock of the thread's next
//! malloc (any observer, and any malloc about to grow, settles every thread's parked
//! block first; a single thread sees exactly the unparked algorithm; see
//! [`arena`](super::arena)). A cached malloc + free pair so allocates nothing on the
//! heap and makes one atomic read-modify-write in all: the malloc's lock; none where
//! [`lock_free_cached_pairs`] says so (a thread's malloc then takes back the block it
//! parked without the lock while its arena has not changed since it last checked
//! under the lock that the block is exactly what the malloc gets). Memory of
//! the default pool ([`get_default_memory_pool`]) refers to its device pool by a
//! `'static` reference, so threads share no reference count; memory of a pool made
//! with [`MemoryPool::new`] holds an `Arc` of its device pool, as do its recycled
//! objects and parking slots, so that pool gives its cache back to the driver when
//! its last handle goes (and each block freed after that at once), not when the
//! device pool itself is dropped.

use std::cell::Cell;
use std::fmt;
use std::ops::Deref;
use std::panic::Location;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::device::get_device_id;
use crate::driver::context::{make_current, MAX_DEVICES};
use crate::driver::{self, sys};
use crate::error::{DriverError, Error, OutOfMemory, Result};
use crate::memory::allocator::Allocate;
use crate::memory::arena::parked::{self, HomeRef};
use crate::memory::arena::{
    limit_from_fraction, parse_limit, round_size, AtomicBlock, Backend, BackendError, Block,
    MallocError, Pool, PoolStats, RawBlock,
};
use crate::memory::device_memory::{check_device, BaseMemory};
use crate::memory::hook;
use crate::memory::MemoryPointer;
use crate::stream::{current_stream_handle, AsStream, PER_THREAD_DEFAULT_HANDLE};

/// Whether a cached malloc + free pair of one thread takes no lock at all in this
/// process (see [`arena`](super::arena)'s parked frees): it needs the operating
/// system's process-wide barrier (Linux `membarrier`, 4.14 or later, not filtered by
/// a sandbox); without it the pair takes its arena's lock once. Either way the
/// semantics are the same.
pub fn lock_free_cached_pairs() -> bool {
    crate::driver::barrier::ready()
}

/// The environment variable with the default limit of each device's pool, read when
/// the pool of a device is created: a byte count (`"1073741824"`) or a percentage of
/// the device's total memory (`"40%"`); `"0"` or unset: no limit (CuPy's
/// `CUPY_GPU_MEMORY_LIMIT`).
pub const LIMIT_ENV: &str = "CUDA_RT_GPU_MEMORY_LIMIT";

/// The bit that marks a per-thread stream key (no stream handle has it).
const PER_THREAD_KEY_BIT: u64 = 1 << 63;

static NEXT_THREAD_KEY: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's key for the per-thread default stream (0: not drawn yet).
    static THREAD_KEY: Cell<u64> = const { Cell::new(0) };
    /// The driver's error of this thread's last refused `cuMemAlloc`, for the
    /// out-of-memory error (the arena's backend error carries no payload).
    static LAST_DRIVER_OOM: Cell<Option<DriverError>> = const { Cell::new(None) };
}

/// The arena key of a stream handle: the handle itself, except the per-thread default
/// stream, which gets one key per thread.
#[inline]
pub(crate) fn stream_key(handle: usize) -> u64 {
    if handle == PER_THREAD_DEFAULT_HANDLE {
        per_thread_key()
    } else {
        handle as u64
    }
}

#[inline]
fn per_thread_key() -> u64 {
    THREAD_KEY.with(|k| match k.get() {
        0 => {
            let v = PER_THREAD_KEY_BIT | NEXT_THREAD_KEY.fetch_add(1, Ordering::Relaxed);
            k.set(v);
            v
        }
        v => v,
    })
}

/// The limit of a new device pool from the value of [`LIMIT_ENV`] (`None`: unset).
/// `total` gives the device's memory, asked only for a percentage.
pub(crate) fn limit_from_env(
    value: Option<&str>,
    total: impl FnOnce() -> Result<u64>,
) -> Result<u64> {
    let Some(v) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(0);
    };
    let total = if v.trim_end().ends_with('%') {
        total()?
    } else {
        0
    };
    parse_limit(v, total).map_err(|e| Error::InvalidArgument(format!("{LIMIT_ENV}: {e}")))
}

fn device_total_memory(device: i32) -> Result<u64> {
    let dev = driver::device::get(device)?;
    Ok(driver::device::total_mem(dev)? as u64)
}

// ---------------------------------------------------------------------------------
// Backends

/// `cuMemAlloc` / `cuMemFree` on one device (its primary context made current).
#[derive(Debug)]
pub(crate) struct DeviceBackend {
    device: i32,
}

impl Backend for DeviceBackend {
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        match make_current(self.device).and_then(|()| driver::memory::alloc(size)) {
            Ok(p) => Ok(p),
            Err(Error::Driver(d)) if d.code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                LAST_DRIVER_OOM.with(|c| c.set(Some(d)));
                Err(BackendError::OutOfMemory)
            }
            Err(e) => Err(BackendError::Other(Box::new(e))),
        }
    }

    fn free(&self, addr: u64, _size: usize) {
        // Nothing to do about a failure here (a context torn down at exit).
        let _ = make_current(self.device).and_then(|()| driver::memory::free(addr));
    }
}

/// A backend with the `alloc_pre` / `alloc_post` hooks around its `alloc` (the arena
/// calls its backend on the thread that mallocs).
#[derive(Debug)]
pub(crate) struct Hooked<B> {
    inner: B,
    device: i32,
}

impl<B: Backend> Backend for Hooked<B> {
    #[inline]
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        if !hook::has_hooks() {
            return self.inner.alloc(size);
        }
        let dev = self.device;
        hook::each(|h| h.alloc_pre(dev, size));
        let r = self.inner.alloc(size);
        if let Ok(p) = r {
            hook::each(|h| h.alloc_post(dev, size, p));
        }
        r
    }

    #[inline]
    fn free(&self, addr: u64, size: usize) {
        self.inner.free(addr, size)
    }
}

// ---------------------------------------------------------------------------------
// One device's pool, generic over the backend (the CPU tests use a host backend)

/// One device's arena pool with the hook dispatch.
pub(crate) struct Core<B: Backend> {
    pool: Pool<Hooked<B>>,
    device: i32,
}

impl<B: Backend> fmt::Debug for Core<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePool")
            .field("device", &self.device)
            .field("stats", &self.pool.stats())
            .finish()
    }
}

impl<B: Backend> Core<B> {
    pub(crate) fn new(backend: B, device: i32) -> Self {
        Core {
            pool: Pool::new(Hooked {
                inner: backend,
                device,
            }),
            device,
        }
    }

    /// The last handle of the pool went. Recycled memory objects and parking slots
    /// may still hold the core (they keep it to avoid a shared count on the hot path),
    /// so dropping it is not what returns the memory: everything cached goes back to
    /// the driver now, and [`after_free`](Self::after_free) does the same for each
    /// block freed later.
    fn orphan(&self) {
        self.pool.close();
        self.pool.free_all_blocks(None);
    }

    /// Called after a block went back: for an orphaned core, gives the cache to the
    /// driver; `true` when orphaned (a recycled object must not be kept).
    #[inline]
    fn after_free(&self) -> bool {
        if !self.pool.is_closed() {
            return false;
        }
        self.pool.free_all_blocks(None);
        true
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> &Pool<Hooked<B>> {
        &self.pool
    }

    /// Mallocs `size` (> 0) bytes in `key`'s arena and wraps the block with `wrap`;
    /// `id` names the wrapped object for the hooks (`pmem_id`). The block this thread
    /// parked (see [`park_raw`](Self::park_raw)), if any, goes back first.
    #[inline]
    pub(crate) fn malloc<R>(
        &self,
        size: usize,
        key: u64,
        site: &'static Location<'static>,
        wrap: impl FnOnce(Block) -> R,
        id: impl FnOnce(&R) -> usize,
    ) -> std::result::Result<R, MallocError> {
        if !hook::has_hooks() {
            return self.pool_malloc(size, key).map(wrap);
        }
        self.malloc_hooked(size, key, site, wrap, id)
    }

    /// The identity of this pool among a thread's parking slots.
    #[inline]
    fn home_id(&self) -> usize {
        &self.pool as *const Pool<Hooked<B>> as usize
    }

    #[inline]
    fn pool_malloc(&self, size: usize, key: u64) -> std::result::Result<Block, MallocError> {
        self.pool
            .malloc_parked(size, key, parked::slot(self.home_id()))
    }

    #[cold]
    #[inline(never)]
    fn malloc_hooked<R>(
        &self,
        size: usize,
        key: u64,
        site: &'static Location<'static>,
        wrap: impl FnOnce(Block) -> R,
        id: impl FnOnce(&R) -> usize,
    ) -> std::result::Result<R, MallocError> {
        let _site = hook::enter_call_site(site);
        let dev = self.device;
        let mem_size = round_size(size).unwrap_or(usize::MAX);
        hook::each(|h| h.malloc_pre(dev, size, mem_size));
        let block = self.pool_malloc(size, key)?;
        let (ptr, mem_size) = (block.addr(), block.size());
        let r = wrap(block);
        let pmem = id(&r);
        hook::each(|h| h.malloc_post(dev, size, mem_size, ptr, pmem));
        Ok(r)
    }

    /// Gives the block `raw` came from ([`Block::into_raw`] of a block of this pool)
    /// back to its arena, once; `pmem_id` as at malloc.
    #[inline]
    pub(crate) fn free_raw(&self, raw: RawBlock, pmem_id: usize) {
        if !hook::has_hooks() {
            self.pool.free_raw(raw);
            return;
        }
        self.free_hooked(self.pool.block_from_raw(raw), pmem_id);
    }

    /// Gives the block `raw` came from back through this thread's parking slot: it
    /// waits there and returns to its arena under the lock of the thread's next
    /// malloc (or any observer's; see `arena::parked`). With hooks registered, or when
    /// the thread cannot park, it goes back at once.
    /// `home` is how the thread's slot list is to hold the core. Returns
    /// [`after_free`](Self::after_free)'s answer.
    #[inline]
    pub(crate) fn park_raw(
        &self,
        raw: RawBlock,
        pmem_id: usize,
        home: impl FnOnce() -> HomeRef,
    ) -> bool {
        if hook::has_hooks() {
            self.free_hooked(self.pool.block_from_raw(raw), pmem_id);
        } else {
            // Parked even in an orphaned core: `after_free` then settles and releases.
            self.pool.park_or_free(raw, self.home_id(), home);
        }
        self.after_free()
    }

    #[cold]
    #[inline(never)]
    fn free_hooked(&self, block: Block, pmem_id: usize) {
        let (dev, size, ptr) = (self.device, block.size(), block.addr());
        hook::each(|h| h.free_pre(dev, size, ptr, pmem_id));
        let _ = self.pool.free(block);
        hook::each(|h| h.free_post(dev, size, ptr, pmem_id));
    }
}

impl<B: Backend + 'static> parked::Home for Core<B> {
    fn forget(&self, p: &'static parked::Parked) {
        self.pool.forget_parked(p);
    }

    fn closed(&self) -> bool {
        self.pool.is_closed()
    }
}

type DeviceCore = Core<DeviceBackend>;

/// A device pool as pooled memory refers to it.
#[derive(Clone)]
enum CoreRef {
    /// A device pool of the default pool: never dropped, so no reference count.
    Static(&'static DeviceCore),
    /// A device pool of a [`MemoryPool::new`] pool: alive while memory from it lives.
    Shared(Arc<DeviceCore>),
}

impl CoreRef {
    /// How a thread's parking-slot list holds this core.
    fn home(&self) -> HomeRef {
        match self {
            CoreRef::Static(c) => HomeRef::Static(*c),
            CoreRef::Shared(c) => HomeRef::Shared(c.clone()),
        }
    }

    /// Whether `self` and `other` are the same device pool.
    #[inline]
    fn same(&self, other: &CoreRef) -> bool {
        std::ptr::eq(&**self, &**other)
    }
}

impl Deref for CoreRef {
    type Target = DeviceCore;
    #[inline]
    fn deref(&self) -> &DeviceCore {
        match self {
            CoreRef::Static(c) => c,
            CoreRef::Shared(c) => c,
        }
    }
}

// ---------------------------------------------------------------------------------
// PooledMemory

/// Memory from a [`MemoryPool`]: a block of a device pool, which goes back to the
/// arena it came from when the object is dropped (when its last [`MemoryPointer`]
/// goes), whatever stream is current then. Its size is the request rounded up to 512
/// bytes.
pub struct PooledMemory {
    // In atomics so that a recycled object is emptied and refilled through `&self`;
    // written only while the object is provably unreachable from anywhere else (see
    // `recycle` and `wrap`). Size 0: emptied, waiting in a spare list.
    block: AtomicBlock,
    core: CoreRef,
}

impl fmt::Debug for PooledMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PooledMemory")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("size", &self.size())
            .field("device", &self.core.device)
            .field("stream_key", &self.stream_key())
            .finish()
    }
}

impl PooledMemory {
    /// The arena key of the stream the memory was allocated under (the stream handle,
    /// or a per-thread key for the per-thread default stream).
    pub fn stream_key(&self) -> u64 {
        self.block.key()
    }

    fn new(core: CoreRef, raw: RawBlock) -> PooledMemory {
        let m = PooledMemory {
            block: AtomicBlock::empty(),
            core,
        };
        m.block.store(raw);
        m
    }

    /// Gives the block back to its arena, if the object still has one.
    #[inline]
    fn release(&self) {
        if let Some(raw) = self.block.take() {
            self.core
                .free_raw(raw, self as *const PooledMemory as usize);
        }
    }
}

// SAFETY: the block is `size` bytes of `cuMemAlloc` memory of the device, handed out
// by the pool to this object alone until its drop (or `recycle`) gives it back; the
// fields change only while nothing else can reach the object: in `recycle` (the last
// strong reference, no weak one), in a thread's spare list, and in `wrap` before the
// object is handed out again.
unsafe impl BaseMemory for PooledMemory {
    #[inline]
    fn ptr(&self) -> u64 {
        self.block.addr()
    }
    #[inline]
    fn size(&self) -> usize {
        self.block.size() as usize
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.core.device
    }

    /// The last pointer went: the block goes back to its arena now (as the drop would
    /// do) and, for the default pool, the emptied object is kept for the thread's next
    /// malloc.
    #[inline]
    fn recycle(self: Arc<Self>) {
        // The caller's reference is the only strong one; with no weak one either,
        // nothing else can reach the object or get to it (plain loads, where
        // `Arc::get_mut` would pay a compare-exchange).
        if Arc::strong_count(&self) != 1 || Arc::weak_count(&self) != 0 {
            return;
        }
        fence(Ordering::Acquire);
        if let Some(raw) = self.block.take() {
            let id = Arc::as_ptr(&self) as usize;
            if self.core.park_raw(raw, id, || self.core.home()) {
                // The pool's handles are gone: let the object (and the core) go.
                return;
            }
        }
        spare::put(self);
    }
}

// Recycled memory objects: when the last pointer to one goes, its block goes back
// (parked) and the emptied `Arc<PooledMemory>` waits here for the thread's next malloc
// from the same device pool, so a cached malloc + free pair allocates nothing on the
// heap.
crate::spare::spare_list!(PooledMemory);

impl PooledMemory {
    /// `block` of `core` as a memory object: a recycled one of this thread's for the
    /// same device pool when there is one (default pool only), else a new one.
    #[inline]
    fn wrap(core: &CoreRef, block: Block) -> Arc<PooledMemory> {
        let raw = block.into_raw();
        if let Some(o) = spare::take_where(|o| o.core.same(core)) {
            // Emptied by `recycle` and held by this thread's list alone since.
            o.block.store(raw);
            return o;
        }
        Arc::new(PooledMemory::new(core.clone(), raw))
    }
}

impl Drop for PooledMemory {
    #[inline]
    fn drop(&mut self) {
        self.release();
        self.core.after_free();
    }
}

// ---------------------------------------------------------------------------------
// MemoryPool

/// The per-device pools behind a [`MemoryPool`].
struct Inner {
    cores: [OnceLock<CoreRef>; MAX_DEVICES],
    /// Whether device pools are leaked (`'static`): the default pool's are.
    leak: bool,
}

impl Drop for Inner {
    /// The last handle of a [`MemoryPool::new`] pool went: its device pools give their
    /// cache back to the driver now (recycled objects and parking slots may keep the
    /// cores themselves a while), and each block freed later goes back at once.
    fn drop(&mut self) {
        for core in self.cores.iter().filter_map(OnceLock::get) {
            core.orphan();
        }
    }
}

impl Inner {
    const fn new(leak: bool) -> Inner {
        Inner {
            cores: [const { OnceLock::new() }; MAX_DEVICES],
            leak,
        }
    }

    /// Device `device`'s pool, created (with the limit of [`LIMIT_ENV`]) on first use.
    #[inline]
    fn core(&self, device: i32) -> Result<&CoreRef> {
        let slot = usize::try_from(device).ok().and_then(|d| self.cores.get(d));
        match slot.and_then(OnceLock::get) {
            Some(c) => Ok(c),
            None => self.create(device),
        }
    }

    /// Device `device`'s pool if it exists (no driver call).
    #[inline]
    fn existing(&self, device: i32) -> Option<&CoreRef> {
        usize::try_from(device)
            .ok()
            .and_then(|d| self.cores.get(d))
            .and_then(OnceLock::get)
    }

    #[cold]
    fn create(&self, device: i32) -> Result<&CoreRef> {
        check_device(device)?;
        let Some(slot) = usize::try_from(device).ok().and_then(|d| self.cores.get(d)) else {
            return Err(Error::InvalidArgument(format!(
                "device id {device}: cuda-rt addresses at most {MAX_DEVICES} devices"
            )));
        };
        let env = std::env::var(LIMIT_ENV).ok();
        let limit = limit_from_env(env.as_deref(), || device_total_memory(device))?;
        Ok(slot.get_or_init(|| {
            let core = Core::new(DeviceBackend { device }, device);
            core.pool.set_limit(limit);
            if self.leak {
                CoreRef::Static(Box::leak(Box::new(core)))
            } else {
                CoreRef::Shared(Arc::new(core))
            }
        }))
    }
}

#[derive(Clone)]
enum Handle {
    Static(&'static Inner),
    Shared(Arc<Inner>),
}

/// The caching device memory pool (CuPy's `MemoryPool`): one pool per device behind
/// it, each created on the device's first use. Cheap to clone (clones share the
/// pools); `Send + Sync`. The calls that take no device use the thread's current
/// device, as in CuPy. See the [module doc](self) for the semantics.
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
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MemoryPool {
    inner: Handle,
}

static DEFAULT_POOL: Inner = Inner::new(true);

/// The process-wide default pool, which [`alloc`](super::alloc) uses unless another
/// allocator is set (CuPy's `get_default_memory_pool`).
#[inline]
pub fn get_default_memory_pool() -> MemoryPool {
    MemoryPool {
        inner: Handle::Static(&DEFAULT_POOL),
    }
}

impl fmt::Debug for MemoryPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let devices: Vec<&DeviceCore> = self
            .inner()
            .cores
            .iter()
            .filter_map(|c| c.get())
            .map(|c| &**c)
            .collect();
        f.debug_struct("MemoryPool")
            .field("default", &self.inner().leak)
            .field("devices", &devices)
            .finish()
    }
}

impl Default for MemoryPool {
    fn default() -> Self {
        Self::new()
    }
}

impl Allocate for MemoryPool {
    #[track_caller]
    fn malloc(&self, size: usize, device: i32) -> Result<MemoryPointer> {
        self.malloc_on(device, size)
    }
}

impl MemoryPool {
    /// A new pool, separate from the default one (no memory until the first malloc).
    pub fn new() -> Self {
        MemoryPool {
            inner: Handle::Shared(Arc::new(Inner::new(false))),
        }
    }

    #[inline]
    fn inner(&self) -> &Inner {
        match &self.inner {
            Handle::Static(i) => i,
            Handle::Shared(i) => i,
        }
    }

    /// Whether `self` and `other` are the same pool.
    pub fn same_pool(&self, other: &MemoryPool) -> bool {
        std::ptr::eq(self.inner(), other.inner())
    }

    /// `size` bytes (rounded up to 512) on the current device, from the arena of the
    /// current stream: a cached block if one fits (best fit), else new memory from
    /// `cuMemAlloc` (see the [module doc](self) for the limit and out of memory).
    /// `size == 0` gives the null pointer, not pooled. The memory returns to the pool
    /// when its last pointer is dropped.
    #[track_caller]
    #[inline]
    pub fn malloc(&self, size: usize) -> Result<MemoryPointer> {
        self.malloc_on(get_device_id(), size)
    }

    /// [`malloc`](Self::malloc) on device `device` (its current stream's arena).
    #[track_caller]
    #[inline]
    pub fn malloc_on(&self, device: i32, size: usize) -> Result<MemoryPointer> {
        if let Some(p) = self.malloc_reparked(device, size) {
            return Ok(p);
        }
        self.malloc_general(device, size)
    }

    /// The cached pair's malloc (see [`Pool::malloc_reparked`]): the block this thread
    /// parked when it is exactly what this malloc gets, in a recycled object; `None`
    /// when that does not apply (hooks, no parked block, another size or stream), with
    /// nothing changed that [`malloc_general`](Self::malloc_general) would see
    /// differently. Kept apart so the hot path carries none of the general path's
    /// frame.
    #[inline]
    fn malloc_reparked(&self, device: i32, size: usize) -> Option<MemoryPointer> {
        let core = self.inner().existing(device)?;
        if hook::has_hooks() {
            return None;
        }
        let slot = parked::slot(core.home_id())?;
        let key = stream_key(current_stream_handle(device));
        let block = core.pool.malloc_reparked(size, key, slot)?;
        let ptr = block.addr();
        Some(MemoryPointer::from_memory_at(
            PooledMemory::wrap(core, block),
            ptr,
        ))
    }

    #[track_caller]
    #[inline(never)]
    fn malloc_general(&self, device: i32, size: usize) -> Result<MemoryPointer> {
        if size == 0 {
            return Ok(MemoryPointer::null(device));
        }
        let core = self.inner().core(device)?;
        let key = stream_key(current_stream_handle(device));
        let r = core.malloc(
            size,
            key,
            Location::caller(),
            |block| {
                let ptr = block.addr();
                (PooledMemory::wrap(core, block), ptr)
            },
            |(m, _)| Arc::as_ptr(m) as usize,
        );
        match r {
            Ok((mem, ptr)) => Ok(MemoryPointer::from_memory_at(mem, ptr)),
            Err(e) => Err(malloc_error(e, size, device)),
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
                if let Some(c) = self.inner().existing(get_device_id()) {
                    c.pool.free_all_blocks(None);
                }
            }
            Some(s) => {
                if let Some(c) = self.inner().existing(s.device_id()) {
                    c.pool.free_all_blocks(Some(stream_key(s.ptr())));
                }
            }
        }
    }

    /// CuPy's deprecated name for `free_all_blocks(None)`.
    pub fn free_all_free(&self) {
        self.free_all_blocks(None);
    }

    fn current(&self) -> Option<&CoreRef> {
        self.inner().existing(get_device_id())
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
        self.inner()
            .existing(device)
            .map(|c| c.pool.stats())
            .unwrap_or_default()
    }

    /// Resets the peaks of the current device's pool to the current values.
    pub fn reset_peaks(&self) {
        if let Some(c) = self.current() {
            c.pool.reset_peaks();
        }
    }

    /// Limits the bytes the current device's pool holds from the driver (0: no limit).
    /// Lowering it releases nothing by itself; the next malloc that misses does.
    pub fn set_limit(&self, bytes: u64) -> Result<()> {
        self.inner().core(get_device_id())?.pool.set_limit(bytes);
        Ok(())
    }

    /// Sets the limit to `fraction` (0.0 ..= 1.0) of the current device's total
    /// memory (0: no limit); another fraction is [`Error::InvalidArgument`].
    pub fn set_limit_fraction(&self, fraction: f64) -> Result<()> {
        let dev = get_device_id();
        let core = self.inner().core(dev)?;
        let bytes = limit_from_fraction(fraction, device_total_memory(dev)?)
            .map_err(|e| Error::InvalidArgument(format!("set_limit_fraction: {e}")))?;
        core.pool.set_limit(bytes);
        Ok(())
    }

    /// The limit of the current device's pool in bytes (0: none), creating the pool
    /// (and reading [`LIMIT_ENV`]) if needed.
    pub fn get_limit(&self) -> Result<u64> {
        Ok(self.inner().core(get_device_id())?.pool.limit())
    }
}

/// The crate's error for a failed pool malloc of `size` bytes on `device`.
#[cold]
fn malloc_error(e: MallocError, size: usize, device: i32) -> Error {
    let pool = format!("memory pool of device {device}");
    pool_malloc_error(e, size, Some(device), &pool, || {
        LAST_DRIVER_OOM.with(Cell::take)
    })
}

/// The crate's error for a failed malloc of `size` bytes from an arena pool: out of
/// memory with the pool's numbers (and `driver`'s error when the backend refused), or
/// an invalid state naming `pool`. Shared by the device and pinned pools.
#[cold]
pub(crate) fn pool_malloc_error(
    e: MallocError,
    size: usize,
    device: Option<i32>,
    pool: &str,
    driver: impl FnOnce() -> Option<DriverError>,
) -> Error {
    match e {
        MallocError::OutOfMemory(o) => Error::OutOfMemory(Box::new(OutOfMemory {
            requested: if o.rounded == u64::MAX {
                size as u64
            } else {
                o.rounded
            },
            device,
            in_use: o.in_use,
            cached: o.cached,
            limit: o.limit,
            driver: if o.backend_refused { driver() } else { None },
        })),
        MallocError::TooMany(what) => Error::InvalidState(format!("{pool}: too many {what}")),
        MallocError::Backend(b) => match b.downcast::<Error>() {
            Ok(e) => *e,
            Err(other) => Error::InvalidState(format!("{pool}: {other}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::memory::arena::HostBackend;
    use crate::memory::hook::{register_hook, MemoryHook};

    #[test]
    fn stream_keys_are_handles_except_the_per_thread_default_stream() {
        assert_eq!(stream_key(0), 0, "the legacy default stream is one arena");
        assert_eq!(stream_key(0x7f00_dead_b000), 0x7f00_dead_b000);
        let mine = stream_key(PER_THREAD_DEFAULT_HANDLE);
        assert_ne!(mine & PER_THREAD_KEY_BIT, 0);
        assert_eq!(
            stream_key(PER_THREAD_DEFAULT_HANDLE),
            mine,
            "stable per thread"
        );
        let other = std::thread::spawn(|| stream_key(PER_THREAD_DEFAULT_HANDLE))
            .join()
            .unwrap();
        assert_ne!(other, mine, "one arena per thread");
        assert_ne!(other & PER_THREAD_KEY_BIT, 0);
    }

    #[test]
    fn limit_env_accepts_bytes_and_percent_of_device_memory() {
        let total = || Ok(1u64 << 30);
        assert_eq!(limit_from_env(None, total).unwrap(), 0);
        assert_eq!(limit_from_env(Some(""), total).unwrap(), 0);
        assert_eq!(limit_from_env(Some("1073741824"), total).unwrap(), 1 << 30);
        assert_eq!(limit_from_env(Some("0"), total).unwrap(), 0);
        assert_eq!(
            limit_from_env(Some("40%"), total).unwrap(),
            (1u64 << 30) * 2 / 5
        );
        assert_eq!(limit_from_env(Some(" 50% "), total).unwrap(), 1 << 29);
        // A byte count needs no device query.
        let no_device = || -> Result<u64> { panic!("device memory asked for a byte count") };
        assert_eq!(limit_from_env(Some("4096"), no_device).unwrap(), 4096);
        for bad in ["-1", "150%", "lots", "1.5"] {
            let e = limit_from_env(Some(bad), total).unwrap_err();
            assert!(matches!(e, Error::InvalidArgument(_)));
            assert!(e.to_string().contains(LIMIT_ENV), "{e}");
        }
        // A failing device query for a percentage is the caller's error.
        let fail = || Err(Error::NotAvailable("no driver".into()));
        assert!(matches!(
            limit_from_env(Some("10%"), fail),
            Err(Error::NotAvailable(_))
        ));
    }

    /// Records every hook call with its arguments.
    #[derive(Default)]
    struct Recorder {
        tag: &'static str,
        log: Rc<RefCell<Vec<String>>>,
    }

    impl MemoryHook for Recorder {
        fn malloc_pre(&self, d: i32, size: usize, mem_size: usize) {
            self.push(format!("malloc_pre({d},{size},{mem_size})"));
        }
        fn alloc_pre(&self, d: i32, mem_size: usize) {
            self.push(format!("alloc_pre({d},{mem_size})"));
        }
        fn alloc_post(&self, d: i32, mem_size: usize, ptr: u64) {
            self.push(format!("alloc_post({d},{mem_size},{ptr:#x})"));
        }
        fn malloc_post(&self, d: i32, size: usize, mem_size: usize, ptr: u64, id: usize) {
            self.push(format!(
                "malloc_post({d},{size},{mem_size},{ptr:#x},{id:#x})"
            ));
        }
        fn free_pre(&self, d: i32, mem_size: usize, ptr: u64, id: usize) {
            self.push(format!("free_pre({d},{mem_size},{ptr:#x},{id:#x})"));
        }
        fn free_post(&self, d: i32, mem_size: usize, ptr: u64, id: usize) {
            self.push(format!("free_post({d},{mem_size},{ptr:#x},{id:#x})"));
        }
    }

    impl Recorder {
        fn push(&self, s: String) {
            self.log.borrow_mut().push(format!("{}:{s}", self.tag));
        }
    }

    /// What the front does with a block: box it (the box's address is `pmem_id`).
    #[track_caller]
    fn malloc(core: &Core<HostBackend>, size: usize) -> Box<Option<Block>> {
        core.malloc(
            size,
            0,
            Location::caller(),
            |b| Box::new(Some(b)),
            |b| &**b as *const Option<Block> as usize,
        )
        .unwrap()
    }

    #[allow(clippy::boxed_local)] // the box is the pooled object whose address is pmem_id
    fn free(core: &Core<HostBackend>, mut b: Box<Option<Block>>) {
        let id = &*b as *const Option<Block> as usize;
        core.free_raw(b.take().unwrap().into_raw(), id);
    }

    #[test]
    fn an_orphaned_core_gives_cached_and_later_freed_blocks_back() {
        let core = Core::new(HostBackend::new(), 0);
        let cached = malloc(&core, 1000);
        let live = malloc(&core, 1000);
        free(&core, cached);
        assert!(!core.after_free(), "not orphaned: the block stays cached");
        assert_eq!(core.pool.total_bytes(), 2048);
        core.orphan();
        assert_eq!(core.pool.total_bytes(), 1024, "the cached block went back");
        free(&core, live);
        assert!(
            core.after_free(),
            "orphaned: a recycled object must not be kept"
        );
        assert_eq!(core.pool.total_bytes(), 0);
        assert_eq!(core.pool.stats().backend_frees, 2);
    }

    #[test]
    fn hooks_are_called_in_cupys_order_with_its_arguments() {
        let core = Core::new(HostBackend::new(), 3);
        let log = Rc::new(RefCell::new(Vec::new()));
        let _a = register_hook(
            "a",
            Rc::new(Recorder {
                tag: "a",
                log: log.clone(),
            }),
        )
        .unwrap();
        let _b = register_hook(
            "b",
            Rc::new(Recorder {
                tag: "b",
                log: log.clone(),
            }),
        )
        .unwrap();

        // A miss: the pool gets new memory, so alloc_pre/post run between.
        let m = malloc(&core, 1000);
        let (p, id) = (
            m.as_ref().as_ref().unwrap().addr(),
            &*m as *const _ as usize,
        );
        // A hit: no alloc hooks.
        free(&core, m);
        let m2 = malloc(&core, 700);
        let id2 = &*m2 as *const Option<Block> as usize;
        assert_eq!(m2.as_ref().as_ref().unwrap().addr(), p, "reused");
        free(&core, m2);

        let expect: Vec<String> = [
            "malloc_pre(3,1000,1024)".to_string(),
            "alloc_pre(3,1024)".into(),
            format!("alloc_post(3,1024,{p:#x})"),
            format!("malloc_post(3,1000,1024,{p:#x},{id:#x})"),
            format!("free_pre(3,1024,{p:#x},{id:#x})"),
            format!("free_post(3,1024,{p:#x},{id:#x})"),
            "malloc_pre(3,700,1024)".into(),
            format!("malloc_post(3,700,1024,{p:#x},{id2:#x})"),
            format!("free_pre(3,1024,{p:#x},{id2:#x})"),
            format!("free_post(3,1024,{p:#x},{id2:#x})"),
        ]
        .into_iter()
        .flat_map(|e| [format!("a:{e}"), format!("b:{e}")])
        .collect();
        assert_eq!(*log.borrow(), expect);
        core.pool().check().unwrap();
        assert_eq!(core.pool().used_bytes(), 0);
    }

    #[test]
    fn a_failed_malloc_calls_no_malloc_post() {
        let core = Core::new(HostBackend::with_capacity(4096), 0);
        let log = Rc::new(RefCell::new(Vec::new()));
        let _g = register_hook(
            "r",
            Rc::new(Recorder {
                tag: "r",
                log: log.clone(),
            }),
        )
        .unwrap();
        let r = core.malloc(8192, 0, Location::caller(), |b| b, |_| 0);
        assert!(matches!(r, Err(MallocError::OutOfMemory(_))));
        // The pool asked twice (release-and-retry): two alloc_pre, no alloc_post.
        assert_eq!(
            *log.borrow(),
            [
                "r:malloc_pre(0,8192,8192)",
                "r:alloc_pre(0,8192)",
                "r:alloc_pre(0,8192)"
            ]
        );
    }

    #[test]
    fn without_hooks_nothing_is_recorded_and_blocks_round_trip() {
        let core = Core::new(HostBackend::new(), 0);
        let m = malloc(&core, 512);
        free(&core, m);
        let s = core.pool().stats();
        assert_eq!((s.mallocs, s.frees, s.backend_allocs), (1, 1, 1));
    }

    #[test]
    fn line_profile_hook_attributes_bytes_to_the_malloc_call_site() {
        let core = Core::new(HostBackend::new(), 0);
        let prof = Rc::new(hook::LineProfileHook::new());
        let _g = register_hook("prof", prof.clone()).unwrap();
        let line = line!() + 1;
        let a = malloc(&core, 2000);
        let b = malloc(&core, 512);
        free(&core, a);
        let sites = prof.sites();
        assert_eq!(sites.len(), 2);
        assert_eq!(sites[0].file, file!());
        assert_eq!(sites[0].line, line);
        assert_eq!((sites[0].allocated, sites[0].in_use), (2048, 0));
        assert_eq!((sites[1].allocated, sites[1].in_use), (512, 512));
        free(&core, b);
    }

    #[test]
    fn pool_error_names_device_and_numbers() {
        let o = crate::memory::arena::OutOfMemory {
            requested: 1000,
            rounded: 1024,
            in_use: 4096,
            cached: 0,
            limit: Some(4096),
            backend_refused: false,
        };
        let e = malloc_error(MallocError::OutOfMemory(o), 1000, 1);
        let Error::OutOfMemory(b) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (b.requested, b.device, b.in_use, b.cached, b.limit),
            (1024, Some(1), 4096, 0, Some(4096))
        );
        assert!(b.driver.is_none());
        let msg = e.to_string();
        assert!(
            msg.contains("on device 1") && msg.contains("limit 4.00 KiB"),
            "{msg}"
        );
    }

    #[test]
    fn pool_handles_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<MemoryPool>();
        check::<PooledMemory>();
    }
}
