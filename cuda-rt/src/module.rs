//! Modules and functions: load PTX, cubin or fatbin, look up kernels and globals, read
//! and set kernel attributes, ask the occupancy calculator.
//!
//! Modules are loaded with `cuModuleLoadDataEx` (not the `cuLibrary*` API) into the
//! primary context of the device that was current at load time: a [`Module`] belongs to
//! one device, like CuPy's. Files are read by cuda-rt and loaded from memory, so a
//! missing file is an error that names it.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::module::Module;
//! use cuda_rt::launch::LaunchConfig;
//! let module = Module::load_file("kernels.cubin")?;
//! let f = module.get_function("scale")?; // scale(float* x, unsigned n)
//! let n = 1024u32;
//! let x = cuda_rt::alloc(4 * n as usize)?; // n floats on the current device
//! // SAFETY: scale(float* x, unsigned n): x holds n floats on the module's device and
//! // nothing else uses them until the synchronize below.
//! unsafe { f.launch(&LaunchConfig::for_num_elems_occupancy(&f, n)?, &[&x, &n])? };
//! cuda_rt::synchronize()?;
//! # Ok(()) }
//! ```

use std::ffi::{c_void, CString};
use std::fmt;
use std::path::Path;
use std::sync::{Arc, OnceLock};

use cuda_sys::driver as sys;
use cuda_sys::{result, CudaVersion};

use crate::device::context::make_current;
use crate::device::get_device_id;
use crate::error::{ArgumentKind, Error, Result, UnsupportedKind};

/// ELF magic: a cubin.
const ELF_MAGIC: [u8; 4] = [0x7f, b'E', b'L', b'F'];
/// Fatbin magic (`0xBA55ED50`, little-endian).
const FATBIN_MAGIC: [u8; 4] = [0x50, 0xED, 0x55, 0xBA];

/// The kind of a module image, told apart by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ImageKind {
    /// PTX assembly (text); JIT-compiled by the driver at load time.
    Ptx,
    /// A cubin (ELF) for one architecture.
    Cubin,
    /// A fatbin holding cubins and/or PTX for several architectures.
    Fatbin,
}

impl ImageKind {
    /// Tells the kind of `image` from its magic bytes (anything else is taken as PTX).
    pub fn detect(image: &[u8]) -> ImageKind {
        if image.starts_with(&ELF_MAGIC) {
            ImageKind::Cubin
        } else if image.starts_with(&FATBIN_MAGIC) {
            ImageKind::Fatbin
        } else {
            ImageKind::Ptx
        }
    }
}

struct ModuleInner {
    handle: usize,
    device: i32,
}

impl Drop for ModuleInner {
    fn drop(&mut self) {
        // Unloading needs the module's context; errors at exit leave nothing to do.
        if make_current(self.device).is_ok() {
            // SAFETY: the module is owned by this value, unloaded once, here, when the
            // last `Module`, `Function`, graph kernel node and graph of a capture that
            // launched one of its kernels are gone.
            let _ = unsafe { result::module::unload(self.handle as sys::CUmodule) };
        }
    }
}

/// A loaded module, unloaded when the last clone and the last [`Function`] taken from
/// it are dropped, and the last [`Graph`](crate::Graph) that runs one of its kernels
/// is gone: a graph keeps the module of each kernel node, and of each kernel launched
/// into a capture begun through cuda-rt (also the executables of a
/// [`Recorder`](crate::Recorder)). Cheap to clone.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

impl fmt::Debug for Module {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Module")
            .field("handle", &(self.inner.handle as *const c_void))
            .field("device", &self.inner.device)
            .finish()
    }
}

