//! A process-wide memory barrier (Linux `membarrier`; plain libc, no CUDA): it lets a
//! hot path that runs on one thread order a store before a later load with a compiler
//! fence alone, paying the hardware barrier only on the rare path that must exclude it
//! (see [`parked`](super::parked)).
//!
//! [`ready`] registers the process once (`MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED`,
//! Linux 4.14); where that fails (another system, an older kernel, a sandbox that
//! filters the call, Miri) it says `false` and callers keep their locked path.

use std::sync::OnceLock;

/// `MEMBARRIER_CMD_GLOBAL` of `<linux/membarrier.h>` (no registration; slow).
#[cfg(all(target_os = "linux", not(miri)))]
const CMD_GLOBAL: libc::c_int = 1;
/// `MEMBARRIER_CMD_PRIVATE_EXPEDITED` of `<linux/membarrier.h>`.
#[cfg(all(target_os = "linux", not(miri)))]
const CMD_PRIVATE_EXPEDITED: libc::c_int = 1 << 3;
/// `MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED` of `<linux/membarrier.h>`.
#[cfg(all(target_os = "linux", not(miri)))]
const CMD_REGISTER_PRIVATE_EXPEDITED: libc::c_int = 1 << 4;

static READY: OnceLock<bool> = OnceLock::new();

#[cfg(all(target_os = "linux", not(miri)))]
#[allow(unsafe_code)] // the arena's one `unsafe`: a system call that touches no memory
fn membarrier(cmd: libc::c_int) -> bool {
    // SAFETY: `membarrier(cmd, flags = 0)` reads and writes no user memory; an
    // unsupported or filtered command only returns -1.
    unsafe { libc::syscall(libc::SYS_membarrier, cmd, 0 as libc::c_int) == 0 }
}

#[cfg(all(target_os = "linux", not(miri)))]
fn register() -> bool {
    // The registration is what makes the expedited barrier legal; one barrier proves
    // the call goes through (a sandbox may filter it after registration).
    membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) && membarrier(CMD_PRIVATE_EXPEDITED)
}

#[cfg(not(all(target_os = "linux", not(miri))))]
fn register() -> bool {
    false
}

/// Whether [`heavy`] works in this process, registering it on the first call.
pub(crate) fn ready() -> bool {
    *READY.get_or_init(register)
}

/// Whether [`ready`] already said `true`, without registering: the hot path's test.
/// `true` here implies `true` from every later [`ready`] on every thread (the
/// answer is set once).
#[inline]
pub(crate) fn ready_hint() -> bool {
    READY.get() == Some(&true)
}

/// Runs a full memory barrier on every running thread of the process, so that a
/// thread's store followed (behind a compiler fence) by its load is ordered against
/// this thread's store before and load after the call. Only after [`ready`] said
/// `true`; a no-op otherwise.
pub(crate) fn heavy() {
    #[cfg(all(target_os = "linux", not(miri)))]
    if ready() && !membarrier(CMD_PRIVATE_EXPEDITED) {
        // Registered, so this does not happen; should a forked child have lost the
        // registration, register again, else take the global barrier (no
        // registration, a scheduler grace period).
        let ok = (membarrier(CMD_REGISTER_PRIVATE_EXPEDITED) && membarrier(CMD_PRIVATE_EXPEDITED))
            || membarrier(CMD_GLOBAL);
        debug_assert!(ok, "membarrier failed after registration");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_answer_is_stable_and_the_barrier_runs() {
        let r = super::ready();
        assert_eq!(super::ready(), r);
        assert_eq!(super::ready_hint(), r);
        super::heavy();
    }
}
