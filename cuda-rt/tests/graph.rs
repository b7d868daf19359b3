//! CUDA graphs: capture and replay against eager results, fork/join, allocation during
//! capture, host nodes, the capture errors, DOT dump, update, clone, explicit graphs.

#[path = "common/kernels.rs"]
mod kernels;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_rt::graph::{
    CaptureMode, CaptureStatus, DotFlags, InstantiateFlags, KernelArgs, LaunchConfig,
};
use cuda_rt::memory::{ClosureAllocator, MemoryPointer};
use cuda_rt::{
    gpu_test, ArgumentKind, AsStream, CaptureKind, Error, Event, EventFlags, Graph, Module,
    StateKind, Stream, StreamCaptureExt, StreamEventExt,
};
use kernels::{add_one, axpy, Kernels};

const N: usize = 4096;

fn read(p: &MemoryPointer, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    p.copy_to_host(&mut v).unwrap();
    v
}

fn event() -> Event {
    Event::with_flags(EventFlags::DISABLE_TIMING).unwrap()
}

/// The pipeline: with `x` in, `y` out, on `s1` forking to `s2` and joining back:
/// t = x + 1 (s1), u = 3x (s2, allocated there), y = 0; y += t; y += 0.5 u, so
/// y = 2.5x + 1. Temporaries are returned, to be dropped by the caller.
fn pipeline(
    k: &Kernels,
    s1: &Stream,
    s2: &Stream,
    x: &MemoryPointer,
    y: &MemoryPointer,
    ran: &Arc<AtomicUsize>,
) -> Vec<MemoryPointer> {
    let bytes = N * 4;
    let _on1 = s1.enter().unwrap();
    let t = cuda_rt::alloc(bytes).unwrap();
    t.copy_from_device_async(x, bytes, None).unwrap();
    let fork = s1.record(Some(event())).unwrap();
    s2.wait_event(&fork).unwrap();
    // SAFETY: t holds N f32 on device 0, freed on s1 only after this pipeline's
    // kernels (stream-ordered, or a free node of the captured graph).
    unsafe { add_one(k, s1, t.ptr(), N) };
    let u = {
        let _on2 = s2.enter().unwrap();
        let u = cuda_rt::alloc(bytes).unwrap();
        u.copy_from_device_async(x, bytes, None).unwrap();
        // SAFETY: u and x hold N f32 each; u is freed after the join, x is the
        // caller's and outlives the pipeline's work (and every graph launch).
        unsafe { axpy(k, s2, u.ptr(), x.ptr(), 2.0, N) };
        u
    };
    let join = s2.record(Some(event())).unwrap();
    s1.wait_event(&join).unwrap();
    y.memset_async(0, bytes, None).unwrap();
    // SAFETY: y, t and u hold N f32 each; y is the caller's (alive past the work), t
    // and u are freed on s1 after these kernels.
    unsafe {
        axpy(k, s1, y.ptr(), t.ptr(), 1.0, N);
        axpy(k, s1, y.ptr(), u.ptr(), 0.5, N);
    }
    let r = ran.clone();
    s1.launch_host_func_repeatable(move || {
        r.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    vec![t, u]
}

/// Graph tests run one at a time: a capture in global mode (and CUDA's own checks
/// during any capture) would make other tests' module loads and allocations fail.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

gpu_test!(
    captured_fork_join_with_allocations_equals_eager_over_100_replays,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s1 = Stream::non_blocking().unwrap();
        let s2 = Stream::non_blocking().unwrap();
        let x = cuda_rt::alloc(N * 4).unwrap();
        let y = cuda_rt::alloc(N * 4).unwrap();
        let y_eager = cuda_rt::alloc(N * 4).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));

        s1.begin_capture(CaptureMode::Global).unwrap();
        assert!(s1.is_capturing().unwrap());
        assert!(matches!(
            s1.capture_status().unwrap(),
            CaptureStatus::Active { .. }
        ));
        let temps = pipeline(&k, &s1, &s2, &x, &y, &ran);
        {
            let _on1 = s1.enter().unwrap();
            drop(temps); // freed inside the graph (memory-free nodes)
        }
        let graph = s1.end_capture().unwrap();
        assert!(!s1.is_capturing().unwrap());
        assert_eq!(graph.owned_allocation_count(), 0);
        assert_eq!(ran.load(Ordering::SeqCst), 0, "captured, not run");

        let eager_ran = Arc::new(AtomicUsize::new(0));
        for i in 0..100 {
            let input: Vec<f32> = (0..N).map(|j| (i * 7 + j) as f32 * 0.25 - 100.0).collect();
            x.copy_from_host(&input).unwrap();
            graph.launch(&s1).unwrap();
            s1.synchronize().unwrap();
            let got = read(&y, N);
            // eager, with the same kernels and allocations from the allocator
            let temps = pipeline(&k, &s1, &s2, &x, &y_eager, &eager_ran);
            s1.synchronize().unwrap();
            drop(temps);
            let want = read(&y_eager, N);
            assert_eq!(got, want, "replay {i} differs from eager");
            for (j, (&g, &xi)) in got.iter().zip(&input).enumerate() {
                let h = 2.5 * xi + 1.0;
                assert!(
                    (g - h).abs() <= 1e-3 * h.abs().max(1.0),
                    "replay {i}[{j}]: {g} vs {h}"
                );
            }
        }
        assert_eq!(
            ran.load(Ordering::SeqCst),
            100,
            "host node ran once per launch"
        );
    }
);

