// A copy to or from a raw device address is `unsafe`: with unified addressing the
// address can be host memory behind a live Rust reference, or a block an allocator has
// handed to someone else. Safe code names the device side with a `MemoryPointer`.
use cuda_rt::{pinned, Stream};

fn main() {
    let stream = Stream::new().unwrap();
    let mut host = vec![1u8; 16];
    let dst = host.as_mut_ptr() as u64;
    let mut p = pinned::alloc_pinned_memory(16).unwrap();
    p.copy_to_device_async_raw(dst, &stream).unwrap();
    p.copy_from_device_async_raw(dst, &stream).unwrap();
    pinned::copy_host_to_device_raw(dst, &[2u8; 16], &stream).unwrap();
    pinned::copy_device_to_host_raw(&mut [0u8; 16], dst, &stream).unwrap();
    drop(host);
}
