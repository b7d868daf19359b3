//! The pool's statistics: [`PoolStats`] and how [`Pool`] sums them arena by arena
//! (see the module doc of `arena` for what the peaks mean).

use std::sync::atomic::Ordering;

use super::{Backend, Pool};

/// Statistics of a [`Pool`]: CuPy's four numbers and more. Under concurrent use each
/// arena's figures are exact and the sums are of per-arena snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes handed out (rounded sizes). CuPy's `used_bytes`.
    pub used_bytes: u64,
    /// Bytes reserved from the backend. CuPy's `total_bytes`.
    pub total_bytes: u64,
    /// `total_bytes - used_bytes`: cached. CuPy's `free_bytes`.
    pub free_bytes: u64,
    /// Free chunks in all arenas. CuPy's `n_free_blocks`.
    pub n_free_blocks: u64,
    /// Peak of `used_bytes` since creation or [`Pool::reset_peaks`] (see the module
    /// doc: exact for one arena, an upper bound across arenas).
    pub peak_used_bytes: u64,
    /// Peak of `total_bytes` since creation or [`Pool::reset_peaks`] (exact).
    pub peak_total_bytes: u64,
    /// Successful non-zero mallocs.
    pub mallocs: u64,
    /// Frees of non-null blocks.
    pub frees: u64,
    /// Mallocs served from cached chunks.
    pub cache_hits: u64,
    /// Mallocs that found no cached chunk (each then grew or failed).
    pub cache_misses: u64,
    /// Successful backend allocations.
    pub backend_allocs: u64,
    /// Backend frees.
    pub backend_frees: u64,
    /// Times an out-of-memory (limit or backend) made the pool release its cache and
    /// retry.
    pub oom_retries: u64,
    /// The limit (0: none).
    pub limit: u64,
    /// Arenas (stream keys seen).
    pub n_arenas: u64,
    /// Blocks given back while streams recorded on them may still use them
    /// ([`Pool::free_after`]), not handed out again until their fences are done.
    /// Not in `used_bytes`; in `free_bytes`.
    pub awaiting_blocks: u64,
    /// Bytes of those blocks.
    pub awaiting_bytes: u64,
    /// Fences given with blocks (events recorded on other streams at free time).
    pub stream_fences: u64,
    /// Host synchronisations on fences: waits before reporting out of memory, at the
    /// pool's drop, and in place of a fence that could not be recorded. None in the
    /// steady state.
    pub fence_syncs: u64,
    /// Ranges of free granules that growths unmapped inside expandable segments
    /// (holes punched, see [`Pool::set_expandable_segments`]); each is also one of
    /// `backend_frees`.
    pub holes_punched: u64,
}

impl<B: Backend> Pool<B> {
    /// Statistics, summed over arenas.
    pub fn stats(&self) -> PoolStats {
        self.settle_all();
        let mut s = PoolStats::default();
        let mut peak_used = 0u64;
        // Sums of snapshots taken at different times: saturating, as they could only
        // overflow near 2^64 bytes.
        for arena in self.arenas.iter() {
            let k = arena.lock_unchanged().counters;
            s.used_bytes = s.used_bytes.saturating_add(k.used);
            s.total_bytes = s.total_bytes.saturating_add(k.reserved);
            s.n_free_blocks += k.n_free;
            s.mallocs += k.mallocs;
            s.frees += k.frees;
            s.cache_hits += k.hits;
            s.cache_misses += k.misses;
            s.awaiting_blocks += k.n_awaiting;
            s.awaiting_bytes = s.awaiting_bytes.saturating_add(k.awaiting);
            peak_used = peak_used.saturating_add(k.peak_used);
            s.n_arenas += 1;
        }
        // Each lock-free pair is a free and a malloc served from the cache.
        let pairs = self.unlocked_pairs();
        s.mallocs += pairs;
        s.frees += pairs;
        s.cache_hits += pairs;
        s.free_bytes = s.total_bytes.saturating_sub(s.used_bytes);
        s.peak_total_bytes = self
            .peak_reserved
            .load(Ordering::Relaxed)
            .max(s.total_bytes);
        s.peak_used_bytes = peak_used.min(s.peak_total_bytes);
        s.backend_allocs = self.backend_allocs.load(Ordering::Relaxed);
        s.backend_frees = self.backend_frees.load(Ordering::Relaxed);
        s.oom_retries = self.oom_retries.load(Ordering::Relaxed);
        s.stream_fences = self.fences_recorded.load(Ordering::Relaxed);
        s.fence_syncs = self.fence_waits.load(Ordering::Relaxed);
        s.holes_punched = self.holes_punched.load(Ordering::Relaxed);
        s.limit = self.limit();
        s
    }

    /// Bytes handed out (CuPy's `used_bytes`).
    pub fn used_bytes(&self) -> u64 {
        self.stats().used_bytes
    }

    /// Bytes reserved from the backend (CuPy's `total_bytes`).
    pub fn total_bytes(&self) -> u64 {
        self.stats().total_bytes
    }

    /// Cached bytes, `total - used` (CuPy's `free_bytes`).
    pub fn free_bytes(&self) -> u64 {
        self.stats().free_bytes
    }

    /// Free chunks in all arenas (CuPy's `n_free_blocks`).
    pub fn n_free_blocks(&self) -> u64 {
        self.stats().n_free_blocks
    }

    /// Resets both peaks to the current values.
    pub fn reset_peaks(&self) {
        let mut total = 0u64;
        for arena in self.arenas.iter() {
            let mut bins = arena.lock_unchanged();
            bins.counters.peak_used = bins.counters.used;
            total = total.saturating_add(bins.counters.reserved);
        }
        self.peak_reserved.store(total, Ordering::Relaxed);
    }
}
