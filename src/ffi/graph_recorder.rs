//! Graph recorders (`cuda_rt::graph::Recorder`): a C callback that queues work on a
//! stream, recorded into a graph once per key and replayed, or updated in place.
//!
//! Keys are byte strings (a `uint64_t` is its 8 bytes). The callback gets a stream
//! handle to the recorder's capture stream, valid during the callback only; it is also
//! the thread's current stream then, so NULL works as well.

use std::cell::RefCell;
use std::ffi::{c_int, c_void};
use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, PoisonError};

use cuda_rt::graph::{Recorder, RecorderStats};
use cuda_rt::prelude::*;
use cuda_rt::{CaptureMode, Error, StateKind};

use super::graph::{
    CURT_CAPTURE_MODE_GLOBAL, CURT_CAPTURE_MODE_RELAXED, CURT_CAPTURE_MODE_THREAD_LOCAL,
};
use super::handles::{curt_recorder_t, curt_stream_t, Table};
use super::status::{bad_arg, guard, last_error_string, out, Fail, Res};
use super::stream::{stream_or_current, STREAMS};

/// The recorders C holds (one call at a time each: the callback runs under the lock).
pub(crate) static RECORDERS: Table<Arc<Mutex<Recorder<Vec<u8>>>>> = Table::new(8, "graph recorder");

/// The callback of [`curt_graph_record`]: queues work on `stream` and returns
/// `CURT_SUCCESS`, or an error code (which the call returns, with this thread's last
/// error message at the callback's return).
pub type CurtRecordFn = extern "C" fn(stream: curt_stream_t, user_data: *mut c_void) -> c_int;

/// A recorder's statistics ([`curt_recorder_stats`]).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct curt_recorder_stats_t {
    /// Calls that replayed the key's executable.
    pub hits: u64,
    /// Calls that found no executable for their key and recorded one.
    pub misses: u64,
    /// Callbacks captured into a graph (misses and updates).
    pub captures: u64,
    /// Executables made: misses and refused updates.
    pub instantiations: u64,
    /// Executables updated in place.
    pub updates: u64,
    /// Updates refused and replaced by a new instantiation.
    pub update_fallbacks: u64,
    /// Executables evicted beyond the capacity.
    pub evictions: u64,
    /// Calls that failed (callback, capture or instantiation): nothing cached.
    pub failures: u64,
    /// Executables cached now.
    pub entries: u64,
    /// Executables kept at most.
    pub capacity: u64,
}

impl curt_recorder_stats_t {
    fn new(s: RecorderStats, entries: usize, capacity: usize) -> Self {
        curt_recorder_stats_t {
            hits: s.hits,
            misses: s.misses,
            captures: s.captures,
            instantiations: s.instantiations,
            updates: s.updates,
            update_fallbacks: s.update_fallbacks,
            evictions: s.evictions,
            failures: s.failures,
            entries: entries as u64,
            capacity: capacity as u64,
        }
    }
}

thread_local! {
    /// The recorders whose callback runs on this thread now: a call on one of them
    /// from inside its own callback would wait for its own lock forever.
    static RECORDING: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
}

/// Marks `handle` as recording on this thread until dropped.
struct Recording(u64);

impl Recording {
    fn enter(handle: u64) -> Res<Recording> {
        let nested = RECORDING
            .try_with(|r| {
                let mut r = r.borrow_mut();
                let nested = r.contains(&handle);
                if !nested {
                    r.push(handle);
                }
                nested
            })
            .unwrap_or(false);
        if nested {
            return Err(Fail::Rt(Error::invalid_state(
                StateKind::Other,
                "a call on a graph recorder from inside its own callback: the callback queues \
                 work on the stream it gets; the recorder running it takes no other call \
                 until it returns",
            )));
        }
        Ok(Recording(handle))
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        let _ = RECORDING.try_with(|r| r.borrow_mut().retain(|&h| h != self.0));
    }
}

/// Creates a recorder that keeps up to `capacity` executables (0: the default, 32),
/// capturing in `mode` (`CURT_CAPTURE_MODE_*`; thread-local is the usual choice).
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_recorder_create(
    capacity: usize,
    mode: c_int,
    recorder: *mut curt_recorder_t,
) -> c_int {
    guard(|| {
        let recorder = out(recorder, "recorder")?;
        let mode = match mode {
            CURT_CAPTURE_MODE_GLOBAL => CaptureMode::Global,
            CURT_CAPTURE_MODE_THREAD_LOCAL => CaptureMode::ThreadLocal,
            CURT_CAPTURE_MODE_RELAXED => CaptureMode::Relaxed,
            m => return Err(bad_arg(format!("unknown capture mode {m}"))),
        };
        let r = match NonZeroUsize::new(capacity) {
            Some(c) => Recorder::with_capacity(c),
            None => Recorder::new(),
        }
        .capture_mode(mode);
        *recorder = RECORDERS.insert(Arc::new(Mutex::new(r))) as curt_recorder_t;
        Ok(())
    })
}

/// Destroys `recorder`: its executables go (what they kept alive once their launches
/// are done, waited for here, or when a call on it under way ends); the handle is dead
/// afterwards.
#[no_mangle]
pub extern "C" fn curt_recorder_destroy(recorder: curt_recorder_t) -> c_int {
    guard(|| {
        drop(RECORDERS.remove(recorder as u64)?);
        Ok(())
    })
}

