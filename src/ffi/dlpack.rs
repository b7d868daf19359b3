//! DLPack: device memory handed to other frameworks as a `DLManagedTensor` (or
//! `DLManagedTensorVersioned`, DLPack 1.x), and their tensors taken in as memory
//! handles with their deleter honoured.
//!
//! Export keeps the memory alive (a clone of the handle's pointer) until the consumer
//! calls the tensor's deleter, on whatever thread. Import wraps the tensor's bytes
//! (from the lowest to the highest element its shape and strides reach) in a memory
//! handle; `curt_free` of that handle, once nothing else (a copy in flight) holds it,
//! calls the producer's deleter exactly once. A failed import leaves the tensor with
//! the caller, its deleter not called. The struct layouts are DLPack's (`dlpack.h`
//! v1.x), declared in `wrapper.h` unless `dlpack.h` was included first.

#![allow(non_camel_case_types, non_snake_case)]

use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};

use cuda_rt::memory::UnownedMemory;
use cuda_rt::MemoryPointer;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::memory::MEMORY;
use super::status::{bad_arg, guard, out, Fail, Res};

/// `kDLCUDA`.
pub const CURT_DL_CUDA: i32 = 2;
/// `kDLCUDAHost` (pinned host memory: refused on import, it is not device memory).
pub const CURT_DL_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`.
pub const CURT_DL_CUDA_MANAGED: i32 = 13;
/// The DLPack major version written and accepted.
pub const CURT_DLPACK_MAJOR: u32 = 1;
/// The DLPack minor version written.
pub const CURT_DLPACK_MINOR: u32 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
pub const CURT_DLPACK_FLAG_READ_ONLY: u64 = 1;

/// DLPack's `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLDevice {
    /// `DLDeviceType`.
    pub device_type: i32,
    /// The device ordinal.
    pub device_id: i32,
}

/// DLPack's `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLDataType {
    /// `DLDataTypeCode` (0 int, 1 uint, 2 float, 4 bfloat, 5 complex, 6 bool...).
    pub code: u8,
    /// Bits per lane.
    pub bits: u8,
    /// Lanes (1 for scalars).
    pub lanes: u16,
}

/// DLPack's `DLTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLTensor {
    /// The base address.
    pub data: *mut c_void,
    /// Where the data lives.
    pub device: DLDevice,
    /// Number of dimensions.
    pub ndim: i32,
    /// Element type.
    pub dtype: DLDataType,
    /// `ndim` extents.
    pub shape: *mut i64,
    /// `ndim` strides in elements, or NULL for a compact row-major tensor.
    pub strides: *mut i64,
    /// Bytes from `data` to the first element.
    pub byte_offset: u64,
}

/// DLPack's `DLManagedTensor`.
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called by the consumer once, when done with the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// DLPack's `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLPackVersion {
    /// Major version.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// DLPack's `DLManagedTensorVersioned` (DLPack 1.0 and later).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version of this struct.
    pub version: DLPackVersion,
    /// The producer's context.
    pub manager_ctx: *mut c_void,
    /// Called by the consumer once, when done with the tensor.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*`.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// What an exported tensor owns: the memory and the shape the tensor points into.
#[repr(C)]
struct Export<T> {
    /// First, so that a pointer to the box is a pointer to the tensor.
    managed: T,
    _mem: MemoryPointer,
    _shape: Vec<i64>,
}

fn check_dtype(dtype: DLDataType) -> Res<usize> {
    if dtype.bits == 0 || !dtype.bits.is_multiple_of(8) || dtype.lanes == 0 {
        return Err(bad_arg(format!(
            "DLPack dtype with {} bits and {} lanes: cuda-rt handles whole bytes \
             (bits a multiple of 8, at least one lane)",
            dtype.bits, dtype.lanes
        )));
    }
    Ok(dtype.bits as usize / 8 * dtype.lanes as usize)
}

