//! The Python module `python/cuda_rt_alloc.py` against the built shim: it loads the
//! library, reads statistics and snapshots, and says clearly when torch or CuPy is
//! missing. Skips with a printed reason where `python3` or the module is absent.

use std::process::Command;

mod support;
use support::{python_dir, shim};

fn python(code: &str) -> Option<(bool, String)> {
    let dir = python_dir();
    if !dir.join("cuda_rt_alloc.py").is_file() {
        eprintln!("skipped: {} has no cuda_rt_alloc.py", dir.display());
        return None;
    }
    let out = match Command::new("python3")
        .arg("-c")
        .arg(code)
        .env("PYTHONPATH", dir)
        .env("CUDA_RT_C_LIB", shim())
        .output()
    {
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
s = c.stats(0)
assert set(s) == {"used_bytes", "total_bytes", "free_bytes", "n_free_blocks",
                  "peak_used_bytes", "peak_total_bytes", "mallocs", "frees",
                  "cache_hits", "cache_misses", "backend_allocs", "backend_frees",
                  "graph_pools_bytes"}, s
snap = c.snapshot(0)
assert "segments" in snap and "device_traces" in snap, snap
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
