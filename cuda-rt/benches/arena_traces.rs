//! Host-only benches of the pool algorithm (`memory::arena`) over the fake backend:
//! cached malloc+free pairs, multi-thread scaling, and three allocation traces (A, B
//! and the serving trace S whose batch size drifts), each with the plain pool, the
//! release-on-miss policy and expandable segments (simulated by the fake backend:
//! 2 MiB granules, 64 GiB of address space per segment).
//! Prints one JSON object per line, then a table (the shared reporter of `common`);
//! `ARENA_BENCH_QUICK=1` runs a tenth of the iterations. `cargo bench --bench
//! arena_traces`. Needs no GPU.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Instant;

use cuda_rt::memory::arena::{Backend, Block, FakeBackend, Pool, SegmentSpec};

mod common;
use common::{Figure, Report};

#[path = "common/traces.rs"]
mod traces;
use traces::{trace_a, trace_b, trace_serving, Op};

fn quick() -> bool {
    std::env::var_os("ARENA_BENCH_QUICK").is_some()
}

/// Best of 5 rounds of `n` iterations of `f`, in ns per iteration.
fn time_ns(n: u64, mut f: impl FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / n as f64);
    }
    best
}

/// The fake backend with expandable segments as the benches use them.
fn segmented() -> FakeBackend {
    FakeBackend::new().with_segments(SegmentSpec {
        granularity: 2 << 20,
        reserve: 64 << 30,
    })
}

/// The cached pair on a pool with expandable segments on: the same path as without.
fn pair_cached_expandable(report: &mut Report, size: usize) {
    let n = if quick() { 200_000 } else { 2_000_000 };
    let pool = Pool::new(segmented());
    pool.set_expandable_segments(true);
    pool.free(pool.malloc(size, 1).unwrap()).unwrap();
    let ns = time_ns(n, || {
        let b = pool.malloc(black_box(size), 1).unwrap();
        black_box(b.addr());
        pool.free(b).unwrap();
    });
    report.push(Figure::new("arena_pair_cached_expandable", ns, "ns").size(size as u64));
}

fn pair_cached(report: &mut Report, size: usize) {
    let n = if quick() { 200_000 } else { 2_000_000 };
    let pool = Pool::new(FakeBackend::new());
    pool.free(pool.malloc(size, 1).unwrap()).unwrap();
    let ns = time_ns(n, || {
        let b = pool.malloc(black_box(size), 1).unwrap();
        black_box(b.addr());
        pool.free(b).unwrap();
    });
    let fake = FakeBackend::new();
    let raw_fake = time_ns(n, || {
        let a = fake.alloc(black_box(size)).unwrap();
        fake.free(black_box(a), size);
    });
    let layout = std::alloc::Layout::from_size_align(size, 512).unwrap();
    let raw_sys = time_ns(n / 20, || {
        // SAFETY: non-zero size, freed with the same layout.
        unsafe {
            let p = std::alloc::alloc(black_box(layout));
            assert!(!p.is_null());
            std::alloc::dealloc(black_box(p), layout);
        }
    });
    let s = pool.stats();
    assert_eq!(
        s.backend_allocs, 1,
        "a cached pair must not reach the backend"
    );
    report.push(
        Figure::new("arena_pair_cached", ns, "ns")
            .size(size as u64)
            .raw(raw_sys, "std_alloc_align512_pair")
            .note(format!("fake backend pair {raw_fake:.1} ns")),
    );
}

fn scaling(report: &mut Report) {
    let size = 1 << 20;
    let per_thread: u64 = if quick() { 100_000 } else { 1_000_000 };
    let mut single = 0.0;
    for threads in [1usize, 2, 4, 8, 16] {
        let rate = run_threads(threads, per_thread, size, true);
        let alone = run_threads(threads, per_thread, size, false);
        if threads == 1 {
            single = rate;
        }
        report.push(
            Figure::new(format!("arena_scaling_{threads}_threads"), rate, "pairs/s")
                .size(size as u64)
                .raw(alone, "one_pool_per_thread")
                .note(format!("{:.2}x one thread", rate / single)),
        );
    }
}

