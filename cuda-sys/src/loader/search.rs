//! The search order for a library, as a pure function of the environment and the file
//! system, so it can be tested with fake folders.
//!
//! Order: the library's override variable (a file, or a folder holding one of the file
//! names); `$CUDA_PATH/lib64` and `$CUDA_PATH/lib`; `/usr/local/cuda/lib64` and `lib`;
//! the system loader's own path (the bare file name); then the `nvidia/*/lib` folders of
//! installed Python wheels in every site-packages folder found (see [`site_packages`]).
//!
//! A candidate path that exists but is not a regular file (a FIFO, a socket, a device)
//! is listed here like any other, and refused by [`super::Library::open_with`] before
//! the system loader sees it, with that reason among the paths tried.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::LibrarySpec;

/// Where a candidate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The library's override variable.
    Override,
    /// `$CUDA_PATH`.
    CudaPath,
    /// `/usr/local/cuda`.
    UsrLocalCuda,
    /// The system loader's search path (`LD_LIBRARY_PATH`, `ld.so.cache`, ...).
    SystemLoader,
    /// A Python wheel's `nvidia/.../lib` folder.
    PythonWheel,
}

/// One path to hand to the system loader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// A full path, or a bare file name for [`Source::SystemLoader`].
    pub path: PathBuf,
    /// Why it is on the list.
    pub source: Source,
}

/// The environment the search reads: variables and the home folder. Tests build one by
/// hand; [`SearchEnv::from_process`] reads the real one.
#[derive(Debug, Clone, Default)]
pub struct SearchEnv {
    vars: Vec<(String, OsString)>,
    /// Root under which the fixed folders (`/usr/local/cuda`, `/usr/lib/python3`...) are
    /// looked for; `/` except in tests.
    root: PathBuf,
}

/// The variables the search reads.
const VARS: &[&str] = &[
    "CUDA_PATH",
    "PATH",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
    "PYTHONPATH",
    "PYTHONUSERBASE",
    "PYENV_ROOT",
    "HOME",
    "CUDA_RT_PYTHON_SITE_PACKAGES",
];

impl SearchEnv {
    /// The process's environment, with `/` as root.
    pub fn from_process(spec: &LibrarySpec) -> Self {
        let mut vars = Vec::new();
        for name in VARS
            .iter()
            .copied()
            .chain(std::iter::once(spec.override_var))
        {
            if let Some(v) = std::env::var_os(name) {
                vars.push((name.to_string(), v));
            }
        }
        SearchEnv {
            vars,
            root: PathBuf::from("/"),
        }
    }

    /// An empty environment whose fixed folders live under `root` (for tests).
    pub fn with_root(root: impl Into<PathBuf>) -> Self {
        SearchEnv {
            vars: Vec::new(),
            root: root.into(),
        }
    }

    /// Sets a variable.
    pub fn var(mut self, name: &str, value: impl Into<OsString>) -> Self {
        self.vars.retain(|(n, _)| n != name);
        self.vars.push((name.to_string(), value.into()));
        self
    }

    fn get(&self, name: &str) -> Option<&OsString> {
        self.vars
            .iter()
            .find(|(n, v)| n == name && !v.is_empty())
            .map(|(_, v)| v)
    }

    fn fixed(&self, path: &str) -> PathBuf {
        self.root.join(path.trim_start_matches('/'))
    }
}

/// Every candidate for `spec`, in search order, without duplicates. Folders that do not
/// exist are left out; the system loader entry is always there.
pub fn candidates(spec: &LibrarySpec, env: &SearchEnv) -> Vec<Candidate> {
    candidates_with_sites(spec, env, &site_packages(env))
}

