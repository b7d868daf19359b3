//! An NVRTC program that destroys itself, over the checked calls of
//! [`cuda_sys::result::nvrtc`] (which also count every NVRTC call, see
//! [`nvrtc_call_count`](super::nvrtc_call_count)). NVRTC needs no GPU, only `libnvrtc`.

use std::ffi::CString;

use cuda_sys::nvrtc::nvrtcProgram;
use cuda_sys::result::nvrtc as raw;

use crate::error::{ArgumentKind, Error, Result, StateKind};

pub(crate) use raw::loaded_path;
#[cfg(feature = "test-util")]
pub(crate) use raw::{call_count, thread_call_count};

/// NVRTC's version `(major, minor)` (`nvrtcVersion`).
pub(crate) fn version() -> Result<(i32, i32)> {
    Ok(raw::version()?)
}

/// The architectures the loaded NVRTC can compile for, e.g. `[75, 80, ..., 120]`.
pub(crate) fn supported_archs() -> Result<Vec<i32>> {
    Ok(raw::get_supported_archs()?)
}

/// An NVRTC program, destroyed on drop. Not `Send` or `Sync` (it holds a raw pointer):
/// NVRTC programs are used by one thread at a time.
pub(crate) struct Program {
    prog: nvrtcProgram,
    name: String,
}

impl Program {
    /// `nvrtcCreateProgram` for `source` under the name `name` (no headers).
    pub(crate) fn new(source: &str, name: &str) -> Result<Program> {
        let src = CString::new(source).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("the source of {name} contains a NUL byte"),
            )
        })?;
        let cname = CString::new(name).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("source name {name:?} contains a NUL byte"),
            )
        })?;
        let prog = raw::create_program(&src, &cname)?;
        Ok(Program {
            prog,
            name: name.to_owned(),
        })
    }

    /// `nvrtcAddNameExpression` (before compiling).
    pub(crate) fn add_name_expression(&mut self, expr: &str) -> Result<()> {
        let c = CString::new(expr).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("name expression {expr:?} contains a NUL byte"),
            )
        })?;
        // SAFETY: the program is owned by `self`, live until its drop, and used by one
        // thread (`&mut self`; `Program` is not `Sync`).
        Ok(unsafe { raw::add_name_expression(self.prog, &c) }?)
    }

    /// `nvrtcCompileProgram`, then the log. `Ok(log)` on success (warnings, often
    /// empty); on failure an [`Error::Compile`] with the source name and the whole log.
    pub(crate) fn compile(&mut self, options: &[String]) -> Result<String> {
        let owned: Vec<CString> = options
            .iter()
            .map(|o| {
                CString::new(o.as_str()).map_err(|_| {
                    Error::invalid_argument(
                        ArgumentKind::InteriorNul,
                        format!("compile option {o:?} contains a NUL byte"),
                    )
                })
            })
            .collect::<Result<_>>()?;
        if i32::try_from(owned.len()).is_err() {
            return Err(Error::invalid_argument(
                ArgumentKind::InvalidValue,
                format!("{} compile options", owned.len()),
            ));
        }
        let opts: Vec<&std::ffi::CStr> = owned.iter().map(|c| c.as_c_str()).collect();
        // SAFETY: the program is owned by `self`, live, and used by one thread.
        let r = unsafe { raw::compile_program(self.prog, &opts) };
        let log = self.log().unwrap_or_default();
        match r {
            Ok(()) => Ok(log),
            Err(e) => match Error::from(e) {
                Error::Compile(mut c) => {
                    c.source_name = Some(self.name.clone());
                    c.log = log;
                    Err(Error::Compile(c))
                }
                other => Err(other),
            },
        }
    }

    /// The program log (`nvrtcGetProgramLogSize`, `nvrtcGetProgramLog`).
    pub(crate) fn log(&self) -> Result<String> {
        // SAFETY: the program is owned by `self` and live; NVRTC only reads it.
        Ok(unsafe { raw::get_program_log(self.prog) }?)
    }

    /// The compiled cubin (`nvrtcGetCUBINSize`, `nvrtcGetCUBIN`).
    pub(crate) fn cubin(&self) -> Result<Vec<u8>> {
        // SAFETY: as in `log`.
        Ok(unsafe { raw::get_cubin(self.prog) }?)
    }

    /// The compiled PTX, NUL byte included (`nvrtcGetPTXSize`, `nvrtcGetPTX`).
    pub(crate) fn ptx(&self) -> Result<Vec<u8>> {
        // SAFETY: as in `log`.
        Ok(unsafe { raw::get_ptx(self.prog) }?)
    }

    /// The lowered (mangled) name of a name expression added before compiling
    /// (`nvrtcGetLoweredName`).
    pub(crate) fn lowered_name(&self, expr: &str) -> Result<String> {
        let c = CString::new(expr).map_err(|_| {
            Error::invalid_argument(
                ArgumentKind::InteriorNul,
                format!("name expression {expr:?} contains a NUL byte"),
            )
        })?;
        // SAFETY: as in `log` (the program was compiled by the caller).
        match unsafe { raw::get_lowered_name(self.prog, &c) }? {
            Some(name) => Ok(name),
            None => Err(Error::invalid_state(
                StateKind::Unexpected,
                format!("NVRTC gave no lowered name for {expr:?}"),
            )),
        }
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        // An error here leaves nothing to clean up.
        // SAFETY: the program is owned by `self` and destroyed once, here.
        let _ = unsafe { raw::destroy_program(&mut self.prog) };
    }
}
