//! Stream-ordered allocation and the driver's memory pools. GPU tests skip without a GPU.

use std::sync::Arc;

use cuda_rt::memory::{
    malloc_async, MemoryAsync, MemoryAsyncPool, MemoryPointer, NO_LIMIT, ROUND_SIZE,
};
use cuda_rt::{ArgumentKind, AsStream, Error, Stream};

cuda_rt::gpu_test!(malloc_async_rounds_to_512_and_round_trips, {
    let p = malloc_async(1000).unwrap();
    assert_eq!(p.size(), 1024);
    assert_eq!(ROUND_SIZE, 512);
    let src: Vec<i32> = (0..250).map(|i| i * -3).collect();
    p.copy_from_host(&src).unwrap();
    let mut back = vec![0i32; 250];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, src);
});

cuda_rt::gpu_test!(memory_async_keeps_its_stream_alive_until_freed_on_it, {
    let s = Stream::new().unwrap();
    let raw = s.as_raw() as usize;
    let m = MemoryAsync::new_on(4096, &s).unwrap();
    assert_eq!(m.stream().handle(), raw);
    let p = MemoryPointer::from_memory(Arc::new(m));
    p.memset_async(3, 4096, Some(&s)).unwrap();
    drop(s); // the user's stream object is gone; the memory still holds the stream
    let mut back = vec![0u8; 4096];
    p.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 3));
    drop(p); // freed on its (live) stream, which is destroyed afterwards
    let q = malloc_async(4096).unwrap();
    q.memset(1, 4096).unwrap();
    cuda_rt::device::synchronize().unwrap();
});

// CuPy's order: allocate under a stream, drop the stream, free the memory later.
cuda_rt::gpu_test!(malloc_async_under_a_dropped_stream_frees_cleanly, {
    let s = Stream::non_blocking().unwrap();
    let p = {
        let _scope = s.enter().unwrap();
        malloc_async(1 << 20).unwrap()
    };
    p.memset_async(7, 1 << 20, Some(&s)).unwrap();
    drop(s);
    let mut back = vec![0u8; 1 << 20];
    p.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    drop(p);
    // The device is still healthy: more stream-ordered work on the default stream.
    let q = malloc_async(1 << 20).unwrap();
    q.memset(9, 1 << 20).unwrap();
    q.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
});

cuda_rt::gpu_test!(pool_malloc_on_a_dropped_stream_round_trips, {
    let pool = MemoryAsyncPool::create(0).unwrap();
    let s = Stream::new().unwrap();
    let p = pool.malloc_on(1000, &s).unwrap();
    drop(s);
    p.copy_from_host(&[8u16; 500]).unwrap();
    let mut back = [0u16; 500];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [8u16; 500]);
    drop(p);
    cuda_rt::device::synchronize().unwrap();
});

cuda_rt::gpu_test!(memory_async_on_a_borrowed_stream_is_freed_on_it, {
    let s = Stream::new().unwrap();
    let m = MemoryAsync::new_on(4096, &s).unwrap();
    assert_eq!(m.stream().handle(), s.as_raw() as usize);
    let p = MemoryPointer::from_memory(Arc::new(m));
    p.memset_async(5, 4096, Some(&s)).unwrap();
    drop(p); // freed on `s`, which is still alive
    s.synchronize().unwrap();
});

cuda_rt::gpu_test!(pool_reports_used_and_total_bytes, {
    let pool = MemoryAsyncPool::create(0).unwrap();
    let s = Stream::new().unwrap();
    assert_eq!(pool.used_bytes().unwrap(), 0);
    let a = pool.malloc_on(1 << 20, &s).unwrap();
    let b = pool.malloc_on(100, &s).unwrap();
    assert_eq!(b.size(), 512);
    assert_eq!(pool.used_bytes().unwrap(), (1 << 20) + 512);
    assert!(pool.total_bytes().unwrap() >= (1 << 20) + 512);
    drop(a);
    drop(b);
    s.synchronize().unwrap();
    assert_eq!(pool.used_bytes().unwrap(), 0);
    pool.free_all_blocks().unwrap();
    assert_eq!(pool.total_bytes().unwrap(), 0);
});

