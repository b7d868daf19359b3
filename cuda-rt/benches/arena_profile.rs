//! Deterministic driver for profiling the arena under callgrind:
//! `cargo bench -p cuda-rt-safe --bench arena_profile --no-run` names the binary; run it
//! under `valgrind --tool=callgrind BINARY [b|pair|pinned]`.
//! Runs trace B (the RMM random-allocation trace of `benches/arena_traces.rs`) once,
//! or a million cached 1 MiB pairs.

use std::hint::black_box;

use cuda_rt::memory::arena::{Block, FakeBackend, Pool};

#[path = "common/traces.rs"]
mod traces;
use traces::{trace_b, Op};

fn main() {
    // `cargo bench` passes `--bench`: only the other arguments are ours.
    let what = std::env::args()
        .skip(1)
        .find(|a| a != "--bench")
        .unwrap_or_else(|| "b".into());
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
            let (ops, _) = trace_b(200_000, 42);
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
