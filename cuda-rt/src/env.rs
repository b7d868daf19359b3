//! Facts about the CUDA installation: driver and runtime versions, the toolkit and
//! compiler paths (and ROCm's, which are none on a CUDA machine).

use std::path::{Path, PathBuf};

use cuda_sys::{result, CudaVersion};

use crate::error::{Error, Result, StateKind};

/// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. 13.0.
pub fn driver_version() -> Result<CudaVersion> {
    let v = result::version()?;
    CudaVersion::from_int(v).ok_or_else(|| {
        Error::invalid_state(
            StateKind::Unexpected,
            format!("the driver reported version {v}"),
        )
    })
}

/// The version of the CUDA runtime library actually loaded (`cudaRuntimeGetVersion` of
/// the `libcudart` the loader found), e.g. 13.0.
pub fn get_local_runtime_version() -> Result<CudaVersion> {
    use cuda_sys::runtime as rt;
    let f = rt::api()?.cudaRuntimeGetVersion()?;
    let mut v = 0;
    // SAFETY: `v` is a valid out pointer; cudaRuntimeGetVersion needs no device.
    let rc = unsafe { f(&mut v) };
    if rc != rt::cudaError_t::cudaSuccess {
        return Err(Error::Library {
            call: "cudaRuntimeGetVersion",
            status: rc.0 as i32,
            name: "cudaError",
            description: None,
        });
    }
    CudaVersion::from_int(v).ok_or_else(|| {
        Error::invalid_state(
            StateKind::Unexpected,
            format!("the runtime reported version {v}"),
        )
    })
}

/// Where the runtime library was loaded from, once loaded.
pub fn runtime_library_path() -> Result<String> {
    Ok(cuda_sys::runtime::api()?.library().path().to_string())
}

/// Where the driver library was loaded from.
pub fn driver_library_path() -> Result<String> {
    Ok(result::api()?.library().path().to_string())
}

/// The CUDA toolkit folder, as CuPy finds it: `CUDA_PATH` if that folder exists, else
/// two levels above `nvcc` found on `PATH`, else `/usr/local/cuda` if it exists.
pub fn get_cuda_path() -> Option<PathBuf> {
    cuda_path_from(
        std::env::var_os("CUDA_PATH").map(PathBuf::from),
        find_on_path("nvcc"),
        Path::new("/usr/local/cuda"),
    )
}

/// The `nvcc` to use: the `NVCC` variable (which may carry arguments; the first word is
/// the program), else `nvcc` under the CUDA path, else `nvcc` on `PATH`.
pub fn get_nvcc_path() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("NVCC") {
        let s = v.to_string_lossy();
        if let Some(first) = s.split_whitespace().next() {
            return Some(PathBuf::from(first));
        }
    }
    get_cuda_path()
        .map(|p| p.join("bin").join("nvcc"))
        .filter(|p| p.is_file())
        .or_else(|| find_on_path("nvcc"))
}

/// The ROCm folder: `ROCM_HOME` if it exists, else two levels above `hipcc` on `PATH`,
/// else `/opt/rocm` if it exists. `None` on a CUDA-only machine.
pub fn get_rocm_path() -> Option<PathBuf> {
    cuda_path_from(
        std::env::var_os("ROCM_HOME").map(PathBuf::from),
        find_on_path("hipcc"),
        Path::new("/opt/rocm"),
    )
}

/// The `hipcc` to use: the `HIPCC` variable, else `hipcc` under the ROCm path, else on
/// `PATH`. `None` on a CUDA-only machine.
pub fn get_hipcc_path() -> Option<PathBuf> {
    if let Some(v) = std::env::var_os("HIPCC") {
        return Some(PathBuf::from(v));
    }
    get_rocm_path()
        .map(|p| p.join("bin").join("hipcc"))
        .filter(|p| p.is_file())
        .or_else(|| find_on_path("hipcc"))
}

/// The rule shared by the CUDA and ROCm lookups, apart from the environment so it can
/// be tested: the variable's folder if it exists, else two levels above the compiler,
/// else the fixed folder if it exists.
pub fn cuda_path_from(
    var: Option<PathBuf>,
    compiler: Option<PathBuf>,
    fixed: &Path,
) -> Option<PathBuf> {
    if let Some(p) = var.filter(|p| p.is_dir()) {
        return Some(p);
    }
    if let Some(p) = compiler.and_then(|c| c.parent()?.parent().map(Path::to_path_buf)) {
        return Some(p);
    }
    fixed.is_dir().then(|| fixed.to_path_buf())
}

/// The first executable file named `name` in a `PATH` folder.
fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_path_prefers_an_existing_variable_folder() {
        let tmp = std::env::temp_dir();
        assert_eq!(
            cuda_path_from(
                Some(tmp.clone()),
                Some("/x/bin/nvcc".into()),
                Path::new("/nope")
            ),
            Some(tmp)
        );
    }

    #[test]
    fn cuda_path_falls_back_to_two_levels_above_the_compiler_then_the_fixed_folder() {
        let missing = PathBuf::from("/definitely/not/here");
        assert_eq!(
            cuda_path_from(
                Some(missing.clone()),
                Some("/opt/cuda-13/bin/nvcc".into()),
                &missing
            ),
            Some(PathBuf::from("/opt/cuda-13"))
        );
        let tmp = std::env::temp_dir();
        assert_eq!(cuda_path_from(None, None, &tmp), Some(tmp));
        assert_eq!(cuda_path_from(None, None, &missing), None);
    }
}
