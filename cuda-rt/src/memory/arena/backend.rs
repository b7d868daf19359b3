//! Where a [`Pool`](super::Pool) gets its memory: the [`Backend`] trait and, with the
//! feature `test-util` (tests, benches, Miri), two host backends: `HostBackend` (real
//! host memory) and `FakeBackend` (address ranges only, for benches and large traces).

#[cfg(any(test, feature = "test-util"))]
use std::collections::{BTreeMap, BTreeSet};
use std::error::Error as StdError;
use std::fmt;
#[cfg(any(test, feature = "test-util"))]
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
#[cfg(any(test, feature = "test-util"))]
use std::sync::{Mutex, PoisonError};

#[cfg(any(test, feature = "test-util"))]
use super::ALLOCATION_UNIT;
use crate::error::DriverError;

/// Why a [`Backend`] could not allocate.
#[derive(Debug)]
pub enum BackendError {
    /// The backend has no memory for the request: a backend over the CUDA driver
    /// gives the driver's error, a host backend `None`. The pool releases its cached
    /// blocks and retries once before reporting [`OutOfMemory`](crate::OutOfMemory),
    /// which carries that error.
    OutOfMemory(Option<DriverError>),
    /// Any other failure (a driver error, a bad context...). The pool gives it to
    /// the caller unchanged and does not retry.
    Other(Box<dyn StdError + Send + Sync + 'static>),
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendError::OutOfMemory(None) => f.write_str("the backend is out of memory"),
            BackendError::OutOfMemory(Some(d)) => write!(f, "the backend is out of memory: {d}"),
            BackendError::Other(e) => write!(f, "the backend failed: {e}"),
        }
    }
}

impl StdError for BackendError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            BackendError::OutOfMemory(_) => None,
            BackendError::Other(e) => Some(&**e),
        }
    }
}

/// The source of memory of a [`Pool`](super::Pool): the CUDA front implements it over
/// `cuMemAlloc`/`cuMemFree`, tests and benches use `HostBackend` or `FakeBackend`
/// (feature `test-util`).
///
/// The pool calls the backend on the thread that called `malloc` (or
/// `free_all_blocks`, or drop), never while holding one of its own locks, so a
/// backend may call back into the pool (for example a memory hook reading stats).
pub trait Backend: Send + Sync {
    /// Allocates `size` bytes and returns the start address. `size` is always a
    /// positive multiple of [`ALLOCATION_UNIT`](super::ALLOCATION_UNIT). The address
    /// must be non-zero and the range `addr..addr + size` must not overlap any live
    /// allocation of this backend.
    fn alloc(&self, size: usize) -> Result<u64, BackendError>;

    /// [`alloc`](Backend::alloc) for the arena of stream key `key`: what the pool
    /// calls when a malloc in that arena grows it. The memory is first used by work
    /// ordered on that arena's stream, so a backend whose allocations are themselves
    /// stream-ordered (CUDA's `cuMemAllocAsync`) must allocate on that stream, not on
    /// whatever stream is current on the calling thread. The default is `alloc`.
    fn alloc_for(&self, size: usize, key: u64) -> Result<u64, BackendError> {
        let _ = key;
        self.alloc(size)
    }

    /// Gives back an allocation made by [`alloc`](Backend::alloc); `size` is the size
    /// it was allocated with. Each allocation is freed exactly once.
    fn free(&self, addr: u64, size: usize);

    /// Whether the work behind `fence` is known to have completed, without blocking.
    /// A fence is an opaque token that the pool's owner recorded (a CUDA event
    /// recorded on a stream that used a block) and gave to
    /// [`Pool::free_after`](super::Pool::free_after); the pool hands the block out
    /// again only once every fence of it is done.
    ///
    /// A query that fails must say `false`: a fence that cannot be queried is not a
    /// finished fence (while another thread holds a global-mode stream capture, every
    /// `cuEventQuery` fails although the work still runs). The pool keeps the block
    /// and asks again at its next poll; a fence that never answers (a dead context)
    /// keeps its block out of use for good, a leak rather than a reuse under a copy.
    /// The default (a backend with no fences) says `true`.
    fn fence_done(&self, fence: u64) -> bool {
        let _ = fence;
        true
    }

