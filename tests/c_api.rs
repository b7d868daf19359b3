//! The C API through the rlib: error paths everywhere (no GPU needed), then the whole
//! API on a GPU (skipped with a printed reason without one; failing instead under
//! `CUDA_RT_REQUIRE_GPU=1`). The header's own tests (C99, C++, names against exports)
//! are here too.

use std::ffi::{c_void, CStr, CString};
use std::path::PathBuf;
use std::process::Command;
use std::ptr::{null, null_mut};

use cuda_rt_c::*;

#[path = "../cuda-rt/tests/common/kernels.rs"]
mod kernels;

fn last_error() -> String {
    // SAFETY: curt_last_error returns a valid NUL-terminated thread-local string.
    unsafe { CStr::from_ptr(curt_last_error()) }
        .to_string_lossy()
        .into_owned()
}

fn gpu_or_skip(name: &str) -> bool {
    // The shim's own answer (what a C caller sees), counted and reported at exit like
    // cuda-rt's GPU tests (`cuda_rt::testing`).
    if curt_is_available() == 1 {
        cuda_rt::testing::ran(name);
        return true;
    }
    let reason = last_error();
    if cuda_rt::testing::gpu_required() {
        panic!("{name}: CUDA_RT_REQUIRE_GPU is set but no GPU is usable: {reason}");
    }
    cuda_rt::testing::skip(name, cuda_rt::testing::NO_GPU, &reason);
    false
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[track_caller]
fn expect(rc: i32, code: i32, msg: &str) {
    assert_eq!(rc, code, "{}", last_error());
    assert!(
        last_error().contains(msg),
        "{:?} lacks {msg:?}",
        last_error()
    );
}

#[test]
fn null_out_pointers_are_invalid_arguments_naming_the_argument() {
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        let a = CURT_ERROR_INVALID_ARGUMENT;
        expect(curt_get_device(null_mut()), a, "id is NULL");
        expect(
            curt_device_mem_info(0, null_mut(), null_mut()),
            a,
            "free is NULL",
        );
        expect(curt_device_name(0, null_mut(), 10), a, "buf is NULL");
        expect(curt_malloc(16, null_mut(), null_mut()), a, "mem is NULL");
        expect(curt_alloc(16, null_mut()), a, "mem is NULL");
        expect(curt_malloc_device(0, 16, null_mut()), a, "mem is NULL");
        expect(curt_malloc_managed(16, null_mut()), a, "mem is NULL");
        expect(
            curt_malloc_async(16, null_mut(), null_mut()),
            a,
            "mem is NULL",
        );
        expect(curt_pool_stats(0, null_mut()), a, "stats is NULL");
        expect(curt_pool_get_limit(null_mut()), a, "bytes is NULL");
        expect(curt_pinned_malloc(16, null_mut()), a, "mem is NULL");
        expect(curt_pinned_pool_stats(null_mut()), a, "stats is NULL");
        expect(curt_stream_create(0, 0, null_mut()), a, "stream is NULL");
        expect(curt_event_create(0, null_mut()), a, "event is NULL");
        expect(
            curt_module_load_file(c"x".as_ptr(), null_mut()),
            a,
            "module is NULL",
        );
        let mut m = null_mut();
        expect(curt_module_load_file(null(), &mut m), a, "path is NULL");
        expect(curt_module_load_data(null(), 4, &mut m), a, "image is NULL");
        expect(
            curt_module_compile(null(), null(), 0, &mut m),
            a,
            "source is NULL",
        );
        expect(
            curt_module_compile(c"".as_ptr(), null(), 2, &mut m),
            a,
            "options is NULL",
        );
        expect(
            curt_stream_end_capture(null_mut(), null_mut()),
            a,
            "graph is NULL",
        );
        expect(
            curt_set_allocator(None, None, null_mut()),
            a,
            "malloc is NULL",
        );
        expect(
            curt_stream_launch_host_func(null_mut(), None, null_mut()),
            a,
            "fn is NULL",
        );
        expect(curt_dropin_live_count(null_mut()), a, "count is NULL");
        expect(
            curt_recorder_create(0, 1, null_mut()),
            a,
            "recorder is NULL",
        );
        expect(
            curt_recorder_stats(null_mut(), null_mut()),
            a,
            "stats is NULL",
        );
        expect(
            curt_recorder_remove(null_mut(), null(), 0, null_mut()),
            a,
            "removed is NULL",
        );
        expect(
            curt_graph_record(null_mut(), null(), 0, null_mut(), None, null_mut()),
            a,
            "fn is NULL",
        );
        expect(
            curt_graph_record_update(null_mut(), null(), 4, null_mut(), Some(ok_cb), null_mut()),
            a,
            "key is NULL with key_len 4",
        );
    }
}

extern "C" fn ok_cb(_: curt_stream_t, _: *mut c_void) -> i32 {
    CURT_SUCCESS
}

#[test]
fn a_recorder_is_made_and_destroyed_without_a_cuda_call() {
    // SAFETY: every pointer passed to the shim is a live local of the type wrapper.h
    // names, alive for the call.
    unsafe {
        let mut r = null_mut();
        ok(curt_recorder_create(
            0,
            CURT_CAPTURE_MODE_THREAD_LOCAL,
            &mut r,
        ));
        let mut st = curt_recorder_stats_t::default();
        ok(curt_recorder_stats(r, &mut st));
        assert_eq!(
            st,
            curt_recorder_stats_t {
                capacity: 32,
                ..Default::default()
            }
        );
        let mut removed = -1;
        ok(curt_recorder_remove(
            r,
            c"k".as_ptr().cast(),
            1,
            &mut removed,
        ));
        assert_eq!(removed, 0);
        ok(curt_recorder_destroy(r));
        expect(
            curt_recorder_stats(r, &mut st),
            CURT_ERROR_INVALID_HANDLE,
            "graph recorder",
        );
    }
}

#[test]
fn bad_flags_and_modes_are_invalid_arguments() {
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        let a = CURT_ERROR_INVALID_ARGUMENT;
        let (mut s, mut e) = (null_mut(), null_mut());
        expect(
            curt_stream_create(4, 0, &mut s),
            a,
            "unknown stream flags 0x4",
        );
        expect(curt_event_create(8, &mut e), a, "unknown event flags 0x8");
        expect(
            curt_stream_begin_capture(null_mut(), 9),
            a,
            "unknown capture mode 9",
        );
        let mut r = null_mut();
        expect(
            curt_recorder_create(0, 9, &mut r),
            a,
            "unknown capture mode 9",
        );
        assert!(r.is_null(), "out-pointers are written only on success");
    }
}

#[test]
fn null_and_made_up_handles_are_invalid_handles_never_crashes() {
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        let h = CURT_ERROR_INVALID_HANDLE;
        let fake = 0x0700_0001_0000_0005_usize;
        expect(curt_stream_destroy(null_mut()), h, "stream handle is NULL");
        expect(curt_stream_destroy(fake as _), h, "invalid stream handle");
        expect(curt_event_destroy(null_mut()), h, "event handle is NULL");
        expect(
            curt_event_record(fake as _, null_mut()),
            h,
            "invalid event handle",
        );
        let mut done = 0;
        expect(
            curt_event_query(12345 as _, &mut done),
            h,
            "invalid event handle",
        );
        expect(
            curt_pool_record_stream(fake as _, null_mut()),
            h,
            "invalid memory handle",
        );
        // NULL is C's free(NULL): nothing to do, success.
        assert_eq!(curt_free(null_mut()), CURT_SUCCESS);
        assert_eq!(curt_pinned_free(null_mut()), CURT_SUCCESS);
        expect(curt_free(fake as _), h, "invalid memory handle");
        let mut p = 0u64;
        expect(
            curt_memory_ptr(fake as _, &mut p),
            h,
            "invalid memory handle",
        );
        expect(curt_memset(fake as _, 0, 0, 4), h, "invalid memory handle");
        let mut byte = 0u8;
        expect(
            curt_memcpy_dtoh((&mut byte as *mut u8).cast(), fake as _, 0, 1),
            h,
            "invalid memory handle",
        );
        expect(
            curt_pinned_free(fake as _),
            h,
            "invalid pinned memory handle",
        );
        expect(curt_module_destroy(fake as _), h, "invalid module handle");
        let mut f = null_mut();
        expect(
            curt_module_get_function(fake as _, c"k".as_ptr(), &mut f),
            h,
            "invalid module handle",
        );
        expect(
            curt_function_destroy(null_mut()),
            h,
            "function handle is NULL",
        );
        let d = curt_dim3 { x: 1, y: 1, z: 1 };
        expect(
            curt_launch(fake as _, d, d, 0, null_mut(), null_mut(), 0),
            h,
            "invalid function handle",
        );
        expect(
            curt_graph_launch(fake as _, null_mut()),
            h,
            "invalid graph handle",
        );
        expect(curt_graph_destroy(null_mut()), h, "graph handle is NULL");
        expect(
            curt_recorder_destroy(null_mut()),
            h,
            "graph recorder handle is NULL",
        );
        expect(
            curt_graph_record(fake as _, null(), 0, null_mut(), Some(ok_cb), null_mut()),
            h,
            "invalid graph recorder handle",
        );
        let mut st = curt_recorder_stats_t::default();
        expect(
            curt_recorder_stats(fake as _, &mut st),
            h,
            "invalid graph recorder handle",
        );
        // A stream handle passed where another kind is expected is not that kind.
        expect(
            curt_stream_wait_event(fake as _, null_mut()),
            h,
            "event handle is NULL",
        );
    }
}

