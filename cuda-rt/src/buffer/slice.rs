//! Borrowed views of a range of a [`DeviceBuffer`](super::DeviceBuffer): shared
//! ([`DeviceSlice`]) and exclusive ([`DeviceSliceMut`]), lengths in elements.

use std::fmt;
use std::marker::PhantomData;
use std::ops::RangeBounds;

use super::{byte_len, on_stream, range_of, same_len, zeroed_vec, PinnedBuffer, Transfer};
use crate::error::Result;
use crate::memory::pod::as_bytes;
use crate::memory::{MemoryPointer, Pod};
use crate::stream::{get_current_stream, AsStream};

/// Anything that can be read as a [`DeviceSlice`]: buffers and both kinds of view.
pub trait AsDeviceSlice<T: Pod> {
    /// The whole of `self` as a shared view.
    fn as_device_slice(&self) -> DeviceSlice<'_, T>;
}

/// A shared view of `len` elements of device memory, borrowed from a
/// [`DeviceBuffer`](super::DeviceBuffer). `Copy`; a kernel argument (its device
/// address).
pub struct DeviceSlice<'a, T: Pod> {
    /// The buffer's pointer (to its first element), which keeps the memory alive.
    base: &'a MemoryPointer,
    /// The device address of the view's first element (a kernel takes its bytes).
    addr: u64,
    /// The view's first element, counted from the buffer's first.
    start: usize,
    len: usize,
    _t: PhantomData<&'a [T]>,
}

/// An exclusive view of `len` elements of device memory, borrowed mutably from a
/// [`DeviceBuffer`](super::DeviceBuffer): what copies into device memory take. A
/// kernel argument (its device address).
pub struct DeviceSliceMut<'a, T: Pod> {
    base: &'a MemoryPointer,
    addr: u64,
    start: usize,
    len: usize,
    _t: PhantomData<&'a mut [T]>,
}

impl<T: Pod> Clone for DeviceSlice<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T: Pod> Copy for DeviceSlice<'_, T> {}

impl<T: Pod> fmt::Debug for DeviceSlice<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug(f, "DeviceSlice", self.addr, self.len, self.base.device_id())
    }
}

impl<T: Pod> fmt::Debug for DeviceSliceMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        debug(
            f,
            "DeviceSliceMut",
            self.addr,
            self.len,
            self.base.device_id(),
        )
    }
}

fn debug(f: &mut fmt::Formatter<'_>, name: &str, addr: u64, len: usize, dev: i32) -> fmt::Result {
    f.debug_struct(name)
        .field("addr", &format_args!("{addr:#x}"))
        .field("len", &len)
        .field("device", &dev)
        .finish()
}

impl<'a, T: Pod> DeviceSlice<'a, T> {
    /// A view of elements `start..start + len` of the buffer whose pointer is `base`;
    /// the caller has checked the range against the buffer's length.
    pub(crate) fn new(base: &'a MemoryPointer, start: usize, len: usize) -> Self {
        DeviceSlice {
            base,
            addr: element_addr::<T>(base, start),
            start,
            len,
            _t: PhantomData,
        }
    }

    /// The untyped pointer to the first element (it keeps the memory alive; its
    /// [`size`](MemoryPointer::size) runs to the end of the allocation, which may be
    /// past the view).
    pub fn as_pointer(&self) -> Result<MemoryPointer> {
        pointer_at::<T>(self.base, self.start)
    }

