//! Streams' and events' completions as futures (issue 29): awaited with tokio and with
//! `futures::executor`, on a kernel and on copies, held pending behind a gate (a host
//! function that holds its stream until the test opens it) so that "pending, then done"
//! is certain, dropped early, many at once, beside a file read. Results are checked
//! with the plain driver (a copy on the legacy stream, which does not wait for the
//! non-blocking streams used here), so a wake that came before the work was done shows
//! as wrong bytes. Without a GPU each test skips (see `cuda_rt::testing`).

mod common;
mod common_kernel;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use common::{pattern, DevBuf, Gate};
use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer};
use cuda_rt::compiler::RawKernel;
use cuda_rt::graph::CaptureMode;
use cuda_rt::launch::LaunchConfig;
use cuda_rt::stream::{Completion, Stream, StreamRef};
use cuda_rt::{gpu_test, AsStream, Error, Event, StateKind, StreamCaptureExt, StreamEventExt};

const N: usize = 4 << 20;

/// One test at a time: a gate holds the driver's callback thread, which the driver may
/// share between streams, and the capture tests must not see other tests' work.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A waker that counts its wakes; its `Arc` count says whether anyone still holds it.
struct Count(AtomicUsize);
impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn counting() -> (Arc<Count>, Waker) {
    let c = Arc::new(Count(AtomicUsize::new(0)));
    (c.clone(), Waker::from(c))
}

/// Waits for the set-up's raw writes and memsets (on the legacy stream, which the
/// non-blocking streams of the tests do not wait for).
fn settle() {
    cuda_rt::synchronize().unwrap();
}

/// Polls once with `w`.
fn poll_once(c: &mut Completion, w: &Waker) -> Poll<cuda_rt::Result<()>> {
    Pin::new(c).poll(&mut Context::from_waker(w))
}

/// Device memory holding `bytes` of `pattern(_, seed)`, written with a raw copy.
fn patterned(bytes: usize, seed: u64) -> DevBuf {
    let b = DevBuf::new(bytes);
    b.write(0, &pattern(bytes, seed));
    b
}

/// Queues a copy of `src` into `dst` on `stream` (`cuMemcpyDtoDAsync`).
fn copy_async(dst: &DevBuf, src: &DevBuf, stream: &impl AsStream) {
    let api = cuda_rt::cuda_sys::driver::api().unwrap();
    // SAFETY: both ranges are whole allocations of at least `dst.len` bytes, alive
    // until the test has synchronized; the stream is live.
    common::check(
        unsafe { api.cuMemcpyDtoDAsync_v2().unwrap()(dst.ptr, src.ptr, dst.len, stream.as_raw()) },
        "cuMemcpyDtoDAsync",
    );
}