#[test]
fn dropin_allocators_never_return_null_silently_for_a_nonzero_size() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        assert!(
            curt_cupy_malloc(null_mut(), 0, 0).is_null(),
            "size 0 is NULL"
        );
        assert!(
            curt_torch_alloc(0, 0, null_mut()).is_null(),
            "size 0 is NULL"
        );
        let p = curt_torch_alloc(-1, 0, null_mut());
        assert!(p.is_null());
        assert!(
            last_error().contains("negative size -1"),
            "{}",
            last_error()
        );
        if curt_is_available() == 0 {
            assert!(curt_cupy_malloc(null_mut(), 256, 0).is_null());
            assert!(!last_error().is_empty());
            assert!(curt_torch_alloc(256, 0, null_mut()).is_null());
            assert!(!last_error().is_empty());
        }
        // Recording a stream on an unknown address is a recorded error, never a crash.
        curt_torch_record_stream(0x2000 as *mut c_void, null_mut());
        assert!(
            last_error().contains("0x2000 was not allocated"),
            "{}",
            last_error()
        );
        // Freeing NULL or an unknown address is a recorded error at most, never a crash.
        curt_torch_free(null_mut(), 0, 0, null_mut());
        curt_cupy_free(null_mut(), 0x1000 as *mut c_void, 0);
        assert!(
            last_error().contains("0x1000 was not allocated"),
            "{}",
            last_error()
        );
    }
}

// What the fake CuPy parameter block saw: the exception type and message of the last
// `set_error`, and whether the stream was read.
static RAISED: std::sync::Mutex<Vec<(usize, String)>> = std::sync::Mutex::new(Vec::new());
static STREAM_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn fake_stream() -> isize {
    STREAM_READS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    0
}

unsafe extern "C" fn failing_stream() -> isize {
    -1
}

unsafe extern "C" fn fake_set_error(kind: *mut c_void, msg: *const std::ffi::c_char) {
    // SAFETY: the shim passes a NUL-terminated message alive for the call.
    let text = unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned();
    RAISED.lock().unwrap().push((kind as usize, text));
}

#[test]
fn cupy_malloc_reads_the_stream_and_raises_through_its_parameter_block() {
    let _serial = serial();
    RAISED.lock().unwrap().clear();
    let mut param = curt_cupy_param_t {
        current_stream: Some(fake_stream),
        set_error: Some(fake_set_error),
        out_of_memory: 0x10 as *mut c_void,
        error: 0x20 as *mut c_void,
    };
    // SAFETY: `param` is a live parameter block whose functions are callable here; the
    // exception "types" are only passed back to `fake_set_error`.
    unsafe {
        let p = (&mut param as *mut curt_cupy_param_t).cast::<c_void>();
        // Past any device's memory: out of memory with a GPU, no driver without one;
        // either way the matching exception set, the stream read first.
        let huge = curt_cupy_malloc(p, usize::MAX / 4, 0);
        // -1: the value after which CuPy's Cython code raises the exception set.
        assert_eq!(huge as usize, usize::MAX);
        assert_eq!(STREAM_READS.load(std::sync::atomic::Ordering::SeqCst), 1);
        let raised = RAISED.lock().unwrap().clone();
        assert_eq!(raised.len(), 1, "{raised:?}");
        let expected = if curt_is_available() != 0 { 0x10 } else { 0x20 };
        assert_eq!(raised[0].0, expected, "{raised:?}");
        assert_eq!(raised[0].1, last_error());
        // A stream that cannot be read: CuPy's own error stands (nothing raised over
        // it).
        param.current_stream = Some(failing_stream);
        let p = (&mut param as *mut curt_cupy_param_t).cast::<c_void>();
        assert_eq!(curt_cupy_malloc(p, 256, 0) as usize, usize::MAX);
        assert!(last_error().contains("current stream"), "{}", last_error());
        assert_eq!(RAISED.lock().unwrap().len(), 1);
    }
}

fn exported_names() -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root().join("src/ffi")).unwrap() {
        let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let mut after_no_mangle = false;
        for line in text.lines() {
            let line = line.trim();
            if line == "#[no_mangle]" {
                after_no_mangle = true;
            } else if after_no_mangle {
                let rest = line
                    .strip_prefix("pub extern \"C\" fn ")
                    .or_else(|| line.strip_prefix("pub unsafe extern \"C\" fn "))
                    .or_else(|| line.strip_prefix("pub extern \"C-unwind\" fn "))
                    .or_else(|| line.strip_prefix("pub unsafe extern \"C-unwind\" fn "));
                if let Some(rest) = rest {
                    names.push(rest[..rest.find('(').unwrap()].to_string());
                    after_no_mangle = false;
                }
            }
        }
    }
    names.sort();
    names
}

fn header_names() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("wrapper.h")).unwrap();
    let mut names: Vec<String> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("/*") && !l.trim_start().starts_with('*'))
        .flat_map(|l| {
            l.match_indices("curt_")
                .filter(|(i, _)| *i == 0 || !l.as_bytes()[i - 1].is_ascii_alphanumeric())
                .filter_map(|(i, _)| {
                    let word: String = l[i..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    l[i + word.len()..].starts_with('(').then_some(word)
                })
                .collect::<Vec<_>>()
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

#[test]
fn header_declares_exactly_the_exported_functions() {
    let (src, hdr) = (exported_names(), header_names());
    assert!(src.len() >= 60, "{src:?}");
    let missing: Vec<_> = src.iter().filter(|n| !hdr.contains(n)).collect();
    let extra: Vec<_> = hdr.iter().filter(|n| !src.contains(n)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "exported, not declared: {missing:?}; declared, not exported: {extra:?}"
    );
    // And the built library's dynamic symbols, where nm is at hand.
    let so = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .join("libcuda_rt_c.so");
    if let Ok(out) = Command::new("nm")
        .args(["-D", "--defined-only"])
        .arg(&so)
        .output()
    {
        if out.status.success() {
            let mut syms: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().nth(2))
                .filter(|s| s.starts_with("curt_"))
                .map(String::from)
                .collect();
            syms.sort();
            assert_eq!(syms, src, "{} exports differ from src/ffi", so.display());
        }
    }
}

fn compiles(compiler: &str, args: &[&str]) {
    let status = Command::new(compiler)
        .args(args)
        .arg(root().join("wrapper.h"))
        .status()
        .unwrap_or_else(|e| panic!("running {compiler}: {e}"));
    assert!(status.success(), "{compiler} {args:?} wrapper.h failed");
}

#[test]
fn header_compiles_as_c99_and_as_cpp_with_all_warnings_as_errors() {
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    compiles(
        &cc,
        &[
            "-std=c99",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Wshadow",
            "-Werror",
            "-fsyntax-only",
            "-x",
            "c",
        ],
    );
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    compiles(
        &cxx,
        &[
            "-x",
            "c++",
            "-std=c++11",
            "-pedantic",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
        ],
    );
}

const SAXPY: &CStr =
    c"extern \"C\" __global__ void saxpy(float a, const float *x, float *y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + y[i];
}";

/// Taken by the tests that allocate through the shim's process-wide state (the device
/// allocator `curt_set_allocator` replaces, the drop-in registry whose live count they
/// read), so that one test's allocations never show up in another's counts.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

#[track_caller]
fn ok(rc: i32) {
    assert_eq!(rc, CURT_SUCCESS, "{}", last_error());
}

fn to_host(mem: curt_memory_t, n: usize) -> Vec<f32> {
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        let mut v = vec![0f32; n];
        ok(curt_memcpy_dtoh(v.as_mut_ptr().cast(), mem, 0, n * 4));
        v
    }
}

