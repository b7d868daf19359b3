//! NVTX ranges and marks (CuPy's `cupy.cuda.nvtx`): annotations that Nsight Systems
//! shows on the timeline. Without a tool attached every call returns at once.
//!
//! The calls go through NVTX v3's own C implementation (vendored headers, compiled into
//! this crate), so a tool is found exactly as for a C program: through
//! `NVTX_INJECTION64_PATH`, which `nsys` sets.

use std::ffi::{CStr, CString};
use std::marker::PhantomData;

use crate::error::{ArgumentKind, Error, Result};

/// An NVTX color, `0xAARRGGBB`. Any `u32` converts into one, so
/// `range_push_color("x", 0xFF00FF00)` and `range_push_color("x", Color::GREEN)` agree.
///
/// ```
/// use cuda_rt::profiler::Color;
///
/// assert_eq!(Color::rgb(0, 255, 0), Color::GREEN);
/// assert_eq!(Color::from(0xFF0000FF).to_argb(), Color::BLUE.to_argb());
/// assert_eq!(Color::from_id(7), Color::from_id(0)); // the palette repeats
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Color(u32);

impl Color {
    /// Opaque green.
    pub const GREEN: Color = Color(0xFF00_FF00);
    /// Opaque blue.
    pub const BLUE: Color = Color(0xFF00_00FF);
    /// Opaque yellow.
    pub const YELLOW: Color = Color(0xFFFF_FF00);
    /// Opaque magenta.
    pub const MAGENTA: Color = Color(0xFFFF_00FF);
    /// Opaque cyan.
    pub const CYAN: Color = Color(0xFF00_FFFF);
    /// Opaque red.
    pub const RED: Color = Color(0xFFFF_0000);
    /// Opaque white.
    pub const WHITE: Color = Color(0xFFFF_FFFF);

    /// CuPy's `id_color` palette, in order: green, blue, yellow, magenta, cyan, red,
    /// white.
    pub const PALETTE: [Color; 7] = [
        Color::GREEN,
        Color::BLUE,
        Color::YELLOW,
        Color::MAGENTA,
        Color::CYAN,
        Color::RED,
        Color::WHITE,
    ];

    /// A color from its `0xAARRGGBB` value.
    pub const fn argb(argb: u32) -> Color {
        Color(argb)
    }

    /// An opaque color from red, green and blue.
    pub const fn rgb(r: u8, g: u8, b: u8) -> Color {
        Color(0xFF00_0000 | (r as u32) << 16 | (g as u32) << 8 | b as u32)
    }

    /// The `id`-th color of [`Color::PALETTE`], cycling (CuPy's `id_color`): handy to
    /// tell ranges apart by an index.
    pub const fn from_id(id: u32) -> Color {
        Color::PALETTE[id as usize % Color::PALETTE.len()]
    }

    /// The `0xAARRGGBB` value.
    pub const fn to_argb(self) -> u32 {
        self.0
    }
}

