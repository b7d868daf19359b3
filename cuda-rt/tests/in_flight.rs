//! Nothing lost in flight (issue 26): memory stays owned until every stream, thread
//! and graph that uses it is done. Each test drives a sequence that handed memory
//! still being written to a new owner, holds the queued work behind a gate (or a slow
//! kernel) so that the race is certain, and checks the next owner's bytes: a race
//! that stays in bounds is invisible to compute-sanitizer. Without a GPU each test
//! skips (see `cuda_rt::testing`).

mod common;
mod common_kernel;

use std::sync::{Arc, Barrier};

use common::{pattern, Gate};
use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::compiler::RawKernel;
use cuda_rt::graph::{CaptureMode, Graph, KernelArgs};
use cuda_rt::launch::LaunchConfig;
use cuda_rt::stream::Stream;
use cuda_rt::{
    gpu_test, AsStream, CaptureKind, Error, StateKind, StreamCaptureExt, StreamEventExt,
};

const N: usize = 1 << 20;

/// Tests that capture run one at a time: a global-mode capture makes other tests'
/// allocations fail.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A graph captured on `s` (global mode) that allocates `N` bytes and sets them to
/// `value`, with the allocation's pointer; the graph is not launched.
fn captured_allocation(s: &Stream, value: u8) -> (cuda_rt::MemoryPointer, Graph) {
    let _on = s.enter().unwrap();
    s.begin_capture(CaptureMode::Global).unwrap();
    let p = cuda_rt::alloc(N).unwrap();
    p.memset_async(value, N, None).unwrap();
    (p, s.end_capture().unwrap())
}

fn is_gone(e: &Error) -> bool {
    matches!(
        e,
        Error::InvalidState {
            kind: StateKind::GraphMemoryGone,
            ..
        }
    )
}

/// How one test queues work on `side` that writes the whole of `buf` with 0xAB bytes.
#[derive(Debug, Clone, Copy)]
enum Writer {
    Memset,
    Fill,
    CopyFrom,
}

/// Item 1: work on another stream (memset, fill, copy), then the buffer dropped: the
/// pool must not hand the block to the next allocation of the buffer's own stream
/// while the work is held behind the gate; the new owners keep their own bytes.
fn held_work_on_another_stream(w: Writer) {
    let _serial = serial();
    let side = Stream::non_blocking().unwrap();
    let source = DeviceBuffer::from_slice(&vec![0xABu8; N]).unwrap();
    let mut buf = DeviceBuffer::<u8>::zeros(N).unwrap();
    let addr = buf.device_ptr();
    let mut gate = Gate::close(side.as_raw());
    match w {
        Writer::Memset => buf.memset_async(0xAB, &side).unwrap(),
        Writer::Fill => buf.fill_async(0xAB, &side).unwrap(),
        Writer::CopyFrom => buf.copy_from_async(&source, &side).unwrap(),
    }
    drop(buf);
    let others: Vec<DeviceBuffer<u8>> = (0..4)
        .map(|i| DeviceBuffer::from_slice(&pattern(N, 40 + i)).unwrap())
        .collect();
    let held = gate.held();
    assert!(
        !held || others.iter().all(|o| o.device_ptr() != addr),
        "{w:?}: the block under queued work on another stream was handed out again"
    );
    gate.open();
    side.synchronize().unwrap();
    for (i, o) in others.iter().enumerate() {
        assert!(
            o.to_vec().unwrap() == pattern(N, 40 + i as u64),
            "{w:?}: the new owner {i} holds the old owner's bytes"
        );
    }
    drop(gate);
}

gpu_test!(a_memset_on_another_stream_keeps_the_block_until_it_ran, {
    held_work_on_another_stream(Writer::Memset);
});

gpu_test!(a_fill_on_another_stream_keeps_the_block_until_it_ran, {
    held_work_on_another_stream(Writer::Fill);
});

gpu_test!(a_copy_on_another_stream_keeps_the_block_until_it_ran, {
    held_work_on_another_stream(Writer::CopyFrom);
});

gpu_test!(a_memory_pointer_memset_on_another_stream_keeps_its_block, {
    let _serial = serial();
    let side = Stream::non_blocking().unwrap();
    let p = cuda_rt::alloc(N).unwrap();
    let addr = p.ptr();
    let mut gate = Gate::close(side.as_raw());
    p.memset_async(0xAB, N, Some(&side)).unwrap();
    drop(p);
    let q = cuda_rt::alloc(N).unwrap();
    q.copy_from_host(&pattern(N, 7)).unwrap();
    let held = gate.held();
    assert!(!held || q.ptr() != addr, "reused under the memset");
    gate.open();
    side.synchronize().unwrap();
    let mut back = vec![0u8; N];
    q.copy_to_host(&mut back).unwrap();
    assert!(
        back == pattern(N, 7),
        "the memset wrote the new owner's bytes"
    );
    drop(gate);
});

// The same work on the block's own stream costs nothing: no stream is recorded and
// the block is reused at once (stream order protects it).
gpu_test!(work_on_the_blocks_own_stream_records_nothing, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let _on = s.enter().unwrap();
    let pool = cuda_rt::get_default_memory_pool();
    let p = cuda_rt::alloc(N).unwrap();
    let addr = p.ptr();
    let before = pool.device_stats(0).stream_fences;
    p.memset_async(1, N, None).unwrap();
    drop(p);
    assert_eq!(pool.device_stats(0).stream_fences, before, "no fence");
    let q = cuda_rt::alloc(N).unwrap();
    assert_eq!(q.ptr(), addr, "reused at once in stream order");
    s.synchronize().unwrap();
});

// Item 3: two threads each capture their own per-thread default stream (one handle,
// two streams): the second `begin_capture` must not drop the first capture's record,
// whose graph keeps the memory its memset uses.
gpu_test!(
    per_thread_stream_captures_on_two_threads_keep_their_own_records,
    {
        let _serial = serial();
        let both = Arc::new(Barrier::new(2));
        let run = |seed: u64, both: Arc<Barrier>| {
            move || {
                let pt = Stream::per_thread();
                let _on = pt.enter().unwrap();
                let x = cuda_rt::alloc(N).unwrap();
                x.memset(0, N).unwrap();
                pt.begin_capture(CaptureMode::ThreadLocal).unwrap();
                x.memset_async(0xAB, N, None).unwrap();
                // Both captures are under way before either ends.
                both.wait();
                let g = pt.end_capture().unwrap();
                both.wait();
                // The graph alone keeps x's block now.
                drop(x);
                let y = cuda_rt::alloc(N).unwrap();
                y.copy_from_host(&pattern(N, seed)).unwrap();
                g.launch(&pt).unwrap();
                pt.synchronize().unwrap();
                let mut back = vec![0u8; N];
                y.copy_to_host(&mut back).unwrap();
                assert!(
                    back == pattern(N, seed),
                    "thread {seed}: the graph's memset wrote a block handed out again"
                );
            }
        };
        let a = std::thread::spawn(run(1, both.clone()));
        let b = std::thread::spawn(run(2, both));
        a.join().unwrap();
        b.join().unwrap();
    }
);

