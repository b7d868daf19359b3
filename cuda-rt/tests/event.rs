//! Events: flags, record/query/synchronize, elapsed time and its errors, the
//! per-thread cache of released handles, IPC.

use std::sync::mpsc;
use std::time::Duration;

use cuda_rt::event::{cached_event_count, EventFlags};
use cuda_rt::{
    get_elapsed_time, gpu_test, AsStream, Device, Event, IpcEventHandle, Stream, StreamEventExt,
    StreamRef,
};

/// The variable that turns `event_ipc_child_process_helper` into the child side of
/// `event_ipc_handle_opens_in_another_process`.
const IPC_VAR: &str = "CUDA_RT_TEST_IPC_EVENT";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap();
    }
    out
}

// ---- no GPU needed ----

#[test]
fn interprocess_event_requires_disable_timing() {
    let e = Event::new(true, false, true).unwrap_err();
    assert!(
        e.to_string()
            .contains("interprocess event must have timing disabled"),
        "{e}"
    );
    assert!(Event::with_flags(EventFlags::INTERPROCESS).is_err());
}

#[test]
fn event_flags_are_cuda_values() {
    assert_eq!(EventFlags::BLOCKING_SYNC.bits(), 1);
    assert_eq!(EventFlags::DISABLE_TIMING.bits(), 2);
    assert_eq!(EventFlags::INTERPROCESS.bits(), 4);
}

#[test]
fn ipc_event_handle_bytes_round_trip() {
    let mut b = [0u8; 64];
    b[7] = 9;
    let h = IpcEventHandle::from_bytes(b);
    assert_eq!(h.as_bytes(), &b);
    assert_eq!(unhex(&hex(h.as_bytes())), b);
}

// ---- GPU ----

gpu_test!(event_new_keeps_its_flags, {
    Device::new(0).unwrap().use_device().unwrap();
    let e = Event::new(true, true, false).unwrap();
    assert_eq!(
        e.flags(),
        EventFlags::BLOCKING_SYNC | EventFlags::DISABLE_TIMING
    );
    assert_eq!(e.device_id(), 0);
    let ipc = Event::new(false, true, true).unwrap();
    assert!(ipc.flags().contains(EventFlags::INTERPROCESS));
});

gpu_test!(event_never_recorded_is_complete, {
    Device::new(0).unwrap().use_device().unwrap();
    let e = Event::new(false, false, false).unwrap();
    assert!(!e.is_recorded());
    assert!(e.query().unwrap());
    assert!(e.done().unwrap());
    e.synchronize().unwrap();
});

gpu_test!(event_record_on_current_stream_then_synchronize, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let _scope = s.enter().unwrap();
    let e = Event::new(true, false, false).unwrap();
    e.record().unwrap();
    assert!(e.is_recorded());
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    // And on the default streams.
    e.record_on(&Stream::null()).unwrap();
    e.synchronize().unwrap();
    e.record_on(&Stream::per_thread()).unwrap();
    e.synchronize().unwrap();
});

gpu_test!(event_query_is_false_until_the_stream_reaches_it, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::non_blocking().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    s.launch_host_func(move || {
        let _ = rx.recv_timeout(Duration::from_secs(30));
    })
    .unwrap();
    let e = Event::new(false, true, false).unwrap();
    e.record_on(&s).unwrap();
    assert!(!e.query().unwrap());
    tx.send(()).unwrap();
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
});

gpu_test!(elapsed_time_measures_a_host_sleep, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let start = Event::new(false, false, false).unwrap();
    let end = Event::new(false, false, false).unwrap();
    start.record_on(&s).unwrap();
    s.launch_host_func(|| std::thread::sleep(Duration::from_millis(20)))
        .unwrap();
    end.record_on(&s).unwrap();
    end.synchronize().unwrap();
    let ms = get_elapsed_time(&start, &end).unwrap();
    assert!(ms >= 15.0, "elapsed {ms} ms after a 20 ms sleep");
    assert!(ms < 10_000.0, "elapsed {ms} ms");
    assert_eq!(start.elapsed_time(&end).unwrap(), ms);
});

gpu_test!(elapsed_time_with_timing_disabled_is_a_clear_error, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let start = Event::new(false, true, false).unwrap();
    let end = Event::new(false, false, false).unwrap();
    start.record_on(&s).unwrap();
    end.record_on(&s).unwrap();
    s.synchronize().unwrap();
    let e = get_elapsed_time(&start, &end).unwrap_err().to_string();
    assert!(
        e.contains("start event was created with timing disabled"),
        "{e}"
    );
    let e = get_elapsed_time(&end, &start).unwrap_err().to_string();
    assert!(
        e.contains("end event was created with timing disabled"),
        "{e}"
    );
});

gpu_test!(elapsed_time_of_a_never_recorded_event_is_a_clear_error, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let start = Event::new(false, false, false).unwrap();
    let end = Event::new(false, false, false).unwrap();
    start.record_on(&s).unwrap();
    s.synchronize().unwrap();
    let e = get_elapsed_time(&start, &end).unwrap_err().to_string();
    assert!(e.contains("end event was never recorded"), "{e}");
    let e = get_elapsed_time(&end, &start).unwrap_err().to_string();
    assert!(e.contains("start event was never recorded"), "{e}");
});

