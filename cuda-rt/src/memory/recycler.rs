//! The per-thread recycler of memory objects: spare lists of emptied `Arc` memory
//! objects (device pool, stream-ordered and pinned memory), so a cached malloc + free
//! pair allocates nothing on the heap. Statics cannot be generic, so each owner type
//! gets its own list through [`spare_list!`].

/// Declares, in the invoking module, `mod spare` with `take() -> Option<Arc<$ty>>`
/// (an emptied object of this thread's, if any), `take_where(pred)` (one that passes
/// `pred`) and `put(Arc<$ty>)` (keeps one for reuse, in the first slot when all
/// eight are taken; dropped when the thread is exiting).
macro_rules! spare_list {
    ($ty:ty) => {
        mod spare {
            use std::cell::Cell;
            use std::sync::Arc;

            #[allow(unused_imports)]
            use super::*;

            const SLOTS: usize = 8;

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

            /// Keeps an emptied object for reuse. When every slot is taken, it takes
            /// the first slot and the object there is dropped: the newest object is
            /// the likeliest to be wanted next (the slots are shared by every pool of
            /// the type, and a burst from one, such as the staging engine's buffers,
            /// must not lock the others out). Dropped when the thread is exiting.
            #[inline]
            pub(super) fn put(o: Arc<$ty>) {
                let _ = SPARE.try_with(move |slots| {
                    for slot in slots {
                        match slot.take() {
                            None => {
                                slot.set(Some(o));
                                return;
                            }
                            Some(full) => slot.set(Some(full)),
                        }
                    }
                    drop(slots[0].replace(Some(o)));
                });
            }
        }
    };
}
pub(crate) use spare_list;

#[cfg(test)]
mod tests {
    #[derive(Debug)]
    pub(super) struct Obj(u32);

    spare_list!(Obj);

    use std::sync::Arc;

    #[test]
    fn a_burst_of_one_owners_objects_does_not_lock_the_others_out() {
        spare::put(Arc::new(Obj(0)));
        // Twelve of another owner fill every slot and push out the first one...
        for i in 1..=12 {
            spare::put(Arc::new(Obj(100 + i)));
        }
        assert!(spare::take_where(|o| o.0 == 0).is_none());
        // ...but the next one freed is kept, and found again.
        spare::put(Arc::new(Obj(7)));
        let o = spare::take_where(|o| o.0 < 100).expect("the newest object is kept");
        assert_eq!(o.0, 7);
        // The others stay, and `take` gives any of them.
        assert!(spare::take().is_some_and(|o| o.0 > 100));
    }
}
