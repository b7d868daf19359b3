//! Kernel launches: shapes, shared memory, streams, typed and raw arguments, argument
//! checks, cooperative and cluster launches. Results are checked against the host.

#[path = "common_kernel/mod.rs"]
mod common;

use std::ffi::c_void;

use common::{cc, DevBuf, SAXPY};
use cuda_rt::compiler::RawKernel;
use cuda_rt::launch::{Dim3, LaunchAttribute, PlainData};
use cuda_rt::module::driver_reports_param_sizes;
use cuda_rt::{ArgumentKind, Error, LaunchConfig, Stream, UnsupportedKind};

fn saxpy() -> RawKernel {
    cuda_rt::device::set_device_id(0).unwrap();
    RawKernel::new(SAXPY, "saxpy", &[]).unwrap()
}

cuda_rt::gpu_test!(launch_macro_on_an_explicit_stream_matches_host, {
    let k = saxpy();
    let stream = Stream::new().unwrap();
    let n = 1000i32;
    let x: Vec<f32> = (0..n).map(|i| i as f32 * 0.25).collect();
    let (dx, dy) = (
        DevBuf::from_slice(&x),
        DevBuf::from_slice(&vec![1.0f32; n as usize]),
    );
    let cfg = LaunchConfig::new(Dim3::from((n as u32).div_ceil(128)), 128);
    // SAFETY: saxpy(a, x, y, n): dx and dy hold n f32 each on device 0, alive and
    // untouched until the synchronize below.
    unsafe { cuda_rt::launch!(k, &cfg, &stream, (3.0f32, dx.ptr, dy.ptr, n)) }.unwrap();
    stream.synchronize().unwrap();
    let got: Vec<f32> = dy.read(n as usize);
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, 3.0 * x[i] + 1.0, "element {i}");
    }
});

cuda_rt::gpu_test!(memory_pointers_are_kernel_arguments, {
    let k = saxpy();
    let n = 3000i32;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let px = cuda_rt::alloc(4 * n as usize).unwrap();
    let py = cuda_rt::alloc(4 * n as usize).unwrap();
    px.copy_from_host(&x).unwrap();
    py.copy_from_host(&vec![2.0f32; n as usize]).unwrap();
    let cfg = LaunchConfig::new(Dim3::from((n as u32).div_ceil(256)), 256);
    // SAFETY: saxpy(a, x, y, n): px and py hold n f32 each on device 0; the copy back
    // below runs after the kernel on the current stream, and both outlive it.
    unsafe { cuda_rt::launch!(k, &cfg, (0.5f32, px, py, n)) }.unwrap();
    let mut got = vec![0.0f32; n as usize];
    py.copy_to_host(&mut got).unwrap();
    for (i, g) in got.iter().enumerate() {
        assert_eq!(*g, 0.5 * x[i] + 2.0, "element {i}");
    }
});

cuda_rt::gpu_test!(outputs_passed_as_mut_references_are_written, {
    let k = saxpy();
    let stream = Stream::new().unwrap();
    let n = 2000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let dx = cuda_rt::DeviceBuffer::from_slice(&x).unwrap();
    let mut dy = cuda_rt::DeviceBuffer::from_slice(&vec![1.0f32; n]).unwrap();
    let cfg = LaunchConfig::for_num_elems_with_block(n as u32, 256);
    let len = n as i32;
    // SAFETY: saxpy(a, x, y, n): dx and dy hold n f32 each on device 0; the copies back
    // below run on the current stream after it (the first launch is on it), and the
    // stream launch is synchronized before anything reads dy.
    unsafe { cuda_rt::launch!(k, &cfg, (2.0f32, &dx, &mut dy, len)) }.unwrap();
    let want: Vec<f32> = x.iter().map(|v| 2.0 * v + 1.0).collect();
    assert_eq!(dy.to_vec().unwrap(), want);
    // A mutable view, on an explicit stream; the function form takes `&mut` too.
    let half = n / 2;
    {
        let mut tail = dy.slice_mut(half..).unwrap();
        let m = (n - half) as i32;
        // SAFETY: as above, on the last n - half elements of dy (x's first n - half
        // are read); `to_vec` ran before, so nothing else uses dy until the synchronize.
        unsafe { cuda_rt::launch!(k, &cfg, &stream, (1.0f32, &dx, &mut tail, m)) }.unwrap();
        stream.synchronize().unwrap();
        // SAFETY: the same, once more through `Function::launch_on`.
        unsafe { k.launch_on(&stream, &cfg, &[&1.0f32, &dx, &mut tail, &m]) }.unwrap();
        stream.synchronize().unwrap();
    }
    let got = dy.to_vec().unwrap();
    assert_eq!(got[..half], want[..half]);
    for i in half..n {
        assert_eq!(got[i], want[i] + 2.0 * x[i - half], "element {i}");
    }
    // A memory pointer borrowed mutably.
    let mut py = cuda_rt::alloc(4 * n).unwrap();
    py.copy_from_host(&vec![0.0f32; n]).unwrap();
    // SAFETY: as above, py holding n f32; the copy back runs after it on the same stream.
    unsafe { cuda_rt::launch!(k, &cfg, (0.5f32, &dx, &mut py, len)) }.unwrap();
    let mut back = vec![0.0f32; n];
    py.copy_to_host(&mut back).unwrap();
    assert!(back.iter().zip(&x).all(|(b, v)| *b == 0.5 * v), "{back:?}");
});

