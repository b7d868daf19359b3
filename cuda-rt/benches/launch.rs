//! Launch overhead: cuda-rt against the raw driver in the same run.
//!
//! One JSON object per line per figure, then a table (the shared reporter of
//! `common`). Without a GPU: one skip line, exit 0. Host time per launch of an empty
//! kernel, cuda-rt's launches and the raw `cuLaunchKernel` timed in the same rounds
//! (each round 20k launches of each, on one stream, synchronised after each; the order
//! turns round by round; medians of 15 rounds), so a host whose speed drifts during the
//! run moves both sides of a ratio alike; also the cost of a second `RawKernel::new` of
//! the same source, and first use from a warm disk cache.

use std::ffi::c_void;
use std::time::Instant;

use cuda_rt::compiler::{KernelCache, Output, Program, RawKernel, RawModule};
use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::{AsStream, LaunchConfig, Stream};

mod common;
use common::{median, Figure, Report};

/// Launches of each body per round.
const LAUNCHES: usize = 20_000;
/// Rounds of launch timings (each round times every body once).
const ROUNDS: usize = 15;
/// Module loads are short and vary more: their medians take more runs.
const MODULE_REPS: usize = 15;

const SRC: &str = r#"
extern "C" __global__ void empty1(int a) {}
extern "C" __global__ void empty6(float* x, float* y, float* z, int n, float a, double b) {}
"#;

/// Host microseconds per launch of each of `bodies` (each one launch), timed in rounds:
/// every round runs each body [`LAUNCHES`] times and synchronises `stream`, starting
/// with a different body each round. The median over [`ROUNDS`] rounds, per body.
fn per_launch_us<const N: usize>(stream: &Stream, bodies: [&mut dyn FnMut(); N]) -> [f64; N] {
    let mut times: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(ROUNDS));
    for round in 0..ROUNDS {
        for k in 0..N {
            let i = (round + k) % N;
            let t = Instant::now();
            for _ in 0..LAUNCHES {
                (bodies[i])();
            }
            stream.synchronize().expect("synchronize");
            times[i].push(t.elapsed().as_secs_f64() * 1e6 / LAUNCHES as f64);
        }
    }
    times.map(median)
}

