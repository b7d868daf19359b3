//! Kernels and modules: NVRTC (PTX without a GPU), `RawKernel` and `RawModule` through
//! the kernel cache, templates, attributes and occupancy, and `launch!` on typed
//! buffers and their views (the spec's "Kernels and Modules").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 07_kernels`. Without NVRTC it prints why
//! and exits 0; without a GPU it compiles to PTX only, then prints why and exits 0.

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::compiler::{Program, Target};
use cuda_rt::{KernelCache, LaunchConfig, RawKernel, RawModule, Stream};

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

const SCALE: &str = r#"
template <typename T>
__global__ void scale(T* x, T a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
"#;

fn main() {
    let (major, minor) = match cuda_rt::compiler::nvrtc_version() {
        Ok(v) => v,
        Err(e) => return println!("skipped: NVRTC is not available: {e}"),
    };
    // NVRTC needs no GPU: compile for an architecture named explicitly.
    match Program::new(SAXPY).compile(Target::ptx(80)) {
        Ok(ptx) => println!(
            "NVRTC {major}.{minor}: {} bytes of PTX for compute_80",
            ptx.image.len()
        ),
        Err(e) => exit_with(e),
    }
    if let Err(reason) = cuda_rt::availability() {
        return println!("skipped: no GPU, nothing to launch: {reason}");
    }
    if let Err(e) = run() {
        exit_with(e);
    }
}

fn exit_with(e: cuda_rt::Error) -> ! {
    eprintln!("error: {e}");
    std::process::exit(1);
}

fn run() -> cuda_rt::Result<()> {
    // Compiled for this device through the kernel cache (in memory, and on disk when
    // its folder is trusted); the same source again compiles and loads nothing.
    let cache = KernelCache::global();
    let saxpy = RawKernel::new(SAXPY, "saxpy", &[])?;
    let before = cache.stats();
    let again = RawKernel::new(SAXPY, "saxpy", &[])?;
    assert!(again.raw_module().same_module(saxpy.raw_module()));
    let after = cache.stats();
    assert_eq!(
        (before.compiles, before.disk_hits),
        (after.compiles, after.disk_hits)
    );

    let n = 1 << 20;
    let cfg = LaunchConfig::for_num_elems_occupancy(&saxpy, n as u32)?; // the best block size
    let (attrs, block) = (saxpy.attributes()?, cfg.block.x);
    let active = saxpy.max_active_blocks_per_multiprocessor(block, 0)?;
    let (regs, sm) = (attrs.num_regs, attrs.binary_version);
    println!("saxpy: sm_{sm}, {regs} registers, blocks of {block}, {active} per SM");

    // Typed buffers are kernel arguments: each passes its device address.
    let host_x: Vec<f32> = (0..n).map(|i| (i % 4096) as f32).collect();
    let x = DeviceBuffer::from_slice(&host_x)?;
    let mut y = DeviceBuffer::from_slice(&vec![1.0f32; n])?;
    let (a, len) = (2.0f32, n as i32);
    // SAFETY: saxpy(float a, const float* x, float* y, int n): x and y hold n floats on
    // this device; `to_vec` below reads y on the same stream, after the kernel.
    unsafe { cuda_rt::launch!(saxpy, &cfg, (a, &x, &mut y, len))? }; // y is written
    let want: Vec<f32> = host_x.iter().map(|&v| 2.0 * v + 1.0).collect();
    assert_eq!(y.to_vec()?, want);

    // A view passes the address of its first element; here on a stream of its own.
    let (half, stream) = (n / 2, Stream::non_blocking()?);
    let (one, m) = (1.0f32, (n - half) as i32);
    let mut tail = y.slice_mut(half..)?;
    let cfg = LaunchConfig::for_num_elems_with_block(m as u32, 256);
    // SAFETY: as above for the last n - half elements of y (the first of x); the work
    // before on the default stream is done (`to_vec` waited), and the exclusive view
    // keeps y from other use until the synchronize.
    unsafe { cuda_rt::launch!(saxpy, &cfg, &stream, (one, &x, &mut tail, m))? };
    stream.synchronize()?;
    let got = y.to_vec()?;
    assert_eq!(got[..half], want[..half]);
    assert!((half..n).all(|i| got[i] == want[i] + host_x[i - half]));

    // Templates: one module, one kernel per name expression.
    let module =
        RawModule::from_source(SCALE, &["-std=c++17"], &["scale<float>", "scale<double>"])?;
    let scale_f64 = module.get_function("scale<double>")?;
    let lowered = module.lowered_name("scale<double>").unwrap_or_default();
    println!("scale<double> is {lowered}");
    let mut d = DeviceBuffer::from_slice(&[1.5f64; 1000])?;
    let cfg = LaunchConfig::for_num_elems_with_block(1000, 128);
    // SAFETY: scale<double>(double* x, double a, int n): d holds 1000 doubles; `to_vec`
    // reads it on the same stream, after the kernel.
    unsafe { cuda_rt::launch!(scale_f64, &cfg, (&mut d, 4.0f64, 1000i32))? };
    assert_eq!(d.to_vec()?, vec![6.0; 1000]);

    // A compile error carries NVRTC's log.
    match RawKernel::new(r#"extern "C" __global__ void k() { nope(); }"#, "k", &[]) {
        Err(e) => println!("a kernel that does not compile:\n{e}"),
        Ok(_) => panic!("the broken kernel compiled"),
    }
    println!("ok");
    Ok(())
}
