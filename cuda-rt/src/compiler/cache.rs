//! The kernel cache: compiled modules in memory per device, compiled images on disk.
//!
//! - **Memory**: a [`RawModule`] per (device, source, source name, options, name
//!   expressions, target). A second [`RawModule::from_source`] of the same program
//!   costs a hash, a string compare and a reference count: no compile, no module load.
//!   A repeated [`RawKernel::new`](super::RawKernel::new) on one thread skips even the
//!   hash: each thread remembers its last few kernels, compared in full with the
//!   arguments.
//! - **Disk**: one file per key under [`KernelCache::disk_dir`]: by default
//!   `$CUDA_RT_KERNEL_CACHE_DIR`, else `$XDG_CACHE_HOME/cuda-rt/kernels`, else
//!   `~/.cache/cuda-rt/kernels`; `CUDA_RT_KERNEL_CACHE_IN_MEMORY=1` (or
//!   [`KernelCache::set_disk_dir`]`(None)`) keeps the cache in memory only.
//!
//! The key ([`cache_key`]) is a 128-bit hash (BLAKE3, cut to 16 bytes) of the source, source name,
//! options, name expressions, architecture, output kind and NVRTC version, each
//! length-prefixed, and of the toolkit include folders the compile gets with a stamp
//! of their headers' state ([`super::toolkit`]), so installing, upgrading or moving
//! the toolkit's headers compiles again (for a program that can read a header: one
//! whose source and options never name `include` is keyed without the folders, which
//! then need not be found or stamped for a warm lookup). A file ([`encode`] / [`decode`]) is a header (magic, format
//! version, key, architecture, output kind, payload length), the payload (image, log,
//! lowered names) and a checksum, XXH3-128 over everything before it ([`checksum`]).
//! Files are written to a temporary with an unpredictable name in the same
//! folder and renamed into place, so readers see a whole file or none, and processes
//! compiling the same kernel at once each rename a complete, identical file. A file
//! that is truncated, corrupt, for another key or another format, or whose checksum
//! does not match, is a miss: the kernel is compiled again and the file rewritten.
//!
//! # What the disk cache trusts
//!
//! A cubin read from the cache is loaded and run as the compile of the program asked
//! for, so whoever can write the folder's files can run code in every process that
//! uses it. The cache therefore uses a folder only if it is a folder **owned by the
//! effective user and not writable by group or others** (a link to such a folder is
//! followed); a missing folder is created mode 0700. Any other folder (another user's,
//! a shared `0777` or group-writable one, `/tmp` itself, a file) is refused: the cache
//! then keeps kernels in memory only, says why through
//! [`KernelCache::memory_only_reason`] and logs that reason once per process (a
//! `log` warning, target `cuda_rt::kernel_cache`: the application's logger decides
//! where it goes). Nothing is ever read from or written to a refused folder.
//!
//! Inside the folder, files are opened without following a link at their name and
//! used only if they are regular files of the user's, writable by nobody else; new
//! files are created exclusively (mode 0600) under unpredictable names, so a link
//! planted in the folder is never written through.
//!
//! When what is checked: the folder on a [`KernelCache`]'s first use of its disk part,
//! remembered by that cache (a folder that becomes writable by others later is refused
//! by every new cache, not by one that already uses it); each entry file (owner, mode,
//! not a link) and its checksum on every read.
//!
//! What remains trusted: the user's own account and root, who alone can write files
//! the checks accept, and whoever can rename or replace the folder's parents (keep the
//! folder under ones only you can write, as the default is). The checksum is not a
//! MAC: it catches a torn or damaged file, not a deliberate one. Entry formats 2 to 4
//! also keyed each entry with a per-user secret (`kcache.secret` in the folder, no
//! longer read; it may be deleted): the secret lay in the folder it guarded, readable
//! by exactly those who can write entries the checks accept, so it stopped no one the
//! checks do not, and it added a third of a cubin's load to a kernel's first use in a
//! process (issue 27). Like CuPy's kernel cache, the folder must not be shared between users;
//! unlike CuPy's, a shared or foreign folder is detected and refused rather than used.
//!
//! The NVRTC version in the key comes from a small facts file in the same folder
//! when NVRTC has been asked once before (see [`super::nvrtc_facts`]), so a warm hit in a
//! new process makes no NVRTC call at all.

