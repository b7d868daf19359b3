//! Pinned (page-locked) host memory: [`PinnedMemory`] owns one `cuMemHostAlloc`
//! allocation; [`PinnedMemoryPointer`] is a handle to a range of pinned memory (from
//! [`PinnedMemory`] or a pool) with offset arithmetic, byte and typed views, and
//! asynchronous copies that protect the memory until they have finished.

use std::ffi::c_void;
use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::allocator::{PinnedFunctions, PinnedMemoryAllocator};
use super::bytes;
use super::fence::{Fence, Pending};
use super::pool_core::{PinnedCore, PinnedFlags};
use crate::device::context;
use crate::error::{ArgumentKind, CaptureKind, Error, Result, StateKind};
use crate::memory::arena::{AtomicBlock, Block, RawBlock};
use crate::memory::{MemoryPointer, Pod};
use crate::stream::{AsStream, LEGACY_DEFAULT_HANDLE};

/// One `cuMemHostAlloc` allocation, freed with `cuMemFreeHost` on drop (CuPy's
/// `PinnedMemory`). Use it through a [`PinnedMemoryPointer`]
/// (`PinnedMemoryPointer::from(mem)`), which also carries the in-flight protection.
#[derive(Debug)]
pub struct PinnedMemory {
    addr: u64,
    size: usize,
    flags: PinnedFlags,
    /// The user's pair that allocated it (`None`: `cuMemHostAlloc`).
    functions: Option<PinnedFunctions>,
}

impl PinnedMemory {
    /// `size` bytes of portable pinned memory in the current device's context.
    /// `size == 0` allocates nothing (address 0).
    pub fn new(size: usize) -> Result<PinnedMemory> {
        Self::with_flags(size, PinnedFlags::PORTABLE)
    }

    /// `size` bytes allocated with `flags`.
    pub fn with_flags(size: usize, flags: PinnedFlags) -> Result<PinnedMemory> {
        if size == 0 {
            return Ok(PinnedMemory {
                addr: 0,
                size: 0,
                flags,
                functions: None,
            });
        }
        context::make_current(crate::device::get_device_id())?;
        let addr = super::host_alloc(size, flags.bits())?;
        Ok(PinnedMemory {
            addr,
            size,
            flags,
            functions: None,
        })
    }

    /// `size` bytes from the user's pair `functions` (freed with its `free` on drop).
    /// Its flags are empty (the pair's are unknown). `size == 0` allocates nothing.
    pub fn with_functions(size: usize, functions: &PinnedFunctions) -> Result<PinnedMemory> {
        let addr = if size == 0 {
            0
        } else {
            functions.malloc(size)?
        };
        Ok(PinnedMemory {
            addr,
            size,
            flags: PinnedFlags::empty(),
            functions: (size != 0).then(|| functions.clone()),
        })
    }

    /// The host address (0 for size 0).
    pub fn ptr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The flags it was allocated with.
    pub fn flags(&self) -> PinnedFlags {
        self.flags
    }

    /// The device address of mapped memory ([`PinnedFlags::DEVICEMAP`]); an error
    /// otherwise.
    pub fn device_ptr(&self) -> Result<u64> {
        if !self.flags.contains(PinnedFlags::DEVICEMAP) {
            return Err(Error::invalid_argument(
                ArgumentKind::Incompatible,
                "device_ptr: the pinned memory was not allocated with PinnedFlags::DEVICEMAP",
            ));
        }
        context::make_current(crate::device::get_device_id())?;
        Ok(result::memory::host_get_device_pointer(
            self.addr as usize as *mut c_void,
        )?)
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        // Inside a host function the driver may not be called: the memory is kept
        // (leaked), as memory dropped there is (docs/soundness.md, "Host functions").
        if result::stream::in_host_function() {
            return;
        }
        if let Some(f) = &self.functions {
            // From the user's pair (`with_functions`), freed once, here, after the copy
            // in flight (as below).
            f.free(self.addr, self.size);
        } else if self.addr != 0 {
            // SAFETY: `addr` came from cuMemHostAlloc (`with_flags`) and is freed once,
            // here; an `Owner` holding this memory waited for the copy in flight on it
            // before dropping it.
            let _ = unsafe { result::memory::free_host(self.addr as usize as *mut c_void) };
        }
    }
}

