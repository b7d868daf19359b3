//! Kernel launches: grid and block shapes, dynamic shared memory, typed arguments
//! without heap allocation, cooperative launches and launch attributes (clusters).
//!
//! Arguments are anything that implements [`KernelArg`]: every primitive scalar, raw
//! pointers, `u64` device pointers, [`MemoryPointer`]s, buffers and views, and your
//! own `#[repr(C)]` plain-data structs once they implement [`PlainData`]. Memory the
//! kernel writes is passed as `&mut`, memory it only reads as itself or `&` (see
//! [`KernelArg`]). A launch takes them as `&[&dyn KernelArg]` (an array on the
//! caller's stack) or through the [`launch!`](crate::launch!) macro:
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::compiler::RawKernel;
//! use cuda_rt::launch::LaunchConfig;
//! let k = RawKernel::new(
//!     r#"extern "C" __global__ void scale(float* x, float a, int n) {
//!            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }"#,
//!     "scale",
//!     &[],
//! )?;
//! let (a, n) = (2.0f32, 1000i32);
//! let mut x = cuda_rt::alloc(4 * n as usize)?; // n floats on the current device
//! let cfg = LaunchConfig::for_num_elems_occupancy(&k, n as u32)?;
//! // SAFETY: scale(float* x, float a, int n): x holds n floats on the kernel's device,
//! // and nothing else touches them until the synchronize below.
//! unsafe { k.launch(&cfg, &[&mut x, &a, &n])? }; // on the current stream
//! // SAFETY: the same arguments.
//! unsafe { cuda_rt::launch!(k, &cfg, (&mut x, a, n))? }; // the same
//! cuda_rt::synchronize()?; // x stays alive until the kernels are done
//! # Ok(()) }
//! ```
//!
//! # Why launching is `unsafe`
//!
//! A launch runs arbitrary device code with the caller's arguments: a kernel that
//! writes through a pointer argument writes wherever that pointer points, on the
//! device or, with unified addressing, in host memory. No host-side check can tell
//! whether a `u64` is a live allocation large enough for what the kernel does, so every
//! call that launches a kernel with caller-chosen arguments is an `unsafe fn`
//! ([`Function::launch`], [`Function::launch_on`], [`Function::launch_cooperative`],
//! [`Function::launch_ex`], [`Function::launch_raw`] and the [`launch!`](crate::launch!)
//! macro, which must be written inside an `unsafe` block). Their `# Safety` sections
//! say what the caller guarantees: the arguments match the kernel's parameters in
//! number, order and type; every pointer the kernel follows is valid for all its
//! accesses, on the launch's device, until the kernel completes; and no other work or
//! host code races with the kernel on that memory.
//!
//! A captured kernel's code is not among those promises: a launch into a capture
//! begun through cuda-rt keeps the kernel's module loaded for the graph (see
//! [`crate::graph`]), so the [`Function`] and every other handle to the module may be
//! dropped once the capture has ended. Only a capture begun outside cuda-rt (a raw
//! `cuStreamBeginCapture`) leaves that to the caller, as the `# Safety` sections say.
//!
//! # What is still checked
//!
//! When the driver can tell a kernel's parameters (`cuFuncGetParamInfo`, CUDA 12.4+), a
//! launch with the wrong number of arguments or a wrong size is an
//! [`Error::InvalidArgument`] naming the expected and the given counts and sizes,
//! before anything is launched. The sizes are fetched once per [`Function`]; later
//! launches compare a few integers. A driver older than 12.4 cannot report them: then
//! neither the count nor the sizes are checked, and [`Function::param_sizes`] returns
//! the error that says so. Types (an `f32` where the kernel takes an `int`) are never
//! checked. The stream must belong to the function's device (an error otherwise), and
//! the driver checks the launch shape.

use std::ffi::c_void;
use std::mem::MaybeUninit;

use cuda_sys::driver as sys;
use cuda_sys::result::launch as dl;

use crate::buffer::{DeviceBuffer, DeviceSlice, DeviceSliceMut};
use crate::device::context::make_current;
use crate::error::{ArgumentKind, Error, Result};
use crate::memory::{Bf16, MemoryPointer, Pod, F16};
use crate::module::Function;
use crate::stream::{current_stream_unretained, AsStream};

mod cooperative;
pub use cooperative::CooperativeGrid;

/// Most arguments a typed launch takes (the raw form has no limit).
pub const MAX_KERNEL_ARGS: usize = 64;

/// Grid or block dimensions. `From` a `u32`, a 1-, 2- or 3-tuple or array of `u32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Dim3 {
    /// x (fastest varying).
    pub x: u32,
    /// y.
    pub y: u32,
    /// z.
    pub z: u32,
}

