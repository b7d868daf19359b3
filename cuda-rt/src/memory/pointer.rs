//! [`MemoryPointer`]: an address inside a memory object, which it keeps alive, with
//! checked arithmetic, copies and memsets.
//!
//! Every copy and memset checks its byte count against the room left behind both
//! pointers before any CUDA call; size 0 is then a no-op.
//!
//! Synchronous forms run in order with this thread's current stream: on the legacy
//! default stream they are the plain driver calls (`cuMemcpyHtoD`, ...); on any other
//! current stream they are queued on it and waited for, and refused with
//! [`Error::Capture`] while that stream captures a graph. Asynchronous forms run on the
//! stream given (default: the current one). Host slices are borrowed only for the
//! call: a copy from or to page-locked host memory (whose transfer really runs after
//! the call returns) waits for the stream before returning, and a host-slice copy into
//! a capturing stream is refused, since the graph would touch the slice later.
//!
//! The synchronous host copies ([`MemoryPointer::copy_from_host`],
//! [`MemoryPointer::copy_to_host`]) are defined in `pinned` (`pinned/host_copy.rs`),
//! since large pageable ones go through pinned staging buffers; this module has what
//! they share with the other copies.

use std::fmt;
use std::ops::{Add, Sub};
use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::{make_current, primary};
use crate::error::{ArgumentKind, CaptureKind, Error, Result};
use crate::memory::device_memory::{BaseMemory, Memory};
use crate::memory::pod::{as_bytes, as_bytes_mut};
use crate::memory::uses;
use crate::memory::Pod;
use crate::stream::{get_current_stream, AsStream, StreamRef, LEGACY_DEFAULT_HANDLE};

// Device ranges (what the `SAFETY` lines of the copies and memsets rely on): every
// call first checks that its bytes fit behind the pointer (`check_room`), in memory the
// pointer's object keeps allocated while the pointer lives (`BaseMemory`'s contract).
// After the last pointer goes, plain memory is freed with `cuMemFree`, which waits for
// the work already queued on it, and pool memory is handed out again once every stream
// that used it has passed the use (`memory::uses`); during a capture the graph keeps
// what its nodes use (`capture::enqueue_using`).

/// A pointer into a memory object: the object (kept alive) and a byte offset in it.
/// Clones share the memory.
#[derive(Clone)]
pub struct MemoryPointer {
    /// Always `Some` but inside [`Drop::drop`], which may take it out to recycle the
    /// memory object (see [`BaseMemory::recycle`]).
    mem: Option<Arc<dyn BaseMemory>>,
    offset: usize,
    /// `mem.ptr() + offset`, kept so a launch can take the address's bytes in place.
    addr: u64,
}

impl fmt::Debug for MemoryPointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryPointer")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("offset", &self.offset)
            .field("mem", self.m())
            .finish()
    }
}

impl Drop for MemoryPointer {
    /// The last pointer to a memory object dropped while a capture is under way, on a
    /// thread in that capture, hands the object to the graph being captured, which may
    /// use it on every launch: it is released only after the graph (see
    /// [`crate::graph`]; memory that a capture's operations use is kept by its graph
    /// anyway). Otherwise the last pointer hands the object to
    /// [`BaseMemory::recycle`].
    #[inline]
    fn drop(&mut self) {
        let Some(mem) = &self.mem else { return };
        if Arc::strong_count(mem) != 1 {
            return;
        }
        if crate::capture::any_capture_active() {
            crate::capture::keep_for_graph(mem);
        } else if let Some(mem) = self.mem.take() {
            // The last pointer: the object gives its memory back now and may keep its
            // emptied allocation for reuse (pooled memory does).
            mem.recycle();
        }
    }
}

/// What [`MemoryPointer::m`] gives while the pointer is being dropped (never seen
/// outside the drop).
#[cold]
fn gone() -> &'static Arc<dyn BaseMemory> {
    static GONE: std::sync::LazyLock<Arc<dyn BaseMemory>> =
        std::sync::LazyLock::new(|| Arc::new(Memory::null(0)));
    &GONE
}

impl PartialEq for MemoryPointer {
    /// Same address on the same device.
    fn eq(&self, other: &Self) -> bool {
        self.ptr() == other.ptr() && self.device_id() == other.device_id()
    }
}
impl Eq for MemoryPointer {}

