//! Explicit graphs: nodes added one by one with their dependencies.
//!
//! Every `add_*_node` method takes the nodes the new one depends on (nodes of the same
//! graph; empty for a root) and returns the new [`Node`], which borrows the graph: it
//! cannot outlive it, and a node of another graph given as a dependency is an error.
//! The methods take `&self`, so several nodes can be held while more are added. What a
//! node refers to (memory, events, closures, kernel modules, a child graph's kept
//! objects) is kept alive by the graph. Adding a node to an instantiated graph drops
//! its executable: the next launch instantiates the graph again.
//!
//! Kernel nodes run arbitrary device code with caller-chosen arguments, so
//! [`Graph::add_kernel_node`] is `unsafe`, as a kernel launch is.

use std::any::Any;
use std::ffi::c_void;
use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::compiler::RawKernel;
use crate::device::context::{make_current, primary};
use crate::error::{ArgumentKind, Error, Result, StateKind};
use crate::event::Event;
use crate::graph::Graph;
use crate::memory::{MemoryPointer, Pod};
use crate::module::Function;

/// A node of a graph (`CUgraphNode`). It borrows its graph (`'g`), so it cannot be
/// used once the graph is dropped; it remembers which graph it belongs to, so giving it
/// as a dependency to another graph is an error rather than a driver call with a
/// foreign node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Node<'g> {
    raw: usize,
    /// The `CUgraph` the node belongs to.
    graph: usize,
    _graph: PhantomData<&'g Graph>,
}

