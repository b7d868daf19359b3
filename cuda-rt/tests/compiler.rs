//! NVRTC compiles for real here (no GPU needed, only libnvrtc); the GPU tests load and
//! run what was compiled.

#[path = "common_kernel/mod.rs"]
mod common;

use common::{nvrtc_or_skip, DevBuf, SAXPY};
use cuda_rt::compiler::{Output, Program, RawKernel, RawModule, Target, DEFAULT_SOURCE_NAME};
use cuda_rt::module::ImageKind;
use cuda_rt::{Error, LaunchConfig};

const TEMPLATE: &str = r#"
template <typename T>
__global__ void add_one(T* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += T(1);
}
"#;

macro_rules! nvrtc_test {
    ($name:ident, $body:block) => {
        #[test]
        fn $name() {
            if !nvrtc_or_skip(stringify!($name)) {
                return;
            }
            $body
        }
    };
}

nvrtc_test!(compiles_saxpy_to_ptx_for_an_explicit_arch, {
    let c = Program::new(SAXPY).compile(Target::ptx(90)).unwrap();
    let text = String::from_utf8_lossy(&c.image);
    assert!(text.contains(".target sm_90"), "{text}");
    assert!(text.contains(".entry saxpy"), "{text}");
    assert_eq!(c.image.last(), Some(&0), "PTX keeps its NUL byte");
    assert_eq!(ImageKind::detect(&c.image), ImageKind::Ptx);
    assert_eq!((c.output, c.arch), (Output::Ptx, 90));
});

nvrtc_test!(compiles_saxpy_to_cubin_for_an_explicit_arch, {
    let c = Program::new(SAXPY).compile(Target::cubin(90)).unwrap();
    assert_eq!(ImageKind::detect(&c.image), ImageKind::Cubin);
    assert!(c.image.len() > 100);
});

nvrtc_test!(compile_error_carries_the_log_and_the_source_name, {
    let bad = "extern \"C\" __global__ void k(float* x) { x[0] = undefined_thing; }";
    let err = Program::new(bad)
        .source_name("bad_kernel.cu")
        .compile(Target::cubin(90))
        .unwrap_err();
    let Error::Compile(e) = &err else {
        panic!("not a compile error: {err}")
    };
    assert_eq!(e.name, "NVRTC_ERROR_COMPILATION");
    assert_eq!(e.source_name.as_deref(), Some("bad_kernel.cu"));
    assert!(e.log.contains("undefined_thing"), "log: {}", e.log);
    let msg = err.to_string();
    assert!(
        msg.contains("bad_kernel.cu") && msg.contains("undefined_thing"),
        "{msg}"
    );
});

nvrtc_test!(raw_module_compile_error_uses_the_default_source_name, {
    // RawModule compiles through Program with the default source name.
    let err = Program::new("this is not C++")
        .compile(Target::cubin(90))
        .unwrap_err();
    match err {
        Error::Compile(e) => assert_eq!(e.source_name.as_deref(), Some(DEFAULT_SOURCE_NAME)),
        e => panic!("{e}"),
    }
});

nvrtc_test!(a_bad_option_is_a_compile_error_naming_it, {
    let err = Program::new(SAXPY)
        .options(&["--no-such-option-at-all"])
        .compile(Target::cubin(90))
        .unwrap_err();
    let Error::Compile(e) = &err else {
        panic!("not a compile error: {err}")
    };
    assert_eq!(e.name, "NVRTC_ERROR_INVALID_OPTION", "{err}");
});

nvrtc_test!(options_are_passed_through, {
    let src = "#ifndef SCALE\n#error SCALE not defined\n#endif\nextern \"C\" __global__ void k(float* x) { x[0] = SCALE; }";
    assert!(Program::new(src).compile(Target::ptx(90)).is_err());
    let three = Program::new(src)
        .options(&["-DSCALE=3.0f"])
        .compile(Target::ptx(90))
        .unwrap();
    let four = Program::new(src)
        .options(&["-DSCALE=4.0f"])
        .compile(Target::ptx(90))
        .unwrap();
    assert_ne!(three.image, four.image);
});

nvrtc_test!(warnings_are_in_the_log_of_a_successful_compile, {
    let src = "#warning cuda-rt-test-warning\nextern \"C\" __global__ void k() {}";
    let c = Program::new(src).compile(Target::ptx(90)).unwrap();
    assert!(
        c.warnings().contains("cuda-rt-test-warning"),
        "log: {:?}",
        c.log
    );
});