/// How a synchronous operation is ordered.
pub(crate) enum SyncVia {
    /// The plain (legacy default stream) driver call.
    Legacy,
    /// Queued on the current stream, then waited for.
    Stream(StreamRef),
}

impl SyncVia {
    /// The stream the operation runs on: the legacy default stream of `device` (the
    /// pointer's) for [`SyncVia::Legacy`], else the current stream.
    pub(crate) fn stream(&self, device: i32) -> StreamRef {
        match self {
            SyncVia::Legacy => StreamRef::legacy_default(device),
            SyncVia::Stream(s) => s.clone(),
        }
    }
}

/// Whether a driver copy to or from the host buffer `buf` may run after the call
/// returns, so that it must be waited for: page-locked memory (`cuMemHostAlloc`,
/// registered), managed memory, and memory the driver cannot answer for. Only plain
/// pageable memory, for which `cuPointerGetAttribute` answers
/// `CUDA_ERROR_INVALID_VALUE`, is `false`. `device`'s context is made current first.
pub(crate) fn is_page_locked<T: Pod>(buf: &[T], device: i32) -> bool {
    if buf.is_empty() {
        return false;
    }
    // The query is answered with a context current (the copy makes it current next).
    let _ = make_current(device);
    match result::memory::pointer_get_memory_type(buf.as_ptr() as u64) {
        // Page-locked host memory, or memory the device reaches directly (managed
        // memory): the driver's asynchronous copy reads or writes it after returning.
        Ok(_) => true,
        // Only "not a pointer CUDA knows" is plain pageable memory, which the driver
        // stages before returning. Any other failure cannot tell: the copy is waited
        // for, as for page-locked memory, rather than the slice given back early.
        Err(e) => !matches!(
            e,
            result::Error::Driver(d) if d.code == sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE
        ),
    }
}

/// Whether `s` is capturing a graph now (an invalidated capture counts: the stream is
/// still in capture mode).
fn is_capturing(s: &StreamRef) -> Result<bool> {
    // SAFETY: `s` keeps its stream alive while borrowed.
    let status = unsafe { result::stream::is_capturing(s.as_raw()) }?;
    Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
}

/// Waits for the work queued on `s`, which a synchronous operation lends borrowed
/// memory to: a wait refused by another thread's capture is retried until it ends
/// (see [`crate::stream::drain`]).
pub(crate) fn synchronize(s: &StreamRef) -> Result<()> {
    // SAFETY: `s` keeps its stream alive while borrowed (a `StreamRef` owns or borrows
    // it); the driver answers an error code for a context mismatch.
    unsafe { crate::stream::drain(s.as_raw()) }
}

