//! `graph::Recorder` on a GPU: replays give the eager results, a new key records a new
//! graph, updates in place and their fallbacks give the right results, eviction lets
//! the executable and its memory go, and a closure that does what a capture refuses
//! gets that error with the stream (and the recorder) still usable. The cache and
//! statistics rules are unit tests of the crate (`graph::recorder`), run without a GPU.

#[path = "common/kernels.rs"]
mod kernels;

use std::num::NonZeroUsize;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_rt::graph::{
    graph_memory_usage, trim_graph_memory, CaptureMode, Outcome, Recorder, RecorderStats,
};
use cuda_rt::memory::MemoryPointer;
use cuda_rt::{gpu_test, AsStream, CaptureKind, Error, Stream, StreamCaptureExt, StreamEventExt};
use kernels::{add_one, axpy, Kernels};

const N: usize = 4096;
const MIB: usize = 1 << 20;

/// Recorder tests run one at a time, as the graph tests do: CUDA's checks during a
/// capture can make another test's module load or allocation fail.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn cap(n: usize) -> NonZeroUsize {
    NonZeroUsize::new(n).unwrap()
}

fn read(p: &MemoryPointer) -> Vec<f32> {
    let mut v = vec![0f32; p.size() / 4];
    p.copy_to_host(&mut v).unwrap();
    v
}

fn write(p: &MemoryPointer, v: &[f32]) {
    p.copy_from_host(v).unwrap();
}

/// Waits up to 5 s for `done`.
fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while !done() {
        // The driver releases graph resources (user objects, an executable's memory)
        // on its own thread; a device-wide wait gives it a point to catch up.
        let _ = cuda_rt::device::synchronize();
        if t.elapsed() > Duration::from_secs(5) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}

/// One step of 24 small kernels on `y` from `x`: y = y + a_j x and y = y + 1 in turn,
/// with a different scalar each time.
///
/// # Safety
/// `x` and `y` hold `N` f32 on device 0 and outlive every launch of what this queues
/// (also every replay of a recording of it).
unsafe fn step(k: &Kernels, s: &impl AsStream, y: &MemoryPointer, x: &MemoryPointer) {
    for j in 0..12 {
        // SAFETY: the caller's promise for x and y.
        unsafe {
            axpy(k, s, y.ptr(), x.ptr(), 0.25 * (j % 5) as f32 - 0.5, N);
            add_one(k, s, y.ptr(), N);
        }
    }
}

/// `step` on the host.
fn step_host(y: &mut [f32], x: &[f32]) {
    for j in 0..12 {
        let a = 0.25 * (j % 5) as f32 - 0.5;
        for (yi, xi) in y.iter_mut().zip(x) {
            *yi = a.mul_add(*xi, *yi) + 1.0;
        }
    }
}

gpu_test!(replay_gives_the_eager_results, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let x = cuda_rt::alloc(N * 4).unwrap();
    let y_eager = cuda_rt::alloc(N * 4).unwrap();
    let y_rec = cuda_rt::alloc(N * 4).unwrap();
    let input: Vec<f32> = (0..N).map(|i| (i % 97) as f32 * 0.5 - 20.0).collect();
    write(&x, &input);
    write(&y_eager, &vec![0.0; N]);
    write(&y_rec, &vec![0.0; N]);
    let mut host = vec![0f32; N];
    let mut rec = Recorder::new();
    for i in 0..10 {
        // SAFETY: x, y_eager and y_rec hold N f32 and outlive the recorder (its drop
        // below comes first).
        unsafe { step(&k, &s, &y_eager, &x) };
        let outcome = rec
            .run(&N, &s, |cs| {
                // SAFETY: as above.
                unsafe { step(&k, cs, &y_rec, &x) };
                Ok(())
            })
            .unwrap();
        let want = if i == 0 {
            Outcome::Recorded
        } else {
            Outcome::Replayed
        };
        assert_eq!(outcome, want, "call {i}");
        step_host(&mut host, &input);
    }
    s.synchronize().unwrap();
    let (eager, recorded) = (read(&y_eager), read(&y_rec));
    assert_eq!(recorded, eager, "replays differ from the eager run");
    for (i, (&g, &h)) in recorded.iter().zip(&host).enumerate() {
        assert!((g - h).abs() <= 1e-3 * h.abs().max(1.0), "[{i}] {g} vs {h}");
    }
    let st = rec.stats();
    assert_eq!((st.hits, st.misses, st.captures), (9, 1, 1), "{st:?}");
    assert_eq!((st.instantiations, st.updates, st.failures), (1, 0, 0));
    assert_eq!(rec.len(), 1);
    drop(rec);
});