impl<'g> Node<'g> {
    /// A node of `graph`, borrowing it.
    pub(crate) fn from_raw(n: sys::CUgraphNode, graph: &'g Graph) -> Node<'g> {
        Node {
            raw: n as usize,
            graph: graph.raw,
            _graph: PhantomData,
        }
    }

    /// The raw `CUgraphNode` (valid while the graph lives).
    pub fn as_raw(&self) -> sys::CUgraphNode {
        self.raw as sys::CUgraphNode
    }

    /// The raw `CUgraph` the node belongs to.
    pub fn graph_raw(&self) -> sys::CUgraph {
        self.graph as sys::CUgraph
    }

    /// The node's type (`cuGraphNodeGetType`).
    pub fn node_type(&self) -> Result<sys::CUgraphNodeType> {
        // SAFETY: the node borrows its graph (`'g`), which is live.
        Ok(unsafe { result::graph::node_get_type(self.as_raw()) }?)
    }
}

/// The raw handles of `deps`, all nodes of the graph `graph` (a raw `CUgraph` as an
/// integer); a node of another graph is an error naming `what`.
fn dep_handles(graph: usize, what: &str, deps: &[Node<'_>]) -> Result<Vec<sys::CUgraphNode>> {
    if let Some(n) = deps.iter().find(|n| n.graph != graph) {
        return Err(Error::invalid_argument(
            ArgumentKind::Incompatible,
            format!(
                "{what}: dependency node {:#x} belongs to graph {:#x}, not to this graph \
                 ({graph:#x}); dependencies must be nodes of the graph the node is added to",
                n.raw, n.graph
            ),
        ));
    }
    Ok(deps.iter().map(Node::as_raw).collect())
}

/// A loaded kernel function (`CUfunction`) a graph kernel node can run: [`Function`]
/// and [`RawKernel`] implement it.
///
/// # Safety
/// The driver trusts the handle, so implementers guarantee that:
/// - [`as_raw`](AsFunction::as_raw) returns a live `CUfunction` loaded in the primary
///   context of device [`device_id`](AsFunction::device_id), the same handle on every
///   call;
/// - the function stays loaded (its module is not unloaded) for at least as long as
///   the object [`keep_alive`](AsFunction::keep_alive) returns lives (the graph keeps
///   that object for its life, its clones' and its executables');
/// - [`param_sizes`](AsFunction::param_sizes), when `Some`, are the kernel's
///   parameter sizes in bytes, in order.
pub unsafe trait AsFunction {
    /// The raw `CUfunction`.
    fn as_raw(&self) -> sys::CUfunction;

    /// The device whose primary context the function is loaded in.
    fn device_id(&self) -> i32;

    /// An object that keeps the function loaded while it lives (for a [`Function`],
    /// its module).
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync>;

    /// The sizes of the kernel's parameters in bytes, when known (CUDA 12.4+ drivers
    /// report them); `None` when they cannot be told, and then an argument list of the
    /// wrong length or sizes cannot be caught before the driver reads it.
    fn param_sizes(&self) -> Option<&[usize]> {
        None
    }
}

// SAFETY: a `Function` is a live function of its module, loaded in the primary
// context of its device; a clone of it keeps the module loaded; its parameter sizes
// are the driver's.
unsafe impl AsFunction for Function {
    fn as_raw(&self) -> sys::CUfunction {
        Function::as_raw(self)
    }
    fn device_id(&self) -> i32 {
        Function::device_id(self)
    }
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        Arc::new(self.clone())
    }
    fn param_sizes(&self) -> Option<&[usize]> {
        // An error says why the driver cannot tell (see `Function::param_sizes`).
        Function::param_sizes(self).ok()
    }
}

// SAFETY: as for the `Function` it holds.
unsafe impl AsFunction for RawKernel {
    fn as_raw(&self) -> sys::CUfunction {
        self.function().as_raw()
    }
    fn device_id(&self) -> i32 {
        self.function().device_id()
    }
    fn keep_alive(&self) -> Arc<dyn Any + Send + Sync> {
        AsFunction::keep_alive(self.function())
    }
    fn param_sizes(&self) -> Option<&[usize]> {
        self.function().param_sizes().ok()
    }
}

pub use crate::launch::LaunchConfig;

/// A kernel's arguments in order: plain values and device pointers. Pointers keep
/// their memory alive in the graph that gets them.
#[derive(Default)]
pub struct KernelArgs {
    /// Each argument's bytes, in 8-byte-aligned storage.
    values: Vec<Box<[u64]>>,
    /// Each argument's size in bytes.
    sizes: Vec<usize>,
    memory: Vec<MemoryPointer>,
}

impl std::fmt::Debug for KernelArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("count", &self.values.len())
            .field("sizes", &self.sizes)
            .field("pointers", &self.memory.len())
            .finish()
    }
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    /// Appends a value argument (`int`, `float`, a struct of plain data...). An
    /// address passed this way (a `u64`) is not kept alive by anyone.
    pub fn push<T: Pod>(&mut self, value: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let mut words = vec![0u64; size.div_ceil(8).max(1)].into_boxed_slice();
        let bytes = crate::memory::pod::as_bytes(std::slice::from_ref(&value));
        for (i, b) in bytes.iter().enumerate() {
            let w = &mut words[i / 8];
            *w |= u64::from(*b) << ((i % 8) * 8);
        }
        // The little-endian packing above puts byte i at address i on every CUDA host.
        self.values.push(words);
        self.sizes.push(size);
        self
    }

    /// Appends a device-pointer argument (`T*` in the kernel): the pointer's address.
    /// The graph the arguments go to keeps the memory alive.
    pub fn push_ptr(&mut self, p: &MemoryPointer) -> &mut Self {
        self.values.push(vec![p.ptr()].into_boxed_slice());
        self.sizes.push(std::mem::size_of::<u64>());
        self.memory.push(p.clone());
        self
    }

    /// How many arguments.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The arguments' sizes in bytes, in order.
    pub fn sizes(&self) -> &[usize] {
        &self.sizes
    }

    /// The `void**` array the driver reads: one pointer per argument, valid while
    /// `self` is not changed.
    fn pointers(&self) -> Vec<*mut c_void> {
        self.values
            .iter()
            .map(|w| w.as_ptr().cast_mut().cast::<c_void>())
            .collect()
    }

    /// Checks the arguments against the kernel's parameter sizes, where known.
    fn check(&self, expected: Option<&[usize]>) -> Result<()> {
        match expected {
            Some(e) if e != self.sizes.as_slice() => Err(Error::invalid_argument(
                ArgumentKind::KernelArguments,
                format!(
                    "add_kernel_node: the kernel takes {} parameter(s) of sizes {e:?} bytes; the \
                     arguments are {} of sizes {:?} bytes",
                    e.len(),
                    self.sizes.len(),
                    self.sizes
                ),
            )),
            _ => Ok(()),
        }
    }
}

