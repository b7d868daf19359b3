//! Memory objects and bad input: each case a clear error, and the process goes on
//! working afterwards. GPU tests skip without a GPU (see `cuda_rt::testing`).

use std::sync::Arc;

use cuda_rt::memory::{
    malloc_managed, Advice, BaseMemory, Location, ManagedMemory, Memory, MemoryPointer,
    UnownedMemory,
};
use cuda_rt::{ArgumentKind, Device, Error};

/// After a bad call, ordinary work still succeeds.
fn still_works() {
    let p = cuda_rt::alloc(256).unwrap();
    p.copy_from_host(&[42u16; 128]).unwrap();
    let mut back = [0u16; 128];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [42u16; 128]);
}

#[test]
fn null_memory_has_size_zero_and_owns_nothing() {
    let m = Memory::null(0);
    assert_eq!((m.ptr(), m.size(), m.device_id()), (0, 0, 0));
    drop(m); // frees nothing, needs no driver
}

#[test]
fn unowned_null_pointer_without_device_is_an_error() {
    // SAFETY: the constructor fails before the pointer could be used.
    let e = unsafe { UnownedMemory::new(0, 16, (), None) }.unwrap_err();
    assert!(matches!(
        e,
        Error::InvalidArgument {
            kind: ArgumentKind::Null,
            ..
        }
    ));
    assert!(e.to_string().contains("null pointer"), "{e}");
}

cuda_rt::gpu_test!(memory_new_round_trips_data, {
    let m = Arc::new(Memory::new(1 << 20).unwrap());
    assert_eq!(m.size(), 1 << 20);
    assert_ne!(m.ptr(), 0);
    assert_eq!(m.device_id(), cuda_rt::get_device_id());
    let p = MemoryPointer::from_memory(m);
    let src: Vec<f64> = (0..(1 << 17)).map(|i| i as f64 * 0.5).collect();
    p.copy_from_host(&src).unwrap();
    let mut back = vec![0.0f64; src.len()];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, src);
});

cuda_rt::gpu_test!(alloc_zero_gives_null_pointer_of_size_zero, {
    for p in [
        cuda_rt::alloc(0).unwrap(),
        cuda_rt::malloc_async(0).unwrap(),
        malloc_managed(0).unwrap(),
        MemoryPointer::from_memory(Arc::new(Memory::new(0).unwrap())),
    ] {
        assert_eq!((p.ptr(), p.size()), (0, 0));
        p.copy_from_host::<u8>(&[]).unwrap();
        p.memset(0, 0).unwrap();
        assert!(p.copy_from_host(&[1u8]).is_err());
    }
    still_works();
});

cuda_rt::gpu_test!(alloc_larger_than_the_device_is_out_of_memory, {
    let total = Device::new(0).unwrap().total_memory().unwrap();
    let ask = total + (1 << 30);
    for e in [
        Memory::new(ask).unwrap_err(),
        cuda_rt::alloc(ask).unwrap_err(),
        cuda_rt::malloc_async(ask).unwrap_err(),
    ] {
        match &e {
            Error::OutOfMemory(o) => {
                assert!(o.requested >= ask as u64, "{e}");
                assert_eq!(o.device, Some(0));
            }
            other => panic!("expected OutOfMemory, got {other}"),
        }
        assert!(e.is_out_of_memory());
        assert!(e.to_string().contains("out of memory allocating"), "{e}");
    }
    still_works();
});

cuda_rt::gpu_test!(memory_on_an_invalid_device_is_an_error, {
    let n = cuda_rt::device_count().unwrap();
    let e = Memory::new_on(n, 1024).unwrap_err();
    assert!(
        matches!(e, Error::InvalidDevice { id, count } if id == n && count == n),
        "{e}"
    );
    assert!(matches!(
        Memory::new_on(-1, 1024),
        Err(Error::InvalidDevice { .. })
    ));
    still_works();
});

