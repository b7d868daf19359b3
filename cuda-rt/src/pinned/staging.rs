//! Copies between pageable (ordinary) host memory and the device at pinned speed.
//!
//! A copy of at least [`PAGEABLE_THRESHOLD`] bytes goes through pinned staging
//! buffers from the default [`PinnedMemoryPool`](super::PinnedMemoryPool), in chunks
//! of up to [`CHUNK_SIZE`] bytes, [`STAGING_BUFFERS`] chunks in flight: while the DMA
//! engine moves one chunk, the host copies others between the pageable memory and
//! their staging buffers. A plan may ramp its chunks up at the start and down at the
//! end (see [`RAMP_START`]; the default does not). The host-side copies are split over a small pool of
//! persistent worker threads (created once, on first use; never one per copy), by
//! default `min(8, available_parallelism)`, see [`set_staging_threads`]. Smaller
//! copies use the driver directly (`cuMemcpyHtoDAsync`/`DtoHAsync` on the stream,
//! then a stream synchronize).
//!
//! Both directions are synchronous: they return once the bytes are at their
//! destination. They run on the given stream, so they follow the work queued on it.
//!
//! The safe forms take the device side as a [`MemoryPointer`], whose room is checked
//! before any CUDA call (more bytes than are left behind it is an error, and nothing
//! is copied). The forms that take a raw device address ([`copy_host_to_device_raw`],
//! [`copy_device_to_host_raw`]) are `unsafe`. On a stream that is capturing a graph
//! the copy fails: its synchronisation is refused by the driver, which invalidates
//! the capture, so no graph can come of it (a [`MemoryPointer`] host copy refuses a
//! capturing current stream before any CUDA call). While this thread captures in
//! global or thread-local mode, which refuse the wait on any stream, the copy is
//! refused before anything is queued: it could not wait for its work before giving the
//! host slice back. No capture takes part of a copy: should another thread begin one
//! on the stream while the copy runs, the copy fails and that capture is invalidated
//! (see `capture::enqueue_uncaptured`).

use std::collections::VecDeque;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::bytes;
use super::fence::{give_event, take_event};
use super::PinnedMemoryPointer;
use crate::capture::enqueue_uncaptured;
use crate::device::context;
use crate::error::{ArgumentKind, Error, Result};
use crate::memory::pointer::refuse_own_capture;
use crate::memory::MemoryPointer;
use crate::stream::AsStream;

/// Copies of fewer bytes than this use the driver's own copy; larger ones are staged.
pub const PAGEABLE_THRESHOLD: usize = 1 << 20;
/// Largest chunk staged at once (the default plan's).
pub const CHUNK_SIZE: usize = 8 << 20;
/// Chunks in flight (staging buffers per copy, the default plan's).
pub const STAGING_BUFFERS: usize = 4;
/// The first chunk of a large copy (the default plan's), 0 for none: with a ramp the
/// chunks grow from this to [`CHUNK_SIZE`] at the start and shrink back at the end,
/// so that the DMA engine starts (host to device) and the host finishes (device to
/// host) after a small chunk's host copy rather than a whole one's. Measured on the
/// H200 host (`benches/host_copies.rs`, 256 MiB), a 1 MiB ramp was slower both ways
/// (H2D 49.0 against 50.7 GB/s, D2H 52.3 against 53.1), so the default has none.
pub const RAMP_START: usize = 0;
/// Most staging buffers a plan may use (the size of a copy's slot arrays).
const MAX_BUFFERS: usize = 16;
/// Smallest chunk of a staged copy.
const MIN_CHUNK: usize = 256 << 10;
/// Smallest piece of host copy given to one worker.
const MIN_PIECE: usize = 64 << 10;
/// Pieces start on multiples of this (pages).
const PIECE_ALIGN: usize = 4096;
/// Most worker threads [`set_staging_threads`] accepts.
pub const MAX_STAGING_THREADS: usize = 64;

// ---------------------------------------------------------------------------------
// Planning (pure arithmetic, tested on the CPU)

/// How staged copies cut their bytes: the largest chunk, the buffers (chunks in
/// flight) and the first chunk of the ramp (0: no ramp). The defaults are
/// [`CHUNK_SIZE`], [`STAGING_BUFFERS`] and [`RAMP_START`]; the GPU bench
/// `host_copies` sweeps others through `cuda_rt::testing::set_staging_plan`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PlanShape {
    pub(crate) chunk: usize,
    pub(crate) buffers: usize,
    pub(crate) ramp: usize,
}

static SHAPE_CHUNK: AtomicUsize = AtomicUsize::new(CHUNK_SIZE);
static SHAPE_BUFFERS: AtomicUsize = AtomicUsize::new(STAGING_BUFFERS);
static SHAPE_RAMP: AtomicUsize = AtomicUsize::new(RAMP_START);