impl Module {
    /// Loads a PTX, cubin or fatbin file on the current device. A file that cannot be
    /// read is an error naming it.
    pub fn load_file(path: impl AsRef<Path>) -> Result<Module> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| {
            Error::invalid_argument(
                ArgumentKind::Other,
                format!("cannot read module file {}: {e}", path.display()),
            )
        })?;
        Self::load_data(&bytes)
    }

    /// Loads a PTX, cubin or fatbin image from memory on the current device (the kind
    /// is told by the image's magic bytes; PTX need not end with a NUL byte).
    pub fn load_data(image: &[u8]) -> Result<Module> {
        Self::load_data_on(get_device_id(), image)
    }

    /// Loads an image on `device`.
    pub(crate) fn load_data_on(device: i32, image: &[u8]) -> Result<Module> {
        // The driver takes no length: it reads a cubin or fatbin as far as the image's
        // headers say, so those must stay inside the slice.
        match ImageKind::detect(image) {
            ImageKind::Cubin => crate::image_extent::check_cubin(image)?,
            ImageKind::Fatbin => crate::image_extent::check_fatbin(image)?,
            ImageKind::Ptx => {}
        }
        make_current(device)?;
        // SAFETY (both calls): PTX ends with a NUL byte (added here when missing); a
        // cubin or fatbin refers to no byte past its end (checked above).
        let handle = if ImageKind::detect(image) == ImageKind::Ptx && image.last() != Some(&0) {
            let mut owned = Vec::with_capacity(image.len() + 1);
            owned.extend_from_slice(image);
            owned.push(0);
            unsafe { load_image(&owned) }?
        } else {
            unsafe { load_image(image) }?
        };
        Ok(Module {
            inner: Arc::new(ModuleInner {
                handle: handle as usize,
                device,
            }),
        })
    }

    /// Same as [`Module::load_data`], by CuPy's name.
    pub fn load_from_string(image: &str) -> Result<Module> {
        Self::load_data(image.as_bytes())
    }

    /// The device the module was loaded on.
    pub fn device_id(&self) -> i32 {
        self.inner.device
    }

    /// The raw `CUmodule` (owned by this module).
    pub fn as_raw(&self) -> sys::CUmodule {
        self.inner.handle as sys::CUmodule
    }

    /// The kernel `name` (a C name, or a lowered C++ name). An unknown name is an error
    /// naming it and, on drivers that can list them (CUDA 12.4+), the module's kernels.
    pub fn get_function(&self, name: &str) -> Result<Function> {
        check_kernel_name(name)?;
        let c = c_name("kernel", name)?;
        make_current(self.inner.device)?;
        // SAFETY: the module is owned by `self`, loaded until its last holder goes; its
        // context was made current above.
        match unsafe { result::module::get_function(self.as_raw(), &c) }.map_err(Error::from) {
            Ok(f) => Ok(Function::new(self.inner.clone(), f, name)),
            Err(Error::Driver(d)) if d.code == sys::CUresult::CUDA_ERROR_NOT_FOUND => {
                let mut msg = format!(
                    "cuModuleGetFunction({name:?}) failed: {}: {}",
                    d.name, d.description
                );
                if let Ok(names) = self.function_names() {
                    if names.is_empty() {
                        msg.push_str("; the module exports no kernel");
                    } else {
                        msg.push_str("; the module exports: ");
                        msg.push_str(&names.join(", "));
                    }
                }
                Err(Error::invalid_argument(ArgumentKind::NotFound, msg))
            }
            Err(e) => Err(e),
        }
    }

    /// The names of the module's kernels (CUDA 12.4+ drivers).
    pub fn function_names(&self) -> Result<Vec<String>> {
        make_current(self.inner.device)?;
        // SAFETY: the module is owned by `self` and loaded; its context is current.
        let funcs = unsafe { result::module::enumerate_functions(self.as_raw()) }?;
        let mut names = funcs
            .into_iter()
            // SAFETY: functions of that module, loaded while `self` is borrowed.
            .map(|f| Ok(unsafe { result::module::func_get_name(f) }?))
            .collect::<Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }

    /// Device address and size in bytes of the `__device__` or `__constant__`
    /// variable `name`.
    pub fn get_global(&self, name: &str) -> Result<(u64, usize)> {
        let c = c_name("global variable", name)?;
        make_current(self.inner.device)?;
        // SAFETY: the module is owned by `self` and loaded; its context is current.
        match unsafe { result::module::get_global(self.as_raw(), &c) }.map_err(Error::from) {
            Ok((p, n)) => Ok((p, n)),
            Err(Error::Driver(d)) if d.code == sys::CUresult::CUDA_ERROR_NOT_FOUND => Err(
                Error::invalid_argument(ArgumentKind::NotFound, format!(
                    "cuModuleGetGlobal({name:?}) failed: {}: {}: the module has no __device__ or __constant__ variable of that name",
                    d.name, d.description
                )),
            ),
            Err(e) => Err(e),
        }
    }

    /// Texture references were removed in CUDA 12: always [`Error::NotSupported`].
    pub fn get_texref(&self, name: &str) -> Result<()> {
        Err(Error::not_supported(UnsupportedKind::Removed, format!(
            "get_texref({name:?}): texture references were removed in CUDA 12; use texture objects (cuTexObjectCreate) instead"
        )))
    }
}

