//! The one helper every GPU test uses to decide whether to run.
//!
//! Without a GPU a test skips with a printed reason; with `CUDA_RT_REQUIRE_GPU=1` it
//! fails instead, so a GPU run can never pass by skipping.

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

/// Runs a GPU test body only when a GPU is usable: `gpu_test!(my_test, { ... })`.
#[macro_export]
macro_rules! gpu_test {
    ($(#[$m:meta])* $name:ident, $body:block) => {
        $(#[$m])*
        #[test]
        fn $name() {
            if !$crate::testing::gpu_or_skip(stringify!($name)) {
                return;
            }
            $body
        }
    };
}
