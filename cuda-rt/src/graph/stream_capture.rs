//! Capturing a stream's work into a [`Graph`]: the stream methods of capture.

use std::any::Any;
use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::{launch_repeatable_host_func, CaptureMode, CaptureStatus, Graph, InstantiateFlags};
use crate::capture::{self, begin as begin_capture, info as capture_info};
use crate::device::context::make_current;
use crate::error::{explain_capture, CaptureKind, Error, Result};
use crate::stream::{context_for, AsStream, LEGACY_DEFAULT_HANDLE};

/// A stream's capture operations: begin and end capturing its work into a [`Graph`],
/// ask whether it captures, and host functions that become graph nodes (CuPy's
/// `Stream.begin_capture`, `end_capture`, `is_capturing`).
///
/// Implemented for every [`AsStream`] (owned, borrowed and foreign streams); nothing
/// else can implement it. It is a trait of its own, defined in `graph` rather than in
/// [`AsStream`], because ending a capture makes a [`Graph`]: streams sit below graphs.
/// Bring it in scope with [`crate::prelude`] (`use cuda_rt::prelude::*;`) or by name.
pub trait StreamCaptureExt: AsStream {
    /// Runs `f` on a driver thread in stream order, like
    /// [`launch_host_func`](AsStream::launch_host_func), but also while the stream
    /// captures a graph: then `f` becomes a host node of the graph and runs once per
    /// launch, for as long as the graph, its clones or executables live (the graph
    /// owns `f`). Not capturing, it runs once. A panic in `f` is caught; a cuda-rt
    /// call in `f` returns [`StateKind::InHostFunction`](crate::StateKind::InHostFunction).
    fn launch_host_func_repeatable<F>(&self, f: F) -> Result<()>
    where
        F: Fn() + Send + Sync + 'static,
        Self: Sized,
    {
        context_for(self)?;
        launch_repeatable_host_func(self, Box::new(f))
    }

    /// Begins capturing the work queued on this stream into a graph
    /// (`cuStreamBeginCapture`), in `mode`. An error for the legacy default stream and
    /// for a stream that is already capturing.
    fn begin_capture(&self, mode: CaptureMode) -> Result<()> {
        begin_capture(self, mode)
    }

    /// Ends the capture begun on this stream and returns its graph, instantiated with
    /// no flags (as CuPy's `end_capture`). An [`Error::Capture`](crate::Error::Capture) when the stream is not
    /// capturing, when the capture was invalidated (a synchronize, a synchronous copy
    /// during it), or when a forked stream was not joined back.
    fn end_capture(&self) -> Result<Graph> {
        end_capture(self, InstantiateFlags::empty())
    }

    /// [`end_capture`](StreamCaptureExt::end_capture), instantiating with `flags`.
    fn end_capture_with(&self, flags: InstantiateFlags) -> Result<Graph> {
        end_capture(self, flags)
    }

    /// Ties `obj` to the graph this stream is capturing into (a capture begun through
    /// cuda-rt, also from a stream forked into it): it is dropped after that graph and
    /// every executable made of it, once their launches are done. What a captured
    /// kernel reaches through a pointer argument is the launch's promise; this is how
    /// to keep it (a buffer, a table) for as long as the graph can run. The kernel's
    /// module needs no such tie: a launch through cuda-rt into such a capture keeps it
    /// loaded for the graph. An [`Error::Capture`](crate::Error::Capture) when the
    /// stream is not capturing, or captures into a capture begun outside cuda-rt.
    ///
    /// ```no_run
    /// # fn main() -> cuda_rt::Result<()> {
    /// use std::sync::Arc;
    /// use cuda_rt::prelude::*;
    /// use cuda_rt::{CaptureMode, Stream};
    /// let stream = Stream::non_blocking()?;
    /// let table = Arc::new(cuda_rt::alloc(4096)?);
    /// stream.begin_capture(CaptureMode::ThreadLocal)?;
    /// // ... kernels that read `table` ...
    /// stream.keep_alive_in_capture(table.clone())?;
    /// let graph = stream.end_capture()?;
    /// drop(table); // the graph holds it now
    /// graph.launch(&stream)?;
    /// # Ok(()) }
    /// ```
    fn keep_alive_in_capture(&self, obj: Arc<dyn Any + Send + Sync>) -> Result<()> {
        context_for(self)?;
        if capture::keep_in_capture(self, obj)? {
            return Ok(());
        }
        Err(Error::capture(
            CaptureKind::NotCapturing,
            format!(
                "keep_alive_in_capture on stream {:#x} of device {}: the stream is not \
                 capturing into a capture begun through cuda-rt",
                self.as_raw() as usize,
                self.device_id()
            ),
        ))
    }

    /// Whether the stream is capturing a graph (an invalidated capture counts: the
    /// stream is still in capture mode until the capture is ended).
    fn is_capturing(&self) -> Result<bool> {
        Ok(self.capture_status()? != CaptureStatus::None)
    }

    /// The stream's capture status and, when active, the capture's id
    /// (`cuStreamGetCaptureInfo`). The driver is asked for the legacy default stream
    /// too: while a blocking stream of its device captures in global mode it answers
    /// with its implicit-synchronization error ([`CaptureKind::LegacyStream`]), as
    /// CuPy reports it.
    ///
    /// [`CaptureKind::LegacyStream`]: crate::CaptureKind::LegacyStream
    fn capture_status(&self) -> Result<CaptureStatus> {
        if self.as_raw() as usize == LEGACY_DEFAULT_HANDLE {
            return legacy_capture_status(self.device_id());
        }
        capture_info(self).map(|(s, _)| s)
    }
}

impl<S: AsStream + ?Sized> StreamCaptureExt for S {}

/// The legacy default stream's capture status, as the driver reports it (not a hot
/// path: cuda-rt's own checks skip the legacy stream, which never captures).
fn legacy_capture_status(device: i32) -> Result<CaptureStatus> {
    make_current(device)?;
    // SAFETY: the legacy default stream handle is valid in every context, and the
    // device's primary context was made current above.
    let (st, _, _) =
        unsafe { result::stream::get_capture_info(LEGACY_DEFAULT_HANDLE as sys::CUstream) }
            .map_err(|e| explain_capture(e.into(), "is_capturing on the legacy default stream"))?;
    Ok(match st {
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => CaptureStatus::None,
        sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED => {
            CaptureStatus::Invalidated
        }
        _ => CaptureStatus::Active { id: 0 },
    })
}

/// Ends the capture begun on `s` and instantiates its graph with `flags`.
fn end_capture<S: AsStream + ?Sized>(s: &S, flags: InstantiateFlags) -> Result<Graph> {
    let ended = capture::end(s)?;
    Graph::from_capture(ended, s.device_id(), flags)
}
