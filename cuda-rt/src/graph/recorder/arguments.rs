//! Updates in place without capturing the work: a recording made only of kernels
//! launched one after another on the capture stream takes new kernel arguments node by
//! node (`cuGraphExecKernelNodeSetParams`), with no capture of the kernels and no
//! `cuGraphExecUpdate` over the whole graph.
//!
//! How: while the closure runs for an update, the capture stream is capturing (so
//! that anything it queues other than those launches is captured, never run), and
//! cuda-rt's typed launches on that stream are taken here instead of being queued
//! ([`take`]): their function, shape and argument bytes. The update is made this way
//! only when the capture ends with no node at all (every piece of work was such a
//! launch) and the launches match the recording's kernel nodes one for one (same
//! functions, shapes and shared memory); otherwise the recorder captures the closure
//! again as usual.
//!
//! The node handles are those of the graph the executable was instantiated from, which
//! the recording keeps while it keeps them ([`KernelNodes`]).

use std::cell::{Cell, RefCell};
use std::ffi::c_void;

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::error::Result;
use crate::launch::{KernelArg, LaunchConfig};
use crate::module::Function;
use crate::stream::AsStream;

thread_local! {
    /// The handle of the stream whose typed launches this thread takes (0: none).
    static TAKING: Cell<usize> = const { Cell::new(0) };
    /// What was taken, reused from one update to the next.
    static TAKEN: RefCell<Launches> = RefCell::new(Launches::default());
}

#[cfg(any(test, feature = "test-util"))]
thread_local! {
    /// How many more node updates this thread makes before one fails as the driver's
    /// would (`usize::MAX`: never); set by `testing::fail_kernel_node_updates_after`.
    static FAIL_AFTER: Cell<usize> = const { Cell::new(usize::MAX) };
}

/// Makes this thread's node updates fail after `n` more succeed (`None`: never fail),
/// for the tests of a partial update, which no driver refusal makes on demand.
#[cfg(any(test, feature = "test-util"))]
pub(crate) fn fail_node_updates_after(n: Option<usize>) {
    FAIL_AFTER.with(|f| f.set(n.unwrap_or(usize::MAX)));
}

/// Whether this node update is the one to fail (`fail_node_updates_after`).
#[cfg(any(test, feature = "test-util"))]
fn failing_now() -> bool {
    FAIL_AFTER.with(|f| match f.get() {
        usize::MAX => false,
        0 => true,
        n => {
            f.set(n - 1);
            false
        }
    })
}

/// Outside the tests no update fails on purpose.
#[cfg(not(any(test, feature = "test-util")))]
#[inline(always)]
fn failing_now() -> bool {
    false
}

/// What identifies a kernel node apart from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Shape {
    func: usize,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
}

impl Shape {
    fn of_node(p: &sys::CUDA_KERNEL_NODE_PARAMS) -> Shape {
        Shape {
            func: p.func as usize,
            grid: [p.gridDimX, p.gridDimY, p.gridDimZ],
            block: [p.blockDimX, p.blockDimY, p.blockDimZ],
            shared_mem: p.sharedMemBytes,
        }
    }
}

/// Launches taken: their shapes and their arguments' bytes, each argument in its own
/// run of 16-byte slots (so that every value the driver reads is aligned).
#[derive(Debug, Default)]
pub(crate) struct Launches {
    shapes: Vec<Shape>,
    /// Per launch, its arguments' range in `args`.
    ranges: Vec<(u32, u32)>,
    /// Per argument, its first slot and its size in bytes.
    args: Vec<(u32, u32)>,
    slots: Vec<u128>,
    /// The modules of the launches taken so far (their identities): each is kept by
    /// the update's capture once.
    modules: Vec<usize>,
}

impl Launches {
    fn clear(&mut self) {
        self.shapes.clear();
        self.ranges.clear();
        self.args.clear();
        self.slots.clear();
        self.modules.clear();
    }

    /// Notes `f`'s module; `true` the first time in this update.
    fn new_module(&mut self, f: &Function) -> bool {
        let id = f.module_identity();
        if self.modules.contains(&id) {
            return false;
        }
        self.modules.push(id);
        true
    }

    fn push(&mut self, f: &Function, config: &LaunchConfig, args: &[&dyn KernelArg]) {
        let first = self.args.len() as u32;
        for a in args {
            // SAFETY: `param_ptr` points at the argument's value, `param_size` bytes
            // readable for the call (`KernelArg`'s contract).
            unsafe { self.push_arg(a.param_ptr(), a.param_size()) };
        }
        self.end_launch(first, f, config);
    }

