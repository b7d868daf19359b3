//! The one helper every GPU test uses to decide whether to run.
//!
//! Without a GPU a test skips with a printed reason; with `CUDA_RT_REQUIRE_GPU=1` it
//! fails instead, so a GPU run can never pass by skipping.
//!
//! A test that asks the driver whether an address is still allocated (to see that
//! memory went back) runs alone in its test binary (`gpu_test!(alone name, ...)`):
//! run beside the others, an address freed there could be handed to another test
//! before the question, and the test would fail for nothing.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Held shared by every GPU test, exclusively by those that run alone.
static ALONE: RwLock<()> = RwLock::new(());

/// What a [`gpu_test!`](crate::gpu_test) holds while its body runs (not for direct use).
#[doc(hidden)]
pub fn beside_others() -> RwLockReadGuard<'static, ()> {
    ALONE.read().unwrap_or_else(PoisonError::into_inner)
}

/// What a `gpu_test!(alone ...)` holds while its body runs (not for direct use).
#[doc(hidden)]
pub fn alone() -> RwLockWriteGuard<'static, ()> {
    ALONE.write().unwrap_or_else(PoisonError::into_inner)
}

/// The variable that turns skips into failures.
pub const REQUIRE_GPU_VAR: &str = "CUDA_RT_REQUIRE_GPU";

/// Whether GPU tests must run (the variable is set to something other than `0`/empty).
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `true` when a GPU is usable. Otherwise prints why the test `name` is skipped and
/// returns `false`, or panics (failing the test) when [`gpu_required`].
///
/// ```
/// if !cuda_rt::testing::gpu_or_skip("my_gpu_test") {
///     return;
/// }
/// ```
pub fn gpu_or_skip(name: &str) -> bool {
    match crate::device::availability() {
        Ok(_) => true,
        Err(reason) if gpu_required() => {
            panic!("{name}: {REQUIRE_GPU_VAR} is set but no GPU is usable: {reason}")
        }
        Err(reason) => {
            eprintln!("skipped {name}: no GPU: {reason}");
            false
        }
    }
}

/// Runs a GPU test body only when a GPU is usable: `gpu_test!(my_test, { ... })`;
/// `gpu_test!(alone my_test, { ... })` also keeps the binary's other GPU tests out
/// while it runs (see the [module doc](crate::testing)).
#[macro_export]
macro_rules! gpu_test {
    ($(#[$m:meta])* alone $name:ident, $body:block) => {
        $(#[$m])*
        #[test]
        fn $name() {
            if !$crate::testing::gpu_or_skip(stringify!($name)) {
                return;
            }
            let _alone = $crate::testing::alone();
            $body
        }
    };
    ($(#[$m:meta])* $name:ident, $body:block) => {
        $(#[$m])*
        #[test]
        fn $name() {
            if !$crate::testing::gpu_or_skip(stringify!($name)) {
                return;
            }
            let _beside_others = $crate::testing::beside_others();
            $body
        }
    };
}