    /// Blocks until the work behind `fence` has completed (a host synchronisation:
    /// the pool does it only when it must, before reporting out of memory, and when
    /// it is dropped); `true` once it has, `false` when the wait failed, which the
    /// pool treats as not done, as [`fence_done`](Backend::fence_done) does. The
    /// default says `true`.
    fn fence_wait(&self, fence: u64) -> bool {
        let _ = fence;
        true
    }

    /// The pool is done with `fence` (it completed, or was waited for): called once
    /// per fence given to the pool.
    fn fence_release(&self, fence: u64) {
        let _ = fence;
    }

    /// The pool made an arena for the stream key `key` (at the key's first malloc;
    /// arenas are never removed). The device pool tells the stream module, which then
    /// keeps a stream with that handle from being destroyed, and its handle reused,
    /// while work queued on it may still use blocks freed into the arena. The default
    /// does nothing.
    fn arena_made(&self, key: u64) {
        let _ = key;
    }

    /// Whether the backend can back expandable segments, and their shape: `None` (the
    /// default) when it cannot, and the pool then grows with [`alloc`](Backend::alloc)
    /// even when expandable segments are asked for. See
    /// [`Pool::set_expandable_segments`](super::Pool::set_expandable_segments).
    fn segment_spec(&self) -> Option<SegmentSpec> {
        None
    }

    /// Reserves `size` bytes of address space with no memory behind it (CUDA:
    /// `cuMemAddressReserve`) and returns its start. `size` is a positive multiple of
    /// the spec's granularity; the start is aligned to it, non-zero, and the range
    /// overlaps no other reservation or allocation of this backend. Called only when
    /// [`segment_spec`](Backend::segment_spec) is `Some`.
    fn segment_reserve(&self, size: u64) -> Result<u64, BackendError> {
        let _ = size;
        Err(BackendError::Other(
            "this backend has no expandable segments".into(),
        ))
    }

    /// Maps `len` new bytes at `addr` in the reservation at `base` (CUDA: `cuMemCreate`,
    /// `cuMemMap` and `cuMemSetAccess`): `addr` and `len` are multiples of the
    /// granularity (`len` positive), `addr..addr + len` lies inside the reservation
    /// and none of it is mapped (the end of what the segment maps so far, or a range
    /// unmapped before by [`segment_unmap`](Backend::segment_unmap)). On `Err` nothing
    /// is mapped.
    fn segment_map(&self, base: u64, addr: u64, len: u64) -> Result<(), BackendError> {
        let _ = (base, addr, len);
        Err(BackendError::Other(
            "this backend has no expandable segments".into(),
        ))
    }

    /// Unmaps and releases the `len` bytes at `addr` in the reservation at `base`
    /// (CUDA: `cuMemUnmap` + `cuMemRelease`): granularity-aligned, all of them mapped
    /// (a segment's free tail, or whole free granules inside it). No block of it is
    /// handed out; stream work queued on it before may still run, and the backend
    /// waits for it (or leaves the range mapped) before unmapping.
    fn segment_unmap(&self, base: u64, addr: u64, len: u64) {
        let _ = (base, addr, len);
    }

    /// Gives back a reservation made by [`segment_reserve`](Backend::segment_reserve),
    /// of `size` bytes, with nothing mapped in it any more (CUDA: `cuMemAddressFree`).
    fn segment_release(&self, base: u64, size: u64) {
        let _ = (base, size);
    }
}

/// The shape of a backend's expandable segments ([`Backend::segment_spec`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentSpec {
    /// The unit of mapping (CUDA: `cuMemGetAllocationGranularity`, 2 MiB on current
    /// GPUs): a power of two, a multiple of [`ALLOCATION_UNIT`](super::ALLOCATION_UNIT).
    pub granularity: u64,
    /// The address space reserved per segment (a multiple of `granularity`): a
    /// segment grows in place up to this size; a request that does not fit in any
    /// segment's room opens another (of at least the request's size).
    pub reserve: u64,
}

