//! Allocation history: a bounded ring of the pool's events with timestamps and call
//! sites ([`HistoryHook`], a [memory hook](super::hook)), and a picture of it
//! ([`render_html`]): a self-contained HTML page with an SVG timeline of reserved and
//! in-use memory and the largest blocks live at the peak, labelled with their sites.
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
}

impl HistoryAction {
    /// Its name in [`HistoryHook::to_json`] (PyTorch's trace names): `segment_alloc`,
    /// `alloc`, `free_completed`.
    pub fn name(self) -> &'static str {
        match self {
            HistoryAction::SegmentAlloc => "segment_alloc",
            HistoryAction::Malloc => "alloc",
            HistoryAction::Free => "free_completed",
        }
    }

    /// The action named `name` in a trace ([`name`](Self::name)'s inverse); PyTorch's
    /// `segment_map` (an expandable segment growing) counts as `segment_alloc`. `None`
    /// for the trace actions that change nothing pictured here (`free_requested`,
    /// `segment_free`, `snapshot`, `oom`...).
    pub fn from_name(name: &str) -> Option<HistoryAction> {
        match name {
            "segment_alloc" | "segment_map" => Some(HistoryAction::SegmentAlloc),
            "alloc" => Some(HistoryAction::Malloc),
            "free_completed" => Some(HistoryAction::Free),
            _ => None,
        }
    }
}

