//! Capture errors in words: every layer that can meet one (device and stream
//! synchronisation, events, memory, graphs) turns the driver's code into what happened
//! and what to do, here, below all of them.

use cuda_sys::driver::CUresult;

use super::{CaptureKind, Error};

/// Whether `code` is one of the capture errors [`explain_capture`] puts in words.
pub(crate) fn is_capture_code(code: CUresult) -> bool {
    use CUresult as R;
    matches!(
        code,
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
            | R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
            | R::CUDA_ERROR_STREAM_CAPTURE_MERGE
            | R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED
            | R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED
            | R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION
            | R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
            | R::CUDA_ERROR_CAPTURED_EVENT
            | R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD
    )
}

/// A driver error about capturing, in words: what happened and what to do (`what`
/// names the call). Other errors are returned unchanged. Every layer that can meet a
/// capture error (device and stream synchronization, events, memory, graphs) uses it,
/// so it sits here, below all of them.
pub(crate) fn explain_capture(e: Error, what: &str) -> Error {
    use CUresult as R;
    let Some(code) = e.driver_code() else {
        return e;
    };
    let (kind, why) = match code {
        R::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED => (
            CaptureKind::Invalidated,
            "this operation is not allowed while a stream captures a graph (a synchronize, \
             a synchronous copy or memset, a stream or event query, ...); the capture is \
             now invalid: end it (which fails) and capture again without the operation",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED => (
            CaptureKind::Invalidated,
            "the capture was invalidated by an earlier operation not allowed during a \
             capture (a synchronize, a synchronous copy, ...); no graph can come of it: end \
             it and capture again",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_MERGE => (
            CaptureKind::Other,
            "two independent captures would be merged (a capturing stream waited on an \
             event recorded in another capture)",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED => (
            CaptureKind::NotCapturing,
            "the capture was not begun on this stream: end a capture on the stream that \
             began it",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_UNJOINED => (
            CaptureKind::Unjoined,
            "a stream forked from the capture (it waited on an event recorded during the \
             capture) has work that was never joined back: record an event on the forked \
             stream and make the origin stream wait on it before ending the capture",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_ISOLATION => (
            CaptureKind::Other,
            "a dependency would cross the capture's boundary (work outside the capture \
             cannot depend on captured work)",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => (
            CaptureKind::LegacyStream,
            "the operation would wait on the legacy default stream, which is not allowed \
             while a stream captures: use non-blocking streams, or a stream other than \
             the legacy default one",
        ),
        R::CUDA_ERROR_CAPTURED_EVENT => (
            CaptureKind::Other,
            "the event was recorded during a capture: it cannot be queried or waited for \
             from the host before the capture ends",
        ),
        R::CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD => (
            CaptureKind::Other,
            "the capture was begun in global or thread-local mode on another thread: end \
             it on that thread",
        ),
        _ => return e,
    };
    Error::capture(kind, format!("{what}: {why} ({e})"))
}