/// [`candidates`] with the site-packages folders already found ([`site_packages`] of
/// the same `env`): a caller that needs both walks the Python installations once
/// (each walk lists and stats every interpreter's folders).
pub fn candidates_with_sites(
    spec: &LibrarySpec,
    env: &SearchEnv,
    sites: &[PathBuf],
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut push = |path: PathBuf, source: Source| {
        if !out.iter().any(|c| c.path == path) {
            out.push(Candidate { path, source });
        }
    };
    if let Some(v) = env.get(spec.override_var) {
        let p = PathBuf::from(v);
        if p.is_dir() {
            for f in spec.files {
                push(p.join(f), Source::Override);
            }
        } else {
            push(p, Source::Override);
        }
    }
    let toolkit_dirs = |base: &Path| [base.join("lib64"), base.join("lib")];
    if let Some(cuda) = env.get("CUDA_PATH") {
        for dir in toolkit_dirs(Path::new(cuda)) {
            for f in files_in(&dir, spec) {
                push(f, Source::CudaPath);
            }
        }
    }
    for dir in toolkit_dirs(&env.fixed("/usr/local/cuda")) {
        for f in files_in(&dir, spec) {
            push(f, Source::UsrLocalCuda);
        }
    }
    for f in spec.files {
        push(PathBuf::from(f), Source::SystemLoader);
    }
    for site in sites {
        for wheel in spec.wheel_dirs {
            for f in files_in(&site.join(wheel), spec) {
                push(f, Source::PythonWheel);
            }
        }
    }
    out
}

fn files_in(dir: &Path, spec: &LibrarySpec) -> Vec<PathBuf> {
    if !dir.is_dir() {
        return Vec::new();
    }
    spec.files.iter().map(|f| dir.join(f)).collect()
}

/// The site-packages folders where `pip install nvidia-...` puts CUDA libraries, in
/// this order: `CUDA_RT_PYTHON_SITE_PACKAGES` (colon-separated), `PYTHONPATH` entries,
/// the active virtualenv, the active conda env, for each `python3` (or `python`) on
/// `PATH` the environment it belongs to (the folder above its `bin`, as found on `PATH`:
/// a virtual environment, with its `pyvenv.cfg`, even when `VIRTUAL_ENV` is not set)
/// and then the installation its symlinks lead to (the base interpreter's), pyenv's
/// versions, the user site (`PYTHONUSERBASE` or `~/.local`), then the system folders
/// under `/usr/local/lib` and `/usr/lib`. Only folders that exist are returned.
pub fn site_packages(env: &SearchEnv) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut add = |p: PathBuf| {
        if p.is_dir() && !out.contains(&p) {
            out.push(p);
        }
    };
    for var in ["CUDA_RT_PYTHON_SITE_PACKAGES", "PYTHONPATH"] {
        if let Some(v) = env.get(var) {
            for p in std::env::split_paths(v) {
                add(p);
            }
        }
    }
    let mut prefixes: Vec<PathBuf> = Vec::new();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(v) = env.get(var) {
            prefixes.push(PathBuf::from(v));
        }
    }
    if let Some(path) = env.get("PATH") {
        for dir in std::env::split_paths(path) {
            for exe in ["python3", "python"] {
                let bin = dir.join(exe);
                // A venv's `bin/python3` is a symlink to the base interpreter: its
                // packages are beside the link, not the target (containers put the venv
                // on PATH without VIRTUAL_ENV). So the link's own prefix first.
                if bin.exists() {
                    if let Some(prefix) = dir.parent() {
                        prefixes.push(prefix.to_path_buf());
                    }
                }
                if let Ok(real) = std::fs::canonicalize(&bin) {
                    if let Some(prefix) = real.parent().and_then(Path::parent) {
                        prefixes.push(prefix.to_path_buf());
                    }
                }
            }
        }
    }
    let pyenv = env
        .get("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| env.get("HOME").map(|h| Path::new(h).join(".pyenv")));
    if let Some(versions) = pyenv.map(|p| p.join("versions")) {
        prefixes.extend(sorted_entries(&versions, |_| true));
    }
    let user = env
        .get("PYTHONUSERBASE")
        .map(PathBuf::from)
        .or_else(|| env.get("HOME").map(|h| Path::new(h).join(".local")));
    prefixes.extend(user);
    prefixes.push(env.fixed("/usr/local"));
    prefixes.push(env.fixed("/usr"));
    for prefix in prefixes {
        let lib = prefix.join("lib");
        for py in sorted_entries(&lib, |n| n.starts_with("python3")) {
            add(py.join("site-packages"));
            add(py.join("dist-packages"));
        }
        if prefix.ends_with("usr") {
            add(lib.join("python3").join("dist-packages"));
        }
    }
    out
}

fn sorted_entries(dir: &Path, keep: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut v: Vec<PathBuf> = rd
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(&keep))
        .map(|e| e.path())
        .collect();
    // Newest Python first: python3.12 before python3.9.
    v.sort_by_key(|p| std::cmp::Reverse(version_key(p)));
    v
}

fn version_key(p: &Path) -> Vec<u64> {
    let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
    name.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0))
        .collect()
}
