//! The backends of a device's pool: `cuMemAlloc` / `cuMemFree` ([`DeviceBackend`]),
//! and any backend with the allocation hooks around it ([`HookedBackend`]).

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::Error;
use crate::memory::arena::{Backend, BackendError};
use crate::memory::hook;

/// `cuMemAlloc` / `cuMemFree` on one device (its primary context made current).
#[derive(Debug)]
pub(crate) struct DeviceBackend {
    pub(super) device: i32,
}

impl Backend for DeviceBackend {
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        let r = make_current(self.device).and_then(|()| Ok(result::memory::alloc(size)?));
        match r {
            Ok(p) => Ok(p),
            Err(Error::Driver(d)) if d.code == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                Err(BackendError::OutOfMemory(Some(d)))
            }
            Err(e) => Err(BackendError::Other(Box::new(e))),
        }
    }

    fn free(&self, addr: u64, _size: usize) {
        // Nothing to do about a failure here (a context torn down at exit).
        if make_current(self.device).is_ok() {
            // SAFETY: the arena frees only what `alloc` above gave it (cuMemAlloc in this
            // device's primary context, made current above), once, when no block of it
            // is handed out any more.
            let _ = unsafe { result::memory::free(addr) };
        }
    }
}

/// A backend with the `alloc_pre` / `alloc_post` hooks around its `alloc` (the arena
/// calls its backend on the thread that mallocs).
#[derive(Debug)]
pub(crate) struct HookedBackend<B> {
    pub(super) backend: B,
    pub(super) device: i32,
}

impl<B: Backend> Backend for HookedBackend<B> {
    #[inline]
    fn alloc(&self, size: usize) -> std::result::Result<u64, BackendError> {
        if !hook::has_hooks() {
            return self.backend.alloc(size);
        }
        let dev = self.device;
        hook::each(|h| h.alloc_pre(dev, size));
        let r = self.backend.alloc(size);
        if let Ok(p) = r {
            hook::each(|h| h.alloc_post(dev, size, p));
        }
        r
    }

    #[inline]
    fn free(&self, addr: u64, size: usize) {
        self.backend.free(addr, size)
    }
}