gpu_test!(event_record_on_a_stream_of_another_device_is_refused, {
    Device::new(0).unwrap().use_device().unwrap();
    let e = Event::new(false, false, false).unwrap();
    let other = StreamRef::legacy_default(1);
    let err = e.record_on(&other).unwrap_err().to_string();
    assert!(
        err.contains("device 0") && err.contains("device 1"),
        "{err}"
    );
    assert!(!e.is_recorded());
});

gpu_test!(released_event_handle_is_reused_by_the_next_event, {
    Device::new(0).unwrap().use_device().unwrap();
    // A fresh thread has an empty cache.
    std::thread::spawn(|| {
        Device::new(0).unwrap().use_device().unwrap();
        assert_eq!(cached_event_count(), 0);
        let a = Event::new(false, true, false).unwrap();
        let ha = a.ptr();
        drop(a);
        assert_eq!(cached_event_count(), 1);
        let other_flags = Event::new(true, false, false).unwrap();
        assert_ne!(other_flags.ptr(), ha, "the cache is keyed by flags");
        assert_eq!(cached_event_count(), 1);
        let b = Event::new(false, true, false).unwrap();
        assert_eq!(b.ptr(), ha, "same flags: the released handle comes back");
        assert_eq!(cached_event_count(), 0);
        let ipc = Event::new(false, true, true).unwrap();
        drop(ipc);
        assert_eq!(
            cached_event_count(),
            0,
            "interprocess events are not cached"
        );
        drop(b);
        drop(other_flags);
        assert_eq!(cached_event_count(), 2);
    })
    .join()
    .unwrap();
});

gpu_test!(event_cache_is_bounded, {
    std::thread::spawn(|| {
        Device::new(0).unwrap().use_device().unwrap();
        let evs: Vec<Event> = (0..cuda_rt::event::EVENT_CACHE_CAPACITY + 10)
            .map(|_| Event::new(false, true, false).unwrap())
            .collect();
        drop(evs);
        assert_eq!(cached_event_count(), cuda_rt::event::EVENT_CACHE_CAPACITY);
    })
    .join()
    .unwrap();
});

gpu_test!(reused_event_counts_as_never_recorded, {
    std::thread::spawn(|| {
        Device::new(0).unwrap().use_device().unwrap();
        let s = Stream::non_blocking().unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        s.launch_host_func(move || {
            let _ = rx.recv_timeout(Duration::from_secs(30));
        })
        .unwrap();
        let a = Event::new(false, true, false).unwrap();
        a.record_on(&s).unwrap();
        assert!(!a.query().unwrap());
        let h = a.ptr();
        drop(a); // its record is still pending
        let b = Event::new(false, true, false).unwrap();
        assert_eq!(b.ptr(), h);
        assert!(!b.is_recorded());
        assert!(
            b.query().unwrap(),
            "a new event is complete, whatever the handle did"
        );
        b.synchronize().unwrap();
        // A stream waiting on it does not wait for the old record.
        let s2 = Stream::non_blocking().unwrap();
        s2.wait_event(&b).unwrap();
        s2.synchronize().unwrap();
        tx.send(()).unwrap();
        s.synchronize().unwrap();
    })
    .join()
    .unwrap();
});

gpu_test!(ipc_handle_of_a_non_interprocess_event_is_refused, {
    Device::new(0).unwrap().use_device().unwrap();
    let e = Event::new(false, true, false).unwrap();
    let err = e.ipc_handle().unwrap_err().to_string();
    assert!(err.contains("interprocess"), "{err}");
});

gpu_test!(event_ipc_handle_opens_in_another_process, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let e = Event::new(false, true, true).unwrap();
    e.record_on(&s).unwrap();
    e.synchronize().unwrap();
    let h = e.ipc_handle().unwrap();
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "event_ipc_child_process_helper",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(IPC_VAR, hex(h.as_bytes()))
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child failed:\n{text}");
    assert!(
        text.contains("ipc child: opened and synchronized"),
        "{text}"
    );
    drop(e);
});

/// The child side of `event_ipc_handle_opens_in_another_process`; does nothing unless
/// that test runs it.
#[test]
fn event_ipc_child_process_helper() {
    let Ok(h) = std::env::var(IPC_VAR) else {
        return;
    };
    Device::new(0).unwrap().use_device().unwrap();
    let ev = Event::from_ipc_handle(&IpcEventHandle::from_bytes(unhex(&h))).unwrap();
    assert!(ev.flags().contains(EventFlags::INTERPROCESS));
    ev.synchronize().unwrap();
    assert!(ev.query().unwrap());
    let s = Stream::new().unwrap();
    s.wait_event(&ev).unwrap();
    s.synchronize().unwrap();
    println!("ipc child: opened and synchronized");
}
