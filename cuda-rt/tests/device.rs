//! Devices: attributes, the per-thread current device and its scope, lookups.

use std::collections::HashSet;

use cuda_rt::device::{device_count, get_device_id, DeviceAttribute};
use cuda_rt::{gpu_test, Device, Error};

// ---- no GPU needed ----

#[test]
fn device_attribute_names_round_trip() {
    let mut names = HashSet::new();
    for &a in DeviceAttribute::ALL {
        assert!(names.insert(a.name()), "duplicate name {}", a.name());
        assert_eq!(DeviceAttribute::from_name(a.name()), Some(a));
        assert_eq!(DeviceAttribute::from_name(a.cuda_name()), Some(a));
        assert_eq!(DeviceAttribute::from_raw(a.raw().0), Some(a));
        assert_eq!(a.name().parse::<DeviceAttribute>().ok(), Some(a));
        assert!(a.cuda_name().starts_with("CU_DEVICE_ATTRIBUTE_"));
    }
}

#[test]
fn device_attribute_table_is_complete() {
    // Every CU_DEVICE_ATTRIBUTE_* value of the 13.0 headers (1..=147), without the
    // MAX sentinel (148).
    assert_eq!(DeviceAttribute::ALL.len(), 147);
    assert_eq!(DeviceAttribute::ALL[0], DeviceAttribute::MaxThreadsPerBlock);
    assert_eq!(DeviceAttribute::MaxThreadsPerBlock.raw().0, 1);
    assert_eq!(DeviceAttribute::WarpSize.raw().0, 10);
    assert_eq!(DeviceAttribute::ComputeCapabilityMajor.raw().0, 75);
    assert_eq!(
        DeviceAttribute::from_raw(148),
        None,
        "the MAX sentinel is no attribute"
    );
}

#[test]
fn device_attribute_from_name_accepts_suffix_and_any_case() {
    let w = Some(DeviceAttribute::WarpSize);
    assert_eq!(DeviceAttribute::from_name("WarpSize"), w);
    assert_eq!(DeviceAttribute::from_name("WARP_SIZE"), w);
    assert_eq!(DeviceAttribute::from_name("warp_size"), w);
    assert_eq!(
        DeviceAttribute::from_name("cu_device_attribute_warp_size"),
        w
    );
    assert_eq!(DeviceAttribute::WarpSize.to_string(), "WarpSize");
}

#[test]
fn device_attribute_deprecated_aliases_resolve() {
    assert_eq!(
        DeviceAttribute::from_name("CU_DEVICE_ATTRIBUTE_SHARED_MEMORY_PER_BLOCK"),
        Some(DeviceAttribute::MaxSharedMemoryPerBlock)
    );
    assert_eq!(
        DeviceAttribute::from_name("VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED"),
        Some(DeviceAttribute::VirtualMemoryManagementSupported)
    );
}

#[test]
fn device_attribute_unknown_name_is_none_and_parse_error_names_it() {
    assert_eq!(DeviceAttribute::from_name("NoSuchAttribute"), None);
    let e = "NoSuchAttribute".parse::<DeviceAttribute>().unwrap_err();
    assert!(e.to_string().contains("\"NoSuchAttribute\""), "{e}");
}

#[test]
fn device_new_with_negative_id_is_an_error() {
    assert!(Device::new(-1).is_err());
}

#[test]
fn current_device_starts_at_zero_on_a_new_thread() {
    std::thread::spawn(|| assert_eq!(get_device_id(), 0))
        .join()
        .unwrap();
}

#[test]
fn is_available_agrees_with_availability() {
    assert_eq!(cuda_rt::is_available(), cuda_rt::availability().is_ok());
}

// ---- GPU ----

gpu_test!(device_new_out_of_range_names_the_valid_range, {
    let n = device_count().unwrap();
    match Device::new(n) {
        Err(Error::InvalidDevice { id, count }) => {
            assert_eq!((id, count), (n, n));
        }
        other => panic!("expected InvalidDevice, got {other:?}"),
    }
    let msg = Device::new(n).unwrap_err().to_string();
    assert!(msg.contains(&format!("valid ids 0..{n}")), "{msg}");
});

gpu_test!(device_is_available_with_a_gpu, {
    assert!(cuda_rt::is_available());
    assert!(device_count().unwrap() >= 1);
});

gpu_test!(device_attributes_have_known_values, {
    let d = Device::new(0).unwrap();
    assert_eq!(d.attribute(DeviceAttribute::WarpSize).unwrap(), 32);
    assert_eq!(d.attribute_by_name("WARP_SIZE").unwrap(), 32);
    assert_eq!(
        d.attribute_by_name("MaxThreadsPerBlock").unwrap(),
        d.attribute(DeviceAttribute::MaxThreadsPerBlock).unwrap()
    );
    assert!(d.attribute_by_name("nonsense").is_err());
    let all = d.attributes().unwrap();
    assert!(all.len() > 100, "only {} attributes answered", all.len());
    assert!(all.contains(&(DeviceAttribute::WarpSize, 32)));
    let sm = d.multiprocessor_count().unwrap();
    assert!(all.contains(&(DeviceAttribute::MultiprocessorCount, sm)));
});

gpu_test!(device_compute_capability_matches_attributes, {
    let d = Device::new(0).unwrap();
    let (major, minor) = d.compute_capability().unwrap();
    assert_eq!(
        major,
        d.attribute(DeviceAttribute::ComputeCapabilityMajor)
            .unwrap()
    );
    assert_eq!(
        minor,
        d.attribute(DeviceAttribute::ComputeCapabilityMinor)
            .unwrap()
    );
    assert!(major >= 5);
    assert_eq!(
        d.compute_capability_string().unwrap(),
        format!("{major}{minor}")
    );
});

