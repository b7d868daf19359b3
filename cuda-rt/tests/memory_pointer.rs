//! MemoryPointer on a GPU: copies in every direction, memsets, offsets, peers, and
//! the length checks. Every copy is checked against values computed on the host.

use std::ffi::c_void;

use cuda_rt::memory::{alloc, Bf16, MemoryPointer, F16};
use cuda_rt::stream::AsStream;
use cuda_rt::{ArgumentKind, Error, Stream};

fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 7 + 3) as u8).collect()
}

cuda_rt::gpu_test!(host_device_round_trip_of_several_types, {
    let p = alloc(1 << 16).unwrap();
    let ints: Vec<i64> = (0..1000).map(|i| i * i - 500).collect();
    p.copy_from_host(&ints).unwrap();
    let mut back = vec![0i64; 1000];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, ints);

    let halves: Vec<F16> = (0..64).map(|i| F16::from_f32(i as f32 / 4.0)).collect();
    p.copy_from_host(&halves).unwrap();
    let mut hb = vec![F16(0); 64];
    p.copy_to_host(&mut hb).unwrap();
    assert_eq!(hb, halves);
    assert_eq!(hb[6].to_f32(), 1.5);

    let bf: Vec<Bf16> = (0..64).map(|i| Bf16::from_f32(-(i as f32))).collect();
    p.copy_from_host(&bf).unwrap();
    let mut bb = vec![Bf16(0); 64];
    p.copy_to_host(&mut bb).unwrap();
    assert_eq!(bb, bf);

    let arrays = [[1.5f32, 2.5, 3.5]; 10];
    p.copy_from_host(&arrays).unwrap();
    let mut ab = [[0f32; 3]; 10];
    p.copy_to_host(&mut ab).unwrap();
    assert_eq!(ab, arrays);
});

cuda_rt::gpu_test!(copies_at_an_offset_touch_only_their_range, {
    let p = alloc(1024).unwrap();
    p.memset(0, 1024).unwrap();
    let q = (&p + 100).unwrap();
    q.copy_from_host(&[0xABu8; 50]).unwrap();
    let mut all = vec![0u8; 1024];
    p.copy_to_host(&mut all).unwrap();
    let mut want = vec![0u8; 1024];
    want[100..150].fill(0xAB);
    assert_eq!(all, want);
    let mut part = [0u8; 60];
    (&q - 5).unwrap().copy_to_host(&mut part).unwrap();
    assert_eq!(&part[..], &want[95..155]);
});

/// Exactly `n` bytes of plain device memory (the default pool rounds to 512 bytes).
fn exact(n: usize) -> MemoryPointer {
    cuda_rt::memory::using_allocator(None, || alloc(n).unwrap())
}

/// The kind of an invalid-argument error, `None` for any other outcome.
fn kind(r: cuda_rt::Result<()>) -> Option<ArgumentKind> {
    match r {
        Err(Error::InvalidArgument { kind, .. }) => Some(kind),
        _ => None,
    }
}

cuda_rt::gpu_test!(pooled_memory_is_rounded_to_512_bytes, {
    assert_eq!(alloc(64).unwrap().size(), 512);
    assert_eq!(exact(64).size(), 64);
});