/// A fork whose temporaries go out of scope at the end of its block, after its join
/// event: with `x` in, `y` out, t = x + 1 (s1's temporary); on s2, u = 3x and
/// v = u + 1 (s2's temporaries, dropped on s2 after the join), w = v (allocated on s1
/// before the fork); then y = t + 0.5 w = 2.5x + 1.5, and t and w drop on s1.
fn late_free_pipeline(k: &Kernels, s1: &Stream, s2: &Stream, x: &MemoryPointer, y: &MemoryPointer) {
    let bytes = N * 4;
    let _on1 = s1.enter().unwrap();
    let t = cuda_rt::alloc(bytes).unwrap();
    t.copy_from_device_async(x, bytes, None).unwrap();
    // SAFETY: t holds N f32, freed on s1 after every kernel that uses it.
    unsafe { add_one(k, s1, t.ptr(), N) };
    let w = cuda_rt::alloc(bytes).unwrap();
    let fork = s1.record(Some(event())).unwrap();
    s2.wait_event(&fork).unwrap();
    {
        let _on2 = s2.enter().unwrap();
        let u = cuda_rt::alloc(bytes).unwrap();
        u.copy_from_device_async(x, bytes, None).unwrap();
        // SAFETY: u and x hold N f32; u is freed on s2 after this kernel, x outlives
        // the work (and every launch of the graph).
        unsafe { axpy(k, s2, u.ptr(), x.ptr(), 2.0, N) };
        let v = cuda_rt::alloc(bytes).unwrap();
        v.copy_from_device_async(&u, bytes, None).unwrap();
        // SAFETY: v holds N f32, freed on s2 after this kernel.
        unsafe { add_one(k, s2, v.ptr(), N) };
        w.copy_from_device_async(&v, bytes, None).unwrap();
        let join = s2.record(Some(event())).unwrap();
        s1.wait_event(&join).unwrap();
        // u and v drop here, s2 current: freed on s2, after the join event.
    }
    y.memset_async(0, bytes, None).unwrap();
    // SAFETY: y, t and w hold N f32 each; y is the caller's, t and w are freed on s1
    // after these kernels.
    unsafe {
        axpy(k, s1, y.ptr(), t.ptr(), 1.0, N);
        axpy(k, s1, y.ptr(), w.ptr(), 0.5, N);
    }
}

gpu_test!(
    fork_join_capture_with_temporaries_freed_after_the_join_on_both_streams_replays_like_eager,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s1 = Stream::non_blocking().unwrap();
        let s2 = Stream::non_blocking().unwrap();
        let x = cuda_rt::alloc(N * 4).unwrap();
        let y = cuda_rt::alloc(N * 4).unwrap();
        let y_eager = cuda_rt::alloc(N * 4).unwrap();

        s1.begin_capture(CaptureMode::Global).unwrap();
        late_free_pipeline(&k, &s1, &s2, &x, &y);
        let graph = s1.end_capture().unwrap();
        assert!(!s1.is_capturing().unwrap());
        assert!(!s2.is_capturing().unwrap());
        assert_eq!(
            graph.owned_allocation_count(),
            0,
            "every temporary is freed inside the graph"
        );

        for i in 0..20 {
            let input: Vec<f32> = (0..N).map(|j| (i * 5 + j) as f32 * 0.5 - 300.0).collect();
            x.copy_from_host(&input).unwrap();
            graph.launch(&s1).unwrap();
            s1.synchronize().unwrap();
            let got = read(&y, N);
            late_free_pipeline(&k, &s1, &s2, &x, &y_eager);
            s1.synchronize().unwrap();
            s2.synchronize().unwrap();
            assert_eq!(got, read(&y_eager, N), "replay {i} differs from eager");
            for (j, (&g, &xi)) in got.iter().zip(&input).enumerate() {
                let h = 2.5 * xi + 1.5;
                assert!(
                    (g - h).abs() <= 1e-3 * h.abs().max(1.0),
                    "replay {i}[{j}]: {g} vs {h}"
                );
            }
        }
    }
);

gpu_test!(work_after_a_late_free_on_a_fork_is_still_unjoined, {
    let _serial = serial();
    let k = Kernels::load();
    let s1 = Stream::non_blocking().unwrap();
    let s2 = Stream::non_blocking().unwrap();
    let _on1 = s1.enter().unwrap();
    s1.begin_capture(CaptureMode::Global).unwrap();
    let fork = s1.record(Some(event())).unwrap();
    s2.wait_event(&fork).unwrap();
    {
        let _on2 = s2.enter().unwrap();
        let u = cuda_rt::alloc(N * 4).unwrap();
        // SAFETY: u holds N f32, freed on s2 after this kernel.
        unsafe { add_one(&k, &s2, u.ptr(), N) };
        let join = s2.record(Some(event())).unwrap();
        s1.wait_event(&join).unwrap();
        drop(u); // a late free: joined at the end
        kernels::empty(&k, &s2); // after the join: never joined back
    }
    let e = s1.end_capture().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: CaptureKind::Unjoined,
                ..
            }
        ),
        "{e}"
    );
});

