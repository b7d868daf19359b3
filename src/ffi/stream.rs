//! Streams: create, destroy, synchronise, query, wait on an event, host callbacks,
//! and the way to and from raw `CUstream`s (`curt_stream_raw`, `curt_stream_wrap`), so
//! that cuBLAS, NCCL and `<<<>>>` kernels share cuda-rt's streams.

use std::ffi::{c_int, c_void};

use cuda_rt::prelude::*;
use cuda_rt::{Stream, StreamRef};

use super::event::EVENTS;
use std::cell::Cell;

use super::handles::{curt_event_t, curt_stream_t, Live, Table};
use super::status::{bad_arg, guard, out, Res};

/// The streams C holds: references that keep a stream made by `curt_stream_create`
/// alive (it is destroyed when the handle is, once nothing else holds it), or that
/// borrow a raw stream given to `curt_stream_wrap` (never destroyed here).
pub(crate) static STREAMS: Table<StreamRef> = Table::new(1, "stream");

/// `CURT_STREAM_NON_BLOCKING`: the stream does not synchronise with the legacy
/// default stream.
pub const CURT_STREAM_NON_BLOCKING: c_int = 1;

/// The stream `h`, or this thread's current stream of the current device when `h` is
/// NULL (as `cudaStream_t` 0 means the default stream).
pub(crate) fn stream_or_current(h: curt_stream_t) -> Res<StreamRef> {
    if h.is_null() {
        return Ok(cuda_rt::get_current_stream());
    }
    STREAMS.get(h as u64)
}

/// The device and raw `CUstream` of `h` while `h` is a live stream handle; `None` for
/// any other value (its error is the caller's to make, through [`stream_or_current`]).
/// The last handle asked on this thread is remembered with its stream and a probe of
/// its slot ([`Live`]), so asking again costs one load of the slot's state instead of
/// a counted read (two atomic read-modify-writes): the allocation fast path of
/// `curt_malloc` on a stream handle. The answer holds while the handle is live; what
/// the caller does with it after a concurrent destroy is what it would do had the
/// destroy come just after the call. (A stream handle's object is never changed in
/// place: nothing calls `with_mut` on [`STREAMS`], so live means the same stream.)
#[inline]
pub(crate) fn live_raw(h: curt_stream_t) -> Option<(i32, usize)> {
    let h = h as u64;
    if let Some((last, live, device, raw)) = LAST.with(Cell::get) {
        if last == h && live.now() {
            return Some((device, raw));
        }
    }
    remember(h)
}

thread_local! {
    /// This thread's last stream handle of [`live_raw`]: the handle, its probe, its
    /// stream's device and address.
    static LAST: Cell<Option<(u64, Live, i32, usize)>> = const { Cell::new(None) };
}

/// [`live_raw`] for a handle not remembered: a counted read of the stream.
#[cold]
#[inline(never)]
fn remember(h: u64) -> Option<(i32, usize)> {
    let live = STREAMS.live(h)?;
    let (device, raw) = STREAMS.with(h, |s| (s.device_id(), s.ptr())).ok()?;
    LAST.with(|l| l.set(Some((h, live, device, raw))));
    Some((device, raw))
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
        // The reference keeps the stream alive; the `Stream` itself goes now.
        *stream = STREAMS.insert(s.as_stream_ref()) as curt_stream_t;
        Ok(())
    })
}

/// Writes the raw `CUstream` (a `cudaStream_t` too) of `stream` (NULL: this thread's
/// current stream of the current device; 0 is the legacy default stream) to `*raw`,
/// for cuBLAS, NCCL or a `<<<>>>` launch. It stays valid while the handle does.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_stream_raw(stream: curt_stream_t, raw: *mut *mut c_void) -> c_int {
    guard(|| {
        let raw = out(raw, "raw")?;
        *raw = stream_or_current(stream)?.as_raw().cast();
        Ok(())
    })
}

/// Wraps `raw`, a `CUstream` / `cudaStream_t` of `device` made by someone else (0 and
/// `CU_STREAM_PER_THREAD` are the default streams; `device` -1: the calling thread's
/// current device), as a handle that borrows it: `curt_stream_destroy` of the handle
/// does not destroy `raw`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given. And
/// `raw` is a live stream of `device` that its owner keeps alive as long as the handle
/// is used and any memory allocated or used on it is not freed, and destroys only once
/// its queued work is done (wrapper.h).
#[no_mangle]
pub unsafe extern "C" fn curt_stream_wrap(
    raw: *mut c_void,
    device: c_int,
    stream: *mut curt_stream_t,
) -> c_int {
    guard(|| {
        let stream = out(stream, "stream")?;
        let device = match device {
            -1 => cuda_rt::device::get_device_id(),
            d => cuda_rt::Device::new(d)?.id(),
        };
        // SAFETY: wrapper.h's contract for curt_stream_wrap: `raw` is a live stream of
        // `device`, kept alive by its owner while the handle or memory allocated on it
        // is used. The reference keeps nothing, so nothing here destroys it.
        let s = unsafe { StreamRef::from_raw(raw.cast(), device) };
        *stream = STREAMS.insert(s) as curt_stream_t;
        Ok(())
    })
}

/// Destroys `stream` (work queued on it still runs); the handle is dead afterwards.
/// A stream of `curt_stream_wrap` is not destroyed: only the handle goes.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn wrapped(raw: usize, device: i32) -> curt_stream_t {
        // SAFETY: the stream is never used with the driver here: only its address and
        // device are read back.
        let s = unsafe { StreamRef::from_raw(raw as *mut _, device) };
        STREAMS.insert(s) as curt_stream_t
    }

    #[test]
    fn live_raw_answers_for_live_handles_only_also_once_remembered() {
        let a = wrapped(0x1230, 3);
        assert_eq!(live_raw(a), Some((3, 0x1230)));
        // Remembered: the same answer, and still none once the handle is destroyed.
        assert_eq!(live_raw(a), Some((3, 0x1230)));
        drop(STREAMS.remove(a as u64).unwrap());
        assert_eq!(live_raw(a), None);
        // A new handle, maybe in the same slot (another generation), is its own.
        let b = wrapped(0x4560, 1);
        assert_ne!(a, b);
        assert_eq!(live_raw(a), None);
        assert_eq!(live_raw(b), Some((1, 0x4560)));
        // Another thread remembers its own.
        let b_raw = b as u64;
        std::thread::spawn(move || {
            assert_eq!(live_raw(b_raw as curt_stream_t), Some((1, 0x4560)));
        })
        .join()
        .unwrap();
        // NULL, made-up values and handles of another kind are not streams.
        assert_eq!(live_raw(std::ptr::null_mut()), None);
        assert_eq!(live_raw(0xdead as curt_stream_t), None);
        assert_eq!(live_raw(((3u64 << 56) | 1) as curt_stream_t), None);
        drop(STREAMS.remove(b as u64).unwrap());
        assert_eq!(live_raw(b), None);
    }
}
