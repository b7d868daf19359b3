//! Typed buffers: device memory and pinned host memory with an element type, lengths
//! in elements, borrowed views, and asynchronous copies that are safe.
//!
//! CuPy's layer is untyped ([`MemoryPointer`](crate::MemoryPointer) counts bytes, and
//! stays); Rust users coming from cudarc expect the element type in the type:
//!
//! | type | what |
//! |---|---|
//! | [`DeviceBuffer<T>`] | owning device memory of `len` `T`s, from the current allocator (the pool by default) |
//! | [`DeviceSlice<'a, T>`] / [`DeviceSliceMut<'a, T>`] | borrowed views of a range of one (`slice`, `split_at`) |
//! | [`PinnedBuffer<T>`] | owning page-locked host memory of `len` `T`s, from the current pinned allocator |
//! | [`Transfer<'p>`] | an asynchronous copy to or from a pinned buffer, in flight |
//!
//! Elements are [`Pod`]: primitives, arrays, the half-precision
//! [`F16`](crate::memory::F16) / [`Bf16`](crate::memory::Bf16) (and `half::f16` /
//! `half::bf16` with the `half` feature), and your `#[repr(C)]` structs of plain data
//! after an `unsafe impl Pod` (see [`Pod`]'s safety rule).
//!
//! # Kernels
//! Buffers and views are kernel arguments: each passes its device address, as a
//! `T*` parameter expects.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::buffer::DeviceBuffer;
//! use cuda_rt::compiler::RawKernel;
//! use cuda_rt::launch::LaunchConfig;
//! let saxpy = RawKernel::new(
//!     r#"extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
//!            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }"#,
//!     "saxpy",
//!     &[],
//! )?;
//! let x = DeviceBuffer::from_slice(&[1.0f32; 1000])?;
//! let mut y = DeviceBuffer::from_slice(&[2.0f32; 1000])?;
//! let (a, n) = (2.0f32, y.len() as i32);
//! let cfg = LaunchConfig::for_num_elems_with_block(n as u32, 256);
//! // SAFETY: saxpy reads `n` floats of `x` and writes `n` of `y`, both that long, and
//! // nothing else uses them until `to_vec` (on the same stream) has read `y`.
//! unsafe { cuda_rt::launch!(saxpy, &cfg, (a, &x, &mut y, n))? }; // y is written
//! assert_eq!(y.to_vec()?, vec![4.0f32; 1000]);
//! # Ok(()) }
//! ```
//!
//! A buffer dropped while a kernel that uses it is still queued is safe to drop when
//! the kernel runs on the stream the buffer was allocated on (the current stream at
//! its allocation): the pool hands the memory out again only to work ordered after
//! that stream's kernel, and never to another stream while it is in use there. A
//! kernel on another stream is the launch's promise (its `# Safety`): keep the buffer
//! until that stream has passed the kernel (synchronise it, or wait for an event
//! recorded after the kernel).
//!
//! # Asynchronous copies
//! [`DeviceSliceMut::copy_from_pinned_async`] and [`DeviceSlice::copy_to_pinned_async`]
//! queue a copy on a stream and return at once, waiting for nothing. The returned
//! [`Transfer`] borrows the pinned buffer (shared for a copy that reads it, exclusive for
//! one that writes it), so the borrow checker refuses code that writes a buffer an
//! in-flight copy reads, or reads one it writes, while the transfer lives. After the
//! transfer is waited for or dropped, the buffer's views ([`PinnedBuffer::as_slice`],
//! [`PinnedBuffer::as_mut_slice`]) still wait for a copy that has not finished, so even a
//! forgotten transfer cannot expose memory under a copy. Both sides stay allocated, and
//! neither pool hands them out again, until the stream has passed the copy: an event
//! recorded after it holds the device memory and the pinned block, however the buffers
//! are dropped. No host synchronisation is made for this.
//!
//! # Synchronous and stream-ordered
//! The methods without `_async` (`zeros`, `from_slice`, `copy_from_host`, `copy_from`,
//! `fill`, `memset`, `to_vec`) queue their work on the current stream and wait for
//! it: their effect is complete, for every stream, when they return. The `_async`
//! forms take a stream and only queue the work, ordered with the stream's other work.
//!
//! Each synchronous method has an explicit-stream form ending in `_on`
//! ([`DeviceBuffer::from_slice_on`], [`DeviceSlice::to_vec_on`],
//! [`DeviceSliceMut::copy_from_host_on`], ...): the same work, ordered after what is
//! queued on the stream given instead of the thread's current stream, and complete
//! when it returns. Library code can take a stream from its caller and never touch the
//! thread's current device or stream (they are the same after the call).
//!
//! ```no_run
//! use cuda_rt::buffer::DeviceBuffer;
//! use cuda_rt::Stream;
//! let stream = Stream::non_blocking()?;
//! let x = DeviceBuffer::from_slice_on(&[1.0f32, 2.0, 3.0], &stream)?;
//! assert_eq!(x.to_vec_on(&stream)?, [1.0, 2.0, 3.0]);
//! # Ok::<(), cuda_rt::Error>(())
//! ```
//!
//! Copies from and to ordinary (pageable) host slices
//! ([`DeviceSliceMut::copy_from_host`], [`DeviceSlice::copy_to_host`],
//! [`DeviceSlice::to_vec`]) are complete when they return: large ones are staged
//! through pinned memory by several threads, which is faster than the driver's own
//! pageable path, but they are not asynchronous.