/// The driver's kernel node parameters for `func` run with `cfg` and the parameter
/// array `params`.
fn kernel_params(
    func: sys::CUfunction,
    cfg: &LaunchConfig,
    params: &[*mut c_void],
) -> sys::CUDA_KERNEL_NODE_PARAMS {
    sys::CUDA_KERNEL_NODE_PARAMS {
        func,
        gridDimX: cfg.grid.x,
        gridDimY: cfg.grid.y,
        gridDimZ: cfg.grid.z,
        blockDimX: cfg.block.x,
        blockDimY: cfg.block.y,
        blockDimZ: cfg.block.z,
        sharedMemBytes: cfg.shared_mem_bytes,
        kernelParams: if params.is_empty() {
            std::ptr::null_mut()
        } else {
            params.as_ptr().cast_mut()
        },
        extra: std::ptr::null_mut(),
        kern: std::ptr::null_mut(),
        ctx: std::ptr::null_mut(),
    }
}

impl Graph {
    /// The raw handles of `deps`, refusing nodes of another graph.
    fn deps(&self, what: &str, deps: &[Node<'_>]) -> Result<Vec<sys::CUgraphNode>> {
        dep_handles(self.raw, what, deps)
    }

    /// The new node `n`: the executable (if any) is stale now.
    fn added(&self, n: sys::CUgraphNode) -> Node<'_> {
        self.changed();
        Node::from_raw(n, self)
    }