    /// # Safety
    /// `params[i]` points at `sizes[i]` readable bytes, for each `i`.
    unsafe fn push_raw(
        &mut self,
        f: &Function,
        config: &LaunchConfig,
        params: &[*mut c_void],
        sizes: &[usize],
    ) {
        let first = self.args.len() as u32;
        for (&p, &size) in params.iter().zip(sizes) {
            // SAFETY: the caller's promise.
            unsafe { self.push_arg(p, size) };
        }
        self.end_launch(first, f, config);
    }

    /// # Safety
    /// `value` points at `size` readable bytes.
    unsafe fn push_arg(&mut self, value: *mut c_void, size: usize) {
        let start = self.slots.len();
        self.slots.resize(start + size.div_ceil(16).max(1), 0);
        // SAFETY: `value` holds `size` readable bytes (caller); the slots just added
        // hold at least that many bytes and do not overlap the value.
        unsafe {
            std::ptr::copy_nonoverlapping(
                value.cast::<u8>().cast_const(),
                self.slots.as_mut_ptr().add(start).cast::<u8>(),
                size,
            )
        };
        self.args.push((start as u32, size as u32));
    }

    fn end_launch(&mut self, first: u32, f: &Function, config: &LaunchConfig) {
        self.ranges.push((first, self.args.len() as u32));
        self.shapes.push(Shape {
            func: f.as_raw() as usize,
            grid: config.grid.to_array(),
            block: config.block.to_array(),
            shared_mem: config.shared_mem_bytes,
        });
    }

    /// The bytes of launch `i`'s argument `j` (an index into `args`).
    fn arg_bytes(&self, j: usize) -> &[u8] {
        let (start, size) = self.args[j];
        // SAFETY: the slots from `start` hold at least `size` initialised bytes (`push`).
        unsafe {
            std::slice::from_raw_parts(
                self.slots.as_ptr().add(start as usize).cast::<u8>(),
                size as usize,
            )
        }
    }
}

/// Whether this thread takes the typed launches on `stream` (a raw handle) now.
#[inline]
pub(crate) fn takes(stream: usize) -> bool {
    stream != 0 && TAKING.with(Cell::get) == stream
}

/// Takes a typed launch of `f` on `stream` (its arguments checked already) instead of
/// queueing it; the update's capture keeps `f`'s module, as a captured launch's (once
/// per module and update).
#[cold]
pub(crate) fn take<S: AsStream + ?Sized>(
    f: &Function,
    stream: &S,
    config: &LaunchConfig,
    args: &[&dyn KernelArg],
) {
    let new_module = TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        t.push(f, config, args);
        t.new_module(f)
    });
    if new_module {
        f.keep_module_for_capture(stream);
    }
}

/// [`take`] for a launch with raw parameter pointers (their count checked against
/// `sizes`, the kernel's parameter sizes).
///
/// # Safety
/// `params[i]` points at a readable value of `sizes[i]` bytes (the launch's own
/// `# Safety`: a value of the kernel's i-th parameter type).
#[cold]
pub(crate) unsafe fn take_raw<S: AsStream + ?Sized>(
    f: &Function,
    stream: &S,
    config: &LaunchConfig,
    params: &[*mut c_void],
    sizes: &[usize],
) {
    let new_module = TAKEN.with(|t| {
        let mut t = t.borrow_mut();
        // SAFETY: the caller's promise.
        unsafe { t.push_raw(f, config, params, sizes) };
        t.new_module(f)
    });
    if new_module {
        f.keep_module_for_capture(stream);
    }
}

/// Whether this thread takes launches for an update now (a closure that updates
/// another recorder inside an update: that inner update captures as usual).
pub(crate) fn busy() -> bool {
    TAKING.with(Cell::get) != 0
}

/// Runs `run` while this thread takes the typed launches on `stream` (a raw handle,
/// not 0), what was taken before forgotten; taking stops when `run` returns or
/// unwinds. Read what was taken with [`with_taken`].
pub(crate) fn taking<R>(stream: usize, run: impl FnOnce() -> R) -> R {
    struct Stop;
    impl Drop for Stop {
        fn drop(&mut self) {
            TAKING.with(|t| t.set(0));
        }
    }
    TAKEN.with(|t| t.borrow_mut().clear());
    TAKING.with(|t| t.set(stream));
    let _stop = Stop;
    run()
}

