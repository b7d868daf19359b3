//! The checked layer without a GPU: error words (suffixes stripped, status names,
//! Display), and that a library or entry point that cannot be used is an `Err`, never a
//! panic, against fake libraries built here with the C compiler.
//!
//! The loader opens each library once per process, so every scenario with a fake
//! library runs in a child process of this test binary: the parent test builds the
//! fake, then runs this binary again on one `child_*` test with the override variable
//! set (`CUDA_RT_LIBCUDA`, ...) and `CUDA_SYS_RESULT_CHILD` naming the scenario. Each
//! `child_*` test does nothing unless it is that child.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{scratch, Scratch};

use cuda_sys::result::{
    self, cublas_status_name, curand_status_name, cusolver_status_name, cusparse_status_name,
    library_check, library_check_described, strip_abi_suffix, DriverError, LibraryError,
    NvrtcError,
};
use cuda_sys::{driver, nvrtc, LoadErrorKind};

// ---------------------------------------------------------------------------------
// Words

#[test]
fn driver_error_says_call_name_and_description() {
    let e = DriverError {
        call: "cuMemAlloc",
        code: driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        name: "CUDA_ERROR_OUT_OF_MEMORY",
        description: "out of memory",
    };
    assert_eq!(
        e.to_string(),
        "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    );
    // result::Error says the same.
    assert_eq!(result::Error::from(e).to_string(), e.to_string());
}

#[test]
fn abi_suffixes_are_stripped_from_call_names() {
    assert_eq!(strip_abi_suffix("cuMemAlloc_v2"), "cuMemAlloc");
    assert_eq!(
        strip_abi_suffix("cuMemcpyHtoDAsync_v2_ptds"),
        "cuMemcpyHtoDAsync"
    );
    assert_eq!(strip_abi_suffix("cuLaunchKernel_ptsz"), "cuLaunchKernel");
    assert_eq!(
        strip_abi_suffix("cuStreamGetCaptureInfo_v3"),
        "cuStreamGetCaptureInfo"
    );
    assert_eq!(strip_abi_suffix("cuInit"), "cuInit");
    assert_eq!(strip_abi_suffix("cuMemAdvise_v"), "cuMemAdvise_v");
    assert_eq!(strip_abi_suffix("cuvid_v2x"), "cuvid_v2x");
}

#[test]
fn library_error_names_the_call_and_status() {
    let e = library_check(3, "cublasCreate", cublas_status_name).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cublasCreate failed: CUBLAS_STATUS_ALLOC_FAILED (3)"
    );
    let result::Error::Library(l) = e else {
        panic!("not a library error: {e:?}")
    };
    assert_eq!(
        l,
        LibraryError {
            call: "cublasCreate",
            status: 3,
            name: "CUBLAS_STATUS_ALLOC_FAILED",
            description: None,
        }
    );
    assert!(library_check(0, "cublasCreate", cublas_status_name).is_ok());
}

#[test]
fn a_library_error_with_a_description_shows_it_after_the_status() {
    let e = library_check_described(1, "cusparseCreate", cusparse_status_name, |_| {
        Some("initialization error")
    })
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1): initialization error"
    );
    // A library that cannot say keeps the name alone.
    let e =
        library_check_described(1, "cusparseCreate", cusparse_status_name, |_| None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1)"
    );
    assert!(library_check_described(0, "x", cusparse_status_name, |_| unreachable!()).is_ok());
}

