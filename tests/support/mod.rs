//! Where the root crate's tests find the built shim and the Python module, here and on
//! the GPU machine (where `scripts/gpu-run.sh` runs the binaries in another checkout
//! than the one they were built in and names both through variables).

#![allow(dead_code)] // each test binary uses what it needs

use std::path::PathBuf;

/// The folder holding `libcuda_rt_c.so`: `CUDA_RT_SHIM_DIR`, else the folder of the test
/// binary (`target/<profile>/deps`, where `cargo test` builds the cdylib).
pub fn shim_dir() -> PathBuf {
    std::env::var_os("CUDA_RT_SHIM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .unwrap()
                .parent()
                .unwrap()
                .to_path_buf()
        })
}

/// `libcuda_rt_c.so` in [`shim_dir`].
pub fn shim() -> PathBuf {
    shim_dir().join("libcuda_rt_c.so")
}

/// The folder of `cuda_rt_alloc.py`: `CUDA_RT_PYTHON_DIR`, else `python/` of this checkout.
pub fn python_dir() -> PathBuf {
    std::env::var_os("CUDA_RT_PYTHON_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("python"))
}
