// Every way of passing memory to a kernel compiles: buffers, views and memory pointers
// plainly, as `&x`, and as `&mut y` for memory the kernel writes, through the macro
// (both forms) and through `Function::launch_on`. Only compiled and type-checked: the
// launch below never runs (`main` does not call it).
use cuda_rt::buffer::{DeviceBuffer, DeviceSlice};
use cuda_rt::compiler::RawKernel;
use cuda_rt::{LaunchConfig, MemoryPointer, Stream};

#[allow(dead_code)]
fn launches(
    k: &RawKernel,
    stream: &Stream,
    x: DeviceBuffer<f32>,
    mut y: DeviceBuffer<f32>,
    mut p: MemoryPointer,
) -> cuda_rt::Result<()> {
    let cfg = LaunchConfig::new(1, 32);
    let n = 32i32;
    // SAFETY: never run (see the file's comment).
    unsafe {
        cuda_rt::launch!(k, &cfg, (2.0f32, x, y, n))?;
        cuda_rt::launch!(k, &cfg, (2.0f32, &x, &mut y, n))?;
        cuda_rt::launch!(k, &cfg, stream, (2.0f32, &x, &mut y, n))?;
        cuda_rt::launch!(k, &cfg, (2.0f32, &x, &mut p, n))?;
        cuda_rt::launch!(k, &cfg, (2.0f32, &p, &mut y, n))?;
        let input: DeviceSlice<'_, f32> = x.slice(..16)?;
        let mut output = y.slice_mut(..16)?;
        cuda_rt::launch!(k, &cfg, (2.0f32, input, &mut output, 16i32))?;
        cuda_rt::launch!(k, &cfg, (2.0f32, &input, &output, 16i32))?;
        k.launch_on(stream, &cfg, &[&2.0f32, &x, &mut y, &n])?;
    }
    // The mutable borrows ended with the launches: the buffer is usable again.
    drop(y);
    Ok(())
}

fn main() {}
