//! [`DeviceBuffer`]: owning, typed device memory.

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use super::{
    byte_len, on_stream, range_of, AsDeviceSlice, DeviceSlice, DeviceSliceMut, PinnedBuffer,
    Transfer, MAX_ALIGN,
};
use crate::error::{ArgumentKind, Error, Result};
use crate::memory::{MemoryPointer, Pod};
use crate::stream::AsStream;

/// `len` elements of `T` in device memory, owned: allocated from the current
/// allocator ([`alloc`](crate::memory::alloc): the device's memory pool unless
/// [`set_allocator`](crate::memory::set_allocator) chose another) on the current
/// device, and given back when the buffer drops.
///
/// Lengths are in elements. Views ([`slice`](Self::slice),
/// [`slice_mut`](Self::slice_mut), [`split_at_mut`](Self::split_at_mut)) borrow the
/// buffer; the untyped [`MemoryPointer`] is [`as_pointer`](Self::as_pointer). A buffer
/// is a kernel argument: a `T*` to its first element.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::buffer::DeviceBuffer;
/// let host: Vec<u32> = (0..1024).collect();
/// let mut b = DeviceBuffer::from_slice(&host)?; // allocated from the pool, copied in
/// b.slice_mut(..512)?.fill(7)?;
/// let v = b.to_vec()?; // copied back, complete on return
/// assert_eq!((v[0], v[511], v[512]), (7, 7, 512));
/// let z = DeviceBuffer::<f64>::zeros(100)?;
/// assert_eq!(z.to_vec()?, vec![0.0; 100]);
/// # Ok(()) }
/// ```
pub struct DeviceBuffer<T: Pod> {
    mem: MemoryPointer,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("addr", &format_args!("{:#x}", self.mem.ptr()))
            .field("len", &self.len)
            .field("device", &self.mem.device_id())
            .finish()
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// `len` elements whose values are unspecified (whatever the memory held: CuPy's
    /// `empty`). Reading them is safe; every bit pattern is a `T`. The memory hooks
    /// see the caller's line as the allocation's site (as for [`alloc`]).
    ///
    /// [`alloc`]: crate::memory::alloc
    #[track_caller]
    #[inline]
    pub fn empty(len: usize) -> Result<Self> {
        let bytes = byte_len::<T>("DeviceBuffer::empty", len)?;
        let mem = crate::memory::alloc(bytes)?;
        Ok(DeviceBuffer {
            mem,
            len,
            _t: PhantomData,
        })
    }

    /// `len` elements, all bytes zero.
    #[track_caller]
    pub fn zeros(len: usize) -> Result<Self> {
        let mut b = Self::empty(len)?;
        b.memset(0)?;
        Ok(b)
    }

    /// A copy of `src` (complete when this returns).
    #[track_caller]
    pub fn from_slice(src: &[T]) -> Result<Self> {
        let mut b = Self::empty(src.len())?;
        b.copy_from_host(src)?;
        Ok(b)
    }

    /// [`empty`](Self::empty) on `stream`'s device, from its arena: the memory is
    /// ready for work queued on `stream` (and, like any pool memory, on others once
    /// they are ordered after it).
    #[track_caller]
    pub fn empty_on(len: usize, stream: &(impl AsStream + ?Sized)) -> Result<Self> {
        on_stream("DeviceBuffer::empty_on", None, stream, || Self::empty(len))
    }

    /// [`zeros`](Self::zeros) on `stream` (see [`empty_on`](Self::empty_on)); the
    /// bytes are zero when this returns.
    #[track_caller]
    pub fn zeros_on(len: usize, stream: &(impl AsStream + ?Sized)) -> Result<Self> {
        on_stream("DeviceBuffer::zeros_on", None, stream, || Self::zeros(len))
    }

    /// [`from_slice`](Self::from_slice) on `stream` (see [`empty_on`](Self::empty_on));
    /// complete when this returns.
    ///
    /// ```no_run
    /// use cuda_rt::{buffer::DeviceBuffer, Stream};
    /// let stream = Stream::new()?;
    /// let b = DeviceBuffer::from_slice_on(&[1u32, 2, 3], &stream)?;
    /// assert_eq!(b.to_vec_on(&stream)?, [1, 2, 3]);
    /// # Ok::<(), cuda_rt::Error>(())
    /// ```
    #[track_caller]
    pub fn from_slice_on(src: &[T], stream: &(impl AsStream + ?Sized)) -> Result<Self> {
        on_stream("DeviceBuffer::from_slice_on", None, stream, || {
            Self::from_slice(src)
        })
    }