// Item 5: allocations of a graph that never ran hold nothing: before the first
// launch and after the graph went unlaunched every use is refused, and the size
// never changes.
gpu_test!(allocations_of_a_graph_never_launched_are_refused, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let (p, g) = captured_allocation(&s, 1);
    assert_eq!(g.owned_allocation_count(), 1);
    let e = p.memset(2, N).unwrap_err();
    assert!(is_gone(&e), "before the first launch: {e}");
    assert!(is_gone(&p.memset_async(2, N, Some(&s)).unwrap_err()));
    drop(g);
    assert_eq!(p.size(), N, "the size never changes");
    let e = p.copy_from_host(&[1u8; 16]).unwrap_err();
    assert!(is_gone(&e), "after the graph went unlaunched: {e}");
    assert!(e.to_string().contains("never allocated"), "{e}");
    // A launched graph's allocation is usable outside it afterwards.
    let (q, g) = {
        let _on = s.enter().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        let q = cuda_rt::alloc(N).unwrap();
        q.memset_async(3, N, None).unwrap();
        (q, s.end_capture().unwrap())
    };
    g.launch(&s).unwrap();
    s.synchronize().unwrap();
    let mut back = vec![0u8; N];
    q.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 3));
    drop(g);
    q.memset(4, N).unwrap();
});

// A graph's own allocation (kept past its capture), used on another stream after a
// launch, then dropped with its graph: the free (queued on the stream of the graph's
// last launch, ordered after nothing else) handed the block back to the graph memory
// pool while the other stream's memset was still queued on it, for the next graph's
// allocation. The gate is opened from another thread a little later: the drop must
// have waited for it, and the next owner keeps its bytes.
gpu_test!(
    a_graph_allocation_used_on_another_stream_is_freed_after_that_use,
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        let _serial = serial();
        let s = Stream::non_blocking().unwrap();
        let side = Stream::non_blocking().unwrap();
        let (p, g) = captured_allocation(&s, 1);
        g.launch(&s).unwrap();
        s.synchronize().unwrap();
        let mut gate = Gate::close(side.as_raw());
        p.memset_async(0xAB, N, Some(&side)).unwrap();
        let opened = Arc::new(AtomicBool::new(false));
        let opener = {
            let (tx, o) = (gate.opener(), opened.clone());
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(300));
                o.store(true, Ordering::SeqCst);
                let _ = tx.send(());
            })
        };
        drop(g);
        drop(p);
        let waited = opened.load(Ordering::SeqCst);
        // The next owner: another graph's allocation of the same size.
        let (q, g2) = captured_allocation(&s, 7);
        g2.launch(&s).unwrap();
        s.synchronize().unwrap();
        opener.join().unwrap();
        gate.open();
        side.synchronize().unwrap();
        assert!(
            waited,
            "the graph's allocation was freed while a memset on another stream was queued on it"
        );
        let mut back = vec![0u8; N];
        q.copy_to_host(&mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 7),
            "the next owner holds the old owner's memset"
        );
        drop(g2);
    }
);

/// A new stream with a block of the default pool freed onto its own arena while a
/// memset of it (0xAB) is held on the stream by a gate: the stream, its handle, the
/// block's address and the gate.
fn stream_with_a_held_freed_block() -> (Stream, usize, u64, Gate) {
    let s = Stream::non_blocking().unwrap();
    let handle = s.ptr();
    let buf = cuda_rt::get_default_memory_pool()
        .malloc_on_stream(&s, N)
        .unwrap();
    let addr = buf.ptr();
    let gate = Gate::close(s.as_raw());
    buf.memset_async(0xAB, N, Some(&s)).unwrap();
    drop(buf);
    (s, handle, addr, gate)
}

/// New streams, made until one has the handle `old` (the driver tends to give a
/// destroyed stream's handle to the next stream), or eight: the last is the one to use.
fn streams_until_handle(old: usize) -> Vec<Stream> {
    let mut made = Vec::new();
    while made.len() < 8 {
        let s = Stream::non_blocking().unwrap();
        let same = s.ptr() == old;
        made.push(s);
        if same {
            break;
        }
    }
    made
}

// Item 1, a stream's end: a block freed into its own stream's arena while work queued
// on the stream still writes it, then the stream dropped. The driver tends to give the
// next stream created the dropped stream's handle, whose arena the pool would then
// lend that block from under the old work: the stream must be kept until its work is
// done. Streams are made until one has the old handle (or eight, which then keep
// theirs); the next owner's bytes are checked after the gate opens.
gpu_test!(
    a_dropped_stream_lends_its_arena_to_no_stream_while_its_work_runs,
    {
        let _serial = serial();
        let pool = cuda_rt::get_default_memory_pool();
        let (s1, old_handle, addr, mut gate) = stream_with_a_held_freed_block();
        drop(s1);
        assert!(
            !gate.held() || cuda_rt::testing::streams_kept_for_their_work().contains(&old_handle),
            "the stream was destroyed with its work queued"
        );
        let made = streams_until_handle(old_handle);
        let s2 = made.last().unwrap();
        let next = pool.malloc_on_stream(s2, N).unwrap();
        next.memset_async(0x11, N, Some(s2)).unwrap();
        s2.synchronize().unwrap();
        let held = gate.held();
        assert!(
            !held || s2.ptr() != old_handle,
            "the dropped stream's handle went to a new stream while its work was queued"
        );
        assert!(
            !held || next.ptr() != addr,
            "the block under the dropped stream's queued work was handed out again"
        );
        gate.open();
        cuda_rt::device::synchronize().unwrap();
        let mut back = vec![0u8; N];
        next.copy_to_host(&mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0x11),
            "the new owner holds the dropped stream's bytes"
        );
        // Its work done, the kept stream goes at the next stream's creation.
        drop(Stream::non_blocking().unwrap());
        assert!(!cuda_rt::testing::streams_kept_for_their_work().contains(&old_handle));
    }
);

