//! NCCL all-reduce through cuda-rt against the raw `ncclAllReduce` in the same run, as
//! nccl-tests measures it: a single-rank communicator on device 0 (or one per GPU with
//! `--all`), 256 MiB of f32, the time per all-reduce from CUDA events around a batch,
//! the bus bandwidth `2 (n-1)/n x bytes / time` (n = 1: the algorithm bandwidth
//! `bytes / time`, since a single rank moves its buffer once).
//!
//! `cargo bench -p cuda-rt-safe --bench nccl [-- MiB]` prints the shared reporter's JSON
//! lines and table. Without a GPU or NCCL it prints why it skipped and exits 0.

mod common;
use common::{interleaved, Figure, Report};

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::cuda_sys::nccl as raw_nccl;
use cuda_rt::cuda_sys::result::nccl as raw;
use cuda_rt::nccl::{Communicator, ReduceOp};
use cuda_rt::{AsStream, Event, Stream};

const REPS: usize = 7;
const BATCH: usize = 20;

fn main() {
    if !common::gpu_or_skip("nccl") {
        return;
    }
    if !cuda_rt::nccl::is_available() {
        common::skip("nccl", "NCCL (libnccl.so.2) is not loadable");
        return;
    }
    if let Err(e) = run() {
        eprintln!("nccl bench failed: {e}");
        std::process::exit(1);
    }
}

/// Milliseconds per operation of `batch` runs of `f` on `s`, timed with events.
fn timed(s: &Stream, mut f: impl FnMut() -> cuda_rt::Result<()>) -> cuda_rt::Result<f64> {
    let (a, b) = (
        Event::new(false, false, false)?,
        Event::new(false, false, false)?,
    );
    a.record_on(s)?;
    for _ in 0..BATCH {
        f()?;
    }
    b.record_on(s)?;
    b.synchronize()?;
    Ok(a.elapsed_time(&b)? as f64 / BATCH as f64)
}

fn run() -> cuda_rt::Result<()> {
    let mib: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(256);
    let n = mib << 18; // f32 elements
    cuda_rt::device::set_device_id(0)?;
    let comm = Communicator::init_all(&[0])?.remove(0);
    let s = Stream::non_blocking()?;
    let send = DeviceBuffer::<f32>::zeros(n)?;
    let mut recv = DeviceBuffer::<f32>::zeros(n)?;
    let (sp, rp) = (send.device_ptr(), recv.device_ptr());
    let mut err = None;
    let (ours, raw_ms) = interleaved(
        REPS,
        || {
            timed(&s, || {
                comm.all_reduce(send.as_slice(), recv.as_mut_slice(), ReduceOp::Sum, &s)
            })
            .unwrap_or_else(|e| {
                err.get_or_insert(e);
                f64::NAN
            })
        },
        || {
            timed(&s, || {
                // SAFETY: both buffers hold `n` f32 on the communicator's device and live
                // past the synchronisation in `timed`; the stream is live.
                Ok(unsafe {
                    raw::all_reduce(
                        sp as *const _,
                        rp as *mut _,
                        n,
                        raw_nccl::ncclDataType_t::ncclFloat32,
                        raw_nccl::ncclRedOp_t::ncclSum,
                        comm.as_raw(),
                        s.as_raw().cast(),
                    )
                }?)
            })
            .unwrap_or(f64::NAN)
        },
    );
    if let Some(e) = err {
        return Err(e);
    }
    let bytes = (n * 4) as f64;
    let gbs = |ms: f64| bytes / (ms * 1e-3) / 1e9;
    let mut report = Report::new(format!("NCCL all-reduce, 1 rank, {mib} MiB f32"));
    report.push(
        Figure::new("all_reduce bandwidth", gbs(ours), "GB/s")
            .raw(gbs(raw_ms), "ncclAllReduce")
            .target("within 3% of the raw call")
            .note(format!("{ours:.3} ms vs {raw_ms:.3} ms per all-reduce")),
    );
    report.finish();
    drop(recv);
    comm.destroy()
}
