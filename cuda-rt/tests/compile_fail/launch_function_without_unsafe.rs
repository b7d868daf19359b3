// A kernel launch runs arbitrary device code with the caller's arguments (here a made-up
// device address the kernel would write through): `Function::launch` is an `unsafe fn`,
// so a launch outside an `unsafe` block does not compile.
use cuda_rt::module::Module;
use cuda_rt::LaunchConfig;

fn main() -> cuda_rt::Result<()> {
    let f = Module::load_file("kernels.cubin")?.get_function("scale")?;
    let not_an_allocation = 0xdead_0000u64;
    f.launch(&LaunchConfig::new(1, 32), &[&not_an_allocation, &1024u32])?;
    Ok(())
}
