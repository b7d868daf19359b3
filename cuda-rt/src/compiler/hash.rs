//! Hashes: a stable one for names and keys that are written to disk ([`StableHash`]),
//! and a fast one for the kernel cache's in-memory map ([`WordHasher`]).

/// The stable hash of names and keys written to disk: BLAKE3, its output cut to 128
/// bits. The same
/// in every build, process and machine; collision-resistant, so two programs never
/// share a cache key by accident.
#[derive(Debug, Clone)]
pub struct StableHash(blake3::Hasher);

impl StableHash {
    /// Length of the hash, in bytes.
    pub const LEN: usize = 16;

    /// A fresh hash.
    pub fn new() -> StableHash {
        StableHash(blake3::Hasher::new())
    }

    /// Hashes `bytes` in.
    pub fn write(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    /// Hashes in `bytes` preceded by their length, so fields cannot run together.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    /// The hash: the first [`StableHash::LEN`] bytes of BLAKE3's output.
    pub fn finish(&self) -> [u8; StableHash::LEN] {
        let mut out = [0u8; StableHash::LEN];
        out.copy_from_slice(&self.0.finalize().as_bytes()[..StableHash::LEN]);
        out
    }
}

impl Default for StableHash {
    fn default() -> Self {
        Self::new()
    }
}

const HEX_DIGITS: &[u8; 16] = b"0123456789abcdef";

/// `bytes` in lowercase hex, in one allocation (the kernel cache names a file this way
/// on every disk lookup; `format!` per byte cost more than the lookup's `open`).
pub fn hex(bytes: &[u8]) -> String {
    let mut s = String::with_capacity(2 * bytes.len());
    for b in bytes {
        s.push(char::from(HEX_DIGITS[usize::from(b >> 4)]));
        s.push(char::from(HEX_DIGITS[usize::from(b & 15)]));
    }
    s
}

/// `bytes` in lowercase hex (ASCII) into the start of `out`, two digits a byte, as
/// far as `out` reaches: no allocation.
pub fn hex_to(out: &mut [u8], bytes: &[u8]) {
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = HEX_DIGITS[usize::from(b >> 4)];
        pair[1] = HEX_DIGITS[usize::from(b & 15)];
    }
}

/// A fast, non-cryptographic hasher that eats eight bytes per step (FxHash's
/// multiply-rotate): the in-memory kernel cache hashes a whole CUDA source per lookup,
/// where SipHash's byte-level rounds cost more than the driver call the cache saves.
/// Not collision-resistant and not meant to be: every hit is confirmed by comparing
/// the full key, so a collision (even a contrived one) only lengthens a bucket.
#[derive(Debug, Clone, Copy, Default)]
pub struct WordHasher(u64);

impl WordHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl std::hash::Hasher for WordHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            // The length goes in with the tail so "a\0" and "a" differ.
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(u64::from(i));
    }

    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }

    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_hash_is_blake3_cut_to_128_bits() {
        // BLAKE3's reference vectors (the empty input; "abc"), first 16 bytes.
        let hex = |b: [u8; 16]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        assert_eq!(
            hex(StableHash::new().finish()),
            "af1349b9f5f9a1a6a0404dea36dcc949"
        );
        let mut h = StableHash::new();
        h.write(b"a");
        h.write(b"bc");
        assert_eq!(hex(h.finish()), "6437b3ac38465133ffb63b75273a8db5");
        // Fields are length-prefixed: ["ab"] is not ["a", "b"].
        let (mut one, mut two) = (StableHash::new(), StableHash::new());
        one.field(b"ab");
        two.field(b"a");
        two.field(b"b");
        assert_ne!(one.finish(), two.finish());
    }

    #[test]
    fn word_hasher_sees_every_byte_and_the_tail_length() {
        use std::hash::Hasher;
        let h = |b: &[u8]| {
            let mut w = WordHasher::default();
            w.write(b);
            w.finish()
        };
        let src = b"extern \"C\" __global__ void k(int a) {}";
        for i in 0..src.len() {
            let mut other = src.to_vec();
            other[i] ^= 1;
            assert_ne!(h(src), h(&other), "byte {i}");
        }
        assert_ne!(h(b"a"), h(b"a\0"));
    }
}
