//! Typed buffers: device buffers and views, pinned buffers, asynchronous copies that
//! wait for nothing and keep both sides alive, kernels on typed buffers (GPU tests skip
//! without a GPU; `CUDA_RT_REQUIRE_GPU=1` makes them fail instead).

mod common;
#[path = "common_kernel/mod.rs"]
mod common_kernel;
#[path = "common/kernels.rs"]
mod kernels;

use std::time::{Duration, Instant};

use common::{pattern, Gate};
use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer};
use cuda_rt::compiler::RawKernel;
use cuda_rt::memory::{Bf16, Pod, F16};
use cuda_rt::{gpu_test, AsStream, LaunchConfig, Stream};

#[derive(Debug, Clone, Copy, PartialEq)]
#[repr(C)]
struct Pair {
    a: u32,
    b: f32,
}
// SAFETY: `#[repr(C)]` of two 4-byte fields: no padding, every bit pattern valid.
unsafe impl Pod for Pair {}

fn round_trip<T: Pod + PartialEq + std::fmt::Debug>(data: &[T]) {
    let b = DeviceBuffer::from_slice(data).unwrap();
    assert_eq!(b.len(), data.len());
    assert_eq!(b.to_vec().unwrap(), data);
}

gpu_test!(buffers_round_trip_elements_of_every_kind, {
    round_trip(&pattern(1001, 1));
    round_trip(&(0..4097).map(|i| i as f32 * 0.5).collect::<Vec<_>>());
    round_trip(&(0..333).map(|i| i as f64 / 3.0).collect::<Vec<_>>());
    round_trip(
        &(0..100)
            .map(|i| F16::from_f32(i as f32))
            .collect::<Vec<_>>(),
    );
    round_trip(
        &(0..100)
            .map(|i| Bf16::from_f32(i as f32))
            .collect::<Vec<_>>(),
    );
    round_trip(&(0..77u16).map(|i| [i, i + 1, i + 2]).collect::<Vec<_>>());
    round_trip(
        &(0..500)
            .map(|i| Pair { a: i, b: i as f32 })
            .collect::<Vec<_>>(),
    );
    // Large enough for the staged pageable path.
    round_trip(&(0..(16u32 << 20) / 4).collect::<Vec<_>>());
});

gpu_test!(zeros_empty_and_zero_lengths, {
    let z = DeviceBuffer::<u64>::zeros(1000).unwrap();
    assert!(z.to_vec().unwrap().iter().all(|&x| x == 0));
    let e = DeviceBuffer::<f32>::empty(10).unwrap();
    assert_eq!((e.len(), e.to_vec().unwrap().len()), (10, 10));
    let none = DeviceBuffer::<f32>::zeros(0).unwrap();
    assert!(none.is_empty());
    assert!(none.to_vec().unwrap().is_empty());
    let mut none = DeviceBuffer::<u8>::from_slice(&[]).unwrap();
    none.fill(3).unwrap();
    none.copy_from_host(&[]).unwrap();
    let p = PinnedBuffer::<u32>::zeros(0).unwrap();
    assert!(p.as_slice().unwrap().is_empty());
    assert!(DeviceBuffer::<u64>::empty(usize::MAX / 2).is_err());
});

gpu_test!(views_slice_split_and_refuse_bad_ranges, {
    let data: Vec<u32> = (0..100).collect();
    let mut b = DeviceBuffer::from_slice(&data).unwrap();
    assert_eq!(b.slice(10..20).unwrap().to_vec().unwrap(), &data[10..20]);
    let (l, r) = b.split_at(30).unwrap();
    assert_eq!((l.len(), r.len()), (30, 70));
    assert_eq!(r.slice(..5).unwrap().to_vec().unwrap(), &data[30..35]);
    assert_eq!(r.device_ptr(), b.device_ptr() + 30 * 4);
    assert!(b.slice(90..101).is_err());
    assert!(b.split_at(101).is_err());
    {
        let (mut lo, mut hi) = b.split_at_mut(50).unwrap();
        lo.slice_mut(..10)
            .unwrap()
            .copy_from_host(&[7; 10])
            .unwrap();
        hi.copy_from(&lo).unwrap();
    }
    let v = b.to_vec().unwrap();
    assert_eq!(&v[..10], &[7; 10]);
    assert_eq!(&v[10..50], &data[10..50]);
    assert_eq!(&v[50..], &v[..50]);
    // A wrong length is refused, and nothing is written.
    let before = b.to_vec().unwrap();
    assert!(b.copy_from_host(&[1; 99]).is_err());
    assert!(b.slice_mut(..10).unwrap().copy_from_host(&[1; 11]).is_err());
    let mut short = vec![0u32; 99];
    assert!(b.copy_to_host(&mut short).is_err());
    assert_eq!(b.to_vec().unwrap(), before);
});

