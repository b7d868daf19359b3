//! The caching device pool (`MemoryPool`) on a real GPU: reuse, statistics, arenas per
//! stream, limits and out of memory, hooks around real mallocs, and a multi-thread
//! stress test with patterned blocks. Without a GPU each test skips (see
//! `cuda_rt::testing`). Each test uses its own `MemoryPool`; the ones that touch the
//! limit variable hold the lock that all tests of this binary share.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::{Arc, Mutex, MutexGuard};

use cuda_rt::cuda_sys::driver::CUresult;
use cuda_rt::memory::hook::{register_hook, MemoryHook};
use cuda_rt::memory::{self, get_default_memory_pool, MemoryPool, LIMIT_ENV};
use cuda_rt::stream::{AsStream, Stream};
use cuda_rt::{ArgumentKind, Error, OutOfMemoryCause};

const MIB: usize = 1 << 20;

/// Serialises tests of this binary around the limit variable (read at pool creation).
fn env_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn check_identity(pool: &MemoryPool) {
    let s = pool.stats();
    assert_eq!(s.used_bytes + s.free_bytes, s.total_bytes, "{s:?}");
    assert_eq!(pool.used_bytes() + pool.free_bytes(), pool.total_bytes());
}

cuda_rt::gpu_test!(free_then_malloc_same_size_reuses_pointer, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let a = pool.malloc(1000).unwrap();
    assert_eq!(a.size(), 1024, "rounded to 512");
    let addr = a.ptr();
    assert_ne!(addr, 0);
    drop(a);
    let b = pool.malloc(1000).unwrap();
    assert_eq!(b.ptr(), addr);
    let s = pool.stats();
    assert_eq!((s.backend_allocs, s.cache_hits, s.cache_misses), (1, 1, 1));
    // The memory works: data round trips.
    let src: Vec<u32> = (0..256).collect();
    b.copy_from_host(&src).unwrap();
    let mut back = vec![0u32; 256];
    b.copy_to_host(&mut back).unwrap();
    assert_eq!(back, src);
});

cuda_rt::gpu_test!(malloc_of_zero_is_null_and_not_pooled, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let p = pool.malloc(0).unwrap();
    assert_eq!((p.ptr(), p.size()), (0, 0));
    assert_eq!(pool.stats().mallocs, 0);
});

cuda_rt::gpu_test!(used_plus_free_equals_total_after_each_step, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    check_identity(&pool);
    let a = pool.malloc(3 * MIB).unwrap();
    check_identity(&pool);
    assert_eq!(pool.used_bytes(), 3 * MIB as u64);
    drop(a);
    check_identity(&pool);
    assert_eq!((pool.used_bytes(), pool.free_bytes()), (0, 3 * MIB as u64));
    // Split: 1 MiB from the 3 MiB chunk, the rest stays free.
    let b = pool.malloc(MIB).unwrap();
    check_identity(&pool);
    assert_eq!(pool.n_free_blocks(), 1);
    assert_eq!(pool.total_bytes(), 3 * MIB as u64, "served from the cache");
    let c = pool.malloc(2 * MIB).unwrap();
    check_identity(&pool);
    assert_eq!(c.ptr(), b.ptr() + MIB as u64, "the upper piece");
    drop((b, c));
    check_identity(&pool);
    assert_eq!(pool.n_free_blocks(), 1, "merged back");
    pool.free_all_blocks(None);
    check_identity(&pool);
    assert_eq!(pool.total_bytes(), 0);
});

cuda_rt::gpu_test!(peaks_and_counts_are_tracked_and_resettable, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let a = pool.malloc(MIB).unwrap();
    let b = pool.malloc(MIB).unwrap();
    drop((a, b));
    let s = pool.stats();
    assert_eq!(s.peak_used_bytes, 2 * MIB as u64);
    assert_eq!(s.peak_total_bytes, 2 * MIB as u64);
    assert_eq!((s.mallocs, s.frees, s.backend_allocs), (2, 2, 2));
    pool.reset_peaks();
    let s = pool.stats();
    assert_eq!((s.peak_used_bytes, s.peak_total_bytes), (0, 2 * MIB as u64));
    pool.free_all_blocks(None);
    assert_eq!(pool.stats().backend_frees, 2);
});