/// The tensor a handle's memory makes, after checking the shape fits the memory.
fn tensor_of(mem: &MemoryPointer, shape: &[i64], dtype: DLDataType) -> Res<DLTensor> {
    let item = check_dtype(dtype)?;
    let mut bytes = item as u64;
    for &d in shape {
        let d = u64::try_from(d).map_err(|_| bad_arg(format!("negative extent {d} in shape")))?;
        bytes = bytes
            .checked_mul(d)
            .ok_or_else(|| bad_arg("the shape's byte count overflows"))?;
    }
    if bytes > mem.size() as u64 {
        return Err(bad_arg(format!(
            "a tensor of shape {shape:?} and {item}-byte elements needs {bytes} bytes; the \
             memory has {}",
            mem.size()
        )));
    }
    Ok(DLTensor {
        data: mem.ptr() as *mut c_void,
        device: DLDevice {
            device_type: CURT_DL_CUDA,
            device_id: mem.device_id(),
        },
        ndim: shape.len() as i32,
        dtype,
        shape: std::ptr::null_mut(),
        strides: std::ptr::null_mut(),
        byte_offset: 0,
    })
}

/// # Safety
/// `shape` is NULL with `ndim == 0` or valid for `ndim` reads.
unsafe fn shape_of(ndim: i32, shape: *const i64) -> Res<Vec<i64>> {
    let n = usize::try_from(ndim)
        .ok()
        .filter(|&n| n <= 64)
        .ok_or_else(|| bad_arg(format!("ndim {ndim}: expected 0 to 64")))?;
    if n == 0 {
        return Ok(Vec::new());
    }
    if shape.is_null() {
        return Err(bad_arg("shape is NULL"));
    }
    // SAFETY: the caller's contract: `shape` has `ndim` elements.
    Ok(unsafe { std::slice::from_raw_parts(shape, n) }.to_vec())
}

/// The two managed-tensor structs, as export fills them.
trait Managed: Sized + 'static {
    /// The struct around `tensor`, with [`delete_export`] as its deleter and no context.
    fn around(tensor: DLTensor) -> Self;
    fn tensor(&mut self) -> &mut DLTensor;
    fn ctx(&mut self) -> &mut *mut c_void;
}

impl Managed for DLManagedTensor {
    fn around(tensor: DLTensor) -> Self {
        DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export::<DLManagedTensor>),
        }
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn ctx(&mut self) -> &mut *mut c_void {
        &mut self.manager_ctx
    }
}

impl Managed for DLManagedTensorVersioned {
    fn around(tensor: DLTensor) -> Self {
        DLManagedTensorVersioned {
            version: DLPackVersion {
                major: CURT_DLPACK_MAJOR,
                minor: CURT_DLPACK_MINOR,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_export::<DLManagedTensorVersioned>),
            flags: 0,
            dl_tensor: tensor,
        }
    }
    fn tensor(&mut self) -> &mut DLTensor {
        &mut self.dl_tensor
    }
    fn ctx(&mut self) -> &mut *mut c_void {
        &mut self.manager_ctx
    }
}

unsafe extern "C" fn delete_export<M: Managed>(t: *mut M) {
    if t.is_null() {
        return;
    }
    // SAFETY: `manager_ctx` is the `Export` box made by `export`; DLPack's contract has
    // the deleter called once.
    let b = unsafe { Box::from_raw((*(*t).ctx()).cast::<Export<M>>()) };
    // No unwind may leave a C callback.
    let _ = catch_unwind(AssertUnwindSafe(move || drop(b)));
}

