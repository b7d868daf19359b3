// An output passed as `&mut y` is borrowed mutably for the launch: the same buffer
// cannot be another argument of that launch (a kernel reading `x` while writing `y`
// through an alias is a race the type system can see).
use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::compiler::RawKernel;
use cuda_rt::LaunchConfig;

fn main() -> cuda_rt::Result<()> {
    let k = RawKernel::new("", "saxpy", &[])?;
    let mut y = DeviceBuffer::<f32>::zeros(32)?;
    let cfg = LaunchConfig::new(1, 32);
    // SAFETY: does not compile.
    unsafe { cuda_rt::launch!(k, &cfg, (2.0f32, &y, &mut y, 32i32))? };
    Ok(())
}
