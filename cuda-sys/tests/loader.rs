//! The loader with fake library folders: search order, overrides, the errors' words,
//! and cuGetProcAddress resolution against a fake driver built here with the C compiler.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;
use common::{scratch, Scratch};

use cuda_sys::loader::search::SearchEnv;
use cuda_sys::loader::search::{candidates, candidates_with_sites, site_packages, Source};
use cuda_sys::loader::{specs, DriverSymbol, Kind, Library, LibrarySpec};
use cuda_sys::LoadErrorKind;

fn temp_dir(tag: &str) -> Scratch {
    scratch("cuda-sys-test", tag)
}

fn touch(p: &Path) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, b"not an ELF file").unwrap();
}

/// Builds a shared library from C source with the system C compiler.
fn build_so(dir: &Path, name: &str, source: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, source).unwrap();
    build_so_from(dir, name, &c, &[])
}

/// Builds `dir/name` from the C file `c` with extra compiler arguments.
fn build_so_from(dir: &Path, name: &str, c: &Path, args: &[&str]) -> PathBuf {
    let so = dir.join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(c)
        .args(args)
        .arg("-ldl")
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler {cc}: {e}"));
    assert!(status.success(), "C compiler failed for {name}");
    so
}

/// Builds the repository's fake driver (scripts/fake-libcuda.c) as `dir/libcuda.so.1`.
fn build_fake_libcuda(dir: &Path, args: &[&str]) -> PathBuf {
    let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fake-libcuda.c");
    build_so_from(dir, "libcuda.so.1", &c, args)
}

/// Makes a FIFO at `p`.
fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `c` is a NUL-terminated path.
    let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
    assert_eq!(
        rc,
        0,
        "mkfifo {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

/// Opens `spec` with `env` on another thread, failing the test if that takes more than
/// 20 s. A FIFO handed to dlopen blocks it forever, holding the system loader's lock
/// that every other test here (and even spawning a thread) needs; so before failing,
/// `fifo` is opened for writing without blocking and closed, again until that dlopen
/// has returned (it reads an empty file and fails), and the other tests go on.
fn open_within_a_timeout(
    spec: &'static LibrarySpec,
    env: SearchEnv,
    fifo: &Path,
) -> Result<Library, cuda_sys::LoadError> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::time::Duration;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(Library::open_with(spec, &env));
    });
    if let Ok(r) = rx.recv_timeout(Duration::from_secs(20)) {
        return r;
    }
    for _ in 0..600 {
        // Fails (ENXIO) while no one has the FIFO open for reading.
        drop(
            std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(fifo),
        );
        if rx.recv_timeout(Duration::from_millis(100)).is_ok() {
            break;
        }
    }
    panic!("opening the library blocked for 20 s: the FIFO reached dlopen");
}

#[test]
fn search_order_is_override_cuda_path_usr_local_system_then_wheels() {
    let root = temp_dir("order");
    let cuda_path = root.join("opt/cuda-13");
    std::fs::create_dir_all(cuda_path.join("lib64")).unwrap();
    std::fs::create_dir_all(root.join("usr/local/cuda/lib64")).unwrap();
    let venv = root.join("venv");
    let site = venv.join("lib/python3.12/site-packages");
    std::fs::create_dir_all(site.join("nvidia/cu13/lib")).unwrap();
    let over = root.join("mine/libnvrtc.so.13");
    touch(&over);

    let env = SearchEnv::with_root(&root)
        .var("CUDA_RT_LIBNVRTC", &over)
        .var("CUDA_PATH", &cuda_path)
        .var("VIRTUAL_ENV", &venv);
    let got: Vec<(PathBuf, Source)> = candidates(&specs::NVRTC, &env)
        .into_iter()
        .map(|c| (c.path, c.source))
        .collect();
    let expect = vec![
        (over.clone(), Source::Override),
        (cuda_path.join("lib64/libnvrtc.so.13"), Source::CudaPath),
        (cuda_path.join("lib64/libnvrtc.so.12"), Source::CudaPath),
        (
            root.join("usr/local/cuda/lib64/libnvrtc.so.13"),
            Source::UsrLocalCuda,
        ),
        (
            root.join("usr/local/cuda/lib64/libnvrtc.so.12"),
            Source::UsrLocalCuda,
        ),
        (PathBuf::from("libnvrtc.so.13"), Source::SystemLoader),
        (PathBuf::from("libnvrtc.so.12"), Source::SystemLoader),
        (
            site.join("nvidia/cu13/lib/libnvrtc.so.13"),
            Source::PythonWheel,
        ),
        (
            site.join("nvidia/cu13/lib/libnvrtc.so.12"),
            Source::PythonWheel,
        ),
    ];
    assert_eq!(got, expect);
    // With the site-packages folders found beforehand: the same list, and the wheels
    // come from the folders given.
    let sites = site_packages(&env);
    let with = |sites: &[PathBuf]| -> Vec<(PathBuf, Source)> {
        candidates_with_sites(&specs::NVRTC, &env, sites)
            .into_iter()
            .map(|c| (c.path, c.source))
            .collect()
    };
    assert_eq!(with(&sites), expect);
    assert_eq!(with(&[]), expect[..expect.len() - 2]);
}

