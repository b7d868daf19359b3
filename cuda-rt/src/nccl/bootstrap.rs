//! Getting a communicator's [`UniqueId`] to every rank of a job launched the way
//! `torchrun` and MPI launchers do: each process has `RANK`, `WORLD_SIZE`,
//! `MASTER_ADDR` and `MASTER_PORT`. Rank 0 makes the id and serves it over TCP on
//! `MASTER_PORT`; the others connect (retrying until rank 0 listens) and fetch it.
//! Everything is bounded: rank 0 waits for the others until a deadline and then names
//! the ranks that never came; the others give up at the same deadline, saying whom
//! they tried and what happened last. Nothing here needs a GPU or NCCL, except
//! [`init_from_env`], which also makes the communicator.
//!
//! The exchange itself moves plain bytes ([`share_bytes`]), so it serves any payload.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! // In each process of `torchrun --nproc-per-node=N prog` (or mpirun with the
//! // variables set):
//! let comm = cuda_rt::nccl::bootstrap::init_from_env()?;
//! println!("rank {} of {} on device {}", comm.rank(), comm.size(), comm.device_id());
//! # Ok(()) }
//! ```
//!
//! The wire format: the client sends `CUDARTB1`, its rank and the world size (both
//! `u32` little-endian); rank 0 answers a status byte (0: here it is; 1: refused, then
//! a `u32` length and a message) and the payload (`u32` length, then the bytes).

use std::collections::BTreeSet;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::{Communicator, UniqueId};
use crate::error::{BootstrapKind, Error, Result};

const MAGIC: &[u8; 8] = b"CUDARTB1";
/// The variable that sets the deadline, in seconds ([`Config::timeout`]).
pub const TIMEOUT_VAR: &str = "CUDA_RT_BOOTSTRAP_TIMEOUT";
/// The deadline when [`TIMEOUT_VAR`] is not set.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
const MAX_PAYLOAD: u32 = 1 << 20;

fn err(kind: BootstrapKind, message: impl Into<String>) -> Error {
    Error::Bootstrap {
        kind,
        message: message.into(),
    }
}

/// Where this process stands in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This process's rank, `0..world_size`.
    pub rank: u32,
    /// The number of ranks.
    pub world_size: u32,
    /// Rank 0's host name or address (`MASTER_ADDR`).
    pub master_addr: String,
    /// The port rank 0 listens on (`MASTER_PORT`).
    pub master_port: u16,
    /// How long rank 0 waits for the others, and the others try to reach rank 0.
    pub timeout: Duration,
    /// The pause between two attempts to reach rank 0.
    pub retry_interval: Duration,
}

impl Config {
    /// The settings from `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` and
    /// [`TIMEOUT_VAR`] (seconds, default [`DEFAULT_TIMEOUT`]).
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|k| std::env::var(k).ok())
    }

    /// The settings from `get` (a variable's value by name), as
    /// [`from_env`](Self::from_env) reads them.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Config> {
        fn need(get: &impl Fn(&str) -> Option<String>, k: &str) -> Result<String> {
            get(k).filter(|v| !v.trim().is_empty()).ok_or_else(|| {
                err(
                    BootstrapKind::Config,
                    format!(
                        "{k} is not set (the launcher sets RANK, WORLD_SIZE, MASTER_ADDR \
                         and MASTER_PORT for each process)"
                    ),
                )
            })
        }
        fn num<T: std::str::FromStr>(k: &str, v: &str) -> Result<T> {
            v.trim().parse().map_err(|_| {
                err(
                    BootstrapKind::Config,
                    format!("{k}={v:?} is not a valid number here"),
                )
            })
        }
        let rank: u32 = num("RANK", &need(&get, "RANK")?)?;
        let world_size: u32 = num("WORLD_SIZE", &need(&get, "WORLD_SIZE")?)?;
        let master_addr = need(&get, "MASTER_ADDR")?.trim().to_string();
        let master_port: u16 = num("MASTER_PORT", &need(&get, "MASTER_PORT")?)?;
        let timeout = match get(TIMEOUT_VAR) {
            Some(v) => Duration::try_from_secs_f64(num::<f64>(TIMEOUT_VAR, &v)?.max(0.0)).map_err(
                |_| {
                    err(
                        BootstrapKind::Config,
                        format!("{TIMEOUT_VAR}={v:?} is not a number of seconds a timer can hold"),
                    )
                },
            )?,
            None => DEFAULT_TIMEOUT,
        };
        let c = Config {
            rank,
            world_size,
            master_addr,
            master_port,
            timeout,
            retry_interval: Duration::from_millis(100),
        };
        c.check()?;
        Ok(c)
    }

    fn check(&self) -> Result<()> {
        if self.world_size == 0 || self.rank >= self.world_size {
            return Err(err(
                BootstrapKind::Config,
                format!(
                    "RANK={} does not fit WORLD_SIZE={} (ranks are 0..WORLD_SIZE)",
                    self.rank, self.world_size
                ),
            ));
        }
        Ok(())
    }

    fn endpoint(&self) -> String {
        format!("{}:{}", self.master_addr, self.master_port)
    }
}

