//! Pageable copies through pinned staging buffers: byte-exact in both directions at
//! odd sizes and offsets. Each direction is checked against the raw driver copy.

mod common;

use common::{pattern, DevBuf};
use cuda_rt::pinned::{
    copy_device_to_host, copy_host_to_device, parallel_memcpy, set_staging_threads,
    staging_threads, CHUNK_SIZE, PAGEABLE_THRESHOLD,
};
use cuda_rt::{get_current_stream, gpu_test, Stream};

const SIZES: &[usize] = &[
    1,
    PAGEABLE_THRESHOLD - 1,
    PAGEABLE_THRESHOLD,
    PAGEABLE_THRESHOLD + 1,
    CHUNK_SIZE - 1,
    CHUNK_SIZE,
    CHUNK_SIZE + 1,
    3 * CHUNK_SIZE + 4097,
];

/// Host data starts 3 bytes into a Vec and the device data 1 byte into its buffer,
/// so nothing is aligned.
fn h2d_then_check(n: usize, stream: &Stream, seed: u64) {
    let host = pattern(n + 3, seed);
    let dev = DevBuf::new(n + 1);
    copy_host_to_device(dev.ptr + 1, &host[3..], stream).unwrap();
    let back = dev.read(1, n);
    assert!(back == host[3..], "host to device, {n} bytes");
}

fn d2h_then_check(n: usize, stream: &Stream, seed: u64) {
    let data = pattern(n, seed);
    let dev = DevBuf::new(n + 1);
    dev.write(1, &data);
    let mut host = vec![0x5Au8; n + 5];
    copy_device_to_host(&mut host[3..3 + n], dev.ptr + 1, stream).unwrap();
    assert!(host[3..3 + n] == data[..], "device to host, {n} bytes");
    assert!(host[..3].iter().chain(&host[3 + n..]).all(|&b| b == 0x5A));
}

gpu_test!(host_to_device_is_byte_exact_at_odd_sizes_and_offsets, {
    let stream = Stream::new().unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        h2d_then_check(n, &stream, i as u64 + 10);
    }
});

gpu_test!(device_to_host_is_byte_exact_at_odd_sizes_and_offsets, {
    let stream = Stream::new().unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        d2h_then_check(n, &stream, i as u64 + 20);
    }
});

gpu_test!(round_trip_of_256_mib_plus_3_is_byte_exact, {
    let n = (256 << 20) + 3;
    let stream = Stream::new().unwrap();
    h2d_then_check(n, &stream, 30);
    d2h_then_check(n, &stream, 31);
});

gpu_test!(copies_on_the_current_default_stream_are_byte_exact, {
    let n = 2 * CHUNK_SIZE + 1;
    let host = pattern(n, 40);
    let dev = DevBuf::new(n);
    copy_host_to_device(dev.ptr, &host, &get_current_stream()).unwrap();
    let mut back = vec![0u8; n];
    copy_device_to_host(&mut back, dev.ptr, &get_current_stream()).unwrap();
    assert!(back == host);
});

gpu_test!(concurrent_copies_from_several_threads_are_byte_exact, {
    let handles: Vec<_> = (0..4)
        .map(|t| {
            std::thread::spawn(move || {
                let stream = Stream::new().unwrap();
                let n = 5 * CHUNK_SIZE / 2 + t;
                h2d_then_check(n, &stream, 50 + t as u64);
                d2h_then_check(n, &stream, 60 + t as u64);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
});

gpu_test!(empty_copies_do_nothing, {
    let stream = Stream::new().unwrap();
    copy_host_to_device(0, &[], &stream).unwrap();
    copy_device_to_host(&mut [], 0, &stream).unwrap();
});

// ---- host only (run everywhere) ----

#[test]
fn staging_threads_can_be_set_and_copies_stay_exact() {
    let src = pattern((5 << 20) + 7, 70);
    for &t in &[1usize, 3, 8, 2] {
        assert_eq!(set_staging_threads(t).unwrap(), t);
        assert_eq!(staging_threads(), t);
        let mut dst = vec![0u8; src.len()];
        parallel_memcpy(&mut dst, &src).unwrap();
        assert!(dst == src, "{t} threads");
    }
    assert!(set_staging_threads(0).is_err());
    assert!(set_staging_threads(10_000).is_err());
}

#[test]
fn parallel_memcpy_from_many_threads_at_once_is_exact() {
    let handles: Vec<_> = (0..6)
        .map(|t| {
            std::thread::spawn(move || {
                let src = pattern((1 << 20) + t * 4099, 80 + t as u64);
                let mut dst = vec![0u8; src.len()];
                parallel_memcpy(&mut dst, &src).unwrap();
                assert!(dst == src);
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