#[test]
fn override_may_name_a_folder() {
    let root = temp_dir("overdir");
    let env = SearchEnv::with_root(&root).var("CUDA_RT_LIBCUBLAS", &root);
    let c = candidates(&specs::CUBLAS, &env);
    assert_eq!(c[0].path, root.join("libcublas.so.13"));
    assert_eq!(c[1].path, root.join("libcublas.so.12"));
    assert!(c[..2].iter().all(|c| c.source == Source::Override));
}

#[test]
fn missing_folders_are_not_searched_but_the_system_loader_always_is() {
    let root = temp_dir("empty");
    let env = SearchEnv::with_root(&root).var("CUDA_PATH", root.join("nope"));
    let c = candidates(&specs::CURAND, &env);
    assert_eq!(c.len(), 1);
    assert_eq!(c[0].source, Source::SystemLoader);
    assert_eq!(c[0].path, PathBuf::from("libcurand.so.10"));
}

#[test]
fn site_packages_prefers_newest_python_and_finds_pyenv_and_user_sites() {
    let root = temp_dir("sites");
    let home = root.join("home/u");
    for d in [
        "home/u/.pyenv/versions/3.11.7/lib/python3.11/site-packages",
        "home/u/.local/lib/python3.9/site-packages",
        "home/u/.local/lib/python3.12/site-packages",
        "usr/local/lib/python3.12/dist-packages",
        "usr/lib/python3/dist-packages",
    ] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    let env = SearchEnv::with_root(&root).var("HOME", &home);
    let got = site_packages(&env);
    assert_eq!(
        got,
        vec![
            root.join("home/u/.pyenv/versions/3.11.7/lib/python3.11/site-packages"),
            root.join("home/u/.local/lib/python3.12/site-packages"),
            root.join("home/u/.local/lib/python3.9/site-packages"),
            root.join("usr/local/lib/python3.12/dist-packages"),
            root.join("usr/lib/python3/dist-packages"),
        ]
    );
}

/// A venv as `python3 -m venv` makes it, under `root`: `venv/bin/python3` a symlink to
/// the base interpreter `base/bin/python3.12`, `venv/pyvenv.cfg`, and NVRTC's wheel in
/// the venv's site-packages (the base installation has a site-packages of its own).
fn fake_venv(root: &Path) -> (PathBuf, PathBuf) {
    let base_bin = root.join("base/bin/python3.12");
    touch(&base_bin);
    let base_site = root.join("base/lib/python3.12/site-packages");
    std::fs::create_dir_all(&base_site).unwrap();
    let venv = root.join("venv");
    std::fs::create_dir_all(venv.join("bin")).unwrap();
    std::os::unix::fs::symlink(&base_bin, venv.join("bin/python3")).unwrap();
    std::fs::write(venv.join("pyvenv.cfg"), "home = base/bin\n").unwrap();
    let site = venv.join("lib/python3.12/site-packages");
    touch(&site.join("nvidia/cu13/lib/libnvrtc.so.13"));
    (venv, base_site)
}