/// Rank 0 sends `payload` to every other rank; the others receive it. Rank 0 passes
/// `Some(bytes)` and gets them back once every rank has fetched them (or the
/// deadline names those that did not); the others pass `None`.
pub fn share_bytes(cfg: &Config, payload: Option<&[u8]>) -> Result<Vec<u8>> {
    cfg.check()?;
    match (cfg.rank, payload) {
        (0, Some(p)) => {
            let listener = listen(cfg)?;
            serve(cfg, &listener, p)?;
            Ok(p.to_vec())
        }
        (0, None) => Err(err(
            BootstrapKind::Config,
            "rank 0 serves the payload: share_bytes needs Some(bytes) there",
        )),
        (_, _) => fetch(cfg),
    }
}

/// Binds rank 0's listening socket on all interfaces at `MASTER_PORT`.
pub fn listen(cfg: &Config) -> Result<TcpListener> {
    let addr = SocketAddr::from(([0, 0, 0, 0], cfg.master_port));
    TcpListener::bind(addr).map_err(|e| {
        err(
            BootstrapKind::Io,
            format!("rank 0 cannot listen on port {}: {e}", cfg.master_port),
        )
    })
}

/// Rank 0's side on an already bound `listener`: answers every other rank with
/// `payload`, until all have it or the deadline passes.
pub fn serve(cfg: &Config, listener: &TcpListener, payload: &[u8]) -> Result<()> {
    let deadline = deadline_after(cfg.timeout);
    let mut waiting: BTreeSet<u32> = (1..cfg.world_size).collect();
    listener
        .set_nonblocking(true)
        .map_err(|e| err(BootstrapKind::Io, format!("rank 0: {e}")))?;
    while !waiting.is_empty() {
        match listener.accept() {
            Ok((sock, _)) => {
                // A peer that misbehaves is dropped; the others still get served.
                if let Ok(r) = answer(cfg, sock, payload, deadline) {
                    waiting.remove(&r);
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    let missing: Vec<String> = waiting.iter().map(u32::to_string).collect();
                    return Err(err(
                        BootstrapKind::MissingRanks,
                        format!(
                            "rank 0 waited {:?} on port {} and rank(s) {} of {} never came",
                            cfg.timeout,
                            cfg.master_port,
                            missing.join(", "),
                            cfg.world_size
                        ),
                    ));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(err(BootstrapKind::Io, format!("rank 0: accept: {e}"))),
        }
    }
    Ok(())
}

fn answer(cfg: &Config, mut sock: TcpStream, payload: &[u8], deadline: Instant) -> Result<u32> {
    let io = |e: std::io::Error| err(BootstrapKind::Io, e.to_string());
    sock.set_nonblocking(false).map_err(io)?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(100));
    sock.set_read_timeout(Some(left.min(Duration::from_secs(10))))
        .map_err(io)?;
    sock.set_write_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    let mut hello = [0u8; 16];
    sock.read_exact(&mut hello).map_err(io)?;
    let rank = u32::from_le_bytes([hello[8], hello[9], hello[10], hello[11]]);
    let world = u32::from_le_bytes([hello[12], hello[13], hello[14], hello[15]]);
    let refuse = |mut sock: TcpStream, why: String| -> Result<u32> {
        let mut msg = vec![1u8];
        msg.extend_from_slice(&(why.len() as u32).to_le_bytes());
        msg.extend_from_slice(why.as_bytes());
        let _ = sock.write_all(&msg);
        Err(err(BootstrapKind::Protocol, why))
    };
    if &hello[..8] != MAGIC {
        return refuse(sock, "not a cuda-rt bootstrap client".into());
    }
    if world != cfg.world_size || rank == 0 || rank >= world {
        return refuse(
            sock,
            format!(
                "rank 0 runs a job of WORLD_SIZE={}, this process says RANK={rank} \
                 WORLD_SIZE={world}",
                cfg.world_size
            ),
        );
    }
    let mut msg = vec![0u8];
    msg.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    msg.extend_from_slice(payload);
    sock.write_all(&msg).map_err(io)?;
    Ok(rank)
}

/// The instant `timeout` from now; a timeout past what an `Instant` holds waits as good
/// as forever (a century) instead of overflowing.
fn deadline_after(timeout: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    let now = Instant::now();
    now.checked_add(timeout.min(CENTURY))
        .or_else(|| now.checked_add(Duration::from_secs(3600)))
        .unwrap_or(now)
}

/// A non-zero rank's side: connects to rank 0 (retrying until the deadline) and
/// fetches the payload.
pub fn fetch(cfg: &Config) -> Result<Vec<u8>> {
    let deadline = deadline_after(cfg.timeout);
    let endpoint = cfg.endpoint();
    let mut last;
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match fetch_once(cfg, &endpoint, deadline) {
            Ok(p) => return Ok(p),
            Err(Error::Bootstrap {
                kind: BootstrapKind::Protocol,
                message,
            }) => return Err(err(BootstrapKind::Protocol, message)),
            Err(e) => last = e.to_string(),
        }
        if Instant::now()
            .checked_add(cfg.retry_interval)
            .is_none_or(|t| t >= deadline)
        {
            return Err(err(
                BootstrapKind::Timeout,
                format!(
                    "rank {} could not get the id from rank 0 at {endpoint} within {:?} \
                     ({attempts} attempts); last: {last}",
                    cfg.rank, cfg.timeout
                ),
            ));
        }
        std::thread::sleep(cfg.retry_interval);
    }
}