// Item 1, synchronous calls on the legacy default stream: CUDA's plain memset and
// device-to-device copy of device memory return before the device ran them (queued on
// the legacy stream, here behind the gate). A block of a non-blocking stream's arena
// freed just after must not go to that stream's next malloc while they wait.
fn held_sync_op_on_the_legacy_stream(copy: bool) {
    let _serial = serial();
    let pool = cuda_rt::get_default_memory_pool();
    let side = Stream::non_blocking().unwrap();
    let src = cuda_rt::alloc(N).unwrap();
    src.memset(0xAB, N).unwrap();
    cuda_rt::device::synchronize().unwrap();
    let p = pool.malloc_on_stream(&side, N).unwrap();
    let addr = p.ptr();
    let mut gate = Gate::close(std::ptr::null_mut());
    if copy {
        p.copy_from_device(&src, N).unwrap();
    } else {
        p.memset(0xAB, N).unwrap();
    }
    drop(p);
    let q = pool.malloc_on_stream(&side, N).unwrap();
    q.memset_async(0x11, N, Some(&side)).unwrap();
    side.synchronize().unwrap();
    let held = gate.held();
    gate.open();
    cuda_rt::device::synchronize().unwrap();
    let mut back = vec![0u8; N];
    q.copy_to_host(&mut back).unwrap();
    assert!(
        !held || q.ptr() != addr,
        "copy {copy}: the block under the legacy stream's queued work was handed out again"
    );
    assert!(
        back.iter().all(|&b| b == 0x11),
        "copy {copy}: the legacy stream's work wrote the new owner's bytes"
    );
    drop(gate);
}

gpu_test!(a_memset_queued_on_the_legacy_stream_keeps_its_block, {
    held_sync_op_on_the_legacy_stream(false);
});

gpu_test!(a_device_copy_queued_on_the_legacy_stream_keeps_its_block, {
    held_sync_op_on_the_legacy_stream(true);
});

// Item 1, a stream given up: `Stream::into_raw` hands the handle to a new owner, who
// may destroy it at once (the driver defers the destruction until the work is done,
// not the handle's reuse), so a block freed onto it while its work still writes it
// could go to the next stream created with that handle, as for a dropped stream.
// `into_raw` of a stream a pool allocated on waits for its work: the gate is opened
// from another thread a little later, and `into_raw` must return only after that.
gpu_test!(
    a_stream_given_up_with_into_raw_has_finished_its_blocks_work,
    {
        use std::sync::atomic::{AtomicBool, Ordering};
        let _serial = serial();
        let pool = cuda_rt::get_default_memory_pool();
        let (s1, old_handle, _, gate) = stream_with_a_held_freed_block();
        let opened = Arc::new(AtomicBool::new(false));
        let (opener, o) = (gate.opener(), opened.clone());
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            o.store(true, Ordering::SeqCst);
            let _ = opener.send(());
        });
        let raw = s1.into_raw().unwrap();
        let waited = opened.load(Ordering::SeqCst);
        // The new owner destroys it; streams are made until one has its handle.
        // SAFETY: the stream was given up above, is destroyed once and not used again.
        unsafe { cuda_rt::cuda_sys::result::stream::destroy(raw) }.unwrap();
        let made = streams_until_handle(old_handle);
        let s2 = made.last().unwrap();
        let next = pool.malloc_on_stream(s2, N).unwrap();
        next.memset_async(0x11, N, Some(s2)).unwrap();
        t.join().unwrap();
        cuda_rt::device::synchronize().unwrap();
        let mut back = vec![0u8; N];
        next.copy_to_host(&mut back).unwrap();
        assert!(
            waited,
            "into_raw gave up a stream while work queued on it still wrote a block freed onto it"
        );
        assert!(
            back.iter().all(|&b| b == 0x11),
            "the new owner holds the given-up stream's bytes"
        );
        drop(gate);
    }
);

// Item 1, a user's allocator: memory of a closure pair freed while work queued on
// another stream still writes it. The pair may hand the memory out again at once (it
// is not `cuMemFree`, which waits for the device), so its free must run only after
// that work: the gate is opened from another thread a little later, and the free must
// see it open.
gpu_test!(
    a_user_pairs_free_runs_after_the_work_queued_on_its_memory,
    {
        use cuda_rt::cuda_sys::result::memory as raw;
        use cuda_rt::memory::{using_allocator, Allocator, ClosureAllocator};
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let _serial = serial();
        let opened = Arc::new(AtomicBool::new(false));
        // 0: not freed; 1: freed after the gate opened; 2: before.
        let freed = Arc::new(AtomicUsize::new(0));
        let (o, f) = (opened.clone(), freed.clone());
        let free = move |ptr, _, _| {
            f.store(
                if o.load(Ordering::SeqCst) { 1 } else { 2 },
                Ordering::SeqCst,
            );
            // SAFETY: `ptr` came from the pair's `cuMemAlloc`, freed once here.
            let _ = unsafe { raw::free(ptr) };
        };
        // SAFETY: `cuMemAlloc` memory of the requested size, freed once by the pair.
        let pair = unsafe { ClosureAllocator::new(|size, _| Ok(raw::alloc(size)?), free) };
        // First: the stream's creation makes the device's context current, which the
        // pair's raw `cuMemAlloc` needs (a pair not in a pool runs where it is called).
        let side = Stream::non_blocking().unwrap();
        let m = using_allocator(Some(Allocator::Closures(pair)), || {
            cuda_rt::alloc(N).unwrap()
        });
        let gate = Gate::close(side.as_raw());
        m.memset_async(0xAB, N, Some(&side)).unwrap();
        let opener = gate.opener();
        let o = opened.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(300));
            o.store(true, Ordering::SeqCst);
            let _ = opener.send(());
        });
        drop(m);
        t.join().unwrap();
        assert_eq!(
            freed.load(Ordering::SeqCst),
            1,
            "the pair's free ran while the memset queued on the memory was held"
        );
        drop(gate);
    }
);

