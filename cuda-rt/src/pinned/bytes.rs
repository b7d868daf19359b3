//! Byte views, typed views and raw host copies over pinned memory: plain Rust over
//! addresses that the pinned types own and keep valid (each function's contract says
//! what they promise), no driver call.

use crate::memory::Pod;

/// A shared byte view of `len` bytes at `addr`, borrowed from `owner`.
///
/// Contract (the pinned types keep it): `addr..addr+len` lies inside memory that
/// `owner` keeps alive and that nothing writes (no `&mut` view, no copy in flight)
/// while the view lives.
#[inline]
pub(crate) fn bytes<O: ?Sized>(_owner: &O, addr: u64, len: usize) -> &[u8] {
    if len == 0 {
        return &[];
    }
    // SAFETY: by the contract above, the range is live, readable memory owned by
    // `owner`, not written while the returned borrow of `owner` lives.
    unsafe { std::slice::from_raw_parts(addr as usize as *const u8, len) }
}

/// A mutable byte view of `len` bytes at `addr`, borrowed from `owner`.
///
/// Contract: as [`bytes`], and no other view of the range exists while it lives.
#[inline]
pub(crate) fn bytes_mut<O: ?Sized>(_owner: &mut O, addr: u64, len: usize) -> &mut [u8] {
    if len == 0 {
        return &mut [];
    }
    // SAFETY: by the contract above, the range is live, writable and unaliased for
    // the returned borrow of `owner`.
    unsafe { std::slice::from_raw_parts_mut(addr as usize as *mut u8, len) }
}

/// `bytes` viewed as `T`s: `None` unless the start is aligned for `T` and the length
/// a multiple of its size. `T: Pod` has no invalid bit patterns.
#[inline]
pub(crate) fn typed<T: Pod>(b: &[u8]) -> Option<&[T]> {
    // SAFETY: `T` is plain data (`Pod`, an unsafe trait: no padding, every bit
    // pattern is a valid `T`).
    let (head, mid, tail) = unsafe { b.align_to::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// Mutable version of [`typed`].
#[inline]
pub(crate) fn typed_mut<T: Pod>(b: &mut [u8]) -> Option<&mut [T]> {
    // SAFETY: as in `typed`; any value written through `T` is valid bytes.
    let (head, mid, tail) = unsafe { b.align_to_mut::<T>() };
    (head.is_empty() && tail.is_empty()).then_some(mid)
}

/// Copies `len` bytes from `src` to `dst` (host addresses), for the staging workers.
///
/// Contract: both ranges are valid for `len` bytes, do not overlap, and nothing else
/// reads `dst` or writes either range during the copy (the staging engine waits for
/// every such copy before the borrows it came from end).
#[inline]
pub(crate) fn copy_raw(dst: usize, src: usize, len: usize) {
    if len == 0 {
        return;
    }
    // SAFETY: by the contract above.
    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len) }
}
