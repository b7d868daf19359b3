//! Every door for a host copy of 256 MiB of pageable memory, each beside the pinned
//! DMA rate measured in the same run (its `raw`, so the ratio is the door's rate over
//! the DMA engine's from page-locked memory; the goal is 0.9 or more, both ways):
//! `MemoryPointer::copy_from_host`/`copy_to_host` (synchronous, current stream),
//! their `_async` forms on a stream, `DeviceBuffer::from_slice`, `copy_from_host`,
//! `copy_to_host` and `to_vec` (into a fresh `Vec`), the explicit-stream `_on` forms,
//! the staged copies of `cuda_rt::pinned`, and the C ABI's `curt_memcpy_htod`/`dtoh`
//! and their `_async` forms. Also printed: the driver's own pageable copy, and the
//! host's side of the ceiling (fresh-page faults, threaded memcpy), so a shortfall
//! can be told apart from a slow machine. The `interleaved:` rows time the doors again
//! in rounds, each round the DMA reference and every door once, so that a shared host
//! whose speed drifts during the run weighs on both sides of the ratio alike.
//! `cargo bench --bench host_copies [-- MiB]`. Without a GPU it prints a skip line.

use std::ffi::c_void;
use std::hint::black_box;
use std::time::Instant;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::pinned;
use cuda_rt::stream::AsStream;
use cuda_rt::Stream;
use cuda_rt_c::{
    curt_free, curt_malloc, curt_memcpy_dtoh, curt_memcpy_dtoh_async, curt_memcpy_htod,
    curt_memcpy_htod_async, curt_memory_t,
};

#[path = "../cuda-rt/benches/common/mod.rs"]
mod common;
use common::{check_rc, median, median_secs, Figure, Report};

const REPS: usize = 7;

