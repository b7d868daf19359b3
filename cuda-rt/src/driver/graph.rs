//! Checked driver calls about graphs (`cuGraph*`, `cuStream*Capture*`, user objects),
//! and the trampolines that run a shared Rust closure as a repeatable host node.

use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::{drv, sys};
use crate::error::Result;

// ---------------------------------------------------------------------------
// Capture

/// `cuStreamBeginCapture` in `mode`.
pub fn begin_capture(s: sys::CUstream, mode: sys::CUstreamCaptureMode) -> Result<()> {
    // SAFETY: `s` is a live stream (the caller's); the mode is a documented value.
    drv!(cuStreamBeginCapture_v2(s, mode))
}

/// `cuStreamEndCapture`: the captured graph, or the error; a graph the driver hands
/// back with an error is destroyed here.
pub fn end_capture(s: sys::CUstream) -> Result<sys::CUgraph> {
    match end_capture_raw(s) {
        (Ok(()), g) => Ok(g),
        (Err(e), g) => {
            discard(g);
            Err(e)
        }
    }
}

/// `cuStreamEndCapture` alone: the driver's verdict and the graph it handed back
/// (possibly null). On an error the caller owns a non-null graph and destroys it
/// ([`discard`]); nothing is destroyed here, so no user-object destructor runs
/// during this call.
pub fn end_capture_raw(s: sys::CUstream) -> (Result<()>, sys::CUgraph) {
    let mut g: sys::CUgraph = std::ptr::null_mut();
    let r = end_capture_into(s, &mut g);
    (r, g)
}

fn end_capture_into(s: sys::CUstream, g: &mut sys::CUgraph) -> Result<()> {
    // SAFETY: `g` is a valid out pointer; `s` a live stream.
    drv!(cuStreamEndCapture(s, g))
}

/// Destroys a graph handed back with a failed [`end_capture_raw`], if there is one.
pub fn discard(g: sys::CUgraph) {
    if !g.is_null() {
        let _ = destroy(g);
    }
}

/// `cuStreamGetCaptureInfo` (the 12.3 ABI): status, capture id and the graph being
/// captured (null unless active).
pub fn capture_info(s: sys::CUstream) -> Result<(sys::CUstreamCaptureStatus, u64, sys::CUgraph)> {
    let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id: u64 = 0;
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: the three out pointers are valid; the optional dependency outputs are
    // null, which the driver documents as "not wanted".
    drv!(cuStreamGetCaptureInfo_v3(
        s,
        &mut st,
        &mut id,
        &mut g,
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut()
    ))?;
    Ok((st, id, g))
}

// ---------------------------------------------------------------------------
// Graphs and executables

/// `cuGraphCreate`: an empty graph.
pub fn create() -> Result<sys::CUgraph> {
    let mut g: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `g` is a valid out pointer; flags must be 0.
    drv!(cuGraphCreate(&mut g, 0))?;
    Ok(g)
}

/// `cuGraphDestroy`.
pub fn destroy(g: sys::CUgraph) -> Result<()> {
    // SAFETY: the caller owns `g` and destroys it once.
    drv!(cuGraphDestroy(g))
}

/// `cuGraphClone`.
pub fn clone(g: sys::CUgraph) -> Result<sys::CUgraph> {
    let mut c: sys::CUgraph = std::ptr::null_mut();
    // SAFETY: `c` is a valid out pointer; `g` a live graph.
    drv!(cuGraphClone(&mut c, g))?;
    Ok(c)
}

/// `cuGraphInstantiateWithFlags`.
pub fn instantiate(g: sys::CUgraph, flags: u64) -> Result<sys::CUgraphExec> {
    let mut e: sys::CUgraphExec = std::ptr::null_mut();
    // SAFETY: `e` is a valid out pointer; `g` a live graph; the driver checks flags.
    drv!(cuGraphInstantiateWithFlags(&mut e, g, flags))?;
    Ok(e)
}

/// `cuGraphExecDestroy`.
pub fn exec_destroy(e: sys::CUgraphExec) -> Result<()> {
    // SAFETY: the caller owns `e` and destroys it once.
    drv!(cuGraphExecDestroy(e))
}

/// `cuGraphLaunch`.
#[inline]
pub fn launch(e: sys::CUgraphExec, s: sys::CUstream) -> Result<()> {
    // SAFETY: `e` is a live executable graph, `s` a live stream (or a default one).
    drv!(cuGraphLaunch(e, s))
}

