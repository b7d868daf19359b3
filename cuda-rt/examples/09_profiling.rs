//! Profiling: a `profile` scope that turns the CUDA profiler on and always off again,
//! NVTX ranges and marks that name the phases of the work on the timeline, and the raw
//! profiler switch (the spec's "Profiling and Debugging").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 09_profiling`; under Nsight Systems,
//! recording only the profiled scope:
//! `nsys profile --capture-range=cudaProfilerApi target/debug/examples/09_profiling`.
//! Without a tool attached the NVTX calls return at once. Without a GPU it prints why
//! and exits 0.

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::profiler::{self, Color, ProfileGuard};

fn main() {
    if let Err(reason) = cuda_rt::availability() {
        println!("skipped: no GPU: {reason}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_rt::Result<()> {
    const N: usize = 1 << 22;
    let host: Vec<u32> = (0..N as u32).collect();

    // CuPy's `with cupy.cuda.profile():` as a closure: the profiler runs while it does,
    // and stops when it returns, with `Ok`, with `Err`, or by panicking.
    let sum = profiler::profile(|| -> cuda_rt::Result<u64> {
        assert_eq!(profiler::open_scopes(), 1);
        let dev = {
            // A range lasts until its guard drops.
            let _upload = profiler::range_color("upload", Color::BLUE)?;
            DeviceBuffer::from_slice(&host)?
        };
        profiler::mark("uploaded")?; // a point on the timeline
        let back = {
            let _download = profiler::range_color("download", Color::GREEN)?;
            dev.to_vec()?
        };
        // Ranges nest; push and pop are the guard-free form.
        profiler::range_push("check")?;
        let sum = back.iter().map(|&v| u64::from(v)).sum();
        profiler::range_pop();
        Ok(sum)
    })?;
    assert_eq!(profiler::open_scopes(), 0, "the scope stopped the profiler");
    assert_eq!(sum, (N as u64 - 1) * N as u64 / 2);
    println!("profiled: uploaded and read back {N} values, sum {sum}");

    // The same as a guard, for scopes that are not one closure. Scopes nest: only the
    // outermost one starts and stops the profiler.
    let outer = ProfileGuard::start()?;
    {
        let _inner = ProfileGuard::start()?;
        assert_eq!(profiler::open_scopes(), 2);
        let mut zeros = DeviceBuffer::<u8>::zeros(1 << 20)?;
        zeros.fill(9)?;
        assert!(zeros.to_vec()?.iter().all(|&b| b == 9));
    }
    assert_eq!(profiler::open_scopes(), 1);
    outer.stop()?; // reports a failure to stop, which a drop cannot

    // The raw switch (`cuProfilerStart` / `cuProfilerStop`): nothing stops it for you.
    profiler::start()?;
    profiler::mark(&format!(
        "raw switch on device {}",
        cuda_rt::get_device_id()
    ))?;
    profiler::stop()?;
    println!("ok");
    Ok(())
}
