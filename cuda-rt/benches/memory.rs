//! Memory figures, each paired with the raw driver call measured in the same run.
//!
//! One JSON object per line (`name`, `size`, `value`, `unit`, `raw`, `raw_name`,
//! `ratio` = our cost over raw: value / raw for times, raw / value for rates), then a
//! human-readable table (the shared reporter of `common`). Without a GPU: says why it
//! skipped and exits 0.
//!
//! `cargo bench -p cuda-rt-safe --bench memory`

use std::ffi::c_void;
use std::time::Instant;

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::memory::{alloc, malloc_async, MemoryPointer};

mod common;
use common::{Figure, Report};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn check(rc: sys::CUresult, call: &str) -> Res<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(format!("{call} failed: {rc:?}").into())
    }
}

fn sync() -> Res<()> {
    let f = sys::api()?.cuCtxSynchronize()?;
    // SAFETY: no arguments; the primary context of device 0 is current.
    check(unsafe { f() }, "cuCtxSynchronize")
}

/// Median seconds of `reps` runs of `f` after `warm` warm-up runs; synchronizes before
/// reading the clock at both ends.
fn median_secs(warm: usize, reps: usize, mut f: impl FnMut() -> Res<()>) -> Res<f64> {
    for _ in 0..warm {
        f()?;
    }
    sync()?;
    let mut t = Vec::with_capacity(reps);
    for _ in 0..reps {
        sync()?;
        let start = Instant::now();
        f()?;
        sync()?;
        t.push(start.elapsed().as_secs_f64());
    }
    t.sort_by(f64::total_cmp);
    Ok(t[t.len() / 2])
}

/// The rate figure of copying `size` bytes in `ours` seconds, raw in `raw` seconds.
fn rate(name: &'static str, size: usize, ours: f64, raw: f64, raw_name: &'static str) -> Figure {
    let (v, r) = (size as f64 / ours / 1e9, size as f64 / raw / 1e9);
    Figure::new(name, v, "GB/s").size(size).raw(r, raw_name)
}

/// Pinned host memory from cuMemHostAlloc, freed on drop.
struct Pinned {
    ptr: *mut c_void,
    len: usize,
}

impl Pinned {
    fn new(len: usize) -> Res<Pinned> {
        let f = sys::api()?.cuMemHostAlloc()?;
        let mut ptr = std::ptr::null_mut();
        // SAFETY: `ptr` is a valid out pointer; flag 0 is plain page-locked memory.
        check(unsafe { f(&mut ptr, len, 0) }, "cuMemHostAlloc")?;
        // SAFETY: `len` bytes were just allocated; writing them initialises them.
        unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 1, len) };
        Ok(Pinned { ptr, len })
    }
    fn slice(&mut self) -> &mut [u8] {
        // SAFETY: `len` initialised bytes, owned by `self`, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if let Ok(f) = sys::api().and_then(|a| a.cuMemFreeHost()) {
            // SAFETY: allocated by cuMemHostAlloc, freed once.
            let _ = unsafe { f(self.ptr) };
        }
    }
}

fn transfers(report: &mut Report) -> Res<()> {
    const N: usize = 256 << 20;
    let (warm, reps) = (2, 9);
    let d = alloc(N)?;
    let htod = sys::api()?.cuMemcpyHtoD_v2()?;
    let dtoh = sys::api()?.cuMemcpyDtoH_v2()?;

    let mut pageable = vec![1u8; N];
    let ours = median_secs(warm, reps, || Ok(d.copy_from_host(&pageable)?))?;
    let raw = median_secs(warm, reps, || {
        // SAFETY: `pageable` holds N bytes; `d` is N bytes of device memory.
        check(
            unsafe { htod(d.ptr(), pageable.as_ptr().cast(), N) },
            "cuMemcpyHtoD",
        )
    })?;
    report.push(rate("h2d_pageable", N, ours, raw, "cuMemcpyHtoD"));

    let ours = median_secs(warm, reps, || Ok(d.copy_to_host(&mut pageable)?))?;
    let raw = median_secs(warm, reps, || {
        // SAFETY: as above, device to host.
        check(
            unsafe { dtoh(pageable.as_mut_ptr().cast(), d.ptr(), N) },
            "cuMemcpyDtoH",
        )
    })?;
    report.push(rate("d2h_pageable", N, ours, raw, "cuMemcpyDtoH"));
    drop(pageable);

    let mut pinned = Pinned::new(N)?;
    let ours = median_secs(warm, reps, || Ok(d.copy_from_host(pinned.slice())?))?;
    let p = pinned.ptr;
    let raw = median_secs(warm, reps, || {
        // SAFETY: `p` is N bytes of pinned host memory alive for the whole loop.
        check(unsafe { htod(d.ptr(), p, N) }, "cuMemcpyHtoD")
    })?;
    report.push(rate("h2d_pinned", N, ours, raw, "cuMemcpyHtoD"));

    let ours = median_secs(warm, reps, || Ok(d.copy_to_host(pinned.slice())?))?;
    let raw = median_secs(warm, reps, || {
        // SAFETY: as above, device to host.
        check(unsafe { dtoh(p, d.ptr(), N) }, "cuMemcpyDtoH")
    })?;
    report.push(rate("d2h_pinned", N, ours, raw, "cuMemcpyDtoH"));
    Ok(())
}

