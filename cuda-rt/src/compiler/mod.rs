//! NVRTC: compile CUDA C++ to cubin or PTX, with a kernel cache in memory and on disk,
//! and CuPy's [`RawModule`] / [`RawKernel`] on top.
//!
//! The disk cache uses its folder only if the folder is the user's and writable by
//! nobody else, and its entries only if they are the user's alone and whole (their
//! checksum matches); otherwise kernels are cached in memory only
//! ([`KernelCache::memory_only_reason`] says why). See
//! [`cache`] for exactly what the folder is trusted with.
//!
//! By default a program is compiled for the current device's architecture, capped at
//! the newest one the loaded NVRTC supports, to a cubin (`-arch=sm_XY`); PTX
//! (`-arch=compute_XY`) when asked. An explicit [`Target`] compiles without any GPU,
//! which is how the tests run on machines with only `libnvrtc`.
//!
//! ```no_run
//! # fn main() -> cuda_rt::Result<()> {
//! use cuda_rt::compiler::{Program, Target};
//! let ptx = Program::new(r#"extern "C" __global__ void k(int* p) { *p = 1; }"#)
//!     .options(&["-std=c++17"])
//!     .compile(Target::ptx(90))?;
//! assert!(ptx.image.starts_with(b"//"));
//! # Ok(()) }
//! ```

pub mod cache;
mod cache_dir;
mod hash;
pub mod link;
mod nvcc;
mod nvrtc;
pub mod nvrtc_facts;
mod raw;
pub mod toolkit;

use std::sync::OnceLock;

pub use cache::{KernelCache, KernelCacheStats};
pub use nvcc::{find_nvcc, NVCC_VAR};
pub use raw::{RawKernel, RawModule};

use crate::device::context::MAX_DEVICES;
use crate::error::{ArgumentKind, Error, Result, StateKind, UnsupportedKind};

/// The source name used when none is given (it appears in compile logs).
pub const DEFAULT_SOURCE_NAME: &str = "cuda_rt_kernel.cu";

/// What NVRTC produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Output {
    /// A cubin for one real architecture (`-arch=sm_XY`); loads without a JIT step.
    #[default]
    Cubin,
    /// PTX for a virtual architecture (`-arch=compute_XY`); the driver JITs it at load.
    Ptx,
}

/// Which compiler turns a [`Program`] into an image (CuPy's `backend=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Backend {
    /// NVRTC, loaded at run time (no toolkit needed): the default.
    #[default]
    Nvrtc,
    /// The toolkit's `nvcc`, run on a temporary file (see [`find_nvcc`] for where it
    /// is looked for). No name expressions; the options are `nvcc`'s.
    Nvcc,
}

/// The architecture and output kind of a compile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    /// Compute capability as `10 * major + minor`, e.g. 90 for sm_90.
    pub arch: u32,
    /// Cubin or PTX.
    pub output: Output,
}

impl Target {
    /// A cubin for `sm_{arch}`.
    pub const fn cubin(arch: u32) -> Target {
        Target {
            arch,
            output: Output::Cubin,
        }
    }

    /// PTX for `compute_{arch}`.
    pub const fn ptx(arch: u32) -> Target {
        Target {
            arch,
            output: Output::Ptx,
        }
    }

    /// A cubin for device `device`'s architecture, capped at the newest one the loaded
    /// NVRTC supports.
    pub fn for_device(device: i32) -> Result<Target> {
        Ok(Target::cubin(arch_for_device(device)?))
    }

    /// The `-arch=` option NVRTC gets for this target.
    pub fn arch_option(&self) -> String {
        match self.output {
            Output::Cubin => format!("-arch=sm_{}", self.arch),
            Output::Ptx => format!("-arch=compute_{}", self.arch),
        }
    }
}

/// The result of a compile: the image, NVRTC's log (warnings) and the lowered names of
/// the name expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The cubin, or the PTX text (NUL-terminated).
    pub image: Vec<u8>,
    /// What [`image`](Compiled::image) is.
    pub output: Output,
    /// The architecture compiled for (as in [`Target::arch`]).
    pub arch: u32,
    /// NVRTC's log of the successful compile: warnings, often empty.
    pub log: String,
    /// `(name expression, lowered name)` pairs, in the order given.
    pub lowered_names: Vec<(String, String)>,
}

impl Compiled {
    /// The lowered (mangled) name of `expr`, if it was a name expression.
    pub fn lowered_name(&self, expr: &str) -> Option<&str> {
        self.lowered_names
            .iter()
            .find(|(e, _)| e == expr)
            .map(|(_, l)| l.as_str())
    }

    /// The compile's warnings (the log), empty when there were none.
    pub fn warnings(&self) -> &str {
        &self.log
    }
}

