//! NCCL communicators: collectives and point-to-point transfers between GPUs, in one
//! process or many, on one host or several.
//!
//! NCCL (`libnccl.so.2`) is loaded at run time like every CUDA library (see
//! [`cuda_sys::nccl`]); a machine without it gets an [`Error::Load`] naming every path
//! tried, and NCCL's own failures are [`Error::Nccl`] with its status name, its words
//! and its last error message.
//!
//! A communicator of `n` ranks is made from one [`UniqueId`] that rank 0 creates and
//! every rank receives: its [`to_bytes`](UniqueId::to_bytes) are 128 plain bytes to
//! send any way, or [`bootstrap`] sends them over TCP for jobs launched the way
//! `torchrun` and MPI launch them (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
//! `MASTER_PORT`). Each rank then calls [`Communicator::init_rank`] on its own GPU;
//! one process driving several GPUs can use [`Communicator::init_all`].
//!
//! Operations take typed device buffers ([`DeviceSlice`] to read, [`DeviceSliceMut`]
//! to write; `buf.as_slice()` / `buf.as_mut_slice()` of a [`DeviceBuffer`]) and a
//! stream, and are queued on it like a copy: the buffers are borrowed for the call,
//! and the memory stays valid for queued work as for
//! [`DeviceSliceMut::copy_from_async`]. Element types are those of [`NcclType`]:
//! the integer types NCCL knows, `f32`, `f64`, [`F16`], [`Bf16`] (and `half::f16`,
//! `half::bf16` with the `half` feature).
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::nccl::{Communicator, ReduceOp, UniqueId};
//! use cuda_rt::{DeviceBuffer, Stream};
//! let id = UniqueId::new()?;
//! let comm = Communicator::init_rank(1, &id, 0)?; // one rank, on the current device
//! let s = Stream::new()?;
//! let mut x = DeviceBuffer::from_slice(&[1.0f32, 2.0, 3.0])?;
//! comm.all_reduce_in_place(x.as_mut_slice(), ReduceOp::Sum, &s)?;
//! s.synchronize()?;
//! assert_eq!(x.to_vec()?, [1.0, 2.0, 3.0]);
//! # Ok(()) }
//! ```
//!
//! [`DeviceBuffer`]: crate::DeviceBuffer
//! [`DeviceSliceMut::copy_from_async`]: crate::DeviceSliceMut::copy_from_async

pub mod bootstrap;

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cuda_sys::nccl::{ncclComm_t, ncclDataType_t, ncclRedOp_t};
use cuda_sys::result::nccl as raw;

use crate::buffer::{DeviceSlice, DeviceSliceMut};
use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result, StateKind};
use crate::memory::{uses, BaseMemory, Bf16, Pod, F16};
use crate::stream::AsStream;

/// NCCL's version as an integer, e.g. 22703 for 2.27.3; an [`Error::Load`] when NCCL
/// cannot be found.
pub fn version() -> Result<i32> {
    Ok(raw::get_version()?)
}

/// Whether NCCL can be loaded here.
pub fn is_available() -> bool {
    version().is_ok()
}

/// The id every rank of one communicator is created with: 128 plain bytes
/// (`ncclUniqueId`). Rank 0 makes it with [`UniqueId::new`]; the others get its
/// [`to_bytes`](Self::to_bytes) by any means ([`bootstrap`], MPI, a file...).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId([u8; 128]);

impl UniqueId {
    /// The id's length in bytes.
    pub const BYTES: usize = 128;

    /// A new id (`ncclGetUniqueId`); it names rank 0's bootstrap address, so it is
    /// made on the host of rank 0.
    pub fn new() -> Result<UniqueId> {
        Ok(UniqueId(raw::get_unique_id()?))
    }

    /// The id's bytes.
    pub fn to_bytes(&self) -> [u8; 128] {
        self.0
    }

    /// An id from bytes of [`to_bytes`](Self::to_bytes).
    pub fn from_bytes(bytes: [u8; 128]) -> UniqueId {
        UniqueId(bytes)
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UniqueId(")?;
        for b in &self.0[..16] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "...)")
    }
}

