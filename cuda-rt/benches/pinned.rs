//! Pinned memory figures, each paired with the raw driver in the same run (256 MiB):
//! pinned H2D/D2H vs raw cuMemcpyHtoD/DtoH from cuMemHostAlloc memory; pageable
//! H2D/D2H through cuda-rt vs raw pageable copies and vs the ceiling
//! min(pinned DMA, host multi-threaded pageable<->pinned memcpy with as many
//! threads); pinned pool malloc+free vs raw cuMemHostAlloc+cuMemFreeHost of 1 MiB.
//! One JSON object per line, then a table (the shared reporter of `common`). Without a
//! GPU: a skip line, exit 0.

use std::sync::Arc;
use std::time::Instant;

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::memory::{Memory, MemoryPointer};
use cuda_rt::pinned::{self, PinnedMemoryPointer, PinnedMemoryPool};
use cuda_rt::Stream;

mod common;
use common::{check_rc, median, median_secs, Figure, Report};

const SIZE: usize = 256 << 20;
const REPS: usize = 9;

fn rate(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Host memcpy with `threads` scoped threads, each a contiguous part: the host side
/// of the ceiling (measured independently of cuda-rt's worker pool).
fn threaded_memcpy(dst: &mut [u8], src: &[u8], threads: usize) {
    let part = src.len().div_ceil(threads);
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(part).zip(src.chunks(part)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
}

fn main() {
    if !common::gpu_or_skip("pinned") {
        return;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    let api = sys::api().unwrap();
    let stream = Stream::new().unwrap();
    let mut report = Report::new(format!(
        "pinned memory on device 0 ({} MiB copies, median of {REPS})",
        SIZE >> 20
    ));

    // Plain cuMemAlloc'd memory: cuda-rt's copies take the pointer, the raw ones the
    // address.
    let dev = MemoryPointer::from_memory(Arc::new(Memory::new(SIZE).unwrap()));
    let dptr: sys::CUdeviceptr = dev.ptr();

    // Raw pinned buffer.
    let mut raw_pinned: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: valid out pointer.
    check_rc(
        unsafe { api.cuMemHostAlloc().unwrap()(&mut raw_pinned, SIZE, 1) },
        "cuMemHostAlloc",
    );
    // SAFETY: SIZE bytes just allocated.
    unsafe { std::ptr::write_bytes(raw_pinned.cast::<u8>(), 1, SIZE) };
    let htod = api.cuMemcpyHtoD_v2().unwrap();
    let dtoh = api.cuMemcpyDtoH_v2().unwrap();

    // --- pinned H2D / D2H ---
    let mut p: PinnedMemoryPointer = pinned::get_default_pinned_memory_pool()
        .malloc(SIZE)
        .unwrap();
    p.as_mut_slice().unwrap().fill(2);
    let ours = median_secs(REPS, || {
        p.copy_to_device_async(&dev, &stream).unwrap();
        p.synchronize().unwrap();
    });
    // SAFETY: raw_pinned holds SIZE bytes; dptr SIZE bytes.
    let raw = median_secs(REPS, || {
        check_rc(unsafe { htod(dptr, raw_pinned, SIZE) }, "htod")
    });
    let (v, r) = (rate(SIZE, ours), rate(SIZE, raw));
    let pinned_h2d = r;
    report.push(
        Figure::new("h2d_pinned", v, "GB/s")
            .size(SIZE)
            .raw(r, "cuMemcpyHtoD(cuMemHostAlloc)"),
    );
    let ours = median_secs(REPS, || {
        p.copy_from_device_async(&dev, &stream).unwrap();
        p.synchronize().unwrap();
    });
    // SAFETY: as above.
    let raw = median_secs(REPS, || {
        check_rc(unsafe { dtoh(raw_pinned, dptr, SIZE) }, "dtoh")
    });
    let (v, r) = (rate(SIZE, ours), rate(SIZE, raw));
    let pinned_d2h = r;
    report.push(
        Figure::new("d2h_pinned", v, "GB/s")
            .size(SIZE)
            .raw(r, "cuMemcpyDtoH(cuMemHostAlloc)"),
    );
    drop(p);

    // --- pageable ---
    // Start the staging workers, so the ceiling uses as many threads.
    pinned::parallel_memcpy(&mut [0u8], &[1u8]).unwrap();
    let threads = pinned::staging_threads();
    let mut host = vec![3u8; SIZE];
    // SAFETY: raw_pinned holds SIZE bytes, only used here on this thread.
    let pin_slice = unsafe { std::slice::from_raw_parts_mut(raw_pinned.cast::<u8>(), SIZE) };
    let memcpy_in = rate(
        SIZE,
        median_secs(REPS, || threaded_memcpy(pin_slice, &host, threads)),
    );
    let memcpy_out = rate(
        SIZE,
        median_secs(REPS, || threaded_memcpy(&mut host, pin_slice, threads)),
    );

    let ours = median_secs(REPS, || {
        pinned::copy_host_to_device(&dev, &host, &stream).unwrap()
    });
    // SAFETY: host holds SIZE bytes.
    let raw = median_secs(REPS, || {
        check_rc(unsafe { htod(dptr, host.as_ptr().cast(), SIZE) }, "htod")
    });
    let (v, r) = (rate(SIZE, ours), rate(SIZE, raw));
    let ceiling_h2d = pinned_h2d.min(memcpy_in);
    report.push(
        Figure::new("h2d_pageable", v, "GB/s")
            .size(SIZE)
            .raw(r, "cuMemcpyHtoD(pageable)"),
    );
    report.push(
        Figure::new(format!("h2d_pageable_vs_ceiling_{threads}t"), v, "GB/s")
            .size(SIZE)
            .raw(ceiling_h2d, "min(pinned DMA, threaded memcpy)"),
    );
    let ours = median_secs(REPS, || {
        pinned::copy_device_to_host(&mut host, &dev, &stream).unwrap()
    });
    // SAFETY: host holds SIZE bytes.
    let raw = median_secs(REPS, || {
        check_rc(
            unsafe { dtoh(host.as_mut_ptr().cast(), dptr, SIZE) },
            "dtoh",
        )
    });
    let (v, r) = (rate(SIZE, ours), rate(SIZE, raw));
    let ceiling_d2h = pinned_d2h.min(memcpy_out);
    report.push(
        Figure::new("d2h_pageable", v, "GB/s")
            .size(SIZE)
            .raw(r, "cuMemcpyDtoH(pageable)"),
    );
    report.push(
        Figure::new(format!("d2h_pageable_vs_ceiling_{threads}t"), v, "GB/s")
            .size(SIZE)
            .raw(ceiling_d2h, "min(pinned DMA, threaded memcpy)"),
    );
    eprintln!(
        "threaded memcpy pageable->pinned {memcpy_in:.1} GB/s, pinned->pageable \
         {memcpy_out:.1} GB/s, {threads} threads"
    );

    // --- pool malloc+free pair vs raw ---
    let pool = PinnedMemoryPool::new();
    drop(pool.malloc(1 << 20).unwrap());
    const PAIRS: usize = 200_000;
    let ours = median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..PAIRS {
                    let b = pool.malloc(std::hint::black_box(1 << 20)).unwrap();
                    drop(std::hint::black_box(b));
                }
                t.elapsed().as_secs_f64() / PAIRS as f64 * 1e9
            })
            .collect(),
    );
    let alloc = api.cuMemHostAlloc().unwrap();
    let free = api.cuMemFreeHost().unwrap();
    let raw = median(
        (0..REPS)
            .map(|_| {
                let t = Instant::now();
                for _ in 0..10 {
                    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
                    // SAFETY: valid out pointer; freed right after.
                    check_rc(unsafe { alloc(&mut p, 1 << 20, 1) }, "alloc");
                    // SAFETY: allocated above.
                    check_rc(unsafe { free(p) }, "free");
                }
                t.elapsed().as_secs_f64() / 10.0 * 1e9
            })
            .collect(),
    );
    report.push(
        Figure::new("pinned_pool_malloc_free_pair", ours, "ns")
            .size(1 << 20)
            .raw(raw, "cuMemHostAlloc+cuMemFreeHost"),
    );

    // SAFETY: allocated above, freed once.
    unsafe {
        api.cuMemFreeHost().unwrap()(raw_pinned);
    }
    drop(dev);

    report.finish();
}
