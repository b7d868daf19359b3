//! The `cuda-rt` command, run as a user runs it: `--help`, `info` and `bench` (on a
//! machine without a GPU they say why and exit 0; with one, `info` lists the devices
//! and `bench` prints its figures), and `snapshot view` on files written by the
//! library's own snapshot and history writers.
//!
//! The binary is cargo's (`CARGO_BIN_EXE_cuda-rt`), or the one `CUDA_RT_CLI` names (the
//! GPU suite runs these tests far from the build).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cuda_rt::memory::arena::{FakeBackend, Pool};
use cuda_rt::memory::history::HistoryHook;
use cuda_rt::memory::hook::MemoryHook;
use cuda_rt::testing::gpu_required;

fn binary() -> PathBuf {
    std::env::var_os("CUDA_RT_CLI")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cuda-rt")))
}

/// Runs the command with `args`; its stdout, and the whole output for messages.
fn run(args: &[&str]) -> (Output, String) {
    let out = Command::new(binary())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", binary().display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    (out, stdout)
}

fn shown(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The loader's reason without the list of paths it tried.
fn first_words(reason: &str) -> &str {
    let first = reason.lines().next().unwrap_or_default();
    first.split("; tried ").next().unwrap_or(first)
}

#[test]
fn help_names_the_three_commands() {
    let (out, stdout) = run(&["--help"]);
    assert!(out.status.success(), "{}", shown(&out));
    for command in ["info", "snapshot", "bench"] {
        assert!(
            stdout.lines().any(|l| l.trim_start().starts_with(command)),
            "{command} missing: {stdout}"
        );
    }
    let (out, stdout) = run(&["snapshot", "view", "--help"]);
    assert!(
        out.status.success() && stdout.contains("--out"),
        "{}",
        shown(&out)
    );
    let (out, _) = run(&["no-such-command"]);
    assert_eq!(out.status.code(), Some(2), "{}", shown(&out));
}

#[test]
fn info_exits_0_and_says_why_there_is_no_gpu_or_lists_the_devices() {
    let (out, stdout) = run(&["info"]);
    assert!(out.status.success(), "{}", shown(&out));
    for section in [
        "Libraries",
        "Toolkit",
        "Devices",
        "Kernel cache",
        "Environment",
    ] {
        assert!(
            stdout.lines().any(|l| l == section),
            "no {section}: {stdout}"
        );
    }
    match cuda_rt::availability() {
        Err(why) => {
            assert!(!gpu_required(), "CUDA_RT_REQUIRE_GPU is set but: {why}");
            let line = format!("  no GPU: {}", first_words(&why.to_string()));
            assert!(stdout.lines().any(|l| l == line), "no {line:?}: {stdout}");
        }
        Ok(count) => {
            for id in 0..count {
                let name = cuda_rt::Device::new(id).unwrap().name().unwrap();
                let (major, minor) = cuda_rt::Device::new(id)
                    .unwrap()
                    .compute_capability()
                    .unwrap();
                let line = format!("  {id}: {name}, compute capability {major}.{minor}, ");
                assert!(stdout.contains(&line), "no {line:?}: {stdout}");
            }
            assert!(stdout.contains(" SMs, "), "{stdout}");
        }
    }
}

#[test]
fn info_says_where_each_library_is_or_which_package_to_install() {
    let (out, stdout) = run(&["info"]);
    assert!(out.status.success(), "{}", shown(&out));
    let pip = [
        ("CUDA driver", ""),
        ("CUDA runtime", "nvidia-cuda-runtime"),
        ("NVRTC", "nvidia-cuda-nvrtc"),
        ("cuBLAS", "nvidia-cublas"),
        ("cuSOLVER", "nvidia-cusolver"),
        ("cuSPARSE", "nvidia-cusparse"),
        ("cuRAND", "nvidia-curand"),
        ("NCCL", "nvidia-nccl-cu1"),
    ];
    for (name, package) in pip {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(&format!("  {name:<13} ")))
            .unwrap_or_else(|| panic!("no {name} line: {stdout}"));
        let rest: Vec<&str> = line[15..].split_whitespace().collect();
        if rest[0] == "missing" {
            let remedy = if package.is_empty() {
                "install the NVIDIA driver".to_owned()
            } else {
                format!("pip install {package}")
            };
            assert!(line.contains(&remedy), "{line}");
        } else {
            // A version, then the file it was loaded from.
            let path = rest.last().unwrap();
            assert!(Path::new(path).is_file(), "{line}");
        }
    }
    assert!(
        stdout.contains("  NVTX          v3         built into cuda-rt"),
        "{stdout}"
    );
}