impl Dim3 {
    /// `(x, y, z)`.
    pub const fn new(x: u32, y: u32, z: u32) -> Dim3 {
        Dim3 { x, y, z }
    }

    /// x * y * z.
    pub const fn count(&self) -> u64 {
        self.x as u64 * self.y as u64 * self.z as u64
    }

    #[inline]
    pub(crate) fn to_array(self) -> [u32; 3] {
        [self.x, self.y, self.z]
    }
}

impl From<u32> for Dim3 {
    fn from(x: u32) -> Dim3 {
        Dim3::new(x, 1, 1)
    }
}
impl From<(u32,)> for Dim3 {
    fn from((x,): (u32,)) -> Dim3 {
        Dim3::new(x, 1, 1)
    }
}
impl From<(u32, u32)> for Dim3 {
    fn from((x, y): (u32, u32)) -> Dim3 {
        Dim3::new(x, y, 1)
    }
}
impl From<(u32, u32, u32)> for Dim3 {
    fn from((x, y, z): (u32, u32, u32)) -> Dim3 {
        Dim3::new(x, y, z)
    }
}
impl From<[u32; 1]> for Dim3 {
    fn from([x]: [u32; 1]) -> Dim3 {
        Dim3::new(x, 1, 1)
    }
}
impl From<[u32; 2]> for Dim3 {
    fn from([x, y]: [u32; 2]) -> Dim3 {
        Dim3::new(x, y, 1)
    }
}
impl From<[u32; 3]> for Dim3 {
    fn from([x, y, z]: [u32; 3]) -> Dim3 {
        Dim3::new(x, y, z)
    }
}

/// Grid, block and dynamic shared memory of a launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LaunchConfig {
    /// Blocks in the grid.
    pub grid: Dim3,
    /// Threads per block.
    pub block: Dim3,
    /// Dynamic shared memory per block, in bytes.
    pub shared_mem_bytes: u32,
}

impl LaunchConfig {
    /// `grid` blocks of `block` threads, no dynamic shared memory.
    pub fn new(grid: impl Into<Dim3>, block: impl Into<Dim3>) -> LaunchConfig {
        LaunchConfig {
            grid: grid.into(),
            block: block.into(),
            shared_mem_bytes: 0,
        }
    }

    /// The same with `bytes` of dynamic shared memory per block.
    pub fn with_shared_mem(mut self, bytes: u32) -> LaunchConfig {
        self.shared_mem_bytes = bytes;
        self
    }

    /// One thread per element for `n` elements in blocks of `block` threads: grid
    /// `ceil(n / block)` (at least 1). Pure arithmetic.
    pub fn for_num_elems_with_block(n: u32, block: u32) -> LaunchConfig {
        let block = block.max(1);
        LaunchConfig::new(n.div_ceil(block).max(1), block)
    }

    /// One thread per element for `n` elements in blocks of 1024 threads, no shared
    /// memory: cudarc's `LaunchConfig::for_num_elems`, with the same meaning (a grid of
    /// `ceil(n / 1024)` blocks, here at least 1). Pure arithmetic; for the block size
    /// that suits a kernel, see [`for_num_elems_occupancy`](Self::for_num_elems_occupancy).
    ///
    /// ```
    /// let cfg = cuda_rt::LaunchConfig::for_num_elems(5000);
    /// assert_eq!((cfg.grid.x, cfg.block.x, cfg.shared_mem_bytes), (5, 1024, 0));
    /// ```
    pub fn for_num_elems(n: u32) -> LaunchConfig {
        Self::for_num_elems_with_block(n, 1024)
    }

    /// One thread per element for `n` elements, with the block size that maximises
    /// `f`'s occupancy (`cuOccupancyMaxPotentialBlockSize`).
    pub fn for_num_elems_occupancy(f: &Function, n: u32) -> Result<LaunchConfig> {
        let (_, block) = f.suggested_block_size(0, 0)?;
        Ok(Self::for_num_elems_with_block(n, block))
    }

    /// For a grid-stride loop over `n` elements: the occupancy-maximising block size
    /// and a grid no larger than what fills the device (nor than `n` needs).
    pub fn for_num_elems_grid_stride(f: &Function, n: u32) -> Result<LaunchConfig> {
        let (min_grid, block) = f.suggested_block_size(0, 0)?;
        let mut cfg = Self::for_num_elems_with_block(n, block);
        cfg.grid.x = cfg.grid.x.min(min_grid.max(1));
        Ok(cfg)
    }

