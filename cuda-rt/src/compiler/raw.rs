//! CuPy's `RawModule` and `RawKernel`: CUDA C++ compiled by NVRTC (through the kernel
//! cache) and loaded on the current device.

use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::path::Path;
use std::sync::{Arc, Mutex};

use super::{Compiled, KernelCache, Output, Program, Target};
use crate::device::get_device_id;
use crate::error::Result;
use crate::module::{Function, Module};

struct RawInner {
    module: Module,
    output: Option<Output>,
    arch: Option<u32>,
    log: String,
    lowered_names: Vec<(String, String)>,
    functions: Mutex<HashMap<String, Function>>,
}

/// A module compiled from CUDA C++ source (or loaded from an image), with its kernels
/// looked up by name or by name expression. Cheap to clone; the kernel cache hands out
/// clones of one module per device and program.
#[derive(Clone)]
pub struct RawModule {
    inner: Arc<RawInner>,
}

impl fmt::Debug for RawModule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawModule")
            .field("module", &self.inner.module)
            .field("arch", &self.inner.arch)
            .field("output", &self.inner.output)
            .field("lowered_names", &self.inner.lowered_names)
            .finish()
    }
}

impl RawModule {
    /// Compiles `code` for the current device (cubin, architecture capped at the
    /// newest NVRTC supports) with `options` and `name_expressions`, through the
    /// global [`KernelCache`], and loads it. A compile error is an
    /// [`Error::Compile`](crate::Error::Compile) with the log.
    pub fn from_source(
        code: &str,
        options: &[&str],
        name_expressions: &[&str],
    ) -> Result<RawModule> {
        let program = Program::new(code)
            .options(options)
            .name_expressions(name_expressions);
        Self::from_program(&program, Output::Cubin, KernelCache::global())
    }

    /// Compiles `program` to `output` for the current device through `cache`.
    pub fn from_program(
        program: &Program<'_>,
        output: Output,
        cache: &KernelCache,
    ) -> Result<RawModule> {
        let device = get_device_id();
        let target = Target {
            output,
            ..Target::for_device(device)?
        };
        cache.module(device, program, target)
    }

    /// Loads a PTX, cubin or fatbin file on the current device (CuPy's `path=`).
    pub fn from_file(path: impl AsRef<Path>) -> Result<RawModule> {
        Ok(Self::wrap(
            Module::load_file(path)?,
            None,
            None,
            String::new(),
            Vec::new(),
        ))
    }

    /// Loads a PTX, cubin or fatbin image on the current device.
    pub fn from_image(image: &[u8]) -> Result<RawModule> {
        Ok(Self::wrap(
            Module::load_data(image)?,
            None,
            None,
            String::new(),
            Vec::new(),
        ))
    }

    pub(crate) fn load(device: i32, compiled: Compiled) -> Result<RawModule> {
        let module = Module::load_data_on(device, &compiled.image)?;
        Ok(Self::wrap(
            module,
            Some(compiled.output),
            Some(compiled.arch),
            compiled.log,
            compiled.lowered_names,
        ))
    }

    fn wrap(
        module: Module,
        output: Option<Output>,
        arch: Option<u32>,
        log: String,
        lowered_names: Vec<(String, String)>,
    ) -> RawModule {
        RawModule {
            inner: Arc::new(RawInner {
                module,
                output,
                arch,
                log,
                lowered_names,
                functions: Mutex::new(HashMap::new()),
            }),
        }
    }

    /// The kernel `name`: a name expression given at compile time (looked up by its
    /// lowered name) or a plain (`extern "C"` or mangled) name. Looked up once, then
    /// cached in this module.
    pub fn get_function(&self, name: &str) -> Result<Function> {
        let mut map = self
            .inner
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(name) {
            return Ok(f.clone());
        }
        let symbol = self.lowered_name(name).unwrap_or(name);
        let f = self.inner.module.get_function(symbol)?;
        map.insert(name.to_owned(), f.clone());
        Ok(f)
    }

    /// The lowered (mangled) name of a name expression given at compile time.
    pub fn lowered_name(&self, expr: &str) -> Option<&str> {
        self.inner
            .lowered_names
            .iter()
            .find(|(e, _)| e == expr)
            .map(|(_, l)| l.as_str())
    }

    /// `(name expression, lowered name)` pairs.
    pub fn lowered_names(&self) -> &[(String, String)] {
        &self.inner.lowered_names
    }

    /// Device address and size of a `__device__` or `__constant__` variable (a name
    /// expression is lowered first).
    pub fn get_global(&self, name: &str) -> Result<(u64, usize)> {
        self.inner
            .module
            .get_global(self.lowered_name(name).unwrap_or(name))
    }

    /// NVRTC's log of the compile (warnings); empty for loaded images.
    pub fn compile_log(&self) -> &str {
        &self.inner.log
    }

    /// The architecture compiled for (`None` for loaded images).
    pub fn arch(&self) -> Option<u32> {
        self.inner.arch
    }

    /// What was compiled to (`None` for loaded images).
    pub fn output(&self) -> Option<Output> {
        self.inner.output
    }

    /// The underlying [`Module`].
    pub fn module(&self) -> &Module {
        &self.inner.module
    }

    /// Whether two handles share one loaded module.
    pub fn same_module(&self, other: &RawModule) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

/// One kernel compiled from CUDA C++ (CuPy's `RawKernel`): dereferences to its
/// [`Function`], so it launches and reports attributes directly.
///
/// Its launch methods are [`Function`]'s ([`launch`](Function::launch),
/// [`launch_on`](Function::launch_on), [`launch_cooperative`](Function::launch_cooperative),
/// [`launch_ex`](Function::launch_ex), [`launch_raw`](Function::launch_raw) and the
/// [`launch!`](crate::launch!) macro): `unsafe`, since the kernel runs with whatever
/// arguments the caller passes; each one's `# Safety` says what the caller guarantees
/// (the arguments match the kernel's parameters; every pointer the kernel follows is
/// valid, on the kernel's device, until it completes; no data race).
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::{LaunchConfig, RawKernel};
/// let k = RawKernel::new(
///     r#"extern "C" __global__ void fill(int* out, int v, int n) {
///            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = v; }"#,
///     "fill",
///     &[],
/// )?;
/// let n = 4096i32;
/// let out = cuda_rt::alloc(4 * n as usize)?;
/// // SAFETY: fill(int* out, int v, int n): out holds n ints on k's device, alive and
/// // untouched by anything else until the synchronize below.
/// unsafe { k.launch(&LaunchConfig::for_num_elems(&k, n as u32)?, &[&out, &7i32, &n])? };
/// cuda_rt::synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct RawKernel {
    module: RawModule,
    function: Function,
}

impl RawKernel {
    /// Compiles `code` (through the kernel cache) for the current device and looks up
    /// the kernel `name`. A second call with the same arguments compiles and loads
    /// nothing.
    pub fn new(code: &str, name: &str, options: &[&str]) -> Result<RawKernel> {
        Self::from_module(RawModule::from_source(code, options, &[])?, name)
    }

    /// The kernel `name` of `module` (a name expression or a plain name).
    pub fn from_module(module: RawModule, name: &str) -> Result<RawKernel> {
        let function = module.get_function(name)?;
        Ok(RawKernel { module, function })
    }

    /// The kernel.
    pub fn function(&self) -> &Function {
        &self.function
    }

    /// The module the kernel lives in.
    pub fn raw_module(&self) -> &RawModule {
        &self.module
    }
}

impl Deref for RawKernel {
    type Target = Function;
    fn deref(&self) -> &Function {
        &self.function
    }
}