mod device;
mod pinned;
mod slice;
mod transfer;

pub use device::DeviceBuffer;
pub use pinned::PinnedBuffer;
pub use slice::{AsDeviceSlice, DeviceSlice, DeviceSliceMut};
pub use transfer::Transfer;

use crate::device::{get_device_id, Device};
use crate::error::{ArgumentKind, Error, Result};
use crate::memory::Pod;
use crate::stream::AsStream;

/// Runs `f`, an implicit-stream operation, with `stream` (and its device) current,
/// restoring both afterwards: the `_on` forms. `device`, when given, is the device
/// of the memory the operation uses, which the stream must belong to.
pub(crate) fn on_stream<R>(
    what: &str,
    device: Option<i32>,
    stream: &(impl AsStream + ?Sized),
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let sd = stream.device_id();
    if let Some(d) = device.filter(|&d| d != sd) {
        return Err(Error::invalid_argument(
            ArgumentKind::WrongDevice {
                expected: d,
                found: sd,
            },
            format!("{what}: the memory is on device {d}, the stream on device {sd}"),
        ));
    }
    let _device = if sd != get_device_id() {
        Some(Device::new(sd)?.enter()?)
    } else {
        None
    };
    let _stream = stream.enter()?;
    f()
}

/// The largest element alignment a buffer takes: device and pinned allocations start
/// at least this aligned, so every element of a buffer is aligned for its type.
pub(crate) const MAX_ALIGN: usize = 256;

/// `len` elements of `T` in bytes, or an error naming the overflow.
///
/// Inlined, with the errors built out of line: every typed allocation runs this, and
/// the alignment test is decided at compile time, so the fast path is one checked
/// multiplication (the error's formatting, inlined, cost the typed pair a fifth more
/// than the untyped one).
#[inline]
pub(crate) fn byte_len<T: Pod>(what: &str, len: usize) -> Result<usize> {
    if std::mem::align_of::<T>() > MAX_ALIGN {
        return Err(over_aligned::<T>(what));
    }
    match len.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) => Ok(bytes),
        None => Err(overflowing::<T>(what, len)),
    }
}

/// The error of an element type aligned beyond [`MAX_ALIGN`].
#[cold]
#[inline(never)]
fn over_aligned<T>(what: &str) -> Error {
    Error::invalid_argument(
        ArgumentKind::Incompatible,
        format!(
            "{what}: {} needs {}-byte alignment; buffers guarantee {MAX_ALIGN}",
            std::any::type_name::<T>(),
            std::mem::align_of::<T>()
        ),
    )
}

/// The error of `len` elements of `T` whose bytes overflow `usize`.
#[cold]
#[inline(never)]
fn overflowing<T>(what: &str, len: usize) -> Error {
    Error::invalid_argument(
        ArgumentKind::OutOfBounds {
            requested: u64::MAX,
            available: isize::MAX as u64,
        },
        format!(
            "{what}: {len} elements of {} overflow usize bytes",
            std::any::type_name::<T>()
        ),
    )
}

/// A `Vec` of `len` zeroed `T`s, allocated zeroed (the allocator hands large zeroed
/// blocks out as untouched pages, so nothing is written twice before a copy fills it).
pub(crate) fn zeroed_vec<T: Pod>(len: usize) -> Vec<T> {
    let Ok(layout) = std::alloc::Layout::array::<T>(len) else {
        // Past isize::MAX bytes: the same refusal `Vec::with_capacity` makes.
        return Vec::with_capacity(len);
    };
    if layout.size() == 0 {
        return std::iter::repeat_with(zero::<T>).take(len).collect();
    }
    // SAFETY: `layout` has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    advise_huge_pages(p, layout.size());
    // SAFETY: `p` was allocated by the global allocator with `Layout::array::<T>(len)`,
    // the layout a `Vec<T>` of capacity `len` has; its `len` elements are all-zero
    // bytes, a valid `T` (`Pod`: every bit pattern is valid).
    unsafe { Vec::from_raw_parts(p.cast::<T>(), len, len) }
}

