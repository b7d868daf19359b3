//! The graph recorder ([`Recorder`]): a closure recorded into a graph once per key,
//! replayed, updated in place, in a bounded cache ([`lru`]) whose retired entries let
//! go of what they kept once their launches are done ([`retired`]).

pub(crate) mod arguments;
mod lru;
mod retired;

use std::borrow::Borrow;
use std::hash::Hash;
use std::num::NonZeroUsize;
use std::sync::Arc;

use super::{CaptureMode, Graph, InstantiateFlags, Updated};
use crate::capture;
use crate::device::{get_device_id, Device, DeviceScope};
use crate::error::Result;
use crate::stream::{AsStream, Stream, StreamRef};
use arguments::KernelNodes;
use lru::Lru;
use retired::Retired;

/// What one call of [`Recorder::run`] or [`Recorder::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// The key's executable was launched again; the closure did not run.
    Replayed,
    /// There was no executable for the key (its first call, or it was evicted or
    /// removed, or made for another device): the closure was captured, the graph
    /// instantiated and launched.
    Recorded,
    /// The closure was captured again and the key's executable updated in place with
    /// the new parameters, then launched.
    Updated,
    /// The closure was captured again, but the key's executable could not take the new
    /// parameters, for `reason`: the new graph was instantiated in its place and
    /// launched.
    Reinstantiated {
        /// Why the update was refused, in words.
        reason: &'static str,
    },
}

/// What a [`Recorder`] did so far ([`Recorder::stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RecorderStats {
    /// Calls of [`Recorder::run`] that replayed the key's executable.
    pub hits: u64,
    /// Calls that found no executable for their key and recorded one.
    pub misses: u64,
    /// Closures captured into a graph (every miss and every update).
    pub captures: u64,
    /// Executables made (`cuGraphInstantiate`): misses and refused updates.
    pub instantiations: u64,
    /// Executables updated in place: by `cuGraphExecUpdate` after a capture, or by
    /// setting kernel arguments alone ([`argument_updates`](Self::argument_updates)).
    pub updates: u64,
    /// Updates in place made by setting the kernel nodes' arguments alone, without
    /// capturing the work (a part of [`updates`](Self::updates); see
    /// [`Recorder::update`]).
    pub argument_updates: u64,
    /// Updates that could not be made, replaced by a new instantiation.
    pub update_fallbacks: u64,
    /// Executables evicted to keep within the capacity (not counting
    /// [`Recorder::remove`] and [`Recorder::clear`]).
    pub evictions: u64,
    /// Calls that failed in the closure, the capture or the instantiation: nothing was
    /// cached or launched.
    pub failures: u64,
}

/// One line: `3 hits, 1 captures, 1 instantiations, 2 updates (2 by kernel arguments
/// alone), 0 update fallbacks, 0 evictions, 0 failures`.
impl std::fmt::Display for RecorderStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} hits, {} captures, {} instantiations, {} updates ({} by kernel arguments \
             alone), {} update fallbacks, {} evictions, {} failures",
            self.hits,
            self.captures,
            self.instantiations,
            self.updates,
            self.argument_updates,
            self.update_fallbacks,
            self.evictions,
            self.failures
        )
    }
}

impl RecorderStats {
    /// Counts a call that ended with `outcome`.
    fn count(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Replayed => self.hits += 1,
            Outcome::Recorded => {
                self.misses += 1;
                self.captures += 1;
                self.instantiations += 1;
            }
            Outcome::Updated => {
                self.captures += 1;
                self.updates += 1;
            }
            Outcome::Reinstantiated { .. } => {
                self.captures += 1;
                self.update_fallbacks += 1;
                self.instantiations += 1;
            }
        }
    }
}

/// What an update replaced.
enum Replaced {
    /// The executable's old parameters: what they kept, and the old graph (unless the
    /// recording keeps it, see `ArgUpdates`).
    Parameters(super::Kept, Option<Graph>),
    /// The whole recording (the update was refused).
    Recording(Box<Recording>),
}

/// One key's executable, and the stream of its last launch.
#[derive(Debug)]
struct Recording {
    /// Instantiated.
    graph: Graph,
    /// Where a fence after its launches goes (launches of one executable run in
    /// order, whatever their streams).
    last: Option<StreamRef>,
    /// Whether and how it takes new kernel arguments without a capture.
    args: ArgUpdates,
}