gpu_test!(fill_writes_every_element_of_any_width, {
    fn check<T: Pod + PartialEq + std::fmt::Debug>(v: T, len: usize) {
        let mut b = DeviceBuffer::<T>::zeros(len + 7).unwrap();
        b.slice_mut(3..3 + len).unwrap().fill(v).unwrap();
        let got = b.to_vec().unwrap();
        assert!(got[3..3 + len].iter().all(|x| *x == v), "{v:?}");
        let zero = DeviceBuffer::<T>::zeros(1).unwrap().to_vec().unwrap()[0];
        assert!(got[..3].iter().chain(&got[3 + len..]).all(|x| *x == zero));
    }
    check(0xabu8, 1000);
    check(0x1234u16, 1000);
    check(1.5f32, 1000);
    check(1.5f64, 1000);
    check(-3i64, 1);
    check([1u8, 2, 3], 1001);
    check(Pair { a: 9, b: -1.0 }, 4099);
    let mut b = DeviceBuffer::<u32>::zeros(10).unwrap();
    b.memset(0x01).unwrap();
    assert_eq!(b.to_vec().unwrap(), vec![0x0101_0101; 10]);
});

gpu_test!(device_copies_and_untyped_pointers, {
    let src = DeviceBuffer::from_slice(&pattern(4096, 3)).unwrap();
    let mut dst = DeviceBuffer::<u8>::zeros(4096).unwrap();
    src.copy_to(&mut dst).unwrap();
    assert_eq!(dst.to_vec().unwrap(), pattern(4096, 3));
    let mut small = DeviceBuffer::<u8>::zeros(10).unwrap();
    assert!(small.copy_from(&src).is_err());
    // Untyped memory, typed: room and alignment are checked.
    let m = cuda_rt::alloc(400).unwrap();
    // The pool rounds up: the room is what the pointer says it has.
    let room = m.size() / 4;
    assert!(DeviceBuffer::<u32>::from_pointer(m.clone(), room + 1).is_err());
    assert!(DeviceBuffer::<u32>::from_pointer(m.checked_add(2).unwrap(), 10).is_err());
    let t = DeviceBuffer::<u32>::from_pointer(m.clone(), room).unwrap();
    assert_eq!(t.device_ptr(), m.ptr());
    assert_eq!(
        src.slice(100..).unwrap().as_pointer().unwrap().ptr(),
        src.device_ptr() + 100
    );
});

gpu_test!(async_pinned_round_trip_on_two_streams, {
    let n = 1 << 20;
    let data: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let (s1, s2) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    let host_in = PinnedBuffer::from_slice(&data).unwrap();
    let mut host_out = PinnedBuffer::<f32>::zeros(n).unwrap();
    let mut dev = DeviceBuffer::<f32>::empty(n).unwrap();
    dev.copy_from_pinned_async(&host_in, &s1)
        .unwrap()
        .wait()
        .unwrap();
    let t = dev.copy_to_pinned_async(&mut host_out, &s2).unwrap();
    t.wait().unwrap();
    assert!(host_out.as_slice().unwrap() == &data[..]);
    // Mismatched lengths are refused before anything is queued.
    let mut short = PinnedBuffer::<f32>::zeros(n - 1).unwrap();
    assert!(dev.copy_to_pinned_async(&mut short, &s1).is_err());
});

