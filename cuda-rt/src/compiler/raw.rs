//! CuPy's `RawModule` and `RawKernel`: CUDA C++ compiled by NVRTC (through the kernel
//! cache) and loaded on the current device.

use std::cell::RefCell;
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
///
/// ```no_run
/// # fn main() -> cuda_rt::Result<()> {
/// use cuda_rt::{DeviceBuffer, LaunchConfig, RawModule};
/// let src = r#"
///     template <typename T> __global__ void scale(T* x, T a, int n) {
///         int i = blockIdx.x * blockDim.x + threadIdx.x;
///         if (i < n) x[i] *= a;
///     }"#;
/// // One kernel per name expression, compiled once for the current device.
/// let module = RawModule::from_source(src, &["-std=c++17"], &["scale<float>", "scale<double>"])?;
/// let scale = module.get_function("scale<double>")?;
/// let mut x = DeviceBuffer::from_slice(&[1.5f64; 1000])?;
/// let cfg = LaunchConfig::for_num_elems_with_block(1000, 128);
/// // SAFETY: scale<double>(double* x, double a, int n): x holds 1000 doubles on this
/// // device; `to_vec` reads it on the same stream, after the kernel.
/// unsafe { cuda_rt::launch!(scale, &cfg, (&mut x, 4.0f64, 1000i32))? };
/// assert_eq!(x.to_vec()?, vec![6.0; 1000]);
/// # Ok(()) }
/// ```
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
    ///
    /// A plain name of a module compiled from source must be a C identifier
    /// (`[A-Za-z_][A-Za-z0-9_]*`, CuPy's `is_valid_kernel_name`): `$` and `.` are
    /// refused with an [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming
    /// the rule, before the driver is asked. No C++ kernel needs them: its symbol is
    /// its identifier or its mangled name, and any other C++ name goes through a name
    /// expression. A module loaded from an image ([`from_file`](Self::from_file),
    /// [`from_image`](Self::from_image)) also takes `$` and `.`, which PTX and other
    /// toolchains' symbols may contain.
    pub fn get_function(&self, name: &str) -> Result<Function> {
        let mut map = self
            .inner
            .functions
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(f) = map.get(name) {
            return Ok(f.clone());
        }
        let lowered = self.lowered_name(name);
        if lowered.is_none() && self.inner.output.is_some() {
            crate::module::check_source_kernel_name(name)?;
        }
        let symbol = lowered.unwrap_or(name);
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
/// unsafe { k.launch(&LaunchConfig::for_num_elems_occupancy(&k, n as u32)?, &[&out, &7i32, &n])? };
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
    /// the kernel `name`, a C identifier (`$` and `.` are refused before compiling, as
    /// CuPy's `is_valid_kernel_name` does; see [`RawModule::get_function`]). A second
    /// call with the same arguments compiles and loads nothing, and on the thread that
    /// made it before costs a comparison of the arguments and two reference counts:
    /// each thread remembers its last few kernels, checked against the whole source,
    /// name and options, so a source that changed in place is never mistaken for the
    /// one remembered.
    pub fn new(code: &str, name: &str, options: &[&str]) -> Result<RawKernel> {
        let cache = KernelCache::global();
        // Read before the slow lookup: a clear_memory racing with it leaves the entry
        // marked with the old generation, so it is never used.
        let q = recent::Query {
            generation: cache.generation(),
            device: get_device_id(),
            code,
            name,
            options,
        };
        if let Some(k) = recent::find(&q) {
            cache.count_memory_hit();
            return Ok(k);
        }
        crate::module::check_source_kernel_name(name)?;
        let k = Self::from_module(RawModule::from_source(code, options, &[])?, name)?;
        recent::remember(&q, &k);
        Ok(k)
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

/// Each thread's last few `RawKernel::new` results, so a repeated construction (a
/// kernel built inside a loop, as CuPy code often does) skips hashing the whole source
/// and two locked maps. An entry is used only when the source, name, options and
/// device are equal to the ones it was made for (the source's address is only a quick
/// filter: a string freed and another one built at the same address is compared in
/// full) and the global cache has not been cleared since.
mod recent {
    use super::*;

    /// Kernels remembered per thread: enough for a loop that builds a few kernels,
    /// small enough that a miss scans little.
    pub(super) const SLOTS: usize = 8;

    struct Entry<T> {
        generation: u64,
        device: i32,
        /// Where the source was when remembered: most repeats pass the same string.
        source_addr: usize,
        source: Box<str>,
        name: Box<str>,
        options: Box<[Box<str>]>,
        value: T,
    }

    impl<T> Entry<T> {
        fn matches(&self, q: &Query<'_>) -> bool {
            self.generation == q.generation
                && self.device == q.device
                && self.source.len() == q.code.len()
                && *self.name == *q.name
                && self.options.len() == q.options.len()
                && self.options.iter().zip(q.options).all(|(a, b)| **a == **b)
                // Last: the only comparison whose cost grows with the source.
                && *self.source == *q.code
        }
    }

    /// What a lookup is for.
    pub(super) struct Query<'a> {
        pub generation: u64,
        pub device: i32,
        pub code: &'a str,
        pub name: &'a str,
        pub options: &'a [&'a str],
    }

    /// The last [`SLOTS`] values remembered, oldest first. Pure (no CUDA): the thread
    /// list below is one of these.
    pub(super) struct Recent<T> {
        entries: Vec<Entry<T>>,
    }

    impl<T: Clone> Recent<T> {
        pub(super) const fn new() -> Recent<T> {
            Recent {
                entries: Vec::new(),
            }
        }

        /// The value remembered for `q`, if any.
        pub(super) fn find(&self, q: &Query<'_>) -> Option<T> {
            let addr = q.code.as_ptr() as usize;
            // The same address first (the usual repeat), then any equal source.
            self.entries
                .iter()
                .rev()
                .find(|e| e.source_addr == addr && e.matches(q))
                .or_else(|| self.entries.iter().rev().find(|e| e.matches(q)))
                .map(|e| e.value.clone())
        }

        /// Remembers `value` for `q`; returns what was forgotten (the oldest entry when
        /// full, and every entry of an older generation) for the caller to drop.
        pub(super) fn remember(&mut self, q: &Query<'_>, value: T) -> Vec<T> {
            let entry = Entry {
                generation: q.generation,
                device: q.device,
                source_addr: q.code.as_ptr() as usize,
                source: q.code.into(),
                name: q.name.into(),
                options: q.options.iter().map(|o| Box::<str>::from(*o)).collect(),
                value,
            };
            let (live, mut old): (Vec<_>, Vec<_>) = std::mem::take(&mut self.entries)
                .into_iter()
                .partition(|e| e.generation == q.generation);
            self.entries = live;
            if self.entries.len() >= SLOTS {
                old.push(self.entries.remove(0));
            }
            self.entries.push(entry);
            old.into_iter().map(|e| e.value).collect()
        }
    }

    thread_local! {
        static RECENT: RefCell<Recent<RawKernel>> = const { RefCell::new(Recent::new()) };
    }

    /// The kernel this thread remembers for `q`, if any. `None` also while the
    /// thread's storage is being torn down.
    pub(super) fn find(q: &Query<'_>) -> Option<RawKernel> {
        RECENT
            .try_with(|r| r.try_borrow().ok()?.find(q))
            .ok()
            .flatten()
    }

    /// Remembers `kernel` for `q` on this thread.
    pub(super) fn remember(q: &Query<'_>, kernel: &RawKernel) {
        // What is forgotten is dropped after the borrow ends, so that nothing a
        // module's unload might do runs while the thread's list is borrowed.
        let forgotten = RECENT
            .try_with(|r| Some(r.try_borrow_mut().ok()?.remember(q, kernel.clone())))
            .ok()
            .flatten();
        drop(forgotten);
    }
}