    #[inline]
    pub(crate) fn to_raw(
        self,
        stream: sys::CUstream,
        attrs: &mut [sys::CUlaunchAttribute],
    ) -> sys::CUlaunchConfig {
        sys::CUlaunchConfig {
            gridDimX: self.grid.x,
            gridDimY: self.grid.y,
            gridDimZ: self.grid.z,
            blockDimX: self.block.x,
            blockDimY: self.block.y,
            blockDimZ: self.block.z,
            sharedMemBytes: self.shared_mem_bytes,
            hStream: stream,
            attrs: if attrs.is_empty() {
                std::ptr::null_mut()
            } else {
                attrs.as_mut_ptr()
            },
            numAttrs: attrs.len() as u32,
        }
    }
}

/// A value that can be passed to a kernel by value.
///
/// Buffers, views and [`MemoryPointer`]s pass their device address, and may be
/// written plainly (`x`), as `&x` or, for memory the kernel writes, as `&mut y`: a
/// [`DeviceBuffer`], a [`DeviceSliceMut`] or a [`MemoryPointer`] borrowed mutably, so
/// that the borrow checker sees the output as written and refuses the same buffer as
/// another argument of the launch. A read-only [`DeviceSlice`] cannot be passed as
/// `&mut`.
///
/// # Safety
/// [`param_ptr`](KernelArg::param_ptr) points to [`param_size`](KernelArg::param_size)
/// readable bytes laid out as the kernel's C++ parameter type expects, valid as long
/// as `self` is borrowed.
#[diagnostic::on_unimplemented(
    message = "`{Self}` cannot be passed to a kernel",
    label = "not a kernel argument",
    note = "kernel arguments are scalars, raw pointers, `PlainData` structs (or \
            `BytemuckPod` ones, with the `bytemuck` feature), and buffers, views and \
            memory pointers written `x`, `&x` or `&mut x` (a read-only `DeviceSlice` \
            not as `&mut`)"
)]
pub unsafe trait KernelArg {
    /// Pointer to the bytes of the value (what `cuLaunchKernel`'s `kernelParams` holds).
    fn param_ptr(&self) -> *mut c_void;
    /// Size of the value in bytes.
    fn param_size(&self) -> usize;
}

/// Plain data: a `Copy` type whose bytes are its C layout (`#[repr(C)]` structs of
/// plain data, primitive scalars, pointers). Implementing it makes the type a
/// [`KernelArg`]. With the `bytemuck` feature, a type that derives `bytemuck::Pod`
/// gets it (and [`Pod`]) safely through `memory::BytemuckPod`.
///
/// ```
/// #[derive(Clone, Copy)]
/// #[repr(C)]
/// struct Params { n: i32, alpha: f32 }
/// // SAFETY: repr(C), fields are plain data.
/// unsafe impl cuda_rt::launch::PlainData for Params {}
/// ```
///
/// # Safety
/// The type must be `#[repr(C)]` (or a primitive) and match the kernel's parameter
/// type in size, alignment and layout; it must hold no references or host pointers
/// the kernel would dereference.
pub unsafe trait PlainData: Copy {}

// Primitives, pointers and arrays are plain data, and plain data is a kernel argument.

// SAFETY: `&self` points to `size_of::<T>()` bytes of plain data.
unsafe impl<T: PlainData> KernelArg for T {
    #[inline(always)]
    fn param_ptr(&self) -> *mut c_void {
        self as *const T as *mut c_void
    }
    #[inline(always)]
    fn param_size(&self) -> usize {
        std::mem::size_of::<T>()
    }
}

macro_rules! plain {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive: its bytes are its C layout.
        unsafe impl PlainData for $t {}
    )* };
}
plain!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64, bool);
// SAFETY: `bytemuck::Pod` (which the marker requires) is `Copy` with no padding and no
// pointers; a `#[repr(C)]` derive of it is the C layout. That it matches the kernel's
// parameter type is the launch's `# Safety`, as for every argument.
#[cfg(feature = "bytemuck")]
unsafe impl<T: crate::memory::BytemuckPod> PlainData for T {}
// SAFETY: a pointer is passed by value as its address (a device or managed pointer).
unsafe impl<T> PlainData for *const T {}
// SAFETY: as above.
unsafe impl<T> PlainData for *mut T {}
// SAFETY: an array of plain data is plain data (for use inside structs).
unsafe impl<T: PlainData, const N: usize> PlainData for [T; N] {}

// Memory's types as kernel arguments. They are implemented here, where the traits
// are, so that `memory` needs nothing from `launch`.

