//! `cuda-rt snapshot view FILE.json`: the timeline page of a pool snapshot or an
//! allocation history, read and drawn by cuda-rt's own code
//! ([`events_from_json`], [`render_html`]).
//!
//! What it reads, all JSON: [`HistoryHook::to_json`]'s list of trace entries, or a
//! snapshot in PyTorch's shape (`MemoryPool::snapshot(..).to_json()`,
//! `cuda_rt_alloc.snapshot()`, or `torch.cuda.memory._snapshot()` saved with
//! `json.dump`): its `device_traces` when they hold events, else its segments and the
//! blocks in use, as one moment.
//!
//! [`HistoryHook::to_json`]: cuda_rt::memory::history::HistoryHook::to_json

use std::path::{Path, PathBuf};

use cuda_rt::memory::history::{events_from_json, render_html, HistoryEvent};

/// Reads `file`, writes its page to `out` (default: beside it, `.html`), prints the
/// page's path.
pub fn view(file: &Path, out: Option<PathBuf>) -> crate::Result<()> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let events = events_from_json(&text).map_err(|e| format!("{}: {e}", file.display()))?;
    let out = out.unwrap_or_else(|| file.with_extension("html"));
    if out == file {
        return Err(format!(
            "the page would replace {}: name another with --out",
            file.display()
        )
        .into());
    }
    let name = file.file_name().map_or_else(
        || file.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let title = format!("{name}: {}", what(&text, &events));
    std::fs::write(&out, render_html(&events, &title))
        .map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    println!("{}", out.display());
    Ok(())
}

/// What the file holds, in words, for the page's title: a history (a list of entries,
/// or a snapshot's traces), or a snapshot's state at one moment (every event at the
/// same time: nothing was recorded over time).
fn what(text: &str, events: &[HistoryEvent]) -> String {
    let n = events.len();
    let plural = if n == 1 { "" } else { "s" };
    let one_moment = events.windows(2).all(|w| w[0].time_ns == w[1].time_ns);
    if text.trim_start().starts_with('{') && one_moment {
        format!("memory snapshot, {n} event{plural} (one moment: no history was recorded)")
    } else {
        format!("allocation history, {n} event{plural}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_title_tells_a_history_from_one_moment() {
        let events = |times: &[u64]| -> Vec<HistoryEvent> {
            times
                .iter()
                .map(|&t| HistoryEvent {
                    time_ns: t,
                    action: cuda_rt::memory::history::HistoryAction::Malloc,
                    device: 0,
                    address: 0x1000 * (t + 1),
                    size: 512,
                    site: None,
                    thread: 0,
                })
                .collect()
        };
        assert_eq!(what("[]", &events(&[1, 2])), "allocation history, 2 events");
        assert_eq!(what("{}", &events(&[1, 2])), "allocation history, 2 events");
        assert!(
            what(" {", &events(&[0, 0, 0])).starts_with("memory snapshot, 3 events (one moment")
        );
    }
}