/// `cuGraphUpload`.
pub fn upload(e: sys::CUgraphExec, s: sys::CUstream) -> Result<()> {
    // SAFETY: `e` is a live executable graph, `s` a live stream (or a default one).
    drv!(cuGraphUpload(e, s))
}

/// `cuGraphExecGetFlags`.
pub fn exec_flags(e: sys::CUgraphExec) -> Result<u64> {
    let mut f: u64 = 0;
    // SAFETY: `f` is a valid out pointer; `e` a live executable graph.
    drv!(cuGraphExecGetFlags(e, &mut f))?;
    Ok(f)
}

/// `cuGraphExecUpdate` (the 12.0 ABI). `Ok(Ok(()))` when updated, `Ok(Err(reason))`
/// when the driver refused the update (`CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE`), with
/// its reason; other failures are `Err`.
pub fn exec_update(
    e: sys::CUgraphExec,
    g: sys::CUgraph,
) -> Result<std::result::Result<(), sys::CUgraphExecUpdateResult>> {
    let mut info = sys::CUgraphExecUpdateResultInfo {
        result: sys::CUgraphExecUpdateResult::CU_GRAPH_EXEC_UPDATE_SUCCESS,
        errorNode: std::ptr::null_mut(),
        errorFromNode: std::ptr::null_mut(),
    };
    let f = super::api()?.cuGraphExecUpdate_v2()?;
    // SAFETY: `e` and `g` are live; `info` is a valid out pointer.
    let rc = unsafe { f(e, g, &mut info) };
    if rc == sys::CUresult::CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE {
        return Ok(Err(info.result));
    }
    super::check(rc, "cuGraphExecUpdate")?;
    Ok(Ok(()))
}

/// `cuGraphDebugDotPrint` to `path`.
pub fn debug_dot_print(g: sys::CUgraph, path: &CStr, flags: u32) -> Result<()> {
    // SAFETY: `g` is a live graph; `path` a NUL-terminated string alive for the call.
    drv!(cuGraphDebugDotPrint(g, path.as_ptr(), flags))
}

/// The nodes of `g` (`cuGraphGetNodes`, asked twice: count, then handles).
pub fn nodes(g: sys::CUgraph) -> Result<Vec<sys::CUgraphNode>> {
    let mut n: usize = 0;
    // SAFETY: a null array asks for the count only; `n` is a valid out pointer.
    drv!(cuGraphGetNodes(g, std::ptr::null_mut(), &mut n))?;
    if n == 0 {
        // The driver refuses a non-null array with a count of 0.
        return Ok(Vec::new());
    }
    let mut v: Vec<sys::CUgraphNode> = vec![std::ptr::null_mut(); n];
    // SAFETY: `v` has room for `n` handles; the driver writes at most `n`.
    drv!(cuGraphGetNodes(g, v.as_mut_ptr(), &mut n))?;
    v.truncate(n);
    Ok(v)
}

/// `cuGraphNodeGetType`.
pub fn node_type(n: sys::CUgraphNode) -> Result<sys::CUgraphNodeType> {
    let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
    // SAFETY: `n` is a node of a live graph; `t` a valid out pointer.
    drv!(cuGraphNodeGetType(n, &mut t))?;
    Ok(t)
}

// ---------------------------------------------------------------------------
// Explicit nodes. Each takes the graph, its dependencies (nodes of the same graph)
// and the node's parameters, which the driver copies.

/// `cuGraphAddEmptyNode`.
pub fn add_empty(g: sys::CUgraph, deps: &[sys::CUgraphNode]) -> Result<sys::CUgraphNode> {
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer; `deps` is a slice of nodes of `g`, length given.
    drv!(cuGraphAddEmptyNode(&mut n, g, deps.as_ptr(), deps.len()))?;
    Ok(n)
}

/// `cuGraphAddKernelNode` (the 12.0 ABI).
///
/// # Safety
/// `params.func` must be a live function of the current context, and
/// `params.kernelParams` an array with one pointer per kernel parameter, each to a
/// value of that parameter's type and size (the driver copies them during the call).
pub unsafe fn add_kernel(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    params: &sys::CUDA_KERNEL_NODE_PARAMS,
) -> Result<sys::CUgraphNode> {
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; the caller vouches for the
    // function and its parameter array.
    drv!(cuGraphAddKernelNode_v2(
        &mut n,
        g,
        deps.as_ptr(),
        deps.len(),
        params
    ))?;
    Ok(n)
}