// SAFETY: `#[repr(transparent)]` over `u16`: the bits of a `__half` kernel parameter.
unsafe impl PlainData for F16 {}
// SAFETY: `#[repr(transparent)]` over `u16`: the bits of a `__nv_bfloat16` parameter.
unsafe impl PlainData for Bf16 {}
// SAFETY: `half::f16` is `#[repr(transparent)]` over `u16`: the bits of a `__half`
// parameter.
#[cfg(feature = "half")]
unsafe impl PlainData for half::f16 {}
// SAFETY: `half::bf16` is `#[repr(transparent)]` over `u16`: the bits of a
// `__nv_bfloat16` parameter.
#[cfg(feature = "half")]
unsafe impl PlainData for half::bf16 {}

// SAFETY: `param_ptr` points to the pointer's own address field, 8 readable bytes laid
// out as the kernel's `T*` parameter, valid while `self` is borrowed.
unsafe impl KernelArg for MemoryPointer {
    #[inline]
    fn param_ptr(&self) -> *mut c_void {
        self.addr_ref() as *const u64 as *mut c_void
    }
    #[inline]
    fn param_size(&self) -> usize {
        std::mem::size_of::<u64>()
    }
}

// Buffers, views and memory pointers also as `&x` and `&mut y` (see `KernelArg`).
// One impl per type rather than a blanket `impl<T: KernelArg> KernelArg for &T`: that
// would overlap `impl<T: PlainData> KernelArg for T` (a downstream crate may implement
// `PlainData` for `&TheirType`).
macro_rules! by_reference {
    ($( [$($gen:tt)*] ($($r:tt)+) $ty:ty; )*) => {$(
        // SAFETY: the referenced value's own parameter bytes (its impl's guarantee),
        // valid while the reference, and so the value, is borrowed.
        unsafe impl<$($gen)*> KernelArg for $($r)+ $ty {
            #[inline(always)]
            fn param_ptr(&self) -> *mut c_void {
                KernelArg::param_ptr(&**self)
            }
            #[inline(always)]
            fn param_size(&self) -> usize {
                KernelArg::param_size(&**self)
            }
        }
    )*};
}
by_reference! {
    [] (&) MemoryPointer;
    [] (&mut) MemoryPointer;
    [T: Pod] (&) DeviceBuffer<T>;
    [T: Pod] (&mut) DeviceBuffer<T>;
    [T: Pod] (&) DeviceSliceMut<'_, T>;
    [T: Pod] (&mut) DeviceSliceMut<'_, T>;
    [T: Pod] (&) DeviceSlice<'_, T>;
}

/// A launch attribute for [`Function::launch_ex`] (`cuLaunchKernelEx`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchAttribute {
    /// Thread block cluster dimensions (sm_90+); the grid must be a multiple.
    ClusterDim(Dim3),
    /// A cooperative launch (grid-wide sync allowed).
    Cooperative(bool),
    /// The launch's priority (as a stream priority).
    Priority(i32),
}

impl LaunchAttribute {
    pub(crate) fn to_raw(self) -> sys::CUlaunchAttribute {
        use sys::CUlaunchAttributeID as Id;
        let mut a = sys::CUlaunchAttribute::default();
        match self {
            LaunchAttribute::ClusterDim(d) => {
                a.id = Id::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
                a.value.clusterDim.x = d.x;
                a.value.clusterDim.y = d.y;
                a.value.clusterDim.z = d.z;
            }
            LaunchAttribute::Cooperative(on) => {
                a.id = Id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
                a.value.cooperative = i32::from(on);
            }
            LaunchAttribute::Priority(p) => {
                a.id = Id::CU_LAUNCH_ATTRIBUTE_PRIORITY;
                a.value.priority = p;
            }
        }
        a
    }
}

/// Most attributes one [`Function::launch_ex`] takes.
pub const MAX_LAUNCH_ATTRIBUTES: usize = 8;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Cooperative,
}

// Launching is a `Function`'s job, but it needs this module's argument and shape
// types, so these methods of `Function` live here: `launch` sits on `module`.
impl Function {
    /// The largest cluster size (blocks per cluster) a launch with this grid, block and
    /// shared memory could use (`cuOccupancyMaxPotentialClusterSize`; sm_90+).
    pub fn max_potential_cluster_size(&self, config: &LaunchConfig) -> Result<i32> {
        make_current(self.device_id())?;
        let cfg = config.to_raw(std::ptr::null_mut(), &mut []);
        // SAFETY: the function is live while `self` is (it keeps its module loaded), and
        // its device's context was made current above; `cfg` has no attributes (null,
        // count 0).
        Ok(unsafe {
            cuda_sys::result::module::occupancy_max_potential_cluster_size(self.as_raw(), &cfg)
        }?)
    }

