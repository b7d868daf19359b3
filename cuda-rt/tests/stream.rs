//! Streams: identity, the per-thread per-device current stream and its scopes, stream
//! operations, host functions and callbacks, external streams.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_rt::stream::{host_func_panic_count, PER_THREAD_DEFAULT_HANDLE};
use cuda_rt::{
    current_stream_of, get_current_stream, gpu_test, AsStream, Device, ExternalStream, Stream,
    StreamEventExt, StreamRef,
};

/// A fake stream reference: only compared and made current, never given to CUDA.
fn fake(handle: usize, device: i32) -> StreamRef {
    // SAFETY: the handle is never passed to the driver in these tests.
    unsafe { StreamRef::from_raw(handle as cuda_rt::cuda_sys::driver::CUstream, device) }
}

// ---- no GPU needed ----

#[test]
fn stream_ref_equality_and_hash_are_by_handle_and_device() {
    let a = fake(0x1000, 0);
    let b = fake(0x1000, 0);
    let c = fake(0x2000, 0);
    let d = fake(0x1000, 1);
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_ne!(a, d);
    let set: HashSet<StreamRef> = [a.clone(), b, c, d].into_iter().collect();
    assert_eq!(set.len(), 3);
    assert_eq!(a.ptr(), 0x1000);
}

#[test]
fn legacy_and_per_thread_default_streams_are_distinct() {
    let legacy = StreamRef::legacy_default(0);
    let ptds = StreamRef::per_thread_default(0);
    assert_ne!(legacy, ptds);
    assert_eq!(legacy.handle(), 0);
    assert_eq!(ptds.handle(), PER_THREAD_DEFAULT_HANDLE);
    assert!(legacy.is_default() && legacy.is_legacy_default() && !legacy.is_per_thread_default());
    assert!(ptds.is_default() && ptds.is_per_thread_default() && !ptds.is_legacy_default());
    assert_eq!(Stream::null(), legacy);
    assert_eq!(Stream::per_thread(), ptds);
}

#[test]
fn current_stream_is_the_legacy_default_on_a_new_thread() {
    std::thread::spawn(|| {
        assert_eq!(get_current_stream(), StreamRef::legacy_default(0));
        assert_eq!(current_stream_of(3), StreamRef::legacy_default(3));
    })
    .join()
    .unwrap();
}

#[test]
fn stream_scope_makes_current_and_restores_on_exit() {
    std::thread::spawn(|| {
        let s = fake(0x1000, 0);
        {
            let scope = s.enter().unwrap();
            assert_eq!(*scope.previous(), StreamRef::legacy_default(0));
            assert_eq!(get_current_stream(), s);
        }
        assert_eq!(get_current_stream(), StreamRef::legacy_default(0));
    })
    .join()
    .unwrap();
}

#[test]
fn stream_scopes_nest() {
    std::thread::spawn(|| {
        let (a, b) = (fake(0x1000, 0), fake(0x2000, 0));
        let _sa = a.enter().unwrap();
        {
            let sb = b.enter().unwrap();
            assert_eq!(*sb.previous(), a);
            assert_eq!(get_current_stream(), b);
        }
        assert_eq!(get_current_stream(), a);
    })
    .join()
    .unwrap();
}

#[test]
fn use_stream_inside_a_scope_is_undone_when_the_scope_ends() {
    std::thread::spawn(|| {
        let (a, b) = (fake(0x1000, 0), fake(0x2000, 0));
        {
            let _sa = a.enter().unwrap();
            b.use_stream().unwrap();
            assert_eq!(get_current_stream(), b);
        }
        assert_eq!(get_current_stream(), StreamRef::legacy_default(0));
    })
    .join()
    .unwrap();
}

#[test]
fn use_stream_without_a_scope_stays_current() {
    std::thread::spawn(|| {
        let a = fake(0x1000, 0);
        a.use_stream().unwrap();
        assert_eq!(get_current_stream(), a);
        StreamRef::per_thread_default(0).use_stream().unwrap();
        assert_eq!(get_current_stream(), StreamRef::per_thread_default(0));
    })
    .join()
    .unwrap();
}