mod entry;
mod stats;

use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

pub use super::cache_dir::{check_dir, write_file_atomically};
use super::hash::WordHasher;
pub use entry::{
    cache_key, cache_key_with_includes, checksum, decode, encode, CacheKey, DecodeError,
    CHECKSUM_LEN, FORMAT_VERSION, MAGIC,
};
pub use stats::KernelCacheStats;

use super::link::{device_runtime, is_relocatable, is_relocatable_cubin, link_with_device_runtime};
use super::nvrtc_facts::nvrtc_facts;
use super::raw::RawModule;
use super::{Compiled, Output, Program, Target};
use crate::error::Result;

/// Variable naming the disk cache folder.
pub const CACHE_DIR_VAR: &str = "CUDA_RT_KERNEL_CACHE_DIR";
/// Variable that, set to anything but `0` or empty, keeps the cache in memory only.
pub const IN_MEMORY_VAR: &str = "CUDA_RT_KERNEL_CACHE_IN_MEMORY";

/// The disk folder the environment asks for, given a variable lookup: `None` when
/// [`IN_MEMORY_VAR`] is set or no folder can be found. Pure.
pub fn disk_dir_from_env(var: impl Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let set = |name: &str| var(name).filter(|v| !v.is_empty());
    if set(IN_MEMORY_VAR).is_some_and(|v| v != "0") {
        return None;
    }
    if let Some(d) = set(CACHE_DIR_VAR) {
        return Some(PathBuf::from(d));
    }
    if let Some(x) = set("XDG_CACHE_HOME") {
        return Some(Path::new(&x).join("cuda-rt").join("kernels"));
    }
    set("HOME").map(|h| Path::new(&h).join(".cache").join("cuda-rt").join("kernels"))
}

/// The memory cache's lookup key, owned.
struct MemKey {
    device: i32,
    target: Target,
    source: Box<str>,
    source_name: Box<str>,
    options: Box<[Box<str>]>,
    name_expressions: Box<[Box<str>]>,
    toolkit_includes: bool,
}

impl MemKey {
    fn new(device: i32, program: &Program<'_>, target: Target) -> MemKey {
        let own = |v: &[&str]| v.iter().map(|s| Box::<str>::from(*s)).collect();
        MemKey {
            device,
            target,
            source: program.source.into(),
            source_name: program.source_name.into(),
            options: own(program.options),
            name_expressions: own(program.name_expressions),
            toolkit_includes: program.toolkit_includes,
        }
    }

    fn matches(&self, device: i32, program: &Program<'_>, target: Target) -> bool {
        let same = |a: &[Box<str>], b: &[&str]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| &**x == *y)
        };
        self.device == device
            && self.target == target
            && *self.source == *program.source
            && *self.source_name == *program.source_name
            && same(&self.options, program.options)
            && same(&self.name_expressions, program.name_expressions)
            && self.toolkit_includes == program.toolkit_includes
    }
}

fn mem_hash(device: i32, program: &Program<'_>, target: Target) -> u64 {
    // Word at a time: the whole source is hashed on every lookup (see `WordHasher`).
    let mut h = WordHasher::default();
    device.hash(&mut h);
    target.hash(&mut h);
    program.hash(&mut h);
    h.finish()
}

/// The disk part's configuration and, once checked, its state.
struct Disk {
    /// The folder asked for; `None`: memory only by configuration.
    dir: Option<PathBuf>,
    /// `None` until first used; then whether the folder is trusted (why not, if not).
    state: Option<std::result::Result<(), String>>,
}

/// The disk folder in use, for one use of the disk part.
struct DiskInUse {
    dir: PathBuf,
    /// The effective user, asked once for this use: the folder's first check and the
    /// entry's read check against it.
    euid: u32,
}

