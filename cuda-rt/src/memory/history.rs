//! Allocation history: a bounded ring of the pool's events with timestamps and call
//! sites ([`HistoryHook`], a [memory hook](super::hook)), and a picture of it
//! ([`render_html`]): a self-contained HTML page with an SVG timeline of reserved and
//! in-use memory and the largest blocks live at the peak, labelled with their sites.
//!
//! With the `serde` feature (on by default) a history is JSON both ways: written as
//! the `device_traces` entries of PyTorch's snapshot ([`HistoryHook::to_json`]) and
//! read back ([`events_from_json`]), which also reads pool snapshots, cuda-rt's
//! ([`PoolSnapshot::to_json`](crate::memory::arena::PoolSnapshot::to_json)) and
//! PyTorch's (`torch.cuda.memory._snapshot()` written with `json.dump`): the page
//! pictures any of them.
//!
//! Recording is off until a [`HistoryHook`] is registered, and then costs what any
//! hook costs; with no hook the pool's hot path tests one thread-local flag, as it
//! always does. Hooks are per thread (CuPy's rule); to record a workload of several
//! threads, register a clone of one `HistoryHook` on each: clones share one ring, and
//! each event carries the thread that made it.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use std::rc::Rc;
//! use cuda_rt::memory::history::{render_html, HistoryHook};
//! let history = Rc::new(HistoryHook::new(100_000));
//! let _guard = cuda_rt::memory::hook::register_hook("history", history.clone())?;
//! let a = cuda_rt::alloc(1 << 20)?;
//! drop(a);
//! std::fs::write("memory.html", render_html(&history.events(), "my workload")).unwrap();
//! # Ok(()) }
//! ```

use std::borrow::Cow;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::hook::{call_site, MemoryHook};
use crate::error::human_bytes;

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HistoryAction {
    /// The pool took a new segment from the driver.
    SegmentAlloc,
    /// A block was handed out.
    Malloc,
    /// A block went back to the pool.
    Free,
    /// The pool gave a segment back to the driver. The hooks do not see releases, so
    /// a [`HistoryHook`] records none; a trace read from PyTorch's snapshot has them
    /// (`segment_free`, `segment_unmap`).
    SegmentFree,
}

impl HistoryAction {
    /// The action's name in PyTorch's trace entries (`"segment_alloc"`, `"alloc"`,
    /// `"free_completed"`, `"segment_free"`).
    pub fn name(self) -> &'static str {
        match self {
            HistoryAction::SegmentAlloc => "segment_alloc",
            HistoryAction::Malloc => "alloc",
            HistoryAction::Free => "free_completed",
            HistoryAction::SegmentFree => "segment_free",
        }
    }

    /// The action a PyTorch trace entry's name stands for in a history: its own names,
    /// and `"segment_map"` / `"segment_unmap"` (an expandable segment growing and
    /// shrinking) as a segment taken and given back. `None` for the entries that
    /// change no memory picture (`"free_requested"`: the block is in use until
    /// `"free_completed"`; `"oom"`, `"snapshot"`, `"annotate"`) and unknown names.
    pub fn from_name(name: &str) -> Option<HistoryAction> {
        Some(match name {
            "segment_alloc" | "segment_map" => HistoryAction::SegmentAlloc,
            "alloc" => HistoryAction::Malloc,
            "free_completed" => HistoryAction::Free,
            "segment_free" | "segment_unmap" => HistoryAction::SegmentFree,
            _ => return None,
        })
    }
}

/// Where a block was allocated: a line of Rust (`#[track_caller]`'s location, as
/// recorded), or a frame of a trace read from JSON.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Site {
    /// The source file.
    pub file: Cow<'static, str>,
    /// Its line.
    pub line: u32,
    /// The function, when the trace names it (PyTorch's frames do; a recorded
    /// location does not).
    pub function: Option<Cow<'static, str>>,
}

impl From<&'static Location<'static>> for Site {
    /// The site of a recorded location: borrowed, nothing is copied.
    fn from(l: &'static Location<'static>) -> Site {
        Site {
            file: Cow::Borrowed(l.file()),
            line: l.line(),
            function: None,
        }
    }
}

impl std::fmt::Display for Site {
    /// `file:line`, then ` in function` when known.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.line)?;
        if let Some(func) = &self.function {
            write!(f, " in {func}")?;
        }
        Ok(())
    }
}

