// A transfer borrows its pinned buffer: it cannot outlive it.
use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer, Transfer};

fn start(dev: &mut DeviceBuffer<u8>, s: &cuda_rt::Stream) -> cuda_rt::Result<Transfer<'static>> {
    let host = PinnedBuffer::<u8>::zeros(dev.len())?;
    dev.copy_from_pinned_async(&host, s)
}

fn main() {}
