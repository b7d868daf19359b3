//! Checked NCCL calls: unique ids, communicators, collectives, point-to-point and
//! groups. A status other than success is an [`NcclError`] with
//! NCCL's status name (`ncclInvalidArgument`), its words for it
//! (`ncclGetErrorString`) and the thread's last error message (`ncclGetLastError`).
//!
//! Calls that take a communicator, device addresses or a stream are `unsafe fn`: the
//! communicator is live (initialised, not destroyed) and not used by another thread
//! during the call; buffers are device memory of the communicator's device, valid for
//! the bytes the operation touches until the stream has passed it; the stream is a
//! live stream of that device.

use std::ffi::{c_int, c_void, CStr};

use super::{NcclError, Result};
use crate::nccl::{
    self as sys, cudaStream_t, ncclComm_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};

/// The name of NCCL status `code`, e.g. `ncclInvalidArgument` (a plain table: no
/// library is loaded).
pub fn status_name(code: u32) -> &'static str {
    match code {
        0 => "ncclSuccess",
        1 => "ncclUnhandledCudaError",
        2 => "ncclSystemError",
        3 => "ncclInternalError",
        4 => "ncclInvalidArgument",
        5 => "ncclInvalidUsage",
        6 => "ncclRemoteError",
        7 => "ncclInProgress",
        _ => "ncclUnknownResult",
    }
}

/// `Ok(())` for `ncclSuccess`, else the [`NcclError`] of `status` for `call`.
#[inline]
pub fn check(status: ncclResult_t, call: &'static str) -> Result<()> {
    if status == ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(NcclError::new(status.0, call).into())
    }
}

/// NCCL's description of `status` (`ncclGetErrorString`), `None` when NCCL is missing.
pub fn get_error_string(status: u32) -> Option<&'static str> {
    let f = sys::api().ok()?.ncclGetErrorString().ok()?;
    // SAFETY: ncclGetErrorString takes any value and returns a static string.
    let p = unsafe { f(ncclResult_t(status)) };
    if p.is_null() {
        return None;
    }
    // SAFETY: a NUL-terminated static string of the library, which is never unloaded.
    unsafe { CStr::from_ptr::<'static>(p) }.to_str().ok()
}

/// The calling thread's last NCCL error message (`ncclGetLastError(NULL)`), `None`
/// when empty or when NCCL is missing.
pub fn get_last_error() -> Option<String> {
    let f = sys::api().ok()?.ncclGetLastError().ok()?;
    // SAFETY: a null communicator asks for the thread's last error; NCCL returns a
    // pointer to a thread-local NUL-terminated string (copied at once).
    let p = unsafe { f(std::ptr::null_mut()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: as above; read before any other NCCL call on this thread.
    let s = unsafe { CStr::from_ptr(p) }
        .to_string_lossy()
        .trim()
        .to_string();
    (!s.is_empty()).then_some(s)
}

/// NCCL's version as an integer, e.g. 22703 for 2.27.3 (`ncclGetVersion`).
pub fn get_version() -> Result<i32> {
    let f = sys::api()?.ncclGetVersion()?;
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out pointer.
    check(unsafe { f(&mut v) }, "ncclGetVersion")?;
    Ok(v)
}

/// A new unique id (`ncclGetUniqueId`), to be given to every rank of one communicator.
pub fn get_unique_id() -> Result<[u8; 128]> {
    let f = sys::api()?.ncclGetUniqueId()?;
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: `id` is a valid out pointer.
    check(unsafe { f(&mut id) }, "ncclGetUniqueId")?;
    Ok(id.internal.map(|c| c as u8))
}

/// Joins communicator `id` as `rank` of `nranks` on the current device
/// (`ncclCommInitRank`); blocks until every rank has joined. The caller destroys the
/// communicator once with [`comm_destroy`] or [`comm_abort`].
pub fn comm_init_rank(nranks: i32, id: &[u8; 128], rank: i32) -> Result<ncclComm_t> {
    let f = sys::api()?.ncclCommInitRank()?;
    let id = ncclUniqueId {
        internal: id.map(|b| b as std::ffi::c_char),
    };
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // SAFETY: `comm` is a valid out pointer; NCCL validates the rank, count and id.
    check(
        unsafe { f(&mut comm, nranks, id, rank) },
        "ncclCommInitRank",
    )?;
    Ok(comm)
}

/// One communicator per device of `devices`, in one process (`ncclCommInitAll`): rank
/// `i` on `devices[i]`. The caller destroys each once.
pub fn comm_init_all(devices: &[i32]) -> Result<Vec<ncclComm_t>> {
    let f = sys::api()?.ncclCommInitAll()?;
    let mut comms: Vec<ncclComm_t> = vec![std::ptr::null_mut(); devices.len()];
    // SAFETY: `comms` has room for `devices.len()` handles, `devices` is that long.
    check(
        unsafe { f(comms.as_mut_ptr(), devices.len() as c_int, devices.as_ptr()) },
        "ncclCommInitAll",
    )?;
    Ok(comms)
}

/// Destroys a communicator after its queued work (`ncclCommDestroy`).
///
/// # Safety
/// `comm` is live, destroyed once (or aborted), and not used afterwards.
pub unsafe fn comm_destroy(comm: ncclComm_t) -> Result<()> {
    let f = sys::api()?.ncclCommDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(comm) }, "ncclCommDestroy")
}

/// Aborts a communicator's pending work and destroys it (`ncclCommAbort`).
///
/// # Safety
/// `comm` is live, destroyed once (or aborted), and not used afterwards.
pub unsafe fn comm_abort(comm: ncclComm_t) -> Result<()> {
    let f = sys::api()?.ncclCommAbort()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(comm) }, "ncclCommAbort")
}