gpu_test!(alone async_copies_return_at_once_and_wait_for_nothing, {
    let n = 4 << 20;
    let stream = Stream::non_blocking().unwrap();
    let host = PinnedBuffer::from_slice(&pattern(n, 4)).unwrap();
    let mut dev = DeviceBuffer::<u8>::zeros(n).unwrap();
    let mut back = PinnedBuffer::<u8>::zeros(n).unwrap();
    let mut gate = Gate::close(stream.as_raw());
    let t0 = Instant::now();
    let up = dev.copy_from_pinned_async(&host, &stream).unwrap();
    let down = dev.copy_to_pinned_async(&mut back, &stream).unwrap();
    let queued = t0.elapsed();
    assert!(
        queued < Duration::from_secs(1),
        "the copies waited: {queued:?}"
    );
    assert!(
        !up.is_done() && !down.is_done(),
        "the stream is held by the gate"
    );
    gate.open();
    up.wait().unwrap();
    down.wait().unwrap();
    assert!(back.as_slice().unwrap() == &pattern(n, 4)[..]);
    drop(gate);
});

gpu_test!(alone a_device_buffer_dropped_under_a_copy_is_not_reused, {
    let n = 1 << 20;
    let stream = Stream::non_blocking().unwrap();
    let dev = DeviceBuffer::from_slice(&pattern(n, 5)).unwrap();
    let addr = dev.device_ptr();
    let mut host = PinnedBuffer::<u8>::zeros(n).unwrap();
    let mut gate = Gate::close(stream.as_raw());
    let t = dev.copy_to_pinned_async(&mut host, &stream).unwrap();
    let in_flight = !t.is_done();
    drop(dev);
    // The copy's fence holds the device memory: the pool cannot hand it out (judged
    // only while the copy is behind the gate: compute-sanitizer can time it out).
    let others: Vec<_> = (0..4)
        .map(|i| DeviceBuffer::from_slice(&pattern(n, 10 + i)).unwrap())
        .collect();
    // Judged when the gate held the copy back through the allocations (it times out
    // after 5 s, e.g. while another test's cuMemFreeHost waits for the whole device).
    assert!(
        !(in_flight && gate.held()) || others.iter().all(|o| o.device_ptr() != addr),
        "memory under a copy was reused"
    );
    gate.open();
    t.wait().unwrap();
    assert!(
        host.as_slice().unwrap() == &pattern(n, 5)[..],
        "the copy read overwritten memory"
    );
    drop(gate);
});

gpu_test!(alone a_pinned_buffer_dropped_under_a_copy_is_not_reused, {
    let n = 1 << 20;
    let stream = Stream::non_blocking().unwrap();
    let host = PinnedBuffer::from_slice(&pattern(n, 6)).unwrap();
    let addr = host.host_ptr();
    let mut dev = DeviceBuffer::<u8>::zeros(n).unwrap();
    let mut gate = Gate::close(stream.as_raw());
    drop(dev.copy_from_pinned_async(&host, &stream).unwrap());
    // Under compute-sanitizer the gate's host function can time out before this line:
    // reuse is then legitimate, and only the data is judged.
    let in_flight = !host.is_idle();
    drop(host);
    let others: Vec<_> = (0..4)
        .map(|i| PinnedBuffer::from_slice(&pattern(n, 20 + i)).unwrap())
        .collect();
    // Judged when the gate held the copy back through the allocations (it times out
    // after 5 s, e.g. while another test's cuMemFreeHost waits for the whole device).
    if in_flight && gate.held() {
        assert!(
            others.iter().all(|o| o.host_ptr() != addr),
            "pinned memory under a copy was reused"
        );
    } else {
        eprintln!(
            "the copy could finish before the allocations (the gate timed out): reuse not judged"
        );
    }
    gate.open();
    stream.synchronize().unwrap();
    assert!(
        dev.to_vec().unwrap() == pattern(n, 6),
        "the copy read overwritten memory"
    );
    drop(gate);
});

gpu_test!(alone a_dropped_transfer_still_guards_the_views, {
    let n = 1 << 20;
    let stream = Stream::non_blocking().unwrap();
    let dev = DeviceBuffer::from_slice(&pattern(n, 7)).unwrap();
    let mut host = PinnedBuffer::<u8>::zeros(n).unwrap();
    let mut gate = Gate::close(stream.as_raw());
    // Dropped (`Transfer` has no drop code, so forgetting it is the same).
    drop(dev.copy_to_pinned_async(&mut host, &stream).unwrap());
    let opener = gate.opener();
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let _ = opener.send(());
    });
    // The view waits for the copy still writing the buffer.
    assert!(host.as_slice().unwrap() == &pattern(n, 7)[..]);
    assert!(host.is_idle());
    t.join().unwrap();
    gate.open();
    drop(gate);
});

