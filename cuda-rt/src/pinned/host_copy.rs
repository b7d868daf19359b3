//! [`MemoryPointer`]'s synchronous host copies ([`MemoryPointer::copy_from_host`],
//! [`MemoryPointer::copy_to_host`]). Pageable memory of at least
//! [`PAGEABLE_THRESHOLD`] bytes goes through pinned staging buffers
//! ([`copy_host_to_device`], [`copy_device_to_host`]) on the same stream, at pinned
//! speed; smaller copies and page-locked memory use the driver's copy.
//!
//! They are methods of `MemoryPointer` defined here, above both `memory` and the
//! staging copies they use, so that `memory` needs nothing from `pinned`. What they
//! share with the other copies (room checks, how a synchronous copy is ordered, the
//! capture refusals) stays in `memory`.

use cuda_sys::result;

use super::staging::{copy_device_to_host, copy_host_to_device, PAGEABLE_THRESHOLD};
use crate::device::context::make_current;
use crate::error::Result;
use crate::memory::pod::{as_bytes, as_bytes_mut};
use crate::memory::pointer::{
    capture_error, host_async_stream, is_page_locked, sync_via, synchronize, SyncVia,
};
use crate::memory::uses;
use crate::memory::{MemoryPointer, Pod};
use crate::stream::{AsStream, StreamRef};

/// Whether a synchronous copy to or from the host slice `buf` goes through the pinned
/// staging buffers ([`copy_host_to_device`]): pageable memory of at
/// least [`PAGEABLE_THRESHOLD`] bytes. Smaller
/// copies, and page-locked memory (which the DMA engine reads directly), use the
/// driver's copy.
fn staged<T: Pod>(buf: &[T], device: i32) -> bool {
    large_pageable(buf, is_page_locked(buf, device))
}

/// [`staged`] for a buffer whose page-locking (`pinned`) is known.
fn large_pageable<T: Pod>(buf: &[T], pinned: bool) -> bool {
    std::mem::size_of_val(buf) >= PAGEABLE_THRESHOLD && !pinned
}

impl MemoryPointer {
    /// Copies all of `src` to this pointer on `stream` (`None`: the current stream),
    /// after the work queued there. `src` is free again when this returns: pageable
    /// memory of at least [`PAGEABLE_THRESHOLD`] bytes goes through pinned staging
    /// buffers at the DMA engine's rate and has landed when this returns; smaller
    /// pageable memory is staged by the driver before it returns; page-locked memory
    /// is waited for. A stream that is capturing a graph is refused (a graph cannot
    /// hold on to a borrowed slice).
    ///
    /// ```no_run
    /// use cuda_rt::{memory::alloc, Stream};
    /// let stream = Stream::new()?;
    /// let d = alloc(4 << 20)?;
    /// d.copy_from_host_async(&vec![1u8; 4 << 20], Some(&stream))?;
    /// # Ok::<(), cuda_rt::Error>(())
    /// ```
    pub fn copy_from_host_async<T: Pod>(
        &self,
        src: &[T],
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        // Asked once: the driver's path needs the answer too. A thread holding a
        // capture cannot wait for the staged chunks.
        let pinned = is_page_locked(src, self.device_id());
        if !large_pageable(src, pinned) || crate::capture::this_thread_captures() {
            return self.copy_from_host_async_direct(src, stream, pinned);
        }
        let what = "copy_from_host_async";
        self.check_room(what, std::mem::size_of_val(src))?;
        let s = host_async_stream(what, stream)?;
        uses::check(Some(&s), &[self.m()])?;
        // Not under the capture transition lock (`uses::enqueue`): the staged copy
        // waits for its stream, and a wait refused by another thread's global-mode
        // capture is retried until that capture ends, which takes that lock
        // exclusively: held here, the capture could never end, and every thread that
        // queues work would block behind it. Nothing needs noting either: the copy is
        // over when this returns (an error path waits for the stream too), and `self`
        // keeps the device memory for the whole call. A capture that another thread
        // begins on `s` between the chunks is waited out (`stream::drain`: the refused
        // wait invalidates it, so no graph keeps the chunks' copies).
        copy_host_to_device(self, as_bytes(src), &s)
    }