// Item 1, a stream-ordered pool grown for another stream's arena (`malloc_on_stream`):
// its block must come from `cuMemAllocAsync` on that stream. Allocated on the thread's
// current stream instead (the legacy default here), the driver may hand over memory
// freed on that stream while work queued there before the free still writes it, and
// the arena's stream then uses it in no order with that work. The gate holds a memset
// of freed stream-ordered memory on the legacy stream; the new owner's bytes, written
// on `side`, must survive it.
gpu_test!(a_stream_ordered_pool_grows_on_the_stream_of_its_arena, {
    use cuda_rt::memory::{malloc_async, MemoryPool, PoolAllocator};
    let _serial = serial();
    let side = Stream::non_blocking().unwrap();
    let mut gate = Gate::close(std::ptr::null_mut());
    let old = malloc_async(N).unwrap();
    old.memset_async(0xAB, N, None).unwrap();
    drop(old);
    let pool = MemoryPool::with_allocator(PoolAllocator::StreamOrdered);
    let p = pool.malloc_on_stream(&side, N).unwrap();
    p.memset_async(0x11, N, Some(&side)).unwrap();
    // Let `side` run what it may (ordered after the gate, it waits: no sync here).
    let t0 = std::time::Instant::now();
    while !side.query().unwrap_or(true) && t0.elapsed() < std::time::Duration::from_millis(500) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let held = gate.held();
    gate.open();
    cuda_rt::device::synchronize().unwrap();
    let mut back = vec![0u8; N];
    p.copy_to_host(&mut back).unwrap();
    assert!(
        !held || back.iter().all(|&b| b == 0x11),
        "the stream-ordered pool handed out memory still written by the legacy stream's work"
    );
    drop(p);
    drop(gate);
});

// A stream-ordered pool does not grow on a capturing stream: `cuMemAllocAsync` there
// makes graph memory (it exists only while a launch of the graph runs), which the pool
// would cache and hand out as its own. Refused; the capture goes on.
gpu_test!(a_stream_ordered_pool_does_not_grow_on_a_capturing_stream, {
    use cuda_rt::memory::{MemoryPool, PoolAllocator};
    let _serial = serial();
    let pool = MemoryPool::with_allocator(PoolAllocator::StreamOrdered);
    let s = Stream::non_blocking().unwrap();
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let r = pool.malloc_on_stream(&s, N);
    let g = s.end_capture();
    let e = r.expect_err("a stream-ordered pool grew with graph memory");
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
    assert!(g.is_ok(), "the capture stayed valid: {:?}", g.err());
    assert_eq!(pool.stats().total_bytes, 0);
});

// Item 5, hand-built graphs: a copy, memset or kernel node is refused memory of a
// graph that never ran, before its first launch and after the graph went unlaunched
// (by the time the node runs, the address may be another graph's memory); ordinary
// memory still goes in, and the graph runs.
gpu_test!(graph_nodes_refuse_allocations_of_a_graph_never_launched, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let (p, g) = captured_allocation(&s, 1);
    let other = cuda_rt::alloc(N).unwrap();
    other.memset(0, N).unwrap();
    let spin =
        common_kernel::nvrtc_or_skip("graph_nodes_refuse_allocations_of_a_graph_never_launched")
            .then(|| RawKernel::new(common_kernel::SPIN_FILL, "spin_fill", &[]).unwrap());
    let h = Graph::new().unwrap();
    let refused = |when: &str| {
        let e = h.add_memset_node(&[], &p, 0xAB, 1, N).unwrap_err();
        assert!(is_gone(&e), "memset node, {when}: {e}");
        let e = h.add_memcpy_node(&[], &p, &other, N).unwrap_err();
        assert!(is_gone(&e), "copy node into it, {when}: {e}");
        let e = h.add_memcpy_node(&[], &other, &p, N).unwrap_err();
        assert!(is_gone(&e), "copy node from it, {when}: {e}");
        if let Some(k) = &spin {
            let mut args = KernelArgs::new();
            args.push_ptr(&p)
                .push((N / 4) as i32)
                .push(0xABu32)
                .push(0i64);
            let cfg = LaunchConfig::new(64, 256);
            // SAFETY: spin_fill(unsigned* p, int n, unsigned v, long long cycles) with N/4
            // words of p; the node is refused before it exists.
            let e = unsafe { h.add_kernel_node(&[], k, cfg, &args) }.unwrap_err();
            assert!(is_gone(&e), "kernel node, {when}: {e}");
        }
        assert_eq!(
            h.node_count().unwrap(),
            0,
            "{when}: a refused node was added"
        );
    };
    refused("before the first launch");
    drop(g);
    refused("after the graph went unlaunched");
    h.add_memset_node(&[], &other, 0x5A, 1, N).unwrap();
    h.launch(&s).unwrap();
    s.synchronize().unwrap();
    let mut back = vec![0u8; N];
    other.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A));
});

// Item 3, host side: a copy that waits for its work is refused before anything is
// queued while this thread captures in global mode (which refuses that wait): were it
// queued, the refused wait would return with the DMA still due to read or write a
// host slice the caller takes back. The streams are synchronised after the capture
// ends: a copy that had been queued would show in the bytes.
gpu_test!(
    waiting_host_copies_are_refused_while_this_thread_captures,
    {
        let _serial = serial();
        let s = Stream::non_blocking().unwrap();
        let other = Stream::non_blocking().unwrap();
        let dev = cuda_rt::alloc(N).unwrap();
        dev.memset(0xAB, N).unwrap();
        let dst = cuda_rt::alloc(N).unwrap();
        dst.memset(0, N).unwrap();
        let src = vec![0xCDu8; N];
        let mut small = vec![0u8; 4096];
        // Staged: pageable and at least PAGEABLE_THRESHOLD bytes.
        let mut large = vec![0u8; N];
        let mut held = vec![0xEEu8; 4096];
        let mut reg = cuda_rt::pinned::register(&mut held).unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        let results = [
            cuda_rt::pinned::copy_device_to_host(&mut small, &dev, &other),
            cuda_rt::pinned::copy_device_to_host(&mut large, &dev, &other),
            cuda_rt::pinned::copy_host_to_device(&dst, &src, &other),
            cuda_rt::pinned::copy_host_to_device(&dst, &src[..4096], &other),
            reg.copy_from_device(&dev, &other),
            reg.copy_to_device(&dst, &other),
        ];
        let _ = s.end_capture();
        other.synchronize().unwrap();
        for (i, r) in results.iter().enumerate() {
            assert!(
                matches!(
                    r,
                    Err(Error::Capture {
                        kind: CaptureKind::Refused,
                        ..
                    })
                ),
                "copy {i}: {r:?}"
            );
        }
        drop(reg);
        assert!(
            small.iter().all(|&b| b == 0),
            "a refused copy wrote the small slice"
        );
        assert!(
            large.iter().all(|&b| b == 0),
            "a refused copy wrote the staged slice"
        );
        assert!(
            held.iter().all(|&b| b == 0xEE),
            "a refused copy wrote registered memory"
        );
        let mut back = vec![1u8; N];
        dst.copy_to_host(&mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "a refused copy wrote the device"
        );
        // The same copies work once the capture is over.
        cuda_rt::pinned::copy_device_to_host(&mut large, &dev, &other).unwrap();
        assert!(large.iter().all(|&b| b == 0xAB));
    }
);

