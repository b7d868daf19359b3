//! The Python module `python/cuda_rt_alloc.py` against the built shim: it loads the
//! library (found where the module says it looks, or named by `CUDA_RT_C_LIB`, with an
//! error saying what it tried), reads statistics and snapshots (an error for a device
//! that does not exist), reports what `install_torch` installed (against a stand-in
//! torch module), and says clearly when torch or CuPy is missing. Skips with a printed
//! reason where `python3` or the module is absent.

use std::path::{Path, PathBuf};
use std::process::Command;

mod support;
use support::{python_dir, shim};

fn python(code: &str) -> Option<(bool, String)> {
    python_in(
        code,
        &python_dir(),
        &[("CUDA_RT_C_LIB", Some(shim().as_os_str()))],
    )
}

/// Runs `code` with `dir` on `PYTHONPATH`, `CUDA_RT_C_LIB` and `CARGO_TARGET_DIR` unset
/// unless `env` sets them (`None` leaves one unset).
fn python_in(
    code: &str,
    dir: &Path,
    env: &[(&str, Option<&std::ffi::OsStr>)],
) -> Option<(bool, String)> {
    if !dir.join("cuda_rt_alloc.py").is_file() {
        eprintln!("skipped: {} has no cuda_rt_alloc.py", dir.display());
        return None;
    }
    let mut cmd = Command::new("python3");
    cmd.arg("-c")
        .arg(code)
        .env("PYTHONPATH", dir)
        .env_remove("CUDA_RT_C_LIB")
        .env_remove("CARGO_TARGET_DIR");
    for (k, v) in env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let out = match cmd.output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("skipped: python3 cannot be run: {e}");
            return None;
        }
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), text))
}

#[test]
fn the_python_module_reads_stats_and_snapshots() {
    assert!(shim().is_file(), "{} was not built", shim().display());
    let code = r#"
import cuda_rt_alloc as c
gpu = c._library().curt_is_available() == 1
if gpu:
    s = c.stats(0)
    assert set(s) == {"used_bytes", "total_bytes", "free_bytes", "n_free_blocks",
                      "peak_used_bytes", "peak_total_bytes", "mallocs", "frees",
                      "cache_hits", "cache_misses", "backend_allocs", "backend_frees",
                      "graph_pools_bytes"}, s
    snap = c.snapshot(0)
    assert "segments" in snap and "device_traces" in snap, snap
    c.reset_peak(0)
    assert c.max_memory_reserved(0) == c.stats(0)["total_bytes"]
else:
    # No device 0 without CUDA: an error that says why, never zeros.
    for call in (c.stats, c.snapshot, c.reset_peak, c.max_memory_reserved):
        try:
            call(0)
        except c.CudaRtError as e:
            assert "not found" in str(e) or "CUDA" in str(e), e
        else:
            raise AssertionError(f"{call.__name__}(0) without a GPU gave no error")
# A device that exists nowhere.
try:
    c.stats(9999)
except c.CudaRtError as e:
    assert "curt_pool_stats" in str(e), e
else:
    raise AssertionError("stats(9999) gave no error")
assert isinstance(c.pinned_snapshot()["segments"], list)
c.empty_cache()
assert c.live_allocations() == 0
print("ok", c.library_path())
"#;
    let Some((ok, text)) = python(code) else {
        return;
    };
    assert!(ok, "{text}");
    assert!(text.starts_with("ok "), "{text}");
}

#[test]
fn installing_without_torch_or_cupy_says_which_is_missing() {
    let code = r#"
import importlib.util, cuda_rt_alloc as c
for name, install in (("torch", c.install_torch), ("cupy", c.install_cupy)):
    if importlib.util.find_spec(name) is None:
        try:
            install()
        except ImportError as e:
            assert name in str(e), e
            print("missing", name)
        else:
            raise AssertionError(name + " installed without the package")
    else:
        print("present", name)
"#;
    let Some((ok, text)) = python(code) else {
        return;
    };
    assert!(ok, "{text}");
    assert_eq!(text.lines().count(), 2, "{text}");
}

/// A scratch folder holding a copy of the module in `py/` (so that the checkout's
/// `target/` is not beside it), removed on drop.
struct Layout {
    tmp: tempfile::TempDir,
}

impl Layout {
    fn new() -> Option<Layout> {
        let module = python_dir().join("cuda_rt_alloc.py");
        if !module.is_file() {
            eprintln!("skipped: {} is missing", module.display());
            return None;
        }
        let tmp = tempfile::Builder::new()
            .prefix("cuda_rt_c_pymod_")
            .tempdir()
            .unwrap();
        std::fs::create_dir(tmp.path().join("py")).unwrap();
        std::fs::copy(&module, tmp.path().join("py/cuda_rt_alloc.py")).unwrap();
        Some(Layout { tmp })
    }
    fn py(&self) -> PathBuf {
        self.tmp.path().join("py")
    }
    /// Links the built shim as `rel` (a path under the scratch folder).
    fn put_library(&self, rel: &str) -> PathBuf {
        let at = self.tmp.path().join(rel);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(shim(), &at).unwrap();
        at
    }
}

