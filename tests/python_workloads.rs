//! Real frameworks on cuda-rt's pool: a PyTorch training loop and a CuPy workload,
//! each run on the framework's own allocator and on cuda-rt's, alternately in fresh
//! processes. Results must agree and cuda-rt must reserve no more memory; the speeds
//! are figures, printed as `figure:` lines by `tests/python/compare.py`, never a
//! pass/fail floor here (the GPU host is shared and noisy: a floor fails at random;
//! `compare.py --speed-floor F` judges speed where a benchmark run wants it).
//!
//! Each workload runs twice: from the checkout (`python3` with `python/` on
//! `PYTHONPATH` and `CUDA_RT_C_LIB` naming the built shim) and from the wheel (the
//! Python of a virtual environment the `cuda-rt-alloc` wheel is installed in, named by
//! `CUDA_RT_WHEEL_PYTHON`, with neither variable: the module and the library it loads
//! are the installed ones; `gpu-bin/run.sh` installs the wheel and sets it).
//!
//! Skips with a printed reason where `python3`, torch/CuPy, a GPU or the wheel's
//! environment is missing (developer machines, CI); on the GPU machine
//! (`CUDA_RT_REQUIRE_GPU=1`) a missing GPU or wheel environment fails, a missing
//! package still skips.

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

/// Where the `cuda_rt_alloc` a workload runs with comes from.
enum Origin {
    /// `python3` with the checkout's `python/` on `PYTHONPATH` and the built shim in
    /// `CUDA_RT_C_LIB`.
    Checkout,
    /// The Python of the wheel's virtual environment, with neither variable.
    Wheel(PathBuf),
}

/// The variable that names the Python of the wheel's virtual environment.
const WHEEL_PYTHON_VAR: &str = "CUDA_RT_WHEEL_PYTHON";

impl Origin {
    /// The wheel's Python, `None` (with the reason printed) when the test must skip; a
    /// failure under `CUDA_RT_REQUIRE_GPU`, where the GPU runner installs the wheel.
    fn wheel() -> Option<Origin> {
        match std::env::var_os(WHEEL_PYTHON_VAR) {
            Some(p) => Some(Origin::Wheel(PathBuf::from(p))),
            None => {
                assert!(
                    std::env::var_os("CUDA_RT_REQUIRE_GPU").is_none(),
                    "CUDA_RT_REQUIRE_GPU is set but {WHEEL_PYTHON_VAR} is not: install the \
                     wheel in a virtual environment and name its python (gpu-bin/run.sh does)"
                );
                eprintln!("skipped: {WHEEL_PYTHON_VAR} names no Python with the wheel installed");
                None
            }
        }
    }

    /// A command running this Python, with the environment that picks the module.
    fn python(&self) -> Command {
        match self {
            Origin::Checkout => {
                let mut c = Command::new("python3");
                c.env("PYTHONPATH", python_dir())
                    .env("CUDA_RT_C_LIB", shim());
                c
            }
            Origin::Wheel(python) => {
                let mut c = Command::new(python);
                c.env_remove("PYTHONPATH").env_remove("CUDA_RT_C_LIB");
                c
            }
        }
    }

    /// Checks that the module and its library are the ones meant: the checkout's
    /// needs the shim built, the wheel's must load the library bundled beside the
    /// installed module.
    fn check(&self) {
        assert!(shim().is_file(), "{} was not built", shim().display());
        if let Origin::Wheel(python) = self {
            let out = self
                .python()
                .arg("-c")
                .arg("import cuda_rt_alloc as c; print(c.__file__); print(c.library_path())")
                .output()
                .unwrap_or_else(|e| panic!("{} cannot be run: {e}", python.display()));
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "the wheel's module does not import: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let mut lines = text.lines();
            let (module, lib) = (lines.next().unwrap_or(""), lines.next().unwrap_or(""));
            let package = std::path::Path::new(module)
                .parent()
                .map(|p| p.join("libcuda_rt_c.so"));
            assert!(
                module.ends_with("cuda_rt_alloc/__init__.py")
                    && package.as_deref() == Some(std::path::Path::new(lib)),
                "not the installed wheel: module {module}, library {lib}"
            );
        }
    }
}

/// Whether `package` imports and sees a GPU: `None` (with the reason printed) when the
/// test must skip.
fn ready(from: &Origin, package: &str, gpu_check: &str) -> Option<()> {
    let out = from
        .python()
        .arg("-c")
        .arg(format!("import {package}; print({gpu_check})"))
        .output();
    let out = match (out, from) {
        (Ok(o), _) => o,
        (Err(e), Origin::Wheel(python)) => {
            panic!("{WHEEL_PYTHON_VAR}={} cannot be run: {e}", python.display())
        }
        (Err(e), Origin::Checkout) => {
            eprintln!("skipped: python3 cannot be run: {e}");
            return None;
        }
    };
    if !out.status.success() {
        eprintln!(
            "skipped: {package} is not installed for this Python ({})",
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
fn compare(from: &Origin, which: &str) {
    // One workload at a time: two timed runs sharing the GPU and the cores would time
    // each other.
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    from.check();
    let out = from
        .python()
        .arg(compare_script())
        .arg(which)
        .output()
        .expect("python runs");
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
            let tag = match from {
                Origin::Checkout => "",
                Origin::Wheel(_) => " (from the wheel)",
            };
            for line in stdout.lines().filter(|l| l.starts_with("figure:")) {
                let _ = writeln!(f, "{line}{tag}");
            }
        }
    }
}

#[test]
fn a_pytorch_training_loop_on_the_pool_matches_torchs_allocator() {
    let from = Origin::Checkout;
    if ready(&from, "torch", "torch.cuda.is_available()").is_some() {
        compare(&from, "torch");
    }
}

#[test]
fn a_cupy_workload_on_the_pool_matches_cupys_pool() {
    let from = Origin::Checkout;
    if ready(&from, "cupy", "cupy.cuda.runtime.getDeviceCount() > 0").is_some() {
        compare(&from, "cupy");
    }
}

#[test]
fn dlpack_hands_memory_to_torch_and_takes_torchs_tensors() {
    dlpack(&Origin::Checkout);
}

#[test]
fn from_the_wheel_a_pytorch_training_loop_matches_torchs_allocator() {
    let Some(from) = Origin::wheel() else { return };
    if ready(&from, "torch", "torch.cuda.is_available()").is_some() {
        compare(&from, "torch");
    }
}

#[test]
fn from_the_wheel_a_cupy_workload_matches_cupys_pool() {
    let Some(from) = Origin::wheel() else { return };
    if ready(&from, "cupy", "cupy.cuda.runtime.getDeviceCount() > 0").is_some() {
        compare(&from, "cupy");
    }
}

#[test]
fn from_the_wheel_dlpack_hands_memory_to_torch() {
    let Some(from) = Origin::wheel() else { return };
    dlpack(&from);
}

fn dlpack(from: &Origin) {
    if ready(from, "torch", "torch.cuda.is_available()").is_none() {
        return;
    }
    from.check();
    let script = compare_script().with_file_name("dlpack_torch.py");
    let out = from.python().arg(script).output().expect("python runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success() && text.contains("ok"), "{text}");
}

#[test]
fn the_pytorch_users_hour_out_of_memory_type_hooks_and_peaks() {
    let from = Origin::Checkout;
    if ready(&from, "torch", "torch.cuda.is_available()").is_none() {
        return;
    }
    assert!(shim().is_file(), "{} was not built", shim().display());
    // Alone: it fills the device on purpose.
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    let script = compare_script().with_file_name("torch_hour.py");
    let out = from.python().arg(script).output().expect("python3 runs");
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
