//! CUDA graphs: capture work on a stream and replay it ([`Graph`]), or build a graph
//! node by node. [`Recorder`] does the capturing for you: a closure recorded once per
//! key, replayed as one graph launch, updated in place when only its arguments change.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::graph::CaptureMode;
//! use cuda_rt::{AsStream, Stream, StreamCaptureExt};
//! let stream = Stream::non_blocking()?;
//! let _scope = stream.enter()?; // allocations and copies follow the current stream
//! stream.begin_capture(CaptureMode::Global)?;
//! let buf = cuda_rt::alloc(4096)?; // a memory node of the graph
//! buf.memset_async(0, 4096, None)?;
//! let graph = stream.end_capture()?; // instantiated, as CuPy does
//! for _ in 0..10 {
//!     graph.launch(&stream)?;
//! }
//! stream.synchronize()?;
//! # Ok(()) }
//! ```
//!
//! # Capture
//! Capture methods are on [`StreamCaptureExt`], which every stream implements (it is
//! in [`crate::prelude`]): `begin_capture(mode)`, `end_capture()`,
//! `is_capturing()`, `capture_status()`, and `launch_host_func_repeatable(f)` for a
//! host function that runs on every launch of the graph. The legacy default stream
//! cannot capture (an error says so). Other streams join a capture by waiting on an
//! event recorded on a capturing stream (fork) and must be joined back (the origin
//! stream waits on an event recorded on them) before `end_capture`.
//!
//! Errors of a capture are [`Error::Capture`] with words and a [`CaptureKind`]: a call
//! cuda-rt refuses before it reaches the driver (`Refused`: the capture goes on),
//! synchronizing or another call the driver refuses during a capture (`Invalidated`),
//! ending a capture on a stream that is not capturing (`NotCapturing`), an unjoined
//! fork (`Unjoined`).
//!
//! # Memory
//! Allocations during a capture become memory nodes of exactly that capture's graph
//! (see [`capture_aware_alloc`] for the reasons and the lifetime rules); a capture
//! that ends in error takes them with it, and their drop frees nothing. Memory that
//! cuda-rt's asynchronous copies and memsets use in a capture is kept alive by that
//! capture's graph, whichever thread drops its last pointer, so no pool hands it out
//! while the graph can run. Memory whose last pointer drops on a thread that is in a
//! capture (its current stream is in it, or it began it) is kept by that capture's
//! graph too. Other memory is freed as usual while captures are under way on other
//! threads: at once, or, while a [`CaptureMode::Global`] capture is under way (CUDA
//! then refuses a free's driver calls on every thread), as soon as none is left.
//! Memory a captured kernel uses (an address given to an `unsafe` launch) must
//! otherwise outlive the graph: hand it to [`Graph::keep_alive`]. A graph waits for its
//! launches to finish before releasing what it keeps alive.
//!
//! # Kernels
//! A kernel launched through cuda-rt ([`Function`](crate::Function)'s launch methods,
//! [`launch!`](crate::launch!), a [`RawKernel`](crate::RawKernel), the C ABI's
//! `curt_launch`) on a stream of a capture begun through cuda-rt keeps its module
//! loaded for that capture's graph, its clones and executables (and a
//! [`Recorder`]'s recordings): the [`Module`](crate::Module), `Function` and
//! `RawKernel` handles may all be dropped once the capture has ended. In a capture
//! begun outside cuda-rt (a raw `cuStreamBeginCapture`), nothing can be kept: there
//! the module must outlive the graph's last launch (the launch's `# Safety` says so).
//!
//! # Recording without the effort
//! A step of many small kernels spends most of its time on the host, a few
//! microseconds per launch; one graph launch costs about as much as one kernel launch.
//! [`Recorder::run`] takes a key and a closure that queues the step on a stream: the
//! first call for a key captures it, instantiates and launches; later calls launch the
//! same executable without running the closure. [`Recorder::update`] runs the
//! closure again and updates the executable in place when only kernel arguments
//! changed: for a chain of kernels by setting the changed nodes' arguments alone
//! (`cuGraphExecKernelNodeSetParams`, no capture of the kernels), otherwise by a new
//! capture and `cuGraphExecUpdate`, falling back to a new instantiation when the
//! driver refuses. A bounded cache keeps the least recently used keys' executables, with
//! [`RecorderStats`]. See the [`Recorder`] docs and the `12_graphs_made_easy` example.
//!
//! # Nodes and threads
//! A [`Node`] borrows its graph and cannot outlive it; nodes are added through `&self`,
//! so several can be held while more are added. A [`Graph`] is `Send` but not `Sync`
//! (CUDA asks that calls on one graph be serialized). Kernel nodes are `unsafe`
//! ([`Graph::add_kernel_node`]) and keep their kernel's module loaded.

