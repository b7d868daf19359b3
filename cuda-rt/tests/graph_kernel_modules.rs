//! A graph keeps the modules of the kernels launched into its capture: every handle to
//! the module (`Module`, `Function`, `RawKernel`, `RawModule`, the kernel cache that
//! made it) may be dropped once the capture has ended, and the graph, its clones and a
//! recorder's recordings still run the kernels, with the right results; the module is
//! unloaded once the last of them is gone, and not kept by a graph whose capture did
//! not launch it.

#[path = "common/kernels.rs"]
mod kernels;

use cuda_rt::compiler::{KernelCache, Output, Program, RawKernel, RawModule};
use cuda_rt::graph::{CaptureMode, Outcome, Recorder};
use cuda_rt::testing::{nvrtc_or_skip, watch_module, ModuleWatch};
use cuda_rt::{
    gpu_test, AsStream, DeviceBuffer, Function, LaunchConfig, Module, Stream, StreamCaptureExt,
};

const N: usize = 4096;

/// These tests run one at a time, as the other graph tests do: CUDA's checks during a
/// capture can make another test's module load or allocation fail.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `add_one(float* x, int n)` of a module loaded for the caller alone (the PTX of
/// `common/kernels.rs`), and a watch on that module. The `Module` handle is dropped
/// here: the function is all that keeps it.
fn add_one_alone() -> (Function, ModuleWatch) {
    cuda_rt::device::set_device_id(0).unwrap();
    let module = Module::load_data(kernels::PTX.as_bytes()).unwrap();
    let watch = watch_module(&module);
    let f = module.get_function("add_one").unwrap();
    (f, watch)
}

fn cfg() -> LaunchConfig {
    LaunchConfig::for_num_elems_with_block(N as u32, 256)
}

gpu_test!(
    a_captured_launch_keeps_its_module_loaded_after_every_handle_is_dropped,
    {
        let _serial = serial();
        let (f, watch) = add_one_alone();
        let s = Stream::non_blocking().unwrap();
        let mut x = DeviceBuffer::<f32>::zeros(N).unwrap();
        let n = N as i32;
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        {
            let _current = s.enter().unwrap();
            // SAFETY (the three launches): add_one(float* x, int n) gets x, which holds
            // n floats on device 0 and outlives the graph and its clone below.
            unsafe { f.launch(&cfg(), &[&mut x, &n]) }.unwrap();
            unsafe { f.launch_on(&s, &cfg(), &[&mut x, &n]) }.unwrap();
            unsafe { cuda_rt::launch!(f, &cfg(), &s, (&mut x, n)) }.unwrap();
        }
        let g = s.end_capture().unwrap();
        drop(f);
        assert!(
            watch.is_loaded(),
            "the graph keeps the module of its kernels"
        );
        for _ in 0..3 {
            g.launch(&s).unwrap();
        }
        s.synchronize().unwrap();
        assert_eq!(
            x.to_vec().unwrap(),
            vec![9.0f32; N],
            "3 launches of 3 add_one"
        );
        // A clone keeps it too, after the original is gone.
        let c = g.try_clone().unwrap();
        drop(g);
        assert!(watch.is_loaded(), "the clone keeps the module");
        c.launch(&s).unwrap();
        s.synchronize().unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![12.0f32; N]);
        drop(c);
        assert!(
            !watch.is_loaded(),
            "the module is unloaded once no graph runs its kernels"
        );
    }
);

