//! Checked driver calls about graphs (`cuGraph*`, `cuGraphExec*`, user objects), and
//! repeatable host nodes that run a shared Rust closure.
//!
//! Stream capture (`cuStreamBeginCapture`, `cuStreamEndCapture`, ...) is in
//! [`stream`](super::stream). Every call that takes a graph, an executable graph or a
//! node is an `unsafe fn`: the graph is live (created and not destroyed), and nodes
//! (`deps` included) belong to it.
//!
//! # Repeatable host nodes
//!
//! A host node may run once per launch, on a driver thread, from any executable or clone
//! of the graph, for as long as any of them lives. Its closure is therefore shared
//! ([`SharedHostFn`]: `Fn + Send + Sync`) and owned by a CUDA user object that the graph
//! holds (`cuGraphRetainUserObject` with MOVE): CUDA carries the reference into clones,
//! child-graph nodes, executables and updates, and calls the destructor once the last of
//! them is gone and its work has finished. A panic in the closure is caught and counted
//! with the stream host functions
//! ([`host_fn_panic_count`](super::stream::host_fn_panic_count)).

use std::ffi::{c_void, CStr};
use std::sync::Arc;

use super::stream::run_caught;
use super::{api, check, Result};
use crate::driver::{
    CUcontext, CUevent, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphExecUpdateResult,
    CUgraphExecUpdateResultInfo, CUgraphNode, CUgraphNodeType, CUhostFn, CUresult, CUstream,
    CUuserObject, CUuserObjectRetain_flags, CUuserObject_flags, CUDA_HOST_NODE_PARAMS,
    CUDA_KERNEL_NODE_PARAMS, CUDA_MEMCPY3D, CUDA_MEMSET_NODE_PARAMS,
};

// ---------------------------------------------------------------------------
// Graphs and executables

/// A new, empty graph (`cuGraphCreate`); the caller destroys it once with [`destroy`].
pub fn create() -> Result<CUgraph> {
    let f = api()?.cuGraphCreate()?;
    let mut g: CUgraph = std::ptr::null_mut();
    // SAFETY: `g` is a valid out pointer; flags must be 0.
    check(unsafe { f(&mut g, 0) }, "cuGraphCreate")?;
    Ok(g)
}

/// Destroys a graph (`cuGraphDestroy`); user objects it holds are released, which may
/// run their destructors.
///
/// # Safety
/// `graph` is live, destroyed once and not used afterwards (its executables are
/// independent of it).
pub unsafe fn destroy(graph: CUgraph) -> Result<()> {
    let f = api()?.cuGraphDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(graph) }, "cuGraphDestroy")
}

/// A copy of `graph` (`cuGraphClone`); the caller destroys it once.
///
/// # Safety
/// `graph` is live.
pub unsafe fn clone(graph: CUgraph) -> Result<CUgraph> {
    let f = api()?.cuGraphClone()?;
    let mut c: CUgraph = std::ptr::null_mut();
    // SAFETY: `c` is a valid out pointer; `graph` is live (caller).
    check(unsafe { f(&mut c, graph) }, "cuGraphClone")?;
    Ok(c)
}

/// An executable graph made from `graph` (`cuGraphInstantiateWithFlags`; `flags` are
/// `CUDA_GRAPH_INSTANTIATE_FLAG_*`); the caller destroys it once with
/// [`exec_destroy`].
///
/// # Safety
/// `graph` is live.
pub unsafe fn instantiate_with_flags(graph: CUgraph, flags: u64) -> Result<CUgraphExec> {
    let f = api()?.cuGraphInstantiateWithFlags()?;
    let mut e: CUgraphExec = std::ptr::null_mut();
    // SAFETY: `e` is a valid out pointer; `graph` is live (caller); the driver checks
    // the flags.
    check(
        unsafe { f(&mut e, graph, flags) },
        "cuGraphInstantiateWithFlags",
    )?;
    Ok(e)
}