mod memory_usage;
mod node;
mod recorder;
pub(crate) use recorder::arguments;
mod stream_capture;

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::path::Path;
use std::sync::Arc;

pub use crate::capture::{any_capture_active, CaptureMode, CaptureStatus};
pub use crate::memory::graph_memory::capture_aware_alloc;
pub use memory_usage::{graph_memory_usage, trim_graph_memory, GraphMemoryUsage};
pub use node::{AsFunction, KernelArgs, LaunchConfig, Node};
pub use recorder::{Outcome, Recorder, RecorderStats};
pub use stream_capture::StreamCaptureExt;

use crate::capture::{info as capture_info, keep_in_capture, AllocState, Ended, LaunchRecord};

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::{explain_capture, ArgumentKind, CaptureKind, Error, Result, StateKind};
use crate::stream::AsStream;

bitflags::bitflags! {
    /// What a DOT dump of a graph shows ([`Graph::debug_dot_print`], `CUgraphDebugDot_flags`).
    /// The empty set is CuPy's default (`flags=0`): the topology with each node's kind.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DotFlags: u32 {
        /// Every detail below.
        const VERBOSE = 1;
        /// Runtime types rather than driver types, where they differ.
        const RUNTIME_TYPES = 1 << 1;
        /// Kernel node parameters (function, grid, block, shared memory, arguments).
        const KERNEL_NODE_PARAMS = 1 << 2;
        /// Memcpy node parameters.
        const MEMCPY_NODE_PARAMS = 1 << 3;
        /// Memset node parameters.
        const MEMSET_NODE_PARAMS = 1 << 4;
        /// Host node parameters.
        const HOST_NODE_PARAMS = 1 << 5;
        /// Event record and wait node parameters.
        const EVENT_NODE_PARAMS = 1 << 6;
        /// External semaphore signal node parameters.
        const EXT_SEMAS_SIGNAL_NODE_PARAMS = 1 << 7;
        /// External semaphore wait node parameters.
        const EXT_SEMAS_WAIT_NODE_PARAMS = 1 << 8;
        /// Kernel node attributes.
        const KERNEL_NODE_ATTRIBUTES = 1 << 9;
        /// Node handles.
        const HANDLES = 1 << 10;
        /// Memory allocation node parameters.
        const MEM_ALLOC_NODE_PARAMS = 1 << 11;
        /// Memory free node parameters.
        const MEM_FREE_NODE_PARAMS = 1 << 12;
        /// Batched memory operation node parameters.
        const BATCH_MEM_OP_NODE_PARAMS = 1 << 13;
        /// Extra topology information.
        const EXTRA_TOPO_INFO = 1 << 14;
        /// Conditional node parameters.
        const CONDITIONAL_NODE_PARAMS = 1 << 15;
    }
}

bitflags::bitflags! {
    /// How a graph is instantiated (`CUgraphInstantiate_flags`).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct InstantiateFlags: u64 {
        /// Free memory the graph allocated and did not free before it is launched
        /// again (set by cuda-rt on graphs that own allocations, see the module docs).
        const AUTO_FREE_ON_LAUNCH = 1;
        /// Upload the graph before its first launch, on that launch's stream. (The
        /// driver takes this flag only with an upload stream at instantiation, so
        /// cuda-rt keeps it and calls `cuGraphUpload` itself.)
        const UPLOAD = 2;
        /// The graph can be launched from the device (kernels only, no host nodes).
        const DEVICE_LAUNCH = 4;
        /// Kernel nodes run with their own priority attribute rather than the launch
        /// stream's.
        const USE_NODE_PRIORITY = 8;
    }
}

