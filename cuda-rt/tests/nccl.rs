//! NCCL: a single-rank communicator on GPU 0 with every collective checked against
//! host values (GPU tests skip without a GPU, fail under `CUDA_RT_REQUIRE_GPU=1`;
//! NCCL itself must then load too), communicators over all GPUs of the host (skip
//! below two GPUs, fail under `CUDA_RT_REQUIRE_MULTI_GPU=1`), and, on any machine,
//! the errors: NCCL missing, status names.

mod common;

use common::Gate;
use cuda_rt::buffer::DeviceBuffer;
use cuda_rt::cuda_sys::result::nccl::status_name;
use cuda_rt::memory::{Bf16, F16};
use cuda_rt::nccl::{self, group, Communicator, ReduceOp, UniqueId};
use cuda_rt::testing::gpus_or_skip;
use cuda_rt::{gpu_test, Error, Stream};

#[test]
fn nccl_status_names_are_nccls() {
    assert_eq!(status_name(0), "ncclSuccess");
    assert_eq!(status_name(4), "ncclInvalidArgument");
    assert_eq!(status_name(6), "ncclRemoteError");
    assert_eq!(status_name(99), "ncclUnknownResult");
}

#[test]
fn a_missing_nccl_is_a_load_error_naming_the_library() {
    if nccl::is_available() {
        eprintln!("NCCL is installed here: the missing-library path is not exercised");
        return;
    }
    let e = UniqueId::new().unwrap_err();
    assert!(matches!(e, Error::Load(_)), "{e}");
    let s = e.to_string();
    assert!(
        s.contains("libnccl.so.2") && s.contains("CUDA_RT_LIBNCCL"),
        "{s}"
    );
}

fn single_rank() -> Communicator {
    cuda_rt::device::set_device_id(0).unwrap();
    let id = UniqueId::new().expect("NCCL must load on the GPU machine");
    let c = Communicator::init_rank(1, &id, 0).unwrap();
    assert_eq!((c.rank(), c.size(), c.device_id()), (0, 1, 0));
    c
}

gpu_test!(single_rank_communicator_runs_every_collective, {
    let comm = single_rank();
    let s = Stream::new().unwrap();
    let host: Vec<f32> = (0..10_000).map(|i| i as f32 * 0.5).collect();
    let src = DeviceBuffer::from_slice(&host).unwrap();

    for op in [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Max,
        ReduceOp::Min,
        ReduceOp::Avg,
    ] {
        let mut dst = DeviceBuffer::<f32>::zeros(host.len()).unwrap();
        comm.all_reduce(src.as_slice(), dst.as_mut_slice(), op, &s)
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(dst.to_vec().unwrap(), host, "all_reduce {op:?} of one rank");
    }
    let mut inplace = DeviceBuffer::from_slice(&host).unwrap();
    comm.all_reduce_in_place(inplace.as_mut_slice(), ReduceOp::Sum, &s)
        .unwrap();

    let mut b = DeviceBuffer::<f32>::zeros(host.len()).unwrap();
    comm.broadcast(src.as_slice(), b.as_mut_slice(), 0, &s)
        .unwrap();
    let mut r = DeviceBuffer::<f32>::zeros(host.len()).unwrap();
    comm.reduce(src.as_slice(), r.as_mut_slice(), ReduceOp::Sum, 0, &s)
        .unwrap();
    let mut g = DeviceBuffer::<f32>::zeros(host.len()).unwrap();
    comm.all_gather(src.as_slice(), g.as_mut_slice(), &s)
        .unwrap();
    let mut rs = DeviceBuffer::<f32>::zeros(host.len()).unwrap();
    comm.reduce_scatter(src.as_slice(), rs.as_mut_slice(), ReduceOp::Sum, &s)
        .unwrap();
    // Send to and receive from itself: one group.
    let mut p2p = DeviceBuffer::<f32>::zeros(host.len()).unwrap();
    group(|| {
        comm.send(src.as_slice(), 0, &s)?;
        comm.recv(p2p.as_mut_slice(), 0, &s)
    })
    .unwrap();
    s.synchronize().unwrap();
    comm.async_error().unwrap();
    for (name, buf) in [
        ("in place", &inplace),
        ("broadcast", &b),
        ("reduce", &r),
        ("all_gather", &g),
        ("reduce_scatter", &rs),
        ("send/recv", &p2p),
    ] {
        assert_eq!(buf.to_vec().unwrap(), host, "{name}");
    }
    comm.destroy().unwrap();
});