gpu_test!(awaiting_a_kernel_resumes_after_it_wrote, {
    if !common_kernel::nvrtc_or_skip("awaiting_a_kernel_resumes_after_it_wrote") {
        return;
    }
    let _serial = serial();
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(common_kernel::SPIN_FILL, "spin_fill", &[]).unwrap();
    let words = N / 4;
    let out = DevBuf::new(N);
    out.fill(0);
    let s = Stream::non_blocking().unwrap();
    settle();
    let mut gate = Gate::close(s.as_raw());
    let cfg = LaunchConfig::new(64, 256);
    // SAFETY: spin_fill(unsigned* p, int n, unsigned v, long long cycles); `out` holds
    // `words` words and outlives the stream's work (the test synchronizes below).
    unsafe {
        cuda_rt::launch!(
            k,
            &cfg,
            &s,
            (out.ptr, words as i32, 0x5EED_u32, 2_000_000i64)
        )
    }
    .unwrap();
    let mut done = s.completion();
    let (count, w) = counting();
    assert!(
        poll_once(&mut done, &w).is_pending(),
        "the gate holds the kernel"
    );
    assert!(!done.is_done());
    let held = gate.held();
    gate.open();
    // No second poll: the waker of the first is the one the callback must wake.
    let t0 = std::time::Instant::now();
    while count.0.load(Ordering::SeqCst) == 0 {
        assert!(t0.elapsed().as_secs() < 20, "never woken");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(held, "the gate opened before the first poll");
    assert_eq!(count.0.load(Ordering::SeqCst), 1, "woken once");
    assert!(done.is_done());
    assert!(matches!(poll_once(&mut done, &w), Poll::Ready(Ok(()))));
    // Read on the legacy stream, which does not wait for `s`: the kernel's words are
    // there because the wake came after it.
    let back: Vec<u32> = out
        .read(0, N)
        .chunks_exact(4)
        .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
        .collect();
    assert!(back.iter().all(|&v| v == 0x5EED), "{:#x?}", &back[..4]);
    drop(gate);
});

gpu_test!(awaiting_copies_to_pinned_and_device_memory, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let data = pattern(N, 1);
    let dev = DeviceBuffer::from_slice(&data).unwrap();
    let mut host = PinnedBuffer::<u8>::zeros(N).unwrap();
    let dst = DevBuf::new(N);
    let src = patterned(N, 2);
    settle();
    let mut gate = Gate::close(s.as_raw());
    let t = dev.copy_to_pinned_async(&mut host, &s).unwrap();
    copy_async(&dst, &src, &s);
    let mut done = s.completion();
    let (_, w) = counting();
    assert!(poll_once(&mut done, &w).is_pending());
    let held = gate.held();
    gate.open();
    futures::executor::block_on(done).unwrap();
    assert!(held);
    drop(t);
    assert!(
        host.is_idle(),
        "the copy into pinned memory was done before the wake"
    );
    assert!(host.as_slice().unwrap() == &data[..]);
    assert!(dst.read(0, N) == pattern(N, 2));
    drop(gate);
});

gpu_test!(
    a_future_dropped_early_lets_the_work_finish_and_keeps_no_waker,
    {
        let _serial = serial();
        let panics = cuda_rt::stream::host_func_panic_count();
        let dst = DevBuf::new(N);
        dst.fill(0);
        let src = patterned(N, 3);
        settle();
        let (count, w) = counting();
        let mut gate;
        {
            let s = Stream::non_blocking().unwrap();
            gate = Gate::close(s.as_raw());
            copy_async(&dst, &src, &s);
            let mut done = s.completion();
            let pending = poll_once(&mut done, &w).is_pending();
            if gate.holds_or_sanitizer("a_future_dropped_early") {
                assert!(pending);
            }
            // The future, then the stream, go before the work has run.
            drop(done);
            drop(s);
        }
        drop(w);
        gate.holds_or_sanitizer("a_future_dropped_early");
        gate.open();
        drop(gate); // waits for the whole device
        assert!(dst.read(0, N) == pattern(N, 3), "the copy ran to its end");
        assert_eq!(count.0.load(Ordering::SeqCst), 0, "nobody woken");
        assert_eq!(
            Arc::strong_count(&count),
            1,
            "the dropped future's waker was released"
        );
        assert_eq!(cuda_rt::stream::host_func_panic_count(), panics);
    }
);

gpu_test!(a_completion_outlives_its_stream, {
    let _serial = serial();
    let dst = DevBuf::new(N);
    let src = patterned(N, 4);
    settle();
    let mut gate;
    let done = {
        let s = Stream::non_blocking().unwrap();
        gate = Gate::close(s.as_raw());
        copy_async(&dst, &src, &s);
        s.completion()
    };
    gate.open();
    futures::executor::block_on(done).unwrap();
    assert!(dst.read(0, N) == pattern(N, 4));
    drop(gate);
});