/// One event of the history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEvent {
    /// Nanoseconds since the hook was made.
    pub time_ns: u64,
    /// What happened.
    pub action: HistoryAction,
    /// The device.
    pub device: i32,
    /// The block's (or segment's) address.
    pub address: u64,
    /// Its size in bytes (rounded, as the pool holds it).
    pub size: u64,
    /// The line that allocated (mallocs only, when known).
    pub site: Option<Site>,
    /// The thread that made the event: a small number, 1 for the first thread that
    /// recorded into any history, and so on.
    pub thread: u64,
}

/// This thread's number in histories (see [`HistoryEvent::thread`]).
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static MINE: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    MINE.try_with(|n| *n).unwrap_or(0)
}

/// A memory hook that keeps the last `capacity` events of the pool, from every
/// thread where it (or a clone: clones share the ring) is registered.
#[derive(Debug, Clone)]
pub struct HistoryHook {
    inner: Arc<Ring>,
}

#[derive(Debug)]
struct Ring {
    start: Instant,
    capacity: usize,
    events: Mutex<VecDeque<HistoryEvent>>,
    dropped: AtomicU64,
}

impl HistoryHook {
    /// A recorder that keeps at most `capacity` events (the oldest go first).
    pub fn new(capacity: usize) -> HistoryHook {
        HistoryHook {
            inner: Arc::new(Ring {
                start: Instant::now(),
                capacity: capacity.max(1),
                events: Mutex::new(VecDeque::new()),
                dropped: AtomicU64::new(0),
            }),
        }
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, VecDeque<HistoryEvent>> {
        self.inner
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The events kept, oldest first.
    pub fn events(&self) -> Vec<HistoryEvent> {
        self.ring().iter().cloned().collect()
    }

    /// How many events fell out of the ring.
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    fn push(&self, action: HistoryAction, device: i32, address: u64, size: usize) {
        let e = HistoryEvent {
            time_ns: self.inner.start.elapsed().as_nanos() as u64,
            action,
            device,
            address,
            size: size as u64,
            // A recorded location is borrowed: nothing allocated here.
            site: if action == HistoryAction::Malloc {
                call_site().map(Site::from)
            } else {
                None
            },
            thread: thread_number(),
        };
        let mut r = self.ring();
        if r.len() == self.inner.capacity {
            r.pop_front();
            self.inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
        r.push_back(e);
    }

    /// The events as JSON, oldest first: a list of PyTorch's snapshot's trace entries
    /// (one device's `device_traces` list), `[{"action", "addr", "size", "time_us",
    /// "time_ns", "device", "thread", "frames": [{"filename", "line"}]}]`, spaced as
    /// Python's `json.dumps` (`time_ns`, `device` and `thread` are cuda-rt's: exact
    /// time, the device and the recording thread). Read back with
    /// [`events_from_json`]. The same as `serde_json::to_string(&hook.events())`
    /// but for the spacing.
    #[cfg(feature = "serde")]
    pub fn to_json(&self) -> String {
        crate::memory::snapshot_json::to_string(&*self.ring())
    }
}

impl MemoryHook for HistoryHook {
    fn alloc_post(&self, device: i32, mem_size: usize, mem_ptr: u64) {
        self.push(HistoryAction::SegmentAlloc, device, mem_ptr, mem_size);
    }

    fn malloc_post(&self, device: i32, _size: usize, mem_size: usize, mem_ptr: u64, _id: usize) {
        self.push(HistoryAction::Malloc, device, mem_ptr, mem_size);
    }

    fn free_post(&self, device: i32, mem_size: usize, mem_ptr: u64, _id: usize) {
        self.push(HistoryAction::Free, device, mem_ptr, mem_size);
    }
}

#[cfg(feature = "serde")]
pub use json::events_from_json;

// JSON: PyTorch's trace entries, through serde (the `serde` feature, on by default).
#[cfg(feature = "serde")]
mod json {
    use std::borrow::Cow;

    use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

    use super::{HistoryAction, HistoryEvent, Site};
    use crate::memory::snapshot_json::{
        self as wire, read_error, ACTIVE_ALLOCATED, ACTIVE_AWAITING_FREE, ACTIVE_PENDING_FREE,
        NO_DEVICE,
    };

    fn to_wire(e: &HistoryEvent) -> wire::TraceEntry {
        wire::TraceEntry {
            action: e.action.name().to_owned(),
            addr: e.address,
            size: e.size,
            time_us: Some(e.time_ns / 1000),
            time_ns: Some(e.time_ns),
            device: Some(e.device),
            thread: Some(e.thread),
            frames: e
                .site
                .iter()
                .map(|s| wire::Frame {
                    filename: s.file.clone().into_owned(),
                    line: i64::from(s.line),
                    name: s.function.as_ref().map(|f| f.clone().into_owned()),
                })
                .collect(),
        }
    }

    /// The site of a trace entry's frames (innermost first): the innermost Python
    /// frame when there is one (PyTorch's stacks start in its C++ internals when they
    /// hold C++ frames), else the innermost.
    fn site_of(frames: Vec<wire::Frame>) -> Option<Site> {
        let i = frames
            .iter()
            .position(|f| f.filename.ends_with(".py"))
            .unwrap_or(0);
        frames.into_iter().nth(i).map(|f| Site {
            file: Cow::Owned(f.filename),
            line: u32::try_from(f.line).unwrap_or(0),
            function: f.name.map(Cow::Owned),
        })
    }

    /// The event of a trace entry (`None` for an action that is none of
    /// [`HistoryAction`]'s), on `device` unless the entry names its own; `order`
    /// times an entry without a time.
    fn from_wire(t: wire::TraceEntry, device: i32, order: u64) -> Option<HistoryEvent> {
        let action = HistoryAction::from_name(&t.action)?;
        Some(HistoryEvent {
            time_ns: t
                .time_ns
                .or_else(|| t.time_us.map(|us| us.saturating_mul(1000)))
                .unwrap_or(order),
            action,
            device: t.device.unwrap_or(device),
            address: t.addr,
            size: t.size,
            // Only a malloc carries its site (as a recording does).
            site: if action == HistoryAction::Malloc {
                site_of(t.frames)
            } else {
                None
            },
            thread: t.thread.unwrap_or(0),
        })
    }

    /// A trace entry (see [`HistoryHook::to_json`](super::HistoryHook::to_json)).
    impl Serialize for HistoryEvent {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            to_wire(self).serialize(s)
        }
    }

    /// From a trace entry, cuda-rt's or PyTorch's; an error for an action that is
    /// none of [`HistoryAction`]'s (`free_requested`, `oom`...: [`events_from_json`]
    /// skips those).
    impl<'de> Deserialize<'de> for HistoryEvent {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<HistoryEvent, D::Error> {
            let t = wire::TraceEntry::deserialize(d)?;
            let name = t.action.clone();
            from_wire(t, 0, 0).ok_or_else(|| {
                de::Error::custom(format!(
                    "trace action {name:?} is no history event (segment_alloc, alloc, \
                     free_completed, segment_free)"
                ))
            })
        }
    }

    /// The history in JSON text, for [`render_html`](super::render_html) and for code
    /// of your own: any of
    /// - a history, [`HistoryHook::to_json`](super::HistoryHook::to_json)'s list of
    ///   trace entries;
    /// - a snapshot, cuda-rt's ([`PoolSnapshot::to_json`](crate::memory::arena::PoolSnapshot::to_json))
    ///   or PyTorch's (`torch.cuda.memory._snapshot()` written with `json.dump`; a
    ///   pickle from `_dump_snapshot` converts with
    ///   `python -c "import json, pickle, sys; json.dump(pickle.load(open(sys.argv[1], 'rb')), sys.stdout)" snapshot.pickle`):
    ///   its `device_traces` (the entries of `device_traces[i]` on device `i`), or,
    ///   when they are empty (recording was off), the state it shows, as events at
    ///   time 0: each segment taken, then each block in use (with its frames' site).
    ///
    /// PyTorch's entries map to [`HistoryAction::from_name`]; the others
    /// (`free_requested`, `oom`, `snapshot`, `annotate`) are skipped. A malloc's
    /// site is its innermost Python frame (else its innermost). Times are
    /// `time_ns`, else `time_us`, else the entry's position; the events are sorted
    /// by time (stable), devices together. An error, saying where, for text that is
    /// none of these.
    pub fn events_from_json(json: &str) -> crate::Result<Vec<HistoryEvent>> {
        let mut events = match json.trim_start().as_bytes().first() {
            Some(b'[') => {
                let trace: Vec<wire::TraceEntry> = serde_json::from_str(json)
                    .map_err(|e| read_error("a history (a list of trace entries)", e))?;
                from_trace(trace, 0)
            }
            Some(b'{') => {
                let snap: wire::Snapshot =
                    serde_json::from_str(json).map_err(|e| read_error("a memory snapshot", e))?;
                from_snapshot(snap)
            }
            _ => {
                return Err(read_error(
                    "a history or a memory snapshot",
                    "the text is neither a JSON list nor a JSON object",
                ))
            }
        };
        events.sort_by_key(|e| e.time_ns);
        Ok(events)
    }

    fn from_trace(trace: Vec<wire::TraceEntry>, device: i32) -> Vec<HistoryEvent> {
        trace
            .into_iter()
            .zip(0u64..)
            .filter_map(|(t, i)| from_wire(t, device, i))
            .collect()
    }

    fn from_snapshot(snap: wire::Snapshot) -> Vec<HistoryEvent> {
        if snap.device_traces.iter().any(|t| !t.is_empty()) {
            let mut events = Vec::new();
            for (device, trace) in snap.device_traces.into_iter().enumerate() {
                events.extend(from_trace(trace, i32::try_from(device).unwrap_or(i32::MAX)));
            }
            return events;
        }
        // No trace: the state, as if it had just been allocated.
        let mut events = Vec::new();
        let ev = |action, device: i32, address, size, site| HistoryEvent {
            time_ns: 0,
            action,
            device: if device == NO_DEVICE { 0 } else { device },
            address,
            size,
            site,
            thread: 0,
        };
        for seg in snap.segments {
            events.push(ev(
                HistoryAction::SegmentAlloc,
                seg.device,
                seg.address,
                seg.total_size,
                None,
            ));
            let mut next = seg.address;
            for b in seg.blocks {
                let address = b.address.unwrap_or(next);
                next = address.saturating_add(b.size);
                match b.state.as_str() {
                    ACTIVE_ALLOCATED | ACTIVE_AWAITING_FREE | ACTIVE_PENDING_FREE => {
                        events.push(ev(
                            HistoryAction::Malloc,
                            seg.device,
                            address,
                            b.size,
                            site_of(b.frames),
                        ));
                    }
                    _ => {}
                }
            }
        }
        events
    }
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// One point of the timeline: after event `i`, `reserved` and `in_use` bytes.
struct Point {
    time_ns: u64,
    reserved: u64,
    in_use: u64,
}

const WIDTH: f64 = 1000.0;
const HEIGHT: f64 = 360.0;
const MARGIN: f64 = 60.0;
/// The largest live blocks at the peak that the page lists.
const LABELLED: usize = 10;

/// Height of one segment's band in the by-segment panel, at most; each band's
/// height is its share of the reserved bytes, at least [`BAND_MIN`].
const BANDS_HEIGHT: f64 = 420.0;
const BAND_MIN: f64 = 14.0;
/// Blocks labelled in the by-segment panel (the largest at the peak).
const BAND_LABELS: usize = 6;

/// A block's life in the by-segment panel: where it sat and when.
struct Life {
    address: u64,
    size: u64,
    from: u64,
    to: Option<u64>,
}

/// The by-segment panel: one band per segment (address running down the band, time
/// to the right), each block a rectangle over the time it was in use, the largest
/// blocks live at the peak labelled with their size. Blocks whose segment the history
/// never saw (a ring that lost its start) get a band of their own span.
fn segments_svg(
    events: &[&HistoryEvent],
    peak_live: &[&HistoryEvent],
    t0: u64,
    t_end: u64,
) -> String {
    let mut segments: Vec<(u64, u64)> = events
        .iter()
        .filter(|e| e.action == HistoryAction::SegmentAlloc)
        .map(|e| (e.address, e.size))
        .collect();
    let mut open: BTreeMap<u64, Life> = BTreeMap::new();
    let mut lives = Vec::new();
    for e in events.iter().copied() {
        match e.action {
            HistoryAction::Malloc => {
                open.insert(
                    e.address,
                    Life {
                        address: e.address,
                        size: e.size,
                        from: e.time_ns,
                        to: None,
                    },
                );
            }
            HistoryAction::Free => {
                if let Some(mut l) = open.remove(&e.address) {
                    l.to = Some(e.time_ns);
                    lives.push(l);
                }
            }
            HistoryAction::SegmentAlloc | HistoryAction::SegmentFree => {}
        }
    }
    lives.extend(open.into_values());
    // A segment given back and taken again at the same place is one band.
    segments.sort_unstable();
    segments.dedup();
    // Blocks in no recorded segment (a ring that lost its start) share one band
    // spanning their addresses. Addresses and sizes come from a file that may be
    // damaged: every sum saturates.
    let inside = |a: u64| {
        segments
            .iter()
            .any(|&(b, n)| a >= b && a < b.saturating_add(n))
    };
    let orphans = lives.iter().filter(|l| !inside(l.address));
    let lo = orphans.clone().map(|l| l.address).min();
    let hi = orphans.map(|l| l.address.saturating_add(l.size)).max();
    if let (Some(lo), Some(hi)) = (lo, hi) {
        segments.push((lo, hi - lo));
    }
    let total: u64 = segments
        .iter()
        .fold(0u64, |t, s| t.saturating_add(s.1))
        .max(1);
    let x = |t: u64| {
        MARGIN + t.saturating_sub(t0) as f64 / (t_end - t0) as f64 * (WIDTH - 2.0 * MARGIN)
    };
    let labelled: Vec<u64> = {
        let mut v: Vec<&HistoryEvent> = peak_live.to_vec();
        v.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
        v.iter().take(BAND_LABELS).map(|e| e.address).collect()
    };
    let mut body = String::new();
    let mut top = 10.0;
    let palette = [
        "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1",
    ];
    for (i, &(base, size)) in segments.iter().enumerate() {
        let h = (size as f64 / total as f64 * BANDS_HEIGHT).max(BAND_MIN);
        let _ = write!(
            body,
            "<g class=\"segment\"><rect x=\"{MARGIN}\" y=\"{top:.1}\" width=\"{w:.1}\" \
             height=\"{h:.1}\" fill=\"#f4f4f4\" stroke=\"#999\"/>\
             <text x=\"{tx:.1}\" y=\"{ty:.1}\" font-size=\"10\" fill=\"#555\">{name}</text>",
            w = WIDTH - 2.0 * MARGIN,
            tx = WIDTH - MARGIN + 4.0,
            ty = top + 10.0,
            name = format_args!("seg {i}: {}", human_bytes(size)),
        );
        for (k, l) in lives
            .iter()
            .filter(|l| l.address >= base && l.address < base.saturating_add(size))
            .enumerate()
        {
            let (x0, x1) = (x(l.from), x(l.to.unwrap_or(t_end)));
            let y0 = top + (l.address - base) as f64 / size as f64 * h;
            let room = base.saturating_add(size) - l.address;
            let bh = (l.size.min(room) as f64 / size as f64 * h).max(1.0);
            let _ = write!(
                body,
                "<rect class=\"block\" x=\"{x0:.1}\" y=\"{y0:.1}\" width=\"{bw:.1}\" \
                 height=\"{bh:.1}\" fill=\"{c}\" fill-opacity=\"0.8\"/>",
                bw = (x1 - x0).max(1.0),
                c = palette[k % palette.len()],
            );
            if labelled.contains(&l.address) && !matches!(l.to, Some(t) if t <= l.from) && bh >= 9.0
            {
                let _ = write!(
                    body,
                    "<text x=\"{lx:.1}\" y=\"{ly:.1}\" font-size=\"10\" fill=\"#000\">{}</text>",
                    human_bytes(l.size),
                    lx = x0 + 3.0,
                    ly = y0 + bh.min(12.0) - 2.0,
                );
            }
        }
        body.push_str("</g>");
        top += h + 4.0;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{ww}\" height=\"{hh:.0}\" \
         viewBox=\"0 0 {ww} {hh:.0}\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>{body}</svg>",
        // Room on the right for the segments' names.
        ww = WIDTH + 60.0,
        hh = top + 10.0,
    )
}

/// A self-contained HTML page (inline SVG, no script) picturing `events`: reserved
/// memory (segments taken from the driver; the hooks see no release, so the curve
/// shows what was taken) and memory in use over time as two step curves, the peak of use marked, and a table of the largest blocks live at that
/// peak with the lines that allocated them; then the same history by segment (each
/// segment a band, each block a rectangle over its lifetime, the largest labelled).
/// Open it in a browser. Events out of time order are pictured in time order; a
/// history read from JSON ([`events_from_json`], with the `serde` feature) is pictured
/// alike, PyTorch's included.
pub fn render_html(events: &[HistoryEvent], title: &str) -> String {
    let mut events: Vec<&HistoryEvent> = events.iter().collect();
    events.sort_by_key(|e| e.time_ns);
    let events = &events[..];
    let mut points = Vec::with_capacity(events.len() + 1);
    let (mut reserved, mut in_use) = (0u64, 0u64);
    let mut live: BTreeMap<u64, &HistoryEvent> = BTreeMap::new();
    let (mut peak, mut peak_live) = (0u64, Vec::new());
    let t0 = events.first().map_or(0, |e| e.time_ns);
    points.push(Point {
        time_ns: t0,
        reserved: 0,
        in_use: 0,
    });
    for &e in events {
        match e.action {
            HistoryAction::SegmentAlloc => reserved = reserved.saturating_add(e.size),
            HistoryAction::SegmentFree => reserved = reserved.saturating_sub(e.size),
            HistoryAction::Malloc => {
                in_use = in_use.saturating_add(e.size);
                live.insert(e.address, e);
            }
            HistoryAction::Free => {
                in_use = in_use.saturating_sub(e.size);
                live.remove(&e.address);
            }
        }
        // A history that starts mid-run (the ring dropped its start) has blocks whose
        // segment it never saw: reserved is at least what is in use.
        reserved = reserved.max(in_use);
        if in_use > peak {
            peak = in_use;
            peak_live = live.values().copied().collect();
        }
        points.push(Point {
            time_ns: e.time_ns,
            reserved,
            in_use,
        });
    }
    let t_end = points
        .last()
        .map_or(t0, |p| p.time_ns)
        .max(t0.saturating_add(1));
    let y_max = points.iter().map(|p| p.reserved).max().unwrap_or(0).max(1);
    let x = |t: u64| {
        MARGIN + t.saturating_sub(t0) as f64 / (t_end - t0) as f64 * (WIDTH - 2.0 * MARGIN)
    };
    let y = |b: u64| HEIGHT - MARGIN + -(b as f64 / y_max as f64) * (HEIGHT - 2.0 * MARGIN);
    let steps = |f: &dyn Fn(&Point) -> u64| {
        let mut d = String::new();
        let mut prev: Option<(f64, f64)> = None;
        for p in &points {
            let (px, py) = (x(p.time_ns), y(f(p)));
            match prev {
                None => {
                    let _ = write!(d, "M{px:.1},{py:.1}");
                }
                Some((_, qy)) => {
                    let _ = write!(d, " L{px:.1},{qy:.1} L{px:.1},{py:.1}");
                }
            }
            prev = Some((px, py));
        }
        d
    };
    let reserved_path = steps(&|p| p.reserved);
    let in_use_path = steps(&|p| p.in_use);
    let peak_x = points
        .iter()
        .find(|p| p.in_use == peak)
        .map_or(MARGIN, |p| x(p.time_ns));

    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\
         <rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\
         <line x1=\"{MARGIN}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#444\"/>\
         <line x1=\"{MARGIN}\" y1=\"{MARGIN}\" x2=\"{MARGIN}\" y2=\"{b}\" stroke=\"#444\"/>\
         <text x=\"{MARGIN}\" y=\"{ty}\">{top}</text>\
         <text x=\"{MARGIN}\" y=\"{lb}\">0</text>\
         <text x=\"{r}\" y=\"{lb}\" text-anchor=\"end\">{dur}</text>\
         <path d=\"{reserved_path}\" fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"2\"/>\
         <path d=\"{in_use_path}\" fill=\"none\" stroke=\"#d62728\" stroke-width=\"2\"/>\
         <line x1=\"{peak_x:.1}\" y1=\"{MARGIN}\" x2=\"{peak_x:.1}\" y2=\"{b}\" \
         stroke=\"#d62728\" stroke-dasharray=\"4 3\"/>\
         <text x=\"{peak_x:.1}\" y=\"{pk}\" fill=\"#d62728\" text-anchor=\"{anchor}\">\
         peak in use {peak_h}</text>\
         <text x=\"{lx}\" y=\"20\" fill=\"#1f77b4\">reserved</text>\
         <text x=\"{lx2}\" y=\"20\" fill=\"#d62728\">in use</text></svg>",
        b = HEIGHT - MARGIN,
        r = WIDTH - MARGIN,
        ty = MARGIN - 6.0,
        top = human_bytes(y_max),
        lb = HEIGHT - MARGIN + 18.0,
        dur = format_args!("{:.3} ms", (t_end - t0) as f64 / 1e6),
        pk = MARGIN - 20.0,
        peak_h = human_bytes(peak),
        // A peak near the right edge has its label to the left of the line.
        anchor = if peak_x > WIDTH - 220.0 {
            "end"
        } else {
            "start"
        },
        lx = WIDTH - 200.0,
        lx2 = WIDTH - 120.0,
    );
    peak_live.sort_by(|a, b| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    let mut rows = String::new();
    for e in peak_live.iter().take(LABELLED) {
        let site = e
            .site
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), Site::to_string);
        let _ = write!(
            rows,
            "<tr><td>{}</td><td>{:#x}</td><td>{}</td><td>{}</td></tr>",
            human_bytes(e.size),
            e.address,
            e.device,
            html_escape(&site)
        );
    }
    format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{t}</title>\
         <style>body{{font-family:sans-serif;margin:24px}}td,th{{padding:2px 10px;\
         text-align:left}}</style></head><body><h1>{t}</h1>\
         <p>{n} events; peak in use {peak_h}; reserved at most {top}.</p>{svg}\
         <h2>By segment</h2><p>Each band a segment (addresses downwards), each block a \
         rectangle over the time it was in use; the largest at the peak labelled.</p>\
         {segments}<h2>Largest blocks live at the peak</h2><table><tr><th>size</th><th>address</th>\
         <th>device</th><th>allocated at</th></tr>{rows}</table></body></html>",
        t = html_escape(title),
        segments = segments_svg(events, &peak_live, t0, t_end),
        n = events.len(),
        peak_h = human_bytes(peak),
        top = human_bytes(y_max),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A history as a workload would leave it: segments, mallocs with sites, frees.
    fn sample() -> Vec<HistoryEvent> {
        let site = Location::caller();
        let mut v = Vec::new();
        let mut t = 0;
        let mut ev = |action, address, size| {
            t += 1000;
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
        ev(HistoryAction::SegmentAlloc, 0x1000_0000, 64 << 20);
        for i in 0..8u64 {
            ev(
                HistoryAction::Malloc,
                0x1000_0000 + i * (4 << 20),
                (i + 1) << 20,
            );
        }
        for i in 0..4u64 {
            ev(
                HistoryAction::Free,
                0x1000_0000 + i * (4 << 20),
                (i + 1) << 20,
            );
        }
        ev(HistoryAction::SegmentAlloc, 0x2000_0000, 32 << 20);
        ev(HistoryAction::Malloc, 0x2000_0000, 30 << 20);
        v
    }

    #[test]
    fn a_page_of_sizes_past_the_address_space_draws_without_overflow() {
        let ev = |time_ns, action, address, size| HistoryEvent {
            time_ns,
            action,
            device: 0,
            address,
            size,
            site: None,
            thread: 1,
        };
        let top = u64::MAX - 600;
        let events = [
            ev(1, HistoryAction::SegmentAlloc, top, 4096),
            ev(2, HistoryAction::Malloc, top + 8, 4096),
            ev(3, HistoryAction::SegmentAlloc, 0, u64::MAX),
            ev(4, HistoryAction::SegmentAlloc, 512, u64::MAX),
            ev(5, HistoryAction::Malloc, u64::MAX - 100, 4096),
        ];
        let page = render_html(&events, "damaged");
        assert!(page.contains("<svg"), "still a page");
    }

    #[test]
    fn the_ring_keeps_the_newest_events() {
        let h = HistoryHook::new(3);
        for i in 0..5u64 {
            h.malloc_post(0, 512, 512, 0x1000 * i, 0);
        }
        let e = h.events();
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].address, 0x2000);
        assert_eq!(h.dropped(), 2);
        h.free_post(0, 512, 0x4000, 0);
        assert_eq!(h.events().last().unwrap().action, HistoryAction::Free);
        #[cfg(feature = "serde")]
        {
            let j = h.to_json();
            assert!(
                j.starts_with("[{\"action\": \"alloc\"") && j.contains("free_completed"),
                "{j}"
            );
        }
    }

