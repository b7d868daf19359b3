//! The backends of a device's pool: `cuMemAlloc` / `cuMemFree` ([`DeviceBackend`],
//! whose fences are events), and any backend with the allocation hooks around it
//! ([`HookedBackend`]).

use cuda_sys::driver as sys;
use cuda_sys::result;

use crate::device::context::make_current;
use crate::error::Error;
use crate::memory::arena::{Backend, BackendError};
use crate::memory::hook;

use super::stream_uses::FENCE_FLAGS;

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

    // Fences are events of this device recorded by `stream_uses`, owned by the pool
    // from `free_raw_after` until `fence_release`.

    fn fence_done(&self, fence: u64) -> bool {
        // An error (a failed context) counts as done: no work runs there any more.
        // SAFETY: the fence is a live event (above) until its release.
        unsafe { result::event::query(fence as usize as sys::CUevent) }.unwrap_or(true)
    }

    fn fence_wait(&self, fence: u64) {
        // SAFETY: as in `fence_done`.
        let _ = unsafe { result::event::synchronize(fence as usize as sys::CUevent) };
    }

    fn fence_release(&self, fence: u64) {
        crate::event::give_raw(self.device, FENCE_FLAGS, fence as usize);
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

    fn fence_done(&self, fence: u64) -> bool {
        self.backend.fence_done(fence)
    }

    fn fence_wait(&self, fence: u64) {
        self.backend.fence_wait(fence)
    }

    fn fence_release(&self, fence: u64) {
        self.backend.fence_release(fence)
    }
}