/// The error a communicator's asynchronous work met, `ncclSuccess` for none
/// (`ncclCommGetAsyncError`).
///
/// # Safety
/// `comm` is live.
pub unsafe fn comm_get_async_error(comm: ncclComm_t) -> Result<ncclResult_t> {
    let f = sys::api()?.ncclCommGetAsyncError()?;
    let mut r = ncclResult_t::ncclSuccess;
    // SAFETY: `r` is a valid out pointer; `comm` is live (caller).
    check(unsafe { f(comm, &mut r) }, "ncclCommGetAsyncError")?;
    Ok(r)
}

macro_rules! comm_query {
    ($(#[$m:meta])* $name:ident, $call:ident) => {
        $(#[$m])*
        ///
        /// # Safety
        /// `comm` is live.
        pub unsafe fn $name(comm: ncclComm_t) -> Result<i32> {
            let f = sys::api()?.$call()?;
            let mut v: c_int = 0;
            // SAFETY: `v` is a valid out pointer; `comm` is live (caller).
            check(unsafe { f(comm, &mut v) }, stringify!($call))?;
            Ok(v)
        }
    };
}

comm_query!(
    /// The number of ranks (`ncclCommCount`).
    comm_count,
    ncclCommCount
);
comm_query!(
    /// The CUDA device of the communicator (`ncclCommCuDevice`).
    comm_cu_device,
    ncclCommCuDevice
);
comm_query!(
    /// This rank's number (`ncclCommUserRank`).
    comm_user_rank,
    ncclCommUserRank
);

/// `ncclAllReduce`: `recv = op(send of every rank)`, `count` elements.
///
/// # Safety
/// See the [module doc](self): `send` and `recv` hold `count` elements of `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn all_reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclAllReduce()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(send, recv, count, dtype, op, comm, stream) },
        "ncclAllReduce",
    )
}

/// `ncclBroadcast`: `recv` of every rank = `send` of `root`, `count` elements.
///
/// # Safety
/// See the [module doc](self): `send` (read at the root only) and `recv` hold `count`
/// elements of `dtype`.
pub unsafe fn broadcast(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    root: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclBroadcast()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(send, recv, count, dtype, root, comm, stream) },
        "ncclBroadcast",
    )
}

/// `ncclReduce`: `recv` of `root` = `op(send of every rank)`, `count` elements.
///
/// # Safety
/// See the [module doc](self): `send` and `recv` (written at the root only) hold
/// `count` elements of `dtype`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn reduce(
    send: *const c_void,
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    root: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclReduce()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(send, recv, count, dtype, op, root, comm, stream) },
        "ncclReduce",
    )
}

/// `ncclAllGather`: `recv[r * send_count..]` = `send` of rank `r`.
///
/// # Safety
/// See the [module doc](self): `send` holds `send_count` elements of `dtype`, `recv`
/// `send_count * nranks`.
pub unsafe fn all_gather(
    send: *const c_void,
    recv: *mut c_void,
    send_count: usize,
    dtype: ncclDataType_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclAllGather()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(send, recv, send_count, dtype, comm, stream) },
        "ncclAllGather",
    )
}

/// `ncclReduceScatter`: `recv` of rank `r` = `op(send[r * recv_count..] of every rank)`.
///
/// # Safety
/// See the [module doc](self): `recv` holds `recv_count` elements of `dtype`, `send`
/// `recv_count * nranks`.
pub unsafe fn reduce_scatter(
    send: *const c_void,
    recv: *mut c_void,
    recv_count: usize,
    dtype: ncclDataType_t,
    op: ncclRedOp_t,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclReduceScatter()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(send, recv, recv_count, dtype, op, comm, stream) },
        "ncclReduceScatter",
    )
}

/// `ncclSend`: `count` elements to rank `peer`, which posts the matching [`recv`].
///
/// # Safety
/// See the [module doc](self): `send` holds `count` elements of `dtype`.
pub unsafe fn send(
    send: *const c_void,
    count: usize,
    dtype: ncclDataType_t,
    peer: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclSend()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(send, count, dtype, peer, comm, stream) },
        "ncclSend",
    )
}

/// `ncclRecv`: `count` elements from rank `peer`, which posts the matching [`send`].
///
/// # Safety
/// See the [module doc](self): `recv` holds `count` elements of `dtype`.
pub unsafe fn recv(
    recv: *mut c_void,
    count: usize,
    dtype: ncclDataType_t,
    peer: i32,
    comm: ncclComm_t,
    stream: cudaStream_t,
) -> Result<()> {
    let f = sys::api()?.ncclRecv()?;
    // SAFETY: see `# Safety`.
    check(
        unsafe { f(recv, count, dtype, peer, comm, stream) },
        "ncclRecv",
    )
}

/// Starts a group of NCCL calls, launched together at [`group_end`] (`ncclGroupStart`).
pub fn group_start() -> Result<()> {
    let f = sys::api()?.ncclGroupStart()?;
    // SAFETY: no arguments; NCCL keeps a per-thread nesting count.
    check(unsafe { f() }, "ncclGroupStart")
}

/// Ends a group of NCCL calls and launches them (`ncclGroupEnd`).
pub fn group_end() -> Result<()> {
    let f = sys::api()?.ncclGroupEnd()?;
    // SAFETY: no arguments; an unmatched end is an error status.
    check(unsafe { f() }, "ncclGroupEnd")
}