impl Recording {
    fn new(graph: Graph) -> Recording {
        Recording {
            graph,
            last: None,
            args: ArgUpdates::default(),
        }
    }
}

/// A recording's updates by kernel arguments alone (see [`arguments`]).
#[derive(Debug, Default)]
struct ArgUpdates {
    /// The graph the executable was instantiated from, once an update by capture gave
    /// the recording another (no executable, nothing kept): its nodes name the
    /// executable's.
    origin: Option<Graph>,
    state: ArgState,
}

#[derive(Debug, Default)]
enum ArgState {
    /// Not looked at yet.
    #[default]
    Unknown,
    /// Not a chain of kernel nodes (or the driver could not say): updates capture.
    Refused,
    /// A chain of kernel nodes.
    Nodes(KernelNodes),
}

impl ArgUpdates {
    /// Whether the recording (whose graph is `graph`) takes arguments alone: looked at
    /// once, on the first update.
    fn ready(&mut self, graph: &Graph) -> bool {
        if let ArgState::Unknown = self.state {
            let from = self.origin.as_ref().unwrap_or(graph);
            // SAFETY: `from` is the live graph the executable was instantiated from,
            // kept while the nodes are (this value or `graph`, which the recording
            // keeps as long as it keeps this value).
            self.state = match unsafe { KernelNodes::of_chain(from.as_raw()) } {
                Some(n) => ArgState::Nodes(n),
                None => ArgState::Refused,
            };
            if let ArgState::Refused = self.state {
                self.origin = None;
            }
        }
        matches!(self.state, ArgState::Nodes(_))
    }

    /// Updates by arguments alone are not tried again for this recording.
    fn refuse(&mut self) {
        self.state = ArgState::Refused;
        self.origin = None;
    }

    /// An update by capture replaced the recording's graph with another, `old` being
    /// the one before; returns what to drop. The graph the executable was
    /// instantiated from is kept while its nodes may be used, and the arguments the
    /// nodes hold are forgotten (the update gave them others).
    fn captured_update(&mut self, old: Graph) -> Option<Graph> {
        if let ArgState::Nodes(n) = &mut self.state {
            n.forget();
        }
        match (&self.state, &self.origin) {
            (ArgState::Refused, _) | (_, Some(_)) => Some(old),
            _ => {
                self.origin = Some(old);
                None
            }
        }
    }
}

impl Recording {
    /// Launches the executable on `stream`.
    #[inline]
    fn launch<S: AsStream + ?Sized>(&mut self, stream: &S) -> Result<()> {
        // Refused on a capturing stream (see `refuse_launch_into_capture`): the
        // recorder could not tell when that graph stops using what the recording
        // keeps alive.
        self.graph.launch(stream)?;
        if self.last.as_ref().map(StreamRef::handle) != Some(stream.as_raw() as usize) {
            self.last = Some(stream.as_stream_ref());
        }
        Ok(())
    }
}

