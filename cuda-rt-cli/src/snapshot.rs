//! `cuda-rt snapshot view FILE.json`: the timeline page of a pool snapshot or an
//! allocation history, drawn by cuda-rt's own renderer
//! ([`render_html_with_sites`]).
//!
//! What it reads, all JSON:
//! - a list of trace events: [`HistoryHook::to_json`]'s output (`action`, `addr`,
//!   `size`, `time_us`, `device`, `thread`, `frames`);
//! - a snapshot object in PyTorch's shape: `MemoryPool::snapshot(..).to_json()`,
//!   `cuda_rt_alloc.snapshot()`, or `torch.cuda.memory._snapshot()` saved with
//!   `json.dump`. Its `device_traces` (one list per device) are drawn when they hold
//!   events; else its `segments` are, as one moment: each segment taken, then each
//!   block in use.
//!
//! [`HistoryHook::to_json`]: cuda_rt::memory::history::HistoryHook::to_json

use std::path::{Path, PathBuf};

use cuda_rt::memory::history::{render_html_with_sites, HistoryAction, HistoryEvent};
use serde_json::Value;

/// The events to draw, their call sites (`file:line`), and what they are, in words.
#[derive(Debug)]
pub struct Trace {
    pub events: Vec<HistoryEvent>,
    pub sites: Vec<Option<String>>,
    pub what: String,
    /// Trace events whose action changes nothing drawn (`free_requested`, `oom`...).
    pub skipped: usize,
}

/// Reads `file`, writes its page to `out` (default: beside it, `.html`), prints the
/// page's path.
pub fn view(file: &Path, out: Option<PathBuf>) -> crate::Result<()> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let json: Value =
        serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", file.display()))?;
    let trace = Trace::from_json(&json).map_err(|e| format!("{}: {e}", file.display()))?;
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
    let html = render_html_with_sites(
        &trace.events,
        &trace.sites,
        &format!("{name}: {}", trace.what),
    );
    std::fs::write(&out, html).map_err(|e| format!("cannot write {}: {e}", out.display()))?;
    if trace.skipped > 0 {
        eprintln!(
            "note: {} trace event{} left out (actions that change nothing drawn: \
             free_requested, segment_free, oom...)",
            trace.skipped,
            if trace.skipped == 1 { "" } else { "s" }
        );
    }
    println!("{}", out.display());
    Ok(())
}

impl Trace {
    /// The events of a trace list or a snapshot object (see the module docs).
    pub fn from_json(json: &Value) -> Result<Trace, String> {
        let mut trace = Trace {
            events: Vec::new(),
            sites: Vec::new(),
            what: String::new(),
            skipped: 0,
        };
        match json {
            Value::Array(events) => {
                trace.read_events(events, 0, "")?;
                trace.what = format!("allocation history, {} events", trace.events.len());
            }
            Value::Object(snapshot) => {
                if let Some(Value::Array(per_device)) = snapshot.get("device_traces") {
                    for (device, events) in per_device.iter().enumerate() {
                        let Value::Array(events) = events else {
                            return Err(format!("device_traces[{device}] is not a list"));
                        };
                        let where_ = format!("device_traces[{device}]");
                        trace.read_events(events, device as i32, &where_)?;
                    }
                }
                if !trace.events.is_empty() || trace.skipped > 0 {
                    trace.what = format!("allocation history, {} events", trace.events.len());
                } else {
                    let Some(Value::Array(segments)) = snapshot.get("segments") else {
                        return Err("neither trace events nor a \"segments\" list".to_owned());
                    };
                    trace.read_segments(segments)?;
                    trace.what = format!(
                        "pool snapshot, {} segment{} (one moment: no history was recorded)",
                        segments.len(),
                        if segments.len() == 1 { "" } else { "s" }
                    );
                }
            }
            _ => return Err("expected a list of trace events or a snapshot object".to_owned()),
        }
        // One time line across devices; ties keep the file's order.
        let mut order: Vec<usize> = (0..trace.events.len()).collect();
        order.sort_by_key(|&i| trace.events[i].time_ns);
        trace.events = order.iter().map(|&i| trace.events[i]).collect();
        trace.sites = order.iter().map(|&i| trace.sites[i].clone()).collect();
        Ok(trace)
    }

