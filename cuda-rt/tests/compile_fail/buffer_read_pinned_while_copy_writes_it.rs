// A device-to-host copy writes the pinned buffer until its transfer is waited for or
// dropped: reading the buffer while the transfer lives does not compile.
use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer};

fn main() -> cuda_rt::Result<()> {
    let s = cuda_rt::Stream::new()?;
    let dev = DeviceBuffer::<f32>::zeros(1024)?;
    let mut host = PinnedBuffer::<f32>::zeros(1024)?;
    let t = dev.copy_to_pinned_async(&mut host, &s)?;
    let first = host.as_slice()?[0];
    t.wait()?;
    println!("{first}");
    Ok(())
}