/// Aggregate pairs/s of `threads` threads on their own keys, of one shared pool
/// (`shared`) or of a pool each (the no-sharing reference).
fn run_threads(threads: usize, per_thread: u64, size: usize, shared: bool) -> f64 {
    let pool = Arc::new(Pool::new(FakeBackend::new()));
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let pool = if shared {
                pool.clone()
            } else {
                Arc::new(Pool::new(FakeBackend::new()))
            };
            let barrier = barrier.clone();
            std::thread::spawn(move || {
                let key = 100 + t as u64;
                pool.free(pool.malloc(size, key).unwrap()).unwrap();
                barrier.wait();
                let start = Instant::now();
                for _ in 0..per_thread {
                    let b = pool.malloc(black_box(size), key).unwrap();
                    black_box(b.addr());
                    pool.free(b).unwrap();
                }
                (start, Instant::now())
            })
        })
        .collect();
    // Wall time from the first thread's start to the last thread's end: each thread
    // stamps its own, so a main thread waiting for a core cannot skew it.
    let spans: Vec<(Instant, Instant)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let start = spans.iter().map(|s| s.0).min().unwrap();
    let end = spans.iter().map(|s| s.1).max().unwrap();
    (threads as u64 * per_thread) as f64 / (end - start).as_secs_f64()
}

/// Runs `ops` on a fresh pool; returns (ns per op, peak reserved, stats line).
fn run_trace(ops: &[Op], release_on_miss: bool, expandable: bool) -> (f64, u64, String) {
    let mut best = f64::MAX;
    let mut peak_reserved = 0;
    let mut note = String::new();
    for _ in 0..3 {
        let pool = Pool::new(if expandable {
            segmented()
        } else {
            FakeBackend::new()
        });
        pool.set_release_on_miss(release_on_miss);
        pool.set_expandable_segments(expandable);
        let mut live: Vec<Block> = Vec::with_capacity(4096);
        let t = Instant::now();
        for op in ops {
            match *op {
                Op::Alloc(s) => live.push(pool.malloc(s, 7).unwrap()),
                Op::Free(i) => pool.free(live.swap_remove(i)).unwrap(),
            }
        }
        let ns = t.elapsed().as_nanos() as f64 / ops.len() as f64;
        let s = pool.stats();
        best = best.min(ns);
        peak_reserved = s.peak_total_bytes;
        note = format!(
            "hits {} misses {} backend allocs {} frees {} holes punched {}",
            s.cache_hits, s.cache_misses, s.backend_allocs, s.backend_frees, s.holes_punched
        );
        for b in live.drain(..) {
            pool.free(b).unwrap();
        }
        pool.check().unwrap();
    }
    (best, peak_reserved, note)
}

fn traces(report: &mut Report) {
    let n = 200_000;
    for (name, (ops, peak_live)) in [
        ("trace_a", trace_a(n, 42)),
        ("trace_b", trace_b(n, 42)),
        ("trace_serving", trace_serving(n, 42)),
    ] {
        for (policy, release, expandable) in [
            ("", false, false),
            ("_release_on_miss", true, false),
            ("_expandable", false, true),
        ] {
            let (ns, peak_reserved, note) = run_trace(&ops, release, expandable);
            report.push(
                Figure::new(format!("arena_{name}{policy}"), ns, "ns")
                    .size(ops.len() as u64)
                    .note(note.clone()),
            );
            report.push(
                Figure::new(
                    format!("arena_{name}{policy}_reserved_over_live"),
                    peak_reserved as f64 / peak_live as f64,
                    "ratio",
                )
                .size(ops.len() as u64)
                .note(format!(
                    "peak reserved {:.2} GiB, peak live {:.2} GiB",
                    peak_reserved as f64 / (1u64 << 30) as f64,
                    peak_live as f64 / (1u64 << 30) as f64
                )),
            );
        }
    }
}

fn main() {
    // `cargo bench` passes `--bench`; accept and ignore arguments.
    let mut report = Report::new("the pool algorithm over the fake backend (host only)");
    for size in [256, 1 << 20, 64 << 20] {
        pair_cached(&mut report, size);
    }
    pair_cached_expandable(&mut report, 1 << 20);
    scaling(&mut report);
    traces(&mut report);
    report.finish();
}