// Item 5: during its capture a graph allocation may be used by work of that capture
// only; work on a stream outside it is refused.
gpu_test!(
    a_capture_allocation_is_refused_to_work_outside_the_capture,
    {
        let _serial = serial();
        let s = Stream::non_blocking().unwrap();
        let other = Stream::non_blocking().unwrap();
        let _on = s.enter().unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let p = cuda_rt::alloc(N).unwrap();
        p.memset_async(1, N, Some(&s)).unwrap();
        let e = p.memset_async(1, N, Some(&other)).unwrap_err();
        assert!(is_gone(&e), "{e}");
        drop(p);
        s.end_capture().unwrap();
    }
);

// Item 6: inside a capture, an allocation dropped on the origin stream while a
// forked stream's memset of it is not joined yet. The fork waits (a slow kernel)
// before its memset; the origin allocates again after the free, sets the new block,
// waits longer, then copies it out. The free node must depend on the fork's memset,
// or the new block (the same memory) is overwritten before the copy.
gpu_test!(a_free_in_a_capture_waits_for_an_unjoined_forks_use, {
    if !common_kernel::nvrtc_or_skip("a_free_in_a_capture_waits_for_an_unjoined_forks_use") {
        return;
    }
    let _serial = serial();
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(common_kernel::SPIN_FILL, "spin_fill", &[]).unwrap();
    let words = (N / 4) as i32;
    let s1 = Stream::non_blocking().unwrap();
    let s2 = Stream::non_blocking().unwrap();
    let scratch1 = cuda_rt::alloc(N).unwrap();
    let scratch2 = cuda_rt::alloc(N).unwrap();
    let out = cuda_rt::alloc(N).unwrap();
    let cfg = LaunchConfig::new(64, 256);
    const SHORT: i64 = 20_000_000; // ~10 ms
    const LONG: i64 = 200_000_000; // ~100 ms
                                   // Loaded before the capture (a module load is refused on a capturing thread).
                                   // SAFETY: as below, on scratch1, with no spin.
    unsafe { cuda_rt::launch!(k, &cfg, &s1, (scratch1.ptr(), words, 0u32, 0i64)).unwrap() };
    s1.synchronize().unwrap();
    let graph = {
        let _on = s1.enter().unwrap();
        s1.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let p = cuda_rt::alloc(N).unwrap();
        let fork = s1.record(None).unwrap();
        s2.wait_event(&fork).unwrap();
        // SAFETY: spin_fill(unsigned* p, int n, unsigned v, long long cycles); scratch2
        // holds N bytes (n/4 words written), kept by the test past every launch.
        unsafe { cuda_rt::launch!(k, &cfg, &s2, (scratch2.ptr(), words, 0u32, SHORT)).unwrap() };
        p.memset_async(0xAB, N, Some(&s2)).unwrap();
        // Dropped on the origin while the fork's memset is not joined.
        drop(p);
        let q = cuda_rt::alloc(N).unwrap();
        q.memset_async(0x11, N, None).unwrap();
        // SAFETY: as above, on scratch1.
        unsafe { cuda_rt::launch!(k, &cfg, &s1, (scratch1.ptr(), words, 0u32, LONG)).unwrap() };
        out.copy_from_device_async(&q, N, None).unwrap();
        drop(q);
        let join = s2.record(None).unwrap();
        s1.wait_event(&join).unwrap();
        s1.end_capture().unwrap()
    };
    graph.launch(&s1).unwrap();
    s1.synchronize().unwrap();
    let mut back = vec![0u8; N];
    out.copy_to_host(&mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0x11),
        "the fork's memset of the freed block overwrote the next allocation: {:#x?}",
        &back[..8]
    );
});

// Item 9: a cuda-rt call from a host function is refused with an error, not made.
gpu_test!(cuda_rt_calls_in_a_host_function_are_refused, {
    let s = Stream::non_blocking().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    s.launch_host_func(move || {
        // Creating a stream always reaches the driver.
        let r = Stream::non_blocking().map(|_| ());
        let _ = tx.send(r);
    })
    .unwrap();
    s.synchronize().unwrap();
    let r = rx.recv().unwrap();
    let e = r.unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidState {
                kind: StateKind::InHostFunction,
                ..
            }
        ),
        "{e}"
    );
});

// Item 9: a stream or an event whose last owner is dropped in a host function is kept
// (leaked), not destroyed there: the driver may not be called in a host function.
// The last memory of a dropped `MemoryPool::new` pool dropped in a host function:
// the orphaned pool releases its cache there (a poll of its fences) and, its last
// object gone, is dropped there (a wait for its fences). CUDA forbids both in a host
// function, and the wait is for a fence recorded on the same stream after the
// function: it would never end. The stream must get past the function.
gpu_test!(
    an_orphaned_pool_dropped_in_a_host_function_waits_for_no_fence,
    {
        use cuda_rt::memory::MemoryPool;
        let _serial = serial();
        let side = Stream::non_blocking().unwrap();
        let other = Stream::non_blocking().unwrap();
        let pool = MemoryPool::new();
        let p = pool.malloc(N).unwrap();
        let q = pool.malloc(N).unwrap();
        // Both used on other streams: their frees fence rather than park (a parking slot
        // of this thread would keep the pool alive).
        p.memset_async(1, N, Some(&other)).unwrap();
        q.memset_async(2, N, Some(&side)).unwrap();
        let mut gate = Gate::close(side.as_raw());
        side.launch_host_func(move || drop(p)).unwrap();
        drop(pool);
        // q awaits a fence recorded on `side` behind the host function, which now holds
        // the pool's last memory.
        drop(q);
        gate.open();
        let t0 = std::time::Instant::now();
        while !side.query().unwrap_or(false) && t0.elapsed() < std::time::Duration::from_secs(10) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let passed = side.query().unwrap_or(false);
        if !passed {
            // Its drop would wait for the stuck stream.
            std::mem::forget(gate);
        }
        assert!(
            passed,
            "the pool dropped in a host function waited for work queued behind it"
        );
        other.synchronize().unwrap();
    }
);