// A shared or boxed backend is the backend it holds: every method forwards.
macro_rules! forward_backend {
    ($($ptr:ident),*) => {$(
        impl<B: Backend + ?Sized> Backend for $ptr<B> {
            fn alloc(&self, size: usize) -> Result<u64, BackendError> {
                (**self).alloc(size)
            }
            fn alloc_for(&self, size: usize, key: u64) -> Result<u64, BackendError> {
                (**self).alloc_for(size, key)
            }
            fn free(&self, addr: u64, size: usize) {
                (**self).free(addr, size)
            }
            fn fence_done(&self, fence: u64) -> bool {
                (**self).fence_done(fence)
            }
            fn fence_wait(&self, fence: u64) -> bool {
                (**self).fence_wait(fence)
            }
            fn fence_release(&self, fence: u64) {
                (**self).fence_release(fence)
            }
            fn arena_made(&self, key: u64) {
                (**self).arena_made(key)
            }
            fn segment_spec(&self) -> Option<SegmentSpec> {
                (**self).segment_spec()
            }
            fn segment_reserve(&self, size: u64) -> Result<u64, BackendError> {
                (**self).segment_reserve(size)
            }
            fn segment_map(&self, base: u64, addr: u64, len: u64) -> Result<(), BackendError> {
                (**self).segment_map(base, addr, len)
            }
            fn segment_unmap(&self, base: u64, addr: u64, len: u64) {
                (**self).segment_unmap(base, addr, len)
            }
            fn segment_release(&self, base: u64, size: u64) {
                (**self).segment_release(base, size)
            }
        }
    )*};
}

forward_backend!(Arc, Box);

/// A snapshot of what a host backend has handed out.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendCounters {
    /// Bytes currently allocated and not yet freed.
    pub live_bytes: u64,
    /// Allocations currently live.
    pub live_allocations: u64,
    /// Highest `live_bytes` seen.
    pub peak_live_bytes: u64,
    /// Successful allocations so far.
    pub allocs: u64,
    /// Frees so far.
    pub frees: u64,
    /// Allocations refused as out of memory so far.
    pub oom_refusals: u64,
    /// Frees that matched no live allocation (unknown address, or a size other than
    /// the one allocated): ignored and counted here (checked backends only). Always 0
    /// under a correct pool.
    pub bad_frees: u64,
    /// Fences made by `new_fence` and not yet released by the pool.
    pub live_fences: u64,
    /// Fence queries the pool made ([`Backend::fence_done`]).
    pub fence_queries: u64,
    /// Fence waits the pool made ([`Backend::fence_wait`]): host synchronisations.
    pub fence_waits: u64,
    /// Releases of fences that were not live (unknown, or released twice). Always 0
    /// under a correct pool.
    pub bad_fence_releases: u64,
    /// Expandable-segment reservations currently live (address space only).
    pub live_segments: u64,
    /// Successful [`Backend::segment_map`] calls so far (their bytes count in
    /// `live_bytes`, not in `allocs`).
    pub segment_maps: u64,
    /// [`Backend::segment_unmap`] calls so far.
    pub segment_unmaps: u64,
    /// Segment calls that broke the contract (a map of granules already mapped or
    /// outside the reservation, an unmap of granules not mapped, a range not whole
    /// granules, a release of a reservation still mapped or unknown): ignored
    /// and counted here (checked backends only). Always 0 under a correct pool.
    pub bad_segment_calls: u64,
}

/// Shared accounting of the two host backends: live bytes against an optional
/// capacity, plus failure injection.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
struct Accounting {
    live_bytes: AtomicU64,
    live_allocations: AtomicU64,
    peak_live_bytes: AtomicU64,
    allocs: AtomicU64,
    frees: AtomicU64,
    oom_refusals: AtomicU64,
    bad_frees: AtomicU64,
    /// 0 means unlimited.
    capacity: AtomicU64,
    fail_other: AtomicBool,
    /// Fake fences: token -> done.
    fences: Mutex<BTreeMap<u64, bool>>,
    next_fence: AtomicU64,
    fence_queries: AtomicU64,
    fence_waits: AtomicU64,
    bad_fence_releases: AtomicU64,
    /// Every fence query and wait fails while set (`set_fences_fail`).
    fences_fail: AtomicBool,
    live_segments: AtomicU64,
    segment_maps: AtomicU64,
    segment_unmaps: AtomicU64,
    bad_segment_calls: AtomicU64,
}