fn fetch_once(cfg: &Config, endpoint: &str, deadline: Instant) -> Result<Vec<u8>> {
    let io = |e: std::io::Error| err(BootstrapKind::Io, format!("{endpoint}: {e}"));
    let addrs: Vec<SocketAddr> = endpoint.to_socket_addrs().map_err(io)?.collect();
    let left = || {
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10))
    };
    let mut sock = None;
    let mut last = None;
    for a in &addrs {
        match TcpStream::connect_timeout(a, left().min(Duration::from_secs(5))) {
            Ok(s) => {
                sock = Some(s);
                break;
            }
            Err(e) => last = Some(e),
        }
    }
    let mut sock = match (sock, last) {
        (Some(s), _) => s,
        (None, Some(e)) => return Err(io(e)),
        (None, None) => {
            return Err(err(
                BootstrapKind::Io,
                format!("{endpoint} resolves to no address"),
            ))
        }
    };
    sock.set_read_timeout(Some(left())).map_err(io)?;
    sock.set_write_timeout(Some(left())).map_err(io)?;
    let mut hello = Vec::with_capacity(16);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&cfg.rank.to_le_bytes());
    hello.extend_from_slice(&cfg.world_size.to_le_bytes());
    sock.write_all(&hello).map_err(io)?;
    let mut head = [0u8; 5];
    sock.read_exact(&mut head).map_err(io)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    if len > MAX_PAYLOAD {
        return Err(err(
            BootstrapKind::Protocol,
            format!("{endpoint} announced {len} bytes: not a cuda-rt bootstrap server"),
        ));
    }
    let mut body = vec![0u8; len as usize];
    sock.read_exact(&mut body).map_err(io)?;
    match head[0] {
        0 => Ok(body),
        1 => Err(err(
            BootstrapKind::Protocol,
            format!(
                "rank 0 at {endpoint} refused rank {}: {}",
                cfg.rank,
                String::from_utf8_lossy(&body)
            ),
        )),
        s => Err(err(
            BootstrapKind::Protocol,
            format!("{endpoint} answered status {s}: not a cuda-rt bootstrap server"),
        )),
    }
}