// A collective captured into a graph: the graph keeps its communicator, so dropping
// the communicator first neither hangs (NCCL 2.26 and later wait in destroy for every
// graph that holds one of its collectives) nor frees it under the graph, which still
// runs; the communicator goes with the graph. `abort` is refused while a graph holds it.
gpu_test!(a_graph_with_a_captured_collective_keeps_its_communicator, {
    use cuda_rt::graph::CaptureMode;
    use cuda_rt::{StateKind, StreamCaptureExt};
    let capture = |comm: &Communicator, buf: &mut DeviceBuffer<f32>, s: &Stream| {
        s.begin_capture(CaptureMode::ThreadLocal).unwrap();
        comm.all_reduce_in_place(buf.as_mut_slice(), ReduceOp::Sum, s)
            .unwrap();
        s.end_capture().unwrap()
    };
    let host: Vec<f32> = (0..4096).map(|i| i as f32).collect();
    let mut buf = DeviceBuffer::from_slice(&host).unwrap();
    let s = Stream::non_blocking().unwrap();
    let comm = single_rank();
    let g = capture(&comm, &mut buf, &s);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(comm);
        let _ = tx.send(());
    });
    rx.recv_timeout(std::time::Duration::from_secs(30))
        .expect("dropping the communicator hung on the graph that holds its collective");
    g.launch(&s).unwrap();
    s.synchronize().unwrap();
    assert_eq!(
        buf.to_vec().unwrap(),
        host,
        "the graph's all-reduce of one rank"
    );
    drop(g);

    let comm = single_rank();
    let g = capture(&comm, &mut buf, &s);
    let e = comm.abort().unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidState {
                kind: StateKind::Shared { others: 1 },
                ..
            }
        ),
        "{e}"
    );
    g.launch(&s).unwrap();
    s.synchronize().unwrap();
    drop(g);
});

gpu_test!(single_rank_all_reduce_handles_every_element_type, {
    let comm = single_rank();
    let s = Stream::new().unwrap();
    fn check<T: nccl::NcclType + PartialEq + std::fmt::Debug>(
        comm: &Communicator,
        s: &Stream,
        v: Vec<T>,
    ) {
        let src = DeviceBuffer::from_slice(&v).unwrap();
        let mut dst = DeviceBuffer::<T>::zeros(v.len()).unwrap();
        comm.all_reduce(src.as_slice(), dst.as_mut_slice(), ReduceOp::Sum, s)
            .unwrap();
        s.synchronize().unwrap();
        assert_eq!(dst.to_vec().unwrap(), v, "{}", std::any::type_name::<T>());
    }
    check(
        &comm,
        &s,
        (0..100).map(|i| i as i8 - 50).collect::<Vec<i8>>(),
    );
    check(&comm, &s, (0..100u8).collect::<Vec<_>>());
    check(&comm, &s, (0..100).map(|i| -i).collect::<Vec<i32>>());
    check(&comm, &s, (0..100u32).collect::<Vec<_>>());
    check(
        &comm,
        &s,
        (0..100).map(|i| i64::MIN + i).collect::<Vec<i64>>(),
    );
    check(
        &comm,
        &s,
        (0..100).map(|i| u64::MAX - i).collect::<Vec<u64>>(),
    );
    check(
        &comm,
        &s,
        (0..100).map(|i| i as f64 / 3.0).collect::<Vec<_>>(),
    );
    check(
        &comm,
        &s,
        (0..100).map(|i| F16::from_f32(i as f32)).collect(),
    );
    check(
        &comm,
        &s,
        (0..100).map(|i| Bf16::from_f32(i as f32)).collect(),
    );
    check(
        &comm,
        &s,
        (0..100).map(|i| half::f16::from_f32(i as f32)).collect(),
    );
    check(
        &comm,
        &s,
        (0..100).map(|i| half::bf16::from_f32(i as f32)).collect(),
    );
});

gpu_test!(
    collectives_refuse_wrong_lengths_and_ranks_before_nccl_sees_them,
    {
        let comm = single_rank();
        let s = Stream::new().unwrap();
        let a = DeviceBuffer::<f32>::zeros(10).unwrap();
        let mut b = DeviceBuffer::<f32>::zeros(11).unwrap();
        let e = comm
            .all_reduce(a.as_slice(), b.as_mut_slice(), ReduceOp::Sum, &s)
            .unwrap_err();
        assert!(e.to_string().contains("11 elements, expected 10"), "{e}");
        let mut c = DeviceBuffer::<f32>::zeros(10).unwrap();
        let e = comm
            .broadcast(a.as_slice(), c.as_mut_slice(), 1, &s)
            .unwrap_err();
        assert!(e.to_string().contains("rank 1 is not a rank"), "{e}");
    }
);

#[test]
fn one_process_drives_every_gpu_of_the_host() {
    if !gpus_or_skip("one_process_drives_every_gpu_of_the_host", 2) {
        return;
    }
    let n = cuda_rt::device_count().unwrap();
    let devices: Vec<i32> = (0..n).collect();
    let comms = Communicator::init_all(&devices).unwrap();
    let len = 1 << 20;
    let mut bufs = Vec::new();
    let mut streams = Vec::new();
    for (i, c) in comms.iter().enumerate() {
        let _g = cuda_rt::Device::new(c.device_id())
            .unwrap()
            .enter()
            .unwrap();
        bufs.push(DeviceBuffer::from_slice(&vec![i as f32 + 1.0; len]).unwrap());
        streams.push(Stream::new().unwrap());
    }
    group(|| {
        for ((c, b), s) in comms.iter().zip(bufs.iter_mut()).zip(&streams) {
            c.all_reduce_in_place(b.as_mut_slice(), ReduceOp::Sum, s)?;
        }
        Ok(())
    })
    .unwrap();
    let want = (n * (n + 1) / 2) as f32;
    for (b, s) in bufs.iter().zip(&streams) {
        s.synchronize().unwrap();
        assert!(b.to_vec().unwrap().iter().all(|&x| x == want));
    }
}