#[cfg(all(feature = "cusolver", feature = "curand"))]
#[test]
fn cusolver_and_curand_errors_are_described_from_fixed_tables() {
    let e = result::cusolver::check(cuda_sys::cusolver::cusolverStatus_t(6), "cusolverDnSgetrf")
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "cusolverDnSgetrf failed: CUSOLVER_STATUS_EXECUTION_FAILED (6): the GPU program \
         failed to execute"
    );
    let e =
        result::curand::check(cuda_sys::curand::curandStatus(104), "curandGenerate").unwrap_err();
    assert_eq!(
        e.to_string(),
        "curandGenerate failed: CURAND_STATUS_OUT_OF_RANGE (104): argument out of range"
    );
    // Every named status has words; success and unknown ones have none.
    for code in (1..=31).filter(|&c| cusolver_status_name(c) != "CUSOLVER_STATUS_UNKNOWN") {
        assert!(
            result::cusolver::status_description(code).is_some(),
            "{code}"
        );
    }
    for code in (1..=999).filter(|&c| curand_status_name(c) != "CURAND_STATUS_UNKNOWN") {
        assert!(result::curand::status_description(code).is_some(), "{code}");
    }
    assert_eq!(result::cusolver::status_description(0), None);
    assert_eq!(result::cusolver::status_description(77), None);
    assert_eq!(result::curand::status_description(0), None);
}

/// A cuSPARSE whose create fails with NOT_INITIALIZED; with `-DWITH_STRING`, it also
/// has `cusparseGetErrorString` (as every cuSPARSE since 10.2 does).
#[cfg(feature = "cusparse")]
const FAILING_CUSPARSE: &str = r#"
int cusparseCreate(void **h) { (void)h; return 1; }
#ifdef WITH_STRING
const char *cusparseGetErrorString(int s) { return s == 1 ? "initialization error" : "unknown"; }
#endif
"#;

#[cfg(feature = "cusparse")]
#[test]
fn a_cusparse_error_carries_the_librarys_words_and_falls_back_to_the_name() {
    let dir = temp_dir("cusparse-words");
    let so = build_so(
        &dir,
        "libcusparse.so.12",
        Some(FAILING_CUSPARSE),
        None,
        &["-DWITH_STRING"],
    );
    run_child(
        "child_cusparse_error_has_the_librarys_words",
        &[("CUDA_RT_LIBCUSPARSE", &so)],
    );
    let dir = temp_dir("cusparse-no-words");
    let so = build_so(&dir, "libcusparse.so.12", Some(FAILING_CUSPARSE), None, &[]);
    run_child(
        "child_cusparse_error_without_the_string_function_has_the_name",
        &[("CUDA_RT_LIBCUSPARSE", &so)],
    );
}

#[cfg(feature = "cusparse")]
#[test]
fn child_cusparse_error_has_the_librarys_words() {
    if !is_child("child_cusparse_error_has_the_librarys_words") {
        return;
    }
    let e = result::cusparse::create().unwrap_err();
    assert_eq!(
        e.to_string(),
        "cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1): initialization error"
    );
}

#[cfg(feature = "cusparse")]
#[test]
fn child_cusparse_error_without_the_string_function_has_the_name() {
    if !is_child("child_cusparse_error_without_the_string_function_has_the_name") {
        return;
    }
    let e = result::cusparse::create().unwrap_err();
    assert_eq!(
        e.to_string(),
        "cusparseCreate failed: CUSPARSE_STATUS_NOT_INITIALIZED (1)"
    );
}

#[test]
fn every_status_has_a_name_also_an_unknown_one() {
    assert_eq!(cublas_status_name(0), "CUBLAS_STATUS_SUCCESS");
    assert_eq!(cublas_status_name(1), "CUBLAS_STATUS_NOT_INITIALIZED");
    assert_eq!(cusolver_status_name(7), "CUSOLVER_STATUS_INTERNAL_ERROR");
    assert_eq!(cusparse_status_name(3), "CUSPARSE_STATUS_INVALID_VALUE");
    assert_eq!(curand_status_name(104), "CURAND_STATUS_OUT_OF_RANGE");
    assert_eq!(curand_status_name(9999), "CURAND_STATUS_UNKNOWN");
    assert_eq!(cublas_status_name(12345), "CUBLAS_STATUS_UNKNOWN");
}