/// Graphs without the effort: recorded once per key, replayed, updated in place when
/// only their arguments change, in a bounded cache. Give it a key and a closure that
/// queues work on a stream; the first call for a key captures the closure into a
/// graph, instantiates it and launches it, and later calls launch the same executable
/// again without running the closure. [`Recorder::update`] runs the closure again and
/// updates the key's executable in place with the new kernel arguments.
///
/// # Why
/// A launch costs the host a few microseconds; a graph launch costs about as much as
/// one launch for the whole graph. A step of many small kernels (an optimiser, a
/// decoder step, a simulation tick) is bound by those microseconds, and a graph makes
/// it several times faster. Capturing by hand means beginning and ending the capture,
/// keeping the executable, and knowing when it no longer fits the work; the recorder
/// does that, per key, with a bounded cache.
///
/// How much it gains is set by where the step's time goes. Measured on an H200
/// (`cargo bench -p cuda-rt-safe --bench recorder`: 100 dependent kernels of one to six
/// arguments over 16384 floats, eager steps of 285-300 us of host time): a replay
/// queues the step in 1.3-1.4 us of host time (0.0045 of eager, within 4% of a
/// [`Graph::launch`] by hand), but a synchronized step still takes the graph's own time
/// on the device, 107 us (0.36 of eager, 2.7x faster), of which 55 us is the device's
/// floor of about 0.55 us per dependent kernel node; an update by other buffers every
/// step takes 136 us (0.47, 2.1x), the driver's node updates added. So the host is
/// freed almost entirely, and the wall time of a step gains most where eager launches,
/// not the kernels, were its bound.
///
/// # What the key is for
/// A recording replays exactly what the closure queued when it was captured: the same
/// kernels, launch shapes and arguments (the same buffers and scalars). The key names
/// one such recording; make it out of whatever changes the graph (sizes, shapes, which
/// buffers, flags). A different key records a new graph; the [least recently
/// used](Recorder::with_capacity) ones are evicted beyond the capacity.
///
/// # Updating in place
/// When only the arguments change (other buffers of the same sizes, other scalars),
/// call [`Recorder::update`] with the same key: it captures the closure again (which
/// runs nothing on the device) and gives the key's executable the new parameters
/// (`cuGraphExecUpdate`), which costs a fraction of a new instantiation. Launches
/// queued before keep the old parameters. When the executable cannot take them (the
/// topology, a kernel or a node's kind changed, or the recording allocates memory that
/// outlives its capture), the new capture is instantiated in its place: the result is
/// right either way, and [`Outcome::Reinstantiated`] and
/// [`RecorderStats::update_fallbacks`] say it happened.
///
/// # Where the closure runs
/// The closure runs on the calling thread, once per capture, with the recorder's own
/// capture stream of the launch stream's device, which is also the thread's current
/// stream while it runs (so [`alloc`](crate::alloc) and launches that take the current
/// stream are captured as well). Queue the work on that stream, or on streams forked
/// from it and joined back (see [`StreamCaptureExt`](super::StreamCaptureExt)). The
/// executable is launched on the stream given to the call, after the work queued
/// there before it; the stream given is never put in capture mode.
///
/// Everything a capture refuses is refused here too, before anything is recorded:
/// synchronous copies, synchronizations, run-once host closures. The call then returns
/// that error (its message names the call), the capture is ended and thrown away, and
/// nothing is cached, launched or left capturing. Memory the closure allocates is a
/// memory node of the graph (see [`capture_aware_alloc`](super::capture_aware_alloc)),
/// and memory that cuda-rt's asynchronous copies and memsets use is kept alive by the
/// recording, as in any capture ([`crate::graph`]).
///
/// # What a replay relies on
/// Kernel launches are `unsafe`: a launch during a capture promises that every address
/// the kernel reaches stays valid until the graph's last launch completes, and the
/// recorder launches its graphs until the key is evicted, removed or the recorder
/// dropped. Keep the buffers alive longer than the recorder, or tie them to the
/// recording with
/// [`keep_alive_in_capture`](super::StreamCaptureExt::keep_alive_in_capture) inside
/// the closure. The kernels themselves need nothing of the kind: a kernel the closure
/// launches through cuda-rt ([`Function`](crate::Function)'s launch methods,
/// [`launch!`](crate::launch!), a [`RawKernel`](crate::RawKernel)) keeps its module
/// loaded for the recording, so the [`Module`](crate::Module), `Function` or
/// `RawKernel` may be dropped once the closure has run. What a recording keeps alive
/// is let go once the launches that may use it are done, also after an update or an
/// eviction.
///
/// # Example
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::graph::{Outcome, Recorder};
/// use cuda_rt::{DeviceBuffer, LaunchConfig, RawKernel, Stream};
/// let axpy = RawKernel::new(
///     r#"extern "C" __global__ void axpy(float* y, const float* x, float a, int n) {
///            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] += a * x[i]; }"#,
///     "axpy",
///     &[],
/// )?;
/// let stream = Stream::non_blocking()?;
/// // Declared before the recorder: they outlive every replay.
/// let x = DeviceBuffer::from_slice(&vec![1.0f32; 4096])?;
/// let y = DeviceBuffer::<f32>::zeros(4096)?;
/// let n = x.len() as i32;
/// let cfg = LaunchConfig::for_num_elems(n as u32);
/// let mut recorder = Recorder::new();
/// for step in 0..1000 {
///     // The key names what shapes the graph: here only the length.
///     let outcome = recorder.run(&n, &stream, |s| {
///         for _ in 0..50 {
///             // SAFETY: axpy(float* y, const float* x, float a, int n): x and y hold n
///             // floats on this device and outlive the recorder, so every replay of
///             // the recording finds them.
///             unsafe { cuda_rt::launch!(axpy, &cfg, s, (y, x, 0.5f32, n))? };
///         }
///         Ok(())
///     })?;
///     assert_eq!(outcome, if step == 0 { Outcome::Recorded } else { Outcome::Replayed });
/// }
/// stream.synchronize()?;
/// assert_eq!(y.to_vec()?[0], 25_000.0);
/// assert_eq!(recorder.stats().hits, 999);
/// # Ok(()) }
/// ```
///
/// # Keys, threads, lifetimes
/// `K` is the key type: anything `Hash + Eq` that names what shapes the graph (a size,
/// a tuple of shapes, a `Vec<u8>` of bytes). Calls take the key by reference, also as
/// its borrowed form (`&[u8]` for `Vec<u8>`, `&str` for `String`); it is copied only
/// when a new recording is cached.
///
/// A `Recorder` is [`Send`] (with a `Send` key) but not [`Sync`]: its calls take
/// `&mut self`. What its recordings keep alive is let go after their launches, when a
/// recording is updated, evicted or removed, and when the recorder drops (which waits
/// for them).
#[derive(Debug)]
pub struct Recorder<K> {
    cache: Lru<K, Recording>,
    stats: RecorderStats,
    mode: CaptureMode,
    flags: InstantiateFlags,
    /// The capture streams, one per device, made on first use.
    streams: Vec<Arc<Stream>>,
    retired: Retired,
}