/// The export of both entry points: a boxed `Export` whose tensor points at its own
/// shape and whose context is the box itself.
///
/// # Safety
/// As [`curt_memory_to_dlpack`].
unsafe fn export<M: Managed>(
    mem: super::handles::curt_memory_t,
    ndim: i32,
    shape: *const i64,
    dtype: DLDataType,
    out_tensor: *mut *mut M,
) -> c_int {
    guard(|| {
        let slot = out(out_tensor, "out")?;
        let m = MEMORY.get(mem as u64)?;
        // SAFETY: this function's contract.
        let shape = unsafe { shape_of(ndim, shape) }?;
        let tensor = tensor_of(&m, &shape, dtype)?;
        let mut b = Box::new(Export {
            managed: M::around(tensor),
            _mem: m,
            _shape: shape,
        });
        b.managed.tensor().shape = b._shape.as_mut_ptr();
        let raw = Box::into_raw(b);
        // SAFETY: `raw` is the live box just made.
        unsafe { *(*raw).managed.ctx() = raw.cast() };
        *slot = raw.cast();
        Ok(())
    })
}

/// Exports `mem` as a `DLManagedTensor` of `shape` (`ndim` extents, compact row-major)
/// and element type `dtype`; the memory stays alive until the consumer calls the
/// tensor's deleter (the handle may be freed meanwhile).
///
/// # Safety
/// `shape` is valid for `ndim` reads (or NULL with `ndim == 0`); `out` for a write.
#[no_mangle]
pub unsafe extern "C" fn curt_memory_to_dlpack(
    mem: super::handles::curt_memory_t,
    ndim: i32,
    shape: *const i64,
    dtype: DLDataType,
    out_tensor: *mut *mut DLManagedTensor,
) -> c_int {
    // SAFETY: this function's contract is `export`'s.
    unsafe { export(mem, ndim, shape, dtype, out_tensor) }
}

/// [`curt_memory_to_dlpack`] as a `DLManagedTensorVersioned` (DLPack 1.1, no flags).
///
/// # Safety
/// As [`curt_memory_to_dlpack`].
#[no_mangle]
pub unsafe extern "C" fn curt_memory_to_dlpack_versioned(
    mem: super::handles::curt_memory_t,
    ndim: i32,
    shape: *const i64,
    dtype: DLDataType,
    out_tensor: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    // SAFETY: this function's contract is `export`'s.
    unsafe { export(mem, ndim, shape, dtype, out_tensor) }
}

/// The producer's tensor, deleted (its deleter called once) when dropped, once armed:
/// an import that fails after handing it over must leave the tensor to the caller.
struct Imported {
    tensor: Tensor,
    armed: AtomicBool,
    /// The tensor's device, whose work is waited for before the deleter runs.
    device: i32,
}

#[derive(Clone, Copy)]
enum Tensor {
    Plain(*mut DLManagedTensor),
    Versioned(*mut DLManagedTensorVersioned),
}

// SAFETY: DLPack lets the consumer call the deleter from the thread where it is done
// with the tensor; the pointer is only used for that call.
unsafe impl Send for Imported {}
// SAFETY: nothing reads through the pointer but the one deleter call in `drop`.
unsafe impl Sync for Imported {}

impl Drop for Imported {
    fn drop(&mut self) {
        if !self.armed.load(Ordering::Acquire) {
            return;
        }
        // The producer may reuse the memory as soon as its deleter runs (PyTorch's
        // caching allocator does), while work cuda-rt queued on the memory may still
        // run: wait for the device first. A wait that fails (another thread's
        // global-mode capture, a dead context) leaves the tensor undeleted, a leak
        // rather than a reuse under that work.
        let drained = cuda_rt::Device::new(self.device).and_then(|d| d.synchronize());
        if drained.is_err() {
            return;
        }
        // SAFETY: the tensor was handed over by a successful import; its deleter is
        // called exactly once, here.
        unsafe {
            match self.tensor {
                Tensor::Plain(t) => {
                    if let Some(d) = (*t).deleter {
                        d(t)
                    }
                }
                Tensor::Versioned(t) => {
                    if let Some(d) = (*t).deleter {
                        d(t)
                    }
                }
            }
        }
    }
}

