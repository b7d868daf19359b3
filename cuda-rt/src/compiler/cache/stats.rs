//! The kernel cache's statistics: [`KernelCacheStats`], a snapshot of its counters.

use std::sync::atomic::Ordering;

use super::KernelCache;

/// What a [`KernelCache`] has done since it was made: how often each part answered,
/// how often NVRTC ran, and what went wrong with the disk part. A low `compiles`
/// against many `disk_hits` is a warm disk cache; `corrupt_files` or
/// `disk_write_failures` above 0 say the folder deserves a look. Each counter is read
/// on its own, so under concurrent compiles the figures may be a few calls apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCacheStats {
    /// Times this cache ran NVRTC's compiler.
    pub compiles: u64,
    /// Compiles the disk part answered (the image was read back, NVRTC did not run).
    pub disk_hits: u64,
    /// Modules the memory part answered (no compile, no module load).
    pub memory_hits: u64,
    /// Disk files found unusable (truncated, corrupt, a tag that does not verify, a
    /// link or a file not the user's...) and rewritten.
    pub corrupt_files: u64,
    /// Disk writes that failed (the cache then works from memory).
    pub disk_write_failures: u64,
}

impl KernelCache {
    /// The cache's statistics so far.
    pub fn stats(&self) -> KernelCacheStats {
        KernelCacheStats {
            compiles: self.compiles.load(Ordering::Relaxed),
            disk_hits: self.disk_hits.load(Ordering::Relaxed),
            memory_hits: self.memory_hits.load(Ordering::Relaxed),
            corrupt_files: self.disk_misses_corrupt.load(Ordering::Relaxed),
            disk_write_failures: self.disk_write_failures.load(Ordering::Relaxed),
        }
    }
}