gpu_test!(
    a_fork_never_joined_is_unjoined_even_when_its_last_work_is_a_free,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s1 = Stream::non_blocking().unwrap();
        let s2 = Stream::non_blocking().unwrap();
        let _on1 = s1.enter().unwrap();
        s1.begin_capture(CaptureMode::Global).unwrap();
        let fork = s1.record(Some(event())).unwrap();
        s2.wait_event(&fork).unwrap();
        {
            let _on2 = s2.enter().unwrap();
            let u = cuda_rt::alloc(N * 4).unwrap();
            // SAFETY: u holds N f32, freed on s2 after this kernel.
            unsafe { add_one(&k, &s2, u.ptr(), N) };
            // u drops here: the fork's last work is its free, and the fork is never
            // joined back.
        }
        let e = s1.end_capture().unwrap_err();
        assert!(
            matches!(
                e,
                Error::Capture {
                    kind: CaptureKind::Unjoined,
                    ..
                }
            ),
            "{e}"
        );
    }
);

gpu_test!(
    allocation_kept_after_capture_is_owned_by_the_graph_and_valid_each_replay,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        let out = {
            let _on = s.enter().unwrap();
            s.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let out = cuda_rt::alloc(N * 4).unwrap();
            out.memset_async(0, N * 4, None).unwrap();
            // SAFETY: out holds N f32 and stays alive past every launch of the graph
            // (the test keeps it, and the graph owns the allocation).
            unsafe {
                add_one(&k, &s, out.ptr(), N);
                add_one(&k, &s, out.ptr(), N);
            }
            out
        };
        let graph = s.end_capture().unwrap();
        assert_eq!(graph.owned_allocation_count(), 1);
        assert!(graph
            .flags()
            .contains(InstantiateFlags::AUTO_FREE_ON_LAUNCH));
        for _ in 0..3 {
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            assert!(read(&out, N).iter().all(|&v| v == 2.0));
        }
        let e = graph.try_clone().unwrap_err();
        assert!(e.to_string().contains("cannot be cloned"), "{e}");
        // Nor updated, either way round: each executable has its own addresses.
        let mut plain = {
            let _on = s.enter().unwrap();
            s.begin_capture(CaptureMode::ThreadLocal).unwrap();
            // SAFETY: out holds N f32 and outlives the graph (dropped below, first).
            unsafe { add_one(&k, &s, out.ptr(), N) };
            s.end_capture().unwrap()
        };
        let mut graph = graph;
        for e in [plain.update(&graph), graph.update(&plain)] {
            let e = e.unwrap_err();
            assert!(e.to_string().contains("cannot be updated"), "{e}");
        }
        drop(plain);
        for _ in 0..2 {
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            assert!(read(&out, N).iter().all(|&v| v == 2.0));
        }
        drop(graph);
        // the pointer outlives the graph: the last launch's block is still there
        assert!(read(&out, N).iter().all(|&v| v == 2.0));
    }
);

gpu_test!(
    memory_dropped_during_capture_is_freed_only_after_the_graph,
    {
        let _serial = serial();
        let k = Kernels::load();
        let frees = Arc::new(AtomicUsize::new(0));
        let f2 = frees.clone();
        let malloc = |size, _dev| {
            let p = cuda_rt::memory::Memory::new(size)?;
            let ptr = cuda_rt::memory::BaseMemory::ptr(&p);
            std::mem::forget(p);
            Ok(ptr)
        };
        let free = move |ptr, _size, _dev| {
            f2.fetch_add(1, Ordering::SeqCst);
            let api = cuda_rt::cuda_sys::driver::api().unwrap();
            // SAFETY: `ptr` came from cuMemAlloc in `malloc` and is freed once here.
            unsafe { api.cuMemFree_v2().unwrap()(ptr) };
        };
        // SAFETY: cuMemAlloc'd memory, freed once with cuMemFree by `free`.
        let alloc = unsafe { ClosureAllocator::new(malloc, free) };
        let m = cuda_rt::memory::using_allocator(
            Some(cuda_rt::memory::Allocator::Closures(alloc)),
            || cuda_rt::alloc(N * 4).unwrap(),
        );
        m.memset(0, N * 4).unwrap();
        let s = Stream::non_blocking().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        // SAFETY: m holds N f32; dropped during the capture, it is freed only after the
        // graph (what this test checks).
        unsafe { add_one(&k, &s, m.ptr(), N) };
        drop(m); // the graph uses it: it must not be freed yet
        let graph = s.end_capture().unwrap();
        assert_eq!(frees.load(Ordering::SeqCst), 0);
        for _ in 0..3 {
            graph.launch(&s).unwrap();
        }
        assert_eq!(frees.load(Ordering::SeqCst), 0);
        drop(graph); // waits for its launches, then releases what it kept
        assert_eq!(frees.load(Ordering::SeqCst), 1);
    }
);

