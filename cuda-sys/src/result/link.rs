//! Checked driver calls of the JIT linker (`cuLink*`): cubins, PTX and libraries (the
//! device runtime `libcudadevrt.a`, which relocatable device code that launches
//! kernels needs) linked into one cubin in the current context.
//!
//! A `CUlinkState` is trusted by the driver, so every call that takes one is an
//! `unsafe fn`: the state was created by [`create`] and not destroyed. The option
//! values given to [`create`] (log buffers, say) must stay valid until [`destroy`]:
//! the driver writes the logs during [`add_data`], [`add_file`] and [`complete`].

use std::ffi::{c_void, CStr};

use super::{api, check, DriverError, Result};
use crate::driver::{CUjitInputType, CUjit_option, CUlinkState, CUresult};

/// A new link (`cuLinkCreate`) in the current context, with JIT options: `options[i]`
/// takes `values[i]` (slices of different lengths are `CUDA_ERROR_INVALID_VALUE`). The
/// caller destroys it once with [`destroy`].
///
/// # Safety
/// Each value is what its option expects, by value or as a pointer; a pointer (a log
/// buffer of the size given with it) stays valid until the link is destroyed. The two
/// slices themselves stay valid and in place until then too: the driver keeps them and
/// writes output options back into `values` (the logs' actual sizes) as late as
/// [`complete`].
pub unsafe fn create(
    options: &mut [CUjit_option],
    values: &mut [*mut c_void],
) -> Result<CUlinkState> {
    if options.len() != values.len() {
        return Err(DriverError::new(CUresult::CUDA_ERROR_INVALID_VALUE, "cuLinkCreate").into());
    }
    let f = api()?.cuLinkCreate_v2()?;
    let mut state: CUlinkState = std::ptr::null_mut();
    // SAFETY: the option values are the caller's (see `# Safety`); both arrays hold
    // `options.len()` entries; `state` is a valid out pointer.
    let rc = unsafe {
        f(
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
            &mut state,
        )
    };
    check(rc, "cuLinkCreate_v2")?;
    Ok(state)
}

/// Adds an input held in memory (`cuLinkAddData`): `data` of kind `kind` (a cubin,
/// PTX text ending with its NUL byte, a fatbin, an object or a library), under `name`
/// (shown in the linker's log).
///
/// # Safety
/// `state` is a live link; `data` is a whole input of kind `kind`.
pub unsafe fn add_data(
    state: CUlinkState,
    kind: CUjitInputType,
    data: &[u8],
    name: &CStr,
) -> Result<()> {
    let f = api()?.cuLinkAddData_v2()?;
    // SAFETY: `state` is live (caller); the driver reads `data.len()` bytes of `data`
    // (it does not write them, whatever the pointer's type) and copies what it keeps;
    // `name` is NUL-terminated; no per-input options.
    let rc = unsafe {
        f(
            state,
            kind,
            data.as_ptr() as *mut c_void,
            data.len(),
            name.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    check(rc, "cuLinkAddData_v2")
}

/// Adds an input read from the file `path` (`cuLinkAddFile`), of kind `kind` (a
/// library such as `libcudadevrt.a` is `CU_JIT_INPUT_LIBRARY`).
///
/// # Safety
/// `state` is a live link.
pub unsafe fn add_file(state: CUlinkState, kind: CUjitInputType, path: &CStr) -> Result<()> {
    let f = api()?.cuLinkAddFile_v2()?;
    // SAFETY: `state` is live (caller); `path` is NUL-terminated; no per-input options.
    let rc = unsafe {
        f(
            state,
            kind,
            path.as_ptr(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    check(rc, "cuLinkAddFile_v2")
}

/// Completes the link (`cuLinkComplete`) and copies out the linked cubin (which the
/// driver keeps inside the link until it is destroyed).
///
/// # Safety
/// `state` is a live link.
pub unsafe fn complete(state: CUlinkState) -> Result<Vec<u8>> {
    let f = api()?.cuLinkComplete()?;
    let mut out: *mut c_void = std::ptr::null_mut();
    let mut size: usize = 0;
    // SAFETY: `state` is live (caller); `out` and `size` are valid out pointers.
    check(unsafe { f(state, &mut out, &mut size) }, "cuLinkComplete")?;
    if out.is_null() || size == 0 {
        return Ok(Vec::new());
    }
    // SAFETY: the driver documents `out` as the cubin of `size` bytes, owned by the link
    // and valid until it is destroyed; it is copied here, before that.
    Ok(unsafe { std::slice::from_raw_parts(out as *const u8, size) }.to_vec())
}

/// Destroys a link (`cuLinkDestroy`), and the cubin [`complete`] made in it.
///
/// # Safety
/// `state` is a live link, destroyed once.
pub unsafe fn destroy(state: CUlinkState) -> Result<()> {
    let f = api()?.cuLinkDestroy()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(state) }, "cuLinkDestroy")
}
