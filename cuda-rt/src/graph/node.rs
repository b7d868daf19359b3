//! Explicit graphs: nodes added one by one with their dependencies.
//!
//! Every `add_*_node` method takes the nodes the new one depends on (nodes of the same
//! graph; empty for a root) and returns the new [`Node`]. What a node refers to
//! (memory, events, closures, a child graph's kept objects) is kept alive by the
//! graph. Adding a node to an instantiated graph drops its executable: the next
//! launch instantiates the graph again.

use std::ffi::c_void;
use std::sync::Arc;

use crate::driver::context::{make_current, primary};
use crate::driver::{self, sys};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::graph::Graph;
use crate::memory::{MemoryPointer, Pod};

/// A node of a graph (`CUgraphNode`): a handle, valid while its graph lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Node(usize);

impl Node {
    pub(crate) fn from_raw(n: sys::CUgraphNode) -> Node {
        Node(n as usize)
    }

    /// The raw `CUgraphNode`.
    pub fn as_raw(&self) -> sys::CUgraphNode {
        self.0 as sys::CUgraphNode
    }

    /// The node's type (`cuGraphNodeGetType`). The node's graph must be alive.
    pub fn node_type(&self) -> Result<sys::CUgraphNodeType> {
        driver::graph::node_type(self.as_raw())
    }
}

/// Anything that names a loaded kernel function (`CUfunction`): the `Function` of
/// the kernel modules implements it.
pub trait AsFunction {
    /// The raw `CUfunction`, alive for as long as `self`.
    fn as_raw(&self) -> sys::CUfunction;
}

pub use crate::launch::LaunchConfig;

/// A kernel's arguments in order: plain values and device pointers. Pointers keep
/// their memory alive in the graph that gets them.
#[derive(Default)]
pub struct KernelArgs {
    /// Each argument's bytes, in 8-byte-aligned storage.
    values: Vec<Box<[u64]>>,
    memory: Vec<MemoryPointer>,
}

impl std::fmt::Debug for KernelArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelArgs")
            .field("count", &self.values.len())
            .field("pointers", &self.memory.len())
            .finish()
    }
}

impl KernelArgs {
    /// No arguments yet.
    pub fn new() -> KernelArgs {
        KernelArgs::default()
    }

    /// Appends a value argument (`int`, `float`, a struct of plain data...).
    pub fn push<T: Pod>(&mut self, value: T) -> &mut Self {
        let size = std::mem::size_of::<T>();
        let mut words = vec![0u64; size.div_ceil(8).max(1)].into_boxed_slice();
        let bytes = driver::graph::pod_bytes(&value);
        for (i, b) in bytes.iter().enumerate() {
            let w = &mut words[i / 8];
            *w |= u64::from(*b) << ((i % 8) * 8);
        }
        // The little-endian packing above puts byte i at address i on every CUDA host.
        self.values.push(words);
        self
    }

    /// Appends a device-pointer argument (`T*` in the kernel): the pointer's address.
    /// The graph the arguments go to keeps the memory alive.
    pub fn push_ptr(&mut self, p: &MemoryPointer) -> &mut Self {
        self.values.push(vec![p.ptr()].into_boxed_slice());
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

    /// The `void**` array the driver reads: one pointer per argument, valid while
    /// `self` is not changed.
    fn pointers(&self) -> Vec<*mut c_void> {
        self.values
            .iter()
            .map(|w| w.as_ptr().cast_mut().cast::<c_void>())
            .collect()
    }
}

impl Graph {
    /// The nodes as raw handles, checking they are not empty handles.
    fn deps(deps: &[Node]) -> Vec<sys::CUgraphNode> {
        deps.iter().map(Node::as_raw).collect()
    }

    fn added(&mut self, n: sys::CUgraphNode) -> Node {
        self.changed();
        Node::from_raw(n)
    }

    /// An empty node: a join point for dependencies.
    pub fn add_empty_node(&mut self, deps: &[Node]) -> Result<Node> {
        make_current(self.device)?;
        let n = driver::graph::add_empty(self.as_raw(), &Self::deps(deps))?;
        Ok(self.added(n))
    }