cuda_rt::gpu_test!(wrong_argument_count_is_an_error_before_launching, {
    let k = saxpy();
    if !driver_reports_param_sizes() {
        // The count cannot be checked: `param_sizes` says so, not silently nothing.
        let err = k.param_sizes().unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                Error::NotSupported {
                    kind: UnsupportedKind::DriverTooOld {
                        needed: cuda_rt::cuda_sys::CudaVersion {
                            major: 12,
                            minor: 4
                        },
                        ..
                    },
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("needs CUDA 12.4") && msg.contains("saxpy") && msg.contains("not checked"),
            "{msg}"
        );
        eprintln!("skipped the count check: {msg}");
        return;
    }
    let y = DevBuf::new(16);
    // SAFETY: refused before launching (3 arguments for saxpy's 4 parameters).
    let err = unsafe { k.launch(&LaunchConfig::new(1, 4), &[&1.0f32, &y.ptr, &4i32]) }.unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(
            err,
            Error::InvalidArgument {
                kind: ArgumentKind::KernelArguments,
                ..
            }
        ),
        "{msg}"
    );
    assert!(
        msg.contains("saxpy") && msg.contains("4 parameter(s)") && msg.contains("passed 3"),
        "{msg}"
    );
    assert_eq!(k.param_sizes().unwrap(), [4, 8, 8, 4]);
    // The raw form checks the count too.
    let mut one = [&mut 1.0f32 as *mut f32 as *mut c_void];
    // SAFETY: rejected before launching (count mismatch).
    let raw = unsafe {
        k.launch_raw(
            &cuda_rt::get_current_stream(),
            &LaunchConfig::new(1, 1),
            &mut one,
        )
    };
    let msg = raw.unwrap_err().to_string();
    assert!(
        msg.contains("4 parameter(s)") && msg.contains("passed 1"),
        "{msg}"
    );
});

cuda_rt::gpu_test!(wrong_argument_size_is_an_error_before_launching, {
    let k = saxpy();
    if !driver_reports_param_sizes() {
        eprintln!("skipped: the driver cannot report parameter sizes");
        return;
    }
    let (x, y) = (DevBuf::new(16), DevBuf::new(16));
    // n passed as i64 where the kernel takes int.
    // SAFETY: refused before launching (an 8-byte n where saxpy takes a 4-byte int).
    let err = unsafe { k.launch(&LaunchConfig::new(1, 4), &[&1.0f32, &x.ptr, &y.ptr, &4i64]) }
        .unwrap_err();
    assert!(err.to_string().contains("sizes [4, 8, 8, 8]"), "{err}");
});

cuda_rt::gpu_test!(raw_parameter_pointers_launch, {
    let k = saxpy();
    let x = DevBuf::from_slice(&[1.0f32, 2.0, 3.0]);
    let y = DevBuf::from_slice(&[0.0f32; 3]);
    let (mut a, mut px, mut py, mut n) = (2.0f32, x.ptr, y.ptr, 3i32);
    let mut params = [
        &mut a as *mut f32 as *mut c_void,
        &mut px as *mut u64 as *mut c_void,
        &mut py as *mut u64 as *mut c_void,
        &mut n as *mut i32 as *mut c_void,
    ];
    // SAFETY: one pointer per saxpy parameter, each to a live value of its type; the
    // device buffers hold 3 floats.
    unsafe {
        k.launch_raw(
            &cuda_rt::get_current_stream(),
            &LaunchConfig::new(1, 32),
            &mut params,
        )
    }
    .unwrap();
    assert_eq!(y.read::<f32>(3), [2.0, 4.0, 6.0]);
});

