//! Streams and events: streams with flags and priorities, the current stream, events
//! that order work across streams (`wait_event`) and time it (`get_elapsed_time`), and
//! host callbacks in stream order (the spec's "Streams and Events").
//!
//! Run it with `cargo run -p cuda-rt-safe --example 05_streams_events`. Without a GPU it
//! prints why and exits 0.

use std::sync::mpsc;

use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::prelude::*;
use cuda_rt::{get_current_stream, get_elapsed_time, Device, Event, Stream};

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
    const N: usize = 16 << 20; // 64 MiB of u32
    let (_, greatest) = Device::current()?.stream_priority_range()?;
    let producer = Stream::non_blocking()?; // does not synchronise with the legacy stream
    let consumer = Stream::with_options(true, greatest)?; // its work is scheduled first
    println!(
        "streams {:#x} (priority {}) and {:#x} (priority {}, non-blocking: {})",
        producer.ptr(),
        producer.priority(),
        consumer.ptr(),
        consumer.priority(),
        consumer.is_non_blocking()
    );

    // Both are written whole below: `empty`, with no work on the legacy default stream
    // (which non-blocking streams do not wait for).
    let a = DeviceBuffer::<u32>::empty(N)?;
    let b = DeviceBuffer::<u32>::empty(N)?;
    let (pa, pb) = (a.as_pointer(), b.as_pointer());

    // Work on the producer, timed by two events recorded around it.
    let start = Event::new(false, false, false)?; // spinning, with timing, local
    start.record_on(&producer)?;
    pa.memset_u32_async(0x0102_0304, N, Some(&producer))?;
    let produced = producer.record(None)?; // a new event, recorded after the memset

    // The consumer waits for that event on the device (the host does not wait), then
    // copies what the producer wrote.
    consumer.wait_event(&produced)?;
    pb.copy_from_device_async(pa, N * 4, Some(&consumer))?;
    let end = consumer.record(None)?;

    // Host callbacks run on a driver thread, in stream order, once the work before
    // them is done. They must not call CUDA.
    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    consumer.launch_host_func(move || tx.send("host function").unwrap_or(()))?;
    consumer.add_callback(move |status| {
        let what = if status.is_ok() {
            "callback: ok"
        } else {
            "callback: failed"
        };
        tx2.send(what).unwrap_or(())
    })?;

    end.synchronize()?;
    let ms = get_elapsed_time(&start, &end)?;
    println!(
        "memset + copy of {} MiB across two streams: {ms:.3} ms",
        (N * 4) >> 20
    );
    assert!(ms >= 0.0 && end.query()?);
    consumer.synchronize()?;
    assert!(consumer.query()? && producer.done()?);
    let order: Vec<_> = rx.try_iter().collect();
    println!("in order: {order:?}");
    assert_eq!(order, ["host function", "callback: ok"]);
    let v = b.to_vec()?;
    assert!(
        v.iter().all(|&x| x == 0x0102_0304),
        "the copy ran before the memset"
    );

    // An event without timing is cheaper; asking for its time is an error that says so.
    let untimed = Event::new(true, true, false)?;
    untimed.record_on(&producer)?;
    untimed.synchronize()?;
    let e = get_elapsed_time(&start, &untimed).expect_err("timing is disabled");
    println!("elapsed time with an untimed event: {e}");

    // The current stream (per thread and device): the legacy default stream until a
    // scope or `use_stream` sets another; work without an explicit stream goes there.
    assert_eq!(get_current_stream().ptr(), Stream::null().ptr());
    {
        let _scope = consumer.enter()?;
        assert_eq!(get_current_stream().ptr(), consumer.ptr());
        let c = DeviceBuffer::from_slice(&[3u8; 100])?; // copied on `consumer`
        assert_eq!(c.to_vec()?, [3; 100]);
    }
    assert_eq!(get_current_stream().ptr(), Stream::null().ptr());
    assert_eq!(Stream::per_thread().ptr(), 2); // CUDA's per-thread default stream
    println!("ok");
    Ok(())
}