    /// The elements in `range` (indices relative to this view).
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceSlice<'a, T>> {
        let (s, e) = range_of::<T>("DeviceSlice::slice", range, self.len)?;
        Ok(DeviceSlice::new(self.base, self.start + s, e - s))
    }

    /// The view cut in two at element `mid`.
    pub fn split_at(&self, mid: usize) -> Result<(DeviceSlice<'a, T>, DeviceSlice<'a, T>)> {
        Ok((self.slice(..mid)?, self.slice(mid..)?))
    }

    /// The elements, copied to a new `Vec` (complete when this returns).
    ///
    /// A new `Vec` of many MiB is fresh memory from the operating system: the copy
    /// that fills it also takes its page faults, and the kernel zeroes each page
    /// first, so a large `to_vec` runs at the rate the host makes fresh pages (asked
    /// for as transparent huge pages; measured 11-17 GB/s for 256 MiB on the lent
    /// H100's host, against 55 GB/s for the DMA engine), not at the rate of the copy.
    /// To copy a large buffer out again and again, keep one `Vec` and use
    /// [`copy_to_host`](Self::copy_to_host): its pages are faulted in once, and the
    /// later copies run at the staged rate (0.9 or more of the pinned DMA rate).
    pub fn to_vec(&self) -> Result<Vec<T>> {
        let mut v = zeroed_vec::<T>(self.len);
        self.copy_to_host(&mut v)?;
        Ok(v)
    }

    /// Copies the elements into `dst`, which holds as many, synchronously. Large
    /// pageable destinations are staged through pinned memory by several threads;
    /// the copy is complete when this returns.
    pub fn copy_to_host(&self, dst: &mut [T]) -> Result<()> {
        same_len("DeviceSlice::copy_to_host", dst.len(), self.len)?;
        if byte_len::<T>("DeviceSlice::copy_to_host", self.len)? == 0 {
            return Ok(());
        }
        self.as_pointer()?.copy_to_host(dst)
    }

    /// [`to_vec`](Self::to_vec) ordered on `stream` (of this memory's device) instead
    /// of the current stream; complete when this returns.
    pub fn to_vec_on(&self, stream: &(impl AsStream + ?Sized)) -> Result<Vec<T>> {
        let d = self.device_id();
        on_stream("DeviceSlice::to_vec_on", Some(d), stream, || self.to_vec())
    }

    /// [`copy_to_host`](Self::copy_to_host) ordered on `stream` (of this memory's
    /// device); complete when this returns.
    pub fn copy_to_host_on(&self, dst: &mut [T], stream: &(impl AsStream + ?Sized)) -> Result<()> {
        let d = self.device_id();
        on_stream("DeviceSlice::copy_to_host_on", Some(d), stream, || {
            self.copy_to_host(dst)
        })
    }

    /// Queues a copy of the elements into `dst` (as many elements) on `stream` and
    /// returns at once; see [`Transfer`] for what stays borrowed and alive.
    ///
    /// The device memory is held until the copy has finished, so dropping the buffer
    /// right after this call is fine. A stream that is capturing a graph is refused.
    pub fn copy_to_pinned_async<'p>(
        &self,
        dst: &'p mut PinnedBuffer<T>,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<Transfer<'p>> {
        let what = "DeviceSlice::copy_to_pinned_async";
        same_len(what, dst.len(), self.len)?;
        if byte_len::<T>(what, self.len)? != 0 {
            let src = self.as_pointer()?;
            dst.pointer_mut().copy_from_device_async(&src, stream)?;
        }
        Ok(Transfer::new(dst.pointer()))
    }
}

impl<'a, T: Pod> DeviceSliceMut<'a, T> {
    /// An exclusive view of elements `start..start + len` of the buffer whose pointer
    /// is `base`; the caller has checked the range and holds the buffer exclusively.
    pub(crate) fn new(base: &'a MemoryPointer, start: usize, len: usize) -> Self {
        DeviceSliceMut {
            base,
            addr: element_addr::<T>(base, start),
            start,
            len,
            _t: PhantomData,
        }
    }