fn d2d(report: &mut Report) -> Res<()> {
    let (free, _) = cuda_rt::Device::new(0)?.mem_info()?;
    let n: usize = if free > (9usize << 30) {
        4 << 30
    } else {
        1 << 30
    };
    let src = alloc(n)?;
    let dst = alloc(n)?;
    src.memset(3, n)?;
    let dtod = sys::api()?.cuMemcpyDtoD_v2()?;
    let ours = median_secs(2, 9, || Ok(dst.copy_from_device(&src, n)?))?;
    let raw = median_secs(2, 9, || {
        // SAFETY: both are n bytes of device memory.
        check(unsafe { dtod(dst.ptr(), src.ptr(), n) }, "cuMemcpyDtoD")
    })?;
    report.push(rate("d2d", n, ours, raw, "cuMemcpyDtoD"));
    Ok(())
}

/// Seconds `f` takes, the context synchronized before starting the clock and before
/// stopping it.
fn timed(f: &mut impl FnMut() -> Res<()>) -> Res<f64> {
    sync()?;
    let start = Instant::now();
    f()?;
    sync()?;
    Ok(start.elapsed().as_secs_f64())
}

/// Medians of `reps` interleaved runs of `ours` and `raw` after `warm` warm-up runs of
/// each: every rep runs both, alternating which goes first, so both see the same
/// pool growth / trim state and queue depth.
fn interleaved_median_secs(
    warm: usize,
    reps: usize,
    mut ours: impl FnMut() -> Res<()>,
    mut raw: impl FnMut() -> Res<()>,
) -> Res<(f64, f64)> {
    for _ in 0..warm {
        ours()?;
        raw()?;
    }
    let (mut to, mut tr) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for i in 0..reps {
        if i % 2 == 0 {
            to.push(timed(&mut ours)?);
            tr.push(timed(&mut raw)?);
        } else {
            tr.push(timed(&mut raw)?);
            to.push(timed(&mut ours)?);
        }
    }
    to.sort_by(f64::total_cmp);
    tr.sort_by(f64::total_cmp);
    Ok((to[reps / 2], tr[reps / 2]))
}

fn async_pairs(report: &mut Report) -> Res<()> {
    const SIZE: usize = 1 << 20;
    const ITERS: usize = 20_000;
    let a = sys::api()?.cuMemAllocAsync()?;
    let f = sys::api()?.cuMemFreeAsync()?;
    // The honest public path: malloc_async + drop, on the current stream (the legacy
    // default stream here, as the raw pair uses).
    let (ours, raw) = interleaved_median_secs(
        3,
        21,
        || {
            for _ in 0..ITERS {
                let p: MemoryPointer = malloc_async(SIZE)?;
                drop(p);
            }
            Ok(())
        },
        || {
            for _ in 0..ITERS {
                let mut p: sys::CUdeviceptr = 0;
                // SAFETY: valid out pointer, legacy default stream (the current stream).
                check(
                    unsafe { a(&mut p, SIZE, std::ptr::null_mut()) },
                    "cuMemAllocAsync",
                )?;
                // SAFETY: freeing what was just allocated, on the same stream.
                check(unsafe { f(p, std::ptr::null_mut()) }, "cuMemFreeAsync")?;
            }
            Ok(())
        },
    )?;
    let (v, r) = (ours / ITERS as f64 * 1e9, raw / ITERS as f64 * 1e9);
    report.push(
        Figure::new("malloc_async_free_pair", v, "ns")
            .size(SIZE)
            .raw(r, "cuMemAllocAsync+cuMemFreeAsync"),
    );
    Ok(())
}

fn main() {
    if !common::gpu_or_skip("memory") {
        return;
    }
    let mut report = Report::new("memory copies and async pairs on device 0 (median of 9 runs)");
    for (name, step) in [
        ("transfers", transfers as fn(&mut Report) -> Res<()>),
        ("d2d", d2d),
        ("async_pairs", async_pairs),
    ] {
        if let Err(e) = step(&mut report) {
            eprintln!("memory bench: {name} failed: {e}");
        }
    }
    report.finish();
}