/// A kernel of a loaded [`Module`]; keeps the module loaded. Cheap to clone: clones
/// share the cached parameter sizes.
#[derive(Clone)]
pub struct Function {
    inner: Arc<FunctionInner>,
}

struct FunctionInner {
    handle: usize,
    device: i32,
    name: Box<str>,
    /// Parameter sizes as the driver reports them, fetched on the first launch (or
    /// [`Function::param_sizes`]); when the driver cannot tell (before CUDA 12.4), the
    /// error that says so.
    params: OnceLock<std::result::Result<Box<[usize]>, Box<Error>>>,
    module: Arc<ModuleInner>,
}

impl fmt::Debug for Function {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Function")
            .field("name", &self.inner.name)
            .field("handle", &(self.inner.handle as *const c_void))
            .field("device", &self.inner.device)
            .finish()
    }
}

/// A kernel's attributes, as `cuFuncGetAttribute` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FunctionAttributes {
    /// Most threads per block this kernel can be launched with.
    pub max_threads_per_block: i32,
    /// Statically allocated shared memory per block, in bytes.
    pub shared_size_bytes: i32,
    /// User constant memory, in bytes.
    pub const_size_bytes: i32,
    /// Local memory per thread, in bytes.
    pub local_size_bytes: i32,
    /// Registers per thread.
    pub num_regs: i32,
    /// PTX virtual architecture, e.g. 90.
    pub ptx_version: i32,
    /// Binary architecture, e.g. 90.
    pub binary_version: i32,
    /// Whether compiled with `-Xptxas --dlcm=ca` (1) or not (0).
    pub cache_mode_ca: i32,
    /// Most dynamic shared memory per block a launch may ask for, in bytes (settable).
    pub max_dynamic_shared_size_bytes: i32,
    /// Preferred shared memory carveout in percent, or -1 for no preference (settable).
    pub preferred_shared_memory_carveout: i32,
}

impl Function {
    fn new(module: Arc<ModuleInner>, handle: sys::CUfunction, name: &str) -> Function {
        Function {
            inner: Arc::new(FunctionInner {
                handle: handle as usize,
                device: module.device,
                name: name.into(),
                params: OnceLock::new(),
                module,
            }),
        }
    }

    /// The raw `CUfunction` (valid while this function or its module lives).
    #[inline]
    pub fn as_raw(&self) -> sys::CUfunction {
        self.inner.handle as sys::CUfunction
    }

    /// The name the function was looked up by.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The device the function's module was loaded on.
    #[inline]
    pub fn device_id(&self) -> i32 {
        self.inner.device
    }