#[test]
fn a_venv_on_path_is_searched_without_virtual_env_though_python3_links_elsewhere() {
    let root = temp_dir("venv");
    let (venv, base_site) = fake_venv(&root);
    // The container setup: the venv's bin on PATH, VIRTUAL_ENV not set.
    let env = SearchEnv::with_root(&root).var("PATH", venv.join("bin"));
    let site = venv.join("lib/python3.12/site-packages");
    // The venv first, then the base interpreter's installation (kept).
    assert_eq!(site_packages(&env), vec![site.clone(), base_site]);
    let c = candidates(&specs::NVRTC, &env);
    let wheel = site.join("nvidia/cu13/lib/libnvrtc.so.13");
    assert!(
        c.iter()
            .any(|c| c.path == wheel && c.source == Source::PythonWheel),
        "{c:?}"
    );
}

#[test]
fn a_real_venv_on_path_is_searched_without_virtual_env() {
    let root = temp_dir("real-venv");
    let venv = root.join("venv");
    // The python3 of this machine makes the venv (no pip needed in it).
    let made = Command::new("python3")
        .args(["-m", "venv", "--without-pip"])
        .arg(&venv)
        .env_remove("VIRTUAL_ENV")
        .output();
    match made {
        Ok(out) if out.status.success() => {}
        // Said, not silent: a machine without python3's venv module cannot run it.
        other => {
            eprintln!("skipped a_real_venv_on_path_is_searched_without_virtual_env: python3 -m venv failed: {other:?}");
            return;
        }
    }
    let lib = venv.join("lib");
    let py = std::fs::read_dir(&lib)
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("python3"))
        .expect("the venv's lib/python3.*")
        .path();
    let so = py.join("site-packages/nvidia/cuda_nvrtc/lib/libnvrtc.so.12");
    touch(&so);
    let env = SearchEnv::with_root(&root).var("PATH", venv.join("bin"));
    assert_eq!(site_packages(&env)[0], py.join("site-packages"));
    assert!(
        candidates(&specs::NVRTC, &env).iter().any(|c| c.path == so),
        "{:?}",
        candidates(&specs::NVRTC, &env)
    );
}

#[test]
fn not_found_names_the_pip_package_on_its_first_line() {
    let root = temp_dir("pip");
    let err = Library::open_with(&NOWHERE_FROM_PIP, &SearchEnv::with_root(&root)).unwrap_err();
    let first = err.to_string().lines().next().unwrap().to_owned();
    assert!(
        first.starts_with(
            "cuNowhere (libcunowhere.so.12) not found (pip install nvidia-cunowhere, or set \
             CUDA_RT_LIBCUNOWHERE to its file or folder); tried 1 path"
        ),
        "{first}"
    );
    // The libraries pip provides name their packages; the driver comes with the
    // NVIDIA driver, not pip.
    assert_eq!(specs::NVRTC.pip_package, Some("nvidia-cuda-nvrtc"));
    assert_eq!(specs::RUNTIME.pip_package, Some("nvidia-cuda-runtime"));
    assert_eq!(specs::DRIVER.pip_package, None);
}

/// A library no machine has, so the system loader fails too.
static NOWHERE: LibrarySpec = LibrarySpec {
    name: "cuNowhere",
    files: &["libcunowhere.so.12"],
    override_var: "CUDA_RT_LIBCUNOWHERE",
    wheel_dirs: &["nvidia/cu13/lib"],
    kind: Kind::Plain,
    pip_package: None,
};

/// [`NOWHERE`] as if pip provided it.
static NOWHERE_FROM_PIP: LibrarySpec = LibrarySpec {
    pip_package: Some("nvidia-cunowhere"),
    ..NOWHERE
};

