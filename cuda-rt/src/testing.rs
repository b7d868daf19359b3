//! The one helper every GPU test uses to decide whether to run (feature `test-util`,
//! which this crate's own tests and benches turn on; not part of the stable API).
//!
//! Without a GPU a test skips with a printed reason; with `CUDA_RT_REQUIRE_GPU=1` it
//! fails instead, so a GPU run can never pass by skipping. libtest counts a skipped test
//! as passed, so when the test binary exits it says on stderr how many of its tests
//! did not run and why (`note: 25 GPU tests of this binary did not run ...`).
//!
//! A test that asks the driver whether an address is still allocated (to see that
//! memory went back) runs alone in its test binary (`gpu_test!(alone name, ...)`):
//! run beside the others, an address freed there could be handed to another test
//! before the question, and the test would fail for nothing.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Once, OnceLock, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

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
            note_skip(&reason.to_string());
            false
        }
    }
}

/// The variable that turns skips of tests needing several GPUs into failures.
pub const REQUIRE_MULTI_GPU_VAR: &str = "CUDA_RT_REQUIRE_MULTI_GPU";

/// Whether tests needing several GPUs must run ([`REQUIRE_MULTI_GPU_VAR`] set to
/// something other than `0`/empty).
pub fn multi_gpu_required() -> bool {
    std::env::var(REQUIRE_MULTI_GPU_VAR).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// `true` when at least `n` GPUs are usable. Otherwise prints why the test `name` is
/// skipped and returns `false`; or panics (failing the test) when no GPU at all is
/// usable and [`gpu_required`], or fewer than `n` are and [`multi_gpu_required`].
///
/// ```
/// if !cuda_rt::testing::gpus_or_skip("my_two_gpu_test", 2) {
///     return;
/// }
/// ```
pub fn gpus_or_skip(name: &str, n: i32) -> bool {
    if !gpu_or_skip(name) {
        return false;
    }
    let have = crate::device::device_count().unwrap_or(0);
    if have >= n {
        return true;
    }
    let reason = format!("needs {n} GPUs, this machine has {have}");
    if multi_gpu_required() {
        panic!("{name}: {REQUIRE_MULTI_GPU_VAR} is set but {reason}");
    }
    eprintln!("skipped {name}: {reason}");
    false
}

/// GPU tests of this process that skipped, and the first reason.
static SKIPPED: AtomicUsize = AtomicUsize::new(0);
static SKIP_REASON: OnceLock<String> = OnceLock::new();
static AT_EXIT: Once = Once::new();

/// How many GPU tests of this process skipped so far.
pub fn skipped_count() -> usize {
    SKIPPED.load(Ordering::Relaxed)
}

fn note_skip(reason: &str) {
    SKIPPED.fetch_add(1, Ordering::Relaxed);
    let _ = SKIP_REASON.set(reason.to_owned());
    AT_EXIT.call_once(|| {
        // SAFETY: `print_skips` is an `extern "C" fn()` that never unwinds.
        unsafe { libc::atexit(print_skips) };
    });
}

/// The line printed at exit when `n` GPU tests skipped for `reason`.
pub fn skip_summary(n: usize, reason: &str) -> String {
    format!(
        "note: {n} GPU test{} of this binary did not run (no GPU: {reason}); libtest \
         counts {} as passed. Set {REQUIRE_GPU_VAR}=1 to make {} fail instead.\n",
        if n == 1 { "" } else { "s" },
        if n == 1 { "it" } else { "them" },
        if n == 1 { "it" } else { "them" },
    )
}

extern "C" fn print_skips() {
    // After libtest's summary: the skips would otherwise read as passes. Written with
    // one `write(2)`, since std's handles may be gone this late in the exit.
    let _ = std::panic::catch_unwind(|| {
        let n = SKIPPED.load(Ordering::Relaxed);
        let reason = SKIP_REASON.get().map_or("", String::as_str);
        let line = skip_summary(n, reason);
        // SAFETY: `line` is a live buffer of `line.len()` bytes; fd 2 is stderr.
        let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    });
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
