//! What can go wrong in a [`Pool`]: [`MallocError`] (out of memory is the crate's
//! [`OutOfMemory`], with the figures of the pool at the time), [`FreeError`] (which
//! hands the refused block back), and the texts for the bookkeeping limits.
//!
//! [`Pool`]: super::Pool

use std::error::Error as StdError;
use std::fmt;

use super::Block;
use crate::error::OutOfMemory;

/// Why [`Pool::malloc`](super::Pool::malloc) failed.
#[derive(Debug)]
pub enum MallocError {
    /// Out of memory after releasing the cache and retrying: the crate's one
    /// out-of-memory type, with the pool's figures, what refused (the limit, or the
    /// backend and the driver's error it gave), and `device` left `None` (the pool
    /// does not know where its memory lives; the device pool's front fills it in).
    /// Boxed, so that a malloc's `Result` stays small.
    OutOfMemory(Box<OutOfMemory>),
    /// The backend failed for another reason (not retried).
    Backend(Box<dyn StdError + Send + Sync + 'static>),
    /// The pool's bookkeeping is full: `u32` indices name arenas and the chunks of
    /// one arena, so a pool tracks at most about 4.29 billion stream keys and as many
    /// chunks per arena (hundreds of GiB of records before that). Not retried; the
    /// string says which limit.
    TooMany(&'static str),
}

impl fmt::Display for MallocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MallocError::OutOfMemory(e) => e.fmt(f),
            MallocError::Backend(e) => write!(f, "the pool's backend failed: {e}"),
            MallocError::TooMany(what) => write!(f, "the pool cannot track more {what}"),
        }
    }
}

impl StdError for MallocError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        match self {
            MallocError::OutOfMemory(e) => Some(&**e),
            MallocError::Backend(e) => Some(&**e),
            MallocError::TooMany(_) => None,
        }
    }
}

pub(super) const TOO_MANY_ARENAS: &str = "stream keys (arenas): 4,294,967,232 is the most";
pub(super) const TOO_MANY_CHUNKS: &str = "chunks in one arena: 4,294,967,294 is the most";

/// Why [`Pool::free`] refused a block. The block is handed back unchanged
/// ([`into_block`](FreeError::into_block)), so memory from another pool can still be
/// given to its own pool.
///
/// [`Pool::free`]: super::Pool::free
#[derive(Debug)]
pub enum FreeError {
    /// The block came from another pool.
    OtherPool(Block),
    /// The block names no chunk handed out by this pool (a block that was already
    /// freed, or one not made by this pool). Blocks cannot be copied, so safe code
    /// only gets here through a bug in the pool.
    NotLive(Block),
}

impl FreeError {
    /// The refused block.
    pub fn block(&self) -> &Block {
        match self {
            FreeError::OtherPool(b) | FreeError::NotLive(b) => b,
        }
    }

    /// The refused block, to give to its own pool.
    pub fn into_block(self) -> Block {
        match self {
            FreeError::OtherPool(b) | FreeError::NotLive(b) => b,
        }
    }
}

impl fmt::Display for FreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.block();
        write!(
            f,
            "cannot free the block at {:#x} ({} bytes, stream key {}): ",
            b.addr, b.size, b.key
        )?;
        match self {
            FreeError::OtherPool(_) => {
                f.write_str("it belongs to another pool; free it with the pool it came from")
            }
            FreeError::NotLive(_) => {
                f.write_str("it is not a live block of this pool (already freed?)")
            }
        }
    }
}

impl StdError for FreeError {}
