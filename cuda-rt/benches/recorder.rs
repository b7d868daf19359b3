//! `graph::Recorder` against eager launches, measured in the same run (issue 28).
//!
//! A step is 100 small kernels (one to six arguments each, 16384 floats, compiled by
//! NVRTC) on one stream. Figures (microseconds per step, median of several
//! repetitions, eager and recorded interleaved, after a warm-up):
//! - `replay_host_per_step`: host time to queue a step, replayed against 100 eager
//!   `Function::launch_on` calls (goal: ratio <= 0.05, 20x fewer);
//! - `replay_wall_per_step`: a step queued and synchronized (goal: ratio <= 0.2);
//! - `update_wall_per_step`, `update_host_per_step`: other buffers every step (the
//!   recording updated in place by `Recorder::update`, which sets the changed kernel
//!   nodes' arguments without capturing the kernels) against eager on the same
//!   buffers (goal for the wall time: ratio <= 0.33);
//! - `first_call`: a new key's capture, instantiation and launch, synchronized,
//!   against one eager step (how many eager steps the recording costs);
//! - `replay_host_vs_graph_launch`: the recorder's replay call against `Graph::launch`
//!   of the same step captured by hand (what the cache lookup adds);
//! - `replay_wall_vs_graph_launch`: the same, queued and synchronized (the wall time
//!   of a replay is the graph's own time on the device);
//! - `update_host_vs_raw_set_params`: the recorder's update (other buffers every
//!   step) against the bare driver calls that do the same to the hand-made graph:
//!   `cuGraphExecKernelNodeSetParams` on each kernel node with the other buffer, then
//!   `Graph::launch` (what the recorder's closure, its checks and its bookkeeping add);
//! - `empty_capture_host`: a capture of nothing (begin, end, the graph dropped), what
//!   every update by arguments pays besides the driver's calls and the launches;
//! - `empty_graph_wall_per_step`: a hand-made graph of 100 dependent empty kernels,
//!   queued and synchronized, against an eager step: the device's floor per node,
//!   which bounds `replay_wall_per_step` whatever the host does.
//!
//! `cargo bench -p cuda-rt-safe --bench recorder` prints one JSON object per line, then a
//! table (the shared reporter of `common`). Without a GPU or NVRTC it prints why it
//! skipped and exits 0.

use std::cell::RefCell;
use std::ffi::c_void;
use std::ptr::null_mut as null;
use std::time::Instant;

use std::num::NonZeroUsize;

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::cuda_sys::result::graph as raw_graph;
use cuda_rt::graph::{CaptureMode, Outcome, Recorder};
use cuda_rt::prelude::*;
use cuda_rt::{DeviceBuffer, Function, Graph, LaunchConfig, RawModule, Stream};

mod common;
use common::{interleaved, Figure, Report};

const KERNELS: &str = r#"
extern "C" __global__ void k0() {}
extern "C" __global__ void k1(float* a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; a[i] += 1.0f; }
extern "C" __global__ void k2(float* a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] *= 0.5f; }
extern "C" __global__ void k3(float* a, const float* b, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] += b[i]; }
extern "C" __global__ void k4(float* a, const float* b, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] += s * b[i]; }
extern "C" __global__ void k5(float* a, const float* b, const float* c, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] += s * b[i] - c[i]; }
extern "C" __global__ void k6(float* a, const float* b, const float* c, float s, float t, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) a[i] = s * a[i] + t * b[i] + c[i]; }
"#;

const N: usize = 1 << 14;
const KERNELS_PER_STEP: usize = 100;
const REPS: usize = 7;
/// Steps per measurement.
const STEPS: usize = 50;
/// Steps queued before a synchronize, for the host figures.
const BATCH: usize = 10;

fn main() {
    if !common::gpu_or_skip("recorder") {
        return;
    }
    if let Err(e) = cuda_rt::compiler::nvrtc_version() {
        common::skip("recorder", &format!("no NVRTC: {e}"));
        return;
    }
    if let Err(e) = run() {
        eprintln!("recorder bench failed: {e}");
        std::process::exit(1);
    }
}

struct Step {
    k: Vec<Function>,
    b: DeviceBuffer<f32>,
    c: DeviceBuffer<f32>,
    cfg: LaunchConfig,
    n: i32,
}

