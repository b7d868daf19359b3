//! Graphs made easy: a step of 100 small kernels (one to six arguments each), run
//! eagerly and through a `graph::Recorder`, which captures the step once and replays
//! it as one graph launch; then the same step on buffers that change every step,
//! updated in place. Both ways give the same bytes; the times are printed side by
//! side.
//!
//! Run it with `cargo run --release -p cuda-rt-safe --example 12_graphs_made_easy`. Without
//! a GPU, or without NVRTC (the kernels are compiled at run time), it prints why and
//! exits 0.

use std::time::{Duration, Instant};

use cuda_rt::graph::{Outcome, Recorder};
use cuda_rt::prelude::*;
use cuda_rt::{DeviceBuffer, Function, LaunchConfig, RawModule, Stream};

/// Six small kernels, with one to six arguments.
const KERNELS: &str = r#"
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

/// Elements per buffer: 64 blocks of 256 threads, so `k1` (no length argument) covers
/// exactly the buffer.
const N: usize = 1 << 14;
const KERNELS_PER_STEP: usize = 100;
const STEPS: usize = 200;

fn main() {
    if let Err(reason) = cuda_rt::availability() {
        println!("skipped: no GPU: {reason}");
        return;
    }
    if let Err(e) = cuda_rt::compiler::nvrtc_version() {
        println!("skipped: NVRTC is not available: {e}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// The step: its kernels, its two read-only inputs and its launch shape.
struct Step {
    k: Vec<Function>,
    b: DeviceBuffer<f32>,
    c: DeviceBuffer<f32>,
    cfg: LaunchConfig,
    n: i32,
}

impl Step {
    /// Queues the step's 100 kernels on `s`, updating `a`.
    ///
    /// # Safety
    /// `a` holds `N` floats on this device and outlives every launch of what this
    /// queues, also every replay of a recording of it.
    unsafe fn enqueue(&self, s: &impl AsStream, a: &DeviceBuffer<f32>) -> cuda_rt::Result<()> {
        let (b, c, n, cfg) = (&self.b, &self.c, &self.n, &self.cfg);
        for j in 0..KERNELS_PER_STEP {
            let (sc, t) = (0.5 - 0.01 * (j % 11) as f32, 0.25f32);
            let k = &self.k[j % 6];
            // SAFETY: each kernel gets the arguments of its signature above; a, b and c
            // hold N floats (the caller's promise for a; b and c live in `self`,
            // which outlives the recorder in `run`), and the launch covers N threads.
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

fn us_per_step(d: Duration, steps: usize) -> f64 {
    d.as_secs_f64() * 1e6 / steps as f64
}

fn run() -> cuda_rt::Result<()> {
    // Compile and load before anything is captured: only stream work is recorded.
    let module = RawModule::from_source(KERNELS, &[], &[])?;
    let k = ["k1", "k2", "k3", "k4", "k5", "k6"]
        .iter()
        .map(|name| module.get_function(name))
        .collect::<cuda_rt::Result<Vec<_>>>()?;
    let init: Vec<f32> = (0..N).map(|i| (i % 101) as f32 * 0.01).collect();
    let step = Step {
        k,
        b: DeviceBuffer::from_slice(&(0..N).map(|i| (i % 7) as f32 * 0.1).collect::<Vec<_>>())?,
        c: DeviceBuffer::from_slice(&(0..N).map(|i| (i % 5) as f32 * 0.05).collect::<Vec<_>>())?,
        cfg: LaunchConfig::new((N / 256) as u32, 256),
        n: N as i32,
    };
    let stream = Stream::non_blocking()?;
    // The buffers outlive the recorder (declared before it): every replay finds them.
    let a_eager = DeviceBuffer::from_slice(&init)?;
    let a_rec = DeviceBuffer::from_slice(&init)?;
    let ping_pong_eager = [
        DeviceBuffer::from_slice(&init)?,
        DeviceBuffer::from_slice(&init)?,
    ];
    let ping_pong_rec = [
        DeviceBuffer::from_slice(&init)?,
        DeviceBuffer::from_slice(&init)?,
    ];
    let mut recorder = Recorder::new();
    // The warm-up launch of each kernel (lazy loading, parameter sizes) is not timed.
    let warm = DeviceBuffer::from_slice(&init)?;
    // SAFETY: `warm` holds N floats and lives past the synchronize below.
    unsafe { step.enqueue(&stream, &warm)? };
    stream.synchronize()?;

    // Eager: 100 launches per step.
    let t = Instant::now();
    for _ in 0..STEPS {
        // SAFETY: a_eager holds N floats and lives to the end of `run`.
        unsafe { step.enqueue(&stream, &a_eager)? };
    }
    let eager_host = t.elapsed();
    stream.synchronize()?;
    let eager_wall = t.elapsed();

    // Recorded: the first call captures and instantiates, the others replay.
    let t = Instant::now();
    // The key names what shapes the recording: which step, and its size.
    let first = recorder.run(&("step", N), &stream, |cs| {
        // SAFETY: a_rec holds N floats and outlives the recorder.
        unsafe { step.enqueue(cs, &a_rec) }
    })?;
    stream.synchronize()?;
    let first_call = t.elapsed();
    assert_eq!(first, Outcome::Recorded);
    let t = Instant::now();
    for _ in 1..STEPS {
        let o = recorder.run(&("step", N), &stream, |cs| {
            // SAFETY: as above.
            unsafe { step.enqueue(cs, &a_rec) }
        })?;
        assert_eq!(o, Outcome::Replayed);
    }
    let replay_host = t.elapsed();
    stream.synchronize()?;
    let replay_wall = t.elapsed();
    let (want, got) = (a_eager.to_vec()?, a_rec.to_vec()?);
    assert!(want.iter().all(|v| v.is_finite()));
    assert_eq!(got, want, "the recorded steps differ from the eager ones");

    // Other buffers every step (ping-pong): the recording is updated in place.
    let t = Instant::now();
    for i in 0..STEPS {
        // SAFETY: both ping-pong buffers hold N floats and live to the end of `run`.
        unsafe { step.enqueue(&stream, &ping_pong_eager[i % 2])? };
    }
    stream.synchronize()?;
    let eager_pp_wall = t.elapsed();
    let t = Instant::now();
    for i in 0..STEPS {
        let a = &ping_pong_rec[i % 2];
        recorder.update(&("ping-pong", N), &stream, |cs| {
            // SAFETY: both ping-pong buffers outlive the recorder.
            unsafe { step.enqueue(cs, a) }
        })?;
    }
    stream.synchronize()?;
    let update_wall = t.elapsed();
    for (e, r) in ping_pong_eager.iter().zip(&ping_pong_rec) {
        assert_eq!(
            r.to_vec()?,
            e.to_vec()?,
            "the updated steps differ from the eager ones"
        );
    }

    let eh = us_per_step(eager_host, STEPS);
    let rh = us_per_step(replay_host, STEPS - 1);
    let ew = us_per_step(eager_wall, STEPS);
    let rw = us_per_step(replay_wall, STEPS - 1);
    let epw = us_per_step(eager_pp_wall, STEPS);
    let uw = us_per_step(update_wall, STEPS);
    println!("{STEPS} steps of {KERNELS_PER_STEP} kernels on {N} floats, same results both ways");
    println!("                    eager      recorded");
    println!(
        "host us/step     {eh:>9.1}   {rh:>9.1}   ({:.1}x less)",
        eh / rh
    );
    println!(
        "wall us/step     {ew:>9.1}   {rw:>9.1}   ({:.1}x faster)",
        ew / rw
    );
    println!(
        "ping-pong us/step{epw:>9.1}   {uw:>9.1}   ({:.1}x faster, updated in place)",
        epw / uw
    );
    println!(
        "first call (capture, instantiate, run): {:.1} us = {:.1} eager steps",
        first_call.as_secs_f64() * 1e6,
        first_call.as_secs_f64() * 1e6 / ew
    );
    println!("recorder: {}", recorder.stats());
    drop(recorder);
    println!("ok");
    Ok(())
}
