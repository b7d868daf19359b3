//! Per-thread spare lists of emptied `Arc` memory objects, so a cached malloc + free
//! pair allocates nothing on the heap. Statics cannot be generic, so each owner type
//! gets its own list through [`spare_list!`].

/// Declares, in the invoking module, `mod spare` with `take() -> Option<Arc<$ty>>`
/// (an emptied object of this thread's, if any), `take_where(pred)` (one that passes
/// `pred`) and `put(Arc<$ty>)` (keeps one for reuse; dropped when all four slots are
/// taken or the thread is exiting).
macro_rules! spare_list {
    ($ty:ty) => {
        mod spare {
            use std::cell::Cell;
            use std::sync::Arc;

            #[allow(unused_imports)]
            use super::*;

            const SLOTS: usize = 4;

            thread_local! {
                static SPARE: [Cell<Option<Arc<$ty>>>; SLOTS] =
                    const { [const { Cell::new(None) }; SLOTS] };
            }

            /// An emptied object of this thread's, if there is one.
            #[allow(dead_code)]
            #[inline]
            pub(super) fn take() -> Option<Arc<$ty>> {
                SPARE
                    .try_with(|slots| slots.iter().find_map(Cell::take))
                    .ok()
                    .flatten()
            }

            /// An emptied object of this thread's that passes `pred`, if there is one.
            #[allow(dead_code)]
            #[inline]
            pub(super) fn take_where(pred: impl Fn(&$ty) -> bool) -> Option<Arc<$ty>> {
                SPARE
                    .try_with(|slots| {
                        slots.iter().find_map(|slot| {
                            let o = slot.take()?;
                            if pred(&o) {
                                Some(o)
                            } else {
                                slot.set(Some(o));
                                None
                            }
                        })
                    })
                    .ok()
                    .flatten()
            }

            /// Keeps an emptied object for reuse (dropped when every slot is taken,
            /// or when the thread is exiting).
            #[inline]
            pub(super) fn put(o: Arc<$ty>) {
                let _ = SPARE.try_with(move |slots| {
                    let mut o = Some(o);
                    for slot in slots {
                        match slot.take() {
                            None => {
                                slot.set(o.take());
                                return;
                            }
                            Some(full) => slot.set(Some(full)),
                        }
                    }
                });
            }
        }
    };
}
pub(crate) use spare_list;