/// The key bytes `key[..len]` (NULL with length 0: the empty key).
///
/// # Safety
/// `key` is NULL or points to `len` readable bytes, for the duration of the call.
unsafe fn key_bytes<'a>(key: *const c_void, len: usize) -> Res<&'a [u8]> {
    if len == 0 {
        return Ok(&[]);
    }
    if key.is_null() {
        return Err(bad_arg(format!("key is NULL with key_len {len}")));
    }
    if len > isize::MAX as usize {
        return Err(bad_arg(format!("key_len {len} is past any object")));
    }
    // SAFETY: non-null (checked), a length a slice may have (checked), and `len`
    // readable bytes for the call (the caller).
    Ok(unsafe { std::slice::from_raw_parts(key.cast::<u8>(), len) })
}

/// `curt_graph_record` and `curt_graph_record_update`.
///
/// # Safety
/// As for those functions (`wrapper.h`).
unsafe fn record(
    recorder: curt_recorder_t,
    key: *const c_void,
    key_len: usize,
    stream: curt_stream_t,
    func: Option<CurtRecordFn>,
    user_data: *mut c_void,
    update: bool,
) -> c_int {
    guard(|| {
        let func = func.ok_or_else(|| bad_arg("fn is NULL"))?;
        // SAFETY: the caller's promise for `key` (wrapper.h).
        let key = unsafe { key_bytes(key, key_len) }?;
        let handle = recorder as u64;
        let rec = RECORDERS.get(handle)?;
        let s = stream_or_current(stream)?;
        let _inside = Recording::enter(handle)?;
        let mut rec = rec.lock().unwrap_or_else(PoisonError::into_inner);
        // The callback gets a handle to the capture stream, valid while it runs.
        let capture_stream = rec.capture_stream(s.device_id())?;
        let mut failed: Option<(c_int, String)> = None;
        let callback = |_: &cuda_rt::Stream| {
            let h = STREAMS.insert(capture_stream.as_stream_ref());
            let rc = func(h as curt_stream_t, user_data);
            let _ = STREAMS.remove(h);
            if rc == 0 {
                return Ok(());
            }
            let msg = last_error_string();
            let e = Error::invalid_state(
                StateKind::Other,
                format!("the record callback returned {rc}: {msg}"),
            );
            failed = Some((rc, msg));
            Err(e)
        };
        let r = if update {
            rec.update(key, &s, callback)
        } else {
            rec.run(key, &s, callback)
        };
        match (r, failed) {
            (Ok(_), _) => Ok(()),
            (Err(_), Some((rc, msg))) => Err(Fail::Code(rc, msg)),
            (Err(e), None) => Err(e.into()),
        }
    })
}

/// Launches the executable `recorder` holds for the key `key[..key_len]` on `stream`
/// (NULL: the current stream); without one, first records `fn(capture_stream,
/// user_data)` into a graph and instantiates it.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_graph_record(
    recorder: curt_recorder_t,
    key: *const c_void,
    key_len: usize,
    stream: curt_stream_t,
    func: Option<CurtRecordFn>,
    user_data: *mut c_void,
) -> c_int {
    // SAFETY: the caller's promises (wrapper.h), passed on.
    unsafe { record(recorder, key, key_len, stream, func, user_data, false) }
}

/// Records `fn` again and launches it as the key's recording: the key's executable
/// updated in place with the new parameters when only they changed, else replaced by
/// a new instantiation.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_graph_record_update(
    recorder: curt_recorder_t,
    key: *const c_void,
    key_len: usize,
    stream: curt_stream_t,
    func: Option<CurtRecordFn>,
    user_data: *mut c_void,
) -> c_int {
    // SAFETY: the caller's promises (wrapper.h), passed on.
    unsafe { record(recorder, key, key_len, stream, func, user_data, true) }
}

/// Drops the executable of the key `key[..key_len]`, if any; `*removed` is 1 when
/// there was one, else 0.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_recorder_remove(
    recorder: curt_recorder_t,
    key: *const c_void,
    key_len: usize,
    removed: *mut c_int,
) -> c_int {
    guard(|| {
        let removed = out(removed, "removed")?;
        // SAFETY: the caller's promise for `key` (wrapper.h).
        let key = unsafe { key_bytes(key, key_len) }?;
        let handle = recorder as u64;
        let rec = RECORDERS.get(handle)?;
        let _not_inside = Recording::enter(handle)?;
        let gone = rec
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        *removed = c_int::from(gone);
        Ok(())
    })
}

/// The statistics of `recorder`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_recorder_stats(
    recorder: curt_recorder_t,
    stats: *mut curt_recorder_stats_t,
) -> c_int {
    guard(|| {
        let stats = out(stats, "stats")?;
        let handle = recorder as u64;
        let rec = RECORDERS.get(handle)?;
        let _not_inside = Recording::enter(handle)?;
        let rec = rec.lock().unwrap_or_else(PoisonError::into_inner);
        *stats = curt_recorder_stats_t::new(rec.stats(), rec.len(), rec.capacity());
        Ok(())
    })
}
