//! CUDA graphs: capture a few operations queued on a stream (an allocation, a copy, a
//! kernel on typed buffers, a host function), get the instantiated graph, and replay
//! it (the spec's "CUDA Graphs").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 06_graphs`. Without a GPU, or without
//! NVRTC (the kernel is compiled at run time), it prints why and exits 0.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::prelude::*;
use cuda_rt::{CaptureMode, DotFlags, LaunchConfig, RawKernel, Stream};

const ACCUMULATE: &str = r#"
extern "C" __global__ void accumulate(float* y, const float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += x[i];
}
"#;

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

fn run() -> cuda_rt::Result<()> {
    const N: usize = 1 << 20;
    const REPLAYS: u32 = 10;
    let host_x: Vec<f32> = (0..N).map(|i| (i % 1000) as f32).collect();
    // Compile, load and size the launch before capturing: only stream work is captured.
    let kernel = RawKernel::new(ACCUMULATE, "accumulate", &[])?;
    let cfg = LaunchConfig::for_num_elems_occupancy(&kernel, N as u32)?;
    // The stream is current from here on: allocations and copies follow it.
    let stream = Stream::non_blocking()?;
    let _current = stream.enter()?;
    // The buffers are declared before the graph, so they outlive it.
    let x = DeviceBuffer::from_slice(&host_x)?;
    let mut y = DeviceBuffer::<f32>::zeros(N)?;
    let launches = Arc::new(AtomicU32::new(0));

    let graph = {
        stream.begin_capture(CaptureMode::Global)?;
        {
            // An allocation during a capture is a memory node of the graph: a scratch
            // buffer for every replay, freed in the graph when dropped during the capture.
            let scratch = cuda_rt::alloc(N * 4)?;
            scratch.copy_from_device_async(x.as_pointer(), N * 4, None)?;
            let n = N as i32;
            // SAFETY: accumulate(float* y, const float* x, int n): y and scratch hold n
            // floats on this device; y outlives every replay of the graph (it is
            // declared before it), and scratch is a node of the graph itself.
            unsafe { cuda_rt::launch!(kernel, &cfg, &stream, (&mut y, &scratch, n))? };
        }
        let counter = launches.clone();
        stream.launch_host_func_repeatable(move || {
            counter.fetch_add(1, Ordering::Relaxed);
        })?;
        stream.end_capture()? // instantiated, as CuPy does
    };
    println!(
        "captured {} nodes; nothing ran yet: {} host calls",
        graph.node_count()?,
        launches.load(Ordering::Relaxed)
    );
    assert!(graph.to_dot(DotFlags::empty())?.contains("digraph"));

    // Replays: each launch runs the whole graph, y += x, one after the other.
    graph.upload(&stream)?;
    for _ in 0..REPLAYS {
        graph.launch(&stream)?;
    }
    stream.synchronize()?;
    assert_eq!(launches.load(Ordering::Relaxed), REPLAYS);
    let got = y.to_vec()?;
    let bad = (0..N)
        .filter(|&i| got[i] != REPLAYS as f32 * host_x[i])
        .count();
    assert_eq!(
        bad, 0,
        "{bad} of {N} elements differ after {REPLAYS} replays"
    );
    println!("{REPLAYS} replays: y = {REPLAYS} x, host function ran {REPLAYS} times");
    println!("ok");
    Ok(())
}