gpu_test!(a_stream_and_an_event_dropped_in_a_host_function_are_kept, {
    use cuda_rt::cuda_sys::driver as sys;
    let s = Stream::non_blocking().unwrap();
    let owned = Stream::non_blocking().unwrap();
    // Interprocess: never kept in a cache, so its drop would destroy it.
    let event = cuda_rt::Event::new(false, true, true).unwrap();
    let (raw_stream, raw_event) = (owned.as_raw(), event.as_raw());
    s.launch_host_func(move || {
        drop(owned);
        drop(event);
    })
    .unwrap();
    s.synchronize().unwrap();
    let api = sys::api().unwrap();
    // SAFETY: both handles were kept alive (leaked) by the drops above, which is what
    // this test checks: a destroyed handle would answer an error.
    let rs = unsafe { api.cuStreamQuery().unwrap()(raw_stream) };
    // SAFETY: as above.
    let re = unsafe { api.cuEventQuery().unwrap()(raw_event) };
    assert_eq!(
        rs,
        sys::CUresult::CUDA_SUCCESS,
        "the stream was destroyed in the host function"
    );
    assert!(
        matches!(
            re,
            sys::CUresult::CUDA_SUCCESS | sys::CUresult::CUDA_ERROR_NOT_READY
        ),
        "the event was destroyed in the host function: {re:?}"
    );
});

// Item 9: an operation enqueued on a stream while another thread begins and ends a
// capture of it is either captured and kept by the graph, or not captured: the
// graph never runs on memory the pool handed out again.
gpu_test!(enqueues_racing_a_capture_are_noted_or_not_captured, {
    let _serial = serial();
    let s = Arc::new(Stream::non_blocking().unwrap());
    for round in 0..20u64 {
        let go = Arc::new(Barrier::new(2));
        let worker = {
            let (s, go) = (s.clone(), go.clone());
            std::thread::spawn(move || {
                let x = cuda_rt::alloc(N).unwrap();
                go.wait();
                // May land inside or outside the capture: either is fine.
                let _ = x.memset_async(0xAB, N, Some(&*s));
                drop(x);
            })
        };
        go.wait();
        s.begin_capture(CaptureMode::Relaxed).unwrap();
        worker.join().unwrap();
        let g = s.end_capture().unwrap();
        let y = cuda_rt::alloc(N).unwrap();
        y.copy_from_host(&pattern(N, round)).unwrap();
        g.launch(&*s).unwrap();
        s.synchronize().unwrap();
        let mut back = vec![0u8; N];
        y.copy_to_host(&mut back).unwrap();
        assert!(
            back == pattern(N, round),
            "round {round}: a captured memset wrote memory handed out again"
        );
        drop(g);
    }
});

// Item 9: the stream-ordered allocator is capture-aware: during a capture,
// `malloc_async` on the capturing stream makes the graph's allocation (as `alloc`
// does), and a `MemoryAsync` that would be freed outside the graph is refused.
gpu_test!(malloc_async_during_a_capture_is_the_graphs_allocation, {
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let (p, g) = {
        let _on = s.enter().unwrap();
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        let p = cuda_rt::memory::malloc_async(N).unwrap();
        p.memset_async(5, N, None).unwrap();
        let e = cuda_rt::memory::MemoryAsync::new_on(N, &s).unwrap_err();
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
        (p, s.end_capture().unwrap())
    };
    assert_eq!(g.owned_allocation_count(), 1, "the graph owns it");
    assert!(is_gone(&p.memset(1, N).unwrap_err()), "not before a launch");
    g.launch(&s).unwrap();
    s.synchronize().unwrap();
    let mut back = vec![0u8; N];
    p.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 5));
});

/// Runs `f` on a thread of its own that begins a global-mode capture on a new
/// stream, waits for `end` (from the test), then ends the capture: while it lasts,
/// every other thread's waits are refused (and retried by the waits that hold lent
/// memory). Returns the sender that ends it and the thread's result channel.
fn global_capture_on_another_thread(
) -> (std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<bool>) {
    let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<bool>();
    let began = Arc::new(Barrier::new(2));
    let b = began.clone();
    std::thread::spawn(move || {
        let s = Stream::non_blocking().unwrap();
        s.begin_capture(CaptureMode::Global).unwrap();
        b.wait();
        let _ = end_rx.recv();
        let ended = s.end_capture().is_ok();
        let _ = done_tx.send(ended);
    });
    began.wait();
    (end_tx, done_rx)
}

// A staged host copy (pageable, at least PAGEABLE_THRESHOLD bytes) whose final wait is
// refused by another thread's global-mode capture retries until that capture ends:
// the capture's end must not wait for the copy. It did: `copy_from_host_async` ran
// the whole staged copy, its waits included, under the capture transition lock,
// which `end_capture` takes exclusively, so neither could go on (and every thread
// that queued work blocked behind the waiting end).
gpu_test!(a_staged_copy_waiting_out_a_global_capture_lets_it_end, {
    let _serial = serial();
    let other = Arc::new(Stream::non_blocking().unwrap());
    let dev = cuda_rt::alloc(4 * N).unwrap();
    let src = Arc::new(pattern(4 * N, 11));
    // Warm: the staging buffers and events are cached, so the copy below makes no
    // call the capture refuses before its wait.
    dev.copy_from_host_async(&src[..], Some(&*other)).unwrap();
    dev.memset(0, 4 * N).unwrap();
    let (end, ended) = global_capture_on_another_thread();
    let (copied_tx, copied) = std::sync::mpsc::channel();
    {
        let (dev, src, other) = (dev.clone(), src.clone(), other.clone());
        std::thread::spawn(move || {
            let r = dev.copy_from_host_async(&src[..], Some(&*other));
            let _ = copied_tx.send(r.is_ok());
        });
    }
    // The copy is queued and waits (refused) meanwhile.
    std::thread::sleep(std::time::Duration::from_millis(200));
    end.send(()).unwrap();
    let t = std::time::Duration::from_secs(30);
    assert!(
        ended.recv_timeout(t).is_ok(),
        "the capture's end waited for a staged copy that waited for the capture's end"
    );
    assert!(
        copied.recv_timeout(t).is_ok(),
        "the staged copy never ended"
    );
    other.synchronize().unwrap();
    let mut back = vec![0u8; 4 * N];
    dev.copy_to_host(&mut back).unwrap();
    assert!(back == *src, "the staged copy's bytes");
});

