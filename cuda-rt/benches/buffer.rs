//! Typed buffer figures, each paired with its baseline in the same run:
//! - overlap: 16 chunks of 64 MiB, each copied host to device from a pinned buffer,
//!   processed by a kernel and copied back, on 3 streams with typed buffers and
//!   `Transfer`s, against the same work on one stream (the speed-up, target >= 1.8x)
//!   and against the same 3-stream pipeline written with raw driver calls (target
//!   within 10%);
//! - `DeviceBuffer` alloc+free of a cached size against the untyped pool pair
//!   (`cuda_rt::alloc` + drop; target within 10%);
//! - `to_vec` of 256 MiB against the untyped staged copy into a fresh `Vec` (the same
//!   work without the type; target within 3%).
//!
//! One JSON object per line, then a table (the shared reporter of `common`). Without a
//! GPU or NVRTC: a skip line, exit 0.

use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer, Transfer};
use cuda_rt::compiler::RawKernel;
use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::{LaunchConfig, Stream};

mod common;
use common::{check_rc, median_secs, Figure, Report};

const CHUNKS: usize = 16;
const CHUNK_ELEMS: usize = (64 << 20) / 4;
const STREAMS: usize = 3;
const REPS: usize = 5;

/// A kernel with a tunable amount of work per element, so compute can be made about
/// as long as a chunk's copies.
const WORK: &str = r#"
extern "C" __global__ void work(float* x, int n, int iters) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = x[i];
        for (int k = 0; k < iters; ++k) v = v * 0.999f + 0.001f;
        x[i] = v;
    }
}
"#;

struct Pipeline {
    kernel: RawKernel,
    cfg: LaunchConfig,
    iters: i32,
    host_in: Vec<PinnedBuffer<f32>>,
    host_out: Vec<PinnedBuffer<f32>>,
    dev: Vec<DeviceBuffer<f32>>,
}

impl Pipeline {
    /// Queues every chunk (copy in, kernel, copy out) on `streams` in turn and waits
    /// for all of them through their transfers.
    fn run(&mut self, streams: &[Stream]) {
        let n = CHUNK_ELEMS as i32;
        let mut inflight: Vec<Transfer<'_>> = Vec::with_capacity(2 * CHUNKS);
        let chunks = self
            .host_in
            .iter()
            .zip(self.host_out.iter_mut())
            .zip(self.dev.iter_mut());
        for (i, ((hin, hout), dev)) in chunks.enumerate() {
            let s = &streams[i % streams.len()];
            inflight.push(dev.copy_from_pinned_async(hin, s).unwrap());
            // SAFETY: work(float* x, int n, int iters): `dev` holds n floats, used on
            // this stream only, and alive until the copy below is done (its fence
            // holds the memory).
            unsafe {
                self.kernel
                    .function()
                    .launch_on(s, &self.cfg, &[dev as &DeviceBuffer<f32>, &n, &self.iters])
                    .unwrap()
            };
            inflight.push(dev.copy_to_pinned_async(hout, s).unwrap());
        }
        for t in inflight {
            t.wait().unwrap();
        }
    }
}

/// The same pipeline with raw driver calls: cuMemHostAlloc, cuMemAlloc, raw streams,
/// cuMemcpy*Async and cuLaunchKernel, one cuCtxSynchronize at the end.
struct RawPipeline {
    api: &'static sys::Api,
    f: sys::CUfunction,
    grid: u32,
    iters: i32,
    host_in: Vec<*mut std::ffi::c_void>,
    host_out: Vec<*mut std::ffi::c_void>,
    dev: Vec<sys::CUdeviceptr>,
    streams: Vec<sys::CUstream>,
}

impl RawPipeline {
    fn new(f: sys::CUfunction, grid: u32, iters: i32) -> RawPipeline {
        let api = sys::api().unwrap();
        let bytes = CHUNK_ELEMS * 4;
        let host = || {
            let mut p = std::ptr::null_mut();
            // SAFETY: valid out pointer.
            check_rc(
                unsafe { api.cuMemHostAlloc().unwrap()(&mut p, bytes, 0) },
                "cuMemHostAlloc",
            );
            // SAFETY: `bytes` bytes just allocated.
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
            p
        };
        let host_in = (0..CHUNKS).map(|_| host()).collect();
        let host_out = (0..CHUNKS).map(|_| host()).collect();
        let dev = (0..CHUNKS)
            .map(|_| {
                let mut d = 0;
                // SAFETY: valid out pointer; the primary context is current.
                check_rc(
                    unsafe { api.cuMemAlloc_v2().unwrap()(&mut d, bytes) },
                    "cuMemAlloc",
                );
                d
            })
            .collect();
        let streams = (0..STREAMS)
            .map(|_| {
                let mut s = std::ptr::null_mut();
                // SAFETY: valid out pointer; flag 1 = non-blocking.
                check_rc(
                    unsafe { api.cuStreamCreate().unwrap()(&mut s, 1) },
                    "cuStreamCreate",
                );
                s
            })
            .collect();
        RawPipeline {
            api,
            f,
            grid,
            iters,
            host_in,
            host_out,
            dev,
            streams,
        }
    }