impl PlanShape {
    fn current() -> PlanShape {
        PlanShape {
            chunk: SHAPE_CHUNK.load(Ordering::Relaxed),
            buffers: SHAPE_BUFFERS.load(Ordering::Relaxed),
            ramp: SHAPE_RAMP.load(Ordering::Relaxed),
        }
    }
}

/// Sets the plan of later staged copies (for the benches that tune it): the chunk a
/// multiple of 4 KiB between 256 KiB and 256 MiB, 2 to 16 buffers, a ramp start of 0
/// or a multiple of 4 KiB below the chunk.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub(crate) fn set_plan_shape(shape: PlanShape) -> Result<()> {
    let PlanShape {
        chunk,
        buffers,
        ramp,
    } = shape;
    let chunk_ok = (MIN_CHUNK..=256 << 20).contains(&chunk) && chunk % PIECE_ALIGN == 0;
    let ramp_ok = ramp == 0 || (ramp % PIECE_ALIGN == 0 && ramp < chunk);
    if !chunk_ok || !(2..=MAX_BUFFERS).contains(&buffers) || !ramp_ok {
        return Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!("no such staging plan: {shape:?}"),
        ));
    }
    SHAPE_CHUNK.store(chunk, Ordering::Relaxed);
    SHAPE_BUFFERS.store(buffers, Ordering::Relaxed);
    SHAPE_RAMP.store(ramp, Ordering::Relaxed);
    Ok(())
}

/// Whether the workers fill the staging buffers of host-to-device copies with
/// streaming (non-temporal) stores: those buffers are read next by the DMA engine,
/// not by a CPU, so their lines need not be read into the cache first (see
/// `bytes::copy_raw_streaming`).
/// Off: on the H100 hosts (`benches/host_copies.rs`, both ways alternated rep by rep)
/// it was no faster (44.75 against 45.29 GB/s, 35.95 against 44.64), likely because a
/// staging buffer filled with plain stores is still in the cache when the DMA engine
/// reads it.
static STREAM_H2D: AtomicBool = AtomicBool::new(false);
/// The same for the pageable destinations of device-to-host copies of at least
/// [`STREAM_D2H_MIN`] bytes. On: a plain store reads each destination line first, and
/// a destination that large is out of the cache by the time the caller reads it. On
/// the H100 hosts, 256 MiB: 53.24 against 51.82 and 52.80 against 44.64 GB/s with the
/// default 8 staging threads, 52.33 against 33.74 and 48.41 against 25.82 with 4.
static STREAM_D2H: AtomicBool = AtomicBool::new(true);
/// The smallest device-to-host copy whose destination is written with streaming
/// stores: a smaller one may still be in the cache when the caller reads it.
pub const STREAM_D2H_MIN: usize = 32 << 20;

/// Sets which directions of later staged copies write with streaming stores (for the
/// bench that compares them).
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub(crate) fn set_streaming_stores(h2d: bool, d2h: bool) {
    STREAM_H2D.store(h2d, Ordering::Relaxed);
    STREAM_D2H.store(d2h, Ordering::Relaxed);
}

/// Which directions of staged copies write with streaming stores now: `(h2d, d2h)`.
#[cfg_attr(not(feature = "test-util"), allow(dead_code))]
pub(crate) fn streaming_stores() -> (bool, bool) {
    (
        STREAM_H2D.load(Ordering::Relaxed),
        STREAM_D2H.load(Ordering::Relaxed),
    )
}

/// The chunk size for a staged copy of `len` bytes: `shape.chunk` for large copies;
/// for smaller ones about `len / shape.buffers` (page-rounded, at least 256 KiB) so
/// that several chunks still overlap.
pub(crate) fn chunk_size_for(len: usize, shape: PlanShape) -> usize {
    let per = len
        .div_ceil(shape.buffers.max(1))
        .next_multiple_of(PIECE_ALIGN);
    per.clamp(MIN_CHUNK, shape.chunk.max(MIN_CHUNK))
}