gpu_test!(
    the_closure_runs_on_the_current_capture_stream_never_on_the_callers,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        let mut rec = Recorder::new();
        let mut seen = None;
        rec.run(&0u8, &s, |cs| {
            assert_ne!(cs.as_raw(), s.as_raw());
            assert!(cs.is_capturing().unwrap());
            assert!(
                !s.is_capturing().unwrap(),
                "the caller's stream never captures"
            );
            assert_eq!(cuda_rt::get_current_stream().as_raw(), cs.as_raw());
            kernels::empty(&k, cs);
            seen = Some(cs.as_raw() as usize);
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, Some(rec.capture_stream(0).unwrap().as_raw() as usize));
        assert!(!rec.capture_stream(0).unwrap().is_capturing().unwrap());
        assert_ne!(
            cuda_rt::get_current_stream().as_raw() as usize,
            seen.unwrap()
        );
        s.synchronize().unwrap();
    }
);

gpu_test!(a_changed_key_records_a_new_graph, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let y = cuda_rt::alloc(N * 4).unwrap();
    write(&y, &vec![0.0; N]);
    let mut rec: Recorder<(usize, u32)> = Recorder::new();
    // The key says how many increments the graph makes.
    let mut call = |times: u32| {
        rec.run(&(N, times), &s, |cs| {
            for _ in 0..times {
                // SAFETY: y holds N f32 and outlives the recorder.
                unsafe { add_one(&k, cs, y.ptr(), N) };
            }
            Ok(())
        })
        .unwrap()
    };
    assert_eq!(call(1), Outcome::Recorded);
    assert_eq!(call(2), Outcome::Recorded);
    assert_eq!(call(1), Outcome::Replayed);
    assert_eq!(call(2), Outcome::Replayed);
    assert_eq!(call(3), Outcome::Recorded);
    s.synchronize().unwrap();
    assert!(read(&y).iter().all(|&v| v == 9.0), "1 + 2 + 1 + 2 + 3");
    let st = rec.stats();
    assert_eq!((st.misses, st.hits, st.captures), (3, 2, 3), "{st:?}");
    assert_eq!(rec.len(), 3);
    assert!(rec.contains(&(N, 2)) && !rec.contains(&(N, 4)));
    assert!(rec.remove(&(N, 2)));
    assert!(!rec.remove(&(N, 2)));
    assert_eq!(rec.len(), 2);
});

/// Nine updates of one key over three buffers of `N` floats, no synchronize between
/// them: each step `enqueue(stream, y, x, a)` queues y += a x, then y += 1, with `a`
/// the step's number, on another buffer `y` in turn; then a replay. Checks every
/// buffer's sum (launches queued before an update keep their arguments; the replay
/// runs the last update's) and returns the recorder's statistics and how many times
/// the closure ran.
fn nine_updates_over_three_buffers(
    mut enqueue: impl FnMut(&Stream, u64, u64, f32) -> cuda_rt::Result<()>,
) -> (RecorderStats, usize) {
    let s = Stream::non_blocking().unwrap();
    let x = cuda_rt::alloc(N * 4).unwrap();
    let bufs: Vec<MemoryPointer> = (0..3).map(|_| cuda_rt::alloc(N * 4).unwrap()).collect();
    write(&x, &vec![2.0; N]);
    for b in &bufs {
        write(b, &vec![0.0; N]);
    }
    let mut rec = Recorder::new();
    let mut want = [0f32; 3];
    let mut outcomes = Vec::new();
    let mut runs = 0;
    for i in 0..9 {
        let (y, a) = (bufs[i % 3].ptr(), i as f32);
        let o = rec
            .update(&"axpy+1", &s, |cs| {
                runs += 1;
                enqueue(cs, y, x.ptr(), a)
            })
            .unwrap();
        outcomes.push(o);
        want[i % 3] += 2.0 * a + 1.0;
    }
    assert_eq!(outcomes[0], Outcome::Recorded);
    assert!(
        outcomes[1..].iter().all(|&o| o == Outcome::Updated),
        "{outcomes:?}"
    );
    assert_eq!(
        rec.run(&"axpy+1", &s, |_| unreachable!()).unwrap(),
        Outcome::Replayed
    );
    want[8 % 3] += 2.0 * 8.0 + 1.0;
    s.synchronize().unwrap();
    for (b, w) in bufs.iter().zip(want) {
        assert!(read(b).iter().all(|&v| v == w), "want {w}");
    }
    (rec.stats(), runs)
}