#[cfg(test)]
mod tests {
    use super::recent::{Query, Recent, SLOTS};

    fn q<'a>(generation: u64, code: &'a str, name: &'a str, options: &'a [&'a str]) -> Query<'a> {
        Query {
            generation,
            device: 0,
            code,
            name,
            options,
        }
    }

    #[test]
    fn a_source_changed_at_the_same_address_is_not_taken_for_the_one_remembered() {
        let mut r = Recent::new();
        let mut src = String::from("extern \"C\" __global__ void k() {}");
        r.remember(&q(0, &src, "k", &[]), 1u32);
        assert_eq!(r.find(&q(0, &src, "k", &[])), Some(1));
        // Same buffer, same length, one byte different.
        src.replace_range(0..1, "E");
        assert_eq!(r.find(&q(0, &src, "k", &[])), None);
        // An equal source elsewhere is found.
        let copy = String::from("extern \"C\" __global__ void k() {}");
        assert_eq!(r.find(&q(0, &copy, "k", &[])), Some(1));
    }

    #[test]
    fn name_options_device_and_generation_are_all_part_of_the_key() {
        let mut r = Recent::new();
        let src = "s";
        r.remember(&q(0, src, "k", &["-O3"]), 1u32);
        assert_eq!(r.find(&q(0, src, "k", &["-O3"])), Some(1));
        assert_eq!(r.find(&q(0, src, "j", &["-O3"])), None);
        assert_eq!(r.find(&q(0, src, "k", &[])), None);
        assert_eq!(r.find(&q(0, src, "k", &["-O2"])), None);
        assert_eq!(r.find(&q(1, src, "k", &["-O3"])), None);
        let mut other_device = q(0, src, "k", &["-O3"]);
        other_device.device = 1;
        assert_eq!(r.find(&other_device), None);
        // A newer generation forgets the older entries.
        assert_eq!(r.remember(&q(1, src, "j", &[]), 2), vec![1]);
    }

    #[test]
    fn the_oldest_entry_is_forgotten_when_full() {
        let mut r = Recent::new();
        let names: Vec<String> = (0..=SLOTS).map(|i| format!("k{i}")).collect();
        for (i, n) in names.iter().enumerate().take(SLOTS) {
            assert!(r.remember(&q(0, "s", n, &[]), i).is_empty());
        }
        assert_eq!(r.remember(&q(0, "s", &names[SLOTS], &[]), SLOTS), vec![0]);
        assert_eq!(r.find(&q(0, "s", &names[0], &[])), None);
        assert_eq!(r.find(&q(0, "s", &names[1], &[])), Some(1));
    }
}
