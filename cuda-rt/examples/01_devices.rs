//! Devices: how many GPUs there are, what each one is (name, compute capability,
//! memory, attributes), which one is current on this thread, scoped and unscoped
//! selection, and synchronization (the spec's "Device Management").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 01_devices`. Without a GPU it prints why
//! and exits 0.

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::error::human_bytes;
use cuda_rt::{Device, DeviceAttribute, Error};

fn main() {
    if let Err(reason) = cuda_rt::availability() {
        println!("skipped: no GPU: {reason}");
        return;
    }
    if let Err(e) = run() {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_rt::Result<()> {
    let count = cuda_rt::device_count()?;
    println!(
        "CUDA available: {}, {count} device(s)",
        cuda_rt::is_available()
    );
    for id in 0..count {
        let dev = Device::new(id)?;
        let (major, minor) = dev.compute_capability()?;
        let (free, total) = dev.mem_info()?;
        let (least, greatest) = dev.stream_priority_range()?;
        println!(
            "device {id}: {} (sm_{}), {} SMs, {} of {} free, PCI {}",
            dev.name()?,
            dev.compute_capability_string()?,
            dev.multiprocessor_count()?,
            human_bytes(free as u64),
            human_bytes(total as u64),
            dev.pci_bus_id()?,
        );
        println!(
            "  warp {}, up to {} threads per block, {} of shared memory per block, \
             managed memory: {}, stream priorities {least} (least) to {greatest}",
            dev.attribute(DeviceAttribute::WarpSize)?,
            dev.attribute(DeviceAttribute::MaxThreadsPerBlock)?,
            human_bytes(dev.attribute(DeviceAttribute::MaxSharedMemoryPerBlock)? as u64),
            dev.attribute(DeviceAttribute::ManagedMemory)? == 1,
        );
        assert!(major >= 3 && (0..10).contains(&minor), "sm_{major}{minor}");
        assert!(free <= total && total <= dev.total_memory()? + (1 << 30));
        // Attributes by name too, as the driver's constant or in CamelCase.
        assert_eq!(
            dev.attribute_by_name("CU_DEVICE_ATTRIBUTE_WARP_SIZE")?,
            dev.attribute_by_name("WarpSize")?
        );
        // The PCI bus id names the same device back.
        assert_eq!(Device::from_pci_bus_id(&dev.pci_bus_id()?)?, dev);
        for peer in 0..count {
            if peer != id && dev.can_access_peer(&Device::new(peer)?)? {
                println!("  can access device {peer}'s memory directly");
            }
        }
    }

    // The current device is per thread: 0 until something selects another.
    assert_eq!(cuda_rt::get_device_id(), 0);
    let last = Device::new(count - 1)?;
    {
        // `enter` selects a device for a scope (CuPy's `with Device(i):`) ...
        let scope = last.enter()?;
        assert_eq!(cuda_rt::get_device_id(), last.id());
        // ... where memory is allocated and work is queued.
        let data = DeviceBuffer::from_slice(&[1u32, 2, 3])?;
        assert_eq!(data.device_id(), last.id());
        assert_eq!(data.to_vec()?, [1, 2, 3]);
        cuda_rt::synchronize()?; // waits for all work of the current device
        println!(
            "in a scope of device {}, the previous device was {}",
            last.id(),
            scope.previous()
        );
    } // ... and the previous device is current again.
    assert_eq!(cuda_rt::get_device_id(), 0);

    // `use_device` (CuPy's `Device.use()`) and `set_device_id` select without a scope.
    last.use_device()?;
    assert_eq!(Device::current()?, last);
    last.synchronize()?;
    cuda_rt::set_device_id(0)?;

    // Each thread starts on device 0, whatever this one selected.
    last.use_device()?;
    let other = std::thread::spawn(cuda_rt::get_device_id)
        .join()
        .expect("thread");
    assert_eq!(other, 0);
    cuda_rt::set_device_id(0)?;

    // A device that does not exist is an error that gives the valid range.
    match Device::new(count) {
        Err(e @ Error::InvalidDevice { .. }) => println!("Device::new({count}): {e}"),
        other => panic!("Device::new({count}) should be InvalidDevice, got {other:?}"),
    }
    println!("ok");
    Ok(())
}
