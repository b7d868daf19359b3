//! Kernels and modules: compile a saxpy with NVRTC (through the kernel cache), launch
//! it, check it on the host, and show its attributes and occupancy.
//!
//! Without a GPU it says so and exits 0 (after compiling to PTX if NVRTC is present).

use cuda_rt::compiler::{KernelCache, Program, RawKernel, Target};
use cuda_rt::LaunchConfig;

const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;

fn main() {
    println!("cuda-rt kernel example");
    match cuda_rt::compiler::nvrtc_version() {
        Ok((major, minor)) => {
            println!("NVRTC {major}.{minor}");
            match Program::new(SAXPY).compile(Target::ptx(90)) {
                Ok(c) => println!(
                    "compiled saxpy to {} bytes of PTX for compute_90",
                    c.image.len()
                ),
                Err(e) => println!("compile failed: {e}"),
            }
        }
        Err(e) => println!("NVRTC is not available: {e}"),
    }
    if let Err(reason) = cuda_rt::availability() {
        println!("CUDA is not available on this machine, nothing to launch: {reason}");
        return;
    }
    if let Err(e) = run() {
        println!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_rt::Result<()> {
    cuda_rt::device::set_device_id(0)?;
    let k = RawKernel::new(SAXPY, "saxpy", &[])?;
    let cache = KernelCache::global();
    let stats = cache.stats();
    println!(
        "kernel cache: {} (compiles so far: {}, disk hits: {})",
        cache
            .disk_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_else(|| "memory only".into()),
        stats.compiles,
        stats.disk_hits
    );
    let a = k.attributes()?;
    println!(
        "saxpy: {} registers, up to {} threads per block, binary sm_{}",
        a.num_regs, a.max_threads_per_block, a.binary_version
    );
    let n = 1 << 20;
    let cfg = LaunchConfig::for_num_elems(&k, n as u32)?;
    println!(
        "launch: {} blocks of {} threads ({} blocks per SM active)",
        cfg.grid.x,
        cfg.block.x,
        k.max_active_blocks_per_multiprocessor(cfg.block.x, 0)?
    );

    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = vec![1.0; n];
    // Device memory that keeps itself alive and bounds-checks the host copies.
    let (dx, dy) = (cuda_rt::alloc(n * 4)?, cuda_rt::alloc(n * 4)?);
    dx.copy_from_host(&x)?;
    dy.copy_from_host(&y)?;
    // SAFETY: saxpy(float a, const float* x, float* y, int n): dx and dy hold n f32 each
    // on device 0 (the kernel's device); threads past n do nothing; the copy back below
    // is ordered after the kernel on the current stream, and both buffers outlive it.
    unsafe { cuda_rt::launch!(k, &cfg, (2.0f32, dx, dy, n as i32))? };
    let mut out = vec![0f32; n];
    dy.copy_to_host(&mut out)?;
    let bad = (0..n).filter(|&i| out[i] != 2.0 * x[i] + y[i]).count();
    println!("saxpy on {n} elements: {} mismatches", bad);
    Ok(())
}
