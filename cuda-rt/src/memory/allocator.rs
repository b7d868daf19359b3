//! Allocator selection: [`alloc`] goes through the allocator in effect on this thread,
//! which is the one of the innermost [`using_allocator`] scope, else the process-wide
//! one of [`set_allocator`] (the caching pool of [`get_default_memory_pool`] until
//! set; `set_allocator(None)` is plain `cuMemAlloc`, as in CuPy).
//!
//! The hot path takes no lock: a thread-local read of the scoped allocator, then an
//! atomic generation number compared with a thread-local cached copy of the
//! process-wide allocator. Only the first [`alloc`] on a thread after a
//! [`set_allocator`] reads the process-wide value under its lock.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result, StateKind};
use crate::memory::async_pool::MemoryAsyncPool;
use crate::memory::device_memory::{CAllocator, ClosureAllocator, Memory};
use crate::memory::pool::{get_default_memory_pool, MemoryPool};
use crate::memory::MemoryPointer;

/// An allocator written as a type: returns memory objects that free themselves.
pub trait Allocate: Send + Sync {
    /// `size` (> 0) bytes on `device`.
    fn malloc(&self, size: usize, device: i32) -> Result<MemoryPointer>;
}

impl Allocate for MemoryPool {
    #[track_caller]
    fn malloc(&self, size: usize, device: i32) -> Result<MemoryPointer> {
        self.malloc_on(device, size)
    }
}

/// What [`alloc`] allocates with. Cheap to clone (at most a reference count).
///
/// New kinds are new variants; the enum is `#[non_exhaustive]` for that.
#[derive(Clone)]
#[non_exhaustive]
pub enum Allocator {
    /// Plain device memory, `cuMemAlloc`/`cuMemFree`, no pool.
    Device,
    /// A caching [`MemoryPool`] (the default: [`get_default_memory_pool`]).
    Pool(MemoryPool),
    /// The driver's stream-ordered pool, on the current stream.
    Async(MemoryAsyncPool),
    /// A pair of Rust closures.
    Closures(ClosureAllocator),
    /// A pair of C functions with an opaque argument.
    C(CAllocator),
    /// Any [`Allocate`] implementation.
    Custom(Arc<dyn Allocate>),
}

impl fmt::Debug for Allocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Allocator::Device => f.write_str("Allocator::Device"),
            Allocator::Pool(p) => write!(
                f,
                "Allocator::Pool({})",
                if p.same_pool(&get_default_memory_pool()) {
                    "default"
                } else {
                    "user"
                }
            ),
            Allocator::Async(p) => write!(f, "Allocator::Async({p:?})"),
            Allocator::Closures(_) => f.write_str("Allocator::Closures"),
            Allocator::C(c) => write!(f, "Allocator::C(ctx {:#x})", c.ctx),
            Allocator::Custom(_) => f.write_str("Allocator::Custom"),
        }
    }
}

impl Allocator {
    /// `size` bytes on `device` with this allocator. Size 0 is the null pointer of size
    /// 0 and calls no allocator. `#[track_caller]`, for the memory hooks' call site.
    #[track_caller]
    pub fn malloc(&self, size: usize, device: i32) -> Result<MemoryPointer> {
        if size == 0 {
            return Ok(MemoryPointer::null(device));
        }
        match self {
            Allocator::Device => Ok(MemoryPointer::from_memory(Arc::new(Memory::new_on(
                device, size,
            )?))),
            Allocator::Pool(pool) => pool.malloc_on(device, size),
            Allocator::Async(pool) => {
                if pool.device_id() != device {
                    return Err(Error::invalid_argument(
                        ArgumentKind::WrongDevice {
                            expected: device,
                            found: pool.device_id(),
                        },
                        format!(
                            "the async pool belongs to device {}, not to device {device}",
                            pool.device_id()
                        ),
                    ));
                }
                pool.malloc(size)
            }
            Allocator::Closures(c) => c.malloc(size, device),
            Allocator::C(c) => c.malloc(size, device),
            Allocator::Custom(a) => a.malloc(size, device),
        }
    }

    /// Whether two values are the same allocator (the same variant and, for the shared
    /// ones, the same object).
    pub fn same_as(&self, other: &Allocator) -> bool {
        match (self, other) {
            (Allocator::Device, Allocator::Device) => true,
            (Allocator::Pool(a), Allocator::Pool(b)) => a.same_pool(b),
            (Allocator::Async(a), Allocator::Async(b)) => a.same_as(b),
            (Allocator::Closures(a), Allocator::Closures(b)) => {
                Arc::ptr_eq(&a.malloc, &b.malloc) && Arc::ptr_eq(&a.free, &b.free)
            }
            (Allocator::C(a), Allocator::C(b)) => {
                a.malloc as usize == b.malloc as usize
                    && a.free as usize == b.free as usize
                    && a.ctx == b.ctx
            }
            (Allocator::Custom(a), Allocator::Custom(b)) => {
                std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
            }
            _ => false,
        }
    }
}