/// The communicator's id for this rank: rank 0 makes it ([`UniqueId::new`]) and
/// serves it, the others fetch it.
pub fn unique_id(cfg: &Config) -> Result<UniqueId> {
    let bytes = if cfg.rank == 0 {
        // Listen before making the id, so a port in use fails before NCCL is asked.
        let listener = listen(cfg)?;
        let id = UniqueId::new()?;
        serve(cfg, &listener, &id.to_bytes())?;
        id.to_bytes().to_vec()
    } else {
        fetch(cfg)?
    };
    let arr: [u8; 128] = bytes.as_slice().try_into().map_err(|_| {
        err(
            BootstrapKind::Protocol,
            format!("the id has {} bytes, expected 128", bytes.len()),
        )
    })?;
    Ok(UniqueId::from_bytes(arr))
}

/// A communicator for this process from `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and
/// `MASTER_PORT`: the id exchanged as [`unique_id`] does, on device `LOCAL_RANK` (or
/// `RANK` modulo the number of devices), which becomes this thread's current device.
pub fn init_from_env() -> Result<Communicator> {
    let cfg = Config::from_env()?;
    let count = crate::device::device_count()?;
    let device = match std::env::var("LOCAL_RANK").ok() {
        Some(v) => v.trim().parse::<i32>().map_err(|_| {
            err(
                BootstrapKind::Config,
                format!("LOCAL_RANK={v:?} is not a number"),
            )
        })?,
        None => (cfg.rank % count.max(1) as u32) as i32,
    };
    crate::Device::new(device)?.use_device()?;
    let id = unique_id(&cfg)?;
    Communicator::init_rank(cfg.world_size as i32, &id, cfg.rank as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(v: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| v.iter().find(|(n, _)| *n == k).map(|(_, x)| x.to_string())
    }

    #[test]
    fn config_reads_the_launcher_variables() {
        let c = Config::from_vars(vars(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "node0"),
            ("MASTER_PORT", "29500"),
            (TIMEOUT_VAR, "1.5"),
        ]))
        .unwrap();
        assert_eq!((c.rank, c.world_size, c.master_port), (2, 4, 29500));
        assert_eq!(c.master_addr, "node0");
        assert_eq!(c.timeout, Duration::from_millis(1500));
    }

    #[test]
    fn timeouts_past_what_a_timer_holds_are_errors_or_capped_not_panics() {
        let with = |t: &'static str| {
            Config::from_vars(vars(&[
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "29500"),
                (TIMEOUT_VAR, t),
            ]))
        };
        for t in ["inf", "1e300"] {
            let e = with(t).unwrap_err();
            assert!(e.to_string().contains(TIMEOUT_VAR), "{t}: {e}");
        }
        assert!(with("1e19").is_ok(), "fits a Duration");
        assert!(deadline_after(Duration::MAX) > Instant::now());
        // Nothing listens on the port: the first attempt fails at once, and a retry
        // interval past any instant ends the wait with a timeout, not an overflow.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let cfg = Config {
            rank: 1,
            world_size: 2,
            master_addr: "127.0.0.1".into(),
            master_port: port,
            timeout: Duration::MAX,
            retry_interval: Duration::MAX,
        };
        let e = fetch(&cfg).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Bootstrap {
                    kind: BootstrapKind::Timeout,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn config_names_what_is_missing_or_wrong() {
        let e = Config::from_vars(vars(&[("RANK", "0")])).unwrap_err();
        assert!(e.to_string().contains("WORLD_SIZE is not set"), "{e}");
        let e = Config::from_vars(vars(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "1"),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                Error::Bootstrap {
                    kind: BootstrapKind::Config,
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().contains("RANK=4 does not fit WORLD_SIZE=4"),
            "{e}"
        );
        let e = Config::from_vars(vars(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "x"),
            ("MASTER_PORT", "http"),
        ]))
        .unwrap_err();
        assert!(e.to_string().contains("MASTER_PORT=\"http\""), "{e}");
    }
}
