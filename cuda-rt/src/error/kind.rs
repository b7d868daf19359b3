//! The kinds of [`Error::InvalidArgument`], [`Error::InvalidState`], [`Error::Capture`]
//! and [`Error::NotSupported`]: what programs match on (the message is for people).

use cuda_sys::CudaVersion;

#[allow(unused_imports)] // for the doc links
use super::Error;

/// What is wrong with the argument of an [`Error::InvalidArgument`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ArgumentKind {
    /// A range past the end of its memory: `requested` bytes (or an offset of that
    /// many bytes) where only `available` are, after the pointer or before it (a
    /// copy, a view, pointer arithmetic, a memcpy or memset node). A size that
    /// overflows counts as `u64::MAX` bytes.
    OutOfBounds {
        /// The bytes the call needs (or the offset it moves by).
        requested: u64,
        /// The bytes there are in that direction.
        available: u64,
    },
    /// Something of device `found` (a stream, an event, a kernel, a pool) where one of
    /// device `expected` is needed.
    WrongDevice {
        /// The device the call needs.
        expected: i32,
        /// The device of what was given.
        found: i32,
    },
    /// Two lengths that must be equal differ (a copy between slices).
    LengthMismatch {
        /// The length of the destination (or of what sets the rule).
        expected: u64,
        /// The length given.
        found: u64,
    },
    /// An address not aligned as the call needs.
    Misaligned {
        /// The address.
        address: u64,
        /// The alignment needed, in bytes.
        alignment: u64,
    },
    /// Kernel arguments that do not match the kernel's parameters in count or sizes
    /// (a launch, a kernel node).
    KernelArguments,
    /// A string with a NUL byte inside, which C strings cannot hold.
    InteriorNul,
    /// A null pointer where one is needed (the C shim's out pointers, an unowned
    /// memory with no device).
    Null,
    /// A name or an address that names nothing: a kernel or global variable a module
    /// lacks, an unknown device attribute or PCI bus id, a pointer CUDA does not know.
    NotFound,
    /// A name already taken (a memory hook's).
    AlreadyExists,
    /// A value outside what is allowed: a fraction, a percentage, an element size, a
    /// count past a limit, a device id past what cuda-rt addresses, a setting that
    /// does not parse.
    InvalidValue,
    /// An object that cannot serve here as it was made: an event without timing or
    /// not interprocess, pinned memory not mapped for the device, a node of another
    /// graph, a graph whose shape differs.
    Incompatible,
    /// Anything else (an unreadable module file, an image the driver refused with a
    /// log...); the message says what.
    Other,
}

/// What is wrong with the state of things in an [`Error::InvalidState`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StateKind {
    /// The call needs the only handle to an object that `others` other handles
    /// (clones, offsets, threads where it is current, memory allocated on it) share.
    Shared {
        /// How many other handles hold the object.
        others: usize,
    },
    /// An object belongs to `device` but device `current` is current on this thread.
    DeviceNotCurrent {
        /// The object's device.
        device: i32,
        /// This thread's current device.
        current: i32,
    },
    /// An event that was never recorded.
    NotRecorded,
    /// Work that has not completed yet (an event's): wait for it and ask again.
    NotReady,
    /// The call came back into itself (a handle asked for while one is being made),
    /// or was made inside a scope that forbids it (`set_allocator` inside
    /// `using_allocator`).
    Reentrant,
    /// The thread is exiting and its thread-local state is gone.
    ThreadExit,
    /// A graph owns allocations made during its capture: their addresses belong to
    /// it, so it can be neither cloned nor added to another graph.
    GraphOwnsAllocations,
    /// Memory allocated during a graph capture used where it does not exist: before
    /// its graph's first launch, by work outside its capture, or after its capture
    /// failed or its graph went without a launch.
    GraphMemoryGone,
    /// A cuda-rt call from a host function or stream callback, where CUDA forbids
    /// every CUDA call (it may fail or deadlock).
    InHostFunction,
    /// A user allocator (closure or C function) returned a null pointer.
    AllocatorFailed,
    /// A table of fixed size is full (a pool's arenas or chunks: about 4.29 billion).
    TooMany,
    /// The driver or a library answered something cuda-rt cannot use (a null pointer
    /// from a call that succeeded, a version it cannot read).
    Unexpected,
    /// Anything else; the message says what.
    Other,
}

/// What went wrong with a graph capture in an [`Error::Capture`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CaptureKind {
    /// cuda-rt refused, before any CUDA call, an operation that cannot be part of a
    /// graph (a synchronous copy, a run-once closure, an asynchronous copy of
    /// borrowed or pinned host memory) on a stream that is capturing. The capture goes
    /// on, still valid.
    Refused,
    /// The capture is invalid: the driver refused an operation during it (a
    /// synchronize, a query...), now or earlier. No graph can come of it: end it and
    /// capture again.
    Invalidated,
    /// The stream is not capturing, or is not the stream that began the capture.
    NotCapturing,
    /// The legacy default stream cannot capture, and a capturing stream cannot wait
    /// on it.
    LegacyStream,
    /// A stream forked from the capture was never joined back.
    Unjoined,
    /// Another rule of captures (two captures merged, a dependency across the
    /// capture's boundary, an event of a capture waited for from the host, a capture
    /// of another thread); the message says which.
    Other,
}

/// What is not supported in an [`Error::NotSupported`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UnsupportedKind {
    /// The driver is too old for the feature (reporting kernel parameters needs a
    /// driver for CUDA 12.4).
    DriverTooOld {
        /// The CUDA version the driver supports, `None` when it could not be asked.
        version: Option<CudaVersion>,
        /// The CUDA version the feature needs.
        needed: CudaVersion,
    },
    /// The device's architecture is not one the loaded NVRTC compiles for.
    Architecture,
    /// A feature CUDA removed (texture references, in CUDA 12).
    Removed,
    /// Anything else; the message says what.
    Other,
}

/// What went wrong while ranks exchanged a communicator's id, in an
/// [`Error::Bootstrap`](super::Error::Bootstrap).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BootstrapKind {
    /// A setting is missing or does not parse (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`,
    /// `MASTER_PORT`), or they disagree (a rank past the world size).
    Config,
    /// Rank 0 could not be reached, or did not answer, before the deadline.
    Timeout,
    /// Rank 0 waited until the deadline and some ranks never came.
    MissingRanks,
    /// A peer spoke something else than this bootstrap, or a different job's
    /// world size.
    Protocol,
    /// A socket error other than a timeout (the address in use, a name that does not
    /// resolve...).
    Io,
}
