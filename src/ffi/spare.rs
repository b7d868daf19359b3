//! [`ThreadSpare`]: a thread's spare slot of one handle table, so that a free and the
//! next allocation of one thread (the steady pair) make no exchange on the table's
//! free list; [`thread_spare!`] declares one with the guard that gives the slot back
//! when the thread exits.

use std::cell::Cell;
use std::thread::LocalKey;

use super::handles::Spare;

/// A thread's spare slot of one `'static` table (see [`Spare`]): no destructor, so
/// reaching it costs nothing; the table's [`GiveBackAtExit`] (registered once
/// `armed`) gives the slot back when the thread exits.
pub(crate) struct ThreadSpare<T: 'static> {
    spare: Cell<Option<Spare<T>>>,
    armed: Cell<bool>,
}

impl<T> ThreadSpare<T> {
    pub(crate) const fn new() -> Self {
        ThreadSpare {
            spare: Cell::new(None),
            armed: Cell::new(false),
        }
    }

    /// The slot, for [`Table::vacant`](super::handles::Table::vacant) and
    /// [`Table::remove_spared`](super::handles::Table::remove_spared).
    #[inline]
    pub(crate) fn spare(&self) -> &Cell<Option<Spare<T>>> {
        &self.spare
    }

    /// Whether this thread may keep a spare slot: `exit`, the table's guard, is
    /// registered (now, the first time), so the slot goes back to the table when the
    /// thread exits. False on a thread that is exiting, where nothing would give it
    /// back.
    #[inline]
    pub(crate) fn may_keep(&self, exit: &'static LocalKey<GiveBackAtExit<T>>) -> bool {
        self.armed.get() || self.arm(exit)
    }

    #[cold]
    #[inline(never)]
    fn arm(&self, exit: &'static LocalKey<GiveBackAtExit<T>>) -> bool {
        let armed = exit.try_with(|_| ()).is_ok();
        self.armed.set(armed);
        armed
    }
}

/// Gives a thread's spare slot (the [`ThreadSpare`] it names) back when the thread
/// exits.
pub(crate) struct GiveBackAtExit<T: 'static>(pub(crate) &'static LocalKey<ThreadSpare<T>>);

impl<T> Drop for GiveBackAtExit<T> {
    fn drop(&mut self) {
        let _ = self.0.try_with(|t| {
            t.armed.set(false);
            if let Some(s) = t.spare.take() {
                s.give_back();
            }
        });
    }
}

/// Declares a table's thread spare `$spare` of values `$t` and its exit guard `$exit`.
macro_rules! thread_spare {
    ($spare:ident, $exit:ident, $t:ty) => {
        thread_local! {
            static $spare: $crate::ffi::spare::ThreadSpare<$t> =
                const { $crate::ffi::spare::ThreadSpare::new() };
            static $exit: $crate::ffi::spare::GiveBackAtExit<$t> =
                const { $crate::ffi::spare::GiveBackAtExit(&$spare) };
        }
    };
}
pub(crate) use thread_spare;