#[test]
fn current_stream_is_per_thread() {
    let a = fake(0x1000, 0);
    let _s = a.enter().unwrap();
    std::thread::spawn(|| assert_eq!(get_current_stream(), StreamRef::legacy_default(0)))
        .join()
        .unwrap();
    assert_eq!(get_current_stream(), a);
}

#[test]
fn stream_of_another_device_cannot_be_entered_or_used() {
    std::thread::spawn(|| {
        // Device 0 is current on a new thread; a stream of device 5 is refused before
        // any CUDA call.
        let other = fake(0x1000, 5);
        let e = other.enter().unwrap_err();
        assert!(e.to_string().contains("belongs to device 5"), "{e}");
        assert!(other.use_stream().is_err());
        assert_eq!(current_stream_of(5), StreamRef::legacy_default(5));
    })
    .join()
    .unwrap();
}

#[test]
fn external_stream_compares_by_handle_and_converts_to_a_stream_ref() {
    // SAFETY: the handle is never passed to the driver in this test.
    let e = unsafe { ExternalStream::from_raw(0x1000 as _, 0) };
    assert_eq!(e.as_stream_ref(), fake(0x1000, 0));
    assert_eq!(e, e.clone());
}

// ---- GPU ----

gpu_test!(stream_new_reads_back_flags_and_priority, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    assert!(!s.is_non_blocking());
    assert_eq!(s.priority(), 0);
    let (_least, greatest) = Device::new(0).unwrap().stream_priority_range().unwrap();
    let hi = Stream::with_options(true, greatest).unwrap();
    assert!(hi.is_non_blocking());
    assert_eq!(hi.priority(), greatest);
    // The driver agrees.
    // SAFETY: `hi` outlives `ext`.
    let ext = unsafe { ExternalStream::from_raw(hi.as_raw(), 0) };
    assert_eq!(ext.priority().unwrap(), greatest);
    assert!(ext.is_non_blocking().unwrap());
    // A priority beyond the range is clamped.
    let clamped = Stream::with_options(false, greatest - 100).unwrap();
    assert_eq!(clamped.priority(), greatest);
    assert!(Stream::non_blocking().unwrap().is_non_blocking());
});

gpu_test!(streams_compare_and_hash_by_handle, {
    Device::new(0).unwrap().use_device().unwrap();
    let a = Stream::new().unwrap();
    let b = Stream::new().unwrap();
    assert_ne!(a, b);
    assert_eq!(a, a.as_stream_ref());
    assert_eq!(a.as_stream_ref(), a);
    assert_ne!(a.as_stream_ref(), StreamRef::legacy_default(0));
    let set: HashSet<StreamRef> = [a.as_stream_ref(), b.as_stream_ref(), a.as_stream_ref()]
        .into_iter()
        .collect();
    assert_eq!(set.len(), 2);
    assert_eq!(a.ptr(), a.as_raw() as usize);
});

gpu_test!(stream_synchronize_then_query_is_done, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    s.synchronize().unwrap();
    assert!(s.query().unwrap());
    assert!(s.done().unwrap());
    AsStream::synchronize(&s).unwrap();
});

gpu_test!(default_streams_synchronize_and_query, {
    Device::new(0).unwrap().use_device().unwrap();
    for s in [Stream::null(), Stream::per_thread()] {
        s.synchronize().unwrap();
        assert!(s.query().unwrap());
    }
});

gpu_test!(stream_query_is_false_while_a_host_func_blocks_it, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::non_blocking().unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    s.launch_host_func(move || {
        let _ = rx.recv_timeout(Duration::from_secs(30));
    })
    .unwrap();
    assert!(!s.query().unwrap(), "work is pending");
    tx.send(()).unwrap();
    s.synchronize().unwrap();
    assert!(s.query().unwrap());
});

gpu_test!(launch_host_func_runs_closures_in_stream_order, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    for i in 0..16 {
        let log = log.clone();
        s.launch_host_func(move || log.lock().unwrap().push(i))
            .unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), (0..16).collect::<Vec<_>>());
});

