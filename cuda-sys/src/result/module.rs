//! Checked driver calls about modules and their functions (`cuModule*`, `cuFunc*`,
//! `cuOccupancy*`).
//!
//! A module belongs to the context that was current when it was loaded; the calls here
//! act in that context, which the caller makes current. Every call that takes a
//! `CUmodule` or a `CUfunction` is an `unsafe fn`: the module is loaded (not unloaded),
//! and a function belongs to such a module.

use std::ffi::{c_char, c_void, CStr};

use super::{api, check, DriverError, Result};
use crate::driver::{
    CUdeviceptr, CUfunction, CUfunction_attribute, CUjit_option, CUlaunchConfig, CUmodule, CUresult,
};

/// Loads a PTX, cubin or fatbin image into the current context (`cuModuleLoadDataEx`)
/// with JIT options: `options[i]` takes `values[i]` (slices of different lengths are
/// `CUDA_ERROR_INVALID_VALUE`). The caller unloads the module once with [`unload`].
///
/// # Safety
/// `image` points to a complete image: PTX text ending with a NUL byte, or a whole
/// cubin or fatbin (the driver reads as far as the image's own headers say). Each value
/// is what its option expects, by value or as a pointer valid for the call (a log
/// buffer of the size given with it, say).
pub unsafe fn load_data_ex(
    image: *const c_void,
    options: &mut [CUjit_option],
    values: &mut [*mut c_void],
) -> Result<CUmodule> {
    if options.len() != values.len() {
        return Err(
            DriverError::new(CUresult::CUDA_ERROR_INVALID_VALUE, "cuModuleLoadDataEx").into(),
        );
    }
    let f = api()?.cuModuleLoadDataEx()?;
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: the image and the option values are the caller's (see `# Safety`); both
    // arrays hold `options.len()` entries; `module` is a valid out pointer.
    let rc = unsafe {
        f(
            &mut module,
            image,
            options.len() as u32,
            options.as_mut_ptr(),
            values.as_mut_ptr(),
        )
    };
    check(rc, "cuModuleLoadDataEx")?;
    Ok(module)
}

/// Unloads a module (`cuModuleUnload`).
///
/// # Safety
/// `module` is loaded, unloaded once, and none of its functions or globals is used
/// afterwards (nor by work still queued).
pub unsafe fn unload(module: CUmodule) -> Result<()> {
    let f = api()?.cuModuleUnload()?;
    // SAFETY: see `# Safety`.
    check(unsafe { f(module) }, "cuModuleUnload")
}

/// The function `name` of `module` (`cuModuleGetFunction`); a missing name is
/// `CUDA_ERROR_NOT_FOUND`.
///
/// # Safety
/// `module` is loaded (see the [module](self) docs).
pub unsafe fn get_function(module: CUmodule, name: &CStr) -> Result<CUfunction> {
    let f = api()?.cuModuleGetFunction()?;
    let mut func: CUfunction = std::ptr::null_mut();
    // SAFETY: `module` is loaded (caller); `name` is NUL-terminated; `func` is a valid
    // out pointer.
    check(
        unsafe { f(&mut func, module, name.as_ptr()) },
        "cuModuleGetFunction",
    )?;
    Ok(func)
}

/// Device address and size in bytes of the global variable `name` of `module`
/// (`cuModuleGetGlobal`).
///
/// # Safety
/// `module` is loaded (see the [module](self) docs).
pub unsafe fn get_global(module: CUmodule, name: &CStr) -> Result<(CUdeviceptr, usize)> {
    let f = api()?.cuModuleGetGlobal_v2()?;
    let (mut ptr, mut size) = (0 as CUdeviceptr, 0usize);
    // SAFETY: `module` is loaded (caller); `name` is NUL-terminated; both out pointers
    // are valid.
    check(
        unsafe { f(&mut ptr, &mut size, module, name.as_ptr()) },
        "cuModuleGetGlobal_v2",
    )?;
    Ok((ptr, size))
}

/// How many functions `module` has (`cuModuleGetFunctionCount`, CUDA 12.4+).
///
/// # Safety
/// `module` is loaded (see the [module](self) docs).
pub unsafe fn get_function_count(module: CUmodule) -> Result<u32> {
    let f = api()?.cuModuleGetFunctionCount()?;
    let mut count = 0u32;
    // SAFETY: `module` is loaded (caller); `count` is a valid out pointer.
    check(unsafe { f(&mut count, module) }, "cuModuleGetFunctionCount")?;
    Ok(count)
}

/// The functions of `module` ([`get_function_count`], then
/// `cuModuleEnumerateFunctions`; CUDA 12.4+).
///
/// # Safety
/// `module` is loaded (see the [module](self) docs).
pub unsafe fn enumerate_functions(module: CUmodule) -> Result<Vec<CUfunction>> {
    // SAFETY: `module` is loaded (caller).
    let count = unsafe { get_function_count(module) }?;
    let f = api()?.cuModuleEnumerateFunctions()?;
    let mut funcs: Vec<CUfunction> = vec![std::ptr::null_mut(); count as usize];
    // SAFETY: `module` is loaded (caller); `funcs` holds `count` slots.
    check(
        unsafe { f(funcs.as_mut_ptr(), count, module) },
        "cuModuleEnumerateFunctions",
    )?;
    Ok(funcs)
}

