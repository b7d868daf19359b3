// A `RawKernel` launches through its `Function`'s `unsafe fn`s: none of the launch
// forms compiles outside an `unsafe` block.
use cuda_rt::launch::LaunchAttribute;
use cuda_rt::{LaunchConfig, RawKernel, Stream};

fn main() -> cuda_rt::Result<()> {
    let k = RawKernel::new(
        r#"extern "C" __global__ void fill(int* out, int v) { out[threadIdx.x] = v; }"#,
        "fill",
        &[],
    )?;
    let stream = Stream::new()?;
    let cfg = LaunchConfig::new(1, 32);
    let out = 0xdead_0000u64;
    k.launch(&cfg, &[&out, &7i32])?;
    k.launch_on(&stream, &cfg, &[&out, &7i32])?;
    k.launch_cooperative(&stream, &cfg, &[&out, &7i32])?;
    k.launch_cooperative_clamped(&stream, &cfg, &[&out, &7i32])?;
    k.launch_ex(&stream, &cfg, &[LaunchAttribute::Priority(0)], &[&out, &7i32])?;
    Ok(())
}
