//! The CUDA toolkit's files that compiles need besides NVRTC: the include folders of
//! the toolkit and of CCCL (CUB, Thrust, libcu++'s `cuda/std`), which kernels that
//! include `<cooperative_groups.h>`, `<cub/...>` or `<cuda/std/...>` need, and the
//! device runtime `libcudadevrt.a`, which relocatable device code links with.
//!
//! They are looked for where the libraries are ([`cuda_sys::loader::search`]), one
//! *place* at a time, in this order:
//! 1. the installation of each NVRTC library the loader would find (its override
//!    variable, `CUDA_PATH`, `/usr/local/cuda`, the Python wheels), so the headers
//!    match the compiler;
//! 2. the toolkit folders `$CUDA_PATH`, `$CUDA_HOME`, the CUDA path as CuPy finds it
//!    ([`crate::env::get_cuda_path`]: `CUDA_PATH`, two levels above `nvcc`) and
//!    `/usr/local/cuda`;
//! 3. the `nvidia` folder of every site-packages folder the loader searches.
//!
//! A toolkit place `R` offers `R/include` (when it holds `cuda_runtime_api.h`) and
//! `R/include/cccl` (where CUDA 13 keeps CCCL), and `R/lib64/libcudadevrt.a` or
//! `R/lib/libcudadevrt.a`. A wheel place (`site-packages/nvidia`) offers
//! `cu13/include`, `cu13/include/cccl`, `cuda_runtime/include` and
//! `cuda_cccl/include` (`nvidia-cuda-runtime` and `nvidia-cuda-cccl`, CUDA 13 and 12
//! layouts), and `cu13/lib/libcudadevrt.a` or `cuda_runtime/lib/libcudadevrt.a`.
//! The include folders come from the first place that offers any (never mixed from
//! two installations); the device runtime from the first place that has it.
//!
//! Overrides: `CUDA_RT_INCLUDE_PATH` (folders separated by `:`) replaces the include
//! search, and set but empty turns it off; `CUDA_RT_LIBCUDADEVRT` names the device
//! runtime's file.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use cuda_sys::loader::search::{
    candidates_with_sites, site_packages, Candidate, SearchEnv, Source,
};
use cuda_sys::loader::specs::NVRTC;

use super::hash::StableHash;

/// Variable that replaces the include-folder search (folders separated by `:`; set
/// but empty: no include folder is added).
pub const INCLUDE_PATH_VAR: &str = "CUDA_RT_INCLUDE_PATH";
/// Variable naming the device runtime's file (`libcudadevrt.a`).
pub const DEVRT_VAR: &str = "CUDA_RT_LIBCUDADEVRT";
/// The device runtime's file name.
pub const DEVRT_FILE: &str = "libcudadevrt.a";

/// Why a place is searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PlaceSource {
    /// The installation an NVRTC library the loader finds belongs to.
    Nvrtc,
    /// `$CUDA_PATH`.
    CudaPath,
    /// `$CUDA_HOME`.
    CudaHome,
    /// The CUDA path as CuPy finds it (two levels above `nvcc`, ...).
    CupyCudaPath,
    /// `/usr/local/cuda`.
    UsrLocalCuda,
    /// A site-packages folder's `nvidia` folder (Python wheels).
    PythonWheel,
    /// An override variable.
    Override,
}

/// Where toolkit files may be: a toolkit folder, or the `nvidia` folder of a
/// site-packages folder (Python wheels).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Place {
    /// A toolkit folder (`/usr/local/cuda`): `include`, `lib64`...
    Toolkit(PathBuf),
    /// `site-packages/nvidia`, holding `cu13/`, `cuda_runtime/`, `cuda_cccl/`...
    Wheels(PathBuf),
}

impl Place {
    /// The place a library file belongs to: the folder above its `lib` folder, or the
    /// `nvidia` folder above that when it is a wheel's.
    pub fn of_library(file: &Path) -> Option<Place> {
        let root = file.parent()?.parent()?;
        match root.parent() {
            Some(n) if n.file_name().is_some_and(|f| f == "nvidia") => {
                Some(Place::Wheels(n.to_path_buf()))
            }
            _ => Some(Place::Toolkit(root.to_path_buf())),
        }
    }