/// Python that prints the path the module picked and checks the library loads.
const WHICH: &str = r#"
import cuda_rt_alloc as c
assert isinstance(c.pinned_snapshot()["segments"], list)
print("path", c.library_path())
"#;

fn picked(text: &str) -> PathBuf {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("path "))
        .unwrap_or_else(|| panic!("{text}"));
    PathBuf::from(line)
}

#[test]
fn the_module_finds_the_library_in_cargo_target_dir_and_in_gpu_bin_and_beside_itself_first() {
    let Some(l) = Layout::new() else { return };
    let target = l.tmp.path().join("cargo-target");
    // Nothing anywhere: the error lists every place, CARGO_TARGET_DIR and gpu-bin too.
    let target_os = target.clone().into_os_string();
    let env = [("CARGO_TARGET_DIR", Some(target_os.as_os_str()))];
    let (ok, text) = python_in(WHICH, &l.py(), &env).unwrap();
    assert!(!ok, "{text}");
    for place in [
        format!("{}", l.py().join("libcuda_rt_c.so").display()),
        format!("{}", target.join("release/libcuda_rt_c.so").display()),
        format!("{}", target.join("debug/libcuda_rt_c.so").display()),
        format!(
            "{}",
            l.tmp.path().join("gpu-bin/lib/libcuda_rt_c.so").display()
        ),
    ] {
        assert!(text.contains(&place), "{place} not in: {text}");
    }
    assert!(text.contains("FileNotFoundError"), "{text}");
    // The GPU build's folder.
    let gpu_bin = l.put_library("gpu-bin/lib/libcuda_rt_c.so");
    let (ok, text) = python_in(WHICH, &l.py(), &env).unwrap();
    assert!(ok, "{text}");
    assert_eq!(picked(&text), gpu_bin);
    // CARGO_TARGET_DIR comes before it.
    let cargo = l.put_library("cargo-target/gpu/libcuda_rt_c.so");
    let (ok, text) = python_in(WHICH, &l.py(), &env).unwrap();
    assert!(ok, "{text}");
    assert_eq!(picked(&text), cargo);
    // Beside the module comes first of all (where a wheel puts it).
    let beside = l.put_library("py/libcuda_rt_c.so");
    let (ok, text) = python_in(WHICH, &l.py(), &env).unwrap();
    assert!(ok, "{text}");
    assert_eq!(picked(&text), beside);
}

#[test]
fn a_wrong_cuda_rt_c_lib_says_what_it_tried_and_a_folder_is_searched() {
    let Some(l) = Layout::new() else { return };
    let missing = l.tmp.path().join("nowhere/libcuda_rt_c.so");
    let (ok, text) = python_in(
        WHICH,
        &l.py(),
        &[("CUDA_RT_C_LIB", Some(missing.as_os_str()))],
    )
    .unwrap();
    assert!(!ok, "{text}");
    assert!(
        text.contains("FileNotFoundError: CUDA_RT_C_LIB=")
            && text.contains(&missing.display().to_string()),
        "{text}"
    );
    // A file that is no library: the loader's complaint, with the path and the variable,
    // as an OSError of the module's (not a bare ctypes error).
    let bogus = l.py().join("cuda_rt_alloc.py");
    let (ok, text) = python_in(
        WHICH,
        &l.py(),
        &[("CUDA_RT_C_LIB", Some(bogus.as_os_str()))],
    )
    .unwrap();
    assert!(!ok, "{text}");
    assert!(
        text.contains(&format!(
            "OSError: {} (CUDA_RT_C_LIB) could not be loaded as libcuda_rt_c.so",
            bogus.display()
        )),
        "{text}"
    );
    // A folder holding the library.
    let lib = l.put_library("libs/libcuda_rt_c.so");
    let folder = lib.parent().unwrap();
    let (ok, text) = python_in(
        WHICH,
        &l.py(),
        &[("CUDA_RT_C_LIB", Some(folder.as_os_str()))],
    )
    .unwrap();
    assert!(ok, "{text}");
    assert_eq!(picked(&text), lib);
}