/// A CUDA graph (`CUgraph`) and, once instantiated, its executable (`CUgraphExec`).
/// Both are destroyed on drop. Made by capture ([`StreamCaptureExt::end_capture`], already
/// instantiated) or by [`Graph::new`] and the `add_*_node` methods (instantiated on
/// first launch, or by [`Graph::instantiate`]).
///
/// # Threads
/// A `Graph` is [`Send`] but not [`Sync`]: it can move to another thread, but two
/// threads cannot use one graph at the same time. CUDA does not synchronize graph
/// objects internally and asks that every call on one graph or executable be
/// serialized, even calls that look read-only (launch, which may instantiate first,
/// clone, node listing). Share a graph between threads behind a `Mutex`. Its
/// [`Node`]s borrow it, so they stay on its thread too.
///
/// # Example
/// Capture once, replay many times. The buffer is made before the graph, so it
/// outlives every replay:
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::prelude::*;
/// use cuda_rt::{CaptureMode, DeviceBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut buf = DeviceBuffer::<u32>::empty(1024)?;
/// stream.begin_capture(CaptureMode::Global)?;
/// buf.fill_async(5, &stream)?; // recorded into the graph, not run
/// let graph = stream.end_capture()?; // instantiated, as CuPy does
/// graph.upload(&stream)?; // optional: prepares the first launch
/// for _ in 0..10 {
///     graph.launch(&stream)?;
/// }
/// stream.synchronize()?;
/// assert_eq!(buf.to_vec()?, vec![5; 1024]);
/// # Ok(()) }
/// ```
pub struct Graph {
    raw: usize,
    device: i32,
    /// The executable, if instantiated (a `Cell`: lazily made by `launch(&self)`,
    /// dropped by `add_*_node(&self)`; this is what makes the graph `!Sync`).
    exec: Cell<Option<usize>>,
    flags: InstantiateFlags,
    /// What the graph's nodes refer to and must outlive: memory, events, closures,
    /// kernel modules (of kernel nodes and of captured launches). Only ever added to
    /// while the graph lives.
    keep: RefCell<Vec<Arc<dyn Any + Send + Sync>>>,
    /// Allocations of the capture that outlived it: the graph owns their blocks.
    allocs: Vec<Arc<AllocState>>,
    /// The last launch's stream, for the owned allocations.
    launches: Arc<LaunchRecord>,
    /// Whether it was ever launched (so there is work to wait for on drop).
    launched: Cell<bool>,
    /// Whether its capture noted a use of kept memory on a forked stream (see
    /// `capture::Ended::forked_uses`).
    forked_uses: bool,
}

/// How [`Graph::update_from`] went.
pub(crate) enum Updated {
    /// The executable has the new parameters.
    Made {
        /// What the graph kept for the old ones.
        old: Kept,
        /// The old graph (no executable, nothing kept), to drop.
        old_graph: Graph,
    },
    /// Nothing changed.
    Refused {
        /// The graph that was to give its parameters.
        fresh: Graph,
        /// Why, in words.
        reason: &'static str,
    },
}

/// What a graph kept alive, taken out of it (see [`Graph::take_kept`]).
pub(crate) struct Kept {
    /// The objects.
    pub(crate) items: Vec<Arc<dyn Any + Send + Sync>>,
    /// Whether work queued outside the capture, on a stream forked into it, may use
    /// some of them: then only an idle context lets them go.
    pub(crate) forked_uses: bool,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph")
            .field("graph", &format_args!("{:#x}", self.raw))
            .field("device", &self.device)
            .field("instantiated", &self.exec.get().is_some())
            .field("flags", &self.flags)
            .field("kept_alive", &self.keep.borrow().len())
            .field("owned_allocations", &self.allocs.len())
            .finish()
    }
}

impl Graph {
    /// An empty graph on the current device, to build node by node.
    pub fn new() -> Result<Graph> {
        let device = get_device_id();
        make_current(device)?;
        let raw = result::graph::create()?;
        Ok(Self::from_parts(raw, device, InstantiateFlags::empty()))
    }