/// `f` of the launches the last [`taking`] of this thread took.
pub(crate) fn with_taken<T>(f: impl FnOnce(&Launches) -> T) -> T {
    TAKEN.with(|t| f(&t.borrow()))
}

/// A recording's kernel nodes in launch order, with what each holds now.
#[derive(Debug)]
pub(crate) struct KernelNodes {
    /// Nodes of the graph the executable was instantiated from.
    nodes: Vec<usize>,
    /// Each node's function and shape as the executable has them, when
    /// `shapes_known` (an update by capture may have changed them).
    shapes: Vec<Shape>,
    shapes_known: bool,
    /// Each node's argument bytes, one after another, as the executable has them
    /// when `known` (kept from one update to the next: no allocation once grown).
    args: Vec<Vec<u8>>,
    known: Vec<bool>,
}

impl KernelNodes {
    /// The kernel nodes of `graph` (a live graph) when it is a single chain of kernel
    /// nodes (what a capture of launches one after another on one stream gives), in
    /// order; `None` for any other graph (or an empty one).
    ///
    /// # Safety
    /// `graph` is live and stays so while the result is used.
    pub(crate) unsafe fn of_chain(graph: sys::CUgraph) -> Option<KernelNodes> {
        // SAFETY: `graph` is live (caller).
        let nodes = unsafe { result::graph::get_nodes(graph) }.ok()?;
        if nodes.is_empty() {
            return None;
        }
        let mut parent = Vec::with_capacity(nodes.len());
        for &n in &nodes {
            // SAFETY: `n` is a node of the live `graph`.
            let t = unsafe { result::graph::node_get_type(n) }.ok()?;
            if t != sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL {
                return None;
            }
            // SAFETY: as above.
            let deps = unsafe { result::graph::node_get_dependencies(n) }.ok()?;
            match deps.as_slice() {
                [] => parent.push(None),
                [p] => parent.push(Some(*p)),
                _ => return None,
            }
        }
        // A chain: one root, and every node the parent of at most one other.
        let mut child = std::collections::HashMap::with_capacity(nodes.len());
        for (i, p) in parent.iter().enumerate() {
            if child.insert(p.map(|n| n as usize), i).is_some() {
                return None;
            }
        }
        let mut order = Vec::with_capacity(nodes.len());
        let mut at = None;
        while order.len() < nodes.len() {
            let Some(&i) = child.get(&at) else { break };
            order.push(nodes[i]);
            at = Some(nodes[i] as usize);
        }
        if order.len() != nodes.len() {
            return None;
        }
        let mut shapes = Vec::with_capacity(order.len());
        for &n in &order {
            // SAFETY: `n` is a kernel node of the live `graph`.
            let p = unsafe { result::graph::kernel_node_get_params(n) }.ok()?;
            shapes.push(Shape::of_node(&p));
        }
        Some(KernelNodes {
            args: vec![Vec::new(); order.len()],
            known: vec![false; order.len()],
            nodes: order.into_iter().map(|n| n as usize).collect(),
            shapes,
            shapes_known: true,
        })
    }

    /// Whether `taken` are launches of these nodes (same functions, shapes and shared
    /// memory, in order; after an update by capture, as many).
    pub(crate) fn matches(&self, taken: &Launches) -> bool {
        if self.shapes_known {
            taken.shapes == self.shapes
        } else {
            taken.shapes.len() == self.shapes.len()
        }
    }

    /// Forgets what the nodes hold (an update by capture gave them other parameters):
    /// the next update by arguments sets every node.
    pub(crate) fn forget(&mut self) {
        self.shapes_known = false;
        self.known.iter_mut().for_each(|k| *k = false);
    }