/// Who gives the memory back when the last handle goes.
enum Kind {
    /// Held for its drop (`cuMemFreeHost`); taken out and leaked by the owner's drop
    /// when the copy in flight cannot be waited for.
    Direct(Option<PinnedMemory>),
    /// A block of a pool (none while the owner waits in a spare list: size 0).
    Pooled(Arc<PinnedCore>),
}

// Recycled owners of pool blocks: when the last handle to a block goes, the block
// goes back to its pool and the emptied `Arc<Owner>` (still naming its pool's core)
// waits here for the thread's next malloc from that pool, so a cached malloc + free
// pair allocates nothing on the heap and touches no shared count.
crate::memory::recycler::spare_list!(Owner);

/// The shared owner of a range of pinned memory: the allocation and the fence of
/// the last asynchronous copy that uses it.
struct Owner {
    // The range (a pool block's `RawBlock`; address and size alone for a direct
    // allocation), in atomics so that a recycled owner is emptied and refilled
    // through `&self`. Written only while nothing else can reach the owner: in
    // `recycle` (the last strong reference, no weak one), in a thread's spare list,
    // and in `pooled` before it is handed out again.
    block: AtomicBlock,
    inflight: Mutex<Option<Fence>>,
    /// Set (under `inflight`'s lock) when a copy records a fence, so an owner that
    /// never had a copy in flight is emptied without taking that lock.
    fenced: AtomicBool,
    kind: Kind,
}

impl Owner {
    fn new(kind: Kind, raw: RawBlock) -> Owner {
        let o = Owner {
            block: AtomicBlock::empty(),
            inflight: Mutex::new(None),
            fenced: AtomicBool::new(false),
            kind,
        };
        o.block.store(raw);
        o
    }

    #[inline]
    fn addr(&self) -> u64 {
        self.block.addr()
    }

    #[inline]
    fn size(&self) -> usize {
        self.block.size() as usize
    }

    /// Takes a pooled owner's block out (none if emptied already, or for a direct
    /// allocation). Only on an owner nothing else can reach, or in its drop.
    #[inline]
    fn take_raw(&self) -> Option<(&Arc<PinnedCore>, RawBlock)> {
        let Kind::Pooled(core) = &self.kind else {
            return None;
        };
        self.block.take().map(|raw| (core, raw))
    }

    /// The fence of the last copy, taken out. Only on an owner nothing else can reach.
    #[inline]
    fn take_fence(&self) -> Option<Fence> {
        if !self.fenced.load(Ordering::Relaxed) {
            return None;
        }
        self.fenced.store(false, Ordering::Relaxed);
        self.inflight().take()
    }

    /// The last handle to a pool block went (this owner is unreachable from anywhere
    /// else): gives the block back now (after the copy in flight on it, through the
    /// pool's deferred list); `true` when the emptied owner may be kept for reuse.
    #[inline]
    fn recycle(&self) -> bool {
        let Some((core, raw)) = self.take_raw() else {
            return false;
        };
        !core.free_parking(raw, self.take_fence())
    }

