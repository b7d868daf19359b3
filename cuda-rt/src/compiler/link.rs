//! Relocatable device code: a program compiled with `-rdc=true` (or `-dc`) is an
//! object to link, not a module to load. cuda-rt links it with the device runtime
//! `libcudadevrt.a` (which device-side kernel launches, dynamic parallelism, need)
//! through the driver's JIT linker (`cuLinkCreate`, `cuLinkAddData`, `cuLinkAddFile`,
//! `cuLinkComplete`, `cuLinkDestroy`), then loads the linked cubin.
//!
//! The device runtime is found with the toolkit's other files
//! ([`super::toolkit`]: the loaded NVRTC's installation, `CUDA_PATH`, `CUDA_HOME`,
//! `/usr/local/cuda`, the `nvidia-cuda-runtime` wheels; `CUDA_RT_LIBCUDADEVRT` names it
//! outright). The link needs the driver and runs when the module is loaded, once per
//! device and program in a process (the kernel cache keeps the module); the disk cache
//! keeps NVRTC's object.

use std::ffi::{c_void, CString};
use std::path::{Path, PathBuf};

use cuda_sys::driver as sys;
use cuda_sys::result;

use super::toolkit::{toolkit_search, ToolkitSearch, DEVRT_FILE, DEVRT_VAR};
use super::{Compiled, Output};
use crate::device::context::make_current;
use crate::error::{ArgumentKind, Error, Result, UnsupportedKind};

/// Whether NVRTC `options` ask for relocatable device code: `-dc` / `--device-c`, or
/// `-rdc=true` / `--relocatable-device-code=true` (the last such option wins, so a
/// later `-rdc=false` turns it off). Pure.
pub fn is_relocatable(options: &[&str]) -> bool {
    let mut on = false;
    for o in options {
        match *o {
            "-dc" | "--device-c" => on = true,
            _ => {
                let value = o
                    .strip_prefix("-rdc=")
                    .or_else(|| o.strip_prefix("--relocatable-device-code="));
                match value {
                    Some("true") => on = true,
                    Some("false") => on = false,
                    _ => {}
                }
            }
        }
    }
    on
}

/// Whether `image` is a relocatable ELF object (a cubin of `e_type` `ET_REL`), which
/// the driver cannot load as a module: it must be linked first. Pure.
pub fn is_relocatable_cubin(image: &[u8]) -> bool {
    const ET_REL: u16 = 1;
    image.len() >= 18
        && image.starts_with(b"\x7fELF")
        && u16::from_le_bytes([image[16], image[17]]) == ET_REL
}

/// The device runtime to link with, or an error that says where it was looked for
/// and how to provide it.
pub fn device_runtime() -> Result<PathBuf> {
    device_runtime_in(toolkit_search())
}

/// [`device_runtime`] in the places of `search`.
pub fn device_runtime_in(search: &ToolkitSearch) -> Result<PathBuf> {
    search.device_runtime().ok_or_else(|| {
        Error::not_supported(
            UnsupportedKind::Other,
            format!(
                "relocatable device code (-rdc=true or -dc) is linked with the CUDA device \
                 runtime {DEVRT_FILE}, which was not found (searched {}): install the CUDA \
                 toolkit or the nvidia-cuda-runtime wheel, or set {DEVRT_VAR} to the file",
                search.describe()
            ),
        )
    })
}

/// Log buffers the driver writes during a link; boxed so their addresses stay put.
const LOG_LEN: usize = 16 * 1024;

/// A link in progress, destroyed on drop (with its logs, which it owns).
struct Link {
    state: sys::CUlinkState,
    error_log: Box<[u8; LOG_LEN]>,
    // The driver keeps the option arrays for the life of the link and writes back into
    // them (the log's actual size at cuLinkComplete): they must outlive it, at
    // addresses that do not move (a Vec's buffer, never grown after creation).
    _options: Vec<sys::CUjit_option>,
    _values: Vec<*mut c_void>,
}

impl Link {
    /// A new link in the current context, for `arch` (`CU_JIT_TARGET`) when given.
    fn new(arch: Option<u32>) -> Result<Link> {
        let mut error_log = Box::new([0u8; LOG_LEN]);
        let mut options = vec![
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            sys::CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
        ];
        let mut values: Vec<*mut c_void> =
            vec![error_log.as_mut_ptr().cast(), LOG_LEN as *mut c_void];
        if let Some(a) = arch {
            // CUjit_target's values are the architectures' numbers (90 for sm_90).
            options.push(sys::CUjit_option::CU_JIT_TARGET);
            values.push(a as usize as *mut c_void);
        }
        // SAFETY: the log buffer holds LOG_LEN bytes and lives in the returned `Link`
        // (boxed, so its address does not move) until the link is destroyed in its
        // drop, as do the two option arrays the driver keeps and writes back into; the
        // size and the target are passed by value, as the options expect.
        let state = unsafe { result::link::create(&mut options, &mut values) }?;
        Ok(Link {
            state,
            error_log,
            _options: options,
            _values: values,
        })
    }