    /// An empty node: a join point for dependencies.
    pub fn add_empty_node(&self, deps: &[Node<'_>]) -> Result<Node<'_>> {
        let deps = self.deps("add_empty_node", deps)?;
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them).
        let n = unsafe { result::graph::add_empty_node(self.as_raw(), &deps) }?;
        Ok(self.added(n))
    }

    /// A kernel node from a raw function and a raw parameter array
    /// (`cuGraphAddKernelNode`; the driver copies the parameter values). Nothing is
    /// kept alive for it.
    ///
    /// # Safety
    /// The kernel runs with these arguments on every launch of this graph, of its
    /// clones, of graphs it is copied into as a child and of executables updated
    /// from it. The caller guarantees that:
    /// - `func` is a live function of this graph's device's primary context, and stays
    ///   loaded for as long as any of those can be launched (hand its module to
    ///   [`Graph::keep_alive`] to make sure);
    /// - `params` holds one pointer per kernel parameter, each to a value of that
    ///   parameter's type (read during this call);
    /// - every address the kernel dereferences is valid for every access it makes, on
    ///   every such launch, for as long as any of those can be launched.
    pub unsafe fn add_kernel_node_raw(
        &self,
        deps: &[Node<'_>],
        func: sys::CUfunction,
        cfg: LaunchConfig,
        params: &[*mut c_void],
    ) -> Result<Node<'_>> {
        let deps = self.deps("add_kernel_node_raw", deps)?;
        make_current(self.device)?;
        let p = kernel_params(func, &cfg, params);
        // SAFETY: the graph is owned by `self` and live, `deps` are nodes of it; the
        // caller vouches for the function, the parameter array and the kernel (see
        // `# Safety`).
        let n = unsafe { result::graph::add_kernel_node(self.as_raw(), &deps, &p) }?;
        Ok(self.added(n))
    }

    /// A kernel node of `func` with `args` (`cuGraphAddKernelNode`). The graph keeps
    /// `func`'s module loaded (through [`AsFunction::keep_alive`]) and the memory
    /// passed with [`KernelArgs::push_ptr`] allocated, for its own life and that of its
    /// clones, child-graph copies and executables. Where the driver reports the
    /// kernel's parameter sizes (CUDA 12.4+), arguments of the wrong number or sizes
    /// are an error; older drivers cannot tell, and nothing is checked.
    ///
    /// # Safety
    /// The kernel runs arbitrary device code with these arguments on every launch of
    /// this graph, of its clones, of graphs it is copied into as a child and of
    /// executables updated from it. The caller guarantees that:
    /// - `args` match the kernel's parameters in number, order and type;
    /// - every address the kernel dereferences is valid for every access it makes, on
    ///   every such launch, for as long as any of those can be launched. Memory passed
    ///   with [`KernelArgs::push_ptr`] stays allocated that long (the graph keeps it),
    ///   so for it the caller guarantees only that the kernel stays within its bytes
    ///   (from the pointer to the end of its allocation) and does not race with other
    ///   work using it; an address passed as a plain value ([`KernelArgs::push`]) is
    ///   kept alive by no one, and the caller keeps it valid.
    pub unsafe fn add_kernel_node<F: AsFunction + ?Sized>(
        &self,
        deps: &[Node<'_>],
        func: &F,
        cfg: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<Node<'_>> {
        let deps = self.deps("add_kernel_node", deps)?;
        if func.device_id() != self.device {
            return Err(Error::invalid_argument(
                ArgumentKind::WrongDevice {
                    expected: self.device,
                    found: func.device_id(),
                },
                format!(
                    "add_kernel_node: the kernel is loaded on device {} but the graph belongs \
                     to device {}",
                    func.device_id(),
                    self.device
                ),
            ));
        }
        args.check(func.param_sizes())?;
        for m in &args.memory {
            // The graph keeps this memory for the kernel: graph memory must exist outside
            // its capture for that to mean anything.
            m.mem().check_use(None)?;
        }
        let keep = func.keep_alive();
        let ptrs = args.pointers();
        make_current(self.device)?;
        let p = kernel_params(func.as_raw(), &cfg, &ptrs);
        // SAFETY: `AsFunction` (an unsafe trait) names a live function of this graph's
        // device, kept loaded by `keep` from now on; `ptrs` has one pointer per
        // argument, each to its 8-byte-aligned value, alive for the call; their match
        // with the kernel's parameters, and the kernel's soundness, are the caller's part
        // (see `# Safety`). The graph is owned by `self`, `deps` are nodes of it.
        let n = unsafe { result::graph::add_kernel_node(self.as_raw(), &deps, &p) }?;
        self.keep_obj(keep);
        for m in &args.memory {
            self.keep_obj(Arc::new(m.clone()));
        }
        Ok(self.added(n))
    }

    /// A device-to-device copy node of `bytes` bytes from `src` to `dst`
    /// (`cuGraphAddMemcpyNode`). Both are kept alive by the graph.
    pub fn add_memcpy_node(
        &self,
        deps: &[Node<'_>],
        dst: &MemoryPointer,
        src: &MemoryPointer,
        bytes: usize,
    ) -> Result<Node<'_>> {
        if bytes > dst.size() || bytes > src.size() {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: bytes as u64,
                    available: dst.size().min(src.size()) as u64,
                },
                format!(
                    "add_memcpy_node: {bytes} bytes do not fit (destination has {}, source {})",
                    dst.size(),
                    src.size()
                ),
            ));
        }
        if bytes != 0 {
            // A node runs outside any capture: graph memory must exist by then.
            dst.mem().check_use(None)?;
            src.mem().check_use(None)?;
        }
        let deps = self.deps("add_memcpy_node", deps)?;
        make_current(self.device)?;
        let ctx = primary(self.device)?;
        let p = sys::CUDA_MEMCPY3D {
            srcMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
            srcDevice: src.ptr(),
            dstMemoryType: sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED,
            dstDevice: dst.ptr(),
            WidthInBytes: bytes,
            Height: 1,
            Depth: 1,
            // Everything else zero: no offsets, no pitches, no arrays.
            ..Default::default()
        };
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them); the primary context is retained for the
        // life of the process; `bytes` fit behind both pointers (checked above), and
        // the graph keeps both memories allocated (below) as long as it can run.
        let n = unsafe { result::graph::add_memcpy_node(self.as_raw(), &deps, &p, ctx) }?;
        self.keep_obj(Arc::new(dst.clone()));
        self.keep_obj(Arc::new(src.clone()));
        Ok(self.added(n))
    }

    /// A memset node: `count` elements of `element_size` bytes (1, 2 or 4) at `dst`
    /// set to `value` (its low `element_size` bytes) (`cuGraphAddMemsetNode`). `dst`
    /// is kept alive by the graph.
    pub fn add_memset_node(
        &self,
        deps: &[Node<'_>],
        dst: &MemoryPointer,
        value: u32,
        element_size: u32,
        count: usize,
    ) -> Result<Node<'_>> {
        if !matches!(element_size, 1 | 2 | 4) {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("add_memset_node: element size {element_size} is not 1, 2 or 4"),
            ));
        }
        let bytes = count.checked_mul(element_size as usize);
        if bytes.is_none_or(|b| b > dst.size()) {
            return Err(Error::invalid_argument(
                ArgumentKind::OutOfBounds {
                    requested: bytes.map_or(u64::MAX, |b| b as u64),
                    available: dst.size() as u64,
                },
                format!(
                    "add_memset_node: {count} elements of {element_size} bytes do not fit in {} \
                     bytes",
                    dst.size()
                ),
            ));
        }
        if count != 0 {
            // As for copies: graph memory must exist outside its capture.
            dst.mem().check_use(None)?;
        }
        let deps = self.deps("add_memset_node", deps)?;
        make_current(self.device)?;
        let ctx = primary(self.device)?;
        let p = sys::CUDA_MEMSET_NODE_PARAMS {
            dst: dst.ptr(),
            pitch: 0,
            value,
            elementSize: element_size,
            width: count,
            height: 1,
        };
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them); the primary context is retained for the
        // life of the process; the elements fit behind `dst` (checked above), and the
        // graph keeps its memory allocated (below) as long as it can run.
        let n = unsafe { result::graph::add_memset_node(self.as_raw(), &deps, &p, ctx) }?;
        self.keep_obj(Arc::new(dst.clone()));
        Ok(self.added(n))
    }

    /// A host node: `f` runs on a driver thread each time the graph runs, in
    /// dependency order (`cuGraphAddHostNode`). `f` lives as long as the graph and
    /// every executable, clone or child node made from it; a panic in it is caught
    /// (see [`host_func_panic_count`](crate::stream::host_func_panic_count)). A
    /// cuda-rt call in `f` returns
    /// [`StateKind::InHostFunction`], as CUDA forbids
    /// CUDA calls there.
    pub fn add_host_node<F>(&self, deps: &[Node<'_>], f: F) -> Result<Node<'_>>
    where
        F: Fn() + Send + Sync + 'static,
    {
        let deps = self.deps("add_host_node", deps)?;
        make_current(self.device)?;
        let f = Arc::new(result::graph::SharedHostFn(Box::new(f)));
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them).
        let n = unsafe { result::graph::add_host_node(self.as_raw(), &deps, &f) }?;
        self.keep_obj(f);
        Ok(self.added(n))
    }

    /// A node that records `event` when it runs (`cuGraphAddEventRecordNode`). The
    /// event is kept alive by the graph and counts as recorded from now on.
    pub fn add_event_record_node(&self, deps: &[Node<'_>], event: Arc<Event>) -> Result<Node<'_>> {
        self.check_event(&event)?;
        let deps = self.deps("add_event_record_node", deps)?;
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them); the event is kept alive by the graph (below).
        let n =
            unsafe { result::graph::add_event_record_node(self.as_raw(), &deps, event.as_raw()) }?;
        event.mark_recorded();
        self.keep_obj(event);
        Ok(self.added(n))
    }

    /// A node that waits for `event`'s last record before its dependents run
    /// (`cuGraphAddEventWaitNode`). The event is kept alive by the graph.
    pub fn add_event_wait_node(&self, deps: &[Node<'_>], event: Arc<Event>) -> Result<Node<'_>> {
        self.check_event(&event)?;
        let deps = self.deps("add_event_wait_node", deps)?;
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them); the event is kept alive by the graph (below).
        let n =
            unsafe { result::graph::add_event_wait_node(self.as_raw(), &deps, event.as_raw()) }?;
        self.keep_obj(event);
        Ok(self.added(n))
    }

    fn check_event(&self, event: &Event) -> Result<()> {
        if event.device_id() != self.device {
            return Err(Error::invalid_argument(
                ArgumentKind::WrongDevice {
                    expected: self.device,
                    found: event.device_id(),
                },
                format!(
                    "an event of device {} cannot be a node of a graph of device {}",
                    event.device_id(),
                    self.device
                ),
            ));
        }
        Ok(())
    }

    /// A node that runs a copy of `child` (`cuGraphAddChildGraphNode`): later changes
    /// to `child` do not reach it. This graph keeps alive what `child` keeps alive.
    /// An error for a child that owns allocations of its capture.
    pub fn add_child_graph_node(&self, deps: &[Node<'_>], child: &Graph) -> Result<Node<'_>> {
        if !child.allocs.is_empty() {
            return Err(Error::invalid_state(
                StateKind::GraphOwnsAllocations,
                "add_child_graph_node: the child graph owns allocations of its capture, whose \
                 addresses belong to it; it cannot be copied into another graph",
            ));
        }
        let deps = self.deps("add_child_graph_node", deps)?;
        make_current(self.device)?;
        // SAFETY: the graph is owned by `self` and live; `deps` are nodes of it (`deps`
        // checked them); `child` is owned by its `Graph`, live while borrowed (the driver
        // copies it).
        let n =
            unsafe { result::graph::add_child_graph_node(self.as_raw(), &deps, child.as_raw()) }?;
        let kept = child.kept();
        self.keep.borrow_mut().extend(kept);
        Ok(self.added(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(raw: usize, graph: usize) -> Node<'static> {
        Node {
            raw,
            graph,
            _graph: PhantomData,
        }
    }

    #[test]
    fn kernel_args_pack_values_little_endian_and_aligned() {
        let mut a = KernelArgs::new();
        a.push(7i32)
            .push(1.5f32)
            .push(u64::MAX)
            .push([1u8, 2, 3, 4, 5, 6, 7, 8, 9]);
        assert_eq!(a.len(), 4);
        assert_eq!(a.values[0][0], 7);
        assert_eq!(a.values[1][0], u64::from(1.5f32.to_bits()));
        assert_eq!(a.values[2][0], u64::MAX);
        assert_eq!(a.values[3].len(), 2);
        assert_eq!(a.values[3][1], 9);
        assert_eq!(a.sizes(), &[4, 4, 8, 9]);
        let p = a.pointers();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|q| (*q as usize).is_multiple_of(8)));
    }

    #[test]
    fn kernel_args_are_checked_against_known_parameter_sizes() {
        let mut a = KernelArgs::new();
        a.push(1u64).push(2i32);
        assert!(a.check(None).is_ok(), "unknown sizes: nothing to check");
        assert!(a.check(Some(&[8, 4])).is_ok());
        let e = a.check(Some(&[8])).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    kind: ArgumentKind::KernelArguments,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("1 parameter(s)"), "{e}");
        let e = a.check(Some(&[8, 8])).unwrap_err();
        assert!(e.to_string().contains("[8, 8]"), "{e}");
    }

    #[test]
    fn a_node_of_another_graph_is_refused_as_a_dependency() {
        let mine = [node(0x10, 0xa), node(0x20, 0xa)];
        assert_eq!(
            dep_handles(0xa, "x", &mine).unwrap(),
            vec![0x10 as sys::CUgraphNode, 0x20 as sys::CUgraphNode]
        );
        let mixed = [node(0x10, 0xa), node(0x30, 0xb)];
        let e = dep_handles(0xa, "add_empty_node", &mixed).unwrap_err();
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    kind: ArgumentKind::Incompatible,
                    ..
                }
            ),
            "{e}"
        );
        let s = e.to_string();
        assert!(s.contains("add_empty_node"), "{s}");
        assert!(s.contains("belongs to graph 0xb"), "{s}");
        assert!(dep_handles(0xa, "x", &[]).unwrap().is_empty());
    }

    #[test]
    fn launch_config_linear_is_one_dimensional() {
        let c = LaunchConfig::new(4, 256);
        assert_eq!(c.grid, (4, 1, 1).into());
        assert_eq!(c.block, (256, 1, 1).into());
        assert_eq!(c.shared_mem_bytes, 0);
    }
}