fn main() {
    if !common::gpu_or_skip("launch") {
        return;
    }
    if let Err(e) = run() {
        eprintln!("launch bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_rt::Result<()> {
    cuda_rt::device::set_device_id(0)?;
    let stream = Stream::new()?;
    let module = RawModule::from_source(SRC, &[], &[])?;
    let e1 = module.get_function("empty1")?;
    let e6 = module.get_function("empty6")?;
    let cfg = LaunchConfig::new(1, 32);
    let launch_raw = sys::api()?.cuLaunchKernel()?;
    let mut report = Report::new(format!(
        "launch and module figures on device 0 (host time; launches: medians of {ROUNDS} rounds)"
    ));

    // Warm up both paths (first launch fetches parameter sizes, loads lazily).
    // SAFETY: empty1(int) gets one int and touches no memory.
    unsafe { e1.launch_on(&stream, &cfg, &[&1i32])? };
    // SAFETY: empty6(float*, float*, float*, int, float, double) gets one value of each
    // type; its body is empty, so the null pointers are never followed.
    unsafe {
        e6.launch_on(
            &stream,
            &cfg,
            &[&0u64, &0u64, &0u64, &1i32, &1.0f32, &1.0f64],
        )?
    };
    stream.synchronize()?;

    let a = 7i32;
    let mut a_raw = a;
    let mut raw1 = || {
        let mut p = [&mut a_raw as *mut i32 as *mut c_void];
        // SAFETY: empty1 takes one int; `p` points to one; the stream is alive.
        let rc = unsafe {
            launch_raw(
                e1.as_raw(),
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream.as_raw(),
                p.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    };
    let mut ours1 = || {
        // SAFETY: empty1(int) gets one int and touches no memory.
        unsafe { e1.launch_on(&stream, &cfg, &[&a]) }.expect("launch");
    };
    let [raw1, ours1] = per_launch_us(&stream, [&mut raw1, &mut ours1]);
    report.push(Figure::new("launch_empty_1arg", ours1, "us").raw(raw1, "cuLaunchKernel"));

    let (x, y, z, n, f, d) = (0u64, 0u64, 0u64, 1i32, 1.0f32, 1.0f64);
    let (mut x_raw, mut y_raw, mut z_raw, mut n_raw, mut f_raw, mut d_raw) = (x, y, z, n, f, d);
    let mut raw6 = || {
        let mut p = [
            &mut x_raw as *mut u64 as *mut c_void,
            &mut y_raw as *mut u64 as *mut c_void,
            &mut z_raw as *mut u64 as *mut c_void,
            &mut n_raw as *mut i32 as *mut c_void,
            &mut f_raw as *mut f32 as *mut c_void,
            &mut d_raw as *mut f64 as *mut c_void,
        ];
        // SAFETY: one pointer per parameter of empty6, each to a value of its type.
        let rc = unsafe {
            launch_raw(
                e6.as_raw(),
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream.as_raw(),
                p.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    };
    let mut ours6 = || {
        // SAFETY: empty6 gets one value of each parameter type; its body is empty, so
        // the null pointers x, y, z are never followed.
        unsafe { cuda_rt::launch!(e6, &cfg, &stream, (x, y, z, n, f, d)) }.expect("launch");
    };
    // The same with buffers, an input as `&x` and outputs as `&mut` (what user code
    // writes): the references add no work to the launch.
    let bx = cuda_rt::DeviceBuffer::<f32>::zeros(32)?;
    let (mut by, mut bz) = (
        cuda_rt::DeviceBuffer::<f32>::zeros(32)?,
        cuda_rt::DeviceBuffer::<f32>::zeros(32)?,
    );
    let mut ours6_refs = || {
        // SAFETY: empty6 gets three buffers of 32 floats on its device and one value of
        // each other parameter type; its body is empty.
        unsafe { cuda_rt::launch!(e6, &cfg, &stream, (&bx, &mut by, &mut bz, n, f, d)) }
            .expect("launch");
    };
    let [raw6, ours6, ours6_refs] =
        per_launch_us(&stream, [&mut raw6, &mut ours6, &mut ours6_refs]);
    report.push(Figure::new("launch_empty_6args", ours6, "us").raw(raw6, "cuLaunchKernel"));
    report.push(
        Figure::new("launch_empty_6args_buffer_refs", ours6_refs, "us").raw(raw6, "cuLaunchKernel"),
    );

    // Second construction of the same RawKernel vs one raw cuModuleGetFunction.
    let _ = RawKernel::new(SRC, "empty6", &[])?;
    let iters = 10_000;
    let t = Instant::now();
    for _ in 0..iters {
        let k = RawKernel::new(SRC, "empty6", &[])?;
        std::hint::black_box(&k);
    }
    let second = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    let get_fn = sys::api()?.cuModuleGetFunction()?;
    let t = Instant::now();
    for _ in 0..iters {
        let mut h: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: the module is loaded; the name is NUL-terminated.
        let rc = unsafe { get_fn(&mut h, module.module().as_raw(), c"empty6".as_ptr()) };
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    }
    let raw_get = t.elapsed().as_secs_f64() * 1e6 / iters as f64;
    report.push(
        Figure::new("raw_kernel_second_new", second, "us").raw(raw_get, "cuModuleGetFunction"),
    );

    // First use in a "new process" (a new cache) with a warm disk cache vs a raw
    // cuModuleLoadData of the same cubin.
    let dir = std::env::temp_dir().join(format!("cuda-rt-bench-{}", std::process::id()));
    let program = Program::new(SRC);
    let warm = KernelCache::new(Some(dir.clone()));
    let compiled = warm.compile(&program, cuda_rt::compiler::Target::for_device(0)?)?;
    let mut firsts = Vec::new();
    let mut raws = Vec::new();
    let load = sys::api()?.cuModuleLoadData()?;
    let load_ex = sys::api()?.cuModuleLoadDataEx()?;
    let unload = sys::api()?.cuModuleUnload()?;
    let mut raws_logged = Vec::new();
    let mut raws_fresh = Vec::new();
    for _ in 0..MODULE_REPS {
        let fresh = KernelCache::new(Some(dir.clone()));
        let t = Instant::now();
        let m = RawModule::from_program(&program, Output::Cubin, &fresh)?;
        firsts.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(
            fresh.stats().compiles,
            0,
            "warm disk cache must not compile"
        );
        drop(m);
        let t = Instant::now();
        let mut h: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: a complete cubin image.
        let rc = unsafe { load(&mut h, compiled.image.as_ptr().cast()) };
        raws.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
        // SAFETY: loaded above, unloaded once.
        unsafe { unload(h) };
        // The same load with a JIT error log (what a load with options costs).
        let mut log = vec![0u8; 8192];
        let mut options = [
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: [*mut std::ffi::c_void; 2] = [log.as_mut_ptr().cast(), 8192 as *mut _];
        let t = Instant::now();
        // SAFETY: a complete cubin image; the log buffer holds the size passed with it.
        let rc = unsafe {
            load_ex(
                &mut h,
                compiled.image.as_ptr().cast(),
                2,
                options.as_mut_ptr(),
                values.as_mut_ptr(),
            )
        };
        raws_logged.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
        // SAFETY: loaded above, unloaded once.
        unsafe { unload(h) };
        // The same load from a buffer just made (as an image read from a file is),
        // not the one every raw load above reuses.
        let fresh_image = compiled.image.clone();
        let t = Instant::now();
        // SAFETY: a complete cubin image.
        let rc = unsafe { load(&mut h, fresh_image.as_ptr().cast()) };
        raws_fresh.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
        // SAFETY: loaded above, unloaded once.
        unsafe { unload(h) };
        drop(fresh_image);
    }
    // Where the first use's time goes: a fresh cache's disk lookup alone (the
    // folder's check, the key, the entry's read and its checksum), against the load.
    let mut lookups = Vec::new();
    for _ in 0..MODULE_REPS {
        let fresh = KernelCache::new(Some(dir.clone()));
        let t = Instant::now();
        let c = fresh.compile(&program, cuda_rt::compiler::Target::for_device(0)?)?;
        lookups.push(t.elapsed().as_secs_f64() * 1e3);
        std::hint::black_box(c);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let raw_load = median(raws);
    report.push(
        Figure::new("raw_module_warm_disk_first_use", median(firsts), "ms")
            .raw(raw_load, "cuModuleLoadData"),
    );
    report.push(
        Figure::new("load_with_jit_log", median(raws_logged), "ms")
            .raw(raw_load, "cuModuleLoadData")
            .note("cuModuleLoadDataEx with an error log buffer: what the options cost"),
    );
    report.push(
        Figure::new("load_from_fresh_buffer", median(raws_fresh), "ms")
            .raw(raw_load, "cuModuleLoadData")
            .note("cuModuleLoadData of a copy of the image made just before"),
    );
    report.push(
        Figure::new("warm_disk_lookup_only", median(lookups), "ms")
            .raw(raw_load, "cuModuleLoadData")
            .note(
                "a fresh cache's compile() from disk: folder check, key, read, checksum; no load",
            ),
    );

    report.finish();
    Ok(())
}