    /// Runs `launch`, which queues this kernel on `stream`, so that a capture begun
    /// through cuda-rt that takes the launch keeps the module loaded for its graph
    /// (see [`crate::capture::launch_keeping`]).
    #[inline(always)]
    pub(crate) fn enqueue_launch<S: crate::stream::AsStream + ?Sized, R>(
        &self,
        stream: &S,
        launch: impl FnOnce() -> Result<R>,
    ) -> Result<R> {
        crate::capture::launch_keeping(stream, &self.inner.module, launch)
    }

    /// Keeps the function's module for the capture cuda-rt began that `stream` is in,
    /// as a launch captured there would (see [`crate::capture::launch_keeping`]).
    pub(crate) fn keep_module_for_capture<S: crate::stream::AsStream + ?Sized>(&self, stream: &S) {
        crate::capture::keep_module(stream, &self.inner.module);
    }

    /// The identity of the function's module (its address, unique while it is loaded).
    pub(crate) fn module_identity(&self) -> usize {
        Arc::as_ptr(&self.inner.module) as usize
    }

    /// The module the function belongs to.
    pub fn module(&self) -> Module {
        Module {
            inner: self.inner.module.clone(),
        }
    }

    /// The sizes in bytes of the kernel's parameters, in order, as the driver reports
    /// them (`cuFuncGetParamInfo`, CUDA 12.4+): what every launch checks the count and
    /// sizes of its arguments against. Fetched once; clones share them.
    ///
    /// # Errors
    /// [`Error::NotSupported`] when the driver cannot report them (kind
    /// [`UnsupportedKind::DriverTooOld`] for a driver before 12.4), with a message such
    /// as `driver 12.2 cannot report kernel parameters (cuFuncGetParamInfo needs CUDA
    /// 12.4): launches of kernel saxpy are not checked for argument count or sizes`.
    /// Launches then go ahead unchecked: the count, like the types, rests on the
    /// caller's `# Safety` guarantee alone (see [`Function::launch`]).
    pub fn param_sizes(&self) -> Result<&[usize]> {
        self.params().as_deref().map_err(|e| (**e).clone())
    }

    /// The parameter sizes for a launch's checks, `None` when the driver cannot tell
    /// (the launch hot path: after the first call, one load and one branch).
    #[inline]
    pub(crate) fn known_param_sizes(&self) -> Option<&[usize]> {
        self.params().as_deref().ok()
    }

    #[inline]
    fn params(&self) -> &std::result::Result<Box<[usize]>, Box<Error>> {
        self.inner.params.get_or_init(|| {
            self.query_param_sizes()
                .ok_or_else(|| Box::new(self.params_unknown()))
        })
    }

    /// The sizes of the kernel's parameters (`cuFuncGetParamInfo`, CUDA 12.4+, asked
    /// index by index until the driver says there is none), or `None` when the driver
    /// cannot tell.
    #[cold]
    fn query_param_sizes(&self) -> Option<Box<[usize]>> {
        let mut sizes = Vec::new();
        loop {
            // SAFETY: the function belongs to a module this function keeps loaded.
            match unsafe { result::module::func_get_param_info(self.as_raw(), sizes.len()) } {
                Ok((_, size)) => sizes.push(size),
                // An index past the last parameter.
                Err(result::Error::Driver(d))
                    if d.code == sys::CUresult::CUDA_ERROR_INVALID_VALUE =>
                {
                    return Some(sizes.into_boxed_slice())
                }
                Err(_) => return None,
            }
            if sizes.len() > 4096 {
                return None;
            }
        }
    }

    /// Why the driver could not report the parameters (once per function).
    #[cold]
    fn params_unknown(&self) -> Error {
        let entry_point = result::api().is_ok_and(|a| a.cuFuncGetParamInfo().is_ok());
        params_unknown(self.name(), result::version().ok(), entry_point)
    }