gpu_test!(many_completions_at_once_each_after_its_own_work, {
    let _serial = serial();
    const K: usize = 32;
    const BYTES: usize = 1 << 20;
    let blocker = Stream::non_blocking().unwrap();
    let streams: Vec<Stream> = (0..K).map(|_| Stream::non_blocking().unwrap()).collect();
    let srcs: Vec<DevBuf> = (0..K).map(|i| patterned(BYTES, 100 + i as u64)).collect();
    let dsts: Vec<DevBuf> = (0..K).map(|_| DevBuf::new(BYTES)).collect();
    settle();
    let mut gate = Gate::close(blocker.as_raw());
    let opened = blocker.record(None).unwrap();
    let mut pending = Vec::new();
    for i in 0..K {
        let s = &streams[i];
        s.wait_event(&opened).unwrap();
        copy_async(&dsts[i], &srcs[i], s);
        // Half through the stream, half through an event recorded after the copy.
        if i % 2 == 0 {
            pending.push(s.completion());
        } else {
            pending.push(s.record(None).unwrap().completion());
        }
    }
    let (_, w) = counting();
    // A completion that is ready at its first poll (under the sanitizer the gate may
    // not hold) gave its outcome there: it is taken from that poll, not polled again.
    let first: Vec<_> = pending.iter_mut().map(|f| poll_once(f, &w)).collect();
    let all_pending = first.iter().all(Poll::is_pending);
    if gate.holds_or_sanitizer("many_completions_at_once") {
        assert!(all_pending, "all wait behind the gate");
    }
    gate.open();
    let results = futures::executor::block_on(futures::future::join_all(
        pending.into_iter().zip(first).map(|(f, p)| async move {
            match p {
                Poll::Ready(r) => r,
                Poll::Pending => f.await,
            }
        }),
    ));
    for (i, r) in results.into_iter().enumerate() {
        r.unwrap();
        assert!(
            dsts[i].read(0, BYTES) == pattern(BYTES, 100 + i as u64),
            "copy {i} was not done when its completion woke"
        );
    }
    drop(gate);
});

gpu_test!(tokio_joins_a_completion_with_a_file_read, {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("input.bin");
    std::fs::write(&path, pattern(N, 5)).unwrap();
    let dst = DevBuf::new(N);
    let src = patterned(N, 6);
    let s = Stream::non_blocking().unwrap();
    settle();
    let mut gate = Gate::close(s.as_raw());
    copy_async(&dst, &src, &s);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let opener = gate.opener();
    let gpu = s.completion();
    let read = async {
        let bytes = tokio::fs::read(&path).await.unwrap();
        // The GPU work is still held: the read finished while it was pending.
        let gpu_pending = gate.held();
        opener.send(()).unwrap();
        (bytes, gpu_pending)
    };
    let (gpu, (bytes, gpu_pending)) = rt.block_on(async { tokio::join!(gpu, read) });
    gpu.unwrap();
    assert!(gpu_pending, "the file read did not overlap the GPU work");
    assert!(bytes == pattern(N, 5));
    assert!(dst.read(0, N) == pattern(N, 6));
    // A completion is Send + 'static: a spawned task awaits it on a worker thread.
    copy_async(&dst, &src, &s);
    let task = rt.spawn(s.completion());
    rt.block_on(task).unwrap().unwrap();
    gate.open();
    drop(gate);
});

gpu_test!(
    an_event_completion_waits_for_its_record_not_for_later_work,
    {
        if !common_kernel::nvrtc_or_skip(
            "an_event_completion_waits_for_its_record_not_for_later_work",
        ) {
            return;
        }
        let _serial = serial();
        cuda_rt::device::set_device_id(0).unwrap();
        let k = RawKernel::new(common_kernel::SPIN_FILL, "spin_fill", &[]).unwrap();
        let out = DevBuf::new(N);
        out.fill(0);
        let src = patterned(N, 7);
        let s = Stream::non_blocking().unwrap();
        settle();
        let mut gate = Gate::close(s.as_raw());
        copy_async(&out, &src, &s);
        let ev = s.record(None).unwrap();
        let cfg = LaunchConfig::new(64, 256);
        // Later work: spins for about a second, then overwrites the first words with 1.
        // SAFETY: spin_fill(unsigned* p, int n, unsigned v, long long cycles) on 16 words of
        // `out`, which outlives the stream's work (the test synchronizes below).
        unsafe { cuda_rt::launch!(k, &cfg, &s, (out.ptr, 16i32, 1u32, 2_000_000_000i64)) }.unwrap();
        let mut done = ev.completion();
        drop(ev); // the future does not need the event
        let (_, w) = counting();
        let first = poll_once(&mut done, &w);
        let pending = first.is_pending();
        if !gate.holds_or_sanitizer("an_event_completion_waits_for_its_record") {
            gate.open();
            // Ready at the first poll, the outcome came there: no second poll.
            match first {
                Poll::Ready(r) => r.unwrap(),
                Poll::Pending => futures::executor::block_on(done).unwrap(),
            }
            s.synchronize().unwrap();
            assert_eq!(&out.read(0, 4)[..], &1u32.to_ne_bytes()[..]);
            return;
        }
        assert!(pending);
        gate.open();
        futures::executor::block_on(done).unwrap();
        let kernel_running = !s.query().unwrap();
        let back = out.read(0, N);
        let still_running = !s.query().unwrap();
        assert!(
            kernel_running && still_running,
            "the event's completion waited for the work queued after its record"
        );
        assert!(back == pattern(N, 7), "the copy before the record was done");
        s.synchronize().unwrap();
        assert_eq!(&out.read(0, 4)[..], &1u32.to_ne_bytes()[..]);
        drop(gate);
    }
);