    /// The view, shared: every read-only method of [`DeviceSlice`].
    #[inline]
    pub fn as_slice(&self) -> DeviceSlice<'_, T> {
        DeviceSlice::new(self.base, self.start, self.len)
    }

    /// A shorter exclusive borrow of the same elements.
    pub fn reborrow(&mut self) -> DeviceSliceMut<'_, T> {
        DeviceSliceMut::new(self.base, self.start, self.len)
    }

    /// The elements in `range` (relative to this view), exclusively.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceSliceMut<'_, T>> {
        let (s, e) = range_of::<T>("DeviceSliceMut::slice_mut", range, self.len)?;
        Ok(DeviceSliceMut::new(self.base, self.start + s, e - s))
    }

    /// The view cut in two exclusive halves at element `mid`.
    pub fn split_at_mut(
        self,
        mid: usize,
    ) -> Result<(DeviceSliceMut<'a, T>, DeviceSliceMut<'a, T>)> {
        let (_, mid) = range_of::<T>("DeviceSliceMut::split_at_mut", ..mid, self.len)?;
        let left = DeviceSliceMut::new(self.base, self.start, mid);
        let right = DeviceSliceMut::new(self.base, self.start + mid, self.len - mid);
        Ok((left, right))
    }

    /// The elements, copied to a new `Vec` (complete when this returns). See
    /// [`DeviceSlice::to_vec`] for its rate, set by the new `Vec`'s fresh pages.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        self.as_slice().to_vec()
    }

    /// Copies `src`, which holds as many elements, into the view. Complete when this
    /// returns, for every stream: large pageable sources are staged through pinned
    /// memory by several threads, and the current stream is waited for (the driver's
    /// own copy from pageable memory may return before the data has landed).
    pub fn copy_from_host(&mut self, src: &[T]) -> Result<()> {
        same_len("DeviceSliceMut::copy_from_host", self.len, src.len())?;
        if byte_len::<T>("DeviceSliceMut::copy_from_host", self.len)? == 0 {
            return Ok(());
        }
        self.pointer()?.copy_from_host(src)?;
        get_current_stream().synchronize()
    }

    /// [`to_vec`](Self::to_vec) ordered on `stream`; complete when this returns.
    pub fn to_vec_on(&self, stream: &(impl AsStream + ?Sized)) -> Result<Vec<T>> {
        self.as_slice().to_vec_on(stream)
    }

    /// [`copy_from_host`](Self::copy_from_host) ordered on `stream` (of this memory's
    /// device) instead of the current stream; complete when this returns.
    pub fn copy_from_host_on(
        &mut self,
        src: &[T],
        stream: &(impl AsStream + ?Sized),
    ) -> Result<()> {
        let d = self.device_id();
        on_stream("DeviceSliceMut::copy_from_host_on", Some(d), stream, || {
            self.copy_from_host(src)
        })
    }

    /// [`fill`](Self::fill) ordered on `stream` (of this memory's device); complete
    /// when this returns.
    pub fn fill_on(&mut self, value: T, stream: &(impl AsStream + ?Sized)) -> Result<()> {
        let d = self.device_id();
        on_stream("DeviceSliceMut::fill_on", Some(d), stream, || {
            self.fill(value)
        })
    }

    /// Copies the elements of `src` (as many; on this device or another, through
    /// peer copies) into the view on the current stream, and waits for it: complete
    /// when this returns.
    pub fn copy_from(&mut self, src: &(impl AsDeviceSlice<T> + ?Sized)) -> Result<()> {
        let s = get_current_stream();
        self.copy_from_async(src, &s)?;
        s.synchronize()
    }

    /// Queues a copy of the elements of `src` (as many; on any device) into the view
    /// on `stream`: ordered with the stream's other work, not waited for.
    pub fn copy_from_async(
        &mut self,
        src: &(impl AsDeviceSlice<T> + ?Sized),
        stream: &impl AsStream,
    ) -> Result<()> {
        let src = src.as_device_slice();
        let bytes = byte_len::<T>("DeviceSliceMut::copy_from_async", self.len)?;
        same_len("DeviceSliceMut::copy_from_async", self.len, src.len())?;
        if bytes == 0 {
            return Ok(());
        }
        self.pointer()?
            .copy_from_device_async(&src.as_pointer()?, bytes, Some(stream))
    }

    /// Queues a copy of `src` (as many elements) into the view on `stream` and
    /// returns at once; see [`Transfer`] for what stays borrowed and alive.
    ///
    /// The device memory is held until the copy has finished, so dropping the buffer
    /// right after this call is fine. A stream that is capturing a graph is refused.
    pub fn copy_from_pinned_async<'p>(
        &mut self,
        src: &'p PinnedBuffer<T>,
        stream: &(impl AsStream + ?Sized),
    ) -> Result<Transfer<'p>> {
        let what = "DeviceSliceMut::copy_from_pinned_async";
        same_len(what, self.len, src.len())?;
        if byte_len::<T>(what, self.len)? != 0 {
            let dst = self.pointer()?;
            src.pointer().copy_to_device_async(&dst, stream)?;
        }
        Ok(Transfer::new(src.pointer()))
    }

    /// Sets every element to `value` on the current stream, and waits for it:
    /// complete when this returns (see [`fill_async`](Self::fill_async) for how).
    pub fn fill(&mut self, value: T) -> Result<()> {
        let s = get_current_stream();
        self.fill_async(value, &s)?;
        s.synchronize()
    }

    /// Queues, on `stream`, the setting of every element to `value`: one memset when
    /// the value's bytes repeat with a period of 1, 2 or 4 bytes, otherwise one copy of
    /// the value (staged by the driver before this returns) and device copies doubling
    /// the filled prefix (about log2(len) of them).
    pub fn fill_async(&mut self, value: T, stream: &impl AsStream) -> Result<()> {
        let bytes = byte_len::<T>("DeviceSliceMut::fill_async", self.len)?;
        if bytes == 0 {
            return Ok(());
        }
        let v = as_bytes(std::slice::from_ref(&value));
        let p = self.pointer()?;
        let s: Option<&dyn AsStream> = Some(stream);
        match memset_period(v) {
            Some(Period::One(b)) => p.memset_async(b, bytes, s),
            Some(Period::Two(w)) => p.memset_u16_async(w, bytes / 2, s),
            Some(Period::Four(w)) => p.memset_u32_async(w, bytes / 4, s),
            None => {
                p.copy_from_host_async(v, s)?;
                let mut done = v.len();
                while done < bytes {
                    let n = done.min(bytes - done);
                    p.checked_add(done)?.copy_from_device_async(&p, n, s)?;
                    done += n;
                }
                Ok(())
            }
        }
    }

    /// Sets every byte of the view to `value` on the current stream, and waits for
    /// it: complete when this returns.
    pub fn memset(&mut self, value: u8) -> Result<()> {
        let s = get_current_stream();
        self.memset_async(value, &s)?;
        s.synchronize()
    }

    /// Queues, on `stream`, the setting of every byte of the view to `value`.
    pub fn memset_async(&mut self, value: u8, stream: &impl AsStream) -> Result<()> {
        let bytes = byte_len::<T>("DeviceSliceMut::memset_async", self.len)?;
        if bytes == 0 {
            return Ok(());
        }
        self.pointer()?.memset_async(value, bytes, Some(stream))
    }

    fn pointer(&self) -> Result<MemoryPointer> {
        pointer_at::<T>(self.base, self.start)
    }
}