/// What the copying thread of [`sync_copy_across_a_capture`] sends once its copy
/// returned: the result, the bytes the range held right then, and the range (which
/// the thread then overwrote with `pattern(N, 5)`: it is the caller's again).
type Returned = (
    cuda_rt::Result<()>,
    Vec<u8>,
    cuda_rt::pinned::PinnedMemoryPointer,
);

/// A synchronous copy queued on a stream, and a capture that the stream is in by the
/// time the copy waits (see [`sync_copy_across_a_capture`]).
struct AcrossCapture {
    /// The capture's origin (capturing, relaxed mode).
    origin: Arc<Stream>,
    /// The copy's stream: the origin, or a stream forked into its capture.
    copy_on: Arc<Stream>,
    /// Holds `copy_on` (the copy and everything after it) until opened.
    gate: Gate,
    /// Where the copying thread sends [`Returned`].
    back: std::sync::mpsc::Receiver<Returned>,
}

impl AcrossCapture {
    /// Joins a forked copy stream back and ends the capture.
    fn end_capture(&self) -> cuda_rt::Result<Graph> {
        if !Arc::ptr_eq(&self.origin, &self.copy_on) {
            // A join refused (an invalidated capture) still ends the capture.
            let joined = self.copy_on.record(None);
            if let Ok(ev) = &joined {
                let _ = self.origin.wait_event(ev);
            }
        }
        self.origin.end_capture()
    }

    /// Waits for the capture's streams after it ended.
    fn synchronize(&self) {
        self.origin.synchronize().unwrap();
        self.copy_on.synchronize().unwrap();
    }
}

/// Makes `to` wait for the work queued on `from` (an event recorded there): forks `to`
/// into `from`'s capture, or joins `from` back into `to`'s.
fn fork(from: &Stream, to: &Stream) {
    let ev = from.record(None).unwrap();
    to.wait_event(&ev).unwrap();
}

/// A synchronous copy of `dev` (`N` bytes) into page-locked memory, queued by a thread
/// of its own on a new stream behind a closed gate, which is then in a capture that
/// this thread began: the copy's stream itself (`forked` false), or another stream
/// forked into that capture after the copy was queued. Another thread's global-mode
/// capture keeps the copy's wait refused (and retried) until then, and ends.
fn sync_copy_across_a_capture(dev: &cuda_rt::MemoryPointer, forked: bool) -> AcrossCapture {
    let origin = Arc::new(Stream::non_blocking().unwrap());
    let copy_on = if forked {
        Arc::new(Stream::non_blocking().unwrap())
    } else {
        origin.clone()
    };
    let mut host = cuda_rt::pinned::alloc_pinned_memory(N).unwrap();
    host.as_mut_slice().unwrap().fill(0);
    // Warm: the fences come from this thread's event cache, so the capture below
    // makes no call another thread's global-mode capture could refuse.
    origin.begin_capture(CaptureMode::Relaxed).unwrap();
    if forked {
        fork(&origin, &copy_on);
    }
    if forked {
        fork(&copy_on, &origin);
    }
    drop(origin.end_capture().unwrap());
    let gate = Gate::close(copy_on.as_raw());
    let (end, ended) = global_capture_on_another_thread();
    let (back_tx, back) = std::sync::mpsc::channel();
    {
        let (dev, copy_on) = (dev.clone(), copy_on.clone());
        std::thread::spawn(move || {
            let r = dev.copy_to_host_async(&mut host.as_mut_slice().unwrap()[..N], Some(&*copy_on));
            let seen = host.as_slice().unwrap()[..N].to_vec();
            // The borrow is over: the range is the caller's again.
            host.as_mut_slice().unwrap()[..N].copy_from_slice(&pattern(N, 5));
            let _ = back_tx.send((r, seen, host));
        });
    }
    std::thread::sleep(std::time::Duration::from_millis(200));
    origin.begin_capture(CaptureMode::Relaxed).unwrap();
    if forked {
        fork(&origin, &copy_on);
    }
    end.send(()).unwrap();
    let _ = ended.recv_timeout(std::time::Duration::from_secs(30));
    std::thread::sleep(std::time::Duration::from_millis(200));
    AcrossCapture {
        origin,
        copy_on,
        gate,
        back,
    }
}

// A synchronous copy into page-locked memory whose stream another thread begins to
// capture while the copy (queued before, held by the gate) is still to run: the wait
// is refused because the stream captures, yet the queued copy is real and still
// writes the memory. The copy must not return before it ran; it did (`stream::drain`
// gave up on a stream that captures, taking its work for the graph's), handing back
// the pinned range while the DMA was still to write it.
gpu_test!(
    a_sync_copy_outlasts_a_capture_begun_on_its_stream_after_it,
    {
        let _serial = serial();
        let dev = cuda_rt::alloc(N).unwrap();
        dev.memset(0xAB, N).unwrap();
        let mut c = sync_copy_across_a_capture(&dev, false);
        let early = c.back.try_recv().ok();
        let held = c.gate.held();
        assert!(
            early.is_none() || !held,
            "the copy returned while its DMA into the pinned range was still queued"
        );
        let _ = c.end_capture();
        c.gate.open();
        let (_, _, host) = match early {
            Some(r) => r,
            None => c
                .back
                .recv_timeout(std::time::Duration::from_secs(30))
                .unwrap(),
        };
        c.synchronize();
        assert!(
            host.as_slice().unwrap()[..N] == pattern(N, 5)[..],
            "the copy wrote the range after it was handed back"
        );
    }
);

