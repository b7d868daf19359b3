//! The NCCL bootstrap's id exchange over TCP on the loopback address (no GPU, no NCCL
//! needed), ranks as threads and as processes launched like torchrun's: the exchange,
//! a rank 0 that never listens, a rank that never comes, and a rank of another job.

use std::net::TcpListener;
use std::thread;
use std::time::{Duration, Instant};

use cuda_rt::nccl::bootstrap::{self, Config};
use cuda_rt::{BootstrapKind, Error};

/// The tests of this file run one at a time: each picks a free port and lets it go
/// before a rank binds it, and a test whose rank keeps knocking on its own "free"
/// port (a rank 0 that never listens) reached another test's rank 0 when the system
/// handed that port out again (in the full GPU suite, 2 runs of 3).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let _serial = serial();
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
    let _serial = serial();
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
    let _serial = serial();
    let port = free_port();
    let came = thread::spawn(move || bootstrap::share_bytes(&cfg(2, 4, port, 8_000), None));
    let e = bootstrap::share_bytes(&cfg(0, 4, port, 3_000), Some(b"id")).unwrap_err();
    assert_eq!(kind(&e), Some(BootstrapKind::MissingRanks), "{e}");
    assert!(
        e.to_string().contains("rank(s) 1, 3 of 4 never came"),
        "{e}"
    );
    assert_eq!(came.join().unwrap().unwrap(), b"id");
}

#[test]
fn a_rank_of_another_job_size_is_refused_and_told_why() {
    let _serial = serial();
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
    let _serial = serial();
    let port = free_port();
    assert_eq!(
        bootstrap::share_bytes(&cfg(0, 1, port, 100), Some(b"solo")).unwrap(),
        b"solo"
    );
}

// Ranks as processes, launched the way torchrun or mpirun launch them: this test binary
// runs itself again with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set and only the
// rank entry below selected.

const RANK_ENTRY: &str = "zz_bootstrap_rank_process_entry";
const RANK_VAR: &str = "CUDA_RT_BOOTSTRAP_TEST_RANK";

/// Rank 0's payload in the process tests.
fn process_payload() -> Vec<u8> {
    (0..128u32).map(|i| (i * 13 + 1) as u8).collect()
}

fn spawn_rank(rank: u32, world: u32, port: u16, timeout_s: &str) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([RANK_ENTRY, "--exact", "--nocapture", "--test-threads=1"])
        .env(RANK_VAR, "1")
        .env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .env(bootstrap::TIMEOUT_VAR, timeout_s)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// A rank's exit status and what it printed.
fn finish(c: std::process::Child) -> (bool, String) {
    let out = c.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn ranks_as_processes_exchange_rank_zeros_bytes() {
    let _serial = serial();
    let port = free_port();
    let world = 4;
    // Rank 3 starts first and waits for rank 0; rank 0 comes last.
    let mut ranks: Vec<_> = (1..world)
        .rev()
        .map(|r| spawn_rank(r, world, port, "20"))
        .collect();
    thread::sleep(Duration::from_millis(300));
    ranks.push(spawn_rank(0, world, port, "20"));
    let want = format!("bytes {}", hex(&process_payload()));
    for c in ranks {
        let (ok, text) = finish(c);
        assert!(
            ok && text.contains(&want),
            "a rank failed or got other bytes:\n{text}"
        );
    }
}

#[test]
fn a_rank_process_that_never_comes_is_named_and_rank_zero_gives_up() {
    let _serial = serial();
    let port = free_port();
    let t = Instant::now();
    let r0 = spawn_rank(0, 3, port, "1.5");
    let r1 = spawn_rank(1, 3, port, "1.5");
    let (ok0, text0) = finish(r0);
    let _ = finish(r1);
    assert!(!ok0, "rank 0 succeeded without rank 2:\n{text0}");
    assert!(
        text0.contains("rank error:") && text0.contains('2'),
        "{text0}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "gave up after {:?}",
        t.elapsed()
    );
}

#[test]
fn a_rank_process_gives_up_when_rank_zero_never_comes() {
    let _serial = serial();
    let port = free_port();
    let t = Instant::now();
    let (ok, text) = finish(spawn_rank(1, 2, port, "1"));
    assert!(!ok, "rank 1 succeeded without rank 0:\n{text}");
    assert!(
        text.contains("rank error:") && text.contains("127.0.0.1"),
        "{text}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "gave up after {:?}",
        t.elapsed()
    );
}

/// Not a test of its own: one rank of the process tests above; does nothing unless
/// `CUDA_RT_BOOTSTRAP_TEST_RANK` is set. Prints `bytes <hex>` or `rank error: ...`
/// and exits non-zero on error.
#[test]
fn zz_bootstrap_rank_process_entry() {
    if std::env::var_os(RANK_VAR).is_none() {
        return;
    }
    let r = Config::from_env().and_then(|c| {
        let payload = process_payload();
        bootstrap::share_bytes(&c, (c.rank == 0).then_some(&payload[..]))
    });
    match r {
        Ok(b) => println!("bytes {}", hex(&b)),
        Err(e) => {
            println!("rank error: {e}");
            std::process::exit(3);
        }
    }
}
