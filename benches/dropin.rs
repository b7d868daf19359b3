//! Host cost of every door to a cached allocation, each beside the Rust pool's untyped
//! pair measured in the same run (its `raw`, so the ratio is the door's cost over the
//! pool's): the caching pool's `MemoryPool::malloc` + drop pair (the reference),
//! `cuda_rt::memory::alloc` + drop, a typed `DeviceBuffer::<f32>::empty` + drop, and
//! the C entry points `curt_malloc` + `curt_free` (on the current stream, and on a
//! stream handle: `curt_stream_wrap` of the per-thread default stream),
//! `curt_malloc_ptr` + `curt_free`, `curt_alloc` + `curt_free` (the current allocator),
//! `curt_dropin_alloc` + `curt_cupy_free`, `curt_torch_alloc` +
//! `curt_torch_free` and `curt_cupy_malloc` + `curt_cupy_free` (what PyTorch and CuPy
//! call per tensor), all of a cached 1 MiB; and the pinned pool's C pair
//! `curt_pinned_malloc` + `curt_pinned_free` beside `PinnedMemoryPool::malloc` + drop.
//! `cargo bench --bench dropin -- [all|alloc|typed|cmalloc|cmallocstream|cmallocptr|calloc|dropinalloc|torch|cupy|pool|pinned|cpinned] N`: `all`
//! (the default, what the GPU runner's `--bench` gets) prints every pair; one name
//! runs that pair alone, for instruction counts under `valgrind --tool=callgrind`
//! with a fake driver (`CUDA_RT_LIBCUDA`). Without a GPU (or fake driver) it prints a
//! skip line.

use std::hint::black_box;
use std::time::Instant;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt_c::{
    curt_alloc, curt_cupy_free, curt_cupy_malloc, curt_dropin_alloc, curt_free, curt_malloc,
    curt_malloc_ptr, curt_memory_t, curt_pinned_free, curt_pinned_malloc, curt_pinned_t,
    curt_stream_t, curt_stream_wrap, curt_torch_alloc, curt_torch_free,
};

#[path = "../cuda-rt/benches/common/mod.rs"]
mod common;
use common::{Figure, Report};

const SIZE: usize = 1 << 20;

fn pool_pairs(n: usize) {
    let pool = cuda_rt::get_default_memory_pool();
    for _ in 0..n {
        drop(black_box(pool.malloc(black_box(SIZE)).unwrap()));
    }
}

fn alloc_pairs(n: usize) {
    for _ in 0..n {
        drop(black_box(cuda_rt::alloc(black_box(SIZE)).unwrap()));
    }
}

fn typed_pairs(n: usize) {
    for _ in 0..n {
        let b = DeviceBuffer::<f32>::empty(black_box(SIZE / 4)).unwrap();
        drop(black_box(b));
    }
}

fn cmalloc_pairs(n: usize) {
    for _ in 0..n {
        let mut m: curt_memory_t = std::ptr::null_mut();
        // SAFETY: NULL is the current stream; `m` is a valid out pointer.
        let rc = unsafe { curt_malloc(black_box(SIZE), std::ptr::null_mut(), &mut m) };
        assert_eq!(rc, 0);
        assert_eq!(curt_free(black_box(m)), 0);
    }
}

/// A stream handle for the `cmallocstream` door: the per-thread default stream
/// (`CU_STREAM_PER_THREAD`) of the current device, wrapped once per thread.
fn stream_handle() -> curt_stream_t {
    thread_local! {
        static HANDLE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }
    HANDLE.with(|h| {
        if h.get() == 0 {
            let mut s: curt_stream_t = std::ptr::null_mut();
            // SAFETY: CU_STREAM_PER_THREAD is a live stream for the process's life;
            // `s` is a valid out pointer.
            let rc = unsafe { curt_stream_wrap(2 as *mut _, -1, &mut s) };
            assert_eq!(rc, 0);
            h.set(s as usize);
        }
        h.get() as curt_stream_t
    })
}

fn cmallocstream_pairs(n: usize) {
    let stream = stream_handle();
    for _ in 0..n {
        let mut m: curt_memory_t = std::ptr::null_mut();
        // SAFETY: a live stream handle; `m` is a valid out pointer.
        let rc = unsafe { curt_malloc(black_box(SIZE), black_box(stream), &mut m) };
        assert_eq!(rc, 0);
        assert_eq!(curt_free(black_box(m)), 0);
    }
}

fn cmallocptr_pairs(n: usize) {
    for _ in 0..n {
        let mut m: curt_memory_t = std::ptr::null_mut();
        let mut p = 0u64;
        // SAFETY: NULL is the current stream; `m` and `p` are valid out pointers.
        let rc = unsafe { curt_malloc_ptr(black_box(SIZE), std::ptr::null_mut(), &mut m, &mut p) };
        assert_eq!(rc, 0);
        black_box(p);
        assert_eq!(curt_free(black_box(m)), 0);
    }
}

fn calloc_pairs(n: usize) {
    for _ in 0..n {
        let mut m: curt_memory_t = std::ptr::null_mut();
        // SAFETY: `m` is a valid out pointer.
        let rc = unsafe { curt_alloc(black_box(SIZE), &mut m) };
        assert_eq!(rc, 0);
        assert_eq!(curt_free(black_box(m)), 0);
    }
}

