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

/// [`copy_raw`] with stores that go around the caches (x86-64 non-temporal stores),
/// for a destination that no CPU reads soon: one too large to be in the cache when it
/// is read (a large device-to-host copy's). A plain store first reads each destination
/// line into the cache (and later writes it back), so a plain copy moves three bytes
/// over the memory bus for every byte copied; a streaming copy moves two. Other
/// targets copy plainly.
///
/// Contract: as [`copy_raw`]. The stores are fenced before this returns, so whoever
/// learns that the copy is over (through the latch's release) sees every byte.
#[cfg(target_arch = "x86_64")]
pub(crate) fn copy_raw_streaming(dst: usize, src: usize, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    const LINE: usize = 64;
    const LANE: usize = 16;
    // Plain up to the first whole destination line, streaming whole lines, plain tail.
    let head = (dst.next_multiple_of(LINE) - dst).min(len);
    copy_raw(dst, src, head);
    let (d, s) = (dst + head, src + head);
    let body = (len - head) / LINE * LINE;
    let mut at = 0;
    while at < body {
        // SAFETY: `at..at + LINE` lies inside `head..len` of both ranges (valid and
        // unshared by the contract); the loads are unaligned loads, the stores go to
        // 16-byte-aligned addresses (`d` is line aligned); SSE2 is part of x86-64.
        unsafe {
            let (from, to) = ((s + at) as *const __m128i, (d + at) as *mut __m128i);
            let a = _mm_loadu_si128(from);
            let b = _mm_loadu_si128(from.byte_add(LANE));
            let c = _mm_loadu_si128(from.byte_add(2 * LANE));
            let e = _mm_loadu_si128(from.byte_add(3 * LANE));
            _mm_stream_si128(to, a);
            _mm_stream_si128(to.byte_add(LANE), b);
            _mm_stream_si128(to.byte_add(2 * LANE), c);
            _mm_stream_si128(to.byte_add(3 * LANE), e);
        }
        at += LINE;
    }
    copy_raw(d + body, s + body, len - head - body);
    // Non-temporal stores are weakly ordered: fence them before the copy is reported
    // done (and the DMA that reads them is queued).
    // SAFETY: SSE is part of x86-64; a fence has no other requirement.
    unsafe { _mm_sfence() };
}

/// [`copy_raw`]: no streaming stores on this target.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub(crate) fn copy_raw_streaming(dst: usize, src: usize, len: usize) {
    copy_raw(dst, src, len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_copies_are_byte_exact_at_every_alignment_and_length() {
        let src: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
        for dst_off in [0usize, 1, 15, 16, 33, 63, 64] {
            for src_off in [0usize, 1, 7, 16] {
                for len in [0usize, 1, 15, 63, 64, 65, 127, 128, 1000, 3000] {
                    let mut dst = vec![0xAAu8; 4096 + 128];
                    let (d, s) = (&mut dst[dst_off..], &src[src_off..]);
                    copy_raw_streaming(d.as_mut_ptr() as usize, s.as_ptr() as usize, len);
                    assert_eq!(&d[..len], &s[..len], "dst+{dst_off} src+{src_off} {len}");
                    assert!(
                        d[len..].iter().all(|&b| b == 0xAA),
                        "nothing past the end: dst+{dst_off} src+{src_off} {len}"
                    );
                    assert!(dst[..dst_off].iter().all(|&b| b == 0xAA));
                }
            }
        }
    }
}