/// Why the cache is in memory only when no folder is configured.
const MEMORY_ONLY_BY_CONFIGURATION: &str = "kernels are cached in memory only: no disk folder is configured (CUDA_RT_KERNEL_CACHE_IN_MEMORY is set, no home or cache folder was found, or set_disk_dir(None) was called)";

/// The kernel cache: compiled modules in memory per device, compiled images on disk
/// (see the [module docs](self), also for what the disk folder must be to be used).
/// [`KernelCache::global`] is the one `RawModule` and `RawKernel` use; tests and tools
/// make their own.
pub struct KernelCache {
    disk: Mutex<Disk>,
    modules: Mutex<HashMap<u64, Vec<(MemKey, RawModule)>>>,
    compiles: AtomicU64,
    disk_hits: AtomicU64,
    disk_misses_corrupt: AtomicU64,
    disk_write_failures: AtomicU64,
    memory_hits: AtomicU64,
    /// Bumped by [`clear_memory`](Self::clear_memory): what a thread's recent lookups
    /// (`RawKernel::new`'s fast path) were taken under, so a cleared cache is not
    /// bypassed by them.
    generation: AtomicU64,
}

impl fmt::Debug for KernelCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // No file-system access here: the folder as configured, and why it is not
        // used if that is known already.
        let (dir, refused) = {
            let d = self.lock_disk();
            let refused = match &d.state {
                Some(Err(why)) => Some(why.clone()),
                _ => None,
            };
            (d.dir.clone(), refused)
        };
        f.debug_struct("KernelCache")
            .field("configured_disk_dir", &dir)
            .field("refused", &refused)
            .field("stats", &self.stats())
            .finish()
    }
}

/// Logs `reason` as a warning (through the `log` facade: the application's logger
/// decides where it goes), the first time a cache folder is refused in this process.
fn say_once(reason: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        log::warn!(target: "cuda_rt::kernel_cache", "{reason}");
    }
}