    fn inflight(&self) -> MutexGuard<'_, Option<Fence>> {
        self.inflight.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the last copy recorded on the memory (which is queued after every
    /// earlier one) has finished.
    fn is_idle(&self) -> bool {
        if !self.fenced.load(Ordering::Relaxed) {
            return true;
        }
        self.inflight().as_ref().is_none_or(|f| f.is_done())
    }

    /// Waits for the copy in flight, if any (only for one that writes the memory
    /// unless `all`).
    fn wait(&self, all: bool) -> Result<()> {
        let mut g = self.inflight();
        let done = match g.as_ref() {
            Some(f) if all || f.writes() => {
                f.synchronize()?;
                g.take()
            }
            _ => None,
        };
        drop(g);
        // The device memory the fence kept alive goes back with no lock held.
        drop(done);
        Ok(())
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let fence = self
            .inflight
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match &mut self.kind {
            Kind::Direct(mem) => {
                // The allocation is freed right after this (field drop): the copy
                // must be over first. A wait that fails (another thread's global
                // capture, a dead context) does not say it is: then the allocation
                // and the fence (with the device memory it keeps for the copy) are
                // leaked, never freed under the copy.
                if let Some(f) = fence {
                    if !f.wait() {
                        std::mem::forget(mem.take());
                        std::mem::forget(f);
                    }
                }
            }
            Kind::Pooled(_) => {
                if let Some((core, raw)) = self.take_raw() {
                    core.free(core.pool().block_from_raw(raw), fence);
                    core.after_free();
                }
            }
        }
    }
}

/// A handle to a range of pinned memory (CuPy's `PinnedMemoryPointer`): the memory
/// stays alive while any handle to it does (clones and offsets share it).
///
/// Views and copies are safe against every misuse that compiles:
/// - [`as_slice`](Self::as_slice) waits for a device-to-host copy in flight into the
///   memory; [`as_mut_slice`](Self::as_mut_slice) and
///   [`copy_from_device_async`](Self::copy_from_device_async) (which write) need the
///   only handle to the allocation (`&mut self` and no clone or offset alive); the
///   view waits for any copy in flight, the copy is queued after it (its stream waits
///   for the copy's event);
/// - the memory is not freed, or handed out again by a pool, before the copies
///   recorded on it have finished, whatever happens to the handles;
/// - the device side of a safe copy is a [`MemoryPointer`]: bounds-checked before any
///   CUDA call, and held by the copy's fence until the copy has finished; the forms
///   that take a raw device address (`*_raw`) are `unsafe`;
/// - a stream that is capturing a graph is refused ([`Error::Capture`]).
pub struct PinnedMemoryPointer {
    owner: Option<Arc<Owner>>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for PinnedMemoryPointer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedMemoryPointer")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("len", &self.len)
            .field("mem_size", &self.mem_size())
            .finish()
    }
}

impl Drop for PinnedMemoryPointer {
    fn drop(&mut self) {
        // The last handle to a pool block: give the block back and keep the emptied
        // owner for the next malloc (no heap traffic). Anything else drops as usual.
        // One strong reference (this one) and no weak one: nothing else can reach the
        // owner (plain loads, where `Arc::get_mut` would pay a compare-exchange).
        if let Some(o) = self.owner.take() {
            if Arc::strong_count(&o) == 1 && Arc::weak_count(&o) == 0 {
                fence(Ordering::Acquire);
                if o.recycle() {
                    spare::put(o);
                }
            }
        }
    }
}

impl Clone for PinnedMemoryPointer {
    /// Another handle to the same range (shares the allocation).
    fn clone(&self) -> Self {
        PinnedMemoryPointer {
            owner: self.owner.clone(),
            offset: self.offset,
            len: self.len,
        }
    }
}

/// `&p + n`: [`PinnedMemoryPointer::offset`], as CuPy's `ptr + n` (an error past
/// the end).
impl std::ops::Add<usize> for &PinnedMemoryPointer {
    type Output = Result<PinnedMemoryPointer>;
    fn add(self, n: usize) -> Result<PinnedMemoryPointer> {
        self.offset(n)
    }
}

/// `&p - n`: [`PinnedMemoryPointer::offset_back`], as CuPy's `ptr - n` (an error
/// before the start of the allocation).
impl std::ops::Sub<usize> for &PinnedMemoryPointer {
    type Output = Result<PinnedMemoryPointer>;
    fn sub(self, n: usize) -> Result<PinnedMemoryPointer> {
        self.offset_back(n)
    }
}