gpu_test!(add_callback_runs_in_stream_order_with_success_status, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    for i in 0..8 {
        let log = log.clone();
        s.add_callback(move |status| log.lock().unwrap().push((i, status.is_ok())))
            .unwrap();
    }
    s.synchronize().unwrap();
    let want: Vec<_> = (0..8).map(|i| (i, true)).collect();
    assert_eq!(*log.lock().unwrap(), want);
});

gpu_test!(host_func_runs_exactly_once_and_is_dropped, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    s.launch_host_func(move || {
        m.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    s.synchronize().unwrap();
    // The driver thread drops the closure right after running it; give it a moment.
    for _ in 0..100 {
        if Arc::strong_count(&n) == 1 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(n.load(Ordering::SeqCst), 1);
    assert_eq!(Arc::strong_count(&n), 1, "the closure was dropped");
});

gpu_test!(host_func_panic_is_caught_and_later_work_still_runs, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let before = host_func_panic_count();
    let log = Arc::new(Mutex::new(Vec::new()));
    s.launch_host_func(|| panic!("panic inside a host function (expected by this test)"))
        .unwrap();
    let l = log.clone();
    s.launch_host_func(move || l.lock().unwrap().push("after"))
        .unwrap();
    s.add_callback(|_| panic!("panic inside a stream callback (expected by this test)"))
        .unwrap();
    s.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["after"]);
    assert!(host_func_panic_count() >= before + 2);
});

gpu_test!(host_func_on_the_default_streams_runs, {
    Device::new(0).unwrap().use_device().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    for s in [Stream::null(), Stream::per_thread()] {
        let m = n.clone();
        s.launch_host_func(move || {
            m.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        s.synchronize().unwrap();
    }
    assert_eq!(n.load(Ordering::SeqCst), 2);
});

gpu_test!(stream_record_without_an_event_creates_one, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let e = s.record(None).unwrap();
    assert!(e.is_recorded());
    assert_eq!(e.device_id(), 0);
    e.synchronize().unwrap();
    assert!(e.query().unwrap());
    let given = cuda_rt::Event::new(false, true, false).unwrap();
    let ptr = given.ptr();
    let back = s.record(Some(given)).unwrap();
    assert_eq!(back.ptr(), ptr, "the given event is recorded and returned");
    assert!(back.is_recorded());
});

gpu_test!(stream_wait_event_orders_work_across_streams, {
    Device::new(0).unwrap().use_device().unwrap();
    let s1 = Stream::non_blocking().unwrap();
    let s2 = Stream::non_blocking().unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let (tx, rx) = mpsc::channel::<()>();
    let l1 = log.clone();
    s1.launch_host_func(move || {
        let _ = rx.recv_timeout(Duration::from_secs(30));
        l1.lock().unwrap().push("s1");
    })
    .unwrap();
    let e = s1.record(None).unwrap();
    s2.wait_event(&e).unwrap();
    let l2 = log.clone();
    s2.launch_host_func(move || l2.lock().unwrap().push("s2"))
        .unwrap();
    assert!(!s2.query().unwrap(), "s2 waits for s1");
    tx.send(()).unwrap();
    s2.synchronize().unwrap();
    assert_eq!(*log.lock().unwrap(), vec!["s1", "s2"]);
});

gpu_test!(stream_scope_with_a_real_stream_restores_the_default, {
    Device::new(0).unwrap().use_device().unwrap();
    let before = get_current_stream();
    let s = Stream::new().unwrap();
    {
        let _scope = s.enter().unwrap();
        assert_eq!(get_current_stream(), s);
        let e = cuda_rt::event::record_now().unwrap();
        e.synchronize().unwrap();
    }
    assert_eq!(get_current_stream(), before);
});

gpu_test!(dropping_the_current_stream_keeps_it_current_and_alive, {
    std::thread::spawn(|| {
        Device::new(0).unwrap().use_device().unwrap();
        let s = Stream::new().unwrap();
        let raw = s.as_raw() as usize;
        s.use_stream().unwrap();
        assert_eq!(get_current_stream(), s);
        drop(s);
        // As in CuPy, the thread's current stream holds it: still current, still live.
        let cur = get_current_stream();
        assert_eq!(cur.handle(), raw);
        cur.synchronize().unwrap();
        StreamRef::legacy_default(0).use_stream().unwrap();
        assert_eq!(get_current_stream(), StreamRef::legacy_default(0));
    })
    .join()
    .unwrap();
});

gpu_test!(external_stream_never_destroys_the_handle, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    {
        // SAFETY: `s` outlives `ext`.
        let ext = unsafe { ExternalStream::from_raw(s.as_raw(), 0) };
        ext.synchronize().unwrap();
        assert_eq!(ext.as_stream_ref(), s.as_stream_ref());
    }
    // Still alive: the external wrapper did not destroy it.
    s.synchronize().unwrap();
    assert!(s.query().unwrap());
});

