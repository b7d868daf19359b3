//! A tour of the environment: driver, runtime and every device.
//!
//! Run it with `cargo run -p cuda-rt-safe --example tour`. On a machine without CUDA it says
//! so, and why, and exits 0; with CUDA, a driver or device it cannot describe makes it
//! exit 1.

use cuda_rt::{env, error::human_bytes, Device};

fn main() {
    println!("cuda-rt tour");
    let count = match cuda_rt::availability() {
        Ok(n) => n,
        Err(reason) => {
            println!("skipped: CUDA is not available on this machine: {reason}");
            return;
        }
    };
    let mut failed = false;
    match env::driver_version() {
        Ok(v) => println!(
            "driver: CUDA {v} ({})",
            env::driver_library_path().unwrap_or_default()
        ),
        Err(e) => {
            println!("driver: {e}");
            failed = true;
        }
    }
    match env::get_local_runtime_version() {
        Ok(v) => println!(
            "runtime: CUDA {v} ({})",
            env::runtime_library_path().unwrap_or_default()
        ),
        Err(e) => println!("runtime: not loaded: {e}"),
    }
    println!("devices: {count}");
    for id in 0..count {
        if let Err(e) = describe(id) {
            println!("  device {id}: {e}");
            failed = true;
        }
    }
    if failed {
        std::process::exit(1);
    }
}

fn describe(id: i32) -> cuda_rt::Result<()> {
    let dev = Device::new(id)?;
    let (major, minor) = dev.compute_capability()?;
    let (free, total) = dev.mem_info()?;
    println!(
        "  device {id}: {}, compute capability {major}.{minor}, {} SMs, {} total, {} free, PCI {}",
        dev.name()?,
        dev.multiprocessor_count()?,
        human_bytes(total as u64),
        human_bytes(free as u64),
        dev.pci_bus_id()?
    );
    Ok(())
}