// Ranks as processes, one per GPU, launched as torchrun launches them: this test binary
// runs itself again per rank with RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT set; each rank makes its communicator through the TCP bootstrap
// (`init_from_env`), all-reduces and checks. NCCL refuses two ranks on one GPU, so
// below two GPUs the test skips with its reason (fails under
// CUDA_RT_REQUIRE_MULTI_GPU=1).

const RANK_ENTRY: &str = "zz_nccl_rank_process_entry";
const RANK_VAR: &str = "CUDA_RT_NCCL_TEST_RANK";

gpu_test!(ranks_as_processes_all_reduce_through_the_bootstrap, {
    if !gpus_or_skip("ranks_as_processes_all_reduce_through_the_bootstrap", 2) {
        return;
    }
    let n = cuda_rt::device::device_count().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let ranks: Vec<_> = (0..n)
        .map(|r| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([RANK_ENTRY, "--exact", "--nocapture", "--test-threads=1"])
                .env(RANK_VAR, "1")
                .env("RANK", r.to_string())
                .env("LOCAL_RANK", r.to_string())
                .env("WORLD_SIZE", n.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env(nccl::bootstrap::TIMEOUT_VAR, "60")
                .output()
                .unwrap()
        })
        .collect();
    for (r, out) in ranks.iter().enumerate() {
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("rank ok"),
            "rank {r}:\n{text}"
        );
    }
});

/// Not a test of its own: one rank of
/// `ranks_as_processes_all_reduce_through_the_bootstrap`; does nothing unless
/// `CUDA_RT_NCCL_TEST_RANK` is set.
#[test]
fn zz_nccl_rank_process_entry() {
    if std::env::var_os(RANK_VAR).is_none() {
        return;
    }
    let comm = nccl::bootstrap::init_from_env().unwrap();
    let (rank, size) = (comm.rank(), comm.size());
    let s = Stream::non_blocking().unwrap();
    // Each rank holds rank + 1 in every element: the sum is size (size + 1) / 2.
    let mut b = DeviceBuffer::from_slice(&vec![(rank + 1) as f32; 1 << 20]).unwrap();
    comm.all_reduce_in_place(b.as_mut_slice(), ReduceOp::Sum, &s)
        .unwrap();
    s.synchronize().unwrap();
    let want = (size * (size + 1) / 2) as f32;
    assert!(b.to_vec().unwrap().iter().all(|&x| x == want));
    comm.destroy().unwrap();
    println!("rank ok");
}

// Issue 26, item 1: a collective queued on another stream (held behind a gate), then
// its receive buffer dropped: the pool must not hand the block out before the
// collective ran, and the new owners keep their own values. Inside a group, the
// buffer dropped before `group_end` (NCCL queues the work only there) is held until
// the group has launched.
gpu_test!(alone a_buffer_dropped_under_a_collective_is_not_reused, {
    let comm = single_rank();
    let side = Stream::non_blocking().unwrap();
    let n = 1 << 18;
    let src = DeviceBuffer::from_slice(&vec![7.0f32; n]).unwrap();
    for grouped in [false, true] {
        let mut dst = DeviceBuffer::<f32>::zeros(n).unwrap();
        let addr = dst.device_ptr();
        let mut gate = Gate::close(cuda_rt::AsStream::as_raw(&side));
        if grouped {
            group(|| {
                comm.all_reduce(src.as_slice(), dst.as_mut_slice(), ReduceOp::Sum, &side)?;
                drop(dst);
                Ok(())
            })
            .unwrap();
        } else {
            comm.all_reduce(src.as_slice(), dst.as_mut_slice(), ReduceOp::Sum, &side)
                .unwrap();
            drop(dst);
        }
        let others: Vec<DeviceBuffer<f32>> = (0..4)
            .map(|i| DeviceBuffer::from_slice(&vec![i as f32; n]).unwrap())
            .collect();
        let held = gate.held();
        assert!(
            !held || others.iter().all(|o| o.device_ptr() != addr),
            "grouped {grouped}: the receive buffer was handed out under the collective"
        );
        gate.open();
        side.synchronize().unwrap();
        for (i, o) in others.iter().enumerate() {
            assert!(
                o.to_vec().unwrap().iter().all(|&v| v == i as f32),
                "grouped {grouped}: the collective wrote the new owner {i}'s memory"
            );
        }
        drop(gate);
    }
});