    /// Launches on this thread's current stream of the function's device.
    ///
    /// The argument count and sizes are checked against the kernel's parameters when the
    /// driver can report them (CUDA 12.4+; see [`Function::param_sizes`]): a mismatch is
    /// an [`Error::InvalidArgument`] naming the expected and given counts and sizes, and
    /// nothing is launched. With an older driver neither is checked.
    ///
    /// # Safety
    /// The kernel runs with `args` as its parameters; the caller guarantees:
    /// - `args` match the kernel's parameters in number, order and type (the C++
    ///   parameter type's size, alignment and layout: an `i32` for an `int`, a
    ///   `#[repr(C)]` [`PlainData`] struct for a struct). Only the count and sizes are
    ///   checked, and only with a driver that reports them.
    /// - Every pointer argument (a `u64` device address, a raw pointer, a
    ///   [`MemoryPointer`], a pointer inside a struct), and every
    ///   address the kernel derives from one, is valid for every access the kernel
    ///   makes through it: memory accessible from this function's device, large enough
    ///   for every index the launch shape reaches, and alive until the kernel has
    ///   completed. The launch is asynchronous: returning from this call does not end
    ///   the kernel's use of the memory (synchronize the stream, or order the free
    ///   after the kernel on the same stream, before the memory is freed or reused).
    ///   On a stream that is capturing a graph, the kernel runs at every launch of the
    ///   graph: the memory must stay valid until the graph's last launch completes.
    /// - In a capture begun outside cuda-rt (a raw `cuStreamBeginCapture`, by the
    ///   caller or another library, on the stream or one it forked into), the
    ///   function's module stays loaded until that graph's last launch completes (a
    ///   [`Module`](crate::Module), [`Function`] or [`RawKernel`](crate::RawKernel) of
    ///   it is kept alive that long): cuda-rt does not know that graph. In a capture
    ///   begun through cuda-rt ([`StreamCaptureExt`](crate::StreamCaptureExt),
    ///   [`Recorder`](crate::Recorder), `curt_stream_begin_capture`) the graph keeps
    ///   the module loaded itself, and every handle to it may be dropped.
    /// - No data race: until the kernel completes, memory it writes is neither read nor
    ///   written, and memory it reads is not written, by the host or by device work not
    ///   ordered with this launch (other streams without an event between them).
    /// - The kernel has no undefined behaviour of its own for these arguments and this
    ///   launch shape (out-of-bounds or misaligned accesses, barrier divergence...).
    #[inline]
    pub unsafe fn launch(&self, config: &LaunchConfig, args: &[&dyn KernelArg]) -> Result<()> {
        // SAFETY: the caller's guarantees (see `# Safety`) are `launch_on`'s; the
        // current stream of the function's device belongs to that device, and stays
        // valid for this call (only this thread could change it, and it does not).
        unsafe { self.launch_on(&current_stream_unretained(self.device_id()), config, args) }
    }

