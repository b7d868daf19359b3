//! Host-side cost of cuda-rt's hot paths, for instruction counting against a fake
//! driver (`CUDA_RT_LIBCUDA=/path/to/fake/libcuda.so.1`): `malloc_async` + free pairs,
//! the same through the raw entry points, caching pool (`MemoryPool`) malloc + drop
//! pairs, event create + drop pairs (the event cache), pinned pool malloc + free pairs,
//! kernel launches of a one-`int` kernel on the current stream (`launch`:
//! `Function::launch`; `launch_raw`: a bare `cuLaunchKernel` of the same kernel);
//! `lock` times an uncontended lock + unlock (a compare-exchange and a release store),
//! the host's cost of one locked instruction, with no driver at all; `disk_lookup`
//! times a new process's first kernel from a warm disk cache without the module load
//! (a fresh `KernelCache` per iteration, `compile` answered from disk: the folder's
//! check, the key, the entry's read and its checksum; needs NVRTC once to fill the cache),
//! and reports the median of the iterations rather than their mean; `disk_first_use`
//! the same with the module loaded (`RawModule::from_program`); `checks` times, with
//! no driver, each piece a warm disk lookup is made of on this host (the `geteuid`,
//! `statx` and file calls of its trust checks, and the entry's XXH3-128 checksum over
//! an entry of the size the H100's test cubin makes, beside the keyed BLAKE3 tag that
//! format 4 checked); `disk_phases` splits a warm disk lookup
//! into its public steps, timed in the same loop as whole lookups (alternate
//! iterations, each followed by the module's load and unload as a first use has them),
//! to tell where a lookup's time goes on the host that runs it.
//! `cargo bench -p cuda-rt-safe --bench hot_paths -- [async|raw|pool|pool_history|event|pinned|launch|launch_raw|lock|checks|disk_lookup|disk_first_use|disk_phases] N [FOLDER]`
//! times it; for instruction counts run the binary that `cargo bench --no-run` names
//! under `valgrind --tool=callgrind` with the same arguments. Prints one figure (the
//! shared reporter of `common`: a JSON line, then a table), named after the path;
//! without a GPU (or a fake driver) a skip line, exit 0.

use std::hint::black_box;
use std::time::Instant;

use cuda_rt::cuda_sys::driver as sys;

mod common;
use common::{Figure, Report};