/// `cuGraphAddMemcpyNode` of `bytes` from `src` to `dst` (unified addresses).
pub fn add_memcpy(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    dst: u64,
    src: u64,
    bytes: usize,
    ctx: sys::CUcontext,
) -> Result<sys::CUgraphNode> {
    // SAFETY: an all-zero CUDA_MEMCPY3D is a valid "nothing set" value (null pointers,
    // zero sizes); the fields that matter are set below.
    let mut p: sys::CUDA_MEMCPY3D = unsafe { std::mem::zeroed() };
    p.srcMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED;
    p.srcDevice = src;
    p.dstMemoryType = sys::CUmemorytype::CU_MEMORYTYPE_UNIFIED;
    p.dstDevice = dst;
    p.WidthInBytes = bytes;
    p.Height = 1;
    p.Depth = 1;
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer, dependency slice and parameters; the addresses are
    // checked by the driver when the node is added and kept alive by the caller.
    drv!(cuGraphAddMemcpyNode(
        &mut n,
        g,
        deps.as_ptr(),
        deps.len(),
        &p,
        ctx
    ))?;
    Ok(n)
}

/// `cuGraphAddMemsetNode`: `count` elements of `element_size` (1, 2 or 4) bytes.
pub fn add_memset(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    dst: u64,
    value: u32,
    element_size: u32,
    count: usize,
    ctx: sys::CUcontext,
) -> Result<sys::CUgraphNode> {
    let p = sys::CUDA_MEMSET_NODE_PARAMS {
        dst,
        pitch: 0,
        value,
        elementSize: element_size,
        width: count,
        height: 1,
    };
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer, dependency slice and parameters.
    drv!(cuGraphAddMemsetNode(
        &mut n,
        g,
        deps.as_ptr(),
        deps.len(),
        &p,
        ctx
    ))?;
    Ok(n)
}

/// `cuGraphAddEventRecordNode`.
pub fn add_event_record(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    ev: sys::CUevent,
) -> Result<sys::CUgraphNode> {
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; `ev` a live event that the
    // caller keeps alive as long as the graph.
    drv!(cuGraphAddEventRecordNode(
        &mut n,
        g,
        deps.as_ptr(),
        deps.len(),
        ev
    ))?;
    Ok(n)
}

/// `cuGraphAddEventWaitNode`.
pub fn add_event_wait(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    ev: sys::CUevent,
) -> Result<sys::CUgraphNode> {
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: as for `add_event_record`.
    drv!(cuGraphAddEventWaitNode(
        &mut n,
        g,
        deps.as_ptr(),
        deps.len(),
        ev
    ))?;
    Ok(n)
}

/// `cuGraphAddChildGraphNode` (the driver clones `child`).
pub fn add_child(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    child: sys::CUgraph,
) -> Result<sys::CUgraphNode> {
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer and dependency slice; `child` a live graph.
    drv!(cuGraphAddChildGraphNode(
        &mut n,
        g,
        deps.as_ptr(),
        deps.len(),
        child
    ))?;
    Ok(n)
}

// ---------------------------------------------------------------------------
// Repeatable host functions, owned by the graph through a CUDA user object.
//
// A host node may run once per launch, on a driver thread, from any executable or
// clone of the graph, for as long as any of them lives. The closure is therefore
// shared (`Fn`, `Send + Sync`) and owned by a user object that the graph holds
// (`cuGraphRetainUserObject` with MOVE): CUDA carries the reference into clones,
// child-graph nodes, executables and updates, and calls the destructor once the
// last of them is gone and its work has finished.

