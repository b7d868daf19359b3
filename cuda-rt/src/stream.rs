//! Streams: owned ([`Stream`]), borrowed ([`StreamRef`]), and the per-thread, per-device
//! current stream.

use std::cell::Cell;

use crate::device::get_device_id;
use crate::driver::context::{make_current, MAX_DEVICES};
use crate::driver::{drv, sys};
use crate::error::{Error, Result};

/// The legacy default stream's handle (CUDA's `0`).
pub const LEGACY_DEFAULT_HANDLE: usize = 0;
/// The per-thread default stream's handle (`CU_STREAM_PER_THREAD`, CUDA's `0x2`).
pub const PER_THREAD_DEFAULT_HANDLE: usize = 2;

/// Anything that names a stream of a device.
pub trait AsStream {
    /// The raw `CUstream`.
    fn as_raw(&self) -> sys::CUstream;
    /// The device the stream belongs to.
    fn device_id(&self) -> i32;
    /// A non-owning copy.
    fn as_stream_ref(&self) -> StreamRef {
        StreamRef {
            handle: self.as_raw() as usize,
            device: self.device_id(),
        }
    }
}

/// A non-owning, copyable reference to a stream: what [`get_current_stream`] returns.
/// Compares and hashes by handle and device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamRef {
    handle: usize,
    device: i32,
}

impl StreamRef {
    /// The legacy default stream of `device` (handle 0).
    pub const fn legacy_default(device: i32) -> Self {
        StreamRef {
            handle: LEGACY_DEFAULT_HANDLE,
            device,
        }
    }

    /// The per-thread default stream of `device` (handle 2).
    pub const fn per_thread_default(device: i32) -> Self {
        StreamRef {
            handle: PER_THREAD_DEFAULT_HANDLE,
            device,
        }
    }

    /// A reference to a raw handle of `device`.
    ///
    /// # Safety
    /// `handle` must be a stream of `device` (or 0/2), alive for as long as this
    /// reference, or a copy of it, is used.
    pub unsafe fn from_raw(handle: sys::CUstream, device: i32) -> Self {
        StreamRef {
            handle: handle as usize,
            device,
        }
    }

    /// The handle as an integer (0 and 2 for the default streams).
    pub const fn handle(&self) -> usize {
        self.handle
    }

    /// Whether this is the legacy or the per-thread default stream.
    pub const fn is_default(&self) -> bool {
        self.handle == LEGACY_DEFAULT_HANDLE || self.handle == PER_THREAD_DEFAULT_HANDLE
    }
}

impl AsStream for StreamRef {
    #[inline]
    fn as_raw(&self) -> sys::CUstream {
        self.handle as sys::CUstream
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.device
    }
}

/// An owned CUDA stream, destroyed on drop.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct Stream {
    handle: usize,
    device: i32,
    non_blocking: bool,
    priority: i32,
}

impl Stream {
    /// A new blocking stream with default priority on the current device.
    pub fn new() -> Result<Stream> {
        Self::with_options(false, 0)
    }

    /// A new stream on the current device; `non_blocking` does not synchronise with the
    /// legacy default stream; lower `priority` numbers run first (clamped by CUDA to the
    /// device's range).
    pub fn with_options(non_blocking: bool, priority: i32) -> Result<Stream> {
        let device = get_device_id();
        make_current(device)?;
        let flags = if non_blocking {
            sys::CUstream_flags::CU_STREAM_NON_BLOCKING.0
        } else {
            sys::CUstream_flags::CU_STREAM_DEFAULT.0
        };
        let mut s: sys::CUstream = std::ptr::null_mut();
        // SAFETY: `s` is a valid out pointer; the device's context is current.
        drv!(cuStreamCreateWithPriority(&mut s, flags, priority))?;
        let mut actual = priority;
        // SAFETY: `s` was just created; `actual` is a valid out pointer.
        drv!(cuStreamGetPriority(s, &mut actual))?;
        Ok(Stream {
            handle: s as usize,
            device,
            non_blocking,
            priority: actual,
        })
    }

    /// Whether the stream does not synchronise with the legacy default stream.
    pub fn is_non_blocking(&self) -> bool {
        self.non_blocking
    }

    /// The stream's priority as CUDA clamped it.
    pub fn priority(&self) -> i32 {
        self.priority
    }

    /// Blocks until all work queued on the stream is done.
    pub fn synchronize(&self) -> Result<()> {
        // SAFETY: the handle is owned and alive.
        drv!(cuStreamSynchronize(self.as_raw()))
    }
}

impl AsStream for Stream {
    #[inline]
    fn as_raw(&self) -> sys::CUstream {
        self.handle as sys::CUstream
    }
    #[inline]
    fn device_id(&self) -> i32 {
        self.device
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // The driver defers destruction until queued work finishes; an error here
        // (a context torn down at exit) leaves nothing to clean up.
        // SAFETY: the handle is owned and destroyed once.
        let _ = (|| drv!(cuStreamDestroy_v2(self.as_raw())))();
    }
}

thread_local! {
    /// This thread's current stream per device (0: the legacy default stream).
    static CURRENT: [Cell<usize>; MAX_DEVICES] = const { [const { Cell::new(0) }; MAX_DEVICES] };
}

/// This thread's current stream on the current device (the legacy default stream until
/// one is set). No driver call.
#[inline]
pub fn get_current_stream() -> StreamRef {
    current_stream_of(get_device_id())
}

/// This thread's current stream on `device`.
#[inline]
pub fn current_stream_of(device: i32) -> StreamRef {
    let handle = usize::try_from(device)
        .ok()
        .and_then(|d| CURRENT.with(|c| c.get(d).map(Cell::get)))
        .unwrap_or(LEGACY_DEFAULT_HANDLE);
    StreamRef { handle, device }
}

/// Sets this thread's current stream for the stream's device, returning the previous
/// one. The caller keeps the stream alive while it is current.
#[allow(dead_code)] // used by the stream scope (issue 3)
pub(crate) fn set_current_stream(s: StreamRef) -> Result<StreamRef> {
    let idx = usize::try_from(s.device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or_else(|| Error::InvalidArgument(format!("device id {} is out of range", s.device)))?;
    let prev = CURRENT.with(|c| c[idx].replace(s.handle));
    Ok(StreamRef {
        handle: prev,
        device: s.device,
    })
}