gpu_test!(captured_host_function_lives_as_long_as_the_graph, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let n = Arc::new(AtomicUsize::new(0));
    let m = n.clone();
    s.begin_capture(CaptureMode::Global).unwrap();
    s.launch_host_func_repeatable(move || {
        m.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    // a run-once closure cannot be captured, and says what to use instead
    let e = s.launch_host_func(|| {}).unwrap_err();
    assert!(e.to_string().contains("launch_host_func_repeatable"), "{e}");
    let graph = s.end_capture().unwrap();
    let copy = graph.try_clone().unwrap();
    drop(graph);
    for _ in 0..5 {
        copy.launch(&s).unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 5);
    drop(copy);
    // the driver drops the closure (a user object) after the last reference goes
    let t = Instant::now();
    while Arc::strong_count(&n) > 1 && t.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(Arc::strong_count(&n), 1, "the closure was released");
});

// ---- errors ----

gpu_test!(begin_capture_on_the_legacy_default_stream_is_refused, {
    let _serial = serial();
    cuda_rt::device::set_device_id(0).unwrap();
    let e = Stream::null()
        .begin_capture(CaptureMode::Relaxed)
        .unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: CaptureKind::LegacyStream,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("legacy default stream"), "{e}");
});

gpu_test!(is_capturing_on_the_legacy_stream_asks_the_driver, {
    let _serial = serial();
    cuda_rt::device::set_device_id(0).unwrap();
    let legacy = Stream::null();
    assert!(!legacy.is_capturing().unwrap(), "nothing captures");
    // A blocking stream capturing in global mode: the driver answers the legacy
    // stream's question with its implicit-synchronization error, as CuPy reports.
    let s = Stream::new().unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let e = legacy.is_capturing().unwrap_err();
    let ended = s.end_capture();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: CaptureKind::LegacyStream,
                ..
            }
        ),
        "{e}"
    );
    if let Err(err) = ended {
        eprintln!("note: the question invalidated the capture: {err}");
    }
    assert!(!legacy.is_capturing().unwrap(), "the capture is over");
});

gpu_test!(
    synchronize_during_capture_is_a_capture_error_and_invalidates_it,
    {
        let _serial = serial();
        let s = Stream::non_blocking().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        let e = s.synchronize().unwrap_err();
        assert!(
            matches!(
                e,
                Error::Capture {
                    kind: CaptureKind::Invalidated,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("capture is now invalid"), "{e}");
        assert_eq!(s.capture_status().unwrap(), CaptureStatus::Invalidated);
        let e = s.end_capture().unwrap_err();
        assert!(
            matches!(
                e,
                Error::Capture {
                    kind: CaptureKind::Invalidated,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("invalidated"), "{e}");
        assert!(!s.is_capturing().unwrap());
        assert!(!cuda_rt::graph::any_capture_active());
    }
);

gpu_test!(synchronous_copy_during_capture_is_a_capture_error, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let p = cuda_rt::alloc(64).unwrap();
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    {
        let _on = s.enter().unwrap();
        let e = p.copy_from_host(&[1u8; 64]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Capture {
                    kind: CaptureKind::Refused,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("capturing a graph"), "{e}");
    }
    // refused before reaching the driver: the capture is still good
    s.end_capture().unwrap();
});

gpu_test!(
    synchronous_legacy_copy_during_a_global_capture_is_a_capture_error,
    {
        let _serial = serial();
        let s = Stream::non_blocking().unwrap();
        let p = cuda_rt::alloc(64).unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        // current stream: the legacy default one. Whether the driver refuses a
        // plain synchronous copy during another stream's global capture is its call;
        // when it does, the error must be a capture error in words.
        let r = p.copy_from_host(&[1u8; 64]);
        let _ = s.end_capture();
        match r {
            Ok(()) => eprintln!("note: the driver allowed a legacy copy during a global capture"),
            Err(e) => {
                assert!(matches!(e, Error::Capture { .. }), "{e}");
                assert!(e.to_string().contains("capturing a graph"), "{e}");
            }
        }
    }
);

gpu_test!(end_capture_on_a_stream_not_capturing_is_an_error, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let e = s.end_capture().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: CaptureKind::NotCapturing,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("not capturing"), "{e}");
});

gpu_test!(unjoined_fork_is_a_capture_error, {
    let _serial = serial();
    let k = Kernels::load();
    let s1 = Stream::non_blocking().unwrap();
    let s2 = Stream::non_blocking().unwrap();
    s1.begin_capture(CaptureMode::Global).unwrap();
    let fork = s1.record(Some(event())).unwrap();
    s2.wait_event(&fork).unwrap();
    kernels::empty(&k, &s2); // never joined back into s1
    let e = s1.end_capture().unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: CaptureKind::Unjoined,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("never joined back"), "{e}");
});

// ---- DOT, update, clone, flags ----

gpu_test!(dot_dump_contains_the_nodes, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let p = cuda_rt::alloc(N * 4).unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    // SAFETY: p holds N f32 and outlives the graph, which is never launched.
    unsafe {
        add_one(&k, &s, p.ptr(), N);
        axpy(&k, &s, p.ptr(), p.ptr(), 1.0, N);
    }
    let graph = s.end_capture().unwrap();
    assert_eq!(graph.node_count().unwrap(), 2);
    let dot = graph.to_dot(DotFlags::VERBOSE).unwrap();
    assert!(dot.contains("digraph"), "{dot}");
    assert!(dot.contains("add_one"), "{dot}");
    assert!(dot.contains("axpy"), "{dot}");
    // Without flags, the topology only: shorter, and no kernel parameters.
    let plain = graph.to_dot(DotFlags::empty()).unwrap();
    assert!(plain.contains("digraph"), "{plain}");
    assert!(plain.len() < dot.len(), "{plain}");
    let params = graph.to_dot(DotFlags::KERNEL_NODE_PARAMS).unwrap();
    assert!(params.contains("add_one"), "{params}");
    let path = std::env::temp_dir().join(format!("cuda-rt-test-{}.dot", std::process::id()));
    graph.debug_dot_print(&path, DotFlags::VERBOSE).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(text.contains("add_one"));
});