impl<K: Hash + Eq> Default for Recorder<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq> Recorder<K> {
    /// How many executables [`Recorder::new`] keeps at most.
    pub const DEFAULT_CAPACITY: usize = 32;

    /// A recorder that keeps up to [`DEFAULT_CAPACITY`](Self::DEFAULT_CAPACITY)
    /// executables, captures in [`CaptureMode::ThreadLocal`] and instantiates with no
    /// flags. Makes no CUDA call.
    pub fn new() -> Self {
        Self::with_capacity(NonZeroUsize::new(Self::DEFAULT_CAPACITY).unwrap_or(NonZeroUsize::MIN))
    }

    /// A recorder that keeps up to `capacity` executables, evicting the least recently
    /// used one to make room for a new key. Makes no CUDA call.
    pub fn with_capacity(capacity: NonZeroUsize) -> Self {
        Recorder {
            cache: Lru::new(capacity),
            stats: RecorderStats::default(),
            mode: CaptureMode::ThreadLocal,
            flags: InstantiateFlags::empty(),
            streams: Vec::new(),
            retired: Retired::default(),
        }
    }

    /// Captures in `mode` from now on. [`CaptureMode::ThreadLocal`] (the default)
    /// refuses CUDA calls that are unsafe during a capture on the recording thread
    /// only; [`CaptureMode::Global`] on every thread, which also catches another
    /// thread's stray work but makes its allocations fail meanwhile.
    pub fn capture_mode(mut self, mode: CaptureMode) -> Self {
        self.mode = mode;
        self
    }

    /// Instantiates with `flags` from now on (for example
    /// [`InstantiateFlags::UPLOAD`] or [`InstantiateFlags::USE_NODE_PRIORITY`]).
    pub fn instantiate_flags(mut self, flags: InstantiateFlags) -> Self {
        self.flags = flags;
        self
    }

    /// Launches the executable recorded for `key` on `stream`; when there is none
    /// (the key's first call, or it was evicted), first captures `f` into a graph
    /// and instantiates it. `f` gets the capture stream (see [`Recorder`]) and runs
    /// only when recording.
    ///
    /// An error from `f`, or from a call `f` made that a capture refuses, is returned
    /// as it is; the capture is then thrown away, and nothing is cached or launched.
    /// On a stream of another device than the key's executable, the key is recorded
    /// again for that device (a key has one executable; put the device in the key to
    /// keep one per device).
    pub fn run<Q, S, F>(&mut self, key: &Q, stream: &S, f: F) -> Result<Outcome>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        S: AsStream + ?Sized,
        F: FnOnce(&Stream) -> Result<()>,
    {
        if !self.retired.is_empty() {
            self.retired.poll();
        }
        if let Some(rec) = self.cache.get_mut(key) {
            if rec.graph.device_id() == stream.device_id() {
                rec.launch(stream)?;
                self.stats.count(Outcome::Replayed);
                return Ok(Outcome::Replayed);
            }
        }
        let fresh = self.capture(stream.device_id(), f)?;
        self.record(key.to_owned(), fresh, stream)
    }