fn dropin_pairs(n: usize) {
    for _ in 0..n {
        // SAFETY: the legacy default stream (0) of device 0.
        let p = unsafe { curt_dropin_alloc(black_box(SIZE), 0, std::ptr::null_mut()) };
        assert!(!p.is_null());
        // SAFETY: `p` came from curt_dropin_alloc and is freed once.
        unsafe { curt_cupy_free(std::ptr::null_mut(), black_box(p), 0) };
    }
}

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

fn pinned_pairs(n: usize) {
    let pool = cuda_rt::get_default_pinned_memory_pool();
    for _ in 0..n {
        drop(black_box(pool.malloc(black_box(SIZE)).unwrap()));
    }
}

fn cpinned_pairs(n: usize) {
    for _ in 0..n {
        let mut m: curt_pinned_t = std::ptr::null_mut();
        // SAFETY: `m` is a valid out pointer.
        let rc = unsafe { curt_pinned_malloc(black_box(SIZE), &mut m) };
        assert_eq!(rc, 0);
        assert_eq!(curt_pinned_free(black_box(m)), 0);
    }
}

/// Nanoseconds per pair of one batch of `n`.
fn batch(f: fn(usize), n: usize) -> f64 {
    let t = Instant::now();
    f(n);
    t.elapsed().as_nanos() as f64 / n as f64
}

/// A door: its argument, its name in the JSON lines, its pairs and its goal.
type Door = (&'static str, &'static str, fn(usize), &'static str);

/// The doors and their goals (ratio to the pool's pair).
const DOORS: [Door; 9] = [
    ("alloc", "alloc_drop_pair", alloc_pairs, "ratio <= 1.05"),
    (
        "typed",
        "device_buffer_empty_drop_pair",
        typed_pairs,
        "ratio <= 1.05",
    ),
    (
        "cmalloc",
        "curt_malloc_free_pair",
        cmalloc_pairs,
        "ratio <= 1.5",
    ),
    (
        "cmallocstream",
        "curt_malloc_stream_free_pair",
        cmallocstream_pairs,
        "ratio <= 1.5",
    ),
    (
        "cmallocptr",
        "curt_malloc_ptr_free_pair",
        cmallocptr_pairs,
        "ratio <= 1.5",
    ),
    (
        "calloc",
        "curt_alloc_free_pair",
        calloc_pairs,
        "ratio <= 1.5",
    ),
    (
        "dropinalloc",
        "curt_dropin_alloc_free_pair",
        dropin_pairs,
        "ratio <= 1.5",
    ),
    (
        "torch",
        "curt_torch_alloc_free_pair",
        torch_pairs,
        "ratio <= 1.5",
    ),
    (
        "cupy",
        "curt_cupy_malloc_free_pair",
        cupy_pairs,
        "ratio <= 1.5",
    ),
];

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
    // One door alone, for instruction counts: a warm-up, then `n` pairs, nothing else.
    let pool_door: Door = ("pool", "pool_malloc_free_pair", pool_pairs, "");
    let pinned_doors: [Door; 2] = [
        ("pinned", "pinned_pool_malloc_free_pair", pinned_pairs, ""),
        ("cpinned", "curt_pinned_malloc_free_pair", cpinned_pairs, ""),
    ];
    if let Some(&(_, name, f, _)) = DOORS
        .iter()
        .chain([&pool_door])
        .chain(&pinned_doors)
        .find(|d| d.0 == what)
    {
        f(1000);
        let ns = batch(f, n);
        let mut report = Report::new(format!("`{what}` alone ({n} pairs of 1 MiB)"));
        report.push(Figure::new(name, ns, "ns").size(SIZE).note("per pair"));
        report.finish();
        return;
    }
    let mut report = Report::new(format!(
        "every door to a cached 1 MiB ({n} pairs a batch, host time, ratio to the \
         pool's malloc + drop pair measured interleaved)"
    ));
    // The reference alone: a median of batches.
    pool_pairs(1000);
    let pool = common::median((0..5).map(|_| batch(pool_pairs, n)).collect());
    report.push(
        Figure::new("pool_malloc_free_pair", pool, "ns")
            .size(SIZE)
            .note("MemoryPool::malloc + drop, per pair"),
    );
    for (_, name, f, target) in DOORS {
        // Interleaved with the pool's pair, so both see the same machine state.
        let (ours, raw) = common::interleaved(5, || batch(f, n), || batch(pool_pairs, n));
        report.push(
            Figure::new(name, ours, "ns")
                .size(SIZE)
                .raw(raw, "pool_malloc_free_pair")
                .target(target)
                .note("per pair"),
        );
    }
    // The pinned pool's C door, against the Rust pinned pool's own pair.
    pinned_pairs(1000);
    cpinned_pairs(1000);
    let (ours, raw) = common::interleaved(5, || batch(cpinned_pairs, n), || batch(pinned_pairs, n));
    report.push(
        Figure::new("curt_pinned_malloc_free_pair", ours, "ns")
            .size(SIZE)
            .raw(raw, "pinned_pool_malloc_free_pair")
            .target("ratio <= 1.5")
            .note("per pair; the reference is PinnedMemoryPool::malloc + drop"),
    );
    report.finish();
}