#[test]
fn gpu_pool_copies_memset_streams_events_and_a_destroyed_handle() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        if !gpu_or_skip("gpu_pool_copies_memset_streams_events_and_a_destroyed_handle") {
            return;
        }
        ok(curt_set_device(0));
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        let (mut a, mut b) = (null_mut(), null_mut());
        ok(curt_malloc(1024, s, &mut a));
        ok(curt_malloc_device(0, 1024, &mut b));
        let mut size = 0;
        ok(curt_memory_size(a, &mut size));
        assert_eq!(size, 1024);
        let mut stats = curt_pool_stats_t::default();
        ok(curt_pool_stats(0, &mut stats));
        assert!(stats.used_bytes >= 1024, "{stats:?}");
        let host: Vec<u8> = (0..=255).cycle().take(1024).collect();
        ok(curt_memcpy_htod_async(a, 0, host.as_ptr().cast(), 1024, s));
        ok(curt_memcpy_dtod_async(b, 0, a, 0, 1024, s));
        ok(curt_memset_async(b, 512, 7, 256, s));
        let (mut e0, mut e1) = (null_mut(), null_mut());
        ok(curt_event_create(0, &mut e0));
        ok(curt_event_create(CURT_EVENT_BLOCKING_SYNC, &mut e1));
        ok(curt_event_record(e0, s));
        ok(curt_memset_async(a, 0, 0, 1024, s));
        ok(curt_event_record(e1, s));
        ok(curt_event_synchronize(e1));
        let mut done = 0;
        ok(curt_event_query(e1, &mut done));
        assert_eq!(done, 1);
        let mut ms = -1f32;
        ok(curt_event_elapsed_time(e0, e1, &mut ms));
        assert!(ms >= 0.0);
        let mut back = vec![0u8; 1024];
        ok(curt_memcpy_dtoh(back.as_mut_ptr().cast(), b, 0, 1024));
        let mut want = host.clone();
        want[512..768].fill(7);
        assert_eq!(back, want);
        ok(curt_memcpy_dtoh(back.as_mut_ptr().cast(), a, 0, 1024));
        assert!(back.iter().all(|&x| x == 0));
        // Past the end is refused.
        expect(
            curt_memset(a, 1000, 0, 100),
            CURT_ERROR_INVALID_ARGUMENT,
            "",
        );
        // Host callback with user data.
        extern "C" fn bump(p: *mut c_void) {
            // SAFETY: the test passes a live AtomicU32 that outlives the callback.
            unsafe { &*(p as *const std::sync::atomic::AtomicU32) }
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        let hits = std::sync::atomic::AtomicU32::new(0);
        ok(curt_stream_launch_host_func(
            s,
            Some(bump),
            &hits as *const _ as *mut c_void,
        ));
        ok(curt_stream_synchronize(s));
        assert_eq!(hits.load(std::sync::atomic::Ordering::SeqCst), 1);
        ok(curt_free(a));
        expect(
            curt_free(a),
            CURT_ERROR_INVALID_HANDLE,
            "invalid memory handle",
        );
        ok(curt_free(b));
        ok(curt_event_destroy(e0));
        ok(curt_event_destroy(e1));
        ok(curt_stream_destroy(s));
        expect(
            curt_stream_synchronize(s),
            CURT_ERROR_INVALID_HANDLE,
            "invalid stream handle",
        );
        let mut pinned = null_mut();
        ok(curt_pinned_malloc(4096, &mut pinned));
        let (mut p, mut n) = (null_mut(), 0usize);
        ok(curt_pinned_ptr(pinned, &mut p, &mut n));
        assert!(!p.is_null() && n >= 4096);
        // Written and read back through its address.
        std::ptr::write_bytes(p.cast::<u8>(), 0x7e, 4096);
        assert!(std::slice::from_raw_parts(p.cast::<u8>(), 4096)
            .iter()
            .all(|&b| b == 0x7e));
        ok(curt_pinned_free(pinned));
        // The steady pair: the freed handle stays dead when its slot is taken again
        // (the thread keeps the slot for its next malloc, with the next generation).
        let mut again = null_mut();
        ok(curt_pinned_malloc(4096, &mut again));
        assert_ne!(again, pinned);
        expect(
            curt_pinned_ptr(pinned, &mut p, &mut n),
            CURT_ERROR_INVALID_HANDLE,
            "invalid pinned memory handle",
        );
        expect(
            curt_pinned_free(pinned),
            CURT_ERROR_INVALID_HANDLE,
            "invalid pinned memory handle",
        );
        ok(curt_pinned_ptr(again, &mut p, &mut n));
        assert!(!p.is_null() && n >= 4096);
        ok(curt_pinned_free(again));
        ok(curt_pool_free_all_blocks());
    }
}

#[test]
fn gpu_saxpy_compiled_by_nvrtc_launched_and_replayed_from_a_graph() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        if !gpu_or_skip("gpu_saxpy_compiled_by_nvrtc_launched_and_replayed_from_a_graph") {
            return;
        }
        ok(curt_set_device(0));
        let opts = [c"-std=c++17".as_ptr()];
        let (mut m, mut f) = (null_mut(), null_mut());
        ok(curt_module_compile(
            SAXPY.as_ptr(),
            opts.as_ptr(),
            1,
            &mut m,
        ));
        ok(curt_module_get_function(m, c"saxpy".as_ptr(), &mut f));
        let bad = CString::new("broken(").unwrap();
        let mut m2 = null_mut();
        expect(
            curt_module_compile(bad.as_ptr(), null(), 0, &mut m2),
            CURT_ERROR_COMPILE,
            "",
        );
        let n = 1000usize;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let (mut dx, mut dy) = (null_mut(), null_mut());
        ok(curt_malloc(n * 4, null_mut(), &mut dx));
        ok(curt_malloc(n * 4, null_mut(), &mut dy));
        ok(curt_memcpy_htod(dx, 0, x.as_ptr().cast(), n * 4));
        ok(curt_memset(dy, 0, 0, n * 4));
        let (mut px, mut py) = (0u64, 0u64);
        ok(curt_memory_ptr(dx, &mut px));
        ok(curt_memory_ptr(dy, &mut py));
        let (mut a, mut count) = (2f32, n as i32);
        let mut args: [*mut c_void; 4] = [
            (&mut a as *mut f32).cast(),
            (&mut px as *mut u64).cast(),
            (&mut py as *mut u64).cast(),
            (&mut count as *mut i32).cast(),
        ];
        let grid = curt_dim3 {
            x: n.div_ceil(256) as u32,
            y: 1,
            z: 1,
        };
        let block = curt_dim3 { x: 256, y: 1, z: 1 };
        ok(curt_launch(
            f,
            grid,
            block,
            0,
            null_mut(),
            args.as_mut_ptr(),
            4,
        ));
        ok(curt_stream_synchronize(null_mut()));
        let want: Vec<f32> = x.iter().map(|v| 2.0 * v).collect();
        assert_eq!(to_host(dy, n), want);
        // Capture one more saxpy into a graph, replay it twice: y = 2x + 2x + 2x + 2x... .
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        ok(curt_stream_begin_capture(s, CURT_CAPTURE_MODE_RELAXED));
        ok(curt_launch(f, grid, block, 0, s, args.as_mut_ptr(), 4));
        let mut g = null_mut();
        ok(curt_stream_end_capture(s, &mut g));
        ok(curt_graph_launch(g, s));
        ok(curt_graph_launch(g, s));
        ok(curt_graph_instantiate(g, 0));
        ok(curt_graph_launch(g, s));
        ok(curt_stream_synchronize(s));
        let want: Vec<f32> = x.iter().map(|v| 8.0 * v).collect();
        assert_eq!(to_host(dy, n), want);
        ok(curt_graph_destroy(g));
        expect(
            curt_graph_launch(g, s),
            CURT_ERROR_INVALID_HANDLE,
            "invalid graph handle",
        );
        ok(curt_function_destroy(f));
        ok(curt_module_destroy(m));
        ok(curt_free(dx));
        ok(curt_free(dy));
        ok(curt_stream_destroy(s));
    }
}