impl KernelCache {
    /// A cache with its disk part in `disk_dir` (`None`: memory only). Nothing is
    /// checked or created until the disk part is first used.
    pub fn new(disk_dir: Option<PathBuf>) -> KernelCache {
        KernelCache {
            disk: Mutex::new(Disk {
                dir: disk_dir,
                state: None,
            }),
            modules: Mutex::new(HashMap::new()),
            compiles: AtomicU64::new(0),
            disk_hits: AtomicU64::new(0),
            disk_misses_corrupt: AtomicU64::new(0),
            disk_write_failures: AtomicU64::new(0),
            memory_hits: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// A cache configured from the environment (see [`disk_dir_from_env`]).
    pub fn from_env() -> KernelCache {
        Self::new(disk_dir_from_env(|k| std::env::var(k).ok()))
    }

    /// The process-wide cache, configured from the environment on first use.
    pub fn global() -> &'static KernelCache {
        static G: OnceLock<KernelCache> = OnceLock::new();
        G.get_or_init(KernelCache::from_env)
    }

    fn lock_disk(&self) -> std::sync::MutexGuard<'_, Disk> {
        self.disk.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The disk part, if there is one and its folder is trusted: checked (and the
    /// folder created) on first use, then remembered.
    fn disk(&self) -> Option<DiskInUse> {
        let mut d = self.lock_disk();
        let dir = d.dir.clone()?;
        let euid = super::cache_dir::euid();
        let state = d.state.get_or_insert_with(|| {
            super::cache_dir::check_dir_as(&dir, euid).map_err(|why| {
                let reason = format!(
                    "kernels are cached in memory only: {why} (the folder must be owned by this user and writable by nobody else; set {CACHE_DIR_VAR} to such a folder)"
                );
                say_once(&reason);
                reason
            })
        });
        match state {
            Ok(()) => Some(DiskInUse { dir, euid }),
            Err(_) => None,
        }
    }

    /// The disk folder in use: `None` when the cache is in memory only, configured so
    /// or because the folder was refused ([`memory_only_reason`](Self::memory_only_reason)
    /// says which). The first call checks the folder, creating it if missing.
    pub fn disk_dir(&self) -> Option<PathBuf> {
        self.disk().map(|d| d.dir)
    }

    /// Why the cache keeps compiled kernels in memory only: `None` when it uses its
    /// disk folder; else no folder is configured, or the folder was refused (another
    /// user's, writable by group or others, or not a folder) and the message names it
    /// and says why. See the [module docs](self).
    pub fn memory_only_reason(&self) -> Option<String> {
        if self.disk().is_some() {
            return None;
        }
        match &self.lock_disk().state {
            Some(Err(why)) => Some(why.clone()),
            _ => Some(MEMORY_ONLY_BY_CONFIGURATION.to_owned()),
        }
    }

    /// Moves the disk part to `dir`, or turns it off with `None` (memory only). The new
    /// folder is checked when first used.
    pub fn set_disk_dir(&self, dir: Option<PathBuf>) {
        *self.lock_disk() = Disk { dir, state: None };
    }

    /// Drops the modules held in memory (modules in use stay loaded until dropped).
    /// Each thread's recently built kernels (`RawKernel::new`) are no longer used from
    /// then on; the modules they hold are let go at that thread's next
    /// `RawKernel::new` miss, or when it exits.
    pub fn clear_memory(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Ok(mut m) = self.modules.lock() {
            m.clear();
        }
    }

    /// How many times the memory part was cleared (see the `generation` field).
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Counts a memory hit served outside [`module`](Self::module) (a thread's recent
    /// lookup in `RawKernel::new`).
    pub(crate) fn count_memory_hit(&self) {
        self.memory_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// The path of `key`'s file, if there is a disk part.
    pub fn file_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.disk_dir().map(|d| d.join(key.file_name()))
    }

    /// The compile stored on disk under `key`, if there is a disk part and a usable
    /// file: a regular file of the user's (a link at its name is not followed), whole,
    /// for this key and format, with a checksum that matches. Counts a hit, or an unusable
    /// file. No NVRTC call.
    pub fn load(&self, key: &CacheKey) -> Option<Compiled> {
        let disk = self.disk()?;
        self.load_from(&disk, key)
    }

    fn load_from(&self, disk: &DiskInUse, key: &CacheKey) -> Option<Compiled> {
        let read = super::cache_dir::read_private(&key.path_in(&disk.dir), disk.euid);
        let decoded = match read {
            Ok(None) => return None,
            Ok(Some(bytes)) => entry::decode_owned(bytes, key).ok(),
            Err(_) => None,
        };
        match decoded {
            Some(c) => {
                self.disk_hits.fetch_add(1, Ordering::Relaxed);
                Some(c)
            }
            None => {
                self.disk_misses_corrupt.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Writes `compiled` to disk under `key` (atomically, with its checksum). An error
    /// when the cache is in memory only (with the reason) or the write fails (counted in [`KernelCacheStats::disk_write_failures`]).
    pub fn store(&self, key: &CacheKey, compiled: &Compiled) -> std::io::Result<()> {
        let Some(disk) = self.disk() else {
            let why = self
                .memory_only_reason()
                .unwrap_or_else(|| MEMORY_ONLY_BY_CONFIGURATION.to_owned());
            return Err(std::io::Error::other(why));
        };
        self.store_to(&disk, key, compiled)
    }

    fn store_to(
        &self,
        disk: &DiskInUse,
        key: &CacheKey,
        compiled: &Compiled,
    ) -> std::io::Result<()> {
        let written = write_atomically(&disk.dir, key, &encode(key, compiled));
        if written.is_err() {
            self.disk_write_failures.fetch_add(1, Ordering::Relaxed);
        }
        written
    }

    /// Compiles `program` for `target` through the disk cache (no GPU needed): a valid
    /// file is read back; otherwise NVRTC compiles and the file is (re)written
    /// atomically. Failures to write are counted, not returned; a refused folder
    /// leaves the cache in memory only ([`memory_only_reason`](Self::memory_only_reason)).
    pub fn compile(&self, program: &Program<'_>, target: Target) -> Result<Compiled> {
        let Some(disk) = self.disk() else {
            return self.compile_now(program, target);
        };
        // The NVRTC version from the facts file when there is one: a warm hit opens
        // no `libnvrtc` at all.
        let key = cache_key(program, target, nvrtc_facts(Some(&disk.dir))?.version);
        if let Some(c) = self.load_from(&disk, &key) {
            return Ok(c);
        }
        let compiled = self.compile_now(program, target)?;
        let _ = self.store_to(&disk, &key, &compiled);
        Ok(compiled)
    }

    fn compile_now(&self, program: &Program<'_>, target: Target) -> Result<Compiled> {
        self.compiles.fetch_add(1, Ordering::Relaxed);
        program.compile(target)
    }

    /// The module of `program` for `target` on `device`: from memory, else compiled
    /// (through the disk cache) and loaded, then kept in memory.
    pub(crate) fn module(
        &self,
        device: i32,
        program: &Program<'_>,
        target: Target,
    ) -> Result<RawModule> {
        let h = mem_hash(device, program, target);
        if let Some(m) = self.lookup(h, device, program, target) {
            self.memory_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(m);
        }
        let compiled = self.compile(program, target)?;
        let module = RawModule::load(device, linked(device, program, compiled)?)?;
        let mut map = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        let bucket = map.entry(h).or_default();
        if let Some((_, m)) = bucket
            .iter()
            .find(|(k, _)| k.matches(device, program, target))
        {
            return Ok(m.clone());
        }
        bucket.push((MemKey::new(device, program, target), module.clone()));
        Ok(module)
    }

    fn lookup(
        &self,
        h: u64,
        device: i32,
        program: &Program<'_>,
        target: Target,
    ) -> Option<RawModule> {
        let map = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&h)?
            .iter()
            .find(|(k, _)| k.matches(device, program, target))
            .map(|(_, m)| m.clone())
    }
}

/// `compiled` ready to load on `device`: as it is, or, for relocatable device code
/// (`-rdc=true`, `-dc`, or a relocatable cubin), linked with the device runtime
/// ([`super::link`]).
fn linked(device: i32, program: &Program<'_>, compiled: Compiled) -> Result<Compiled> {
    let relocatable = is_relocatable(program.options)
        || (compiled.output == Output::Cubin && is_relocatable_cubin(&compiled.image));
    if !relocatable {
        return Ok(compiled);
    }
    let devrt = device_runtime()?;
    let image = link_with_device_runtime(device, &compiled, &devrt)?;
    Ok(Compiled {
        image,
        output: Output::Cubin,
        ..compiled
    })
}

/// Writes `bytes` to `dir/<key>.kcache` atomically; see [`write_file_atomically`].
pub fn write_atomically(dir: &Path, key: &CacheKey, bytes: &[u8]) -> std::io::Result<()> {
    write_file_atomically(dir, &key.file_name(), bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_dir_follows_the_variables_in_order() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            disk_dir_from_env(env(&[("HOME", "/h")])),
            Some(PathBuf::from("/h/.cache/cuda-rt/kernels"))
        );
        assert_eq!(
            disk_dir_from_env(env(&[("HOME", "/h"), ("XDG_CACHE_HOME", "/x")])),
            Some(PathBuf::from("/x/cuda-rt/kernels"))
        );
        assert_eq!(
            disk_dir_from_env(env(&[("HOME", "/h"), (CACHE_DIR_VAR, "/c")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(
            disk_dir_from_env(env(&[(CACHE_DIR_VAR, "/c"), (IN_MEMORY_VAR, "1")])),
            None
        );
        assert_eq!(
            disk_dir_from_env(env(&[(CACHE_DIR_VAR, "/c"), (IN_MEMORY_VAR, "0")])),
            Some(PathBuf::from("/c"))
        );
        assert_eq!(disk_dir_from_env(env(&[])), None);
    }
}
