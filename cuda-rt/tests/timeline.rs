//! The allocation-history picture rendered by a real browser: a history made here (a
//! synthetic workload; the GPU suite's pool tests record real ones) is turned into the
//! HTML page, which headless Chromium (Debian's `chromium`) screenshots and dumps; the
//! test checks the screenshot is a real image and the rendered page holds the curves,
//! the peak and the labelled blocks. Skips with a reason where Chromium is absent,
//! unless `CUDA_RT_REQUIRE_CHROMIUM=1`. `CUDA_RT_TIMELINE_PNG=path` keeps the
//! screenshot (docs/memory-timeline.png was made so).
//!
//! The same page pictures JSON read back ([`events_from_json`]): cuda-rt's own
//! snapshots and histories, and PyTorch's snapshot, here
//! `tests/fixtures/torch_snapshot.json`, written by hand in the layout
//! `torch.cuda.memory._snapshot()` documents (torch/cuda/memory.py: segments of
//! blocks with frames, and `device_traces` of trace entries with `time_us`, C++ and
//! Python frames, `free_requested`/`free_completed` pairs, an `oom` and a `snapshot`
//! entry, a segment given back) as `json.dump` writes it. Those checks need no
//! browser.

use std::panic::Location;
use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_rt::memory::arena::{FakeBackend, Pool, PoolSnapshot};
use cuda_rt::memory::history::{events_from_json, render_html, HistoryAction, HistoryEvent, Site};
use cuda_rt::testing;

/// The test that needs Chromium.
const TEST: &str = "the_timeline_renders_in_a_browser";

fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .flat_map(|n| {
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
                .map(move |d| d.join(n))
                .collect::<Vec<_>>()
        })
        .find(|p| p.is_file());
    if found.is_none() {
        let why = "no chromium on PATH (apt-get install chromium)";
        if std::env::var(testing::REQUIRE_CHROMIUM_VAR).is_ok_and(|v| v == "1") {
            panic!("{} is set but {why}", testing::REQUIRE_CHROMIUM_VAR);
        }
        // Said once and counted in the binary's closing line: libtest would
        // otherwise show a pass.
        testing::skip(TEST, testing::NO_CHROMIUM, &why);
    } else {
        testing::ran(TEST);
    }
    found
}

/// A serving-shaped history: a weight segment, then batches whose activations grow
/// and shrink, each freed before the next.
#[track_caller]
fn workload() -> Vec<HistoryEvent> {
    let site = Location::caller();
    let mut v = Vec::new();
    let mut t = 0u64;
    let mut push = |action, address, size| {
        t += 50_000;
        v.push(HistoryEvent {
            time_ns: t,
            action,
            device: 0,
            address,
            size,
            site: (action == HistoryAction::Malloc).then(|| Site::from(site)),
            thread: 1,
        });
    };
    push(HistoryAction::SegmentAlloc, 0x7f00_0000_0000, 512 << 20);
    push(HistoryAction::Malloc, 0x7f00_0000_0000, 256 << 20);
    // Requests of a drifting batch size: each one's activations (act, then 2 x act)
    // at the start of the current segment; a larger segment when a batch outgrows it.
    let (mut seg, mut seg_size) = (0x7f00_2000_0000u64, 0u64);
    for step in 0..24u64 {
        let batch = 8 + (step % 6) * 4 + step / 6;
        let act = batch << 20;
        if 3 * act > seg_size {
            seg += seg_size.next_multiple_of(2 << 20);
            seg_size = 3 * act;
            push(HistoryAction::SegmentAlloc, seg, seg_size);
        }
        push(HistoryAction::Malloc, seg, act);
        push(HistoryAction::Malloc, seg + act, 2 * act);
        push(HistoryAction::Free, seg + act, 2 * act);
        push(HistoryAction::Free, seg, act);
    }
    v
}

fn run(chrome: &Path, args: &[&str], page: &Path) -> std::process::Output {
    Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium")
}

/// PyTorch's snapshot, by hand (see the file's doc).
const TORCH_SNAPSHOT: &str = include_str!("fixtures/torch_snapshot.json");

