//! The NCCL bootstrap's id exchange over TCP on the loopback address, ranks as
//! threads (no GPU, no NCCL needed): the exchange, a rank 0 that never listens, a rank
//! that never comes, and a rank of another job.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use cuda_rt::nccl::bootstrap::{self, Config};
use cuda_rt::{BootstrapKind, Error};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn cfg(rank: u32, world_size: u32, port: u16, timeout_ms: u64) -> Config {
    Config {
        rank,
        world_size,
        master_addr: "127.0.0.1".into(),
        master_port: port,
        timeout: Duration::from_millis(timeout_ms),
        retry_interval: Duration::from_millis(20),
    }
}

fn kind(e: &Error) -> Option<BootstrapKind> {
    match e {
        Error::Bootstrap { kind, .. } => Some(*kind),
        _ => None,
    }
}

#[test]
fn every_rank_gets_rank_zeros_bytes_even_when_it_starts_first() {
    let port = free_port();
    let payload: Vec<u8> = (0..128u32).map(|i| (i * 7) as u8).collect();
    let world = 5;
    // The other ranks start before rank 0 listens: they retry.
    let others: Vec<_> = (1..world)
        .map(|r| thread::spawn(move || bootstrap::share_bytes(&cfg(r, world, port, 10_000), None)))
        .collect();
    thread::sleep(Duration::from_millis(200));
    let p = payload.clone();
    let root =
        thread::spawn(move || bootstrap::share_bytes(&cfg(0, world, port, 10_000), Some(&p)));
    assert_eq!(root.join().unwrap().unwrap(), payload);
    for h in others {
        assert_eq!(h.join().unwrap().unwrap(), payload);
    }
}

#[test]
fn a_rank_gives_up_when_rank_zero_never_listens() {
    let port = free_port();
    let t = Instant::now();
    let e = bootstrap::share_bytes(&cfg(1, 2, port, 300), None).unwrap_err();
    assert_eq!(kind(&e), Some(BootstrapKind::Timeout), "{e}");
    let s = e.to_string();
    assert!(
        s.contains(&format!("127.0.0.1:{port}")) && s.contains("rank 1"),
        "{s}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
}

#[test]
fn rank_zero_names_the_ranks_that_never_came() {
    let port = free_port();
    let came = thread::spawn(move || bootstrap::share_bytes(&cfg(2, 4, port, 5_000), None));
    let e = bootstrap::share_bytes(&cfg(0, 4, port, 700), Some(b"id")).unwrap_err();
    assert_eq!(kind(&e), Some(BootstrapKind::MissingRanks), "{e}");
    assert!(
        e.to_string().contains("rank(s) 1, 3 of 4 never came"),
        "{e}"
    );
    assert_eq!(came.join().unwrap().unwrap(), b"id");
}

#[test]
fn a_rank_of_another_job_size_is_refused_and_told_why() {
    let port = free_port();
    let root = thread::spawn(move || bootstrap::share_bytes(&cfg(0, 2, port, 1_500), Some(b"x")));
    let e = bootstrap::share_bytes(&cfg(1, 3, port, 3_000), None).unwrap_err();
    assert_eq!(kind(&e), Some(BootstrapKind::Protocol), "{e}");
    assert!(e.to_string().contains("WORLD_SIZE=2"), "{e}");
    // Rank 0 still waits for its real rank 1, then gives up naming it.
    let e = root.join().unwrap().unwrap_err();
    assert_eq!(kind(&e), Some(BootstrapKind::MissingRanks), "{e}");
}

#[test]
fn a_single_rank_job_needs_no_network() {
    let port = free_port();
    assert_eq!(
        bootstrap::share_bytes(&cfg(0, 1, port, 100), Some(b"solo")).unwrap(),
        b"solo"
    );
}
