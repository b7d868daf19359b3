//! Streams and events against the raw driver, measured in the same run.
//!
//! `cargo bench -p cuda-rt-safe --bench stream_event` prints one JSON object per line
//! (`name`, `value`, `unit`, `raw`, `raw_name`, `ratio` = value / raw, `target`,
//! `device`) and then a table (the shared reporter of `common`). Each figure is the
//! median over several repetitions of the mean time per operation over many
//! iterations, after a warm-up, with raw and cuda-rt interleaved in each repetition.
//! Without a GPU it prints why it skipped and exits 0.

use std::hint::black_box;
use std::time::Instant;

mod common;
use common::{interleaved, Figure, Report};

use cuda_rt::cuda_sys::driver as sys;
use cuda_rt::{AsStream, Device, Event, Stream};

const REPS: usize = 9;

/// Mean ns per operation of `f`, which runs `iters` operations.
fn per_op(iters: usize, f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_nanos() as f64 / iters as f64
}

fn check(rc: sys::CUresult, what: &str) {
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what}");
}

fn main() {
    if !common::gpu_or_skip("stream_event") {
        return;
    }
    if let Err(e) = run() {
        eprintln!("stream_event bench failed: {e}");
        std::process::exit(1);
    }
}

fn run() -> cuda_rt::Result<()> {
    let dev = Device::new(0)?;
    dev.use_device()?;
    let api = sys::api()?;
    let ev_create = api.cuEventCreate()?;
    let ev_destroy = api.cuEventDestroy_v2()?;
    let ev_record = api.cuEventRecord()?;
    let ev_query = api.cuEventQuery()?;
    let st_create = api.cuStreamCreate()?;
    let st_destroy = api.cuStreamDestroy_v2()?;
    let ctx_get = api.cuCtxGetCurrent()?;
    let ctx_push = api.cuCtxPushCurrent_v2()?;
    let ctx_pop = api.cuCtxPopCurrent_v2()?;
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING.0;
    let stream = Stream::non_blocking()?;
    let s_raw = stream.as_raw();
    let name = dev.name()?;
    let mut report = Report::new(format!(
        "streams and events on {name} (ns per operation, median of {REPS})"
    ));
    report.context("device", name);

    // Batches of the cache's size, so every cuda-rt create is served by the cache.
    const BATCH: usize = cuda_rt::event::EVENT_CACHE_CAPACITY;
    const BATCHES: usize = 200;
    let mut raw_evs: Vec<sys::CUevent> = Vec::with_capacity(BATCH);
    let mut our_evs: Vec<Event> = Vec::with_capacity(BATCH);

    // Event create, alone.
    let (o, r) = interleaved(
        REPS,
        || {
            let mut total = 0.0;
            for _ in 0..BATCHES {
                total += per_op(BATCH, || {
                    for _ in 0..BATCH {
                        our_evs.push(Event::new(false, true, false).expect("Event::new"));
                    }
                });
                our_evs.clear();
            }
            total / BATCHES as f64
        },
        || {
            let mut total = 0.0;
            for _ in 0..BATCHES {
                total += per_op(BATCH, || {
                    for _ in 0..BATCH {
                        let mut e = std::ptr::null_mut();
                        // SAFETY: `e` is a valid out pointer; device 0's context is current.
                        check(unsafe { ev_create(&mut e, flags) }, "cuEventCreate");
                        raw_evs.push(e);
                    }
                });
                for e in raw_evs.drain(..) {
                    // SAFETY: `e` was created above and is destroyed once.
                    check(unsafe { ev_destroy(e) }, "cuEventDestroy");
                }
            }
            total / BATCHES as f64
        },
    );
    report.push(Figure::new("event_create", o, "ns").raw(r, "cuEventCreate"));

    // Event destroy, alone.
    let (o, r) = interleaved(
        REPS,
        || {
            let mut total = 0.0;
            for _ in 0..BATCHES {
                for _ in 0..BATCH {
                    our_evs.push(Event::new(false, true, false).expect("Event::new"));
                }
                total += per_op(BATCH, || our_evs.clear());
            }
            total / BATCHES as f64
        },
        || {
            let mut total = 0.0;
            for _ in 0..BATCHES {
                for _ in 0..BATCH {
                    let mut e = std::ptr::null_mut();
                    // SAFETY: `e` is a valid out pointer; device 0's context is current.
                    check(unsafe { ev_create(&mut e, flags) }, "cuEventCreate");
                    raw_evs.push(e);
                }
                total += per_op(BATCH, || {
                    for e in raw_evs.drain(..) {
                        // SAFETY: `e` was created above and is destroyed once.
                        check(unsafe { ev_destroy(e) }, "cuEventDestroy");
                    }
                });
            }
            total / BATCHES as f64
        },
    );
    report.push(Figure::new("event_destroy", o, "ns").raw(r, "cuEventDestroy"));

    // Event create + destroy pair.
    const N: usize = 20_000;
    let (o, r) = interleaved(
        REPS,
        || {
            per_op(N, || {
                for _ in 0..N {
                    black_box(Event::new(false, true, false).expect("Event::new"));
                }
            })
        },
        || {
            per_op(N, || {
                for _ in 0..N {
                    let mut e = std::ptr::null_mut();
                    // SAFETY: `e` is a valid out pointer; device 0's context is current.
                    check(unsafe { ev_create(&mut e, flags) }, "cuEventCreate");
                    // SAFETY: `e` was just created and is destroyed once.
                    check(unsafe { ev_destroy(black_box(e)) }, "cuEventDestroy");
                }
            })
        },
    );
    report.push(
        Figure::new("event_create_destroy", o, "ns")
            .raw(r, "cuEventCreate+cuEventDestroy")
            .target("< 0.10"),
    );

    // Record, on the same idle stream, the same event.
    let ev = Event::new(false, true, false)?;
    let e_raw = ev.as_raw();
    let (o, r) = interleaved(
        REPS,
        || {
            per_op(N, || {
                for _ in 0..N {
                    ev.record_on(&stream).expect("record");
                }
            })
        },
        || {
            per_op(N, || {
                for _ in 0..N {
                    // SAFETY: `e_raw` and `s_raw` are live handles of one context.
                    check(unsafe { ev_record(e_raw, s_raw) }, "cuEventRecord");
                }
            })
        },
    );
    report.push(
        Figure::new("event_record", o, "ns")
            .raw(r, "cuEventRecord")
            .target("<= 1.05"),
    );

    // Query of a completed event.
    ev.synchronize()?;
    let (o, r) = interleaved(
        REPS,
        || {
            per_op(N, || {
                for _ in 0..N {
                    black_box(ev.query().expect("query"));
                }
            })
        },
        || {
            per_op(N, || {
                for _ in 0..N {
                    // SAFETY: `e_raw` is a live event.
                    black_box(unsafe { ev_query(e_raw) });
                }
            })
        },
    );
    report.push(
        Figure::new("event_query", o, "ns")
            .raw(r, "cuEventQuery")
            .target("<= 1.05"),
    );

    // Stream create + destroy.
    const NS: usize = 2_000;
    let (o, r) = interleaved(
        REPS,
        || {
            per_op(NS, || {
                for _ in 0..NS {
                    black_box(Stream::new().expect("Stream::new"));
                }
            })
        },
        || {
            per_op(NS, || {
                for _ in 0..NS {
                    let mut s = std::ptr::null_mut();
                    // SAFETY: `s` is a valid out pointer; device 0's context is current.
                    check(unsafe { st_create(&mut s, 0) }, "cuStreamCreate");
                    // SAFETY: `s` was just created and is destroyed once.
                    check(unsafe { st_destroy(black_box(s)) }, "cuStreamDestroy");
                }
            })
        },
    );
    report.push(
        Figure::new("stream_create_destroy", o, "ns")
            .raw(r, "cuStreamCreate+cuStreamDestroy")
            .target("<= 1.05"),
    );

    // Current-stream lookup: no driver call; paired with the cheapest driver query.
    const NL: usize = 1_000_000;
    let (o, r) = interleaved(
        REPS,
        || {
            per_op(NL, || {
                for _ in 0..NL {
                    black_box(cuda_rt::get_current_stream());
                }
            })
        },
        || {
            per_op(NL, || {
                for _ in 0..NL {
                    let mut c = std::ptr::null_mut();
                    // SAFETY: `c` is a valid out pointer.
                    check(unsafe { ctx_get(&mut c) }, "cuCtxGetCurrent");
                    black_box(c);
                }
            })
        },
    );
    report.push(
        Figure::new("current_stream_lookup", o, "ns")
            .raw(r, "cuCtxGetCurrent")
            .target("ns, no driver call"),
    );

    // Device scope enter + exit when the device is current: no driver call; paired with
    // the push/pop a naive scope would make.
    let ctx = dev.primary_context()?;
    let (o, r) = interleaved(
        REPS,
        || {
            per_op(NL, || {
                for _ in 0..NL {
                    let scope = dev.enter().expect("enter");
                    black_box(&scope);
                    drop(scope);
                }
            })
        },
        || {
            per_op(NL, || {
                for _ in 0..NL {
                    // SAFETY: `ctx` is device 0's retained primary context.
                    check(unsafe { ctx_push(ctx) }, "cuCtxPushCurrent");
                    let mut c = std::ptr::null_mut();
                    // SAFETY: `c` is a valid out pointer; a context was pushed above.
                    check(unsafe { ctx_pop(&mut c) }, "cuCtxPopCurrent");
                }
            })
        },
    );
    report.push(
        Figure::new("device_scope_enter_exit", o, "ns")
            .raw(r, "cuCtxPushCurrent+cuCtxPopCurrent")
            .target("ns, no driver call"),
    );
    drop(ev);
    drop(stream);

    report.finish();
    Ok(())
}