impl Step {
    /// Queues the step's kernels on `s`, on `a`.
    ///
    /// # Safety
    /// `a` holds `N` floats and outlives every launch of what this queues, also every
    /// replay of a recording of it.
    unsafe fn enqueue(&self, s: &impl AsStream, a: &DeviceBuffer<f32>) -> cuda_rt::Result<()> {
        let (b, c, n, cfg) = (&self.b, &self.c, &self.n, &self.cfg);
        for j in 0..KERNELS_PER_STEP {
            let (sc, t) = (0.5 - 0.01 * (j % 11) as f32, 0.25f32);
            let k = &self.k[j % 6];
            // SAFETY: each kernel gets the arguments of its signature; a (the caller's
            // promise), b and c hold N floats; the launch covers exactly N threads.
            unsafe {
                match j % 6 {
                    0 => k.launch_on(s, cfg, &[a])?,
                    1 => k.launch_on(s, cfg, &[a, n])?,
                    2 => k.launch_on(s, cfg, &[a, b, n])?,
                    3 => k.launch_on(s, cfg, &[a, b, &sc, n])?,
                    4 => k.launch_on(s, cfg, &[a, b, c, &sc, n])?,
                    _ => k.launch_on(s, cfg, &[a, b, c, &sc, &t, n])?,
                }
            }
        }
        Ok(())
    }
}

/// The step, its buffers and the recorders. Fields drop in order: the recorders (and
/// the hand-made graph) before the buffers their recordings use, after a synchronize
/// (see `Drop`), so every launch is done before any buffer goes.
struct Bench {
    rec: RefCell<Recorder<(&'static str, usize)>>,
    fresh: RefCell<Recorder<usize>>,
    graph: Option<Graph>,
    s: Stream,
    step: Step,
    eager_bufs: [DeviceBuffer<f32>; 2],
    rec_bufs: [DeviceBuffer<f32>; 2],
}

impl Drop for Bench {
    fn drop(&mut self) {
        let _ = self.s.synchronize();
    }
}

impl Bench {
    /// One eager step on eager buffer `i % 2`.
    fn eager(&self, i: usize) {
        // SAFETY: the buffers live in `self`, whose drop synchronizes the stream first.
        unsafe { self.step.enqueue(&self.s, &self.eager_bufs[i % 2]) }.unwrap();
    }

    /// The recorded step on `rec_bufs[0]`: replayed after its first call.
    fn replay(&self) -> Outcome {
        self.rec
            .borrow_mut()
            .run(&("step", 0), &self.s, |cs| {
                // SAFETY: the buffers outlive the recorders (fields dropped after them).
                unsafe { self.step.enqueue(cs, &self.rec_bufs[0]) }
            })
            .unwrap()
    }

    /// The step on recorded buffer `i % 2`, the recording updated in place.
    fn update(&self, i: usize) -> Outcome {
        self.rec
            .borrow_mut()
            .update(&("ping-pong", 0), &self.s, |cs| {
                // SAFETY: as in `replay`.
                unsafe { self.step.enqueue(cs, &self.rec_bufs[i % 2]) }
            })
            .unwrap()
    }

    /// The step recorded under a new key (capacity 1: the previous one is evicted).
    fn record_new(&self, key: usize) -> Outcome {
        self.fresh
            .borrow_mut()
            .run(&key, &self.s, |cs| {
                // SAFETY: as in `replay`.
                unsafe { self.step.enqueue(cs, &self.rec_bufs[1]) }
            })
            .unwrap()
    }

    /// Microseconds per step of `f` (which queues one step), queued `BATCH` at a time
    /// and synchronized outside the timed part.
    fn host_us(&self, f: &mut dyn FnMut(usize)) -> f64 {
        let mut total = 0.0;
        let mut i = 0;
        for _ in 0..STEPS / BATCH {
            let t = Instant::now();
            for _ in 0..BATCH {
                f(i);
                i += 1;
            }
            total += t.elapsed().as_secs_f64();
            self.s.synchronize().unwrap();
        }
        total * 1e6 / (STEPS / BATCH * BATCH) as f64
    }

