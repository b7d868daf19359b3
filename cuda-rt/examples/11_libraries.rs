//! Libraries: cuBLAS (saxpy, sgemm) and cuRAND (uniform numbers) on typed buffers,
//! through the per-thread, per-device handles cuda-rt keeps bound to the current
//! stream, and the raw calls of `cuda_sys` (the spec's "Low-level API Access").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 11_libraries`. Without a GPU, or without
//! the cuBLAS or cuRAND library, it prints why and exits 0.

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::cuda_sys::result::{cublas::check as cublas_check, curand::check as curand_check};
use cuda_rt::cuda_sys::{cublas, curand};
use cuda_rt::{AsStream, Error, Stream};

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

/// `Some(handle)`, or `None` after saying that the library is not installed.
fn installed<H>(what: &str, handle: cuda_rt::Result<H>) -> cuda_rt::Result<Option<H>> {
    match handle {
        Ok(h) => Ok(Some(h)),
        Err(Error::Load(e)) => {
            println!("skipped: {what} is not installed: {e}");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

fn run() -> cuda_rt::Result<()> {
    let stream = Stream::non_blocking()?;
    let _current = stream.enter()?; // the handles are bound to the current stream
    if let Some(h) = installed("cuBLAS", cuda_rt::get_cublas_handle())? {
        blas(h)?;
    }
    if let Some(g) = installed("cuRAND", cuda_rt::get_curand_generator())? {
        random(g)?;
    }
    stream.synchronize()?;
    println!("ok");
    Ok(())
}

fn blas(h: cublas::cublasHandle_t) -> cuda_rt::Result<()> {
    // y = 3 x + y
    let n = 1 << 20;
    let hx: Vec<f32> = (0..n).map(|i| (i % 100) as f32).collect();
    let x = DeviceBuffer::from_slice(&hx)?;
    let mut y = DeviceBuffer::from_slice(&vec![1.0f32; n])?;
    let (alpha, px) = (3.0f32, x.device_ptr() as *const f32);
    let py = y.as_mut_slice().device_ptr() as *mut f32;
    // SAFETY: `h` is this thread's handle for the current device, where x and y hold n
    // floats each; `alpha` is read on the host during the call (the default pointer
    // mode); y is read back on the handle's stream, after the call.
    let s = unsafe { cublas::cublasSaxpy_v2(h, n as i32, &alpha, px, 1, py, 1)? };
    cublas_check(s, "cublasSaxpy")?;
    let got = y.to_vec()?;
    assert!(got.iter().zip(&hx).all(|(&v, &x)| v == 3.0 * x + 1.0));

    // C = A B, column-major: A is m x k, B is k x n, C is m x n.
    let (m, k, n) = (128, 64, 32);
    let ha: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32).collect();
    let hb: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let a = DeviceBuffer::from_slice(&ha)?;
    let b = DeviceBuffer::from_slice(&hb)?;
    let mut c = DeviceBuffer::<f32>::zeros(m * n)?;
    let (pa, pb) = (a.device_ptr() as *const f32, b.device_ptr() as *const f32);
    let pc = c.as_mut_slice().device_ptr() as *mut f32;
    let (one, zero, op) = (1.0f32, 0.0f32, cublas::cublasOperation_t::CUBLAS_OP_N);
    let (mi, ni, ki) = (m as i32, n as i32, k as i32);
    // SAFETY: as above; a, b and c hold m k, k n and m n floats, with leading
    // dimensions m, k and m.
    let s = unsafe {
        cublas::cublasSgemm_v2(h, op, op, mi, ni, ki, &one, pa, mi, pb, ki, &zero, pc, mi)?
    };
    cublas_check(s, "cublasSgemm")?;
    let got = c.to_vec()?;
    for (col, row) in (0..n).flat_map(|col| (0..m).map(move |row| (col, row))) {
        let want: f32 = (0..k).map(|p| ha[row + p * m] * hb[p + col * k]).sum();
        assert!((got[row + col * m] - want).abs() <= 1e-3 * want.abs().max(1.0));
    }
    println!(
        "cuBLAS: saxpy of {} floats and a ({m} x {k}) ({k} x {n}) sgemm check out",
        hx.len()
    );
    Ok(())
}

fn random(g: curand::curandGenerator_t) -> cuda_rt::Result<()> {
    let mut u = DeviceBuffer::<f32>::zeros(1 << 20)?;
    let (p, len) = (u.as_mut_slice().device_ptr() as *mut f32, u.len());
    // SAFETY: `g` is this thread's generator, a live handle.
    let s = unsafe { curand::curandSetPseudoRandomGeneratorSeed(g, 2024)? };
    curand_check(s, "curandSetPseudoRandomGeneratorSeed")?;
    // SAFETY: `g` is this thread's generator for the current device, where `u` holds
    // `len` floats; `u` is read back on the generator's stream, after the call.
    let s = unsafe { curand::curandGenerateUniform(g, p, len)? };
    curand_check(s, "curandGenerateUniform")?;
    let v = u.to_vec()?;
    let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
    println!("cuRAND: {len} uniform floats, mean {mean:.4}");
    assert!(v.iter().all(|&x| x > 0.0 && x <= 1.0));
    assert!((mean - 0.5).abs() < 0.01);
    Ok(())
}