    /// One attribute by the driver's raw enum value.
    pub fn attribute_raw(&self, attr: sys::CUfunction_attribute) -> Result<i32> {
        make_current(self.inner.device)?;
        // SAFETY: the function belongs to a module this function keeps loaded; its
        // context is current.
        Ok(unsafe { result::module::func_get_attribute(self.as_raw(), attr) }?)
    }

    /// Sets one attribute by the driver's raw enum value (CUDA allows only a few).
    pub fn set_attribute_raw(&self, attr: sys::CUfunction_attribute, value: i32) -> Result<()> {
        make_current(self.inner.device)?;
        // SAFETY: as in `attribute_raw`.
        Ok(unsafe { result::module::func_set_attribute(self.as_raw(), attr, value) }?)
    }

    /// Every attribute (CuPy's `Function.attributes`).
    pub fn attributes(&self) -> Result<FunctionAttributes> {
        use sys::CUfunction_attribute as A;
        let a = |attr| self.attribute_raw(attr);
        Ok(FunctionAttributes {
            max_threads_per_block: a(A::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            shared_size_bytes: a(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            const_size_bytes: a(A::CU_FUNC_ATTRIBUTE_CONST_SIZE_BYTES)?,
            local_size_bytes: a(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            num_regs: a(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            ptx_version: a(A::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
            binary_version: a(A::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
            cache_mode_ca: a(A::CU_FUNC_ATTRIBUTE_CACHE_MODE_CA)?,
            max_dynamic_shared_size_bytes: a(A::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES)?,
            preferred_shared_memory_carveout: a(
                A::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            )?,
        })
    }

    /// Lets launches ask for up to `bytes` of dynamic shared memory per block (above
    /// 48 KiB needs this opt-in).
    pub fn set_max_dynamic_shared_memory(&self, bytes: i32) -> Result<()> {
        self.set_attribute_raw(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            bytes,
        )
    }

    /// The preferred shared memory carveout, in percent of the maximum (0..=100), or
    /// -1 for no preference.
    pub fn set_preferred_shared_memory_carveout(&self, percent: i32) -> Result<()> {
        if !(-1..=100).contains(&percent) {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("shared memory carveout {percent}: must be -1 or 0..=100 percent"),
            ));
        }
        self.set_attribute_raw(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
            percent,
        )
    }

    /// How many blocks of `block_size` threads using `dynamic_shared_bytes` can be
    /// active at once on one multiprocessor.
    pub fn max_active_blocks_per_multiprocessor(
        &self,
        block_size: u32,
        dynamic_shared_bytes: usize,
    ) -> Result<i32> {
        let block = i32::try_from(block_size).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("block size {block_size}"),
            )
        })?;
        make_current(self.inner.device)?;
        // SAFETY: as in `attribute_raw`.
        Ok(unsafe {
            result::module::occupancy_max_active_blocks_per_multiprocessor(
                self.as_raw(),
                block,
                dynamic_shared_bytes,
            )
        }?)
    }

    /// The block size that maximises occupancy, and the smallest grid that fills the
    /// device at that size: `(min_grid_size, block_size)`. `block_size_limit` 0 means
    /// no limit.
    pub fn suggested_block_size(
        &self,
        dynamic_shared_bytes: usize,
        block_size_limit: u32,
    ) -> Result<(u32, u32)> {
        let limit = i32::try_from(block_size_limit).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("block size limit {block_size_limit}"),
            )
        })?;
        make_current(self.inner.device)?;
        // SAFETY: as in `attribute_raw`.
        let (grid, block) = unsafe {
            result::module::occupancy_max_potential_block_size(
                self.as_raw(),
                dynamic_shared_bytes,
                limit,
            )
        }?;
        Ok((grid.max(0) as u32, block.max(0) as u32))
    }
}