/// The function's (mangled) name, copied (`cuFuncGetName`, CUDA 12.3+).
///
/// # Safety
/// `func` is a function of a loaded module.
pub unsafe fn func_get_name(func: CUfunction) -> Result<String> {
    let f = api()?.cuFuncGetName()?;
    let mut p: *const c_char = std::ptr::null();
    // SAFETY: `func` is live (caller); `p` is a valid out pointer.
    check(unsafe { f(&mut p, func) }, "cuFuncGetName")?;
    if p.is_null() {
        return Ok(String::new());
    }
    // SAFETY: the driver returns a NUL-terminated name owned by the module, which is
    // loaded during this call; it is copied here.
    Ok(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// One attribute of `func` (`cuFuncGetAttribute`).
///
/// # Safety
/// `func` is a function of a loaded module.
pub unsafe fn func_get_attribute(func: CUfunction, attr: CUfunction_attribute) -> Result<i32> {
    let f = api()?.cuFuncGetAttribute()?;
    let mut v = 0;
    // SAFETY: `func` is live (caller); `v` is a valid out pointer.
    check(unsafe { f(&mut v, attr, func) }, "cuFuncGetAttribute")?;
    Ok(v)
}

/// Sets one attribute of `func` (`cuFuncSetAttribute`); a bad value is an error code.
///
/// # Safety
/// `func` is a function of a loaded module.
pub unsafe fn func_set_attribute(
    func: CUfunction,
    attr: CUfunction_attribute,
    value: i32,
) -> Result<()> {
    let f = api()?.cuFuncSetAttribute()?;
    // SAFETY: `func` is live (caller).
    check(unsafe { f(func, attr, value) }, "cuFuncSetAttribute")
}

/// Offset and size in bytes of the kernel's parameter `index` in its parameter buffer
/// (`cuFuncGetParamInfo`, CUDA 12.4+); an index past the last parameter is
/// `CUDA_ERROR_INVALID_VALUE`.
///
/// # Safety
/// `func` is a function of a loaded module.
pub unsafe fn func_get_param_info(func: CUfunction, index: usize) -> Result<(usize, usize)> {
    let f = api()?.cuFuncGetParamInfo()?;
    let (mut offset, mut size) = (0usize, 0usize);
    // SAFETY: `func` is live (caller); both out pointers are valid.
    check(
        unsafe { f(func, index, &mut offset, &mut size) },
        "cuFuncGetParamInfo",
    )?;
    Ok((offset, size))
}

/// How many blocks of `block` threads, with `dyn_smem` bytes of dynamic shared memory
/// each, fit on one multiprocessor at once
/// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
///
/// # Safety
/// `func` is a function of a loaded module.
pub unsafe fn occupancy_max_active_blocks_per_multiprocessor(
    func: CUfunction,
    block: i32,
    dyn_smem: usize,
) -> Result<i32> {
    let f = api()?.cuOccupancyMaxActiveBlocksPerMultiprocessor()?;
    let mut n = 0;
    // SAFETY: `func` is live (caller); `n` is a valid out pointer.
    check(
        unsafe { f(&mut n, func, block, dyn_smem) },
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    )?;
    Ok(n)
}

/// The block size with the best occupancy and the smallest grid that reaches it, as
/// `(min grid size, block size)`, for `dyn_smem` bytes of dynamic shared memory per
/// block and at most `block_limit` threads, 0 for no limit
/// (`cuOccupancyMaxPotentialBlockSize` without a shared-memory callback).
///
/// # Safety
/// `func` is a function of a loaded module.
pub unsafe fn occupancy_max_potential_block_size(
    func: CUfunction,
    dyn_smem: usize,
    block_limit: i32,
) -> Result<(i32, i32)> {
    let f = api()?.cuOccupancyMaxPotentialBlockSize()?;
    let (mut grid, mut block) = (0, 0);
    // SAFETY: `func` is live (caller); the out pointers are valid; a null callback
    // means `dyn_smem` bytes for every block size.
    check(
        unsafe { f(&mut grid, &mut block, func, None, dyn_smem, block_limit) },
        "cuOccupancyMaxPotentialBlockSize",
    )?;
    Ok((grid, block))
}

/// The largest cluster size `func` can be launched with under `config`
/// (`cuOccupancyMaxPotentialClusterSize`).
///
/// # Safety
/// `func` is a function of a loaded module; `config.attrs` points to `config.numAttrs`
/// initialised attributes (or is null with `numAttrs` 0).
pub unsafe fn occupancy_max_potential_cluster_size(
    func: CUfunction,
    config: &CUlaunchConfig,
) -> Result<i32> {
    let f = api()?.cuOccupancyMaxPotentialClusterSize()?;
    let mut n = 0;
    // SAFETY: `func` is live and `config`'s attribute array valid (caller); `n` is a
    // valid out pointer.
    check(
        unsafe { f(&mut n, func, config) },
        "cuOccupancyMaxPotentialClusterSize",
    )?;
    Ok(n)
}
