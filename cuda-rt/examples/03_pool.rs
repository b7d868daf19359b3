//! Memory pools: the caching `MemoryPool` (reuse, statistics, a limit, giving memory
//! back), choosing the allocator for a scope or for the process (`using_allocator`,
//! `set_allocator`, your own `Allocate`), and the driver's stream-ordered pool (the
//! spec's "Memory Pools").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 03_pool`. Without a GPU it prints why
//! and exits 0. `CUDA_RT_GPU_MEMORY_LIMIT` (bytes or a share, `40%`) limits every pool
//! per device.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::memory::{Allocate, MemoryAsyncPool};
use cuda_rt::{get_default_memory_pool, set_allocator, using_allocator, Allocator};
use cuda_rt::{MemoryPointer, MemoryPool};

const MIB: usize = 1 << 20;

fn main() {
    if let Err(reason) = cuda_rt::availability() {
        println!("skipped: no GPU: {reason}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// An allocator of your own: counts the calls, takes the memory from a pool.
struct Counting {
    pool: MemoryPool,
    calls: AtomicUsize,
}

impl Allocate for Counting {
    fn malloc(&self, size: usize, device: i32) -> cuda_rt::Result<MemoryPointer> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.pool.malloc_on(device, size)
    }
}

fn run() -> cuda_rt::Result<()> {
    // A pool of our own (the default one is `get_default_memory_pool()`).
    let pool = MemoryPool::new();
    let a = pool.malloc(MIB)?; // from the driver (cuMemAlloc)
    let addr = a.ptr();
    drop(a); // back to the pool, not to the driver
    assert_eq!((pool.used_bytes(), pool.free_bytes()), (0, MIB as u64));
    let b = pool.malloc(MIB)?; // the same block again, no driver call
    assert_eq!(b.ptr(), addr);
    let s = pool.stats();
    println!(
        "pool: used {} B, free {} B, total {} B, {} free blocks; {} mallocs, {} cache hits, \
         {} driver allocations",
        s.used_bytes,
        s.free_bytes,
        s.total_bytes,
        s.n_free_blocks,
        s.mallocs,
        s.cache_hits,
        s.backend_allocs
    );
    assert_eq!((s.mallocs, s.cache_hits, s.backend_allocs), (2, 1, 1));

    // A limit on what the pool holds from the driver; past it, an error with numbers.
    pool.set_limit(4 * MIB as u64)?;
    assert_eq!(pool.get_limit()?, 4 * MIB as u64);
    match pool.malloc(8 * MIB) {
        Err(e) if e.is_out_of_memory() => println!("over the limit: {e}"),
        other => panic!("8 MiB under a 4 MiB limit should fail, got {other:?}"),
    }
    pool.set_limit(0)?; // no limit

    // Cached blocks go back to the driver on request.
    drop(pool.malloc(16 * MIB)?);
    assert_eq!(pool.total_bytes(), 17 * MIB as u64);
    drop(b);
    pool.free_all_blocks(None);
    assert_eq!(pool.total_bytes(), 0);

    // Typed buffers allocate through the allocator in effect: for a scope ...
    let x = using_allocator(Some(Allocator::Pool(pool.clone())), || {
        DeviceBuffer::<f64>::from_slice(&[1.5; 1000])
    })?;
    assert_eq!(pool.used_bytes(), 8192); // 8000 bytes, rounded up to 512
    assert_eq!(x.to_vec()?, vec![1.5; 1000]);

    // ... or for the whole process (here an allocator of our own).
    let counting = Arc::new(Counting {
        pool: pool.clone(),
        calls: AtomicUsize::new(0),
    });
    set_allocator(Some(Allocator::Custom(counting.clone())))?;
    let y = DeviceBuffer::<u32>::zeros(4096);
    set_allocator(Some(Allocator::Pool(get_default_memory_pool())))?; // the default again
    assert_eq!(y?.to_vec()?, vec![0; 4096]);
    assert_eq!(counting.calls.load(Ordering::Relaxed), 1);

    // The driver's stream-ordered pool (cuMemAllocAsync) as the allocator.
    let driver_pool = MemoryAsyncPool::new()?;
    let z = using_allocator(Some(Allocator::Async(driver_pool.clone())), || {
        DeviceBuffer::<u8>::zeros(MIB)
    })?;
    println!(
        "driver pool: {} B used, {} B reserved",
        driver_pool.used_bytes()?,
        driver_pool.total_bytes()?
    );
    assert!(driver_pool.used_bytes()? >= MIB as u64);
    assert!(z.to_vec()?.iter().all(|&v| v == 0));
    println!("ok");
    Ok(())
}