gpu_test!(stream_into_raw_and_from_raw_round_trip, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::with_options(true, 0).unwrap();
    let raw = s.into_raw().unwrap();
    // SAFETY: `raw` came from into_raw and is owned by the new value alone.
    let back = unsafe { Stream::from_raw(raw, 0) }.unwrap();
    assert!(back.is_non_blocking());
    assert_eq!(back.priority(), 0);
    back.synchronize().unwrap();
});

// ---- who keeps a stream alive (soundness, issue 14 item 4) ----

gpu_test!(
    a_stream_current_on_one_thread_and_dropped_on_another_stays_usable,
    {
        let (tx_stream, rx_stream) = mpsc::channel::<Stream>();
        let (tx_done, rx_done) = mpsc::channel::<()>();
        let user = std::thread::spawn(move || {
            Device::new(0).unwrap().use_device().unwrap();
            let s = Stream::non_blocking().unwrap();
            let raw = s.as_raw() as usize;
            s.use_stream().unwrap();
            // The stream object goes to another thread, which drops it.
            tx_stream.send(s).unwrap();
            rx_done.recv().unwrap();
            // Still current here, and still a live stream: work on it runs.
            let cur = get_current_stream();
            assert_eq!(cur.handle(), raw);
            let p = cuda_rt::memory::alloc(4096).unwrap();
            p.memset_async(0x5a, 4096, None).unwrap();
            let mut back = vec![0u8; 4096];
            p.copy_to_host_async(&mut back, None).unwrap();
            cur.synchronize().unwrap();
            assert!(back.iter().all(|&b| b == 0x5a));
            // Moving off releases the thread's hold; the stream is destroyed now.
            StreamRef::legacy_default(0).use_stream().unwrap();
            drop(cur);
            assert_eq!(get_current_stream(), StreamRef::legacy_default(0));
        });
        let s = rx_stream.recv().unwrap();
        drop(s);
        tx_done.send(()).unwrap();
        user.join().unwrap();
    }
);

gpu_test!(a_forgotten_stream_scope_leaves_a_live_stream_current, {
    std::thread::spawn(|| {
        Device::new(0).unwrap().use_device().unwrap();
        let s = Stream::new().unwrap();
        let raw = s.as_raw() as usize;
        std::mem::forget(s.enter().unwrap());
        drop(s);
        let cur = get_current_stream();
        assert_eq!(cur.handle(), raw);
        cur.synchronize().unwrap();
        assert!(cur.query().unwrap());
    })
    .join()
    .unwrap();
});

gpu_test!(a_stream_ref_outlives_its_stream_object, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let r = s.as_stream_ref();
    drop(s);
    let p = cuda_rt::memory::alloc(256).unwrap();
    p.memset_async(1, 256, Some(&r)).unwrap();
    r.synchronize().unwrap();
    let mut back = [0u8; 256];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [1u8; 256]);
});

gpu_test!(into_raw_refuses_a_stream_still_held_elsewhere, {
    Device::new(0).unwrap().use_device().unwrap();
    let s = Stream::new().unwrap();
    let r = s.as_stream_ref();
    let e = s.into_raw().unwrap_err();
    assert!(e.to_string().contains("still hold it"), "{e}");
    r.synchronize().unwrap();
});