fn capture_add_one(k: &Kernels, s: &Stream, p: &MemoryPointer, times: usize) -> Graph {
    s.begin_capture(CaptureMode::Global).unwrap();
    for _ in 0..times {
        // SAFETY: p holds N f32; the callers keep it past every launch of the graph.
        unsafe { add_one(k, s, p.ptr(), N) };
    }
    s.end_capture().unwrap()
}

gpu_test!(
    update_takes_the_parameters_of_a_recapture_with_the_same_topology,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        let a = cuda_rt::alloc(N * 4).unwrap();
        let b = cuda_rt::alloc(N * 4).unwrap();
        a.memset(0, N * 4).unwrap();
        b.memset(0, N * 4).unwrap();
        let mut g = capture_add_one(&k, &s, &a, 1);
        let g_b = capture_add_one(&k, &s, &b, 1);
        g.update(&g_b).unwrap();
        g.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert!(read(&a, N).iter().all(|&v| v == 0.0), "a untouched");
        assert!(read(&b, N).iter().all(|&v| v == 1.0), "b updated");
        let two = capture_add_one(&k, &s, &a, 2);
        let e = g.update(&two).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    kind: ArgumentKind::Incompatible,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("topology"), "{e}");
        // unchanged after the refusal
        g.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert!(read(&b, N).iter().all(|&v| v == 2.0));
    }
);

gpu_test!(clone_runs_like_the_original, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let p = cuda_rt::alloc(N * 4).unwrap();
    p.memset(0, N * 4).unwrap();
    let g = capture_add_one(&k, &s, &p, 3);
    let c = g.try_clone().unwrap();
    assert!(!c.is_instantiated());
    assert_eq!(c.node_count().unwrap(), 3);
    g.launch(&s).unwrap();
    c.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert!(read(&p, N).iter().all(|&v| v == 6.0));
});

gpu_test!(instantiate_flags_are_kept_and_uploaded_graphs_run, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let p = cuda_rt::alloc(N * 4).unwrap();
    p.memset(0, N * 4).unwrap();
    s.begin_capture(CaptureMode::Relaxed).unwrap();
    // SAFETY: p holds N f32 and outlives the graph's launches (synchronized below).
    unsafe { add_one(&k, &s, p.ptr(), N) };
    let flags = InstantiateFlags::USE_NODE_PRIORITY;
    let mut g = s.end_capture_with(flags).unwrap();
    assert_eq!(g.flags(), flags);
    g.upload(&s).unwrap();
    g.launch(&s).unwrap();
    g.instantiate(InstantiateFlags::UPLOAD).unwrap();
    g.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert!(read(&p, N).iter().all(|&v| v == 2.0));
});

// ---- explicit graphs ----

