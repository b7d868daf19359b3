//! A tiny hand-written PTX module (sm_90) loaded with the raw driver, for graph tests
//! and benches until the kernel-module API lands: `empty()`, `add_one(float* x, int n)`
//! and `axpy(float* y, const float* x, float a, int n)` (y = a * x + y).
#![allow(dead_code)]

use std::ffi::{c_void, CString};

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::graph::AsFunction;
use cuda_rt::AsStream;

pub const PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64

.visible .entry empty()
{
    ret;
}

.visible .entry add_one(
    .param .u64 add_one_x,
    .param .u32 add_one_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<3>;
    .reg .b64 %rd<5>;

    ld.param.u64 %rd1, [add_one_x];
    ld.param.u32 %r1, [add_one_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra $L_add_one_done;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.s32 %rd3, %r5, 4;
    add.s64 %rd4, %rd2, %rd3;
    ld.global.f32 %f1, [%rd4];
    add.f32 %f2, %f1, 0f3F800000;
    st.global.f32 [%rd4], %f2;
$L_add_one_done:
    ret;
}

.visible .entry axpy(
    .param .u64 axpy_y,
    .param .u64 axpy_x,
    .param .f32 axpy_a,
    .param .u32 axpy_n
)
{
    .reg .pred %p<2>;
    .reg .b32 %r<6>;
    .reg .f32 %f<5>;
    .reg .b64 %rd<8>;

    ld.param.u64 %rd1, [axpy_y];
    ld.param.u64 %rd2, [axpy_x];
    ld.param.f32 %f1, [axpy_a];
    ld.param.u32 %r1, [axpy_n];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.s32 %r5, %r2, %r3, %r4;
    setp.ge.s32 %p1, %r5, %r1;
    @%p1 bra $L_axpy_done;
    cvta.to.global.u64 %rd3, %rd1;
    cvta.to.global.u64 %rd4, %rd2;
    mul.wide.s32 %rd5, %r5, 4;
    add.s64 %rd6, %rd3, %rd5;
    add.s64 %rd7, %rd4, %rd5;
    ld.global.f32 %f2, [%rd7];
    ld.global.f32 %f3, [%rd6];
    fma.rn.f32 %f4, %f1, %f2, %f3;
    st.global.f32 [%rd6], %f4;
$L_axpy_done:
    ret;
}
"#;

fn check(rc: sys::CUresult, what: &str) {
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what}");
}

/// A raw kernel function of the module.
#[derive(Clone, Copy, Debug)]
pub struct Func(pub sys::CUfunction);

// SAFETY: a function of the module `Kernels::load` loads on device 0 and never
// unloads; the parameter sizes are not known.
unsafe impl AsFunction for Func {
    fn as_raw(&self) -> sys::CUfunction {
        self.0
    }
    fn device_id(&self) -> i32 {
        0
    }
    fn keep_alive(&self) -> std::sync::Arc<dyn std::any::Any + Send + Sync> {
        std::sync::Arc::new(())
    }
}

/// The loaded module (never unloaded: the tests' graphs may outlive any one test
/// value, and the process ends soon).
pub struct Kernels {
    pub empty: Func,
    pub add_one: Func,
    pub axpy: Func,
}

impl Kernels {
    /// Loads the PTX on device 0 (its primary context made current through cuda-rt).
    pub fn load() -> Kernels {
        cuda_rt::device::set_device_id(0).unwrap();
        // A stream creation makes the primary context current on this thread.
        drop(cuda_rt::Stream::new().unwrap());
        let api = sys::api().unwrap();
        let image = CString::new(PTX).unwrap();
        let mut m: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `m` is a valid out pointer; `image` is NUL-terminated PTX text.
        check(
            unsafe { api.cuModuleLoadData().unwrap()(&mut m, image.as_ptr().cast()) },
            "cuModuleLoadData",
        );
        let get = |name: &str| {
            let n = CString::new(name).unwrap();
            let mut f: sys::CUfunction = std::ptr::null_mut();
            // SAFETY: valid out pointer, live module, NUL-terminated name.
            check(
                unsafe { api.cuModuleGetFunction().unwrap()(&mut f, m, n.as_ptr()) },
                "cuModuleGetFunction",
            );
            Func(f)
        };
        Kernels {
            empty: get("empty"),
            add_one: get("add_one"),
            axpy: get("axpy"),
        }
    }
}

/// Blocks of 256 threads covering `n`.
pub fn blocks(n: usize) -> u32 {
    n.div_ceil(256) as u32
}

/// Raw `cuLaunchKernel` of `f` on `stream` with `params` (pointers to the values).
///
/// # Safety
/// `f` is a live function of a module loaded in `stream`'s context; `params` holds one
/// pointer per kernel parameter, each to a value of the parameter's type, alive for
/// the call; every pointer the kernel follows is valid for its accesses until the
/// kernel completes (or, captured, until the graph's last launch completes), with no
/// data race (as for `cuda_rt::Function::launch`).
pub unsafe fn launch(
    f: Func,
    grid: u32,
    block: u32,
    stream: &impl AsStream,
    params: &mut [*mut c_void],
) {
    let api = sys::api().unwrap();
    // SAFETY: the caller's guarantees (see `# Safety`).
    check(
        unsafe {
            api.cuLaunchKernel().unwrap()(
                f.0,
                grid,
                1,
                1,
                block,
                1,
                1,
                0,
                stream.as_raw(),
                if params.is_empty() {
                    std::ptr::null_mut()
                } else {
                    params.as_mut_ptr()
                },
                std::ptr::null_mut(),
            )
        },
        "cuLaunchKernel",
    );
}

/// `add_one(x, n)` on `stream`.
///
/// # Safety
/// `k` is the module `Kernels::load` loaded; `x` holds `n` f32 on device 0, alive
/// and not accessed by the host or unordered work until the kernel (or the graph it
/// is captured into, at every launch) completes.
pub unsafe fn add_one(k: &Kernels, stream: &impl AsStream, x: u64, n: usize) {
    let mut x = x;
    let mut n32 = n as i32;
    let mut p = [
        (&mut x as *mut u64).cast::<c_void>(),
        (&mut n32 as *mut i32).cast::<c_void>(),
    ];
    // SAFETY: add_one(float* x, int n) gets a pointer and an int; `x` is the caller's
    // guarantee.
    unsafe { launch(k.add_one, blocks(n), 256, stream, &mut p) };
}

/// `axpy(y, x, a, n)` on `stream`: y = a * x + y.
///
/// # Safety
/// As for [`add_one`], for both `y` (written) and `x` (read).
pub unsafe fn axpy(k: &Kernels, stream: &impl AsStream, y: u64, x: u64, a: f32, n: usize) {
    let (mut y, mut x, mut a) = (y, x, a);
    let mut n32 = n as i32;
    let mut p = [
        (&mut y as *mut u64).cast::<c_void>(),
        (&mut x as *mut u64).cast::<c_void>(),
        (&mut a as *mut f32).cast::<c_void>(),
        (&mut n32 as *mut i32).cast::<c_void>(),
    ];
    // SAFETY: axpy(float* y, const float* x, float a, int n) gets two pointers, a
    // float and an int; `y` and `x` are the caller's guarantee.
    unsafe { launch(k.axpy, blocks(n), 256, stream, &mut p) };
}

/// `empty()` on `stream`, one block of one thread.
pub fn empty(k: &Kernels, stream: &impl AsStream) {
    // SAFETY: empty() takes no parameters and touches no memory; `k.empty` is the
    // function `Kernels::load` looked up.
    unsafe { launch(k.empty, 1, 1, stream, &mut []) };
}
