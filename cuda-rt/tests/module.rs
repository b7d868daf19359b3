//! Modules and functions: loading, lookups, globals, attributes and occupancy.

#[path = "common_kernel/mod.rs"]
mod common;

use common::{nvrtc_or_skip, read_raw, write_raw, TempDir, SAXPY};
use cuda_rt::compiler::{Program, Target};
use cuda_rt::module::{ImageKind, Module};
use cuda_rt::{Error, LaunchConfig, UnsupportedKind};

const GLOBALS: &str = r#"
__device__ int counters[4];
__constant__ float scale[2];
extern "C" __global__ void bump(float* out) {
    int i = threadIdx.x;
    if (i < 4) { counters[i] += i + 1; out[i] = scale[i % 2] * counters[i]; }
}
"#;

fn compile_for_device(src: &str) -> Vec<u8> {
    Program::new(src)
        .compile(Target::for_device(0).unwrap())
        .unwrap()
        .image
}

#[test]
fn missing_module_file_is_an_error_naming_it() {
    let err = Module::load_file("/no/such/dir/kernels.cubin").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("/no/such/dir/kernels.cubin"), "{msg}");
}

#[test]
fn image_kind_is_told_by_magic_bytes() {
    assert_eq!(ImageKind::detect(b"\x7fELF\x02"), ImageKind::Cubin);
    assert_eq!(
        ImageKind::detect(&[0x50, 0xED, 0x55, 0xBA, 1]),
        ImageKind::Fatbin
    );
    assert_eq!(ImageKind::detect(b"//\n.version 8.0"), ImageKind::Ptx);
}

cuda_rt::gpu_test!(cubin_file_loads_and_its_kernel_is_found, {
    if !nvrtc_or_skip("cubin_file_loads_and_its_kernel_is_found") {
        return;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    let dir = TempDir::new("cubin");
    let path = dir.0.join("saxpy.cubin");
    std::fs::write(&path, compile_for_device(SAXPY)).unwrap();
    let m = Module::load_file(&path).unwrap();
    let f = m.get_function("saxpy").unwrap();
    assert_eq!(f.name(), "saxpy");
    assert_eq!(f.device_id(), 0);
});

cuda_rt::gpu_test!(ptx_bytes_without_nul_load, {
    cuda_rt::device::set_device_id(0).unwrap();
    let arch = cuda_rt::compiler::arch_for_device(0).unwrap();
    let mut ptx = Program::new(SAXPY)
        .compile(Target::ptx(arch))
        .unwrap()
        .image;
    assert_eq!(ptx.pop(), Some(0));
    let m = Module::load_data(&ptx).unwrap();
    m.get_function("saxpy").unwrap();
});

cuda_rt::gpu_test!(bad_ptx_is_an_error_with_the_jit_log, {
    let bad = |lines: &str| {
        cuda_rt::device::set_device_id(0).unwrap();
        let ptx = format!(".version 8.0\n.target sm_90\n.address_size 64\n{lines}");
        Module::load_data(ptx.as_bytes()).unwrap_err().to_string()
    };
    let long = "this is not ptx;\n".repeat(20) + "nor is this one at all;\n";
    let first = bad(&long);
    assert!(first.contains("JIT log:"), "{first}");
    // The thread's log buffer is reused: a later load's error, after a good load,
    // says what the same load says on a new thread (a buffer never used), nothing of
    // the first one's longer log.
    Module::load_data(&compile_for_device(GLOBALS)).unwrap();
    let second = bad("x;\n");
    let fresh = std::thread::spawn(move || bad("x;\n")).join().unwrap();
    assert_eq!(second, fresh);
});

cuda_rt::gpu_test!(unknown_kernel_error_names_it_and_lists_the_exports, {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = Module::load_data(&compile_for_device(GLOBALS)).unwrap();
    let err = m.get_function("saxpy_f64").unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("saxpy_f64"), "{msg}");
    assert!(msg.contains("CUDA_ERROR_NOT_FOUND"), "{msg}");
    if m.function_names().is_ok() {
        assert!(msg.contains("the module exports: bump"), "{msg}");
    }
});

cuda_rt::gpu_test!(function_names_lists_the_kernels, {
    cuda_rt::device::set_device_id(0).unwrap();
    let src = format!("{SAXPY}\nextern \"C\" __global__ void other() {{}}");
    let m = Module::load_data(&compile_for_device(&src)).unwrap();
    match m.function_names() {
        Ok(names) => assert_eq!(names, ["other", "saxpy"]),
        Err(e) => eprintln!("driver cannot enumerate functions: {e}"),
    }
});