    /// Launches on `stream`, which must belong to the function's device (an
    /// [`Error::InvalidArgument`] otherwise). Arguments are checked as for
    /// [`Function::launch`].
    ///
    /// # Safety
    /// As for [`Function::launch`]: the arguments match the kernel's parameters in
    /// number, order and type; every pointer the kernel follows is valid for all its
    /// accesses, on the function's device, until the kernel completes on `stream`; no
    /// host access or unordered device work races with the kernel on that memory; in a
    /// capture begun outside cuda-rt, the module stays loaded until the graph's last
    /// launch completes.
    #[inline]
    pub unsafe fn launch_on(
        &self,
        stream: &impl AsStream,
        config: &LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<()> {
        // SAFETY: the caller guarantees the arguments (see `# Safety`).
        unsafe { self.launch_typed(Kind::Plain, stream, config, args) }
    }

    /// Launches with attributes through `cuLaunchKernelEx` (cluster dimensions,
    /// cooperative, priority). Arguments are checked as for [`Function::launch`]; at
    /// most [`MAX_LAUNCH_ATTRIBUTES`] attributes.
    ///
    /// # Safety
    /// As for [`Function::launch`]: the arguments match the kernel's parameters in
    /// number, order and type; every pointer the kernel follows is valid for all its
    /// accesses, on the function's device, until the kernel completes on `stream`; no
    /// host access or unordered device work races with the kernel on that memory
    /// (with clusters or a cooperative launch, the kernel's own cross-block accesses
    /// must be free of races too); in a capture begun outside cuda-rt, the module stays
    /// loaded until the graph's last launch completes.
    pub unsafe fn launch_ex(
        &self,
        stream: &impl AsStream,
        config: &LaunchConfig,
        attributes: &[LaunchAttribute],
        args: &[&dyn KernelArg],
    ) -> Result<()> {
        if attributes.len() > MAX_LAUNCH_ATTRIBUTES {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!(
                    "{} launch attributes: at most {MAX_LAUNCH_ATTRIBUTES}",
                    attributes.len()
                ),
            ));
        }
        if attributes.contains(&LaunchAttribute::Cooperative(true)) {
            self.check_co_resident(config)?;
        }
        let mut raw = [sys::CUlaunchAttribute::default(); MAX_LAUNCH_ATTRIBUTES];
        for (r, a) in raw.iter_mut().zip(attributes) {
            *r = a.to_raw();
        }
        let mut params = ParamArray::new();
        let ptrs = params.fill(self, args)?;
        self.check_stream(stream)?;
        make_current(self.device_id())?;
        let cfg = config.to_raw(stream.as_raw(), &mut raw[..attributes.len()]);
        self.enqueue_launch(stream, || {
            // SAFETY: the function's module is alive (self holds it, and a capture
            // cuda-rt began keeps it for its graph) and its context current; the
            // stream is live while borrowed (`AsStream`) and belongs to the device
            // (checked); `ptrs` holds one pointer per argument, each alive for the
            // call, count and sizes checked where the driver can tell; `cfg.attrs`
            // covers `numAttrs` initialised entries. That the arguments match the
            // kernel and the memory they name is valid and race-free until the kernel
            // completes is the caller's guarantee (see `# Safety`).
            Ok(unsafe { dl::launch_kernel_ex(&cfg, self.as_raw(), ptrs) }?)
        })
    }

    /// Launches with raw parameter pointers on `stream` (which must belong to the
    /// function's device). The count is checked where the driver can tell (CUDA 12.4+,
    /// see [`Function::param_sizes`]); sizes cannot be, since the pointers carry none.
    /// Takes any number of arguments (the typed forms take at most
    /// [`MAX_KERNEL_ARGS`]).
    ///
    /// # Safety
    /// As for [`Function::launch`] (also for the module in a capture begun outside
    /// cuda-rt), and: `params` holds one pointer per kernel
    /// parameter, `params[i]` pointing to a readable value of the kernel's i-th
    /// parameter type (its size and layout), alive for the call (the driver copies the
    /// values before returning).
    #[inline]
    pub unsafe fn launch_raw(
        &self,
        stream: &impl AsStream,
        config: &LaunchConfig,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let known = self.known_param_sizes();
        if let Some(expected) = known {
            if expected.len() != params.len() {
                return Err(self.arity_error(expected, params.len(), None));
            }
        }
        self.check_stream(stream)?;
        // Taken by a recorder's update, as a typed launch is, when the parameters'
        // sizes are known (their count was checked above).
        if crate::capture::any_capture_active()
            && crate::graph::arguments::takes(stream.as_raw() as usize)
        {
            if let Some(sizes) = known {
                // SAFETY: `params[i]` points at a value of the kernel's i-th parameter
                // type (this function's `# Safety`), whose size is `sizes[i]`.
                unsafe { crate::graph::arguments::take_raw(self, stream, config, params, sizes) };
                return Ok(());
            }
        }
        make_current(self.device_id())?;
        self.enqueue_launch(stream, || {
            // SAFETY: the module is alive (self holds it, and a capture cuda-rt began
            // keeps it for its graph) and its context current; the stream is live
            // while borrowed (`AsStream`) and belongs to the device (checked); the
            // parameter pointers, and the memory the kernel reaches through them, are
            // the caller's guarantee (see `# Safety`).
            Ok(unsafe {
                dl::launch_kernel(
                    self.as_raw(),
                    config.grid.to_array(),
                    config.block.to_array(),
                    config.shared_mem_bytes,
                    stream.as_raw(),
                    params.as_mut_ptr(),
                )
            }?)
        })
    }

    /// # Safety
    /// As for [`Function::launch`].
    #[inline]
    unsafe fn launch_typed(
        &self,
        kind: Kind,
        stream: &impl AsStream,
        config: &LaunchConfig,
        args: &[&dyn KernelArg],
    ) -> Result<()> {
        let mut params = ParamArray::new();
        let ptrs = params.fill(self, args)?;
        self.check_stream(stream)?;
        // A recorder updating a recording in place takes the launches on its capture
        // stream instead (one relaxed load here when no capture is under way).
        if crate::capture::any_capture_active()
            && kind == Kind::Plain
            && crate::graph::arguments::takes(stream.as_raw() as usize)
        {
            crate::graph::arguments::take(self, stream, config, args);
            return Ok(());
        }
        make_current(self.device_id())?;
        let (grid, block) = (config.grid.to_array(), config.block.to_array());
        self.enqueue_launch(stream, || {
            // SAFETY: the function's module is alive (self holds it, and a capture
            // cuda-rt began keeps it for its graph) and its context current; the
            // stream is live while borrowed (`AsStream`) and belongs to the device
            // (checked); `ptrs` holds one pointer per argument, each alive for the
            // call, with count and sizes checked where the driver can tell. That the
            // arguments match the kernel and the memory they name is valid and
            // race-free until the kernel completes is the caller's guarantee.
            Ok(unsafe {
                match kind {
                    Kind::Plain => dl::launch_kernel(
                        self.as_raw(),
                        grid,
                        block,
                        config.shared_mem_bytes,
                        stream.as_raw(),
                        ptrs,
                    ),
                    Kind::Cooperative => dl::launch_cooperative_kernel(
                        self.as_raw(),
                        grid,
                        block,
                        config.shared_mem_bytes,
                        stream.as_raw(),
                        ptrs,
                    ),
                }
            }?)
        })
    }

    #[inline]
    fn check_stream(&self, stream: &impl AsStream) -> Result<()> {
        if stream.device_id() != self.device_id() {
            return Err(self.stream_error(stream.device_id()));
        }
        Ok(())
    }

    #[cold]
    fn stream_error(&self, stream_device: i32) -> Error {
        let expected = self.device_id();
        Error::invalid_argument(
            ArgumentKind::WrongDevice {
                expected,
                found: stream_device,
            },
            format!(
                "kernel {} is loaded on device {expected} but the launch stream belongs to \
                 device {stream_device}",
                self.name(),
            ),
        )
    }

    #[cold]
    fn arity_error(&self, expected: &[usize], n: usize, sizes: Option<&[usize]>) -> Error {
        let mut msg = format!(
            "kernel {} takes {} parameter(s) of sizes {:?} bytes; the launch passed {n} argument(s)",
            self.name(),
            expected.len(),
            expected
        );
        if let Some(s) = sizes {
            msg.push_str(&format!(" of sizes {s:?} bytes"));
        }
        Error::invalid_argument(ArgumentKind::KernelArguments, msg)
    }
}