    /// Gives each node of `exec` whose arguments differ from `taken`'s the new ones;
    /// how many nodes were set. On an error, the nodes set before it have their new
    /// arguments and the others their old ones, and which is which is forgotten (the
    /// next update sets every node).
    ///
    /// # Safety
    /// `exec` is live and was instantiated from the graph the nodes belong to, which
    /// is live; `taken` [`matches`](Self::matches) these nodes, and its arguments were
    /// checked against each kernel's parameters as a launch checks them; the memory
    /// they name is valid whenever `exec` runs (the launch's own `# Safety`, given by
    /// the closure that made them).
    pub(crate) unsafe fn set(&mut self, exec: sys::CUgraphExec, taken: &Launches) -> Result<usize> {
        let mut ptrs: Vec<*mut c_void> = Vec::new();
        let mut set = 0;
        for (i, &(first, end)) in taken.ranges.iter().enumerate() {
            let range = first as usize..end as usize;
            if self.known[i] && same_bytes(&self.args[i], taken, range.clone()) {
                continue;
            }
            ptrs.clear();
            for j in range.clone() {
                let (start, _) = taken.args[j];
                // SAFETY: `start` is a slot of `taken.slots` (`push`).
                ptrs.push(unsafe { taken.slots.as_ptr().add(start as usize) } as *mut c_void);
            }
            let s = taken.shapes[i];
            let params = sys::CUDA_KERNEL_NODE_PARAMS {
                func: s.func as sys::CUfunction,
                gridDimX: s.grid[0],
                gridDimY: s.grid[1],
                gridDimZ: s.grid[2],
                blockDimX: s.block[0],
                blockDimY: s.block[1],
                blockDimZ: s.block[2],
                sharedMemBytes: s.shared_mem,
                kernelParams: if ptrs.is_empty() {
                    std::ptr::null_mut()
                } else {
                    ptrs.as_mut_ptr()
                },
                ..Default::default()
            };
            // Forgotten first: on an error this node's arguments are unknown.
            self.known[i] = false;
            if failing_now() {
                return Err(crate::Error::Driver(result::DriverError {
                    call: "cuGraphExecKernelNodeSetParams",
                    code: sys::cudaError_enum::CUDA_ERROR_INVALID_VALUE,
                    name: "CUDA_ERROR_INVALID_VALUE",
                    description: "failed on purpose (testing::fail_kernel_node_updates_after)",
                }));
            }
            // SAFETY: `exec` and the node's graph are live and related (caller); the
            // function and shape are the node's own; `ptrs` holds one pointer per
            // argument the launch checked, each into `taken.slots`, alive for the call;
            // what the kernel reaches through them is the caller's guarantee.
            unsafe {
                result::graph::exec_kernel_node_set_params(
                    exec,
                    self.nodes[i] as sys::CUgraphNode,
                    &params,
                )
            }?;
            let kept = &mut self.args[i];
            kept.clear();
            for j in range {
                kept.extend_from_slice(taken.arg_bytes(j));
            }
            self.known[i] = true;
            set += 1;
        }
        // Every node was set, or kept arguments set while the shapes were known.
        self.shapes.clone_from(&taken.shapes);
        self.shapes_known = true;
        Ok(set)
    }
}

/// Whether `kept` is the bytes of `taken`'s arguments `range`, one after another.
fn same_bytes(kept: &[u8], taken: &Launches, range: std::ops::Range<usize>) -> bool {
    let mut at = 0;
    for j in range {
        let b = taken.arg_bytes(j);
        if kept.get(at..at + b.len()) != Some(b) {
            return false;
        }
        at += b.len();
    }
    at == kept.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_taken_outside_an_update_or_on_another_stream() {
        assert!(!takes(0x1000) && !busy());
        taking(0x1000, || {
            assert!(busy());
            assert!(takes(0x1000));
            assert!(!takes(0x2000));
            assert!(!takes(0));
        });
        assert!(!takes(0x1000) && !busy());
        assert_eq!(with_taken(|l| l.shapes.len()), 0);
    }

    #[test]
    fn taking_stops_when_the_closure_unwinds() {
        let r = std::panic::catch_unwind(|| taking(0x3000, || panic!("in the closure")));
        assert!(r.is_err());
        assert!(!takes(0x3000) && !busy());
    }

    #[test]
    fn kept_bytes_compare_argument_by_argument() {
        let mut l = Launches::default();
        l.slots.resize(2, 0);
        l.slots[0] = u128::from(7u32);
        l.slots[1] = u128::from(9u64);
        l.args.push((0, 4));
        l.args.push((1, 8));
        let mut kept = 7u32.to_ne_bytes().to_vec();
        kept.extend_from_slice(&9u64.to_ne_bytes());
        assert!(same_bytes(&kept, &l, 0..2));
        assert!(!same_bytes(&kept[..11], &l, 0..2), "shorter");
        assert!(!same_bytes(&kept, &l, 0..1), "longer");
        kept[4] = 8;
        assert!(!same_bytes(&kept, &l, 0..2), "another value");
    }

    #[test]
    fn arguments_are_kept_aligned_and_whole() {
        let mut l = Launches::default();
        l.slots.resize(1, 0);
        l.args.push((0, 4));
        l.slots[0] = u128::from(0xdead_beef_u32);
        assert_eq!(l.arg_bytes(0), &0xdead_beef_u32.to_ne_bytes());
        assert_eq!(l.slots.as_ptr() as usize % 16, 0);
    }
}
