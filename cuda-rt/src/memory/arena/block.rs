//! What a [`Pool`] hands out: the [`Block`] token, and its crate-internal forms as
//! plain integers ([`RawBlock`]) and in relaxed atomics ([`AtomicBlock`]).
//!
//! [`Pool`]: super::Pool

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::bins::NIL;

/// Memory handed out by a [`Pool`]: a token to give back with [`Pool::free`]. Not
/// `Clone` (a chunk is freed once); dropping it without `free` leaks the chunk (see
/// the module doc). Plain integers, so `Send + Sync`.
///
/// [`Pool`]: super::Pool
/// [`Pool::free`]: super::Pool::free
#[must_use = "a Block must be given back with Pool::free, or its chunk stays in use"]
pub struct Block {
    pub(super) addr: u64,
    pub(super) size: u64,
    pub(super) key: u64,
    /// Id of the pool it came from (0 for the null block).
    pub(super) pool: u64,
    /// Index of the chunk record in its arena's slab.
    pub(super) chunk: u32,
    /// Index of its arena in the pool's table.
    pub(super) arena: u32,
}

impl Block {
    /// The null block of `malloc(0)`.
    pub(super) fn null(key: u64) -> Block {
        Block {
            addr: 0,
            size: 0,
            key,
            pool: 0,
            chunk: NIL,
            arena: u32::MAX,
        }
    }

    /// Start address (0 for the null block).
    #[inline]
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Size in bytes, rounded up to [`ALLOCATION_UNIT`] (0 for the null block).
    ///
    /// [`ALLOCATION_UNIT`]: super::ALLOCATION_UNIT
    #[inline]
    pub fn size(&self) -> usize {
        self.size as usize
    }

    /// The stream key of the arena the block came from (and goes back to).
    #[inline]
    pub fn stream_key(&self) -> u64 {
        self.key
    }

    /// `true` for the size-0 block of `malloc(0)`.
    #[inline]
    pub fn is_null(&self) -> bool {
        self.size == 0
    }
}

/// A [`Block`] as plain integers, for an owner that keeps its block in atomics (the
/// pool front refills recycled memory objects through `&self`). Crate-internal: a
/// `RawBlock` turns back into a block only through the pool it came from
/// ([`Pool::block_from_raw`](super::Pool::block_from_raw)), once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawBlock {
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) key: u64,
    pub(crate) chunk: u32,
    pub(crate) arena: u32,
}

/// A [`RawBlock`] in relaxed atomics (plain loads and stores on every target): how
/// recycled memory objects and parking slots hold a block, so that they can be
/// emptied and refilled through `&self` (no `Arc::get_mut`, an atomic
/// read-modify-write). Whoever writes one makes sure nothing reads it meanwhile.
#[derive(Debug, Default)]
pub(crate) struct AtomicBlock {
    addr: AtomicU64,
    /// 0: no block.
    size: AtomicU64,
    key: AtomicU64,
    /// `chunk | arena << 32`.
    loc: AtomicU64,
}

impl AtomicBlock {
    /// An empty one (size 0).
    pub(crate) fn empty() -> Self {
        Self::default()
    }

    /// Holds `raw` from now on.
    #[inline]
    pub(crate) fn store(&self, raw: RawBlock) {
        self.addr.store(raw.addr, Ordering::Relaxed);
        self.size.store(raw.size, Ordering::Relaxed);
        self.key.store(raw.key, Ordering::Relaxed);
        let loc = u64::from(raw.chunk) | u64::from(raw.arena) << 32;
        self.loc.store(loc, Ordering::Relaxed);
    }

    /// The block held (size 0 when empty).
    #[inline]
    pub(crate) fn load(&self) -> RawBlock {
        let loc = self.loc.load(Ordering::Relaxed);
        RawBlock {
            addr: self.addr(),
            size: self.size(),
            key: self.key.load(Ordering::Relaxed),
            chunk: loc as u32,
            arena: (loc >> 32) as u32,
        }
    }

    /// The block taken out (`None` when empty); empty afterwards.
    #[inline]
    pub(crate) fn take(&self) -> Option<RawBlock> {
        let raw = self.load();
        if raw.size == 0 {
            return None;
        }
        self.size.store(0, Ordering::Relaxed);
        Some(raw)
    }

    #[inline]
    pub(crate) fn addr(&self) -> u64 {
        self.addr.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn size(&self) -> u64 {
        self.size.load(Ordering::Relaxed)
    }

    #[inline]
    pub(crate) fn key(&self) -> u64 {
        self.key.load(Ordering::Relaxed)
    }

    /// The arena index of the block held.
    #[inline]
    pub(crate) fn arena(&self) -> u32 {
        (self.loc.load(Ordering::Relaxed) >> 32) as u32
    }
}

impl Block {
    /// The block as integers (its pool is the owner's to remember).
    #[inline]
    pub(crate) fn into_raw(self) -> RawBlock {
        RawBlock {
            addr: self.addr,
            size: self.size,
            key: self.key,
            chunk: self.chunk,
            arena: self.arena,
        }
    }
}

impl fmt::Debug for Block {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Block")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("size", &self.size)
            .field("stream_key", &self.key)
            .finish()
    }
}