/// The parameter pointer array of a typed launch, on the stack, written only as far
/// as there are arguments.
struct ParamArray {
    ptrs: [MaybeUninit<*mut c_void>; MAX_KERNEL_ARGS],
}

impl ParamArray {
    #[inline(always)]
    fn new() -> Self {
        ParamArray {
            ptrs: [MaybeUninit::uninit(); MAX_KERNEL_ARGS],
        }
    }

    /// Checks `args` against the kernel's parameters and writes their pointers;
    /// returns the array's start (null when there are no arguments).
    #[inline(always)]
    fn fill(&mut self, f: &Function, args: &[&dyn KernelArg]) -> Result<*mut *mut c_void> {
        if args.len() > MAX_KERNEL_ARGS {
            return Err(Error::invalid_argument(ArgumentKind::InvalidValue, format!(
                "{} kernel arguments: a typed launch takes at most {MAX_KERNEL_ARGS} (use launch_raw)",
                args.len()
            )));
        }
        if let Some(expected) = f.known_param_sizes() {
            if expected.len() != args.len()
                || expected.iter().zip(args).any(|(&e, a)| e != a.param_size())
            {
                let sizes: Vec<usize> = args.iter().map(|a| a.param_size()).collect();
                return Err(f.arity_error(expected, args.len(), Some(&sizes)));
            }
        }
        for (slot, a) in self.ptrs.iter_mut().zip(args) {
            slot.write(a.param_ptr());
        }
        Ok(if args.is_empty() {
            std::ptr::null_mut()
        } else {
            self.ptrs.as_mut_ptr().cast()
        })
    }
}