/// A reduction ([`Communicator::all_reduce`], [`reduce`](Communicator::reduce),
/// [`reduce_scatter`](Communicator::reduce_scatter)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average over the ranks (NCCL 2.10 and later).
    Avg,
}

impl ReduceOp {
    fn raw(self) -> ncclRedOp_t {
        match self {
            ReduceOp::Sum => ncclRedOp_t::ncclSum,
            ReduceOp::Prod => ncclRedOp_t::ncclProd,
            ReduceOp::Max => ncclRedOp_t::ncclMax,
            ReduceOp::Min => ncclRedOp_t::ncclMin,
            ReduceOp::Avg => ncclRedOp_t::ncclAvg,
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Element types NCCL reduces and moves; sealed (NCCL trusts the type tag to read the
/// bytes).
pub trait NcclType: Pod + sealed::Sealed {
    /// NCCL's tag for the type.
    const DATA_TYPE: ncclDataType_t;
}

macro_rules! nccl_types {
    ($($t:ty => $tag:ident),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl NcclType for $t {
            const DATA_TYPE: ncclDataType_t = ncclDataType_t::$tag;
        }
    )*};
}

nccl_types!(
    i8 => ncclInt8, u8 => ncclUint8, i32 => ncclInt32, u32 => ncclUint32,
    i64 => ncclInt64, u64 => ncclUint64, f32 => ncclFloat32, f64 => ncclFloat64,
    F16 => ncclFloat16, Bf16 => ncclBfloat16,
);
#[cfg(feature = "half")]
nccl_types!(half::f16 => ncclFloat16, half::bf16 => ncclBfloat16);

/// Starts a group of NCCL calls (`ncclGroupStart`): calls until [`group_end`] are
/// launched together, as several point-to-point transfers or one thread driving
/// several communicators need. [`group`] pairs the two.
pub fn group_start() -> Result<()> {
    raw::group_start()?;
    GROUP.with(|g| g.depth.set(g.depth.get() + 1));
    Ok(())
}

/// Ends a group (`ncclGroupEnd`) and launches its calls. The memory the group's calls
/// use is let go only after the launch, so a buffer dropped inside the group is
/// freed after the work that uses it, not before.
pub fn group_end() -> Result<()> {
    let r = raw::group_end();
    let held = GROUP.with(|g| {
        let d = g.depth.get().saturating_sub(1);
        g.depth.set(d);
        if d == 0 {
            std::mem::take(&mut *g.held.borrow_mut())
        } else {
            Vec::new()
        }
    });
    drop(held);
    Ok(r?)
}

/// This thread's NCCL groups: how deep it is in `ncclGroupStart`s, and the memory the
/// calls inside use, held until the outermost `ncclGroupEnd` has launched them (NCCL
/// queues a grouped call on its stream only then, so a free recorded earlier would
/// come before it in the stream).
struct Group {
    depth: std::cell::Cell<u32>,
    held: std::cell::RefCell<Vec<Arc<dyn BaseMemory>>>,
}

thread_local! {
    static GROUP: Group = const {
        Group {
            depth: std::cell::Cell::new(0),
            held: std::cell::RefCell::new(Vec::new()),
        }
    };
}

/// Queues NCCL work of the communicator `comm` on `stream` through `call`, noting its
/// uses of `mems` (see `memory::uses`), and holding them until the group's end inside
/// a group. On a stream that is capturing, the capture's graph keeps `comm`: NCCL's
/// destroy waits for every graph that holds one of its collectives (and older NCCL
/// would free the communicator under the graph), so the graph must go first.
fn enqueue<S: AsStream + ?Sized>(
    stream: &S,
    comm: &Arc<CommHandle>,
    mems: &[&Arc<dyn BaseMemory>],
    call: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let s = stream.as_stream_ref();
    uses::check(Some(&s), mems)?;
    uses::enqueue(&s, mems, call)?;
    if crate::capture::any_capture_active() {
        let keep: Arc<dyn std::any::Any + Send + Sync> = comm.clone();
        crate::capture::keep_in_capture(&s, keep)?;
    }
    GROUP.with(|g| {
        if g.depth.get() > 0 {
            if let Ok(mut held) = g.held.try_borrow_mut() {
                held.extend(mems.iter().map(|m| Arc::clone(m)));
            }
        }
    });
    Ok(())
}

/// Runs `f` inside `ncclGroupStart`/`ncclGroupEnd`; the group is ended also when `f`
/// fails (then `f`'s error is returned).
pub fn group<R>(f: impl FnOnce() -> Result<R>) -> Result<R> {
    group_start()?;
    let out = f();
    let end = group_end();
    let r = out?;
    end?;
    Ok(r)
}

/// One rank of an NCCL communicator, on one device. Destroyed (after its queued work)
/// on drop; [`destroy`](Self::destroy) says whether that worked, and
/// [`abort`](Self::abort) gives up on queued work.
///
/// `Send`, not `Sync`: NCCL lets any thread use a communicator, but one at a time.
pub struct Communicator {
    comm: usize,
    device: i32,
    rank: i32,
    size: i32,
    /// What destroys the communicator: this value's, or a captured graph's clone.
    owner: Arc<CommHandle>,
    _not_sync: PhantomData<std::cell::Cell<()>>,
}

/// The NCCL communicator, destroyed (after its queued work) when its last holder goes:
/// the [`Communicator`], or a graph captured with one of its collectives, which NCCL
/// needs to go first.
#[derive(Debug)]
struct CommHandle {
    comm: usize,
    device: i32,
}

impl CommHandle {
    fn new(comm: ncclComm_t, device: i32) -> Arc<CommHandle> {
        Arc::new(CommHandle {
            comm: comm as usize,
            device,
        })
    }
}

impl Drop for CommHandle {
    fn drop(&mut self) {
        if make_current(self.device).is_ok() {
            // SAFETY: the communicator is live and destroyed here, once, by its last
            // holder. A failure (a peer gone, NCCL torn down at exit) leaves nothing
            // to do.
            let _ = unsafe { raw::comm_destroy(self.comm as ncclComm_t) };
        }
    }
}

impl fmt::Debug for Communicator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.size)
            .field("device", &self.device)
            .finish()
    }
}