fn main() {
    // `cargo bench` passes `--bench`: only the other arguments are ours.
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let what = args.first().cloned().unwrap_or_else(|| "async".into());
    let n: usize = args
        .get(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    if what == "lock" {
        use std::sync::atomic::{AtomicBool, Ordering};
        let l = AtomicBool::new(false);
        let t = Instant::now();
        for _ in 0..n {
            let l = black_box(&l);
            while l
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {}
            l.store(false, Ordering::Release);
        }
        let ns = t.elapsed().as_nanos() as f64 / n as f64;
        let mut report = Report::new(format!("hot path `lock` ({n} iterations)"));
        report.push(Figure::new("lock", ns, "ns").note("per lock + unlock"));
        report.finish();
        return;
    }
    if what == "checks" {
        disk_checks(n);
        return;
    }
    if !common::gpu_or_skip("hot_paths") {
        return;
    }
    if let Err(e) = cuda_rt::device::set_device_id(0) {
        common::skip("hot_paths", &format!("device 0: {e}"));
        return;
    }
    if what == "disk_phases" {
        disk_phases(n, args.get(2).map(std::path::PathBuf::from));
        return;
    }
    if what == "disk_lookup" || what == "disk_first_use" {
        disk_lookup(
            n,
            args.get(2).map(std::path::PathBuf::from),
            what == "disk_first_use",
        );
        return;
    }
    let t = Instant::now();
    match what.as_str() {
        "async" => {
            for _ in 0..n {
                let p = cuda_rt::memory::malloc_async(black_box(1 << 20)).unwrap();
                drop(black_box(p));
            }
        }
        "raw" => {
            let a = sys::api().unwrap().cuMemAllocAsync().unwrap();
            let f = sys::api().unwrap().cuMemFreeAsync().unwrap();
            for _ in 0..n {
                let mut p: sys::CUdeviceptr = 0;
                // SAFETY: valid out pointer, legacy default stream.
                let rc = unsafe { a(&mut p, black_box(1 << 20), std::ptr::null_mut()) };
                assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
                // SAFETY: freeing what was just allocated.
                let rc = unsafe { f(p, std::ptr::null_mut()) };
                assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
            }
        }
        "pool" => {
            // The default pool, as benches/pool.rs measures it.
            let pool = cuda_rt::memory::get_default_memory_pool();
            drop(pool.malloc(1 << 20).unwrap());
            for _ in 0..n {
                let p = pool.malloc(black_box(1 << 20)).unwrap();
                drop(black_box(p));
            }
        }
        "pool_history" => {
            // The same with allocation history recorded (a `HistoryHook` registered on
            // this thread): what recording costs when on; off, no hook is registered.
            let hook = cuda_rt::memory::history::HistoryHook::new(4096);
            let _guard =
                cuda_rt::memory::hook::register_hook("history", std::rc::Rc::new(hook)).unwrap();
            let pool = cuda_rt::memory::get_default_memory_pool();
            drop(pool.malloc(1 << 20).unwrap());
            for _ in 0..n {
                let p = pool.malloc(black_box(1 << 20)).unwrap();
                drop(black_box(p));
            }
        }
        "launch" => {
            let (f, a, cfg) = launch_setup();
            for _ in 0..n {
                // SAFETY: k(int) gets one int and touches no memory.
                unsafe { f.launch(&cfg, &[black_box(&a)]) }.unwrap();
            }
            cuda_rt::synchronize().unwrap();
        }
        "launch_raw" => {
            let (f, mut a, _) = launch_setup();
            let launch = sys::api().unwrap().cuLaunchKernel().unwrap();
            for _ in 0..n {
                let mut p = [black_box(&mut a) as *mut i32 as *mut std::ffi::c_void];
                // SAFETY: k takes one int and `p` points to one; the legacy default
                // stream; the module is loaded while `f` lives.
                let rc = unsafe {
                    launch(
                        f.as_raw(),
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        std::ptr::null_mut(),
                        p.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
            }
            cuda_rt::synchronize().unwrap();
        }
        "event" => {
            drop(cuda_rt::event::Event::new(false, true, false).unwrap());
            for _ in 0..n {
                let e = cuda_rt::event::Event::new(false, black_box(true), false).unwrap();
                drop(black_box(e));
            }
        }
        _ => {
            let pool = cuda_rt::pinned::PinnedMemoryPool::new();
            drop(pool.malloc(1 << 20).unwrap());
            for _ in 0..n {
                let b = pool.malloc(black_box(1 << 20)).unwrap();
                drop(black_box(b));
            }
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    let mut report = Report::new(format!("hot path `{what}` ({n} iterations, host time)"));
    let per = if what.starts_with("launch") {
        "per launch"
    } else {
        "per pair"
    };
    report.push(Figure::new(what, ns, "ns").note(per));
    report.finish();
}

/// The pieces of a warm disk lookup, `n` times each (mean per call): the syscalls of
/// the trust checks (`geteuid`; `statx` of a folder and, not followed, of a file; an
/// entry's open + `fstat` + read + close) and the entry's checksum over 5196 bytes,
/// beside keyed BLAKE3 (format 4's tag) over 5196, 4096 and 8192 bytes.
fn disk_checks(n: usize) {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = std::env::temp_dir().join(format!("cuda-rt-hot-checks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let entry = dir.join("entry");
    std::fs::write(&entry, vec![7u8; 5196]).unwrap();
    let per = |t: Instant| t.elapsed().as_nanos() as f64 / 1e3 / n as f64;
    let mut report = Report::new(format!("hot path `checks` ({n} iterations, host time)"));
    let t = Instant::now();
    for _ in 0..n {
        // SAFETY: geteuid has no preconditions.
        black_box(unsafe { libc::geteuid() });
    }
    report.push(Figure::new("geteuid", per(t), "us"));
    let t = Instant::now();
    for _ in 0..n {
        black_box(std::fs::metadata(&dir).unwrap());
    }
    report.push(Figure::new("statx_folder", per(t), "us"));
    let t = Instant::now();
    for _ in 0..n {
        black_box(std::fs::symlink_metadata(&entry).unwrap());
    }
    report.push(Figure::new("statx_file_nofollow", per(t), "us"));
    let mut buf = Vec::with_capacity(8192);
    let t = Instant::now();
    for _ in 0..n {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(&entry)
            .unwrap();
        let len = f.metadata().unwrap().len() as usize;
        buf.clear();
        buf.resize(len, 0);
        f.read_exact(&mut buf).unwrap();
        black_box(&buf);
    }
    report.push(Figure::new("open_fstat_read_close", per(t), "us").note("an entry of 5196 bytes"));
    let data = vec![5u8; 5196];
    let t = Instant::now();
    for _ in 0..n {
        black_box(cuda_rt::compiler::cache::checksum(black_box(&data)));
    }
    report.push(
        Figure::new("checksum_5196_bytes", per(t), "us").note("XXH3-128, as a lookup checks it"),
    );
    let key = [3u8; 32];
    for bytes in [5196usize, 4096, 8192] {
        let data = vec![5u8; bytes];
        let t = Instant::now();
        for _ in 0..n {
            black_box(blake3::keyed_hash(&key, black_box(&data)));
        }
        report.push(Figure::new(
            format!("bare_blake3_{bytes}_bytes"),
            per(t),
            "us",
        ));
    }
    let _ = std::fs::remove_dir_all(&dir);
    report.finish();
}

/// The program the disk modes look up: a kept folder filled by one of them serves all.
const DISK_SRC: &str = r#"
extern "C" __global__ void empty1(int a) {}
extern "C" __global__ void empty6(float* x, float* y, float* z, int n, float a, double b) {}
"#;

/// The disk modes' folder: the `kept` one, else a temporary one named for `what`.
fn disk_folder(kept: &Option<std::path::PathBuf>, what: &str) -> std::path::PathBuf {
    kept.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("cuda-rt-hot-{what}-{}", std::process::id()))
    })
}

/// `n` warm disk lookups, each by a fresh cache over one folder (what a new process
/// does), as `benches/launch.rs`'s `warm_disk_lookup_only` measures them: the median.
/// The folder is `kept` when given (filled by an earlier run, so that a run under
/// callgrind needs no compile), else a temporary one.
/// With `load`, each iteration is a whole first use (`RawModule::from_program`: the
/// lookup, the module's load and the cache's bookkeeping), as `benches/launch.rs`'s
/// `raw_module_warm_disk_first_use` measures it; under the fake driver the load itself
/// costs next to nothing, so the figure is cuda-rt's own share of a first use.
fn disk_lookup(n: usize, kept: Option<std::path::PathBuf>, load: bool) {
    use cuda_rt::compiler::{KernelCache, Output, Program, Target};
    let dir = disk_folder(&kept, "disk");
    let program = Program::new(DISK_SRC);
    let warm = KernelCache::new(Some(dir.clone()));
    // With a folder filled before, the process's first lookup is a new process's first
    // kernel: it also pays what is done once per process (the NVRTC facts, the
    // toolkit's include folders and their stamp).
    // The device's architecture first, apart: it opens the driver.
    let target = match Target::for_device(0) {
        Ok(t) => t,
        Err(e) => return common::skip("hot_paths", &format!("no device architecture: {e}")),
    };
    let t = Instant::now();
    if let Err(e) = warm.compile(&program, target) {
        common::skip("hot_paths", &format!("no compile to fill the cache: {e}"));
        return;
    }
    let first = t.elapsed().as_nanos() as f64 / 1e3;
    let first_was_hit = warm.stats().disk_hits == 1;
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let fresh = KernelCache::new(Some(dir.clone()));
        let t = Instant::now();
        if load {
            let m = cuda_rt::RawModule::from_program(&program, Output::Cubin, &fresh);
            times.push(t.elapsed().as_nanos() as f64 / 1e3);
            black_box(m.unwrap());
        } else {
            let c = fresh.compile(&program, Target::for_device(0).unwrap());
            times.push(t.elapsed().as_nanos() as f64 / 1e3);
            black_box(c.unwrap());
        }
        assert_eq!(fresh.stats().disk_hits, 1, "a warm disk hit");
    }
    if kept.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let name = if load {
        "disk_first_use"
    } else {
        "disk_lookup"
    };
    let mut report = Report::new(format!("hot path `{name}` ({n} iterations, host time)"));
    report.push(
        Figure::new(name, common::median(times), "us").note(if load {
            "median; fresh cache, warm disk entry, module loaded"
        } else {
            "median; fresh cache, warm disk entry"
        }),
    );
    if first_was_hit {
        report.push(
            Figure::new("disk_lookup_first_in_process", first, "us")
                .note("one run: the process's first lookup"),
        );
    }
    report.finish();
}

/// A warm disk lookup cut into its public steps, over a folder filled by one compile
/// (`kept` when given, as in [`disk_lookup`], else a temporary one): a fresh cache's
/// folder check (`disk_dir`), the device's architecture, the NVRTC facts, the key, and
/// the entry's read, checksum and decode
/// (`load`). Even iterations time a whole lookup (`compile`), odd ones the steps; every
/// iteration then loads and unloads the module outside the timing, as a first use does,
/// so both see the same caches. Medians per step, their sum, and the whole lookup.
fn disk_phases(n: usize, kept: Option<std::path::PathBuf>) {
    use cuda_rt::compiler::cache::cache_key;
    use cuda_rt::compiler::nvrtc_facts::nvrtc_facts;
    use cuda_rt::compiler::{KernelCache, Program, Target};
    let dir = disk_folder(&kept, "phases");
    let program = Program::new(DISK_SRC);
    let target = match Target::for_device(0) {
        Ok(t) => t,
        Err(e) => return common::skip("hot_paths", &format!("no device architecture: {e}")),
    };
    let filled = KernelCache::new(Some(dir.clone())).compile(&program, target);
    let image = match filled {
        Ok(c) => c.image,
        Err(e) => return common::skip("hot_paths", &format!("no compile to fill the cache: {e}")),
    };
    let us = |t: Instant| t.elapsed().as_nanos() as f64 / 1e3;
    let names = ["checks", "target", "facts", "key", "load", "sum", "whole"];
    let mut steps: Vec<Vec<f64>> = names
        .iter()
        .map(|_| Vec::with_capacity(n / 2 + 1))
        .collect();
    for i in 0..n {
        let fresh = KernelCache::new(Some(dir.clone()));
        if i % 2 == 0 {
            let t = Instant::now();
            let c = fresh.compile(&program, Target::for_device(0).unwrap());
            steps[6].push(us(t));
            black_box(c.unwrap());
        } else {
            let t = Instant::now();
            black_box(fresh.disk_dir().expect("the folder is trusted"));
            let t1 = Instant::now();
            let target = Target::for_device(0).unwrap();
            let t2 = Instant::now();
            let version = nvrtc_facts(Some(&dir)).unwrap().version;
            let t3 = Instant::now();
            let key = cache_key(&program, target, version);
            let t4 = Instant::now();
            black_box(fresh.load(&key).expect("a warm entry"));
            let t5 = Instant::now();
            let d = |a: Instant, b: Instant| (b - a).as_nanos() as f64 / 1e3;
            for (k, v) in [
                d(t, t1),
                d(t1, t2),
                d(t2, t3),
                d(t3, t4),
                d(t4, t5),
                d(t, t5),
            ]
            .into_iter()
            .enumerate()
            {
                steps[k].push(v);
            }
        }
        assert_eq!(fresh.stats().disk_hits, 1, "a warm disk hit");
        let module = cuda_rt::Module::load_data(&image).unwrap();
        drop(black_box(module));
    }
    if kept.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    let mut report = Report::new(format!(
        "hot path `disk_phases` ({n} iterations, host time, medians)"
    ));
    for (name, times) in names.iter().zip(steps) {
        report.push(Figure::new(
            format!("disk_phase_{name}"),
            common::median(times),
            "us",
        ));
    }
    report.finish();
}

/// An empty kernel `k(int)` (PTX, loaded on the current device; the fake driver takes
/// any image), its argument and a one-block shape, launched once (the first launch
/// fetches the parameter sizes).
fn launch_setup() -> (cuda_rt::Function, i32, cuda_rt::LaunchConfig) {
    const PTX: &str = ".version 8.0\n.target sm_90\n.address_size 64\n\
                       .visible .entry k(.param .u32 a)\n{\n    ret;\n}\n";
    let module = cuda_rt::Module::load_data(PTX.as_bytes()).unwrap();
    let f = module.get_function("k").unwrap();
    let cfg = cuda_rt::LaunchConfig::new(1, 32);
    let a = 7i32;
    // SAFETY: k(int) gets one int and touches no memory.
    unsafe { f.launch(&cfg, &[&a]) }.unwrap();
    (f, a, cfg)
}
