//! Async: the GPU's work awaited like any I/O. A file is read in chunks and each chunk
//! checksummed on the GPU; while the GPU works on one chunk, the next one is read from
//! the file, and the task awaits `stream.completion()` (a future woken by the driver's
//! stream callback, not by polling) instead of blocking a thread in `synchronize`.
//! tokio runs it here; any executor would do (cuda-rt depends on none).
//!
//! Run it with `cargo run -p cuda-rt-safe --example 13_async`. Without a GPU (or NVRTC,
//! which compiles the checksum kernel) it prints why and exits 0.

use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_rt::prelude::*;
use cuda_rt::{DeviceBuffer, LaunchConfig, PinnedBuffer, RawKernel, Stream};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CHUNK: usize = 8 << 20;
const CHUNKS: usize = 8;

/// Adds the bytes of `p[0..n]` into `*sum`.
const BYTE_SUM: &str = r#"
extern "C" __global__ void byte_sum(const unsigned char* p, unsigned long long n,
                                    unsigned long long* sum) {
    unsigned long long s = 0;
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)blockDim.x * gridDim.x) {
        s += p[i];
    }
    atomicAdd(sum, s);
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
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: no tokio runtime: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = rt.block_on(run()) {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

/// Reads chunk `i` of the file on tokio's blocking pool (positioned reads, so reads of
/// different chunks share nothing).
fn read_chunk(
    file: Arc<std::fs::File>,
    i: usize,
) -> tokio::task::JoinHandle<std::io::Result<Vec<u8>>> {
    tokio::task::spawn_blocking(move || {
        let mut buf = vec![0u8; CHUNK];
        file.read_exact_at(&mut buf, (i * CHUNK) as u64)?;
        Ok(buf)
    })
}

async fn run() -> Result<(), BoxError> {
    // The input: CHUNKS chunks of pseudo-random bytes, in a file removed at the end.
    let input = tempfile::NamedTempFile::new()?;
    write_input(input.path().to_path_buf())?;
    let file = Arc::new(std::fs::File::open(input.path())?);

    let kernel = RawKernel::new(BYTE_SUM, "byte_sum", &[])?;
    let stream = Stream::non_blocking()?;
    let mut pinned = PinnedBuffer::<u8>::zeros(CHUNK)?;
    let mut chunk = DeviceBuffer::<u8>::empty(CHUNK)?;
    let sums = DeviceBuffer::<u64>::zeros(CHUNKS)?;
    let cfg = LaunchConfig::new(264, 256);

    let start = Instant::now();
    let mut gpu_wait = Duration::ZERO;
    let mut host_sums = Vec::with_capacity(CHUNKS);
    let mut reading = Some(read_chunk(file.clone(), 0));
    for i in 0..CHUNKS {
        let Some(read) = reading.take() else {
            return Err("a read is spawned for every chunk".into());
        };
        let bytes = read.await??;
        // The previous chunk's work was awaited, so the pinned and device buffers are
        // free to take this one.
        pinned.as_mut_slice()?.copy_from_slice(&bytes);
        drop(chunk.copy_from_pinned_async(&pinned, &stream)?); // goes on in the background
        let n = CHUNK as u64;
        let sum_i = sums.device_ptr() + (i * std::mem::size_of::<u64>()) as u64;
        // SAFETY: byte_sum(const unsigned char* p, unsigned long long n, unsigned long
        // long* sum): `chunk` holds n bytes; `sum_i` is element i of `sums` (CHUNKS
        // u64s); both live until the end of `run`, after the last await.
        unsafe { cuda_rt::launch!(kernel, &cfg, &stream, (chunk, n, sum_i))? };
        let gpu = stream.completion();
        // The next chunk is read while the GPU copies and sums this one.
        if i + 1 < CHUNKS {
            reading = Some(read_chunk(file.clone(), i + 1));
        }
        // And the host sums it too, to check the GPU's answer.
        host_sums.push(bytes.iter().map(|&b| u64::from(b)).sum::<u64>());
        let t = Instant::now();
        gpu.await?;
        gpu_wait += t.elapsed();
    }
    let total = start.elapsed();

    let gpu_sums = sums.to_vec()?;
    for (i, (g, h)) in gpu_sums.iter().zip(&host_sums).enumerate() {
        if g != h {
            return Err(format!("chunk {i}: the GPU summed {g}, the host {h}").into());
        }
    }
    println!(
        "{CHUNKS} chunks of {} MiB read and checksummed in {:.1} ms; the task awaited the \
         GPU for {:.1} ms of it, the file reads of the next chunks ran meanwhile",
        CHUNK >> 20,
        total.as_secs_f64() * 1e3,
        gpu_wait.as_secs_f64() * 1e3
    );
    println!(
        "every GPU checksum matches the host's (first: {})",
        gpu_sums[0]
    );
    Ok(())
}

fn write_input(path: PathBuf) -> std::io::Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::OpenOptions::new().write(true).open(path)?);
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    let mut block = vec![0u8; 1 << 16];
    for _ in 0..(CHUNKS * CHUNK) / block.len() {
        for b in &mut block {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        f.write_all(&block)?;
    }
    f.flush()
}