/// The statistics of `nine_updates_over_three_buffers`: one recording, eight updates
/// in place, one replay; `captures` closures captured, `argument_updates` updates by
/// arguments alone.
fn stats_of_nine_updates(captures: u64, argument_updates: u64) -> RecorderStats {
    RecorderStats {
        hits: 1,
        misses: 1,
        captures,
        instantiations: 1,
        updates: 8,
        argument_updates,
        ..RecorderStats::default()
    }
}

gpu_test!(an_update_with_other_buffers_and_scalars_is_made_in_place, {
    let _serial = serial();
    let k = Kernels::load();
    // Launched through the raw driver: the updates capture the closure again.
    let (st, _) = nine_updates_over_three_buffers(|cs, y, x, a| {
        // SAFETY: y and x hold N f32 on device 0 and outlive the recorder.
        unsafe {
            axpy(&k, cs, y, x, a, N);
            add_one(&k, cs, y, N);
        }
        Ok(())
    });
    // Every update captured the closure: nine captures, one instantiation.
    assert_eq!(st, stats_of_nine_updates(9, 0));
});

gpu_test!(
    an_update_the_driver_refuses_falls_back_and_gives_the_right_results,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        let y = cuda_rt::alloc(N * 4).unwrap();
        write(&y, &vec![0.0; N]);
        let mut rec = Recorder::new();
        let increments = |times: usize| {
            let y = &y;
            let k = &k;
            move |cs: &Stream| {
                for _ in 0..times {
                    // SAFETY: y holds N f32 and outlives the recorder.
                    unsafe { add_one(k, cs, y.ptr(), N) };
                }
                Ok(())
            }
        };
        assert_eq!(rec.run(&1, &s, increments(1)).unwrap(), Outcome::Recorded);
        // Two kernels where there was one: the topology changed.
        let o = rec.update(&1, &s, increments(2)).unwrap();
        let Outcome::Reinstantiated { reason } = o else {
            panic!("{o:?}")
        };
        assert!(reason.contains("topology"), "{reason}");
        // The new executable is the key's from now on.
        assert_eq!(rec.run(&1, &s, increments(5)).unwrap(), Outcome::Replayed);
        s.synchronize().unwrap();
        assert!(read(&y).iter().all(|&v| v == 5.0), "1 + 2 + 2");
        let st = rec.stats();
        assert_eq!((st.update_fallbacks, st.updates), (1, 0), "{st:?}");
        assert_eq!((st.instantiations, st.captures, st.hits), (2, 2, 1));

        // A recording that keeps an allocation of its capture past it owns that memory in
        // its executable: never updated in place, always re-instantiated, and right.
        let mut kept: Vec<MemoryPointer> = Vec::new();
        let mut scratch_of = |rec: &mut Recorder<i32>, update: bool| {
            let mut made = None;
            let f = |cs: &Stream| {
                let t = cuda_rt::alloc(N * 4)?; // a memory node of the graph
                t.memset_async(0, N * 4, Some(cs))?;
                // SAFETY: t is the graph's own allocation, y the test's; both hold N f32.
                unsafe {
                    add_one(&k, cs, t.ptr(), N);
                    axpy(&k, cs, y.ptr(), t.ptr(), 1.0, N);
                }
                made = Some(t);
                Ok(())
            };
            let o = if update {
                rec.update(&2, &s, f)
            } else {
                rec.run(&2, &s, f)
            }
            .unwrap();
            kept.push(made.unwrap());
            o
        };
        assert_eq!(scratch_of(&mut rec, false), Outcome::Recorded);
        let o = scratch_of(&mut rec, true);
        assert!(
            matches!(o, Outcome::Reinstantiated { reason } if reason.contains("allocates")),
            "{o:?}"
        );
        s.synchronize().unwrap();
        assert!(read(&y).iter().all(|&v| v == 7.0), "5 + 1 + 1");
        assert_eq!(rec.stats().update_fallbacks, 2);
        drop(rec);
        drop(kept);
    }
);

gpu_test!(updates_let_go_of_what_the_old_parameters_kept_once_done, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let mut rec = Recorder::new();
    let mut last = Vec::new();
    for i in 0..20u8 {
        // A buffer made and dropped each step, set by the recording: the recording
        // keeps it alive (a capture keeps what cuda-rt's memsets use).
        let b = cuda_rt::alloc(N).unwrap();
        rec.update(&(), &s, |cs| b.memset_async(i, N, Some(cs)))
            .unwrap();
        last = {
            s.synchronize().unwrap();
            let mut v = vec![0u8; N];
            b.copy_to_host(&mut v).unwrap();
            v
        };
        assert!(last.iter().all(|&v| v == i), "step {i}");
        drop(b);
        // What the step before kept waits for its launches, then goes at a later call.
        assert!(rec.retired_pending() <= 1, "{}", rec.retired_pending());
    }
    assert!(last.iter().all(|&v| v == 19));
    // All launches are done: the next call lets go of every retired list.
    s.synchronize().unwrap();
    rec.run(&(), &s, |_| unreachable!()).unwrap();
    assert_eq!(rec.retired_pending(), 0);
    assert_eq!(rec.stats().updates, 19);
});