    fn from_parts(raw: sys::CUgraph, device: i32, flags: InstantiateFlags) -> Graph {
        Graph {
            raw: raw as usize,
            device,
            exec: Cell::new(None),
            flags,
            keep: RefCell::new(Vec::new()),
            allocs: Vec::new(),
            launches: Arc::default(),
            launched: Cell::new(false),
            forked_uses: false,
        }
    }

    /// The graph of a finished capture, instantiated with `flags` (plus
    /// [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`] when it owns allocations).
    pub(crate) fn from_capture(
        ended: Ended,
        device: i32,
        flags: InstantiateFlags,
    ) -> Result<Graph> {
        let mut g = Self::from_ended(ended, device, flags);
        // A failed instantiation drops `g`, which abandons its allocations.
        g.instantiate(g.flags)?;
        Ok(g)
    }

    /// The graph of a finished capture, not instantiated yet: it owns the
    /// allocations the capture did not free, and keeps what the capture kept.
    pub(crate) fn from_ended(ended: Ended, device: i32, flags: InstantiateFlags) -> Graph {
        let mut g = Self::from_parts(ended.raw, device, flags);
        g.keep = RefCell::new(ended.keep);
        g.forked_uses = ended.forked_uses;
        let rec = Arc::clone(&g.launches);
        g.allocs = ended
            .allocs
            .into_iter()
            .filter(|a| a.hand_to_graph(&rec))
            .collect();
        if !g.allocs.is_empty() {
            g.flags |= InstantiateFlags::AUTO_FREE_ON_LAUNCH;
        }
        g
    }

    /// The raw `CUgraph` (owned by this value).
    pub fn as_raw(&self) -> sys::CUgraph {
        self.raw as sys::CUgraph
    }

    /// The raw `CUgraphExec`, when instantiated (owned by this value).
    pub fn exec_raw(&self) -> Option<sys::CUgraphExec> {
        self.exec.get().map(|e| e as sys::CUgraphExec)
    }

    /// The device the graph belongs to.
    pub fn device_id(&self) -> i32 {
        self.device
    }

    /// The flags the graph is (or will be) instantiated with.
    pub fn flags(&self) -> InstantiateFlags {
        self.flags
    }

    /// Whether an executable graph exists now.
    pub fn is_instantiated(&self) -> bool {
        self.exec.get().is_some()
    }

    /// How many allocations of its capture the graph owns (see the module docs).
    pub fn owned_allocation_count(&self) -> usize {
        self.allocs.len()
    }

    /// (Re-)instantiates the graph with `flags`, replacing an earlier executable
    /// (which finishes the launches already queued). A graph that owns allocations
    /// always gets [`InstantiateFlags::AUTO_FREE_ON_LAUNCH`].
    pub fn instantiate(&mut self, flags: InstantiateFlags) -> Result<()> {
        let mut flags = flags;
        if !self.allocs.is_empty() {
            flags |= InstantiateFlags::AUTO_FREE_ON_LAUNCH;
        }
        make_current(self.device)?;
        self.drop_exec();
        // SAFETY: the graph is owned by `self` and live until its drop.
        let e =
            unsafe { result::graph::instantiate_with_flags(self.as_raw(), driver_flags(flags)) }
                .map_err(|e| explain_capture(e.into(), "Graph::instantiate"))?;
        self.flags = flags;
        self.exec.set(Some(e as usize));
        Ok(())
    }

    /// Destroys the executable, if any (queued launches still finish).
    fn drop_exec(&self) {
        if let Some(e) = self.exec.take() {
            // SAFETY: the executable is owned by `self` and taken out of it here, so it
            // is destroyed once and never used again.
            let _ = unsafe { result::graph::exec_destroy(e as sys::CUgraphExec) };
        }
    }

    /// The executable, instantiated now with the graph's flags if it is not yet.
    #[inline]
    fn exec(&self) -> Result<sys::CUgraphExec> {
        match self.exec.get() {
            Some(e) => Ok(e as sys::CUgraphExec),
            None => self.instantiate_lazily(),
        }
    }

