//! Environment: where the CUDA toolkit, `nvcc` and ROCm are (found as CuPy finds
//! them), the NVRTC, runtime and driver versions and where each library was loaded
//! from, the kernel cache's folder, and whether CUDA is usable and why not (the spec's
//! "Environment Information").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 10_environment`. Everything but the
//! driver is shown without a GPU too; then it prints why there is no GPU and exits 0.

use std::path::PathBuf;

use cuda_rt::{compiler, env, KernelCache};

fn main() {
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn shown(path: Option<PathBuf>) -> String {
    path.map_or_else(|| "not found".to_owned(), |p| p.display().to_string())
}

fn run() -> cuda_rt::Result<()> {
    // Paths: CUDA_PATH, else two levels above nvcc on PATH, else /usr/local/cuda (and
    // the same rule for ROCm). No library is loaded for these.
    println!("CUDA path: {}", shown(env::get_cuda_path()));
    println!("nvcc:      {}", shown(env::get_nvcc_path()));
    println!("ROCm path: {}", shown(env::get_rocm_path()));
    println!("hipcc:     {}", shown(env::get_hipcc_path()));

    // Libraries are opened at run time; a missing one is an error that lists every
    // place it was looked for.
    match compiler::nvrtc_version() {
        Ok((major, minor)) => println!(
            "NVRTC:     {major}.{minor}, architectures {:?}",
            compiler::supported_archs()?
        ),
        Err(e) => println!("NVRTC:     not loaded: {e}"),
    }
    let cache = KernelCache::global();
    match cache.disk_dir() {
        Some(dir) => println!("kernels:   cached in {}", dir.display()),
        None => println!(
            "kernels:   {}",
            cache.memory_only_reason().unwrap_or_default()
        ),
    }
    let runtime = env::get_local_runtime_version();
    match &runtime {
        Ok(v) => println!("runtime:   CUDA {v} ({})", env::runtime_library_path()?),
        Err(e) => println!("runtime:   not loaded: {e}"),
    }

    // The driver, and whether CUDA is usable at all.
    let count = match cuda_rt::availability() {
        Ok(n) => n,
        Err(reason) => {
            assert!(!cuda_rt::is_available());
            println!("skipped: no GPU: {reason}");
            return Ok(());
        }
    };
    let driver = env::driver_version()?;
    println!(
        "driver:    CUDA {driver} ({}), {count} device(s)",
        env::driver_library_path()?
    );
    assert!(cuda_rt::is_available());
    assert!(
        driver.major >= 12,
        "cuda-rt needs a CUDA 12 or newer driver, found {driver}"
    );
    if let Ok(rt) = runtime {
        if rt > driver {
            println!("note: the runtime (CUDA {rt}) is newer than the driver supports");
        }
    }
    println!("ok");
    Ok(())
}