cuda_rt::gpu_test!(
    get_global_gives_pointer_and_size_usable_for_read_and_write,
    {
        cuda_rt::device::set_device_id(0).unwrap();
        let m = Module::load_data(&compile_for_device(GLOBALS)).unwrap();
        let (counters, n) = m.get_global("counters").unwrap();
        let (scale, s) = m.get_global("scale").unwrap();
        assert_eq!((n, s), (16, 8));
        write_raw(counters, &[10i32, 20, 30, 40]);
        write_raw(scale, &[1.0f32, 0.5]);
        let out = common::DevBuf::new(16);
        let f = m.get_function("bump").unwrap();
        // SAFETY: bump(float* out): threads below 4 write out[0..4], which holds 4
        // floats read back by a synchronous copy.
        unsafe { f.launch(&LaunchConfig::new(1, 32), &[&out.ptr]) }.unwrap();
        assert_eq!(read_raw::<i32>(counters, 4), [11, 22, 33, 44]);
        assert_eq!(out.read::<f32>(4), [11.0, 11.0, 33.0, 22.0]);
    }
);

cuda_rt::gpu_test!(unknown_global_is_an_error_naming_it, {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = Module::load_data(&compile_for_device(GLOBALS)).unwrap();
    let msg = m.get_global("nope").unwrap_err().to_string();
    assert!(msg.contains("nope"), "{msg}");
});

cuda_rt::gpu_test!(get_texref_says_texture_references_are_gone, {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = Module::load_data(&compile_for_device(GLOBALS)).unwrap();
    let err = m.get_texref("tex").unwrap_err();
    assert!(matches!(
        err,
        Error::NotSupported {
            kind: UnsupportedKind::Removed,
            ..
        }
    ));
    assert!(err.to_string().contains("CUDA 12"), "{err}");
});

cuda_rt::gpu_test!(attributes_are_readable_and_settable, {
    cuda_rt::device::set_device_id(0).unwrap();
    let src = "extern \"C\" __global__ void k(float* x) { __shared__ float s[256]; \
               s[threadIdx.x] = x[threadIdx.x]; __syncthreads(); x[threadIdx.x] = s[255 - threadIdx.x]; }";
    let m = Module::load_data(&compile_for_device(src)).unwrap();
    let f = m.get_function("k").unwrap();
    let a = f.attributes().unwrap();
    assert!(
        a.max_threads_per_block > 0 && a.max_threads_per_block <= 1024,
        "{a:?}"
    );
    assert!(a.num_regs > 0, "{a:?}");
    assert_eq!(a.shared_size_bytes, 1024, "{a:?}");
    assert_eq!(
        a.binary_version as u32,
        cuda_rt::compiler::arch_for_device(0).unwrap()
    );
    f.set_max_dynamic_shared_memory(64 * 1024).unwrap();
    assert_eq!(
        f.attributes().unwrap().max_dynamic_shared_size_bytes,
        64 * 1024
    );
    f.set_preferred_shared_memory_carveout(50).unwrap();
    assert_eq!(f.attributes().unwrap().preferred_shared_memory_carveout, 50);
    assert!(f.set_preferred_shared_memory_carveout(101).is_err());
});

cuda_rt::gpu_test!(occupancy_helpers_give_sane_numbers, {
    cuda_rt::device::set_device_id(0).unwrap();
    let m = Module::load_data(&compile_for_device(SAXPY)).unwrap();
    let f = m.get_function("saxpy").unwrap();
    let blocks = f.max_active_blocks_per_multiprocessor(256, 0).unwrap();
    assert!((1..=64).contains(&blocks), "{blocks}");
    let (min_grid, block) = f.suggested_block_size(0, 0).unwrap();
    assert!(block % 32 == 0 && (32..=1024).contains(&block), "{block}");
    let sms = cuda_rt::Device::new(0)
        .unwrap()
        .multiprocessor_count()
        .unwrap() as u32;
    assert!(min_grid >= sms, "{min_grid} < {sms} SMs");
    let (_, limited) = f.suggested_block_size(0, 128).unwrap();
    assert!(limited <= 128);
    let cfg = LaunchConfig::for_num_elems_occupancy(&f, 1_000_000).unwrap();
    assert_eq!(cfg.block.x, block);
    assert!(cfg.grid.x as u64 * block as u64 >= 1_000_000);
});

cuda_rt::gpu_test!(functions_keep_their_module_loaded, {
    cuda_rt::device::set_device_id(0).unwrap();
    let f = {
        let m = Module::load_data(&compile_for_device(GLOBALS)).unwrap();
        m.get_function("bump").unwrap()
    };
    let out = common::DevBuf::new(16);
    // SAFETY: bump(float* out): out holds the 4 floats it writes, alive past the sync.
    unsafe { f.launch(&LaunchConfig::new(1, 4), &[&out.ptr]) }.unwrap();
    common::sync();
    assert_eq!(f.module().get_global("counters").unwrap().1, 16);
});