/// A stand-in `torch` package: `CUDAPluggableAllocator` records the setters called,
/// `_allocator` has those of `setters`, and `change_current_allocator` remembers.
fn fake_torch(dir: &Path, version: &str, setters: &[&str]) {
    let pkg = dir.join("torch");
    std::fs::create_dir_all(pkg.join("cuda")).unwrap();
    let methods: String = setters
        .iter()
        .map(|s| format!("    def {s}(self, address):\n        SET.append(({s:?}, address))\n"))
        .collect();
    std::fs::write(
        pkg.join("__init__.py"),
        format!("__version__ = {version:?}\nfrom . import cuda\n"),
    )
    .unwrap();
    std::fs::write(pkg.join("cuda/__init__.py"), "from . import memory\n").unwrap();
    std::fs::write(
        pkg.join("cuda/memory.py"),
        format!(
            "SET = []\nCURRENT = []\n\nclass Hooks:\n{methods}    pass\n\n\
             class CUDAPluggableAllocator:\n    def __init__(self, path, alloc, free):\n        \
             self.args = (path, alloc, free)\n        self._allocator = Hooks()\n\n\
             def change_current_allocator(a):\n    CURRENT.append(a)\n"
        ),
    )
    .unwrap();
}

#[test]
fn install_torch_reports_what_it_installed_and_warns_for_what_it_skipped() {
    let Some(l) = Layout::new() else { return };
    let lib = shim().into_os_string();
    let env = [("CUDA_RT_C_LIB", Some(lib.as_os_str()))];
    let all = [
        "set_begin_allocate_to_pool",
        "set_end_allocate_to_pool_fn",
        "set_release_pool",
        "set_reset_fn",
        "set_memory_fraction_fn",
        "set_record_stream_fn",
    ];
    // A torch with every setter: all installed, no warning.
    let t1 = l.tmp.path().join("t1");
    fake_torch(&t1, "2.5.1+cu124", &all);
    let code = format!(
        r#"
import sys, warnings
sys.path.insert(0, {t1:?})
import cuda_rt_alloc as c, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = c.install_torch()
assert not w, [str(x.message) for x in w]
assert r.installed == ["CUDA-graph private pools", "torch.cuda.empty_cache()",
                       "torch.cuda.set_per_process_memory_fraction()",
                       "Tensor.record_stream()"], r.installed
assert r.skipped == {{}}, r.skipped
assert [s for s, _ in torch.cuda.memory.SET] == {all:?}
assert all(a for _, a in torch.cuda.memory.SET)
assert torch.cuda.memory.CURRENT == [r.allocator]
assert r.allocator.args[1:] == ("curt_torch_alloc", "curt_torch_free")
print(r)
"#,
        t1 = t1.display().to_string(),
        all = all,
    );
    let (ok, text) = python_in(&code, &l.py(), &env).unwrap();
    assert!(ok, "{text}");
    assert!(
        text.contains("hooks installed: CUDA-graph private pools"),
        "{text}"
    );
    // An older torch: no graph-pool setters (and only one of three is no better): the
    // trio is skipped together, with the reason and the version it needs, as a warning.
    let t2 = l.tmp.path().join("t2");
    fake_torch(
        &t2,
        "2.1.0",
        &[
            "set_release_pool",
            "set_reset_fn",
            "set_memory_fraction_fn",
            "set_record_stream_fn",
        ],
    );
    let code = format!(
        r#"
import sys, warnings
sys.path.insert(0, {t2:?})
import cuda_rt_alloc as c, torch
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    r = c.install_torch()
assert len(w) == 1 and issubclass(w[0].category, RuntimeWarning), [str(x.message) for x in w]
msg = str(w[0].message)
assert "CUDA-graph private pools not installed" in msg, msg
assert "has no set_begin_allocate_to_pool" in msg and "torch 2.3 or newer" in msg, msg
assert list(r.skipped) == ["CUDA-graph private pools"], r.skipped
assert "set_release_pool" not in [s for s, _ in torch.cuda.memory.SET]
assert len(r.installed) == 3, r.installed
print(r)
"#,
        t2 = t2.display().to_string(),
    );
    let (ok, text) = python_in(&code, &l.py(), &env).unwrap();
    assert!(ok, "{text}");
    assert!(
        text.contains("skipped: CUDA-graph private pools (torch 2.1.0 has no"),
        "{text}"
    );
    // A torch before CUDAPluggableAllocator: refused, saying which version is needed.
    let t3 = l.tmp.path().join("t3");
    fake_torch(&t3, "1.13.1", &all);
    let code = format!(
        r#"
import sys
sys.path.insert(0, {t3:?})
import cuda_rt_alloc as c, torch
try:
    c.install_torch()
except RuntimeError as e:
    assert "needs torch 2.0 or newer" in str(e) and "1.13.1" in str(e), e
    assert torch.cuda.memory.CURRENT == []
    print("refused")
"#,
        t3 = t3.display().to_string(),
    );
    let (ok, text) = python_in(&code, &l.py(), &env).unwrap();
    assert!(ok && text.contains("refused"), "{text}");
}
