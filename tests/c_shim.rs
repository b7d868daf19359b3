//! Whole-stack tests: Rust through the shim's C ABI, and a C program built with the C
//! compiler against `wrapper.h` and `libcuda_rt_c.so`.

use std::ffi::CStr;
use std::path::PathBuf;
use std::process::Command;

use cuda_rt_c::*;

fn last_error() -> String {
    // SAFETY: curt_last_error returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(curt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_out_pointer_is_an_invalid_argument_with_a_message() {
    assert_eq!(
        curt_device_count(std::ptr::null_mut()),
        CURT_ERROR_INVALID_ARGUMENT
    );
    assert_eq!(last_error(), "invalid argument: count is NULL");
}

#[test]
fn device_count_matches_availability() {
    let mut n = -1;
    let rc = curt_device_count(&mut n);
    if curt_is_available() == 1 {
        assert_eq!(rc, CURT_SUCCESS);
        assert!(n > 0);
    } else {
        assert_ne!(rc, CURT_SUCCESS);
        assert!(!last_error().is_empty());
    }
}

/// The folder holding libcuda_rt_c.so: `CUDA_RT_SHIM_DIR`, else the folder this test
/// binary sits in (`target/<profile>/deps`, where `cargo test` builds the cdylib).
fn shim_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CUDA_RT_SHIM_DIR") {
        return PathBuf::from(d);
    }
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().to_path_buf()
}

/// Compiles tests/c/smoke.c against the shim, or takes the program already built by
/// scripts/build-gpu.sh (`CUDA_RT_C_SMOKE`, on machines without the sources or a C
/// compiler).
fn smoke_program(dir: &std::path::Path) -> PathBuf {
    if let Some(p) = std::env::var_os("CUDA_RT_C_SMOKE") {
        return PathBuf::from(p);
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("cuda_rt_c_smoke_{}", std::process::id()));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(root.join("tests/c/smoke.c"))
        .arg("-I")
        .arg(&root)
        .arg("-L")
        .arg(dir)
        .arg("-lcuda_rt_c")
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc}: {e}"));
    assert!(status.success(), "compiling tests/c/smoke.c failed");
    out
}

#[test]
fn c_program_links_the_shim_and_never_crashes() {
    let dir = shim_dir();
    let so = dir.join("libcuda_rt_c.so");
    assert!(so.exists(), "{} not built", so.display());
    let out = smoke_program(&dir);
    let run = Command::new(&out)
        .env("LD_LIBRARY_PATH", &dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(run.status.success(), "C smoke test failed:\n{stdout}");
    assert!(stdout.contains("C SMOKE PASSED"));
}
