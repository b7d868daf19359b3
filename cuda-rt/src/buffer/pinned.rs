//! [`PinnedBuffer`]: owning, typed page-locked host memory.

use std::fmt;
use std::marker::PhantomData;

use super::byte_len;
use crate::error::Result;
use crate::memory::Pod;
use crate::pinned::{alloc_pinned_memory, PinnedMemoryPointer};

/// `len` elements of `T` in page-locked (pinned) host memory, owned: allocated from
/// the current pinned allocator (the default
/// [`PinnedMemoryPool`](crate::pinned::PinnedMemoryPool) unless
/// [`set_pinned_memory_allocator`](crate::pinned::set_pinned_memory_allocator) chose
/// another), and given back when the buffer drops (after any copy still using it).
///
/// The copies that do not wait ([`DeviceBuffer::copy_from_pinned_async`],
/// [`DeviceBuffer::copy_to_pinned_async`]) take a pinned buffer; their
/// [`Transfer`](super::Transfer) borrows it while the copy is in flight. The views
/// ([`as_slice`](Self::as_slice), [`as_mut_slice`](Self::as_mut_slice)) wait for a
/// copy still in flight that writes (for `as_mut_slice`, or reads) the memory.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::{DeviceBuffer, PinnedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut host = PinnedBuffer::<f32>::zeros(1 << 20)?;
/// host.as_mut_slice()?.fill(2.5);
/// let mut dev = DeviceBuffer::<f32>::empty(1 << 20)?;
/// let upload = dev.copy_from_pinned_async(&host, &stream)?; // returns at once
/// // ... host work here; `host` is borrowed by the copy while `upload` lives ...
/// drop(upload); // neither waits nor cancels: the copy goes on
/// let mut back = PinnedBuffer::<f32>::zeros(1 << 20)?;
/// let download = dev.copy_to_pinned_async(&mut back, &stream)?; // same stream: in order
/// download.wait()?; // ends the borrow of `back`
/// assert!(back.as_slice()?.iter().all(|&v| v == 2.5));
/// # Ok(()) }
/// ```
///
/// [`DeviceBuffer::copy_from_pinned_async`]: super::DeviceBuffer::copy_from_pinned_async
/// [`DeviceBuffer::copy_to_pinned_async`]: super::DeviceBuffer::copy_to_pinned_async
pub struct PinnedBuffer<T: Pod> {
    /// The only handle to the allocation (so writes need no other handle to go),
    /// exactly `len` elements long.
    mem: PinnedMemoryPointer,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> fmt::Debug for PinnedBuffer<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PinnedBuffer")
            .field("type", &std::any::type_name::<T>())
            .field("addr", &format_args!("{:#x}", self.mem.ptr()))
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Pod> PinnedBuffer<T> {
    /// `len` elements, all bytes zero.
    pub fn zeros(len: usize) -> Result<Self> {
        let mut b = Self::alloc(len)?;
        b.as_mut_slice()?.fill_with(super::zero::<T>);
        Ok(b)
    }

    /// A copy of `src`.
    pub fn from_slice(src: &[T]) -> Result<Self> {
        let mut b = Self::alloc(src.len())?;
        b.as_mut_slice()?.copy_from_slice(src);
        Ok(b)
    }

    fn alloc(len: usize) -> Result<Self> {
        let bytes = byte_len::<T>("PinnedBuffer", len)?;
        let block = alloc_pinned_memory(bytes)?;
        // A pool hands out rounded blocks: the buffer's handle covers its elements
        // only, and is the only handle once the block's is dropped.
        let mem = block.slice(0, bytes)?;
        drop(block);
        Ok(PinnedBuffer {
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

    /// The host address of the first element.
    pub fn host_ptr(&self) -> u64 {
        self.mem.ptr()
    }

    /// The elements. Waits first for a copy still in flight into the buffer.
    pub fn as_slice(&self) -> Result<&[T]> {
        self.mem.as_slice_of::<T>()
    }

    /// The elements, writable. Waits first for any copy still in flight on the buffer.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.mem.as_mut_slice_of::<T>()
    }

    /// The elements, copied to a new `Vec`.
    pub fn to_vec(&self) -> Result<Vec<T>> {
        Ok(self.as_slice()?.to_vec())
    }

    /// Whether no copy recorded on the buffer is known to be in flight: `false` while
    /// one runs, and also when the query fails (during another thread's global-mode
    /// capture, or on a dead context), the copy being then not known to be done.
    pub fn is_idle(&self) -> bool {
        self.mem.is_idle()
    }

    /// Waits until every copy recorded on the buffer has finished.
    pub fn synchronize(&self) -> Result<()> {
        self.mem.synchronize()
    }

    /// The untyped handle (CuPy's `PinnedMemoryPointer`), shared.
    pub fn pointer(&self) -> &PinnedMemoryPointer {
        &self.mem
    }

    pub(crate) fn pointer_mut(&mut self) -> &mut PinnedMemoryPointer {
        &mut self.mem
    }

    /// The untyped handle, giving up the type.
    pub fn into_pointer(self) -> PinnedMemoryPointer {
        self.mem
    }
}
