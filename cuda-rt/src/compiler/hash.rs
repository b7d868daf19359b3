//! A stable hash for names and keys that are written to disk.

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
}
