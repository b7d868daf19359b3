//! The one helper every GPU test uses to decide whether to run (feature `test-util`,
//! which this crate's own tests and benches turn on; not part of the stable API).
//!
//! Without a GPU a test skips with a printed reason; with `CUDA_RT_REQUIRE_GPU=1` it
//! fails instead, so a GPU run can never pass by skipping. Tests that need something
//! else that may be missing (NVRTC, Chromium, a second GPU) skip the same way through
//! [`nvrtc_or_skip`] and [`skip`].
//!
//! libtest counts a skipped test as passed and has no end-of-run hook, so each skip and
//! each test that got past its check is recorded here, and when the test binary exits
//! (an `atexit` handler, after libtest's own summary) it says on stderr, in one line,
//! how many of those tests ran for real and how many did not, and why:
//!
//! ```text
//! note: 2 tests that need a GPU, NVRTC or Chromium ran for real; 27 did not, and libtest counts them as passed: 25 no GPU (CUDA driver (libcuda.so.1) not found ...), 2 no NVRTC (...). Set CUDA_RT_REQUIRE_GPU=1 to make them fail instead.
//! ```
//!
//! A test that skips says so once, in one line: the first skip of each kind in the
//! binary gives the whole reason (the loader's text names every path it tried), the
//! later ones its first line only.
//!
//! A test that asks the driver whether an address is still allocated (to see that
//! memory went back) runs alone in its test binary (`gpu_test!(alone name, ...)`):
//! run beside the others, an address freed there could be handed to another test
//! before the question, and the test would fail for nothing.

use std::collections::BTreeSet;
use std::fmt::Display;
use std::sync::{Mutex, Once, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

/// What a skipped test lacked: no usable GPU.
pub const NO_GPU: &str = "no GPU";
/// What a skipped test lacked: fewer GPUs than it needs.
pub const TOO_FEW_GPUS: &str = "too few GPUs";
/// What a skipped test lacked: NVRTC cannot be loaded.
pub const NO_NVRTC: &str = "no NVRTC";
/// What a skipped test lacked: the CUDA headers a kernel includes (toolkit or wheels).
pub const NO_CUDA_HEADERS: &str = "no CUDA headers";
/// What a skipped test lacked: no Chromium to render a page.
pub const NO_CHROMIUM: &str = "no Chromium";

/// The variable that turns skips for want of Chromium into failures.
pub const REQUIRE_CHROMIUM_VAR: &str = "CUDA_RT_REQUIRE_CHROMIUM";

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
    ran_or_skip(
        name,
        crate::device::availability(),
        NO_GPU,
        "no GPU is usable",
    )
}

