//! Host cost of the drop-in entry points that PyTorch and CuPy call per tensor:
//! `curt_torch_alloc` + `curt_torch_free` and `curt_cupy_malloc` + `curt_cupy_free`
//! pairs of a cached size, beside the caching pool's own `malloc` + drop pair in the
//! same run (the floor the entry points add their registry and stream handling to).
//! `cargo bench --bench dropin -- [all|torch|cupy|pool] N`; for instruction counts run
//! the binary under `valgrind --tool=callgrind` with a fake driver
//! (`CUDA_RT_LIBCUDA`). Without a GPU (or fake driver) it prints a skip line.

use std::hint::black_box;
use std::time::Instant;

use cuda_rt_c::{curt_cupy_free, curt_cupy_malloc, curt_torch_alloc, curt_torch_free};

#[path = "../cuda-rt/benches/common/mod.rs"]
mod common;
use common::{Figure, Report};

const SIZE: usize = 1 << 20;

fn torch_pairs(n: usize) {
    for _ in 0..n {
        // SAFETY: the legacy default stream (0) of device 0.
        let p = unsafe { curt_torch_alloc(black_box(SIZE as isize), 0, std::ptr::null_mut()) };
        assert!(!p.is_null());
        // SAFETY: `p` came from curt_torch_alloc and is freed once.
        unsafe { curt_torch_free(black_box(p), SIZE as isize, 0, std::ptr::null_mut()) };
    }
}

fn cupy_pairs(n: usize) {
    for _ in 0..n {
        // SAFETY: no parameter is used.
        let p = unsafe { curt_cupy_malloc(std::ptr::null_mut(), black_box(SIZE), 0) };
        assert!(!p.is_null());
        // SAFETY: `p` came from curt_cupy_malloc and is freed once.
        unsafe { curt_cupy_free(std::ptr::null_mut(), black_box(p), 0) };
    }
}

fn pool_pairs(n: usize) {
    let pool = cuda_rt::get_default_memory_pool();
    for _ in 0..n {
        drop(black_box(pool.malloc(black_box(SIZE)).unwrap()));
    }
}

fn time(f: fn(usize), n: usize) -> f64 {
    f(1000); // warm: the size cached, the registry's tables grown
    common::median(
        (0..5)
            .map(|_| {
                let t = Instant::now();
                f(n);
                t.elapsed().as_nanos() as f64 / n as f64
            })
            .collect(),
    )
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let what = args.first().cloned().unwrap_or_else(|| "all".into());
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    if !common::gpu_or_skip("dropin") {
        return;
    }
    if let Err(e) = cuda_rt::device::set_device_id(0) {
        common::skip("dropin", &format!("device 0: {e}"));
        return;
    }
    let mut report = Report::new(format!(
        "drop-in allocator entry points ({n} pairs of 1 MiB, host time)"
    ));
    let pool = matches!(what.as_str(), "all" | "pool").then(|| time(pool_pairs, n));
    if let Some(ns) = pool {
        report.push(Figure::new("pool malloc + drop", ns, "ns").note("per pair"));
    }
    for (name, f) in [("torch", torch_pairs as fn(usize)), ("cupy", cupy_pairs)] {
        if what == "all" || what == name {
            let ns = time(f, n);
            let mut fig = Figure::new(format!("{name} alloc + free"), ns, "ns").note("per pair");
            if let Some(p) = pool {
                fig = fig.note(format!("{:.2}x the pool's pair", ns / p));
            }
            report.push(fig);
        }
    }
    report.finish();
}