#[test]
fn gpu_a_captured_launch_runs_after_its_module_and_function_handles_are_destroyed() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim here is a live local, buffer or string of
    // the type and size wrapper.h names, alive for the call (and, for device memory a
    // kernel uses, until the stream is synchronised below).
    unsafe {
        if !gpu_or_skip(
            "gpu_a_captured_launch_runs_after_its_module_and_function_handles_are_destroyed",
        ) {
            return;
        }
        ok(curt_set_device(0));
        // Loaded from an image (not through the kernel cache, which would hold it too):
        // the two handles are all that keep the module outside the graph.
        let (mut m, mut f) = (null_mut(), null_mut());
        let ptx = kernels::PTX.as_bytes();
        ok(curt_module_load_data(
            ptx.as_ptr().cast(),
            ptx.len(),
            &mut m,
        ));
        ok(curt_module_get_function(m, c"add_one".as_ptr(), &mut f));
        let n = 1000usize;
        let mut dx = null_mut();
        ok(curt_malloc(n * 4, null_mut(), &mut dx));
        ok(curt_memset(dx, 0, 0, n * 4));
        let mut px = 0u64;
        ok(curt_memory_ptr(dx, &mut px));
        let mut count = n as i32;
        // add_one(float* x, int n)
        let mut args: [*mut c_void; 2] = [
            (&mut px as *mut u64).cast(),
            (&mut count as *mut i32).cast(),
        ];
        let grid = curt_dim3 {
            x: n.div_ceil(256) as u32,
            y: 1,
            z: 1,
        };
        let block = curt_dim3 { x: 256, y: 1, z: 1 };
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        ok(curt_stream_begin_capture(s, CURT_CAPTURE_MODE_THREAD_LOCAL));
        ok(curt_launch(f, grid, block, 0, s, args.as_mut_ptr(), 2));
        ok(curt_launch(f, grid, block, 0, s, args.as_mut_ptr(), 2));
        let mut g = null_mut();
        ok(curt_stream_end_capture(s, &mut g));
        ok(curt_function_destroy(f));
        ok(curt_module_destroy(m));
        for _ in 0..3 {
            ok(curt_graph_launch(g, s));
        }
        ok(curt_stream_synchronize(s));
        assert_eq!(to_host(dx, n), vec![6.0f32; n], "3 launches of 2 add_one");
        ok(curt_graph_destroy(g));
        ok(curt_free(dx));
        ok(curt_stream_destroy(s));
    }
}

/// What the record callback of the recorder test gets.
struct SaxpyCall {
    f: curt_function_t,
    a: f32,
    x: u64,
    y: u64,
    n: i32,
    /// What the callback does: 0 the saxpy, 1 a synchronous copy (refused during a
    /// capture), 2 a call on the recorder that runs it.
    mode: u32,
    recorder: curt_recorder_t,
    host: [f32; 4],
    dst: curt_memory_t,
    /// The stream handle the callback got.
    stream: curt_stream_t,
}

extern "C" fn saxpy_cb(stream: curt_stream_t, data: *mut c_void) -> i32 {
    // SAFETY: `data` is the test's live `SaxpyCall`, used by nothing else meanwhile;
    // the shim calls are given live locals and handles of that test.
    unsafe {
        let d = &mut *data.cast::<SaxpyCall>();
        d.stream = stream;
        match d.mode {
            1 => curt_memcpy_htod(d.dst, 0, d.host.as_ptr().cast(), 16),
            2 => {
                let mut st = curt_recorder_stats_t::default();
                curt_recorder_stats(d.recorder, &mut st)
            }
            _ => {
                let mut args: [*mut c_void; 4] = [
                    (&mut d.a as *mut f32).cast(),
                    (&mut d.x as *mut u64).cast(),
                    (&mut d.y as *mut u64).cast(),
                    (&mut d.n as *mut i32).cast(),
                ];
                let grid = curt_dim3 {
                    x: (d.n as u32).div_ceil(256),
                    y: 1,
                    z: 1,
                };
                let block = curt_dim3 { x: 256, y: 1, z: 1 };
                curt_launch(d.f, grid, block, 0, stream, args.as_mut_ptr(), 4)
            }
        }
    }
}

#[test]
fn gpu_recorder_records_replays_updates_and_reports_callback_errors() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim is a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call; the callback's data is `call`,
    // alive for every record call; the kernel's buffers outlive the recorder.
    unsafe {
        if !gpu_or_skip("gpu_recorder_records_replays_updates_and_reports_callback_errors") {
            return;
        }
        ok(curt_set_device(0));
        let opts = [c"-std=c++17".as_ptr()];
        let (mut m, mut f) = (null_mut(), null_mut());
        ok(curt_module_compile(
            SAXPY.as_ptr(),
            opts.as_ptr(),
            1,
            &mut m,
        ));
        ok(curt_module_get_function(m, c"saxpy".as_ptr(), &mut f));
        let n = 1000usize;
        let x: Vec<f32> = (0..n).map(|i| i as f32).collect();
        let (mut dx, mut dy, mut dz) = (null_mut(), null_mut(), null_mut());
        ok(curt_malloc(n * 4, null_mut(), &mut dx));
        ok(curt_malloc(n * 4, null_mut(), &mut dy));
        ok(curt_malloc(n * 4, null_mut(), &mut dz));
        ok(curt_memcpy_htod(dx, 0, x.as_ptr().cast(), n * 4));
        ok(curt_memset(dy, 0, 0, n * 4));
        ok(curt_memset(dz, 0, 0, n * 4));
        let (mut px, mut py, mut pz) = (0u64, 0u64, 0u64);
        ok(curt_memory_ptr(dx, &mut px));
        ok(curt_memory_ptr(dy, &mut py));
        ok(curt_memory_ptr(dz, &mut pz));
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        let mut r = null_mut();
        ok(curt_recorder_create(
            4,
            CURT_CAPTURE_MODE_THREAD_LOCAL,
            &mut r,
        ));
        let mut call = SaxpyCall {
            f,
            a: 2.0,
            x: px,
            y: py,
            n: n as i32,
            mode: 0,
            recorder: r,
            host: [1.0; 4],
            dst: dy,
            stream: null_mut(),
        };
        // Made again before each call: a write to `call` ends an earlier pointer's
        // right to it.
        fn data(c: &mut SaxpyCall) -> *mut c_void {
            (c as *mut SaxpyCall).cast()
        }
        let key = 7u64.to_ne_bytes();
        let k = key.as_ptr().cast::<c_void>();
        // Recorded (y = 2x), then replayed: the callback is not called again, so its
        // new scalar is not seen (y = 4x).
        ok(curt_graph_record(
            r,
            k,
            8,
            s,
            Some(saxpy_cb),
            data(&mut call),
        ));
        let handed = call.stream;
        assert!(
            !handed.is_null() && handed != s,
            "the capture stream's handle"
        );
        call.a = 100.0;
        call.stream = null_mut();
        ok(curt_graph_record(
            r,
            k,
            8,
            s,
            Some(saxpy_cb),
            data(&mut call),
        ));
        assert!(call.stream.is_null(), "a replay does not call back");
        expect(
            curt_stream_synchronize(handed),
            CURT_ERROR_INVALID_HANDLE,
            "stream",
        );
        ok(curt_stream_synchronize(s));
        let want: Vec<f32> = x.iter().map(|v| 4.0 * v).collect();
        assert_eq!(to_host(dy, n), want);
        // Updated in place: another buffer, another scalar (z = 3x).
        call.a = 3.0;
        call.y = pz;
        ok(curt_graph_record_update(
            r,
            k,
            8,
            s,
            Some(saxpy_cb),
            data(&mut call),
        ));
        ok(curt_stream_synchronize(s));
        let want3: Vec<f32> = x.iter().map(|v| 3.0 * v).collect();
        assert_eq!(to_host(dz, n), want3);
        assert_eq!(to_host(dy, n), want, "y untouched by the update");
        // A callback's failure comes back with its code and message: a synchronous
        // copy is refused during a capture.
        call.mode = 1;
        let rc = curt_graph_record(
            r,
            c"other".as_ptr().cast(),
            5,
            s,
            Some(saxpy_cb),
            data(&mut call),
        );
        assert_eq!(rc, CURT_ERROR_OTHER, "{}", last_error());
        assert!(
            last_error().contains("capturing a graph"),
            "{}",
            last_error()
        );
        // A call on the recorder from its own callback is refused, not a deadlock.
        call.mode = 2;
        let rc = curt_graph_record(
            r,
            c"other".as_ptr().cast(),
            5,
            s,
            Some(saxpy_cb),
            data(&mut call),
        );
        assert_eq!(rc, CURT_ERROR_OTHER, "{}", last_error());
        assert!(
            last_error().contains("inside its own callback"),
            "{}",
            last_error()
        );
        let mut st = curt_recorder_stats_t::default();
        ok(curt_recorder_stats(r, &mut st));
        // The update set the kernel's arguments alone where the driver reports the
        // kernel's parameter sizes (CUDA 12.4+: curt_launch's arguments can then be
        // copied without a capture: one capture in all); else it captured the callback
        // again (two).
        assert!(st.captures == 1 || st.captures == 2, "{st:?}");
        assert_eq!(
            st,
            curt_recorder_stats_t {
                hits: 1,
                misses: 1,
                captures: st.captures,
                instantiations: 1,
                updates: 1,
                update_fallbacks: 0,
                evictions: 0,
                failures: 2,
                entries: 1,
                capacity: 4,
            }
        );
        let mut removed = 0;
        ok(curt_recorder_remove(r, k, 8, &mut removed));
        assert_eq!(removed, 1);
        ok(curt_recorder_destroy(r));
        expect(
            curt_graph_record(r, k, 8, s, Some(saxpy_cb), data(&mut call)),
            CURT_ERROR_INVALID_HANDLE,
            "graph recorder",
        );
        ok(curt_stream_destroy(s));
        ok(curt_free(dx));
        ok(curt_free(dy));
        ok(curt_free(dz));
        ok(curt_function_destroy(f));
        ok(curt_module_destroy(m));
    }
}

