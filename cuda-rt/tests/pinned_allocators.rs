//! Pinned memory from a user's function pair on a real GPU: a pinned pool that caches
//! it (`PinnedMemoryPool::with_allocator`), and `set_pinned_memory_allocator` with the
//! pair itself (no pooling), each data-checked through copies. Its own test binary:
//! the allocator setting is process-wide. Without a GPU each test skips.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cuda_rt::cuda_sys::result;
use cuda_rt::pinned::{self, PinnedAllocator, PinnedFunctions, PinnedMemoryPool};
use cuda_rt::{gpu_test, Stream};

/// Serialises the tests of this binary (the allocator setting is process-wide).
fn lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A pair over cuMemHostAlloc / cuMemFreeHost counting its calls.
fn counting_pair() -> (PinnedFunctions, Arc<AtomicU64>, Arc<AtomicU64>) {
    let (mallocs, frees) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let (m, f) = (mallocs.clone(), frees.clone());
    let malloc = move |size: usize| {
        m.fetch_add(1, Ordering::SeqCst);
        Ok(result::memory::host_alloc(size, 0)? as u64)
    };
    let free = move |ptr: u64, _size: usize| {
        f.fetch_add(1, Ordering::SeqCst);
        // SAFETY: `ptr` came from the cuMemHostAlloc above and is freed once.
        let _ = unsafe { result::memory::free_host(ptr as usize as *mut c_void) };
    };
    // SAFETY: cuMemHostAlloc memory (page-locked), valid until its cuMemFreeHost.
    let pair = unsafe { PinnedFunctions::new(malloc, free) };
    (pair, mallocs, frees)
}

gpu_test!(
    a_pinned_pool_over_a_user_pair_caches_its_memory_and_copies_through_it,
    {
        let _g = lock();
        cuda_rt::device::set_device_id(0).unwrap();
        let (pair, mallocs, frees) = counting_pair();
        let pool = PinnedMemoryPool::with_allocator(PinnedAllocator::Functions(pair));
        let n = 1 << 20;
        let dev = cuda_rt::alloc(n).unwrap();
        let s = Stream::non_blocking().unwrap();
        let mut addr = 0;
        for round in 0..10u8 {
            let mut p = pool.malloc(n).unwrap();
            addr = p.ptr();
            p.as_mut_slice().unwrap().fill(round);
            p.copy_to_device_async(&dev, &s).unwrap();
            let mut q = pool.malloc(n).unwrap();
            q.copy_from_device_async(&dev, &s).unwrap();
            assert!(q.as_slice().unwrap().iter().all(|&b| b == round));
        }
        s.synchronize().unwrap();
        assert_ne!(addr, 0);
        assert_eq!(
            mallocs.load(Ordering::SeqCst),
            2,
            "two blocks, then the cache"
        );
        assert_eq!(frees.load(Ordering::SeqCst), 0);
        pool.free_all_blocks();
        assert_eq!(frees.load(Ordering::SeqCst), 2, "released through the pair");
        assert!(pool.flags().is_empty());
    }
);

gpu_test!(set_pinned_memory_allocator_takes_a_user_pair, {
    let _g = lock();
    cuda_rt::device::set_device_id(0).unwrap();
    let (pair, mallocs, frees) = counting_pair();
    pinned::set_pinned_memory_allocator(pair);
    assert!(
        pinned::get_pinned_memory_allocator().is_none(),
        "not a pool"
    );
    let mut p = pinned::alloc_pinned_memory(4096).unwrap();
    assert_eq!(mallocs.load(Ordering::SeqCst), 1);
    p.as_mut_slice().unwrap().fill(9);
    let dev = cuda_rt::alloc(4096).unwrap();
    let s = Stream::non_blocking().unwrap();
    p.copy_to_device_async(&dev, &s).unwrap();
    // Freed through the pair only after the copy in flight (the handle waits).
    drop(p);
    assert_eq!(frees.load(Ordering::SeqCst), 1);
    let mut back = vec![0u8; 4096];
    dev.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
    let q = pinned::alloc_pinned_memory(4096).unwrap();
    assert_eq!(
        mallocs.load(Ordering::SeqCst),
        2,
        "no pooling: one call each"
    );
    drop(q);
    assert_eq!(frees.load(Ordering::SeqCst), 2);
    pinned::set_pinned_memory_allocator(pinned::get_default_pinned_memory_pool());
});