    /// The driver's error log so far.
    fn log(&self) -> String {
        let end = self
            .error_log
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(LOG_LEN);
        String::from_utf8_lossy(&self.error_log[..end])
            .trim()
            .to_owned()
    }

    /// `e` with the linker's log, for `what`.
    fn explain(&self, what: &str, e: result::Error) -> Error {
        let log = self.log();
        let e = Error::from(e);
        if log.is_empty() {
            return e;
        }
        Error::invalid_argument(
            ArgumentKind::Other,
            format!("{what}: {e}; linker log:\n{log}"),
        )
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        // Inside a host function the driver may not be called: the handle is kept
        // (leaked), as memory dropped there is (docs/soundness.md, "Host functions").
        if result::stream::in_host_function() {
            return;
        }
        // SAFETY: the link was created in `new` and is destroyed once, here; the log
        // buffer it writes to is dropped after (fields drop after `drop` returns).
        let _ = unsafe { result::link::destroy(self.state) };
    }
}

/// Links the relocatable `compiled` (NVRTC's cubin or PTX of a program compiled with
/// `-rdc=true`) with the device runtime `devrt` into a cubin for device `device`.
pub fn link_with_device_runtime(device: i32, compiled: &Compiled, devrt: &Path) -> Result<Vec<u8>> {
    make_current(device)?;
    let (kind, arch) = match compiled.output {
        Output::Cubin => (sys::CUjitInputType::CU_JIT_INPUT_CUBIN, Some(compiled.arch)),
        Output::Ptx => (sys::CUjitInputType::CU_JIT_INPUT_PTX, None),
    };
    let path = CString::new(devrt.as_os_str().as_encoded_bytes()).map_err(|_| {
        Error::invalid_argument(
            ArgumentKind::InteriorNul,
            format!(
                "the device runtime's path {} contains a NUL byte",
                devrt.display()
            ),
        )
    })?;
    let link = Link::new(arch)?;
    // SAFETY (the three calls): the link is live until `link` drops; the image is
    // NVRTC's whole output of the kind given (PTX keeps its NUL byte); the device's
    // context was made current above and the link was created in it.
    unsafe { result::link::add_data(link.state, kind, &compiled.image, c"cuda_rt_program") }
        .map_err(|e| link.explain("adding the program to the link", e))?;
    unsafe { result::link::add_file(link.state, sys::CUjitInputType::CU_JIT_INPUT_LIBRARY, &path) }
        .map_err(|e| link.explain(&format!("adding {} to the link", devrt.display()), e))?;
    let cubin = unsafe { result::link::complete(link.state) }
        .map_err(|e| link.explain("completing the link", e))?;
    Ok(cubin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relocatable_options_are_recognised_and_the_last_one_wins() {
        assert!(is_relocatable(&["-rdc=true"]));
        assert!(is_relocatable(&["--relocatable-device-code=true"]));
        assert!(is_relocatable(&["-std=c++17", "-dc"]));
        assert!(is_relocatable(&["--device-c"]));
        assert!(!is_relocatable(&[]));
        assert!(!is_relocatable(&["-rdc=false"]));
        assert!(!is_relocatable(&["-rdc=true", "-rdc=false"]));
        assert!(is_relocatable(&["-rdc=false", "-dc"]));
        assert!(!is_relocatable(&["-dcx", "-rdc", "-rdc=yes", "-DRDC=true"]));
    }

    #[test]
    fn a_missing_device_runtime_says_where_it_was_looked_for_and_what_to_do() {
        use super::super::toolkit::PlaceSource;
        let nowhere =
            std::env::temp_dir().join(format!("cuda-rt-no-toolkit-{}", std::process::id()));
        let search =
            ToolkitSearch::from_parts(&[], &[(nowhere.clone(), PlaceSource::CudaPath)], &[]);
        let e = device_runtime_in(&search).unwrap_err();
        assert!(
            matches!(
                e,
                Error::NotSupported {
                    kind: UnsupportedKind::Other,
                    ..
                }
            ),
            "{e}"
        );
        let msg = e.to_string();
        for part in [DEVRT_FILE, DEVRT_VAR, "nvidia-cuda-runtime", "-rdc=true"] {
            assert!(msg.contains(part), "{part} in {msg}");
        }
        assert!(msg.contains(&*nowhere.to_string_lossy()), "{msg}");
    }

    #[test]
    fn a_found_device_runtime_is_used() {
        let search = ToolkitSearch {
            devrt_override: Some(PathBuf::from("/x/libcudadevrt.a")),
            ..ToolkitSearch::default()
        };
        assert_eq!(
            device_runtime_in(&search).unwrap(),
            PathBuf::from("/x/libcudadevrt.a")
        );
    }

    #[test]
    fn a_relocatable_cubin_is_told_by_its_elf_type() {
        let mut elf = vec![0u8; 64];
        elf[..4].copy_from_slice(b"\x7fELF");
        elf[16] = 1; // ET_REL
        assert!(is_relocatable_cubin(&elf));
        elf[16] = 2; // ET_EXEC
        assert!(!is_relocatable_cubin(&elf));
        assert!(!is_relocatable_cubin(b"//\n.version 9.0\n"));
        assert!(!is_relocatable_cubin(b"\x7fELF"));
    }
}
