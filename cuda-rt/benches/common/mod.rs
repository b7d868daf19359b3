//! What the bench binaries share: timing helpers and the one reporter, [`Report`].
//!
//! # What a bench prints
//! One JSON object per figure, on its own line, as soon as the figure is measured (a
//! run cut short keeps what it measured), then a blank line and a table of all the
//! figures. A script keeps the lines that start with `{`:
//!
//! ```text
//! {"name": "pool_malloc_free_pair", "size": 1048576, "value": 31.20, "unit": "ns", "raw": 1140, "raw_name": "cuMemAllocAsync_pair", "ratio": 0.02736}
//! ```
//!
//! `size` is there when the figure has one; `raw` and `raw_name` are the raw driver
//! call (or the peer) measured in the same run, and `ratio` is our cost over its cost:
//! value / raw for times, raw / value for rates (units ending in `/s`), so below 1 is
//! faster than raw. Then, where a figure has them, `target`, `note` and the bench's own
//! fields (`threads`, `speedup`, `nodes`, `device`...). Numbers carry at least four
//! significant digits; one that is not finite is `null`.
//!
//! Without a GPU a bench prints one line, `{"skipped": "<bench> bench", "reason":
//! "no GPU: ..."}`, and exits 0 (see [`gpu_or_skip`]).
#![allow(dead_code)]

use std::fmt::Write as _;

/// The median of `xs` (the upper one for an even count); `NaN` for none.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// The median wall time in seconds of `reps` runs of `f`, after one warm-up run.
pub fn median_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    median(
        (0..reps)
            .map(|_| {
                let t = std::time::Instant::now();
                f();
                t.elapsed().as_secs_f64()
            })
            .collect(),
    )
}

/// Panics, naming `what`, unless the driver answered success.
pub fn check_rc(rc: cuda_rt::cuda_sys::driver::CUresult, what: &str) {
    assert_eq!(
        rc,
        cuda_rt::cuda_sys::driver::CUresult::CUDA_SUCCESS,
        "{what}"
    );
}

/// `ours` and `raw` (each returning one measurement) interleaved: a warm-up pair, then
/// `reps` pairs, alternating which goes first so neither always pays for work the
/// other left behind; the two medians.
pub fn interleaved(
    reps: usize,
    mut ours: impl FnMut() -> f64,
    mut raw: impl FnMut() -> f64,
) -> (f64, f64) {
    ours();
    raw();
    let (mut o, mut r) = (Vec::with_capacity(reps), Vec::with_capacity(reps));
    for i in 0..reps {
        if i % 2 == 0 {
            r.push(raw());
            o.push(ours());
        } else {
            o.push(ours());
            r.push(raw());
        }
    }
    (median(o), median(r))
}

/// `true` when a GPU is usable; otherwise prints the skip line of the bench `bench`
/// (`"pool"` -> `{"skipped": "pool bench", "reason": "no GPU: ..."}`) and returns
/// `false`: the bench then returns from `main`, exiting 0.
pub fn gpu_or_skip(bench: &str) -> bool {
    match cuda_rt::availability() {
        Ok(_) => true,
        Err(reason) => {
            skip(bench, &format!("no GPU: {reason}"));
            false
        }
    }
}

/// Prints the line saying that the bench `bench` did not run, and why.
pub fn skip(bench: &str, reason: &str) {
    println!(
        "{{\"skipped\": {}, \"reason\": {}}}",
        json_str(&format!("{bench} bench")),
        json_str(reason)
    );
}

/// A value of a JSON field beyond the common ones.
#[derive(Debug, Clone)]
pub enum Json {
    Int(i64),
    Num(f64),
    Str(String),
    Bool(bool),
}

impl Json {
    /// The number, if it is one.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Json::Int(i) => Some(*i as f64),
            Json::Num(x) => Some(*x),
            _ => None,
        }
    }

    fn json(&self) -> String {
        match self {
            Json::Int(i) => i.to_string(),
            Json::Num(x) => num(*x),
            Json::Str(s) => json_str(s),
            Json::Bool(b) => b.to_string(),
        }
    }

    fn text(&self) -> String {
        match self {
            Json::Str(s) => s.clone(),
            other => other.json(),
        }
    }
}