impl From<u32> for Color {
    fn from(argb: u32) -> Color {
        Color(argb)
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for str {}
    impl Sealed for String {}
    impl Sealed for std::ffi::CStr {}
    impl Sealed for std::ffi::CString {}
}

/// Text NVTX can take as a message: `str`, `String`, `CStr` or `CString`.
///
/// A `CStr` is passed as is. Other text is copied to a stack buffer with a NUL appended
/// (to the heap only when longer than 255 bytes); text with a NUL byte inside is an
/// [`Error::InvalidArgument`].
///
/// ```
/// use cuda_rt::profiler::mark;
///
/// mark("plain text")?;
/// mark(&String::from("an owned string"))?;
/// mark(c"a C string, no copy")?;
/// assert!(mark("no\0NUL inside").is_err());
/// # Ok::<(), cuda_rt::Error>(())
/// ```
pub trait Message: sealed::Sealed {
    /// Calls `f` with the message as a NUL-terminated string.
    fn with_c_str<R>(&self, f: impl FnOnce(&CStr) -> R) -> Result<R>;
}

/// Bytes of a message (NUL included) that fit the stack buffer.
const STACK_MESSAGE: usize = 256;

impl Message for str {
    #[inline]
    fn with_c_str<R>(&self, f: impl FnOnce(&CStr) -> R) -> Result<R> {
        let bytes = self.as_bytes();
        if bytes.len() < STACK_MESSAGE {
            let mut buf = [0u8; STACK_MESSAGE];
            buf[..bytes.len()].copy_from_slice(bytes);
            // Fails only for a NUL byte inside the text.
            let c =
                CStr::from_bytes_with_nul(&buf[..=bytes.len()]).map_err(|_| interior_nul(self))?;
            Ok(f(c))
        } else {
            let c = CString::new(bytes).map_err(|_| interior_nul(self))?;
            Ok(f(&c))
        }
    }
}

impl Message for String {
    #[inline]
    fn with_c_str<R>(&self, f: impl FnOnce(&CStr) -> R) -> Result<R> {
        self.as_str().with_c_str(f)
    }
}

impl Message for CStr {
    #[inline]
    fn with_c_str<R>(&self, f: impl FnOnce(&CStr) -> R) -> Result<R> {
        Ok(f(self))
    }
}

impl Message for CString {
    #[inline]
    fn with_c_str<R>(&self, f: impl FnOnce(&CStr) -> R) -> Result<R> {
        Ok(f(self))
    }
}

#[cold]
fn interior_nul(text: &str) -> Error {
    let at = text.bytes().position(|b| b == 0).unwrap_or(0);
    let shown: String = text.chars().take(64).collect();
    let more = if shown.len() < text.len() { "..." } else { "" };
    Error::invalid_argument(
        ArgumentKind::InteriorNul,
        format!(
            "NVTX message has a NUL byte at offset {at}, which C strings cannot hold: \
             {shown:?}{more}"
        ),
    )
}

/// Opens an NVTX range on this thread (`nvtxRangePushEx`); [`range_pop`] closes the
/// innermost one. Ranges nest. Prefer [`range`], whose guard pops for you.
///
/// ```
/// use cuda_rt::profiler::{range_pop, range_push};
///
/// range_push("load")?;
/// // ... work ...
/// range_pop();
/// # Ok::<(), cuda_rt::Error>(())
/// ```
#[inline]
pub fn range_push<M: Message + ?Sized>(message: &M) -> Result<()> {
    message.with_c_str(|c| {
        raw::nvtx_range_push(c, None);
    })
}

/// [`range_push`] with a color.
///
/// ```
/// use cuda_rt::profiler::{range_pop, range_push_color, Color};
///
/// range_push_color("copy", Color::CYAN)?;
/// range_push_color("kernel", 0xFFFF8000)?; // any 0xAARRGGBB
/// range_pop();
/// range_pop();
/// # Ok::<(), cuda_rt::Error>(())
/// ```
#[inline]
pub fn range_push_color<M: Message + ?Sized>(message: &M, color: impl Into<Color>) -> Result<()> {
    let argb = color.into().to_argb();
    message.with_c_str(|c| {
        raw::nvtx_range_push(c, Some(argb));
    })
}

/// Closes this thread's innermost NVTX range (`nvtxRangePop`). Popping with no range
/// open is harmless: the tool, if any, ignores it.
#[inline]
pub fn range_pop() {
    raw::nvtx_range_pop();
}

/// An instantaneous NVTX event on this thread's timeline (`nvtxMarkEx`).
///
/// ```
/// cuda_rt::profiler::mark("checkpoint reached")?;
/// # Ok::<(), cuda_rt::Error>(())
/// ```
#[inline]
pub fn mark<M: Message + ?Sized>(message: &M) -> Result<()> {
    message.with_c_str(|c| raw::nvtx_mark(c, None))
}

/// [`mark`] with a color.
///
/// ```
/// use cuda_rt::profiler::{mark_color, Color};
///
/// mark_color("restart", Color::RED)?;
/// # Ok::<(), cuda_rt::Error>(())
/// ```
#[inline]
pub fn mark_color<M: Message + ?Sized>(message: &M, color: impl Into<Color>) -> Result<()> {
    let argb = color.into().to_argb();
    message.with_c_str(|c| raw::nvtx_mark(c, Some(argb)))
}

/// An open NVTX range, closed when dropped (or by [`Range::end`]). Made by [`range`] or
/// [`range_color`]. NVTX ranges belong to a thread, so the guard cannot leave it.
///
/// ```
/// use cuda_rt::profiler::{range, range_color, Color};
///
/// let _outer = range("epoch")?;
/// for step in 0..3u32 {
///     let _inner = range_color("step", Color::from_id(step))?;
///     // ... work ...
/// } // each `step` range closes here
/// # Ok::<(), cuda_rt::Error>(())
/// ```
#[derive(Debug)]
#[must_use = "the range closes as soon as the guard is dropped"]
pub struct Range {
    /// NVTX push/pop ranges are per thread: keep the guard `!Send`.
    _thread: PhantomData<*const ()>,
}

impl Range {
    /// Closes the range now.
    pub fn end(self) {}
}

impl Drop for Range {
    fn drop(&mut self) {
        raw::nvtx_range_pop();
    }
}

/// Opens an NVTX range that closes when the returned guard drops.
#[inline]
pub fn range<M: Message + ?Sized>(message: &M) -> Result<Range> {
    range_push(message)?;
    Ok(Range {
        _thread: PhantomData,
    })
}

/// [`range`] with a color.
#[inline]
pub fn range_color<M: Message + ?Sized>(message: &M, color: impl Into<Color>) -> Result<Range> {
    range_push_color(message, color)?;
    Ok(Range {
        _thread: PhantomData,
    })
}

/// The NVTX shim compiled from `csrc/nvtx.c` (NVTX v3's header-only core API behind
/// plain C functions), linked into this crate.
mod raw {
    use std::ffi::{c_char, c_int, CStr};

