//! Timing helpers shared by the bench binaries.
#![allow(dead_code)]

/// The median of `xs` (the upper one for an even count); `NaN` for none.
pub fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
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
