//! Deterministic driver for profiling the arena under callgrind:
//! `cargo build --release -p cuda-rt --example arena_profile` then
//! `valgrind --tool=callgrind target/release/examples/arena_profile [b|pair|pinned]`.
//! Runs trace B (the RMM random-allocation trace of `benches/arena_traces.rs`) once,
//! or a million cached 1 MiB pairs.

use std::hint::black_box;

use cuda_rt::memory::arena::{Block, FakeBackend, Pool};

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn log_uniform(&mut self, lo: f64, hi: f64) -> usize {
        (lo.ln() + self.unit() * (hi.ln() - lo.ln())).exp() as usize
    }
}

enum Op {
    Alloc(usize),
    Free(usize),
}

fn trace_b(n: usize, seed: u64) -> Vec<Op> {
    let mut rng = Rng(seed);
    let mut live: Vec<u64> = Vec::new();
    let mut bytes = 0u64;
    let cap = 16u64 << 30;
    let mut ops = Vec::with_capacity(n);
    let round = |s: usize| (s as u64).div_ceil(512) * 512;
    while ops.len() < n {
        let s = rng.log_uniform(1024.0, 64.0 * 1048576.0);
        let alloc = rng.unit() < 0.73 && bytes + round(s) <= cap;
        if alloc {
            bytes += round(s);
            live.push(round(s));
            ops.push(Op::Alloc(s));
        } else if !live.is_empty() {
            let i = rng.below(live.len());
            bytes -= live.swap_remove(i);
            ops.push(Op::Free(i));
        }
    }
    ops
}

fn main() {
    let what = std::env::args().nth(1).unwrap_or_else(|| "b".into());
    match what.as_str() {
        "pair" => {
            let pool = Pool::new(FakeBackend::new());
            for _ in 0..1_000_000 {
                let b = pool.malloc(black_box(1 << 20), 1).unwrap();
                black_box(b.addr());
                pool.free(b).unwrap();
            }
        }
        _ => {
            let ops = trace_b(200_000, 42);
            let pool = Pool::new(FakeBackend::new());
            let mut live: Vec<Block> = Vec::with_capacity(4096);
            let mut h = 0u64;
            for op in &ops {
                match *op {
                    Op::Alloc(s) => {
                        let b = pool.malloc(s, 7).unwrap();
                        h = (h ^ b.addr()).wrapping_mul(0x100_0000_01b3);
                        live.push(b);
                    }
                    Op::Free(i) => pool.free(live.swap_remove(i)).unwrap(),
                }
            }
            for b in live.drain(..) {
                pool.free(b).unwrap();
            }
            println!("addresses hash {h:#x}");
            println!("{:?}", pool.stats());
        }
    }
}