nvrtc_test!(name_expressions_give_lowered_names, {
    let exprs = ["add_one<float>", "add_one<int>"];
    let c = Program::new(TEMPLATE)
        .name_expressions(&exprs)
        .compile(Target::cubin(90))
        .unwrap();
    let f = c.lowered_name("add_one<float>").unwrap();
    let i = c.lowered_name("add_one<int>").unwrap();
    assert!(f.starts_with("_Z") && i.starts_with("_Z"), "{f} {i}");
    assert_ne!(f, i);
    assert_eq!(c.lowered_name("add_one<double>"), None);
});

nvrtc_test!(an_invalid_name_expression_is_an_error, {
    let err = Program::new(TEMPLATE)
        .name_expressions(&["no_such_template<float>"])
        .compile(Target::cubin(90))
        .unwrap_err();
    assert!(matches!(err, Error::Compile(_)), "{err}");
});

nvrtc_test!(supported_archs_include_sm_90_and_are_sorted, {
    let archs = cuda_rt::compiler::supported_archs().unwrap();
    assert!(archs.contains(&90), "{archs:?}");
    assert!(archs.windows(2).all(|w| w[0] < w[1]), "{archs:?}");
});

nvrtc_test!(nvrtc_version_is_12_or_newer, {
    let (major, _) = cuda_rt::compiler::nvrtc_version().unwrap();
    assert!(major >= 12);
});

cuda_rt::gpu_test!(saxpy_compiled_by_nvrtc_matches_host_values, {
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(SAXPY, "saxpy", &["-std=c++17"]).unwrap();
    let n = 10_000usize;
    let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let y: Vec<f32> = (0..n).map(|i| 1.0 - i as f32 * 0.5).collect();
    let (dx, dy) = (DevBuf::from_slice(&x), DevBuf::from_slice(&y));
    let a = 2.5f32;
    let cfg = LaunchConfig::for_num_elems_occupancy(&k, n as u32).unwrap();
    // SAFETY: saxpy(a, x, y, n): dx and dy hold n f32 each, read back by a synchronous
    // copy; threads past n do nothing.
    unsafe { k.launch(&cfg, &[&a, &dx.ptr, &dy.ptr, &(n as i32)]) }.unwrap();
    let got: Vec<f32> = dy.read(n);
    for i in 0..n {
        assert_eq!(got[i], a * x[i] + y[i], "element {i}");
    }
});

cuda_rt::gpu_test!(
    repeated_raw_kernel_new_shares_the_kernel_until_the_source_changes_in_place,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        // One buffer, rewritten in place between constructions: the thread's recent
        // lookups must compare the source, not only its address.
        let mut src = String::from(r#"extern "C" __global__ void put(int* o) { *o = 1; }"#);
        let a = RawKernel::new(&src, "put", &[]).unwrap();
        let b = RawKernel::new(&src, "put", &[]).unwrap();
        assert!(a.raw_module().same_module(b.raw_module()));
        assert_eq!(a.as_raw(), b.as_raw());
        let at = src.find('1').unwrap();
        src.replace_range(at..at + 1, "2");
        let c = RawKernel::new(&src, "put", &[]).unwrap();
        assert!(!a.raw_module().same_module(c.raw_module()));
        let out = DevBuf::from_slice(&[0i32]);
        // SAFETY: put(int* o) writes one int; out holds one, read back synchronously.
        unsafe { c.launch(&LaunchConfig::new(1, 1), &[&out.ptr]) }.unwrap();
        assert_eq!(out.read::<i32>(1), [2]);
    }
);

cuda_rt::gpu_test!(template_kernel_runs_through_its_name_expression, {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = RawModule::from_source(TEMPLATE, &[], &["add_one<float>", "add_one<int>"]).unwrap();
    let fi = m.get_function("add_one<int>").unwrap();
    let ff = m.get_function("add_one<float>").unwrap();
    let xs = DevBuf::from_slice(&[1i32, 2, 3]);
    let fs = DevBuf::from_slice(&[0.5f32, 1.5]);
    // SAFETY: add_one<int>(int* x, int n): xs holds the 3 ints n = 3 reaches.
    unsafe { fi.launch(&LaunchConfig::new(1, 32), &[&xs.ptr, &3i32]) }.unwrap();
    // SAFETY: add_one<float>(float* x, int n): fs holds the 2 floats n = 2 reaches.
    unsafe { ff.launch(&LaunchConfig::new(1, 32), &[&fs.ptr, &2i32]) }.unwrap();
    assert_eq!(xs.read::<i32>(3), [2, 3, 4]);
    assert_eq!(fs.read::<f32>(2), [1.5, 2.5]);
    // The lowered name works as a plain name too.
    let lowered = m.lowered_name("add_one<int>").unwrap().to_owned();
    assert_eq!(m.get_function(&lowered).unwrap().as_raw(), fi.as_raw());
});