/// [`Function::param_sizes`]' error: `driver_version` is what `cuDriverGetVersion`
/// says (if anything); `entry_point` whether the driver has `cuFuncGetParamInfo` at all
/// (its absence means a driver before 12.4).
fn params_unknown(kernel: &str, driver_version: Option<i32>, entry_point: bool) -> Error {
    const UNCHECKED: &str = "are not checked for argument count or sizes";
    const NEEDED: CudaVersion = CudaVersion {
        major: 12,
        minor: 4,
    };
    let driver = match driver_version {
        Some(v) => format!("driver {}", cuda_sys::format_version(v)),
        None => "the driver (version unknown)".to_owned(),
    };
    if entry_point {
        Error::not_supported(
            UnsupportedKind::Other,
            format!(
                "{driver} did not report the parameters of kernel {kernel} \
                 (cuFuncGetParamInfo failed): launches of it {UNCHECKED}"
            ),
        )
    } else {
        Error::not_supported(
            UnsupportedKind::DriverTooOld {
                version: driver_version.and_then(CudaVersion::from_int),
                needed: NEEDED,
            },
            format!(
                "{driver} cannot report kernel parameters (cuFuncGetParamInfo needs CUDA \
                 {NEEDED}): launches of kernel {kernel} {UNCHECKED}"
            ),
        )
    }
}

/// Whether a module is still loaded, without keeping it loaded: for tests that check
/// when a module goes (feature `test-util`; made by
/// [`testing::watch_module`](crate::testing::watch_module)).
#[cfg(any(test, feature = "test-util"))]
#[derive(Clone)]
pub struct ModuleWatch(std::sync::Weak<ModuleInner>);

#[cfg(any(test, feature = "test-util"))]
impl ModuleWatch {
    /// A watch on `module`.
    pub(crate) fn new(module: &Module) -> ModuleWatch {
        ModuleWatch(Arc::downgrade(&module.inner))
    }

    /// Whether the module is loaded: something (a [`Module`], a [`Function`], a graph)
    /// still holds it. `false` once it was unloaded (`cuModuleUnload`).
    pub fn is_loaded(&self) -> bool {
        self.0.strong_count() > 0
    }
}

#[cfg(any(test, feature = "test-util"))]
impl fmt::Debug for ModuleWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModuleWatch")
            .field("loaded", &self.is_loaded())
            .finish()
    }
}

/// `true` if the driver's kernel parameter table can be read (for tests; feature
/// `test-util`).
#[cfg(feature = "test-util")]
pub fn driver_reports_param_sizes() -> bool {
    result::api().is_ok_and(|a| a.cuFuncGetParamInfo().is_ok())
}

/// A `CString` for a symbol name, or an error naming it.
/// Refuses, before any driver call, a kernel name no loaded image can export: a
/// symbol is a C identifier (an `extern "C"` kernel) or a mangled name, which is one
/// too (`[A-Za-z_][A-Za-z0-9_]*`). `$` and `.` are let through here, for images
/// (PTX, cubins) that a compiler other than NVRTC wrote: PTX identifiers may hold
/// `$`, and other toolchains' ELF symbols `.`. Kernels compiled from CUDA C++ follow
/// the stricter [`check_source_kernel_name`]. A C++ name (a template instance, a
/// namespace path, a signature) is not a symbol: the message says how to get one.
pub(crate) fn check_kernel_name(name: &str) -> Result<()> {
    check_name(name, true)
}

/// CuPy's `is_valid_kernel_name` for a kernel compiled from CUDA C++ and asked for by
/// a plain name: a C identifier, `[A-Za-z_][A-Za-z0-9_]*`, so `$` and `.` are refused
/// (an [`Error::InvalidArgument`] naming the rule). Nothing legitimate is lost: a C++
/// kernel's symbol is its identifier (`extern "C"`) or its Itanium-mangled name, both
/// made of letters, digits and `_`, and every other C++ name is asked for through a
/// name expression, which is looked up by NVRTC's lowered name and never checked here.
pub(crate) fn check_source_kernel_name(name: &str) -> Result<()> {
    check_name(name, false)
}