    fn run(&self) {
        let bytes = CHUNK_ELEMS * 4;
        let (htod, dtoh) = (
            self.api.cuMemcpyHtoDAsync_v2().unwrap(),
            self.api.cuMemcpyDtoHAsync_v2().unwrap(),
        );
        let launch = self.api.cuLaunchKernel().unwrap();
        for i in 0..CHUNKS {
            let s = self.streams[i % STREAMS];
            let (mut d, mut n, mut iters) = (self.dev[i], CHUNK_ELEMS as i32, self.iters);
            let mut params = [
                (&mut d as *mut u64).cast::<std::ffi::c_void>(),
                (&mut n as *mut i32).cast(),
                (&mut iters as *mut i32).cast(),
            ];
            // SAFETY: every buffer holds `bytes` bytes and lives until `drop`; the
            // kernel takes (float*, int, int), given in `params`.
            unsafe {
                check_rc(htod(self.dev[i], self.host_in[i], bytes, s), "htod");
                check_rc(
                    launch(
                        self.f,
                        self.grid,
                        1,
                        1,
                        256,
                        1,
                        1,
                        0,
                        s,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    ),
                    "launch",
                );
                check_rc(dtoh(self.host_out[i], self.dev[i], bytes, s), "dtoh");
            }
        }
        // SAFETY: no arguments.
        check_rc(
            unsafe { self.api.cuCtxSynchronize().unwrap()() },
            "cuCtxSynchronize",
        );
    }
}

impl Drop for RawPipeline {
    fn drop(&mut self) {
        // SAFETY: handles made in `new`, each freed once, after the last synchronize.
        unsafe {
            for &p in self.host_in.iter().chain(&self.host_out) {
                self.api.cuMemFreeHost().unwrap()(p);
            }
            for &d in &self.dev {
                self.api.cuMemFree_v2().unwrap()(d);
            }
            for &s in &self.streams {
                self.api.cuStreamDestroy_v2().unwrap()(s);
            }
        }
    }
}