    extern "C" {
        fn cuda_rt_nvtx_range_push(message: *const c_char, argb: u32, has_color: c_int) -> c_int;
        fn cuda_rt_nvtx_range_pop() -> c_int;
        fn cuda_rt_nvtx_mark(message: *const c_char, argb: u32, has_color: c_int);
    }

    /// `nvtxRangePushEx` with an ASCII message and, if `color` is `Some`, an ARGB
    /// color. Returns NVTX's answer: the depth of the new range, negative without a
    /// tool.
    #[inline]
    pub(super) fn nvtx_range_push(message: &CStr, color: Option<u32>) -> i32 {
        // SAFETY: `message` is NUL-terminated and outlives the call; NVTX copies what
        // it keeps. The shim has no other preconditions and is thread-safe.
        unsafe {
            cuda_rt_nvtx_range_push(
                message.as_ptr(),
                color.unwrap_or(0),
                c_int::from(color.is_some()),
            )
        }
    }

    /// `nvtxRangePop`: ends the thread's innermost range. Returns NVTX's answer: the
    /// depth of the range ended, negative without a tool (or with nothing to pop).
    #[inline]
    pub(super) fn nvtx_range_pop() -> i32 {
        // SAFETY: no arguments; popping with no open range is reported, not undefined.
        unsafe { cuda_rt_nvtx_range_pop() }
    }

    /// `nvtxMarkEx` with an ASCII message and, if `color` is `Some`, an ARGB color.
    #[inline]
    pub(super) fn nvtx_mark(message: &CStr, color: Option<u32>) {
        // SAFETY: as in `nvtx_range_push`.
        unsafe {
            cuda_rt_nvtx_mark(
                message.as_ptr(),
                color.unwrap_or(0),
                c_int::from(color.is_some()),
            )
        }
    }
}