gpu_test!(alone eviction_lets_the_executable_and_its_memory_go, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let pool = cuda_rt::get_default_memory_pool();
    const BIG: usize = 64 * MIB;
    const SCRATCH: usize = 96 * MIB;
    let token = Arc::new(());
    let mut rec = Recorder::with_capacity(cap(1));
    let used_before = pool.used_bytes();
    let big = cuda_rt::alloc(BIG).unwrap();
    let t = Arc::clone(&token);
    rec.run(&"big", &s, |cs| {
        // Kept by the recording: its memset is captured.
        big.memset_async(7, BIG, Some(cs))?;
        // Graph memory: allocated and freed inside the graph.
        let scratch = cuda_rt::alloc(SCRATCH)?;
        scratch.memset_async(1, SCRATCH, Some(cs))?;
        drop(scratch);
        // Owned by the graph and its executable until both go.
        cs.launch_host_func_repeatable(move || {
            let _ = &t;
        })
    })
    .unwrap();
    drop(big);
    s.synchronize().unwrap();
    assert!(pool.used_bytes() >= used_before + BIG as u64, "the recording keeps big");
    let graph_mem = graph_memory_usage(0).unwrap();
    assert!(graph_mem.used >= SCRATCH as u64, "{graph_mem:?}");

    // A second key evicts the first.
    let small = || {
        let k = &k;
        move |cs: &Stream| {
            kernels::empty(k, cs);
            Ok(())
        }
    };
    assert_eq!(rec.run(&"small", &s, small()).unwrap(), Outcome::Recorded);
    assert_eq!(rec.stats().evictions, 1);
    assert!(!rec.contains(&"big") && rec.contains(&"small"));
    s.synchronize().unwrap();
    // Its launches are done: the next call lets go of what it kept.
    assert_eq!(rec.run(&"small", &s, small()).unwrap(), Outcome::Replayed);
    assert_eq!(rec.retired_pending(), 0);
    assert!(
        pool.used_bytes() < used_before + BIG as u64,
        "big went back to the pool: {} >= {} + {BIG}",
        pool.used_bytes(),
        used_before
    );
    // The graph and its executable are gone: the driver dropped the host node's
    // closure, and unmapped the executable's graph memory.
    assert!(
        eventually(|| Arc::strong_count(&token) == 1),
        "host closure held: {} references; graph memory {:?} (was {graph_mem:?})",
        Arc::strong_count(&token),
        graph_memory_usage(0).unwrap()
    );
    // The driver keeps the pages a destroyed executable mapped counted as used until
    // they are trimmed (H100, driver 13.0: 96 MiB used after the eviction, 0 after
    // the trim); that the executable is gone, the released closure above shows.
    let before_trim = graph_memory_usage(0).unwrap();
    trim_graph_memory(0).unwrap();
    eprintln!(
        "graph memory: recorded {graph_mem:?}; evicted {before_trim:?}; trimmed {:?}",
        graph_memory_usage(0).unwrap()
    );
    assert!(
        eventually(|| graph_memory_usage(0).unwrap().used + SCRATCH as u64 <= graph_mem.used),
        "graph memory still in use after a trim: {:?} (was {graph_mem:?}, before the trim {before_trim:?})",
        graph_memory_usage(0).unwrap()
    );
    let after_trim = graph_memory_usage(0).unwrap();
    assert!(
        after_trim.reserved < before_trim.reserved,
        "trim gave nothing back: {after_trim:?} (was {before_trim:?})"
    );
});