#[test]
fn missing_library_error_names_it_and_lists_every_path_tried() {
    let root = temp_dir("missing");
    let cuda = root.join("cuda");
    touch(&cuda.join("lib64/libcunowhere.so.12"));
    let env = SearchEnv::with_root(&root).var("CUDA_PATH", &cuda);
    let err = Library::open_with(&NOWHERE, &env).unwrap_err();
    let LoadErrorKind::LibraryNotFound { tried, .. } = err.kind() else {
        panic!("wrong kind: {err:?}")
    };
    assert_eq!(tried.len(), 2);
    let msg = err.to_string();
    assert!(msg.starts_with("cuNowhere (libcunowhere.so.12) not found (set CUDA_RT_LIBCUNOWHERE to its file or folder); tried 2 paths:"), "{msg}");
    assert!(
        msg.contains(&format!("{}/lib64/libcunowhere.so.12: ", cuda.display())),
        "{msg}"
    );
    assert!(msg.contains("\n  libcunowhere.so.12: "), "{msg}");
}

#[test]
fn override_library_loads_and_a_missing_symbol_is_an_error_naming_it() {
    let dir = temp_dir("fake-nvrtc");
    let so = build_so(
        &dir,
        "libnvrtc.so.13",
        "int nvrtcVersion(int *ma, int *mi) { *ma = 13; *mi = 0; return 0; }\n",
    );
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBNVRTC", &so);
    let lib = Library::open_with(&specs::NVRTC, &env).expect("fake NVRTC loads");
    assert_eq!(lib.path(), so.display().to_string());
    let p = lib.resolve("nvrtcVersion").expect("symbol exists");
    // SAFETY: the fake's nvrtcVersion has exactly this signature.
    let f: unsafe extern "C" fn(*mut i32, *mut i32) -> i32 = unsafe { std::mem::transmute(p) };
    let (mut a, mut b) = (0, 0);
    // SAFETY: valid out pointers.
    assert_eq!(unsafe { f(&mut a, &mut b) }, 0);
    assert_eq!((a, b), (13, 0));

    let err = lib.resolve("nvrtcNoSuchThing").unwrap_err();
    assert_eq!(err.symbol(), Some("nvrtcNoSuchThing"));
    let msg = err.to_string();
    assert!(
        msg.starts_with(&format!(
            "symbol nvrtcNoSuchThing not found in NVRTC (libnvrtc.so.13 or libnvrtc.so.12) ({})",
            so.display()
        )),
        "{msg}"
    );
}

const FAKE_DRIVER: &str = r#"
#include <string.h>
static int init_calls = 0;
static int fake_init(unsigned flags) { (void)flags; init_calls++; return 0; }
static int fake_sync_v1(void) { return 0; }
int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuGetProcAddress_v2(const char *sym, void **pfn, int ver, unsigned long long flags, int *status) {
    (void)flags;
    *pfn = 0;
    if (ver > 12080) { *status = 2; return 500; }
    if (strcmp(sym, "cuInit") == 0 && ver == 2000) { *pfn = (void*)fake_init; *status = 0; return 0; }
    if (strcmp(sym, "cuCtxSynchronize") == 0 && ver == 2000) { *pfn = (void*)fake_sync_v1; *status = 0; return 0; }
    *status = 1; return 500;
}
int fake_init_calls(void) { return init_calls; }
"#;

#[test]
fn driver_entry_points_come_from_cu_get_proc_address_with_their_abi_version() {
    let dir = temp_dir("fake-driver");
    let so = build_so(&dir, "libcuda.so.1", FAKE_DRIVER);
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBCUDA", &so);
    let lib = Library::open_with(&specs::DRIVER, &env).expect("fake driver loads");
    assert_eq!(lib.driver_version(), Some(12080));

    // cuInit is ABI 2000: a 12.8 driver serves it.
    let p = lib.resolve("cuInit").expect("cuInit resolves");
    // SAFETY: fake_init has this signature.
    let f: unsafe extern "C" fn(u32) -> i32 = unsafe { std::mem::transmute(p) };
    // SAFETY: no preconditions.
    assert_eq!(unsafe { f(0) }, 0);

    // cuCtxSynchronize (no suffix) is the old ABI; cuCtxSynchronize_v2 needs CUDA 13.0.
    assert!(lib.resolve("cuCtxSynchronize").is_ok());
    let err = lib.resolve("cuCtxSynchronize_v2").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "symbol cuCtxSynchronize_v2 not found in CUDA driver (libcuda.so.1) ({}): this ABI version needs a CUDA 13.0 driver; this driver supports CUDA 12.8",
            so.display()
        )
    );
    let err = lib.resolve("cuMemAlloc_v2").unwrap_err();
    assert!(
        err.to_string().ends_with("the driver does not export it"),
        "{err}"
    );
}

