//! Checked driver calls about modules and functions (`cuModule*`, `cuFunc*`,
//! `cuOccupancy*`). The caller makes the right context current first.

use std::ffi::{c_char, c_void, CStr, CString};

use super::{check, drv, sys};
use crate::error::{ArgumentKind, Error, Result};

/// Size of the JIT error log buffer handed to `cuModuleLoadDataEx`.
const JIT_LOG_BYTES: usize = 8192;

/// Loads a PTX, cubin or fatbin image (`cuModuleLoadDataEx`). PTX must end with a NUL
/// byte. On failure the JIT error log, if any, is appended to the message.
pub fn load_data(image: &[u8]) -> Result<sys::CUmodule> {
    let mut module: sys::CUmodule = std::ptr::null_mut();
    let mut log = vec![0u8; JIT_LOG_BYTES];
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), JIT_LOG_BYTES as *mut c_void];
    let f = super::api()?.cuModuleLoadDataEx()?;
    // SAFETY: `image` is a complete image the caller checked the kind of (PTX is
    // NUL-terminated); the option arrays have 2 entries each; the log buffer holds
    // JIT_LOG_BYTES bytes, which is the size passed (by value, as CUDA wants).
    let rc = unsafe {
        f(
            &mut module,
            image.as_ptr().cast(),
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    match check(rc, "cuModuleLoadDataEx") {
        Ok(()) => Ok(module),
        Err(Error::Driver(d)) => {
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let text = text.trim();
            if text.is_empty() {
                Err(Error::Driver(d))
            } else {
                Err(Error::invalid_argument(
                    ArgumentKind::Other,
                    format!("loading the module image failed: {d}; JIT log:\n{text}"),
                ))
            }
        }
        Err(e) => Err(e),
    }
}

/// `cuModuleUnload`.
pub fn unload(module: sys::CUmodule) -> Result<()> {
    // SAFETY: the caller owns `module` and unloads it once.
    drv!(cuModuleUnload(module))
}

/// `cuModuleGetFunction`.
pub fn get_function(module: sys::CUmodule, name: &CStr) -> Result<sys::CUfunction> {
    let mut f: sys::CUfunction = std::ptr::null_mut();
    // SAFETY: `module` is loaded, `name` NUL-terminated, `f` a valid out pointer.
    drv!(cuModuleGetFunction(&mut f, module, name.as_ptr()))?;
    Ok(f)
}

/// `cuModuleGetGlobal`: device address and size of a global variable.
pub fn get_global(module: sys::CUmodule, name: &CStr) -> Result<(sys::CUdeviceptr, usize)> {
    let (mut ptr, mut size) = (0 as sys::CUdeviceptr, 0usize);
    // SAFETY: `module` is loaded, `name` NUL-terminated, both out pointers valid.
    drv!(cuModuleGetGlobal_v2(
        &mut ptr,
        &mut size,
        module,
        name.as_ptr()
    ))?;
    Ok((ptr, size))
}

/// The names of the module's functions (`cuModuleGetFunctionCount`,
/// `cuModuleEnumerateFunctions`, `cuFuncGetName`; CUDA 12.4+).
pub fn function_names(module: sys::CUmodule) -> Result<Vec<String>> {
    let mut count = 0u32;
    // SAFETY: `module` is loaded, `count` a valid out pointer.
    drv!(cuModuleGetFunctionCount(&mut count, module))?;
    let mut funcs: Vec<sys::CUfunction> = vec![std::ptr::null_mut(); count as usize];
    // SAFETY: `funcs` holds `count` slots.
    drv!(cuModuleEnumerateFunctions(
        funcs.as_mut_ptr(),
        count,
        module
    ))?;
    funcs.into_iter().map(name).collect()
}

/// `cuFuncGetName` (CUDA 12.3+).
pub fn name(f: sys::CUfunction) -> Result<String> {
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `f` is a function of a loaded module, `p` a valid out pointer.
    drv!(cuFuncGetName(&mut p, f))?;
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the driver returns a NUL-terminated name owned by the module.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// `cuFuncGetAttribute`.
pub fn attribute(f: sys::CUfunction, attr: sys::CUfunction_attribute) -> Result<i32> {
    let mut v = 0;
    // SAFETY: `f` is a function of a loaded module, `v` a valid out pointer.
    drv!(cuFuncGetAttribute(&mut v, attr, f))?;
    Ok(v)
}

/// `cuFuncSetAttribute`.
pub fn set_attribute(
    f: sys::CUfunction,
    attr: sys::CUfunction_attribute,
    value: i32,
) -> Result<()> {
    // SAFETY: `f` is a function of a loaded module; bad values are error codes.
    drv!(cuFuncSetAttribute(f, attr, value))
}

/// The sizes of the kernel's parameters (`cuFuncGetParamInfo`, CUDA 12.4+), or `None`
/// when the driver cannot tell.
pub fn param_sizes(f: sys::CUfunction) -> Option<Box<[usize]>> {
    let get = super::api().ok()?.cuFuncGetParamInfo().ok()?;
    let mut sizes = Vec::new();
    loop {
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: `f` is a function of a loaded module, both out pointers valid; an
        // index past the last parameter is CUDA_ERROR_INVALID_VALUE.
        let rc = unsafe { get(f, sizes.len(), &mut offset, &mut size) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            sizes.push(size);
        } else if rc == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
            return Some(sizes.into_boxed_slice());
        } else {
            return None;
        }
        if sizes.len() > 4096 {
            return None;
        }
    }
}

/// `cuOccupancyMaxActiveBlocksPerMultiprocessor`.
pub fn max_active_blocks_per_sm(f: sys::CUfunction, block: i32, dyn_smem: usize) -> Result<i32> {
    let mut n = 0;
    // SAFETY: `f` is a function of a loaded module, `n` a valid out pointer.
    drv!(cuOccupancyMaxActiveBlocksPerMultiprocessor(
        &mut n, f, block, dyn_smem
    ))?;
    Ok(n)
}

/// `cuOccupancyMaxPotentialBlockSize` with no shared-memory callback: `(min grid size,
/// block size)`.
pub fn max_potential_block_size(
    f: sys::CUfunction,
    dyn_smem: usize,
    block_limit: i32,
) -> Result<(i32, i32)> {
    let (mut grid, mut block) = (0, 0);
    // SAFETY: `f` is a function of a loaded module, out pointers valid; a null callback
    // means `dyn_smem` bytes for every block size.
    drv!(cuOccupancyMaxPotentialBlockSize(
        &mut grid,
        &mut block,
        f,
        None,
        dyn_smem,
        block_limit
    ))?;
    Ok((grid, block))
}

/// `cuOccupancyMaxPotentialClusterSize` for a launch configuration.
pub fn max_potential_cluster_size(f: sys::CUfunction, config: &sys::CUlaunchConfig) -> Result<i32> {
    let mut n = 0;
    // SAFETY: `f` is loaded; `config` is fully initialised and its attribute pointer
    // covers `numAttrs` entries.
    drv!(cuOccupancyMaxPotentialClusterSize(&mut n, f, config))?;
    Ok(n)
}

/// A `CString` for a symbol name, or an error naming it.
pub fn c_name(what: &str, name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| {
        Error::invalid_argument(
            ArgumentKind::InteriorNul,
            format!("{what} name {name:?} contains a NUL byte"),
        )
    })
}
