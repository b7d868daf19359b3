//! PyTorch's memory snapshot as JSON (`torch.cuda.memory._snapshot()`, the dictionary
//! `_dump_snapshot` pickles): the wire types that pool snapshots
//! ([`PoolSnapshot`](super::arena::PoolSnapshot)) and allocation histories
//! ([`history`](super::history)) are written as and read from, with serde.
//!
//! Reading is lenient where PyTorch's versions differ (a block without `address`, a
//! segment without `device` or `is_expandable`, a trace entry without `time_us`) and
//! ignores the keys it does not use (`fx_*` frame fields, `user_metadata`, `pool_id`,
//! `host_segments`...). Writing gives Python's `json.dumps` text (`", "` and `": "`
//! between items), which the JSON of earlier versions of this crate was.

use serde::{Deserialize, Serialize};

/// A snapshot: `{"segments": [...], "device_traces": [[...], ...]}` (one trace per
/// device, by device index).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Snapshot {
    #[serde(default)]
    pub segments: Vec<Segment>,
    #[serde(default)]
    pub device_traces: Vec<Vec<TraceEntry>>,
}

/// Device number of a segment that has none (host memory, or a PyTorch version that
/// did not write it).
pub(crate) const NO_DEVICE: i32 = -1;

fn no_device() -> i32 {
    NO_DEVICE
}

/// One segment (a `cudaMalloc`) and its blocks.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Segment {
    #[serde(default = "no_device")]
    pub device: i32,
    pub address: u64,
    pub total_size: u64,
    #[serde(default)]
    pub allocated_size: u64,
    #[serde(default)]
    pub active_size: u64,
    #[serde(default)]
    pub requested_size: u64,
    #[serde(default)]
    pub stream: u64,
    #[serde(default)]
    pub segment_type: String,
    #[serde(default)]
    pub segment_pool_id: (u64, u64),
    #[serde(default)]
    pub is_expandable: bool,
    #[serde(default)]
    pub frames: Vec<Frame>,
    pub blocks: Vec<Block>,
}

/// One block of a segment. `address` is missing in PyTorch's older snapshots: the
/// blocks are then contiguous from the segment's address.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Block {
    #[serde(default)]
    pub address: Option<u64>,
    pub size: u64,
    #[serde(default)]
    pub requested_size: u64,
    pub state: String,
    #[serde(default)]
    pub frames: Vec<Frame>,
}

/// Block states: in use, freed but awaiting other streams, free.
pub(crate) const ACTIVE_ALLOCATED: &str = "active_allocated";
pub(crate) const ACTIVE_AWAITING_FREE: &str = "active_awaiting_free";
/// What versions of cuda-rt before PyTorch's name wrote for
/// [`ACTIVE_AWAITING_FREE`]; still read.
pub(crate) const ACTIVE_PENDING_FREE: &str = "active_pending_free";
pub(crate) const INACTIVE: &str = "inactive";

/// One frame of a call stack, innermost first in a list.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Frame {
    pub filename: String,
    pub line: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// One entry of a device trace (PyTorch's `TraceEntry`), with cuda-rt's own
/// `time_ns`, `device` and `thread` (which PyTorch's readers ignore).
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct TraceEntry {
    pub action: String,
    /// Missing for an `oom` entry.
    #[serde(default)]
    pub addr: u64,
    #[serde(default)]
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_ns: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<i32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub thread: Option<u64>,
    #[serde(default)]
    pub frames: Vec<Frame>,
}

/// Python's `json.dumps` spacing: `", "` between items, `": "` after keys.
struct PythonStyle;

impl serde_json::ser::Formatter for PythonStyle {
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// `value` as JSON text in Python's spacing.
pub(crate) fn to_string<T: Serialize + ?Sized>(value: &T) -> String {
    let mut out = Vec::with_capacity(256);
    let mut ser = serde_json::Serializer::with_formatter(&mut out, PythonStyle);
    // Cannot fail: the values written here are numbers, strings, booleans and lists
    // of them (no map with non-string keys, no failing `Serialize`), into a `Vec`.
    let _ = value.serialize(&mut ser);
    // serde_json writes UTF-8 only.
    String::from_utf8(out).unwrap_or_default()
}

/// A JSON reading error as the crate's error: what was being read, and where serde
/// stopped (line and column).
pub(crate) fn read_error(what: &str, e: impl std::fmt::Display) -> crate::Error {
    crate::Error::invalid_argument(
        crate::ArgumentKind::InvalidValue,
        format!("not {what}: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_spaced_as_pythons_json_dumps() {
        let f = Frame {
            filename: "a\"b".into(),
            line: 3,
            name: None,
        };
        assert_eq!(
            to_string(&[&f, &f]),
            r#"[{"filename": "a\"b", "line": 3}, {"filename": "a\"b", "line": 3}]"#
        );
    }

    #[test]
    fn a_pytorch_block_without_address_or_requested_size_reads() {
        let b: Block = serde_json::from_str(r#"{"size": 512, "state": "inactive"}"#).unwrap();
        assert_eq!((b.address, b.size, b.requested_size), (None, 512, 0));
        assert!(b.frames.is_empty());
    }
}