    /// The include folders this place offers, in order (only folders that exist).
    pub fn include_dirs(&self) -> Vec<PathBuf> {
        let candidates: Vec<PathBuf> = match self {
            Place::Toolkit(r) => {
                let inc = r.join("include");
                if !inc.join("cuda_runtime_api.h").is_file() {
                    return Vec::new();
                }
                vec![inc.clone(), inc.join("cccl")]
            }
            Place::Wheels(n) => vec![
                n.join("cu13").join("include"),
                n.join("cu13").join("include").join("cccl"),
                n.join("cuda_runtime").join("include"),
                n.join("cuda_cccl").join("include"),
            ],
        };
        candidates.into_iter().filter(|d| d.is_dir()).collect()
    }

    /// This place's device runtime (`libcudadevrt.a`), if it has one.
    pub fn device_runtime(&self) -> Option<PathBuf> {
        let candidates: Vec<PathBuf> = match self {
            Place::Toolkit(r) => vec![r.join("lib64"), r.join("lib")],
            Place::Wheels(n) => vec![
                n.join("cu13").join("lib"),
                n.join("cuda_runtime").join("lib"),
            ],
        };
        candidates
            .into_iter()
            .map(|d| d.join(DEVRT_FILE))
            .find(|f| f.is_file())
    }

    /// The folder itself.
    pub fn path(&self) -> &Path {
        match self {
            Place::Toolkit(p) | Place::Wheels(p) => p,
        }
    }
}

/// The include folders a compile gets, where they came from, and a stamp of their
/// state (part of the kernel-cache key, see [`IncludeSet::key_bytes`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IncludeSet {
    /// The folders, in the order NVRTC gets them (`-I` each).
    pub dirs: Vec<PathBuf>,
    /// Why they were chosen.
    pub source: PlaceSource,
    /// A hash of the folders' modification times and those of their entries: changes
    /// when headers are installed, upgraded or removed there.
    pub stamp: u128,
}

impl IncludeSet {
    /// A set of `dirs` from `source`, stamped now.
    pub fn new(dirs: Vec<PathBuf>, source: PlaceSource) -> IncludeSet {
        let stamp = stamp_of(&dirs);
        IncludeSet {
            dirs,
            source,
            stamp,
        }
    }

    /// The NVRTC options that add the folders: `-I<dir>` each.
    pub fn options(&self) -> Vec<String> {
        self.dirs
            .iter()
            .map(|d| format!("-I{}", d.display()))
            .collect()
    }

    /// What the kernel-cache key takes of the set: the folders and the stamp.
    pub fn key_bytes(&self) -> Vec<u8> {
        let mut h = StableHash::new();
        h.write(&(self.dirs.len() as u64).to_le_bytes());
        for d in &self.dirs {
            h.field(d.as_os_str().as_encoded_bytes());
        }
        h.write(&self.stamp.to_le_bytes());
        h.finish().to_vec()
    }
}

/// A hash of the modification times of `dirs` and of their entries (one level).
fn stamp_of(dirs: &[PathBuf]) -> u128 {
    let mut h = StableHash::new();
    let mut time = |p: &Path| {
        let t = std::fs::metadata(p)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        h.field(p.as_os_str().as_encoded_bytes());
        h.write(&t.to_le_bytes());
    };
    for d in dirs {
        time(d);
        if let Ok(rd) = std::fs::read_dir(d) {
            let mut entries: Vec<PathBuf> = rd.filter_map(|e| e.ok().map(|e| e.path())).collect();
            entries.sort();
            for e in &entries {
                time(e);
            }
        }
    }
    u128::from_be_bytes(h.finish())
}

/// The places to search, in order, with the overrides: see the [module docs](self).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolkitSearch {
    /// The places, in search order, without duplicates.
    pub places: Vec<(Place, PlaceSource)>,
    /// `CUDA_RT_INCLUDE_PATH`, when set.
    pub include_override: Option<OsString>,
    /// `CUDA_RT_LIBCUDADEVRT`, when set.
    pub devrt_override: Option<PathBuf>,
}

impl ToolkitSearch {
    /// The places from their parts: the NVRTC library files found (full paths), the
    /// toolkit folders with their source, and the site-packages folders. Pure but for
    /// the folders' existence checks made later.
    pub fn from_parts(
        nvrtc_libraries: &[PathBuf],
        toolkit_roots: &[(PathBuf, PlaceSource)],
        site_packages: &[PathBuf],
    ) -> ToolkitSearch {
        let mut s = ToolkitSearch::default();
        for lib in nvrtc_libraries {
            if let Some(p) = Place::of_library(lib) {
                s.push(p, PlaceSource::Nvrtc);
            }
        }
        for (root, source) in toolkit_roots {
            s.push(Place::Toolkit(root.clone()), *source);
        }
        for site in site_packages {
            s.push(Place::Wheels(site.join("nvidia")), PlaceSource::PythonWheel);
        }
        s
    }

