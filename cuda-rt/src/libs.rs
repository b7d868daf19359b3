//! Per-thread, per-device handles of the CUDA math libraries (CuPy's
//! `get_cublas_handle()` and friends): cuBLAS, cuSOLVER (dense), cuSPARSE and a cuRAND
//! generator.
//!
//! Each handle is created the first time a thread asks for it on a device (in that
//! device's primary context), cached for the thread, and destroyed when the thread
//! exits. Before a handle is returned its stream is set to the caller's stream (the
//! thread's current stream for the `get_*` functions); the library call that sets it is
//! made only when the stream changed since the last time. Call the libraries through
//! [`cuda_sys`]'s `cublas`, `cusolver`, `cusparse` and `curand` modules with these
//! handles. A handle must not be used on another thread, nor after its thread exited.

use std::cell::RefCell;

use cuda_sys::result::{
    cublas as rblas, curand as rrand, cusolver as rsolver, cusparse as rsparse,
};
use cuda_sys::{cublas, curand, cusolver, cusparse};

use crate::device::context::{make_current, MAX_DEVICES};
use crate::error::{ArgumentKind, Error, Result, StateKind};
use crate::stream::{get_current_stream, AsStream, StreamRef};

/// The libraries, as indices into a device's slots.
#[derive(Clone, Copy)]
enum Lib {
    Cublas = 0,
    Cusolver = 1,
    Cusparse = 2,
    Curand = 3,
}
const LIBS: usize = 4;

impl Lib {
    /// A new handle of this library in the current context.
    fn create(self) -> Result<usize> {
        Ok(match self {
            Lib::Cublas => rblas::create()? as usize,
            Lib::Cusolver => rsolver::dn_create()? as usize,
            Lib::Cusparse => rsparse::create()? as usize,
            Lib::Curand => {
                rrand::create_generator(curand::curandRngType::CURAND_RNG_PSEUDO_DEFAULT)? as usize
            }
        })
    }

    /// Destroys handle `h` of this library.
    ///
    /// # Safety
    /// `h` came from [`Lib::create`] of this library, is destroyed once and not used
    /// afterwards.
    unsafe fn destroy(self, h: usize) -> Result<()> {
        // SAFETY: see `# Safety`.
        Ok(unsafe {
            match self {
                Lib::Cublas => rblas::destroy(h as cublas::cublasHandle_t),
                Lib::Cusolver => rsolver::dn_destroy(h as cusolver::cusolverDnHandle_t),
                Lib::Cusparse => rsparse::destroy(h as cusparse::cusparseHandle_t),
                Lib::Curand => rrand::destroy_generator(h as curand::curandGenerator_t),
            }
        }?)
    }

    /// Makes handle `h` of this library run on stream `s` (a `CUstream` as an integer,
    /// which is the runtime's `cudaStream_t`).
    ///
    /// # Safety
    /// `h` came from [`Lib::create`] of this library and is live; `s` is a live stream
    /// (or a default-stream handle) of the handle's context.
    unsafe fn set_stream(self, h: usize, s: usize) -> Result<()> {
        // SAFETY: see `# Safety`.
        Ok(unsafe {
            match self {
                Lib::Cublas => rblas::set_stream(h as cublas::cublasHandle_t, s as _),
                Lib::Cusolver => rsolver::dn_set_stream(h as cusolver::cusolverDnHandle_t, s as _),
                Lib::Cusparse => rsparse::set_stream(h as cusparse::cusparseHandle_t, s as _),
                Lib::Curand => rrand::set_stream(h as curand::curandGenerator_t, s as _),
            }
        }?)
    }

    const ALL: [Lib; LIBS] = [Lib::Cublas, Lib::Cusolver, Lib::Cusparse, Lib::Curand];
}

/// One library handle of one device on one thread.
#[derive(Clone, Copy, Default)]
struct Slot {
    /// The handle, 0 before it is created.
    handle: usize,
    /// The stream last set on it (a new handle uses the legacy default stream, 0).
    stream: usize,
}

/// A thread's handles, `[device][library]`, grown to the highest device used.
struct Handles {
    devices: Vec<[Slot; LIBS]>,
}