cuda_rt::gpu_test!(block_freed_under_another_stream_returns_to_its_own_arena, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let (s1, s2) = (Stream::new().unwrap(), Stream::new().unwrap());
    let a = {
        let _in = s1.enter().unwrap();
        pool.malloc(4096).unwrap()
    };
    let addr = a.ptr();
    {
        let _in = s2.enter().unwrap();
        drop(a); // freed while s2 is current: still goes to s1's arena
        let b = pool.malloc(4096).unwrap();
        assert_ne!(b.ptr(), addr, "s2's arena does not hold s1's block");
    }
    let _in = s1.enter().unwrap();
    assert_eq!(pool.malloc(4096).unwrap().ptr(), addr, "back in s1's arena");
    assert_eq!(pool.stats().n_arenas, 2);
});

cuda_rt::gpu_test!(per_thread_default_stream_gets_one_arena_per_thread, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let on_thread = |pool: MemoryPool| {
        std::thread::spawn(move || {
            let s = Stream::per_thread();
            let _in = s.enter().unwrap();
            let p = pool.malloc(8192).unwrap();
            let addr = p.ptr();
            drop(p); // cached in this thread's arena
            addr
        })
        .join()
        .unwrap()
    };
    let a = on_thread(pool.clone());
    let b = on_thread(pool.clone());
    assert_ne!(a, b, "the second thread cannot reuse the first one's arena");
    let s = pool.stats();
    assert_eq!((s.n_arenas, s.backend_allocs), (2, 2));
});

cuda_rt::gpu_test!(free_all_blocks_of_a_stream_touches_only_its_arena, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let (s1, s2) = (Stream::new().unwrap(), Stream::new().unwrap());
    for s in [&s1, &s2] {
        let _in = s.enter().unwrap();
        drop(pool.malloc(MIB).unwrap());
    }
    assert_eq!(pool.total_bytes(), 2 * MIB as u64);
    pool.free_all_blocks(Some(&s1));
    assert_eq!(pool.total_bytes(), MIB as u64);
    let _in = s2.enter().unwrap();
    let p = pool.malloc(MIB).unwrap();
    assert_eq!(pool.stats().cache_hits, 1, "s2's block stayed cached");
    drop(p);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);
});

cuda_rt::gpu_test!(limit_env_var_applies_when_the_device_pool_is_created, {
    let _g = env_lock();
    std::env::set_var(LIMIT_ENV, "1048576");
    let pool = MemoryPool::new();
    let limit = pool.get_limit();
    let e = pool.malloc(2 * MIB).unwrap_err();
    std::env::set_var(LIMIT_ENV, "50%");
    let half = MemoryPool::new().get_limit();
    std::env::set_var(LIMIT_ENV, "lots");
    let bad = MemoryPool::new().malloc(16);
    std::env::remove_var(LIMIT_ENV);
    assert_eq!(limit.unwrap(), MIB as u64);
    let Error::OutOfMemory(o) = &e else {
        panic!("{e:?}")
    };
    assert_eq!((o.requested, o.limit), (2 * MIB as u64, Some(MIB as u64)));
    let total = cuda_rt::Device::new(0).unwrap().total_memory().unwrap() as u64;
    assert_eq!(half.unwrap(), total / 2);
    let bad = bad.unwrap_err();
    assert!(bad.to_string().contains(LIMIT_ENV), "{bad}");
    assert_eq!(MemoryPool::new().get_limit().unwrap(), 0, "unset: no limit");
});