    /// `len` elements at the start of `mem`, taken over (CuPy code's untyped memory,
    /// typed). `mem` must have room for them and be aligned for `T`.
    pub fn from_pointer(mem: MemoryPointer, len: usize) -> Result<Self> {
        let what = "DeviceBuffer::from_pointer";
        let bytes = byte_len::<T>(what, len)?;
        if bytes > mem.size() {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: bytes as u64,
                    available: mem.size() as u64,
                },
                format!(
                    "{what}: {len} elements of {} take {bytes} bytes, but only {} are left \
                     behind the pointer {:#x}",
                    std::any::type_name::<T>(),
                    mem.size(),
                    mem.ptr()
                ),
            ));
        }
        let align = std::mem::align_of::<T>().min(MAX_ALIGN) as u64;
        if bytes != 0 && !mem.ptr().is_multiple_of(align) {
            return Err(Error::invalid_argument(
                ArgumentKind::Misaligned {
                    address: mem.ptr(),
                    alignment: align,
                },
                format!(
                    "{what}: the pointer {:#x} is not aligned for {} ({align} bytes)",
                    mem.ptr(),
                    std::any::type_name::<T>()
                ),
            ));
        }
        Ok(DeviceBuffer {
            mem,
            len,
            _t: PhantomData,
        })
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer has no elements.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    pub fn device_id(&self) -> i32 {
        self.mem.device_id()
    }

    /// The device address of the first element.
    #[inline]
    pub fn device_ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// The untyped pointer to the first element (clone it to keep the memory alive
    /// past the buffer).
    #[inline]
    pub fn as_pointer(&self) -> &MemoryPointer {
        &self.mem
    }

    /// The untyped pointer, giving up the type.
    pub fn into_pointer(self) -> MemoryPointer {
        self.mem
    }

    /// Marks the buffer's memory as used by work queued on `stream`, so that once it
    /// is freed it is not reused before that work has completed (see
    /// [`MemoryPointer::record_stream`]).
    pub fn record_stream<S: AsStream + ?Sized>(&self, stream: &S) -> Result<()> {
        self.mem.record_stream(stream)
    }

    /// The whole buffer as a shared view.
    #[inline]
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::new(&self.mem, 0, self.len)
    }

    /// The whole buffer as an exclusive view.
    #[inline]
    pub fn as_mut_slice(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::new(&self.mem, 0, self.len)
    }

    /// The elements in `range`.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'_, T>> {
        let (s, e) = range_of::<T>("DeviceBuffer::slice", range, self.len)?;
        Ok(DeviceSlice::new(&self.mem, s, e - s))
    }

    /// The elements in `range`, exclusively.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let (s, e) = range_of::<T>("DeviceBuffer::slice_mut", range, self.len)?;
        Ok(DeviceSliceMut::new(&self.mem, s, e - s))
    }

    /// The buffer cut in two shared views at element `mid`.
    pub fn split_at(&self, mid: usize) -> Result<(DeviceSlice<'_, T>, DeviceSlice<'_, T>)> {
        self.as_slice().split_at(mid)
    }

    /// The buffer cut in two exclusive views at element `mid`.
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'_, T>, DeviceSliceMut<'_, T>)> {
        self.as_mut_slice().split_at_mut(mid)
    }

    /// The elements, copied to a new `Vec` (complete when this returns). See
    /// [`DeviceSlice::to_vec`] for its rate, set by the new `Vec`'s fresh pages: to
    /// copy out again and again, keep a `Vec` and use [`copy_to_host`](Self::copy_to_host).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }

    /// Copies the elements into `dst` (as many), synchronously.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        self.as_slice().copy_to_host(dst)
    }

    /// Copies `src` (as many elements) into the buffer, complete on return.
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        self.as_mut_slice().copy_from_host(src)
    }

    /// [`to_vec`](Self::to_vec) ordered on `stream` (of the buffer's device) instead of
    /// the current stream; complete when this returns.
    pub fn to_vec_on(&self, stream: &(impl AsStream + ?Sized)) -> Result<Vec<T>> {
        self.as_slice().to_vec_on(stream)
    }

    /// [`copy_to_host`](Self::copy_to_host) ordered on `stream`; complete when this
    /// returns.
    pub fn copy_to_host_on(&self, dst: &mut [T], stream: &(impl AsStream + ?Sized)) -> Result<()> {
        self.as_slice().copy_to_host_on(dst, stream)
    }

    /// [`copy_from_host`](Self::copy_from_host) ordered on `stream`; complete when
    /// this returns.
    pub fn copy_from_host_on(
        &mut self,
        src: &[T],
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        self.as_mut_slice().copy_from_host_on(src, stream)
    }

    /// [`fill`](Self::fill) ordered on `stream`; complete when this returns.
    pub fn fill_on(&mut self, value: T, stream: &(impl AsStream + ?Sized)) -> Result<()> {
        self.as_mut_slice().fill_on(value, stream)
    }

    /// Copies `src` (as many elements, on any device) into the buffer, complete on
    /// return.
    pub fn copy_from(&mut self, src: &(impl AsDeviceSlice<T> + ?Sized)) -> Result<()> {
        self.as_mut_slice().copy_from(src)
    }

    /// Copies the buffer into `dst` (as many elements, on any device), complete on
    /// return.
    pub fn copy_to(&self, dst: &mut DeviceBuffer<T>) -> Result<()> {
        dst.copy_from(self)
    }

    /// Queues a copy of `src` into the buffer on `stream`, returning at once (see
    /// [`DeviceSliceMut::copy_from_pinned_async`]).
    pub fn copy_from_pinned_async<'p>(
        &mut self,
        src: &'p PinnedBuffer<T>,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<Transfer<'p>> {
        self.as_mut_slice().copy_from_pinned_async(src, stream)
    }

    /// Queues a copy of the buffer into `dst` on `stream`, returning at once (see
    /// [`DeviceSlice::copy_to_pinned_async`]).
    pub fn copy_to_pinned_async<'p>(
        &self,
        dst: &'p mut PinnedBuffer<T>,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<Transfer<'p>> {
        self.as_slice().copy_to_pinned_async(dst, stream)
    }

    /// Queues a copy of `src` (as many elements, on any device) into the buffer on
    /// `stream` (see [`DeviceSliceMut::copy_from_async`]).
    pub fn copy_from_async(
        &mut self,
        src: &(impl AsDeviceSlice<T> + ?Sized),
        stream: &impl AsStream,
    ) -> Result<()> {
        self.as_mut_slice().copy_from_async(src, stream)
    }

    /// Sets every element to `value`, complete on return (see
    /// [`DeviceSliceMut::fill`]).
    pub fn fill(&mut self, value: T) -> Result<()> {
        self.as_mut_slice().fill(value)
    }

    /// Queues the setting of every element to `value` on `stream` (see
    /// [`DeviceSliceMut::fill_async`]).
    pub fn fill_async(&mut self, value: T, stream: &impl AsStream) -> Result<()> {
        self.as_mut_slice().fill_async(value, stream)
    }

    /// Sets every byte to `value`, complete on return.
    pub fn memset(&mut self, value: u8) -> Result<()> {
        self.as_mut_slice().memset(value)
    }

    /// Queues the setting of every byte to `value` on `stream`.
    pub fn memset_async(&mut self, value: u8, stream: &impl AsStream) -> Result<()> {
        self.as_mut_slice().memset_async(value, stream)
    }
}

impl<T: Pod> AsDeviceSlice<T> for DeviceBuffer<T> {
    fn as_device_slice(&self) -> DeviceSlice<'_, T> {
        self.as_slice()
    }
}

// SAFETY: the buffer's pointer's own address field (see `MemoryPointer`'s impl), 8
// readable bytes laid out as the kernel's `T*` parameter, valid while `self` is
// borrowed.
unsafe impl<T: Pod> crate::launch::KernelArg for DeviceBuffer<T> {
    #[inline]
    fn param_ptr(&self) -> *mut std::ffi::c_void {
        crate::launch::KernelArg::param_ptr(&self.mem)
    }
    #[inline]
    fn param_size(&self) -> usize {
        crate::launch::KernelArg::param_size(&self.mem)
    }
}