impl Drop for Handles {
    fn drop(&mut self) {
        for (device, slots) in self.devices.iter().enumerate() {
            for lib in Lib::ALL {
                let h = slots[lib as usize].handle;
                if h != 0 {
                    // Libraries free their workspace in the device's context. At thread
                    // exit an error leaves nothing to do.
                    let _ = make_current(device as i32);
                    // SAFETY: a handle this thread's table created, destroyed once, as
                    // the table goes at thread exit (handles must not be used after
                    // their thread exited, as the module docs say).
                    let _ = unsafe { lib.destroy(h) };
                }
            }
        }
    }
}

thread_local! {
    static HANDLES: RefCell<Handles> = const { RefCell::new(Handles { devices: Vec::new() }) };
}

/// The thread's handle of `lib` for the stream's device, bound to the stream.
fn handle(lib: Lib, stream: StreamRef) -> Result<usize> {
    let device = stream.device_id();
    let idx = usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("device id {device} is out of range"),
            )
        })?;
    let s = stream.handle();
    HANDLES
        .try_with(|cell| {
            let mut hs = cell.try_borrow_mut().map_err(|_| {
                Error::invalid_state(
                    StateKind::Reentrant,
                    "library handles asked for re-entrantly",
                )
            })?;
            if hs.devices.len() <= idx {
                hs.devices.resize(idx + 1, [Slot::default(); LIBS]);
            }
            let slot = &mut hs.devices[idx][lib as usize];
            if slot.handle == 0 {
                make_current(device)?;
                slot.handle = lib.create()?;
                slot.stream = 0;
            }
            if slot.stream != s {
                // SAFETY: the handle is this thread's, created above or earlier and
                // live until the thread exits; the stream is live while `stream` (a
                // `StreamRef`) is, of the handle's device.
                unsafe { lib.set_stream(slot.handle, s) }?;
                slot.stream = s;
            }
            Ok(slot.handle)
        })
        .map_err(|_| {
            Error::invalid_state(
                StateKind::ThreadExit,
                "library handles asked for during thread exit",
            )
        })?
}

/// This thread's cuBLAS handle for the current device, bound to the current stream.
pub fn get_cublas_handle() -> Result<cublas::cublasHandle_t> {
    cublas_handle_for(&get_current_stream())
}

/// This thread's cuBLAS handle for `stream`'s device, bound to `stream`.
pub fn cublas_handle_for<S: AsStream + ?Sized>(stream: &S) -> Result<cublas::cublasHandle_t> {
    Ok(handle(Lib::Cublas, stream.as_stream_ref())? as cublas::cublasHandle_t)
}

/// This thread's cuSOLVER dense handle for the current device, bound to the current
/// stream.
pub fn get_cusolver_handle() -> Result<cusolver::cusolverDnHandle_t> {
    cusolver_handle_for(&get_current_stream())
}

/// This thread's cuSOLVER dense handle for `stream`'s device, bound to `stream`.
pub fn cusolver_handle_for<S: AsStream + ?Sized>(
    stream: &S,
) -> Result<cusolver::cusolverDnHandle_t> {
    Ok(handle(Lib::Cusolver, stream.as_stream_ref())? as cusolver::cusolverDnHandle_t)
}

/// This thread's cuSPARSE handle for the current device, bound to the current stream.
pub fn get_cusparse_handle() -> Result<cusparse::cusparseHandle_t> {
    cusparse_handle_for(&get_current_stream())
}

/// This thread's cuSPARSE handle for `stream`'s device, bound to `stream`.
pub fn cusparse_handle_for<S: AsStream + ?Sized>(stream: &S) -> Result<cusparse::cusparseHandle_t> {
    Ok(handle(Lib::Cusparse, stream.as_stream_ref())? as cusparse::cusparseHandle_t)
}

/// This thread's cuRAND generator (`CURAND_RNG_PSEUDO_DEFAULT`) for the current device,
/// bound to the current stream.
pub fn get_curand_generator() -> Result<curand::curandGenerator_t> {
    curand_generator_for(&get_current_stream())
}

/// This thread's cuRAND generator for `stream`'s device, bound to `stream`.
pub fn curand_generator_for<S: AsStream + ?Sized>(stream: &S) -> Result<curand::curandGenerator_t> {
    Ok(handle(Lib::Curand, stream.as_stream_ref())? as curand::curandGenerator_t)
}
