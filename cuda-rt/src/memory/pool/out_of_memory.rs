//! Out of memory and the other failed mallocs as the crate's [`Error`].

use std::cell::Cell;

use crate::error::{DriverError, Error, OutOfMemory};
use crate::memory::arena::MallocError;

thread_local! {
    /// The driver's error of this thread's last refused `cuMemAlloc`, for the
    /// out-of-memory error (the arena's backend error carries no payload).
    pub(super) static LAST_DRIVER_OOM: Cell<Option<DriverError>> = const { Cell::new(None) };
}

/// The crate's error for a failed pool malloc of `size` bytes on `device`.
#[cold]
pub(super) fn malloc_error(e: MallocError, size: usize, device: i32) -> Error {
    let pool = format!("memory pool of device {device}");
    pool_malloc_error(e, size, Some(device), &pool, || {
        LAST_DRIVER_OOM.with(Cell::take)
    })
}

/// The crate's error for a failed malloc of `size` bytes from an arena pool: out of
/// memory with the pool's numbers (and `driver`'s error when the backend refused), or
/// an invalid state naming `pool`. Shared by the device and pinned pools.
#[cold]
pub(crate) fn pool_malloc_error(
    e: MallocError,
    size: usize,
    device: Option<i32>,
    pool: &str,
    driver: impl FnOnce() -> Option<DriverError>,
) -> Error {
    match e {
        MallocError::OutOfMemory(o) => Error::OutOfMemory(Box::new(OutOfMemory {
            requested: if o.rounded == u64::MAX {
                size as u64
            } else {
                o.rounded
            },
            device,
            in_use: o.in_use,
            cached: o.cached,
            limit: o.limit,
            driver: if o.backend_refused { driver() } else { None },
        })),
        MallocError::TooMany(what) => Error::InvalidState(format!("{pool}: too many {what}")),
        MallocError::Backend(b) => match b.downcast::<Error>() {
            Ok(e) => *e,
            Err(other) => Error::InvalidState(format!("{pool}: {other}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_error_names_device_and_numbers() {
        let o = crate::memory::arena::OutOfMemory {
            requested: 1000,
            rounded: 1024,
            in_use: 4096,
            cached: 0,
            limit: Some(4096),
            backend_refused: false,
        };
        let e = malloc_error(MallocError::OutOfMemory(o), 1000, 1);
        let Error::OutOfMemory(b) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (b.requested, b.device, b.in_use, b.cached, b.limit),
            (1024, Some(1), 4096, 0, Some(4096))
        );
        assert!(b.driver.is_none());
        let msg = e.to_string();
        assert!(
            msg.contains("on device 1") && msg.contains("limit 4.00 KiB"),
            "{msg}"
        );
    }
}
