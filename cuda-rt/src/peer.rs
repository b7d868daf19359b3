//! Peer access: letting one device read and write another device's memory directly
//! (kernels dereferencing a peer's addresses, faster peer copies).
//!
//! CuPy's `runtime.deviceCanAccessPeer`, `deviceEnablePeerAccess` and
//! `deviceDisablePeerAccess`, with two differences a user asked for: enabling access
//! that is already enabled is not an error (the driver's
//! `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` is swallowed), nor is disabling access that
//! was never enabled; and disabling first waits for the device's queued work, so no
//! kernel loses its access half-way.
//!
//! Copies between devices need none of this: [`MemoryPointer::copy_from_device`],
//! [`copy_from_device_async`](crate::MemoryPointer::copy_from_device_async) and the typed
//! buffers' `copy_from`/`copy_from_async` use `cuMemcpyPeer`/`cuMemcpyPeerAsync`,
//! which work with or without peer access (staged through the host without it).
//!
//! Access is a property of the pair of primary contexts: it holds for every thread
//! of the process, whatever device each thread has current.
//!
//! [`MemoryPointer::copy_from_device`]: crate::MemoryPointer::copy_from_device
//! [`MemoryPointer`]: crate::MemoryPointer

use cuda_sys::driver::CUresult;
use cuda_sys::result;

use crate::device::{context, Device};
use crate::error::{Error, Result, UnsupportedKind};

/// Whether device `device` can access memory of device `peer` directly
/// (`cuDeviceCanAccessPeer`). A device and itself: `true` (its own memory, no peer
/// access needed), unlike the driver, which answers 0.
pub fn can_access_peer(device: i32, peer: i32) -> Result<bool> {
    let (d, p) = (Device::new(device)?, Device::new(peer)?);
    if device == peer {
        return Ok(true);
    }
    d.can_access_peer(&p)
}

/// Lets the current device access memory of device `peer` (`cuCtxEnablePeerAccess`).
/// See [`Device::enable_peer_access`].
pub fn enable_peer_access(peer: i32) -> Result<()> {
    Device::current()?.enable_peer_access(&Device::new(peer)?)
}

/// Takes back the current device's access to memory of device `peer`. See
/// [`Device::disable_peer_access`].
pub fn disable_peer_access(peer: i32) -> Result<()> {
    Device::current()?.disable_peer_access(&Device::new(peer)?)
}

impl Device {
    /// Lets this device access memory of `peer` directly: kernels on this device may
    /// then dereference `peer`'s addresses (`cuCtxEnablePeerAccess` from this device's
    /// primary context to `peer`'s). Enabling it again is not an error; `peer` being
    /// this device is a no-op. A pair that cannot reach each other (see
    /// [`can_access_peer`]) is [`Error::NotSupported`], naming both.
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if self.id() == peer.id() {
            return Ok(());
        }
        let peer_ctx = context::primary(peer.id())?;
        context::make_current(self.id())?;
        // SAFETY: `peer_ctx` is a primary context retained for the life of the process;
        // this device's context was just made current.
        match unsafe { result::context::enable_peer_access(peer_ctx) } {
            Ok(()) => Ok(()),
            Err(e) => match Error::from(e) {
                Error::Driver(d) if d.code == CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => {
                    Ok(())
                }
                Error::Driver(d) if d.code == CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED => {
                    Err(Error::not_supported(
                        UnsupportedKind::Other,
                        format!(
                            "device {} cannot access memory of device {} directly ({d}); \
                             copies between them still work, staged by the driver",
                            self.id(),
                            peer.id()
                        ),
                    ))
                }
                other => Err(other),
            },
        }
    }

    /// Takes back this device's access to memory of `peer` (`cuCtxDisablePeerAccess`),
    /// after waiting for the work queued on this device (so nothing running loses its
    /// access). Access that was not enabled, and `peer` being this device, are no-ops.
    pub fn disable_peer_access(&self, peer: &Device) -> Result<()> {
        if self.id() == peer.id() {
            return Ok(());
        }
        let peer_ctx = context::primary(peer.id())?;
        self.synchronize()?;
        // SAFETY: `peer_ctx` is retained for the life of the process; `synchronize`
        // made this device's context current and waited for its queued work.
        match unsafe { result::context::disable_peer_access(peer_ctx) } {
            Ok(()) => Ok(()),
            Err(e) => match Error::from(e) {
                Error::Driver(d) if d.code == CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED => {
                    Ok(())
                }
                other => Err(other),
            },
        }
    }
}