#[test]
fn driver_symbols_map_to_base_name_and_abi_version() {
    let s = DriverSymbol::parse("cuMemAlloc_v2");
    assert_eq!(
        (s.base, s.version, s.per_thread),
        ("cuMemAlloc", 3020, false)
    );
    let s = DriverSymbol::parse("cuMemcpyHtoD_v2_ptds");
    assert_eq!(
        (s.base, s.version, s.per_thread),
        ("cuMemcpyHtoD", 3020, true)
    );
    let s = DriverSymbol::parse("cuCtxSynchronize");
    assert_eq!((s.base, s.version), ("cuCtxSynchronize", 2000));
    let s = DriverSymbol::parse("cuCtxSynchronize_v2");
    assert_eq!((s.base, s.version), ("cuCtxSynchronize", 13000));
    let s = DriverSymbol::parse("cuStreamGetCaptureInfo_v3");
    assert_eq!((s.base, s.version), ("cuStreamGetCaptureInfo", 12030));
    let s = DriverSymbol::parse("cuSomethingNew");
    assert_eq!((s.base, s.version), ("cuSomethingNew", 13000));
}

#[test]
fn generated_module_reports_a_missing_library_instead_of_panicking() {
    // On a machine without CUDA the real driver is missing; with one it loads. Either
    // way the call returns, and an error names the library.
    match cuda_sys::driver::api() {
        Ok(api) => assert!(api.cuInit().is_ok()),
        Err(e) => assert!(e.to_string().contains("libcuda.so.1"), "{e}"),
    }
}

/// The reason given for `path` among the paths tried, if it was tried.
fn reason_for(err: &cuda_sys::LoadError, path: &Path) -> Option<String> {
    let LoadErrorKind::LibraryNotFound { tried, .. } = err.kind() else {
        panic!("wrong kind: {err:?}")
    };
    let shown = path.display().to_string();
    tried
        .iter()
        .find(|a| a.path == shown)
        .map(|a| a.reason.clone())
}

#[test]
fn override_naming_a_fifo_is_refused_quickly_and_says_it_is_not_a_regular_file() {
    let dir = temp_dir("fifo");
    let fifo = dir.join("libcunowhere.so.12");
    mkfifo(&fifo);
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBCUNOWHERE", &fifo);
    let err = open_within_a_timeout(&NOWHERE, env, &fifo).unwrap_err();
    assert_eq!(
        reason_for(&err, &fifo).as_deref(),
        Some(
            "a FIFO, not a regular file, so it was not opened (CUDA_RT_LIBCUNOWHERE must name the library file or a folder holding it)"
        ),
        "{err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(&format!(
            "\n  {}: a FIFO, not a regular file",
            fifo.display()
        )),
        "{msg}"
    );
}

#[test]
fn override_folder_holding_a_fifo_is_refused_quickly() {
    let dir = temp_dir("fifo-dir");
    let fifo = dir.join("libcunowhere.so.12");
    mkfifo(&fifo);
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBCUNOWHERE", &dir);
    let err = open_within_a_timeout(&NOWHERE, env, &fifo).unwrap_err();
    let reason = reason_for(&err, &fifo).expect("the FIFO is among the paths tried");
    assert!(reason.starts_with("a FIFO, not a regular file"), "{err}");
}