#[test]
fn nvrtc_error_says_the_call_and_the_status_name_or_number() {
    let named = NvrtcError {
        call: "nvrtcCompileProgram",
        code: nvrtc::nvrtcResult::NVRTC_ERROR_COMPILATION,
        name: Some("NVRTC_ERROR_COMPILATION"),
    };
    assert_eq!(
        named.to_string(),
        "nvrtcCompileProgram failed: NVRTC_ERROR_COMPILATION"
    );
    let unnamed = NvrtcError {
        name: None,
        ..named
    };
    assert_eq!(
        unnamed.to_string(),
        "nvrtcCompileProgram failed: NVRTC error 6"
    );
    assert_eq!(result::Error::from(named).to_string(), named.to_string());
}

// ---------------------------------------------------------------------------------
// Fake libraries, in child processes

/// The variable that names the scenario a child process runs.
const CHILD: &str = "CUDA_SYS_RESULT_CHILD";

fn temp_dir(tag: &str) -> Scratch {
    scratch("cuda-sys-result", tag)
}

/// Builds `dir/name` from C source (or the C file `c`) with the system C compiler.
fn build_so(
    dir: &Path,
    name: &str,
    source: Option<&str>,
    c: Option<&Path>,
    args: &[&str],
) -> PathBuf {
    let c = match (source, c) {
        (Some(src), _) => {
            let f = dir.join(format!("{name}.c"));
            std::fs::write(&f, src).unwrap();
            f
        }
        (None, Some(c)) => c.to_path_buf(),
        (None, None) => unreachable!("a source or a file"),
    };
    let so = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(&c)
        .args(args)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc}: {e}"));
    assert!(status.success(), "C compiler failed for {name}");
    so
}

/// The repository's fake driver (scripts/fake-libcuda.c) as `dir/libcuda.so.1`.
fn fake_libcuda(dir: &Path, args: &[&str]) -> PathBuf {
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fake-libcuda.c");
    build_so(dir, "libcuda.so.1", None, Some(&c), args)
}

/// Runs the test `child` of this binary in a new process with `vars` set and the
/// scenario named; fails with the child's output when the child fails.
fn run_child(child: &str, vars: &[(&str, &Path)]) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([child, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, child);
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "child {child} failed:\n{text}");
    assert!(
        text.contains(&format!("child {child} ran")),
        "child {child} did not run:\n{text}"
    );
}

/// Whether this process is the child running `name` (it says so, for the parent).
fn is_child(name: &str) -> bool {
    let me = std::env::var(CHILD).is_ok_and(|v| v == name);
    if me {
        println!("child {name} ran");
    }
    me
}

/// A 12.8 driver that serves a few entry points through `cuGetProcAddress_v2`;
/// `cuMemAlloc` answers `CUDA_ERROR_OUT_OF_MEMORY`.
const OOM_DRIVER: &str = r#"
#include <string.h>
#include <stdint.h>
static int fake_init(unsigned flags) { (void)flags; return 0; }
static int fake_alloc(uint64_t *p, size_t n) { (void)p; (void)n; return 2; }
static int fake_name(int e, const char **s) { *s = e == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : "CUDA_ERROR_OTHER"; return 0; }
static int fake_string(int e, const char **s) { *s = e == 2 ? "out of memory" : "other"; return 0; }
int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    (void)ver; (void)flags;
    *pfn = 0;
    if (strcmp(sym, "cuInit") == 0) *pfn = (void *)fake_init;
    if (strcmp(sym, "cuDriverGetVersion") == 0) *pfn = (void *)cuDriverGetVersion;
    if (strcmp(sym, "cuMemAlloc") == 0) *pfn = (void *)fake_alloc;
    if (strcmp(sym, "cuGetErrorName") == 0) *pfn = (void *)fake_name;
    if (strcmp(sym, "cuGetErrorString") == 0) *pfn = (void *)fake_string;
    if (*pfn) { *status = 0; return 0; }
    *status = 1; return 500;
}
"#;