    /// Microseconds per step of `f`, each step queued and synchronized.
    fn wall_us(&self, f: &mut dyn FnMut(usize)) -> f64 {
        let t = Instant::now();
        for i in 0..STEPS {
            f(i);
            self.s.synchronize().unwrap();
        }
        t.elapsed().as_secs_f64() * 1e6 / STEPS as f64
    }
}

/// `v` as a kernel parameter pointer.
fn ptr<T>(v: &mut T) -> *mut c_void {
    (v as *mut T).cast()
}

/// The hand-made graph's kernel nodes, in the step's launch order, with the
/// parameters they were captured with: what a caller updating a graph by hand keeps.
struct RawUpdate {
    exec: sys::CUgraphExec,
    nodes: Vec<(sys::CUgraphNode, sys::CUDA_KERNEL_NODE_PARAMS)>,
}

impl RawUpdate {
    /// `None` unless `graph` (instantiated) holds exactly the step's kernels, in order.
    fn of(graph: &Graph, step: &Step) -> Option<RawUpdate> {
        let exec = graph.exec_raw()?;
        // SAFETY: `graph` is live for the calls; the nodes are its own.
        let nodes = unsafe { raw_graph::get_nodes(graph.as_raw()) }.ok()?;
        if nodes.len() != KERNELS_PER_STEP {
            return None;
        }
        let mut kept = Vec::with_capacity(nodes.len());
        for (j, node) in nodes.into_iter().enumerate() {
            // SAFETY: as above.
            let p = unsafe { raw_graph::kernel_node_get_params(node) }.ok()?;
            if p.func != step.k[j % 6].as_raw() {
                return None;
            }
            kept.push((node, p));
        }
        Some(RawUpdate { exec, nodes: kept })
    }

