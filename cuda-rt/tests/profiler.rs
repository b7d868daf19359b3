//! Profiling: NVTX ranges and marks (no GPU, no tool needed), NVTX events reaching a
//! tool injected the way Nsight Systems is, and `profile()` always stopping the CUDA
//! profiler.

use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use cuda_rt::profiler::{
    self, mark, mark_color, open_scopes, profile, range, range_color, range_pop, range_push,
    range_push_color, Color, ProfileGuard,
};
use cuda_rt::{ArgumentKind, Error, StateKind};

// ---------------------------------------------------------------- NVTX, no tool

#[test]
fn nvtx_ranges_nest_and_pop_without_a_tool() {
    range_push("outer").unwrap();
    range_push_color("middle", Color::BLUE).unwrap();
    range_push_color("inner", 0x80FF_8000u32).unwrap();
    range_pop();
    range_pop();
    range_pop();
}

#[test]
fn range_guards_nest_and_pop_on_drop() {
    let outer = range("outer").unwrap();
    for step in 0..3 {
        let _inner = range_color(&format!("step {step}"), Color::from_id(step)).unwrap();
    }
    let explicit = range("explicit").unwrap();
    explicit.end();
    drop(outer);
}

#[test]
fn popping_with_no_open_range_is_harmless() {
    range_pop();
    range_pop();
}

#[test]
fn mark_with_a_color_runs_without_a_tool() {
    mark("plain").unwrap();
    mark_color("red", Color::RED).unwrap();
    mark_color("raw argb", 0xFF12_3456u32).unwrap();
}

#[test]
fn messages_may_be_str_string_cstr_or_long() {
    let owned = String::from("owned");
    let c_owned = CString::new("c owned").unwrap();
    let long = "x".repeat(10_000);
    mark(&owned).unwrap();
    mark(c"c literal").unwrap();
    mark(&c_owned).unwrap();
    mark(long.as_str()).unwrap();
    // Exactly at and around the stack buffer's edge.
    for n in 250..260 {
        mark("y".repeat(n).as_str()).unwrap();
    }
    let _r = range(&long).unwrap();
}