/// One event of the history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    pub site: Option<&'static Location<'static>>,
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
        self.ring().iter().copied().collect()
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
            site: if action == HistoryAction::Malloc {
                call_site()
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

    /// The events as JSON, close to the `device_traces` of PyTorch's snapshot:
    /// `[{"action", "addr", "size", "time_us", "device", "frames": [{"filename", "line"}]}]`.
    pub fn to_json(&self) -> String {
        let mut out = String::from("[");
        for (i, e) in self.ring().iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let _ = write!(
                out,
                "{{\"action\": \"{}\", \"addr\": {}, \"size\": {}, \"time_us\": {}, \
                 \"device\": {}, \"thread\": {}, \"frames\": [",
                e.action.name(),
                e.address,
                e.size,
                e.time_ns / 1000,
                e.device,
                e.thread
            );
            if let Some(s) = e.site {
                let _ = write!(
                    out,
                    "{{\"filename\": \"{}\", \"line\": {}}}",
                    json_escape(s.file()),
                    s.line()
                );
            }
            out.push_str("]}");
        }
        out.push(']');
        out
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

fn json_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
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
    events: &[HistoryEvent],
    peak_live: &[HistoryEvent],
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
    for e in events {
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
            HistoryAction::SegmentAlloc => {}
        }
    }
    lives.extend(open.into_values());
    segments.sort_unstable();
    // Blocks in no recorded segment (a ring that lost its start) share one band
    // spanning their addresses.
    let inside = |a: u64| segments.iter().any(|&(b, n)| a >= b && a < b + n);
    let orphans = lives.iter().filter(|l| !inside(l.address));
    let lo = orphans.clone().map(|l| l.address).min();
    let hi = orphans.map(|l| l.address + l.size).max();
    if let (Some(lo), Some(hi)) = (lo, hi) {
        segments.push((lo, hi - lo));
    }
    let total: u64 = segments.iter().map(|s| s.1).sum::<u64>().max(1);
    let x = |t: u64| MARGIN + (t - t0) as f64 / (t_end - t0) as f64 * (WIDTH - 2.0 * MARGIN);
    let labelled: Vec<u64> = {
        let mut v: Vec<&HistoryEvent> = peak_live.iter().collect();
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
            .filter(|l| l.address >= base && l.address < base + size)
            .enumerate()
        {
            let (x0, x1) = (x(l.from), x(l.to.unwrap_or(t_end)));
            let y0 = top + (l.address - base) as f64 / size as f64 * h;
            let bh = (l.size.min(base + size - l.address) as f64 / size as f64 * h).max(1.0);
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
/// Open it in a browser.
pub fn render_html(events: &[HistoryEvent], title: &str) -> String {
    render(events, &|_| None, title)
}

/// [`render_html`] for events read back from a file (what `cuda-rt snapshot view`
/// does with [`HistoryHook::to_json`]'s output or a PyTorch snapshot): their call sites
/// are text, not `Location`s of this process, so they come beside the events:
/// `sites[i]` is event `i`'s (`file:line`). An event's own `site` wins.
pub fn render_html_with_sites(
    events: &[HistoryEvent],
    sites: &[Option<String>],
    title: &str,
) -> String {
    render(events, &|i| sites.get(i).cloned().flatten(), title)
}

/// The page of [`render_html`], with `site_text(i)` naming event `i`'s call site when
/// the event carries none.
fn render(
    events: &[HistoryEvent],
    site_text: &dyn Fn(usize) -> Option<String>,
    title: &str,
) -> String {
    let mut points = Vec::with_capacity(events.len() + 1);
    let (mut reserved, mut in_use) = (0u64, 0u64);
    // Live blocks by address: the event that allocated each, and its index.
    let mut live: BTreeMap<u64, (usize, HistoryEvent)> = BTreeMap::new();
    let (mut peak, mut peak_live) = (0u64, Vec::<(usize, HistoryEvent)>::new());
    let t0 = events.first().map_or(0, |e| e.time_ns);
    points.push(Point {
        time_ns: t0,
        reserved: 0,
        in_use: 0,
    });
    for (i, e) in events.iter().enumerate() {
        match e.action {
            HistoryAction::SegmentAlloc => reserved += e.size,
            HistoryAction::Malloc => {
                in_use += e.size;
                live.insert(e.address, (i, *e));
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
    let t_end = points.last().map_or(t0, |p| p.time_ns).max(t0 + 1);
    let y_max = points.iter().map(|p| p.reserved).max().unwrap_or(0).max(1);
    let x = |t: u64| MARGIN + (t - t0) as f64 / (t_end - t0) as f64 * (WIDTH - 2.0 * MARGIN);
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
    peak_live.sort_by(|(_, a), (_, b)| b.size.cmp(&a.size).then(a.address.cmp(&b.address)));
    let mut rows = String::new();
    for (i, e) in peak_live.iter().take(LABELLED) {
        let site = match e.site {
            Some(s) => format!("{}:{}", s.file(), s.line()),
            None => site_text(*i).unwrap_or_else(|| "unknown".to_owned()),
        };
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
        segments = segments_svg(
            events,
            &peak_live.iter().map(|(_, e)| *e).collect::<Vec<_>>(),
            t0,
            t_end
        ),
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
                site: (action == HistoryAction::Malloc).then_some(site),
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
        let j = h.to_json();
        assert!(
            j.starts_with("[{\"action\": \"alloc\"") && j.contains("free_completed"),
            "{j}"
        );
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
    fn sites_read_back_from_a_file_label_the_largest_blocks() {
        let mut events = sample();
        for e in &mut events {
            e.site = None;
        }
        let sites: Vec<Option<String>> = (0..events.len())
            .map(|i| Some(format!("train.py:{i}")))
            .collect();
        let html = render_html_with_sites(&events, &sites, "from a file");
        // The 30 MiB block is event 14, the largest live at the peak.
        assert!(
            html.contains("<td>30.00 MiB</td><td>0x20000000</td><td>0</td><td>train.py:14</td>"),
            "{html}"
        );
        // Without sites the blocks are unknown, as with render_html.
        let plain = render_html_with_sites(&events, &[], "from a file");
        assert!(
            plain.contains("<td>unknown</td>") && !plain.contains("train.py"),
            "{plain}"
        );
    }

    #[test]
    fn action_names_read_back() {
        for a in [
            HistoryAction::SegmentAlloc,
            HistoryAction::Malloc,
            HistoryAction::Free,
        ] {
            assert_eq!(HistoryAction::from_name(a.name()), Some(a));
        }
        assert_eq!(
            HistoryAction::from_name("segment_map"),
            Some(HistoryAction::SegmentAlloc)
        );
        assert_eq!(HistoryAction::from_name("free_requested"), None);
    }
}