/// The chunks of a staged copy of `len` bytes, each at most `chunk_size_for(len,
/// shape)`: with a ramp, doubling from `shape.ramp` at the start and halving back to
/// it at the end, as long as the middle keeps at least half the bytes.
pub(crate) fn plan_chunks(len: usize, shape: PlanShape) -> Vec<(usize, usize)> {
    let max = chunk_size_for(len, shape);
    let mut ramp = Vec::new();
    let (mut left, mut s) = (len, shape.ramp);
    while s != 0 && s < max && left >= 4 * s {
        ramp.push(s);
        left -= 2 * s;
        s *= 2;
    }
    let mut out = Vec::with_capacity(2 * ramp.len() + left.div_ceil(max));
    let mut pos = 0;
    for &l in ramp.iter().chain(std::iter::once(&0)) {
        if l == 0 {
            // The middle in equal chunks (no short one among the large).
            let piece = left
                .div_ceil(left.div_ceil(max).max(1))
                .next_multiple_of(PIECE_ALIGN)
                .min(max);
            out.extend(chunks(left, piece).map(|(st, l)| (pos + st, l)));
            pos += left;
        } else {
            out.push((pos, l));
            pos += l;
        }
    }
    for &l in ramp.iter().rev() {
        out.push((pos, l));
        pos += l;
    }
    out
}

/// Splits `len` bytes into at most `threads` pieces of at least 64 KiB, starting on
/// page multiples: the piece size.
pub(crate) fn piece_size_for(len: usize, threads: usize) -> usize {
    len.div_ceil(threads.max(1))
        .next_multiple_of(PIECE_ALIGN)
        .max(MIN_PIECE)
}

/// `(start, len)` of each chunk of a `len`-byte copy in chunks of `chunk`.
pub(crate) fn chunks(len: usize, chunk: usize) -> impl Iterator<Item = (usize, usize)> {
    let chunk = chunk.max(1);
    (0..len.div_ceil(chunk)).map(move |i| {
        let start = i * chunk;
        (start, chunk.min(len - start))
    })
}

// ---------------------------------------------------------------------------------
// The worker pool

/// One host copy for a worker: raw addresses, kept valid by the caller until the
/// latch says the piece is done.
struct Job {
    dst: usize,
    src: usize,
    len: usize,
    slot: usize,
    latch: Arc<Latch>,
    streaming: bool,
}

/// Counts the pieces still to copy, per staging slot.
struct Latch {
    remaining: Mutex<[usize; MAX_BUFFERS]>,
    cv: Condvar,
}