    #[cold]
    fn instantiate_lazily(&self) -> Result<sys::CUgraphExec> {
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live until its drop.
        let e = unsafe {
            result::graph::instantiate_with_flags(self.as_raw(), driver_flags(self.flags))
        }
        .map_err(|e| explain_capture(e.into(), "Graph::instantiate"))?;
        // The graph is not `Sync`: no other thread can have instantiated meanwhile.
        self.exec.set(Some(e as usize));
        Ok(e)
    }

    /// Launches the graph on `stream` (`cuGraphLaunch`), instantiating it first if
    /// needed. Launches on one stream run one after the other.
    #[inline]
    pub fn launch<S: AsStream + ?Sized>(&self, stream: &S) -> Result<()> {
        if any_capture_active() {
            refuse_launch_into_capture(stream)?;
        }
        let e = self.exec()?;
        make_current(stream.device_id())?;
        if !self.launched.get() {
            self.first_launch(e, stream.as_raw())?;
        }
        // SAFETY: the executable is owned by `self` and live until replaced or dropped;
        // the stream is live while `stream` is borrowed (`AsStream`). What the nodes
        // use is kept alive by the graph (its keep-alive list, waited for on drop).
        unsafe { result::graph::launch(e, stream.as_raw()) }
            .map_err(|e| explain_capture(e.into(), "Graph::launch"))?;
        if !self.allocs.is_empty() {
            self.launches.launched_on(stream.as_stream_ref());
        }
        Ok(())
    }

    /// Before the first launch: the upload [`InstantiateFlags::UPLOAD`] asks for, and
    /// the mark that there is work to wait for on drop.
    #[cold]
    fn first_launch(&self, e: sys::CUgraphExec, stream: sys::CUstream) -> Result<()> {
        if self.flags.contains(InstantiateFlags::UPLOAD) {
            // SAFETY: `e` is this graph's executable and `stream` the live stream of
            // the launch that calls this (see `launch`).
            unsafe { result::graph::upload(e, stream) }
                .map_err(|e| explain_capture(e.into(), "Graph::launch (upload)"))?;
        }
        self.launched.set(true);
        Ok(())
    }

    /// Uploads the executable graph to the device on `stream` ahead of its first
    /// launch (`cuGraphUpload`), instantiating it first if needed.
    pub fn upload<S: AsStream + ?Sized>(&self, stream: &S) -> Result<()> {
        let e = self.exec()?;
        make_current(stream.device_id())?;
        // SAFETY: the executable is owned by `self`; the stream is live while `stream`
        // is borrowed (`AsStream`).
        unsafe { result::graph::upload(e, stream.as_raw()) }
            .map_err(|e| explain_capture(e.into(), "Graph::upload"))
    }

    /// Gives this graph's executable the node parameters of `from` (a re-capture or
    /// re-build of the same work, with other pointers or values), without
    /// re-instantiating (`cuGraphExecUpdate`). The topology (nodes, node types,
    /// edges, kernels' functions) must be the same; otherwise an error says what
    /// differs and this executable is unchanged. This graph then keeps alive what
    /// `from` refers to as well. Either graph owning allocations of its capture (their
    /// addresses belong to each executable) is refused the same way.
    pub fn update(&mut self, from: &Graph) -> Result<()> {
        let owned = self.allocs.len().max(from.allocs.len());
        if owned != 0 {
            return Err(Error::invalid_state(
                StateKind::GraphOwnsAllocations,
                format!(
                    "Graph::update: a graph owns {owned} allocation(s) made during its \
                     capture and still referred to outside it; their addresses belong to \
                     that graph's executable, so it cannot be updated (instantiate the \
                     other graph instead)"
                ),
            ));
        }
        let e = self.exec()?;
        make_current(self.device)?;
        // SAFETY: this graph's executable and `from`'s graph are owned by them and live
        // while borrowed; `self` keeps alive what `from` refers to once updated (below).
        match unsafe { result::graph::exec_update(e, from.as_raw()) }? {
            Ok(()) => {
                let kept = from.kept();
                self.keep.get_mut().extend(kept);
                Ok(())
            }
            Err(reason) => Err(Error::invalid_argument(
                ArgumentKind::Incompatible,
                format!(
                    "Graph::update: the executable graph cannot take the other graph's \
                     parameters: {}; instantiate the other graph instead",
                    update_reason(reason)
                ),
            )),
        }
    }