    fn push(&mut self, place: Place, source: PlaceSource) {
        if !self.places.iter().any(|(p, _)| *p == place) {
            self.places.push((place, source));
        }
    }

    /// The places of this process's environment (looked at once per call).
    pub fn from_process() -> ToolkitSearch {
        Self::from_nvrtc_search(&NvrtcSearch::from_process())
    }

    /// The places given NVRTC's search in this process's environment.
    fn from_nvrtc_search(search: &NvrtcSearch) -> ToolkitSearch {
        let nvrtc: Vec<PathBuf> = search
            .candidates
            .iter()
            .filter(|c| c.source != Source::SystemLoader && c.path.is_file())
            .map(|c| c.path.clone())
            .collect();
        let mut roots: Vec<(PathBuf, PlaceSource)> = Vec::new();
        for (var, source) in [
            ("CUDA_PATH", PlaceSource::CudaPath),
            ("CUDA_HOME", PlaceSource::CudaHome),
        ] {
            if let Some(v) = std::env::var_os(var).filter(|v| !v.is_empty()) {
                roots.push((PathBuf::from(v), source));
            }
        }
        if let Some(p) = crate::env::get_cuda_path() {
            roots.push((p, PlaceSource::CupyCudaPath));
        }
        roots.push((PathBuf::from("/usr/local/cuda"), PlaceSource::UsrLocalCuda));
        let mut s = Self::from_parts(&nvrtc, &roots, &search.sites);
        s.include_override = std::env::var_os(INCLUDE_PATH_VAR);
        s.devrt_override = std::env::var_os(DEVRT_VAR)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        s
    }

    /// The include folders: the override's when set (an empty one: none), else those
    /// of the first place that offers any; `None` when nothing is found.
    pub fn include_set(&self) -> Option<IncludeSet> {
        if let Some(v) = &self.include_override {
            let dirs: Vec<PathBuf> = std::env::split_paths(v)
                .filter(|p| !p.as_os_str().is_empty())
                .collect();
            return (!dirs.is_empty()).then(|| IncludeSet::new(dirs, PlaceSource::Override));
        }
        self.places.iter().find_map(|(p, source)| {
            let dirs = p.include_dirs();
            (!dirs.is_empty()).then(|| IncludeSet::new(dirs, *source))
        })
    }

    /// The device runtime `libcudadevrt.a`: the override's file when set, else the
    /// first place's that has one.
    pub fn device_runtime(&self) -> Option<PathBuf> {
        if let Some(f) = &self.devrt_override {
            return Some(f.clone());
        }
        self.places.iter().find_map(|(p, _)| p.device_runtime())
    }

