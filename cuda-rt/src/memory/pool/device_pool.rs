//! One device's pool ([`DevicePool`]: the arena pool with the hook dispatch, generic
//! over the backend so the CPU tests run it over a host backend), and how pooled
//! memory refers to it ([`DevicePoolRef`]).

use std::fmt;
use std::ops::Deref;
use std::panic::Location;
use std::sync::Arc;

use crate::memory::arena::parked::{self, HomeRef};
use crate::memory::arena::{round_size, Backend, Block, MallocError, Pool, RawBlock};
use crate::memory::hook;

use super::device_backend::{DeviceBackend, HookedBackend};
use super::stream_uses::StreamUses;

/// One device's arena pool with the hook dispatch.
pub(crate) struct DevicePool<B: Backend> {
    pub(super) pool: Pool<HookedBackend<B>>,
    pub(super) device: i32,
}

impl<B: Backend> fmt::Debug for DevicePool<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DevicePool")
            .field("device", &self.device)
            .field("stats", &self.pool.stats())
            .finish()
    }
}

impl<B: Backend> DevicePool<B> {
    pub(crate) fn new(backend: B, device: i32) -> Self {
        DevicePool {
            pool: Pool::new(HookedBackend { backend, device }),
            device,
        }
    }

    /// The last handle of the pool went. Recycled memory objects and parking slots
    /// may still hold the device pool (they keep it to avoid a shared count on the hot
    /// path), so dropping it is not what returns the memory: everything cached goes
    /// back to the driver now, and [`after_free`](Self::after_free) does the same for
    /// each block freed later.
    pub(super) fn orphan(&self) {
        self.pool.close();
        self.pool.free_all_blocks(None);
    }

    /// Called after a block went back: for an orphaned device pool, gives the cache to the
    /// driver; `true` when orphaned (a recycled object must not be kept).
    #[inline]
    pub(super) fn after_free(&self) -> bool {
        if !self.pool.is_closed() {
            return false;
        }
        self.pool.free_all_blocks(None);
        true
    }

    #[cfg(test)]
    pub(crate) fn pool(&self) -> &Pool<HookedBackend<B>> {
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
    pub(super) fn home_id(&self) -> usize {
        &self.pool as *const Pool<HookedBackend<B>> as usize
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
    /// `home` is how the thread's slot list is to hold the device pool. Returns
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
            // Parked even in an orphaned device pool: `after_free` then settles and releases.
            self.pool.park_or_free(raw, self.home_id(), home);
        }
        self.after_free()
    }

    /// Gives the block `raw` came from back after the streams recorded in `uses`
    /// (see `stream_uses`): a fence (event) on each, then the block awaits them in
    /// its arena. The hooks see one free, now.
    #[cold]
    #[inline(never)]
    pub(super) fn free_after_streams(&self, raw: RawBlock, pmem_id: usize, uses: &StreamUses) {
        let hooked = hook::has_hooks();
        let (dev, size, ptr) = (self.device, raw.size as usize, raw.addr);
        if hooked {
            hook::each(|h| h.free_pre(dev, size, ptr, pmem_id));
        }
        // A block no fence could cover stays in use (`fence` says `false`).
        uses.fence(
            dev,
            || self.pool.count_sync(),
            |fences| {
                self.pool.free_raw_after(raw, fences);
            },
        );
        if hooked {
            hook::each(|h| h.free_post(dev, size, ptr, pmem_id));
        }
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

impl<B: Backend + 'static> parked::Home for DevicePool<B> {
    fn forget(&self, p: &'static parked::Parked) {
        self.pool.forget_parked(p);
    }

    fn closed(&self) -> bool {
        self.pool.is_closed()
    }
}

pub(super) type CudaDevicePool = DevicePool<DeviceBackend>;

/// A device pool as pooled memory refers to it.
#[derive(Clone)]
pub(super) enum DevicePoolRef {
    /// A device pool of the default pool: never dropped, so no reference count.
    Static(&'static CudaDevicePool),
    /// A device pool of a [`MemoryPool::new`] pool: alive while memory from it lives.
    Shared(Arc<CudaDevicePool>),
}

impl DevicePoolRef {
    /// How a thread's parking-slot list holds this device pool.
    pub(super) fn home(&self) -> HomeRef {
        match self {
            DevicePoolRef::Static(c) => HomeRef::Static(*c),
            DevicePoolRef::Shared(c) => HomeRef::Shared(c.clone()),
        }
    }

    /// Whether `self` and `other` are the same device pool.
    #[inline]
    pub(super) fn same(&self, other: &DevicePoolRef) -> bool {
        std::ptr::eq(&**self, &**other)
    }
}

impl Deref for DevicePoolRef {
    type Target = CudaDevicePool;
    #[inline]
    fn deref(&self) -> &CudaDevicePool {
        match self {
            DevicePoolRef::Static(c) => c,
            DevicePoolRef::Shared(c) => c,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::memory::arena::HostBackend;
    use crate::memory::hook::{register_hook, MemoryHook};

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
    fn malloc(core: &DevicePool<HostBackend>, size: usize) -> Box<Option<Block>> {
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
    fn free(core: &DevicePool<HostBackend>, mut b: Box<Option<Block>>) {
        let id = &*b as *const Option<Block> as usize;
        core.free_raw(b.take().unwrap().into_raw(), id);
    }

    #[test]
    fn an_orphaned_core_gives_cached_and_later_freed_blocks_back() {
        let core = DevicePool::new(HostBackend::new(), 0);
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
        let core = DevicePool::new(HostBackend::new(), 3);
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
        let core = DevicePool::new(HostBackend::with_capacity(4096), 0);
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
        let core = DevicePool::new(HostBackend::new(), 0);
        let m = malloc(&core, 512);
        free(&core, m);
        let s = core.pool().stats();
        assert_eq!((s.mallocs, s.frees, s.backend_allocs), (1, 1, 1));
    }

    #[test]
    fn line_profile_hook_attributes_bytes_to_the_malloc_call_site() {
        let core = DevicePool::new(HostBackend::new(), 0);
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
}