/// Destroys an executable graph (`cuGraphExecDestroy`).
///
/// # Safety
/// `exec` is live, destroyed once and not used afterwards.
pub unsafe fn exec_destroy(exec: CUgraphExec) -> Result<()> {
    let f = api()?.cuGraphExecDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(exec) }, "cuGraphExecDestroy")
}

/// Launches an executable graph on `stream` (`cuGraphLaunch`).
///
/// # Safety
/// `exec` is live; `stream` is a live stream or a default-stream handle. Everything the
/// graph's nodes read and write stays valid until the launch has completed.
#[inline]
pub unsafe fn launch(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    let f = api()?.cuGraphLaunch()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(exec, stream) }, "cuGraphLaunch")
}

/// Uploads an executable graph to the device on `stream` ahead of a launch
/// (`cuGraphUpload`).
///
/// # Safety
/// `exec` is live; `stream` is a live stream or a default-stream handle.
pub unsafe fn upload(exec: CUgraphExec, stream: CUstream) -> Result<()> {
    let f = api()?.cuGraphUpload()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(exec, stream) }, "cuGraphUpload")
}

/// The flags `exec` was instantiated with (`cuGraphExecGetFlags`).
///
/// # Safety
/// `exec` is live.
pub unsafe fn exec_get_flags(exec: CUgraphExec) -> Result<u64> {
    let f = api()?.cuGraphExecGetFlags()?;
    let mut flags: u64 = 0;
    // SAFETY: `flags` is a valid out pointer; `exec` is live (caller).
    check(unsafe { f(exec, &mut flags) }, "cuGraphExecGetFlags")?;
    Ok(flags)
}

/// Updates `exec` in place to the nodes' parameters of `graph` (`cuGraphExecUpdate`,
/// the CUDA 12.0 ABI): `Ok(Ok(()))` when updated, `Ok(Err(reason))` when the driver
/// refused the update (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`) with its reason; other
/// failures are `Err`.
///
/// # Safety
/// `exec` and `graph` are live; everything the updated nodes use stays valid as long as
/// `exec` may run.
pub unsafe fn exec_update(
    exec: CUgraphExec,
    graph: CUgraph,
) -> Result<std::result::Result<(), CUgraphExecUpdateResult>> {
    let f = api()?.cuGraphExecUpdate_v2()?;
    let mut info = CUgraphExecUpdateResultInfo {
        result: CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
        errorNode: std::ptr::null_mut(),
        errorFromNode: std::ptr::null_mut(),
    };
    // SAFETY: `exec` and `graph` are live (caller); `info` is a valid out pointer.
    let rc = unsafe { f(exec, graph, &mut info) };
    if rc == CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE {
        return Ok(Err(info.result));
    }
    check(rc, "cuGraphExecUpdate_v2")?;
    Ok(Ok(()))
}

/// Writes a DOT description of `graph` to the file `path` (`cuGraphDebugDotPrint`;
/// `flags` are `CU_GRAPH_DEBUG_DOT_FLAGS_*`).
///
/// # Safety
/// `graph` is live.
pub unsafe fn debug_dot_print(graph: CUgraph, path: &CStr, flags: u32) -> Result<()> {
    let f = api()?.cuGraphDebugDotPrint()?;
    // SAFETY: `graph` is live (caller); `path` is NUL-terminated and alive for the call.
    check(
        unsafe { f(graph, path.as_ptr(), flags) },
        "cuGraphDebugDotPrint",
    )
}

/// The nodes of `graph` (`cuGraphGetNodes`, asked twice: the count, then the handles).
///
/// # Safety
/// `graph` is live.
pub unsafe fn get_nodes(graph: CUgraph) -> Result<Vec<CUgraphNode>> {
    let f = api()?.cuGraphGetNodes()?;
    let mut n: usize = 0;
    // SAFETY: `graph` is live (caller); a null array asks for the count only; `n` is a
    // valid out pointer.
    check(
        unsafe { f(graph, std::ptr::null_mut(), &mut n) },
        "cuGraphGetNodes",
    )?;
    if n == 0 {
        // The driver refuses a non-null array with a count of 0.
        return Ok(Vec::new());
    }
    let mut v: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `v` has room for `n` handles; the driver writes at most `n`.
    check(
        unsafe { f(graph, v.as_mut_ptr(), &mut n) },
        "cuGraphGetNodes",
    )?;
    v.truncate(n);
    Ok(v)
}

