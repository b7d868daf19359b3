//! `cuda-rt bench`: cuda-rt's headline costs against the raw driver calls that do the
//! same work, measured in the same run on one device, in about a minute.
//!
//! | figure | cuda-rt | raw |
//! |---|---|---|
//! | `pool_malloc_free_pair` | `MemoryPool::malloc_on_stream` + drop, 1 MiB | `cuMemAllocAsync` + `cuMemFreeAsync` on the same stream |
//! | `launch_empty_kernel` | `Function::launch_on`, one `int` | `cuLaunchKernel` |
//! | `event_record` | `Event::record_on` | `cuEventRecord` |
//! | `h2d_pinned`, `d2h_pinned` | pinned pool memory, `copy_{to,from}_device_async` + wait, 64 MiB | `cuMemcpy{HtoD,DtoH}Async` from `cuMemHostAlloc` memory + `cuStreamSynchronize` |
//!
//! Each figure is the median over `--reps` repetitions of the mean per operation,
//! cuda-rt and raw interleaved (alternating which goes first) after a warm-up. The
//! ratio is cuda-rt's cost over raw's: time over time, or raw's rate over cuda-rt's,
//! so below 1 is faster than raw. Printed as one JSON object per figure, then a table
//! (the repository's benches print the same shape). Without a GPU: the reason, exit 0.

use std::ffi::c_void;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::memory::{Memory, MemoryPointer};
use cuda_rt::module::{Function, Module};
use cuda_rt::{AsStream, Event, LaunchConfig, Stream};

/// Options of `cuda-rt bench`.
#[derive(Debug, clap::Args)]
pub struct Options {
    /// The device to measure.
    #[arg(long, default_value_t = 0)]
    device: i32,
    /// Repetitions per figure (the median is kept).
    #[arg(long, default_value_t = 9, value_parser = clap::value_parser!(u32).range(1..=1000))]
    reps: u32,
}

/// Operations per repetition of the per-call figures.
const CALLS: usize = 20_000;
/// Bytes per pinned copy.
const COPY_BYTES: usize = 64 << 20;

/// An empty kernel of one `int` in PTX, which the driver compiles for the device: the
/// launch figure needs no NVRTC. (`.target sm_50`: any later GPU runs it.)
const EMPTY_KERNEL_PTX: &str = "\
.version 7.0
.target sm_50
.address_size 64

.visible .entry cuda_rt_bench_empty(
    .param .u32 cuda_rt_bench_empty_param_0
)
{
    ret;
}
";

/// One measured figure.
struct Figure {
    name: &'static str,
    ours: f64,
    raw: f64,
    unit: &'static str,
    raw_name: &'static str,
}

impl Figure {
    /// cuda-rt's cost over raw's: below 1 is faster than raw.
    fn ratio(&self) -> f64 {
        if self.unit.ends_with("/s") {
            self.raw / self.ours
        } else {
            self.ours / self.raw
        }
    }

    fn json(&self, device: &str) -> String {
        let finite = |x: f64| {
            if x.is_finite() {
                serde_json::json!(x)
            } else {
                serde_json::Value::Null
            }
        };
        serde_json::json!({
            "name": self.name,
            "value": finite(self.ours),
            "unit": self.unit,
            "raw": finite(self.raw),
            "raw_name": self.raw_name,
            "ratio": finite(self.ratio()),
            "device": device,
        })
        .to_string()
    }
}