impl From<usize> for Json {
    fn from(v: usize) -> Json {
        Json::Int(v as i64)
    }
}

impl From<u64> for Json {
    fn from(v: u64) -> Json {
        Json::Int(v as i64)
    }
}

impl From<f64> for Json {
    fn from(v: f64) -> Json {
        Json::Num(v)
    }
}

impl From<bool> for Json {
    fn from(v: bool) -> Json {
        Json::Bool(v)
    }
}

impl From<&str> for Json {
    fn from(v: &str) -> Json {
        Json::Str(v.to_owned())
    }
}

impl From<String> for Json {
    fn from(v: String) -> Json {
        Json::Str(v)
    }
}

/// One measured figure: `value` in `unit` for cuda-rt, and usually the raw call (or a
/// peer) measured in the same run. Built with [`Figure::new`] and the setters.
#[derive(Debug, Clone)]
pub struct Figure {
    pub name: String,
    /// Bytes per operation, or what the bench counts (a trace's operations).
    pub size: Option<u64>,
    /// cuda-rt's figure ("ours").
    pub value: f64,
    pub unit: &'static str,
    /// The raw call's (or peer's) figure in the same unit, and what it is.
    pub raw: Option<(f64, String)>,
    /// What the figure should reach, in words (`"ratio <= 1.05"`).
    pub target: Option<String>,
    /// Anything else a reader needs (printed in the table and the JSON).
    pub note: String,
    /// The bench's own fields, in the JSON and in the table's notes.
    pub fields: Vec<(&'static str, Json)>,
}

impl Figure {
    pub fn new(name: impl Into<String>, value: f64, unit: &'static str) -> Figure {
        Figure {
            name: name.into(),
            size: None,
            value,
            unit,
            raw: None,
            target: None,
            note: String::new(),
            fields: Vec::new(),
        }
    }

    pub fn size(mut self, size: impl TryInto<u64>) -> Figure {
        self.size = size.try_into().ok();
        self
    }

    /// The raw call (or peer) `name` measured `value` in the figure's unit.
    pub fn raw(mut self, value: f64, name: impl Into<String>) -> Figure {
        self.raw = Some((value, name.into()));
        self
    }

    pub fn target(mut self, target: impl Into<String>) -> Figure {
        self.target = Some(target.into());
        self
    }

    pub fn note(mut self, note: impl Into<String>) -> Figure {
        self.note = note.into();
        self
    }

    pub fn field(mut self, key: &'static str, value: impl Into<Json>) -> Figure {
        self.fields.push((key, value.into()));
        self
    }

    /// The bench's own field `key`.
    pub fn get(&self, key: &str) -> Option<&Json> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// Whether the unit is a rate (bigger is better): one ending in `/s`.
    pub fn is_rate(&self) -> bool {
        self.unit.ends_with("/s")
    }

    /// Our cost over the raw one: value / raw for times, raw / value for rates.
    pub fn ratio(&self) -> Option<f64> {
        let (raw, _) = self.raw.as_ref()?;
        Some(if self.is_rate() {
            raw / self.value
        } else {
            self.value / raw
        })
    }