/// The first address and the byte length a tensor's elements span.
fn span_of(t: &DLTensor) -> Res<(u64, usize)> {
    match t.device.device_type {
        CURT_DL_CUDA | CURT_DL_CUDA_MANAGED => {}
        CURT_DL_CUDA_HOST => {
            return Err(bad_arg(
                "a DLPack tensor in pinned host memory (kDLCUDAHost) is not device memory: \
                 use the pinned-memory functions",
            ))
        }
        other => {
            return Err(bad_arg(format!(
                "a DLPack tensor on device type {other}: cuda-rt takes CUDA device memory \
                 (kDLCUDA = 2, kDLCUDAManaged = 13)"
            )))
        }
    }
    let item = check_dtype(t.dtype)? as i128;
    // SAFETY: DLPack's contract: `shape` (and `strides` unless NULL) hold `ndim` values.
    let shape = unsafe { shape_of(t.ndim, t.shape) }?;
    let strides = if t.strides.is_null() || shape.is_empty() {
        None
    } else {
        // SAFETY: as above.
        Some(unsafe { std::slice::from_raw_parts(t.strides, shape.len()) })
    };
    let base = (t.data as u64)
        .checked_add(t.byte_offset)
        .ok_or_else(|| bad_arg("data + byte_offset overflows"))?;
    if shape.iter().any(|&d| d < 0) {
        return Err(bad_arg(format!("negative extent in shape {shape:?}")));
    }
    if shape.contains(&0) {
        return Ok((base, 0));
    }
    // Lowest and highest element offsets (in elements), strides possibly negative;
    // every step checked, as the shape and strides are the producer's word.
    let overflow = || bad_arg("the tensor's span overflows");
    let (mut lo, mut hi) = (0i128, 0i128);
    let mut compact = 1i128;
    for i in (0..shape.len()).rev() {
        let stride = match strides {
            Some(s) => s[i] as i128,
            None => compact,
        };
        let reach = stride
            .checked_mul(shape[i] as i128 - 1)
            .ok_or_else(overflow)?;
        if reach < 0 {
            lo = lo.checked_add(reach).ok_or_else(overflow)?;
        } else {
            hi = hi.checked_add(reach).ok_or_else(overflow)?;
        }
        if strides.is_none() {
            compact = compact.checked_mul(shape[i] as i128).ok_or_else(overflow)?;
        }
    }
    let start = lo
        .checked_mul(item)
        .and_then(|l| (base as i128).checked_add(l))
        .ok_or_else(overflow)?;
    let len = hi
        .checked_sub(lo)
        .and_then(|d| d.checked_add(1))
        .and_then(|n| n.checked_mul(item))
        .ok_or_else(overflow)?;
    let start = u64::try_from(start).map_err(|_| bad_arg("the tensor starts below address 0"))?;
    let len = usize::try_from(len).map_err(|_| bad_arg("the tensor's span overflows"))?;
    Ok((start, len))
}

fn import(t: &DLTensor, tensor: Tensor) -> Res<MemoryPointer> {
    let (start, len) = span_of(t)?;
    let owner = Imported {
        tensor,
        armed: AtomicBool::new(false),
        device: t.device.device_id,
    };
    // SAFETY: DLPack's contract: the tensor's elements are the producer's memory on
    // that device, valid until its deleter is called, which `owner` does on drop.
    let mem = unsafe { UnownedMemory::new(start, len, owner, Some(t.device.device_id)) }
        .map_err(Fail::Rt)?;
    // Handed over: from now on dropping the memory deletes the tensor.
    if let Some(o) = mem.owner().downcast_ref::<Imported>() {
        o.armed.store(true, Ordering::Release);
    }
    Ok(MemoryPointer::from_memory(Arc::new(mem)))
}

