//! Host-side cost of cuda-rt's hot paths, for instruction counting against a fake
//! driver (`CUDA_RT_LIBCUDA=/path/to/fake/libcuda.so.1`): `malloc_async` + free pairs,
//! the same through the raw entry points, caching pool (`MemoryPool`) malloc + drop
//! pairs, event create + drop pairs (the event cache), pinned pool malloc + free pairs,
//! kernel launches of a one-`int` kernel on the current stream (`launch`:
//! `Function::launch`; `launch_raw`: a bare `cuLaunchKernel` of the same kernel);
//! `lock` times an uncontended lock + unlock (a compare-exchange and a release store),
//! the host's cost of one locked instruction, with no driver at all.
//! `cargo bench -p cuda-rt-safe --bench hot_paths -- [async|raw|pool|pool_history|event|pinned|launch|launch_raw|lock] N`
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
    if !common::gpu_or_skip("hot_paths") {
        return;
    }
    if let Err(e) = cuda_rt::device::set_device_id(0) {
        common::skip("hot_paths", &format!("device 0: {e}"));
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
