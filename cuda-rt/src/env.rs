//! Facts about the CUDA installation: driver and runtime versions.

use cuda_sys::CudaVersion;

use crate::driver;
use crate::error::{Error, Result};

/// The CUDA version the driver supports (`cuDriverGetVersion`), e.g. 13.0.
pub fn driver_version() -> Result<CudaVersion> {
    let v = driver::version()?;
    CudaVersion::from_int(v)
        .ok_or_else(|| Error::InvalidState(format!("the driver reported version {v}")))
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
        });
    }
    CudaVersion::from_int(v)
        .ok_or_else(|| Error::InvalidState(format!("the runtime reported version {v}")))
}

/// Where the runtime library was loaded from, once loaded.
pub fn runtime_library_path() -> Result<String> {
    Ok(cuda_sys::runtime::api()?.library().path().to_string())
}

/// Where the driver library was loaded from.
pub fn driver_library_path() -> Result<String> {
    Ok(driver::api()?.library().path().to_string())
}