impl Latch {
    fn new() -> Self {
        Latch {
            remaining: Mutex::new([0; MAX_BUFFERS]),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, [usize; MAX_BUFFERS]> {
        self.remaining
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn done(&self, slot: usize) {
        let mut r = self.lock();
        r[slot] -= 1;
        if r[slot] == 0 {
            self.cv.notify_all();
        }
    }

    /// Waits until `slot`'s pieces are all copied.
    fn wait(&self, slot: usize) {
        let mut r = self.lock();
        while r[slot] != 0 {
            r = self.cv.wait(r).unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Waits until every piece is copied.
    fn wait_all(&self) {
        let mut r = self.lock();
        while r.iter().any(|&n| n != 0) {
            r = self.cv.wait(r).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

struct Queue {
    jobs: VecDeque<Job>,
    /// Threads wanted.
    target: usize,
    /// Threads running.
    live: usize,
}

struct Workers {
    queue: Mutex<Queue>,
    cv: Condvar,
    /// Jobs queued, readable without the lock (workers spin on it briefly).
    queued: AtomicUsize,
}

static WORKERS: OnceLock<Workers> = OnceLock::new();

/// One piece of a staged copy, with streaming stores or plain ones.
fn copy(dst: usize, src: usize, len: usize, streaming: bool) {
    if streaming {
        bytes::copy_raw_streaming(dst, src, len);
    } else {
        bytes::copy_raw(dst, src, len);
    }
}

fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 8)
}

fn workers() -> &'static Workers {
    // Threads start on the first copy (`ensure_started`), not here: the pool is not
    // 'static yet.
    WORKERS.get_or_init(Workers::new)
}

impl Job {
    /// Makes the copy and tells its latch.
    fn make(self) {
        copy(self.dst, self.src, self.len, self.streaming);
        self.latch.done(self.slot);
    }
}

impl Workers {
    /// No thread, nothing queued.
    fn new() -> Self {
        Workers {
            queue: Mutex::new(Queue {
                jobs: VecDeque::with_capacity(256),
                target: 0,
                live: 0,
            }),
            cv: Condvar::new(),
            queued: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts the worker threads on first use.
    fn ensure_started(&'static self) {
        self.resize(None);
    }

    /// Sets the number of workers (`None`: the default, only if never set), spawning
    /// or retiring threads; returns how many run.
    fn resize(&'static self, n: Option<usize>) -> usize {
        self.resize_with(n, |i| {
            std::thread::Builder::new()
                .name(format!("cuda-rt-staging-{i}"))
                .spawn(move || self.run())
                .map(drop)
        })
    }

    /// `resize`, starting worker `i` with `spawn(i)`.
    fn resize_with(
        &'static self,
        n: Option<usize>,
        spawn: impl Fn(usize) -> std::io::Result<()>,
    ) -> usize {
        let to_spawn = {
            let mut q = self.lock();
            match n {
                Some(n) => q.target = n,
                None if q.target != 0 => return q.target,
                None => q.target = default_threads(),
            }
            let s = q.target.saturating_sub(q.live);
            q.live += s;
            s
        };
        self.cv.notify_all();
        let mut failed = 0;
        for i in 0..to_spawn {
            if spawn(i).is_err() {
                failed += 1;
            }
        }
        let mut q = self.lock();
        q.live -= failed;
        if failed != 0 {
            q.target = q.live;
        }
        // Copies submitted while the failed threads were counted as live may wait in
        // the queue; with no worker left to take them, this thread does.
        while q.live == 0 {
            let Some(job) = q.jobs.pop_front() else { break };
            self.queued.fetch_sub(1, Ordering::AcqRel);
            drop(q);
            job.make();
            q = self.lock();
        }
        q.target
    }

    fn threads(&self) -> usize {
        self.lock().target
    }

    fn run(&self) {
        loop {
            // Spin a little before sleeping: during a copy the next pieces come
            // within microseconds, sooner than a futex wake.
            for _ in 0..2000 {
                if self.queued.load(Ordering::Acquire) != 0 {
                    break;
                }
                std::hint::spin_loop();
            }
            let job = {
                let mut q = self.lock();
                loop {
                    if q.live > q.target {
                        q.live -= 1;
                        return;
                    }
                    if let Some(j) = q.jobs.pop_front() {
                        self.queued.fetch_sub(1, Ordering::AcqRel);
                        break j;
                    }
                    q = self.cv.wait(q).unwrap_or_else(PoisonError::into_inner);
                }
            };
            job.make();
        }
    }

    /// Queues the copy of `len` bytes from `src` to `dst` in pieces under `slot`,
    /// with streaming stores if `streaming`. With no worker running (spawning
    /// failed), copies on the calling thread.
    fn submit(
        &self,
        latch: &Arc<Latch>,
        slot: usize,
        (dst, src, len): (usize, usize, usize),
        streaming: bool,
    ) {
        let mut q = self.lock();
        if q.live == 0 {
            drop(q);
            copy(dst, src, len, streaming);
            return;
        }
        let piece = piece_size_for(len, q.target);
        let n = len.div_ceil(piece);
        latch.lock()[slot] += n;
        for (start, l) in chunks(len, piece) {
            q.jobs.push_back(Job {
                dst: dst + start,
                src: src + start,
                len: l,
                slot,
                latch: latch.clone(),
                streaming,
            });
        }
        self.queued.fetch_add(n, Ordering::AcqRel);
        drop(q);
        if n == 1 {
            self.cv.notify_one();
        } else {
            self.cv.notify_all();
        }
    }
}

/// Sets the number of staging worker threads (1 to [`MAX_STAGING_THREADS`]); threads
/// are spawned now, or retire as soon as they are idle. Returns the new number
/// (fewer than `n` if spawning failed).
pub fn set_staging_threads(n: usize) -> Result<usize> {
    if n == 0 || n > MAX_STAGING_THREADS {
        return Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!("staging threads must be between 1 and {MAX_STAGING_THREADS}, got {n}"),
        ));
    }
    Ok(workers().resize(Some(n)))
}

/// The number of staging worker threads (the default, `min(8, available
/// parallelism)`, until set; 0 before first use).
pub fn staging_threads() -> usize {
    match WORKERS.get() {
        Some(w) => w.threads(),
        None => 0,
    }
}

/// Waits for every queued piece of a copy when the copy ends, early return or not:
/// the pieces point into borrowed memory. `stream` is the stream of the copy, which
/// the copy function borrows for longer than the drain lives.
struct Drain<'a> {
    latch: &'a Latch,
    stream: Option<sys::CUstream>,
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.latch.wait_all();
        if let Some(s) = self.stream {
            // On an error path: the DMAs issued must be over before the staging
            // buffers go back to the pool.
            // SAFETY: the copy's stream, live while the copy function borrows it, which
            // is longer than this drain lives.
            let _ = unsafe { crate::stream::drain(s) };
        }
    }
}

/// Copies `src` into `dst` (the same length) with the staging worker threads.
pub fn parallel_memcpy(dst: &mut [u8], src: &[u8]) -> Result<()> {
    if dst.len() != src.len() {
        return Err(Error::invalid_argument(
            ArgumentKind::LengthMismatch {
                expected: dst.len() as u64,
                found: src.len() as u64,
            },
            format!(
                "parallel_memcpy: destination has {} bytes, source {}",
                dst.len(),
                src.len()
            ),
        ));
    }
    if src.is_empty() {
        return Ok(());
    }
    let w = workers();
    w.ensure_started();
    let latch = Arc::new(Latch::new());
    let _drain = Drain {
        latch: &latch,
        stream: None,
    };
    let piece = (dst.as_mut_ptr() as usize, src.as_ptr() as usize, src.len());
    w.submit(&latch, 0, piece, false);
    Ok(())
}

// ---------------------------------------------------------------------------------
// The staged copies

/// Events, one per staging slot, given back to the cache at the end.
struct SlotEvents {
    device: i32,
    events: [usize; MAX_BUFFERS],
    n: usize,
}

impl SlotEvents {
    fn new(device: i32, n: usize) -> Result<Self> {
        let mut s = SlotEvents {
            device,
            events: [0; MAX_BUFFERS],
            n: 0,
        };
        while s.n < n {
            s.events[s.n] = take_event(device)?;
            s.n += 1;
        }
        Ok(s)
    }
}

impl Drop for SlotEvents {
    fn drop(&mut self) {
        for &e in &self.events[..self.n] {
            give_event(self.device, e);
        }
    }
}

/// Staging buffers from the default pinned pool.
fn staging_buffers(n: usize, chunk: usize) -> Result<Vec<PinnedMemoryPointer>> {
    let pool = super::default_pinned_memory_pool();
    (0..n).map(|_| pool.malloc(chunk)).collect()
}

/// One staged copy of `len` bytes on a device: its chunks, `k` pinned buffers with
/// an event each, the started workers and the latch of their jobs.
struct Plan {
    chunks: Vec<(usize, usize)>,
    k: usize,
    bufs: Vec<PinnedMemoryPointer>,
    events: SlotEvents,
    workers: &'static Workers,
    latch: Arc<Latch>,
}

impl Plan {
    fn new(len: usize, device: i32) -> Result<Plan> {
        let shape = PlanShape::current();
        let chunks = plan_chunks(len, shape);
        let k = chunks.len().min(shape.buffers).min(MAX_BUFFERS);
        let bufs = staging_buffers(k, chunk_size_for(len, shape))?;
        let events = SlotEvents::new(device, k)?;
        let workers = workers();
        workers.ensure_started();
        Ok(Plan {
            chunks,
            k,
            bufs,
            events,
            workers,
            latch: Arc::new(Latch::new()),
        })
    }

    /// Waits, when dropped, for the jobs and (unless disarmed) for `stream`, so the
    /// buffers outlive every copy that uses them, also on an error path.
    fn drain(&self, stream: sys::CUstream) -> Drain<'_> {
        Drain {
            latch: &self.latch,
            stream: Some(stream),
        }
    }
}

/// Copies all of `src` to the device memory at `dst` on `stream`; returns when the
/// bytes are on the device. More bytes than the room left behind `dst`
/// ([`MemoryPointer::size`]) is an error, and nothing is copied; fewer fill a prefix.
/// Staged through pinned buffers at and above [`PAGEABLE_THRESHOLD`] bytes (see the
/// module doc).
pub fn copy_host_to_device(
    dst: &MemoryPointer,
    src: &[u8],
    stream: &(impl AsStream + ?Sized),
) -> Result<()> {
    super::check_room("copy_host_to_device", "destination", dst, src.len())?;
    // SAFETY: `dst` has room for `src.len()` bytes (checked above) of memory that CUDA
    // copies may write (`BaseMemory`'s contract), which no Rust reference aliases (the
    // memory is reached only through copies), and which `dst` keeps allocated for the
    // whole call; the call returns only once the copy is over (or, on an error, after
    // waiting for the stream).
    unsafe { copy_host_to_device_raw(dst.ptr(), src, stream) }
}

/// [`copy_host_to_device`] to a raw device address, with no bounds check.
///
/// # Safety
/// `dst` must be the start of at least `src.len()` bytes of memory that CUDA copies
/// may write (device, managed or mapped pinned memory) that stays allocated, is not
/// handed to another user by its allocator, and is neither read nor written by
/// anything else (no live Rust reference to it, no other host code or device work)
/// until this call returns.
pub unsafe fn copy_host_to_device_raw(
    dst: u64,
    src: &[u8],
    stream: &(impl AsStream + ?Sized),
) -> Result<()> {
    if src.is_empty() {
        return Ok(());
    }
    // Before anything is queued: the copy must be waited for before `src` is given
    // back, and this thread's own capture would refuse that wait.
    refuse_own_capture("copy_host_to_device")?;
    context::make_current(stream.device_id())?;
    // Live while `stream` is borrowed (`AsStream`), its context made current above.
    let s = stream.as_raw();
    if src.len() < PAGEABLE_THRESHOLD {
        // Not into a capture: the copy is waited for before `src` is given back.
        enqueue_uncaptured(stream, "copy_host_to_device", || {
            // SAFETY: `dst` is the caller's promise (see `# Safety`); `src` is borrowed
            // until the copy is waited for just after; `s` is live and current.
            Ok(unsafe {
                result::memory::memcpy_htod_async(dst, src.as_ptr().cast(), src.len(), s)
            }?)
        })?;
        // SAFETY: as above.
        return unsafe { crate::stream::drain(s) };
    }
    let p = Plan::new(src.len(), stream.device_id())?;
    let mut drain = p.drain(s);
    let (plan, k, bufs, events, w, latch) =
        (&p.chunks, p.k, &p.bufs, &p.events, p.workers, &p.latch);
    let base = src.as_ptr() as usize;
    let streaming = STREAM_H2D.load(Ordering::Relaxed);
    // Fill every buffer first; then, as chunk j's host copy ends, send it and refill
    // the buffer of chunk j - 1 (whose DMA is done or nearly) with chunk j - 1 + k.
    for (j, &(start, len)) in plan.iter().enumerate().take(k) {
        w.submit(
            latch,
            j,
            (bufs[j].ptr() as usize, base + start, len),
            streaming,
        );
    }
    for (j, &(start, len)) in plan.iter().enumerate() {
        let slot = j % k;
        latch.wait(slot);
        // Chunk by chunk, not into a capture that another thread begins on `s` meanwhile
        // (the lock is not held across the waits, which such a capture may refuse).
        enqueue_uncaptured(stream, "copy_host_to_device", || {
            // SAFETY: the source is staging buffer `slot` (pinned memory the plan
            // holds), filled by the workers (waited for above) and not refilled before
            // this copy's event is waited for; the chunk lies in `dst..dst + src.len()`,
            // the caller's (see `# Safety`); `s` is live and current. The drain waits
            // for the stream before the buffers go back on an error path.
            unsafe {
                result::memory::memcpy_htod_async(
                    dst + start as u64,
                    bufs[slot].ptr() as usize as *const c_void,
                    len,
                    s,
                )
            }?;
            // SAFETY: the slot's event is the plan's (live until it drops); `s` as above.
            Ok(unsafe { result::event::record(events.events[slot] as sys::CUevent, s) }?)
        })?;
        if j >= 1 {
            if let Some(&(next_start, next_len)) = plan.get(j - 1 + k) {
                let prev = (j - 1) % k;
                // SAFETY: the plan's event, as above.
                unsafe { result::event::synchronize(events.events[prev] as sys::CUevent) }?;
                let piece = (bufs[prev].ptr() as usize, base + next_start, next_len);
                w.submit(latch, prev, piece, streaming);
            }
        }
    }
    // SAFETY: `s` is live and current (above).
    unsafe { crate::stream::drain(s) }?;
    drain.stream = None;
    Ok(())
}

/// Fills all of `dst` from the device memory at `src` on `stream`; returns when the
/// bytes are in `dst`. More bytes than the room left behind `src`
/// ([`MemoryPointer::size`]) is an error, and nothing is copied. Staged through
/// pinned buffers at and above [`PAGEABLE_THRESHOLD`] bytes (see the module doc).
pub fn copy_device_to_host(
    dst: &mut [u8],
    src: &MemoryPointer,
    stream: &(impl AsStream + ?Sized),
) -> Result<()> {
    super::check_room("copy_device_to_host", "source", src, dst.len())?;
    // SAFETY: `src` has `dst.len()` bytes (checked above) of memory that CUDA copies
    // may read (`BaseMemory`'s contract), which no Rust reference aliases, and which
    // `src` keeps allocated for the whole call; the call returns only once the copy is
    // over (or, on an error, after waiting for the stream).
    unsafe { copy_device_to_host_raw(dst, src.ptr(), stream) }
}

/// [`copy_device_to_host`] from a raw device address, with no bounds check.
///
/// # Safety
/// `src` must be the start of at least `dst.len()` bytes of memory that CUDA copies
/// may read (device, managed or mapped pinned memory) that stays allocated, is not
/// handed to another user by its allocator, and is not written by anything else (no
/// live `&mut` reference to it, no other host code or device work) until this call
/// returns.
pub unsafe fn copy_device_to_host_raw(
    dst: &mut [u8],
    src: u64,
    stream: &(impl AsStream + ?Sized),
) -> Result<()> {
    if dst.is_empty() {
        return Ok(());
    }
    // Before anything is queued: the copy must be waited for before `dst` is given
    // back, and this thread's own capture would refuse that wait.
    refuse_own_capture("copy_device_to_host")?;
    context::make_current(stream.device_id())?;
    // Live while `stream` is borrowed (`AsStream`), its context made current above.
    let s = stream.as_raw();
    if dst.len() < PAGEABLE_THRESHOLD {
        // Not into a capture: the copy is waited for before `dst` is given back.
        enqueue_uncaptured(stream, "copy_device_to_host", || {
            // SAFETY: `src` is the caller's promise (see `# Safety`); `dst` is borrowed
            // mutably until the copy is waited for just after, and any byte is a valid
            // `u8`; `s` is live and current.
            Ok(unsafe {
                result::memory::memcpy_dtoh_async(dst.as_mut_ptr().cast(), src, dst.len(), s)
            }?)
        })?;
        // SAFETY: as above.
        return unsafe { crate::stream::drain(s) };
    }
    let p = Plan::new(dst.len(), stream.device_id())?;
    let mut drain = p.drain(s);
    let (plan, k, bufs, events, w, latch) =
        (&p.chunks, p.k, &p.bufs, &p.events, p.workers, &p.latch);
    let base = dst.as_mut_ptr() as usize;
    let streaming = STREAM_D2H.load(Ordering::Relaxed) && dst.len() >= STREAM_D2H_MIN;
    // Queues the DMA of the chunk at `start` into staging buffer `slot`, and its
    // event: chunk by chunk, never into a capture (as in `copy_host_to_device_raw`).
    let fetch = |slot: usize, start: usize, len: usize| {
        enqueue_uncaptured(stream, "copy_device_to_host", || {
            // SAFETY: the destination is staging buffer `slot` (pinned memory the plan
            // holds, read out by the workers: never yet, or waited for by the caller);
            // the chunk lies in `src..src + dst.len()`, the caller's (see `# Safety`);
            // `s` is live and current. The drain waits for the stream before the
            // buffers go back on an error path.
            unsafe {
                result::memory::memcpy_dtoh_async(
                    bufs[slot].ptr() as usize as *mut c_void,
                    src + start as u64,
                    len,
                    s,
                )
            }?;
            // SAFETY: the slot's event is the plan's (live until it drops); `s` as above.
            Ok(unsafe { result::event::record(events.events[slot] as sys::CUevent, s) }?)
        })
    };
    // Start k DMAs; as chunk j lands, hand it to the workers, and once chunk j - 1
    // has left its buffer, start the DMA of chunk j - 1 + k into it.
    for (j, &(start, len)) in plan.iter().enumerate().take(k) {
        fetch(j, start, len)?;
    }
    for (j, &(start, len)) in plan.iter().enumerate() {
        let slot = j % k;
        // SAFETY: the plan's event, as above.
        unsafe { result::event::synchronize(events.events[slot] as sys::CUevent) }?;
        let piece = (base + start, bufs[slot].ptr() as usize, len);
        w.submit(latch, slot, piece, streaming);
        if j >= 1 {
            if let Some(&(next_start, next_len)) = plan.get(j - 1 + k) {
                let prev = (j - 1) % k;
                // Buffer `prev` read out by the workers before its next DMA.
                latch.wait(prev);
                fetch(prev, next_start, next_len)?;
            }
        }
    }
    latch.wait_all();
    drain.stream = None;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_queued_for_workers_that_failed_to_start_are_made_all_the_same() {
        let w: &'static Workers = Box::leak(Box::new(Workers::new()));
        let src: Vec<u8> = (0..=255).cycle().take(1 << 20).collect();
        let mut dst = vec![0u8; src.len()];
        let latch = Arc::new(Latch::new());
        let (d, s) = (dst.as_mut_ptr() as usize, src.as_ptr() as usize);
        // Another thread's copy comes while the threads being started count as live,
        // and then no thread starts.
        let threads = w.resize_with(Some(2), |i| {
            if i == 0 {
                w.submit(&latch, 0, (d, s, src.len()), false);
                assert!(!w.lock().jobs.is_empty(), "queued for the workers");
            }
            Err(std::io::Error::other("no thread"))
        });
        assert_eq!(threads, 0);
        latch.wait_all();
        assert!(w.lock().jobs.is_empty());
        assert_eq!(w.queued.load(Ordering::Acquire), 0);
        assert!(dst == src, "every piece copied");
    }

    #[test]
    fn chunks_cover_the_range_exactly_once() {
        for &(len, chunk) in &[
            (1usize, 8usize),
            (8, 8),
            (9, 8),
            (CHUNK_SIZE - 1, CHUNK_SIZE),
            (CHUNK_SIZE + 1, CHUNK_SIZE),
            ((256 << 20) + 3, CHUNK_SIZE),
        ] {
            let v: Vec<_> = chunks(len, chunk).collect();
            let mut next = 0;
            for &(s, l) in &v {
                assert_eq!(s, next);
                assert!(l >= 1 && l <= chunk);
                next = s + l;
            }
            assert_eq!(next, len, "len {len} chunk {chunk}");
            assert_eq!(v.len(), len.div_ceil(chunk));
        }
        assert_eq!(chunks(0, 8).count(), 0);
    }

    #[test]
    fn chunk_size_is_capped_and_keeps_several_chunks_in_flight() {
        let shape = PlanShape::current();
        assert_eq!(chunk_size_for(256 << 20, shape), CHUNK_SIZE);
        assert_eq!(chunk_size_for(PAGEABLE_THRESHOLD, shape), MIN_CHUNK);
        let c = chunk_size_for(4 << 20, shape);
        assert_eq!(c, 1 << 20);
        assert_eq!((4usize << 20).div_ceil(c), STAGING_BUFFERS);
        let c = chunk_size_for((10 << 20) + 3, shape);
        assert_eq!(c % PIECE_ALIGN, 0);
        assert!((c..=CHUNK_SIZE).contains(&c));
    }

    #[test]
    fn planned_chunks_cover_the_range_exactly_once_and_ramp_both_ends() {
        let shapes = [
            PlanShape {
                chunk: CHUNK_SIZE,
                buffers: 4,
                ramp: 1 << 20,
            },
            PlanShape {
                chunk: CHUNK_SIZE,
                buffers: 4,
                ramp: 0,
            },
            PlanShape {
                chunk: 16 << 20,
                buffers: 8,
                ramp: 256 << 10,
            },
            PlanShape {
                chunk: MIN_CHUNK,
                buffers: 2,
                ramp: 4096,
            },
        ];
        for shape in shapes {
            for len in [PAGEABLE_THRESHOLD, (3 << 20) + 1, 64 << 20, (256 << 20) + 3] {
                let v = plan_chunks(len, shape);
                let max = chunk_size_for(len, shape);
                let mut next = 0;
                for &(s, l) in &v {
                    assert_eq!(s, next, "{shape:?} {len}");
                    assert!(l >= 1 && l <= max, "{shape:?} {len}: {l} > {max}");
                    next = s + l;
                }
                assert_eq!(next, len, "{shape:?} {len}");
            }
        }
        let v = plan_chunks(256 << 20, shapes[0]);
        let sizes: Vec<usize> = v.iter().map(|&(_, l)| l >> 20).collect();
        assert_eq!(&sizes[..4], &[1, 2, 4, 7]);
        assert_eq!(&sizes[sizes.len() - 4..], &[7, 4, 2, 1]);
        assert!(plan_chunks(256 << 20, shapes[1])
            .iter()
            .all(|&(_, l)| l == CHUNK_SIZE));
    }

    #[test]
    fn plan_shapes_out_of_range_are_refused() {
        let ok = PlanShape::current();
        for bad in [
            PlanShape { chunk: 1000, ..ok },
            PlanShape { buffers: 1, ..ok },
            PlanShape {
                buffers: MAX_BUFFERS + 1,
                ..ok
            },
            PlanShape {
                ramp: ok.chunk,
                ..ok
            },
            PlanShape { ramp: 4097, ..ok },
            PlanShape {
                ramp: 0,
                chunk: 1000,
                ..ok
            },
        ] {
            assert!(set_plan_shape(bad).is_err(), "{bad:?}");
        }
        assert_eq!(PlanShape::current(), ok);
    }

    #[test]
    fn pieces_are_page_aligned_and_at_least_64_kib() {
        assert_eq!(piece_size_for(CHUNK_SIZE, 8), 1 << 20);
        assert_eq!(piece_size_for(100, 8), MIN_PIECE);
        assert_eq!(piece_size_for(CHUNK_SIZE + 1, 8) % PIECE_ALIGN, 0);
        assert!((CHUNK_SIZE + 1).div_ceil(piece_size_for(CHUNK_SIZE + 1, 8)) <= 8);
        assert_eq!(piece_size_for(1 << 20, 0), 1 << 20);
    }

    #[test]
    fn parallel_memcpy_is_byte_exact_at_odd_sizes() {
        for &n in &[1usize, 4095, 65537, (3 << 20) + 5] {
            let src: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
            let mut dst = vec![0u8; n];
            parallel_memcpy(&mut dst, &src).unwrap();
            assert!(dst == src, "size {n}");
        }
    }

    #[test]
    fn parallel_memcpy_refuses_different_lengths() {
        let mut d = [0u8; 3];
        assert!(parallel_memcpy(&mut d, &[1, 2]).is_err());
    }
}