cuda_rt::gpu_test!(set_limit_releases_the_cache_then_fails_with_the_numbers, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    pool.set_limit(4 * MIB as u64).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 4 * MIB as u64);
    let a = pool.malloc(3 * MIB).unwrap();
    drop(pool.malloc(MIB).unwrap()); // cached
    assert_eq!(pool.total_bytes(), 4 * MIB as u64);
    let e = pool.malloc(2 * MIB).unwrap_err();
    let Error::OutOfMemory(o) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(o.requested, 2 * MIB as u64);
    assert_eq!(o.in_use, 3 * MIB as u64);
    assert_eq!(o.cached, 0, "the cached block was released before failing");
    assert_eq!(o.limit, Some(4 * MIB as u64));
    assert_eq!(
        o.cause,
        OutOfMemoryCause::Limit,
        "the limit refused, not the driver"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("3.00 MiB in use") && msg.contains("limit 4.00 MiB"),
        "{msg}"
    );
    let s = pool.stats();
    assert_eq!((s.oom_retries, s.backend_frees), (1, 1));
    // Within the limit again after a free.
    drop(a);
    let _b = pool.malloc(2 * MIB).unwrap();
    // Fractions.
    assert!(matches!(
        pool.set_limit_fraction(1.5),
        Err(Error::InvalidArgument {
            kind: ArgumentKind::InvalidValue,
            ..
        })
    ));
    pool.set_limit_fraction(0.0).unwrap();
    assert_eq!(pool.get_limit().unwrap(), 0);
    pool.set_limit_fraction(0.25).unwrap();
    let total = cuda_rt::Device::new(0).unwrap().total_memory().unwrap() as u64;
    assert_eq!(pool.get_limit().unwrap(), total / 4);
});

cuda_rt::gpu_test!(driver_out_of_memory_carries_the_driver_error, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let _small = pool.malloc(MIB).unwrap();
    let e = pool.malloc(1 << 50).unwrap_err(); // 1 PiB
    assert!(e.is_out_of_memory(), "{e:?}");
    let Error::OutOfMemory(o) = &e else {
        panic!("{e:?}")
    };
    assert_eq!(
        (o.requested, o.in_use, o.limit),
        (1 << 50, MIB as u64, None)
    );
    let driver = o.driver().map(|d| d.code);
    assert_eq!(driver, Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{e}");
    assert_eq!(pool.stats().oom_retries, 1);
    assert!(pool.malloc(MIB).is_ok(), "the pool still works");
});

/// Records hook calls.
struct Recorder(Rc<RefCell<Vec<String>>>);

impl MemoryHook for Recorder {
    fn malloc_pre(&self, d: i32, size: usize, mem_size: usize) {
        self.0
            .borrow_mut()
            .push(format!("malloc_pre {d} {size} {mem_size}"));
    }
    fn alloc_pre(&self, d: i32, mem_size: usize) {
        self.0
            .borrow_mut()
            .push(format!("alloc_pre {d} {mem_size}"));
    }
    fn alloc_post(&self, d: i32, mem_size: usize, ptr: u64) {
        self.0
            .borrow_mut()
            .push(format!("alloc_post {d} {mem_size} {ptr:#x}"));
    }
    fn malloc_post(&self, d: i32, size: usize, mem_size: usize, ptr: u64, id: usize) {
        self.0.borrow_mut().push(format!(
            "malloc_post {d} {size} {mem_size} {ptr:#x} {id:#x}"
        ));
    }
    fn free_pre(&self, d: i32, mem_size: usize, ptr: u64, id: usize) {
        self.0
            .borrow_mut()
            .push(format!("free_pre {d} {mem_size} {ptr:#x} {id:#x}"));
    }
    fn free_post(&self, d: i32, mem_size: usize, ptr: u64, id: usize) {
        self.0
            .borrow_mut()
            .push(format!("free_post {d} {mem_size} {ptr:#x} {id:#x}"));
    }
}

