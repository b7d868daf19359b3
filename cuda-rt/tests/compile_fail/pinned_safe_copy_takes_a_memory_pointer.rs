// The safe pinned copies take the device side as a `MemoryPointer` (bounds-checked,
// keeping the memory alive until the copy is over), never as a raw address.
use cuda_rt::{pinned, Stream};

fn main() {
    let stream = Stream::new().unwrap();
    let dst: u64 = 0x7f00_0000_0000;
    let p = pinned::alloc_pinned_memory(16).unwrap();
    p.copy_to_device_async(dst, &stream).unwrap();
    pinned::copy_host_to_device(dst, &[2u8; 16], &stream).unwrap();
}