pub fn run(options: &Options) -> crate::Result<()> {
    let count = match cuda_rt::availability() {
        Ok(n) => n,
        Err(why) => {
            println!("skipped: no GPU: {}", crate::reason_line(&why));
            return Ok(());
        }
    };
    if options.device < 0 || options.device >= count {
        return Err(format!("no device {} (this machine has {count})", options.device).into());
    }
    let started = Instant::now();
    cuda_rt::device::set_device_id(options.device)?;
    let dev = cuda_rt::Device::new(options.device)?;
    let device = match dev.name() {
        Ok(name) => format!("{name} (device {})", options.device),
        Err(_) => format!("device {}", options.device),
    };
    let reps = options.reps as usize;
    let stream = Stream::non_blocking()?;
    println!("cuda-rt bench on {device}: median of {reps}, cuda-rt and raw interleaved");

    let mut figures = Vec::new();
    let mut report = |f: Figure| {
        println!("{}", f.json(&device));
        figures.push(f);
    };
    report(pool_pair(&stream, reps)?);
    match empty_kernel() {
        Ok((function, how)) => {
            println!("(launch: the empty kernel {how})");
            report(launch(&function, &stream, reps)?);
        }
        Err(e) => println!("skipped launch_empty_kernel: the empty kernel did not load: {e}"),
    }
    report(event_record(&stream, reps)?);
    for f in pinned_copies(&stream, reps)? {
        report(f);
    }

    println!();
    println!(
        "{:<24} {:>12} {:>12} {:>8}  {:<8} raw",
        "figure", "cuda-rt", "raw", "ratio", "unit"
    );
    for f in &figures {
        println!(
            "{:<24} {:>12.3} {:>12.3} {:>8.3}  {:<8} {}",
            f.name,
            f.ours,
            f.raw,
            f.ratio(),
            f.unit,
            f.raw_name
        );
    }
    println!(
        "ratio: cuda-rt's cost over raw's (below 1 is faster); {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The medians of `ours` and `raw` (each one measurement), interleaved after a warm-up
/// of each, alternating which goes first so neither always pays for the other's leftovers.
fn interleaved(
    reps: usize,
    mut ours: impl FnMut() -> cuda_rt::Result<f64>,
    mut raw: impl FnMut() -> cuda_rt::Result<f64>,
) -> cuda_rt::Result<(f64, f64)> {
    ours()?;
    raw()?;
    let (mut o, mut r) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for i in 0..reps {
        if i % 2 == 0 {
            r.push(raw()?);
            o.push(ours()?);
        } else {
            o.push(ours()?);
            r.push(raw()?);
        }
    }
    Ok((median(o), median(r)))
}

/// A driver status as an error naming the call.
fn check(rc: sys::CUresult, call: &'static str) -> cuda_rt::Result<()> {
    cuda_rt::cuda_sys::result::check(rc, call).map_err(Into::into)
}

/// Mean nanoseconds per call of `body`, run `CALLS` times.
fn per_call(mut body: impl FnMut() -> cuda_rt::Result<()>) -> cuda_rt::Result<f64> {
    let t = Instant::now();
    for _ in 0..CALLS {
        body()?;
    }
    Ok(t.elapsed().as_nanos() as f64 / CALLS as f64)
}

fn pool_pair(stream: &Stream, reps: usize) -> cuda_rt::Result<Figure> {
    const SIZE: usize = 1 << 20;
    let pool = cuda_rt::memory::get_default_memory_pool();
    let api = sys::api()?;
    let (alloc, free) = (api.cuMemAllocAsync()?, api.cuMemFreeAsync()?);
    let s = stream.as_raw();
    let (ours, raw) = interleaved(
        reps,
        || {
            per_call(|| {
                let p = pool.malloc_on_stream(stream, black_box(SIZE))?;
                drop(black_box(p));
                Ok(())
            })
        },
        || {
            per_call(|| {
                let mut p: sys::CUdeviceptr = 0;
                // SAFETY: `p` is a valid out pointer and `s` a live stream of the
                // current device.
                check(
                    unsafe { alloc(&mut p, black_box(SIZE), s) },
                    "cuMemAllocAsync",
                )?;
                // SAFETY: `p` was allocated just above on `s` and is freed once.
                check(unsafe { free(p, s) }, "cuMemFreeAsync")
            })
        },
    )?;
    stream.synchronize()?;
    Ok(Figure {
        name: "pool_malloc_free_pair",
        ours,
        raw,
        unit: "ns",
        raw_name: "cuMemAllocAsync+cuMemFreeAsync",
    })
}

/// The empty kernel: from PTX through the driver, else compiled by NVRTC.
fn empty_kernel() -> cuda_rt::Result<(Function, &'static str)> {
    match Module::load_data(EMPTY_KERNEL_PTX.as_bytes())
        .and_then(|m| m.get_function("cuda_rt_bench_empty"))
    {
        Ok(f) => Ok((f, "is PTX compiled by the driver")),
        Err(ptx_error) => {
            let src = r#"extern "C" __global__ void cuda_rt_bench_empty(int a) {}"#;
            let module =
                cuda_rt::compiler::RawModule::from_source(src, &[], &[]).map_err(|_| ptx_error)?;
            Ok((
                module.get_function("cuda_rt_bench_empty")?,
                "was compiled by NVRTC",
            ))
        }
    }
}

fn launch(function: &Function, stream: &Stream, reps: usize) -> cuda_rt::Result<Figure> {
    let cfg = LaunchConfig::new(1, 32);
    let launch_raw = sys::api()?.cuLaunchKernel()?;
    let (f, s) = (function.as_raw(), stream.as_raw());
    let arg = 7i32;
    let mut raw_arg = 7i32;
    let (ours, raw) = interleaved(
        reps,
        || {
            let ns = per_call(|| {
                // SAFETY: the empty kernel takes one int, is given one, and touches no
                // memory.
                unsafe { function.launch_on(stream, &cfg, &[&arg]) }
            });
            stream.synchronize()?;
            ns
        },
        || {
            let ns = per_call(|| {
                let mut params = [&mut raw_arg as *mut i32 as *mut c_void];
                // SAFETY: one pointer to an int for the kernel's one int parameter; the
                // function and the stream are live on the current device.
                let rc = unsafe {
                    launch_raw(
                        f,
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        s,
                        params.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                check(rc, "cuLaunchKernel")
            });
            stream.synchronize()?;
            ns
        },
    )?;
    Ok(Figure {
        name: "launch_empty_kernel",
        ours,
        raw,
        unit: "ns",
        raw_name: "cuLaunchKernel",
    })
}

fn event_record(stream: &Stream, reps: usize) -> cuda_rt::Result<Figure> {
    let event = Event::new(false, true, false)?;
    let record_raw = sys::api()?.cuEventRecord()?;
    let (e, s) = (event.as_raw(), stream.as_raw());
    let (ours, raw) = interleaved(
        reps,
        || per_call(|| event.record_on(stream)),
        || {
            per_call(|| {
                // SAFETY: `e` and `s` are live handles of the current device.
                check(unsafe { record_raw(e, s) }, "cuEventRecord")
            })
        },
    )?;
    stream.synchronize()?;
    Ok(Figure {
        name: "event_record",
        ours,
        raw,
        unit: "ns",
        raw_name: "cuEventRecord",
    })
}

/// Host memory from `cuMemHostAlloc`, freed on drop.
struct RawPinned(*mut c_void);

impl Drop for RawPinned {
    fn drop(&mut self) {
        if let Ok(free) = sys::api().and_then(|a| a.cuMemFreeHost()) {
            // SAFETY: allocated by cuMemHostAlloc, freed once, after the copies using
            // it were waited for (each measurement synchronises its stream).
            unsafe { free(self.0) };
        }
    }
}

fn pinned_copies(stream: &Stream, reps: usize) -> cuda_rt::Result<Vec<Figure>> {
    let api = sys::api()?;
    let dev = MemoryPointer::from_memory(Arc::new(Memory::new(COPY_BYTES)?));
    let dptr = dev.ptr();
    let mut p = cuda_rt::pinned::get_default_pinned_memory_pool().malloc(COPY_BYTES)?;
    p.as_mut_slice()?.fill(1);
    let mut host: *mut c_void = std::ptr::null_mut();
    // SAFETY: `host` is a valid out pointer.
    check(
        unsafe { api.cuMemHostAlloc()?(&mut host, COPY_BYTES, 0) },
        "cuMemHostAlloc",
    )?;
    let raw_pinned = RawPinned(host);
    // SAFETY: COPY_BYTES bytes were just allocated at `host`, used by nothing else.
    unsafe { std::ptr::write_bytes(raw_pinned.0.cast::<u8>(), 2, COPY_BYTES) };
    let (htod, dtoh) = (api.cuMemcpyHtoDAsync_v2()?, api.cuMemcpyDtoHAsync_v2()?);
    let sync = api.cuStreamSynchronize()?;
    let s = stream.as_raw();
    let gbps = |secs: f64| COPY_BYTES as f64 / secs / 1e9;
    let timed = |f: &mut dyn FnMut() -> cuda_rt::Result<()>| -> cuda_rt::Result<f64> {
        let t = Instant::now();
        f()?;
        Ok(gbps(t.elapsed().as_secs_f64()))
    };

    let (ours, raw) = interleaved(
        reps,
        || {
            timed(&mut || {
                p.copy_to_device_async(&dev, stream)?;
                p.synchronize()
            })
        },
        || {
            timed(&mut || {
                // SAFETY: COPY_BYTES bytes at `raw_pinned` and at `dptr`; the stream is
                // waited for before either is touched again.
                check(
                    unsafe { htod(dptr, raw_pinned.0, COPY_BYTES, s) },
                    "cuMemcpyHtoDAsync",
                )?;
                // SAFETY: `s` is a live stream.
                check(unsafe { sync(s) }, "cuStreamSynchronize")
            })
        },
    )?;
    let h2d = Figure {
        name: "h2d_pinned",
        ours,
        raw,
        unit: "GB/s",
        raw_name: "cuMemcpyHtoDAsync(cuMemHostAlloc)",
    };
    let (ours, raw) = interleaved(
        reps,
        || {
            timed(&mut || {
                p.copy_from_device_async(&dev, stream)?;
                p.synchronize()
            })
        },
        || {
            timed(&mut || {
                // SAFETY: as above, the other way.
                check(
                    unsafe { dtoh(raw_pinned.0, dptr, COPY_BYTES, s) },
                    "cuMemcpyDtoHAsync",
                )?;
                // SAFETY: `s` is a live stream.
                check(unsafe { sync(s) }, "cuStreamSynchronize")
            })
        },
    )?;
    let d2h = Figure {
        name: "d2h_pinned",
        ours,
        raw,
        unit: "GB/s",
        raw_name: "cuMemcpyDtoHAsync(cuMemHostAlloc)",
    };
    stream.synchronize()?;
    drop(raw_pinned);
    Ok(vec![h2d, d2h])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_is_a_cost_whatever_the_unit() {
        let f = |ours, raw, unit| Figure {
            name: "x",
            ours,
            raw,
            unit,
            raw_name: "raw",
        };
        assert_eq!(f(50.0, 100.0, "ns").ratio(), 0.5);
        assert_eq!(f(50.0, 100.0, "GB/s").ratio(), 2.0);
        let j = f(1.0, f64::NAN, "ns").json("gpu");
        assert!(
            j.contains("\"raw\":null") && j.contains("\"device\":\"gpu\""),
            "{j}"
        );
    }
}