gpu_test!(the_least_recently_used_key_is_evicted, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let y = cuda_rt::alloc(N * 4).unwrap();
    write(&y, &vec![0.0; N]);
    let mut rec = Recorder::with_capacity(cap(2));
    let mut call = |key: u32| {
        rec.run(&key, &s, |cs| {
            // SAFETY: y holds N f32 and outlives the recorder.
            unsafe { add_one(&k, cs, y.ptr(), N) };
            Ok(())
        })
        .unwrap()
    };
    assert_eq!(call(1), Outcome::Recorded);
    assert_eq!(call(2), Outcome::Recorded);
    assert_eq!(call(1), Outcome::Replayed); // 2 is now the oldest
    assert_eq!(call(3), Outcome::Recorded); // evicts 2
    assert_eq!(call(1), Outcome::Replayed);
    assert_eq!(call(2), Outcome::Recorded); // evicts 3
    s.synchronize().unwrap();
    assert!(read(&y).iter().all(|&v| v == 6.0));
    let st = rec.stats();
    assert_eq!((st.evictions, st.misses, st.hits), (2, 4, 2), "{st:?}");
    assert!(rec.contains(&1) && rec.contains(&2) && !rec.contains(&3));
    rec.set_capacity(cap(1));
    assert_eq!(rec.len(), 1);
    assert!(rec.contains(&2), "the most recently used stays");
    assert_eq!(rec.stats().evictions, 3);
});

/// The error a closure's refused call gave, the recorder and streams left clean.
fn assert_clean_failure(rec: &mut Recorder<u32>, s: &Stream, e: &Error, failures: u64) {
    assert_eq!(rec.stats().failures, failures, "{e}");
    assert!(rec.is_empty(), "nothing cached after: {e}");
    assert!(
        !cuda_rt::graph::any_capture_active(),
        "a capture left open: {e}"
    );
    assert!(!rec.capture_stream(0).unwrap().is_capturing().unwrap());
    assert!(!s.is_capturing().unwrap());
}

gpu_test!(
    a_closure_that_calls_what_a_capture_refuses_gets_that_error,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        let y = cuda_rt::alloc(N * 4).unwrap();
        write(&y, &vec![0.0; N]);
        let mut rec = Recorder::new();

        // A run-once host closure: refused by cuda-rt before it reaches the driver.
        let e = rec
            .run(&1, &s, |cs| {
                // SAFETY: y holds N f32 and outlives the recorder.
                unsafe { add_one(&k, cs, y.ptr(), N) };
                cs.launch_host_func(|| {})
            })
            .unwrap_err();
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
        assert!(
            e.to_string().contains("launch_host_func"),
            "names the call: {e}"
        );
        assert_clean_failure(&mut rec, &s, &e, 1);

        // A synchronous copy.
        let e = rec
            .run(&1, &s, |_| y.copy_from_host(&vec![1f32; N]))
            .unwrap_err();
        assert!(e.to_string().contains("capturing a graph"), "{e}");
        assert_clean_failure(&mut rec, &s, &e, 2);

        // A synchronize: the driver refuses it and invalidates the capture.
        let e = rec.update(&1, &s, |cs| cs.synchronize()).unwrap_err();
        assert!(matches!(e, Error::Capture { .. }), "{e}");
        assert!(e.to_string().contains("synchronize"), "names the call: {e}");
        assert_clean_failure(&mut rec, &s, &e, 3);

        // A closure that ignores the refusal and returns Ok: the invalid capture's end
        // is the error.
        let e = rec
            .run(&1, &s, |cs| {
                let _ = cs.synchronize();
                Ok(())
            })
            .unwrap_err();
        assert!(matches!(e, Error::Capture { .. }), "{e}");
        assert_clean_failure(&mut rec, &s, &e, 4);

        // The closure's own error, as it is.
        let e = rec
            .run(&1, &s, |_| {
                Err(Error::invalid_state(cuda_rt::StateKind::Other, "mine"))
            })
            .unwrap_err();
        assert!(e.to_string().contains("mine"), "{e}");
        assert_clean_failure(&mut rec, &s, &e, 5);

        // A closure that panics: the capture is ended as it unwinds.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _ = rec.run(&1, &s, |_| -> cuda_rt::Result<()> {
                panic!("in the closure")
            });
        }));
        assert!(caught.is_err());
        assert!(!cuda_rt::graph::any_capture_active());
        assert!(!rec.capture_stream(0).unwrap().is_capturing().unwrap());

        // Everything still works: the stream, and the recorder on the same key.
        y.memset_async(0, N * 4, Some(&s)).unwrap();
        for _ in 0..3 {
            rec.run(&1, &s, |cs| {
                // SAFETY: y holds N f32 and outlives the recorder.
                unsafe { add_one(&k, cs, y.ptr(), N) };
                Ok(())
            })
            .unwrap();
        }
        s.synchronize().unwrap();
        assert!(read(&y).iter().all(|&v| v == 3.0));
        assert_eq!(rec.stats().hits, 2);
    }
);