/// `true` (and `name` counted as run) when `have` is `Ok`; otherwise a failure under
/// [`REQUIRE_GPU_VAR`] (`missing` words the panic), else `name` counted as skipped
/// for `kind`.
fn ran_or_skip<T, E: Display>(
    name: &str,
    have: std::result::Result<T, E>,
    kind: &'static str,
    missing: &str,
) -> bool {
    match have {
        Ok(_) => {
            ran(name);
            true
        }
        Err(e) if gpu_required() => panic!("{name}: {REQUIRE_GPU_VAR} is set but {missing}: {e}"),
        Err(e) => {
            skip(name, kind, &e);
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
    skip(name, TOO_FEW_GPUS, &reason);
    false
}

/// `true` when NVRTC loads. Otherwise prints why the test `name` is skipped and returns
/// `false`, or panics when [`gpu_required`] (the GPU machine has NVRTC).
///
/// ```
/// if !cuda_rt::testing::nvrtc_or_skip("my_compile_test") {
///     return;
/// }
/// ```
pub fn nvrtc_or_skip(name: &str) -> bool {
    ran_or_skip(
        name,
        crate::compiler::nvrtc_version(),
        NO_NVRTC,
        "NVRTC cannot be loaded",
    )
}

/// What this process's tests did, for the line printed at exit.
struct Record {
    /// Tests that got past a check ([`ran`]).
    ran: BTreeSet<String>,
    /// Tests that skipped, with what they lacked.
    skipped: Vec<(String, &'static str)>,
    /// Each kind of skip with its first reason, in the order first seen.
    reasons: Vec<(&'static str, String)>,
}

static RECORD: Mutex<Record> = Mutex::new(Record {
    ran: BTreeSet::new(),
    skipped: Vec::new(),
    reasons: Vec::new(),
});
static AT_EXIT: Once = Once::new();

fn record() -> std::sync::MutexGuard<'static, Record> {
    // A test that panicked while holding it left nothing half-done worth refusing.
    RECORD.lock().unwrap_or_else(PoisonError::into_inner)
}

fn print_at_exit() {
    AT_EXIT.call_once(|| {
        // SAFETY: `print_summary` is an `extern "C" fn()` that never unwinds.
        unsafe { libc::atexit(print_summary) };
    });
}

/// Records that the test `name` got past its check and runs its real body. The
/// `..._or_skip` helpers call it; a test with its own check calls it directly.
pub fn ran(name: &str) {
    print_at_exit();
    record().ran.insert(name.to_owned());
}

/// Records that the test `name` did not run its real check because `missing` (one of
/// [`NO_GPU`], [`TOO_FEW_GPUS`], [`NO_NVRTC`], [`NO_CUDA_HEADERS`], [`NO_CHROMIUM`], or
/// the caller's own
/// words, e.g. `"no nvcc"`), and prints one line saying so: `reason` in full for the
/// binary's first skip of that kind, its first line after that.
///
/// The caller decides first whether a skip is allowed (see [`gpu_required`]).
pub fn skip(name: &str, missing: &'static str, reason: &dyn Display) {
    print_at_exit();
    let reason = reason.to_string();
    let mut r = record();
    let first = !r.reasons.iter().any(|(m, _)| *m == missing);
    if first {
        eprintln!("skipped {name}: {missing}: {reason}");
        r.reasons.push((missing, first_line(&reason)));
    } else {
        eprintln!("skipped {name}: {missing} ({})", first_line(&reason));
    }
    r.skipped.push((name.to_owned(), missing));
}

/// The first line of `s`, with ` ...` when more followed.
fn first_line(s: &str) -> String {
    match s.split_once('\n') {
        Some((line, _)) => format!("{} ...", line.trim_end_matches(':')),
        None => s.to_owned(),
    }
}

/// How many tests of this process skipped so far.
pub fn skipped_count() -> usize {
    let r = record();
    let names: BTreeSet<&str> = r.skipped.iter().map(|(n, _)| n.as_str()).collect();
    names.len()
}

/// What one test binary's tests did: the input of [`skip_summary`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    /// Tests that got past their checks and ran their real body.
    pub ran: usize,
    /// Per kind of skip (`"no GPU"`...), in the order first seen: how many tests, and
    /// the first line of the first reason.
    pub skipped: Vec<(&'static str, usize, String)>,
}

impl Tally {
    /// This process's tally so far. A test counts once: skipped if any of its checks
    /// skipped (under its first reason), else ran.
    pub fn current() -> Tally {
        let r = record();
        let mut t = Tally::default();
        let mut seen = BTreeSet::new();
        for (name, missing) in &r.skipped {
            if !seen.insert(name.as_str()) {
                continue;
            }
            match t.skipped.iter_mut().find(|(m, _, _)| m == missing) {
                Some(entry) => entry.1 += 1,
                None => {
                    let why = r
                        .reasons
                        .iter()
                        .find(|(m, _)| m == missing)
                        .map_or(String::new(), |(_, w)| w.clone());
                    t.skipped.push((missing, 1, why));
                }
            }
        }
        t.ran = r.ran.iter().filter(|n| !seen.contains(n.as_str())).count();
        t
    }
}

/// The line printed at exit for `tally` (ends with a newline).
pub fn skip_summary(tally: &Tally) -> String {
    let needs = |n: usize| {
        if n == 1 {
            "test that needs a GPU, NVRTC or Chromium"
        } else {
            "tests that need a GPU, NVRTC or Chromium"
        }
    };
    let skipped: usize = tally.skipped.iter().map(|(_, n, _)| n).sum();
    if skipped == 0 {
        let all = if tally.ran == 1 { "the" } else { "all" };
        return format!(
            "note: {all} {} {} ran for real; none skipped.\n",
            tally.ran,
            needs(tally.ran)
        );
    }
    let why: Vec<String> = tally
        .skipped
        .iter()
        .map(|(m, n, reason)| format!("{n} {m} ({reason})"))
        .collect();
    let mut hints: Vec<&str> = Vec::new();
    for (m, _, _) in &tally.skipped {
        // Only the kinds a variable turns into failures; a test's own kind (`"no
        // nvcc"`) has none.
        let var = match *m {
            NO_GPU | NO_NVRTC | NO_CUDA_HEADERS => REQUIRE_GPU_VAR,
            TOO_FEW_GPUS => REQUIRE_MULTI_GPU_VAR,
            NO_CHROMIUM => REQUIRE_CHROMIUM_VAR,
            _ => continue,
        };
        if !hints.contains(&var) {
            hints.push(var);
        }
    }
    let them = if skipped == 1 { "it" } else { "them" };
    let hint = if hints.is_empty() {
        String::new()
    } else {
        format!(
            " Set {}=1 to make {them} fail instead.",
            hints.join("=1 or ")
        )
    };
    format!(
        "note: {} {} ran for real; {skipped} did not, and libtest counts {them} as \
         passed: {}.{hint}\n",
        tally.ran,
        needs(tally.ran),
        why.join(", "),
    )
}

extern "C" fn print_summary() {
    // After libtest's summary: the skips would otherwise read as passes. Written with
    // one `write(2)`, since std's handles may be gone this late in the exit.
    let _ = std::panic::catch_unwind(|| {
        let line = skip_summary(&Tally::current());
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

/// Sets how later staged host copies cut their bytes: the largest chunk (a multiple of
/// 4 KiB, 256 KiB to 256 MiB), the staging buffers in flight (2 to 16) and the first
/// chunk of the ramp (0 for none). For the bench that tunes the defaults
/// (`host_copies`); not part of the stable API.
pub fn set_staging_plan(chunk: usize, buffers: usize, ramp: usize) -> crate::Result<()> {
    crate::pinned::staging::set_plan_shape(crate::pinned::staging::PlanShape {
        chunk,
        buffers,
        ramp,
    })
}

/// Sets which directions of later staged host copies fill their destination with
/// streaming (non-temporal) stores on x86-64: `h2d` the staging buffers of copies to
/// the device, `d2h` the pageable destinations of copies to the host (of at least
/// [`STREAM_D2H_MIN`](crate::pinned::staging::STREAM_D2H_MIN) bytes). By default
/// `h2d` is off and `d2h` on ([`streaming_stores`] tells); for the bench that
/// compares them.
pub fn set_streaming_stores(h2d: bool, d2h: bool) {
    crate::pinned::staging::set_streaming_stores(h2d, d2h)
}

/// Which directions of staged host copies write with streaming stores now: `(h2d,
/// d2h)`, as [`set_streaming_stores`] takes them.
pub fn streaming_stores() -> (bool, bool) {
    crate::pinned::staging::streaming_stores()
}

/// Makes this thread's updates of a recording's kernel nodes by arguments fail after
/// `n` more node updates succeed, as a driver refusal would (`None`: never), for the
/// tests of an update that fails partway; not part of the stable API.
pub fn fail_kernel_node_updates_after(n: Option<usize>) {
    crate::graph::arguments::fail_node_updates_after(n)
}

/// The handles of the dropped streams kept, not destroyed yet, because work was still
/// queued on them while a pool may hold blocks freed onto them (their handles must not
/// go to another stream before that work is done; see `Stream`'s drop).
pub fn streams_kept_for_their_work() -> Vec<usize> {
    crate::stream::retire::kept()
}

pub use crate::module::ModuleWatch;

/// A watch on `module`: tells whether it is still loaded without keeping it loaded,
/// for tests that check what keeps a module (a graph of a capture that launched one
/// of its kernels) and that it goes afterwards.
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// let module = cuda_rt::Module::load_file("kernels.cubin")?;
/// let watch = cuda_rt::testing::watch_module(&module);
/// assert!(watch.is_loaded());
/// drop(module);
/// assert!(!watch.is_loaded());
/// # Ok(()) }
/// ```
pub fn watch_module(module: &crate::Module) -> ModuleWatch {
    ModuleWatch::new(module)
}
