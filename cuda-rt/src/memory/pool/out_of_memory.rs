//! Out of memory and the other failed mallocs as the crate's [`Error`].

use crate::error::{Error, StateKind};
use crate::memory::arena::MallocError;

/// The crate's error for a failed pool malloc on `device`.
#[cold]
pub(super) fn malloc_error(e: MallocError, device: i32) -> Error {
    let pool = format!("memory pool of device {device}");
    pool_malloc_error(e, Some(device), &pool)
}

/// The crate's error for a failed malloc from an arena pool: the arena's out of
/// memory (with the pool's numbers, and the driver's error when the driver refused)
/// on `device` (`None`: host memory), or an invalid state naming `pool`. Shared by
/// the device and pinned pools.
#[cold]
pub(crate) fn pool_malloc_error(e: MallocError, device: Option<i32>, pool: &str) -> Error {
    match e {
        MallocError::OutOfMemory(mut o) => {
            o.device = device;
            Error::OutOfMemory(o)
        }
        MallocError::TooMany(what) => {
            Error::invalid_state(StateKind::TooMany, format!("{pool}: too many {what}"))
        }
        MallocError::Backend(b) => match b.downcast::<Error>() {
            Ok(e) => *e,
            Err(other) => Error::invalid_state(StateKind::Other, format!("{pool}: {other}")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{DriverError, OutOfMemory, OutOfMemoryCause};
    use cuda_sys::driver::CUresult;

    fn arena_oom(cause: OutOfMemoryCause) -> MallocError {
        MallocError::OutOfMemory(Box::new(OutOfMemory {
            requested: 1000,
            rounded: Some(1024),
            device: None,
            in_use: 4096,
            cached: 0,
            limit: Some(4096),
            cause,
        }))
    }

    #[test]
    fn pool_error_names_device_and_numbers() {
        let e = malloc_error(arena_oom(OutOfMemoryCause::Limit), 1);
        let Error::OutOfMemory(b) = &e else {
            panic!("{e:?}")
        };
        assert_eq!(
            (
                b.requested,
                b.rounded,
                b.device,
                b.in_use,
                b.cached,
                b.limit
            ),
            (1000, Some(1024), Some(1), 4096, 0, Some(4096))
        );
        assert_eq!(b.cause, OutOfMemoryCause::Limit);
        assert_eq!(e.driver_code(), None);
        let msg = e.to_string();
        assert!(
            msg.contains("on device 1") && msg.contains("limit 4.00 KiB"),
            "{msg}"
        );
    }

    #[test]
    fn the_drivers_refusal_reaches_the_error_in_the_return_value() {
        let d = DriverError {
            call: "cuMemAlloc",
            code: CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            name: "CUDA_ERROR_OUT_OF_MEMORY",
            description: "out of memory",
        };
        let e = malloc_error(arena_oom(OutOfMemoryCause::Driver(d)), 0);
        assert_eq!(e.driver_code(), Some(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(
            e.to_string()
                .ends_with("(cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY: out of memory)"),
            "{e}"
        );
        let e = pool_malloc_error(
            arena_oom(OutOfMemoryCause::Driver(d)),
            None,
            "pinned memory pool",
        );
        let Error::OutOfMemory(b) = &e else {
            panic!("{e:?}")
        };
        assert_eq!((b.device, b.driver()), (None, Some(&d)));
    }

    #[test]
    fn a_full_table_is_an_invalid_state_naming_the_pool() {
        let e = malloc_error(MallocError::TooMany("chunks in one arena"), 2);
        assert!(matches!(
            e,
            Error::InvalidState {
                kind: StateKind::TooMany,
                ..
            }
        ));
        assert_eq!(
            e.to_string(),
            "memory pool of device 2: too many chunks in one arena"
        );
    }
}