    #[test]
    fn clones_registered_on_several_threads_share_one_ring() {
        let h = HistoryHook::new(100);
        let threads: Vec<_> = (0..3u64)
            .map(|i| {
                let mine = h.clone();
                std::thread::spawn(move || {
                    mine.malloc_post(0, 512, 512, 0x1000 * (i + 1), 0);
                    mine.free_post(0, 512, 0x1000 * (i + 1), 0);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let e = h.events();
        assert_eq!(e.len(), 6);
        let mut ids: Vec<u64> = e.iter().map(|e| e.thread).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), 3, "three threads: {e:?}");
        #[cfg(feature = "serde")]
        assert!(h.to_json().contains("\"thread\": "));
    }

    #[test]
    fn the_page_pictures_the_history() {
        let html = render_html(&sample(), "a <test> workload");
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert!(html.contains("<svg") && html.contains("</svg>"));
        assert!(html.contains("a &lt;test&gt; workload"));
        // Peak in use: 1+...+8 MiB = 36 MiB before the frees; then 5+6+7+8 + 30 = 56 MiB.
        assert!(html.contains("peak in use 56.00 MiB"), "{html}");
        assert!(
            html.contains("30.00 MiB") && html.contains("history.rs"),
            "{html}"
        );
        assert!(render_html(&[], "empty").contains("0 events"));
        // Two segments, nine block lifetimes in them, the largest labelled.
        assert_eq!(html.matches("class=\"segment\"").count(), 2, "{html}");
        assert_eq!(html.matches("class=\"block\"").count(), 9, "{html}");
        assert!(html.contains("seg 0: 64.00 MiB") && html.contains("seg 1: 32.00 MiB"));
    }

    #[test]
    fn events_out_of_time_order_and_segment_frees_are_pictured() {
        let mut events = sample();
        events.reverse();
        let html = render_html(&events, "reversed");
        assert!(html.contains("peak in use 56.00 MiB"), "{html}");
        let t = events[0].time_ns + 1000;
        let free = |address, size| HistoryEvent {
            time_ns: t,
            action: HistoryAction::SegmentFree,
            device: 0,
            address,
            size,
            site: None,
            thread: 1,
        };
        events.push(free(0x2000_0000, 32 << 20));
        assert!(render_html(&events, "freed").contains("reserved at most 96.00 MiB"));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn names_with_control_characters_and_quotes_round_trip_through_json() {
        let weird = "dir \"quoted\"\\back\\slash\n\u{1}\t\u{7f}é€😀.rs";
        let mut events = sample();
        // The 8 MiB block, live at the peak: the page's table names its site.
        events[8].site = Some(Site {
            file: Cow::Borrowed(weird),
            line: 4242,
            function: Some(Cow::Borrowed("f<\"T\">\r\n")),
        });
        events[2].device = 3;
        events[2].time_ns = 123_456_789;
        let h = HistoryHook::new(100);
        h.inner
            .events
            .lock()
            .unwrap()
            .extend(events.iter().cloned());
        let j = h.to_json();
        // Valid JSON, with the control characters escaped.
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        assert_eq!(v[8]["frames"][0]["filename"], weird);
        assert!(
            j.contains("\\u0001") && j.contains("\\n") && !j.contains('\u{1}'),
            "{j}"
        );
        // And back, exactly (the nanoseconds too).
        let mut sorted = events.clone();
        sorted.sort_by_key(|e| e.time_ns);
        assert_eq!(events_from_json(&j).unwrap(), sorted);
        // serde's own entry points agree.
        let compact = serde_json::to_string(&events).unwrap();
        assert_eq!(
            serde_json::from_str::<Vec<HistoryEvent>>(&compact).unwrap(),
            events
        );
        assert!(render_html(&events_from_json(&j).unwrap(), "weird").contains("4242"));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn a_pool_snapshot_without_a_trace_is_read_as_its_state() {
        let j = r#"{"segments": [{"device": 0, "address": 1048576, "total_size": 4096,
            "stream": 0, "blocks": [
              {"address": 1048576, "size": 1024, "state": "active_allocated"},
              {"address": 1049600, "size": 1024, "state": "inactive"},
              {"address": 1050624, "size": 2048, "state": "active_awaiting_free"}]}],
            "device_traces": [[]]}"#;
        let e = events_from_json(j).unwrap();
        let got: Vec<_> = e.iter().map(|e| (e.action, e.address, e.size)).collect();
        assert_eq!(
            got,
            [
                (HistoryAction::SegmentAlloc, 1048576, 4096),
                (HistoryAction::Malloc, 1048576, 1024),
                (HistoryAction::Malloc, 1050624, 2048),
            ]
        );
        assert!(render_html(&e, "state").contains("peak in use 3.00 KiB"));
    }

    #[cfg(feature = "serde")]
    #[test]
    fn unreadable_json_says_what_was_expected_and_where() {
        let e = events_from_json("  42").unwrap_err().to_string();
        assert!(e.contains("neither a JSON list nor a JSON object"), "{e}");
        let e = events_from_json("[{\"action\": 1}]")
            .unwrap_err()
            .to_string();
        assert!(e.contains("not a history") && e.contains("line 1"), "{e}");
        let e = serde_json::from_str::<HistoryEvent>(r#"{"action": "oom"}"#).unwrap_err();
        assert!(e.to_string().contains("\"oom\""), "{e}");
    }
}
