//! How far a cubin or fatbin image says it extends: the driver's module loaders take
//! no length and read an image as far as its own headers say, so a safe load checks
//! that every byte the headers point at lies inside the slice it was given. A
//! truncated or inflated image is refused before it reaches the driver.
//!
//! What is checked: for a cubin (ELF64, little-endian, as every CUDA cubin is), the
//! program and section header tables and every section and segment they list (a
//! section of no bits excepted); for a fatbin, its header and the payload size the
//! header gives. What the driver makes of well-bounded bytes is its own parsing.

use crate::error::{ArgumentKind, Error, Result};

const ELF_CLASS_64: u8 = 2;
const ELF_DATA_LE: u8 = 1;
const ELF_HEADER_LEN: usize = 64;
const SHT_NOBITS: u32 = 8;
const FATBIN_HEADER_LEN: usize = 16;

/// `Ok` when every byte a cubin's headers refer to lies inside `image`.
pub(crate) fn check_cubin(image: &[u8]) -> Result<()> {
    let end = elf_extent(image).ok_or_else(|| malformed("cubin", image.len()))?;
    within("cubin", end, image.len())
}

/// As [`check_cubin`], for a fatbin.
pub(crate) fn check_fatbin(image: &[u8]) -> Result<()> {
    let end = fatbin_extent(image).ok_or_else(|| malformed("fatbin", image.len()))?;
    within("fatbin", end, image.len())
}

fn within(what: &str, end: u64, len: usize) -> Result<()> {
    if end > len as u64 {
        return Err(Error::invalid_argument(
            ArgumentKind::OutOfBounds {
                requested: end,
                available: len as u64,
            },
            format!(
                "the {what} image is truncated: its headers refer to {end} bytes but only \
                 {len} were given (the driver would read past the end)"
            ),
        ));
    }
    Ok(())
}

#[cold]
fn malformed(what: &str, len: usize) -> Error {
    Error::invalid_argument(
        ArgumentKind::InvalidValue,
        format!(
            "the {what} image ({len} bytes) has malformed headers (not a 64-bit \
             little-endian ELF, or sizes that overflow)"
        ),
    )
}

/// The `N` bytes at `at`, `None` past the image's end (or past `usize::MAX`: `at`
/// comes from the image's own fields).
fn bytes_at<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn u16_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u16::from_le_bytes(bytes_at(b, at)?).into())
}

fn u32_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u32::from_le_bytes(bytes_at(b, at)?).into())
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(bytes_at(b, at)?))
}

/// The end of a table of `n` entries of `size` bytes at `off`.
fn table_end(off: u64, n: u64, size: u64) -> Option<u64> {
    off.checked_add(n.checked_mul(size)?)
}

/// The last byte an ELF64 image's headers refer to, plus one; `None` when it is not a
/// 64-bit little-endian ELF whose tables can be read inside the image.
fn elf_extent(b: &[u8]) -> Option<u64> {
    if b.len() < ELF_HEADER_LEN || b[4] != ELF_CLASS_64 || b[5] != ELF_DATA_LE {
        return None;
    }
    let (phoff, shoff) = (u64_at(b, 0x20)?, u64_at(b, 0x28)?);
    let (phentsize, phnum) = (u16_at(b, 0x36)?, u16_at(b, 0x38)?);
    let (shentsize, mut shnum) = (u16_at(b, 0x3a)?, u16_at(b, 0x3c)?);
    let mut end = ELF_HEADER_LEN as u64;
    if phnum > 0 {
        if phentsize < 56 {
            return None;
        }
        end = end.max(table_end(phoff, phnum, phentsize)?);
    }
    if shoff != 0 {
        if shentsize < 64 {
            return None;
        }
        if shnum == 0 {
            // Extended numbering: section 0's size holds the count.
            shnum = u64_at(b, usize::try_from(shoff).ok()?.checked_add(0x20)?)?;
        }
        end = end.max(table_end(shoff, shnum, shentsize)?);
    }
    // The tables are inside the image from here on (or the caller refuses it).
    if end > b.len() as u64 {
        return Some(end);
    }
    for i in 0..phnum {
        let h = usize::try_from(phoff + i * phentsize).ok()?;
        end = end.max(u64_at(b, h + 8)?.checked_add(u64_at(b, h + 0x20)?)?);
    }
    for i in 0..if shoff != 0 { shnum } else { 0 } {
        let h = usize::try_from(shoff + i * shentsize).ok()?;
        if u32_at(b, h + 4)? != u64::from(SHT_NOBITS) {
            end = end.max(u64_at(b, h + 0x18)?.checked_add(u64_at(b, h + 0x20)?)?);
        }
    }
    Some(end)
}

