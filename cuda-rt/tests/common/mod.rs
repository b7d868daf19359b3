//! Helpers shared by the pinned-memory GPU tests: raw device buffers and raw copies,
//! so results are checked with the plain driver, not with the code under test.
#![allow(dead_code)]

use cuda_rt::cuda_sys::driver as sys;

/// `cuMemAlloc`'d device memory, freed on drop.
pub struct DevBuf {
    pub ptr: u64,
    pub len: usize,
}

pub fn check(rc: sys::CUresult, what: &str) {
    assert_eq!(rc, sys::CUresult::CUDA_SUCCESS, "{what}");
}

impl DevBuf {
    pub fn new(len: usize) -> DevBuf {
        // Makes the device's primary context current through the safe API.
        cuda_rt::device::set_device_id(0).unwrap();
        let api = sys::api().unwrap();
        let mut p: sys::CUdeviceptr = 0;
        // SAFETY: `p` is a valid out pointer; a context is current.
        check(
            unsafe { api.cuMemAlloc_v2().unwrap()(&mut p, len.max(1)) },
            "cuMemAlloc",
        );
        DevBuf { ptr: p, len }
    }

    /// Reads `len` bytes at `offset` with a raw `cuMemcpyDtoH`.
    pub fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut v = vec![0u8; len];
        if len == 0 {
            return v;
        }
        let api = sys::api().unwrap();
        // SAFETY: `v` holds `len` bytes; the device range is inside the allocation.
        check(
            unsafe {
                api.cuMemcpyDtoH_v2().unwrap()(v.as_mut_ptr().cast(), self.ptr + offset as u64, len)
            },
            "cuMemcpyDtoH",
        );
        v
    }

    /// Writes `data` at `offset` with a raw `cuMemcpyHtoD`.
    pub fn write(&self, offset: usize, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        let api = sys::api().unwrap();
        // SAFETY: `data` is valid for its length; the range is inside the allocation.
        check(
            unsafe {
                api.cuMemcpyHtoD_v2().unwrap()(
                    self.ptr + offset as u64,
                    data.as_ptr().cast(),
                    data.len(),
                )
            },
            "cuMemcpyHtoD",
        );
    }

    /// Sets every byte to `v` (`cuMemsetD8`).
    pub fn fill(&self, v: u8) {
        let api = sys::api().unwrap();
        // SAFETY: the range is the allocation.
        check(
            unsafe { api.cuMemsetD8_v2().unwrap()(self.ptr, v, self.len.max(1)) },
            "cuMemsetD8",
        );
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        if let Ok(api) = sys::api() {
            if let Ok(f) = api.cuMemFree_v2() {
                // SAFETY: allocated by cuMemAlloc, freed once.
                unsafe { f(self.ptr) };
            }
        }
    }
}

/// A deterministic byte pattern that differs at every offset of a chunk (so a
/// misplaced chunk or piece is caught).
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A gate that holds a stream at a host function until opened (or for 5 s, so that a
/// failing test cannot hang the device): work queued after it stays pending.
pub struct Gate {
    tx: Option<std::sync::mpsc::Sender<()>>,
    state: Box<GateState>,
}

/// What the host function reads: the receiver it waits on, and whether it gave up.
struct GateState {
    rx: std::sync::Mutex<std::sync::mpsc::Receiver<()>>,
    timed_out: std::sync::atomic::AtomicBool,
}

extern "C" fn gate_fn(p: *mut std::ffi::c_void) {
    // SAFETY: `p` points to the gate's boxed state, alive until the stream is
    // synchronized after the gate opens (Gate::drop waits for that).
    let state = unsafe { &*(p as *const GateState) };
    if let Ok(rx) = state.rx.lock() {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            rx.recv_timeout(std::time::Duration::from_secs(5))
        {
            state
                .timed_out
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
}

impl Gate {
    /// Enqueues the gate on `stream` (a raw handle).
    pub fn close(stream: sys::CUstream) -> Gate {
        let (tx, rx) = std::sync::mpsc::channel();
        let g = Gate {
            tx: Some(tx),
            state: Box::new(GateState {
                rx: std::sync::Mutex::new(rx),
                timed_out: std::sync::atomic::AtomicBool::new(false),
            }),
        };
        let api = sys::api().unwrap();
        let p = &*g.state as *const GateState as *mut std::ffi::c_void;
        // SAFETY: `p` stays valid until the host function has run (see gate_fn).
        check(
            unsafe { api.cuLaunchHostFunc().unwrap()(stream, Some(gate_fn), p) },
            "cuLaunchHostFunc",
        );
        g
    }

    /// Whether the gate has held its stream until now (not opened, not timed out):
    /// work queued after it has not run. A test judging "still in flight" asks this
    /// after its checks (another thread's call that waits for the whole device, such
    /// as `cuMemFreeHost`, can stall a test until the gate times out).
    #[allow(dead_code)]
    pub fn held(&self) -> bool {
        self.tx.is_some()
            && !self
                .state
                .timed_out
                .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Whether an in-flight judgement can be made: the gate still holds its stream.
    /// Under compute-sanitizer (the GPU runner sets `CUDA_RT_UNDER_SANITIZER=1`),
    /// which can make queued copies and launches wait for the stream, a gate that
    /// timed out says so once and returns `false` (the caller then checks only the
    /// results); anywhere else it fails the test, as a lost gate means work did not
    /// stay queued.
    #[allow(dead_code)]
    pub fn holds_or_sanitizer(&self, test: &str) -> bool {
        if self.held() {
            return true;
        }
        assert!(
            std::env::var_os("CUDA_RT_UNDER_SANITIZER").is_some_and(|v| v == "1"),
            "{test}: the gate no longer holds its stream"
        );
        eprintln!("{test}: the gate timed out under compute-sanitizer: in-flight case not judged");
        false
    }

    /// A sender that opens the gate from another thread.
    pub fn opener(&self) -> std::sync::mpsc::Sender<()> {
        match &self.tx {
            Some(tx) => tx.clone(),
            None => std::sync::mpsc::channel().0,
        }
    }

    /// Lets the stream go on.
    pub fn open(&mut self) {
        if let Some(tx) = self.tx.take() {
            let _ = tx.send(());
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
        // Wait for the whole device so the host function is done with `rx`.
        let api = sys::api().unwrap();
        // SAFETY: no pointers.
        unsafe { api.cuCtxSynchronize().unwrap()() };
    }
}