    /// A kernel node from a raw function and a raw parameter array
    /// (`cuGraphAddKernelNode`; the driver copies the parameter values).
    ///
    /// # Safety
    /// `func` must be a live function of this graph's device's primary context that
    /// outlives the graph, and `params` must hold one pointer per kernel parameter,
    /// each to a value of that parameter's type. The kernel must only touch memory
    /// that is valid whenever the graph runs.
    pub unsafe fn add_kernel_node_raw(
        &mut self,
        deps: &[Node],
        func: sys::CUfunction,
        cfg: LaunchConfig,
        params: &[*mut c_void],
    ) -> Result<Node> {
        make_current(self.device)?;
        let p = sys::CUDA_KERNEL_NODE_PARAMS {
            func,
            gridDimX: cfg.grid.x,
            gridDimY: cfg.grid.y,
            gridDimZ: cfg.grid.z,
            blockDimX: cfg.block.x,
            blockDimY: cfg.block.y,
            blockDimZ: cfg.block.z,
            sharedMemBytes: cfg.shared_mem_bytes,
            kernelParams: params.as_ptr().cast_mut(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        // SAFETY: the caller vouches for the function and the parameter array.
        let n = unsafe { driver::graph::add_kernel(self.as_raw(), &Self::deps(deps), &p) }?;
        Ok(self.added(n))
    }

    /// A kernel node of `func` with `args` (`cuGraphAddKernelNode`). The arguments
    /// must match the kernel's parameters in number, order and type, as for any
    /// launch; memory passed with [`KernelArgs::push_ptr`] is kept alive by the
    /// graph. Keep `func`'s module loaded while the graph lives.
    pub fn add_kernel_node<F: AsFunction + ?Sized>(
        &mut self,
        deps: &[Node],
        func: &F,
        cfg: LaunchConfig,
        args: &KernelArgs,
    ) -> Result<Node> {
        let ptrs = args.pointers();
        make_current(self.device)?;
        let p = sys::CUDA_KERNEL_NODE_PARAMS {
            func: func.as_raw(),
            gridDimX: cfg.grid.x,
            gridDimY: cfg.grid.y,
            gridDimZ: cfg.grid.z,
            blockDimX: cfg.block.x,
            blockDimY: cfg.block.y,
            blockDimZ: cfg.block.z,
            sharedMemBytes: cfg.shared_mem_bytes,
            kernelParams: ptrs.as_ptr().cast_mut(),
            extra: std::ptr::null_mut(),
            kern: std::ptr::null_mut(),
            ctx: std::ptr::null_mut(),
        };
        // SAFETY: `AsFunction` names a live function; `ptrs` has one pointer per
        // argument, each to its 8-byte-aligned value, alive for the call; their match
        // with the kernel's parameters is the caller's part, as for any launch.
        let n = unsafe { driver::graph::add_kernel(self.as_raw(), &Self::deps(deps), &p) }?;
        for m in &args.memory {
            self.keep.push(Arc::new(m.clone()));
        }
        Ok(self.added(n))
    }

    /// A device-to-device copy node of `bytes` bytes from `src` to `dst`
    /// (`cuGraphAddMemcpyNode`). Both are kept alive by the graph.
    pub fn add_memcpy_node(
        &mut self,
        deps: &[Node],
        dst: &MemoryPointer,
        src: &MemoryPointer,
        bytes: usize,
    ) -> Result<Node> {
        if bytes > dst.size() || bytes > src.size() {
            return Err(Error::InvalidArgument(format!(
                "add_memcpy_node: {bytes} bytes do not fit (destination has {}, source {})",
                dst.size(),
                src.size()
            )));
        }
        make_current(self.device)?;
        let ctx = primary(self.device)?;
        let n = driver::graph::add_memcpy(
            self.as_raw(),
            &Self::deps(deps),
            dst.ptr(),
            src.ptr(),
            bytes,
            ctx,
        )?;
        self.keep.push(Arc::new(dst.clone()));
        self.keep.push(Arc::new(src.clone()));
        Ok(self.added(n))
    }

    /// A memset node: `count` elements of `element_size` bytes (1, 2 or 4) at `dst`
    /// set to `value` (its low `element_size` bytes) (`cuGraphAddMemsetNode`). `dst`
    /// is kept alive by the graph.
    pub fn add_memset_node(
        &mut self,
        deps: &[Node],
        dst: &MemoryPointer,
        value: u32,
        element_size: u32,
        count: usize,
    ) -> Result<Node> {
        if !matches!(element_size, 1 | 2 | 4) {
            return Err(Error::InvalidArgument(format!(
                "add_memset_node: element size {element_size} is not 1, 2 or 4"
            )));
        }
        let bytes = count.checked_mul(element_size as usize);
        if bytes.is_none_or(|b| b > dst.size()) {
            return Err(Error::InvalidArgument(format!(
                "add_memset_node: {count} elements of {element_size} bytes do not fit in {} \
                 bytes",
                dst.size()
            )));
        }
        make_current(self.device)?;
        let ctx = primary(self.device)?;
        let n = driver::graph::add_memset(
            self.as_raw(),
            &Self::deps(deps),
            dst.ptr(),
            value,
            element_size,
            count,
            ctx,
        )?;
        self.keep.push(Arc::new(dst.clone()));
        Ok(self.added(n))
    }

    /// A host node: `f` runs on a driver thread each time the graph runs, in
    /// dependency order (`cuGraphAddHostNode`). `f` lives as long as the graph and
    /// every executable, clone or child node made from it; a panic in it is caught
    /// (see [`host_func_panic_count`](crate::stream::host_func_panic_count)). `f`
    /// must not call CUDA, nor own anything whose drop calls CUDA.
    pub fn add_host_node<F>(&mut self, deps: &[Node], f: F) -> Result<Node>
    where
        F: Fn() + Send + Sync + 'static,
    {
        make_current(self.device)?;
        let f = Arc::new(driver::graph::SharedHostFn(Box::new(f)));
        let n = driver::graph::add_host(self.as_raw(), &Self::deps(deps), &f)?;
        self.keep.push(f);
        Ok(self.added(n))
    }

    /// A node that records `event` when it runs (`cuGraphAddEventRecordNode`). The
    /// event is kept alive by the graph and counts as recorded from now on.
    pub fn add_event_record_node(&mut self, deps: &[Node], event: Arc<Event>) -> Result<Node> {
        self.check_event(&event)?;
        make_current(self.device)?;
        let n = driver::graph::add_event_record(self.as_raw(), &Self::deps(deps), event.as_raw())?;
        event.mark_recorded();
        self.keep.push(event);
        Ok(self.added(n))
    }

    /// A node that waits for `event`'s last record before its dependents run
    /// (`cuGraphAddEventWaitNode`). The event is kept alive by the graph.
    pub fn add_event_wait_node(&mut self, deps: &[Node], event: Arc<Event>) -> Result<Node> {
        self.check_event(&event)?;
        make_current(self.device)?;
        let n = driver::graph::add_event_wait(self.as_raw(), &Self::deps(deps), event.as_raw())?;
        self.keep.push(event);
        Ok(self.added(n))
    }

    fn check_event(&self, event: &Event) -> Result<()> {
        if event.device_id() != self.device {
            return Err(Error::InvalidArgument(format!(
                "an event of device {} cannot be a node of a graph of device {}",
                event.device_id(),
                self.device
            )));
        }
        Ok(())
    }

    /// A node that runs a copy of `child` (`cuGraphAddChildGraphNode`): later changes
    /// to `child` do not reach it. This graph keeps alive what `child` keeps alive.
    /// An error for a child that owns allocations of its capture.
    pub fn add_child_graph_node(&mut self, deps: &[Node], child: &Graph) -> Result<Node> {
        if !child.allocs.is_empty() {
            return Err(Error::InvalidState(
                "add_child_graph_node: the child graph owns allocations of its capture, whose \
                 addresses belong to it; it cannot be copied into another graph"
                    .into(),
            ));
        }
        make_current(self.device)?;
        let n = driver::graph::add_child(self.as_raw(), &Self::deps(deps), child.as_raw())?;
        self.keep.extend(child.keep.iter().cloned());
        Ok(self.added(n))
    }
}

impl AsFunction for crate::module::Function {
    fn as_raw(&self) -> sys::CUfunction {
        crate::module::Function::as_raw(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let p = a.pointers();
        assert_eq!(p.len(), 4);
        assert!(p.iter().all(|q| (*q as usize).is_multiple_of(8)));
    }

    #[test]
    fn launch_config_linear_is_one_dimensional() {
        let c = LaunchConfig::new(4, 256);
        assert_eq!(c.grid, (4, 1, 1).into());
        assert_eq!(c.block, (256, 1, 1).into());
        assert_eq!(c.shared_mem_bytes, 0);
    }
}