/// A host closure that a graph may call any number of times, behind a thin pointer.
pub struct SharedHostFn(pub Box<dyn Fn() + Send + Sync + 'static>);

/// Runs `f`, catching a panic; counted with the run-once host functions.
fn run_caught(f: impl FnOnce()) {
    if catch_unwind(AssertUnwindSafe(f)).is_err() {
        super::stream::count_host_fn_panic();
    }
}

/// The `CUhostFn` of a repeatable host node: calls the closure, keeps it.
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
unsafe extern "C" fn shared_host_fn_destroy(data: *mut c_void) {
    run_caught(|| {
        // SAFETY: the driver calls the destructor once, after the last reference to
        // the user object is gone; the reference was leaked for it in `retain_host_fn`.
        drop(unsafe { Arc::from_raw(data.cast_const().cast::<SharedHostFn>()) });
    });
}

/// Gives graph `g` a reference to `f` through a new user object (CUDA carries it into
/// clones, child-graph nodes, executables and updates), and returns the host node
/// parameters (function and data) that call it. The caller may keep its own `Arc`
/// too (cuda-rt's graphs do, in their keep-alive list).
pub fn retain_host_fn(
    g: sys::CUgraph,
    f: &Arc<SharedHostFn>,
) -> Result<(sys::CUhostFn, *mut c_void)> {
    let data = Arc::into_raw(Arc::clone(f)).cast_mut().cast::<c_void>();
    let mut obj: sys::CUuserObject = std::ptr::null_mut();
    // SAFETY: valid out pointer; the destructor matches `data`'s type; one reference;
    // the only documented flag, which lets the driver call the destructor on its own
    // thread.
    let r = drv!(cuUserObjectCreate(
        &mut obj,
        data,
        Some(shared_host_fn_destroy),
        1,
        sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC.0
    ));
    if let Err(e) = r {
        // SAFETY: the driver refused, so it owns nothing: the reference is still ours.
        drop(unsafe { Arc::from_raw(data.cast_const().cast::<SharedHostFn>()) });
        return Err(e);
    }
    // SAFETY: `g` is a live graph; MOVE hands our one reference to it.
    let r = drv!(cuGraphRetainUserObject(
        g,
        obj,
        1,
        sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE.0
    ));
    if let Err(e) = r {
        // SAFETY: our reference was not moved: release it, which runs the destructor.
        let _ = drv!(cuUserObjectRelease(obj, 1));
        return Err(e);
    }
    Ok((Some(shared_host_fn_trampoline), data))
}

/// `cuLaunchHostFunc` of a repeatable host node on `s`, which captures into graph
/// `g`: the graph gets a reference to `f` (see [`retain_host_fn`]), and the captured
/// node calls it on every launch.
pub fn launch_captured_host_fn(
    s: sys::CUstream,
    g: sys::CUgraph,
    f: &Arc<SharedHostFn>,
) -> Result<()> {
    let (fn_, data) = retain_host_fn(g, f)?;
    // SAFETY: `s` is a live stream capturing into `g`, which owns the reference that
    // `data` is for as long as the node (in `g`, its clones or executables) can run.
    drv!(cuLaunchHostFunc(s, fn_, data))
}

/// `cuGraphAddHostNode` for a closure the graph owns (see [`retain_host_fn`]).
pub fn add_host(
    g: sys::CUgraph,
    deps: &[sys::CUgraphNode],
    f: &Arc<SharedHostFn>,
) -> Result<sys::CUgraphNode> {
    let (fn_, data) = retain_host_fn(g, f)?;
    let p = sys::CUDA_HOST_NODE_PARAMS {
        fn_,
        userData: data,
    };
    let mut n: sys::CUgraphNode = std::ptr::null_mut();
    // SAFETY: valid out pointer, dependency slice and parameters; `g` owns `data`.
    drv!(cuGraphAddHostNode(&mut n, g, deps.as_ptr(), deps.len(), &p))?;
    Ok(n)
}

// ---------------------------------------------------------------------------
// Graph memory

/// `cuDeviceGraphMemTrim`: gives back the device's graph memory not in use.
pub fn graph_mem_trim(dev: sys::CUdevice) -> Result<()> {
    // SAFETY: `dev` came from cuDeviceGet.
    drv!(cuDeviceGraphMemTrim(dev))
}

/// The bytes of a plain-data value (a kernel argument).
pub fn pod_bytes<T: crate::memory::Pod>(v: &T) -> &[u8] {
    // SAFETY: `Pod` types have no padding (the trait's promise), so every byte is
    // initialised; the slice covers exactly the value and borrows it.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let before = super::super::stream::host_fn_panic_count();
        let f = Arc::new(SharedHostFn(Box::new(|| {
            panic!("boom in a graph host node")
        })));
        let data = Arc::into_raw(Arc::clone(&f)).cast_mut().cast::<c_void>();
        // SAFETY: as above.
        unsafe { shared_host_fn_trampoline(data) };
        // SAFETY: as above.
        unsafe { shared_host_fn_destroy(data) };
        assert!(super::super::stream::host_fn_panic_count() > before);
    }
}
