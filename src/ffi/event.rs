//! Events: create, record, query, synchronise, elapsed time.

use std::ffi::c_int;
use std::sync::Arc;

use cuda_rt::{Event, EventFlags};

use super::handles::{curt_event_t, curt_stream_t, Table};
use super::status::{bad_arg, guard, out};
use super::stream::stream_or_current;

/// The events C holds.
pub(crate) static EVENTS: Table<Arc<Event>> = Table::new(2, "event");

/// `CURT_EVENT_BLOCKING_SYNC`: a synchronising thread sleeps instead of spinning.
pub const CURT_EVENT_BLOCKING_SYNC: c_int = 1;
/// `CURT_EVENT_DISABLE_TIMING`: no timing (cheaper; no elapsed time).
pub const CURT_EVENT_DISABLE_TIMING: c_int = 2;

/// Creates an event on the current device with `flags` (`CURT_EVENT_*`, or 0).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_event_create(flags: c_int, event: *mut curt_event_t) -> c_int {
    guard(|| {
        let event = out(event, "event")?;
        if flags & !(CURT_EVENT_BLOCKING_SYNC | CURT_EVENT_DISABLE_TIMING) != 0 {
            return Err(bad_arg(format!("unknown event flags {flags:#x}")));
        }
        let mut f = EventFlags::empty();
        if flags & CURT_EVENT_BLOCKING_SYNC != 0 {
            f |= EventFlags::BLOCKING_SYNC;
        }
        if flags & CURT_EVENT_DISABLE_TIMING != 0 {
            f |= EventFlags::DISABLE_TIMING;
        }
        *event = EVENTS.insert(Arc::new(Event::with_flags(f)?)) as curt_event_t;
        Ok(())
    })
}

/// Destroys `event`; the handle is dead afterwards.
#[no_mangle]
pub extern "C" fn curt_event_destroy(event: curt_event_t) -> c_int {
    guard(|| {
        drop(EVENTS.remove(event as u64)?);
        Ok(())
    })
}

/// Records `event` on `stream` (NULL: the current stream).
#[no_mangle]
pub extern "C" fn curt_event_record(event: curt_event_t, stream: curt_stream_t) -> c_int {
    guard(|| {
        let ev = EVENTS.get(event as u64)?;
        Ok(ev.record_on(&stream_or_current(stream)?)?)
    })
}

/// Writes 1 to `*done` when the work before `event`'s last record is done, else 0.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_event_query(event: curt_event_t, done: *mut c_int) -> c_int {
    guard(|| {
        let done = out(done, "done")?;
        *done = EVENTS.get(event as u64)?.query()? as c_int;
        Ok(())
    })
}

/// Blocks until the work before `event`'s last record is done.
#[no_mangle]
pub extern "C" fn curt_event_synchronize(event: curt_event_t) -> c_int {
    guard(|| Ok(EVENTS.get(event as u64)?.synchronize()?))
}

/// Writes the milliseconds between the records of `start` and `end` (both complete,
/// both with timing) to `*ms`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_event_elapsed_time(
    start: curt_event_t,
    end: curt_event_t,
    ms: *mut f32,
) -> c_int {
    guard(|| {
        let ms = out(ms, "ms")?;
        let (s, e) = (EVENTS.get(start as u64)?, EVENTS.get(end as u64)?);
        *ms = s.elapsed_time(&e)?;
        Ok(())
    })
}