fn check_name(name: &str, image_symbols: bool) -> Result<()> {
    let extra = |c: char| image_symbols && matches!(c, '$' | '.');
    let symbol_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || extra(c);
    let first_ok = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || (extra(c) && c != '.'));
    if first_ok && name.chars().all(symbol_char) {
        return Ok(());
    }
    let why = if name.is_empty() {
        "is empty".to_owned()
    } else if name.contains(['<', '>', ':', '(', ')', ',', ' ']) {
        "is a C++ name, not a symbol: compile the program with it as a name expression \
         (RawModule::from_source's name_expressions) and ask the RawModule for it by that \
         expression, or declare the kernel extern \"C\""
            .to_owned()
    } else if image_symbols {
        "is not a valid symbol (letters, digits, '_', '$' and '.', not starting with a \
         digit or '.')"
            .to_owned()
    } else {
        "is not a valid kernel name: a kernel compiled from CUDA C++ is named by a C \
         identifier (letters, digits and '_', not starting with a digit; '$' and '.' are \
         refused, as CuPy's is_valid_kernel_name refuses them), or asked for by a name \
         expression given at compile time"
            .to_owned()
    };
    Err(Error::invalid_argument(
        ArgumentKind::InvalidValue,
        format!("kernel name {name:?} {why}"),
    ))
}

fn c_name(what: &str, name: &str) -> Result<CString> {
    CString::new(name).map_err(|_| {
        Error::invalid_argument(
            ArgumentKind::InteriorNul,
            format!("{what} name {name:?} contains a NUL byte"),
        )
    })
}

/// Size of the JIT error log buffer handed to `cuModuleLoadDataEx`.
const JIT_LOG_BYTES: usize = 8192;

