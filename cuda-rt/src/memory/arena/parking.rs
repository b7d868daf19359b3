//! The pool's side of parked frees (the per-thread slots themselves are in
//! `parked`): the cached pair's malloc, taking parked blocks back into their arenas,
//! settling every slot before an observer looks, and tracking the slots.

use std::sync::atomic::Ordering;
use std::sync::PoisonError;

use super::barrier;
use super::bins::Bins;
use super::parked::{self, Parked, Taken};
use super::stream_arena::Arena;
use super::{round_size, Backend, Block, Pool, RawBlock};

impl<B: Backend> Pool<B> {
    /// The cached pair's malloc: when the block this thread parked in `parked` is
    /// exactly what a malloc of `size` bytes in `stream`'s arena gets back, that block,
    /// found without the arena lookup, with no lock while the arena has not changed
    /// since this thread last found so (see `parked`), else under one; `None`
    /// otherwise, with the
    /// parked block (if any was taken) given back to its arena, so that a
    /// [`malloc_parked`](Self::malloc_parked) that follows sees what it would have.
    #[inline]
    pub(crate) fn malloc_reparked(
        &self,
        size: usize,
        stream: u64,
        parked: &Parked,
    ) -> Option<Block> {
        // Read without the lock: only this thread fills its slot, so what it holds
        // while full is what this thread parked; another thread may only empty it,
        // which `take_in` sees under the lock.
        if !parked.is_full() {
            return None;
        }
        let hint = parked.peek();
        let rounded = round_size(size)? as u64;
        // A block's key is its arena's: same key, same arena as `arena(stream)`.
        if hint.size != rounded || hint.key != stream {
            return None;
        }
        let arena = self.arenas.get(hint.arena)?;
        if parked.take_unlocked(&hint, &arena.changes) {
            return Some(self.block(arena, hint.chunk, hint.addr, rounded));
        }
        let mut bins = arena.lock();
        // Still full: still `hint` (an observer may have settled it meanwhile).
        if !parked.take_peeked() {
            return None;
        }
        self.reuse_or_free(&mut bins, arena, hint, parked)
    }

    /// Under `arena`'s lock (`bins`): takes back the block parked in `parked` if it is
    /// of this arena, and gives it out again when it is exactly what a malloc of
    /// `rounded` bytes gets (the free and the malloc fused); else it goes back to the
    /// arena (`None`).
    #[inline]
    pub(super) fn take_back(
        &self,
        bins: &mut Bins,
        arena: &Arena,
        rounded: u64,
        parked: &Parked,
    ) -> Option<Block> {
        let Taken::Block(raw) = parked.take_in(arena.index) else {
            return None;
        };
        if raw.size != rounded {
            let _ = bins.free(raw.chunk, raw.addr, raw.size);
            return None;
        }
        self.reuse_or_free(bins, arena, raw, parked)
    }

    /// Under `arena`'s lock (`bins`), with `raw` (this thread's parked block, of the
    /// size being asked for) taken out of its slot `parked`: the block again when the
    /// free and the malloc fused give it back exactly (remembered in the slot for the
    /// lock-free take), else it goes back to the arena (`None`).
    #[inline]
    fn reuse_or_free(
        &self,
        bins: &mut Bins,
        arena: &Arena,
        raw: RawBlock,
        parked: &Parked,
    ) -> Option<Block> {
        // Ours to give back; it names a live chunk of this arena.
        if bins.reuse_exact(raw.chunk, raw.addr, raw.size) {
            parked.set_verified(raw, arena.changes.load(Ordering::Relaxed));
            return Some(self.block(arena, raw.chunk, raw.addr, raw.size));
        }
        let _ = bins.free(raw.chunk, raw.addr, raw.size);
        None
    }

    /// Starts tracking the calling thread's new parking slot `p`.
    pub(crate) fn register_parked(&self, p: &'static Parked) {
        self.parked_list().push(p);
    }