gpu_test!(device_pci_bus_id_round_trips, {
    for id in 0..device_count().unwrap() {
        let d = Device::new(id).unwrap();
        let bus = d.pci_bus_id().unwrap();
        assert_eq!(bus.len(), 12, "{bus}");
        assert_eq!(Device::from_pci_bus_id(&bus).unwrap(), d);
        assert_eq!(
            Device::from_pci_bus_id(&bus.to_lowercase()).unwrap(),
            d,
            "lower case"
        );
    }
    assert!(Device::from_pci_bus_id("ffff:ff:1f.7").is_err());
});

gpu_test!(device_mem_info_is_consistent, {
    let d = Device::new(0).unwrap();
    let (free, total) = d.mem_info().unwrap();
    assert!(total > 0 && free <= total, "free {free}, total {total}");
    assert!(d.total_memory().unwrap() > 0);
});

gpu_test!(device_from_pointer_finds_the_owner, {
    use cuda_rt::cuda_sys::driver as sys;
    let d = Device::new(0).unwrap();
    d.use_device().unwrap();
    let api = sys::api().unwrap();
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: `p` is a valid out pointer; device 0's primary context is current.
    let rc = unsafe { api.cuMemAlloc_v2().unwrap()(&mut p, 4096) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(Device::from_pointer(p).unwrap(), d);
    assert_eq!(
        Device::from_pointer(p + 100).unwrap(),
        d,
        "interior pointer"
    );
    // SAFETY: `p` was allocated above and is freed once.
    let rc = unsafe { api.cuMemFree_v2().unwrap()(p) };
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS);
});

gpu_test!(device_from_pointer_of_host_memory_is_a_clear_error, {
    let x = [0u8; 16];
    let e = Device::from_pointer(x.as_ptr() as u64).unwrap_err();
    assert!(e.to_string().contains("is not memory CUDA knows"), "{e}");
});

gpu_test!(device_scope_of_current_device_restores_it, {
    let d = Device::new(0).unwrap();
    d.use_device().unwrap();
    {
        let scope = d.enter().unwrap();
        assert_eq!(scope.previous(), 0);
        assert_eq!(get_device_id(), 0);
        let inner = d.enter().unwrap();
        assert_eq!(get_device_id(), 0);
        drop(inner);
        assert_eq!(get_device_id(), 0);
    }
    assert_eq!(get_device_id(), 0);
    assert_eq!(
        Device::current().unwrap().primary_context().unwrap(),
        d.primary_context().unwrap()
    );
});

gpu_test!(device_scopes_nest_and_restore_the_device_of_entry, {
    if device_count().unwrap() < 2 {
        eprintln!("device_scopes_nest...: one device only; checked with device 0 alone");
    }
    let last = device_count().unwrap() - 1;
    let d0 = Device::new(0).unwrap();
    let dl = Device::new(last).unwrap();
    d0.use_device().unwrap();
    {
        let _a = dl.enter().unwrap();
        assert_eq!(get_device_id(), last);
        {
            let b = d0.enter().unwrap();
            assert_eq!(b.previous(), last);
            assert_eq!(get_device_id(), 0);
        }
        assert_eq!(get_device_id(), last);
    }
    assert_eq!(get_device_id(), 0);
});

gpu_test!(device_use_inside_a_scope_is_undone_when_the_scope_ends, {
    let last = device_count().unwrap() - 1;
    let d0 = Device::new(0).unwrap();
    let dl = Device::new(last).unwrap();
    d0.use_device().unwrap();
    {
        let _s = d0.enter().unwrap();
        dl.use_device().unwrap();
        assert_eq!(get_device_id(), last);
    }
    assert_eq!(get_device_id(), 0);
    // A stream made after the scope is on device 0 again.
    let s = cuda_rt::Stream::new().unwrap();
    assert_eq!(cuda_rt::AsStream::device_id(&s), 0);
});

gpu_test!(set_device_id_validates_and_sets, {
    cuda_rt::set_device_id(0).unwrap();
    assert_eq!(get_device_id(), 0);
    let n = device_count().unwrap();
    assert!(cuda_rt::set_device_id(n).is_err());
    assert_eq!(get_device_id(), 0, "a failed set changes nothing");
});

gpu_test!(device_synchronize_succeeds, {
    Device::new(0).unwrap().synchronize().unwrap();
    cuda_rt::synchronize().unwrap();
});

gpu_test!(device_stream_priority_range_is_ordered, {
    let (least, greatest) = Device::new(0).unwrap().stream_priority_range().unwrap();
    assert!(greatest <= least, "({least}, {greatest})");
});

gpu_test!(device_can_access_peer_answers_for_two_devices, {
    if device_count().unwrap() < 2 {
        eprintln!("device_can_access_peer...: one device only; nothing to ask");
        return;
    }
    let (a, b) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    // Whether it can depends on the topology; that the driver answers is the test.
    a.can_access_peer(&b).unwrap();
    b.can_access_peer(&a).unwrap();
});

#[test]
fn device_attribute_from_name_with_multibyte_text_is_none_not_a_panic() {
    assert_eq!(DeviceAttribute::from_name("CU_DEVICE_ATTRIBUTEé_X"), None);
    assert_eq!(DeviceAttribute::from_name("ééééééééééééééééééééé"), None);
}
