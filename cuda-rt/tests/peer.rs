//! Peer access and copies between devices. Tests on one GPU run everywhere a GPU is;
//! tests that need two GPUs skip with a printed reason where there are fewer, and fail
//! instead under `CUDA_RT_REQUIRE_MULTI_GPU=1`.

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::testing::gpus_or_skip;
use cuda_rt::{gpu_test, peer, AsStream, Device, Error, Stream};

fn pattern(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761).wrapping_add(seed))
        .collect()
}

gpu_test!(a_device_can_access_itself, {
    assert!(peer::can_access_peer(0, 0).unwrap());
});

gpu_test!(peer_access_to_the_device_itself_is_a_no_op, {
    let d = Device::new(0).unwrap();
    d.enable_peer_access(&d).unwrap();
    d.enable_peer_access(&d).unwrap();
    d.disable_peer_access(&d).unwrap();
    peer::enable_peer_access(0).unwrap();
    peer::disable_peer_access(0).unwrap();
});

gpu_test!(can_access_peer_of_a_missing_device_is_invalid_device, {
    let n = cuda_rt::device_count().unwrap();
    let e = peer::can_access_peer(0, n).unwrap_err();
    assert!(
        matches!(e, Error::InvalidDevice { id, .. } if id == n),
        "{e}"
    );
    let e = peer::enable_peer_access(-1).unwrap_err();
    assert!(matches!(e, Error::InvalidDevice { id: -1, .. }), "{e}");
});

#[test]
fn enabling_peer_access_twice_is_not_an_error() {
    if !gpus_or_skip("enabling_peer_access_twice_is_not_an_error", 2) {
        return;
    }
    let (d0, d1) = (Device::new(0).unwrap(), Device::new(1).unwrap());
    if !peer::can_access_peer(0, 1).unwrap() {
        let e = d0.enable_peer_access(&d1).unwrap_err();
        assert!(matches!(e, Error::NotSupported { .. }), "{e}");
        eprintln!("devices 0 and 1 cannot access each other: only the refusal was checked");
        return;
    }
    d0.enable_peer_access(&d1).unwrap();
    d0.enable_peer_access(&d1).unwrap();
    d0.disable_peer_access(&d1).unwrap();
    // Not enabled any more: disabling again is fine too.
    d0.disable_peer_access(&d1).unwrap();
    d0.enable_peer_access(&d1).unwrap();
}

#[test]
fn memory_pointer_peer_copies_sync_and_on_a_stream() {
    if !gpus_or_skip("memory_pointer_peer_copies_sync_and_on_a_stream", 2) {
        return;
    }
    let n = 1 << 20;
    let bytes = n * 4;
    let data = pattern(n, 7);
    let src = {
        let _g = Device::new(0).unwrap().enter().unwrap();
        let p = cuda_rt::alloc(bytes).unwrap();
        p.copy_from_host(&data).unwrap();
        p
    };
    for enabled in [false, true] {
        if enabled {
            if !peer::can_access_peer(1, 0).unwrap() {
                break;
            }
            Device::new(1)
                .unwrap()
                .enable_peer_access(&Device::new(0).unwrap())
                .unwrap();
        }
        let _g = Device::new(1).unwrap().enter().unwrap();
        let dst = cuda_rt::alloc(bytes).unwrap();
        assert_eq!(dst.device_id(), 1);
        dst.copy_from_device(&src, bytes).unwrap();
        let mut back = vec![0u32; n];
        dst.copy_to_host(&mut back).unwrap();
        assert_eq!(back, data, "sync peer copy (peer access {enabled})");

        let dst2 = cuda_rt::alloc(bytes).unwrap();
        let s = Stream::new().unwrap();
        dst2.copy_from_device_async(&src, bytes, Some(&s)).unwrap();
        s.synchronize().unwrap();
        let mut back = vec![0u32; n];
        dst2.copy_to_host(&mut back).unwrap();
        assert_eq!(back, data, "async peer copy (peer access {enabled})");

        // And back the other way, from device 1 to device 0, with a sub-range.
        let half = bytes / 2;
        let _g0 = Device::new(0).unwrap().enter().unwrap();
        let back0 = cuda_rt::alloc(half).unwrap();
        back0
            .copy_from_device(&dst2.checked_add(half).unwrap(), half)
            .unwrap();
        let mut h = vec![0u32; n / 2];
        back0.copy_to_host(&mut h).unwrap();
        assert_eq!(h, data[n / 2..]);
    }
}

#[test]
fn typed_buffer_peer_copies_sync_and_on_a_stream() {
    if !gpus_or_skip("typed_buffer_peer_copies_sync_and_on_a_stream", 2) {
        return;
    }
    let data: Vec<f64> = (0..100_003).map(|i| i as f64 * 0.25).collect();
    let a = {
        let _g = Device::new(0).unwrap().enter().unwrap();
        DeviceBuffer::from_slice(&data).unwrap()
    };
    let _g = Device::new(1).unwrap().enter().unwrap();
    let mut b = DeviceBuffer::<f64>::zeros(data.len()).unwrap();
    assert_eq!((a.device_id(), b.device_id()), (0, 1));
    b.copy_from(&a).unwrap();
    assert_eq!(b.to_vec().unwrap(), data);

    let mut c = DeviceBuffer::<f64>::zeros(data.len()).unwrap();
    let s = Stream::new().unwrap();
    c.copy_from_async(&a, &s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(c.to_vec().unwrap(), data);

    // A view of a peer's buffer into a view of this one.
    let mut d = DeviceBuffer::<f64>::zeros(10).unwrap();
    d.as_mut_slice()
        .copy_from(&a.slice(50..60).unwrap())
        .unwrap();
    assert_eq!(d.to_vec().unwrap(), data[50..60]);
}

#[test]
fn each_thread_keeps_its_own_current_device_and_pool() {
    let name = "each_thread_keeps_its_own_current_device_and_pool";
    if !gpus_or_skip(name, 2) {
        return;
    }
    let n = cuda_rt::device_count().unwrap();
    let handles: Vec<_> = (0..n)
        .map(|id| {
            std::thread::spawn(move || {
                Device::new(id).unwrap().use_device().unwrap();
                for _ in 0..50 {
                    assert_eq!(cuda_rt::get_device_id(), id);
                    let p = cuda_rt::alloc(4096).unwrap();
                    assert_eq!(p.device_id(), id);
                    assert_eq!(Device::from_pointer(p.ptr()).unwrap().id(), id);
                    let b = DeviceBuffer::from_slice(&pattern(1024, id as u32)).unwrap();
                    assert_eq!(b.to_vec().unwrap(), pattern(1024, id as u32));
                    assert_eq!(cuda_rt::get_current_stream().device_id(), id);
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    // The main thread's device did not move.
    assert_eq!(cuda_rt::get_device_id(), 0);
}