cuda_rt::gpu_test!(hooks_run_in_order_around_a_real_malloc, {
    let _g = env_lock();
    let pool = MemoryPool::new();
    let log = Rc::new(RefCell::new(Vec::new()));
    let guard = register_hook("rec", Rc::new(Recorder(log.clone()))).unwrap();
    assert!(register_hook("rec", Rc::new(Recorder(log.clone()))).is_err());
    let p = pool.malloc(1000).unwrap();
    let (ptr, id) = (p.ptr(), Arc::as_ptr(p.mem()) as *const () as usize);
    drop(p);
    let q = pool.malloc(600).unwrap(); // a hit: no alloc hooks
    let id2 = Arc::as_ptr(q.mem()) as *const () as usize;
    drop(q);
    drop(guard);
    drop(pool.malloc(1).unwrap()); // unregistered: nothing recorded
    assert_eq!(
        *log.borrow(),
        [
            "malloc_pre 0 1000 1024".to_string(),
            "alloc_pre 0 1024".into(),
            format!("alloc_post 0 1024 {ptr:#x}"),
            format!("malloc_post 0 1000 1024 {ptr:#x} {id:#x}"),
            format!("free_pre 0 1024 {ptr:#x} {id:#x}"),
            format!("free_post 0 1024 {ptr:#x} {id:#x}"),
            "malloc_pre 0 600 1024".into(),
            format!("malloc_post 0 600 1024 {ptr:#x} {id2:#x}"),
            format!("free_pre 0 1024 {ptr:#x} {id2:#x}"),
            format!("free_post 0 1024 {ptr:#x} {id2:#x}"),
        ]
    );
});

cuda_rt::gpu_test!(alloc_uses_the_default_pool_by_default, {
    let _g = env_lock();
    // No test of this binary calls set_allocator.
    let pool = get_default_memory_pool();
    let before = pool.stats().mallocs;
    let p = memory::alloc(5000).unwrap();
    assert_eq!(p.size(), 5120);
    assert_eq!(pool.stats().mallocs, before + 1);
    let addr = p.ptr();
    drop(p);
    assert_eq!(memory::alloc(5000).unwrap().ptr(), addr, "reused");
});

