//! Per-thread, per-device library handles.

use cuda_rt::cuda_sys::{cublas, cusolver, cusparse};
use cuda_rt::libs::{
    cublas_handle_for, get_cublas_handle, get_curand_generator, get_cusolver_handle,
    get_cusparse_handle,
};
use cuda_rt::{gpu_test, AsStream, Device, Error, Stream};

/// `Some(value)`, or `None` after printing why when the library is not installed
/// (a missing library is not a GPU failure; the message says which was missing).
fn or_missing<T>(name: &str, r: cuda_rt::Result<T>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(Error::Load(e)) => {
            eprintln!("skipped {name}: library not installed: {e}");
            None
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

#[test]
fn library_handles_without_cuda_are_errors_not_panics() {
    if cuda_rt::is_available() {
        return;
    }
    assert!(get_cublas_handle().is_err());
    assert!(get_cusolver_handle().is_err());
    assert!(get_cusparse_handle().is_err());
    assert!(get_curand_generator().is_err());
}

gpu_test!(cublas_handle_is_cached_per_thread, {
    Device::new(0).unwrap().use_device().unwrap();
    let Some(h1) = or_missing("cublas_handle_is_cached_per_thread", get_cublas_handle()) else {
        return;
    };
    let h2 = get_cublas_handle().unwrap();
    assert!(!h1.is_null());
    assert_eq!(h1, h2, "same thread, same device: same handle");
    let h1_addr = h1 as usize;
    let other = std::thread::spawn(|| {
        Device::new(0).unwrap().use_device().unwrap();
        get_cublas_handle().unwrap() as usize
    })
    .join()
    .unwrap();
    assert_ne!(other, h1_addr, "another thread has its own handle");
});

gpu_test!(cublas_handle_follows_the_current_stream, {
    Device::new(0).unwrap().use_device().unwrap();
    let Some(h) = or_missing(
        "cublas_handle_follows_the_current_stream",
        get_cublas_handle(),
    ) else {
        return;
    };
    let stream_of = |h: cublas::cublasHandle_t| {
        let mut s: cublas::cudaStream_t = std::ptr::null_mut();
        // SAFETY: `h` is a live handle of this thread; `s` a valid out pointer.
        let st = unsafe { cublas::cublasGetStream_v2(h, &mut s) }.unwrap();
        assert_eq!(st, cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS);
        s as usize
    };
    assert_eq!(stream_of(h), 0, "legacy default stream at first");
    let s = Stream::new().unwrap();
    {
        let _scope = s.enter().unwrap();
        let h2 = get_cublas_handle().unwrap();
        assert_eq!(h2, h);
        assert_eq!(stream_of(h2), s.ptr());
    }
    assert_eq!(
        stream_of(get_cublas_handle().unwrap()),
        0,
        "back to the default"
    );
    assert_eq!(stream_of(cublas_handle_for(&s).unwrap()), s.ptr());
});

gpu_test!(cusolver_handle_is_created_and_cached, {
    Device::new(0).unwrap().use_device().unwrap();
    let Some(h) = or_missing(
        "cusolver_handle_is_created_and_cached",
        get_cusolver_handle(),
    ) else {
        return;
    };
    assert!(!h.is_null());
    assert_eq!(h, get_cusolver_handle().unwrap());
    let s = Stream::new().unwrap();
    let _scope = s.enter().unwrap();
    let h2 = get_cusolver_handle().unwrap();
    let mut got: cusolver::cudaStream_t = std::ptr::null_mut();
    // SAFETY: `h2` is a live handle of this thread; `got` a valid out pointer.
    let st = unsafe { cusolver::cusolverDnGetStream(h2, &mut got) }.unwrap();
    assert_eq!(st, cusolver::cusolverStatus_t::CUSOLVER_STATUS_SUCCESS);
    assert_eq!(got as usize, s.ptr());
});

gpu_test!(cusparse_handle_is_created_and_cached, {
    Device::new(0).unwrap().use_device().unwrap();
    let Some(h) = or_missing(
        "cusparse_handle_is_created_and_cached",
        get_cusparse_handle(),
    ) else {
        return;
    };
    assert!(!h.is_null());
    assert_eq!(h, get_cusparse_handle().unwrap());
    let mut got: cusparse::cudaStream_t = 1 as _;
    // SAFETY: `h` is a live handle of this thread; `got` a valid out pointer.
    let st = unsafe { cusparse::cusparseGetStream(h, &mut got) }.unwrap();
    assert_eq!(st, cusparse::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS);
    assert_eq!(got as usize, 0);
});

gpu_test!(curand_generator_is_created_and_cached, {
    Device::new(0).unwrap().use_device().unwrap();
    let Some(g) = or_missing(
        "curand_generator_is_created_and_cached",
        get_curand_generator(),
    ) else {
        return;
    };
    assert!(!g.is_null());
    assert_eq!(g, get_curand_generator().unwrap());
});

gpu_test!(
    library_handles_of_an_exiting_thread_are_destroyed_cleanly,
    {
        // The thread creates every handle and exits; its handles are destroyed then. A
        // failure there would crash or hang the join.
        std::thread::spawn(|| {
            Device::new(0).unwrap().use_device().unwrap();
            let s = Stream::new().unwrap();
            let _scope = s.enter().unwrap();
            let _ = get_cublas_handle();
            let _ = get_cusolver_handle();
            let _ = get_cusparse_handle();
            let _ = get_curand_generator();
        })
        .join()
        .unwrap();
        // Work on the device still goes through.
        cuda_rt::synchronize().unwrap();
    }
);