#[test]
fn a_failed_driver_call_names_the_call_without_its_suffix_and_the_code() {
    let dir = temp_dir("oom");
    let so = build_so(&dir, "libcuda.so.1", Some(OOM_DRIVER), None, &[]);
    run_child(
        "child_a_failed_driver_call_is_a_driver_error",
        &[("CUDA_RT_LIBCUDA", &so)],
    );
}

#[test]
fn child_a_failed_driver_call_is_a_driver_error() {
    if !is_child("child_a_failed_driver_call_is_a_driver_error") {
        return;
    }
    result::init().expect("the fake's cuInit succeeds");
    assert_eq!(result::version().unwrap(), 12080);
    let e = result::memory::alloc(1 << 20).unwrap_err();
    let result::Error::Driver(d) = &e else {
        panic!("not a driver error: {e:?}")
    };
    assert_eq!(d.call, "cuMemAlloc");
    assert_eq!(d.code, driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY);
    assert_eq!(
        e.to_string(),
        "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory"
    );
    assert_eq!(
        result::get_error_name(driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap(),
        "CUDA_ERROR_OUT_OF_MEMORY"
    );
    assert_eq!(
        result::get_error_string(driver::CUresult::CUDA_ERROR_OUT_OF_MEMORY).unwrap(),
        "out of memory"
    );
    // An entry point the fake does not serve is an error naming it.
    let e = result::device::get_count().unwrap_err();
    let result::Error::Load(l) = &e else {
        panic!("not a load error: {e:?}")
    };
    assert_eq!(l.symbol(), Some("cuDeviceGetCount"), "{e}");
}

#[test]
fn calls_go_through_the_repository_fake_driver_and_a_missing_entry_point_is_an_err() {
    let dir = temp_dir("fake");
    let so = fake_libcuda(&dir, &[]);
    run_child(
        "child_the_fake_driver_serves_calls",
        &[("CUDA_RT_LIBCUDA", &so)],
    );
}

#[test]
fn child_the_fake_driver_serves_calls() {
    if !is_child("child_the_fake_driver_serves_calls") {
        return;
    }
    result::init().unwrap();
    assert_eq!(result::version().unwrap(), 13000);
    assert_eq!(result::device::get_count().unwrap(), 1);
    let dev = result::device::get(0).unwrap();
    let ctx = result::context::primary_ctx_retain(dev).unwrap();
    // SAFETY: the fake's context, just retained.
    unsafe { result::context::set_current(ctx) }.unwrap();
    let p = result::memory::alloc(256).unwrap();
    assert_eq!(p, 1 << 40);
    // SAFETY: `p` came from alloc, freed once.
    unsafe { result::memory::free(p) }.unwrap();
    let e = result::event::create(0).unwrap();
    // SAFETY: a fake event, live; the legacy default stream (null).
    unsafe {
        result::event::record(e, std::ptr::null_mut()).unwrap();
        assert!(result::event::query(e).unwrap());
        result::event::destroy(e).unwrap();
    }
    // The fake has no cuStreamSynchronize: an error naming it, not a panic.
    // SAFETY: the legacy default stream, valid with a current context.
    let err = unsafe { result::stream::synchronize(std::ptr::null_mut()) }.unwrap_err();
    let result::Error::Load(l) = &err else {
        panic!("not a load error: {err:?}")
    };
    assert_eq!(l.symbol(), Some("cuStreamSynchronize"));
    assert!(
        err.to_string().ends_with("the driver does not export it"),
        "{err}"
    );
}

#[test]
fn a_driver_too_old_is_an_err_from_every_call() {
    let dir = temp_dir("old");
    let so = fake_libcuda(&dir, &["-DFAKE_DRIVER_VERSION=11080"]);
    run_child(
        "child_a_driver_too_old_is_refused",
        &[("CUDA_RT_LIBCUDA", &so)],
    );
}

#[test]
fn child_a_driver_too_old_is_refused() {
    if !is_child("child_a_driver_too_old_is_refused") {
        return;
    }
    for e in [
        result::init().unwrap_err(),
        result::device::get_count().unwrap_err(),
        result::memory::alloc(1).unwrap_err(),
    ] {
        let result::Error::Load(l) = &e else {
            panic!("not a load error: {e:?}")
        };
        assert!(
            matches!(l.kind(), LoadErrorKind::DriverTooOld { .. }),
            "{e}"
        );
        assert!(e.to_string().contains("is too old"), "{e}");
    }
}

#[test]
fn an_nvrtc_without_the_entry_point_is_an_err() {
    let dir = temp_dir("nvrtc");
    // An NVRTC with nvrtcVersion only.
    let so = build_so(
        &dir,
        "libnvrtc.so.13",
        Some("int nvrtcVersion(int *ma, int *mi) { *ma = 13; *mi = 0; return 0; }\n"),
        None,
        &[],
    );
    run_child(
        "child_nvrtc_calls_count_and_fail_cleanly",
        &[("CUDA_RT_LIBNVRTC", &so)],
    );
}

#[test]
fn child_nvrtc_calls_count_and_fail_cleanly() {
    if !is_child("child_nvrtc_calls_count_and_fail_cleanly") {
        return;
    }
    assert_eq!(result::nvrtc::loaded_path(), None, "nothing opened yet");
    let before = result::nvrtc::call_count();
    assert_eq!(result::nvrtc::version().unwrap(), (13, 0));
    assert!(result::nvrtc::call_count() > before);
    assert!(result::nvrtc::loaded_path().is_some());
    let src = c"extern \"C\" __global__ void k() {}";
    let e = result::nvrtc::create_program(src, c"k.cu").unwrap_err();
    let result::Error::Load(l) = &e else {
        panic!("not a load error: {e:?}")
    };
    assert_eq!(l.symbol(), Some("nvrtcCreateProgram"));
    // No nvrtcGetErrorString: the name is missing, the number says what it was.
    let err = cuda_sys::result::NvrtcError::new(
        nvrtc::nvrtcResult::NVRTC_ERROR_COMPILATION,
        "nvrtcCompileProgram",
    );
    assert_eq!(err.name, None);
    assert_eq!(err.to_string(), "nvrtcCompileProgram failed: NVRTC error 6");
}

#[cfg(feature = "cublas")]
#[test]
fn a_cublas_without_the_entry_point_is_an_err() {
    let dir = temp_dir("cublas");
    let so = build_so(
        &dir,
        "libcublas.so.13",
        Some("int cublasGetVersion_v2(void *h, int *v) { (void)h; *v = 130000; return 0; }\n"),
        None,
        &[],
    );
    run_child(
        "child_cublas_create_fails_cleanly",
        &[("CUDA_RT_LIBCUBLAS", &so)],
    );
}

#[cfg(feature = "cublas")]
#[test]
fn child_cublas_create_fails_cleanly() {
    if !is_child("child_cublas_create_fails_cleanly") {
        return;
    }
    let e = result::cublas::create().unwrap_err();
    let result::Error::Load(l) = &e else {
        panic!("not a load error: {e:?}")
    };
    assert_eq!(l.symbol(), Some("cublasCreate_v2"));
}

#[test]
fn a_library_that_is_nowhere_is_an_err_naming_it() {
    // Whether this machine has the real driver or not, the call returns; without
    // one, the error names the library and the override variable.
    match result::init() {
        Ok(()) => {}
        Err(result::Error::Load(l)) => {
            let msg = l.to_string();
            assert!(
                msg.contains("libcuda.so.1") || msg.contains("too old"),
                "{msg}"
            );
            if let LoadErrorKind::LibraryNotFound { override_var, .. } = l.kind() {
                assert_eq!(*override_var, "CUDA_RT_LIBCUDA");
            }
        }
        Err(e) => {
            // A driver without a device answers with its own code.
            assert!(matches!(e, result::Error::Driver(_)), "{e:?}");
        }
    }
}