impl From<PinnedMemory> for PinnedMemoryPointer {
    /// A handle to the whole allocation.
    fn from(mem: PinnedMemory) -> Self {
        if mem.size == 0 {
            return PinnedMemoryPointer::empty();
        }
        let raw = RawBlock {
            addr: mem.addr,
            size: mem.size as u64,
            key: 0,
            chunk: 0,
            arena: 0,
        };
        PinnedMemoryPointer::with_owner(Owner::new(Kind::Direct(Some(mem)), raw))
    }
}

impl PinnedMemoryPointer {
    fn with_owner(owner: Owner) -> Self {
        let len = owner.size();
        PinnedMemoryPointer {
            owner: Some(Arc::new(owner)),
            offset: 0,
            len,
        }
    }

    /// A handle to no memory (address 0, length 0).
    pub fn empty() -> Self {
        PinnedMemoryPointer {
            owner: None,
            offset: 0,
            len: 0,
        }
    }

    /// A pool block as a handle (the block's rounded size is the allocation size;
    /// the handle's length is also the rounded size, as in CuPy).
    #[inline]
    pub(crate) fn pooled(core: &Arc<PinnedCore>, block: Block) -> Self {
        if block.is_null() {
            core.free(block, None);
            return PinnedMemoryPointer::empty();
        }
        let size = block.size();
        let raw = block.into_raw();
        let same = |o: &Owner| matches!(&o.kind, Kind::Pooled(c) if Arc::ptr_eq(c, core));
        let owner = match spare::take_where(same) {
            Some(o) => {
                // Emptied by `recycle` and held by this thread's list alone since.
                o.block.store(raw);
                o
            }
            None => Arc::new(Owner::new(Kind::Pooled(core.clone()), raw)),
        };
        PinnedMemoryPointer {
            owner: Some(owner),
            offset: 0,
            len: size,
        }
    }