cuda_rt::gpu_test!(
    stress_8_threads_4_streams_patterned_blocks_are_not_corrupted,
    {
        let _g = env_lock();
        let pool = MemoryPool::new();
        let streams: Arc<Vec<Stream>> = Arc::new((0..4).map(|_| Stream::new().unwrap()).collect());
        let threads: Vec<_> = (0..8u32)
            .map(|t| {
                let (pool, streams) = (pool.clone(), streams.clone());
                std::thread::spawn(move || {
                    let stream = &streams[t as usize % 4];
                    let _in = stream.enter().unwrap();
                    let mut rng = 0x9E37_79B9u32.wrapping_mul(t + 1);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 17;
                        rng ^= rng << 5;
                        rng
                    };
                    let check = |p: &memory::MemoryPointer, len: usize, byte: u8| {
                        let mut back = vec![0u8; len];
                        p.copy_to_host(&mut back).unwrap();
                        if let Some(i) = back.iter().position(|&b| b != byte) {
                            panic!(
                                "thread {t}: block {:#x} byte {i} is {} instead of {byte}",
                                p.ptr(),
                                back[i]
                            );
                        }
                    };
                    let mut live: Vec<(memory::MemoryPointer, usize, u8)> = Vec::new();
                    for i in 0..300u32 {
                        if live.len() < 24 && next() % 4 != 0 {
                            let len = 1 + (next() as usize % (256 << 10));
                            let byte = (t * 37 + i) as u8 | 1;
                            let p = pool.malloc(len).unwrap();
                            p.memset_async(byte, len, None).unwrap();
                            live.push((p, len, byte));
                        } else if !live.is_empty() {
                            let k = next() as usize % live.len();
                            let (p, len, byte) = live.swap_remove(k);
                            check(&p, len, byte);
                        }
                    }
                    for (p, len, byte) in &live {
                        check(p, *len, *byte);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let s = pool.stats();
        assert_eq!(s.used_bytes, 0, "{s:?}");
        assert_eq!(s.n_arenas, 4);
        assert!(s.cache_hits > 0);
        check_identity(&pool);
    }
);

/// Whether the driver still knows `ptr` as allocated device memory.
fn driver_holds(ptr: u64) -> bool {
    use cuda_rt::cuda_sys::driver as sys;
    let api = sys::api().unwrap();
    let mut base: sys::CUdeviceptr = 0;
    let mut size = 0usize;
    // SAFETY: valid out pointers; the driver only looks the address up.
    let rc = unsafe { api.cuMemGetAddressRange_v2().unwrap()(&mut base, &mut size, ptr) };
    rc == sys::CUresult::CUDA_SUCCESS
}

cuda_rt::gpu_test!(
    alone dropping_a_pool_gives_its_memory_back_despite_recycled_objects_and_parked_frees,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        // A pointer dropped before the pool is recycled and its block parked on this
        // thread: both still name the pool, yet its memory goes back with its handle.
        let pool = MemoryPool::new();
        let cached = pool.malloc(MIB).unwrap();
        let live = pool.malloc(MIB).unwrap();
        let (cached_addr, live_addr) = (cached.ptr(), live.ptr());
        drop(cached);
        assert_eq!(
            pool.stats().free_bytes,
            MIB as u64,
            "the parked block is free"
        );
        assert!(driver_holds(cached_addr) && driver_holds(live_addr));
        drop(pool);
        assert!(
            !driver_holds(cached_addr),
            "cached memory outlived its pool"
        );
        assert!(driver_holds(live_addr), "a live block must stay");
        drop(live);
        assert!(
            !driver_holds(live_addr),
            "freed after the pool went: released at once"
        );
        // A new pool works as usual, recycled objects around or not.
        let again = MemoryPool::new();
        let a = again.malloc(MIB).unwrap();
        let addr = a.ptr();
        drop(a);
        assert_eq!(again.malloc(MIB).unwrap().ptr(), addr);
        assert_eq!(again.stats().backend_allocs, 1);
    }
);

cuda_rt::gpu_test!(a_snapshot_lists_the_pools_segments_and_blocks, {
    cuda_rt::device::set_device_id(0).unwrap();
    let pool = MemoryPool::new();
    assert!(pool.snapshot(0).segments.is_empty(), "no pool yet");
    let s = Stream::non_blocking().unwrap();
    let a = pool.malloc(1 << 20).unwrap();
    let b = {
        let _in_s = s.enter().unwrap();
        pool.malloc(3 << 20).unwrap()
    };
    let snap = pool.snapshot(0);
    let stats = pool.device_stats(0);
    assert_eq!(snap.device, Some(0));
    assert_eq!(snap.reserved_bytes(), stats.total_bytes);
    assert_eq!(snap.allocated_bytes(), stats.used_bytes);
    let used: Vec<u64> = snap
        .segments
        .iter()
        .flat_map(|seg| &seg.blocks)
        .filter(|blk| blk.in_use)
        .map(|blk| blk.address)
        .collect();
    assert!(
        used.contains(&a.ptr()) && used.contains(&b.ptr()),
        "{snap:?}"
    );
    assert!(
        snap.segments
            .iter()
            .any(|seg| seg.stream != snap.segments[0].stream),
        "two streams, two arenas: {snap:?}"
    );
    let json = snap.to_json();
    assert!(
        json.contains("\"device\": 0") && json.contains("active_allocated"),
        "{json}"
    );
    drop((a, b));
    assert_eq!(pool.snapshot(0).allocated_bytes(), 0);
});

// A bare block of the default pool (`malloc_block_on_stream`, what the C shim's
// drop-in allocators hold): it is the block a cached pair gets, handed out once,
// counted in the statistics, given back by its drop (the pool's figures as before),
// refused where it does not apply (another pool, hooks on the thread), and a
// `MemoryPointer` to the same memory after `into_pointer`, whose recorded stream
// holds the block back at its free as any pointer's does. Alone: another test's
// statistics or growth of the default pool settles this thread's parked block (then
// the steady pair has none to give), and the figures it checks are the whole pool's.
cuda_rt::gpu_test!(
    alone a_bare_block_is_the_cached_pairs_block_and_goes_back_on_drop,
    {
        let _g = env_lock();
        let pool = get_default_memory_pool();
        // A stream of its own, so that its arena holds nothing but this test's blocks:
        // in an arena that earlier tests left free blocks in, the parked block need
        // not be what a malloc gets (another free chunk may fit better), and then the
        // steady pair rightly gives none.
        let s = Stream::non_blocking().unwrap();
        // Statistics settle parked blocks: read before the pair, not between.
        let before = pool.device_stats(0);
        // The steady pair first: malloc + free parks the block for this thread.
        let addr = pool.malloc_on_stream(&s, MIB).unwrap().ptr();
        let b = pool
            .malloc_block_on_stream(&s, MIB)
            .expect("the parked block of the steady pair");
        assert_eq!((b.ptr(), b.size(), b.device_id()), (addr, MIB, 0));
        assert!(pool.device_stats(0).used_bytes >= before.used_bytes + MIB as u64);
        // Handed out once: the next malloc gets other memory (kept to the end, so that
        // the block has no free neighbour to merge with when it is freed: a steady pair
        // reparks only a block that goes back unmerged).
        let other = pool.malloc_on_stream(&s, MIB).unwrap();
        assert_ne!(other.ptr(), addr);
        drop(b);
        // Back: the pool's figures are those before, `other` aside.
        let after = pool.device_stats(0);
        assert_eq!(
            after.used_bytes,
            before.used_bytes + MIB as u64,
            "{after:?}"
        );
        assert!(after.mallocs >= before.mallocs + 2, "{after:?}");

        // Not for another pool, nor with hooks on this thread (they must see each malloc).
        let mine = MemoryPool::new();
        drop(mine.malloc_on_stream(&s, MIB).unwrap());
        assert!(mine.malloc_block_on_stream(&s, MIB).is_none());
        drop(pool.malloc_on_stream(&s, MIB).unwrap());
        let log = Rc::new(RefCell::new(Vec::new()));
        let guard = register_hook("bare", Rc::new(Recorder(log.clone()))).unwrap();
        assert!(pool.malloc_block_on_stream(&s, MIB).is_none());
        drop(guard);
        assert!(log.borrow().is_empty(), "a refused block is no malloc");

        // As a pointer: the same memory, usable, and a recorded stream fences its free.
        drop(pool.malloc_on_stream(&s, MIB).unwrap());
        let b = pool
            .malloc_block_on_stream(&s, MIB)
            .expect("the parked block");
        let addr = b.ptr();
        let p = b.into_pointer();
        assert_eq!((p.ptr(), p.size(), p.device_id()), (addr, MIB, 0));
        p.memset(0x5a, MIB).unwrap();
        let mut back = vec![0u8; MIB];
        p.copy_to_host(&mut back).unwrap();
        assert!(back.iter().all(|&x| x == 0x5a));
        let side = Stream::non_blocking().unwrap();
        p.record_stream(&side).unwrap();
        let fences = pool.device_stats(0).stream_fences;
        drop(p);
        // `side`, and the legacy default stream, where the plain memset above was
        // queued (CUDA's memset of device memory returns before it ran).
        assert_eq!(pool.device_stats(0).stream_fences, fences + 2);
        side.synchronize().unwrap();
        s.synchronize().unwrap();
        drop(other);
    }
);