/// The process-wide allocator (`None`: the default pool, not yet materialised) and its
/// generation (bumped under the lock on every set; starts at 1 so that the threads'
/// cached copies, made with generation 0, are read fresh once).
static GLOBAL: RwLock<Option<Allocator>> = RwLock::new(None);
static GENERATION: AtomicU64 = AtomicU64::new(FIRST_GENERATION);
/// The generation before any `set_allocator`: the default pool is in effect.
const FIRST_GENERATION: u64 = 1;

thread_local! {
    /// The innermost `using_allocator` scope's allocator on this thread.
    static SCOPED: RefCell<Option<Allocator>> = const { RefCell::new(None) };
    /// How many `using_allocator` scopes are open on this thread.
    static DEPTH: Cell<usize> = const { Cell::new(0) };
    /// This thread's copy of the process-wide allocator, with its generation.
    static CACHED: RefCell<(u64, Allocator)> = const { RefCell::new((0, Allocator::Device)) };
}

/// Sets the process-wide allocator; `None` is plain device allocation, with no pool
/// (the default until set is the caching pool of [`get_default_memory_pool`]). An
/// error inside a [`using_allocator`] scope on this thread, as in CuPy.
pub fn set_allocator(allocator: Option<Allocator>) -> Result<()> {
    if DEPTH.with(Cell::get) > 0 {
        return Err(Error::invalid_state(
            StateKind::Reentrant,
            "set_allocator cannot be called inside a using_allocator scope; \
             leave the scope first",
        ));
    }
    let mut g = GLOBAL.write().unwrap_or_else(|e| e.into_inner());
    *g = Some(allocator.unwrap_or(Allocator::Device));
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(())
}

/// The allocator [`alloc`] uses on this thread now: the innermost scope's, else the
/// process-wide one.
#[inline]
pub fn get_allocator() -> Allocator {
    // `try_with`: an allocation made while this thread's locals are being torn down
    // (a TLS destructor that allocates) takes the process-wide allocator.
    if let Some(a) = SCOPED
        .try_with(|s| s.try_borrow().ok().and_then(|a| a.clone()))
        .ok()
        .flatten()
    {
        return a;
    }
    let generation = GENERATION.load(Ordering::Acquire);
    let cached = CACHED.try_with(|c| {
        if let Ok(c) = c.try_borrow() {
            if c.0 == generation {
                return c.1.clone();
            }
        }
        let a = global_allocator();
        // Refreshed unless an `alloc` further up this thread's stack holds the copy
        // (an allocation made from inside an allocation): then the next call does it.
        if let Ok(mut c) = c.try_borrow_mut() {
            *c = (generation, a.clone());
        }
        a
    });
    cached.unwrap_or_else(|_| global_allocator())
}

/// The process-wide allocator, read under its lock.
#[cold]
fn global_allocator() -> Allocator {
    let g = GLOBAL.read().unwrap_or_else(|e| e.into_inner());
    g.clone()
        .unwrap_or_else(|| Allocator::Pool(get_default_memory_pool()))
}

/// Runs `f` with `allocator` (`None`: plain device allocation) as this thread's
/// allocator, then restores the previous one, also when `f` panics. Scopes nest.
/// Memory allocated inside stays valid after the scope: it frees itself.
pub fn using_allocator<R>(allocator: Option<Allocator>, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<Allocator>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let prev = self.0.take();
            SCOPED.with(|s| *s.borrow_mut() = prev);
            DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
        }
    }
    let new = Some(allocator.unwrap_or(Allocator::Device));
    let prev = SCOPED.with(|s| std::mem::replace(&mut *s.borrow_mut(), new));
    DEPTH.with(|d| d.set(d.get() + 1));
    let _restore = Restore(prev);
    f()
}

/// Whether [`alloc`] on this thread allocates from the default caching pool on the
/// current stream right now: no [`using_allocator`] scope open, no [`set_allocator`]
/// call in this process, and no capture under way (where `alloc` makes a graph memory
/// node instead). Then what `alloc` returns is what
/// [`MemoryPool::malloc_block_on`] of the default pool gives for the current device
/// when it gives a block, so a caller that holds bare blocks (the C shim's
/// `curt_alloc`) may take that faster door and keep `alloc`'s meaning.
///
/// ```
/// // Nothing changed the allocator in this program.
/// assert!(cuda_rt::memory::alloc_takes_default_pool());
/// cuda_rt::memory::using_allocator(None, || {
///     assert!(!cuda_rt::memory::alloc_takes_default_pool());
/// });
/// ```
#[inline]
pub fn alloc_takes_default_pool() -> bool {
    DEPTH.with(Cell::get) == 0
        && GENERATION.load(Ordering::Acquire) == FIRST_GENERATION
        && !crate::capture::any_capture_active()
}