gpu_test!(a_recording_is_not_launched_into_another_capture, {
    let _serial = serial();
    let k = Kernels::load();
    let s = Stream::non_blocking().unwrap();
    let mut rec = Recorder::new().capture_mode(CaptureMode::Global);
    let f = |cs: &Stream| {
        kernels::empty(&k, cs);
        Ok(())
    };
    assert_eq!(rec.run(&7, &s, f).unwrap(), Outcome::Recorded);
    s.synchronize().unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let e = rec.run(&7, &s, f).unwrap_err();
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
    assert!(
        e.to_string().contains("not launched into another capture"),
        "{e}"
    );
    let g = s.end_capture().unwrap();
    assert_eq!(
        g.node_count().unwrap(),
        0,
        "nothing went into the caller's graph"
    );
    // Outside the capture it replays.
    assert_eq!(rec.run(&7, &s, f).unwrap(), Outcome::Replayed);
    s.synchronize().unwrap();
    assert_eq!(rec.stats().hits, 1);
});

gpu_test!(
    work_forked_from_the_capture_stream_and_joined_back_is_recorded,
    {
        let _serial = serial();
        let k = Kernels::load();
        let s = Stream::non_blocking().unwrap();
        let side = Stream::non_blocking().unwrap();
        let a = cuda_rt::alloc(N * 4).unwrap();
        let b = cuda_rt::alloc(N * 4).unwrap();
        write(&a, &vec![0.0; N]);
        write(&b, &vec![0.0; N]);
        let mut rec = Recorder::new();
        for _ in 0..4 {
            rec.run(&(), &s, |cs| {
                let fork = cs.record(None)?;
                side.wait_event(&fork)?;
                // SAFETY: a and b hold N f32 and outlive the recorder.
                unsafe {
                    add_one(&k, cs, a.ptr(), N);
                    add_one(&k, &side, b.ptr(), N);
                }
                let join = side.record(None)?;
                cs.wait_event(&join)?;
                // b is read after the join: y = a + b on the capture stream.
                // SAFETY: as above.
                unsafe { axpy(&k, cs, a.ptr(), b.ptr(), 1.0, N) };
                Ok(())
            })
            .unwrap();
        }
        s.synchronize().unwrap();
        // a: +1 then +b each call; b: +1 each call.
        let (mut wa, mut wb) = (0f32, 0f32);
        for _ in 0..4 {
            wb += 1.0;
            wa += 1.0 + wb;
        }
        assert!(read(&a).iter().all(|&v| v == wa), "want {wa}");
        assert!(read(&b).iter().all(|&v| v == wb), "want {wb}");
    }
);

gpu_test!(keep_alive_in_capture_ties_an_object_to_the_recording, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let e = s.keep_alive_in_capture(Arc::new(())).unwrap_err();
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
    let token = Arc::new(5u32);
    let mut rec = Recorder::new();
    rec.run(&0, &s, |cs| cs.keep_alive_in_capture(token.clone()))
        .unwrap();
    assert_eq!(Arc::strong_count(&token), 2, "the recording holds it");
    s.synchronize().unwrap();
    drop(rec); // waits for the recording's launches, then lets go
    assert_eq!(Arc::strong_count(&token), 1);
});

/// The error path of a machine without a GPU (CI's): with one, the GPU tests above
/// cover the calls.
#[test]
fn without_a_gpu_a_call_fails_cleanly() {
    if cuda_rt::is_available() {
        return;
    }
    let mut rec: Recorder<u32> = Recorder::new();
    let s = Stream::null();
    let e = rec.run(&1, &s, |_| Ok(())).unwrap_err();
    assert!(!e.to_string().is_empty());
    assert_eq!(rec.stats().failures, 1);
    assert!(rec.is_empty());
}

/// `add_one` and `axpy` of `kernels::PTX` loaded through cuda-rt: typed launches,
/// which an update of a chain of kernels takes without a capture.
struct Typed {
    add_one: cuda_rt::Function,
    axpy: cuda_rt::Function,
}

fn typed() -> Typed {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = cuda_rt::Module::load_data(kernels::PTX.as_bytes()).unwrap();
    Typed {
        add_one: m.get_function("add_one").unwrap(),
        axpy: m.get_function("axpy").unwrap(),
    }
}

/// `n` threads in blocks of 256.
fn shape(n: usize) -> cuda_rt::LaunchConfig {
    cuda_rt::LaunchConfig::new(kernels::blocks(n), 256)
}

