// A `DeviceSlice` is a read-only view: it cannot be passed as an output (`&mut`);
// the kernel-argument error says what can be.
use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::compiler::RawKernel;
use cuda_rt::LaunchConfig;

fn main() -> cuda_rt::Result<()> {
    let k = RawKernel::new("", "scale", &[])?;
    let y = DeviceBuffer::<f32>::zeros(32)?;
    let mut view = y.slice(..)?;
    let cfg = LaunchConfig::new(1, 32);
    // SAFETY: does not compile.
    unsafe { cuda_rt::launch!(k, &cfg, (&mut view, 2.0f32, 32i32))? };
    Ok(())
}
