//! Plain data that may be copied between host slices and device memory byte for byte.
//!
//! [`Pod`] marks types with no padding, no pointers and no invalid bit patterns, so a
//! device-to-host copy can fill a `&mut [T]` with whatever bytes the device holds.
//! Half-precision numbers ([`F16`], [`Bf16`]) are small `#[repr(transparent)]` wrappers
//! of their bits, with exact conversions to `f32` and rounding conversions from it.
//! With the `half` feature, `half::f16` and `half::bf16` are `Pod` and kernel
//! arguments too, and convert to and from [`F16`] / [`Bf16`] bit for bit.
//!
//! With the `bytemuck` feature, a type that derives (or implements) `bytemuck::Pod`
//! becomes `Pod` and a kernel argument with one safe line, `impl BytemuckPod for
//! Particle {}` (see `BytemuckPod`), and [`F16`] / [`Bf16`] are `bytemuck::Pod`, so
//! structs holding them can derive it.

/// Plain old data: any bit pattern is a valid value, no padding bytes, no pointers.
///
/// # Safety
/// Implement only for types for which every bit pattern of `size_of::<Self>()` bytes
/// is a valid value and which have no padding (a `#[repr(C)]` or
/// `#[repr(transparent)]` struct of `Pod` fields with no gaps qualifies).
pub unsafe trait Pod: Copy + Send + Sync + 'static {}

macro_rules! impl_pod {
    ($($t:ty),* $(,)?) => {$(
        // SAFETY: a primitive integer or float: no padding, every bit pattern valid.
        unsafe impl Pod for $t {}
    )*};
}
impl_pod!(u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64);

// SAFETY: an array of `Pod` has no padding between elements and every element is any
// bit pattern.
unsafe impl<T: Pod, const N: usize> Pod for [T; N] {}

/// With the `bytemuck` feature: a `bytemuck::Pod` type that is [`Pod`] (a buffer
/// element) and [`PlainData`](crate::launch::PlainData) (a kernel argument by value)
/// through `bytemuck`'s promise, without an `unsafe impl`:
///
/// ```
/// # #[cfg(feature = "bytemuck")] {
/// #[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
/// #[repr(C)]
/// struct Particle {
///     position: [f32; 3],
///     mass: f32,
/// }
/// impl cuda_rt::memory::BytemuckPod for Particle {}
///
/// fn element<T: cuda_rt::memory::Pod>() {}
/// fn by_value<T: cuda_rt::launch::PlainData>() {}
/// element::<Particle>(); // DeviceBuffer<Particle>, PinnedBuffer<Particle>, ...
/// by_value::<Particle>(); // a kernel's `Particle p` parameter
/// # }
/// ```
///
/// Why a marker and not every `bytemuck::Pod` type at once: a blanket impl over
/// `bytemuck::Pod` overlaps this crate's impls for the primitives (which are
/// `bytemuck::Pod` too) and, for kernel arguments, its impls for `bool` and raw pointers
/// (which the compiler must assume `bytemuck` may make `Pod` one day). Replacing those
/// impls when the feature is on would make the feature take things away (an array of a
/// type with a hand-written `Pod` impl would stop being `Pod`; a type with both impls
/// would stop compiling) in crates that never asked for it, since Cargo turns a
/// feature on for the whole build. A marker only this crate's users implement, for
/// their own types, overlaps nothing: turning the feature on changes no other type.
/// A type implements either this marker or [`Pod`] by hand, not both.
#[cfg(feature = "bytemuck")]
pub trait BytemuckPod: bytemuck::Pod + Send + Sync {}

// SAFETY: `bytemuck::Pod` promises what `Pod` asks: every bit pattern is a valid value
// and there is no padding (nor pointer); `Send + Sync + 'static + Copy` are required by
// the marker and by `bytemuck::Pod`.
#[cfg(feature = "bytemuck")]
unsafe impl<T: BytemuckPod> Pod for T {}

// `F16` and `Bf16` for `bytemuck`, so that structs holding them can derive its traits.
#[cfg(feature = "bytemuck")]
mod bytemuck_impls {
    // SAFETY: `#[repr(transparent)]` over `u16`: all zeros is +0.0.
    unsafe impl bytemuck::Zeroable for super::F16 {}
    // SAFETY: `#[repr(transparent)]` over `u16`: no padding, every bit pattern a value.
    unsafe impl bytemuck::Pod for super::F16 {}
    // SAFETY: as above.
    unsafe impl bytemuck::Zeroable for super::Bf16 {}
    // SAFETY: as above.
    unsafe impl bytemuck::Pod for super::Bf16 {}
}

