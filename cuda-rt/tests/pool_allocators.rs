//! `MemoryPool::with_allocator` on a real GPU: pools caching managed memory, the
//! driver's stream-ordered allocator and a user function pair, each with reuse,
//! statistics and release checked, and the data pattern-checked. Without a GPU each
//! test skips (see `cuda_rt::testing`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cuda_rt::cuda_sys::result;
use cuda_rt::gpu_test;
use cuda_rt::memory::{ClosureAllocator, MemoryPool, PoolAllocator};
use cuda_rt::prelude::*;
use cuda_rt::stream::Stream;

const N: usize = 1 << 18;
const BYTES: usize = N * 4;

gpu_test!(
    a_managed_memory_pool_hands_out_memory_the_host_reads_and_writes,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let pool = MemoryPool::with_allocator(PoolAllocator::Managed);
        assert!(matches!(pool.allocator(), PoolAllocator::Managed));
        let a = pool.malloc(BYTES).unwrap();
        let addr = a.ptr();
        // The device writes, the host reads the same address directly: managed memory.
        a.memset_u32(0x5A5A_5A5A, N).unwrap();
        cuda_rt::device::synchronize().unwrap();
        // SAFETY: `a` is BYTES bytes of managed memory (host-accessible), the device is idle
        // (synchronised above) and nothing else uses it until `a` is dropped.
        let host = unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u32, N) };
        assert!(
            host.iter().all(|&v| v == 0x5A5A_5A5A),
            "device writes seen by the host"
        );
        // The host writes, the device copies out.
        for (i, v) in host.iter_mut().enumerate() {
            *v = i as u32;
        }
        let mut back = vec![0u32; N];
        a.copy_to_host(&mut back).unwrap();
        assert!(back.iter().enumerate().all(|(i, &v)| v == i as u32));
        drop(a);
        // Cached: the same block again, no new allocation.
        let b = pool.malloc(BYTES).unwrap();
        assert_eq!(b.ptr(), addr);
        let s = pool.stats();
        assert_eq!((s.backend_allocs, s.cache_hits), (1, 1), "{s:?}");
        drop(b);
        pool.free_all_blocks(None);
        let s = pool.stats();
        assert_eq!((s.total_bytes, s.backend_frees), (0, 1), "{s:?}");
    }
);

gpu_test!(a_stream_ordered_pool_caches_cu_mem_alloc_async_memory, {
    cuda_rt::device::set_device_id(0).unwrap();
    let pool = MemoryPool::with_allocator(PoolAllocator::StreamOrdered);
    let s = Stream::non_blocking().unwrap();
    let _in = s.enter().unwrap();
    let a = pool.malloc(BYTES).unwrap();
    let addr = a.ptr();
    a.memset_u32_async(7, N, Some(&s)).unwrap();
    let mut back = vec![0u32; N];
    a.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&v| v == 7));
    drop(a);
    let b = pool.malloc(BYTES).unwrap();
    assert_eq!(b.ptr(), addr, "cached and reused on the same stream");
    drop(b);
    pool.free_all_blocks(None);
    let st = pool.stats();
    assert_eq!(
        (st.backend_allocs, st.backend_frees, st.total_bytes),
        (1, 1, 0)
    );
});

gpu_test!(
    a_pool_over_a_user_function_pair_calls_it_only_on_misses_and_release,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let (mallocs, frees) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (m, f) = (mallocs.clone(), frees.clone());
        let malloc = move |size, _device| {
            m.fetch_add(1, Ordering::SeqCst);
            Ok(result::memory::alloc(size)?)
        };
        let free = move |ptr, _size, _device| {
            f.fetch_add(1, Ordering::SeqCst);
            // SAFETY: `ptr` came from the cuMemAlloc above and is freed once.
            let _ = unsafe { result::memory::free(ptr) };
        };
        // SAFETY: cuMemAlloc memory of device 0 (whose context the pool makes current
        // before calling the pair), valid until the matching cuMemFree.
        let pair = unsafe { ClosureAllocator::new(malloc, free) };
        let pool = MemoryPool::with_allocator(PoolAllocator::Closures(pair));
        for i in 0..100u32 {
            let p = pool.malloc(BYTES).unwrap();
            p.memset_u32(i, N).unwrap();
            let mut back = vec![0u32; N];
            p.copy_to_host(&mut back).unwrap();
            assert!(back.iter().all(|&v| v == i));
        }
        assert_eq!(
            mallocs.load(Ordering::SeqCst),
            1,
            "one miss, then the cache"
        );
        assert_eq!(frees.load(Ordering::SeqCst), 0);
        pool.free_all_blocks(None);
        assert_eq!(
            frees.load(Ordering::SeqCst),
            1,
            "the release went through the pair"
        );
        assert_eq!(pool.stats().total_bytes, 0);
    }
);