    /// Gives this graph's executable the node parameters of `fresh` (a new capture of
    /// the same work) and takes `fresh`'s place: from then on this graph is `fresh`'s
    /// graph, keeping what `fresh` kept. Returns what this graph kept before, which
    /// launches queued before the update may still use (the caller lets it go once
    /// they are done), and `fresh` holding this graph's old graph (no executable,
    /// nothing kept), for the caller to drop when destroying it costs least (after the
    /// next launch is queued). When the update cannot be made (either graph owns
    /// allocations of its capture, whose addresses belong to each executable, or the
    /// driver refuses), nothing changes and `fresh` comes back with the reason.
    pub(crate) fn update_from(&mut self, mut fresh: Graph) -> Result<Updated> {
        if !self.allocs.is_empty() || !fresh.allocs.is_empty() {
            return Ok(Updated::Refused {
                fresh,
                reason: "a recording that allocates memory during its capture and keeps it \
                         past the capture owns that memory in each executable: it cannot be \
                         updated",
            });
        }
        let e = self.exec()?;
        make_current(self.device)?;
        // SAFETY: this graph's executable and `fresh`'s graph are owned by them and
        // live while borrowed; once updated, the executable refers to what `fresh`
        // keeps alive, which this graph takes over below, and launches queued before
        // go on with the old parameters, whose keep-alive list goes to the caller.
        match unsafe { result::graph::exec_update(e, fresh.as_raw()) }? {
            Ok(()) => {
                // The executable is independent of the graph it came from: this graph
                // takes `fresh`'s graph, and `fresh` the old one, which it destroys as
                // it drops.
                std::mem::swap(&mut self.raw, &mut fresh.raw);
                let old = self.take_kept();
                *self.keep.get_mut() = std::mem::take(fresh.keep.get_mut());
                self.forked_uses = fresh.forked_uses;
                Ok(Updated::Made {
                    old,
                    old_graph: fresh,
                })
            }
            Err(reason) => Ok(Updated::Refused {
                fresh,
                reason: update_reason(reason),
            }),
        }
    }

    /// Makes `new` what the graph keeps alive, and returns what it kept before (for a
    /// caller that gave its executable parameters that use only `new`'s objects, and
    /// lets the old ones go once the launches before are done).
    pub(crate) fn replace_kept(&mut self, new: Kept) -> Kept {
        let old = self.take_kept();
        *self.keep.get_mut() = new.items;
        self.forked_uses = new.forked_uses;
        old
    }