    /// Fills all of `dst` from this pointer on `stream` (`None`: the current stream),
    /// after the work queued there; `dst` is filled when this returns (pageable memory
    /// of at least [`PAGEABLE_THRESHOLD`] bytes through pinned staging buffers at the
    /// DMA engine's rate, smaller pageable memory by the driver, page-locked memory
    /// waited for). A stream that is capturing a graph is refused.
    pub fn copy_to_host_async<T: Pod>(
        &self,
        dst: &mut [T],
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        let pinned = is_page_locked(dst, self.device_id());
        if !large_pageable(dst, pinned) || crate::capture::this_thread_captures() {
            return self.copy_to_host_async_direct(dst, stream, pinned);
        }
        let what = "copy_to_host_async";
        self.check_room(what, std::mem::size_of_val(dst))?;
        let s = host_async_stream(what, stream)?;
        uses::check(Some(&s), &[self.m()])?;
        // Not under the capture transition lock, as in `copy_from_host_async`.
        copy_device_to_host(as_bytes_mut(dst), self, &s)
    }

    /// Copies all of `src` to this pointer, synchronously. More bytes than the room left
    /// behind the pointer is an error; fewer fill a prefix.
    pub fn copy_from_host<T: Pod>(&self, src: &[T]) -> Result<()> {
        let what = "copy_from_host";
        self.check_room(what, std::mem::size_of_val(src))?;
        if src.is_empty() || std::mem::size_of::<T>() == 0 {
            return Ok(());
        }
        self.mem().check_use(None)?;
        let via = sync_via(what)?;
        if staged(src, self.device_id()) {
            let s = via.stream(self.device_id());
            return copy_host_to_device(self, as_bytes(src), &s)
                .map_err(|e| capture_error(what, e));
        }
        let src = as_bytes(src);
        match via {
            SyncVia::Legacy => {
                make_current(self.device_id())?;
                // SAFETY: the `src.len()` bytes behind this pointer fit (`check_room`)
                // in memory its object keeps alive (`BaseMemory`) while `self` is
                // borrowed; `src` is borrowed for this synchronous copy.
                unsafe { result::memory::memcpy_htod(self.ptr(), src) }
                    .map_err(|e| capture_error(what, e.into()))?;
                // CUDA's plain copy from pageable memory returns once the source is
                // staged, before the device has been written: the rest is queued on
                // the legacy default stream, which the memory's free waits for (a
                // block of that stream's own arena: one key compare).
                uses::record(&StreamRef::legacy_default(self.device_id()), &[self.m()]);
                Ok(())
            }
            SyncVia::Stream(s) => {
                // Not into a capture begun on `s` since `sync_via` asked.
                // SAFETY: the destination as above; `src` stays borrowed until the copy
                // is waited for below; `sync_via` made `s`'s context current.
                unsafe { self.htod_uncaptured(what, src, &s) }?;
                synchronize(&s)
            }
        }
    }

    /// Fills all of `dst` from this pointer, synchronously. More bytes than the room
    /// left behind the pointer is an error.
    pub fn copy_to_host<T: Pod>(&self, dst: &mut [T]) -> Result<()> {
        let what = "copy_to_host";
        self.check_room(what, std::mem::size_of_val(dst))?;
        if dst.is_empty() || std::mem::size_of::<T>() == 0 {
            return Ok(());
        }
        self.mem().check_use(None)?;
        let via = sync_via(what)?;
        if staged(dst, self.device_id()) {
            let s = via.stream(self.device_id());
            return copy_device_to_host(as_bytes_mut(dst), self, &s)
                .map_err(|e| capture_error(what, e));
        }
        let dst = as_bytes_mut(dst);
        match via {
            SyncVia::Legacy => {
                make_current(self.device_id())?;
                // SAFETY: the `dst.len()` bytes behind this pointer fit (`check_room`)
                // in memory its object keeps alive (`BaseMemory`) while `self` is
                // borrowed; `dst` is borrowed mutably for this synchronous copy, and any
                // bytes are valid for it (`Pod`).
                unsafe { result::memory::memcpy_dtoh(dst, self.ptr()) }
                    .map_err(|e| capture_error(what, e.into()))
            }
            SyncVia::Stream(s) => {
                // Not into a capture begun on `s` since `sync_via` asked.
                // SAFETY: as above; `dst` stays borrowed mutably until the copy is
                // waited for below; `sync_via` made `s`'s context current.
                unsafe { self.dtoh_uncaptured(what, dst, &s) }?;
                synchronize(&s)
            }
        }
    }
}