/// The kind of `node` (`cuGraphNodeGetType`).
///
/// # Safety
/// `node` is a node of a live graph.
pub unsafe fn node_get_type(node: CUgraphNode) -> Result<CUgraphNodeType> {
    let f = api()?.cuGraphNodeGetType()?;
    let mut t = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `node` is live (caller); `t` is a valid out pointer.
    check(unsafe { f(node, &mut t) }, "cuGraphNodeGetType")?;
    Ok(t)
}

/// The nodes `node` depends on (`cuGraphNodeGetDependencies`, the CUDA 12.3 ABI; asked
/// twice: the count, then the handles; the edges' data is dropped).
///
/// # Safety
/// `node` is a node of a live graph (also of a graph under capture).
pub unsafe fn node_get_dependencies(node: CUgraphNode) -> Result<Vec<CUgraphNode>> {
    let f = api()?.cuGraphNodeGetDependencies_v2()?;
    let mut n: usize = 0;
    // SAFETY: `node` is live (caller); null arrays ask for the count only; `n` is a
    // valid out pointer.
    check(
        unsafe { f(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut n) },
        "cuGraphNodeGetDependencies_v2",
    )?;
    if n == 0 {
        return Ok(Vec::new());
    }
    let mut v: Vec<CUgraphNode> = vec![std::ptr::null_mut(); n];
    // Asked for too: without it the driver refuses edges with data (a lossy query).
    let mut edges = vec![CUgraphEdgeData::default(); n];
    // SAFETY: `v` and `edges` have room for `n` entries; the driver writes at most `n`.
    check(
        unsafe { f(node, v.as_mut_ptr(), edges.as_mut_ptr(), &mut n) },
        "cuGraphNodeGetDependencies_v2",
    )?;
    v.truncate(n);
    Ok(v)
}

/// How many nodes depend on `node` (`cuGraphNodeGetDependentNodes`, the CUDA 12.3
/// ABI, asked for the count only): 0 for a leaf of its graph.
///
/// # Safety
/// `node` is a node of a live graph (also of a graph under capture).
pub unsafe fn node_dependent_count(node: CUgraphNode) -> Result<usize> {
    let f = api()?.cuGraphNodeGetDependentNodes_v2()?;
    let mut n: usize = 0;
    // SAFETY: `node` is live (caller); null arrays ask for the count only; `n` is a
    // valid out pointer.
    check(
        unsafe { f(node, std::ptr::null_mut(), std::ptr::null_mut(), &mut n) },
        "cuGraphNodeGetDependentNodes_v2",
    )?;
    Ok(n)
}

/// The parameters of kernel node `node` (`cuGraphKernelNodeGetParams_v2`): its
/// function, launch shape and shared memory; `kernelParams` points into the driver's
/// copy, valid only until the node changes or its graph is destroyed.
///
/// # Safety
/// `node` is a kernel node of a live graph.
pub unsafe fn kernel_node_get_params(node: CUgraphNode) -> Result<CUDA_KERNEL_NODE_PARAMS> {
    let f = api()?.cuGraphKernelNodeGetParams_v2()?;
    let mut p = CUDA_KERNEL_NODE_PARAMS::default();
    // SAFETY: `node` is a live kernel node (caller); `p` is a valid out pointer.
    check(unsafe { f(node, &mut p) }, "cuGraphKernelNodeGetParams_v2")?;
    Ok(p)
}