gpu_test!(saxpy_on_typed_buffers, {
    if !common_kernel::nvrtc_or_skip("saxpy_on_typed_buffers") {
        return;
    }
    cuda_rt::device::set_device_id(0).unwrap();
    let k = RawKernel::new(common_kernel::SAXPY, "saxpy", &[]).unwrap();
    let n = 100_000;
    let x = DeviceBuffer::from_slice(&vec![1.0f32; n]).unwrap();
    let mut y = DeviceBuffer::from_slice(&vec![2.0f32; n]).unwrap();
    let (a, len) = (3.0f32, n as i32);
    let cfg = LaunchConfig::for_num_elems_with_block(n as u32, 256);
    // SAFETY: saxpy(float a, const float* x, float* y, int n): x and y hold n floats on
    // the current device; nothing else touches them before `to_vec` (same stream).
    unsafe { cuda_rt::launch!(k, &cfg, (a, &x, &mut y, len)).unwrap() };
    assert!(y.to_vec().unwrap().iter().all(|&v| v == 5.0));
    // Views pass the address of their first element.
    let mut tail = y.slice_mut(n - 10..).unwrap();
    let (one, ten) = (1.0f32, 10i32);
    // SAFETY: as above, on the last 10 elements of y (x's first 10 are read).
    unsafe { cuda_rt::launch!(k, &LaunchConfig::new(1, 32), (one, &x, &mut tail, ten)).unwrap() };
    let v = y.to_vec().unwrap();
    assert!(v[..n - 10].iter().all(|&e| e == 5.0) && v[n - 10..].iter().all(|&e| e == 6.0));
});

gpu_test!(synchronous_forms_are_complete_for_other_streams, {
    // A non-blocking stream does not wait for the legacy default stream: what it
    // reads right after a "synchronous" call must already be there.
    let n = 8 << 20;
    let s = Stream::non_blocking().unwrap();
    let mut host = PinnedBuffer::<u32>::zeros(n).unwrap();
    for round in 0..3u32 {
        let mut b = DeviceBuffer::<u32>::zeros(n).unwrap();
        b.fill(round + 7).unwrap();
        b.copy_to_pinned_async(&mut host, &s)
            .unwrap()
            .wait()
            .unwrap();
        assert!(host.as_slice().unwrap().iter().all(|&v| v == round + 7));
        let c = DeviceBuffer::from_slice(&[round; 1000]).unwrap();
        b.slice_mut(..1000).unwrap().copy_from(&c).unwrap();
        b.copy_to_pinned_async(&mut host, &s)
            .unwrap()
            .wait()
            .unwrap();
        assert!(host.as_slice().unwrap()[..1000].iter().all(|&v| v == round));
    }
});

gpu_test!(stream_ordered_forms_follow_their_stream, {
    let n = 1 << 20;
    let s = Stream::non_blocking().unwrap();
    let mut a = DeviceBuffer::<f64>::empty(n).unwrap();
    let mut b = DeviceBuffer::<f64>::empty(n).unwrap();
    let mut host = PinnedBuffer::<f64>::zeros(n).unwrap();
    a.fill_async(2.5, &s).unwrap();
    b.copy_from_async(&a, &s).unwrap();
    b.slice_mut(..10).unwrap().memset_async(0, &s).unwrap();
    b.copy_to_pinned_async(&mut host, &s)
        .unwrap()
        .wait()
        .unwrap();
    let v = host.as_slice().unwrap();
    assert!(v[..10].iter().all(|&x| x == 0.0) && v[10..].iter().all(|&x| x == 2.5));
});

