//! Pinned memory: page-locked `PinnedBuffer`s from the pinned pool, asynchronous
//! copies whose `Transfer` borrows the host side while the copy runs, the host filling
//! one buffer while the other is being copied on another stream, CuPy's untyped
//! pinned memory and a pinned pool of your own (the spec's "Pinned Memory").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 04_pinned`. Without a GPU it prints why
//! and exits 0.

use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer};
use cuda_rt::pinned::{get_default_pinned_memory_pool, set_pinned_memory_allocator};
use cuda_rt::prelude::*;
use cuda_rt::{PinnedMemoryPool, Stream};

const CHUNK: usize = 1 << 20; // elements (4 MiB of f32)
const CHUNKS: usize = 8;

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

/// Chunk `i` of the data: element `k` of the whole is `k`.
fn fill(chunk: &mut [f32], i: usize) {
    for (j, v) in chunk.iter_mut().enumerate() {
        *v = (i * CHUNK + j) as f32;
    }
}

fn run() -> cuda_rt::Result<()> {
    let streams = [Stream::non_blocking()?, Stream::non_blocking()?];
    // Every element is written by the uploads: no need to zero it first (which would
    // be work on the legacy default stream, which non-blocking streams do not wait for).
    let mut dev = DeviceBuffer::<f32>::empty(CHUNK * CHUNKS)?;

    // Upload through two pinned staging buffers in turn, on two streams.
    let mut staging = [PinnedBuffer::zeros(CHUNK)?, PinnedBuffer::zeros(CHUNK)?];
    let mut overlapped = 0;
    for pair in 0..CHUNKS / 2 {
        let [a, b] = &mut staging;
        let (i, j) = (2 * pair, 2 * pair + 1);
        // A view waits for a copy still reading the buffer (queued one pair ago).
        fill(a.as_mut_slice()?, i);
        let ta = dev
            .slice_mut(i * CHUNK..(i + 1) * CHUNK)?
            .copy_from_pinned_async(a, &streams[0])?;
        // While `ta` lives, `a` is borrowed by its copy: writing `a` here would not
        // compile. The host fills `b` while `a` is being copied.
        fill(b.as_mut_slice()?, j);
        overlapped += usize::from(!ta.is_done());
        let tb = dev
            .slice_mut(j * CHUNK..(j + 1) * CHUNK)?
            .copy_from_pinned_async(b, &streams[1])?;
        // Dropping a transfer neither waits nor cancels: the copies go on, and both
        // sides stay allocated until they are done.
        drop((ta, tb));
    }
    println!(
        "host work overlapped a copy in {overlapped} of {} pairs",
        CHUNKS / 2
    );

    // Download on stream 0 once stream 1's uploads are done too: an event orders them.
    streams[0].wait_event(&streams[1].record(None)?)?;
    let mut result = PinnedBuffer::<f32>::zeros(CHUNK * CHUNKS)?;
    let t = dev.copy_to_pinned_async(&mut result, &streams[0])?;
    // `result` is borrowed by the copy until it is waited for: no read before.
    t.wait()?;
    let got = result.as_slice()?;
    let bad = got
        .iter()
        .enumerate()
        .filter(|&(k, &v)| v != k as f32)
        .count();
    assert_eq!(bad, 0, "{bad} of {} elements came back wrong", got.len());

    // CuPy's untyped pinned memory, from the same default pool.
    let pool = get_default_pinned_memory_pool();
    let mut raw = cuda_rt::alloc_pinned_memory(4096)?;
    raw.as_mut_slice_of::<u32>()?.fill(7);
    let d = cuda_rt::alloc(4096)?;
    raw.copy_to_device_async(&d, &streams[0])?;
    raw.synchronize()?;
    let mut words = [0u32; 1024];
    d.copy_to_host(&mut words)?;
    assert_eq!(words, [7; 1024]);
    println!(
        "default pinned pool: {} B in use, {} B held, {} free blocks",
        pool.used_bytes(),
        pool.total_bytes(),
        pool.n_free_blocks()
    );

    // A pinned pool of its own, for every thread, then the default one again.
    let own = PinnedMemoryPool::new();
    set_pinned_memory_allocator(Some(own.clone()));
    let p = PinnedBuffer::<u8>::zeros(1 << 20);
    set_pinned_memory_allocator(Some(pool));
    assert_eq!(own.used_bytes(), 1 << 20);
    drop(p?);
    own.free_all_blocks();
    assert_eq!(own.total_bytes(), 0);
    println!("ok");
    Ok(())
}