    /// The host address of the start of the range (0 for an empty handle).
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.owner
            .as_ref()
            .map_or(0, |o| o.addr() + self.offset as u64)
    }

    /// Length of the range in bytes.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the range is empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Offset of the range from the start of its allocation.
    #[inline]
    pub fn offset_in_mem(&self) -> usize {
        self.offset
    }

    /// Size of the whole allocation (or pool block) the range lies in.
    #[inline]
    pub fn mem_size(&self) -> usize {
        self.owner.as_ref().map_or(0, |o| o.size())
    }

    /// A handle `n` bytes further on, to the rest of the range (CuPy's `ptr + n`);
    /// it keeps the allocation alive. `n` past the end is an error.
    pub fn offset(&self, n: usize) -> Result<PinnedMemoryPointer> {
        if n > self.len {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: n as u64,
                    available: self.len as u64,
                },
                format!(
                    "pinned pointer offset {n} is past the end of its {}-byte range",
                    self.len
                ),
            ));
        }
        self.slice(n, self.len - n)
    }

    /// A handle `n` bytes back, within the same allocation (CuPy's `ptr - n`): the
    /// range starts `n` bytes earlier and ends where this one does. Moving before the
    /// start of the allocation is an error.
    pub fn offset_back(&self, n: usize) -> Result<PinnedMemoryPointer> {
        if n > self.offset {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: n as u64,
                    available: self.offset as u64,
                },
                format!(
                    "pinned pointer offset -{n} is before the start of its allocation \
                     ({} bytes back at most)",
                    self.offset
                ),
            ));
        }
        Ok(PinnedMemoryPointer {
            owner: self.owner.clone(),
            offset: self.offset - n,
            len: self.len + n,
        })
    }

    /// A handle moved by `delta` bytes, forwards or backwards ([`offset`](Self::offset)
    /// or [`offset_back`](Self::offset_back)).
    pub fn offset_by(&self, delta: isize) -> Result<PinnedMemoryPointer> {
        if delta >= 0 {
            self.offset(delta.unsigned_abs())
        } else {
            self.offset_back(delta.unsigned_abs())
        }
    }

    /// A handle to `len` bytes at `start` within this range.
    pub fn slice(&self, start: usize, len: usize) -> Result<PinnedMemoryPointer> {
        match start.checked_add(len) {
            Some(end) if end <= self.len => Ok(PinnedMemoryPointer {
                owner: self.owner.clone(),
                offset: self.offset + start,
                len,
            }),
            _ => Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: (start as u64).saturating_add(len as u64),
                    available: self.len as u64,
                },
                format!(
                    "pinned range {start}..{start}+{len} is outside its {}-byte range",
                    self.len
                ),
            )),
        }
    }

    /// Whether no other handle (clone or offset) shares the allocation.
    pub fn is_unique(&self) -> bool {
        match &self.owner {
            Some(o) => Arc::strong_count(o) == 1,
            None => true,
        }
    }

    fn unique_owner(&mut self, what: &str) -> Result<Option<&Owner>> {
        match &self.owner {
            Some(o) if Arc::strong_count(o) != 1 => Err(Error::invalid_state(
                StateKind::Shared {
                    others: Arc::strong_count(o) - 1,
                },
                format!(
                    "{what} needs the only handle to this pinned memory, but {} other handles \
                     (clones or offsets) share it",
                    Arc::strong_count(o) - 1
                ),
            )),
            o => Ok(o.as_deref()),
        }
    }

    /// The bytes of the range. Waits first for a device-to-host copy in flight into
    /// the memory.
    pub fn as_slice(&self) -> Result<&[u8]> {
        match &self.owner {
            None => Ok(&[]),
            Some(o) => {
                o.wait(false)?;
                Ok(bytes::bytes(self, o.addr() + self.offset as u64, self.len))
            }
        }
    }

    /// The bytes of the range, writable. Needs the only handle to the allocation
    /// (see the type's doc); waits first for any copy in flight on the memory.
    pub fn as_mut_slice(&mut self) -> Result<&mut [u8]> {
        let (addr, len) = match self.unique_owner("as_mut_slice")? {
            None => return Ok(&mut []),
            Some(o) => {
                o.wait(true)?;
                (o.addr() + self.offset as u64, self.len)
            }
        };
        Ok(bytes::bytes_mut(self, addr, len))
    }

    /// The range as `T`s; an error when it is not aligned for `T` or its length is
    /// not a multiple of `T`'s size.
    pub fn as_slice_of<T: Pod>(&self) -> Result<&[T]> {
        let b = self.as_slice()?;
        bytes::typed(b).ok_or_else(|| misaligned::<T>(b.as_ptr() as u64, b.len()))
    }

    /// The range as mutable `T`s (as [`as_mut_slice`](Self::as_mut_slice)).
    pub fn as_mut_slice_of<T: Pod>(&mut self) -> Result<&mut [T]> {
        let b = self.as_mut_slice()?;
        let (p, n) = (b.as_ptr() as u64, b.len());
        bytes::typed_mut(b).ok_or_else(|| misaligned::<T>(p, n))
    }

    /// Copies the range ([`len`](Self::len) bytes) to the device memory at `dst` on
    /// `stream`, asynchronously. The bytes must fit in the room left behind `dst`
    /// ([`MemoryPointer::size`]): more is an error, and nothing is copied.
    ///
    /// An event recorded after the copy (a fence) protects both sides until the copy
    /// has completed, whatever happens to the handles meanwhile: the pinned memory is
    /// neither written through a view of this crate nor freed nor handed out again by
    /// a pool, and the fence holds a clone of `dst`, so the device memory is neither
    /// freed nor handed to another user (dropping `dst` right after this call is
    /// fine). No host synchronisation. The fence, and the clone with it, goes at the
    /// next copy on or wait for this pinned memory ([`synchronize`](Self::synchronize),
    /// a view), or, once the pinned memory went back to its pool, at the pool's next
    /// allocation after the copy: until then the device memory is not reused.
    ///
    /// A stream that is capturing a graph is refused with [`Error::Capture`]: the
    /// graph would copy out of this memory on every launch, long after it has gone
    /// back to its pool (a fence recorded during a capture never completes).
    pub fn copy_to_device_async(
        &self,
        dst: &MemoryPointer,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        let what = "copy_to_device_async";
        super::check_room(what, "destination", dst, self.len)?;
        let Some(o) = &self.owner else {
            return Ok(());
        };
        if self.len == 0 {
            return Ok(());
        }
        let (src, d, len) = (o.addr() + self.offset as u64, dst.ptr(), self.len);
        Self::enqueue(what, o, stream, false, Some(dst), |s| {
            // SAFETY: the source is this range of pinned memory, which the fence
            // recorded after the copy keeps from being freed, handed out again or
            // written through a view until the copy is done; the destination fits
            // behind `dst` (`check_room`) and the fence holds a clone of `dst`, so it
            // stays allocated; `s` is live and current (see `enqueue`).
            Ok(unsafe {
                result::memory::memcpy_htod_async(d, src as usize as *const c_void, len, s)
            }?)
        })
    }

    /// [`copy_to_device_async`](Self::copy_to_device_async) to a raw device address,
    /// with no bounds check and nothing kept alive on the device side. The pinned side
    /// is protected as in the safe form, and capturing streams are refused the same
    /// way.
    ///
    /// # Safety
    /// `dst` must be the start of at least [`len`](Self::len) bytes of memory that
    /// CUDA copies may write (device, managed or mapped pinned memory) and that, from
    /// this call until the copy has completed on `stream` (a synchronisation of the
    /// stream, or of an event recorded on it after this call):
    /// - stays allocated and is not handed to any other user by its allocator;
    /// - is neither read nor written by anything else: no Rust reference to it is
    ///   alive, and no other host code or device work touches it.
    pub unsafe fn copy_to_device_async_raw(
        &self,
        dst: u64,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        let what = "copy_to_device_async_raw";
        let Some(o) = &self.owner else {
            return Ok(());
        };
        if self.len == 0 {
            return Ok(());
        }
        let (src, len) = (o.addr() + self.offset as u64, self.len);
        Self::enqueue(what, o, stream, false, None, |s| {
            // SAFETY: the source as in `copy_to_device_async`; the destination is the
            // caller's promise (see `# Safety`); `s` is live and current (`enqueue`).
            Ok(unsafe {
                result::memory::memcpy_htod_async(dst, src as usize as *const c_void, len, s)
            }?)
        })
    }

    /// Copies [`len`](Self::len) bytes from the device memory at `src` into the range
    /// on `stream`, asynchronously. They must lie in the room left behind `src`
    /// ([`MemoryPointer::size`]): more is an error, and nothing is copied. Needs the
    /// only handle to the allocation (`&mut self`, no clone or offset alive).
    ///
    /// A fence recorded after the copy protects both sides until it has completed:
    /// views of the pinned memory wait for it, the pinned memory is neither freed nor
    /// handed out again, and the fence holds a clone of `src`, so the device memory is
    /// not reused meanwhile (dropping `src` right after this call is fine). No host
    /// synchronisation. The clone goes with the fence, as for
    /// [`copy_to_device_async`](Self::copy_to_device_async).
    ///
    /// A stream that is capturing a graph is refused with [`Error::Capture`], as for
    /// [`copy_to_device_async`](Self::copy_to_device_async).
    pub fn copy_from_device_async(
        &mut self,
        src: &MemoryPointer,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        let what = "copy_from_device_async";
        super::check_room(what, "source", src, self.len)?;
        let (len, offset) = (self.len, self.offset as u64);
        let Some(o) = self.unique_owner(what)? else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let (dst, s_addr) = (o.addr() + offset, src.ptr());
        Self::enqueue(what, o, stream, true, Some(src), |s| {
            // SAFETY: the destination is this range of pinned memory, whose only handle
            // is `self` (`unique_owner`); views wait for the writing fence recorded
            // after the copy, and the memory is neither freed nor handed out again
            // before it is done; any byte is a valid `u8`. The source fits behind `src`
            // (`check_room`) and the fence holds a clone of `src`, so it stays
            // allocated; `s` is live and current (see `enqueue`).
            Ok(unsafe {
                result::memory::memcpy_dtoh_async(dst as usize as *mut c_void, s_addr, len, s)
            }?)
        })
    }

    /// [`copy_from_device_async`](Self::copy_from_device_async) from a raw device
    /// address, with no bounds check and nothing kept alive on the device side. The
    /// pinned side is protected as in the safe form, and capturing streams are refused
    /// the same way.
    ///
    /// # Safety
    /// `src` must be the start of at least [`len`](Self::len) bytes of memory that
    /// CUDA copies may read (device, managed or mapped pinned memory) and that, from
    /// this call until the copy has completed on `stream` (a synchronisation of the
    /// stream, or of an event recorded on it after this call):
    /// - stays allocated and is not handed to any other user by its allocator;
    /// - is not written by anything else: no `&mut` reference to it is alive, and no
    ///   other host code or device work writes it.
    pub unsafe fn copy_from_device_async_raw(
        &mut self,
        src: u64,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        let what = "copy_from_device_async_raw";
        let (len, offset) = (self.len, self.offset as u64);
        let Some(o) = self.unique_owner(what)? else {
            return Ok(());
        };
        if len == 0 {
            return Ok(());
        }
        let dst = o.addr() + offset;
        Self::enqueue(what, o, stream, true, None, |s| {
            // SAFETY: the destination as in `copy_from_device_async`; the source is the
            // caller's promise (see `# Safety`); `s` is live and current (`enqueue`).
            Ok(unsafe {
                result::memory::memcpy_dtoh_async(dst as usize as *mut c_void, src, len, s)
            }?)
        })
    }

    /// Issues `copy` on `stream` after any earlier copy in flight on the memory (on
    /// another stream, the stream waits for it), then records the new fence, which
    /// holds `keep` (the device side) and what the earlier fence still held.
    /// Refuses a capturing stream first (one `cuStreamIsCapturing`; none for the
    /// legacy default stream, which cannot capture). `copy` gets the raw stream: live
    /// while `stream` is borrowed (`AsStream`), with its device's context current.
    fn enqueue(
        what: &str,
        o: &Owner,
        stream: &(impl AsStream + ?Sized),
        writes: bool,
        keep: Option<&MemoryPointer>,
        copy: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        let device = stream.device_id();
        context::make_current(device)?;
        let s = stream.as_raw();
        // SAFETY: `s` is live while `stream` is borrowed (`AsStream`); its device's
        // context was made current above.
        unsafe { refuse_capture(what, s, device) }?;
        let mut f = Fence::new(device, writes, keep.cloned())?;
        let mut g = o.inflight();
        o.fenced.store(true, Ordering::Relaxed);
        let after_earlier = match g.as_ref() {
            Some(old) if !old.is_done() => {
                // SAFETY: `s` is live while `stream` is borrowed (`AsStream`); the
                // earlier fence's event is live while the fence (held in `g`) is.
                unsafe { result::stream::wait_event(s, old.event() as sys::CUevent) }?;
                true
            }
            _ => false,
        };
        // Not into a capture that another thread began on `s` since `refuse_capture`
        // asked: its graph would copy at each launch, after the fence said done.
        let recorded = crate::capture::enqueue_uncaptured(stream, what, || {
            copy(s)?;
            // SAFETY: `s` is live while `stream` is borrowed, of the fence's device.
            Ok(unsafe { f.record(s) })
        })?;
        if let Err(e) = recorded {
            // The copy is queued but cannot be fenced: wait for it here (an error path
            // only), so nothing it uses is reused under it. The earlier fence stays.
            // SAFETY: as above.
            let _ = unsafe { crate::stream::drain(s) };
            return Err(e);
        }
        if after_earlier {
            if let Some(old) = g.as_mut() {
                // This copy's stream waited for the earlier one: the new fence is done
                // only after it, so it may hold what the earlier one held.
                f.inherit(old);
            }
        }
        let done = g.replace(f);
        drop(g);
        // The earlier fence (finished, or inherited) goes with no lock held: it may
        // drop the last pointer to device memory.
        drop(done);
        Ok(())
    }

    /// Whether no copy recorded on the memory is known to be in flight, asked without
    /// blocking. A query that fails (every event query fails while another thread
    /// holds a global-mode capture; a dead context fails for good) says `false`: the
    /// copy is not known to be done.
    pub fn is_idle(&self) -> bool {
        match &self.owner {
            Some(o) => o.is_idle(),
            None => true,
        }
    }

    /// Waits until every copy recorded on the memory has finished.
    pub fn synchronize(&self) -> Result<()> {
        match &self.owner {
            Some(o) => o.wait(true),
            None => Ok(()),
        }
    }
}

