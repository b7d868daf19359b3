//! Checked calls of the math libraries that cuda-rt makes itself: creating and
//! destroying handles and setting their stream. Each status other than success becomes
//! [`Error::Library`] with the library's name for the code.

use cuda_sys::{cublas, curand, cusolver, cusparse};

use super::lib_status;
use crate::error::{Error, Result};

fn lib_err(call: &'static str, status: u32, name: fn(u32) -> &'static str) -> Result<()> {
    if status == 0 {
        Ok(())
    } else {
        Err(Error::Library {
            call,
            status: status as i32,
            name: name(status),
        })
    }
}

/// `cublasCreate` (in the current context).
pub fn cublas_create() -> Result<cublas::cublasHandle_t> {
    let f = cublas::api()?.cublasCreate_v2()?;
    let mut h: cublas::cublasHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out pointer.
    let st = unsafe { f(&mut h) };
    lib_err("cublasCreate", st.0, lib_status::cublas_status_name)?;
    Ok(h)
}

/// `cublasDestroy`.
pub fn cublas_destroy(h: cublas::cublasHandle_t) -> Result<()> {
    let f = cublas::api()?.cublasDestroy_v2()?;
    // SAFETY: the caller owns `h` and destroys it once.
    let st = unsafe { f(h) };
    lib_err("cublasDestroy", st.0, lib_status::cublas_status_name)
}

/// `cublasSetStream` (`s` is a `CUstream`, which is the runtime's `cudaStream_t`).
pub fn cublas_set_stream(h: cublas::cublasHandle_t, s: usize) -> Result<()> {
    let f = cublas::api()?.cublasSetStream_v2()?;
    // SAFETY: `h` is a live handle; `s` a live stream of the handle's context.
    let st = unsafe { f(h, s as cublas::cudaStream_t) };
    lib_err("cublasSetStream", st.0, lib_status::cublas_status_name)
}

/// `cusolverDnCreate`.
pub fn cusolver_dn_create() -> Result<cusolver::cusolverDnHandle_t> {
    let f = cusolver::api()?.cusolverDnCreate()?;
    let mut h: cusolver::cusolverDnHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out pointer.
    let st = unsafe { f(&mut h) };
    lib_err("cusolverDnCreate", st.0, lib_status::cusolver_status_name)?;
    Ok(h)
}

/// `cusolverDnDestroy`.
pub fn cusolver_dn_destroy(h: cusolver::cusolverDnHandle_t) -> Result<()> {
    let f = cusolver::api()?.cusolverDnDestroy()?;
    // SAFETY: the caller owns `h` and destroys it once.
    let st = unsafe { f(h) };
    lib_err("cusolverDnDestroy", st.0, lib_status::cusolver_status_name)
}

/// `cusolverDnSetStream`.
pub fn cusolver_dn_set_stream(h: cusolver::cusolverDnHandle_t, s: usize) -> Result<()> {
    let f = cusolver::api()?.cusolverDnSetStream()?;
    // SAFETY: `h` is a live handle; `s` a live stream of the handle's context.
    let st = unsafe { f(h, s as cusolver::cudaStream_t) };
    lib_err(
        "cusolverDnSetStream",
        st.0,
        lib_status::cusolver_status_name,
    )
}

/// `cusparseCreate`.
pub fn cusparse_create() -> Result<cusparse::cusparseHandle_t> {
    let f = cusparse::api()?.cusparseCreate()?;
    let mut h: cusparse::cusparseHandle_t = std::ptr::null_mut();
    // SAFETY: `h` is a valid out pointer.
    let st = unsafe { f(&mut h) };
    lib_err("cusparseCreate", st.0, lib_status::cusparse_status_name)?;
    Ok(h)
}

/// `cusparseDestroy`.
pub fn cusparse_destroy(h: cusparse::cusparseHandle_t) -> Result<()> {
    let f = cusparse::api()?.cusparseDestroy()?;
    // SAFETY: the caller owns `h` and destroys it once.
    let st = unsafe { f(h) };
    lib_err("cusparseDestroy", st.0, lib_status::cusparse_status_name)
}

/// `cusparseSetStream`.
pub fn cusparse_set_stream(h: cusparse::cusparseHandle_t, s: usize) -> Result<()> {
    let f = cusparse::api()?.cusparseSetStream()?;
    // SAFETY: `h` is a live handle; `s` a live stream of the handle's context.
    let st = unsafe { f(h, s as cusparse::cudaStream_t) };
    lib_err("cusparseSetStream", st.0, lib_status::cusparse_status_name)
}

/// `curandCreateGenerator` of type `CURAND_RNG_PSEUDO_DEFAULT`.
pub fn curand_create_generator() -> Result<curand::curandGenerator_t> {
    let f = curand::api()?.curandCreateGenerator()?;
    let mut g: curand::curandGenerator_t = std::ptr::null_mut();
    // SAFETY: `g` is a valid out pointer; the type is a valid generator type.
    let st = unsafe { f(&mut g, curand::curandRngType::CURAND_RNG_PSEUDO_DEFAULT) };
    lib_err(
        "curandCreateGenerator",
        st.0,
        lib_status::curand_status_name,
    )?;
    Ok(g)
}

/// `curandDestroyGenerator`.
pub fn curand_destroy_generator(g: curand::curandGenerator_t) -> Result<()> {
    let f = curand::api()?.curandDestroyGenerator()?;
    // SAFETY: the caller owns `g` and destroys it once.
    let st = unsafe { f(g) };
    lib_err(
        "curandDestroyGenerator",
        st.0,
        lib_status::curand_status_name,
    )
}

/// `curandSetStream`.
pub fn curand_set_stream(g: curand::curandGenerator_t, s: usize) -> Result<()> {
    let f = curand::api()?.curandSetStream()?;
    // SAFETY: `g` is a live generator; `s` a live stream of its context.
    let st = unsafe { f(g, s as curand::cudaStream_t) };
    lib_err("curandSetStream", st.0, lib_status::curand_status_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_error_names_the_call_and_status() {
        let e = lib_err("cublasCreate", 3, lib_status::cublas_status_name).unwrap_err();
        assert_eq!(
            e.to_string(),
            "cublasCreate failed: CUBLAS_STATUS_ALLOC_FAILED (3)"
        );
        assert!(lib_err("cublasCreate", 0, lib_status::cublas_status_name).is_ok());
    }

    #[test]
    fn unknown_status_has_a_name_too() {
        assert_eq!(
            lib_status::curand_status_name(9999),
            "CURAND_STATUS_UNKNOWN"
        );
        assert_eq!(
            lib_status::cusparse_status_name(3),
            "CUSPARSE_STATUS_INVALID_VALUE"
        );
        assert_eq!(
            lib_status::cusolver_status_name(7),
            "CUSOLVER_STATUS_INTERNAL_ERROR"
        );
    }
}
