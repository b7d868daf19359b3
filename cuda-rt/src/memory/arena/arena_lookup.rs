//! Finding the arena of a stream key: each thread's small cache of
//! `(pool id, key) -> arena index`, then the pool's table (creating the arena on the
//! first use of a key).

use super::error::TOO_MANY_ARENAS;
use super::stream_arena::Arena;
use super::{Backend, MallocError, Pool};
use std::cell::Cell;

const CACHE_SLOTS: usize = 4;

#[derive(Clone, Copy)]
struct CacheEntry {
    /// 0: empty (pool ids start at 1).
    pool: u64,
    key: u64,
    /// Index of the arena in the pool's table.
    arena: u32,
}

const EMPTY_ENTRY: CacheEntry = CacheEntry {
    pool: 0,
    key: 0,
    arena: 0,
};

thread_local! {
    /// Last arenas this thread used: `(pool id, key) -> arena index`. Entries of
    /// dropped pools are never matched again (ids are unique).
    static ARENA_CACHE: [Cell<CacheEntry>; CACHE_SLOTS] =
        const { [const { Cell::new(EMPTY_ENTRY) }; CACHE_SLOTS] };
    static ARENA_CACHE_NEXT: Cell<usize> = const { Cell::new(0) };
}

impl<B: Backend> Pool<B> {
    /// The arena of `key`, created on first use.
    #[inline]
    pub(super) fn arena(&self, key: u64) -> Result<&Arena, MallocError> {
        let hit = ARENA_CACHE.with(|slots| {
            slots
                .iter()
                .map(Cell::get)
                .find_map(|e| (e.pool == self.id && e.key == key).then_some(e.arena))
        });
        // An index cached by this pool (same id; ids are unique) is always in its
        // table, which never removes an arena; the fallback only re-reads the map.
        match hit.and_then(|i| self.arenas.get(i)) {
            Some(arena) => Ok(arena),
            None => self.arena_slow(key),
        }
    }

    #[cold]
    fn arena_slow(&self, key: u64) -> Result<&Arena, MallocError> {
        let too_many = || MallocError::TooMany(TOO_MANY_ARENAS);
        let index = self
            .arenas
            .get_or_create(key, |index| {
                self.backend.arena_made(key);
                Arena::new(key, index)
            })
            .map_err(|_| too_many())?;
        let arena = self.arenas.get(index).ok_or_else(too_many)?;
        ARENA_CACHE.with(|slots| {
            ARENA_CACHE_NEXT.with(|next| {
                let n = next.get() % CACHE_SLOTS;
                slots[n].set(CacheEntry {
                    pool: self.id,
                    key,
                    arena: index,
                });
                next.set((n + 1) % CACHE_SLOTS);
            })
        });
        Ok(arena)
    }
}