static C_ALLOCS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn c_malloc(ctx: *mut c_void, size: usize, device: i32) -> u64 {
    assert_eq!(ctx as usize, 0xc0ffee);
    C_ALLOCS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let mut m = null_mut();
    // SAFETY: `m` is a live handle slot.
    if unsafe { curt_malloc_device(device, size, &mut m) } != CURT_SUCCESS {
        return 0;
    }
    let mut p = 0;
    // SAFETY: `p` is a live u64.
    let _ = unsafe { curt_memory_ptr(m, &mut p) };
    // Keep the handle by address for c_free.
    LIVE.lock().unwrap().push((p, m as usize));
    p
}

extern "C" fn c_free(_ctx: *mut c_void, ptr: u64, _device: i32) {
    let mut live = LIVE.lock().unwrap();
    if let Some(i) = live.iter().position(|&(p, _)| p == ptr) {
        let (_, m) = live.swap_remove(i);
        let _ = curt_free(m as curt_memory_t);
    }
}

static LIVE: std::sync::Mutex<Vec<(u64, usize)>> = std::sync::Mutex::new(Vec::new());

#[test]
fn gpu_c_allocator_pair_and_the_torch_and_cupy_entry_points() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim here is NULL (which the call
    // refuses, the point of the check) or a live local, buffer or string of the
    // type and size wrapper.h names, alive for the call (and, for device or host
    // memory a queued copy uses, until the stream or event is synchronised below).
    unsafe {
        if !gpu_or_skip("gpu_c_allocator_pair_and_the_torch_and_cupy_entry_points") {
            return;
        }
        ok(curt_set_device(0));
        ok(curt_set_allocator(
            Some(c_malloc),
            Some(c_free),
            0xc0ffee as *mut c_void,
        ));
        let mut m = null_mut();
        ok(curt_alloc(4096, &mut m));
        assert_eq!(C_ALLOCS.load(std::sync::atomic::Ordering::SeqCst), 1);
        ok(curt_memset(m, 0, 1, 4096));
        ok(curt_free(m));
        assert!(LIVE.lock().unwrap().is_empty(), "freed through c_free");
        ok(curt_reset_allocator());

        let mut before = 0;
        ok(curt_dropin_live_count(&mut before));
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        // The raw CUstream behind the handle is what PyTorch would pass; here the legacy
        // default stream (0) and the current stream stand in.
        let t = curt_torch_alloc(1 << 20, 0, null_mut());
        assert!(!t.is_null(), "{}", last_error());
        let c = curt_cupy_malloc(null_mut(), 1 << 20, 0);
        assert!(!c.is_null(), "{}", last_error());
        assert_ne!(t, c);
        let mut live = 0;
        ok(curt_dropin_live_count(&mut live));
        assert_eq!(live, before + 2);
        let mut stats = curt_pool_stats_t::default();
        ok(curt_pool_stats(0, &mut stats));
        assert!(stats.used_bytes >= 2 << 20, "{stats:?}");
        curt_torch_free(t, 1 << 20, 0, null_mut());
        curt_cupy_free(null_mut(), c, 0);
        ok(curt_dropin_live_count(&mut live));
        assert_eq!(live, before);
        // Out of memory is NULL with the reason, never silent.
        let huge = curt_torch_alloc(isize::MAX / 2, 0, null_mut());
        assert!(huge.is_null());
        assert!(!last_error().is_empty());
        ok(curt_stream_destroy(s));
    }
}

/// `record_stream` through the shim: on a `curt_malloc` handle, and through PyTorch's
/// hook on memory of `curt_torch_alloc`; each records one event on the other stream
/// when the memory is freed (the default pool's statistics count it).
#[test]
fn gpu_record_stream_through_the_shim_and_the_torch_hook() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim here is NULL or a live local of the
    // type wrapper.h names; the streams live until the end, past every free.
    unsafe {
        if !gpu_or_skip("gpu_record_stream_through_the_shim_and_the_torch_hook") {
            return;
        }
        ok(curt_set_device(0));
        let fences = || {
            cuda_rt::get_default_memory_pool()
                .device_stats(0)
                .stream_fences
        };
        // PyTorch's hook: the raw stream handle, as torch passes a cudaStream_t.
        let side = cuda_rt::stream::Stream::non_blocking().unwrap();
        let raw = cuda_rt::AsStream::as_raw(&side);
        let t = curt_torch_alloc(1 << 20, 0, null_mut());
        assert!(!t.is_null(), "{}", last_error());
        let before = fences();
        curt_torch_record_stream(t, raw.cast());
        curt_torch_free(t, 1 << 20, 0, null_mut());
        assert_eq!(fences(), before + 1, "one event recorded at the free");

        // A curt_malloc handle and a curt stream handle.
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        let mut m = null_mut();
        ok(curt_malloc(1 << 20, null_mut(), &mut m));
        ok(curt_memset(m, 0, 7, 1 << 20));
        ok(curt_pool_record_stream(m, s));
        // The memory's own stream (the current one): nothing to record.
        ok(curt_pool_record_stream(m, null_mut()));
        ok(curt_free(m));
        assert_eq!(fences(), before + 2);
        ok(curt_stream_synchronize(s));
        ok(curt_stream_destroy(s));
        cuda_rt::AsStream::synchronize(&side).unwrap();
    }
}