    /// Whether `kept` is what this graph keeps alive already: the same objects in the
    /// same order, and the same `forked_uses`. Replacing the one with the other would
    /// change nothing (the objects stay alive either way), so it needs no fence.
    pub(crate) fn keeps_same(&mut self, kept: &Kept) -> bool {
        let mine = self.keep.get_mut();
        self.forked_uses == kept.forked_uses
            && mine.len() == kept.items.len()
            && mine
                .iter()
                .zip(&kept.items)
                .all(|(a, b)| std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b)))
    }

    /// Takes out what the graph keeps alive, for a caller that lets it go once the
    /// graph's launches are done (the graph's drop then has nothing to wait for).
    pub(crate) fn take_kept(&mut self) -> Kept {
        Kept {
            items: std::mem::take(self.keep.get_mut()),
            forked_uses: self.forked_uses,
        }
    }

    /// A copy of the graph (`cuGraphClone`), not yet instantiated, with the same
    /// instantiate flags; it keeps alive what this graph keeps alive. An error for a
    /// graph that owns allocations of its capture (their addresses belong to this
    /// graph's executable).
    pub fn try_clone(&self) -> Result<Graph> {
        if !self.allocs.is_empty() {
            return Err(Error::invalid_state(
                StateKind::GraphOwnsAllocations,
                format!(
                    "Graph::try_clone: the graph owns {} allocation(s) made during its capture \
                     and still referred to outside it; their addresses belong to this graph, \
                     so it cannot be cloned (drop those pointers during the capture to make \
                     them free inside the graph)",
                    self.allocs.len()
                ),
            ));
        }
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live until its drop.
        let raw = unsafe { result::graph::clone(self.as_raw()) }?;
        let mut g = Self::from_parts(raw, self.device, self.flags);
        g.keep = RefCell::new(self.kept());
        Ok(g)
    }

    /// Ties `obj` (memory, an event, a kernel's module, anything the graph's nodes
    /// refer to) to the graph: it is dropped after the graph, once the graph's launches
    /// have finished. Clones, child-graph copies and updated executables of this graph
    /// keep it too.
    pub fn keep_alive(&self, obj: Arc<dyn Any + Send + Sync>) {
        self.keep_obj(obj);
    }

    /// Adds `obj` to the keep-alive list.
    fn keep_obj(&self, obj: Arc<dyn Any + Send + Sync>) {
        // No borrow of the list is ever held across a call that could reach here.
        self.keep.borrow_mut().push(obj);
    }

    /// A copy of the keep-alive list.
    fn kept(&self) -> Vec<Arc<dyn Any + Send + Sync>> {
        self.keep.borrow().clone()
    }

    /// The graph's nodes (`cuGraphGetNodes`), borrowing the graph.
    pub fn nodes(&self) -> Result<Vec<Node<'_>>> {
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live until its drop.
        Ok(unsafe { result::graph::get_nodes(self.as_raw()) }?
            .into_iter()
            .map(|n| Node::from_raw(n, self))
            .collect())
    }

    /// How many nodes the graph has.
    pub fn node_count(&self) -> Result<usize> {
        Ok(self.nodes()?.len())
    }

    /// Writes the graph in Graphviz DOT format to `path`, showing what `flags` asks for
    /// (`cuGraphDebugDotPrint`; CuPy's `debug_dot_print(path, flags)`): the empty set
    /// gives the topology, [`DotFlags::VERBOSE`] every detail the driver can print.
    pub fn debug_dot_print(&self, path: impl AsRef<Path>, flags: DotFlags) -> Result<()> {
        let path = path.as_ref();
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("the DOT path {} contains a NUL byte", path.display()),
            )
        })?;
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live until its drop.
        Ok(unsafe { result::graph::debug_dot_print(self.as_raw(), &c, flags.bits()) }?)
    }

    /// The graph in DOT format as a string, showing what `flags` asks for (through a
    /// temporary file; CuPy's `debug_dot_str`). The file lies in a folder of its own,
    /// made for the call (mode 0700, under a random name) and removed after: the
    /// driver opens the path for writing and follows links, so a predictable name in
    /// the shared temporary folder would let another user point it elsewhere.
    pub fn to_dot(&self, flags: DotFlags) -> Result<String> {
        let io = |what: &str, e: std::io::Error| {
            Error::invalid_state(StateKind::Other, format!("{what} for the DOT dump: {e}"))
        };
        let dir = tempfile::Builder::new()
            .prefix("cuda-rt-graph-")
            .tempdir()
            .map_err(|e| io("making a private temporary folder", e))?;
        let path = dir.path().join("graph.dot");
        self.debug_dot_print(&path, flags)?;
        std::fs::read_to_string(&path).map_err(|e| io(&format!("reading {}", path.display()), e))
    }

    /// Marks the executable stale after the graph changed: the next launch
    /// instantiates again.
    fn changed(&self) {
        self.drop_exec();
    }
}

/// A graph is not launched into a capture (as a recorder's executable is not, see
/// `recorder`): the captured graph would run this graph's nodes at its own launches,
/// while what this graph keeps alive (memory, modules, closures) goes with this graph,
/// and its own allocations belong to its executable. One relaxed load on the launch
/// path while no capture is under way.
#[cold]
fn refuse_launch_into_capture<S: AsStream + ?Sized>(stream: &S) -> Result<()> {
    match capture_info(stream)?.0 {
        CaptureStatus::None => Ok(()),
        _ => Err(Error::capture(
            CaptureKind::Refused,
            format!(
                "Graph::launch: stream {:#x} of device {} is capturing a graph, and a graph is \
                 not launched into another capture (the captured graph would run its nodes \
                 after this graph and what it keeps alive are gone); launch it on a stream \
                 that is not capturing, or add it with Graph::add_child_graph_node",
                stream.as_raw() as usize,
                stream.device_id()
            ),
        )),
    }
}

