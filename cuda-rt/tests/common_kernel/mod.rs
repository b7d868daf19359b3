//! Helpers shared by the kernel tests: skipping without NVRTC, temporary folders and a
//! minimal device buffer over the raw driver API (device memory types live elsewhere).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use cuda_rt::cuda_sys::driver as sys;

/// Spins for `cycles` clock cycles, then fills `p[0..n]` with `v`.
pub const SPIN_FILL: &str = r#"
extern "C" __global__ void spin_fill(unsigned int* p, int n, unsigned int v, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        p[i] = v;
    }
}
"#;

/// `true` when NVRTC loads; otherwise the test `name` skips, said once and counted in
/// the binary's closing line (see `cuda_rt::testing`), or fails under
/// `CUDA_RT_REQUIRE_GPU=1` (the GPU machine has NVRTC).
pub fn nvrtc_or_skip(name: &str) -> bool {
    cuda_rt::testing::nvrtc_or_skip(name)
}

/// A fresh empty folder under the system temp dir, mode 0700 (the kernel cache refuses
/// a folder others may write to), removed on drop, also when the test panics.
pub struct TempDir(pub PathBuf, tempfile::TempDir);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let d = tempfile::Builder::new()
            .prefix(&format!("cuda-rt-test-{tag}-"))
            .tempdir()
            .expect("create temp dir");
        // The kernel cache refuses a folder others may write to: whatever the umask,
        // a test folder is the user's alone.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700))
            .expect("chmod temp dir");
        TempDir(d.path().to_path_buf(), d)
    }
    pub fn path(&self) -> PathBuf {
        self.0.clone()
    }
}

/// Source text that no earlier run compiled (so disk caches cannot answer it).
pub fn unique(src: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "// run {} {nanos} {}\n{src}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

fn ok(rc: sys::CUresult, what: &str) {
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what} failed");
}

/// Device memory from raw `cuMemAlloc` on device 0's primary context, freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub bytes: usize,
}

impl DevBuf {
    /// `bytes` of device memory (device 0 is made current first).
    pub fn new(bytes: usize) -> DevBuf {
        cuda_rt::device::set_device_id(0).expect("device 0");
        let f = sys::api().unwrap().cuMemAlloc_v2().unwrap();
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: valid out pointer; device 0's context is current.
        ok(unsafe { f(&mut p, bytes.max(1)) }, "cuMemAlloc");
        DevBuf { ptr: p, bytes }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice<T: Copy>(data: &[T]) -> DevBuf {
        let b = DevBuf::new(std::mem::size_of_val(data));
        write_raw(b.ptr, data);
        b
    }

    /// Reads `n` values back (synchronous copy; waits for the legacy stream).
    pub fn read<T: Copy + Default>(&self, n: usize) -> Vec<T> {
        read_raw(self.ptr, n)
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        let f = sys::api().unwrap().cuMemFree_v2().unwrap();
        // SAFETY: allocated by cuMemAlloc, freed once.
        let _ = unsafe { f(self.ptr) };
    }
}

/// Copies `data` to device address `dst` (synchronous).
pub fn write_raw<T: Copy>(dst: u64, data: &[T]) {
    let f = sys::api().unwrap().cuMemcpyHtoD_v2().unwrap();
    // SAFETY: `dst` has room for the slice (callers allocate it so); the host slice
    // is readable for its size.
    ok(
        unsafe { f(dst, data.as_ptr().cast(), std::mem::size_of_val(data)) },
        "cuMemcpyHtoD",
    );
}

/// Reads `n` values from device address `src` (synchronous).
pub fn read_raw<T: Copy + Default>(src: u64, n: usize) -> Vec<T> {
    let mut out = vec![T::default(); n];
    let f = sys::api().unwrap().cuMemcpyDtoH_v2().unwrap();
    // SAFETY: `out` has room for `n` values; `src` holds at least that many bytes.
    ok(
        unsafe {
            f(
                out.as_mut_ptr().cast(),
                src,
                std::mem::size_of_val(&out[..]),
            )
        },
        "cuMemcpyDtoH",
    );
    out
}

/// Blocks until device 0's work is done.
pub fn sync() {
    let f = sys::api().unwrap().cuCtxSynchronize().unwrap();
    // SAFETY: no arguments.
    ok(unsafe { f() }, "cuCtxSynchronize");
}

/// Device 0's compute capability as `10 * major + minor`.
pub fn cc() -> u32 {
    let (a, b) = cuda_rt::Device::new(0)
        .unwrap()
        .compute_capability()
        .unwrap();
    (a * 10 + b) as u32
}

pub const SAXPY: &str = r#"
extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}
"#;
