// An exclusive view of a device buffer excludes every other view of it.
use cuda_rt::buffer::DeviceBuffer;

fn main() -> cuda_rt::Result<()> {
    let mut b = DeviceBuffer::<u32>::zeros(16)?;
    let mut w = b.slice_mut(..8)?;
    let r = b.slice(4..)?;
    w.copy_from(&r)?;
    Ok(())
}