    /// Settles `p` and stops tracking it; its thread's call (exiting, or dropping its
    /// entry for the pool).
    pub(crate) fn forget_parked(&self, p: &'static Parked) {
        self.take_parked(p);
        let mut list = self.parked_list();
        list.retain(|q| !std::ptr::eq(*q, p));
        // Under the list lock, as `stats` reads the counts.
        self.retired_pairs.fetch_add(p.retire(), Ordering::Relaxed);
    }

    fn parked_list(&self) -> std::sync::MutexGuard<'_, Vec<&'static Parked>> {
        self.parked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes `p`'s block into its arena under the arena's lock; `true` if there was
    /// one. The caller is `p`'s thread (never inside its own lock-free take, so no
    /// claim is needed), or has claimed `p` and waited for it to be idle (see
    /// [`Parked::claim`]).
    fn take_parked(&self, p: &Parked) -> bool {
        // A stale arena index (the slot refilled meanwhile) is seen under the lock as
        // `Elsewhere`: read it again. Only the slot's thread refills it, so this ends.
        for _ in 0..4 {
            if !p.is_full() {
                return false;
            }
            let index = p.arena();
            let Some(arena) = self.arenas.get(index) else {
                return false;
            };
            let mut bins = arena.lock();
            match p.take_in(index) {
                Taken::Empty => return false,
                Taken::Elsewhere => continue,
                Taken::Block(raw) => {
                    let _ = bins.free(raw.chunk, raw.addr, raw.size);
                    return true;
                }
            }
        }
        false
    }

    /// Settles every thread's parked block; `true` if any went back. Each slot's
    /// thread may be taking its block back without a lock: every slot is claimed,
    /// then one process-wide barrier, then each is waited for and taken.
    pub(crate) fn settle_all(&self) -> bool {
        let list = self.parked_list();
        // A slot that fills after this look is parked after the caller's point.
        if !list.iter().any(|p| p.is_full()) {
            return false;
        }
        for p in list.iter() {
            p.claim();
        }
        barrier::heavy();
        let mut any = false;
        for p in list.iter() {
            p.wait_idle();
            any |= self.take_parked(p);
        }
        for p in list.iter() {
            p.unclaim();
        }
        any
    }

    /// Cached pairs done without the lock by every thread (see
    /// [`Parked::take_unlocked`]), including threads gone.
    pub(super) fn unlocked_pairs(&self) -> u64 {
        let list = self.parked_list();
        let live: u64 = list.iter().map(|p| p.pairs()).sum();
        self.retired_pairs.load(Ordering::Relaxed) + live
    }

    /// Gives back the block `raw` came from (a block of this pool, once) through the
    /// calling thread's parking slot for this pool, registering one first (`home`:
    /// how the thread's list holds the pool, `id` its identity there); at once when
    /// the thread cannot park.
    #[inline]
    pub(crate) fn park_or_free(
        &self,
        raw: RawBlock,
        id: usize,
        home: impl FnOnce() -> parked::HomeRef,
    ) {
        let slot = parked::slot_or_register(id, |p| {
            self.register_parked(p);
            home()
        });
        match slot {
            Some(p) => self.park(p, raw),
            None => {
                self.free_raw(raw);
            }
        }
    }

    /// Marks the pool's owner gone (its user handles dropped while recycled objects
    /// or parking slots may still hold it); the owner then releases the cache and
    /// checks [`is_closed`](Self::is_closed) after each free.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    /// Whether [`close`](Self::close) happened. SeqCst pairs with `close`: a free
    /// followed by this check either sees the flag (and releases the cache itself) or
    /// ran before the close, whose release then finds the block cached.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Parks `raw` (a block of this pool given back once) in the calling thread's
    /// slot `p`; the block parked there before goes back to its arena first.
    #[inline]
    pub(crate) fn park(&self, p: &Parked, raw: RawBlock) {
        if raw.size == 0 {
            return;
        }
        if p.is_full() {
            self.take_parked(p);
            if p.is_full() {
                self.free_raw(raw);
                return;
            }
        }
        p.put(raw);
    }
}

impl<B: Backend + 'static> parked::Home for Pool<B> {
    fn forget(&self, p: &'static Parked) {
        self.forget_parked(p);
    }

    fn closed(&self) -> bool {
        self.is_closed()
    }
}