gpu_test!(explicit_graph_of_every_node_type_runs, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let a = cuda_rt::alloc(N * 4).unwrap();
    let b = cuda_rt::alloc(N * 4).unwrap();
    b.memset(0, N * 4).unwrap();
    let hits = Arc::new(AtomicUsize::new(0));
    let h = hits.clone();
    let ev = Arc::new(event());

    // child: b += 1
    let child = Graph::new().unwrap();
    let mut args = KernelArgs::new();
    args.push_ptr(&b).push(N as i32);
    let cfg = LaunchConfig::new(kernels::blocks(N), 256);
    // SAFETY: add_one(float* x, int n) gets b (kept alive by the graph) and n = N, the
    // floats b holds; the module is never unloaded.
    unsafe { child.add_kernel_node(&[], &k.add_one, cfg, &args) }.unwrap();

    let g = Graph::new().unwrap();
    let set = g.add_memset_node(&[], &a, 1.0f32.to_bits(), 4, N).unwrap();
    let mut args = KernelArgs::new();
    args.push_ptr(&a).push(N as i32);
    // SAFETY: as above, with a.
    let kern = unsafe { g.add_kernel_node(&[set], &k.add_one, cfg, &args) }.unwrap(); // a = 2
    let copy = g.add_memcpy_node(&[kern], &b, &a, N * 4).unwrap(); // b = 2
    let rec = g.add_event_record_node(&[copy], ev.clone()).unwrap();
    let wait = g.add_event_wait_node(&[rec], ev.clone()).unwrap();
    let kid = g.add_child_graph_node(&[wait], &child).unwrap(); // b = 3
    let host = g
        .add_host_node(&[kid], move || {
            h.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let mut x = a.ptr();
    let mut n = N as i32;
    let raw = [
        (&mut x as *mut u64).cast::<std::ffi::c_void>(),
        (&mut n as *mut i32).cast::<std::ffi::c_void>(),
    ];
    // SAFETY: add_one(float*, int) with a pointer to a's address and to an int; the
    // module is never unloaded and `a` outlives the graph.
    let last = unsafe { g.add_kernel_node_raw(&[host], k.add_one.0, cfg, &raw) }.unwrap(); // a = 3
    let _join = g.add_empty_node(&[last]).unwrap();
    assert_eq!(g.node_count().unwrap(), 9);
    let types: Vec<_> = g
        .nodes()
        .unwrap()
        .iter()
        .map(|n| n.node_type().unwrap())
        .collect();
    assert_eq!(types.len(), 9);

    for round in 1..=2 {
        g.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert!(read(&a, N).iter().all(|&v| v == 3.0), "round {round}");
        assert!(read(&b, N).iter().all(|&v| v == 3.0), "round {round}");
        assert_eq!(hits.load(Ordering::SeqCst), round);
    }
    // waiting on the event the graph records works outside it
    s.wait_event(&ev).unwrap();
    ev.synchronize().unwrap();
});

// ---- soundness: nodes, kernel nodes' modules, threads ----

/// `Graph` moves between threads but is not shared by them (the compile-fail test
/// `graph_shared_across_threads` holds the other half).
#[test]
fn graph_is_send() {
    fn send<T: Send>() {}
    send::<Graph>();
}

gpu_test!(
    kernel_node_keeps_its_module_loaded_after_function_and_module_drop,
    {
        let _serial = serial();
        cuda_rt::device::set_device_id(0).unwrap();
        let s = Stream::non_blocking().unwrap();
        let p = cuda_rt::alloc(N * 4).unwrap();
        let input: Vec<f32> = (0..N).map(|j| j as f32 * 0.5 - 700.0).collect();
        p.copy_from_host(&input).unwrap();
        let g = Graph::new().unwrap();
        {
            let module = Module::load_data(kernels::PTX.as_bytes()).unwrap();
            let f = module.get_function("add_one").unwrap();
            let mut args = KernelArgs::new();
            args.push_ptr(&p).push(N as i32);
            let cfg = LaunchConfig::new(kernels::blocks(N), 256);
            // SAFETY: add_one(float* x, int n) gets p (kept alive by the graph) and
            // n = N, the floats p holds.
            unsafe { g.add_kernel_node(&[], &f, cfg, &args) }.unwrap();
            drop(f);
            drop(module);
        }
        // Load and unload other modules meanwhile: a dangling CUfunction would now
        // name freed or reused driver memory.
        for _ in 0..4 {
            let m = Module::load_data(kernels::PTX.as_bytes()).unwrap();
            let _ = m.get_function("axpy").unwrap();
        }
        for round in 1..=3 {
            g.launch(&s).unwrap();
            s.synchronize().unwrap();
            let got = read(&p, N);
            for (j, (&v, &x)) in got.iter().zip(&input).enumerate() {
                assert_eq!(v, x + round as f32, "round {round}, element {j}");
            }
        }
        // a clone keeps the module too, after the original is gone
        let c = g.try_clone().unwrap();
        drop(g);
        c.launch(&s).unwrap();
        s.synchronize().unwrap();
        let got = read(&p, N);
        for (j, (&v, &x)) in got.iter().zip(&input).enumerate() {
            assert_eq!(v, x + 4.0, "clone, element {j}");
        }
    }
);

gpu_test!(
    kernel_node_arguments_are_checked_where_the_driver_can_tell,
    {
        let _serial = serial();
        cuda_rt::device::set_device_id(0).unwrap();
        let module = Module::load_data(kernels::PTX.as_bytes()).unwrap();
        let f = module.get_function("add_one").unwrap();
        let sizes = match f.param_sizes() {
            Ok(sizes) => sizes,
            Err(why) => {
                // Nothing would catch a missing argument: the driver would read past
                // the parameter array. Not tried.
                eprintln!("note: skipped: {why}");
                return;
            }
        };
        assert_eq!(sizes, &[8, 4]);
        let p = cuda_rt::alloc(N * 4).unwrap();
        let g = Graph::new().unwrap();
        let mut args = KernelArgs::new();
        args.push_ptr(&p);
        // SAFETY: the driver reported the parameter sizes, so the argument list with n
        // missing is refused before it reaches the driver.
        let r = unsafe { g.add_kernel_node(&[], &f, LaunchConfig::new(1, 1), &args) };
        let e = r.unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    kind: ArgumentKind::KernelArguments,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("2 parameter(s)"), "{e}");
        assert_eq!(g.node_count().unwrap(), 0);
    }
);