/// Launches a kernel with typed arguments, no heap allocation:
/// `launch!(f, &cfg, (a, b, c))` on the current stream, or
/// `launch!(f, &cfg, &stream, (a, b, c))`. `f` is a [`Function`] or anything that
/// dereferences to one (a [`RawKernel`](crate::compiler::RawKernel)); each argument
/// is a [`KernelArg`], borrowed (not moved) by the launch. Memory the kernel writes is
/// written `&mut y` (a buffer, a mutable view or a memory pointer), so the borrow
/// checker treats it as written and refuses it as another argument of the same
/// launch; inputs are written `x` or `&x`. Evaluates to `Result<()>`.
///
/// It expands to a call of the `unsafe fn` [`Function::launch`] (or
/// [`Function::launch_on`]) and is therefore only accepted inside an `unsafe` block,
/// whose `// SAFETY:` comment says why the arguments are right:
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// # let k = cuda_rt::RawKernel::new("", "f", &[])?;
/// # let stream = cuda_rt::Stream::new()?;
/// let n = 1024i32;
/// let (x, mut y) = (cuda_rt::alloc(4 * n as usize)?, cuda_rt::alloc(4 * n as usize)?);
/// let cfg = cuda_rt::LaunchConfig::for_num_elems_occupancy(&k, n as u32)?;
/// // SAFETY: saxpy(float a, const float* x, float* y, int n): x and y hold n floats each
/// // on k's device and stay alive and untouched until the synchronize below.
/// unsafe { cuda_rt::launch!(k, &cfg, &stream, (2.0f32, &x, &mut y, n))? };
/// stream.synchronize()?;
/// # Ok(()) }
/// ```
///
/// # Safety
/// As for [`Function::launch`]: the arguments match the kernel's parameters in number,
/// order and type; every pointer the kernel follows is valid for all its accesses, on
/// the function's device, until the kernel completes; no host access or unordered
/// device work races with the kernel on that memory; in a capture begun outside
/// cuda-rt, the module stays loaded until the graph's last launch completes. The
/// argument count and sizes are checked only when the driver can report them (CUDA
/// 12.4+).
#[macro_export]
macro_rules! launch {
    ($f:expr, $cfg:expr, ( $($arg:expr),* $(,)? )) => {
        $crate::module::Function::launch(&$f, $cfg, &[$(&$arg as &dyn $crate::launch::KernelArg),*])
    };
    ($f:expr, $cfg:expr, $stream:expr, ( $($arg:expr),* $(,)? )) => {
        $crate::module::Function::launch_on(&$f, $stream, $cfg, &[$(&$arg as &dyn $crate::launch::KernelArg),*])
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dim3_from_tuples_and_arrays_fills_missing_dims_with_one() {
        assert_eq!(Dim3::from(7), Dim3::new(7, 1, 1));
        assert_eq!(Dim3::from((2, 3)), Dim3::new(2, 3, 1));
        assert_eq!(Dim3::from([2, 3, 4]), Dim3::new(2, 3, 4));
        assert_eq!(Dim3::from((5,)).count(), 5);
    }

    #[test]
    fn for_num_elems_rounds_the_grid_up() {
        let c = LaunchConfig::for_num_elems_with_block(1000, 256);
        assert_eq!((c.grid.x, c.block.x), (4, 256));
        let c = LaunchConfig::for_num_elems_with_block(0, 128);
        assert_eq!(c.grid.x, 1);
    }

    #[test]
    fn cluster_attribute_sets_id_and_dims() {
        let a = LaunchAttribute::ClusterDim(Dim3::new(2, 1, 1)).to_raw();
        assert_eq!(
            a.id,
            sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        );
        // SAFETY: the cluster variant was written.
        let d = unsafe { a.value.clusterDim };
        assert_eq!((d.x, d.y, d.z), (2, 1, 1));
    }

    #[test]
    fn references_to_memory_pass_the_same_address_bytes() {
        let mut p = MemoryPointer::null(0);
        let by_value = p.param_ptr();
        assert_eq!(<&MemoryPointer as KernelArg>::param_ptr(&&p), by_value);
        assert_eq!(<&MemoryPointer as KernelArg>::param_size(&&p), 8);
        let as_mut = &mut p;
        assert_eq!(
            <&mut MemoryPointer as KernelArg>::param_ptr(&as_mut),
            by_value
        );
        assert_eq!(<&mut MemoryPointer as KernelArg>::param_size(&as_mut), 8);
        // The launch array the macro builds: each form points at the pointer's field.
        let q = MemoryPointer::null(0);
        let mut r = MemoryPointer::null(0);
        let (qp, rp) = (q.param_ptr(), r.param_ptr());
        let args: [&dyn KernelArg; 3] = [&q, &&q, &&mut r];
        assert_eq!(args.map(|a| a.param_ptr()), [qp, qp, rp]);
    }

    #[test]
    fn plain_data_args_point_at_their_bytes() {
        #[derive(Clone, Copy)]
        #[repr(C)]
        struct P {
            a: i32,
            b: f64,
        }
        // SAFETY: repr(C) plain data.
        unsafe impl PlainData for P {}
        let p = P { a: 1, b: 2.0 };
        assert_eq!(p.param_size(), 16);
        assert_eq!(p.param_ptr() as usize, &p as *const P as usize);
        assert_eq!(3u8.param_size(), 1);
        assert_eq!(std::ptr::null_mut::<f32>().param_size(), 8);
    }
}