gpu_test!(
    an_update_of_kernels_alone_sets_their_arguments_without_a_capture,
    {
        let _serial = serial();
        let k = typed();
        let n = N as i32;
        let (st, runs) = nine_updates_over_three_buffers(|cs, y, x, a| {
            // SAFETY: axpy(float* y, const float* x, float a, int n) and add_one(float* x,
            // int n) get buffers of n f32 on device 0 that outlive the recorder.
            unsafe {
                k.axpy.launch_on(cs, &shape(N), &[&y, &x, &a, &n])?;
                k.add_one.launch_on(cs, &shape(N), &[&y, &n])
            }
        });
        assert_eq!(runs, 9, "the closure ran once per call");
        // One capture (the recording); the eight updates set arguments alone.
        assert_eq!(st, stats_of_nine_updates(1, 8));
    }
);

gpu_test!(
    a_steady_update_of_kernels_keeps_what_it_kept_and_retires_only_what_changed,
    {
        let _serial = serial();
        let k = typed();
        let s = Stream::non_blocking().unwrap();
        let bufs: Vec<MemoryPointer> = (0..2).map(|_| cuda_rt::alloc(N * 4).unwrap()).collect();
        for b in &bufs {
            write(b, &vec![0.0; N]);
        }
        let mut rec = Recorder::new();
        let n = N as i32;
        // add_one on buffer `i % 2`, tying `tie` to the recording when given.
        let step = |rec: &mut Recorder<u8>, i: usize, tie: Option<Arc<u32>>| {
            let y = bufs[i % 2].ptr();
            rec.update(&0, &s, |cs| {
                if let Some(t) = &tie {
                    cs.keep_alive_in_capture(t.clone())?;
                }
                // SAFETY: add_one(float* x, int n) gets a buffer of N f32 on device 0
                // that outlives the recorder.
                unsafe { k.add_one.launch_on(cs, &shape(N), &[&y, &n]) }
            })
            .unwrap()
        };
        assert_eq!(step(&mut rec, 0, None), Outcome::Recorded);
        // The same kernel on the other buffers: the recording keeps the same module,
        // so nothing is retired and no fence is recorded.
        for i in 1..7 {
            assert_eq!(step(&mut rec, i, None), Outcome::Updated);
            assert_eq!(rec.retired_pending(), 0, "step {i}");
        }
        assert_eq!(rec.stats().argument_updates, 6);
        // A new object tied by an update: what was kept before goes after a fence.
        let (t1, t2) = (Arc::new(1u32), Arc::new(2u32));
        assert_eq!(step(&mut rec, 7, Some(t1.clone())), Outcome::Updated);
        assert_eq!(Arc::strong_count(&t1), 2, "the recording holds it");
        assert_eq!(step(&mut rec, 8, Some(t2.clone())), Outcome::Updated);
        assert_eq!(rec.stats().argument_updates, 8);
        assert!(rec.retired_pending() <= 2, "{}", rec.retired_pending());
        // Once the launches are done, the next call lets go of t1, not of t2.
        s.synchronize().unwrap();
        assert_eq!(step(&mut rec, 9, Some(t2.clone())), Outcome::Updated);
        assert_eq!(Arc::strong_count(&t1), 1, "t1 let go");
        assert_eq!(Arc::strong_count(&t2), 2, "t2 still kept");
        s.synchronize().unwrap();
        // Five add_one on each buffer.
        for b in &bufs {
            assert!(read(b).iter().all(|&v| v == 5.0), "{}", read(b)[0]);
        }
        drop(rec);
        assert_eq!(Arc::strong_count(&t2), 1);
    }
);