/// Wraps a memory object so it can sit in a capture's keep-alive list.
#[derive(Debug)]
struct KeptMemory(#[allow(dead_code)] Arc<dyn BaseMemory>);

// The capture registry (below `memory`) sees memory objects through this.
impl crate::capture::Keepable for Arc<dyn BaseMemory> {
    #[inline]
    fn ptr(&self) -> u64 {
        BaseMemory::ptr(&**self)
    }
    #[inline]
    fn size(&self) -> usize {
        BaseMemory::size(&**self)
    }
    #[inline]
    fn identity(&self) -> usize {
        Arc::as_ptr(self).cast::<()>() as usize
    }
    fn keep(&self) -> Arc<dyn std::any::Any + Send + Sync> {
        Arc::new(KeptMemory(Arc::clone(self)))
    }
}

impl MemoryPointer {
    /// A pointer `offset` bytes into `mem` (`offset <= mem.size()`).
    pub fn new(mem: Arc<dyn BaseMemory>, offset: usize) -> Result<MemoryPointer> {
        if offset > mem.size() {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: offset as u64,
                    available: mem.size() as u64,
                },
                format!(
                    "offset {offset} is past the end of a memory of {} bytes",
                    mem.size()
                ),
            ));
        }
        let addr = mem.ptr() + offset as u64;
        Ok(MemoryPointer {
            mem: Some(mem),
            offset,
            addr,
        })
    }

    /// A pointer to the start of `mem`.
    #[inline]
    pub fn from_memory(mem: Arc<dyn BaseMemory>) -> MemoryPointer {
        let addr = mem.ptr();
        MemoryPointer {
            mem: Some(mem),
            offset: 0,
            addr,
        }
    }

    /// A pointer to the start of `mem`, whose address the caller already has
    /// (`addr == mem.ptr()`): no virtual call on the allocation hot paths.
    #[inline]
    pub(crate) fn from_memory_at(mem: Arc<dyn BaseMemory>, addr: u64) -> MemoryPointer {
        MemoryPointer {
            mem: Some(mem),
            offset: 0,
            addr,
        }
    }

    /// The null pointer of size 0 on `device` (what allocating 0 bytes gives).
    pub fn null(device: i32) -> MemoryPointer {
        MemoryPointer::from_memory(Arc::new(Memory::null(device)))
    }

    /// The address (`CUdeviceptr`): the memory's start plus the offset.
    #[inline]
    pub fn ptr(&self) -> u64 {
        self.addr
    }

    /// The address field itself: a launch passes the kernel a pointer to these 8 bytes
    /// (`KernelArg`, in `launch`), valid while `self` is borrowed.
    #[inline]
    pub(crate) fn addr_ref(&self) -> &u64 {
        &self.addr
    }

    /// The byte offset into the memory.
    #[inline]
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The bytes from this pointer to the end of its memory.
    #[inline]
    pub fn size(&self) -> usize {
        // A memory can shrink to 0 (an allocation of a graph capture that failed).
        self.m().size().saturating_sub(self.offset)
    }

    /// The device the memory belongs to.
    #[inline]
    pub fn device_id(&self) -> i32 {
        self.m().device_id()
    }

    /// The memory object this pointer keeps alive.
    pub fn mem(&self) -> &Arc<dyn BaseMemory> {
        self.m()
    }

    /// Marks the memory as used by work queued on `stream` (PyTorch's
    /// `Tensor.record_stream`): when its last pointer goes, the memory is not handed
    /// to anyone else before the work queued on `stream` up to then has completed.
    /// Call it when the memory, allocated on one stream, is used by another, instead
    /// of synchronising: for pool memory an event is recorded on each such stream at
    /// the free and the pool polls it (no host synchronisation in the steady state;
    /// see [`PoolStats::awaiting_blocks`](crate::memory::arena::PoolStats::awaiting_blocks)).
    /// Recording the stream the memory was allocated on does nothing; so does any
    /// stream for memory whose release waits for the device anyway (`cuMemFree`).
    /// The stream is kept alive until the free.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a stream of another device than the memory's.
    pub fn record_stream<S: AsStream + ?Sized>(&self, stream: &S) -> Result<()> {
        self.m().record_stream(&stream.as_stream_ref())
    }

    /// The memory object (a null one only while the pointer is being dropped).
    #[inline]
    pub(crate) fn m(&self) -> &Arc<dyn BaseMemory> {
        match &self.mem {
            Some(m) => m,
            None => gone(),
        }
    }

    /// The pointer `delta` bytes away; an error past either end of the memory.
    pub fn offset_by(&self, delta: isize) -> Result<MemoryPointer> {
        let off = self
            .offset
            .checked_add_signed(delta)
            .filter(|&o| o <= self.m().size())
            .ok_or_else(|| {
                Error::invalid_argument(
                    ArgumentKind::OutOfBounds {
                        requested: delta.unsigned_abs() as u64,
                        available: if delta < 0 { self.offset } else { self.size() } as u64,
                    },
                    format!(
                        "pointer arithmetic out of bounds: offset {} {} {} is outside the \
                         memory's 0..={} bytes",
                        self.offset,
                        if delta < 0 { '-' } else { '+' },
                        delta.unsigned_abs(),
                        self.m().size()
                    ),
                )
            })?;
        Ok(MemoryPointer {
            mem: Some(Arc::clone(self.m())),
            offset: off,
            addr: self.m().ptr() + off as u64,
        })
    }

    /// The pointer `n` bytes further; an error past the end.
    pub fn checked_add(&self, n: usize) -> Result<MemoryPointer> {
        let d = isize::try_from(n).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: n as u64,
                    available: self.size() as u64,
                },
                format!("pointer offset {n} is too large"),
            )
        })?;
        self.offset_by(d)
    }

    /// The pointer `n` bytes back; an error before the start.
    pub fn checked_sub(&self, n: usize) -> Result<MemoryPointer> {
        let d = isize::try_from(n).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: n as u64,
                    available: self.offset as u64,
                },
                format!("pointer offset {n} is too large"),
            )
        })?;
        self.offset_by(-d)
    }

    // -------------------------------------------------------------------------
    // Checks

    pub(crate) fn check_room(&self, what: &str, bytes: usize) -> Result<()> {
        if bytes > self.size() {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: bytes as u64,
                    available: self.size() as u64,
                },
                format!(
                    "{what}: {bytes} bytes do not fit: only {} bytes are left behind the pointer \
                     {:#x} (offset {} of a memory of {} bytes)",
                    self.size(),
                    self.ptr(),
                    self.offset,
                    self.m().size()
                ),
            ));
        }
        Ok(())
    }

    fn check_src_room(what: &str, src: &MemoryPointer, bytes: usize) -> Result<()> {
        if bytes > src.size() {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: bytes as u64,
                    available: src.size() as u64,
                },
                format!(
                    "{what}: the source has only {} bytes left behind {:#x}, {bytes} asked for",
                    src.size(),
                    src.ptr()
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn check_align(&self, what: &str, align: u64) -> Result<()> {
        if self.ptr() & (align - 1) != 0 {
            return Err(Error::invalid_argument(
                ArgumentKind::Misaligned {
                    address: self.ptr(),
                    alignment: align,
                },
                format!(
                    "{what}: the pointer {:#x} is not {align}-byte aligned",
                    self.ptr()
                ),
            ));
        }
        Ok(())
    }

    // -------------------------------------------------------------------------
    // Host -> device

    /// [`MemoryPointer::copy_from_host_async`] through the driver's own copy: what
    /// small or page-locked sources, and a thread that holds a capture, get (the staged
    /// path waits for each chunk).
    /// `pinned`: whether `src` is page-locked, which the caller has asked already.
    pub(crate) fn copy_from_host_async_direct<T: Pod>(
        &self,
        src: &[T],
        stream: Option<&dyn AsStream>,
        pinned: bool,
    ) -> Result<()> {
        let what = "copy_from_host_async";
        self.check_room(what, std::mem::size_of_val(src))?;
        if src.is_empty() || std::mem::size_of::<T>() == 0 {
            return Ok(());
        }
        let s = host_async_stream(what, stream)?;
        uses::check(Some(&s), &[self.m()])?;
        if pinned {
            refuse_own_capture(what)?;
        }
        // SAFETY: the bytes fit (`check_room`) in memory that `self`'s object keeps
        // alive while borrowed, and until `s` has passed the copy (`uses`). The driver
        // stages pageable `src` before it returns; page-locked `src` is waited for
        // below, so it stays borrowed until the copy has read it. `host_async_stream`
        // made `s`'s context current.
        unsafe { self.htod_uncaptured(what, as_bytes(src), &s) }?;
        if pinned {
            return synchronize(&s);
        }
        // The driver may write the device after this returns (a staged pageable copy):
        // the memory's free waits for `s`.
        uses::record(&s, &[self.m()]);
        Ok(())
    }

    // -------------------------------------------------------------------------
    // Device -> host

    /// [`MemoryPointer::copy_to_host_async`] through the driver's own copy (see
    /// [`MemoryPointer::copy_from_host_async_direct`]).
    /// `pinned`: whether `dst` is page-locked, which the caller has asked already.
    pub(crate) fn copy_to_host_async_direct<T: Pod>(
        &self,
        dst: &mut [T],
        stream: Option<&dyn AsStream>,
        pinned: bool,
    ) -> Result<()> {
        let what = "copy_to_host_async";
        self.check_room(what, std::mem::size_of_val(dst))?;
        if dst.is_empty() || std::mem::size_of::<T>() == 0 {
            return Ok(());
        }
        let s = host_async_stream(what, stream)?;
        uses::check(Some(&s), &[self.m()])?;
        if pinned {
            refuse_own_capture(what)?;
        }
        // SAFETY: the bytes fit (`check_room`) in memory that `self`'s object keeps
        // alive while borrowed. The driver completes a copy into pageable `dst` before
        // it returns; page-locked `dst` is waited for below, so it stays borrowed
        // mutably until the copy has written it; any bytes are valid for it (`Pod`).
        // `host_async_stream` made `s`'s context current.
        unsafe { self.dtoh_uncaptured(what, as_bytes_mut(dst), &s) }?;
        if pinned {
            synchronize(&s)?;
        }
        Ok(())
    }

    /// Queues the copy of `src` to this pointer on `s`, never into a capture
    /// ([`enqueue_uncaptured`](crate::capture::enqueue_uncaptured)): what a caller that
    /// waits for the copy, or whose `src` the driver stages before returning, queues.
    ///
    /// # Safety
    /// `src.len()` bytes fit behind this pointer; `src` stays borrowed until the copy
    /// has read it (the caller waits for `s`, or `src` is pageable); `s`'s context is
    /// current.
    pub(crate) unsafe fn htod_uncaptured(
        &self,
        what: &str,
        src: &[u8],
        s: &StreamRef,
    ) -> Result<()> {
        crate::capture::enqueue_uncaptured(s, what, || {
            // SAFETY: the caller's promise (see `# Safety`); the memory stays allocated
            // while `self` is borrowed, and `s` keeps its stream alive.
            Ok(unsafe {
                result::memory::memcpy_htod_async(
                    self.ptr(),
                    src.as_ptr().cast(),
                    src.len(),
                    s.as_raw(),
                )
            }?)
        })
    }

    /// Queues the copy of this pointer's first `dst.len()` bytes into `dst` on `s`,
    /// never into a capture (see [`htod_uncaptured`](Self::htod_uncaptured)).
    ///
    /// # Safety
    /// `dst.len()` bytes fit behind this pointer; `dst` stays borrowed mutably until
    /// the copy has written it (the caller waits for `s`, or `dst` is pageable, which
    /// the driver fills before returning); `s`'s context is current.
    pub(crate) unsafe fn dtoh_uncaptured(
        &self,
        what: &str,
        dst: &mut [u8],
        s: &StreamRef,
    ) -> Result<()> {
        let (ptr, len) = (dst.as_mut_ptr(), dst.len());
        crate::capture::enqueue_uncaptured(s, what, || {
            // SAFETY: the caller's promise (see `# Safety`); any bytes are valid `u8`s;
            // the memory stays allocated while `self` is borrowed, and `s` keeps its
            // stream alive.
            Ok(unsafe {
                result::memory::memcpy_dtoh_async(ptr.cast(), self.ptr(), len, s.as_raw())
            }?)
        })
    }

    // -------------------------------------------------------------------------
    // Device -> device

    /// Copies `size` bytes from `src` to this pointer, synchronously; across devices
    /// with `cuMemcpyPeer`. When the current stream is the legacy default stream this
    /// is CUDA's plain copy, which may return before the device has run it (queued on
    /// that stream, as [`memset`](Self::memset)); both frees wait for it.
    pub fn copy_from_device(&self, src: &MemoryPointer, size: usize) -> Result<()> {
        let what = "copy_from_device";
        self.check_room(what, size)?;
        Self::check_src_room(what, src, size)?;
        if size == 0 {
            return Ok(());
        }
        uses::check(None, &[self.m(), src.m()])?;
        match sync_via(what)? {
            SyncVia::Legacy => {
                make_current(self.device_id())?;
                self.d2d(src, size, None)
                    .map_err(|e| capture_error(what, e))?;
                // CUDA's plain device-to-device copy returns before the copy has run:
                // it is queued on the legacy default stream (of this pointer's device).
                // Both frees wait for that stream, as for `copy_from_device_async` on
                // it (blocks of that stream's own arena: one key compare each).
                let legacy = StreamRef::legacy_default(self.device_id());
                uses::record(&legacy, &[self.m(), src.m()]);
                Ok(())
            }
            SyncVia::Stream(s) => {
                // Not into a capture begun on `s` since `sync_via` asked: it would
                // copy at each launch of its graph, which keeps neither memory.
                crate::capture::enqueue_uncaptured(&s, what, || self.d2d(src, size, Some(&s)))?;
                synchronize(&s)
            }
        }
    }

    /// Copies `size` bytes from `src` to this pointer on `stream` (`None`: the current
    /// stream); across devices with `cuMemcpyPeerAsync`.
    pub fn copy_from_device_async(
        &self,
        src: &MemoryPointer,
        size: usize,
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        let what = "copy_from_device_async";
        self.check_room(what, size)?;
        Self::check_src_room(what, src, size)?;
        if size == 0 {
            return Ok(());
        }
        let s = stream_or_current(stream);
        make_current(s.device_id())?;
        let mems = [self.m(), src.m()];
        uses::check(Some(&s), &mems)?;
        uses::enqueue(&s, &mems, || self.d2d(src, size, Some(&s)))
    }

    /// Copies `size` bytes from this pointer to `dst`, synchronously.
    pub fn copy_to_device(&self, dst: &MemoryPointer, size: usize) -> Result<()> {
        dst.copy_from_device(self, size)
    }

    /// Copies `size` bytes (checked against both pointers' room by the caller) from
    /// `src`, on `stream` or synchronously; the caller made a context current.
    fn d2d(&self, src: &MemoryPointer, size: usize, stream: Option<&StreamRef>) -> Result<()> {
        let (dd, sd) = (self.device_id(), src.device_id());
        // SAFETY (every call below): both ranges are `size` bytes that fit behind their
        // pointers (the callers' `check_room`s), allocated as the "device ranges"
        // comment at the top of this file says; `s` keeps its stream alive while
        // borrowed, and the caller made a context current.
        if dd == sd {
            return Ok(match stream {
                None => unsafe { result::memory::memcpy_dtod(self.ptr(), src.ptr(), size) },
                Some(s) => unsafe {
                    result::memory::memcpy_dtod_async(self.ptr(), src.ptr(), size, s.as_raw())
                },
            }?);
        }
        // Both primary contexts are retained for the life of the process.
        let (dc, sc) = (primary(dd)?, primary(sd)?);
        Ok(match stream {
            None => unsafe { result::memory::memcpy_peer(self.ptr(), dc, src.ptr(), sc, size) },
            Some(s) => unsafe {
                result::memory::memcpy_peer_async(self.ptr(), dc, src.ptr(), sc, size, s.as_raw())
            },
        }?)
    }
}

impl Add<usize> for &MemoryPointer {
    type Output = Result<MemoryPointer>;
    /// `ptr + n`: [`MemoryPointer::checked_add`].
    fn add(self, n: usize) -> Result<MemoryPointer> {
        self.checked_add(n)
    }
}

impl Add<usize> for MemoryPointer {
    type Output = Result<MemoryPointer>;
    /// `ptr + n`: [`MemoryPointer::checked_add`].
    fn add(self, n: usize) -> Result<MemoryPointer> {
        self.checked_add(n)
    }
}

impl Sub<usize> for &MemoryPointer {
    type Output = Result<MemoryPointer>;
    /// `ptr - n`: [`MemoryPointer::checked_sub`].
    fn sub(self, n: usize) -> Result<MemoryPointer> {
        self.checked_sub(n)
    }
}

impl Sub<usize> for MemoryPointer {
    type Output = Result<MemoryPointer>;
    /// `ptr - n`: [`MemoryPointer::checked_sub`].
    fn sub(self, n: usize) -> Result<MemoryPointer> {
        self.checked_sub(n)
    }
}

pub(super) fn stream_or_current(stream: Option<&dyn AsStream>) -> StreamRef {
    match stream {
        Some(s) => s.as_stream_ref(),
        None => get_current_stream(),
    }
}

/// How a synchronous operation runs: the plain call when the current stream is the
/// legacy default stream, else queued on the current stream (refused while it
/// captures).
pub(crate) fn sync_via(what: &str) -> Result<SyncVia> {
    let s = get_current_stream();
    if s.handle() == LEGACY_DEFAULT_HANDLE {
        return Ok(SyncVia::Legacy);
    }
    make_current(s.device_id())?;
    if is_capturing(&s)? {
        return Err(Error::capture(
            CaptureKind::Refused,
            format!(
                "{what} is synchronous and the current stream ({:#x}) is capturing a graph; \
                 use the _async form (or end the capture first)",
                s.handle()
            ),
        ));
    }
    refuse_own_capture(what)?;
    Ok(SyncVia::Stream(s))
}

/// Refuses, before anything is queued, an operation that must wait for its work while
/// this thread holds a capture that refuses waits (global or thread-local mode): the
/// work would run on after the refused wait, on memory the caller takes back.
pub(crate) fn refuse_own_capture(what: &str) -> Result<()> {
    if crate::capture::this_thread_captures() {
        return Err(Error::capture(
            CaptureKind::Refused,
            format!(
                "{what} waits for its work, and this thread is capturing a graph in global \
                 or thread-local mode, which refuses waits; end the capture first (or \
                 capture in relaxed mode)"
            ),
        ));
    }
    Ok(())
}

/// The stream for an asynchronous host-slice copy, refusing a capturing stream (the
/// graph would read or write the borrowed slice when replayed, after the borrow).
pub(crate) fn host_async_stream(what: &str, stream: Option<&dyn AsStream>) -> Result<StreamRef> {
    let s = stream_or_current(stream);
    make_current(s.device_id())?;
    if s.handle() != LEGACY_DEFAULT_HANDLE && is_capturing(&s)? {
        return Err(Error::capture(
            CaptureKind::Refused,
            format!(
                "{what}: stream {:#x} is capturing a graph, and a graph cannot hold on to a \
                 borrowed host slice; copy from memory the graph owns instead",
                s.handle()
            ),
        ));
    }
    Ok(s)
}

/// A synchronous call that the driver refused because a capture is under way
/// (another stream capturing in global mode) becomes [`Error::Capture`].
pub(crate) fn capture_error(what: &str, e: Error) -> Error {
    if !e.driver_code().is_some_and(crate::error::is_capture_code) {
        return e;
    }
    // The one translator of capture errors, with the hint for synchronous copies.
    crate::error::explain_capture(
        e,
        &format!(
            "{what} is synchronous while a stream is capturing a graph (use the _async \
             form on the capturing stream)"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host-only memory for checks that run before any CUDA call (never accessed).
    #[derive(Debug)]
    struct Fake(usize);
    // SAFETY: only the bounds checks run on it: every test below fails or is a no-op
    // before a driver call, so the fake address is never accessed.
    unsafe impl BaseMemory for Fake {
        fn ptr(&self) -> u64 {
            0x1000
        }
        fn size(&self) -> usize {
            self.0
        }
        fn device_id(&self) -> i32 {
            0
        }
    }

    fn fake(size: usize) -> MemoryPointer {
        MemoryPointer::from_memory(Arc::new(Fake(size)))
    }

    #[test]
    fn arithmetic_moves_within_the_memory() {
        let p = fake(100);
        let q = (&p + 40).unwrap();
        assert_eq!(q.ptr(), 0x1000 + 40);
        assert_eq!(q.size(), 60);
        let r = (q.clone() - 40).unwrap();
        assert_eq!(r, p);
        assert_eq!(p.offset_by(100).unwrap().size(), 0);
        assert_eq!(q.offset_by(-40).unwrap().offset(), 0);
    }

    #[test]
    fn arithmetic_past_either_end_is_an_error() {
        let p = fake(100);
        let kind = |r: Result<MemoryPointer>| match r {
            Err(Error::InvalidArgument { kind, .. }) => Some(kind),
            _ => None,
        };
        let out = |requested, available| {
            Some(ArgumentKind::OutOfBounds {
                requested,
                available,
            })
        };
        assert_eq!(kind(&p + 101), out(101, 100));
        assert_eq!(kind(&p - 1), out(1, 0));
        assert_eq!(
            kind(p.offset_by(60).and_then(|q| q.offset_by(41))),
            out(41, 40)
        );
        assert!(p.offset_by(isize::MIN).is_err());
        assert!(p.checked_add(usize::MAX).is_err());
        let q = p.offset_by(60).unwrap();
        assert!(q.offset_by(41).is_err());
        assert!(q.offset_by(-61).is_err());
        assert!(MemoryPointer::new(Arc::new(Fake(8)), 9).is_err());
    }

    #[test]
    fn copies_past_the_end_fail_before_any_cuda_call() {
        let p = fake(16);
        let e = p.copy_from_host(&[0u32; 5]).unwrap_err();
        assert!(e.to_string().contains("20 bytes do not fit"), "{e}");
        assert!(p.copy_to_host(&mut [0u64; 3]).is_err());
        assert!(p.copy_from_host_async(&[0u8; 17], None).is_err());
        assert!(p.copy_to_host_async(&mut [0u8; 17], None).is_err());
        let q = p.offset_by(8).unwrap();
        assert!(q.copy_from_host(&[0u8; 9]).is_err());
        let src = fake(4);
        let e = p.copy_from_device(&src, 5).unwrap_err();
        assert!(e.to_string().contains("source has only 4 bytes"), "{e}");
        assert!(src.copy_from_device(&p, 5).is_err());
        assert!(p.copy_from_device_async(&src, 8, None).is_err());
        assert!(p.memset(0, 17).is_err());
        assert!(p.memset_u16(0, 9).is_err());
        assert!(p.memset_u32_async(0, 5, None).is_err());
        assert!(p.memset_u32(0, usize::MAX).is_err());
    }

    crate::gpu_test!(only_plain_pageable_memory_is_left_unwaited, {
        // Asked on a thread with no context current yet: the answer is the same.
        let pageable = vec![7u8; 1 << 20];
        let fresh = std::thread::scope(|s| s.spawn(|| is_page_locked(&pageable, 0)).join());
        assert!(!fresh.unwrap(), "pageable memory is staged by the driver");
        assert!(!is_page_locked(&pageable, 0));
        let pinned = crate::pinned::alloc_pinned_memory(4096).unwrap();
        assert!(is_page_locked(pinned.as_slice().unwrap(), 0));
        make_current(0).unwrap();
        let global = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL.0;
        let managed = result::memory::alloc_managed(4096, global).unwrap();
        // SAFETY: 4096 bytes of managed memory, readable on the host, not written while
        // the slice lives (nothing runs on the device), freed after it.
        let m = unsafe { std::slice::from_raw_parts(managed as *const u8, 4096) };
        assert!(
            is_page_locked(m, 0),
            "a copy of managed memory runs after the call"
        );
        // SAFETY: allocated above, freed once, no slice of it left.
        unsafe { result::memory::free(managed) }.unwrap();
    });

    crate::gpu_test!(sync_copies_are_refused_while_the_current_stream_captures, {
        let p = crate::memory::alloc(1024).unwrap();
        let stream = crate::Stream::new().unwrap();
        let prev = crate::stream::set_current_stream(stream.as_stream_ref()).unwrap();
        // SAFETY: `stream` is alive for the whole test.
        unsafe {
            result::stream::begin_capture(
                stream.as_raw(),
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        }
        .unwrap();
        let host = [1u8; 16];
        let mut back = [0u8; 16];
        let errors = [
            p.copy_from_host(&host).unwrap_err(),
            p.copy_to_host(&mut back).unwrap_err(),
            p.copy_from_device(&p.offset_by(512).unwrap(), 16)
                .unwrap_err(),
            p.memset(0, 16).unwrap_err(),
            // a borrowed host slice cannot be captured either
            p.copy_from_host_async(&host, None).unwrap_err(),
        ];
        // device-only async work is captured normally
        p.memset_async(0, 16, None).unwrap();
        let mut graph = std::ptr::null_mut();
        // SAFETY: `stream` is alive and capturing; the graph it hands back is destroyed
        // once, just after.
        let ended = unsafe { result::stream::end_capture(stream.as_raw(), &mut graph) };
        if !graph.is_null() {
            // SAFETY: the captured graph, ours, destroyed once.
            unsafe { result::graph::destroy(graph) }.unwrap();
        }
        ended.unwrap();
        crate::stream::set_current_stream(prev).unwrap();
        for e in errors {
            assert!(
                matches!(
                    e,
                    Error::Capture {
                        kind: CaptureKind::Refused,
                        ..
                    }
                ),
                "{e}"
            );
            assert!(e.to_string().contains("capturing a graph"), "{e}");
        }
        // after the capture, the same copies work
        p.copy_from_host(&host).unwrap();
        p.copy_to_host(&mut back).unwrap();
        assert_eq!(back, host);
    });

    crate::gpu_test!(sync_copies_follow_a_non_default_current_stream, {
        let p = crate::memory::alloc(1 << 20).unwrap();
        let stream = crate::Stream::with_options(true, 0).unwrap();
        let prev = crate::stream::set_current_stream(stream.as_stream_ref()).unwrap();
        // queued on the non-blocking current stream, then a synchronous read: it must
        // see the memset.
        p.memset_async(0x11, 1 << 20, None).unwrap();
        let mut back = vec![0u8; 1 << 20];
        p.copy_to_host(&mut back).unwrap();
        crate::stream::set_current_stream(prev).unwrap();
        assert!(back.iter().all(|&b| b == 0x11));
    });

    #[test]
    fn size_zero_operations_are_no_ops() {
        let p = fake(0);
        p.copy_from_host::<f32>(&[]).unwrap();
        p.copy_to_host::<u8>(&mut []).unwrap();
        p.copy_from_host_async::<u8>(&[], None).unwrap();
        p.copy_to_host_async::<u8>(&mut [], None).unwrap();
        p.copy_from_device(&fake(0), 0).unwrap();
        p.copy_from_device_async(&fake(0), 0, None).unwrap();
        p.memset(1, 0).unwrap();
        p.memset_u32_async(1, 0, None).unwrap();
        let n = MemoryPointer::null(0);
        assert_eq!((n.ptr(), n.size()), (0, 0));
        n.copy_from_host::<u8>(&[]).unwrap();
    }
}