#[cfg(any(test, feature = "test-util"))]
impl Accounting {
    fn reserve(&self, size: u64) -> Result<(), BackendError> {
        self.reserve_bytes(size)?;
        self.live_allocations.fetch_add(1, Ordering::Relaxed);
        self.allocs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// `size` more live bytes against the capacity, counting no allocation (a map).
    fn reserve_bytes(&self, size: u64) -> Result<(), BackendError> {
        if self.fail_other.load(Ordering::Relaxed) {
            return Err(BackendError::Other("injected backend failure".into()));
        }
        let cap = self.capacity.load(Ordering::Relaxed);
        let res = self
            .live_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |live| {
                let new = live.checked_add(size)?;
                (cap == 0 || new <= cap).then_some(new)
            });
        match res {
            Ok(old) => {
                self.peak_live_bytes
                    .fetch_max(old + size, Ordering::Relaxed);
                Ok(())
            }
            Err(_) => {
                self.oom_refusals.fetch_add(1, Ordering::Relaxed);
                Err(BackendError::OutOfMemory(None))
            }
        }
    }

    fn unreserve(&self, size: u64) {
        self.live_bytes.fetch_sub(size, Ordering::AcqRel);
        self.live_allocations.fetch_sub(1, Ordering::Relaxed);
        self.frees.fetch_add(1, Ordering::Relaxed);
    }