gpu_test!(alone memory_under_a_kernel_is_not_handed_to_another_stream, {
    let k = kernels::Kernels::load();
    let n = 1 << 20;
    let (a, b) = (
        Stream::non_blocking().unwrap(),
        Stream::non_blocking().unwrap(),
    );
    let in_a = a.enter().unwrap();
    let x = DeviceBuffer::<f32>::zeros(n).unwrap();
    let x_addr = x.device_ptr();
    let mut gate = Gate::close(a.as_raw());
    // SAFETY: add_one(float* x, int n) on a: x holds n floats; it is dropped below
    // while the kernel is still queued, which is what this test checks is harmless:
    // x's memory goes back to a's arena, reused only by work ordered after the kernel.
    unsafe { kernels::add_one(&k, &a, x.device_ptr(), n) };
    drop(x);
    drop(in_a);
    // On stream b, the pool does not hand out memory a still uses.
    let _in_b = b.enter().unwrap();
    let others: Vec<_> = (0..4)
        .map(|i| DeviceBuffer::from_slice(&vec![i as f32 + 10.0; n]).unwrap())
        .collect();
    assert!(
        others.iter().all(|o| o.device_ptr() != x_addr),
        "memory under a queued kernel was handed to another stream"
    );
    gate.open();
    a.synchronize().unwrap();
    for (i, o) in others.iter().enumerate() {
        assert!(o.to_vec().unwrap().iter().all(|&v| v == i as f32 + 10.0));
    }
    drop(gate);
});

#[cfg(feature = "half")]
gpu_test!(half_crate_elements_round_trip, {
    let data: Vec<half::f16> = (0..1000).map(|i| half::f16::from_f32(i as f32)).collect();
    round_trip(&data);
    let data: Vec<half::bf16> = (0..1000).map(|i| half::bf16::from_f32(i as f32)).collect();
    round_trip(&data);
});

gpu_test!(
    alone on_stream_forms_follow_their_stream_and_leave_the_thread_state,
    {
        let stream = Stream::non_blocking().unwrap();
        let before = cuda_rt::stream::get_current_stream().handle();
        // Small (the driver's copy) and large (staged through pinned buffers) alike.
        for n in [4096usize, (3 << 20) + 5] {
            let src = pattern(n, 21);
            let mut b = DeviceBuffer::from_slice_on(&src, &stream).unwrap();
            assert!(
                b.to_vec_on(&stream).unwrap() == src,
                "round trip of {n} bytes"
            );
            // Work queued on `stream` behind a gate: the `_on` forms wait for it, whatever
            // the current stream is (the legacy default stream, not ordered with a
            // non-blocking one).
            let mut gate = Gate::close(stream.as_raw());
            b.as_mut_slice().fill_async(7, &stream).unwrap();
            let opener = gate.opener();
            let t = std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                let _ = opener.send(());
            });
            let got = b.to_vec_on(&stream).unwrap();
            t.join().unwrap();
            assert!(got.iter().all(|&x| x == 7), "to_vec_on ran before the fill");
            gate.open();
            drop(gate);
            let mut host = vec![0u8; n];
            b.copy_from_host_on(&src, &stream).unwrap();
            b.copy_to_host_on(&mut host, &stream).unwrap();
            assert!(host == src);
            b.fill_on(9, &stream).unwrap();
            assert!(b
                .as_slice()
                .to_vec_on(&stream)
                .unwrap()
                .iter()
                .all(|&x| x == 9));
            let z = DeviceBuffer::<u32>::zeros_on(n / 4, &stream).unwrap();
            assert!(z.to_vec_on(&stream).unwrap().iter().all(|&x| x == 0));
            assert_eq!(DeviceBuffer::<u8>::empty_on(n, &stream).unwrap().len(), n);
        }
        assert_eq!(
            cuda_rt::stream::get_current_stream().handle(),
            before,
            "an _on form changed the current stream"
        );
    }
);

#[test]
fn on_stream_forms_refuse_a_stream_of_another_device() {
    if !cuda_rt::testing::gpus_or_skip("on_stream_forms_refuse_a_stream_of_another_device", 2) {
        return;
    }
    cuda_rt::device::set_device_id(1).unwrap();
    let other = Stream::non_blocking().unwrap();
    cuda_rt::device::set_device_id(0).unwrap();
    let b = DeviceBuffer::from_slice(&[1u8, 2, 3]).unwrap();
    let e = b.to_vec_on(&other).unwrap_err();
    assert!(
        matches!(
            e,
            cuda_rt::Error::InvalidArgument {
                kind: cuda_rt::error::ArgumentKind::WrongDevice {
                    expected: 0,
                    found: 1
                },
                ..
            }
        ),
        "{e}"
    );
}