gpu_test!(completions_with_nothing_to_wait_for_are_ready_at_once, {
    let _serial = serial();
    let never = Event::new(false, true, false).unwrap();
    let c = never.completion();
    assert!(c.is_done(), "an event never recorded is complete");
    futures::executor::block_on(c).unwrap();
    let s = Stream::non_blocking().unwrap();
    let ev = s.record(None).unwrap();
    s.synchronize().unwrap();
    let c = ev.completion();
    assert!(c.is_done(), "a completed event needs no callback");
    futures::executor::block_on(c).unwrap();
    // An idle stream's completion still goes through the driver, and resolves.
    futures::executor::block_on(s.completion()).unwrap();
    futures::executor::block_on(StreamRef::legacy_default(0).completion()).unwrap();
    futures::executor::block_on(StreamRef::per_thread_default(0).completion()).unwrap();
});

gpu_test!(a_capturing_stream_is_refused_and_its_capture_goes_on, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let dst = DevBuf::new(N);
    let src = patterned(N, 8);
    settle();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    copy_async(&dst, &src, &s);
    let refused = s.completion();
    assert!(refused.is_done(), "refused at once, not left pending");
    let e = futures::executor::block_on(refused).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Capture {
                kind: cuda_rt::CaptureKind::Refused,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("graph is launched on"), "{e}");
    let graph = s.end_capture().expect("the capture is still valid");
    dst.fill(0);
    settle();
    graph.launch(&s).unwrap();
    futures::executor::block_on(s.completion()).unwrap();
    assert!(dst.read(0, N) == pattern(N, 8), "the graph's copy ran");
});

gpu_test!(an_event_recorded_in_a_capture_is_refused, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let ev = s.record(None).unwrap();
    let refused = ev.completion();
    // The capture is ended whatever the outcome (a query of a captured event may
    // invalidate it).
    let _ = s.end_capture();
    assert!(refused.is_done());
    let e = futures::executor::block_on(refused).unwrap_err();
    assert!(matches!(e, Error::Capture { .. }), "{e}");
    s.synchronize().unwrap();
});

gpu_test!(a_completion_asked_for_in_a_host_function_is_refused, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let other = Stream::non_blocking().unwrap();
    // A reference that keeps nothing: the stream must not be destroyed (a CUDA call)
    // by a drop inside the host function.
    // SAFETY: `other` outlives the host function: it is dropped after `s` is
    // synchronized below.
    let other_ref = unsafe { StreamRef::from_raw(other.as_raw(), other.device_id()) };
    let (tx, rx) = std::sync::mpsc::channel();
    s.launch_host_func(move || {
        let c = other_ref.completion();
        let _ = tx.send((c.is_done(), futures::executor::block_on(c)));
    })
    .unwrap();
    s.synchronize().unwrap();
    drop(other);
    let (done, r) = rx.recv().unwrap();
    assert!(done);
    assert!(
        matches!(
            r,
            Err(Error::InvalidState {
                kind: StateKind::InHostFunction,
                ..
            })
        ),
        "{r:?}"
    );
});

/// Runs on every machine: without a GPU a completion resolves to the reason, it does
/// not hang; with one it resolves to `Ok`.
#[test]
fn without_a_driver_a_completion_resolves_to_the_reason() {
    let r = futures::executor::block_on(StreamRef::legacy_default(0).completion());
    match cuda_rt::availability() {
        Ok(_) => r.unwrap(),
        Err(_) => assert!(r.is_err(), "resolved to Ok without a driver"),
    }
}