gpu_test!(
    nodes_of_one_graph_are_held_together_and_refused_by_another,
    {
        let _serial = serial();
        cuda_rt::device::set_device_id(0).unwrap();
        let a = Graph::new().unwrap();
        let b = Graph::new().unwrap();
        // several nodes held while more are added (the add methods take &self)
        let n1 = b.add_empty_node(&[]).unwrap();
        let n2 = b.add_empty_node(&[]).unwrap();
        let join = b.add_empty_node(&[n1, n2]).unwrap();
        let listed = b.nodes().unwrap();
        assert_eq!(listed.len(), 3);
        assert!(listed.contains(&n1) && listed.contains(&n2) && listed.contains(&join));
        assert_eq!(join.graph_raw(), b.as_raw());
        // a node of graph a as a dependency in graph b: an error, b unchanged
        let na = a.add_empty_node(&[]).unwrap();
        let e = b.add_empty_node(&[join, na]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    kind: ArgumentKind::Incompatible,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("belongs to graph"), "{e}");
        assert_eq!(b.node_count().unwrap(), 3);
        // and a node of a graph's clone is not a node of the graph
        let c = b.try_clone().unwrap();
        let nc = c.nodes().unwrap()[0];
        assert!(b.add_empty_node(&[nc]).is_err());
        let s = Stream::non_blocking().unwrap();
        b.launch(&s).unwrap();
        s.synchronize().unwrap();
    }
);

gpu_test!(a_graph_moves_to_another_thread_and_launches_there, {
    let _serial = serial();
    let k = Kernels::load();
    let p = cuda_rt::alloc(N * 4).unwrap();
    p.memset(0, N * 4).unwrap();
    let s = Stream::non_blocking().unwrap();
    let g = capture_add_one(&k, &s, &p, 2);
    let q = p.clone();
    std::thread::spawn(move || {
        cuda_rt::device::set_device_id(0).unwrap();
        let s = Stream::non_blocking().unwrap();
        g.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert!(read(&q, N).iter().all(|&v| v == 2.0));
    })
    .join()
    .unwrap();
});

// ---- soundness: memory of failed captures and of other threads ----

gpu_test!(
    allocations_of_a_failed_capture_free_nothing_of_another_graph,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        // Capture A allocates, then a synchronize invalidates it: no graph comes of it.
        let mut stale: Vec<MemoryPointer> = {
            let _on = s.enter().unwrap();
            s.begin_capture(CaptureMode::ThreadLocal).unwrap();
            let v: Vec<_> = (0..4).map(|_| cuda_rt::alloc(N * 4).unwrap()).collect();
            let e = s.synchronize().unwrap_err();
            assert!(matches!(e, Error::Capture { .. }), "{e}");
            v
        };
        let e = s.end_capture().unwrap_err();
        assert!(e.to_string().contains("invalidated"), "{e}");
        let stale_addrs: Vec<u64> = stale.iter().map(MemoryPointer::ptr).collect();
        // Nothing can be written through them any more: every use is refused, and
        // their size never changes (BaseMemory's rule).
        let gone = |e: Error| {
            assert!(
                matches!(
                    e,
                    Error::InvalidState {
                        kind: StateKind::GraphMemoryGone,
                        ..
                    }
                ),
                "{e}"
            )
        };
        for p in &stale {
            assert_eq!(p.size(), N * 4);
            gone(p.memset_async(1, 4, Some(&s)).unwrap_err());
            gone(p.copy_from_host(&[1.0f32]).unwrap_err());
            gone(p.memset(1, 4).unwrap_err());
        }
        // Capture B allocates (its addresses may be A's) and keeps its allocation;
        // half of A's pointers drop during B's capture, on B's stream.
        let (out, b) = {
            let _on = s.enter().unwrap();
            s.begin_capture(CaptureMode::Global).unwrap();
            let out = cuda_rt::alloc(N * 4).unwrap();
            out.memset_async(0, N * 4, None).unwrap();
            for _ in 0..3 {
                // SAFETY: out holds N f32, an allocation of this capture that the
                // graph owns afterwards; the test keeps it past every launch.
                unsafe { add_one(&k, &s, out.ptr(), N) };
            }
            stale.truncate(2);
            (out, s.end_capture().unwrap())
        };
        eprintln!(
            "failed capture's addresses {stale_addrs:#x?}, the graph's {:#x}",
            out.ptr()
        );
        assert_eq!(b.owned_allocation_count(), 1);
        b.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert!(read(&out, N).iter().all(|&v| v == 3.0));
        // The rest drop after B: still nothing of B's may be freed.
        drop(stale);
        for round in 0..3 {
            b.launch(&s).unwrap();
            s.synchronize().unwrap();
            let got = read(&out, N);
            assert!(
                got.iter().all(|&v| v == 3.0),
                "round {round}: {:?}",
                &got[..4]
            );
        }
        // A new allocation elsewhere does not land in B's memory either.
        let other = cuda_rt::alloc(N * 4).unwrap();
        other.memset(0xff, N * 4).unwrap();
        b.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert!(read(&out, N).iter().all(|&v| v == 3.0));
        assert!(!cuda_rt::graph::any_capture_active());
    }
);

