//! Pageable copies through pinned staging buffers: byte-exact in both directions at
//! odd sizes and offsets. Each direction is checked against the raw driver copy.

mod common;

use std::sync::Arc;

use common::{pattern, DevBuf};
use cuda_rt::memory::{MemoryPointer, UnownedMemory};
use cuda_rt::pinned::staging::STREAM_D2H_MIN;
use cuda_rt::pinned::{
    copy_device_to_host, copy_device_to_host_raw, copy_host_to_device, copy_host_to_device_raw,
    parallel_memcpy, set_staging_threads, staging_threads, CHUNK_SIZE, PAGEABLE_THRESHOLD,
};
use cuda_rt::{
    get_current_stream, gpu_test, ArgumentKind, CaptureMode, Error, Stream, StreamCaptureExt,
};

/// The first `len` bytes of `dev` as a [`MemoryPointer`] that keeps `dev` alive (its
/// owner); the checks read `dev` with raw driver copies. Bytes past `len` are a guard.
fn pointer(dev: &Arc<DevBuf>, len: usize) -> MemoryPointer {
    assert!(len <= dev.len);
    // SAFETY: `dev` is cuMemAlloc'd memory of at least `len` bytes, freed only when the
    // `DevBuf` drops, which the memory object keeps alive (its owner).
    let m = unsafe { UnownedMemory::new(dev.ptr, len, Arc::clone(dev), Some(0)) }.unwrap();
    MemoryPointer::from_memory(Arc::new(m))
}

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
    let dev = Arc::new(DevBuf::new(n + 1));
    let dst = pointer(&dev, n + 1).offset_by(1).unwrap();
    copy_host_to_device(&dst, &host[3..], stream).unwrap();
    let back = dev.read(1, n);
    assert!(back == host[3..], "host to device, {n} bytes");
}

fn d2h_then_check(n: usize, stream: &Stream, seed: u64) {
    let data = pattern(n, seed);
    let dev = Arc::new(DevBuf::new(n + 1));
    dev.write(1, &data);
    let src = pointer(&dev, n + 1).offset_by(1).unwrap();
    let mut host = vec![0x5Au8; n + 5];
    copy_device_to_host(&mut host[3..3 + n], &src, stream).unwrap();
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

// Device-to-host copies from `STREAM_D2H_MIN` bytes up write their destination with
// streaming stores by default: just below and above it, at odd offsets, each byte is
// the device's and nothing past either end is written.
gpu_test!(
    device_to_host_around_the_streaming_threshold_is_byte_exact,
    {
        assert_eq!(cuda_rt::testing::streaming_stores(), (false, true));
        let stream = Stream::new().unwrap();
        for (i, n) in [STREAM_D2H_MIN - 1, STREAM_D2H_MIN, STREAM_D2H_MIN + 4097]
            .into_iter()
            .enumerate()
        {
            d2h_then_check(n, &stream, 50 + i as u64);
        }
    }
);

gpu_test!(copies_on_the_current_default_stream_are_byte_exact, {
    let n = 2 * CHUNK_SIZE + 1;
    let host = pattern(n, 40);
    let dev = Arc::new(DevBuf::new(n));
    let d = pointer(&dev, n);
    copy_host_to_device(&d, &host, &get_current_stream()).unwrap();
    assert!(dev.read(0, n) == host);
    let mut back = vec![0u8; n];
    copy_device_to_host(&mut back, &d, &get_current_stream()).unwrap();
    assert!(back == host);
});

gpu_test!(raw_address_copies_are_byte_exact, {
    let n = CHUNK_SIZE + 5;
    let host = pattern(n, 41);
    let dev = DevBuf::new(n);
    let stream = Stream::new().unwrap();
    // SAFETY: `dev` holds `n` bytes, alive and touched by nothing else until it drops.
    unsafe { copy_host_to_device_raw(dev.ptr, &host, &stream) }.unwrap();
    assert!(dev.read(0, n) == host);
    let mut back = vec![0u8; n];
    // SAFETY: as above.
    unsafe { copy_device_to_host_raw(&mut back, dev.ptr, &stream) }.unwrap();
    assert!(back == host);
});

gpu_test!(
    copies_past_the_end_of_the_memory_pointer_fail_and_write_nothing,
    {
        let stream = Stream::non_blocking().unwrap();
        // Below and above the staging threshold: the check comes before either path.
        for (i, &room) in [4096usize, PAGEABLE_THRESHOLD + 4096].iter().enumerate() {
            let guard = 4096;
            let dev = Arc::new(DevBuf::new(room + guard));
            let fill = pattern(room + guard, 90 + i as u64);
            dev.write(0, &fill);
            let whole = pointer(&dev, room);
            let tail = whole.offset_by(room as isize - 10).unwrap();
            let out_of_bounds = ArgumentKind::OutOfBounds {
                requested: room as u64 + 1,
                available: room as u64,
            };

            let host = pattern(room + 1, 95);
            let e = copy_host_to_device(&whole, &host, &stream).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { kind, .. } if kind == out_of_bounds),
                "{e}"
            );
            assert!(e.to_string().contains("do not fit"), "{e}");
            assert!(copy_host_to_device(&tail, &host[..11], &stream).is_err());

            let mut back = vec![0x5Au8; room + 1];
            let e = copy_device_to_host(&mut back, &whole, &stream).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { kind, .. } if kind == out_of_bounds),
                "{e}"
            );
            assert!(copy_device_to_host(&mut back[..11], &tail, &stream).is_err());
            assert!(
                back.iter().all(|&b| b == 0x5A),
                "the host memory was written"
            );

            stream.synchronize().unwrap();
            assert!(
                dev.read(0, room + guard) == fill,
                "the device memory was written"
            );

            // Exactly the room left fits, and the guard stays as it was.
            copy_host_to_device(&tail, &host[..10], &stream).unwrap();
            let mut expect = fill.clone();
            expect[room - 10..room].copy_from_slice(&host[..10]);
            assert!(dev.read(0, room + guard) == expect);
        }
    }
);