    /// Captures `f` again and launches it on `stream` as `key`'s recording: the key's
    /// executable is updated in place with the new capture's parameters
    /// (`cuGraphExecUpdate`) when only kernel arguments and other node parameters
    /// changed ([`Outcome::Updated`]); otherwise the new capture is instantiated in its
    /// place ([`Outcome::Reinstantiated`], with the reason). Without an executable for
    /// the key, it is recorded ([`Outcome::Recorded`]). Launches queued before keep the
    /// parameters they were launched with.
    ///
    /// Use it when the same work runs on other buffers of the same sizes, or with
    /// other scalars: an update costs a capture (the host time of queueing the work,
    /// without running it) and a pass over the executable's nodes, a fraction of a new
    /// instantiation. Errors are those of [`run`](Self::run); on an error the key's
    /// executable, if any, is unchanged.
    ///
    /// # Kernels alone: no capture of the work
    /// When the recording is a chain of kernels (the closure launched kernels one
    /// after another on the capture stream, through cuda-rt's typed launches:
    /// [`launch!`](crate::launch!), [`Function::launch`](crate::Function::launch) or
    /// [`launch_on`](crate::Function::launch_on), a [`RawKernel`](crate::RawKernel)),
    /// an update takes those launches as the closure makes them, without queueing or
    /// capturing them, and gives only the kernel nodes whose arguments changed their
    /// new ones (`cuGraphExecKernelNodeSetParams`): no capture of the kernels and no
    /// `cuGraphExecUpdate` over the whole graph ([`RecorderStats::argument_updates`]
    /// counts them). The capture stream is capturing meanwhile, so anything else the
    /// closure queues is captured, never run; if it queued anything else, or other
    /// kernels, launch shapes or a different number of them, the closure runs a
    /// second time under a capture and the update is made as above. That is why `f`
    /// is `FnMut`: it may run twice in one update (it queues work only, which runs
    /// once, at the launch). A recording whose closure once queued other work (a
    /// copy, a memset, a kernel launched through the raw driver) is updated by
    /// capture from then on, its closure running once per update.
    pub fn update<Q, S, F>(&mut self, key: &Q, stream: &S, mut f: F) -> Result<Outcome>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        S: AsStream + ?Sized,
        F: FnMut(&Stream) -> Result<()>,
    {
        if !self.retired.is_empty() {
            self.retired.poll();
        }
        let device = stream.device_id();
        if let Some(outcome) = self.update_arguments(key, stream, &mut f)? {
            return Ok(outcome);
        }
        let fresh = self.capture(device, f)?;
        let Some(rec) = self
            .cache
            .get_mut(key)
            .filter(|r| r.graph.device_id() == device)
        else {
            return self.record(key.to_owned(), fresh, stream);
        };
        // What the update replaced goes after the launch is queued: destroying a graph
        // or an executable then overlaps with the device running the new one.
        let (outcome, old) = match rec.graph.update_from(fresh) {
            Ok(Updated::Made { old, old_graph }) => {
                let old_graph = rec.args.captured_update(old_graph);
                (Outcome::Updated, Replaced::Parameters(old, old_graph))
            }
            Ok(Updated::Refused { fresh, reason }) => {
                let graph = instantiate(fresh, &mut self.retired, &mut self.stats)?;
                let old = Recording {
                    graph: std::mem::replace(&mut rec.graph, graph),
                    last: rec.last.take(),
                    args: std::mem::take(&mut rec.args),
                };
                (
                    Outcome::Reinstantiated { reason },
                    Replaced::Recording(Box::new(old)),
                )
            }
            Err(e) => {
                self.stats.failures += 1;
                return Err(e);
            }
        };
        self.stats.count(outcome);
        let launched = rec.launch(stream);
        match old {
            // The executable's launches run in order: a fence after the last one (this
            // one, or the one before when it failed) follows every launch with the old
            // parameters.
            Replaced::Parameters(kept, old_graph) => {
                // The old graph first: its kernel nodes name the code of the modules
                // it kept.
                drop(old_graph);
                self.retired.retire(kept, device, rec.last.as_ref());
            }
            Replaced::Recording(old) => retire(*old, &mut self.retired),
        }
        launched.map(|()| outcome)
    }

