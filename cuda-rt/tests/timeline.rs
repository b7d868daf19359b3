//! The allocation-history picture rendered by a real browser: a history made here (a
//! synthetic workload; the GPU suite's pool tests record real ones) is turned into the
//! HTML page, which headless Chromium (Debian's `chromium`) screenshots and dumps; the
//! test checks the screenshot is a real image and the rendered page holds the curves,
//! the peak and the labelled blocks. Skips with a reason where Chromium is absent,
//! unless `CUDA_RT_REQUIRE_CHROMIUM=1`. `CUDA_RT_TIMELINE_PNG=path` keeps the
//! screenshot (docs/memory-timeline.png was made so).

use std::panic::Location;
use std::path::{Path, PathBuf};
use std::process::Command;

use cuda_rt::memory::history::{render_html, HistoryAction, HistoryEvent};
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
            site: (action == HistoryAction::Malloc).then_some(site),
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
