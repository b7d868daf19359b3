//! A data-parallel step on every GPU of the host (or one rank per process under
//! `torchrun`-style launchers: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`):
//! each GPU computes its local "gradient" (here: filled with `rank + 1`, on the GPU),
//! the gradients are all-reduced (averaged) with NCCL, and every rank checks the
//! result against the host's value. Runs on one GPU as on N.
//!
//! `cargo run -p cuda-rt-safe --example data_parallel`

use cuda_rt::nccl::{self, group, Communicator, ReduceOp};
use cuda_rt::{DeviceBuffer, Stream};

const LEN: usize = 1 << 22;

fn main() -> cuda_rt::Result<()> {
    if let Err(why) = cuda_rt::availability() {
        println!("no GPU here ({why}); nothing to do");
        return Ok(());
    }
    let comms = if std::env::var_os("RANK").is_some() {
        vec![nccl::bootstrap::init_from_env()?]
    } else {
        let n = cuda_rt::device_count()?;
        Communicator::init_all(&(0..n).collect::<Vec<_>>())?
    };
    let world = comms[0].size();
    let mut grads = Vec::new();
    let mut streams = Vec::new();
    for c in &comms {
        let _on = cuda_rt::Device::new(c.device_id())?.enter()?;
        let s = Stream::new()?;
        let mut g = DeviceBuffer::<f32>::zeros(LEN)?;
        g.fill_async(c.rank() as f32 + 1.0, &s)?; // the local computation
        grads.push(g);
        streams.push(s);
    }
    group(|| {
        for ((c, g), s) in comms.iter().zip(grads.iter_mut()).zip(&streams) {
            c.all_reduce_in_place(g.as_mut_slice(), ReduceOp::Avg, s)?;
        }
        Ok(())
    })?;
    let want = (1..=world).map(|r| r as f32).sum::<f32>() / world as f32;
    for ((c, g), s) in comms.iter().zip(&grads).zip(&streams) {
        s.synchronize()?;
        let _on = cuda_rt::Device::new(c.device_id())?.enter()?;
        let got = g.to_vec()?;
        let bad = got.iter().filter(|&&x| (x - want).abs() > 1e-5).count();
        println!(
            "rank {} of {world} on GPU {}: mean gradient {} (expected {want}), {bad} wrong",
            c.rank(),
            c.device_id(),
            got[0]
        );
        if bad != 0 {
            std::process::exit(1);
        }
    }
    Ok(())
}