#[test]
fn nul_in_message_is_an_invalid_argument() {
    let long_with_nul = format!("{}\0tail", "z".repeat(1000));
    let results = [
        range_push("bad\0range"),
        range_push_color("bad\0range", Color::GREEN),
        mark("bad\0mark"),
        mark_color("bad\0mark", Color::GREEN),
        range("bad\0guard").map(drop),
        range_color("bad\0guard", 0u32).map(drop),
        mark(long_with_nul.as_str()),
        mark("\0"),
    ];
    for r in results {
        match r {
            Err(Error::InvalidArgument {
                kind: ArgumentKind::InteriorNul,
                message,
            }) => assert!(message.contains("NUL"), "{message}"),
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }
    let e = mark("ab\0cd").unwrap_err().to_string();
    assert!(e.contains("offset 2"), "{e}");
}

#[test]
fn colors_convert_between_forms() {
    assert_eq!(Color::rgb(0x12, 0x34, 0x56).to_argb(), 0xFF12_3456);
    assert_eq!(Color::argb(0x0102_0304).to_argb(), 0x0102_0304);
    assert_eq!(Color::from(0xFF00_FF00), Color::GREEN);
    assert_eq!(Color::from_id(0), Color::GREEN);
    assert_eq!(Color::from_id(1), Color::BLUE);
    assert_eq!(Color::from_id(8), Color::BLUE);
}

#[test]
fn range_guards_are_independent_per_thread() {
    let workers: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                for i in 0..100 {
                    let _r =
                        range_color(&format!("thread {t} item {i}"), Color::from_id(t)).unwrap();
                    mark("tick").unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}

// ---------------------------------------------------------------- NVTX, with a tool

/// An NVTX tool in the form Nsight Systems uses: a shared library named by
/// `NVTX_INJECTION64_PATH` exporting `InitializeInjectionNvtx2`. It writes every core
/// push, pop and mark to the file named by `CUDA_RT_NVTX_LOG`.
const RECORDER_TOOL: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include "nvtx3/nvToolsExt.h"

static FILE *out;
static int depth;

static void attrs(const char *what, const nvtxEventAttributes_t *a) {
    fprintf(out, "%s %s", what, a->messageType == NVTX_MESSAGE_TYPE_ASCII ? a->message.ascii : "?");
    if (a->colorType == NVTX_COLOR_ARGB) fprintf(out, " #%08x", a->color);
    fprintf(out, "\n");
    fflush(out);
}
static int push(const nvtxEventAttributes_t *a) { attrs("push", a); return depth++; }
static int pop(void) { fprintf(out, "pop\n"); fflush(out); return depth > 0 ? --depth : -1; }
static void mark(const nvtxEventAttributes_t *a) { attrs("mark", a); }

__attribute__((visibility("default")))
int InitializeInjectionNvtx2(NvtxGetExportTableFunc_t get) {
    const char *path = getenv("CUDA_RT_NVTX_LOG");
    if (!path || !(out = fopen(path, "w"))) return 0;
    const NvtxExportTableCallbacks *cb = (const NvtxExportTableCallbacks *)get(NVTX_ETID_CALLBACKS);
    NvtxFunctionTable table = 0;
    unsigned int size = 0;
    if (!cb || !cb->GetModuleFunctionTable(NVTX_CB_MODULE_CORE, &table, &size)) return 0;
    if (size <= NVTX_CBID_CORE_RangePop) return 0;
    *table[NVTX_CBID_CORE_RangePushEx] = (NvtxFunctionPointer)push;
    *table[NVTX_CBID_CORE_RangePop] = (NvtxFunctionPointer)pop;
    *table[NVTX_CBID_CORE_MarkEx] = (NvtxFunctionPointer)mark;
    return 1;
}
"#;

const LOG_VAR: &str = "CUDA_RT_NVTX_LOG";

/// Builds the recorder tool with the system C compiler, or says why it cannot.
fn build_recorder(dir: &Path) -> Result<PathBuf, String> {
    let src = dir.join("nvtx_recorder.c");
    let lib = dir.join("libnvtx_recorder.so");
    std::fs::write(&src, RECORDER_TOOL).map_err(|e| e.to_string())?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let include = Path::new(env!("CARGO_MANIFEST_DIR")).join("csrc");
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-I")
        .arg(&include)
        .arg("-ldl")
        .output()
        .map_err(|e| format!("cannot run the C compiler `{cc}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{cc}` failed to build the recorder tool:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(lib)
}

/// The events the child sends, and what the recorder must see.
fn emit_known_events() {
    range_push("outer").unwrap();
    {
        let _r = range_color("inner", Color::argb(0x8011_2233)).unwrap();
        mark_color("tick", Color::RED).unwrap();
        assert!(mark("bad\0tick").is_err());
    }
    mark(c"plain").unwrap();
    let long = "L".repeat(300);
    mark(long.as_str()).unwrap();
    range_pop();
}

fn expected_events() -> String {
    format!(
        "push outer\npush inner #80112233\nmark tick #ffff0000\npop\nmark plain\nmark {}\npop\n",
        "L".repeat(300)
    )
}

/// Runs in the child process only (when the parent test sets the log variable).
#[test]
fn nvtx_tool_child_emits_known_events() {
    if std::env::var_os(LOG_VAR).is_none() {
        return;
    }
    emit_known_events();
}

#[test]
fn nvtx_events_reach_a_tool_injected_like_nsight() {
    let dir = std::env::temp_dir().join(format!("cuda-rt-nvtx-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let lib = match build_recorder(&dir) {
        Ok(lib) => lib,
        Err(why) => {
            eprintln!("skipped nvtx_events_reach_a_tool_injected_like_nsight: {why}");
            return;
        }
    };
    let log = dir.join("events.log");
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "nvtx_tool_child_emits_known_events",
            "--test-threads=1",
        ])
        .env("NVTX_INJECTION64_PATH", &lib)
        .env(LOG_VAR, &log)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "child failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let events = std::fs::read_to_string(&log).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(events, expected_events());
}

// ---------------------------------------------------------------- profile()

/// `open_scopes()` is process-wide: profile tests take turns.
static PROFILE_TESTS: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    PROFILE_TESTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[test]
fn profile_without_a_gpu_returns_the_driver_error_and_skips_the_body() {
    if cuda_rt::is_available() {
        eprintln!("skipped: a GPU is present (covered by the GPU tests below)");
        return;
    }
    let _serial = serial();
    let mut ran = false;
    let r = profile(|| -> cuda_rt::Result<()> {
        ran = true;
        Ok(())
    });
    let e = r.unwrap_err();
    assert!(matches!(e, Error::Load(_) | Error::Driver(_)), "{e:?}");
    assert!(!ran, "the body must not run when the profiler cannot start");
    assert!(ProfileGuard::start().is_err());
    assert!(profiler::start().is_err());
    assert!(profiler::stop().is_err());
    assert_eq!(open_scopes(), 0);
}

cuda_rt::gpu_test!(profile_returns_the_body_value_and_stops, {
    let _serial = serial();
    let v = profile(|| -> cuda_rt::Result<i32> {
        assert_eq!(open_scopes(), 1);
        Ok(7)
    })
    .unwrap();
    assert_eq!(v, 7);
    assert_eq!(open_scopes(), 0);
});

cuda_rt::gpu_test!(profile_stops_the_profiler_when_the_body_returns_err, {
    let _serial = serial();
    let r = profile(|| -> cuda_rt::Result<()> {
        assert_eq!(open_scopes(), 1);
        Err(Error::invalid_state(StateKind::Other, "body failed"))
    });
    assert!(
        matches!(r, Err(Error::InvalidState { ref message, .. }) if message == "body failed"),
        "{r:?}"
    );
    assert_eq!(open_scopes(), 0);
});

cuda_rt::gpu_test!(profile_stops_the_profiler_when_the_body_panics, {
    let _serial = serial();
    let r = catch_unwind(AssertUnwindSafe(|| {
        profile(|| -> cuda_rt::Result<()> {
            assert_eq!(open_scopes(), 1);
            panic!("body panicked");
        })
    }));
    assert!(r.is_err(), "the panic must go on");
    assert_eq!(open_scopes(), 0);
    // The profiler can be started again afterwards.
    profile(|| -> cuda_rt::Result<()> { Ok(()) }).unwrap();
});

cuda_rt::gpu_test!(profile_scopes_nest_and_the_outermost_stops, {
    let _serial = serial();
    let outer = ProfileGuard::start().unwrap();
    assert_eq!(outer.device(), cuda_rt::get_device_id());
    {
        let _inner = ProfileGuard::start().unwrap();
        assert_eq!(open_scopes(), 2);
    }
    assert_eq!(open_scopes(), 1);
    outer.stop().unwrap();
    assert_eq!(open_scopes(), 0);
    profiler::start().unwrap();
    profiler::stop().unwrap();
});