cuda_rt::gpu_test!(ptx_output_is_jit_loaded_and_runs, {
    cuda_rt::device::set_device_id(0).unwrap();
    let cache = cuda_rt::KernelCache::new(None);
    let m = RawModule::from_program(&Program::new(SAXPY), Output::Ptx, &cache).unwrap();
    assert_eq!(m.output(), Some(Output::Ptx));
    let k = m.get_function("saxpy").unwrap();
    let x = DevBuf::from_slice(&[1.0f32, 2.0]);
    let y = DevBuf::from_slice(&[10.0f32, 20.0]);
    // SAFETY: saxpy(a, x, y, n): x and y hold the 2 f32 each that n = 2 reaches.
    unsafe { k.launch(&LaunchConfig::new(1, 2), &[&3.0f32, &x.ptr, &y.ptr, &2i32]) }.unwrap();
    assert_eq!(y.read::<f32>(2), [13.0, 26.0]);
});

cuda_rt::gpu_test!(raw_module_compiles_for_the_device_arch_capped_by_nvrtc, {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = RawModule::from_source(SAXPY, &[], &[]).unwrap();
    let arch = m.arch().unwrap();
    assert!(arch <= common::cc());
    assert!(cuda_rt::compiler::supported_archs()
        .unwrap()
        .contains(&arch));
    let attrs = m.get_function("saxpy").unwrap().attributes().unwrap();
    assert_eq!(attrs.binary_version as u32, arch);
});

nvrtc_test!(cluster_special_registers_compile_for_sm_90, {
    let src = r#"
extern "C" __global__ void k(unsigned* x) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    x[blockIdx.x] = r;
}"#;
    Program::new(src).compile(Target::cubin(90)).unwrap();
});

/// Dynamic parallelism: each block of `parent` launches `child`, which writes
/// out[32 b + t] = 32 b + 3 t. Needs relocatable device code and the device runtime.
const PARENT_CHILD: &str = r#"
extern "C" __global__ void child(int* out, int base) {
    out[base + threadIdx.x] = base + 3 * threadIdx.x;
}
extern "C" __global__ void parent(int* out) {
    if (threadIdx.x == 0) child<<<1, 32>>>(out, blockIdx.x * 32);
}
"#;

nvrtc_test!(rdc_compiles_to_a_relocatable_object_to_link, {
    use cuda_rt::compiler::link::{is_relocatable, is_relocatable_cubin};
    for opts in [&["-rdc=true"][..], &["-dc"][..]] {
        assert!(is_relocatable(opts));
        let c = Program::new(PARENT_CHILD)
            .options(opts)
            .compile(Target::cubin(90))
            .unwrap();
        assert!(
            is_relocatable_cubin(&c.image),
            "{opts:?}: an ELF of type ET_REL"
        );
    }
    let plain = Program::new(SAXPY).compile(Target::cubin(90)).unwrap();
    assert!(!is_relocatable_cubin(&plain.image));
});

nvrtc_test!(
    a_device_side_launch_without_rdc_is_a_compile_error_saying_so,
    {
        let e = Program::new(PARENT_CHILD)
            .compile(Target::cubin(90))
            .unwrap_err();
        assert!(e.to_string().contains("device-side kernel launch"), "{e}");
    }
);

cuda_rt::gpu_test!(
    dynamic_parallelism_parent_launches_a_child_that_writes_a_pattern,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        for opts in [&["-rdc=true"][..], &["-dc"][..]] {
            let k = RawKernel::new(PARENT_CHILD, "parent", opts).unwrap();
            let blocks = 8usize;
            let out = DevBuf::new(4 * 32 * blocks);
            // SAFETY: parent(int* out): its blocks' children write 32 ints each at 32 b,
            // inside out's 32 * blocks ints; the parent grid completes after its children,
            // and out is read back by a synchronous copy.
            unsafe { k.launch(&LaunchConfig::new(blocks as u32, 32), &[&out.ptr]) }.unwrap();
            common::sync();
            let want: Vec<i32> = (0..blocks * 32)
                .map(|i| (i / 32 * 32 + 3 * (i % 32)) as i32)
                .collect();
            assert_eq!(out.read::<i32>(blocks * 32), want, "{opts:?}");
        }
    }
);

