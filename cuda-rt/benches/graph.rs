//! Graph replay against the raw driver, measured in the same run.
//!
//! A graph of 1000 empty-kernel nodes is captured once; the same executable graph is
//! launched through [`Graph::launch`] and through a raw `cuGraphLaunch`:
//! - `graph_replay_per_node`: device time per node (launches then a synchronize,
//!   divided by launches x nodes), target within 3% of raw;
//! - `graph_launch_host_call`: host time of one launch call (batches of launches,
//!   synchronized outside the timed part), target within 5% of raw.
//!
//! `cargo bench -p cuda-rt-safe --bench graph` prints one JSON object per line (`name`,
//! `value`, `unit`, `raw`, `raw_name`, `ratio` = value / raw, `target`, `nodes`,
//! `device`), then a table (the shared reporter of `common`);
//! each figure is the median of several repetitions, raw and cuda-rt interleaved,
//! after a warm-up. Without a GPU it prints why it skipped and exits 0.

#[path = "../tests/common/kernels.rs"]
mod kernels;

use std::time::Instant;

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::graph::CaptureMode;
use cuda_rt::{AsStream, Stream, StreamCaptureExt};

mod common;
use common::{interleaved, Figure, Report};

const REPS: usize = 11;
const NODES: usize = 1000;

fn main() {
    if !common::gpu_or_skip("graph") {
        return;
    }
    if let Err(e) = run() {
        eprintln!("graph bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_rt::Result<()> {
    let k = kernels::Kernels::load();
    let name = cuda_rt::Device::new(0)?.name()?;
    let s = Stream::non_blocking()?;
    s.begin_capture(CaptureMode::Global)?;
    for _ in 0..NODES {
        kernels::empty(&k, &s);
    }
    let graph = s.end_capture()?;
    graph.upload(&s)?;
    s.synchronize()?;
    let exec = graph.exec_raw().ok_or_else(|| {
        cuda_rt::Error::invalid_state(cuda_rt::StateKind::Other, "graph not instantiated")
    })?;
    let api = sys::api()?;
    let raw_launch = api.cuGraphLaunch()?;
    let raw_s = s.as_raw();
    let raw = |what: &str| {
        // SAFETY: `exec` is the live executable graph owned by `graph`, `raw_s` a live
        // stream of its context (made current by the safe calls above).
        let rc = unsafe { raw_launch(exec, raw_s) };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what}");
    };

    let mut report = Report::new(format!(
        "graph replay on {name} ({NODES} empty-kernel nodes; ns, median of {REPS})"
    ));
    report.context("nodes", NODES);
    report.context("device", name);

    // Device time per node: LAUNCHES launches, then a synchronize.
    const LAUNCHES: usize = 20;
    let per_node = |f: &dyn Fn()| {
        let t = Instant::now();
        for _ in 0..LAUNCHES {
            f();
        }
        s.synchronize().unwrap();
        t.elapsed().as_nanos() as f64 / (LAUNCHES * NODES) as f64
    };
    let (value, rawv) = interleaved(
        REPS,
        || per_node(&|| graph.launch(&s).unwrap()),
        || per_node(&|| raw("cuGraphLaunch")),
    );
    report.push(
        Figure::new("graph_replay_per_node", value, "ns")
            .raw(rawv, "cuGraphLaunch_1000_empty_nodes")
            .target("ratio <= 1.03"),
    );

    // Host time of one launch call: BATCH calls timed, synchronized untimed.
    const BATCH: usize = 10;
    const ROUNDS: usize = 20;
    let host_call = |f: &dyn Fn()| {
        let mut total = 0u128;
        for _ in 0..ROUNDS {
            let t = Instant::now();
            for _ in 0..BATCH {
                f();
            }
            total += t.elapsed().as_nanos();
            s.synchronize().unwrap();
        }
        total as f64 / (ROUNDS * BATCH) as f64
    };
    let (value, rawv) = interleaved(
        REPS,
        || host_call(&|| graph.launch(&s).unwrap()),
        || host_call(&|| raw("cuGraphLaunch")),
    );
    report.push(
        Figure::new("graph_launch_host_call", value, "ns")
            .raw(rawv, "cuGraphLaunch")
            .target("ratio <= 1.05"),
    );

    report.finish();
    Ok(())
}
