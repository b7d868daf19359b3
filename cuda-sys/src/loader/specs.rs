//! Where each CUDA library lives: file names (newest first), override variable, the
//! folders of the Python wheels that ship it and the pip package that installs them
//! (the CUDA 13 wheels; CUDA 12's carry a `-cu12` suffix).

use super::{Kind, LibrarySpec};

/// The CUDA driver, `libcuda.so.1`. Its entry points go through `cuGetProcAddress`.
pub static DRIVER: LibrarySpec = LibrarySpec {
    name: "CUDA driver",
    files: &["libcuda.so.1"],
    override_var: "CUDA_RT_LIBCUDA",
    wheel_dirs: &[],
    kind: Kind::Driver,
    pip_package: None,
};

/// The CUDA runtime, `libcudart`.
pub static RUNTIME: LibrarySpec = LibrarySpec {
    name: "CUDA runtime",
    files: &["libcudart.so.13", "libcudart.so.12"],
    override_var: "CUDA_RT_LIBCUDART",
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cuda_runtime/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-cuda-runtime"),
};

/// NVRTC, the run-time compiler.
pub static NVRTC: LibrarySpec = LibrarySpec {
    name: "NVRTC",
    files: &["libnvrtc.so.13", "libnvrtc.so.12"],
    override_var: "CUDA_RT_LIBNVRTC",
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-cuda-nvrtc"),
};

/// cuBLAS.
pub static CUBLAS: LibrarySpec = LibrarySpec {
    name: "cuBLAS",
    files: &["libcublas.so.13", "libcublas.so.12"],
    override_var: "CUDA_RT_LIBCUBLAS",
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cublas/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-cublas"),
};

/// cuSOLVER (CUDA 13 ships soname 12, CUDA 12 soname 11).
pub static CUSOLVER: LibrarySpec = LibrarySpec {
    name: "cuSOLVER",
    files: &["libcusolver.so.12", "libcusolver.so.11"],
    override_var: "CUDA_RT_LIBCUSOLVER",
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cusolver/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-cusolver"),
};

/// cuSPARSE (soname 12 on CUDA 12 and 13).
pub static CUSPARSE: LibrarySpec = LibrarySpec {
    name: "cuSPARSE",
    files: &["libcusparse.so.12"],
    override_var: "CUDA_RT_LIBCUSPARSE",
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cusparse/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-cusparse"),
};

/// cuRAND (soname 10 on CUDA 12 and 13).
pub static CURAND: LibrarySpec = LibrarySpec {
    name: "cuRAND",
    files: &["libcurand.so.10"],
    override_var: "CUDA_RT_LIBCURAND",
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/curand/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-curand"),
};

/// NCCL (soname 2), also from the `nvidia-nccl-cu12`/`-cu13` wheels.
pub static NCCL: LibrarySpec = LibrarySpec {
    name: "NCCL",
    files: &["libnccl.so.2"],
    override_var: "CUDA_RT_LIBNCCL",
    wheel_dirs: &["nvidia/nccl/lib"],
    kind: Kind::Plain,
    pip_package: Some("nvidia-nccl-cu13"),
};