cuda_rt::gpu_test!(relocatable_ptx_is_linked_with_the_device_runtime_too, {
    cuda_rt::device::set_device_id(0).unwrap();
    let cache = cuda_rt::KernelCache::new(None);
    let m = RawModule::from_program(
        &Program::new(PARENT_CHILD).options(&["-rdc=true"]),
        Output::Ptx,
        &cache,
    )
    .unwrap();
    let k = m.get_function("parent").unwrap();
    let out = DevBuf::new(4 * 32 * 2);
    // SAFETY: parent(int* out): 2 blocks whose children write 32 ints each inside out's
    // 64 ints; read back by a synchronous copy after the parent grid (and its children).
    unsafe { k.launch(&LaunchConfig::new(2, 32), &[&out.ptr]) }.unwrap();
    common::sync();
    let want: Vec<i32> = (0..64i32).map(|i| i / 32 * 32 + 3 * (i % 32)).collect();
    assert_eq!(out.read::<i32>(64), want);
});

cuda_rt::gpu_test!(the_nvcc_backend_compiles_a_kernel_that_runs, {
    // The GPU machine has the toolkit; elsewhere a GPU without nvcc says so.
    if cuda_rt::compiler::find_nvcc().is_err() {
        assert!(
            std::env::var_os("CUDA_RT_REQUIRE_GPU").is_none()
                || !std::path::Path::new("/usr/local/cuda/bin/nvcc").exists(),
            "nvcc is installed but not found"
        );
        cuda_rt::testing::skip(
            "the_nvcc_backend_compiles_a_kernel_that_runs",
            "no nvcc",
            &"nvcc is not on PATH nor in the CUDA path",
        );
        return;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    let cache = cuda_rt::KernelCache::new(None);
    let p = Program::new(SAXPY).backend(cuda_rt::compiler::Backend::Nvcc);
    for out in [Output::Cubin, Output::Ptx] {
        let m = RawModule::from_program(&p, out, &cache).unwrap();
        let k = m.get_function("saxpy").unwrap();
        let x = DevBuf::from_slice(&[1.0f32, 2.0]);
        let y = DevBuf::from_slice(&[10.0f32, 20.0]);
        // SAFETY: saxpy(a, x, y, n): x and y hold the 2 f32 each that n = 2 reaches.
        unsafe { k.launch(&LaunchConfig::new(1, 2), &[&3.0f32, &x.ptr, &y.ptr, &2i32]) }.unwrap();
        assert_eq!(y.read::<f32>(2), [13.0, 26.0]);
    }
    // A compile error carries nvcc's output.
    let bad = Program::new("__global__ void k() { undeclared(); }")
        .backend(cuda_rt::compiler::Backend::Nvcc);
    let e = bad
        .compile(cuda_rt::compiler::Target::cubin(common::cc()))
        .unwrap_err();
    assert!(e.to_string().contains("undeclared"), "{e}");
});

#[test]
fn raw_kernel_new_refuses_dollar_and_dot_in_a_kernel_name_before_compiling() {
    // No GPU and no NVRTC needed: the name is refused before anything is compiled.
    for bad in ["k$1", "$k", "k.cold"] {
        let e = RawKernel::new(SAXPY, bad, &[]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    kind: cuda_rt::ArgumentKind::InvalidValue,
                    ..
                }
            ),
            "{bad}: {e:?}"
        );
        assert!(e.to_string().contains("is not a valid kernel name"), "{e}");
    }
}

nvrtc_test!(
    a_missing_cccl_header_names_the_pip_package_that_brings_it,
    {
        // Without the toolkit's include folders, as on a machine with the NVRTC wheel alone.
        let src = "#include <cub/cub.cuh>\nextern \"C\" __global__ void k() {}\n";
        let e = Program::new(src)
            .toolkit_includes(false)
            .compile(Target::ptx(90))
            .unwrap_err()
            .to_string();
        assert!(e.contains("open source file \"cub/cub.cuh\""), "{e}");
        assert!(e.contains("pip install nvidia-cuda-cccl"), "{e}");
    }
);