fn main() {
    if !common::gpu_or_skip("buffer") {
        return;
    }
    if let Err(why) = cuda_rt::compiler::nvrtc_version() {
        common::skip("buffer", &format!("no NVRTC: {why}"));
        return;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    let mut report = Report::new(format!(
        "typed buffers on device 0 ({CHUNKS} chunks of {} MiB on {STREAMS} streams; median of {REPS})",
        (CHUNK_ELEMS * 4) >> 20
    ));
    // The pairs first: measured after the pipeline (gigabytes of pinned and device
    // memory cached, staging threads up) every pair of the process ran 3-4x slower
    // on the H200 loan, the untyped ones as much as the typed.
    alloc_pair(&mut report);
    overlap(&mut report);
    to_vec(&mut report);
    report.finish();
}

fn overlap(report: &mut Report) {
    let kernel = RawKernel::new(WORK, "work", &[]).unwrap();
    let sms = cuda_rt::Device::new(0)
        .unwrap()
        .multiprocessor_count()
        .unwrap() as u32;
    let grid = sms * 8;
    let cfg = LaunchConfig::new(grid, 256);
    let mut p = Pipeline {
        kernel,
        cfg,
        iters: 1,
        host_in: (0..CHUNKS)
            .map(|i| PinnedBuffer::from_slice(&vec![i as f32; CHUNK_ELEMS]).unwrap())
            .collect(),
        host_out: (0..CHUNKS)
            .map(|_| PinnedBuffer::zeros(CHUNK_ELEMS).unwrap())
            .collect(),
        dev: (0..CHUNKS)
            .map(|_| DeviceBuffer::zeros(CHUNK_ELEMS).unwrap())
            .collect(),
    };
    let one: Vec<Stream> = vec![Stream::non_blocking().unwrap()];
    let many: Vec<Stream> = (0..STREAMS)
        .map(|_| Stream::non_blocking().unwrap())
        .collect();

    // Calibrate: make one chunk's kernel about as long as one chunk's copy in.
    let copy_in = median_secs(REPS, || {
        p.dev[0]
            .copy_from_pinned_async(&p.host_in[0], &one[0])
            .unwrap()
            .wait()
            .unwrap();
    });
    let kernel_time = |p: &Pipeline, iters: i32| {
        let n = CHUNK_ELEMS as i32;
        median_secs(REPS, || {
            // SAFETY: as in `Pipeline::run`, on chunk 0, waited for below.
            unsafe {
                p.kernel
                    .function()
                    .launch_on(&one[0], &p.cfg, &[&p.dev[0], &n, &iters])
                    .unwrap()
            };
            one[0].synchronize().unwrap();
        })
    };
    let probe = 256;
    let per_iter = kernel_time(&p, probe) / probe as f64;
    p.iters = ((copy_in / per_iter) as i32).clamp(1, 1 << 20);
    let k = kernel_time(&p, p.iters);
    eprintln!(
        "chunk: copy in {:.3} ms, kernel {:.3} ms ({} iterations)",
        copy_in * 1e3,
        k * 1e3,
        p.iters
    );

    let serial = median_secs(REPS, || p.run(&one));
    let ours = median_secs(REPS, || p.run(&many));
    // Every chunk went through the kernel (the value moved from its start).
    for (i, h) in p.host_out.iter().enumerate() {
        let v = h.as_slice().unwrap();
        assert!(v[0] != i as f32 || i == 1, "chunk {i} was not processed");
        assert!(v.iter().all(|x| *x == v[0]), "chunk {i} is not uniform");
    }
    let raw = RawPipeline::new(p.kernel.function().as_raw(), grid, p.iters);
    let raw_time = median_secs(REPS, || raw.run());
    drop(raw);
    let size = CHUNKS * CHUNK_ELEMS * 4;
    report.push(
        Figure::new("pipeline_3_streams", ours * 1e3, "ms")
            .size(size)
            .raw(raw_time * 1e3, "raw_driver_pipeline_3_streams")
            .target("ratio <= 1.10"),
    );
    report.push(
        Figure::new("pipeline_1_stream", serial * 1e3, "ms")
            .size(size)
            .note("the same work serialised on one stream"),
    );
    report.push(
        Figure::new("overlap_speedup_3_streams_vs_1", serial / ours, "x")
            .size(size)
            .target(">= 1.8"),
    );
}

fn alloc_pair(report: &mut Report) {
    const N: usize = 200_000;
    let elems = (1 << 20) / 4;
    let per = |f: &mut dyn FnMut()| {
        median_secs(REPS, || {
            for _ in 0..N {
                f();
            }
        }) / N as f64
    };
    let (typed, untyped) = common::interleaved(
        7,
        || {
            per(&mut || {
                drop(std::hint::black_box(
                    DeviceBuffer::<f32>::empty(elems).unwrap(),
                ))
            })
        },
        || per(&mut || drop(std::hint::black_box(cuda_rt::alloc(elems * 4).unwrap()))),
    );
    let pool = cuda_rt::get_default_memory_pool();
    let (pool_pair, _) = common::interleaved(
        7,
        || per(&mut || drop(std::hint::black_box(pool.malloc(elems * 4).unwrap()))),
        || per(&mut || drop(std::hint::black_box(cuda_rt::alloc(elems * 4).unwrap()))),
    );
    report.push(
        Figure::new("device_buffer_alloc_free_pair", typed * 1e9, "ns")
            .size(elems * 4)
            .raw(untyped * 1e9, "alloc_free_pair")
            .target("ratio <= 1.10"),
    );
    report.push(
        Figure::new("alloc_free_pair", untyped * 1e9, "ns")
            .size(elems * 4)
            .raw(pool_pair * 1e9, "pool_malloc_free_pair")
            .note("cuda_rt::alloc (allocator lookup) vs MemoryPool::malloc"),
    );
}

fn to_vec(report: &mut Report) {
    let elems = (256 << 20) / 4;
    let b = DeviceBuffer::<f32>::zeros(elems).unwrap();
    let (typed, untyped) = common::interleaved(
        7,
        || {
            median_secs(REPS, || {
                std::hint::black_box(b.to_vec().unwrap());
            })
        },
        || {
            median_secs(REPS, || {
                let mut v = vec![0f32; elems];
                b.as_pointer().copy_to_host(&mut v).unwrap();
                std::hint::black_box(v);
            })
        },
    );
    report.push(
        Figure::new("to_vec", (256 << 20) as f64 / typed / 1e9, "GB/s")
            .size(256 << 20)
            .raw(
                (256 << 20) as f64 / untyped / 1e9,
                "copy_to_host_into_new_vec",
            )
            .target("ratio <= 1.03"),
    );
}
