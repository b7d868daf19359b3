//! The pinned memory pool on the GPU: reuse, the waste bound, in-flight protection,
//! the allocator setting. (The algorithm itself is tested on the CPU in the crate.)

mod common;

use std::sync::Arc;

use common::{pattern, DevBuf, Gate};
use cuda_rt::cuda_sys::driver::CUresult;
use cuda_rt::memory::{MemoryPointer, UnownedMemory};
use cuda_rt::pinned::{self, PinnedMemoryPool, ALLOCATION_UNIT_BYTES};
use cuda_rt::{gpu_test, AsStream, Error, Stream};

/// `dev` as a [`MemoryPointer`] that keeps it alive (its owner); the checks read `dev`
/// with raw driver copies.
fn pointer(dev: &Arc<DevBuf>) -> MemoryPointer {
    // SAFETY: `dev` is cuMemAlloc'd memory of `dev.len` bytes, freed only when the
    // `DevBuf` drops, which the memory object keeps alive (its owner).
    let m = unsafe { UnownedMemory::new(dev.ptr, dev.len, Arc::clone(dev), Some(0)) }.unwrap();
    MemoryPointer::from_memory(Arc::new(m))
}

/// Queues `p`'s copy to `dev` behind a closed gate on `stream` and drops `p`: the
/// gate (open it to let the copy run) while the pool holds the block back, `None`
/// when the copy ran already. compute-sanitizer makes async copies from pinned memory
/// synchronous, so the copy ran (after the gate timed out): nothing is in flight.
fn copy_held_behind_a_gate(
    pool: &PinnedMemoryPool,
    p: pinned::PinnedMemoryPointer,
    dev: &Arc<DevBuf>,
    stream: &Stream,
) -> Option<Gate> {
    let mut gate = Gate::close(stream.as_raw());
    p.copy_to_device_async(&pointer(dev), stream).unwrap();
    drop(p); // the copy is held behind the gate: still pending
    if pool.n_deferred_blocks() == 0 {
        eprintln!("copy completed synchronously (sanitizer?): in-flight case not reached");
        gate.open();
        return None;
    }
    Some(gate)
}

gpu_test!(free_then_malloc_same_size_reuses_pointer, {
    let pool = PinnedMemoryPool::new();
    let p = pool.malloc(1 << 20).unwrap();
    let addr = p.ptr();
    pool.free(p);
    assert_eq!(pool.n_free_blocks(), 1);
    let q = pool.malloc(1 << 20).unwrap();
    assert_eq!(q.ptr(), addr);
    assert_eq!(pool.stats().backend_allocs, 1);
    assert_eq!(pool.used_bytes(), 1 << 20);
});