/// A CUDA C++ program to compile: source, source name, options and name expressions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Program<'a> {
    /// The CUDA C++ source.
    pub source: &'a str,
    /// The name the source is compiled under (shown in logs and errors).
    pub source_name: &'a str,
    /// NVRTC options, passed through (an `-arch` option here replaces the target's).
    pub options: &'a [&'a str],
    /// Name expressions (e.g. `my_kernel<float>`), lowered after compiling.
    pub name_expressions: &'a [&'a str],
    /// Whether NVRTC also gets the include folders of the CUDA toolkit and CCCL
    /// ([`toolkit::toolkit_includes`]), after the options' own `-I` folders (so those
    /// win). On by default.
    pub toolkit_includes: bool,
    /// The compiler: NVRTC unless [`Backend::Nvcc`] is asked for.
    pub backend: Backend,
}

impl<'a> Program<'a> {
    /// `source` under [`DEFAULT_SOURCE_NAME`], no options, no name expressions.
    pub fn new(source: &'a str) -> Program<'a> {
        Program {
            source,
            source_name: DEFAULT_SOURCE_NAME,
            options: &[],
            name_expressions: &[],
            toolkit_includes: true,
            backend: Backend::Nvrtc,
        }
    }

    /// Compiled by `backend` ([`Backend::Nvcc`]: the toolkit's `nvcc`).
    pub fn backend(mut self, backend: Backend) -> Program<'a> {
        self.backend = backend;
        self
    }

    /// With or without the toolkit's include folders (see
    /// [`toolkit_includes`](Program::toolkit_includes)).
    pub fn toolkit_includes(mut self, on: bool) -> Program<'a> {
        self.toolkit_includes = on;
        self
    }

    /// The toolkit include folders this program is compiled with: the process's
    /// ([`toolkit::toolkit_includes`]) unless turned off.
    pub fn include_set(&self) -> Option<&'static toolkit::IncludeSet> {
        if self.toolkit_includes && self.backend == Backend::Nvrtc {
            toolkit::toolkit_includes()
        } else {
            None
        }
    }

    /// What the kernel-cache key takes of [`include_set`](Program::include_set)
    /// ([`toolkit::IncludeSet::key_bytes`]), worked out once per process: every disk
    /// lookup needs it.
    ///
    /// `None` also for a program that reads no header ([`may_include`](Self::may_include)):
    /// then the folders cannot change what it compiles to, and a warm lookup need not
    /// find or stamp them (a process's first lookup otherwise spent most of its time
    /// listing the toolkit's folders).
    pub(crate) fn include_key(&self) -> Option<&'static [u8]> {
        if !self.may_include() {
            return None;
        }
        self.include_set()?;
        toolkit::toolkit_include_key()
    }

    /// Whether the program may read a file from an include folder: its source names
    /// `include`, `import` or `embed` (an `#include` or `#include_next` directive, a
    /// `__has_include` test, the `#import` and `#embed` extensions), or an option names
    /// `include` (`-include`, `--pre-include`). A preprocessor directive cannot come
    /// out of a macro, so a source without the words holds none. Conservative: a word
    /// in a comment, a string or a name counts too.
    pub(crate) fn may_include(&self) -> bool {
        ["include", "import", "embed"]
            .iter()
            .any(|w| self.source.contains(w))
            || self.options.iter().any(|o| o.contains("include"))
    }

    /// With these NVRTC options.
    pub fn options(mut self, options: &'a [&'a str]) -> Program<'a> {
        self.options = options;
        self
    }

    /// With these name expressions.
    pub fn name_expressions(mut self, exprs: &'a [&'a str]) -> Program<'a> {
        self.name_expressions = exprs;
        self
    }

    /// Under this source name.
    pub fn source_name(mut self, name: &'a str) -> Program<'a> {
        self.source_name = name;
        self
    }

    /// The options NVRTC gets: the user's, then `-I` for each toolkit include folder
    /// (see [`include_set`](Program::include_set); the user's `-I` folders come first,
    /// so they win), then the target's `-arch` unless the user gave one.
    pub fn effective_options(&self, target: Target) -> Vec<String> {
        self.effective_options_with(target, self.include_set())
    }

    /// [`effective_options`](Program::effective_options) with the include set `includes`.
    /// Pure.
    pub fn effective_options_with(
        &self,
        target: Target,
        includes: Option<&toolkit::IncludeSet>,
    ) -> Vec<String> {
        let mut opts: Vec<String> = self.options.iter().map(|s| (*s).to_owned()).collect();
        if let Some(set) = includes {
            opts.extend(set.options());
        }
        let has_arch = self.options.iter().any(|o| {
            o.starts_with("-arch")
                || o.starts_with("--gpu-architecture")
                || o.starts_with("--gpu-name")
        });
        if !has_arch {
            opts.push(target.arch_option());
        }
        opts
    }

    /// Compiles with the program's backend now (NVRTC unless [`Backend::Nvcc`]),
    /// bypassing every cache. A failed compile is an [`Error::Compile`] carrying the
    /// source name and the whole log.
    pub fn compile(&self, target: Target) -> Result<Compiled> {
        if self.backend == Backend::Nvcc {
            return nvcc::compile(self, target);
        }
        let mut prog = nvrtc::Program::new(self.source, self.source_name)?;
        for e in self.name_expressions {
            prog.add_name_expression(e)?;
        }
        let log = prog.compile(&self.effective_options(target))?;
        let image = match target.output {
            Output::Cubin => prog.cubin()?,
            Output::Ptx => prog.ptx()?,
        };
        let lowered_names = self
            .name_expressions
            .iter()
            .map(|e| Ok(((*e).to_owned(), prog.lowered_name(e)?)))
            .collect::<Result<_>>()?;
        Ok(Compiled {
            image,
            output: target.output,
            arch: target.arch,
            log,
            lowered_names,
        })
    }
}

