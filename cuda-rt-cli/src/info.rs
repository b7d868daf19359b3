//! `cuda-rt info`: what CUDA this machine has, as cuda-rt sees it (CuPy's
//! `show_config()`): the driver and runtime versions, each library cuda-rt loads with
//! its version and the file it was found at (or the pip package that provides it), the
//! toolkit and its headers, the devices with their key attributes, the kernel cache
//! folder and its state, and the variables that steer all of this.
//!
//! Every part is looked at on its own: a missing library or a machine without a GPU
//! is a line of the report, never a failure. Only writing the report can fail.

use std::ffi::c_int;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use cuda_rt::compiler::{self, cache, toolkit, KernelCache};
use cuda_rt::cuda_sys::{self as sys, loader::Library, LoadError, LoadErrorKind};
use cuda_rt::error::human_bytes;
use cuda_rt::{env, Device, DeviceAttribute};

/// Writes the report to `out`. With `verbose`, a missing library lists every path tried.
pub fn run(out: &mut dyn Write, verbose: bool) -> crate::Result<()> {
    writeln!(
        out,
        "cuda-rt {} ({}-{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    )?;
    let available = cuda_rt::availability();
    let driver_major = env::driver_version().ok().map(|v| v.major);

    writeln!(out, "\nLibraries")?;
    for lib in libraries() {
        lib.write(out, driver_major, verbose)?;
    }
    write_nvtx(out)?;

    writeln!(out, "\nToolkit")?;
    write_toolkit(out)?;

    writeln!(out, "\nDevices")?;
    match &available {
        Ok(count) => {
            for id in 0..*count {
                write_device(out, id)?;
            }
            write_peers(out, *count)?;
        }
        // The reason's first line: the driver's paths are listed under Libraries.
        Err(why) => writeln!(out, "  no GPU: {}", crate::reason_line(why))?,
    }

    writeln!(out, "\nKernel cache")?;
    write_kernel_cache(out)?;

    writeln!(out, "\nEnvironment")?;
    write_environment(out)?;
    Ok(())
}

/// One library cuda-rt loads: where it was found and its version, or why not.
struct LibraryLine {
    name: &'static str,
    found: Result<(&'static Library, Option<String>), LoadError>,
}

impl LibraryLine {
    fn write(
        &self,
        out: &mut dyn Write,
        driver_major: Option<u32>,
        verbose: bool,
    ) -> io::Result<()> {
        match &self.found {
            Ok((lib, version)) => writeln!(
                out,
                "  {:<13} {:<10} {}",
                self.name,
                version.as_deref().unwrap_or("?"),
                lib.file()
            ),
            Err(e) => {
                writeln!(
                    out,
                    "  {:<13} {:<10} {}",
                    self.name,
                    "missing",
                    remedy(e, driver_major)
                )?;
                if verbose {
                    for line in e.to_string().lines().skip(1) {
                        writeln!(out, "  {:<24} {}", "", line.trim_start())?;
                    }
                }
                Ok(())
            }
        }
    }
}

/// What to do about a library that did not load, in one line: the pip package (for
/// the driver's CUDA major version) and the variable that names the file.
fn remedy(e: &LoadError, driver_major: Option<u32>) -> String {
    match e.kind() {
        LoadErrorKind::LibraryNotFound {
            override_var,
            pip_package,
            tried,
            ..
        } => {
            let places = format!("not found in {} place{}", tried.len(), plural(tried.len()));
            match pip_package {
                Some(p) => format!(
                    "{places}: pip install {}, or set {override_var}",
                    pip_package_for(p, driver_major)
                ),
                None => format!("{places}: install the NVIDIA driver, or set {override_var}"),
            }
        }
        // Too old a driver, a missing entry point: the loader's words say it all.
        _ => e.to_string(),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The loader names the CUDA 13 wheels (`nvidia-cublas`, `nvidia-nccl-cu13`); CUDA 12's
/// carry a `-cu12` suffix (`nvidia-cublas-cu12`, `nvidia-nccl-cu12`). Without a driver,
/// the CUDA 13 name.
pub fn pip_package_for(package: &str, driver_major: Option<u32>) -> String {
    match driver_major {
        Some(12) => match package.strip_suffix("-cu13") {
            Some(base) => format!("{base}-cu12"),
            None => format!("{package}-cu12"),
        },
        _ => package.to_owned(),
    }
}

/// `major.minor.patch` from three `GetProperty` calls; `None` if one fails.
fn from_properties(get: impl Fn(c_int) -> Option<c_int>) -> Option<String> {
    Some(format!("{}.{}.{}", get(0)?, get(1)?, get(2)?))
}

/// Every library cuda-rt loads, opened now (each is opened once per process anyway).
fn libraries() -> Vec<LibraryLine> {
    fn line<A: 'static>(
        name: &'static str,
        api: Result<&'static A, LoadError>,
        library: impl Fn(&'static A) -> &'static Library,
        version: impl Fn(&'static A) -> Option<String>,
    ) -> LibraryLine {
        LibraryLine {
            name,
            found: api.map(|a| (library(a), version(a))),
        }
    }
    vec![
        line(
            "CUDA driver",
            sys::driver::api(),
            |a| a.library(),
            |_| env::driver_version().ok().map(|v| v.to_string()),
        ),
        line(
            "CUDA runtime",
            sys::runtime::api(),
            |a| a.library(),
            |_| env::get_local_runtime_version().ok().map(|v| v.to_string()),
        ),
        line(
            "NVRTC",
            sys::nvrtc::api(),
            |a| a.library(),
            |_| {
                compiler::nvrtc_version()
                    .ok()
                    .map(|(major, minor)| format!("{major}.{minor}"))
            },
        ),
        line(
            "cuBLAS",
            sys::cublas::api(),
            |a| a.library(),
            |a| {
                let get = a.cublasGetProperty().ok()?;
                from_properties(|p| {
                    let mut v = 0;
                    // SAFETY: `v` is a valid out pointer; the property is one of the three
                    // libraryPropertyType values; no handle or device is needed.
                    let rc = unsafe { get(sys::cublas::libraryPropertyType_t(p as u32), &mut v) };
                    (rc == sys::cublas::cublasStatus_t::CUBLAS_STATUS_SUCCESS).then_some(v)
                })
            },
        ),
        // cuSOLVER's version call is not among the dense API's declarations: its soname
        // says the major version.
        line(
            "cuSOLVER",
            sys::cusolver::api(),
            |a| a.library(),
            |a| soname_version(a.library().path()),
        ),
        line(
            "cuSPARSE",
            sys::cusparse::api(),
            |a| a.library(),
            |a| {
                let get = a.cusparseGetProperty().ok()?;
                from_properties(|p| {
                    let mut v = 0;
                    // SAFETY: as for cuBLAS: a valid out pointer and a valid property.
                    let rc = unsafe { get(sys::cusparse::libraryPropertyType_t(p as u32), &mut v) };
                    (rc == sys::cusparse::cusparseStatus_t::CUSPARSE_STATUS_SUCCESS).then_some(v)
                })
            },
        ),
        line(
            "cuRAND",
            sys::curand::api(),
            |a| a.library(),
            |a| {
                let get = a.curandGetVersion().ok()?;
                let mut v = 0;
                // SAFETY: `v` is a valid out pointer; no generator is needed.
                let rc = unsafe { get(&mut v) };
                // CURAND_VERSION is major * 1000 + minor * 100 + patch.
                (rc == sys::curand::curandStatus_t::CURAND_STATUS_SUCCESS)
                    .then(|| format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100))
            },
        ),
        line(
            "NCCL",
            sys::nccl::api(),
            |a| a.library(),
            |a| {
                let get = a.ncclGetVersion().ok()?;
                let mut v = 0;
                // SAFETY: `v` is a valid out pointer; no communicator is needed.
                let rc = unsafe { get(&mut v) };
                // NCCL_VERSION_CODE is major * 10000 + minor * 100 + patch since 2.9.
                (rc == sys::nccl::ncclResult_t::ncclSuccess)
                    .then(|| format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100))
            },
        ),
    ]
}

/// `libcusolver.so.12` -> `soname 12`.
fn soname_version(path: &str) -> Option<String> {
    let name = Path::new(path).file_name()?.to_str()?;
    let (_, after) = name.split_once(".so.")?;
    Some(format!("soname {after}"))
}

fn write_nvtx(out: &mut dyn Write) -> io::Result<()> {
    let tool = match std::env::var_os("NVTX_INJECTION64_PATH") {
        Some(p) => format!("tool {}", Path::new(&p).display()),
        None => "no tool attached (nsys sets NVTX_INJECTION64_PATH)".to_owned(),
    };
    writeln!(
        out,
        "  {:<13} {:<10} built into cuda-rt; {tool}",
        "NVTX", "v3"
    )
}

fn shown(path: Option<PathBuf>) -> String {
    path.map_or_else(|| "not found".to_owned(), |p| p.display().to_string())
}

fn write_toolkit(out: &mut dyn Write) -> io::Result<()> {
    writeln!(out, "  CUDA path     {}", shown(env::get_cuda_path()))?;
    writeln!(out, "  nvcc          {}", shown(env::get_nvcc_path()))?;
    match toolkit::toolkit_includes() {
        Some(set) => {
            let dirs: Vec<String> = set.dirs.iter().map(|d| d.display().to_string()).collect();
            writeln!(
                out,
                "  headers       {} ({:?})",
                dirs.join(", "),
                set.source
            )?;
        }
        None => writeln!(
            out,
            "  headers       not found (kernels that include <cuda/std/...> or CUB need \
             pip install nvidia-cuda-runtime nvidia-cuda-cccl, or a toolkit)"
        )?,
    }
    writeln!(
        out,
        "  cudadevrt     {}",
        shown(toolkit::toolkit_search().device_runtime())
    )
}

fn write_device(out: &mut dyn Write, id: i32) -> io::Result<()> {
    let dev = match Device::new(id) {
        Ok(d) => d,
        Err(e) => return writeln!(out, "  {id}: {e}"),
    };
    let attr = |a: DeviceAttribute| dev.attribute(a).ok();
    let yes = |a: DeviceAttribute| match attr(a) {
        Some(0) => "no",
        Some(_) => "yes",
        None => "?",
    };
    let name = dev.name().unwrap_or_else(|e| format!("(name: {e})"));
    let cc = dev
        .compute_capability()
        .map_or("?".to_owned(), |(major, minor)| format!("{major}.{minor}"));
    let total = dev
        .total_memory()
        .map_or("?".to_owned(), |b| human_bytes(b as u64));
    let free = match dev.mem_info() {
        Ok((free, _)) => format!(", {} free", human_bytes(free as u64)),
        Err(_) => String::new(),
    };
    writeln!(
        out,
        "  {id}: {name}, compute capability {cc}, {total}{free}"
    )?;
    let n = |a: DeviceAttribute| attr(a).map_or("?".to_owned(), |v| v.to_string());
    writeln!(
        out,
        "     {} SMs, {} threads/SM, clock {} MHz, memory clock {} MHz, bus {} bits, L2 {}",
        n(DeviceAttribute::MultiprocessorCount),
        n(DeviceAttribute::MaxThreadsPerMultiprocessor),
        attr(DeviceAttribute::ClockRate).map_or("?".to_owned(), |k| (k / 1000).to_string()),
        attr(DeviceAttribute::MemoryClockRate).map_or("?".to_owned(), |k| (k / 1000).to_string()),
        n(DeviceAttribute::GlobalMemoryBusWidth),
        attr(DeviceAttribute::L2CacheSize).map_or("?".to_owned(), |b| human_bytes(b as u64)),
    )?;
    writeln!(
        out,
        "     shared memory/block {} (opt-in), PCI {}, ECC {}, integrated {}",
        attr(DeviceAttribute::MaxSharedMemoryPerBlockOptin)
            .map_or("?".to_owned(), |b| human_bytes(b as u64)),
        dev.pci_bus_id().unwrap_or_else(|_| "?".to_owned()),
        yes(DeviceAttribute::EccEnabled),
        yes(DeviceAttribute::Integrated),
    )?;
    writeln!(
        out,
        "     managed memory {}, concurrent managed access {}, memory pools {}, \
         virtual memory management {} (expandable segments), cooperative launch {}",
        yes(DeviceAttribute::ManagedMemory),
        yes(DeviceAttribute::ConcurrentManagedAccess),
        yes(DeviceAttribute::MemoryPoolsSupported),
        yes(DeviceAttribute::VirtualMemoryManagementSupported),
        yes(DeviceAttribute::CooperativeLaunch),
    )
}

fn write_peers(out: &mut dyn Write, count: i32) -> io::Result<()> {
    if count < 2 {
        return Ok(());
    }
    let mut pairs = Vec::new();
    for a in 0..count {
        for b in 0..count {
            if a == b {
                continue;
            }
            let can = match (Device::new(a), Device::new(b)) {
                (Ok(x), Ok(y)) => x.can_access_peer(&y).ok(),
                _ => None,
            };
            pairs.push(format!(
                "{a}->{b} {}",
                match can {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "?",
                }
            ));
        }
    }
    writeln!(out, "  peer access: {}", pairs.join(", "))
}

/// The folder from the environment, and what is in it; nothing is created here (the
/// first compile does that).
fn write_kernel_cache(out: &mut dyn Write) -> io::Result<()> {
    let Some(dir) = cache::disk_dir_from_env(|k| std::env::var(k).ok()) else {
        let why = if std::env::var_os(cache::IN_MEMORY_VAR).is_some() {
            format!("{} is set", cache::IN_MEMORY_VAR)
        } else {
            format!("no folder: set {} (or HOME)", cache::CACHE_DIR_VAR)
        };
        return writeln!(out, "  in memory only: {why}");
    };
    if !dir.exists() {
        return writeln!(
            out,
            "  {}: not created yet (the first compiled kernel creates it)",
            dir.display()
        );
    }
    // The cache's own check: the folder's owner and mode (a refused folder is named
    // with the reason).
    let cache = KernelCache::global();
    if let Some(why) = cache.memory_only_reason() {
        return writeln!(out, "  {why}");
    }
    let (mut entries, mut bytes) = (0u64, 0u64);
    if let Ok(read) = std::fs::read_dir(&dir) {
        for e in read.flatten() {
            let is_entry = e.path().extension().is_some_and(|x| x == "kcache");
            if let (true, Ok(m)) = (is_entry, e.metadata()) {
                entries += 1;
                bytes += m.len();
            }
        }
    }
    writeln!(
        out,
        "  {}: {entries} kernel{} cached, {}",
        dir.display(),
        plural(entries as usize),
        human_bytes(bytes)
    )
}

/// The variables that change what cuda-rt finds or does, as set now.
fn write_environment(out: &mut dyn Write) -> io::Result<()> {
    let mut vars: Vec<(String, String)> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.to_string_lossy().into_owned())))
        .filter(|(k, _)| {
            k.starts_with("CUDA_RT_")
                || matches!(
                    k.as_str(),
                    "CUDA_PATH" | "CUDA_HOME" | "CUDA_VISIBLE_DEVICES" | "CUDA_DEVICE_ORDER"
                )
        })
        .collect();
    vars.sort();
    if vars.is_empty() {
        return writeln!(
            out,
            "  (no CUDA_RT_*, CUDA_PATH, CUDA_HOME or CUDA_VISIBLE_DEVICES set)"
        );
    }
    for (k, v) in vars {
        writeln!(out, "  {k}={v}")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_12_drivers_get_the_cu12_wheels() {
        assert_eq!(pip_package_for("nvidia-cublas", Some(13)), "nvidia-cublas");
        assert_eq!(
            pip_package_for("nvidia-cublas", Some(12)),
            "nvidia-cublas-cu12"
        );
        assert_eq!(
            pip_package_for("nvidia-nccl-cu13", Some(12)),
            "nvidia-nccl-cu12"
        );
        assert_eq!(
            pip_package_for("nvidia-nccl-cu13", None),
            "nvidia-nccl-cu13"
        );
    }

    #[test]
    fn the_soname_says_cusolvers_major_version() {
        assert_eq!(
            soname_version("/x/nvidia/cu13/lib/libcusolver.so.12").as_deref(),
            Some("soname 12")
        );
        assert_eq!(soname_version("libcusolver.so"), None);
    }
}
