//! Interprocess memory and events on one GPU with two processes: this test binary
//! runs itself again as the child (`CUDA_RT_IPC_CHILD` set, only the child entry test
//! selected). The parent allocates a plain allocation and a pointer in the middle of a
//! pool segment, writes patterns and exports both with an interprocess event; the
//! child opens them, checks the patterns, writes new ones on a stream and records the
//! event; the parent waits on the event and checks.
//!
//! GPU tests skip without a GPU; `CUDA_RT_REQUIRE_GPU=1` makes them fail instead.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use cuda_rt::event::IpcEventHandle;
use cuda_rt::ipc::IpcMemHandle;
use cuda_rt::memory::Memory;
use cuda_rt::{gpu_test, Event, MemoryPointer, Stream};

const CHILD_VAR: &str = "CUDA_RT_IPC_CHILD";
const CHILD_TEST: &str = "zz_ipc_child_process_entry";
const RECORDED: &str = "IPC_CHILD_RECORDED";

const PLAIN_WORDS: usize = 1 << 18;
const POOL_WORDS: usize = 3 << 16;

/// Kills a child process that is still running a minute after it was started, unless
/// dropped first: a hung child fails its test instead of hanging the suite.
struct Watchdog {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn new(what: &'static str, pid: u32) -> Watchdog {
        let (done, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            // Dropping the sender ends the wait early (Disconnected): only a timeout kills.
            if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(std::time::Duration::from_secs(60))
            {
                eprintln!("{what}: the child took over 60 s; killing it");
                let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            }
        });
        Watchdog {
            done: Some(done),
            thread: Some(thread),
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.done.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The first connection to `listener`, or a panic after `limit` (a child that never
/// connects).
fn accept_within(
    listener: &std::os::unix::net::UnixListener,
    limit: std::time::Duration,
) -> std::os::unix::net::UnixStream {
    listener.set_nonblocking(true).unwrap();
    let start = std::time::Instant::now();
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                return s;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(start.elapsed() < limit, "the child never connected");
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            Err(e) => panic!("accept: {e}"),
        }
    }
}

fn pattern(n: usize, seed: u32) -> Vec<u32> {
    (0..n as u32)
        .map(|i| i.wrapping_mul(0x9e37_79b9).wrapping_add(seed))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn read_words(p: &MemoryPointer, n: usize) -> Vec<u32> {
    let mut v = vec![0u32; n];
    p.copy_to_host(&mut v).unwrap();
    v
}

/// A pointer that starts in the middle of one of the pool's segments: a segment made
/// by a large request, given back, then split by two smaller requests.
fn pool_pointer_mid_segment(words: usize) -> (MemoryPointer, MemoryPointer) {
    let pool = cuda_rt::get_default_memory_pool();
    drop(pool.malloc(8 * words * 4).unwrap());
    let first = pool.malloc(words * 4).unwrap();
    let second = pool.malloc(words * 4).unwrap();
    (first, second)
}

gpu_test!(memory_and_events_are_shared_with_a_child_process, {
    cuda_rt::device::set_device_id(0).unwrap();
    // A plain allocation (cuMemAlloc), as its own memory object.
    let plain =
        MemoryPointer::from_memory(std::sync::Arc::new(Memory::new(PLAIN_WORDS * 4).unwrap()));
    plain.copy_from_host(&pattern(PLAIN_WORDS, 1)).unwrap();
    let plain_h = plain.ipc_handle().unwrap();
    assert_eq!(plain_h.offset(), 0);
    assert_eq!(plain_h.size(), (PLAIN_WORDS * 4) as u64);

    let (_first, pooled) = pool_pointer_mid_segment(POOL_WORDS);
    pooled.copy_from_host(&pattern(POOL_WORDS, 2)).unwrap();
    let pool_h = pooled.ipc_handle().unwrap();
    assert!(
        pool_h.offset() > 0,
        "the pooled pointer should lie inside a segment: {pool_h:?}"
    );
    assert!(pool_h.size() >= (POOL_WORDS * 4) as u64);

    let event = Event::new(false, true, true).unwrap();
    let event_h = event.ipc_handle().unwrap();

    let arg = format!(
        "{}:{}:{}",
        hex(&plain_h.to_bytes()),
        hex(&pool_h.to_bytes()),
        hex(event_h.as_bytes())
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([CHILD_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, arg)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    // A child that hangs fails the test after a minute instead of hanging the suite:
    // the watchdog kills it, which ends the reads below.
    let watchdog = Watchdog::new("ipc test", child.id());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut seen = String::new();
    let mut recorded = false;
    let mut line = String::new();
    while out.read_line(&mut line).unwrap() > 0 {
        seen.push_str(&line);
        // libtest prints "test <name> ... " before the child's own output, on its line.
        if line.trim_end().ends_with(RECORDED) {
            recorded = true;
            break;
        }
        line.clear();
    }
    assert!(
        recorded,
        "the child never recorded the event; it said:\n{seen}"
    );

    // The child's writes are ordered before its record: wait for it (polling, with a
    // deadline, so that an event that never completes fails the test), then check.
    let start = std::time::Instant::now();
    while !event.query().unwrap() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "the child's event did not complete in 30 s; the child said:\n{seen}"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    event.synchronize().unwrap();
    // And a stream of this process can wait on it too.
    let s = Stream::new().unwrap();
    {
        use cuda_rt::StreamEventExt;
        s.wait_event(&event).unwrap();
    }
    s.synchronize().unwrap();
    assert_eq!(read_words(&plain, PLAIN_WORDS), pattern(PLAIN_WORDS, 11));
    assert_eq!(read_words(&pooled, POOL_WORDS), pattern(POOL_WORDS, 12));
    // The first pooled block, beside the shared one, is untouched by the child.
    drop(child.stdin.take()); // lets the child exit
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut out, &mut rest);
    let status = child.wait().unwrap();
    drop(watchdog);
    assert!(status.success(), "child failed: {status}\n{seen}{rest}");
});

gpu_test!(a_handle_of_this_same_process_does_not_open, {
    cuda_rt::device::set_device_id(0).unwrap();
    let p = cuda_rt::get_default_memory_pool().malloc(4096).unwrap();
    let h = p.ipc_handle().unwrap();
    let e = h.open().unwrap_err();
    assert!(e.to_string().contains("cuIpcOpenMemHandle"), "{e}");
});

gpu_test!(the_null_pointer_has_no_ipc_handle, {
    let e = MemoryPointer::null(0).ipc_handle().unwrap_err();
    assert!(matches!(e, cuda_rt::Error::InvalidArgument { .. }), "{e}");
});

gpu_test!(stream_ordered_memory_has_no_legacy_ipc_handle, {
    cuda_rt::device::set_device_id(0).unwrap();
    let p = cuda_rt::malloc_async(1 << 16).unwrap();
    let e = p.ipc_handle().unwrap_err();
    assert!(
        matches!(
            e,
            cuda_rt::Error::NotSupported { .. } | cuda_rt::Error::Driver(_)
        ),
        "{e}"
    );
});

/// Not a test of its own: the child process's side of
/// `memory_and_events_are_shared_with_a_child_process`; does nothing unless
/// `CUDA_RT_IPC_CHILD` is set.
#[test]
fn zz_ipc_child_process_entry() {
    let Ok(arg) = std::env::var(CHILD_VAR) else {
        return;
    };
    let parts: Vec<&str> = arg.split(':').collect();
    assert_eq!(parts.len(), 3, "bad {CHILD_VAR}");
    cuda_rt::device::set_device_id(0).unwrap();
    let plain_h = IpcMemHandle::from_bytes(&unhex(parts[0])).unwrap();
    let pool_h = IpcMemHandle::from_bytes(&unhex(parts[1])).unwrap();
    let ev_bytes: [u8; 64] = unhex(parts[2]).try_into().unwrap();

    eprintln!("ipc child: opening the handles");
    let plain = plain_h.open().unwrap();
    let pooled = pool_h.open().unwrap();
    eprintln!("ipc child: opened; checking the patterns");
    assert_eq!(plain.size(), PLAIN_WORDS * 4);
    assert_eq!(pooled.size() as u64, pool_h.size());
    assert_eq!(read_words(&plain, PLAIN_WORDS), pattern(PLAIN_WORDS, 1));
    assert_eq!(read_words(&pooled, POOL_WORDS), pattern(POOL_WORDS, 2));

    let s = Stream::new().unwrap();
    let new_plain = pattern(PLAIN_WORDS, 11);
    let new_pool = pattern(POOL_WORDS, 12);
    plain.copy_from_host_async(&new_plain, Some(&s)).unwrap();
    pooled.copy_from_host_async(&new_pool, Some(&s)).unwrap();
    eprintln!("ipc child: copies queued; opening the event");
    let event = Event::from_ipc_handle(&IpcEventHandle::from_bytes(ev_bytes)).unwrap();
    event.record_on(&s).unwrap();
    println!("{RECORDED}");
    std::io::stdout().flush().unwrap();
    // Stay alive (and keep the mappings) until the parent has checked.
    let mut buf = String::new();
    let _ = std::io::stdin().read_line(&mut buf);
    s.synchronize().unwrap();
}

const POOL_CHILD_VAR: &str = "CUDA_RT_POOL_IPC_CHILD";
const POOL_CHILD_TEST: &str = "zz_pool_ipc_child_process_entry";

/// Runs the test `child_test` of this binary in a child process with `child_var` set
/// to a socket's path, sends it `pool`'s descriptor and `h` through the socket, and
/// waits for it: `true` when it exited cleanly after sending one byte back.
fn share_pool_with_child(
    child_test: &str,
    child_var: &str,
    pool: &cuda_rt::memory::MemoryAsyncPool,
    h: &cuda_rt::ipc::PoolPointerHandle,
) -> bool {
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixListener;
    let path = std::env::temp_dir().join(format!("cuda-rt-{child_test}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([child_test, "--exact", "--nocapture", "--test-threads=1"])
        .env(child_var, &path)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let watchdog = Watchdog::new("pool ipc test", child.id());
    let socket = accept_within(&listener, std::time::Duration::from_secs(60));
    cuda_rt::ipc::send_fd(&socket, pool.export_fd().unwrap().as_fd(), &h.to_bytes()).unwrap();
    // The child does its part, synchronises, and says so with one byte.
    let mut byte = [0u8; 1];
    let got = std::io::Read::read(&mut &socket, &mut byte).unwrap_or(0);
    let status = child.wait().unwrap();
    drop(watchdog);
    let _ = std::fs::remove_file(&path);
    eprintln!("{child_test}: child exited with {status}, sent {got} byte(s)");
    status.success() && got == 1
}

/// An exportable pool with one allocation of `POOL_WORDS` words holding pattern 3,
/// and the allocation's handle.
fn shared_pool_pointer() -> (
    cuda_rt::memory::MemoryAsyncPool,
    MemoryPointer,
    cuda_rt::ipc::PoolPointerHandle,
) {
    cuda_rt::device::set_device_id(0).unwrap();
    let pool = cuda_rt::memory::MemoryAsyncPool::create_shareable(0).unwrap();
    let p = pool.malloc(POOL_WORDS * 4).unwrap();
    p.copy_from_host(&pattern(POOL_WORDS, 3)).unwrap();
    cuda_rt::device::synchronize().unwrap();
    let h = cuda_rt::ipc::PoolPointerHandle::export(&p).unwrap();
    (pool, p, h)
}

gpu_test!(
    a_stream_ordered_pool_and_its_pointer_are_shared_with_a_child_process,
    {
        let (pool, p, h) = shared_pool_pointer();
        // An offset pointer is refused before the driver sees it.
        assert!(cuda_rt::ipc::PoolPointerHandle::export(&p.checked_add(256).unwrap()).is_err());
        assert!(
            share_pool_with_child(POOL_CHILD_TEST, POOL_CHILD_VAR, &pool, &h),
            "child failed"
        );
        assert_eq!(read_words(&p, POOL_WORDS), pattern(POOL_WORDS, 13));
    }
);

/// Not a test of its own: the child's side of
/// `a_stream_ordered_pool_and_its_pointer_are_shared_with_a_child_process`; does
/// nothing unless `CUDA_RT_POOL_IPC_CHILD` is set.
#[test]
fn zz_pool_ipc_child_process_entry() {
    use std::os::fd::AsFd;
    let Some(path) = std::env::var_os(POOL_CHILD_VAR) else {
        return;
    };
    cuda_rt::device::set_device_id(0).unwrap();
    let socket = std::os::unix::net::UnixStream::connect(path).unwrap();
    let (fd, bytes) = cuda_rt::ipc::recv_fd(&socket).unwrap();
    let pool = cuda_rt::memory::MemoryAsyncPool::import_fd(fd.as_fd(), 0).unwrap();
    let h = cuda_rt::ipc::PoolPointerHandle::from_bytes(&bytes).unwrap();
    let q = h.import(&pool).unwrap();
    assert_eq!(q.size(), POOL_WORDS * 4);
    assert_eq!(read_words(&q, POOL_WORDS), pattern(POOL_WORDS, 3));
    q.copy_from_host(&pattern(POOL_WORDS, 13)).unwrap();
    cuda_rt::device::synchronize().unwrap();
    drop(q); // freed here before the exporter frees the allocation
    std::io::Write::write_all(&mut &socket, &[1]).unwrap();
}

const IMPORTS_CHILD_VAR: &str = "CUDA_RT_POOL_IMPORTS_CHILD";
const IMPORTS_CHILD_TEST: &str = "zz_pool_imports_child_process_entry";

// Issue 26, item 7: the driver maps one allocation once per process, so two imports
// share a mapping; dropping one must not unmap the other's memory, and a handle whose
// size was forged (from_bytes) must not reach past the mapping. The child does it all
// and reports with its exit status.
gpu_test!(
    two_imports_of_one_pool_pointer_share_the_mapping_and_a_larger_size_is_refused,
    {
        let (pool, p, h) = shared_pool_pointer();
        assert!(
            share_pool_with_child(IMPORTS_CHILD_TEST, IMPORTS_CHILD_VAR, &pool, &h),
            "child failed (see its output above)"
        );
        // The exporter's allocation is untouched by the child's imports and frees.
        assert_eq!(read_words(&p, POOL_WORDS), pattern(POOL_WORDS, 3));
    }
);

/// Not a test of its own: the child's side of
/// `two_imports_of_one_pool_pointer_share_the_mapping_and_a_larger_size_is_refused`;
/// does nothing unless `CUDA_RT_POOL_IMPORTS_CHILD` is set.
#[test]
fn zz_pool_imports_child_process_entry() {
    use cuda_rt::ipc::PoolPointerHandle;
    use std::os::fd::AsFd;
    let Some(path) = std::env::var_os(IMPORTS_CHILD_VAR) else {
        return;
    };
    cuda_rt::device::set_device_id(0).unwrap();
    let socket = std::os::unix::net::UnixStream::connect(path).unwrap();
    let (fd, bytes) = cuda_rt::ipc::recv_fd(&socket).unwrap();
    let pool = cuda_rt::memory::MemoryAsyncPool::import_fd(fd.as_fd(), 0).unwrap();
    let h = PoolPointerHandle::from_bytes(&bytes).unwrap();

    let q = h.import(&pool).unwrap();
    let q2 = h.import(&pool).unwrap();
    eprintln!(
        "pool imports child: first import at {:#x}, second at {:#x}",
        q.ptr(),
        q2.ptr()
    );
    assert_eq!(read_words(&q2, POOL_WORDS), pattern(POOL_WORDS, 3));
    // Dropping one import leaves the other mapped (a read of an unmapped address is
    // an error, and a sticky one: the asserts below would fail).
    drop(q2);
    cuda_rt::device::synchronize().unwrap();
    assert_eq!(read_words(&q, POOL_WORDS), pattern(POOL_WORDS, 3));

    // A handle claiming far more than the allocation (1 TiB: no mapping is that
    // large) is refused, and undoing it leaves the live import mapped.
    let mut forged = bytes.clone();
    forged[64..].copy_from_slice(&(1u64 << 40).to_le_bytes());
    let e = PoolPointerHandle::from_bytes(&forged)
        .unwrap()
        .import(&pool)
        .unwrap_err();
    assert!(
        matches!(e, cuda_rt::Error::InvalidArgument { .. }) && e.to_string().contains("claims"),
        "{e}"
    );
    assert_eq!(read_words(&q, POOL_WORDS), pattern(POOL_WORDS, 3));

    // The last import gone, the mapping is freed; a new import maps it again.
    drop(q);
    let q3 = h.import(&pool).unwrap();
    assert_eq!(read_words(&q3, POOL_WORDS), pattern(POOL_WORDS, 3));
    drop(q3);
    cuda_rt::device::synchronize().unwrap();
    std::io::Write::write_all(&mut &socket, &[1]).unwrap();
}