gpu_test!(out_of_pinned_memory_carries_the_drivers_error, {
    let pool = PinnedMemoryPool::new();
    let e = pool.malloc(1 << 50).unwrap_err(); // 1 PiB: more than any host can pin
    let Error::OutOfMemory(o) = &e else {
        panic!("{e:?}")
    };
    assert_eq!((o.requested, o.device), (1 << 50, None));
    let driver = o.driver().map(|d| (d.call, d.code));
    assert_eq!(
        driver,
        Some(("cuMemHostAlloc", CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
        "{e}"
    );
    assert!(e.to_string().contains("of host memory"), "{e}");
    drop(pool.malloc(1 << 20).unwrap()); // the pool still works
});

gpu_test!(pool_wastes_at_most_511_bytes_per_request, {
    let pool = PinnedMemoryPool::new();
    for &n in &[1usize, 1000, (1 << 20) + 1, (64 << 20) + 3] {
        let before = pool.total_bytes();
        let p = pool.malloc(n).unwrap();
        assert!(p.len() >= n && p.len() - n < ALLOCATION_UNIT_BYTES, "{n}");
        let grown = (pool.total_bytes() - before) as usize;
        assert!(grown < n + ALLOCATION_UNIT_BYTES, "{n}: grew {grown}");
        drop(p);
    }
    // A smaller request splits a cached block; the rest stays free for others.
    pool.free_all_blocks();
    drop(pool.malloc(16 << 20).unwrap());
    let total = pool.total_bytes();
    let a = pool.malloc(5 << 20).unwrap();
    let b = pool.malloc(5 << 20).unwrap();
    assert_eq!(pool.total_bytes(), total, "served from the cached block");
    drop((a, b));
});

gpu_test!(free_all_blocks_gives_memory_back_to_the_driver, {
    let pool = PinnedMemoryPool::new();
    drop(pool.malloc(1 << 20).unwrap());
    assert_eq!(pool.total_bytes(), 1 << 20);
    pool.free_all_blocks();
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(pool.n_free_blocks(), 0);
    assert_eq!(pool.stats().backend_frees, 1);
});

gpu_test!(
    alone buffer_freed_during_its_async_copy_is_not_handed_out_until_the_copy_ends,
    {
        let n = 1 << 20;
        let pool = PinnedMemoryPool::new();
        let dev = Arc::new(DevBuf::new(n));
        let stream = Stream::new().unwrap();
        let data = pattern(n, 5);
        let mut p = pool.malloc(n).unwrap();
        p.as_mut_slice().unwrap().copy_from_slice(&data);
        let addr = p.ptr();

        let Some(mut gate) = copy_held_behind_a_gate(&pool, p, &dev, &stream) else {
            return;
        };
        assert_eq!(pool.n_deferred_blocks(), 1);
        assert_eq!(pool.n_free_blocks(), 0);

        let mut q = pool.malloc(n).unwrap();
        assert_ne!(q.ptr(), addr, "a buffer still being copied was handed out");
        // Scribbling over the new buffer cannot reach the pending copy.
        q.as_mut_slice().unwrap().fill(0xEE);

        gate.open();
        stream.synchronize().unwrap();
        assert!(dev.read(0, n) == data, "the copy read the data as it was");
        drop(q);
        // The next malloc takes the finished block back.
        let r = pool.malloc(n).unwrap();
        assert_eq!(pool.n_deferred_blocks(), 0);
        assert_eq!(pool.stats().backend_allocs, 2);
        drop(r);
        drop(gate);
    }
);

gpu_test!(alone free_all_blocks_waits_for_copies_in_flight, {
    let n = 1 << 20;
    let pool = PinnedMemoryPool::new();
    let dev = Arc::new(DevBuf::new(n));
    let stream = Stream::new().unwrap();
    let data = pattern(n, 6);
    let mut p = pool.malloc(n).unwrap();
    p.as_mut_slice().unwrap().copy_from_slice(&data);
    let gate = Gate::close(stream.as_raw());
    p.copy_to_device_async(&pointer(&dev), &stream).unwrap();
    drop(p);
    let tx = gate.opener();
    let t = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let _ = tx.send(());
    });
    pool.free_all_blocks(); // waits for the copy, then cuMemFreeHost
    assert_eq!(pool.total_bytes(), 0);
    assert_eq!(pool.n_deferred_blocks(), 0);
    t.join().unwrap();
    stream.synchronize().unwrap();
    assert!(dev.read(0, n) == data);
    drop(gate);
});

gpu_test!(
    set_pinned_memory_allocator_switches_between_pools_and_none,
    {
        let pool = PinnedMemoryPool::new();
        pinned::set_pinned_memory_allocator(Some(pool.clone()));
        let p = pinned::alloc_pinned_memory(4096).unwrap();
        assert_eq!(pool.used_bytes(), 4096);
        drop(p);
        pinned::set_pinned_memory_allocator(None);
        let q = pinned::alloc_pinned_memory(4096).unwrap();
        assert_eq!(pool.used_bytes(), 0, "no pooling");
        assert_eq!(q.len(), 4096);
        drop(q);
        assert!(pinned::get_pinned_memory_allocator().is_none());
        pinned::set_pinned_memory_allocator(Some(pinned::get_default_pinned_memory_pool()));
    }
);

/// Whether `addr` is pinned memory the driver still holds (`cuMemHostGetFlags`
/// refuses an address that was freed).
fn driver_holds(addr: u64) -> bool {
    let api = cuda_rt::cuda_sys::driver::api().unwrap();
    let mut flags = 0u32;
    // SAFETY: a valid out pointer; the driver only looks the address up.
    let rc = unsafe { api.cuMemHostGetFlags().unwrap()(&mut flags, addr as *mut _) };
    rc == cuda_rt::cuda_sys::driver::CUresult::CUDA_SUCCESS
}

gpu_test!(
    alone dropping_the_pool_gives_its_memory_back_despite_recycled_handles,
    {
        // A handle dropped before the pool is kept (emptied) for reuse and still names
        // the pool; the pool's memory must go back when the pool goes all the same.
        let pool = PinnedMemoryPool::new();
        let cached = pool.malloc(1 << 20).unwrap();
        let live = pool.malloc(1 << 20).unwrap();
        let (cached_addr, live_addr) = (cached.ptr(), live.ptr());
        drop(cached);
        assert!(driver_holds(cached_addr) && driver_holds(live_addr));
        drop(pool);
        assert!(!driver_holds(cached_addr), "cached block outlived its pool");
        assert!(driver_holds(live_addr), "a live block must stay");
        drop(live);
        assert!(
            !driver_holds(live_addr),
            "a block freed after its pool went is released"
        );
        // A new pool of the same size works as usual, recycled handles or not.
        let again = PinnedMemoryPool::new();
        let a = again.malloc(1 << 20).unwrap();
        let addr = a.ptr();
        drop(a);
        assert_eq!(again.malloc(1 << 20).unwrap().ptr(), addr);
    }
);

