//! Pinned memory, pointers, views, async copies and registration (GPU tests skip
//! without a GPU; `CUDA_RT_REQUIRE_GPU=1` makes them fail instead).

mod common;

use common::{pattern, DevBuf, Gate};
use cuda_rt::pinned::{
    self, alloc_pinned_memory, register, PinnedFlags, PinnedMemory, PinnedMemoryPointer,
};
use cuda_rt::{gpu_test, AsStream, Stream};

gpu_test!(alloc_pinned_memory_is_writable_and_readable, {
    let mut p = alloc_pinned_memory(1000).unwrap();
    assert!(p.len() >= 1000);
    assert_ne!(p.ptr(), 0);
    let data = pattern(p.len(), 1);
    p.as_mut_slice().unwrap().copy_from_slice(&data);
    assert_eq!(p.as_slice().unwrap(), &data[..]);
});

gpu_test!(pinned_memory_new_has_the_exact_size_and_portable_flag, {
    let m = PinnedMemory::new(12345).unwrap();
    assert_eq!(m.size(), 12345);
    assert_eq!(m.flags(), PinnedFlags::PORTABLE);
    assert!(m.device_ptr().is_err(), "not mapped");
    let p = PinnedMemoryPointer::from(m);
    assert_eq!(p.len(), 12345);
});

gpu_test!(size_zero_gives_an_empty_pointer, {
    let p = alloc_pinned_memory(0).unwrap();
    assert_eq!((p.ptr(), p.len()), (0, 0));
    assert!(p.as_slice().unwrap().is_empty());
});

gpu_test!(offset_and_slice_stay_inside_the_range, {
    let p = PinnedMemoryPointer::from(PinnedMemory::new(4096).unwrap());
    let q = p.offset(100).unwrap();
    assert_eq!(q.ptr(), p.ptr() + 100);
    assert_eq!(q.len(), 3996);
    assert_eq!(q.offset_in_mem(), 100);
    assert_eq!(q.mem_size(), 4096);
    let r = q.slice(10, 20).unwrap();
    assert_eq!((r.ptr(), r.len()), (p.ptr() + 110, 20));
    assert!(q.offset(3997).is_err());
    assert!(q.slice(3990, 7).is_err());
    assert!(q.slice(usize::MAX, 2).is_err());
    assert!(p.offset(4096).unwrap().is_empty());
});

gpu_test!(offset_keeps_the_memory_alive_after_the_base_is_dropped, {
    let mut p = PinnedMemoryPointer::from(PinnedMemory::new(8192).unwrap());
    p.as_mut_slice().unwrap().fill(7);
    let q = p.offset(4096).unwrap();
    drop(p);
    assert!(q.as_slice().unwrap().iter().all(|&b| b == 7));
});

gpu_test!(mutable_view_needs_the_only_handle, {
    let mut p = PinnedMemoryPointer::from(PinnedMemory::new(64).unwrap());
    let q = p.clone();
    assert!(p.as_mut_slice().is_err());
    drop(q);
    assert!(p.as_mut_slice().is_ok());
});

gpu_test!(typed_views_check_alignment_and_length, {
    let mut p = PinnedMemoryPointer::from(PinnedMemory::new(64).unwrap());
    p.as_mut_slice_of::<f64>().unwrap().fill(1.5);
    assert_eq!(p.as_slice_of::<f64>().unwrap(), &[1.5; 8]);
    assert_eq!(p.as_slice_of::<u32>().unwrap().len(), 16);
    let odd = p.offset(1).unwrap();
    assert!(odd.as_slice_of::<u32>().is_err());
    assert!(p.slice(0, 6).unwrap().as_slice_of::<u32>().is_err());
});

gpu_test!(async_round_trip_through_the_device_is_byte_exact, {
    let n = (3 << 20) + 17;
    let dev = DevBuf::new(n);
    let stream = Stream::new().unwrap();
    let data = pattern(n, 2);
    let mut a = alloc_pinned_memory(n).unwrap().slice(0, n).unwrap();
    a.as_mut_slice().unwrap().copy_from_slice(&data);
    a.copy_to_device_async(dev.ptr, &stream).unwrap();
    let mut b = PinnedMemoryPointer::from(PinnedMemory::new(n).unwrap());
    b.copy_from_device_async(dev.ptr, &stream).unwrap();
    // The view waits for the copy into `b`.
    assert!(b.as_slice().unwrap() == &data[..]);
    assert!(dev.read(0, n) == data);
});

gpu_test!(view_waits_for_a_device_to_host_copy_in_flight, {
    let n = 1 << 20;
    let dev = DevBuf::new(n);
    dev.fill(0xAB);
    let stream = Stream::new().unwrap();
    let mut p = PinnedMemoryPointer::from(PinnedMemory::new(n).unwrap());
    p.as_mut_slice().unwrap().fill(0);
    let gate = Gate::close(stream.as_raw());
    p.copy_from_device_async(dev.ptr, &stream).unwrap();
    let tx = gate.opener();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(100));
        let _ = tx.send(());
    });
    // Blocks until the gate opens and the copy lands.
    assert!(p.as_slice().unwrap().iter().all(|&b| b == 0xAB));
    opener.join().unwrap();
    drop(gate);
});

gpu_test!(dropping_the_last_handle_during_a_copy_waits_for_it, {
    let n = 4 << 20;
    let dev = DevBuf::new(n);
    let stream = Stream::new().unwrap();
    let data = pattern(n, 3);
    let mut p = PinnedMemoryPointer::from(PinnedMemory::new(n).unwrap());
    p.as_mut_slice().unwrap().copy_from_slice(&data);
    p.copy_to_device_async(dev.ptr, &stream).unwrap();
    drop(p); // waits for the copy, then cuMemFreeHost
    stream.synchronize().unwrap();
    assert!(dev.read(0, n) == data);
});

gpu_test!(mapped_pinned_memory_has_a_device_pointer, {
    let m = PinnedMemory::with_flags(4096, PinnedFlags::PORTABLE | PinnedFlags::DEVICEMAP).unwrap();
    assert_ne!(m.device_ptr().unwrap(), 0);
});

gpu_test!(register_pins_a_slice_and_unregisters_on_drop, {
    let n = (1 << 20) + 5;
    let mut host = pattern(n, 4);
    let expect = host.clone();
    let dev = DevBuf::new(n);
    let stream = Stream::new().unwrap();
    {
        let mut r = register(&mut host).unwrap();
        assert_eq!(r.len(), n);
        r.copy_to_device(dev.ptr, &stream).unwrap();
        r.as_mut_slice().fill(0);
        r.copy_from_device(dev.ptr, &stream).unwrap();
        assert!(r.as_slice() == &expect[..]);
    }
    // Unregistered on drop: registering it again works.
    let r = register(&mut host).unwrap();
    r.unregister().unwrap();
    assert!(host == expect);
});

gpu_test!(register_of_an_empty_slice_is_a_no_op, {
    let mut v: Vec<u8> = Vec::new();
    let r = register(&mut v).unwrap();
    assert!(r.is_empty());
});

gpu_test!(default_allocator_is_the_default_pool, {
    let pool = pinned::get_pinned_memory_allocator().expect("pooling by default");
    assert!(pool.same_pool(&pinned::get_default_pinned_memory_pool()));
});