#[test]
fn bench_exits_0_and_says_why_there_is_no_gpu_or_prints_its_figures() {
    let (out, stdout) = run(&["bench", "--reps", "3"]);
    assert!(out.status.success(), "{}", shown(&out));
    match cuda_rt::availability() {
        Err(why) => {
            assert!(!gpu_required(), "CUDA_RT_REQUIRE_GPU is set but: {why}");
            let line = format!("skipped: no GPU: {}", first_words(&why.to_string()));
            assert_eq!(stdout.trim_end(), line);
        }
        Ok(_) => {
            let figures: Vec<serde_json::Value> = stdout
                .lines()
                .filter(|l| l.starts_with('{'))
                .map(|l| serde_json::from_str(l).unwrap())
                .collect();
            let names: Vec<&str> = figures
                .iter()
                .map(|f| f["name"].as_str().unwrap())
                .collect();
            assert_eq!(
                names,
                [
                    "pool_malloc_free_pair",
                    "launch_empty_kernel",
                    "event_record",
                    "h2d_pinned",
                    "d2h_pinned"
                ],
                "{stdout}"
            );
            for f in &figures {
                let (v, r, ratio) = (f["value"].as_f64(), f["raw"].as_f64(), f["ratio"].as_f64());
                assert!(
                    v.is_some_and(|v| v > 0.0)
                        && r.is_some_and(|r| r > 0.0)
                        && ratio.is_some_and(|x| x > 0.0),
                    "{f}"
                );
            }
            assert!(stdout.contains("\nfigure "), "no table: {stdout}");
        }
    }
}

#[test]
fn snapshot_view_draws_a_pool_snapshot_beside_its_file() {
    // A pool on host memory with two blocks in use and one freed, as the library's
    // snapshot writer gives it.
    let pool = Pool::new(FakeBackend::checked());
    let a = pool.malloc(3 << 20, 7).unwrap();
    let b = pool.malloc(1 << 20, 7).unwrap();
    let c = pool.malloc(512, 7).unwrap();
    pool.free(c).unwrap();
    let mut snapshot = pool.snapshot();
    snapshot.device = Some(0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pool.json");
    std::fs::write(&file, snapshot.to_json()).unwrap();

    let (out, stdout) = run(&["snapshot", "view", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", shown(&out));
    let page = dir.path().join("pool.html");
    assert_eq!(stdout.trim_end(), page.display().to_string());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.starts_with("<!DOCTYPE html>") && html.contains("<svg"),
        "{html}"
    );
    assert!(html.contains("pool.json: memory snapshot"), "{html}");
    let segments = snapshot.segments.len();
    assert_eq!(
        html.matches("class=\"segment\"").count(),
        segments,
        "{html}"
    );
    // The two blocks in use, each a rectangle; the freed one is not drawn.
    assert_eq!(html.matches("class=\"block\"").count(), 2, "{html}");
    assert!(html.contains("peak in use 4.00 MiB"), "{html}");
    pool.free(a).unwrap();
    pool.free(b).unwrap();
}

#[test]
fn snapshot_view_draws_a_history_where_out_says() {
    let history = HistoryHook::new(100);
    history.alloc_post(0, 8 << 20, 0x1000_0000);
    history.malloc_post(0, 2 << 20, 2 << 20, 0x1000_0000, 1);
    history.malloc_post(0, 5 << 20, 5 << 20, 0x1020_0000, 2);
    history.free_post(0, 2 << 20, 0x1000_0000, 1);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("history.json");
    std::fs::write(&file, history.to_json()).unwrap();
    let page = dir.path().join("elsewhere.html");

    let (out, stdout) = run(&[
        "snapshot",
        "view",
        file.to_str().unwrap(),
        "--out",
        page.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", shown(&out));
    assert_eq!(stdout.trim_end(), page.display().to_string());
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("history.json: allocation history, 4 events"),
        "{html}"
    );
    assert!(html.contains("peak in use 7.00 MiB"), "{html}");
}

#[test]
fn snapshot_view_draws_a_pytorch_snapshot_with_its_call_sites() {
    // The shape of torch.cuda.memory._snapshot() with history recorded, saved as JSON:
    // one trace list per device, frames innermost first.
    let json = r#"{"segments": [], "device_traces": [[
        {"action": "segment_alloc", "addr": 1048576, "size": 20971520, "time_us": 10, "frames": []},
        {"action": "alloc", "addr": 1048576, "size": 4194304, "time_us": 11,
         "frames": [{"filename": "train.py", "line": 42, "name": "forward"}]},
        {"action": "free_requested", "addr": 1048576, "size": 4194304, "time_us": 12, "frames": []},
        {"action": "free_completed", "addr": 1048576, "size": 4194304, "time_us": 13, "frames": []},
        {"action": "alloc", "addr": 5242880, "size": 2097152, "time_us": 14,
         "frames": [{"filename": "train.py", "line": 57, "name": "backward"}]}]]}"#;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("torch.json");
    std::fs::write(&file, json).unwrap();
    let (out, _) = run(&["snapshot", "view", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", shown(&out));
    let html = std::fs::read_to_string(dir.path().join("torch.html")).unwrap();
    assert!(html.contains("allocation history, 4 events"), "{html}");
    assert!(html.contains("peak in use 4.00 MiB"), "{html}");
    // The largest block live at the peak, with the line that allocated it.
    assert!(
        html.contains("<td>4.00 MiB</td><td>0x100000</td><td>0</td><td>train.py:42"),
        "{html}"
    );
}

#[test]
fn snapshot_view_refuses_what_it_cannot_read() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.json");
    let (out, _) = run(&["snapshot", "view", missing.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("cannot read"),
        "{}",
        shown(&out)
    );

    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"segments": [{"address": 1}]}"#).unwrap();
    let (out, _) = run(&["snapshot", "view", bad.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("bad.json: ") && stderr.contains("total_size"),
        "{}",
        shown(&out)
    );
    assert!(!dir.path().join("bad.html").exists());
}
