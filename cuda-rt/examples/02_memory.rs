//! Memory: device allocations with `alloc`, CuPy's untyped `MemoryPointer` (copies,
//! memsets, pointer arithmetic), typed `DeviceBuffer`s over the same memory, managed
//! (unified) memory and stream-ordered `malloc_async` (the spec's "Memory
//! Management").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 02_memory`. Without a GPU it prints why
//! and exits 0.

use std::sync::Arc;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::memory::{Location, ManagedMemory, Memory, MemoryPointer};
use cuda_rt::{AsStream, DeviceAttribute, Stream};

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

fn run() -> cuda_rt::Result<()> {
    const N: usize = 1 << 16;
    let host: Vec<f32> = (0..N).map(|i| i as f32).collect();

    // `alloc` takes bytes from the current allocator (the caching pool by default) and
    // returns a pointer that keeps the memory alive; clones share it.
    let a = cuda_rt::alloc(N * 4)?;
    a.copy_from_host(&host)?;
    let b = cuda_rt::alloc(N * 4)?;
    b.copy_from_device(&a, N * 4)?;
    // Pointer arithmetic is checked: the second half of `b`, zeroed.
    let half = b.checked_add(N / 2 * 4)?;
    half.memset(0, N / 2 * 4)?;
    let mut back = vec![1f32; N];
    b.copy_to_host(&mut back)?;
    assert_eq!(back[..N / 2], host[..N / 2]);
    assert!(back[N / 2..].iter().all(|&v| v == 0.0));
    println!("alloc: {:#x}, {} bytes", a.ptr(), a.size());

    // Every copy is checked against the room behind the pointer before CUDA sees it.
    let too_big = vec![0f32; a.size() / 4 + 1];
    let e = a.copy_from_host(&too_big).expect_err("too many");
    println!("{} floats into {} bytes: {e}", too_big.len(), a.size());

    // Typed buffers: lengths in elements, views, host copies. `from_pointer` types
    // memory that came untyped; `as_pointer` goes back.
    let mut typed = DeviceBuffer::<f32>::from_pointer(a.clone(), N)?;
    typed.slice_mut(..4)?.fill(-1.0)?;
    let v = typed.to_vec()?;
    assert_eq!((v[0], v[3], v[4]), (-1.0, -1.0, 4.0));
    assert_eq!(typed.as_pointer().ptr(), a.ptr());
    let mut ids = DeviceBuffer::<u32>::zeros(N)?;
    ids.copy_from_host(&(0..N as u32).collect::<Vec<_>>())?;
    assert_eq!(ids.slice(N - 2..)?.to_vec()?, [N as u32 - 2, N as u32 - 1]);

    // Plain cuMemAlloc memory, outside the pool, behind the same pointer type.
    let raw = MemoryPointer::from_memory(Arc::new(Memory::new(4096)?));
    raw.memset_u32(0xdead_beef, 1024)?;
    let mut words = [0u32; 1024];
    raw.copy_to_host(&mut words)?;
    assert!(words.iter().all(|&w| w == 0xdead_beef));

    // Managed (unified) memory: one address for the host and every device. Keep the
    // `ManagedMemory` to prefetch or advise it.
    let managed = Arc::new(ManagedMemory::new(N * 4)?);
    let m = MemoryPointer::from_memory(managed.clone());
    m.copy_from_host(&host)?;
    let device = cuda_rt::Device::current()?;
    if device.attribute(DeviceAttribute::ConcurrentManagedAccess)? == 1 {
        managed.prefetch(Location::Device(device.id()), None)?; // on the current stream
    }
    let mut from_managed = DeviceBuffer::<f32>::zeros(N)?;
    from_managed.copy_from(&DeviceBuffer::<f32>::from_pointer(m, N)?)?;
    assert_eq!(from_managed.to_vec()?, host);
    let small = cuda_rt::malloc_managed(256)?; // the plain form, as a pointer
    small.memset(7, 256)?;
    let mut bytes = [0u8; 256];
    small.copy_to_host(&mut bytes)?;
    assert_eq!(bytes, [7; 256]);

    // Stream-ordered memory (cuMemAllocAsync) on the current stream: allocated, set
    // and freed in that stream's order, from the driver's memory pool.
    let stream = Stream::non_blocking()?;
    {
        let _current = stream.enter()?;
        let p = cuda_rt::malloc_async(N * 4)?;
        p.memset_async(0x3f, N * 4, None)?; // on the current stream
        p.copy_from_host_async(&host[..16], Some(&stream))?;
        let mut out = vec![0f32; N];
        p.copy_to_host(&mut out)?; // waits for the stream
        assert_eq!(out[..16], host[..16]);
        assert_eq!(out[16].to_bits(), 0x3f3f_3f3f);
        println!("malloc_async: {} bytes on {:#x}", p.size(), stream.ptr());
    } // `p` is freed on `stream`, after the work queued on it
    stream.synchronize()?;
    println!("ok");
    Ok(())
}