gpu_test!(
    a_captured_raw_kernel_keeps_its_module_loaded_when_all_its_handles_go,
    {
        if !nvrtc_or_skip("a_captured_raw_kernel_keeps_its_module_loaded_when_all_its_handles_go") {
            return;
        }
        let _serial = serial();
        cuda_rt::device::set_device_id(0).unwrap();
        const SRC: &str = r#"
        extern "C" __global__ void add_bytes(unsigned char* out, unsigned char v, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) out[i] = (unsigned char)(out[i] + v);
        }"#;
        // A cache of its own, so that nothing but the handles below holds the module.
        let cache = KernelCache::new(None);
        let module = RawModule::from_program(&Program::new(SRC), Output::Cubin, &cache).unwrap();
        let k = RawKernel::from_module(module.clone(), "add_bytes").unwrap();
        let watch = watch_module(k.raw_module().module());
        let s = Stream::non_blocking().unwrap();
        let mut out = DeviceBuffer::<u8>::zeros(N).unwrap();
        let (n, v) = (N as i32, 3u8);
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        {
            let _current = s.enter().unwrap();
            // SAFETY (the four launches): add_bytes(unsigned char* out, unsigned char v,
            // int n) gets out, n bytes on device 0 that outlive the graph.
            unsafe { k.launch(&cfg(), &[&mut out, &v, &n]) }.unwrap();
            unsafe { cuda_rt::launch!(k, &cfg(), (&mut out, v, n)) }.unwrap();
            unsafe { k.launch_ex(&s, &cfg(), &[], &[&mut out, &v, &n]) }.unwrap();
            let (mut p, mut vv, mut nn) = (out.device_ptr(), v, n);
            let mut params = [
                (&mut p as *mut u64).cast::<std::ffi::c_void>(),
                (&mut vv as *mut u8).cast(),
                (&mut nn as *mut i32).cast(),
            ];
            unsafe { k.launch_raw(&s, &cfg(), &mut params) }.unwrap();
        }
        let g = s.end_capture().unwrap();
        drop((k, module, cache));
        assert!(
            watch.is_loaded(),
            "the graph keeps the module of a RawKernel"
        );
        for _ in 0..5 {
            g.launch(&s).unwrap();
        }
        s.synchronize().unwrap();
        // 5 launches of 4 kernels adding 3: 60 in every byte.
        assert_eq!(out.to_vec().unwrap(), vec![60u8; N]);
        drop(g);
        assert!(!watch.is_loaded(), "the module goes with the graph");
    }
);

gpu_test!(
    a_recording_keeps_its_kernels_module_until_the_recorder_goes,
    {
        let _serial = serial();
        let (f, watch) = add_one_alone();
        let s = Stream::non_blocking().unwrap();
        let mut x = DeviceBuffer::<f32>::zeros(N).unwrap();
        let n = N as i32;
        let mut rec: Recorder<u32> = Recorder::new();
        let recorded = rec
            .run(&1, &s, |cs| {
                // SAFETY: add_one(float* x, int n) gets x, n floats on device 0 that
                // outlive the recorder.
                unsafe { cuda_rt::launch!(f, &cfg(), cs, (&mut x, n)) }?;
                // SAFETY: as above.
                unsafe { f.launch_on(cs, &cfg(), &[&mut x, &n]) }
            })
            .unwrap();
        assert_eq!(recorded, Outcome::Recorded);
        drop(f);
        assert!(watch.is_loaded(), "the recording keeps the module");
        for _ in 0..3 {
            let replayed = rec
                .run(&1, &s, |_| unreachable!("a replay runs no closure"))
                .unwrap();
            assert_eq!(replayed, Outcome::Replayed);
        }
        s.synchronize().unwrap();
        assert_eq!(
            x.to_vec().unwrap(),
            vec![8.0f32; N],
            "4 launches of 2 add_one"
        );
        assert!(watch.is_loaded());
        drop(rec);
        assert!(
            !watch.is_loaded(),
            "the module goes once the recorder's launches are done"
        );
    }
);

gpu_test!(
    an_updated_recording_lets_the_old_module_go_after_its_launches_and_keeps_the_new,
    {
        let _serial = serial();
        let (old, old_watch) = add_one_alone();
        let (new, new_watch) = add_one_alone();
        let s = Stream::non_blocking().unwrap();
        let mut x = DeviceBuffer::<f32>::zeros(N).unwrap();
        let n = N as i32;
        let mut rec: Recorder<u32> = Recorder::new();
        rec.run(&7, &s, |cs| {
            // SAFETY: add_one(float* x, int n) gets x, n floats on device 0 that
            // outlive the recorder.
            unsafe { cuda_rt::launch!(old, &cfg(), cs, (&mut x, n)) }
        })
        .unwrap();
        drop(old);
        let updated = rec
            .update(&7, &s, |cs| {
                // SAFETY: as above, with the other module's kernel.
                unsafe { cuda_rt::launch!(new, &cfg(), cs, (&mut x, n)) }
            })
            .unwrap();
        // Either way (the executable took the other module's kernel, or a new one was
        // instantiated), the recording runs the new kernel from now on.
        assert!(
            matches!(updated, Outcome::Updated | Outcome::Reinstantiated { .. }),
            "{updated:?}"
        );
        drop(new);
        s.synchronize().unwrap();
        // The old module's launches are done: the next call lets it go.
        assert_eq!(
            rec.run(&7, &s, |_| unreachable!("replayed")).unwrap(),
            Outcome::Replayed
        );
        assert!(
            !old_watch.is_loaded(),
            "the old module goes after its launches"
        );
        assert!(new_watch.is_loaded(), "the recording keeps the new module");
        s.synchronize().unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![3.0f32; N]);
        assert!(rec.remove(&7));
        drop(rec);
        assert!(!new_watch.is_loaded(), "and the new one with the recorder");
    }
);