    fn bad_free(&self) {
        self.bad_frees.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> BackendCounters {
        BackendCounters {
            live_bytes: self.live_bytes.load(Ordering::Acquire),
            live_allocations: self.live_allocations.load(Ordering::Relaxed),
            peak_live_bytes: self.peak_live_bytes.load(Ordering::Relaxed),
            allocs: self.allocs.load(Ordering::Relaxed),
            frees: self.frees.load(Ordering::Relaxed),
            oom_refusals: self.oom_refusals.load(Ordering::Relaxed),
            bad_frees: self.bad_frees.load(Ordering::Relaxed),
            live_fences: lock(&self.fences).len() as u64,
            fence_queries: self.fence_queries.load(Ordering::Relaxed),
            fence_waits: self.fence_waits.load(Ordering::Relaxed),
            bad_fence_releases: self.bad_fence_releases.load(Ordering::Relaxed),
            live_segments: self.live_segments.load(Ordering::Relaxed),
            segment_maps: self.segment_maps.load(Ordering::Relaxed),
            segment_unmaps: self.segment_unmaps.load(Ordering::Relaxed),
            bad_segment_calls: self.bad_segment_calls.load(Ordering::Relaxed),
        }
    }

    fn new_fence(&self) -> u64 {
        let f = self.next_fence.fetch_add(1, Ordering::Relaxed) + 1;
        lock(&self.fences).insert(f, false);
        f
    }

    fn complete_fence(&self, fence: u64) {
        if let Some(done) = lock(&self.fences).get_mut(&fence) {
            *done = true;
        }
    }

    fn fence_done(&self, fence: u64) -> bool {
        self.fence_queries.fetch_add(1, Ordering::Relaxed);
        if self.fences_fail.load(Ordering::Relaxed) {
            return false;
        }
        // An unknown token (released already) is not known to be done either.
        lock(&self.fences).get(&fence).copied().unwrap_or(false)
    }

    fn fence_wait(&self, fence: u64) -> bool {
        self.fence_waits.fetch_add(1, Ordering::Relaxed);
        if self.fences_fail.load(Ordering::Relaxed) {
            return false;
        }
        self.complete_fence(fence);
        true
    }

    fn fence_release(&self, fence: u64) {
        if lock(&self.fences).remove(&fence).is_none() {
            self.bad_fence_releases.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The fake fences of both host backends: what tests use for the stream work a block
/// waits for before it is reused.
#[cfg(any(test, feature = "test-util"))]
macro_rules! fake_fences {
    ($t:ty) => {
        impl $t {
            /// A new fake fence, not done: give it to
            /// [`Pool::free_after`](super::Pool::free_after) as the stream work a block
            /// waits for.
            pub fn new_fence(&self) -> u64 {
                self.acct.new_fence()
            }

            /// Marks `fence` done (the stream passed it); the pool's next poll sees it.
            pub fn complete_fence(&self, fence: u64) {
                self.acct.complete_fence(fence)
            }

            /// While `true`, every fence query and wait fails (says "not done", and a
            /// wait completes nothing), as every `cuEventQuery` and
            /// `cuEventSynchronize` does while another thread holds a global-mode
            /// stream capture, or forever on a dead context.
            pub fn set_fences_fail(&self, fail: bool) {
                self.acct.fences_fail.store(fail, Ordering::Relaxed);
            }
        }
    };
}
#[cfg(any(test, feature = "test-util"))]
fake_fences!(HostBackend);
#[cfg(any(test, feature = "test-util"))]
fake_fences!(FakeBackend);

/// The fence methods of both host backends' `Backend` impls.
#[cfg(any(test, feature = "test-util"))]
macro_rules! fence_methods {
    () => {
        fn fence_done(&self, fence: u64) -> bool {
            self.acct.fence_done(fence)
        }
        fn fence_wait(&self, fence: u64) -> bool {
            self.acct.fence_wait(fence)
        }
        fn fence_release(&self, fence: u64) {
            self.acct.fence_release(fence)
        }
    };
}

#[cfg(any(test, feature = "test-util"))]
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Real host memory, aligned to [`ALLOCATION_UNIT`] bytes: blocks can be written and
/// read, so tests (and Miri) see any overlap or use after free.
///
/// Each allocation is a `Vec<u8>` with room for `size + 511` bytes, of which the
/// first 512-aligned `size` bytes are handed out (uninitialized, as from `malloc`);
/// the vector stays in the backend's live map until `free`, so no `unsafe` is needed.
/// A `free` of an address or size it did not hand out changes nothing and is counted
/// in [`BackendCounters::bad_frees`]; whatever is still live when the backend is
/// dropped is deallocated then. Optional capacity (out of memory past it) and failure
/// injection let tests drive the pool's retry paths.
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug, Default)]
pub struct HostBackend {
    acct: Accounting,
    /// Aligned address -> (size, the vector holding it).
    live: Mutex<BTreeMap<u64, (usize, Vec<u8>)>>,
}

#[cfg(any(test, feature = "test-util"))]
impl HostBackend {
    /// A backend with no capacity limit.
    pub fn new() -> Self {
        Self::default()
    }

    /// A backend that reports out of memory once `capacity` bytes are live.
    pub fn with_capacity(capacity: u64) -> Self {
        let b = Self::default();
        b.set_capacity(capacity);
        b
    }

    /// Sets the capacity in bytes (0: unlimited).
    pub fn set_capacity(&self, capacity: u64) {
        self.acct.capacity.store(capacity, Ordering::Relaxed);
    }

    /// While `true`, every `alloc` fails with [`BackendError::Other`].
    pub fn set_fail_other(&self, fail: bool) {
        self.acct.fail_other.store(fail, Ordering::Relaxed);
    }

    /// What the backend has handed out so far.
    pub fn counters(&self) -> BackendCounters {
        self.acct.snapshot()
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Backend for HostBackend {
    fence_methods!();

    fn alloc(&self, size: usize) -> Result<u64, BackendError> {
        const ALIGN: usize = ALLOCATION_UNIT;
        let Some(room) = size.checked_add(ALIGN - 1).filter(|_| size > 0) else {
            return Err(BackendError::Other(
                format!("HostBackend cannot allocate {size} bytes").into(),
            ));
        };
        self.acct.reserve(size as u64)?;
        let mut buf = Vec::<u8>::new();
        if buf.try_reserve_exact(room).is_err() {
            self.acct.unreserve(size as u64);
            return Err(BackendError::OutOfMemory(None));
        }
        // The cast exposes the buffer's address, so callers may turn the `u64` back
        // into a pointer; moving `buf` into the map does not move its heap buffer.
        let base = buf.as_mut_ptr() as usize;
        let addr = (base + (ALIGN - 1)) & !(ALIGN - 1);
        lock(&self.live).insert(addr as u64, (size, buf));
        Ok(addr as u64)
    }

    fn free(&self, addr: u64, size: usize) {
        let freed = {
            let mut live = lock(&self.live);
            match live.get(&addr) {
                Some(&(recorded, _)) if recorded == size => live.remove(&addr),
                _ => None,
            }
        };
        match freed {
            Some(_) => self.acct.unreserve(size as u64),
            None => self.acct.bad_free(),
        }
    }
}

/// Address ranges without memory: hands out non-overlapping ranges from a counter
/// (never reused), so traces of many gibibytes run in no memory at all. The fast
/// mode only counts; [`FakeBackend::checked`] also records every live range, and a
/// free that does not match one changes nothing and is counted in
/// [`BackendCounters::bad_frees`].
///
/// With [`with_segments`](FakeBackend::with_segments) it also simulates expandable
/// segments: a reservation takes address space from the same counter and counts no
/// bytes; mapping counts its bytes as live (against the capacity, so a map can be
/// out of memory), unmapping gives them back. The checked mode records each
/// reservation's mapped granules and checks that maps cover whole granules inside
/// it not mapped yet, unmaps whole granules that are mapped, and releases find it
/// empty ([`BackendCounters::bad_segment_calls`]).
#[cfg(any(test, feature = "test-util"))]
#[derive(Debug)]
pub struct FakeBackend {
    acct: Accounting,
    next: AtomicU64,
    live: Option<Mutex<BTreeMap<u64, usize>>>,
    segments: Option<SegmentSpec>,
    /// Checked mode: reservation base -> (reserved size, addresses of mapped granules).
    reservations: Mutex<BTreeMap<u64, (u64, BTreeSet<u64>)>>,
}

#[cfg(any(test, feature = "test-util"))]
impl Default for FakeBackend {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(any(test, feature = "test-util"))]
impl FakeBackend {
    /// First address handed out; any non-zero multiple of 512 would do.
    const BASE: u64 = 1 << 40;

    /// A counting-only fake backend with no capacity limit (fastest).
    pub fn new() -> Self {
        FakeBackend {
            acct: Accounting::default(),
            next: AtomicU64::new(Self::BASE),
            live: None,
            segments: None,
            reservations: Mutex::new(BTreeMap::new()),
        }
    }

    /// This backend with expandable segments of shape `spec` (see the type's doc).
    pub fn with_segments(self, spec: SegmentSpec) -> Self {
        FakeBackend {
            segments: Some(spec),
            ..self
        }
    }

    /// Bytes mapped in the reservation at `base` (checked mode; `None`: no such
    /// reservation, or not the checked mode).
    pub fn mapped(&self, base: u64) -> Option<u64> {
        self.live.as_ref()?;
        let g = self.segments?.granularity;
        lock(&self.reservations)
            .get(&base)
            .map(|(_, m)| m.len() as u64 * g)
    }

    /// Whether `addr` lies in a mapped granule of a reservation (checked mode; `false`
    /// otherwise).
    pub fn is_mapped(&self, addr: u64) -> bool {
        let Some(g) = self.segments.map(|s| s.granularity) else {
            return false;
        };
        self.live.is_some()
            && lock(&self.reservations)
                .range(..=addr)
                .next_back()
                .is_some_and(|(_, (_, m))| m.contains(&(addr & !(g - 1))))
    }

    /// The granules `addr..addr + len` of the reservation at `base` if that range is
    /// whole granules inside it (checked mode).
    fn granules_of(&self, size: u64, base: u64, addr: u64, len: u64) -> Option<Vec<u64>> {
        let g = self.segments?.granularity;
        let ok = len > 0
            && addr >= base
            && (addr - base).is_multiple_of(g)
            && len.is_multiple_of(g)
            && addr - base <= size
            && len <= size - (addr - base);
        ok.then(|| (0..len / g).map(|k| addr + k * g).collect())
    }

    /// A fake backend that records live ranges and checks every free against them
    /// (mismatches are counted in [`BackendCounters::bad_frees`]).
    pub fn checked() -> Self {
        FakeBackend {
            live: Some(Mutex::new(BTreeMap::new())),
            ..Self::new()
        }
    }

    /// Sets the capacity in bytes (0: unlimited).
    pub fn set_capacity(&self, capacity: u64) {
        self.acct.capacity.store(capacity, Ordering::Relaxed);
    }

    /// While `true`, every `alloc` fails with [`BackendError::Other`].
    pub fn set_fail_other(&self, fail: bool) {
        self.acct.fail_other.store(fail, Ordering::Relaxed);
    }

    /// What the backend has handed out so far.
    pub fn counters(&self) -> BackendCounters {
        self.acct.snapshot()
    }
}

#[cfg(any(test, feature = "test-util"))]
impl Backend for FakeBackend {
    fence_methods!();

    fn alloc(&self, size: usize) -> Result<u64, BackendError> {
        if size == 0 {
            return Err(BackendError::Other(
                "FakeBackend cannot allocate 0 bytes".into(),
            ));
        }
        self.acct.reserve(size as u64)?;
        let addr = self.next.fetch_add(size as u64, Ordering::Relaxed);
        if let Some(live) = &self.live {
            lock(live).insert(addr, size);
        }
        Ok(addr)
    }

    fn free(&self, addr: u64, size: usize) {
        if let Some(live) = &self.live {
            let mut live = lock(live);
            if live.get(&addr) != Some(&size) {
                drop(live);
                self.acct.bad_free();
                return;
            }
            live.remove(&addr);
        }
        self.acct.unreserve(size as u64);
    }

    fn segment_spec(&self) -> Option<SegmentSpec> {
        self.segments
    }

    fn segment_reserve(&self, size: u64) -> Result<u64, BackendError> {
        let Some(spec) = self.segments else {
            return Err(BackendError::Other("FakeBackend has no segments".into()));
        };
        let g = spec.granularity;
        if size == 0 || !size.is_multiple_of(g) {
            return Err(BackendError::Other(
                format!("FakeBackend cannot reserve {size} bytes").into(),
            ));
        }
        let mut base = 0;
        let r = self
            .next
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                base = n.checked_add(g - 1)? & !(g - 1);
                base.checked_add(size)
            });
        if r.is_err() {
            return Err(BackendError::OutOfMemory(None));
        }
        self.acct.live_segments.fetch_add(1, Ordering::Relaxed);
        if self.live.is_some() {
            lock(&self.reservations).insert(base, (size, BTreeSet::new()));
        }
        Ok(base)
    }

    fn segment_map(&self, base: u64, addr: u64, len: u64) -> Result<(), BackendError> {
        let mut granules = Vec::new();
        if self.live.is_some() {
            let res = lock(&self.reservations);
            let free = res.get(&base).and_then(|(size, m)| {
                let gs = self.granules_of(*size, base, addr, len)?;
                gs.iter().all(|a| !m.contains(a)).then_some(gs)
            });
            match free {
                Some(gs) => granules = gs,
                None => {
                    self.acct.bad_segment_calls.fetch_add(1, Ordering::Relaxed);
                    return Err(BackendError::Other("bad segment_map".into()));
                }
            }
        }
        self.acct.reserve_bytes(len)?;
        self.acct.segment_maps.fetch_add(1, Ordering::Relaxed);
        if let Some((_, m)) = lock(&self.reservations).get_mut(&base) {
            m.extend(granules);
        }
        Ok(())
    }

    fn segment_unmap(&self, base: u64, addr: u64, len: u64) {
        if self.live.is_some() {
            let mut res = lock(&self.reservations);
            let taken = res.get_mut(&base).and_then(|(size, m)| {
                let gs = self.granules_of(*size, base, addr, len)?;
                gs.iter().all(|a| m.contains(a)).then(|| {
                    gs.iter().for_each(|a| {
                        m.remove(a);
                    })
                })
            });
            if taken.is_none() {
                self.acct.bad_segment_calls.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.acct.segment_unmaps.fetch_add(1, Ordering::Relaxed);
        self.acct.live_bytes.fetch_sub(len, Ordering::AcqRel);
    }

    fn segment_release(&self, base: u64, size: u64) {
        if self.live.is_some() {
            let mut res = lock(&self.reservations);
            if !res
                .get(&base)
                .is_some_and(|(s, m)| *s == size && m.is_empty())
            {
                self.acct.bad_segment_calls.fetch_add(1, Ordering::Relaxed);
                return;
            }
            res.remove(&base);
        }
        self.acct.live_segments.fetch_sub(1, Ordering::Relaxed);
    }
}
