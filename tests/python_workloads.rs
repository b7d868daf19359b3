//! Real frameworks on cuda-rt's pool: a PyTorch training loop and a CuPy workload,
//! each run on the framework's own allocator and on cuda-rt's (through
//! `python/cuda_rt_alloc.py` and the built shim), alternately in fresh processes.
//! Results must agree and cuda-rt must reserve no more memory; the speeds are
//! figures, printed as `figure:` lines by `tests/python/compare.py`, never a
//! pass/fail floor here (the GPU host is shared and noisy: a floor fails at random;
//! `compare.py --speed-floor F` judges speed where a benchmark run wants it).
//!
//! Skips with a printed reason where `python3`, torch/CuPy or a GPU is missing
//! (developer machines, CI); on the GPU machine (`CUDA_RT_REQUIRE_GPU=1`) a missing
//! GPU fails, a missing package still skips.

use std::path::PathBuf;
use std::process::Command;

mod support;
use support::{python_dir, shim};

/// Held by each test that times a framework.
static ALONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// `tests/python/compare.py`, beside the module's folder in the checkout.
fn compare_script() -> PathBuf {
    python_dir()
        .join("..")
        .join("tests")
        .join("python")
        .join("compare.py")
}

/// Whether `package` imports and sees a GPU: `None` (with the reason printed) when the
/// test must skip.
fn ready(package: &str, gpu_check: &str) -> Option<()> {
    let out = Command::new("python3")
        .arg("-c")
        .arg(format!("import {package}; print({gpu_check})"))
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: python3 cannot be run: {e}");
            return None;
        }
    };
    if !out.status.success() {
        eprintln!(
            "skipped: {package} is not installed for python3 ({})",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
        return None;
    }
    if String::from_utf8_lossy(&out.stdout).trim() != "True" {
        assert!(
            std::env::var_os("CUDA_RT_REQUIRE_GPU").is_none(),
            "CUDA_RT_REQUIRE_GPU is set but {package} sees no GPU"
        );
        eprintln!("skipped: {package} sees no GPU");
        return None;
    }
    Some(())
}

/// Runs `compare.py which` (five runs of each allocator, alternating; cuda-rt's peak
/// reserved memory no higher, the results equal) and prints its figures, speeds
/// included.
fn compare(which: &str) {
    // One workload at a time: two timed runs sharing the GPU and the cores would time
    // each other.
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    assert!(shim().is_file(), "{} was not built", shim().display());
    let out = Command::new("python3")
        .arg(compare_script())
        .arg(which)
        .env("PYTHONPATH", python_dir())
        .env("CUDA_RT_C_LIB", shim())
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "{which} on cuda-rt's pool: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("figure:"), "{stdout}");
    // The GPU runner collects the figures in one file (a passing test's output is
    // captured).
    if let Some(path) = std::env::var_os("CUDA_RT_FIGURES") {
        use std::io::Write;
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            for line in stdout.lines().filter(|l| l.starts_with("figure:")) {
                let _ = writeln!(f, "{line}");
            }
        }
    }
}

#[test]
fn a_pytorch_training_loop_on_the_pool_matches_torchs_allocator() {
    if ready("torch", "torch.cuda.is_available()").is_some() {
        compare("torch");
    }
}

#[test]
fn a_cupy_workload_on_the_pool_matches_cupys_pool() {
    if ready("cupy", "cupy.cuda.runtime.getDeviceCount() > 0").is_some() {
        compare("cupy");
    }
}

#[test]
fn dlpack_hands_memory_to_torch_and_takes_torchs_tensors() {
    if ready("torch", "torch.cuda.is_available()").is_none() {
        return;
    }
    assert!(shim().is_file(), "{} was not built", shim().display());
    let script = compare_script().with_file_name("dlpack_torch.py");
    let out = Command::new("python3")
        .arg(script)
        .env("PYTHONPATH", python_dir())
        .env("CUDA_RT_C_LIB", shim())
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("ok"), "{text}");
}

#[test]
fn the_pytorch_users_hour_out_of_memory_type_hooks_and_peaks() {
    if ready("torch", "torch.cuda.is_available()").is_none() {
        return;
    }
    assert!(shim().is_file(), "{} was not built", shim().display());
    // Alone: it fills the device on purpose.
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let script = compare_script().with_file_name("torch_hour.py");
    let out = Command::new("python3")
        .arg(script)
        .env("PYTHONPATH", python_dir())
        .env("CUDA_RT_C_LIB", shim())
        .output()
        .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    assert!(
        out.status.success() && text.contains("TORCH HOUR PASSED"),
        "{text}"
    );
}
