//! [`Transfer`]: an asynchronous copy to or from a pinned buffer, in flight.

use crate::error::Result;
use crate::pinned::PinnedMemoryPointer;

/// An asynchronous copy between device memory and a
/// [`PinnedBuffer`](super::PinnedBuffer), queued on a stream.
///
/// It borrows the pinned buffer for as long as it lives: shared when the copy reads
/// the buffer (host to device), exclusively when it writes it (device to host). So the
/// borrow checker refuses to compile code that writes a buffer a copy still reads, or
/// reads one a copy still writes, while the transfer is alive:
///
/// ```compile_fail
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::buffer::{DeviceBuffer, PinnedBuffer};
/// let s = cuda_rt::Stream::new()?;
/// let mut host = PinnedBuffer::<f32>::zeros(1 << 20)?;
/// let dev = DeviceBuffer::<f32>::zeros(1 << 20)?;
/// let t = dev.copy_to_pinned_async(&mut host, &s)?;
/// let first = host.as_slice()?[0]; // error: `host` is borrowed by the copy
/// t.wait()?;
/// # Ok(()) }
/// ```
///
/// Dropping a transfer neither waits nor cancels: the copy goes on, the memory on both
/// sides stays allocated until it has finished, and the buffer's views wait for it if
/// it is still running when they are asked for (so a transfer that is forgotten with
/// `mem::forget` is as safe as one that is waited for).
///
/// The host works on one pinned buffer while the other one is being copied:
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::{DeviceBuffer, PinnedBuffer, Stream};
/// let stream = Stream::non_blocking()?;
/// let mut dev = DeviceBuffer::<u8>::empty(2 << 20)?;
/// let (mut a, mut b) = (PinnedBuffer::<u8>::zeros(1 << 20)?, PinnedBuffer::zeros(1 << 20)?);
/// a.as_mut_slice()?.fill(1);
/// let (mut first, mut second) = dev.split_at_mut(1 << 20)?;
/// let t = first.copy_from_pinned_async(&a, &stream)?; // `a` is read while `t` lives
/// b.as_mut_slice()?.fill(2); // meanwhile, the host fills `b`
/// t.wait()?;
/// second.copy_from_pinned_async(&b, &stream)?.wait()?;
/// # Ok(()) }
/// ```
#[must_use = "a transfer is in flight until waited for; drop it to let it finish in the background"]
#[derive(Debug)]
pub struct Transfer<'p> {
    mem: &'p PinnedMemoryPointer,
}

impl<'p> Transfer<'p> {
    pub(crate) fn new(mem: &'p PinnedMemoryPointer) -> Self {
        Transfer { mem }
    }

    /// Whether the copy is known to have finished (without blocking). Copies queued
    /// later on the same pinned buffer count too: a transfer is done when all of them
    /// are. A query that fails (another thread holds a global-mode capture, or the
    /// context died) says `false`: the copy is not known to be done.
    pub fn is_done(&self) -> bool {
        self.mem.is_idle()
    }

    /// Blocks until the copy has finished, ending the borrow of the pinned buffer;
    /// the copy's error, if its stream failed, or the wait's (then the copy is not
    /// known to be done: the buffer's views wait for it again).
    pub fn wait(self) -> Result<()> {
        self.mem.synchronize()
    }
}