/// `cuGraphExecUpdate`'s reason, in words.
fn update_reason(r: sys::CUgraphExecUpdateResult) -> &'static str {
    use sys::CUgraphExecUpdateResult as U;
    match r {
        U::CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED => {
            "the topology changed (nodes or edges were added or removed)"
        }
        U::CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED => "a node's type changed",
        U::CU_GRAPH_EXEC_UPDATE_ERROR_FUNCTION_CHANGED => {
            "a kernel node's function changed in a way an update cannot follow"
        }
        U::CU_GRAPH_EXEC_UPDATE_ERROR_UNSUPPORTED_FUNCTION_CHANGE => {
            "a kernel node's function changed in an unsupported way"
        }
        U::CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED => {
            "a node's parameters changed in a way an update cannot follow (e.g. a memcpy \
             between other kinds of memory, or memory of another device)"
        }
        U::CU_GRAPH_EXEC_UPDATE_ERROR_NOT_SUPPORTED => {
            "a node cannot be updated (memory nodes, for instance)"
        }
        U::CU_GRAPH_EXEC_UPDATE_ERROR_ATTRIBUTES_CHANGED => "a node's attributes changed",
        _ => "the driver refused the update",
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Inside a host function the driver may not be called: the graph (and what it keeps) stays
        // (leaked), as memory dropped there is (docs/soundness.md, "Host functions").
        if result::stream::in_host_function() {
            return;
        }
        let _ = make_current(self.device);
        // What the graph keeps alive may be in use by queued launches, or by work
        // queued outside the capture on a stream that joined it (noted as the
        // capture's, see `capture::enqueue_using`): wait for them.
        if !self.keep.get_mut().is_empty() {
            let _ = result::context::synchronize();
        }
        // Allocations of a graph never launched never existed: refuse their pointers.
        for a in &self.allocs {
            a.graph_gone();
        }
        self.drop_exec();
        // SAFETY: the graph is owned by `self`, destroyed once, here; its nodes borrow
        // `self`, so none outlives it.
        let _ = unsafe { result::graph::destroy(self.as_raw()) };
        // `keep` and `allocs` drop now; owned allocations free themselves once no
        // pointer to them is left.
    }
}

/// `StreamCaptureExt::launch_host_func_repeatable`: a host node in the graph `s` captures
/// into, or a plain one-off host function when `s` is not capturing.
pub(crate) fn launch_repeatable_host_func<S: AsStream + ?Sized>(
    s: &S,
    f: Box<dyn Fn() + Send + Sync + 'static>,
) -> Result<()> {
    let (status, g) = capture_info(s)?;
    match status {
        // SAFETY: the stream is live while `s` is borrowed (`AsStream`), its context
        // made current by the caller (`context_for`).
        CaptureStatus::None => Ok(unsafe { result::stream::launch_host_func(s.as_raw(), f) }?),
        CaptureStatus::Invalidated => Err(Error::capture(
            CaptureKind::Invalidated,
            format!(
                "launch_host_func_repeatable on stream {:#x}: its capture was invalidated by an \
                 operation not allowed during a capture; end it and capture again",
                s.as_raw() as usize
            ),
        )),
        CaptureStatus::Active { .. } => {
            let f = Arc::new(result::graph::SharedHostFn(f));
            // The graph owns a reference through a user object; the Graph that comes
            // of the capture keeps one too.
            keep_in_capture(s, f.clone())?;
            // SAFETY: the stream is live while `s` is borrowed and captures into `g`
            // (just asked: an active capture's graph lives until the capture ends).
            Ok(unsafe { result::graph::launch_captured_host_fn(s.as_raw(), g, &f) }?)
        }
    }
}

/// The flags the driver's `cuGraphInstantiateWithFlags` accepts: all but `UPLOAD`,
/// which cuda-rt carries out itself at the first launch.
fn driver_flags(flags: InstantiateFlags) -> u64 {
    (flags - InstantiateFlags::UPLOAD).bits()
}
