// `launch!` expands to a call of the `unsafe fn` `Function::launch` (or `launch_on`)
// without wrapping it in `unsafe`: the call site must write the `unsafe` block, and say
// why the arguments are right.
use cuda_rt::module::Module;
use cuda_rt::{LaunchConfig, Stream};

fn main() -> cuda_rt::Result<()> {
    let f = Module::load_file("kernels.cubin")?.get_function("scale")?;
    let stream = Stream::new()?;
    let cfg = LaunchConfig::new(1, 32);
    let (x, n) = (0xdead_0000u64, 1024u32);
    cuda_rt::launch!(f, &cfg, (x, n))?;
    cuda_rt::launch!(f, &cfg, &stream, (x, n))?;
    Ok(())
}
