//! Whole-stack tests: Rust through the shim's C ABI, and a C program built with the C
//! compiler against `wrapper.h` and `libcuda_rt_c.so`.

use std::ffi::CStr;
use std::path::PathBuf;
use std::process::Command;

use cuda_rt_c::*;

mod support;
use support::shim_dir;

fn last_error() -> String {
    // SAFETY: curt_last_error returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(curt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

#[test]
fn null_out_pointer_is_an_invalid_argument_with_a_message() {
    // SAFETY: NULL is what this test passes, and the function refuses it.
    let rc = unsafe { curt_device_count(std::ptr::null_mut()) };
    assert_eq!(rc, CURT_ERROR_INVALID_ARGUMENT);
    assert_eq!(last_error(), "invalid argument: count is NULL");
}

#[test]
fn device_count_matches_availability() {
    let mut n = -1;
    // SAFETY: `n` is a live int.
    let rc = unsafe { curt_device_count(&mut n) };
    if curt_is_available() == 1 {
        assert_eq!(rc, CURT_SUCCESS);
        assert!(n > 0);
    } else {
        assert_ne!(rc, CURT_SUCCESS);
        assert!(!last_error().is_empty());
    }
}

/// Compiles `tests/c/<name>.c` against the shim, or takes the program already built by
/// scripts/build-gpu.sh (named by the variable `prebuilt`, on machines without the
/// sources or a C compiler).
/// A C program to run: prebuilt, or compiled here into a temporary folder that goes
/// with it (removed on drop, also when the test panics), with the folder the loader
/// finds the shim in under its soname.
struct CProgram {
    path: PathBuf,
    /// Holds `libcuda_rt_c.so.0`, the name the program asks the loader for.
    lib_dir: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

/// The shim's soname (build.rs): what a program linked with `-lcuda_rt_c` loads.
const SONAME: &str = "libcuda_rt_c.so.0";

impl std::ops::Deref for CProgram {
    type Target = std::path::Path;
    fn deref(&self) -> &std::path::Path {
        &self.path
    }
}

impl AsRef<std::ffi::OsStr> for CProgram {
    fn as_ref(&self) -> &std::ffi::OsStr {
        self.path.as_os_str()
    }
}

fn c_program(dir: &std::path::Path, name: &str, prebuilt: &str) -> CProgram {
    c_source(dir, &format!("tests/c/{name}.c"), prebuilt)
}

/// Compiles the C file `source` (relative to the package root) against the shim, or
/// takes the program named by the variable `prebuilt`.
fn c_source(dir: &std::path::Path, source: &str, prebuilt: &str) -> CProgram {
    if let Some(p) = std::env::var_os(prebuilt) {
        // scripts/build-gpu.sh made the soname's link beside the library.
        return CProgram {
            path: PathBuf::from(p),
            lib_dir: dir.to_path_buf(),
            _dir: None,
        };
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let name = source.replace(['/', '.'], "_");
    let tmp = tempfile::Builder::new()
        .prefix(&format!("cuda_rt_c_{name}_"))
        .tempdir()
        .unwrap();
    let out = tmp.path().join(&name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(root.join(source))
        .args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror"])
        .arg("-I")
        .arg(&root)
        .arg("-pthread")
        .arg("-L")
        .arg(dir)
        .arg("-lcuda_rt_c")
        .arg("-o")
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc}: {e}"));
    assert!(status.success(), "compiling {source} failed");
    // Cargo names the library `libcuda_rt_c.so`; the program asks for the soname, which
    // a link beside it in the program's folder answers (as an installation's does).
    std::os::unix::fs::symlink(dir.join("libcuda_rt_c.so"), tmp.path().join(SONAME)).unwrap();
    CProgram {
        path: out,
        lib_dir: tmp.path().to_path_buf(),
        _dir: Some(tmp),
    }
}

#[test]
fn c_program_links_the_shim_and_never_crashes() {
    let dir = shim_dir();
    let so = dir.join("libcuda_rt_c.so");
    assert!(so.exists(), "{} not built", so.display());
    let out = c_program(&dir, "smoke", "CUDA_RT_C_SMOKE");
    let run = Command::new(&out)
        .env("LD_LIBRARY_PATH", &out.lib_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}");
    assert!(run.status.success(), "C smoke test failed:\n{stdout}");
    assert!(stdout.contains("C SMOKE PASSED"));
}

/// Runs a C program with the shim on its library path: its stdout, after checking it
/// exited 0 with `passed` in its output (when given).
fn run_c(program: &CProgram, passed: Option<&str>) -> String {
    let run = Command::new(program)
        .env("LD_LIBRARY_PATH", &program.lib_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}{stderr}");
    assert!(
        run.status.success(),
        "{} failed ({}):\n{stdout}{stderr}",
        program.display(),
        run.status
    );
    if let Some(p) = passed {
        assert!(stdout.contains(p), "{stdout}");
    }
    stdout
}

#[test]
fn c_api_program_gets_the_right_code_and_message_on_every_error_path() {
    let dir = shim_dir();
    let out = c_program(&dir, "api", "CUDA_RT_C_API");
    let stdout = run_c(&out, Some("C API PASSED"));
    assert!(!stdout.contains("FAIL "), "{stdout}");
}

#[test]
fn c_saxpy_example_builds_and_runs_or_skips_without_a_gpu() {
    let dir = shim_dir();
    let out = c_source(&dir, "examples/c/saxpy.c", "CUDA_RT_C_SAXPY");
    let stdout = run_c(&out, None);
    if curt_is_available() == 1 {
        assert!(stdout.contains("saxpy: 0 of 4096 wrong"), "{stdout}");
    } else {
        let required =
            std::env::var("CUDA_RT_REQUIRE_GPU").is_ok_and(|v| !v.is_empty() && v != "0");
        assert!(
            !required,
            "CUDA_RT_REQUIRE_GPU is set but no GPU is usable: {stdout}"
        );
        assert!(stdout.starts_with("skipped:"), "{stdout}");
    }
}

#[test]
fn c_program_calling_the_shim_from_a_key_destructor_and_atexit_exits_normally() {
    let dir = shim_dir();
    let out = c_program(&dir, "teardown", "CUDA_RT_C_TEARDOWN");
    let run = Command::new(&out)
        .env("LD_LIBRARY_PATH", &out.lib_dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    println!("{stdout}{stderr}");
    // Before the fix the process died of SIGABRT in the key destructor.
    assert!(
        run.status.success(),
        "C teardown program failed ({}):\n{stdout}{stderr}",
        run.status
    );
    assert!(stdout.contains("KEY DESTRUCTOR DONE"), "{stdout}");
    assert!(stdout.contains("C TEARDOWN PASSED"), "{stdout}");
    assert!(!stdout.contains("FAIL "), "{stdout}");
}

/// What one thread-local destructor saw when it called the shim.
#[derive(Debug)]
struct Seen {
    rc: i32,
    last_error: String,
}

static SEEN: std::sync::Mutex<Vec<Seen>> = std::sync::Mutex::new(Vec::new());

/// Calls the shim from its `Drop`, run as a thread-local destructor while the thread
/// exits: a failing call, `curt_last_error`, then the calls that need CUDA.
struct CallsTheShimOnDrop;

impl Drop for CallsTheShimOnDrop {
    fn drop(&mut self) {
        // SAFETY: NULL (refused by the function), then a live int.
        let rc = unsafe { curt_device_count(std::ptr::null_mut()) };
        let last_error = last_error();
        let _ = curt_is_available();
        let mut n = 0;
        // SAFETY: `n` is a live int.
        let _ = unsafe { curt_device_count(&mut n) };
        // SAFETY: as above.
        let _ = unsafe { curt_driver_version(&mut n) };
        let _ = curt_last_error();
        SEEN.lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Seen { rc, last_error });
    }
}

thread_local! {
    static REGISTERED_BEFORE_THE_SHIM: CallsTheShimOnDrop = const { CallsTheShimOnDrop };
    static REGISTERED_AFTER_THE_SHIM: CallsTheShimOnDrop = const { CallsTheShimOnDrop };
}

const TEARDOWN_CHILD_VAR: &str = "CUDA_RT_TEST_TLS_TEARDOWN_CHILD";

/// Not a test of its own: the body of the child process of
/// `shim_calls_from_thread_local_destructors_neither_panic_nor_abort`, a no-op unless
/// that test starts it (the bug it guards against aborts the whole process).
#[test]
fn tls_teardown_child_process() {
    if std::env::var_os(TEARDOWN_CHILD_VAR).is_none() {
        return;
    }
    std::thread::spawn(|| {
        // Destructors run in some order of registration; one key on each side of the
        // shim's own makes one of them run after the shim's slot is destroyed.
        REGISTERED_BEFORE_THE_SHIM.with(|_| {});
        // SAFETY: NULL, which the function refuses.
        let rc = unsafe { curt_device_count(std::ptr::null_mut()) };
        assert_eq!(rc, CURT_ERROR_INVALID_ARGUMENT);
        REGISTERED_AFTER_THE_SHIM.with(|_| {});
    })
    .join()
    .unwrap();
    let seen = SEEN.lock().unwrap();
    println!("seen: {seen:?}");
    assert_eq!(seen.len(), 2, "both destructors ran: {seen:?}");
    assert!(seen.iter().all(|s| s.rc == CURT_ERROR_INVALID_ARGUMENT));
    // One destructor ran with the shim's slot alive and got the message, the other
    // after it was destroyed and got "" (what the test is for).
    assert!(
        seen.iter().any(|s| s.last_error.is_empty()),
        "no destructor ran after the shim's slot was torn down: {seen:?}"
    );
    assert!(seen
        .iter()
        .all(|s| s.last_error.is_empty() || s.last_error == "invalid argument: count is NULL"));
    println!("TLS TEARDOWN PASSED");
}

#[test]
fn shim_calls_from_thread_local_destructors_neither_panic_nor_abort() {
    let run = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "tls_teardown_child_process",
            "--test-threads=1",
            "--nocapture",
        ])
        .env(TEARDOWN_CHILD_VAR, "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "child failed ({}):\n{stdout}{stderr}",
        run.status
    );
    assert!(stdout.contains("TLS TEARDOWN PASSED"), "{stdout}{stderr}");
}

#[test]
fn c_api_program_links_the_static_library_too() {
    // The static library sits beside the shared one where cargo builds them (not on
    // the GPU machine, whose prebuilt programs link the shared one).
    if std::env::var_os("CUDA_RT_C_API").is_some() {
        eprintln!("skipped: prebuilt programs in use (the static library is tested where built)");
        return;
    }
    let dir = shim_dir();
    let lib = dir.join("libcuda_rt_c.a");
    assert!(lib.exists(), "{} not built", lib.display());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::Builder::new()
        .prefix("cuda_rt_c_api_static_")
        .tempdir()
        .unwrap();
    let out = tmp.path().join("api_static");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .arg(root.join("tests/c/api.c"))
        .args(["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(&root)
        .arg(&lib)
        .args(["-pthread", "-ldl", "-lm", "-o"])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc}: {e}"));
    assert!(
        status.success(),
        "linking tests/c/api.c with libcuda_rt_c.a failed"
    );
    // No LD_LIBRARY_PATH: nothing of the shim is loaded at run time.
    let run = Command::new(&out).output().unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(stdout.contains("C API PASSED"), "{stdout}");
}

/// Whether `file`'s dynamic section has the entry `readelf -d` prints as
/// `<tag>: [<SONAME>]` (`Library soname`, `Shared library`). Where readelf (binutils)
/// is missing (a bare GPU machine), whether the name is among the file's strings.
fn has_dynamic_entry(file: &std::path::Path, tag: &str) -> bool {
    match Command::new("readelf").arg("-d").arg(file).output() {
        Ok(out) if out.status.success() => {
            String::from_utf8_lossy(&out.stdout).contains(&format!("{tag}: [{SONAME}]"))
        }
        _ => {
            let bytes = std::fs::read(file).unwrap();
            let name = format!("{SONAME}\0");
            bytes.windows(name.len()).any(|w| w == name.as_bytes())
        }
    }
}

#[test]
fn the_shared_library_has_a_versioned_soname_that_linked_programs_ask_for() {
    let dir = shim_dir();
    let so = dir.join("libcuda_rt_c.so");
    assert!(
        has_dynamic_entry(&so, "Library soname"),
        "{} has no soname {SONAME}",
        so.display()
    );
    // A program linked with -lcuda_rt_c records the soname, and runs through the link.
    let out = c_program(&dir, "smoke", "CUDA_RT_C_SMOKE");
    assert!(
        has_dynamic_entry(&out, "Shared library"),
        "{} does not ask for {SONAME}",
        out.display()
    );
    assert!(
        out.lib_dir.join(SONAME).exists(),
        "no {SONAME} beside the program"
    );
    run_c(&out, Some("C SMOKE PASSED"));
}

/// Runs `command`, panicking with what it printed when it fails.
fn run_ok(command: &mut Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn out_of_memory_in_curt_torch_alloc_is_thrown_as_c10_out_of_memory_error() {
    // C++ is compiled here, where the sources and compilers are (not on the GPU
    // machine, whose prebuilt programs are named by variables; there the real PyTorch
    // is tested by tests/python/torch_hour.py).
    if std::env::var_os("CUDA_RT_C_API").is_some() {
        eprintln!(
            "skipped: prebuilt programs in use (the C++ stand-in for libc10 is tested where built)"
        );
        return;
    }
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = shim_dir();
    let tmp = tempfile::Builder::new()
        .prefix("cuda_rt_c_torch_oom_")
        .tempdir()
        .unwrap();
    let t = tmp.path();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    // The fake driver: allocations succeed without a GPU, so the pool's limit is what
    // runs out.
    run_ok(
        Command::new(&cc)
            .args(["-O2", "-shared", "-fPIC", "-o"])
            .arg(t.join("libcuda.so.1"))
            .arg(root.join("scripts/fake-libcuda.c"))
            .arg("-ldl"),
        "building the fake driver",
    );
    run_ok(
        Command::new(&cxx)
            .args([
                "-std=c++17",
                "-shared",
                "-fPIC",
                // As PyTorch builds libc10: Error's implicit destructor is not exported,
                // so the shim takes it from OutOfMemoryError's vtable.
                "-fvisibility-inlines-hidden",
                "-Wl,-soname,libc10.so",
                "-o",
            ])
            .arg(t.join("libc10.so"))
            .arg(root.join("tests/cxx/fake_c10.cpp")),
        "building the stand-in libc10.so",
    );
    std::os::unix::fs::symlink(dir.join("libcuda_rt_c.so"), t.join(SONAME)).unwrap();
    let program = t.join("torch_oom");
    run_ok(
        Command::new(&cxx)
            .args(["-std=c++17", "-Wall", "-Wextra", "-Werror"])
            .arg(root.join("tests/cxx/torch_oom.cpp"))
            .arg("-I")
            .arg(&root)
            .arg("-L")
            .arg(t)
            .arg("-lc10")
            .arg("-L")
            .arg(&dir)
            .arg("-lcuda_rt_c")
            .arg("-o")
            .arg(&program),
        "building tests/cxx/torch_oom.cpp",
    );
    let run = Command::new(&program)
        .env("LD_LIBRARY_PATH", t)
        .env("CUDA_RT_LIBCUDA", t.join("libcuda.so.1"))
        .env_remove("CUDA_RT_GPU_MEMORY_LIMIT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success(), "{stdout}");
    assert!(stdout.contains("TORCH OOM PASSED"), "{stdout}");
    assert!(!stdout.contains("FAIL "), "{stdout}");
}

#[test]
fn a_length_past_any_object_is_an_invalid_argument() {
    let image = [0u8; 4];
    let mut m = std::ptr::null_mut();
    // SAFETY: the lengths are refused before anything is read.
    let rc = unsafe { curt_module_load_data(image.as_ptr().cast(), usize::MAX, &mut m) };
    assert_eq!(rc, CURT_ERROR_INVALID_ARGUMENT);
    assert!(last_error().contains("past any object"), "{}", last_error());
    assert!(m.is_null());
}