fn rate(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// Pinned host memory from cuMemHostAlloc, freed on drop.
struct Pinned(*mut c_void, usize);

impl Pinned {
    fn new(len: usize) -> Pinned {
        let api = sys::api().unwrap();
        let mut p = std::ptr::null_mut();
        // SAFETY: `p` is a valid out pointer; flag 0 is plain page-locked memory.
        check_rc(
            unsafe { api.cuMemHostAlloc().unwrap()(&mut p, len, 0) },
            "cuMemHostAlloc",
        );
        // SAFETY: `len` bytes were just allocated; writing them initialises them.
        unsafe { std::ptr::write_bytes(p.cast::<u8>(), 1, len) };
        Pinned(p, len)
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        let _ = unsafe { sys::api().unwrap().cuMemFreeHost().unwrap()(self.0) };
        let _ = self.1;
    }
}

/// The transparent huge page setting of the host (what the fresh `Vec` of `to_vec`
/// gets), as the kernel prints it.
fn thp() -> String {
    std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

fn uname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn main() {
    if !common::gpu_or_skip("host_copies") {
        return;
    }
    let mib: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(256);
    let n = mib << 20;
    cuda_rt::device::set_device_id(0).unwrap();
    pinned::parallel_memcpy(&mut [0u8], &[1u8]).unwrap();
    let default_threads = pinned::staging_threads();
    // The doors run with the default stores; the rows that compare them restore it.
    let defaults = cuda_rt::testing::streaming_stores();

    let mut report = Report::new("host_copies");
    report.context("bytes", n as u64);
    report.context("staging_threads", default_threads as u64);
    report.context("transparent_hugepage", thp());
    report.context("kernel", uname());
    report.context(
        "thp_defrag",
        std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/defrag")
            .map(|s| s.trim().to_string())
            .unwrap_or_default(),
    );

    let api = sys::api().unwrap();
    let htod = api.cuMemcpyHtoD_v2().unwrap();
    let dtoh = api.cuMemcpyDtoH_v2().unwrap();
    let mut dev = DeviceBuffer::<u8>::zeros(n).unwrap();
    let dptr = dev.as_pointer().ptr();
    let pin = Pinned::new(n);
    let mut host = vec![3u8; n];
    let stream = Stream::new().unwrap();

    // The reference: the DMA engine from page-locked memory.
    // SAFETY: `pin` holds n bytes, `dptr` n bytes of device memory, for the whole run.
    let dma_in = rate(
        n,
        median_secs(REPS, || check_rc(unsafe { htod(dptr, pin.0, n) }, "htod")),
    );
    // SAFETY: as above, device to host.
    let dma_out = rate(
        n,
        median_secs(REPS, || check_rc(unsafe { dtoh(pin.0, dptr, n) }, "dtoh")),
    );
    report.info("pinned_dma_h2d_gbs", dma_in);
    report.info("pinned_dma_d2h_gbs", dma_out);
    let h2d = |report: &mut Report, name: &str, secs: f64| {
        report.push(
            Figure::new(name, rate(n, secs), "GB/s")
                .size(n)
                .raw(dma_in, "pinned DMA cuMemcpyHtoD")
                .target(">= 0.9x"),
        );
    };
    let d2h = |report: &mut Report, name: &str, secs: f64| {
        report.push(
            Figure::new(name, rate(n, secs), "GB/s")
                .size(n)
                .raw(dma_out, "pinned DMA cuMemcpyDtoH")
                .target(">= 0.9x"),
        );
    };

    // --- host to device ---
    // SAFETY: `host` holds n bytes, `dptr` n bytes of device memory.
    let t = median_secs(REPS, || {
        check_rc(unsafe { htod(dptr, host.as_ptr().cast(), n) }, "htod")
    });
    h2d(&mut report, "driver_pageable_htod", t);
    let p = dev.as_pointer().clone();
    h2d(
        &mut report,
        "MemoryPointer::copy_from_host",
        median_secs(REPS, || p.copy_from_host(&host).unwrap()),
    );
    h2d(
        &mut report,
        "MemoryPointer::copy_from_host_async",
        median_secs(REPS, || {
            p.copy_from_host_async(&host, Some(&stream)).unwrap();
            stream.synchronize().unwrap();
        }),
    );
    h2d(
        &mut report,
        "pinned::copy_host_to_device(stream)",
        median_secs(REPS, || {
            pinned::copy_host_to_device(&p, &host, &stream).unwrap()
        }),
    );
    h2d(
        &mut report,
        "DeviceBuffer::copy_from_host",
        median_secs(REPS, || dev.copy_from_host(&host).unwrap()),
    );
    h2d(
        &mut report,
        "DeviceBuffer::from_slice",
        median_secs(REPS, || {
            drop(black_box(DeviceBuffer::from_slice(&host).unwrap()))
        }),
    );
    let mut m: curt_memory_t = std::ptr::null_mut();
    // SAFETY: NULL is the current stream; `m` is a valid out pointer.
    assert_eq!(unsafe { curt_malloc(n, std::ptr::null_mut(), &mut m) }, 0);
    h2d(
        &mut report,
        "curt_memcpy_htod",
        median_secs(REPS, || {
            // SAFETY: `host` holds n bytes; `m` n bytes of device memory.
            assert_eq!(
                unsafe { curt_memcpy_htod(m, 0, host.as_ptr().cast(), n) },
                0
            )
        }),
    );
    h2d(
        &mut report,
        "curt_memcpy_htod_async",
        median_secs(REPS, || {
            // SAFETY: as above; NULL is the current stream.
            let rc = unsafe {
                curt_memcpy_htod_async(m, 0, host.as_ptr().cast(), n, std::ptr::null_mut())
            };
            assert_eq!(rc, 0);
            cuda_rt::stream::get_current_stream().synchronize().unwrap();
        }),
    );

    // --- device to host ---
    // SAFETY: as above, device to host.
    let t = median_secs(REPS, || {
        check_rc(unsafe { dtoh(host.as_mut_ptr().cast(), dptr, n) }, "dtoh")
    });
    d2h(&mut report, "driver_pageable_dtoh", t);
    d2h(
        &mut report,
        "MemoryPointer::copy_to_host",
        median_secs(REPS, || p.copy_to_host(&mut host).unwrap()),
    );
    d2h(
        &mut report,
        "MemoryPointer::copy_to_host_async",
        median_secs(REPS, || {
            p.copy_to_host_async(&mut host, Some(&stream)).unwrap();
            stream.synchronize().unwrap();
        }),
    );
    d2h(
        &mut report,
        "pinned::copy_device_to_host(stream)",
        median_secs(REPS, || {
            pinned::copy_device_to_host(&mut host, &p, &stream).unwrap()
        }),
    );
    d2h(
        &mut report,
        "DeviceBuffer::copy_to_host",
        median_secs(REPS, || dev.copy_to_host(&mut host).unwrap()),
    );
    d2h(
        &mut report,
        "DeviceBuffer::to_vec",
        median_secs(REPS, || drop(black_box(dev.to_vec().unwrap()))),
    );
    let mut kept = None;
    let secs: Vec<f64> = (0..=REPS)
        .map(|_| {
            drop(kept.take());
            let t = Instant::now();
            kept = Some(dev.to_vec().unwrap());
            t.elapsed().as_secs_f64()
        })
        .collect();
    drop(kept);
    d2h(
        &mut report,
        "DeviceBuffer::to_vec(drop not timed)",
        median(secs[1..].to_vec()),
    );
    d2h(
        &mut report,
        "curt_memcpy_dtoh",
        median_secs(REPS, || {
            // SAFETY: `host` holds n bytes; `m` n bytes of device memory.
            assert_eq!(
                unsafe { curt_memcpy_dtoh(host.as_mut_ptr().cast(), m, 0, n) },
                0
            )
        }),
    );
    d2h(
        &mut report,
        "curt_memcpy_dtoh_async",
        median_secs(REPS, || {
            // SAFETY: as above; NULL is the current stream.
            let rc = unsafe {
                curt_memcpy_dtoh_async(host.as_mut_ptr().cast(), m, 0, n, std::ptr::null_mut())
            };
            assert_eq!(rc, 0);
            cuda_rt::stream::get_current_stream().synchronize().unwrap();
        }),
    );
    // --- the same doors interleaved: each round times the DMA reference and every
    // door once, so a host that speeds up or slows down during the run (other tenants,
    // clocks, pages settling) weighs on the reference and the doors alike ---
    {
        let (hp, mp) = (host.as_ptr(), m);
        let mut doors: Vec<Door<'_>> = vec![
            (
                "pinned_dma_h2d",
                // SAFETY: `pin` holds n bytes, `dptr` n bytes of device memory.
                Box::new(|| check_rc(unsafe { htod(dptr, pin.0, n) }, "htod")),
            ),
            (
                "MemoryPointer::copy_from_host",
                Box::new(|| p.copy_from_host(&host).unwrap()),
            ),
            (
                "MemoryPointer::copy_from_host_async",
                Box::new(|| {
                    p.copy_from_host_async(&host, Some(&stream)).unwrap();
                    stream.synchronize().unwrap();
                }),
            ),
            (
                "pinned::copy_host_to_device(stream)",
                Box::new(|| pinned::copy_host_to_device(&p, &host, &stream).unwrap()),
            ),
            (
                "DeviceBuffer::from_slice",
                Box::new(|| drop(black_box(DeviceBuffer::from_slice(&host).unwrap()))),
            ),
            (
                "curt_memcpy_htod",
                // SAFETY: `host` holds n bytes; `m` n bytes of device memory.
                Box::new(move || assert_eq!(unsafe { curt_memcpy_htod(mp, 0, hp.cast(), n) }, 0)),
            ),
        ];
        interleaved(&mut report, n, &mut doors);
    }
    {
        // One destination for every door of the round, each taking it in turn.
        let out = std::cell::RefCell::new(&mut host);
        let mut doors: Vec<Door<'_>> = vec![
            (
                "pinned_dma_d2h",
                // SAFETY: as above, device to host.
                Box::new(|| check_rc(unsafe { dtoh(pin.0, dptr, n) }, "dtoh")),
            ),
            (
                "MemoryPointer::copy_to_host",
                Box::new(|| p.copy_to_host(&mut out.borrow_mut()).unwrap()),
            ),
            (
                "DeviceBuffer::copy_to_host",
                Box::new(|| dev.copy_to_host(&mut out.borrow_mut()).unwrap()),
            ),
            (
                "DeviceBuffer::to_vec",
                Box::new(|| drop(black_box(dev.to_vec().unwrap()))),
            ),
            (
                "curt_memcpy_dtoh",
                Box::new(|| {
                    let dst = out.borrow_mut().as_mut_ptr();
                    // SAFETY: `dst` holds n bytes (borrowed for the call); `m` n bytes
                    // of device memory.
                    assert_eq!(unsafe { curt_memcpy_dtoh(dst.cast(), m, 0, n) }, 0)
                }),
            ),
        ];
        interleaved(&mut report, n, &mut doors);
    }
    assert_eq!(curt_free(m), 0);

    // --- the host's side of the ceiling ---
    let mut other = vec![5u8; n];
    let memcpy = rate(
        n,
        median_secs(REPS, || pinned::parallel_memcpy(&mut other, &host).unwrap()),
    );
    report.info("threaded_memcpy_gbs", memcpy);
    let fresh = rate(
        n,
        median_secs(REPS, || {
            // Untouched zero pages (calloc's fresh mapping): the copy faults them in.
            let mut v = vec![0u8; n];
            pinned::parallel_memcpy(&mut v, &host).unwrap();
            drop(black_box(v));
        }),
    );
    report.info("threaded_memcpy_fresh_vec_gbs", fresh);
    let zeroed = rate(n, median_secs(REPS, || drop(black_box(vec![0u8; n]))));
    report.info("fresh_zeroed_vec_gbs", zeroed);

    // --- fresh pages: what a new Vec costs before any copy (to_vec's floor) ---
    for threads in [8usize, 16] {
        for (how, advice) in [
            ("4k", None),
            ("hugepage", Some(libc::MADV_HUGEPAGE)),
            ("populate_write", Some(23)), // MADV_POPULATE_WRITE (Linux 5.14)
        ] {
            let t = median_secs(REPS, || {
                let mut v: Vec<u8> = Vec::with_capacity(n);
                let base = v.as_mut_ptr() as usize;
                let part = n.div_ceil(threads).next_multiple_of(2 << 20);
                std::thread::scope(|sc| {
                    for i in 0..threads {
                        let (start, end) = ((i * part).min(n), ((i + 1) * part).min(n));
                        if start == end {
                            continue;
                        }
                        sc.spawn(move || {
                            let (a, len) = (base + start, end - start);
                            let aligned = a.next_multiple_of(4096);
                            let alen = (a + len - aligned) / 4096 * 4096;
                            if let (Some(adv), true) = (advice, alen > 0) {
                                if adv == libc::MADV_HUGEPAGE {
                                    // SAFETY: a page-aligned range inside `v`'s capacity.
                                    unsafe { libc::madvise(aligned as *mut c_void, alen, adv) };
                                }
                                // SAFETY: as above; populating keeps contents (zero pages).
                                let _ = unsafe { libc::madvise(aligned as *mut c_void, alen, 23) };
                            }
                            // SAFETY: this thread's part of `v`'s capacity, written once.
                            unsafe { std::ptr::write_bytes(a as *mut u8, 7, len) };
                        });
                    }
                });
                // SAFETY: every byte was written above.
                unsafe { v.set_len(n) };
                drop(black_box(v));
            });
            report.push(
                Figure::new(
                    format!("fresh_vec_first_write_{how}@{threads}t"),
                    rate(n, t),
                    "GB/s",
                )
                .size(n)
                .raw(dma_out, "pinned DMA"),
            );
        }
    }
    // --- staging plans: chunk MiB x buffers x ramp KiB ---
    for (chunk, buffers, ramp) in [
        (8usize, 4usize, 0usize),
        (8, 4, 1024),
        (8, 8, 1024),
        (4, 8, 512),
        (4, 4, 512),
        (16, 4, 1024),
        (16, 8, 1024),
        (2, 8, 256),
        (2, 16, 256),
        (32, 4, 2048),
    ] {
        cuda_rt::testing::set_staging_plan(chunk << 20, buffers, ramp << 10).unwrap();
        let name = |dir: &str| format!("plan_{dir}_{chunk}m_x{buffers}_ramp{ramp}k");
        let t = median_secs(REPS, || p.copy_from_host(&host).unwrap());
        report.push(
            Figure::new(name("h2d"), rate(n, t), "GB/s")
                .size(n)
                .raw(dma_in, "pinned DMA"),
        );
        let t = median_secs(REPS, || p.copy_to_host(&mut host).unwrap());
        report.push(
            Figure::new(name("d2h"), rate(n, t), "GB/s")
                .size(n)
                .raw(dma_out, "pinned DMA"),
        );
    }
    cuda_rt::testing::set_staging_plan(
        pinned::CHUNK_SIZE,
        pinned::STAGING_BUFFERS,
        pinned::staging::RAMP_START,
    )
    .unwrap();

    // --- streaming (non-temporal) stores against plain ones, alternated rep by rep ---
    for (what, dir_in) in [
        ("copy_from_host", true),
        ("copy_to_host", false),
        ("to_vec", false),
    ] {
        let (mut plain, mut streaming) = (Vec::new(), Vec::new());
        for _ in 0..=REPS {
            for on in [false, true] {
                cuda_rt::testing::set_streaming_stores(on, on);
                let t = Instant::now();
                match what {
                    "copy_from_host" => p.copy_from_host(&host).unwrap(),
                    "copy_to_host" => p.copy_to_host(&mut host).unwrap(),
                    _ => drop(black_box(dev.to_vec().unwrap())),
                }
                let secs = t.elapsed().as_secs_f64();
                if on { &mut streaming } else { &mut plain }.push(secs);
            }
        }
        let dma = if dir_in { dma_in } else { dma_out };
        for (how, secs) in [("plain", plain), ("streaming", streaming)] {
            report.push(
                Figure::new(
                    format!("{what}_{how}_stores"),
                    rate(n, median(secs[1..].to_vec())),
                    "GB/s",
                )
                .size(n)
                .raw(dma, "pinned DMA"),
            );
        }
    }
    cuda_rt::testing::set_streaming_stores(defaults.0, defaults.1);

    // --- the same doors with more staging threads ---
    for threads in [16usize, 4] {
        if pinned::set_staging_threads(threads).is_err() {
            continue;
        }
        cuda_rt::testing::set_streaming_stores(false, false);
        let d = |r: &mut Report, what: &str, t: f64| {
            r.push(
                Figure::new(format!("{what}@{threads}t"), rate(n, t), "GB/s")
                    .size(n)
                    .raw(
                        if what.contains("to_") {
                            dma_out
                        } else {
                            dma_in
                        },
                        "pinned DMA",
                    ),
            )
        };
        d(
            &mut report,
            "copy_from_host",
            median_secs(REPS, || p.copy_from_host(&host).unwrap()),
        );
        d(
            &mut report,
            "copy_to_host",
            median_secs(REPS, || p.copy_to_host(&mut host).unwrap()),
        );
        cuda_rt::testing::set_streaming_stores(true, true);
        d(
            &mut report,
            "copy_from_host_streaming",
            median_secs(REPS, || p.copy_from_host(&host).unwrap()),
        );
        d(
            &mut report,
            "copy_to_host_streaming",
            median_secs(REPS, || p.copy_to_host(&mut host).unwrap()),
        );
        cuda_rt::testing::set_streaming_stores(defaults.0, defaults.1);
        d(
            &mut report,
            "to_vec",
            median_secs(REPS, || drop(black_box(dev.to_vec().unwrap()))),
        );
        let fresh = rate(
            n,
            median_secs(REPS, || {
                let mut v = vec![0u8; n];
                pinned::parallel_memcpy(&mut v, &host).unwrap();
                drop(black_box(v));
            }),
        );
        report.info(
            if threads == 16 {
                "threaded_memcpy_fresh_vec_16t_gbs"
            } else {
                "threaded_memcpy_fresh_vec_4t_gbs"
            },
            fresh,
        );
    }
    let _ = pinned::set_staging_threads(default_threads.max(1));
    report.finish();
}

/// A named copy, run once per call.
type Door<'a> = (&'static str, Box<dyn FnMut() + 'a>);

/// Rounds of `doors`, the first the DMA reference: each round runs every door once (one
/// untimed round first), and each door's figure is its median rate over the rounds
/// beside the reference's median over the same rounds (`interleaved:` names them).
fn interleaved(report: &mut Report, n: usize, doors: &mut [Door<'_>]) {
    const ROUNDS: usize = 11;
    let mut secs = vec![Vec::with_capacity(ROUNDS); doors.len()];
    for round in 0..=ROUNDS {
        for (i, (_, f)) in doors.iter_mut().enumerate() {
            let t = Instant::now();
            f();
            if round > 0 {
                secs[i].push(t.elapsed().as_secs_f64());
            }
        }
    }
    let dma = rate(n, median(secs[0].clone()));
    let reference = doors[0].0;
    for ((name, _), s) in doors.iter().zip(secs).skip(1) {
        report.push(
            Figure::new(format!("interleaved:{name}"), rate(n, median(s)), "GB/s")
                .size(n)
                .raw(dma, reference)
                .target(">= 0.9x"),
        );
    }
}