#[test]
fn a_pytorch_snapshot_reads_into_the_history_and_the_pool_snapshot() {
    let events = events_from_json(TORCH_SNAPSHOT).unwrap();
    // free_requested (3), oom and snapshot are no history events.
    let actions: Vec<HistoryAction> = events.iter().map(|e| e.action).collect();
    use HistoryAction::*;
    assert_eq!(
        actions,
        [
            SegmentAlloc,
            Malloc,
            SegmentAlloc,
            Malloc,
            Malloc,
            Malloc,
            Free,
            Free,
            SegmentAlloc,
            Malloc,
            Free,
            SegmentFree
        ]
    );
    assert!(events.iter().all(|e| e.device == 0));
    assert!(events.windows(2).all(|w| w[0].time_ns < w[1].time_ns));
    assert_eq!(events[0].time_ns, 1_717_171_717_000_000_000);
    // The innermost Python frame, past PyTorch's C++ frames.
    let site = events[1].site.as_ref().unwrap();
    assert_eq!(
        (&*site.file, site.line, site.function.as_deref()),
        ("/workspace/model.py", 41, Some("__init__"))
    );
    // Its state, as a pool snapshot.
    let snap = PoolSnapshot::from_json(TORCH_SNAPSHOT).unwrap();
    assert_eq!(snap.device, Some(0));
    assert_eq!(snap.segments.len(), 2);
    assert_eq!(snap.allocated_bytes(), (8 << 20) + 512);
    assert_eq!(snap.reserved_bytes(), 22 << 20);
}

#[test]
fn the_page_pictures_a_pytorch_snapshot() {
    let html = render_html(
        &events_from_json(TORCH_SNAPSHOT).unwrap(),
        "PyTorch: a training step",
    );
    // 8 MiB weights, a 512 B bias, 32 MiB at the peak; a 40 MiB segment given back.
    assert!(html.contains("12 events"), "{html}");
    assert!(html.contains("peak in use 40.00 MiB"), "{html}");
    assert!(html.contains("reserved at most 62.00 MiB"), "{html}");
    for site in [
        "/workspace/train.py:33 in train_step",
        "/workspace/model.py:41 in __init__",
        "/workspace/model.py:42 in __init__",
    ] {
        assert!(html.contains(site), "{site}: {html}");
    }
    assert_eq!(html.matches("class=\"segment\"").count(), 3, "{html}");
}

#[test]
fn the_page_pictures_a_cuda_rt_pool_snapshot_and_history() {
    let pool = Pool::new(FakeBackend::checked());
    let a = pool.malloc(3 << 20, 0).unwrap();
    let b = pool.malloc(1000, 0).unwrap();
    let mut snap = pool.snapshot();
    snap.device = Some(0);
    let html = render_html(&events_from_json(&snap.to_json()).unwrap(), "pool");
    assert!(html.contains("peak in use 3.00 MiB"), "{html}");
    // A history written by cuda-rt reads back to the same page.
    let history = workload();
    let json = serde_json::to_string(&history).unwrap();
    assert_eq!(
        render_html(&events_from_json(&json).unwrap(), "t"),
        render_html(&history, "t")
    );
    pool.free(a).unwrap();
    pool.free(b).unwrap();
}

#[test]
fn the_timeline_renders_in_a_browser() {
    let Some(chrome) = chromium() else { return };
    let dir = std::env::temp_dir().join(format!("cuda-rt-timeline-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("timeline.html");
    std::fs::write(
        &page,
        render_html(&workload(), "cuda-rt pool: a serving workload"),
    )
    .unwrap();

    let dom = run(&chrome, &["--dump-dom"], &page);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(dom.contains("<svg"), "{dom}");
    assert!(dom.contains("peak in use"), "{dom}");
    assert!(
        dom.contains("256.00 MiB"),
        "the weights are labelled: {dom}"
    );
    assert!(
        dom.contains("timeline.rs"),
        "call sites are labelled: {dom}"
    );
    assert!(
        dom.contains("By segment")
            && dom.contains("class=\"segment\"")
            && dom.contains("class=\"block\""),
        "the by-segment panel: {dom}"
    );
    // PyTorch's snapshot, in the same viewer.
    let torch_page = dir.join("torch.html");
    let events = events_from_json(TORCH_SNAPSHOT).unwrap();
    std::fs::write(&torch_page, render_html(&events, "PyTorch snapshot")).unwrap();
    let dom = run(&chrome, &["--dump-dom"], &torch_page);
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("<svg") && dom.contains("peak in use 40.00 MiB"),
        "{dom}"
    );
    assert!(dom.contains("train.py:33 in train_step"), "{dom}");

    let png = dir.join("timeline.png");
    let shot = run(
        &chrome,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1100,1400",
        ],
        &page,
    );
    let bytes = std::fs::read(&png).unwrap_or_else(|e| {
        panic!(
            "no screenshot ({e}): {}",
            String::from_utf8_lossy(&shot.stderr)
        )
    });
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let width = u32::from_be_bytes(bytes[16..20].try_into().unwrap());
    let height = u32::from_be_bytes(bytes[20..24].try_into().unwrap());
    assert_eq!((width, height), (1100, 1400));
    // A blank page compresses to a few kilobytes; curves, text and a table do not.
    assert!(
        bytes.len() > 20_000,
        "{} bytes: nothing drawn?",
        bytes.len()
    );
    if let Some(keep) = std::env::var_os("CUDA_RT_TIMELINE_PNG") {
        std::fs::copy(&png, keep).unwrap();
    }
    let _ = std::fs::remove_dir_all(&dir);
}