/// Refuses an asynchronous copy on a stream that is capturing a graph (an invalidated
/// capture counts): the captured copy would run on every launch of the graph, while
/// its fence, recorded during the capture, is never waited for, so the pinned block
/// would go back to its pool and be handed out again while launches still use it.
///
/// # Safety
/// `s` is a live stream (or a default-stream handle) of `device`, whose context is
/// current.
#[inline]
unsafe fn refuse_capture(what: &str, s: sys::CUstream, device: i32) -> Result<()> {
    if s as usize != LEGACY_DEFAULT_HANDLE {
        // SAFETY: `s` is live (caller).
        let status = unsafe { result::stream::is_capturing(s) }?;
        if status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
            return Err(capturing(what, s, device));
        }
    }
    Ok(())
}

#[cold]
fn capturing(what: &str, s: sys::CUstream, device: i32) -> Error {
    Error::capture(
        CaptureKind::Refused,
        format!(
            "{what}: stream {:#x} of device {device} is capturing a graph, and an \
             asynchronous pinned copy cannot be captured: every launch of the graph would \
             copy to or from this pinned memory after it has gone back to its pool; copy on \
             a stream that is not capturing, or end the capture first",
            s as usize
        ),
    )
}

#[cold]
fn misaligned<T>(addr: u64, len: usize) -> Error {
    let alignment = std::mem::align_of::<T>() as u64;
    let kind = if !addr.is_multiple_of(alignment) {
        ArgumentKind::Misaligned {
            address: addr,
            alignment,
        }
    } else {
        // Aligned, but the length is not a whole number of `T`s.
        ArgumentKind::Incompatible
    };
    Error::invalid_argument(
        kind,
        format!(
            "pinned range at {addr:#x} of {len} bytes cannot be viewed as {} (size {}, \
             alignment {})",
            std::any::type_name::<T>(),
            std::mem::size_of::<T>(),
            std::mem::align_of::<T>()
        ),
    )
}

/// Allocates `size` bytes of pinned memory from the current pinned allocator: the
/// default [`PinnedMemoryPool`](super::PinnedMemoryPool) unless
/// [`set_pinned_memory_allocator`](super::set_pinned_memory_allocator) chose another
/// pool, none (then each call is one `cuMemHostAlloc`), or a user's function pair
/// (one call of it).
pub fn alloc_pinned_memory(size: usize) -> Result<PinnedMemoryPointer> {
    super::with_current_allocator(|a| match a {
        PinnedMemoryAllocator::Pool(p) => p.malloc(size),
        PinnedMemoryAllocator::Unpooled => PinnedMemory::new(size).map(PinnedMemoryPointer::from),
        PinnedMemoryAllocator::Functions(f) => {
            PinnedMemory::with_functions(size, f).map(PinnedMemoryPointer::from)
        }
    })
}