    /// One step on `rec_bufs[i % 2]`: every kernel node's arguments set, then the
    /// graph launched.
    fn step(&self, b: &Bench, graph: &Graph, i: usize) {
        let mut a = b.rec_bufs[i % 2].device_ptr();
        let (mut bp, mut cp, mut n) = (b.step.b.device_ptr(), b.step.c.device_ptr(), b.step.n);
        let mut t = 0.25f32;
        for (j, (node, captured)) in self.nodes.iter().enumerate() {
            let mut sc = 0.5 - 0.01 * (j % 11) as f32;
            let mut args: [*mut c_void; 6] = match j % 6 {
                0 => [ptr(&mut a), null(), null(), null(), null(), null()],
                1 => [ptr(&mut a), ptr(&mut n), null(), null(), null(), null()],
                2 => [
                    ptr(&mut a),
                    ptr(&mut bp),
                    ptr(&mut n),
                    null(),
                    null(),
                    null(),
                ],
                3 => [
                    ptr(&mut a),
                    ptr(&mut bp),
                    ptr(&mut sc),
                    ptr(&mut n),
                    null(),
                    null(),
                ],
                4 => [
                    ptr(&mut a),
                    ptr(&mut bp),
                    ptr(&mut cp),
                    ptr(&mut sc),
                    ptr(&mut n),
                    null(),
                ],
                _ => [
                    ptr(&mut a),
                    ptr(&mut bp),
                    ptr(&mut cp),
                    ptr(&mut sc),
                    ptr(&mut t),
                    ptr(&mut n),
                ],
            };
            let params = sys::CUDA_KERNEL_NODE_PARAMS {
                kernelParams: args.as_mut_ptr(),
                extra: std::ptr::null_mut(),
                ..*captured
            };
            // SAFETY: the executable and node are the hand-made graph's, live in
            // `bench`; each kernel gets its signature's arguments, read during the
            // call; the buffers they name outlive every launch (fields of `bench`).
            unsafe { raw_graph::exec_kernel_node_set_params(self.exec, *node, &params) }.unwrap();
        }
        graph.launch(&b.s).unwrap();
    }
}

fn run() -> cuda_rt::Result<()> {
    cuda_rt::device::set_device_id(0)?;
    let name = cuda_rt::Device::new(0)?.name()?;
    let module = RawModule::from_source(KERNELS, &[], &[])?;
    let k = ["k1", "k2", "k3", "k4", "k5", "k6"]
        .iter()
        .map(|f| module.get_function(f))
        .collect::<cuda_rt::Result<Vec<_>>>()?;
    let init: Vec<f32> = (0..N).map(|i| (i % 101) as f32 * 0.01).collect();
    let b: Vec<f32> = (0..N).map(|i| (i % 7) as f32 * 0.1).collect();
    let c: Vec<f32> = (0..N).map(|i| (i % 5) as f32 * 0.05).collect();
    let mut bench = Bench {
        rec: RefCell::new(Recorder::new()),
        fresh: RefCell::new(Recorder::with_capacity(NonZeroUsize::MIN)),
        graph: None,
        s: Stream::non_blocking()?,
        step: Step {
            k,
            b: DeviceBuffer::from_slice(&b)?,
            c: DeviceBuffer::from_slice(&c)?,
            cfg: LaunchConfig::new((N / 256) as u32, 256),
            n: N as i32,
        },
        eager_bufs: [
            DeviceBuffer::from_slice(&init)?,
            DeviceBuffer::from_slice(&init)?,
        ],
        rec_bufs: [
            DeviceBuffer::from_slice(&init)?,
            DeviceBuffer::from_slice(&init)?,
        ],
    };

    // The same bytes both ways, checked once before anything is timed (also the
    // warm-up of every kernel).
    for _ in 0..3 {
        bench.eager(0);
        bench.replay();
    }
    bench.s.synchronize()?;
    if bench.eager_bufs[0].to_vec()? != bench.rec_bufs[0].to_vec()? {
        return Err(cuda_rt::Error::invalid_state(
            cuda_rt::StateKind::Other,
            "the recorded step gives other bytes than the eager one",
        ));
    }

    let mut report = Report::new(format!(
        "graph::Recorder on {name}: a step of {KERNELS_PER_STEP} small kernels (1-6 \
         arguments, {N} floats); us per step, median of {REPS}"
    ));
    report.context("kernels_per_step", KERNELS_PER_STEP);
    report.context("device", name);

    let b = &bench;
    let (value, raw) = interleaved(
        REPS,
        || b.host_us(&mut |_| assert_eq!(b.replay(), Outcome::Replayed)),
        || b.host_us(&mut |_| b.eager(0)),
    );
    report.push(
        Figure::new("replay_host_per_step", value, "us")
            .raw(raw, "eager_100_launch_on")
            .target("ratio <= 0.05"),
    );
    let (value, raw) = interleaved(
        REPS,
        || b.wall_us(&mut |_| assert_eq!(b.replay(), Outcome::Replayed)),
        || b.wall_us(&mut |_| b.eager(0)),
    );
    report.push(
        Figure::new("replay_wall_per_step", value, "us")
            .raw(raw, "eager_100_launch_on")
            .target("ratio <= 0.2")
            .note("queued and synchronized"),
    );

    // Other buffers every step: the recording is updated in place.
    let (value, raw) = interleaved(
        REPS,
        || {
            b.wall_us(&mut |i| {
                let _ = b.update(i);
            })
        },
        || b.wall_us(&mut |i| b.eager(i)),
    );
    report.push(
        Figure::new("update_wall_per_step", value, "us")
            .raw(raw, "eager_100_launch_on")
            .target("ratio <= 0.33")
            .note("other buffers every step, queued and synchronized"),
    );
    let (value, raw) = interleaved(
        REPS,
        || {
            b.host_us(&mut |i| {
                let _ = b.update(i);
            })
        },
        || b.host_us(&mut |i| b.eager(i)),
    );
    report.push(
        Figure::new("update_host_per_step", value, "us")
            .raw(raw, "eager_100_launch_on")
            .note("kernel arguments set node by node (no capture of the kernels) + launch"),
    );

    // A new key every time: capture, instantiate, launch, synchronized.
    let mut key = 0;
    let (value, raw) = interleaved(
        REPS,
        || {
            key += 1;
            let t = Instant::now();
            assert_eq!(b.record_new(key), Outcome::Recorded);
            b.s.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e6
        },
        || {
            let t = Instant::now();
            b.eager(0);
            b.s.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e6
        },
    );
    report.push(
        Figure::new("first_call", value, "us")
            .raw(raw, "eager_step_synchronized")
            .note(
                "capture + instantiate + launch, synchronized: the ratio is the eager steps \
                 it costs",
            ),
    );

    // The replay call against Graph::launch of the same step captured by hand.
    let s = &bench.s;
    s.begin_capture(CaptureMode::ThreadLocal)?;
    // SAFETY: rec_bufs[0] lives in `bench`, which drops the graph before it.
    let queued = unsafe { bench.step.enqueue(s, &bench.rec_bufs[0]) };
    let graph = s.end_capture()?;
    queued?;
    bench.graph = Some(graph);
    let b = &bench;
    let graph = b.graph.as_ref().expect("set above");
    let (value, raw) = interleaved(
        REPS,
        || b.host_us(&mut |_| assert_eq!(b.replay(), Outcome::Replayed)),
        || b.host_us(&mut |_| graph.launch(&b.s).unwrap()),
    );
    report.push(
        Figure::new("replay_host_vs_graph_launch", value, "us")
            .raw(raw, "Graph::launch")
            .target("ratio <= 1.1")
            .note("the recorder's lookup and bookkeeping over a plain graph launch"),
    );
    let (value, raw) = interleaved(
        REPS,
        || b.wall_us(&mut |_| assert_eq!(b.replay(), Outcome::Replayed)),
        || b.wall_us(&mut |_| graph.launch(&b.s).unwrap()),
    );
    report.push(
        Figure::new("replay_wall_vs_graph_launch", value, "us")
            .raw(raw, "Graph::launch")
            .note("queued and synchronized: the same graph launched by hand"),
    );

    // The update against the driver's own calls doing the same to the hand-made graph.
    match RawUpdate::of(graph, &b.step) {
        Some(raw_update) => {
            let (value, raw) = interleaved(
                REPS,
                || {
                    b.host_us(&mut |i| {
                        let _ = b.update(i);
                    })
                },
                || b.host_us(&mut |i| raw_update.step(b, graph, i)),
            );
            report.push(
                Figure::new("update_host_vs_raw_set_params", value, "us")
                    .raw(raw, "cuGraphExecKernelNodeSetParams x 100 + launch")
                    .note(
                        "other buffers every step: the recorder's update against the bare \
                         driver calls on the hand-made graph",
                    ),
            );
        }
        None => report.info(
            "update_host_vs_raw_set_params",
            "skipped: the hand-made graph's nodes are not the step's launches in order",
        ),
    }

    // What an update's capture of a closure that queues nothing costs (begin, end, the
    // empty graph dropped), against a replay: the part of an update's overhead over
    // the driver's calls that is not the launches' taking.
    let (value, raw) = interleaved(
        REPS,
        || {
            b.host_us(&mut |_| {
                b.s.begin_capture(CaptureMode::ThreadLocal).unwrap();
                drop(b.s.end_capture().unwrap());
            })
        },
        || b.host_us(&mut |_| assert_eq!(b.replay(), Outcome::Replayed)),
    );
    report.push(
        Figure::new("empty_capture_host", value, "us")
            .raw(raw, "replay")
            .note("begin + end capture of nothing, the empty graph dropped"),
    );

    // The device's floor: 100 dependent empty kernels in one graph.
    let empty = module.get_function("k0")?;
    let one = LaunchConfig::new(1, 32);
    s.begin_capture(CaptureMode::ThreadLocal)?;
    let queued = (0..KERNELS_PER_STEP).try_for_each(|_| {
        // SAFETY: k0 takes no arguments and touches no memory.
        unsafe { empty.launch_on(s, &one, &[]) }
    });
    let floor = s.end_capture()?;
    queued?;
    let (value, raw) = interleaved(
        REPS,
        || b.wall_us(&mut |_| floor.launch(&b.s).unwrap()),
        || b.wall_us(&mut |_| b.eager(0)),
    );
    report.push(
        Figure::new("empty_graph_wall_per_step", value, "us")
            .raw(raw, "eager_100_launch_on")
            .note(
                "100 dependent empty kernels in a graph, queued and synchronized: the \
                 device's own time per node, a floor for replay_wall_per_step",
            ),
    );
    b.s.synchronize()?;
    drop(floor);
    let st = b.rec.borrow().stats();
    report.info("recorder_stats", st.to_string());
    report.finish();
    Ok(())
}