gpu_test!(
    an_update_by_kernel_arguments_alone_keeps_the_module_for_the_recording,
    {
        let _serial = serial();
        let (f, watch) = add_one_alone();
        let s = Stream::non_blocking().unwrap();
        let mut x = DeviceBuffer::<f32>::zeros(N).unwrap();
        let mut y = DeviceBuffer::<f32>::zeros(N).unwrap();
        let n = N as i32;
        let mut rec: Recorder<u32> = Recorder::new();
        let first = rec
            .update(&1, &s, |cs| {
                // SAFETY: add_one(float* x, int n) gets x, n floats on device 0 that
                // outlive the recorder.
                unsafe { cuda_rt::launch!(f, &cfg(), cs, (&mut x, n)) }
            })
            .unwrap();
        assert_eq!(first, Outcome::Recorded);
        // The same kernel on another buffer: its argument alone is set.
        let second = rec
            .update(&1, &s, |cs| {
                // SAFETY: as above, with y.
                unsafe { cuda_rt::launch!(f, &cfg(), cs, (&mut y, n)) }
            })
            .unwrap();
        assert_eq!(second, Outcome::Updated);
        assert_eq!(rec.stats().argument_updates, 1);
        drop(f);
        s.synchronize().unwrap();
        // The first parameters' launches are done: this call lets go of what they
        // kept. The module must stay: the executable's node still runs its kernel.
        assert_eq!(
            rec.run(&1, &s, |_| unreachable!("replayed")).unwrap(),
            Outcome::Replayed
        );
        s.synchronize().unwrap();
        assert!(
            watch.is_loaded(),
            "the recording keeps its module after an update by arguments"
        );
        assert_eq!(x.to_vec().unwrap(), vec![1.0f32; N]);
        assert_eq!(y.to_vec().unwrap(), vec![2.0f32; N]);
        drop(rec);
        assert!(!watch.is_loaded(), "and lets it go with the recorder");
    }
);

gpu_test!(
    a_launch_on_a_stream_outside_the_capture_is_not_kept_by_its_graph,
    {
        let _serial = serial();
        let (inside, inside_watch) = add_one_alone();
        let (outside, outside_watch) = add_one_alone();
        let s1 = Stream::non_blocking().unwrap();
        let s2 = Stream::non_blocking().unwrap();
        let mut x = DeviceBuffer::<f32>::zeros(N).unwrap();
        let mut y = DeviceBuffer::<f32>::zeros(N).unwrap();
        let n = N as i32;
        s1.begin_capture(CaptureMode::ThreadLocal).unwrap();
        // SAFETY (both launches): add_one(float* x, int n) gets a buffer of n floats
        // on device 0 that outlives the graph and the synchronize below.
        unsafe { cuda_rt::launch!(inside, &cfg(), &s1, (&mut x, n)) }.unwrap();
        // While the capture is under way: s2 is not in it, so the kernel runs now.
        unsafe { cuda_rt::launch!(outside, &cfg(), &s2, (&mut y, n)) }.unwrap();
        let g = s1.end_capture().unwrap();
        s2.synchronize().unwrap();
        drop((inside, outside));
        assert_eq!(y.to_vec().unwrap(), vec![1.0f32; N], "ran once, at once");
        assert!(
            !outside_watch.is_loaded(),
            "a launch outside the capture keeps nothing for its graph"
        );
        assert!(inside_watch.is_loaded());
        g.launch(&s1).unwrap();
        s1.synchronize().unwrap();
        assert_eq!(x.to_vec().unwrap(), vec![1.0f32; N]);
        drop(g);
        assert!(!inside_watch.is_loaded());
    }
);

gpu_test!(a_module_watch_says_loaded_until_the_last_holder_goes, {
    let _serial = serial();
    let (f, watch) = add_one_alone();
    let module = f.module();
    drop(f);
    assert!(watch.is_loaded(), "the Module holds it");
    drop(module);
    assert!(!watch.is_loaded());
    assert!(format!("{watch:?}").contains("loaded: false"));
});