/// The shortest memset that writes a value's bytes.
#[derive(Debug, PartialEq, Eq)]
enum Period {
    One(u8),
    Two(u16),
    Four(u32),
}

/// `Some` when `v` is one byte, word or double word repeated (so a memset of that
/// width writes it), `None` otherwise.
fn memset_period(v: &[u8]) -> Option<Period> {
    let repeats = |p: usize| v.len().is_multiple_of(p) && v.chunks(p).all(|c| c == &v[..p]);
    if repeats(1) {
        Some(Period::One(v[0]))
    } else if repeats(2) {
        Some(Period::Two(u16::from_ne_bytes([v[0], v[1]])))
    } else if repeats(4) {
        Some(Period::Four(u32::from_ne_bytes([v[0], v[1], v[2], v[3]])))
    } else {
        None
    }
}

/// The device address of element `start` of the buffer at `base`.
fn element_addr<T>(base: &MemoryPointer, start: usize) -> u64 {
    // The view's range was checked against the buffer, whose bytes fit in a usize.
    base.ptr() + (start * std::mem::size_of::<T>()) as u64
}

/// The untyped pointer to element `start` of the buffer at `base`.
fn pointer_at<T>(base: &MemoryPointer, start: usize) -> Result<MemoryPointer> {
    match start * std::mem::size_of::<T>() {
        0 => Ok(base.clone()),
        off => base.checked_add(off),
    }
}

impl<T: Pod> AsDeviceSlice<T> for DeviceSlice<'_, T> {
    fn as_device_slice(&self) -> DeviceSlice<'_, T> {
        *self
    }
}

impl<T: Pod> AsDeviceSlice<T> for DeviceSliceMut<'_, T> {
    fn as_device_slice(&self) -> DeviceSlice<'_, T> {
        self.as_slice()
    }
}

/// What both views have alike: their length, device and address, and their use as a
/// kernel argument (the address of their first element).
macro_rules! view_common {
    ($($view:ident),*) => {$(
        impl<T: Pod> $view<'_, T> {
            /// Number of elements.
            #[inline]
            pub fn len(&self) -> usize {
                self.len
            }

            /// Whether the view has no elements.
            #[inline]
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }

            /// The device the memory is on.
            pub fn device_id(&self) -> i32 {
                self.base.device_id()
            }

            /// The device address of the first element.
            #[inline]
            pub fn device_ptr(&self) -> u64 {
                self.addr
            }

            /// The memory object the view is in (what a use of it records).
            #[inline]
            pub(crate) fn memory(&self) -> &std::sync::Arc<dyn crate::memory::BaseMemory> {
                self.base.mem()
            }
        }

        // SAFETY: `param_ptr` points to the view's own `addr` field, 8 readable bytes
        // laid out as the kernel's `T*` parameter, valid while `self` is borrowed.
        unsafe impl<T: Pod> crate::launch::KernelArg for $view<'_, T> {
            #[inline]
            fn param_ptr(&self) -> *mut std::ffi::c_void {
                &self.addr as *const u64 as *mut std::ffi::c_void
            }
            #[inline]
            fn param_size(&self) -> usize {
                std::mem::size_of::<u64>()
            }
        }
    )*};
}
view_common!(DeviceSlice, DeviceSliceMut);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memset_periods_are_the_shortest() {
        assert_eq!(memset_period(&[7; 8]), Some(Period::One(7)));
        assert_eq!(
            memset_period(&[1, 2, 1, 2]),
            Some(Period::Two(u16::from_ne_bytes([1, 2])))
        );
        assert_eq!(
            memset_period(&1.5f32.to_ne_bytes()),
            Some(Period::Four(1.5f32.to_bits()))
        );
        assert_eq!(memset_period(&1.5f64.to_ne_bytes()), None);
        assert_eq!(memset_period(&[1, 2, 3]), None);
        assert_eq!(memset_period(&[9, 9, 9]), Some(Period::One(9)));
    }
}