impl Communicator {
    /// Joins the communicator named by `id` as rank `rank` of `nranks`, on the current
    /// device (`ncclCommInitRank`). Blocks until every rank has joined. NCCL refuses
    /// two ranks on one GPU.
    pub fn init_rank(nranks: i32, id: &UniqueId, rank: i32) -> Result<Communicator> {
        if nranks < 1 || rank < 0 || rank >= nranks {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("Communicator::init_rank: rank {rank} of {nranks} ranks"),
            ));
        }
        let device = get_device_id();
        make_current(device)?;
        let comm = raw::comm_init_rank(nranks, &id.0, rank)?;
        Ok(Communicator {
            comm: comm as usize,
            device,
            rank,
            size: nranks,
            owner: CommHandle::new(comm, device),
            _not_sync: PhantomData,
        })
    }

    /// One communicator per device of `devices`, driven by this process
    /// (`ncclCommInitAll`): rank `i` on `devices[i]`. Use [`group`] to queue work on
    /// several of them from one thread.
    pub fn init_all(devices: &[i32]) -> Result<Vec<Communicator>> {
        if devices.is_empty() {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                "Communicator::init_all: no devices",
            ));
        }
        for &d in devices {
            crate::Device::new(d)?;
        }
        make_current(devices[0])?;
        let comms = raw::comm_init_all(devices)?;
        let n = devices.len() as i32;
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(i, (c, &device))| Communicator {
                comm: c as usize,
                device,
                rank: i as i32,
                size: n,
                owner: CommHandle::new(c, device),
                _not_sync: PhantomData,
            })
            .collect())
    }

    /// This rank's number.
    pub fn rank(&self) -> i32 {
        self.rank
    }

    /// The number of ranks.
    pub fn size(&self) -> i32 {
        self.size
    }

    /// The device this rank runs on.
    pub fn device_id(&self) -> i32 {
        self.device
    }

    /// The raw `ncclComm_t`, still owned by `self`.
    pub fn as_raw(&self) -> ncclComm_t {
        self.comm as ncclComm_t
    }

    /// The error the communicator's asynchronous work met, if any
    /// (`ncclCommGetAsyncError`): `Ok(())` when none.
    pub fn async_error(&self) -> Result<()> {
        // SAFETY: the communicator is live while `self` is.
        let r = unsafe { raw::comm_get_async_error(self.as_raw()) }?;
        Ok(raw::check(r, "ncclCommGetAsyncError (asynchronous error)")?)
    }

    /// Destroys the communicator after its queued work (`ncclCommDestroy`). While a
    /// graph captured with one of its collectives lives, the graph keeps it, and it is
    /// destroyed when the last such graph goes (NCCL's destroy would wait for those
    /// graphs); `Ok` then says nothing failed so far.
    pub fn destroy(self) -> Result<()> {
        make_current(self.device)?;
        let Ok(handle) = Arc::try_unwrap(self.owner) else {
            return Ok(());
        };
        let handle = std::mem::ManuallyDrop::new(handle);
        // SAFETY: the communicator is live and, its only holder taken here, destroyed
        // once.
        Ok(unsafe { raw::comm_destroy(handle.comm as ncclComm_t) }?)
    }

    /// Aborts the communicator's pending work and destroys it (`ncclCommAbort`): for
    /// when a peer has failed and waiting would hang. Refused while a graph captured
    /// with one of its collectives lives (the graph would launch on a destroyed
    /// communicator): the graph keeps it, destroyed when the last such graph goes.
    pub fn abort(self) -> Result<()> {
        make_current(self.device)?;
        let handle = Arc::try_unwrap(self.owner).map_err(|graphs| {
            Error::invalid_state(
                StateKind::Shared {
                    others: Arc::strong_count(&graphs) - 1,
                },
                "Communicator::abort: a captured graph still holds one of this \
                 communicator's collectives; drop the graph first (the communicator is \
                 destroyed when it goes)",
            )
        })?;
        let handle = std::mem::ManuallyDrop::new(handle);
        // SAFETY: as in `destroy`.
        Ok(unsafe { raw::comm_abort(handle.comm as ncclComm_t) }?)
    }

    fn check_stream<S: AsStream + ?Sized>(&self, what: &str, stream: &S) -> Result<()> {
        self.check_device(what, "the stream", stream.device_id())?;
        make_current(self.device)
    }

    fn check_device(&self, what: &str, which: &str, found: i32) -> Result<()> {
        if found == self.device {
            return Ok(());
        }
        Err(Error::invalid_argument(
            ArgumentKind::WrongDevice {
                expected: self.device,
                found,
            },
            format!(
                "Communicator::{what}: {which} is on device {found}, the communicator's \
                 rank {} on device {}",
                self.rank, self.device
            ),
        ))
    }

    fn check_len(&self, what: &str, which: &str, expected: usize, found: usize) -> Result<()> {
        if expected == found {
            return Ok(());
        }
        Err(Error::invalid_argument(
            ArgumentKind::LengthMismatch {
                expected: expected as u64,
                found: found as u64,
            },
            format!("Communicator::{what}: {which} has {found} elements, expected {expected}"),
        ))
    }

    fn check_root(&self, what: &str, root: i32) -> Result<()> {
        if (0..self.size).contains(&root) {
            return Ok(());
        }
        Err(Error::invalid_argument(
            ArgumentKind::InvalidValue,
            format!(
                "Communicator::{what}: rank {root} is not a rank of this communicator (0..{})",
                self.size
            ),
        ))
    }

    fn src<T: Pod>(&self, what: &str, s: &DeviceSlice<'_, T>) -> Result<*const c_void> {
        self.check_device(what, "the send buffer", s.device_id())?;
        Ok(s.device_ptr() as *const c_void)
    }

    fn dst<T: Pod>(&self, what: &str, s: &DeviceSliceMut<'_, T>) -> Result<*mut c_void> {
        self.check_device(what, "the receive buffer", s.device_id())?;
        Ok(s.device_ptr() as *mut c_void)
    }

    /// Every rank's `recv` = `op` over every rank's `send` (`ncclAllReduce`); both as
    /// long.
    pub fn all_reduce<T: NcclType, S: AsStream + ?Sized>(
        &self,
        send: DeviceSlice<'_, T>,
        recv: DeviceSliceMut<'_, T>,
        op: ReduceOp,
        stream: &S,
    ) -> Result<()> {
        let what = "all_reduce";
        self.check_len(what, "the receive buffer", send.len(), recv.len())?;
        let (s, r) = (self.src(what, &send)?, self.dst(what, &recv)?);
        self.check_stream(what, stream)?;
        // SAFETY: both views are device memory of this rank's device holding
        // `send.len()` elements of `T` (checked), borrowed for the call and kept
        // valid for queued work as copies are; the stream is live while borrowed.
        enqueue(stream, &self.owner, &[send.memory(), recv.memory()], || {
            Ok(unsafe {
                raw::all_reduce(
                    s,
                    r,
                    send.len(),
                    T::DATA_TYPE,
                    op.raw(),
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// [`all_reduce`](Self::all_reduce) with `buf` as both send and receive buffer.
    pub fn all_reduce_in_place<T: NcclType, S: AsStream + ?Sized>(
        &self,
        buf: DeviceSliceMut<'_, T>,
        op: ReduceOp,
        stream: &S,
    ) -> Result<()> {
        let what = "all_reduce_in_place";
        let p = self.dst(what, &buf)?;
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`; NCCL allows send == recv.
        enqueue(stream, &self.owner, &[buf.memory()], || {
            Ok(unsafe {
                raw::all_reduce(
                    p,
                    p,
                    buf.len(),
                    T::DATA_TYPE,
                    op.raw(),
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// Every rank's `recv` = `root`'s `send` (`ncclBroadcast`); `send` is read at the
    /// root only, but every rank passes one as long as `recv`.
    pub fn broadcast<T: NcclType, S: AsStream + ?Sized>(
        &self,
        send: DeviceSlice<'_, T>,
        recv: DeviceSliceMut<'_, T>,
        root: i32,
        stream: &S,
    ) -> Result<()> {
        let what = "broadcast";
        self.check_root(what, root)?;
        self.check_len(what, "the receive buffer", send.len(), recv.len())?;
        let (s, r) = (self.src(what, &send)?, self.dst(what, &recv)?);
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`.
        enqueue(stream, &self.owner, &[send.memory(), recv.memory()], || {
            Ok(unsafe {
                raw::broadcast(
                    s,
                    r,
                    recv.len(),
                    T::DATA_TYPE,
                    root,
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// [`broadcast`](Self::broadcast) in place: `buf` of every rank = `buf` of `root`.
    pub fn broadcast_in_place<T: NcclType, S: AsStream + ?Sized>(
        &self,
        buf: DeviceSliceMut<'_, T>,
        root: i32,
        stream: &S,
    ) -> Result<()> {
        let what = "broadcast_in_place";
        self.check_root(what, root)?;
        let p = self.dst(what, &buf)?;
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`.
        enqueue(stream, &self.owner, &[buf.memory()], || {
            Ok(unsafe {
                raw::broadcast(
                    p,
                    p,
                    buf.len(),
                    T::DATA_TYPE,
                    root,
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// `root`'s `recv` = `op` over every rank's `send` (`ncclReduce`); `recv` is
    /// written at the root only, but every rank passes one as long as `send`.
    pub fn reduce<T: NcclType, S: AsStream + ?Sized>(
        &self,
        send: DeviceSlice<'_, T>,
        recv: DeviceSliceMut<'_, T>,
        op: ReduceOp,
        root: i32,
        stream: &S,
    ) -> Result<()> {
        let what = "reduce";
        self.check_root(what, root)?;
        self.check_len(what, "the receive buffer", send.len(), recv.len())?;
        let (s, r) = (self.src(what, &send)?, self.dst(what, &recv)?);
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`.
        enqueue(stream, &self.owner, &[send.memory(), recv.memory()], || {
            Ok(unsafe {
                raw::reduce(
                    s,
                    r,
                    send.len(),
                    T::DATA_TYPE,
                    op.raw(),
                    root,
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// Every rank's `recv` = the ranks' `send`s one after the other
    /// (`ncclAllGather`): `recv` is `size()` times as long as `send`.
    pub fn all_gather<T: NcclType, S: AsStream + ?Sized>(
        &self,
        send: DeviceSlice<'_, T>,
        recv: DeviceSliceMut<'_, T>,
        stream: &S,
    ) -> Result<()> {
        let what = "all_gather";
        let want = send.len().saturating_mul(self.size as usize);
        self.check_len(what, "the receive buffer", want, recv.len())?;
        let (s, r) = (self.src(what, &send)?, self.dst(what, &recv)?);
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`; `recv` holds `size` times `send.len()`.
        enqueue(stream, &self.owner, &[send.memory(), recv.memory()], || {
            Ok(unsafe {
                raw::all_gather(
                    s,
                    r,
                    send.len(),
                    T::DATA_TYPE,
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// Rank `r`'s `recv` = `op` over every rank's `send[r * n..(r + 1) * n]`, `n` the
    /// length of `recv` (`ncclReduceScatter`): `send` is `size()` times as long.
    pub fn reduce_scatter<T: NcclType, S: AsStream + ?Sized>(
        &self,
        send: DeviceSlice<'_, T>,
        recv: DeviceSliceMut<'_, T>,
        op: ReduceOp,
        stream: &S,
    ) -> Result<()> {
        let what = "reduce_scatter";
        let want = recv.len().saturating_mul(self.size as usize);
        self.check_len(what, "the send buffer", want, send.len())?;
        let (s, r) = (self.src(what, &send)?, self.dst(what, &recv)?);
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`; `send` holds `size` times `recv.len()`.
        enqueue(stream, &self.owner, &[send.memory(), recv.memory()], || {
            Ok(unsafe {
                raw::reduce_scatter(
                    s,
                    r,
                    recv.len(),
                    T::DATA_TYPE,
                    op.raw(),
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// Sends `send` to rank `peer` (`ncclSend`), which posts a [`recv`](Self::recv)
    /// as long. Pair sends and receives of one step in a [`group`], or they may wait
    /// for each other forever.
    pub fn send<T: NcclType, S: AsStream + ?Sized>(
        &self,
        send: DeviceSlice<'_, T>,
        peer: i32,
        stream: &S,
    ) -> Result<()> {
        let what = "send";
        self.check_root(what, peer)?;
        let s = self.src(what, &send)?;
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`.
        enqueue(stream, &self.owner, &[send.memory()], || {
            Ok(unsafe {
                raw::send(
                    s,
                    send.len(),
                    T::DATA_TYPE,
                    peer,
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }

    /// Receives into `recv` from rank `peer` (`ncclRecv`), which posts a
    /// [`send`](Self::send) as long.
    pub fn recv<T: NcclType, S: AsStream + ?Sized>(
        &self,
        recv: DeviceSliceMut<'_, T>,
        peer: i32,
        stream: &S,
    ) -> Result<()> {
        let what = "recv";
        self.check_root(what, peer)?;
        let r = self.dst(what, &recv)?;
        self.check_stream(what, stream)?;
        // SAFETY: as in `all_reduce`.
        enqueue(stream, &self.owner, &[recv.memory()], || {
            Ok(unsafe {
                raw::recv(
                    r,
                    recv.len(),
                    T::DATA_TYPE,
                    peer,
                    self.as_raw(),
                    stream.as_raw().cast(),
                )
            }?)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unique_id_bytes_round_trip_and_debug_shows_a_prefix() {
        let mut b = [0u8; 128];
        b[0] = 0xab;
        b[127] = 7;
        let id = UniqueId::from_bytes(b);
        assert_eq!(id.to_bytes(), b);
        assert!(format!("{id:?}").starts_with("UniqueId(ab00"));
    }

    #[test]
    fn element_types_carry_nccls_tags() {
        assert_eq!(f32::DATA_TYPE, ncclDataType_t::ncclFloat32);
        assert_eq!(F16::DATA_TYPE, ncclDataType_t(6));
        assert_eq!(Bf16::DATA_TYPE, ncclDataType_t(9));
        assert_eq!(u64::DATA_TYPE, ncclDataType_t(5));
        assert_eq!(ReduceOp::Avg.raw(), ncclRedOp_t(4));
    }
}