    /// [`update`](Self::update) by kernel arguments alone, when `key`'s recording is a
    /// chain of kernels (see [`arguments`]): `f` runs once on the capture stream, which
    /// captures whatever `f` queues there other than cuda-rt's typed launches, and
    /// those launches are taken rather than queued. When nothing else was queued and
    /// the launches match the recording's kernel nodes, the nodes whose arguments
    /// changed get the new ones and the executable is launched: `Some(Updated)`.
    /// `None` when that cannot be done (no such recording, other work, other kernels
    /// or shapes, a refusal of the driver): nothing was launched, and the caller
    /// updates by capture. A refusal after some nodes took their new arguments drops
    /// the recording (after its launches), so that no executable holding old and new
    /// arguments at once is left for a replay, whatever the capture then does.
    fn update_arguments<Q, S, F>(
        &mut self,
        key: &Q,
        stream: &S,
        f: &mut F,
    ) -> Result<Option<Outcome>>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
        S: AsStream + ?Sized,
        F: FnMut(&Stream) -> Result<()>,
    {
        let device = stream.device_id();
        if arguments::busy() {
            // An update inside another's closure: that one takes the launches.
            return Ok(None);
        }
        let Some(rec) = self.cache.get_mut(key) else {
            return Ok(None);
        };
        if rec.graph.device_id() != device || !rec.args.ready(&rec.graph) {
            return Ok(None);
        }
        let handle = self.capture_stream(device)?.as_raw() as usize;
        let captured = arguments::taking(handle, || self.capture(device, &mut *f))?;
        let Some(rec) = self.cache.get_mut(key) else {
            return Ok(None);
        };
        // Anything captured is work the nodes do not hold: a closure that queues
        // other work (or launches kernels another way) is updated by capture from
        // now on, without running twice each time.
        if captured.node_count().map_or(true, |n| n != 0) {
            rec.args.refuse();
            return Ok(None);
        }
        let ArgState::Nodes(nodes) = &mut rec.args.state else {
            return Ok(None);
        };
        let Some(exec) = rec.graph.exec_raw() else {
            return Ok(None);
        };
        let _on = enter_device(device)?;
        // `None`: other launches; `Some(false)`: the driver refused a node.
        let set = arguments::with_taken(|taken| {
            // SAFETY: `exec` is the recording's live executable, instantiated from the
            // graph the nodes belong to (kept by the recording: `ArgUpdates`); the
            // launches were checked as any launch is, and what their arguments name is
            // valid for every run of the executable: the `# Safety` of the launches
            // the closure made (which promise it for every replay of a recording);
            // `taken` matches the nodes (`then` runs only then).
            nodes
                .matches(taken)
                .then(|| unsafe { nodes.set(exec, taken) }.is_ok())
        });
        match set {
            Some(true) => {}
            None => return Ok(None),
            Some(false) => {
                // Some nodes may hold the new arguments and the others the old: the
                // executable is neither recording. It goes (after its launches), so
                // that a capture failing next cannot leave it to be replayed; the
                // caller records the key afresh.
                if let Some(rec) = self.cache.remove(key) {
                    retire(rec, &mut self.retired);
                }
                return Ok(None);
            }
        }
        // What the capture kept (the kernels' modules, what the closure tied to it)
        // is the recording's from now on; what it kept before goes after the launches
        // that may use it. The same objects as before (the steady update: the same
        // kernels, nothing new tied) stay where they are, with no fence to record.
        let mut captured = captured;
        let new = captured.take_kept();
        drop(captured);
        let old = if rec.graph.keeps_same(&new) {
            drop(new);
            None
        } else {
            Some(rec.graph.replace_kept(new))
        };
        self.stats.updates += 1;
        self.stats.argument_updates += 1;
        let launched = rec.launch(stream);
        if let Some(old) = old {
            self.retired.retire(old, device, rec.last.as_ref());
        }
        launched.map(|()| Some(Outcome::Updated))
    }

    /// Whether an executable is cached for `key` (not counted as a use).
    pub fn contains<Q>(&self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.cache.contains(key)
    }