gpu_test!(
    allocations_of_an_unjoined_capture_free_nothing_after_it_fails,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s1 = Stream::non_blocking().unwrap();
        let s2 = Stream::non_blocking().unwrap();
        let stale = {
            let _on = s1.enter().unwrap();
            s1.begin_capture(CaptureMode::Global).unwrap();
            let p = cuda_rt::alloc(N * 4).unwrap();
            let fork = s1.record(Some(event())).unwrap();
            s2.wait_event(&fork).unwrap();
            kernels::empty(&k, &s2); // never joined back
            p
        };
        let e = s1.end_capture().unwrap_err();
        assert!(e.to_string().contains("never joined back"), "{e}");
        let p = cuda_rt::alloc(N * 4).unwrap();
        p.memset(0, N * 4).unwrap();
        let g = capture_add_one(&k, &s1, &p, 1);
        drop(stale); // frees nothing: its capture is gone
        g.launch(&s1).unwrap();
        s1.synchronize().unwrap();
        assert!(read(&p, N).iter().all(|&v| v == 1.0));
    }
);

gpu_test!(
    memory_dropped_on_another_thread_during_a_capture_is_not_kept_by_its_graph,
    {
        let _serial = serial();
        let k = Kernels::load();
        let pool = cuda_rt::MemoryPool::new();
        let x = cuda_rt::alloc(N * 4).unwrap();
        x.memset(0, N * 4).unwrap();
        let s = Stream::non_blocking().unwrap();
        let bytes = (N * 4) as u64;
        for mode in [
            CaptureMode::ThreadLocal,
            CaptureMode::Relaxed,
            CaptureMode::Global,
        ] {
            let m = pool.malloc(N * 4).unwrap();
            let used = pool.used_bytes();
            assert!(used >= bytes);
            s.begin_capture(mode).unwrap();
            x.memset_async(0, N * 4, Some(&s)).unwrap();
            // SAFETY: x holds N f32 and outlives every launch of the graph.
            unsafe { add_one(&k, &s, x.ptr(), N) };
            // m is not used by the capture; its last pointer drops on another thread
            std::thread::spawn(move || drop(m)).join().unwrap();
            let during = pool.used_bytes();
            let graph = s.end_capture().unwrap();
            let after_end = pool.used_bytes();
            if mode == CaptureMode::Global {
                // CUDA refuses a free's driver calls on every thread during a global
                // capture: the free waits for the capture's end, not the graph's.
                assert_eq!(during, used, "{mode:?}: deferred while capturing");
            } else {
                assert_eq!(during, used - bytes, "{mode:?}: freed at once");
            }
            assert_eq!(
                after_end,
                used - bytes,
                "{mode:?}: free before the graph drops"
            );
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            assert!(read(&x, N).iter().all(|&v| v == 1.0), "{mode:?}");
            drop(graph);
            assert_eq!(pool.used_bytes(), used - bytes);
        }
    }
);

gpu_test!(
    memory_a_capture_copies_from_is_kept_by_its_graph_whoever_drops_it,
    {
        let _serial = serial();
        let pool = cuda_rt::MemoryPool::new();
        let s = Stream::non_blocking().unwrap();
        let want: Vec<f32> = (0..N).map(|j| (j as f32).sin() * 1000.0).collect();
        let src = pool.malloc(N * 4).unwrap();
        src.copy_from_host(&want).unwrap();
        let src_range = src.ptr()..src.ptr() + (N * 4) as u64;
        let out = cuda_rt::alloc(N * 4).unwrap();
        let used = pool.used_bytes();
        s.begin_capture(CaptureMode::Global).unwrap();
        out.copy_from_device_async(&src, N * 4, Some(&s)).unwrap();
        // the last pointer goes on a thread that knows nothing of the capture
        std::thread::spawn(move || drop(src)).join().unwrap();
        assert_eq!(pool.used_bytes(), used, "kept by the capture");
        let graph = s.end_capture().unwrap();
        assert_eq!(pool.used_bytes(), used, "kept by the graph");
        // the pool cannot hand the block out while the graph lives
        let other = pool.malloc(N * 4).unwrap();
        assert!(
            !src_range.contains(&other.ptr()),
            "the graph's source was reused"
        );
        other.memset(0xff, N * 4).unwrap();
        for round in 0..3 {
            out.memset(0, N * 4).unwrap();
            graph.launch(&s).unwrap();
            s.synchronize().unwrap();
            assert_eq!(read(&out, N), want, "round {round}");
        }
        drop(graph);
        assert_eq!(
            pool.used_bytes(),
            used - (N * 4) as u64 + other.size() as u64
        );
    }
);

// A graph is not launched into another capture (as a recorder's executable is not):
// the captured graph would run its nodes at its own launches, after the launched
// graph and the memory it keeps alive are gone.
gpu_test!(a_graph_is_not_launched_into_another_capture, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let buf = cuda_rt::alloc(N * 4).unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    buf.memset_async(1, N * 4, Some(&s)).unwrap();
    let inner = s.end_capture().unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let e = inner.launch(&s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: CaptureKind::Refused,
                ..
            }
        ),
        "{e}"
    );
    let outer = s.end_capture().unwrap();
    assert_eq!(
        outer.node_count().unwrap(),
        0,
        "nothing went into the outer graph"
    );
    // Outside a capture it launches.
    inner.launch(&s).unwrap();
    s.synchronize().unwrap();
});
