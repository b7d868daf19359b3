//! Cross-stream safety of the caching pool (`MemoryPointer::record_stream`, PyTorch's
//! `record_stream`) on a real GPU: a block used by a slow kernel on another stream is
//! not handed out again until the kernel has ended (pattern-checked), it is reused
//! without any host synchronisation once the stream has passed it, and a block with
//! no recorded stream records no event and waits for nothing. Without a GPU each test
//! skips (see `cuda_rt::testing`); the kernel tests also need NVRTC.

mod common_kernel;

use cuda_rt::compiler::RawKernel;
use cuda_rt::event::Event;
use cuda_rt::launch::LaunchConfig;
use cuda_rt::memory::MemoryPool;
use cuda_rt::prelude::*;
use cuda_rt::stream::Stream;
use cuda_rt::{gpu_test, DeviceBuffer};

/// About a second on a 2 GHz GPU (longer under compute-sanitizer).
const SLOW: i64 = 2_000_000_000;

const N: usize = 1 << 20;
const BYTES: usize = N * 4;

fn spin_kernel(name: &str) -> Option<RawKernel> {
    if !common_kernel::nvrtc_or_skip(name) {
        return None;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    Some(RawKernel::new(common_kernel::SPIN_FILL, "spin_fill", &[]).unwrap())
}

gpu_test!(
    a_block_used_by_a_slow_kernel_on_another_stream_is_not_reused_until_it_ends,
    {
        let Some(k) = spin_kernel("record_stream_slow_kernel") else {
            return;
        };
        let pool = MemoryPool::new();
        let a = Stream::non_blocking().unwrap();
        let b = Stream::non_blocking().unwrap();
        let _in = a.enter().unwrap();
        let x = pool.malloc(BYTES).unwrap();
        let x_addr = x.ptr();
        let (n, v_b) = (N as i32, 0xB0B0_B0B0u32);
        // SAFETY: spin_fill(unsigned* p, int n, unsigned v, long long cycles): x holds N
        // u32 of this device, kept from reuse by record_stream until the kernel ends.
        unsafe { cuda_rt::launch!(k, &LaunchConfig::new(64, 256), &b, (x, n, v_b, SLOW)).unwrap() };
        let b_done = Event::new(false, true, false).unwrap();
        b_done.record_on(&b).unwrap();
        x.record_stream(&b).unwrap();
        drop(x);
        let s = pool.stats();
        assert_eq!(
            (s.awaiting_blocks, s.awaiting_bytes),
            (1, BYTES as u64),
            "{s:?}"
        );
        assert_eq!((s.stream_fences, s.used_bytes), (1, 0), "{s:?}");

        // The same size again on A while B spins: another block, which A fills.
        let y = pool.malloc(BYTES).unwrap();
        let running = !b_done.query().unwrap();
        y.memset_u32_async(0xA0A0_A0A0, N, Some(&a)).unwrap();
        a.synchronize().unwrap();
        if running {
            assert_ne!(y.ptr(), x_addr, "a block in use by stream B was handed out");
        } else {
            eprintln!("the kernel ended before the malloc (sanitizer?): reuse not judged");
        }
        b.synchronize().unwrap();
        // B's kernel wrote its pattern into x only: y still holds A's.
        let mut back = vec![0u32; N];
        y.copy_to_host(&mut back).unwrap();
        assert!(
            back.iter().all(|&v| v == 0xA0A0_A0A0),
            "the kernel on B overwrote memory handed out on A"
        );
        // B has passed the fence: the next miss takes x back, no host synchronisation.
        let z = pool.malloc(BYTES).unwrap();
        assert_eq!(z.ptr(), x_addr, "the completed block is reused");
        let s = pool.stats();
        assert_eq!((s.awaiting_blocks, s.fence_syncs), (0, 0), "{s:?}");
        assert_eq!(s.used_bytes + s.free_bytes, s.total_bytes);
    }
);

gpu_test!(
    no_event_or_synchronisation_happens_without_a_recorded_stream,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let pool = MemoryPool::new();
        let a = Stream::non_blocking().unwrap();
        let _in = a.enter().unwrap();
        for i in 0..1000u32 {
            let p = pool.malloc(BYTES).unwrap();
            p.memset_u32_async(i, N, Some(&a)).unwrap();
            if i % 2 == 0 {
                // Recording the block's own stream is nothing.
                p.record_stream(&a).unwrap();
            }
            drop(p);
        }
        a.synchronize().unwrap();
        let s = pool.stats();
        assert_eq!((s.stream_fences, s.fence_syncs), (0, 0), "{s:?}");
        assert_eq!((s.awaiting_blocks, s.awaiting_bytes), (0, 0), "{s:?}");
        assert_eq!(s.backend_allocs, 1, "one block, reused: {s:?}");
    }
);