thread_local! {
    /// This thread's JIT error log buffer, handed to the driver by every load: a fresh
    /// zeroed 8 KiB per load cost each module load (a kernel's first use from the disk
    /// cache among them) an allocation, a memset and a free beside the driver's work.
    static JIT_LOG: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Loads a PTX, cubin or fatbin image in the current context (`cuModuleLoadDataEx`).
/// On failure the JIT error log, if any, is appended to the message.
///
/// # Safety
/// `image` is a complete image: PTX ending with a NUL byte, or a whole cubin or fatbin.
unsafe fn load_image(image: &[u8]) -> Result<sys::CUmodule> {
    let kept = JIT_LOG.try_with(|log| {
        log.try_borrow_mut()
            // SAFETY: `image` is complete (caller).
            .map(|mut log| unsafe { load_image_logged(image, &mut log) })
    });
    match kept {
        Ok(Ok(loaded)) => loaded,
        // The thread is exiting (its buffer is gone), or a load is under way on it: a
        // buffer of this load's own.
        // SAFETY: `image` is complete (caller).
        _ => unsafe { load_image_logged(image, &mut Vec::new()) },
    }
}

/// [`load_image`] with `log` as the JIT error log buffer (made [`JIT_LOG_BYTES`] long,
/// zeroed, if it is not).
///
/// # Safety
/// As [`load_image`].
unsafe fn load_image_logged(image: &[u8], log: &mut Vec<u8>) -> Result<sys::CUmodule> {
    if log.len() != JIT_LOG_BYTES {
        *log = vec![0u8; JIT_LOG_BYTES];
    }
    // Empty unless this load writes a log: the buffer may hold an earlier load's.
    log[0] = 0;
    let mut options = [
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
        sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
    ];
    let mut values: [*mut c_void; 2] = [log.as_mut_ptr().cast(), JIT_LOG_BYTES as *mut c_void];
    // SAFETY: the image is complete (caller); the log buffer holds JIT_LOG_BYTES bytes,
    // the size passed with it (by value, as CUDA wants), and outlives the call.
    match unsafe { result::module::load_data_ex(image.as_ptr().cast(), &mut options, &mut values) }
    {
        Ok(module) => Ok(module),
        Err(result::Error::Driver(d)) => {
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
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn kernel_names_are_checked_before_the_driver() {
        for ok in ["saxpy", "_Z6kernelIfEvPT_", "k2", "_k", "$k"] {
            super::check_kernel_name(ok).unwrap();
        }
        // '$' and '.' are let through for loaded images...
        super::check_kernel_name("k.cold").unwrap();
        // ... but not for kernels compiled from source (CuPy's is_valid_kernel_name).
        for ok in ["saxpy", "_Z6kernelIfEvPT_", "k2", "_k"] {
            super::check_source_kernel_name(ok).unwrap();
        }
        for bad in ["$k", "k$1", "k.cold", ".k"] {
            let e = super::check_source_kernel_name(bad).unwrap_err();
            assert!(
                matches!(
                    e,
                    Error::InvalidArgument {
                        kind: ArgumentKind::InvalidValue,
                        ..
                    }
                ),
                "{bad:?}: {e:?}"
            );
            let msg = e.to_string();
            assert!(msg.contains("is not a valid kernel name"), "{bad:?}: {msg}");
            assert!(msg.contains("'$' and '.' are refused"), "{bad:?}: {msg}");
        }
        assert!(super::check_source_kernel_name("k<float>")
            .unwrap_err()
            .to_string()
            .contains("name expression"));
        assert!(super::check_kernel_name(".k").is_err());
        for (bad, says) in [
            ("", "is empty"),
            ("k<float>", "name expression"),
            ("ns::k", "name expression"),
            ("k(float*)", "name expression"),
            ("2k", "not a valid symbol"),
            ("k-1", "not a valid symbol"),
            ("k\0", "not a valid symbol"),
        ] {
            let e = super::check_kernel_name(bad).unwrap_err();
            assert!(e.to_string().contains(says), "{bad:?}: {e}");
        }
    }

    use super::*;

    fn message(e: &Error) -> &str {
        match e {
            Error::NotSupported { message, .. } => message,
            other => panic!("expected NotSupported, got {other:?}"),
        }
    }

    #[test]
    fn a_driver_before_12_4_is_named_with_the_version_it_needs() {
        let e = params_unknown("saxpy", Some(12020), false);
        assert_eq!(
            message(&e),
            "driver 12.2 cannot report kernel parameters (cuFuncGetParamInfo needs CUDA \
             12.4): launches of kernel saxpy are not checked for argument count or sizes"
        );
        assert!(matches!(
            e,
            Error::NotSupported {
                kind: UnsupportedKind::DriverTooOld {
                    version: Some(CudaVersion {
                        major: 12,
                        minor: 2
                    }),
                    needed: CudaVersion {
                        major: 12,
                        minor: 4
                    },
                },
                ..
            }
        ));
        assert!(
            e.to_string().starts_with("not supported: driver 12.2"),
            "{e}"
        );
    }

    #[test]
    fn an_unknown_version_or_a_failed_query_still_says_the_launch_is_unchecked() {
        let e = params_unknown("k", None, false);
        let m = message(&e);
        assert!(
            m.starts_with("the driver (version unknown) cannot report"),
            "{m}"
        );
        assert!(m.contains("needs CUDA 12.4"), "{m}");
        assert!(matches!(
            e,
            Error::NotSupported {
                kind: UnsupportedKind::DriverTooOld { version: None, .. },
                ..
            }
        ));
        let e = params_unknown("k", Some(13000), true);
        let m = message(&e);
        assert!(
            m.starts_with("driver 13.0 did not report the parameters of kernel k"),
            "{m}"
        );
        assert!(m.contains("cuFuncGetParamInfo failed"), "{m}");
        assert!(
            m.ends_with("not checked for argument count or sizes"),
            "{m}"
        );
        assert!(matches!(
            e,
            Error::NotSupported {
                kind: UnsupportedKind::Other,
                ..
            }
        ));
    }
}