    /// Drops `key`'s executable, if any (what it kept alive goes once its launches are
    /// done); `true` when there was one. Not counted as an eviction.
    pub fn remove<Q>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        match self.cache.remove(key) {
            Some(rec) => {
                retire(rec, &mut self.retired);
                true
            }
            None => false,
        }
    }

    /// Drops every executable (what they kept alive goes once their launches are
    /// done). The statistics stay.
    pub fn clear(&mut self) {
        for rec in self.cache.drain() {
            retire(rec, &mut self.retired);
        }
    }

    /// How many executables are cached.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    /// Whether none is cached.
    pub fn is_empty(&self) -> bool {
        self.cache.len() == 0
    }

    /// How many executables are kept at most.
    pub fn capacity(&self) -> usize {
        self.cache.capacity()
    }

    /// Keeps at most `capacity` executables from now on, evicting the least recently
    /// used ones beyond it (counted as evictions).
    pub fn set_capacity(&mut self, capacity: NonZeroUsize) {
        for rec in self.cache.set_capacity(capacity) {
            self.stats.evictions += 1;
            retire(rec, &mut self.retired);
        }
    }

    /// What the recorder did so far.
    pub fn stats(&self) -> RecorderStats {
        self.stats
    }

    /// How many retired executables' kept objects still wait for their launches to
    /// finish (they are let go at a later call once done, or when the recorder drops).
    pub fn retired_pending(&self) -> usize {
        self.retired.len()
    }

    /// The stream the recorder captures on for `device`, made on first use: the stream
    /// its closures get. Work queued on it outside a closure runs at once, like on any
    /// stream; a capture begun on it by hand makes the recorder's next capture on it
    /// fail. (The C ABI hands it to C callbacks as a stream handle.)
    pub fn capture_stream(&mut self, device: i32) -> Result<Arc<Stream>> {
        if let Some(s) = self.streams.iter().find(|s| s.device_id() == device) {
            return Ok(Arc::clone(s));
        }
        let _on = enter_device(device)?;
        let s = Arc::new(Stream::non_blocking()?);
        self.streams.push(Arc::clone(&s));
        Ok(s)
    }

    /// Captures `f` on `device`'s capture stream into a graph, not instantiated.
    fn capture<F>(&mut self, device: i32, f: F) -> Result<Graph>
    where
        F: FnOnce(&Stream) -> Result<()>,
    {
        let r = self.capture_on(device, f);
        if r.is_err() {
            self.stats.failures += 1;
        }
        r
    }

    fn capture_on<F>(&mut self, device: i32, f: F) -> Result<Graph>
    where
        F: FnOnce(&Stream) -> Result<()>,
    {
        let stream = self.capture_stream(device)?;
        let _on_device = enter_device(device)?;
        let _current = stream.enter()?;
        capture::begin(&*stream, self.mode)?;
        let mut open = OpenCapture {
            stream: &stream,
            open: true,
        };
        let ran = f(&stream);
        open.open = false;
        let ended = capture::end(&*stream);
        match (ran, ended) {
            (Ok(()), Ok(ended)) => Ok(Graph::from_ended(ended, device, self.flags)),
            (Ok(()), Err(e)) => Err(e),
            (Err(e), Ok(ended)) => {
                ended.discard();
                Err(e)
            }
            // The capture's own error (invalidated, unjoined...) follows from the
            // closure's, which says what was called.
            (Err(e), Err(_)) => Err(e),
        }
    }

    /// Instantiates `fresh`, caches it as `key`'s recording and launches it.
    fn record<S: AsStream + ?Sized>(
        &mut self,
        key: K,
        fresh: Graph,
        stream: &S,
    ) -> Result<Outcome> {
        let graph = instantiate(fresh, &mut self.retired, &mut self.stats)?;
        let mut rec = Recording::new(graph);
        // Cached even when this launch fails: the executable is good.
        let launched = rec.launch(stream);
        let displaced = self.cache.insert(key, rec);
        if let Some(old) = displaced.replaced {
            retire(old, &mut self.retired);
        }
        if let Some(old) = displaced.evicted {
            self.stats.evictions += 1;
            retire(old, &mut self.retired);
        }
        self.stats.count(Outcome::Recorded);
        launched.map(|()| Outcome::Recorded)
    }
}

