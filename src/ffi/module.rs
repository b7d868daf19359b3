//! Modules (load from a file or bytes, NVRTC compile through the kernel cache),
//! functions, and kernel launch with `void**` arguments.

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::Arc;

use cuda_rt::{Function, LaunchConfig, Module, RawModule};

use super::handles::{curt_function_t, curt_module_t, curt_stream_t, Table};
use super::status::{bad_arg, c_str, guard, out, Res};
use super::stream::stream_or_current;

/// The modules C holds.
pub(crate) static MODULES: Table<Arc<Module>> = Table::new(5, "module");
/// The functions C holds.
pub(crate) static FUNCTIONS: Table<Arc<Function>> = Table::new(6, "function");

/// A launch shape (`curt_dim3`): x, y, z, each at least 1.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct curt_dim3 {
    /// Extent along x.
    pub x: c_uint,
    /// Extent along y.
    pub y: c_uint,
    /// Extent along z.
    pub z: c_uint,
}

fn put(module: &mut curt_module_t, m: Module) {
    *module = MODULES.insert(Arc::new(m)) as curt_module_t;
}

/// Loads a PTX, cubin or fatbin file on the current device.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_module_load_file(
    path: *const c_char,
    module: *mut curt_module_t,
) -> c_int {
    guard(|| {
        let (module, path) = (out(module, "module")?, c_str(path, "path")?);
        put(module, Module::load_file(path)?);
        Ok(())
    })
}

/// Loads a PTX (NUL-terminated), cubin or fatbin image of `size` bytes on the current
/// device.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_module_load_data(
    image: *const c_void,
    size: usize,
    module: *mut curt_module_t,
) -> c_int {
    guard(|| {
        let module = out(module, "module")?;
        if image.is_null() {
            return Err(bad_arg("image is NULL"));
        }
        if size > isize::MAX as usize {
            return Err(bad_arg(format!("size {size} is past any object")));
        }
        // SAFETY: non-null (checked), a length a slice may have (checked); wrapper.h
        // requires `size` readable bytes.
        let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), size) };
        put(module, Module::load_data(bytes)?);
        Ok(())
    })
}

fn options<'a>(options: *const *const c_char, n: usize) -> Res<Vec<&'a str>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if options.is_null() {
        return Err(bad_arg("options is NULL with n_options > 0"));
    }
    if n > isize::MAX as usize / std::mem::size_of::<*const c_char>() {
        return Err(bad_arg(format!("n_options {n} is past any array")));
    }
    // SAFETY: non-null (checked), a length a slice may have (checked); wrapper.h
    // requires `n` string pointers.
    let ptrs = unsafe { std::slice::from_raw_parts(options, n) };
    ptrs.iter()
        .enumerate()
        .map(|(i, &p)| c_str(p, &format!("options[{i}]")))
        .collect()
}

/// Compiles CUDA C++ `source` with NVRTC for the current device (options such as
/// "-std=c++17"), through the kernel cache (memory and disk), and loads it. On a
/// compile error, `CURT_ERROR_COMPILE` and the log in `curt_last_error()`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_module_compile(
    source: *const c_char,
    options_: *const *const c_char,
    n_options: usize,
    module: *mut curt_module_t,
) -> c_int {
    guard(|| {
        let module = out(module, "module")?;
        let source = c_str(source, "source")?;
        let opts = options(options_, n_options)?;
        let raw = RawModule::from_source(source, &opts, &[])?;
        put(module, raw.module().clone());
        Ok(())
    })
}

/// Destroys `module`'s handle (functions from it keep it loaded); dead afterwards.
#[no_mangle]
pub extern "C" fn curt_module_destroy(module: curt_module_t) -> c_int {
    guard(|| {
        drop(MODULES.remove(module as u64)?);
        Ok(())
    })
}

/// Looks up the kernel `name` (its mangled name, or an `extern "C"` name) in `module`.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_module_get_function(
    module: curt_module_t,
    name: *const c_char,
    function: *mut curt_function_t,
) -> c_int {
    guard(|| {
        let (function, name) = (out(function, "function")?, c_str(name, "name")?);
        let f = MODULES.get(module as u64)?.get_function(name)?;
        *function = FUNCTIONS.insert(Arc::new(f)) as curt_function_t;
        Ok(())
    })
}

/// Destroys `function`'s handle; dead afterwards.
#[no_mangle]
pub extern "C" fn curt_function_destroy(function: curt_function_t) -> c_int {
    guard(|| {
        drop(FUNCTIONS.remove(function as u64)?);
        Ok(())
    })
}

/// Launches `function` on `stream` (NULL: the current stream) with `grid` x `block`
/// threads, `shared_mem` bytes of dynamic shared memory and `n_args` arguments.
///
/// # Safety
/// Each pointer argument is NULL (refused with an error where the function needs
/// it) or valid for what `wrapper.h` says the function does with it, for the
/// duration of the call (and, for memory a copy or callback uses later, as long as
/// `wrapper.h` says); function pointers are callable with the arguments given.
#[no_mangle]
pub unsafe extern "C" fn curt_launch(
    function: curt_function_t,
    grid: curt_dim3,
    block: curt_dim3,
    shared_mem: c_uint,
    stream: curt_stream_t,
    args: *mut *mut c_void,
    n_args: usize,
) -> c_int {
    guard(|| {
        if args.is_null() && n_args > 0 {
            return Err(bad_arg("args is NULL with n_args > 0"));
        }
        let f = FUNCTIONS.get(function as u64)?;
        let s = stream_or_current(stream)?;
        let config = LaunchConfig::new((grid.x, grid.y, grid.z), (block.x, block.y, block.z))
            .with_shared_mem(shared_mem);
        let params: &mut [*mut c_void] = if n_args == 0 {
            &mut []
        } else {
            // SAFETY: non-null (checked); wrapper.h requires `n_args` pointers.
            unsafe { std::slice::from_raw_parts_mut(args, n_args) }
        };
        // SAFETY: wrapper.h's contract for curt_launch: `args[i]` points to a value of
        // the kernel's i-th parameter type, the device memory the kernel reaches stays
        // allocated until the kernel has run, and in a capture begun with the raw
        // driver the module stays loaded until the graph's last launch (a capture
        // begun through cuda-rt keeps it itself).
        Ok(unsafe { f.launch_raw(&s, &config, params) }?)
    })
}