/// How many NVRTC entry points this process has called (the first one opens
/// `libnvrtc`). A warm disk-cache hit adds none. Test instrumentation (feature
/// `test-util`).
#[cfg(feature = "test-util")]
pub fn nvrtc_call_count() -> u64 {
    nvrtc::call_count()
}

/// How many NVRTC entry points the calling thread has called: the same count as
/// [`nvrtc_call_count`], blind to other threads compiling at the same time (what a
/// test that runs beside others should assert on). Feature `test-util`.
#[cfg(feature = "test-util")]
pub fn nvrtc_call_count_on_this_thread() -> u64 {
    nvrtc::thread_call_count()
}

/// The loaded NVRTC's version `(major, minor)`, asked once.
pub fn nvrtc_version() -> Result<(i32, i32)> {
    static V: OnceLock<Result<(i32, i32)>> = OnceLock::new();
    V.get_or_init(nvrtc::version).clone()
}

/// The architectures the loaded NVRTC compiles for (e.g. `[75, 80, 86, ..., 120]`),
/// asked once.
pub fn supported_archs() -> Result<Vec<u32>> {
    static V: OnceLock<Result<Vec<u32>>> = OnceLock::new();
    V.get_or_init(|| {
        Ok(nvrtc::supported_archs()?
            .into_iter()
            .filter_map(|a| u32::try_from(a).ok())
            .collect())
    })
    .clone()
}

/// The newest architecture in `supported` not newer than `cc` (both as `10 * major +
/// minor`); `None` when all are newer.
pub fn cap_arch(cc: u32, supported: &[u32]) -> Option<u32> {
    supported.iter().copied().filter(|&a| a <= cc).max()
}

/// Device `device`'s compute capability, capped at the newest the loaded NVRTC
/// supports; asked once per device.
pub fn arch_for_device(device: i32) -> Result<u32> {
    static ARCH: [OnceLock<Result<u32>>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];
    let slot = usize::try_from(device)
        .ok()
        .and_then(|i| ARCH.get(i))
        .ok_or_else(|| {
            Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("device id {device} is out of range"),
            )
        })?;
    slot.get_or_init(|| {
        let (major, minor) = crate::Device::new(device)?.compute_capability()?;
        let cc = u32::try_from(major * 10 + minor).map_err(|_| {
            Error::invalid_state(
                StateKind::Unexpected,
                format!("compute capability {major}.{minor}"),
            )
        })?;
        let dir = KernelCache::global().disk_dir();
        let supported = nvrtc_facts::nvrtc_facts(dir.as_deref())?.archs.clone();
        cap_arch(cc, &supported).ok_or_else(|| {
            Error::not_supported(
                UnsupportedKind::Architecture,
                format!(
                    "device {device} is sm_{cc} but the loaded NVRTC compiles only for \
                     {supported:?}"
                ),
            )
        })
    })
    .clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_arch_picks_newest_supported_not_newer_than_device() {
        let s = [75, 80, 86, 89, 90, 100, 120];
        assert_eq!(cap_arch(90, &s), Some(90));
        assert_eq!(cap_arch(87, &s), Some(86));
        assert_eq!(cap_arch(130, &s), Some(120));
        assert_eq!(cap_arch(70, &s), None);
    }

    #[test]
    fn user_arch_option_replaces_the_target_one() {
        let p = Program::new("").options(&["-arch=sm_80", "-lineinfo"]);
        assert_eq!(
            p.effective_options_with(Target::cubin(90), None),
            ["-arch=sm_80", "-lineinfo"]
        );
        let p = Program::new("").options(&["-lineinfo"]);
        assert_eq!(
            p.effective_options_with(Target::ptx(90), None),
            ["-lineinfo", "-arch=compute_90"]
        );
    }

    #[test]
    fn toolkit_include_folders_come_after_the_users_own() {
        let set = toolkit::IncludeSet::new(
            vec!["/tk/include".into(), "/tk/include/cccl".into()],
            toolkit::PlaceSource::CudaPath,
        );
        let p = Program::new("").options(&["-I/mine", "-lineinfo"]);
        assert_eq!(
            p.effective_options_with(Target::cubin(90), Some(&set)),
            [
                "-I/mine",
                "-lineinfo",
                "-I/tk/include",
                "-I/tk/include/cccl",
                "-arch=sm_90"
            ]
        );
    }

    #[test]
    fn toolkit_includes_can_be_turned_off() {
        let p = Program::new("").toolkit_includes(false);
        assert!(!p.toolkit_includes);
        assert_eq!(p.include_set(), None);
        assert_eq!(p.effective_options(Target::cubin(90)), ["-arch=sm_90"]);
        assert!(Program::new("").toolkit_includes);
    }
}