#[derive(Clone, Copy)]
#[repr(C)]
struct Params {
    n: i32,
    alpha: f32,
    offset: f64,
}
// SAFETY: repr(C) plain data matching the kernel's struct.
unsafe impl PlainData for Params {}

cuda_rt::gpu_test!(plain_data_struct_is_passed_by_value, {
    cuda_rt::device::set_device_id(0).unwrap();
    let src = r#"
struct Params { int n; float alpha; double offset; };
extern "C" __global__ void affine(Params p, double* out) {
    int i = threadIdx.x;
    if (i < p.n) out[i] = p.alpha * i + p.offset;
}"#;
    let k = RawKernel::new(src, "affine", &[]).unwrap();
    let out = DevBuf::new(8 * 5);
    let p = Params {
        n: 5,
        alpha: 0.5,
        offset: 10.0,
    };
    // SAFETY: affine(Params p, double* out): Params is the kernel's struct (repr(C));
    // out holds p.n = 5 doubles, read back after the kernel by a synchronous copy.
    unsafe { k.launch(&LaunchConfig::new(1, 32), &[&p, &out.ptr]) }.unwrap();
    assert_eq!(out.read::<f64>(5), [10.0, 10.5, 11.0, 11.5, 12.0]);
});

cuda_rt::gpu_test!(three_dimensional_grid_and_block_cover_every_index, {
    cuda_rt::device::set_device_id(0).unwrap();
    let src = r#"
extern "C" __global__ void index3(int* out, int w, int h) {
    int x = blockIdx.x * blockDim.x + threadIdx.x;
    int y = blockIdx.y * blockDim.y + threadIdx.y;
    int z = blockIdx.z * blockDim.z + threadIdx.z;
    out[(z * h + y) * w + x] = x + 100 * y + 10000 * z;
}"#;
    let k = RawKernel::new(src, "index3", &[]).unwrap();
    let (w, h, d) = (8, 6, 4);
    let out = DevBuf::new(4 * w * h * d);
    let cfg = LaunchConfig::new((2, 3, 2), (4u32, 2u32, 2u32));
    // SAFETY: index3(int* out, int w, int h): the grid covers exactly w x h x d
    // threads, and out holds w * h * d ints, read back by a synchronous copy.
    unsafe { k.launch(&cfg, &[&out.ptr, &(w as i32), &(h as i32)]) }.unwrap();
    let got: Vec<i32> = out.read(w * h * d);
    for z in 0..d {
        for y in 0..h {
            for x in 0..w {
                assert_eq!(got[(z * h + y) * w + x], (x + 100 * y + 10000 * z) as i32);
            }
        }
    }
});

cuda_rt::gpu_test!(dynamic_shared_memory_reverses_a_block, {
    cuda_rt::device::set_device_id(0).unwrap();
    let src = r#"
extern "C" __global__ void reverse(int* x) {
    extern __shared__ int s[];
    int t = threadIdx.x, n = blockDim.x;
    s[t] = x[t]; __syncthreads(); x[t] = s[n - 1 - t];
}"#;
    let k = RawKernel::new(src, "reverse", &[]).unwrap();
    let n = 256usize;
    let data: Vec<i32> = (0..n as i32).collect();
    let x = DevBuf::from_slice(&data);
    let cfg = LaunchConfig::new(1, n as u32).with_shared_mem((n * 4) as u32);
    // SAFETY: reverse(int* x): one block of n threads with n ints of shared memory;
    // x holds n ints, read back by a synchronous copy.
    unsafe { k.launch(&cfg, &[&x.ptr]) }.unwrap();
    let expect: Vec<i32> = data.iter().rev().copied().collect();
    assert_eq!(x.read::<i32>(n), expect);
});

/// Every block waits at a hand-made grid barrier: only a launch that guarantees all
/// blocks are resident at once (cooperative) can finish it.
const GRID_SUM: &str = r#"
extern "C" __global__ void grid_sum(int* partial, int* total, unsigned* arrived) {
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = blockIdx.x + 1;
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {}
        if (blockIdx.x == 0) {
            int s = 0;
            for (int b = 0; b < gridDim.x; ++b) s += ((volatile int*)partial)[b];
            *total = s;
        }
    }
}"#;