gpu_test!(
    recorded_blocks_are_reused_in_the_steady_state_without_host_synchronisation,
    {
        let Some(k) = spin_kernel("record_stream_steady_state") else {
            return;
        };
        let pool = MemoryPool::new();
        let a = Stream::non_blocking().unwrap();
        let b = Stream::non_blocking().unwrap();
        let _in = a.enter().unwrap();
        let rounds = 200u32;
        for i in 0..rounds {
            let x = pool.malloc(BYTES).unwrap();
            x.memset_u32_async(i, N, Some(&a)).unwrap();
            // B waits for A's fill, then writes (a short spin): a producer on A, a
            // consumer on B, as with a side stream for copies.
            let filled = Event::new(false, true, false).unwrap();
            filled.record_on(&a).unwrap();
            b.wait_event(&filled).unwrap();
            let (n, v) = (N as i32, i);
            // SAFETY: spin_fill on x's N u32, kept from reuse by record_stream.
            unsafe {
                cuda_rt::launch!(k, &LaunchConfig::new(64, 256), &b, (x, n, v, 1000i64)).unwrap()
            };
            x.record_stream(&b).unwrap();
        }
        b.synchronize().unwrap();
        let s = pool.stats();
        assert_eq!(s.stream_fences, u64::from(rounds), "{s:?}");
        assert_eq!(s.fence_syncs, 0, "no host synchronisation: {s:?}");
        // Blocks came back as B passed them: far fewer driver allocations than rounds.
        assert!(s.backend_allocs < u64::from(rounds) / 2, "{s:?}");
        // Once B is idle, free_all_blocks takes every awaiting block back and frees it.
        pool.free_all_blocks(None);
        let s = pool.stats();
        assert_eq!((s.awaiting_blocks, s.total_bytes), (0, 0), "{s:?}");
    }
);

gpu_test!(a_typed_buffer_records_its_stream_too, {
    cuda_rt::device::set_device_id(0).unwrap();
    let b = Stream::non_blocking().unwrap();
    let before = cuda_rt::memory::get_default_memory_pool().stats();
    let buf = DeviceBuffer::from_slice(&vec![7u32; 4096]).unwrap();
    buf.record_stream(&b).unwrap();
    drop(buf);
    let after = cuda_rt::memory::get_default_memory_pool().stats();
    assert_eq!(after.stream_fences, before.stream_fences + 1);
    b.synchronize().unwrap();
});

gpu_test!(
    recording_a_stream_of_another_device_is_accepted_and_waited_for,
    {
        if !cuda_rt::testing::gpus_or_skip(
            "recording_a_stream_of_another_device_is_accepted_and_waited_for",
            2,
        ) {
            return;
        }
        cuda_rt::device::set_device_id(1).unwrap();
        let other = Stream::new().unwrap();
        cuda_rt::device::set_device_id(0).unwrap();
        let p = MemoryPool::new().malloc(512).unwrap();
        // A peer's use: the free waits for that stream on the host.
        p.record_stream(&other).unwrap();
        drop(p);
        other.synchronize().unwrap();
    }
);