cuda_rt::gpu_test!(managed_memory_is_readable_after_device_writes, {
    let m = Arc::new(ManagedMemory::new(4096).unwrap());
    let p = MemoryPointer::from_memory(m.clone());
    p.memset_u32(0xDEADBEEF, 1024).unwrap();
    let mut back = vec![0u32; 1024];
    p.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&v| v == 0xDEADBEEF));
    let dev = Device::new(0).unwrap();
    let concurrent = dev
        .attribute_raw(
            cuda_rt::cuda_sys::driver::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        )
        .unwrap();
    if concurrent != 0 {
        m.advise(Advice::SetReadMostly, Location::Device(0))
            .unwrap();
        m.advise(Advice::UnsetReadMostly, Location::Device(0))
            .unwrap();
        m.advise(Advice::SetPreferredLocation, Location::Host)
            .unwrap();
        m.prefetch(Location::Device(0), None).unwrap();
        m.prefetch(Location::Host, None).unwrap();
        let s = cuda_rt::Stream::new().unwrap();
        m.prefetch(Location::Device(0), Some(&s)).unwrap();
        s.synchronize().unwrap();
    }
    p.copy_to_host(&mut back).unwrap();
    assert!(back.iter().all(|&v| v == 0xDEADBEEF));
});

cuda_rt::gpu_test!(managed_prefetch_to_a_missing_device_is_an_error, {
    let m = ManagedMemory::new(4096).unwrap();
    let n = cuda_rt::device_count().unwrap();
    let e = m.prefetch(Location::Device(n), None).unwrap_err();
    assert!(matches!(e, Error::InvalidDevice { .. }), "{e}");
    let e = m
        .advise(Advice::SetAccessedBy, Location::Device(n + 5))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidDevice { .. }), "{e}");
    still_works();
});

cuda_rt::gpu_test!(unowned_memory_finds_its_device_and_keeps_the_owner, {
    let owner = Arc::new(Memory::new(1024).unwrap());
    let ptr = owner.ptr();
    // SAFETY: `owner` owns the 1024 bytes and is kept alive by the UnownedMemory.
    let u = unsafe { UnownedMemory::new(ptr + 512, 512, owner.clone(), None) }.unwrap();
    assert_eq!(u.device_id(), 0);
    assert_eq!(Arc::strong_count(&owner), 2);
    let p = MemoryPointer::from_memory(Arc::new(u));
    p.copy_from_host(&[9u8; 512]).unwrap();
    let whole = MemoryPointer::from_memory(owner.clone());
    let mut back = vec![0u8; 1024];
    whole.copy_to_host(&mut back).unwrap();
    assert_eq!(&back[512..], &[9u8; 512][..]);
    drop(whole);
    drop(p);
    assert_eq!(
        Arc::strong_count(&owner),
        1,
        "owner released with the wrapper"
    );
});

cuda_rt::gpu_test!(unowned_host_pointer_without_device_is_an_error, {
    let host = [0u8; 64];
    // SAFETY: the constructor fails before the pointer could be used.
    let e = unsafe { UnownedMemory::new(host.as_ptr() as u64, 64, (), None) }.unwrap_err();
    assert!(matches!(
        e,
        Error::InvalidArgument {
            kind: ArgumentKind::NotFound,
            ..
        }
    ));
    assert!(e.to_string().contains("does not know the pointer"), "{e}");
    still_works();
});

cuda_rt::gpu_test!(unowned_memory_with_an_invalid_device_is_an_error, {
    let owner = Memory::new(64).unwrap();
    let n = cuda_rt::device_count().unwrap();
    // SAFETY: the constructor fails before the pointer could be used.
    let e = unsafe { UnownedMemory::new(owner.ptr(), 64, (), Some(n)) }.unwrap_err();
    assert!(matches!(e, Error::InvalidDevice { .. }), "{e}");
    still_works();
});