    fn read_events(&mut self, events: &[Value], device: i32, list: &str) -> Result<(), String> {
        for (i, e) in events.iter().enumerate() {
            let at = || format!("{list}[{i}]");
            let action = e
                .get("action")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{}: no \"action\"", at()))?;
            let Some(action) = HistoryAction::from_name(action) else {
                self.skipped += 1;
                continue;
            };
            let time_us = number(e, "time_us").unwrap_or(0);
            self.events.push(HistoryEvent {
                time_ns: time_us.saturating_mul(1000),
                action,
                device: number(e, "device").map_or(device, |d| d as i32),
                address: number(e, "addr").ok_or_else(|| format!("{}: no \"addr\"", at()))?,
                size: number(e, "size").ok_or_else(|| format!("{}: no \"size\"", at()))?,
                site: None,
                thread: number(e, "thread").unwrap_or(0),
            });
            self.sites.push(first_frame(e));
        }
        Ok(())
    }

    /// A snapshot without history, as one moment: each segment, then its blocks in use.
    fn read_segments(&mut self, segments: &[Value]) -> Result<(), String> {
        for (i, s) in segments.iter().enumerate() {
            let at = |field: &str| format!("segments[{i}]: no \"{field}\"");
            let device = number(s, "device").map_or(0, |d| d as i32);
            let mut push = |action, address, size| {
                self.events.push(HistoryEvent {
                    time_ns: 0,
                    action,
                    device,
                    address,
                    size,
                    site: None,
                    thread: 0,
                });
                self.sites.push(None);
            };
            push(
                HistoryAction::SegmentAlloc,
                number(s, "address").ok_or_else(|| at("address"))?,
                number(s, "total_size").ok_or_else(|| at("total_size"))?,
            );
            let Some(Value::Array(blocks)) = s.get("blocks") else {
                continue;
            };
            for (j, b) in blocks.iter().enumerate() {
                let state = b.get("state").and_then(Value::as_str).unwrap_or("");
                if !state.starts_with("active") {
                    continue;
                }
                let missing = |field: &str| format!("segments[{i}].blocks[{j}]: no \"{field}\"");
                push(
                    HistoryAction::Malloc,
                    number(b, "address").ok_or_else(|| missing("address"))?,
                    number(b, "size").ok_or_else(|| missing("size"))?,
                );
            }
        }
        Ok(())
    }
}

/// A non-negative number field (integers; a float is cut to its integer part).
fn number(v: &Value, field: &str) -> Option<u64> {
    let f = v.get(field)?;
    f.as_u64()
        .or_else(|| f.as_f64().filter(|x| *x >= 0.0).map(|x| x as u64))
}

/// `file:line` of an event's first (innermost) frame.
fn first_frame(e: &Value) -> Option<String> {
    let f = e.get("frames")?.as_array()?.first()?;
    let file = f.get("filename")?.as_str()?;
    match number(f, "line") {
        Some(line) => Some(format!("{file}:{line}")),
        None => Some(file.to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pytorch_traces_merge_devices_in_time_order() {
        let json: Value = serde_json::from_str(
            r#"{"segments": [], "device_traces": [
                [{"action": "segment_alloc", "addr": 4096, "size": 2097152, "time_us": 1},
                 {"action": "alloc", "addr": 4096, "size": 512, "time_us": 5,
                  "frames": [{"filename": "train.py", "line": 12, "name": "step"}]}],
                [{"action": "free_requested", "addr": 8192, "size": 512, "time_us": 2},
                 {"action": "alloc", "addr": 8192, "size": 512, "time_us": 3}]]}"#,
        )
        .unwrap();
        let t = Trace::from_json(&json).unwrap();
        let times: Vec<u64> = t.events.iter().map(|e| e.time_ns).collect();
        assert_eq!(times, [1000, 3000, 5000]);
        assert_eq!(t.events[1].device, 1);
        assert_eq!(t.sites[2].as_deref(), Some("train.py:12"));
        assert_eq!(t.skipped, 1);
    }

    #[test]
    fn a_bad_event_is_named() {
        let json: Value = serde_json::from_str(r#"[{"action": "alloc", "size": 1}]"#).unwrap();
        assert_eq!(Trace::from_json(&json).unwrap_err(), "[0]: no \"addr\"");
        assert!(Trace::from_json(&Value::Bool(true)).is_err());
    }
}