/// The snapshot JSON through a buffer: too small (or NULL) says the length needed and
/// fails; large enough gets the text. The pinned pool's needs no GPU; a device's
/// snapshot is an error where the device does not exist (without a GPU, device 0).
/// Run one at a time with the tests that allocate.
#[test]
fn snapshots_come_back_as_json_through_a_sized_buffer() {
    // The pools' snapshots change with every allocation: with another test allocating
    // meanwhile, the length one call asks for may no longer be the next call's.
    let _serial = serial();
    type Snap = unsafe extern "C" fn(*mut std::ffi::c_char, usize, *mut usize) -> i32;
    unsafe extern "C" fn device0(b: *mut std::ffi::c_char, cap: usize, len: *mut usize) -> i32 {
        // SAFETY: this function's caller passes what curt_pool_snapshot_json takes.
        unsafe { curt_pool_snapshot_json(0, b, cap, len) }
    }
    let mut snaps: Vec<(Snap, &str)> =
        vec![(curt_pinned_pool_snapshot_json as Snap, "{\"segments\": [")];
    if curt_is_available() == 1 {
        snaps.push((device0 as Snap, "{\"segments\": ["));
    } else {
        let mut len = 0usize;
        // SAFETY: a live out-value.
        let rc = unsafe { curt_pool_snapshot_json(0, null_mut(), 0, &mut len) };
        assert_ne!(
            rc, CURT_SUCCESS,
            "a snapshot of a device that does not exist"
        );
        assert!(!last_error().contains("needs"), "{}", last_error());
    }
    for (snap, start) in snaps {
        // SAFETY: every pointer passed to the shim here is NULL (which the call
        // refuses, the point of the check) or a live local or buffer of the size given.
        unsafe {
            let mut len = 0usize;
            expect(
                snap(null_mut(), 0, &mut len),
                CURT_ERROR_INVALID_ARGUMENT,
                "needs",
            );
            assert!(len > 0);
            let mut small = vec![0 as std::ffi::c_char; len];
            expect(
                snap(small.as_mut_ptr(), small.len(), &mut len),
                CURT_ERROR_INVALID_ARGUMENT,
                "needs",
            );
            let mut buf = vec![0 as std::ffi::c_char; len + 1];
            assert_eq!(
                snap(buf.as_mut_ptr(), buf.len(), &mut len),
                CURT_SUCCESS,
                "{}",
                last_error()
            );
            // The call wrote a NUL-terminated string into `buf`.
            let text = CStr::from_ptr(buf.as_ptr()).to_str().unwrap().to_owned();
            assert_eq!(text.len(), len);
            assert!(text.starts_with(start) && text.ends_with('}'), "{text}");
            expect(
                snap(buf.as_mut_ptr(), buf.len(), null_mut()),
                CURT_ERROR_INVALID_ARGUMENT,
                "len is NULL",
            );
        }
    }
}

#[test]
fn gpu_dlpack_export_and_import_keep_the_memory_and_call_the_deleter_once() {
    let _serial = serial();
    // SAFETY: every pointer passed is a live local or a tensor the shim made; each
    // tensor's deleter is called once, by its consumer (this test or the shim).
    unsafe {
        if !gpu_or_skip("gpu_dlpack_export_and_import_keep_the_memory_and_call_the_deleter_once") {
            return;
        }
        ok(curt_set_device(0));
        let mut a = null_mut();
        ok(curt_malloc_device(0, 4096, &mut a));
        let host: Vec<u8> = (0..=255).cycle().take(4096).collect();
        ok(curt_memcpy_htod(a, 0, host.as_ptr().cast(), 4096));
        let mut ptr = 0;
        ok(curt_memory_ptr(a, &mut ptr));
        let f32_ = DLDataType {
            code: 2,
            bits: 32,
            lanes: 1,
        };
        // Too big a shape for the memory: refused.
        let mut t = null_mut();
        expect(
            curt_memory_to_dlpack(a, 2, [64i64, 64].as_ptr(), f32_, &mut t),
            CURT_ERROR_INVALID_ARGUMENT,
            "needs 16384 bytes",
        );
        ok(curt_memory_to_dlpack(
            a,
            2,
            [32i64, 32].as_ptr(),
            f32_,
            &mut t,
        ));
        let dl = &(*t).dl_tensor;
        assert_eq!(dl.data as u64, ptr);
        assert_eq!(
            (dl.device.device_type, dl.device.device_id, dl.ndim),
            (CURT_DL_CUDA, 0, 2)
        );
        assert_eq!(std::slice::from_raw_parts(dl.shape, 2), &[32, 32]);
        // The handle goes; the tensor keeps the memory.
        ok(curt_free(a));
        // Imported back: a handle over the same bytes, whose free calls the deleter.
        let mut b = null_mut();
        ok(curt_memory_from_dlpack(t, &mut b));
        let (mut bp, mut bs) = (0, 0);
        ok(curt_memory_ptr(b, &mut bp));
        ok(curt_memory_size(b, &mut bs));
        assert_eq!((bp, bs), (ptr, 4096));
        let mut back = vec![0u8; 4096];
        ok(curt_memcpy_dtoh(back.as_mut_ptr().cast(), b, 0, 4096));
        assert_eq!(back, host, "the exported memory outlived its handle");
        ok(curt_free(b)); // the deleter runs: the pool gets its block back

        // The versioned struct, deleted by its consumer (here).
        let mut c = null_mut();
        ok(curt_malloc_device(0, 256, &mut c));
        let mut v = null_mut();
        ok(curt_memory_to_dlpack_versioned(
            c,
            1,
            [64i64].as_ptr(),
            f32_,
            &mut v,
        ));
        assert_eq!(((*v).version.major, (*v).flags), (1, 0));
        ok(curt_free(c));
        ((*v).deleter.unwrap())(v);
    }
}