/// A copy of `pattern(N, 9)` across a capture ([`sync_copy_across_a_capture`], the
/// copy's stream `forked` into it or its origin), whose thread then waits for the
/// copying thread before it ends the capture (a worker joined inside the capture):
/// the copy must return meanwhile, not before its DMA ran, with its bytes, and the
/// capture must end with no node of the copy.
fn a_capture_waits_for_the_copy(forked: bool) {
    let _serial = serial();
    let dev = cuda_rt::alloc(N).unwrap();
    dev.copy_from_host(&pattern(N, 9)).unwrap();
    let mut c = sync_copy_across_a_capture(&dev, forked);
    let early = c.back.try_recv().ok();
    let returned_early = early.is_some() && c.gate.held();
    c.gate.open();
    let got = early.or_else(|| c.back.recv_timeout(std::time::Duration::from_secs(20)).ok());
    let ended_capture = c.end_capture();
    assert!(
        !returned_early,
        "the copy returned while its DMA into the pinned range was still queued"
    );
    let Some((r, seen, host)) = got else {
        panic!("the copy waited for the end of a capture whose thread waited for the copy");
    };
    r.unwrap();
    assert!(seen == pattern(N, 9), "the copy returned without its bytes");
    // The copy's wait did not touch the capturing stream (unless it asked just before
    // the stream joined the capture, a window of microseconds): the capture survives.
    match ended_capture {
        Ok(g) => {
            let copies = g
                .nodes()
                .unwrap()
                .iter()
                .filter(|n| {
                    n.node_type().ok()
                        == Some(
                            cuda_rt::cuda_sys::driver::CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY,
                        )
                })
                .count();
            assert_eq!(copies, 0, "the copy went into the graph");
        }
        Err(e) => assert!(
            matches!(
                e,
                Error::Capture {
                    kind: CaptureKind::Invalidated,
                    ..
                }
            ),
            "{e}"
        ),
    }
    c.synchronize();
    assert!(
        host.as_slice().unwrap()[..N] == pattern(N, 5)[..],
        "the copy wrote the range after it was handed back"
    );
}

// As above, but the capturing thread waits for the copying thread before it ends its
// capture. The copy's wait, refused because the stream captures, waited for the
// capture to end, which waited for the copy: both hung. Now the copy waits for the
// capture's fence (an event recorded on the stream just before the capture began) and
// returns once its own DMA ran, without touching the stream, so the capture goes on.
gpu_test!(
    a_sync_copy_queued_before_a_capture_returns_while_the_capture_waits_for_it,
    {
        a_capture_waits_for_the_copy(false);
    }
);

// The same with the copy's stream forked into the capture (`wait_event` on an event
// recorded in it) after the copy was queued: the fork records the stream's fence.
gpu_test!(
    a_sync_copy_queued_before_its_stream_joined_a_capture_returns_while_the_capture_waits,
    {
        a_capture_waits_for_the_copy(true);
    }
);

// A synchronous copy queued on a stream that another thread captures: the copy must
// run (and be waited for) or fail, never land in that thread's graph. Before
// `capture::enqueue_uncaptured`, a capture begun and ended around the copy's enqueue
// (a narrow window, so the test runs many rounds) took the copy into its graph, which
// kept neither the device memory nor the page-locked range, and the copy's wait then
// found an idle stream and reported the copy done: its bytes never came, and every
// launch of that graph would have written the range after it was given back.
gpu_test!(
    a_capture_of_another_thread_never_takes_a_synchronous_copy,
    {
        let _serial = serial();
        const M: usize = 64 << 10;
        let s = Arc::new(Stream::non_blocking().unwrap());
        let dev = cuda_rt::alloc(M).unwrap();
        dev.copy_from_host(&pattern(M, 3)).unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let worker = {
            let (s, dev, stop) = (s.clone(), dev.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut host = cuda_rt::pinned::alloc_pinned_memory(M).unwrap();
                let (mut ok, mut refused) = (0u64, 0u64);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let h = &mut host.as_mut_slice().unwrap()[..M];
                    h.fill(0);
                    match cuda_rt::pinned::copy_device_to_host(h, &dev, &*s) {
                        Ok(()) => {
                            assert!(
                                h[..] == pattern(M, 3)[..],
                                "a synchronous copy reported done without its bytes"
                            );
                            ok += 1;
                        }
                        Err(_) => refused += 1,
                    }
                }
                (ok, refused)
            })
        };
        let mut taken = 0;
        for _ in 0..300 {
            s.begin_capture(CaptureMode::Relaxed).unwrap();
            std::thread::yield_now();
            if let Ok(g) = s.end_capture() {
                if g.node_count().unwrap() != 0 {
                    taken += 1;
                }
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (ok, refused) = worker.join().unwrap();
        s.synchronize().unwrap();
        assert_eq!(
            taken, 0,
            "{taken} graphs of 300 took another thread's synchronous copy ({ok} copies done, \
         {refused} refused)"
        );
        // With no capture under way the stream copies as before.
        let mut host = cuda_rt::pinned::alloc_pinned_memory(M).unwrap();
        let h = &mut host.as_mut_slice().unwrap()[..M];
        cuda_rt::pinned::copy_device_to_host(h, &dev, &*s).unwrap();
        assert!(h[..] == pattern(M, 3)[..]);
    }
);

// A pool's cached block never goes into a graph: freed on its own stream with no
// fence, it may still be written by work queued there before the capture began, and
// the graph, launched on another stream, is not ordered after that work. During a
// capture the default pool makes the graph's own memory (as `alloc` does) and any
// other pool refuses; before, `malloc_on_stream` handed the capture the block the
// gated memset below still had to write.
gpu_test!(a_pools_cached_block_is_not_handed_to_a_capture, {
    use cuda_rt::memory::MemoryPool;
    let _serial = serial();
    let s = Stream::non_blocking().unwrap();
    let t = Stream::non_blocking().unwrap();
    let default = cuda_rt::get_default_memory_pool();
    let other = MemoryPool::new();
    // Cached on `s`'s arena of both pools with work still queued on it.
    let mut gate = Gate::close(s.as_raw());
    for pool in [&default, &other] {
        let p = pool.malloc_on_stream(&s, N).unwrap();
        p.memset_async(0xAB, N, Some(&s)).unwrap();
        drop(p);
    }
    s.begin_capture(CaptureMode::ThreadLocal).unwrap();
    let e = other.malloc_on_stream(&s, N).unwrap_err();
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
    let q = default.malloc_on_stream(&s, N).unwrap();
    q.memset_async(0x11, N, Some(&s)).unwrap();
    let g = s.end_capture().unwrap();
    assert_eq!(g.owned_allocation_count(), 1, "the graph's own memory");
    // Launched elsewhere while the memset of the cached block still waits.
    g.launch(&t).unwrap();
    t.synchronize().unwrap();
    assert!(gate.held(), "the gate held the earlier memset");
    gate.open();
    s.synchronize().unwrap();
    let mut back = vec![0u8; N];
    q.copy_to_host(&mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 0x11),
        "the graph's memory was a block still written by work queued before the capture"
    );
    drop(g);
});