/// Asks the kernel to back a large fresh allocation with transparent huge pages: the
/// copy that fills it then takes one page fault per 2 MiB instead of one per 4 KiB,
/// which is most of the time a fresh `Vec` of hundreds of MiB costs. Advice only: the
/// contents are untouched, and a kernel without THP ignores it.
fn advise_huge_pages(p: *mut u8, len: usize) {
    const HUGE: usize = 2 << 20;
    if len < 2 * HUGE {
        return;
    }
    let start = (p as usize).next_multiple_of(HUGE);
    let end = (p as usize + len) / HUGE * HUGE;
    if end > start {
        // SAFETY: `start..end` lies inside the allocation at `p` (page aligned, as
        // madvise wants); MADV_HUGEPAGE changes how its pages are backed, never
        // their contents.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE) };
    }
}

/// An all-zero `T`.
fn zero<T: Pod>() -> T {
    // SAFETY: `T: Pod`: every bit pattern, all zeros included, is a valid `T`.
    unsafe { std::mem::zeroed() }
}

/// The range `r` of a length `len` in `T`s, checked: `start <= end <= len` (an error
/// counts the bytes).
pub(crate) fn range_of<T>(
    what: &str,
    r: impl std::ops::RangeBounds<usize>,
    len: usize,
) -> Result<(usize, usize)> {
    use std::ops::Bound::*;
    let start = match r.start_bound() {
        Included(&s) => Some(s),
        Excluded(&s) => s.checked_add(1),
        Unbounded => Some(0),
    };
    let end = match r.end_bound() {
        Included(&e) => e.checked_add(1),
        Excluded(&e) => Some(e),
        Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        _ => {
            let size = std::mem::size_of::<T>() as u64;
            let end = end.map_or(u64::MAX, |e| (e as u64).saturating_mul(size));
            Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: end,
                    available: len as u64 * size,
                },
                format!("{what}: range {} is outside 0..{len}", show_range(&r)),
            ))
        }
    }
}

/// `r` as Rust writes it: `2..5`, `..=7`, `3..`.
fn show_range(r: &impl std::ops::RangeBounds<usize>) -> String {
    use std::ops::Bound::*;
    let start = match r.start_bound() {
        Included(s) => s.to_string(),
        Excluded(s) => format!("{s}+1"),
        Unbounded => String::new(),
    };
    let end = match r.end_bound() {
        Included(e) => format!("={e}"),
        Excluded(e) => e.to_string(),
        Unbounded => String::new(),
    };
    format!("{start}..{end}")
}

/// Two lengths in elements that must be equal for a copy.
pub(crate) fn same_len(what: &str, dst: usize, src: usize) -> Result<()> {
    if dst != src {
        return Err(Error::invalid_argument(
            ArgumentKind::LengthMismatch {
                expected: dst as u64,
                found: src as u64,
            },
            format!(
                "{what}: the destination holds {dst} elements and the source {src}; a copy \
                 between buffers takes equal lengths (slice one of them)"
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_checked() {
        assert_eq!(range_of::<u8>("t", .., 10).unwrap(), (0, 10));
        assert_eq!(range_of::<u8>("t", 2..5, 10).unwrap(), (2, 5));
        assert_eq!(range_of::<u8>("t", 2..=5, 10).unwrap(), (2, 6));
        assert_eq!(range_of::<u8>("t", 10.., 10).unwrap(), (10, 10));
        let (five, four) = (5, 4);
        assert!(range_of::<u8>("t", five..four, 10).is_err());
        assert!(range_of::<u8>("t", 0..11, 10).is_err());
        assert!(range_of::<u8>("t", ..=usize::MAX, 10).is_err());
        let e = range_of::<u8>("t", 2..=11, 10).unwrap_err().to_string();
        assert!(e.contains("range 2..=11 is outside 0..10"), "{e}");
    }

    #[test]
    fn byte_lengths_overflow_into_an_error() {
        assert_eq!(byte_len::<u32>("t", 10).unwrap(), 40);
        assert!(byte_len::<u64>("t", usize::MAX / 4).is_err());
        #[derive(Clone, Copy)]
        #[repr(C, align(512))]
        struct Big([u8; 512]);
        // SAFETY: a byte array with no padding.
        unsafe impl Pod for Big {}
        assert!(byte_len::<Big>("t", 1).is_err());
    }

    #[test]
    fn zeroed_vecs_are_zero() {
        let v = zeroed_vec::<u64>(1 << 20);
        assert_eq!(v.len(), 1 << 20);
        assert!(v.iter().all(|&x| x == 0));
        assert!(zeroed_vec::<f32>(0).is_empty());
        assert_eq!(zeroed_vec::<[u8; 0]>(3).len(), 3);
    }
}