    /// The places searched, for error messages: `path (source)` each.
    pub fn describe(&self) -> String {
        self.places
            .iter()
            .map(|(p, s)| format!("{} ({s:?})", p.path().display()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Where NVRTC may be in this process's environment: its candidates and the
/// site-packages folders, found with one walk of the Python installations. The kernel
/// cache's key needs both (the NVRTC file it would load, [`super::nvrtc_facts`], and the
/// toolkit's include folders), on a new process's first kernel: each walk there cost
/// as much as the rest of a warm first use.
#[derive(Debug, Clone)]
pub struct NvrtcSearch {
    /// [`site_packages`] of the environment searched.
    pub sites: Vec<PathBuf>,
    /// NVRTC's candidates ([`cuda_sys::loader::search::candidates`]) there.
    pub candidates: Vec<Candidate>,
}

impl NvrtcSearch {
    /// The search in this process's environment now.
    pub fn from_process() -> NvrtcSearch {
        let env = SearchEnv::from_process(&NVRTC);
        let sites = site_packages(&env);
        let candidates = candidates_with_sites(&NVRTC, &env, &sites);
        NvrtcSearch { sites, candidates }
    }
}

/// NVRTC's search in this process, done once.
pub fn nvrtc_search() -> &'static NvrtcSearch {
    static S: OnceLock<NvrtcSearch> = OnceLock::new();
    S.get_or_init(NvrtcSearch::from_process)
}

/// This process's places, looked for once.
pub fn toolkit_search() -> &'static ToolkitSearch {
    static S: OnceLock<ToolkitSearch> = OnceLock::new();
    S.get_or_init(|| ToolkitSearch::from_nvrtc_search(nvrtc_search()))
}

/// The include folders NVRTC gets in this process (see the [module docs](self)),
/// found and stamped once; `None` when none was found.
pub fn toolkit_includes() -> Option<&'static IncludeSet> {
    static S: OnceLock<Option<IncludeSet>> = OnceLock::new();
    S.get_or_init(|| toolkit_search().include_set()).as_ref()
}

/// [`IncludeSet::key_bytes`] of [`toolkit_includes`], worked out once.
pub(crate) fn toolkit_include_key() -> Option<&'static [u8]> {
    static S: OnceLock<Option<Vec<u8>>> = OnceLock::new();
    S.get_or_init(|| toolkit_includes().map(IncludeSet::key_bytes))
        .as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh, empty folder under the system temporary folder.
    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "cuda-rt-toolkit-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"").unwrap();
    }

    /// A CUDA 13 toolkit: include/ with the runtime headers, include/cccl, lib64/.
    fn toolkit(root: &Path) {
        touch(&root.join("include/cuda_runtime_api.h"));
        touch(&root.join("include/cooperative_groups.h"));
        touch(&root.join("include/cccl/cuda/std/array"));
        touch(&root.join("lib64/libnvrtc.so.13"));
        touch(&root.join("lib64/libcudadevrt.a"));
    }

    #[test]
    fn a_toolkit_offers_include_then_cccl_and_its_device_runtime() {
        let root = scratch("tk");
        toolkit(&root);
        let s = ToolkitSearch::from_parts(&[], &[(root.clone(), PlaceSource::CudaPath)], &[]);
        let set = s.include_set().unwrap();
        assert_eq!(set.dirs, [root.join("include"), root.join("include/cccl")]);
        assert_eq!(set.source, PlaceSource::CudaPath);
        assert_eq!(
            set.options(),
            [
                format!("-I{}", root.join("include").display()),
                format!("-I{}", root.join("include/cccl").display())
            ]
        );
        assert_eq!(s.device_runtime(), Some(root.join("lib64/libcudadevrt.a")));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_cuda_12_toolkit_without_cccl_folder_offers_include_alone() {
        let root = scratch("tk12");
        touch(&root.join("include/cuda_runtime_api.h"));
        touch(&root.join("include/cuda/std/array"));
        touch(&root.join("lib/libcudadevrt.a"));
        let s = ToolkitSearch::from_parts(&[], &[(root.clone(), PlaceSource::UsrLocalCuda)], &[]);
        assert_eq!(s.include_set().unwrap().dirs, [root.join("include")]);
        assert_eq!(s.device_runtime(), Some(root.join("lib/libcudadevrt.a")));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a_folder_without_runtime_headers_is_skipped_for_the_next_place() {
        let empty = scratch("nohdr");
        touch(&empty.join("include/nvrtc.h"));
        let root = scratch("tk2");
        toolkit(&root);
        let s = ToolkitSearch::from_parts(
            &[],
            &[
                (empty.clone(), PlaceSource::CudaPath),
                (root.clone(), PlaceSource::UsrLocalCuda),
            ],
            &[],
        );
        let set = s.include_set().unwrap();
        assert_eq!(set.source, PlaceSource::UsrLocalCuda);
        assert_eq!(set.dirs[0], root.join("include"));
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn cuda_13_wheels_offer_cu13_include_and_cccl() {
        let site = scratch("wheel13");
        let n = site.join("nvidia");
        touch(&n.join("cu13/include/cuda_runtime_api.h"));
        touch(&n.join("cu13/include/cccl/cub/cub.cuh"));
        touch(&n.join("cu13/lib/libnvrtc.so.13"));
        touch(&n.join("cu13/lib/libcudadevrt.a"));
        let s = ToolkitSearch::from_parts(&[], &[], std::slice::from_ref(&site));
        let set = s.include_set().unwrap();
        assert_eq!(
            set.dirs,
            [n.join("cu13/include"), n.join("cu13/include/cccl")]
        );
        assert_eq!(set.source, PlaceSource::PythonWheel);
        assert_eq!(s.device_runtime(), Some(n.join("cu13/lib/libcudadevrt.a")));
        let _ = std::fs::remove_dir_all(&site);
    }

    #[test]
    fn cuda_12_wheels_offer_runtime_then_cccl() {
        let site = scratch("wheel12");
        let n = site.join("nvidia");
        touch(&n.join("cuda_runtime/include/cuda_runtime_api.h"));
        touch(&n.join("cuda_runtime/lib/libcudadevrt.a"));
        touch(&n.join("cuda_cccl/include/cuda/std/array"));
        let s = ToolkitSearch::from_parts(&[], &[], std::slice::from_ref(&site));
        assert_eq!(
            s.include_set().unwrap().dirs,
            [n.join("cuda_runtime/include"), n.join("cuda_cccl/include")]
        );
        assert_eq!(
            s.device_runtime(),
            Some(n.join("cuda_runtime/lib/libcudadevrt.a"))
        );
        let _ = std::fs::remove_dir_all(&site);
    }

    #[test]
    fn the_nvrtc_librarys_own_installation_comes_first() {
        // NVRTC from a wheel, a full toolkit in CUDA_PATH: the wheel's headers win
        // (they match the compiler).
        let site = scratch("first-wheel");
        let n = site.join("nvidia");
        touch(&n.join("cu13/include/cuda_runtime_api.h"));
        touch(&n.join("cu13/lib/libnvrtc.so.13"));
        let root = scratch("first-tk");
        toolkit(&root);
        let s = ToolkitSearch::from_parts(
            &[n.join("cu13/lib/libnvrtc.so.13")],
            &[(root.clone(), PlaceSource::CudaPath)],
            std::slice::from_ref(&site),
        );
        assert_eq!(s.places[0], (Place::Wheels(n.clone()), PlaceSource::Nvrtc));
        // the same wheels are not searched twice
        assert_eq!(s.places.len(), 2);
        let set = s.include_set().unwrap();
        assert_eq!(set.source, PlaceSource::Nvrtc);
        assert_eq!(set.dirs, [n.join("cu13/include")]);
        // ... and a toolkit's NVRTC points at the toolkit
        assert_eq!(
            Place::of_library(&root.join("lib64/libnvrtc.so.13")),
            Some(Place::Toolkit(root.clone()))
        );
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&site);
    }

    #[test]
    fn nothing_found_is_none() {
        let empty = scratch("none");
        let s = ToolkitSearch::from_parts(
            &[],
            &[(empty.clone(), PlaceSource::CudaPath)],
            std::slice::from_ref(&empty),
        );
        assert_eq!(s.include_set(), None);
        assert_eq!(s.device_runtime(), None);
        assert!(s.describe().contains(&*empty.to_string_lossy()));
        let _ = std::fs::remove_dir_all(&empty);
    }

    #[test]
    fn the_overrides_replace_the_search() {
        let root = scratch("ovr");
        toolkit(&root);
        let mut s = ToolkitSearch::from_parts(&[], &[(root.clone(), PlaceSource::CudaPath)], &[]);
        s.include_override = Some(OsString::from("/a:/b"));
        let set = s.include_set().unwrap();
        assert_eq!(set.dirs, [PathBuf::from("/a"), PathBuf::from("/b")]);
        assert_eq!(set.source, PlaceSource::Override);
        s.include_override = Some(OsString::new());
        assert_eq!(s.include_set(), None, "set but empty: no include folder");
        s.devrt_override = Some(PathBuf::from("/x/libcudadevrt.a"));
        assert_eq!(s.device_runtime(), Some(PathBuf::from("/x/libcudadevrt.a")));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn the_stamp_changes_when_headers_change() {
        let root = scratch("stamp");
        toolkit(&root);
        let s = ToolkitSearch::from_parts(&[], &[(root.clone(), PlaceSource::CudaPath)], &[]);
        let a = s.include_set().unwrap();
        assert_eq!(a, s.include_set().unwrap(), "stable while nothing changes");
        // An upgrade rewrites files: a new entry, and a later time on the folder.
        std::thread::sleep(std::time::Duration::from_millis(20));
        touch(&root.join("include/cuda_new_header.h"));
        let b = s.include_set().unwrap();
        assert_eq!(a.dirs, b.dirs);
        assert_ne!(a.stamp, b.stamp);
        assert_ne!(a.key_bytes(), b.key_bytes());
        let _ = std::fs::remove_dir_all(&root);
    }
}