cuda_rt::gpu_test!(cooperative_launch_syncs_the_whole_grid, {
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(GRID_SUM, "grid_sum", &[]).unwrap();
    let sms = cuda_rt::Device::new(0)
        .unwrap()
        .multiprocessor_count()
        .unwrap() as u32;
    let per_sm = k.max_active_blocks_per_multiprocessor(128, 0).unwrap() as u32;
    let blocks = sms * per_sm.clamp(1, 2);
    let partial = DevBuf::new(4 * blocks as usize);
    let total = DevBuf::new(4);
    let arrived = DevBuf::from_slice(&[0u32]);
    let stream = Stream::new().unwrap();
    // SAFETY: grid_sum(int* partial, int* total, unsigned* arrived): partial holds one
    // int per block, total one int, arrived one zeroed unsigned; all outlive the
    // synchronize below.
    unsafe {
        k.launch_cooperative(
            &stream,
            &LaunchConfig::new(blocks, 128),
            &[&partial.ptr, &total.ptr, &arrived.ptr],
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    let b = blocks as i32;
    assert_eq!(total.read::<i32>(1), [b * (b + 1) / 2]);
    // The same through cuLaunchKernelEx's cooperative attribute.
    let total2 = DevBuf::new(4);
    let arrived2 = DevBuf::from_slice(&[0u32]);
    // SAFETY: as above, with a fresh total and arrived counter.
    unsafe {
        k.launch_ex(
            &stream,
            &LaunchConfig::new(blocks, 128),
            &[LaunchAttribute::Cooperative(true)],
            &[&partial.ptr, &total2.ptr, &arrived2.ptr],
        )
    }
    .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(total2.read::<i32>(1), [b * (b + 1) / 2]);
});

/// GRID_SUM over `n` items with a grid-stride loop: correct for any grid, so a
/// cooperative grid shrunk to fit still sums 1..=n.
const GRID_STRIDE_SUM: &str = r#"
extern "C" __global__ void stride_sum(int* partial, int* total, unsigned* arrived, int n) {
    if (threadIdx.x == 0) {
        for (int i = blockIdx.x; i < n; i += gridDim.x) partial[i] = i + 1;
        __threadfence();
        atomicAdd(arrived, 1u);
        while (atomicAdd(arrived, 0u) < gridDim.x) {}
        if (blockIdx.x == 0) {
            int s = 0;
            for (int i = 0; i < n; ++i) s += ((volatile int*)partial)[i];
            *total = s;
        }
    }
}"#;

cuda_rt::gpu_test!(
    a_clamped_cooperative_launch_shrinks_a_1d_grid_to_the_resident_limit,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let k = RawKernel::new(GRID_STRIDE_SUM, "stride_sum", &[]).unwrap();
        let max = k
            .function()
            .max_cooperative_grid(&LaunchConfig::new(1, 128))
            .unwrap() as u32;
        let n = max * 3 + 7;
        let partial = DevBuf::new(4 * n as usize);
        let total = DevBuf::new(4);
        let arrived = DevBuf::from_slice(&[0u32]);
        let stream = Stream::new().unwrap();
        // SAFETY: stride_sum(int* partial, int* total, unsigned* arrived, int n):
        // partial holds n ints, total one, arrived one zeroed unsigned, all alive until
        // the synchronize; the grid-stride loop covers n items with any grid.
        let ran = unsafe {
            k.launch_cooperative_clamped(
                &stream,
                &LaunchConfig::new(n, 128),
                &[&partial.ptr, &total.ptr, &arrived.ptr, &(n as i32)],
            )
        }
        .unwrap();
        stream.synchronize().unwrap();
        assert!(ran.shrunk());
        assert_eq!(ran.launched, Dim3::new(max, 1, 1));
        assert_eq!(ran.requested, Dim3::new(n, 1, 1));
        let n = i64::from(n);
        assert_eq!(i64::from(total.read::<i32>(1)[0]), n * (n + 1) / 2);
        // A 2-D grid that does not fit is still refused.
        // SAFETY: refused before any launch.
        let e = unsafe {
            k.launch_cooperative_clamped(
                &stream,
                &LaunchConfig::new((max, 2), 128),
                &[&partial.ptr, &total.ptr, &arrived.ptr, &0i32],
            )
        }
        .unwrap_err();
        assert!(e.to_string().contains("only a 1-D grid"), "{e}");
    }
);

cuda_rt::gpu_test!(a_cooperative_grid_too_large_to_be_resident_is_refused, {
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(GRID_SUM, "grid_sum", &[]).unwrap();
    let cfg = LaunchConfig::new(1, 128);
    let max = k.function().max_cooperative_grid(&cfg).unwrap();
    let sms = cuda_rt::Device::new(0)
        .unwrap()
        .multiprocessor_count()
        .unwrap() as u64;
    let per_sm = k.max_active_blocks_per_multiprocessor(128, 0).unwrap() as u64;
    assert_eq!(max, sms * per_sm);
    let too_many = LaunchConfig::new(max as u32 + 1, 128);
    let (partial, total, arrived) = (DevBuf::new(4), DevBuf::new(4), DevBuf::from_slice(&[0u32]));
    let stream = Stream::new().unwrap();
    // SAFETY: refused before any launch (the grid cannot be resident), so the kernel
    // never runs on these one-element buffers.
    let e = unsafe {
        k.launch_cooperative(
            &stream,
            &too_many,
            &[&partial.ptr, &total.ptr, &arrived.ptr],
        )
    }
    .unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                kind: ArgumentKind::InvalidValue,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains(&format!("at most {max}")), "{e}");
    // SAFETY: as above.
    let e = unsafe {
        k.launch_ex(
            &stream,
            &too_many,
            &[LaunchAttribute::Cooperative(true)],
            &[&partial.ptr, &total.ptr, &arrived.ptr],
        )
    }
    .unwrap_err();
    assert!(e.to_string().contains(&format!("at most {max}")), "{e}");
    stream.synchronize().unwrap();
});