    fn json(&self, context: &[(&'static str, Json)]) -> String {
        let mut s = format!("{{\"name\": {}", json_str(&self.name));
        if let Some(size) = self.size {
            let _ = write!(s, ", \"size\": {size}");
        }
        let _ = write!(
            s,
            ", \"value\": {}, \"unit\": {}",
            num(self.value),
            json_str(self.unit)
        );
        if let (Some((raw, raw_name)), Some(ratio)) = (&self.raw, self.ratio()) {
            let _ = write!(
                s,
                ", \"raw\": {}, \"raw_name\": {}, \"ratio\": {}",
                num(*raw),
                json_str(raw_name),
                num(ratio)
            );
        }
        if let Some(t) = &self.target {
            let _ = write!(s, ", \"target\": {}", json_str(t));
        }
        if !self.note.is_empty() {
            let _ = write!(s, ", \"note\": {}", json_str(&self.note));
        }
        for (k, v) in self.fields.iter().chain(context) {
            let _ = write!(s, ", {}: {}", json_str(k), v.json());
        }
        s.push('}');
        s
    }

    /// The table's last column: the bench's fields, the target, the note.
    fn notes(&self) -> String {
        let mut parts: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| format!("{k} {}", v.text()))
            .collect();
        if let Some(t) = &self.target {
            parts.push(format!("target {t}"));
        }
        if !self.note.is_empty() {
            parts.push(self.note.clone());
        }
        parts.join("; ")
    }
}

/// A bench's figures: each printed as a JSON line when pushed, all of them as a table
/// by [`Report::finish`].
pub struct Report {
    title: String,
    context: Vec<(&'static str, Json)>,
    infos: Vec<(&'static str, Json)>,
    figures: Vec<Figure>,
}

impl Report {
    /// A report whose table is headed by `title` (what is measured, and how).
    pub fn new(title: impl Into<String>) -> Report {
        Report {
            title: title.into(),
            context: Vec::new(),
            infos: Vec::new(),
            figures: Vec::new(),
        }
    }

    /// Adds `key: value` to every figure's JSON line (the device, say).
    pub fn context(&mut self, key: &'static str, value: impl Into<Json>) {
        self.context.push((key, value.into()));
    }

    /// A fact about the run that is no figure: printed now as `{"key": value}`, and
    /// again above the table.
    pub fn info(&mut self, key: &'static str, value: impl Into<Json>) {
        let value = value.into();
        println!("{{{}: {}}}", json_str(key), value.json());
        self.infos.push((key, value));
    }

    /// Prints `figure`'s JSON line and keeps it for the table.
    pub fn push(&mut self, figure: Figure) {
        println!("{}", figure.json(&self.context));
        self.figures.push(figure);
    }

    pub fn figures(&self) -> &[Figure] {
        &self.figures
    }

    /// The figure named `name` (the first, if several share it).
    pub fn figure(&self, name: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.name == name)
    }

    /// Prints a blank line, the title, the facts and the table of every figure.
    pub fn finish(&self) {
        println!();
        println!("{}", self.title);
        if self.figures.iter().any(|f| f.raw.is_some()) {
            println!(
                "ratio: our cost over raw (value / raw for times, raw / value for rates); \
                 below 1 is faster"
            );
        }
        for (k, v) in &self.infos {
            println!("{k}: {}", v.text());
        }
        let rows: Vec<[String; 7]> = self
            .figures
            .iter()
            .map(|f| {
                let (raw, raw_name) = match &f.raw {
                    Some((r, n)) => (format!("{} {}", num(*r), f.unit), n.clone()),
                    None => (String::new(), String::new()),
                };
                [
                    f.name.clone(),
                    f.size.map(|s| s.to_string()).unwrap_or_default(),
                    format!("{} {}", num(f.value), f.unit),
                    raw,
                    f.ratio().map(num).unwrap_or_default(),
                    raw_name,
                    f.notes(),
                ]
            })
            .collect();
        let head = [
            "figure", "size", "cuda-rt", "raw", "ratio", "raw call", "notes",
        ];
        let mut width = head.map(str::len);
        for r in &rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: [&str; 7]| {
            // Names and words to the left, numbers to the right; no trailing blanks.
            let mut s = String::new();
            for (i, (c, w)) in cells.iter().zip(width).enumerate() {
                match i {
                    0 | 5 => {
                        let _ = write!(s, "{c:<w$}  ");
                    }
                    6 => s.push_str(c),
                    _ => {
                        let _ = write!(s, "{c:>w$}  ");
                    }
                }
            }
            println!("{}", s.trim_end());
        };
        line(head);
        for r in &rows {
            line(r.each_ref().map(String::as_str));
        }
    }
}

/// `x` with at least four significant digits and no exponent; `null` if not finite.
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        return "null".into();
    }
    if x == 0.0 {
        return "0".into();
    }
    let decimals = (3 - x.abs().log10().floor() as i32).clamp(0, 9) as usize;
    format!("{x:.decimals$}")
}

/// `s` as a JSON string literal.
pub fn json_str(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
