//! The allocation traces of the arena benches (and of `benches/arena_profile.rs`,
//! which includes this file by path): a seeded generator and traces A and B.
#![allow(dead_code)]

/// xorshift64*: tiny, seeded, good enough for traces.
pub struct Rng(u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn log_uniform(&mut self, lo: f64, hi: f64) -> usize {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp() as usize
    }
}

pub enum Op {
    Alloc(usize),
    /// Free the live block at this index (swap_remove).
    Free(usize),
}

/// Trace A: sizes log-uniform 256 B .. 64 MiB, at most 512 live blocks.
pub fn trace_a(n: usize, seed: u64) -> (Vec<Op>, u64) {
    let mut rng = Rng(seed);
    let mut live: Vec<usize> = Vec::new();
    let (mut bytes, mut peak) = (0u64, 0u64);
    let mut ops = Vec::with_capacity(n);
    for _ in 0..n {
        let alloc = live.is_empty() || (live.len() < 512 && rng.next() & 1 == 0);
        if alloc {
            let s = rng.log_uniform(256.0, 64.0 * 1048576.0);
            bytes += round(s);
            peak = peak.max(bytes);
            live.push(s);
            ops.push(Op::Alloc(s));
        } else {
            let i = rng.below(live.len());
            bytes -= round(live.swap_remove(i));
            ops.push(Op::Free(i));
        }
    }
    (ops, peak)
}

/// Trace B (RMM random allocations): sizes log-uniform 1 KiB .. 64 MiB; allocate
/// with probability 0.73 while live bytes stay under 16 GiB, else free a random block.
pub fn trace_b(n: usize, seed: u64) -> (Vec<Op>, u64) {
    let mut rng = Rng(seed);
    let mut live: Vec<usize> = Vec::new();
    let (mut bytes, mut peak) = (0u64, 0u64);
    let cap = 16u64 << 30;
    let mut ops = Vec::with_capacity(n);
    while ops.len() < n {
        let s = rng.log_uniform(1024.0, 64.0 * 1048576.0);
        let alloc = rng.unit() < 0.73 && bytes + round(s) <= cap;
        if alloc {
            bytes += round(s);
            peak = peak.max(bytes);
            live.push(s);
            ops.push(Op::Alloc(s));
        } else if !live.is_empty() {
            let i = rng.below(live.len());
            bytes -= round(live.swap_remove(i));
            ops.push(Op::Free(i));
        }
    }
    (ops, peak)
}

pub fn round(s: usize) -> u64 {
    (s as u64).div_ceil(512) * 512
}

/// Trace S (serving): 1 GiB of weights allocated first and kept, then inference steps
/// whose batch size drifts by one (a random walk N, N+1, N-1, ... within 16..=96).
/// Each step runs 8 layers; a layer allocates its output activation (batch x 2 MiB),
/// an intermediate (batch x 8 MiB) and a small temporary (batch x 16 KiB plus up to
/// 64 KiB), then frees the intermediate, the temporary and the previous layer's
/// output; the last output is freed at the end of the step. Peak live is the weights
/// plus the largest batch's two activations and one intermediate.
pub fn trace_serving(n: usize, seed: u64) -> (Vec<Op>, u64) {
    const MIB: usize = 1 << 20;
    let mut rng = Rng(seed);
    // Simulated live list (ids, as the bench's Vec of blocks), to emit indices.
    let mut live: Vec<(u64, usize)> = Vec::new();
    let mut next_id = 0u64;
    let (mut bytes, mut peak) = (0u64, 0u64);
    let mut ops = Vec::with_capacity(n + 64);
    let mut alloc = |ops: &mut Vec<Op>, live: &mut Vec<(u64, usize)>, s: usize| {
        next_id += 1;
        live.push((next_id, s));
        ops.push(Op::Alloc(s));
        next_id
    };
    let free = |ops: &mut Vec<Op>, live: &mut Vec<(u64, usize)>, id: u64| {
        if let Some(i) = live.iter().position(|&(x, _)| x == id) {
            live.swap_remove(i);
            ops.push(Op::Free(i));
        }
    };
    for _ in 0..16 {
        alloc(&mut ops, &mut live, 64 * MIB);
    }
    let mut batch = 32usize;
    while ops.len() < n {
        batch = match rng.below(3) {
            0 => (batch + 1).min(96),
            1 => batch.saturating_sub(1).max(16),
            _ => batch,
        };
        let mut prev: Option<u64> = None;
        for _ in 0..8 {
            let out = alloc(&mut ops, &mut live, batch * 2 * MIB);
            let mid = alloc(&mut ops, &mut live, batch * 8 * MIB);
            let tmp = alloc(
                &mut ops,
                &mut live,
                batch * 16 * 1024 + rng.below(64 * 1024) + 1,
            );
            let now: u64 = live.iter().map(|&(_, s)| round(s)).sum();
            bytes = now;
            peak = peak.max(bytes);
            free(&mut ops, &mut live, mid);
            free(&mut ops, &mut live, tmp);
            if let Some(p) = prev {
                free(&mut ops, &mut live, p);
            }
            prev = Some(out);
        }
        if let Some(p) = prev {
            free(&mut ops, &mut live, p);
        }
    }
    let _ = bytes;
    (ops, peak)
}