/// Whether the C gate below may let its stream go on, and whether it gave up waiting.
static C_GATE_OPEN: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static C_GATE_TIMED_OUT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// A host function that holds its stream until `C_GATE_OPEN` (or 5 s).
extern "C" fn c_gate(_: *mut c_void) {
    use std::sync::atomic::Ordering::SeqCst;
    let t0 = std::time::Instant::now();
    while !C_GATE_OPEN.load(SeqCst) {
        if t0.elapsed() > std::time::Duration::from_secs(5) {
            C_GATE_TIMED_OUT.store(true, SeqCst);
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// Issue 26, item 1 through the C ABI: `curt_memset_async` on another stream, then
/// `curt_free`: wrapper.h promises the memory goes back once the queued work using it
/// is done. The memset is held behind a gate; the next `curt_malloc`s must not get the
/// block, and keep their own bytes after the memset ran.
#[test]
fn gpu_memory_freed_under_a_memset_on_another_stream_is_not_reused() {
    use std::sync::atomic::Ordering::SeqCst;
    let _serial = serial();
    // SAFETY: every pointer passed to the shim is a live local of the type wrapper.h
    // names; the gate's host function takes no data; the stream is synchronised
    // before it is destroyed.
    unsafe {
        if !gpu_or_skip("gpu_memory_freed_under_a_memset_on_another_stream_is_not_reused") {
            return;
        }
        ok(curt_set_device(0));
        let n = 1usize << 20;
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        let mut m = null_mut();
        ok(curt_malloc(n, null_mut(), &mut m));
        let mut addr = 0u64;
        ok(curt_memory_ptr(m, &mut addr));
        C_GATE_OPEN.store(false, SeqCst);
        C_GATE_TIMED_OUT.store(false, SeqCst);
        ok(curt_stream_launch_host_func(s, Some(c_gate), null_mut()));
        ok(curt_memset_async(m, 0, 0xAB, n as _, s));
        ok(curt_free(m));
        let mut others = Vec::new();
        for i in 0..4u8 {
            let mut o = null_mut();
            ok(curt_malloc(n, null_mut(), &mut o));
            ok(curt_memset(o, 0, i as _, n));
            let mut p = 0u64;
            ok(curt_memory_ptr(o, &mut p));
            others.push((o, p, i));
        }
        let held = !C_GATE_TIMED_OUT.load(SeqCst);
        assert!(
            !held || others.iter().all(|&(_, p, _)| p != addr),
            "a block under a queued memset was handed out again"
        );
        C_GATE_OPEN.store(true, SeqCst);
        ok(curt_stream_synchronize(s));
        for (o, _, i) in others {
            let mut back = vec![0u8; n];
            ok(curt_memcpy_dtoh(back.as_mut_ptr().cast(), o, 0, n));
            assert!(
                back.iter().all(|&b| b == i),
                "the memset wrote into the new owner {i}'s memory"
            );
            ok(curt_free(o));
        }
        ok(curt_stream_destroy(s));
    }
}

/// What the producer's deleter saw: 0 not called, 1 called after the gate opened, 2
/// called while the memset queued on the imported memory was still held.
static DELETED_WHEN: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

unsafe extern "C" fn note_deletion(_: *mut DLManagedTensor) {
    use std::sync::atomic::Ordering::SeqCst;
    let when = if C_GATE_OPEN.load(SeqCst) { 1 } else { 2 };
    DELETED_WHEN.store(when, SeqCst);
}

/// A DLPack import freed while work queued on it is held: the producer may reuse its
/// memory as soon as its deleter runs (PyTorch's caching allocator does), so
/// `curt_free` calls the deleter only after that work. The gate is opened 300 ms later
/// from another thread; the deleter must see it open.
#[test]
fn gpu_a_dlpack_imports_deleter_runs_after_the_work_queued_on_it() {
    use std::sync::atomic::Ordering::SeqCst;
    let _serial = serial();
    // SAFETY: every pointer passed to the shim is a live local of the type wrapper.h
    // names; the tensor describes memory of `m`, freed only after the import's handle;
    // the gate's host function takes no data.
    unsafe {
        if !gpu_or_skip("gpu_a_dlpack_imports_deleter_runs_after_the_work_queued_on_it") {
            return;
        }
        ok(curt_set_device(0));
        let n = 1usize << 20;
        let mut m = null_mut();
        ok(curt_malloc(n, null_mut(), &mut m));
        let mut ptr = 0u64;
        ok(curt_memory_ptr(m, &mut ptr));
        let mut shape = [n as i64];
        let mut t = DLManagedTensor {
            dl_tensor: DLTensor {
                data: ptr as *mut c_void,
                device: DLDevice {
                    device_type: CURT_DL_CUDA,
                    device_id: 0,
                },
                ndim: 1,
                dtype: DLDataType {
                    code: 1,
                    bits: 8,
                    lanes: 1,
                },
                shape: shape.as_mut_ptr(),
                strides: null_mut(),
                byte_offset: 0,
            },
            manager_ctx: null_mut(),
            deleter: Some(note_deletion),
        };
        let mut h = null_mut();
        ok(curt_memory_from_dlpack(&mut t, &mut h));
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        C_GATE_OPEN.store(false, SeqCst);
        C_GATE_TIMED_OUT.store(false, SeqCst);
        DELETED_WHEN.store(0, SeqCst);
        ok(curt_stream_launch_host_func(s, Some(c_gate), null_mut()));
        ok(curt_memset_async(h, 0, 0xAB, n as _, s));
        let opener = std::thread::spawn(|| {
            std::thread::sleep(std::time::Duration::from_millis(300));
            C_GATE_OPEN.store(true, SeqCst);
        });
        ok(curt_free(h));
        opener.join().unwrap();
        assert!(!C_GATE_TIMED_OUT.load(SeqCst), "the gate gave up");
        assert_eq!(
            DELETED_WHEN.load(SeqCst),
            1,
            "the deleter ran while the memset queued on the imported memory was held"
        );
        ok(curt_stream_synchronize(s));
        ok(curt_stream_destroy(s));
        ok(curt_free(m));
    }
}

#[test]
fn every_status_code_has_its_name_and_unknown_ones_one_too() {
    let name = |code| {
        // SAFETY: curt_status_name returns a static NUL-terminated string, never NULL.
        unsafe { CStr::from_ptr(curt_status_name(code)) }
            .to_str()
            .unwrap()
            .to_owned()
    };
    for (code, text) in [
        (CURT_SUCCESS, "CURT_SUCCESS"),
        (CURT_ERROR_INVALID_ARGUMENT, "CURT_ERROR_INVALID_ARGUMENT"),
        (CURT_ERROR_NOT_FOUND, "CURT_ERROR_NOT_FOUND"),
        (CURT_ERROR_OUT_OF_MEMORY, "CURT_ERROR_OUT_OF_MEMORY"),
        (CURT_ERROR_COMPILE, "CURT_ERROR_COMPILE"),
        (CURT_ERROR_NOT_SUPPORTED, "CURT_ERROR_NOT_SUPPORTED"),
        (CURT_ERROR_OTHER, "CURT_ERROR_OTHER"),
        (CURT_ERROR_INVALID_HANDLE, "CURT_ERROR_INVALID_HANDLE"),
        (CURT_ERROR_PANIC, "CURT_ERROR_PANIC"),
        (-8, "CURT_ERROR_UNRECOGNIZED"),
        (i32::MIN, "CURT_ERROR_UNRECOGNIZED"),
    ] {
        assert_eq!(name(code), text, "code {code}");
    }
    // A positive code is the driver's: named by it where it loads.
    let oom = name(2);
    if curt_is_available() == 1 {
        assert_eq!(oom, "CUDA_ERROR_OUT_OF_MEMORY");
    } else {
        assert!(
            oom == "CUDA_ERROR_OUT_OF_MEMORY" || oom == "CURT_ERROR_UNRECOGNIZED",
            "{oom}"
        );
    }
}

/// The value of `#define name value` in wrapper.h.
fn header_define(name: &str) -> String {
    let text = std::fs::read_to_string(root().join("wrapper.h")).unwrap();
    let prefix = format!("#define {name} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("wrapper.h has no {name}"))
        .trim()
        .to_owned()
}

#[test]
fn the_version_call_the_version_string_and_the_header_agree_with_the_package() {
    let major: i32 = env!("CARGO_PKG_VERSION_MAJOR").parse().unwrap();
    let minor: i32 = env!("CARGO_PKG_VERSION_MINOR").parse().unwrap();
    let patch: i32 = env!("CARGO_PKG_VERSION_PATCH").parse().unwrap();
    assert_eq!(curt_version(), major * 10000 + minor * 100 + patch);
    // SAFETY: a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(curt_version_string()) };
    assert_eq!(text.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    assert_eq!(header_define("CURT_VERSION_MAJOR"), major.to_string());
    assert_eq!(header_define("CURT_VERSION_MINOR"), minor.to_string());
    assert_eq!(header_define("CURT_VERSION_PATCH"), patch.to_string());
}

#[test]
fn statistics_of_a_device_that_does_not_exist_are_an_error_not_zeros() {
    // SAFETY: live out-values of the types wrapper.h names.
    unsafe {
        let mut st = curt_pool_stats_t {
            used_bytes: 5,
            ..Default::default()
        };
        for device in [-1, 9999] {
            let rc = curt_pool_stats(device, &mut st);
            assert_ne!(rc, CURT_SUCCESS, "device {device}");
            assert!(!last_error().is_empty());
            assert_eq!(st.used_bytes, 5, "nothing written");
            let (mut u, mut r) = (0, 0);
            assert_ne!(
                curt_torch_memory_peaks(device, &mut u, &mut r),
                CURT_SUCCESS
            );
            assert_ne!(curt_pool_reset_peaks(device), CURT_SUCCESS);
        }
        if curt_is_available() == 1 {
            let mut n = 0;
            ok(curt_device_count(&mut n));
            expect(
                curt_pool_stats(n, &mut st),
                CURT_ERROR_INVALID_ARGUMENT,
                "device",
            );
            ok(curt_pool_stats(0, &mut st));
        } else {
            assert_ne!(curt_pool_stats(0, &mut st), CURT_SUCCESS);
        }
    }
}

#[test]
fn a_wrapped_raw_stream_is_borrowed_and_gives_its_handle_back() {
    // SAFETY: the raw stream is made up and only ever compared, never given to the
    // driver (a wrapper's destruction does not touch its CUstream: the point).
    unsafe {
        let made_up = 0x7e57usize as *mut c_void;
        let mut s = null_mut();
        ok(curt_stream_wrap(made_up, -1, &mut s));
        let mut raw = null_mut();
        ok(curt_stream_raw(s, &mut raw));
        assert_eq!(raw, made_up);
        ok(curt_stream_destroy(s));
        expect(
            curt_stream_raw(s, &mut raw),
            CURT_ERROR_INVALID_HANDLE,
            "stream handle",
        );
        expect(
            curt_stream_raw(null_mut(), null_mut()),
            CURT_ERROR_INVALID_ARGUMENT,
            "raw is NULL",
        );
        // NULL is the current stream: the legacy default stream (0) until one is set.
        ok(curt_stream_raw(null_mut(), &mut raw));
        assert!(raw.is_null());
        assert_ne!(curt_stream_wrap(made_up, 9999, &mut s), CURT_SUCCESS);
    }
}

#[test]
fn gpu_a_stream_made_here_and_wrapped_again_outlives_its_wrapper() {
    if !gpu_or_skip("gpu_a_stream_made_here_and_wrapped_again_outlives_its_wrapper") {
        return;
    }
    // SAFETY: live out-values and host buffers of the sizes given; the raw stream is
    // kept alive by `s` until after the wrapper is destroyed.
    unsafe {
        ok(curt_set_device(0));
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        let mut raw = null_mut();
        ok(curt_stream_raw(s, &mut raw));
        assert!(!raw.is_null());
        let mut w = null_mut();
        ok(curt_stream_wrap(raw, 0, &mut w));
        let (mut m, mut addr) = (null_mut(), 0u64);
        ok(curt_malloc_ptr(1024, w, &mut m, &mut addr));
        let mut again = 0u64;
        ok(curt_memory_ptr(m, &mut again));
        assert_eq!(addr, again);
        assert_ne!(addr, 0);
        let host: Vec<u8> = (0..1024).map(|i| i as u8).collect();
        let mut back = vec![0u8; 1024];
        ok(curt_memcpy_htod_async(m, 0, host.as_ptr().cast(), 1024, w));
        ok(curt_memcpy_dtoh_async(
            back.as_mut_ptr().cast(),
            m,
            0,
            1024,
            w,
        ));
        ok(curt_stream_destroy(w));
        // The stream is alive: the copies queued through the wrapper complete on it.
        ok(curt_stream_synchronize(s));
        assert_eq!(host, back);
        ok(curt_free(m));
        ok(curt_stream_destroy(s));
    }
}

/// Issue 27: a steady pair of one thread holds the pool's bare block (no memory
/// object) in the drop-in map and in the handle table. Everything that looks the
/// memory up still works on it: PyTorch's record-stream hook and `curt_pool_record_
/// stream` (each fences the free on the other stream), the address and size of a
/// handle, a memset and a copy back. A drop-in address freed on another thread (which
/// then exits, releasing what it kept of the map) is freed once, and the map serves
/// both threads' allocations after.
#[test]
fn gpu_steady_pairs_hold_bare_blocks_and_every_lookup_still_works() {
    let _serial = serial();
    // SAFETY: every pointer passed to the shim is a live local of the type wrapper.h
    // names, or an address the drop-in entry points handed out and not yet freed; the
    // streams live past every free and are synchronised before they go.
    unsafe {
        if !gpu_or_skip("gpu_steady_pairs_hold_bare_blocks_and_every_lookup_still_works") {
            return;
        }
        ok(curt_set_device(0));
        let n = 1usize << 20;
        let fences = || {
            cuda_rt::get_default_memory_pool()
                .device_stats(0)
                .stream_fences
        };
        let mut live0 = 0;
        ok(curt_dropin_live_count(&mut live0));
        // Allocated here, freed on another thread, which exits.
        let t = curt_torch_alloc(n as isize, 0, null_mut()) as usize;
        assert_ne!(t, 0, "{}", last_error());
        std::thread::spawn(move || {
            curt_torch_free(t as *mut c_void, n as isize, 0, null_mut());
            // And that thread's own pair, which leaves it a reserved entry.
            let u = curt_torch_alloc(n as isize, 0, null_mut());
            assert!(!u.is_null(), "{}", last_error());
            curt_torch_free(u, n as isize, 0, null_mut());
        })
        .join()
        .unwrap();
        let mut live = 0;
        ok(curt_dropin_live_count(&mut live));
        assert_eq!(live, live0);
        // Freed once: a second free is an error, nothing else.
        curt_torch_free(t as *mut c_void, n as isize, 0, null_mut());
        assert!(last_error().contains("freed already"), "{}", last_error());
        let many: Vec<_> = (0..64)
            .map(|_| curt_torch_alloc(4096, 0, null_mut()))
            .collect();
        assert!(many.iter().all(|p| !p.is_null()), "{}", last_error());
        ok(curt_dropin_live_count(&mut live));
        assert_eq!(live, live0 + 64);
        for p in many {
            curt_torch_free(p, 4096, 0, null_mut());
        }
        ok(curt_dropin_live_count(&mut live));
        assert_eq!(live, live0);

        let side = cuda_rt::stream::Stream::non_blocking().unwrap();
        let raw = cuda_rt::AsStream::as_raw(&side);

        // The drop-in pair, twice (the second allocation is the steady one).
        let t = curt_torch_alloc(n as isize, 0, null_mut());
        assert!(!t.is_null(), "{}", last_error());
        curt_torch_free(t, n as isize, 0, null_mut());
        let t = curt_torch_alloc(n as isize, 0, null_mut());
        assert!(!t.is_null(), "{}", last_error());
        let before = fences();
        curt_torch_record_stream(t, raw.cast());
        curt_torch_free(t, n as isize, 0, null_mut());
        assert_eq!(fences(), before + 1, "one event recorded at the free");
        ok(curt_dropin_live_count(&mut live));
        assert_eq!(live, live0);

        // The handle pair, twice; then every lookup of the steady one.
        let mut m = null_mut();
        ok(curt_malloc(n, null_mut(), &mut m));
        ok(curt_free(m));
        ok(curt_malloc(n, null_mut(), &mut m));
        let (mut addr, mut size) = (0u64, 0usize);
        ok(curt_memory_ptr(m, &mut addr));
        ok(curt_memory_size(m, &mut size));
        assert_ne!(addr, 0);
        assert_eq!(size, n);
        ok(curt_memset(m, 0, 0x3c, n));
        let mut back = vec![0u8; n];
        ok(curt_memcpy_dtoh(back.as_mut_ptr().cast(), m, 0, n));
        assert!(back.iter().all(|&b| b == 0x3c));
        let mut s = null_mut();
        ok(curt_stream_create(CURT_STREAM_NON_BLOCKING, 0, &mut s));
        // The pair on a stream handle: the steady one takes its block back.
        let (mut on_s, mut first, mut again) = (null_mut(), 0u64, 0u64);
        ok(curt_malloc_ptr(n, s, &mut on_s, &mut first));
        ok(curt_free(on_s));
        ok(curt_malloc_ptr(n, s, &mut on_s, &mut again));
        assert_eq!(
            again, first,
            "the steady pair on a stream takes its block back"
        );
        ok(curt_free(on_s));
        // The current allocator's door (the default pool here, as every test that
        // sets another resets it): the same steady pair.
        let (mut c, mut c_first, mut c_again) = (null_mut(), 0u64, 0u64);
        ok(curt_alloc(n, &mut c));
        ok(curt_memory_ptr(c, &mut c_first));
        ok(curt_free(c));
        ok(curt_alloc(n, &mut c));
        ok(curt_memory_ptr(c, &mut c_again));
        assert_eq!(
            c_again, c_first,
            "curt_alloc's steady pair takes its block back"
        );
        ok(curt_memset(c, 0, 0x5a, n));
        ok(curt_memcpy_dtoh(back.as_mut_ptr().cast(), c, 0, n));
        assert!(back.iter().all(|&b| b == 0x5a));
        ok(curt_free(c));
        ok(curt_pool_record_stream(m, s));
        let before = fences();
        ok(curt_free(m));
        assert_eq!(fences(), before + 1);
        expect(
            curt_free(m),
            CURT_ERROR_INVALID_HANDLE,
            "invalid memory handle",
        );

        ok(curt_stream_synchronize(s));
        ok(curt_stream_destroy(s));
        // Refused once destroyed, though this thread's last pair remembered it.
        let mut dead = null_mut();
        expect(
            curt_malloc(n, s, &mut dead),
            CURT_ERROR_INVALID_HANDLE,
            "invalid stream handle",
        );
        assert!(dead.is_null());
        cuda_rt::AsStream::synchronize(&side).unwrap();
    }
}