gpu_test!(
    an_update_with_other_shapes_or_other_work_is_captured_and_gives_the_right_results,
    {
        let _serial = serial();
        let k = typed();
        let s = Stream::non_blocking().unwrap();
        let (y, z) = (
            cuda_rt::alloc(N * 4).unwrap(),
            cuda_rt::alloc(N * 4).unwrap(),
        );
        write(&y, &vec![0.0; N]);
        write(&z, &vec![5.0; N]);
        let mut rec = Recorder::new();
        let runs = std::cell::Cell::new(0);
        // add_one over the first `n` floats of `p`, then (with `clear`) z set to 0.
        let call = |rec: &mut Recorder<u8>, p: u64, n: usize, clear: bool| {
            rec.update(&1, &s, |cs| {
                runs.set(runs.get() + 1);
                let m = n as i32;
                // SAFETY: add_one(float* x, int n) gets a buffer of N >= n f32 on
                // device 0 that outlives the recorder.
                unsafe { k.add_one.launch_on(cs, &shape(n), &[&p, &m]) }?;
                if clear {
                    z.memset_async(0, N * 4, Some(cs))?;
                }
                Ok(())
            })
            .unwrap()
        };
        assert_eq!(call(&mut rec, y.ptr(), N, false), Outcome::Recorded);
        // Another launch shape: captured, the executable updated by cuGraphExecUpdate.
        assert_eq!(call(&mut rec, y.ptr(), N / 2, false), Outcome::Updated);
        assert_eq!(rec.stats().argument_updates, 0);
        // The same shape on another buffer: by arguments alone again.
        assert_eq!(call(&mut rec, z.ptr(), N / 2, false), Outcome::Updated);
        assert_eq!(rec.stats().argument_updates, 1);
        // Other work besides the kernel: captured (the topology changed).
        let o = call(&mut rec, y.ptr(), N, true);
        assert!(matches!(o, Outcome::Reinstantiated { .. }), "{o:?}");
        s.synchronize().unwrap();
        let (yv, zv) = (read(&y), read(&z));
        assert!(yv[..N / 2].iter().all(|&v| v == 3.0), "{}", yv[0]);
        assert!(yv[N / 2..].iter().all(|&v| v == 2.0), "{}", yv[N / 2]);
        assert!(zv.iter().all(|&v| v == 0.0), "z was cleared last");
        // Recorded once, each shape or work change ran the closure twice, the update
        // by arguments once.
        assert_eq!(runs.get(), 1 + 2 + 1 + 2);
        let st = rec.stats();
        assert_eq!((st.updates, st.update_fallbacks), (2, 1), "{st:?}");
        // The recording with a memset updates by capture, the closure running once.
        let before = runs.get();
        let o = call(&mut rec, z.ptr(), N, true);
        assert!(matches!(o, Outcome::Updated), "{o:?}");
        assert_eq!(runs.get(), before + 1);
        s.synchronize().unwrap();
    }
);

gpu_test!(
    an_update_of_kernels_that_fails_partway_never_leaves_a_mixed_executable,
    {
        let _serial = serial();
        let k = typed();
        let s = Stream::non_blocking().unwrap();
        let bufs: Vec<MemoryPointer> = (0..3).map(|_| cuda_rt::alloc(N * 4).unwrap()).collect();
        for b in &bufs {
            write(b, &vec![0.0; N]);
        }
        let mut rec = Recorder::new();
        let n = N as i32;
        let runs = std::cell::Cell::new(0);
        // Three add_one on `y`; the closure's `fail_at`-th run (counting from 1) fails.
        let call = |rec: &mut Recorder<u8>, y: u64, fail_at: usize| {
            rec.update(&1, &s, |cs| {
                runs.set(runs.get() + 1);
                if runs.get() == fail_at {
                    return Err(Error::invalid_state(cuda_rt::StateKind::Other, "mine"));
                }
                for _ in 0..3 {
                    // SAFETY: add_one(float* x, int n) gets a buffer of N f32 on
                    // device 0 that outlives the recorder.
                    unsafe { k.add_one.launch_on(cs, &shape(N), &[&y, &n]) }?;
                }
                Ok(())
            })
        };
        assert_eq!(call(&mut rec, bufs[0].ptr(), 0).unwrap(), Outcome::Recorded);
        // The second node's new arguments fail after the first's were set: the
        // executable holds both buffers, so it goes, and the capture that follows
        // records the key afresh.
        cuda_rt::testing::fail_kernel_node_updates_after(Some(1));
        let o = call(&mut rec, bufs[1].ptr(), 0);
        cuda_rt::testing::fail_kernel_node_updates_after(None);
        assert_eq!(o.unwrap(), Outcome::Recorded);
        assert_eq!(runs.get(), 3, "taken once, then captured");
        s.synchronize().unwrap();
        assert!(read(&bufs[0]).iter().all(|&v| v == 3.0));
        assert!(read(&bufs[1]).iter().all(|&v| v == 3.0));

        // The same, and the capture after it fails: the error comes back and no
        // executable is left for the key, so nothing replays the mixed one.
        cuda_rt::testing::fail_kernel_node_updates_after(Some(1));
        let e = call(&mut rec, bufs[2].ptr(), runs.get() + 2).unwrap_err();
        cuda_rt::testing::fail_kernel_node_updates_after(None);
        assert!(e.to_string().contains("mine"), "{e}");
        assert!(!rec.contains(&1), "the mixed executable went");
        assert!(!s.is_capturing().unwrap());
        // A replay of the key records it again, on the buffer it names now.
        assert_eq!(call(&mut rec, bufs[2].ptr(), 0).unwrap(), Outcome::Recorded);
        s.synchronize().unwrap();
        let sums: Vec<f32> = bufs.iter().map(|b| read(b)[0]).collect();
        assert_eq!(sums, [3.0, 3.0, 3.0], "no launch of a mixed executable");
        for b in &bufs {
            assert!(read(b).iter().all(|&v| v == 3.0));
        }
    }
);
