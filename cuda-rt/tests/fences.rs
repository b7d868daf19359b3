//! A fence that cannot be queried is not a finished fence, on a real GPU: while another
//! thread holds a global-mode stream capture, every `cuEventQuery` (and
//! `cuEventSynchronize`) of this process fails although the stream work goes on. A
//! pinned block freed under a device-to-host copy, and a device pool block used by a
//! recorded stream, must not be handed out again on the strength of such a failed
//! query. Each test queues the work behind a [`Gate`], frees the block, lets another
//! thread hold a global capture while this one allocates the same size (the pool polls
//! its fences then), ends the capture, opens the gate, and checks that every new owner
//! still has its own bytes. Reuse is judged only when the gate held the work back
//! through the allocations (`Gate::held`).
//!
//! Both tests run alone (`gpu_test!(alone ...)`): a global capture makes the other
//! threads' event queries, synchronisations and allocations fail. Without a GPU they
//! skip.

mod common;

use std::sync::mpsc;
use std::thread::{self, JoinHandle};

use common::{pattern, Gate};
use cuda_rt::memory::MemoryPool;
use cuda_rt::{
    gpu_test, AsStream, CaptureMode, PinnedMemoryPointer, PinnedMemoryPool, Stream,
    StreamCaptureExt,
};

/// A global-mode capture held by a thread of its own on a stream of its own, from
/// [`begin`](GlobalCapture::begin) until the value is dropped (a panicking test ends
/// it too).
struct GlobalCapture {
    done: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl GlobalCapture {
    /// Starts the capture; `None` when the driver refused to begin it.
    fn begin() -> Option<GlobalCapture> {
        let (began_tx, began_rx) = mpsc::channel();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let thread = thread::spawn(move || {
            let s = Stream::non_blocking().unwrap();
            let began = s.begin_capture(CaptureMode::Global);
            let ok = began.is_ok();
            let _ = began_tx.send(began.err().map(|e| e.to_string()));
            if !ok {
                return;
            }
            // Held until the test says so (or drops the sender).
            let _ = done_rx.recv();
            // The calls other threads made may have invalidated the capture: its end
            // (the stream leaves capture mode either way) is all that matters here.
            let _ = s.end_capture();
        });
        match began_rx.recv() {
            Ok(None) => Some(GlobalCapture {
                done: Some(done_tx),
                thread: Some(thread),
            }),
            Ok(Some(e)) => {
                eprintln!("the global capture could not begin ({e}): not judged");
                let _ = thread.join();
                None
            }
            Err(_) => {
                let _ = thread.join();
                None
            }
        }
    }
}

impl Drop for GlobalCapture {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// `n` bytes of pinned memory from `pool` holding `pattern(n, seed)`, or `None` when
/// the allocation was refused (during a global capture `cuMemHostAlloc` may be).
fn pinned_with(pool: &PinnedMemoryPool, n: usize, seed: u64) -> Option<PinnedMemoryPointer> {
    let mut p = pool.malloc(n).ok()?;
    p.as_mut_slice().unwrap().copy_from_slice(&pattern(n, seed));
    Some(p)
}

gpu_test!(
    alone
    a_pinned_block_under_a_copy_is_not_reused_while_another_thread_holds_a_global_capture,
    {
        let n = 1 << 20;
        let pool = PinnedMemoryPool::new();
        let stream = Stream::non_blocking().unwrap();
        let dev = cuda_rt::alloc(n).unwrap();
        dev.copy_from_host(&pattern(n, 30)).unwrap();
        let mut host = pool.malloc(n).unwrap();
        let addr = host.ptr();
        // Declared before the capture, so the capture ends first when a check fails.
        let mut gate = Gate::close(stream.as_raw());
        // Device to host, behind the gate: it writes the block after the gate opens.
        host.copy_from_device_async(&dev, &stream).unwrap();
        let in_flight = !host.is_idle();
        let Some(capture) = GlobalCapture::begin() else {
            gate.open();
            return;
        };
        // Freed while every fence query fails: the block must go to the deferred list,
        // not to the cache (nor this thread's parking slot).
        drop(host);
        // Each malloc polls the deferred list (queries fail again), then misses: the
        // growth may be refused during the capture, which is fine; a hit on the block
        // under the copy is the bug.
        let mut owners: Vec<(PinnedMemoryPointer, u64)> = (0..4)
            .filter_map(|i| pinned_with(&pool, n, 40 + i).map(|p| (p, 40 + i)))
            .collect();
        let deferred_during = pool.n_deferred_blocks();
        drop(capture);
        // Queries answer again, and say the copy is still behind the gate.
        owners.extend((0..2).filter_map(|i| pinned_with(&pool, n, 50 + i).map(|p| (p, 50 + i))));
        let deferred_after = pool.n_deferred_blocks();
        if in_flight && gate.held() {
            assert!(
                owners.iter().all(|(p, _)| p.ptr() != addr),
                "pinned memory under a copy was handed out"
            );
            assert_eq!(
                (deferred_during, deferred_after),
                (1, 1),
                "the block under the copy left the deferred list while its copy waited"
            );
        } else {
            eprintln!("the copy could finish before the allocations (the gate timed out): reuse not judged");
        }
        gate.open();
        stream.synchronize().unwrap();
        for (p, seed) in &owners {
            assert!(
                p.as_slice().unwrap() == &pattern(n, *seed)[..],
                "the copy wrote into the pinned memory of a new owner (seed {seed})"
            );
        }
        drop(owners);
        drop(gate);
    }
);

gpu_test!(
    alone
    a_pool_block_used_by_a_recorded_stream_is_not_reused_while_another_thread_holds_a_global_capture,
    {
        // A size no other test of this binary uses, in a pool of its own.
        let n = (3 << 20) + 512;
        let pool = MemoryPool::new();
        let home = Stream::non_blocking().unwrap();
        let side = Stream::non_blocking().unwrap();
        // Every malloc below goes to `home`'s arena, where the block is freed.
        let _on_home = home.enter().unwrap();
        let x = pool.malloc(n).unwrap();
        let x_addr = x.ptr();
        let mut gate = Gate::close(side.as_raw());
        // Behind the gate on the side stream: it writes the block after the gate opens.
        x.memset_async(0xAB, n, Some(&side)).unwrap();
        x.record_stream(&side).unwrap();
        // Freed before the capture, so its fence is recorded: the block awaits it.
        drop(x);
        let in_flight = pool.stats().awaiting_blocks == 1;
        let Some(capture) = GlobalCapture::begin() else {
            gate.open();
            return;
        };
        // Each miss polls the arena's awaiting blocks (every query fails), then grows
        // (`cuMemAlloc` may be refused during the capture, which is fine); handing out
        // the awaiting block is the bug. Nothing is written yet: copies may be refused
        // during the capture too.
        let mut owners: Vec<_> = (0..4).filter_map(|_| pool.malloc(n).ok()).collect();
        let awaiting_during = pool.stats().awaiting_blocks;
        drop(capture);
        // Queries answer again, and say the memset is still behind the gate.
        owners.extend((0..2).map(|_| pool.malloc(n).unwrap()));
        let awaiting_after = pool.stats().awaiting_blocks;
        for (i, p) in owners.iter().enumerate() {
            p.copy_from_host(&pattern(n, 60 + i as u64)).unwrap();
        }
        if in_flight && gate.held() {
            assert!(
                owners.iter().all(|p| p.ptr() != x_addr),
                "a block in use by a recorded stream was handed out"
            );
            assert_eq!(
                (awaiting_during, awaiting_after),
                (1, 1),
                "the block left the awaiting list while its stream was held"
            );
        } else {
            eprintln!("the memset could finish before the allocations (the gate timed out): reuse not judged");
        }
        gate.open();
        side.synchronize().unwrap();
        for (i, p) in owners.iter().enumerate() {
            let mut back = vec![0u8; n];
            p.copy_to_host(&mut back).unwrap();
            assert!(
                back == pattern(n, 60 + i as u64),
                "the memset on the recorded stream wrote into a new owner's block ({i})"
            );
        }
        drop(owners);
        drop(gate);
    }
);