impl<K> Drop for Recorder<K> {
    fn drop(&mut self) {
        // What the executables kept goes once their launches are done (the fences are
        // waited for as `retired` drops, after this).
        for rec in self.cache.drain() {
            retire(rec, &mut self.retired);
        }
    }
}

/// Instantiates `g` with its flags; on failure what it kept goes (it never ran).
fn instantiate(mut g: Graph, retired: &mut Retired, stats: &mut RecorderStats) -> Result<Graph> {
    let flags = g.flags();
    match g.instantiate(flags) {
        Ok(()) => Ok(g),
        Err(e) => {
            stats.failures += 1;
            let device = g.device_id();
            let kept = g.take_kept();
            // The graph first: its kernel nodes name the code of the modules it kept.
            drop(g);
            retired.retire(kept, device, None);
            Err(e)
        }
    }
}

/// Drops `rec`'s executable and graph now (queued launches still run), and lets go of
/// what it kept once they are done.
fn retire(rec: Recording, retired: &mut Retired) {
    let Recording {
        mut graph,
        last,
        args,
    } = rec;
    // The graph the executable came from, if kept apart: nothing kept, no executable.
    drop(args);
    let device = graph.device_id();
    let kept = graph.take_kept();
    // The graph and its executable go first (what they kept is out of them, so their
    // drop waits for nothing): their kernel nodes name the code of the kept modules,
    // which is let go only after them, at once when the recording never ran.
    drop(graph);
    retired.retire(kept, device, last.as_ref());
}

/// Makes `device` current on this thread until the guard drops (nothing when it is
/// current already).
fn enter_device(device: i32) -> Result<Option<DeviceScope>> {
    if get_device_id() == device {
        return Ok(None);
    }
    Device::new(device)?.enter().map(Some)
}

/// A capture under way on the recorder's stream: if the closure unwinds, the capture
/// is ended and thrown away, so that neither the stream nor the process is left
/// capturing.
struct OpenCapture<'a> {
    stream: &'a Stream,
    open: bool,
}

impl Drop for OpenCapture<'_> {
    fn drop(&mut self) {
        if self.open {
            if let Ok(ended) = capture::end(self.stream) {
                ended.discard();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_outcome_counts_what_it_did() {
        let mut s = RecorderStats::default();
        s.count(Outcome::Recorded);
        s.count(Outcome::Replayed);
        s.count(Outcome::Replayed);
        s.count(Outcome::Updated);
        s.count(Outcome::Reinstantiated { reason: "topology" });
        assert_eq!(
            s,
            RecorderStats {
                hits: 2,
                misses: 1,
                captures: 3,
                instantiations: 2,
                updates: 1,
                argument_updates: 0,
                update_fallbacks: 1,
                evictions: 0,
                failures: 0,
            }
        );
    }

    #[test]
    fn stats_read_as_one_line() {
        let s = RecorderStats {
            hits: 3,
            captures: 1,
            instantiations: 1,
            updates: 2,
            argument_updates: 2,
            ..Default::default()
        };
        assert_eq!(
            s.to_string(),
            "3 hits, 1 captures, 1 instantiations, 2 updates (2 by kernel arguments alone), \
             0 update fallbacks, 0 evictions, 0 failures"
        );
    }

    #[test]
    fn a_new_recorder_makes_no_cuda_call_and_holds_nothing() {
        let r: Recorder<u64> = Recorder::new();
        assert_eq!(r.capacity(), Recorder::<u64>::DEFAULT_CAPACITY);
        assert!(r.is_empty());
        assert_eq!(r.len(), 0);
        assert!(!r.contains(&1));
        assert_eq!(r.stats(), RecorderStats::default());
        assert_eq!(r.retired_pending(), 0);
        let mut r: Recorder<Vec<u8>> = Recorder::with_capacity(NonZeroUsize::new(3).unwrap())
            .capture_mode(CaptureMode::Global);
        assert_eq!(r.capacity(), 3);
        assert!(!r.remove(&b"k"[..]));
        r.set_capacity(NonZeroUsize::MIN);
        r.clear();
        assert_eq!(r.capacity(), 1);
        assert_eq!(r.stats().evictions, 0);
    }

    #[test]
    fn a_recorder_moves_between_threads() {
        fn send<T: Send>() {}
        send::<Recorder<u64>>();
        send::<Recorder<Vec<u8>>>();
    }
}