cuda_rt::gpu_test!(cluster_launch_groups_blocks_into_clusters, {
    cuda_rt::device::set_device_id(0).unwrap();
    if cc() < 90 {
        eprintln!("skipped: thread block clusters need sm_90 or newer");
        return;
    }
    let src = r#"
extern "C" __global__ void cluster_rank(unsigned* rank, unsigned* size) {
    unsigned r, n;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(n));
    if (threadIdx.x == 0) { rank[blockIdx.x] = r; size[blockIdx.x] = n; }
}"#;
    let k = RawKernel::new(src, "cluster_rank", &[]).unwrap();
    let blocks = 8u32;
    let (rank, size) = (DevBuf::new(4 * 8), DevBuf::new(4 * 8));
    let stream = Stream::new().unwrap();
    let cfg = LaunchConfig::new(blocks, 32);
    let cluster = LaunchAttribute::ClusterDim(Dim3::new(2, 1, 1));
    assert!(k.max_potential_cluster_size(&cfg).unwrap() >= 2);
    // SAFETY: cluster_rank(unsigned* rank, unsigned* size): both hold one unsigned per
    // block (8), and outlive the synchronize below.
    unsafe { k.launch_ex(&stream, &cfg, &[cluster], &[&rank.ptr, &size.ptr]) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(size.read::<u32>(8), [2; 8]);
    assert_eq!(rank.read::<u32>(8), [0, 1, 0, 1, 0, 1, 0, 1]);
    // A grid that is not a multiple of the cluster is refused.
    // SAFETY: refused by the driver; were it launched, 3 blocks stay within rank and
    // size (8 each), which outlive the test.
    let bad = unsafe {
        k.launch_ex(
            &stream,
            &LaunchConfig::new(3, 32),
            &[cluster],
            &[&rank.ptr, &size.ptr],
        )
    };
    assert!(bad.is_err());
});

cuda_rt::gpu_test!(launch_config_for_num_elems_covers_every_element, {
    let k = saxpy();
    let n = 100_003i32;
    let x = DevBuf::from_slice(&vec![1.0f32; n as usize]);
    let y = DevBuf::from_slice(&vec![0.0f32; n as usize]);
    let cfg = LaunchConfig::for_num_elems_occupancy(&k, n as u32).unwrap();
    // SAFETY: saxpy(a, x, y, n): x and y hold n f32 each, read back by a synchronous
    // copy; threads past n do nothing.
    unsafe { k.launch(&cfg, &[&1.0f32, &x.ptr, &y.ptr, &n]) }.unwrap();
    assert!(y.read::<f32>(n as usize).iter().all(|&v| v == 1.0));
});

cuda_rt::gpu_test!(zero_block_size_is_a_driver_error_not_a_crash, {
    let k = saxpy();
    let y = DevBuf::new(4);
    // SAFETY: refused by the driver (block of 0 threads); were it launched, y holds the
    // one f32 that n = 1 reaches.
    let err = unsafe { k.launch(&LaunchConfig::new(1, 0), &[&1.0f32, &y.ptr, &y.ptr, &1i32]) }
        .unwrap_err();
    assert!(err.to_string().contains("cuLaunchKernel"), "{err}");
});