cuda_rt::gpu_test!(a_pinned_pool_snapshot_adds_up, {
    let pool = PinnedMemoryPool::new();
    let a = pool.malloc(1000).unwrap();
    let b = pool.malloc(5 << 20).unwrap();
    let snap = pool.snapshot();
    assert_eq!(snap.device, None);
    assert_eq!(snap.reserved_bytes(), pool.total_bytes());
    assert_eq!(snap.allocated_bytes(), pool.used_bytes());
    let used: Vec<u64> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .filter(|blk| blk.in_use)
        .map(|blk| blk.address)
        .collect();
    assert!(
        used.contains(&a.ptr()) && used.contains(&b.ptr()),
        "{snap:?}"
    );
    drop((a, b));
    assert_eq!(pool.snapshot().allocated_bytes(), 0);
});

/// A pool of its own that lives as long as the process (what `malloc_block` asks).
fn static_pool() -> &'static PinnedMemoryPool {
    Box::leak(Box::new(PinnedMemoryPool::new()))
}

gpu_test!(a_bare_block_holds_its_bytes_and_goes_back_at_drop, {
    let pool = static_pool();
    let b = pool.malloc_block(1000).unwrap();
    assert_eq!(b.len(), 1024, "rounded up to 512 bytes");
    assert!(!b.is_empty() && b.ptr() != 0);
    assert_eq!(pool.used_bytes(), 1024);
    let data = pattern(1000, 3);
    // SAFETY: the block's 1024 bytes are page-locked host memory this value owns
    // alone until it drops; nothing else reads or writes them meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts_mut(b.ptr() as *mut u8, b.len()) };
    bytes[..1000].copy_from_slice(&data);
    assert!(bytes[..1000] == data[..]);
    let addr = b.ptr();
    drop(b);
    assert_eq!(pool.used_bytes(), 0, "given back at drop");
    // Parked for this thread's next malloc of the size: the same block, no new
    // allocation.
    let again = pool.malloc_block(1000).unwrap();
    assert_eq!(again.ptr(), addr);
    assert_eq!(pool.stats().backend_allocs, 1);
    // A pointer's malloc after a block's free takes the same block too.
    drop(again);
    let p = pool.malloc(1000).unwrap();
    assert_eq!(p.ptr(), addr);
    drop(p);
    assert_eq!(pool.used_bytes(), 0);
});

gpu_test!(a_bare_block_of_zero_bytes_is_empty_and_holds_nothing, {
    let pool = static_pool();
    let b = pool.malloc_block(0).unwrap();
    assert!(b.is_empty());
    assert_eq!((b.ptr(), b.len()), (0, 0));
    assert_eq!(pool.used_bytes(), 0);
    let p = b.into_pointer();
    assert_eq!((p.ptr(), p.len()), (0, 0));
    drop(p);
    assert_eq!(pool.stats().backend_allocs, 0);
});

gpu_test!(
    alone a_block_made_a_pointer_is_kept_from_the_pool_while_its_copy_runs,
    {
        let n = 1 << 20;
        let pool = static_pool();
        let dev = Arc::new(DevBuf::new(n));
        let stream = Stream::new().unwrap();
        let data = pattern(n, 9);
        let b = pool.malloc_block(n).unwrap();
        let addr = b.ptr();
        let mut p = b.into_pointer();
        assert_eq!((p.ptr(), p.len()), (addr, n));
        assert_eq!(pool.used_bytes(), n as u64, "the pointer holds the block");
        p.as_mut_slice().unwrap().copy_from_slice(&data);

        let Some(mut gate) = copy_held_behind_a_gate(pool, p, &dev, &stream) else {
            return;
        };
        // Neither door hands out the block being read.
        let q = pool.malloc_block(n).unwrap();
        assert_ne!(q.ptr(), addr, "a block still being copied was handed out");
        // SAFETY: `q`'s bytes are this test's alone until it drops.
        unsafe { std::ptr::write_bytes(q.ptr() as *mut u8, 0xEE, q.len()) };
        gate.open();
        stream.synchronize().unwrap();
        assert!(dev.read(0, n) == data, "the copy read the data as it was");
        drop(q);
        drop(gate);
    }
);