#[test]
fn driver_override_naming_a_fifo_never_reaches_dlopen() {
    let dir = temp_dir("fifo-driver");
    let fifo = dir.join("libcuda.so.1");
    mkfifo(&fifo);
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBCUDA", &fifo);
    // With a real driver on the machine the system loader's bare name may still find
    // it after the FIFO is passed over; either way the FIFO is not what opened.
    match open_within_a_timeout(&specs::DRIVER, env, &fifo) {
        Ok(lib) => assert_ne!(lib.path(), fifo.display().to_string()),
        Err(e) => assert!(
            reason_for(&e, &fifo).is_some_and(|r| r.starts_with("a FIFO")),
            "{e}"
        ),
    }
}

fn driver_refusal(args: &[&str]) -> (PathBuf, cuda_sys::LoadError) {
    let dir = temp_dir("old-driver");
    let so = build_fake_libcuda(&dir, args);
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBCUDA", &so);
    let err = Library::open_with(&specs::DRIVER, &env).expect_err("an old driver is refused");
    (so, err)
}

#[test]
fn driver_without_cu_get_proc_address_v2_is_refused_naming_its_version_and_the_minimum() {
    let (so, err) = driver_refusal(&["-DFAKE_DRIVER_VERSION=11080", "-DFAKE_NO_GET_PROC_ADDRESS"]);
    let LoadErrorKind::DriverTooOld {
        version,
        minimum,
        has_get_proc_address,
        ..
    } = err.kind()
    else {
        panic!("wrong kind: {err:?}")
    };
    assert_eq!(
        (*version, *minimum, *has_get_proc_address),
        (Some(11080), 12000, false)
    );
    assert_eq!(
        err.to_string(),
        format!(
            "CUDA driver (libcuda.so.1) at {} is too old: it supports CUDA 11.8, and cuda-rt needs a driver for CUDA 12.0 or newer (it lacks cuGetProcAddress_v2); update the NVIDIA driver",
            so.display()
        )
    );
}

#[test]
fn driver_reporting_a_version_before_12_0_is_refused_even_with_cu_get_proc_address_v2() {
    let (so, err) = driver_refusal(&["-DFAKE_DRIVER_VERSION=11080"]);
    assert_eq!(
        err.to_string(),
        format!(
            "CUDA driver (libcuda.so.1) at {} is too old: it supports CUDA 11.8, and cuda-rt needs a driver for CUDA 12.0 or newer; update the NVIDIA driver",
            so.display()
        )
    );
}

#[test]
fn driver_lacking_cu_get_proc_address_v2_is_refused_whatever_version_it_reports() {
    let (_, err) = driver_refusal(&["-DFAKE_DRIVER_VERSION=12080", "-DFAKE_NO_GET_PROC_ADDRESS"]);
    let msg = err.to_string();
    assert!(msg.contains("it supports CUDA 12.8"), "{msg}");
    assert!(msg.contains("(it lacks cuGetProcAddress_v2)"), "{msg}");
}

#[test]
fn repository_fake_driver_loads_and_serves_entry_points_through_cu_get_proc_address() {
    let dir = temp_dir("fake-libcuda");
    let so = build_fake_libcuda(&dir, &[]);
    let env = SearchEnv::with_root(&dir).var("CUDA_RT_LIBCUDA", &so);
    let lib = Library::open_with(&specs::DRIVER, &env).expect("the fake 13.0 driver loads");
    assert_eq!(lib.driver_version(), Some(13000));
    // cuMemAlloc is ABI 3020, served by the fake's cuMemAlloc_v2.
    let p = lib
        .resolve("cuMemAlloc_v2")
        .expect("cuMemAlloc_v2 resolves");
    // SAFETY: the fake's cuMemAlloc_v2 has this signature.
    let f: unsafe extern "C" fn(*mut u64, usize) -> i32 = unsafe { std::mem::transmute(p) };
    let mut ptr = 0u64;
    // SAFETY: a valid out pointer.
    assert_eq!(unsafe { f(&mut ptr, 256) }, 0);
    assert_eq!(ptr, 1 << 40);
    let err = lib.resolve("cuNoSuchThing").unwrap_err();
    assert!(
        err.to_string().ends_with("the driver does not export it"),
        "{err}"
    );
}