cuda_rt::gpu_test!(pool_limit_is_the_release_threshold, {
    let pool = MemoryAsyncPool::create(0).unwrap();
    pool.set_limit(64 << 20).unwrap();
    assert_eq!(pool.limit().unwrap(), 64 << 20);
    pool.set_limit_fraction(0.0).unwrap();
    assert_eq!(
        pool.limit().unwrap(),
        NO_LIMIT,
        "a fraction of 0 is no limit"
    );
    assert!(matches!(
        pool.set_limit_fraction(1.5),
        Err(Error::InvalidArgument {
            kind: ArgumentKind::InvalidValue,
            ..
        })
    ));
    assert!(matches!(
        pool.set_limit_fraction(-0.1),
        Err(Error::InvalidArgument {
            kind: ArgumentKind::InvalidValue,
            ..
        })
    ));
});

cuda_rt::gpu_test!(
    a_limit_of_zero_and_the_default_read_as_no_limit_as_in_cupy,
    {
        // CUDA_RT_GPU_MEMORY_LIMIT would set the default: this test reads the unset case.
        if std::env::var_os(cuda_rt::memory::pool::LIMIT_ENV).is_some() {
            eprintln!("skipped: {} is set", cuda_rt::memory::pool::LIMIT_ENV);
            return;
        }
        let pool = MemoryAsyncPool::create(0).unwrap();
        assert_eq!(pool.limit().unwrap(), NO_LIMIT, "a new pool has no limit");
        assert_eq!(NO_LIMIT, u64::MAX);
        pool.set_limit(1 << 20).unwrap();
        assert_eq!(pool.limit().unwrap(), 1 << 20);
        pool.set_limit(0).unwrap();
        assert_eq!(pool.limit().unwrap(), NO_LIMIT, "0 is no limit");
        // CuPy's MemoryAsyncPool() sets the device's current pool to no limit; wrapping
        // the current pool leaves it as it is.
        let current = MemoryAsyncPool::current(0).unwrap();
        current.set_limit(3 << 20).unwrap();
        assert_eq!(
            MemoryAsyncPool::current(0).unwrap().limit().unwrap(),
            3 << 20
        );
        cuda_rt::device::set_device_id(0).unwrap();
        let cupy_like = MemoryAsyncPool::new().unwrap();
        assert!(cupy_like.same_as(&current));
        assert_eq!(current.limit().unwrap(), NO_LIMIT);
    }
);

cuda_rt::gpu_test!(device_current_pool_is_the_default, {
    let a = MemoryAsyncPool::new().unwrap();
    let b = MemoryAsyncPool::current(0).unwrap();
    assert!(a.same_as(&b));
    let p = a.malloc(512).unwrap();
    p.memset(0, 512).unwrap();
    drop(p);
    a.free_all_blocks().unwrap();
});

cuda_rt::gpu_test!(pool_on_an_invalid_device_is_an_error, {
    let n = cuda_rt::device_count().unwrap();
    assert!(matches!(
        MemoryAsyncPool::create(n),
        Err(Error::InvalidDevice { .. })
    ));
    assert!(matches!(
        MemoryAsyncPool::current(-1),
        Err(Error::InvalidDevice { .. })
    ));
    malloc_async(512).unwrap();
});

cuda_rt::gpu_test!(pool_out_of_memory_says_requested_size, {
    let pool = MemoryAsyncPool::create(0).unwrap();
    let total = cuda_rt::Device::new(0).unwrap().total_memory().unwrap();
    let e = pool.malloc(total + (1 << 30)).unwrap_err();
    match &e {
        Error::OutOfMemory(o) => assert!(o.requested >= (total + (1 << 30)) as u64),
        other => panic!("expected OutOfMemory, got {other}"),
    }
    pool.malloc(1 << 20).unwrap();
});

cuda_rt::gpu_test!(pool_freed_memory_is_reused_in_stream_order, {
    let pool = MemoryAsyncPool::create(0).unwrap();
    let s = Stream::new().unwrap();
    let first = pool.malloc_on(1 << 16, &s).unwrap();
    let addr = first.ptr();
    drop(first);
    let second = pool.malloc_on(1 << 16, &s).unwrap();
    assert_eq!(
        second.ptr(),
        addr,
        "same stream: the freed block comes back"
    );
});
