// A host-to-device copy reads the pinned buffer until its transfer is waited for or
// dropped: writing the buffer while the transfer lives does not compile.
use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer};

fn main() -> cuda_rt::Result<()> {
    let s = cuda_rt::Stream::new()?;
    let mut dev = DeviceBuffer::<f32>::zeros(1024)?;
    let mut host = PinnedBuffer::<f32>::zeros(1024)?;
    let t = dev.copy_from_pinned_async(&host, &s)?;
    host.as_mut_slice()?[0] = 1.0;
    t.wait()?;
    Ok(())
}