cuda_rt::gpu_test!(copies_with_mismatched_lengths_are_errors, {
    let p = exact(64);
    let e = p.copy_from_host(&[0u8; 65]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                kind: ArgumentKind::OutOfBounds {
                    requested: 65,
                    available: 64
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(p.copy_to_host(&mut [0u32; 17]).is_err());
    let end = (&p + 60).unwrap();
    assert!(end.copy_from_host(&[0u32; 2]).is_err());
    let other = exact(32);
    assert!(p.copy_from_device(&other, 33).is_err());
    assert!(other.copy_from_device(&p, 33).is_err());
    assert!(p.memset(1, 65).is_err());
    // and a fitting copy still works
    p.copy_from_host(&[5u8; 64]).unwrap();
    let mut back = [0u8; 64];
    p.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [5u8; 64]);
});

cuda_rt::gpu_test!(device_to_device_copy_sync_and_async, {
    let src = alloc(1 << 20).unwrap();
    let data = pattern(1 << 20);
    src.copy_from_host(&data).unwrap();
    let dst = alloc(1 << 20).unwrap();
    dst.copy_from_device(&src, 1 << 20).unwrap();
    let mut back = vec![0u8; 1 << 20];
    dst.copy_to_host(&mut back).unwrap();
    assert_eq!(back, data);

    let s = Stream::new().unwrap();
    let dst2 = alloc(1 << 20).unwrap();
    dst2.memset_async(0, 1 << 20, Some(&s)).unwrap();
    dst2.copy_from_device_async(&src, 1000, Some(&s)).unwrap();
    s.synchronize().unwrap();
    let mut back2 = vec![1u8; 1 << 20];
    dst2.copy_to_host(&mut back2).unwrap();
    assert_eq!(&back2[..1000], &data[..1000]);
    assert!(back2[1000..].iter().all(|&b| b == 0));
    src.copy_to_device(&dst2, 10).unwrap();
});

cuda_rt::gpu_test!(async_host_copies_on_a_stream, {
    let s = Stream::new().unwrap();
    let p = alloc(4096).unwrap();
    let data = pattern(4096);
    p.copy_from_host_async(&data, Some(&s)).unwrap();
    let mut back = vec![0u8; 4096];
    p.copy_to_host_async(&mut back, Some(&s)).unwrap();
    s.synchronize().unwrap();
    assert_eq!(back, data);
    // default: the current stream
    p.copy_from_host_async(&data[..100], None).unwrap();
    let mut b2 = vec![0u8; 100];
    p.copy_to_host_async(&mut b2, None).unwrap();
    assert_eq!(b2, &data[..100]);
});

cuda_rt::gpu_test!(async_copies_from_page_locked_host_memory, {
    use cuda_rt::cuda_sys::driver as sys;
    let n = 1 << 20;
    let p = alloc(n).unwrap(); // makes the context current
    let alloc_host = sys::api().unwrap().cuMemHostAlloc().unwrap();
    let free_host = sys::api().unwrap().cuMemFreeHost().unwrap();
    let mut raw: *mut c_void = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out pointer; flags 0 = plain pinned memory.
    assert_eq!(
        unsafe { alloc_host(&mut raw, n, 0) },
        sys::CUresult::CUDA_SUCCESS
    );
    // SAFETY: `raw` points to `n` bytes of pinned host memory, ours until freed below.
    let host = unsafe { std::slice::from_raw_parts_mut(raw.cast::<u8>(), n) };
    let data = pattern(n);
    host.copy_from_slice(&data);
    let s = Stream::new().unwrap();
    p.copy_from_host_async(host, Some(&s)).unwrap();
    host.fill(0); // the copy has read it: page-locked copies wait before returning
    p.copy_to_host_async(host, Some(&s)).unwrap();
    assert_eq!(host, &data[..]);
    // SAFETY: allocated above by cuMemHostAlloc, freed once; `host` is not used after.
    assert_eq!(unsafe { free_host(raw) }, sys::CUresult::CUDA_SUCCESS);
});

cuda_rt::gpu_test!(memset_widths_sync_and_async, {
    let p = alloc(1024).unwrap();
    p.memset(0x5A, 1024).unwrap();
    let mut b = vec![0u8; 1024];
    p.copy_to_host(&mut b).unwrap();
    assert!(b.iter().all(|&x| x == 0x5A));

    p.memset_u16(0xBEEF, 512).unwrap();
    let mut h = vec![0u16; 512];
    p.copy_to_host(&mut h).unwrap();
    assert!(h.iter().all(|&x| x == 0xBEEF));

    let s = Stream::new().unwrap();
    p.memset_u32_async(0x0102_0304, 100, Some(&s)).unwrap();
    p.memset_u16_async(7, 1, Some(&s)).unwrap();
    p.memset_async(9, 1, Some(&s)).unwrap();
    s.synchronize().unwrap();
    let mut w = vec![0u32; 256];
    p.copy_to_host(&mut w).unwrap();
    assert_eq!(w[0], u32::from_le_bytes([9, 0, 2, 1]));
    assert!(w[1..100].iter().all(|&x| x == 0x0102_0304));
    assert!(w[100..].iter().all(|&x| x == 0xBEEF_BEEF));
});

cuda_rt::gpu_test!(misaligned_wide_memset_is_an_error, {
    let p = alloc(64).unwrap();
    let odd = (&p + 1).unwrap();
    assert_eq!(
        kind(odd.memset_u16(0, 4)),
        Some(ArgumentKind::Misaligned {
            address: odd.ptr(),
            alignment: 2
        })
    );
    let two = (&p + 2).unwrap();
    assert_eq!(
        kind(two.memset_u32(0, 4)),
        Some(ArgumentKind::Misaligned {
            address: two.ptr(),
            alignment: 4
        })
    );
    two.memset_u16(1, 4).unwrap();
});

cuda_rt::gpu_test!(pointer_keeps_its_memory_alive, {
    let p = alloc(256).unwrap();
    p.copy_from_host(&[1u8; 256]).unwrap();
    let q = (&p + 128).unwrap();
    drop(p);
    let mut back = [0u8; 128];
    q.copy_to_host(&mut back).unwrap();
    assert_eq!(back, [1u8; 128]);
});

cuda_rt::gpu_test!(peer_copy_between_two_devices, {
    let n = cuda_rt::device_count().unwrap();
    if n < 2 {
        eprintln!("peer_copy_between_two_devices: one device only, the peer path is not run");
        return;
    }
    let data = pattern(1 << 16);
    let a = alloc(1 << 16).unwrap();
    a.copy_from_host(&data).unwrap();
    cuda_rt::device::set_device_id(1).unwrap();
    let b = alloc(1 << 16).unwrap();
    assert_eq!(b.device_id(), 1);
    b.copy_from_device(&a, 1 << 16).unwrap();
    let mut back = vec![0u8; 1 << 16];
    b.copy_to_host(&mut back).unwrap();
    assert_eq!(back, data);
    let s = Stream::new().unwrap(); // on device 1
    b.memset_async(0, 1 << 16, Some(&s)).unwrap();
    b.copy_from_device_async(&a, 1 << 16, Some(&s)).unwrap();
    s.synchronize().unwrap();
    b.copy_to_host(&mut back).unwrap();
    assert_eq!(back, data);
    cuda_rt::device::set_device_id(0).unwrap();
});

#[test]
fn pointer_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<MemoryPointer>();
}

cuda_rt::gpu_test!(large_sync_host_copies_are_staged_and_round_trip, {
    // Above PAGEABLE_THRESHOLD: pageable memory goes through the pinned staging path,
    // on the legacy default stream and on a current stream, at an offset, with an
    // odd length and a wider element type.
    let n = (3 << 20) / 4 + 7;
    let src: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let p = alloc(n * 4 + 512).unwrap();
    let q = p.checked_add(256).unwrap();
    p.memset(0xab, 256).unwrap();
    q.copy_from_host(&src).unwrap();
    let mut back = vec![0u32; n];
    q.copy_to_host(&mut back).unwrap();
    assert_eq!(back, src);

    let s = Stream::new().unwrap();
    let _scope = s.enter().unwrap();
    let twice: Vec<u32> = src.iter().map(|v| v ^ 0xffff_ffff).collect();
    q.copy_from_host(&twice).unwrap();
    let mut back = vec![0u32; n];
    q.copy_to_host(&mut back).unwrap();
    assert_eq!(back, twice);
    // The bytes before the offset were not touched by the staged copies.
    let mut head = vec![0u8; 256];
    p.copy_to_host(&mut head).unwrap();
    assert_eq!(head, vec![0xab; 256]);
});