/// Imports a `DLManagedTensor` of CUDA device (or managed) memory as a memory handle
/// spanning its elements; `curt_free` of the handle calls the tensor's deleter. On
/// error the tensor stays the caller's (its deleter not called).
///
/// # Safety
/// `tensor` is NULL (an error) or a valid `DLManagedTensor` whose ownership passes to
/// cuda-rt on success; `mem` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn curt_memory_from_dlpack(
    tensor: *mut DLManagedTensor,
    mem: *mut super::handles::curt_memory_t,
) -> c_int {
    guard(|| {
        let slot = out(mem, "mem")?;
        if tensor.is_null() {
            return Err(bad_arg("tensor is NULL"));
        }
        // SAFETY: this function's contract: a valid tensor.
        let t = unsafe { &(*tensor).dl_tensor };
        let p = import(t, Tensor::Plain(tensor))?;
        *slot = MEMORY.insert(p) as _;
        Ok(())
    })
}

/// [`curt_memory_from_dlpack`] for a `DLManagedTensorVersioned`: major version 1
/// only; a read-only tensor is refused (a memory handle is writable).
///
/// # Safety
/// As [`curt_memory_from_dlpack`].
#[no_mangle]
pub unsafe extern "C" fn curt_memory_from_dlpack_versioned(
    tensor: *mut DLManagedTensorVersioned,
    mem: *mut super::handles::curt_memory_t,
) -> c_int {
    guard(|| {
        let slot = out(mem, "mem")?;
        if tensor.is_null() {
            return Err(bad_arg("tensor is NULL"));
        }
        // SAFETY: this function's contract: a valid tensor.
        let v = unsafe { &*tensor };
        if v.version.major != CURT_DLPACK_MAJOR {
            return Err(bad_arg(format!(
                "DLPack {}.{}: cuda-rt reads major version {CURT_DLPACK_MAJOR}",
                v.version.major, v.version.minor
            )));
        }
        if v.flags & CURT_DLPACK_FLAG_READ_ONLY != 0 {
            return Err(bad_arg(
                "a read-only DLPack tensor: cuda-rt's memory handles are writable; copy it first",
            ));
        }
        let p = import(&v.dl_tensor, Tensor::Versioned(tensor))?;
        *slot = MEMORY.insert(p) as _;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(device_type: i32, shape: &mut [i64], strides: Option<&mut [i64]>) -> DLTensor {
        DLTensor {
            data: 0x10_0000 as *mut c_void,
            device: DLDevice {
                device_type,
                device_id: 0,
            },
            ndim: shape.len() as i32,
            dtype: DLDataType {
                code: 2,
                bits: 32,
                lanes: 1,
            },
            shape: shape.as_mut_ptr(),
            strides: strides.map_or(std::ptr::null_mut(), |s| s.as_mut_ptr()),
            byte_offset: 0,
        }
    }

    #[test]
    fn the_span_covers_every_element_whatever_the_strides() {
        let mut shape = [3, 4];
        assert_eq!(
            span_of(&tensor(2, &mut shape, None)).unwrap(),
            (0x10_0000, 48)
        );
        // A transposed view: the same 12 elements.
        let mut strides = [1, 3];
        let t = tensor(2, &mut shape, Some(&mut strides));
        assert_eq!(span_of(&t).unwrap(), (0x10_0000, 48));
        // Every other column of a 3x8 array: up to element 2*8 + 3*2.
        let mut strides = [8, 2];
        let t = tensor(13, &mut shape, Some(&mut strides));
        assert_eq!(span_of(&t).unwrap(), (0x10_0000, (16 + 6 + 1) * 4));
        // A reversed row: starts 3 elements below data.
        let mut shape = [4];
        let mut strides = [-1];
        let t = tensor(2, &mut shape, Some(&mut strides));
        assert_eq!(span_of(&t).unwrap(), (0x10_0000 - 12, 16));
        let mut empty = [3, 0];
        assert_eq!(span_of(&tensor(2, &mut empty, None)).unwrap().1, 0);
    }

    #[test]
    fn a_span_past_any_integer_is_refused_not_wrapped() {
        // Three extents of 2^62 compact: the third dimension's reach overflows.
        let mut shape = [1 << 62, 1 << 62, 1 << 62];
        let e = span_of(&tensor(2, &mut shape, None)).unwrap_err();
        assert!(format!("{e:?}").contains("overflows"), "{e:?}");
        // The largest extents and strides, wide elements: the sum of reaches overflows.
        let mut shape = [i64::MAX; 4];
        let mut strides = [i64::MAX; 4];
        let mut t = tensor(2, &mut shape, Some(&mut strides));
        t.dtype.bits = 248;
        t.dtype.lanes = 65535;
        assert!(span_of(&t).is_err());
        // Broadcast (stride 0) extents of any size span one element.
        let mut shape = [1 << 62, 1 << 62, 1 << 62];
        let mut strides = [0, 0, 0];
        let t = tensor(2, &mut shape, Some(&mut strides));
        assert_eq!(span_of(&t).unwrap(), (0x10_0000, 4));
    }

    #[test]
    fn host_and_foreign_tensors_are_refused_and_stay_the_callers() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static DELETED: AtomicUsize = AtomicUsize::new(0);
        unsafe extern "C" fn deleter(_: *mut DLManagedTensor) {
            DELETED.fetch_add(1, Ordering::SeqCst);
        }
        for device_type in [1, CURT_DL_CUDA_HOST, 10] {
            let mut shape = [4];
            let mut t = DLManagedTensor {
                dl_tensor: tensor(device_type, &mut shape, None),
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(deleter),
            };
            let mut h: super::super::handles::curt_memory_t = std::ptr::null_mut();
            // SAFETY: a valid tensor and out-pointer.
            let rc = unsafe { curt_memory_from_dlpack(&mut t, &mut h) };
            assert_eq!(rc, super::super::status::CURT_ERROR_INVALID_ARGUMENT);
            assert!(h.is_null());
        }
        // A CUDA tensor on a device that does not exist: refused after the tensor was
        // wrapped, and still not deleted.
        let mut shape = [4];
        let mut t = DLManagedTensor {
            dl_tensor: tensor(CURT_DL_CUDA, &mut shape, None),
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(deleter),
        };
        t.dl_tensor.device.device_id = 9999;
        let mut h: super::super::handles::curt_memory_t = std::ptr::null_mut();
        // SAFETY: a valid tensor and out-pointer.
        assert_ne!(unsafe { curt_memory_from_dlpack(&mut t, &mut h) }, 0);
        assert_eq!(
            DELETED.load(Ordering::SeqCst),
            0,
            "a refused tensor is not deleted"
        );
    }

    #[test]
    fn versioned_tensors_of_another_major_or_read_only_are_refused() {
        let mut shape = [4];
        for (major, flags) in [(2, 0), (0, 0), (1, CURT_DLPACK_FLAG_READ_ONLY)] {
            let mut t = DLManagedTensorVersioned {
                version: DLPackVersion { major, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: None,
                flags,
                dl_tensor: tensor(CURT_DL_CUDA, &mut shape, None),
            };
            let mut h: super::super::handles::curt_memory_t = std::ptr::null_mut();
            // SAFETY: a valid tensor and out-pointer.
            let rc = unsafe { curt_memory_from_dlpack_versioned(&mut t, &mut h) };
            assert_eq!(rc, super::super::status::CURT_ERROR_INVALID_ARGUMENT);
        }
    }

    #[test]
    fn bad_dtypes_and_shapes_are_refused() {
        assert!(check_dtype(DLDataType {
            code: 6,
            bits: 1,
            lanes: 1
        })
        .is_err());
        assert!(check_dtype(DLDataType {
            code: 2,
            bits: 16,
            lanes: 0
        })
        .is_err());
        assert_eq!(
            check_dtype(DLDataType {
                code: 2,
                bits: 16,
                lanes: 2
            })
            .unwrap(),
            4
        );
        // SAFETY: NULL with ndim 0, and an out-of-range ndim.
        assert!(unsafe { shape_of(0, std::ptr::null()) }.unwrap().is_empty());
        assert!(unsafe { shape_of(-1, std::ptr::null()) }.is_err());
        assert!(unsafe { shape_of(2, std::ptr::null()) }.is_err());
    }
}
