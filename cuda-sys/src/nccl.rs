//! NCCL, the collective communication library (`nccl.h`, NCCL 2.x), declared by hand:
//! NCCL's header is not part of the CUDA toolkit the other bindings are generated from,
//! and its ABI is small and stable (the same layout since NCCL 2.0; `ncclAvg` since
//! 2.10, `ncclBfloat16` since 2.10). Only what cuda-rt uses is declared.
//!
//! `libnccl.so.2` is found like the CUDA libraries: `CUDA_RT_LIBNCCL`, `CUDA_PATH`,
//! `/usr/local/cuda`, the system loader path, and the `nvidia/nccl/lib` folder of the
//! `nvidia-nccl-cu12`/`-cu13` Python wheels.
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::{c_char, c_int, c_void};

/// Where this module's functions are loaded from.
pub static LIBRARY: &crate::loader::LibrarySpec = &crate::loader::specs::NCCL;

/// An opaque NCCL communicator.
#[repr(C)]
pub struct ncclComm {
    _private: [u8; 0],
}
/// A communicator handle (`ncclComm_t`).
pub type ncclComm_t = *mut ncclComm;

/// `cudaStream_t` (the same handle as the driver's `CUstream`).
pub type cudaStream_t = *mut c_void;

/// The bytes that name a communicator to all its ranks (`NCCL_UNIQUE_ID_BYTES` = 128).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ncclUniqueId {
    /// The id's bytes.
    pub internal: [c_char; 128],
}

/// NCCL's status (`ncclResult_t`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ncclResult_t(pub u32);
impl ncclResult_t {
    /// Success.
    pub const ncclSuccess: ncclResult_t = ncclResult_t(0);
    /// A CUDA call NCCL made failed.
    pub const ncclUnhandledCudaError: ncclResult_t = ncclResult_t(1);
    /// A system call failed (sockets, shared memory...).
    pub const ncclSystemError: ncclResult_t = ncclResult_t(2);
    /// An internal check failed (a bug in NCCL, or memory corruption).
    pub const ncclInternalError: ncclResult_t = ncclResult_t(3);
    /// An invalid argument.
    pub const ncclInvalidArgument: ncclResult_t = ncclResult_t(4);
    /// A call made in the wrong way or order.
    pub const ncclInvalidUsage: ncclResult_t = ncclResult_t(5);
    /// A remote process failed or disconnected.
    pub const ncclRemoteError: ncclResult_t = ncclResult_t(6);
    /// A non-blocking operation is still in progress.
    pub const ncclInProgress: ncclResult_t = ncclResult_t(7);
}

/// Element types (`ncclDataType_t`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ncclDataType_t(pub u32);
impl ncclDataType_t {
    /// `int8_t` (also `ncclChar`).
    pub const ncclInt8: ncclDataType_t = ncclDataType_t(0);
    /// `uint8_t`.
    pub const ncclUint8: ncclDataType_t = ncclDataType_t(1);
    /// `int32_t` (also `ncclInt`).
    pub const ncclInt32: ncclDataType_t = ncclDataType_t(2);
    /// `uint32_t`.
    pub const ncclUint32: ncclDataType_t = ncclDataType_t(3);
    /// `int64_t`.
    pub const ncclInt64: ncclDataType_t = ncclDataType_t(4);
    /// `uint64_t`.
    pub const ncclUint64: ncclDataType_t = ncclDataType_t(5);
    /// `__half` (also `ncclHalf`).
    pub const ncclFloat16: ncclDataType_t = ncclDataType_t(6);
    /// `float` (also `ncclFloat`).
    pub const ncclFloat32: ncclDataType_t = ncclDataType_t(7);
    /// `double` (also `ncclDouble`).
    pub const ncclFloat64: ncclDataType_t = ncclDataType_t(8);
    /// `__nv_bfloat16` (NCCL 2.10 and later).
    pub const ncclBfloat16: ncclDataType_t = ncclDataType_t(9);
}

/// Reduction operations (`ncclRedOp_t`).
#[repr(transparent)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ncclRedOp_t(pub u32);
impl ncclRedOp_t {
    /// Sum.
    pub const ncclSum: ncclRedOp_t = ncclRedOp_t(0);
    /// Product.
    pub const ncclProd: ncclRedOp_t = ncclRedOp_t(1);
    /// Maximum.
    pub const ncclMax: ncclRedOp_t = ncclRedOp_t(2);
    /// Minimum.
    pub const ncclMin: ncclRedOp_t = ncclRedOp_t(3);
    /// Average (NCCL 2.10 and later).
    pub const ncclAvg: ncclRedOp_t = ncclRedOp_t(4);
}

crate::dylib_fns! {
    pub fn ncclGetVersion(version: *mut c_int) -> ncclResult_t;
    pub fn ncclGetUniqueId(uniqueId: *mut ncclUniqueId) -> ncclResult_t;
    pub fn ncclCommInitRank(comm: *mut ncclComm_t, nranks: c_int, commId: ncclUniqueId, rank: c_int) -> ncclResult_t;
    pub fn ncclCommInitAll(comm: *mut ncclComm_t, ndev: c_int, devlist: *const c_int) -> ncclResult_t;
    pub fn ncclCommFinalize(comm: ncclComm_t) -> ncclResult_t;
    pub fn ncclCommDestroy(comm: ncclComm_t) -> ncclResult_t;
    pub fn ncclCommAbort(comm: ncclComm_t) -> ncclResult_t;
    pub fn ncclGetErrorString(result: ncclResult_t) -> *const c_char;
    pub fn ncclGetLastError(comm: ncclComm_t) -> *const c_char;
    pub fn ncclCommGetAsyncError(comm: ncclComm_t, asyncError: *mut ncclResult_t) -> ncclResult_t;
    pub fn ncclCommCount(comm: ncclComm_t, count: *mut c_int) -> ncclResult_t;
    pub fn ncclCommCuDevice(comm: ncclComm_t, device: *mut c_int) -> ncclResult_t;
    pub fn ncclCommUserRank(comm: ncclComm_t, rank: *mut c_int) -> ncclResult_t;
    pub fn ncclAllReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclBroadcast(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclReduce(sendbuff: *const c_void, recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, op: ncclRedOp_t, root: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclAllGather(sendbuff: *const c_void, recvbuff: *mut c_void, sendcount: usize, datatype: ncclDataType_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclReduceScatter(sendbuff: *const c_void, recvbuff: *mut c_void, recvcount: usize, datatype: ncclDataType_t, op: ncclRedOp_t, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclSend(sendbuff: *const c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclRecv(recvbuff: *mut c_void, count: usize, datatype: ncclDataType_t, peer: c_int, comm: ncclComm_t, stream: cudaStream_t) -> ncclResult_t;
    pub fn ncclGroupStart() -> ncclResult_t;
    pub fn ncclGroupEnd() -> ncclResult_t;
}