/// Gives kernel node `node` of executable `exec` the parameters `params` for its later
/// launches (`cuGraphExecKernelNodeSetParams_v2`); launches queued before keep theirs.
///
/// # Safety
/// `exec` is live and was instantiated from the live graph `node` belongs to;
/// `params.kernelParams` holds one pointer per parameter of `params.func`, each to a
/// readable value of that parameter's size (the driver copies them); the memory the
/// kernel reaches through them is valid whenever `exec` runs.
pub unsafe fn exec_kernel_node_set_params(
    exec: CUgraphExec,
    node: CUgraphNode,
    params: &CUDA_KERNEL_NODE_PARAMS,
) -> Result<()> {
    let f = api()?.cuGraphExecKernelNodeSetParams_v2()?;
    // SAFETY: the caller's guarantees (see `# Safety`).
    check(
        unsafe { f(exec, node, params) },
        "cuGraphExecKernelNodeSetParams_v2",
    )
}

// ---------------------------------------------------------------------------
// Explicit nodes. Each takes the graph, its dependencies (nodes of the same graph) and
// the node's parameters, which the driver copies.

/// Adds an empty node after `deps` (`cuGraphAddEmptyNode`).
///
/// # Safety
/// `graph` is live and `deps` are nodes of it.
pub unsafe fn add_empty_node(graph: CUgraph, deps: &[CUgraphNode]) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddEmptyNode()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer; `graph` and `deps` as the caller guarantees, length
    // given.
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len()) },
        "cuGraphAddEmptyNode",
    )?;
    Ok(n)
}

/// Adds a kernel node after `deps` (`cuGraphAddKernelNode`, the CUDA 12.0 ABI).
///
/// # Safety
/// `graph` is live and `deps` are nodes of it; `params.func` is a live function of the
/// current context, and `params.kernelParams` an array with one pointer per kernel
/// parameter, each to a value of that parameter's type and size (the driver copies them
/// during the call). Each launch of the graph runs the kernel: its use of those values
/// must be sound then (as for [`launch::launch_kernel`](super::launch::launch_kernel)).
pub unsafe fn add_kernel_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    params: &CUDA_KERNEL_NODE_PARAMS,
) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddKernelNode_v2()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; the caller vouches for the graph,
    // the function and its parameter array.
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len(), params) },
        "cuGraphAddKernelNode_v2",
    )?;
    Ok(n)
}

/// Adds a memcpy node after `deps` (`cuGraphAddMemcpyNode`), in context `ctx`.
///
/// # Safety
/// `graph` is live and `deps` are nodes of it; `ctx` is live; the memory `params`
/// names is valid for the copy whenever the graph runs.
pub unsafe fn add_memcpy_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    params: &CUDA_MEMCPY3D,
    ctx: CUcontext,
) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddMemcpyNode()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer, dependency slice and parameters; the addresses and the
    // handles are the caller's (see `# Safety`).
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len(), params, ctx) },
        "cuGraphAddMemcpyNode",
    )?;
    Ok(n)
}

/// Adds a memset node after `deps` (`cuGraphAddMemsetNode`), in context `ctx`.
///
/// # Safety
/// `graph` is live and `deps` are nodes of it; `ctx` is live; the memory `params`
/// names is valid for the set whenever the graph runs.
pub unsafe fn add_memset_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    params: &CUDA_MEMSET_NODE_PARAMS,
    ctx: CUcontext,
) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddMemsetNode()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer, dependency slice and parameters; the addresses and the
    // handles are the caller's (see `# Safety`).
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len(), params, ctx) },
        "cuGraphAddMemsetNode",
    )?;
    Ok(n)
}

/// Adds a node that records `event` after `deps` (`cuGraphAddEventRecordNode`).
///
/// # Safety
/// `graph` is live and `deps` are nodes of it; `event` is live as long as the graph or
/// an executable of it may run.
pub unsafe fn add_event_record_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    event: CUevent,
) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddEventRecordNode()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; the handles are the caller's.
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len(), event) },
        "cuGraphAddEventRecordNode",
    )?;
    Ok(n)
}

