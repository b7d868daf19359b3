//! Hashes: a stable one for names and keys that are written to disk ([`Fnv128`]), and
//! a fast one for the kernel cache's in-memory map ([`WordHasher`]).

/// FNV-1a, 128 bits: a stable hash (the same in every build and process).
#[derive(Debug, Clone, Copy)]
pub struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    /// A fresh hash.
    pub const fn new() -> Fnv128 {
        Fnv128(Self::OFFSET)
    }

    /// Hashes `bytes` in.
    pub fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u128::from(b);
            h = h.wrapping_mul(Self::PRIME);
        }
        self.0 = h;
    }

    /// Hashes in `bytes` preceded by their length, so fields cannot run together.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    /// The hash, big-endian.
    pub const fn finish(&self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl Default for Fnv128 {
    fn default() -> Self {
        Self::new()
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
    fn fnv128_matches_reference_vectors() {
        assert_eq!(
            Fnv128::new().finish(),
            0x6c62272e07bb014262b821756295c58du128.to_be_bytes()
        );
        let mut h = Fnv128::new();
        h.write(b"a");
        assert_eq!(
            h.finish(),
            0xd228cb696f1a8caf78912b704e4a8964u128.to_be_bytes()
        );
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