gpu_test!(
    alone copies_on_a_capturing_stream_fail_and_no_graph_replays_them,
    {
        // Synchronous copies cannot be captured: the driver refuses their wait (or the
        // copy itself) and invalidates the capture, so whatever was captured is never
        // replayed.
        let s = Stream::non_blocking().unwrap();
        for &n in &[4096usize, PAGEABLE_THRESHOLD + 4096] {
            let dev = Arc::new(DevBuf::new(n));
            dev.fill(0x11);
            let d = pointer(&dev, n);
            let host = vec![0x22u8; n];
            let mut back = vec![0x33u8; n];
            for to_device in [true, false] {
                s.begin_capture(CaptureMode::Relaxed).unwrap();
                let r = if to_device {
                    copy_host_to_device(&d, &host, &s)
                } else {
                    copy_device_to_host(&mut back, &d, &s)
                };
                let end = s.end_capture();
                assert!(r.is_err(), "{n} bytes, to device: {to_device}: a copy was captured");
                if let Ok(g) = end {
                    assert_eq!(g.node_count().unwrap(), 0, "{n} bytes: a graph holds the copy");
                }
            }
            s.synchronize().unwrap();
            assert!(dev.read(0, n).iter().all(|&b| b == 0x11));
            assert!(back.iter().all(|&b| b == 0x33));
        }
    }
);

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
    let null = MemoryPointer::null(0);
    copy_host_to_device(&null, &[], &stream).unwrap();
    copy_device_to_host(&mut [], &null, &stream).unwrap();
    // SAFETY: no byte is copied.
    unsafe {
        copy_host_to_device_raw(0, &[], &stream).unwrap();
        copy_device_to_host_raw(&mut [], 0, &stream).unwrap();
    }
});

// ---- host only (run everywhere) ----

#[test]
fn copies_past_the_end_of_a_memory_pointer_fail_before_any_cuda_call() {
    // A null pointer of size 0 and the current stream: no CUDA call makes either.
    let null = MemoryPointer::null(0);
    let s = get_current_stream();
    let e = copy_host_to_device(&null, &[1u8; 3], &s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                kind: ArgumentKind::OutOfBounds {
                    requested: 3,
                    available: 0
                },
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("3 bytes do not fit"), "{e}");
    let mut back = [7u8; 3];
    let e = copy_device_to_host(&mut back, &null, &s).unwrap_err();
    assert!(e.to_string().contains("3 bytes do not fit"), "{e}");
    assert_eq!(back, [7; 3]);
    // Size 0 fits anywhere and is a no-op.
    copy_host_to_device(&null, &[], &s).unwrap();
    copy_device_to_host(&mut [], &null, &s).unwrap();
}

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

/// Marks the child process of
/// [`staged_copies_are_byte_exact_over_a_memory_backed_fake_driver`].
const FAKE_CHILD: &str = "CUDA_RT_STAGING_FAKE_CHILD";

/// The byte checks of the GPU tests above, run again (in a child process of this
/// binary) over the repository's fake driver built with `FAKE_REAL_MEMORY`, whose
/// device memory is host memory and whose copies are `memcpy`: the staging plans, the
/// workers and their plain and streaming stores are checked byte for byte on machines
/// without a GPU (CI). In the GPU suite (`CUDA_RT_REQUIRE_GPU=1`) the same tests have
/// just run on the real driver, and a child on another driver would only confuse
/// compute-sanitizer: it is left out there, saying so.
#[test]
fn staged_copies_are_byte_exact_over_a_memory_backed_fake_driver() {
    const CHECKS: &[&str] = &[
        "host_to_device_is_byte_exact_at_odd_sizes_and_offsets",
        "device_to_host_is_byte_exact_at_odd_sizes_and_offsets",
        "device_to_host_around_the_streaming_threshold_is_byte_exact",
        "round_trip_of_256_mib_plus_3_is_byte_exact",
        "copies_on_the_current_default_stream_are_byte_exact",
        "raw_address_copies_are_byte_exact",
        "concurrent_copies_from_several_threads_are_byte_exact",
    ];
    if std::env::var_os(FAKE_CHILD).is_some() {
        return;
    }
    if std::env::var("CUDA_RT_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        println!("the GPU suite: these checks ran on the real driver");
        return;
    }
    let c = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/fake-libcuda.c");
    let dir = std::env::temp_dir().join(format!("cuda-rt-staging-fake-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let so = dir.join("libcuda.so.1");
    let built = c.is_file()
        && std::process::Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
            .args(["-O2", "-shared", "-fPIC", "-DFAKE_REAL_MEMORY", "-o"])
            .arg(&so)
            .arg(&c)
            .arg("-ldl")
            .status()
            .is_ok_and(|s| s.success());
    if !built {
        let _ = std::fs::remove_dir_all(&dir);
        panic!(
            "could not build the fake driver from {} with a C compiler",
            c.display()
        );
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(CHECKS)
        .arg("--exact")
        .env(FAKE_CHILD, "1")
        .env("CUDA_RT_LIBCUDA", &so)
        .env("CUDA_RT_REQUIRE_GPU", "1")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "over the fake driver:\n{text}");
    let ran = format!("test result: ok. {} passed; 0 failed", CHECKS.len());
    assert!(text.contains(&ran), "not every check ran:\n{text}");
}