/// The bytes of a slice of plain data.
#[inline]
pub(crate) fn as_bytes<T: Pod>(s: &[T]) -> &[u8] {
    // SAFETY: `T: Pod` has no padding, so all `size_of_val(s)` bytes are initialised;
    // the view borrows `s` and `u8` has alignment 1.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of plain data.
#[inline]
pub(crate) fn as_bytes_mut<T: Pod>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as in `as_bytes`; any bytes written are a valid `T` (`Pod`: every bit
    // pattern is a value), and the view borrows `s` mutably.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast::<u8>(), std::mem::size_of_val(s)) }
}

/// IEEE 754 binary16 (`half`, CUDA's `__half`), stored as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct F16(pub u16);

/// bfloat16 (CUDA's `__nv_bfloat16`): the upper half of an `f32`, stored as its bits.
#[repr(transparent)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bf16(pub u16);

// SAFETY: `#[repr(transparent)]` over `u16`.
unsafe impl Pod for F16 {}
// SAFETY: `#[repr(transparent)]` over `u16`.
unsafe impl Pod for Bf16 {}

// The `half` crate's types, with the `half` feature: the same layout as `F16`/`Bf16`.
#[cfg(feature = "half")]
mod half_types {
    // SAFETY: `half::f16` is `#[repr(transparent)]` over `u16`: no padding, every bit
    // pattern a value.
    unsafe impl super::Pod for half::f16 {}
    // SAFETY: `half::bf16` is `#[repr(transparent)]` over `u16`, as above.
    unsafe impl super::Pod for half::bf16 {}

    impl From<half::f16> for super::F16 {
        fn from(v: half::f16) -> Self {
            super::F16(v.to_bits())
        }
    }
    impl From<super::F16> for half::f16 {
        fn from(v: super::F16) -> Self {
            half::f16::from_bits(v.0)
        }
    }
    impl From<half::bf16> for super::Bf16 {
        fn from(v: half::bf16) -> Self {
            super::Bf16(v.to_bits())
        }
    }
    impl From<super::Bf16> for half::bf16 {
        fn from(v: super::Bf16) -> Self {
            half::bf16::from_bits(v.0)
        }
    }
}

impl F16 {
    /// The value with these bits.
    pub const fn from_bits(bits: u16) -> Self {
        F16(bits)
    }

    /// The bits.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// The nearest half (ties to even); overflow gives infinity, NaN stays NaN.
    pub fn from_f32(v: f32) -> Self {
        let x = v.to_bits();
        let sign = ((x >> 16) & 0x8000) as u16;
        let exp = ((x >> 23) & 0xff) as i32;
        let man = x & 0x007f_ffff;
        if exp == 0xff {
            // Inf or NaN (keep a quiet NaN bit).
            let nan = if man != 0 { 0x0200 } else { 0 };
            return F16(sign | 0x7c00 | nan);
        }
        let e = exp - 127 + 15;
        if e >= 0x1f {
            return F16(sign | 0x7c00);
        }
        if e <= 0 {
            // Subnormal half or zero.
            if e < -10 {
                return F16(sign);
            }
            let m = man | 0x0080_0000;
            let shift = (14 - e) as u32;
            let half = 1u32 << (shift - 1);
            let rest = m & ((1u32 << shift) - 1);
            let mut h = m >> shift;
            if rest > half || (rest == half && (h & 1) == 1) {
                h += 1;
            }
            return F16(sign | h as u16);
        }
        let mut h = ((e as u32) << 10) | (man >> 13);
        let rest = man & 0x1fff;
        if rest > 0x1000 || (rest == 0x1000 && (h & 1) == 1) {
            h += 1; // may carry into the exponent, up to infinity: still correct
        }
        F16(sign | h as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        let h = u32::from(self.0);
        let sign = (h & 0x8000) << 16;
        let exp = (h >> 10) & 0x1f;
        let man = h & 0x3ff;
        let bits = match exp {
            0 if man == 0 => sign,
            0 => {
                // Subnormal: normalise.
                let mut e = 127 - 15 + 1;
                let mut m = man;
                while m & 0x400 == 0 {
                    m <<= 1;
                    e -= 1;
                }
                sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
            }
            0x1f => sign | 0x7f80_0000 | (man << 13),
            _ => sign | ((exp + 127 - 15) << 23) | (man << 13),
        };
        f32::from_bits(bits)
    }
}

impl Bf16 {
    /// The value with these bits.
    pub const fn from_bits(bits: u16) -> Self {
        Bf16(bits)
    }

    /// The bits.
    pub const fn to_bits(self) -> u16 {
        self.0
    }

    /// The nearest bfloat16 (ties to even); NaN stays NaN.
    pub fn from_f32(v: f32) -> Self {
        let x = v.to_bits();
        if v.is_nan() {
            return Bf16(((x >> 16) as u16) | 0x0040);
        }
        let round = 0x7fff + ((x >> 16) & 1);
        Bf16((x.wrapping_add(round) >> 16) as u16)
    }

    /// The exact `f32` value.
    pub fn to_f32(self) -> f32 {
        f32::from_bits(u32::from(self.0) << 16)
    }
}

impl From<F16> for f32 {
    fn from(v: F16) -> f32 {
        v.to_f32()
    }
}

impl From<Bf16> for f32 {
    fn from(v: Bf16) -> f32 {
        v.to_f32()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_pod<T: Pod>() {}

    #[test]
    fn primitives_arrays_and_halves_are_pod() {
        assert_pod::<u8>();
        assert_pod::<f64>();
        assert_pod::<[f32; 4]>();
        assert_pod::<[[i16; 2]; 3]>();
        assert_pod::<F16>();
        assert_pod::<Bf16>();
        assert_eq!(std::mem::size_of::<F16>(), 2);
        assert_eq!(std::mem::size_of::<Bf16>(), 2);
    }

    #[cfg(feature = "bytemuck")]
    #[test]
    fn a_bytemuck_pod_struct_is_pod_through_the_marker() {
        #[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
        #[repr(C)]
        struct Sample {
            value: F16,
            scale: Bf16,
            count: u32,
        }
        impl BytemuckPod for Sample {}
        assert_pod::<Sample>();
        assert_pod::<[Sample; 4]>();
        let s = [Sample {
            value: F16::from_f32(1.5),
            scale: Bf16::from_f32(-2.0),
            count: 7,
        }];
        // Our byte view and bytemuck's agree, and the bytes read back whole.
        assert_eq!(as_bytes(&s), bytemuck::cast_slice::<Sample, u8>(&s));
        let mut back = [<Sample as bytemuck::Zeroable>::zeroed()];
        as_bytes_mut(&mut back).copy_from_slice(as_bytes(&s));
        assert_eq!(back, s);
    }

    #[test]
    fn f16_round_trips_known_values() {
        for (v, bits) in [
            (0.0f32, 0x0000u16),
            (-0.0, 0x8000),
            (1.0, 0x3c00),
            (-2.0, 0xc000),
            (0.5, 0x3800),
            (65504.0, 0x7bff),
            (f32::INFINITY, 0x7c00),
            (6.103_515_6e-5, 0x0400), // smallest normal
            (5.960_464_5e-8, 0x0001), // smallest subnormal
        ] {
            assert_eq!(F16::from_f32(v).to_bits(), bits, "{v}");
            assert_eq!(F16::from_bits(bits).to_f32(), v, "{bits:#x}");
        }
        assert_eq!(F16::from_f32(1e6).to_bits(), 0x7c00);
        assert!(F16::from_f32(f32::NAN).to_f32().is_nan());
        // 1 + 2^-11 is halfway between 1 and the next half: ties to even (down).
        assert_eq!(F16::from_f32(1.0 + 2f32.powi(-11)).to_bits(), 0x3c00);
        assert_eq!(F16::from_f32(1.0 + 3.0 * 2f32.powi(-11)).to_bits(), 0x3c02);
    }

    #[test]
    fn every_f16_converts_to_f32_and_back_exactly() {
        for bits in 0..=u16::MAX {
            let h = F16::from_bits(bits);
            let f = h.to_f32();
            if f.is_nan() {
                continue;
            }
            assert_eq!(F16::from_f32(f).to_bits(), bits, "{bits:#x}");
        }
    }

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(Bf16::from_f32(1.0).to_bits(), 0x3f80);
        assert_eq!(Bf16::from_f32(-3.0).to_f32(), -3.0);
        assert_eq!(Bf16::from_f32(1.0 + 2f32.powi(-8)).to_bits(), 0x3f80);
        assert_eq!(Bf16::from_f32(1.0 + 3.0 * 2f32.powi(-8)).to_bits(), 0x3f82);
        assert!(Bf16::from_f32(f32::NAN).to_f32().is_nan());
    }
}
