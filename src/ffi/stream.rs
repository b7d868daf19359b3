//! Streams: create, destroy, synchronise, query, wait on an event, host callbacks.

use std::ffi::{c_int, c_void};
use std::sync::Arc;

use cuda_rt::prelude::*;
use cuda_rt::{Stream, StreamRef};

use super::event::EVENTS;
use super::handles::{curt_event_t, curt_stream_t, Table};
use super::status::{bad_arg, guard, out, Res};

/// The streams C holds.
pub(crate) static STREAMS: Table<Arc<Stream>> = Table::new(1, "stream");

/// `CURT_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy
/// default stream.
pub const CURT_STREAM_NON_BLOCKING: c_int = 1;

/// The stream `h`, or this thread's current stream of the current device when `h` is
/// NULL (as `cudaStream_t` 0 means the default stream).
pub(crate) fn stream_or_current(h: curt_stream_t) -> Res<StreamRef> {
    if h.is_null() {
        return Ok(cuda_rt::get_current_stream());
    }
    Ok(STREAMS.get(h as u64)?.as_stream_ref())
}

/// Creates a stream on the current device with `flags` (0 or
/// `CURT_STREAM_NON_BLOCKING`) and `priority` (lower is higher priority; clamped to the
/// device's range).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_stream_create(
    flags: c_int,
    priority: c_int,
    stream: *mut curt_stream_t,
) -> c_int {
    guard(|| {
        let stream = out(stream, "stream")?;
        if flags & !CURT_STREAM_NON_BLOCKING != 0 {
            return Err(bad_arg(format!("unknown stream flags {flags:#x}")));
        }
        let s = Stream::with_options(flags & CURT_STREAM_NON_BLOCKING != 0, priority)?;
        *stream = STREAMS.insert(Arc::new(s)) as curt_stream_t;
        Ok(())
    })
}

/// Destroys `stream` (work queued on it still runs); the handle is dead afterwards.
#[no_mangle]
pub extern "C" fn curt_stream_destroy(stream: curt_stream_t) -> c_int {
    guard(|| {
        drop(STREAMS.remove(stream as u64)?);
        Ok(())
    })
}

/// Blocks until all work queued on `stream` (NULL: the current stream) is done.
#[no_mangle]
pub extern "C" fn curt_stream_synchronize(stream: curt_stream_t) -> c_int {
    guard(|| Ok(stream_or_current(stream)?.synchronize()?))
}

/// Writes 1 to `*done` when all work queued on `stream` is done, else 0.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_stream_query(stream: curt_stream_t, done: *mut c_int) -> c_int {
    guard(|| {
        let done = out(done, "done")?;
        *done = stream_or_current(stream)?.query()? as c_int;
        Ok(())
    })
}

/// Makes work queued on `stream` after this call wait for `event`'s last record.
#[no_mangle]
pub extern "C" fn curt_stream_wait_event(stream: curt_stream_t, event: curt_event_t) -> c_int {
    guard(|| {
        let ev = EVENTS.get(event as u64)?;
        Ok(stream_or_current(stream)?.wait_event(&ev)?)
    })
}

/// A host callback: C's function pointer and its argument.
pub type CurtHostFn = extern "C" fn(user_data: *mut c_void);

/// Runs `fn(user_data)` on a driver thread once the work queued before it on `stream`
/// is done; later work waits for it. `fn` must not call CUDA or cuda-rt.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_stream_launch_host_func(
    stream: curt_stream_t,
    func: Option<CurtHostFn>,
    user_data: *mut c_void,
) -> c_int {
    guard(|| {
        let func = func.ok_or_else(|| bad_arg("fn is NULL"))?;
        let s = stream_or_current(stream)?;
        // The address crosses to the driver's thread; what it points to is the C
        // caller's business (wrapper.h).
        let data = user_data as usize;
        s.launch_host_func(move || func(data as *mut c_void))?;
        Ok(())
    })
}