/// Adds a node that waits for `event` after `deps` (`cuGraphAddEventWaitNode`).
///
/// # Safety
/// As for [`add_event_record_node`].
pub unsafe fn add_event_wait_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    event: CUevent,
) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddEventWaitNode()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; the handles are the caller's.
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len(), event) },
        "cuGraphAddEventWaitNode",
    )?;
    Ok(n)
}

/// Adds a node that runs a copy of `child` after `deps` (`cuGraphAddChildGraphNode`;
/// the driver clones `child`).
///
/// # Safety
/// `graph` and `child` are live and `deps` are nodes of `graph`.
pub unsafe fn add_child_graph_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    child: CUgraph,
) -> Result<CUgraphNode> {
    let f = api()?.cuGraphAddChildGraphNode()?;
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; the graphs are live (caller).
    check(
        unsafe { f(&mut n, graph, deps.as_ptr(), deps.len(), child) },
        "cuGraphAddChildGraphNode",
    )?;
    Ok(n)
}

// ---------------------------------------------------------------------------
// Repeatable host functions, owned by the graph through a CUDA user object.

/// A host closure that a graph may call any number of times, behind a thin pointer.
pub struct SharedHostFn(pub Box<dyn Fn() + Send + Sync + 'static>);

/// The `CUhostFn` of a repeatable host node: calls the closure, keeps it.
///
/// # Safety
/// `data` is a live `Arc<SharedHostFn>` reference.
unsafe extern "C" fn shared_host_fn_trampoline(data: *mut c_void) {
    run_caught(|| {
        // SAFETY: `data` is an `Arc<SharedHostFn>` reference owned by the user object
        // that the graph (and every executable of it) holds, so it is alive whenever
        // the node runs; it is only read here.
        let f = unsafe { &*data.cast_const().cast::<SharedHostFn>() };
        (f.0)();
    });
}

/// The user object's destructor: gives back its reference to the closure.
///
/// # Safety
/// `data` is an `Arc<SharedHostFn>` reference leaked for this call, given back once.
unsafe extern "C" fn shared_host_fn_destroy(data: *mut c_void) {
    run_caught(|| {
        // SAFETY: the driver calls the destructor once, after the last reference to
        // the user object is gone; the reference was leaked for it in `retain_host_fn`.
        drop(unsafe { Arc::from_raw(data.cast_const().cast::<SharedHostFn>()) });
    });
}

/// Gives `graph` a reference to `f` through a new user object (`cuUserObjectCreate`,
/// then `cuGraphRetainUserObject` with MOVE: CUDA carries it into clones, child-graph
/// nodes, executables and updates), and returns the host node parameters (function and
/// data) that call it. The caller may keep its own `Arc` too.
///
/// # Safety
/// `graph` is live.
pub unsafe fn retain_host_fn(
    graph: CUgraph,
    f: &Arc<SharedHostFn>,
) -> Result<(CUhostFn, *mut c_void)> {
    let api = api()?;
    let create = api.cuUserObjectCreate()?;
    let retain = api.cuGraphRetainUserObject()?;
    let release = api.cuUserObjectRelease()?;
    let data = Arc::into_raw(Arc::clone(f)).cast_mut().cast::<c_void>();
    let mut obj: CUuserObject = std::ptr::null_mut();
    // SAFETY: valid out pointer; the destructor matches `data`'s type; one reference;
    // the only documented flag, which lets the driver call the destructor on its own
    // thread.
    let rc = unsafe {
        create(
            &mut obj,
            data,
            Some(shared_host_fn_destroy),
            1,
            CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0,
        )
    };
    if let Err(e) = check(rc, "cuUserObjectCreate") {
        // SAFETY: the driver refused, so it owns nothing: the reference is still ours.
        drop(unsafe { Arc::from_raw(data.cast_const().cast::<SharedHostFn>()) });
        return Err(e);
    }
    // SAFETY: `graph` is live (caller); MOVE hands our one reference to it.
    let rc = unsafe {
        retain(
            graph,
            obj,
            1,
            CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0,
        )
    };
    if let Err(e) = check(rc, "cuGraphRetainUserObject") {
        // SAFETY: our reference was not moved: release it, which runs the destructor.
        let _ = check(unsafe { release(obj, 1) }, "cuUserObjectRelease");
        return Err(e);
    }
    Ok((Some(shared_host_fn_trampoline), data))
}

/// Queues a repeatable host node on `stream`, which captures into `graph`
/// (`cuLaunchHostFunc`): the graph gets a reference to `f` (see [`retain_host_fn`]), and
/// the captured node calls it on every launch.
///
/// # Safety
/// `stream` is a live stream capturing into `graph`, which is live.
pub unsafe fn launch_captured_host_fn(
    stream: CUstream,
    graph: CUgraph,
    f: &Arc<SharedHostFn>,
) -> Result<()> {
    let launch = api()?.cuLaunchHostFunc()?;
    // SAFETY: `graph` is live (caller).
    let (fn_, data) = unsafe { retain_host_fn(graph, f) }?;
    // SAFETY: `stream` is live and captures into `graph` (caller), which owns the
    // reference that `data` is for as long as the node (in `graph`, its clones or
    // executables) can run.
    check(unsafe { launch(stream, fn_, data) }, "cuLaunchHostFunc")
}

/// Adds a repeatable host node that calls `f` after `deps` (`cuGraphAddHostNode`); the
/// graph owns a reference to `f` (see [`retain_host_fn`]).
///
/// # Safety
/// `graph` is live and `deps` are nodes of it.
pub unsafe fn add_host_node(
    graph: CUgraph,
    deps: &[CUgraphNode],
    f: &Arc<SharedHostFn>,
) -> Result<CUgraphNode> {
    let add = api()?.cuGraphAddHostNode()?;
    // SAFETY: `graph` is live (caller).
    let (fn_, data) = unsafe { retain_host_fn(graph, f) }?;
    let p = CUDA_HOST_NODE_PARAMS {
        fn_,
        userData: data,
    };
    let mut n: CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer, dependency slice and parameters; `graph` owns the
    // reference `data` is for.
    check(
        unsafe { add(&mut n, graph, deps.as_ptr(), deps.len(), &p) },
        "cuGraphAddHostNode",
    )?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::result::stream::host_fn_panic_count;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn shared_trampoline_runs_many_times_and_destructor_gives_back_its_reference() {
        let n = Arc::new(AtomicUsize::new(0));
        let m = n.clone();
        let f = Arc::new(SharedHostFn(Box::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
        })));
        let data = Arc::into_raw(Arc::clone(&f)).cast_mut().cast::<c_void>();
        for _ in 0..3 {
            // SAFETY: `data` is a live Arc<SharedHostFn> reference, as the driver passes.
            unsafe { shared_host_fn_trampoline(data) };
        }
        assert_eq!(n.load(Ordering::SeqCst), 3);
        assert_eq!(Arc::strong_count(&f), 2);
        // SAFETY: called once, as the driver would after the last reference.
        unsafe { shared_host_fn_destroy(data) };
        assert_eq!(Arc::strong_count(&f), 1);
        drop(f);
        assert_eq!(Arc::strong_count(&n), 1, "the closure was dropped");
    }

    #[test]
    fn shared_trampoline_catches_a_panic() {
        let before = host_fn_panic_count();
        let f = Arc::new(SharedHostFn(Box::new(|| {
            panic!("boom in a graph host node")
        })));
        let data = Arc::into_raw(Arc::clone(&f)).cast_mut().cast::<c_void>();
        // SAFETY: as above.
        unsafe { shared_host_fn_trampoline(data) };
        // SAFETY: as above.
        unsafe { shared_host_fn_destroy(data) };
        assert!(host_fn_panic_count() > before);
    }
}