/// `size` bytes on the current device through the allocator in effect
/// ([`get_allocator`]; by default the caching pool). Size 0 is a null pointer of size
/// 0 (no allocator call). `#[track_caller]`, for the memory hooks' call site.
///
/// While this thread's current stream captures a graph (a capture begun through
/// cuda-rt, or a stream forked into one), the allocation is a memory node of that
/// graph instead ([`capture_aware_alloc`](crate::graph::capture_aware_alloc)): no
/// allocator is called, and the memory stays valid for every replay.
#[track_caller]
#[inline]
pub fn alloc(size: usize) -> Result<MemoryPointer> {
    let device = get_device_id();
    if size == 0 {
        return Ok(MemoryPointer::null(device));
    }
    if let Some(r) = crate::memory::graph_memory::capture_aware_alloc(size) {
        return r;
    }
    let site = std::panic::Location::caller();
    // The common case, tested first and ending in a tail call: no scope open and no
    // `set_allocator` yet, so the allocator is the default pool, a static. Going
    // through `with_cached_pool`'s `Option<Result<_>>` here copied the result once
    // more and left `alloc` too big to inline (a sixth of the pair's instructions).
    if DEPTH.with(Cell::get) == 0 && GENERATION.load(Ordering::Acquire) == FIRST_GENERATION {
        return get_default_memory_pool().malloc_from(device, size, site);
    }
    alloc_other(device, size)
}

/// [`alloc`] once a scope is open or `set_allocator` was called: the thread's cached
/// pool when it is current, else the allocator in effect. Out of line, so the common
/// `alloc` stays small; `#[track_caller]`, so the hooks still see `alloc`'s caller.
#[track_caller]
#[inline(never)]
fn alloc_other(device: i32, size: usize) -> Result<MemoryPointer> {
    let site = std::panic::Location::caller();
    if let Some(r) = with_cached_pool(|pool| pool.malloc_from(device, size, site)) {
        return r;
    }
    get_allocator().malloc(size, device)
}

/// Runs `f` on this thread's cached copy of the process-wide allocator when it is a
/// pool, no scope is open and the copy is current: borrowed in place, so the common
/// `alloc` touches no reference count (a clone and a drop of the pool's `Arc` were a
/// third of a cached pair). `None` when that does not apply.
///
/// Until `set_allocator` is first called (generation 1) the allocator is the default
/// pool, a static: then no thread-local copy is read at all.
#[inline]
fn with_cached_pool<R>(f: impl FnOnce(&MemoryPool) -> R) -> Option<R> {
    if DEPTH.with(Cell::get) != 0 {
        return None;
    }
    let generation = GENERATION.load(Ordering::Acquire);
    if generation == FIRST_GENERATION {
        return Some(f(&get_default_memory_pool()));
    }
    // `try_with`: during the thread's teardown the copy is gone (`get_allocator` then
    // reads the process-wide allocator).
    CACHED
        .try_with(|c| {
            // A shared borrow: `f` may allocate again (a hook, a custom allocator), which
            // takes another shared borrow here or falls back to `get_allocator`.
            let c = c.try_borrow().ok()?;
            match &*c {
                (g, Allocator::Pool(pool)) if *g == generation => Some(f(pool)),
                _ => None,
            }
        })
        .ok()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allocator_is_found_during_thread_teardown() {
        use std::sync::atomic::AtomicBool;
        static FOUND: AtomicBool = AtomicBool::new(false);
        struct AskOnDrop;
        impl Drop for AskOnDrop {
            fn drop(&mut self) {
                // Runs after this thread's allocator locals are gone (destructors run in
                // the reverse order of the locals' first use): a panic here aborts.
                let _ = get_allocator();
                let _ = with_cached_pool(|_| ());
                FOUND.store(true, Ordering::SeqCst);
            }
        }
        thread_local! {
            static ASK: AskOnDrop = const { AskOnDrop };
        }
        std::thread::spawn(|| {
            ASK.with(|_| ());
            let _ = get_allocator();
        })
        .join()
        .unwrap();
        assert!(FOUND.load(Ordering::SeqCst));
    }

    // No other test of the library binary calls `set_allocator`.
    #[test]
    fn the_process_wide_default_is_the_default_pool() {
        let a = get_allocator();
        assert!(
            a.same_as(&Allocator::Pool(get_default_memory_pool())),
            "{a:?}"
        );
        let other = std::thread::spawn(get_allocator).join().unwrap();
        assert!(matches!(other, Allocator::Pool(_)), "{other:?}");
    }
}
