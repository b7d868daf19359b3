//! Memset on a [`MemoryPointer`]: bytes, 16-bit and 32-bit words, synchronous or on a
//! stream, bounds- and alignment-checked before any CUDA call.

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::pointer::{capture_error, stream_or_current, sync_via, synchronize, SyncVia};
use super::{uses, MemoryPointer};
use crate::device::context::make_current;
use crate::error::{ArgumentKind, Error, Result};
use crate::stream::{AsStream, StreamRef};

impl MemoryPointer {
    /// Sets `size` bytes to `value`, synchronously. When the current stream is the
    /// legacy default stream this is CUDA's plain memset, which may return before the
    /// device has run it (queued on that stream, in order with the later work of that
    /// stream and of blocking streams); the memory's free waits for it, as for every
    /// other synchronous form.
    pub fn memset(&self, value: u8, size: usize) -> Result<()> {
        self.memset_impl("memset", Fill::U8(value), size, false, None)
    }

    /// Sets `size` bytes to `value` on `stream` (`None`: the current stream).
    pub fn memset_async(
        &self,
        value: u8,
        size: usize,
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        self.memset_impl("memset_async", Fill::U8(value), size, true, stream)
    }

    /// Sets `count` 16-bit words to `value`, synchronously (pointer 2-byte aligned).
    pub fn memset_u16(&self, value: u16, count: usize) -> Result<()> {
        self.memset_impl("memset_u16", Fill::U16(value), count, false, None)
    }

    /// Sets `count` 16-bit words to `value` on `stream` (`None`: the current stream).
    pub fn memset_u16_async(
        &self,
        value: u16,
        count: usize,
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        self.memset_impl("memset_u16_async", Fill::U16(value), count, true, stream)
    }

    /// Sets `count` 32-bit words to `value`, synchronously (pointer 4-byte aligned).
    pub fn memset_u32(&self, value: u32, count: usize) -> Result<()> {
        self.memset_impl("memset_u32", Fill::U32(value), count, false, None)
    }

    /// Sets `count` 32-bit words to `value` on `stream` (`None`: the current stream).
    pub fn memset_u32_async(
        &self,
        value: u32,
        count: usize,
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        self.memset_impl("memset_u32_async", Fill::U32(value), count, true, stream)
    }

    fn memset_impl(
        &self,
        what: &str,
        fill: Fill,
        count: usize,
        is_async: bool,
        stream: Option<&dyn AsStream>,
    ) -> Result<()> {
        let width = fill.width();
        let bytes = count.checked_mul(width).ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: (count as u64).saturating_mul(width as u64),
                    available: self.size() as u64,
                },
                format!("{what}: {count} elements of {width} bytes overflow"),
            )
        })?;
        self.check_room(what, bytes)?;
        if count == 0 {
            return Ok(());
        }
        self.check_align(what, width as u64)?;
        // The stream it runs on (kept here while in use); `None`: the plain call.
        let stream = if is_async {
            let s = stream_or_current(stream);
            make_current(s.device_id())?;
            Some(s)
        } else {
            match sync_via(what)? {
                SyncVia::Legacy => {
                    make_current(self.device_id())?;
                    None
                }
                SyncVia::Stream(s) => Some(s),
            }
        };
        uses::check(stream.as_ref().filter(|_| is_async), &[self.m()])?;
        let p = self.ptr();
        // SAFETY (every call below): `count` elements of `width` bytes fit behind the
        // pointer (`check_room`), allocated as the "device ranges" comment at the top of
        // pointer.rs says, and aligned for the width (`check_align`); `stream` keeps its
        // stream alive, and a context was made current above.
        let set = |s: Option<sys::CUstream>| -> Result<()> {
            Ok(match (fill, s) {
                (Fill::U8(v), None) => unsafe { result::memory::memset_d8(p, v, count) },
                (Fill::U16(v), None) => unsafe { result::memory::memset_d16(p, v, count) },
                (Fill::U32(v), None) => unsafe { result::memory::memset_d32(p, v, count) },
                (Fill::U8(v), Some(s)) => unsafe {
                    result::memory::memset_d8_async(p, v, count, s)
                },
                (Fill::U16(v), Some(s)) => unsafe {
                    result::memory::memset_d16_async(p, v, count, s)
                },
                (Fill::U32(v), Some(s)) => unsafe {
                    result::memory::memset_d32_async(p, v, count, s)
                },
            }?)
        };
        match (is_async, &stream) {
            (false, None) => {
                set(None).map_err(|e| capture_error(what, e))?;
                // CUDA's plain memset of device memory returns before the device has
                // written: it is queued on the legacy default stream. The memory's
                // free waits for that stream, as for `memset_async` on it (a block of
                // that stream's own arena: one key compare).
                uses::record(&StreamRef::legacy_default(self.device_id()), &[self.m()]);
                Ok(())
            }
            (false, Some(s)) => {
                // Not into a capture begun on `s` since the check above: it would set
                // the memory at each launch of its graph, which does not keep it.
                crate::capture::enqueue_uncaptured(s, what, || set(Some(s.as_raw())))?;
                synchronize(s)
            }
            // The memory's free waits for the stream (or, captured, the graph keeps it
            // and sets it on every launch).
            (true, Some(s)) => uses::enqueue(s, &[self.m()], || set(Some(s.as_raw()))),
            (true, None) => Ok(()),
        }
    }
}

#[derive(Clone, Copy)]
enum Fill {
    U8(u8),
    U16(u16),
    U32(u32),
}

impl Fill {
    fn width(self) -> usize {
        match self {
            Fill::U8(_) => 1,
            Fill::U16(_) => 2,
            Fill::U32(_) => 4,
        }
    }
}