/// The end of a fatbin: its header's size plus the payload size the header gives.
fn fatbin_extent(b: &[u8]) -> Option<u64> {
    if b.len() < FATBIN_HEADER_LEN {
        return Some(FATBIN_HEADER_LEN as u64);
    }
    let header = u16_at(b, 6)?;
    if header < FATBIN_HEADER_LEN as u64 {
        return None;
    }
    header.checked_add(u64_at(b, 8)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal ELF64 with one program header and two sections (one of no bits).
    fn elf() -> Vec<u8> {
        let mut b = vec![0u8; 64 + 56 + 2 * 64 + 32];
        b[..4].copy_from_slice(&[0x7f, b'E', b'L', b'F']);
        b[4] = ELF_CLASS_64;
        b[5] = ELF_DATA_LE;
        b[0x20..0x28].copy_from_slice(&64u64.to_le_bytes()); // phoff
        b[0x28..0x30].copy_from_slice(&120u64.to_le_bytes()); // shoff
        b[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        b[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        b[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        b[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        // The segment: 32 bytes at 248.
        b[64 + 8..64 + 16].copy_from_slice(&248u64.to_le_bytes());
        b[64 + 0x20..64 + 0x28].copy_from_slice(&32u64.to_le_bytes());
        // Section 0: the same 32 bytes; section 1: of no bits, "huge".
        b[120 + 0x18..120 + 0x20].copy_from_slice(&248u64.to_le_bytes());
        b[120 + 0x20..120 + 0x28].copy_from_slice(&32u64.to_le_bytes());
        b[184 + 4..184 + 8].copy_from_slice(&SHT_NOBITS.to_le_bytes());
        b[184 + 0x18..184 + 0x20].copy_from_slice(&0u64.to_le_bytes());
        b[184 + 0x20..184 + 0x28].copy_from_slice(&(1u64 << 40).to_le_bytes());
        b
    }

    #[test]
    fn a_whole_cubin_passes_and_every_truncation_is_refused() {
        let b = elf();
        assert_eq!(elf_extent(&b), Some(b.len() as u64));
        check_cubin(&b).unwrap();
        for n in 0..b.len() {
            assert!(check_cubin(&b[..n]).is_err(), "truncated to {n}");
        }
    }

    #[test]
    fn a_section_past_the_end_or_an_overflow_is_refused() {
        let mut b = elf();
        b[120 + 0x20..120 + 0x28].copy_from_slice(&33u64.to_le_bytes());
        let e = check_cubin(&b).unwrap_err();
        assert!(e.to_string().contains("truncated"), "{e}");
        b[120 + 0x20..120 + 0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check_cubin(&b).is_err());
        let mut b = elf();
        b[0x3c..0x3e].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(check_cubin(&b).is_err());
        let mut b = elf();
        b[4] = 1; // 32-bit
        assert!(check_cubin(&b).is_err());
    }

    #[test]
    fn a_table_offset_at_the_end_of_the_address_space_is_refused() {
        // Extended section numbering sends the reader to `shoff + 0x20`; an offset
        // near `usize::MAX` must be refused, not overflow.
        for shoff in [usize::MAX - 0x22, usize::MAX - 0x20, usize::MAX - 0x1a] {
            let mut b = elf();
            b[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
            b[0x3c..0x3e].copy_from_slice(&0u16.to_le_bytes());
            assert!(check_cubin(&b).is_err(), "shoff {shoff:#x}");
        }
        let b = [0u8; 4];
        assert_eq!(u16_at(&b, usize::MAX), None);
        assert_eq!(u32_at(&b, usize::MAX - 3), None);
        assert_eq!(u64_at(&b, usize::MAX - 1), None);
    }

    #[test]
    fn cubins_from_nvrtc_pass() {
        use crate::compiler::{Program, Target};
        let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }";
        // Without NVRTC there is nothing to compile (the GPU suite loads real ones).
        let Ok(c) = Program::new(src).compile(Target::cubin(90)) else {
            return;
        };
        check_cubin(&c.image).unwrap();
        assert!(check_cubin(&c.image[..c.image.len() - 1]).is_err());
    }

    #[test]
    fn a_fatbin_is_checked_against_its_header() {
        let mut b = vec![0u8; 16 + 100];
        b[..4].copy_from_slice(&[0x50, 0xED, 0x55, 0xBA]);
        b[6..8].copy_from_slice(&16u16.to_le_bytes());
        b[8..16].copy_from_slice(&100u64.to_le_bytes());
        check_fatbin(&b).unwrap();
        assert!(check_fatbin(&b[..115]).is_err());
        assert!(check_fatbin(&b[..10]).is_err());
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(check_fatbin(&b).is_err());
    }
}
