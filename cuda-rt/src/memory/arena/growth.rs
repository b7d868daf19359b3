//! A miss that grows the pool: new backend memory, checked against the limit, with
//! the release-and-retry on out of memory and the error that reports it.

use std::sync::atomic::Ordering;

use super::bins::SlabFull;
use super::error::TOO_MANY_CHUNKS;
use super::stream_arena::Arena;
use super::{Backend, BackendError, Block, MallocError, Pool};
use crate::error::{OutOfMemory, OutOfMemoryCause};

impl<B: Backend> Pool<B> {
    /// A miss: new backend memory for `rounded` bytes, with the growth policy and the
    /// limit / out-of-memory retries. No arena lock is held on entry.
    #[cold]
    pub(super) fn grow(
        &self,
        arena: &Arena,
        requested: usize,
        rounded: u64,
        release_smaller: bool,
    ) -> Result<Block, MallocError> {
        if release_smaller {
            let mut out = Vec::new();
            arena
                .lock()
                .release_whole_where(&mut out, |size| size < rounded);
            self.give_back(&mut out);
        }
        let mut retried = false;
        loop {
            let (cause, limit) = match self.try_grow(rounded) {
                Ok(addr) => {
                    let added = arena.lock().add_allocation(addr, rounded);
                    return match added {
                        Ok(chunk) => Ok(self.block(arena, chunk, addr, rounded)),
                        Err(SlabFull) => {
                            self.give_back(&mut vec![(addr, rounded)]);
                            Err(MallocError::TooMany(TOO_MANY_CHUNKS))
                        }
                    };
                }
                Err(Growth::Limit(limit)) => (OutOfMemoryCause::Limit, limit),
                Err(Growth::Backend(BackendError::OutOfMemory(driver))) => {
                    let cause = match driver {
                        Some(d) => OutOfMemoryCause::Driver(d),
                        None => OutOfMemoryCause::Backend,
                    };
                    (cause, self.limit())
                }
                Err(Growth::Backend(BackendError::Other(e))) => {
                    return Err(MallocError::Backend(e));
                }
            };
            if retried {
                return Err(MallocError::OutOfMemory(self.oom(
                    requested,
                    Some(rounded),
                    cause,
                    limit,
                )));
            }
            retried = true;
            self.oom_retries.fetch_add(1, Ordering::Relaxed);
            // Blocks awaiting other streams are memory too: wait for them (a host
            // synchronisation, the only one) so the release below can give them back.
            if self.any_awaiting() {
                self.wait_awaiting();
            }
            self.free_all_blocks(None);
        }
    }

    /// Reserves `size` against the limit, then asks the backend.
    fn try_grow(&self, size: u64) -> Result<u64, Growth> {
        let limit = self.limit();
        let old = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                let new = r.checked_add(size)?;
                (limit == 0 || new <= limit).then_some(new)
            })
            .map_err(|_| Growth::Limit(limit))?;
        let Ok(len) = usize::try_from(size) else {
            self.reserved.fetch_sub(size, Ordering::AcqRel);
            return Err(Growth::Backend(BackendError::OutOfMemory(None)));
        };
        match self.backend.alloc(len) {
            Ok(addr) => {
                self.peak_reserved.fetch_max(old + size, Ordering::Relaxed);
                self.backend_allocs.fetch_add(1, Ordering::Relaxed);
                Ok(addr)
            }
            Err(e) => {
                self.reserved.fetch_sub(size, Ordering::AcqRel);
                Err(Growth::Backend(e))
            }
        }
    }

    /// The error for a request of `requested` bytes (`rounded` up, `None` when
    /// rounding overflowed) that `cause` refused under `limit` (0: none). The pool
    /// does not know its device: `device` is `None` until a front fills it in.
    #[cold]
    pub(super) fn oom(
        &self,
        requested: usize,
        rounded: Option<u64>,
        cause: OutOfMemoryCause,
        limit: u64,
    ) -> Box<OutOfMemory> {
        let s = self.stats();
        Box::new(OutOfMemory {
            requested: requested as u64,
            rounded,
            device: None,
            in_use: s.used_bytes,
            cached: s.free_bytes,
            limit: (limit != 0).then_some(limit),
            cause,
        })
    }
}

enum Growth {
    /// The limit in force refused.
    Limit(u64),
    Backend(BackendError),
}
