//! The kernel cache: compiled modules in memory per device, compiled images on disk.
//!
//! - **Memory**: a [`RawModule`] per (device, source, source name, options, name
//!   expressions, target). A second [`RawModule::from_source`] of the same program
//!   costs a hash, a string compare and a reference count: no compile, no module load.
//! - **Disk**: one file per key under [`KernelCache::disk_dir`]: by default
//!   `$CUDA_RT_KERNEL_CACHE_DIR`, else `$XDG_CACHE_HOME/cuda-rt/kernels`, else
//!   `~/.cache/cuda-rt/kernels`; `CUDA_RT_KERNEL_CACHE_IN_MEMORY=1` (or
//!   [`KernelCache::set_disk_dir`]`(None)`) keeps the cache in memory only.
//!
//! The key ([`cache_key`]) is a 128-bit FNV-1a hash of the source, source name,
//! options, name expressions, architecture, output kind and NVRTC version, each
//! length-prefixed. A file ([`encode`] / [`decode`]) is a header (magic, format
//! version, key, architecture, output kind, payload length), the payload (image, log,
//! lowered names) and a tag: BLAKE3 in keyed mode over everything before it, keyed
//! with the user's secret ([`CacheSecret`], 32 random bytes in [`SECRET_FILE`] in the
//! folder). Files are written to a temporary with an unpredictable name in the same
//! folder and renamed into place, so readers see a whole file or none, and processes
//! compiling the same kernel at once each rename a complete, identical file. A file
//! that is truncated, corrupt, for another key or another format, or whose tag does
//! not verify, is a miss: the kernel is compiled again and the file rewritten.
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
//! [`KernelCache::memory_only_reason`] and prints that reason once per process on
//! standard error. Nothing is ever read from or written to a refused folder.
//!
//! Inside the folder, files are opened without following a link at their name and
//! used only if they are regular files of the user's, writable by nobody else; new
//! files are created exclusively (mode 0600) under unpredictable names, so a link
//! planted in the folder is never written through. An entry is used only if its tag
//! verifies with the secret, so a file not written by this user's cache (forged,
//! copied from another machine or user, or in the format before tags, version 1) is
//! a miss and is overwritten. The secret is read once per [`KernelCache`] and is
//! itself refused unless it is a regular file of the user's, mode 0600 (readable by
//! nobody else).
//!
//! What remains trusted: the user's own account and root (who can read the secret),
//! and the NVRTC facts file (see below), which is not tagged: it only names the NVRTC
//! version in the key and the architectures compiled for, and lives in the same
//! user-only folder. Like CuPy's kernel cache, the folder must not be shared between
//! users; unlike CuPy's, a shared or foreign folder is detected and refused rather than
//! used.
//!
//! The NVRTC version in the key comes from a small facts file in the same folder
//! when NVRTC has been asked once before (see [`super::facts`]), so a warm hit in a
//! new process makes no NVRTC call at all.

mod disk;
mod stats;

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

pub use disk::{check_dir, CacheSecret, SECRET_FILE, SECRET_LEN, TAG_LEN};
pub use stats::KernelCacheStats;

use super::facts::nvrtc_facts;
use super::raw::RawModule;
use super::{Compiled, Output, Program, Target};
use crate::error::Result;

/// Variable naming the disk cache folder.
pub const CACHE_DIR_VAR: &str = "CUDA_RT_KERNEL_CACHE_DIR";
/// Variable that, set to anything but `0` or empty, keeps the cache in memory only.
pub const IN_MEMORY_VAR: &str = "CUDA_RT_KERNEL_CACHE_IN_MEMORY";

/// FNV-1a, 128 bits: a stable hash (the same in every build and process).
#[derive(Debug, Clone, Copy)]
pub struct Fnv128(u128);

impl Fnv128 {
    const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
    const PRIME: u128 = 0x0000000001000000000000000000013B;

    /// A fresh hash.
    pub const fn new() -> Fnv128 {
        Fnv128(Self::OFFSET)
    }

    /// Hashes `bytes` in.
    pub fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u128::from(b);
            h = h.wrapping_mul(Self::PRIME);
        }
        self.0 = h;
    }

    /// Hashes in `bytes` preceded by their length, so fields cannot run together.
    pub fn field(&mut self, bytes: &[u8]) {
        self.write(&(bytes.len() as u64).to_le_bytes());
        self.write(bytes);
    }

    /// The hash, big-endian.
    pub const fn finish(&self) -> [u8; 16] {
        self.0.to_be_bytes()
    }
}

impl Default for Fnv128 {
    fn default() -> Self {
        Self::new()
    }
}

/// The disk cache key of a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey(pub [u8; 16]);

impl CacheKey {
    /// 32 lowercase hex digits.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The cache file's name: `<hex>.kcache`.
    pub fn file_name(&self) -> String {
        format!("{}.kcache", self.to_hex())
    }
}

/// The key of `program` compiled for `target` by NVRTC `nvrtc_version`. Pure.
pub fn cache_key(program: &Program<'_>, target: Target, nvrtc_version: (i32, i32)) -> CacheKey {
    let mut h = Fnv128::new();
    h.field(b"cuda-rt kernel cache key v1");
    h.field(program.source.as_bytes());
    h.field(program.source_name.as_bytes());
    h.write(&(program.options.len() as u64).to_le_bytes());
    for o in program.options {
        h.field(o.as_bytes());
    }
    h.write(&(program.name_expressions.len() as u64).to_le_bytes());
    for e in program.name_expressions {
        h.field(e.as_bytes());
    }
    h.write(&target.arch.to_le_bytes());
    h.write(&[output_byte(target.output)]);
    h.write(&nvrtc_version.0.to_le_bytes());
    h.write(&nvrtc_version.1.to_le_bytes());
    CacheKey(h.finish())
}

/// First bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"CURTKC\r\n";
/// Version of the file layout: 2 ends with a keyed tag (1, before it, with an unkeyed
/// FNV-1a checksum, is read as a miss).
pub const FORMAT_VERSION: u32 = 2;
/// magic 8, version 4, key 16, arch 4, output 1, pad 3, payload length 8.
const HEADER_LEN: usize = 44;

fn output_byte(o: Output) -> u8 {
    match o {
        Output::Cubin => 0,
        Output::Ptx => 1,
    }
}

/// Why a cache file was not used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeError(pub &'static str);

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unusable kernel cache file: {}", self.0)
    }
}

impl std::error::Error for DecodeError {}

/// The bytes of a cache file for `compiled` under `key`, tagged with `secret`. Pure.
pub fn encode(secret: &CacheSecret, key: &CacheKey, compiled: &Compiled) -> Vec<u8> {
    let mut payload = Vec::with_capacity(compiled.image.len() + compiled.log.len() + 64);
    put_bytes(&mut payload, &compiled.image);
    put_bytes(&mut payload, compiled.log.as_bytes());
    payload.extend_from_slice(&(compiled.lowered_names.len() as u64).to_le_bytes());
    for (e, l) in &compiled.lowered_names {
        put_bytes(&mut payload, e.as_bytes());
        put_bytes(&mut payload, l.as_bytes());
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len() + TAG_LEN);
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&key.0);
    out.extend_from_slice(&compiled.arch.to_le_bytes());
    out.extend_from_slice(&[output_byte(compiled.output), 0, 0, 0]);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&payload);
    let tag = secret.tag(&out);
    out.extend_from_slice(&tag);
    out
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

/// Reads a cache file's bytes back, checking magic, version, key, length and the tag
/// (keyed with `secret`) before anything of the payload is used. Never panics,
/// whatever the bytes. Pure.
pub fn decode(secret: &CacheSecret, bytes: &[u8], key: &CacheKey) -> Result<Compiled, DecodeError> {
    if bytes.len() < HEADER_LEN + TAG_LEN {
        return Err(DecodeError("shorter than its header (truncated)"));
    }
    if bytes[..8] != MAGIC {
        return Err(DecodeError("bad magic"));
    }
    let mut r = Reader {
        b: &bytes[8..HEADER_LEN],
    };
    if r.u32()? != FORMAT_VERSION {
        return Err(DecodeError("another format version"));
    }
    if r.take(16)? != key.0 {
        return Err(DecodeError("written for another key"));
    }
    let arch = r.u32()?;
    let output = match r.take(4)?[0] {
        0 => Output::Cubin,
        1 => Output::Ptx,
        _ => return Err(DecodeError("unknown output kind")),
    };
    let payload_len = r.u64()?;
    let body_end = bytes.len() - TAG_LEN;
    if payload_len != (body_end - HEADER_LEN) as u64 {
        return Err(DecodeError("length does not match (truncated or extended)"));
    }
    if !secret.verify(&bytes[..body_end], &bytes[body_end..]) {
        return Err(DecodeError(
            "the tag does not verify (corrupt, or not written by this user's cache)",
        ));
    }
    let mut r = Reader {
        b: &bytes[HEADER_LEN..body_end],
    };
    let image = r.bytes()?.to_vec();
    let log = r.string()?;
    let n = r.u64()?;
    let mut lowered_names = Vec::new();
    for _ in 0..n {
        lowered_names.push((r.string()?, r.string()?));
    }
    if !r.b.is_empty() {
        return Err(DecodeError("trailing bytes in the payload"));
    }
    Ok(Compiled {
        image,
        output,
        arch,
        log,
        lowered_names,
    })
}

struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() < n {
            return Err(DecodeError("a field runs past the end"));
        }
        let (head, tail) = self.b.split_at(n);
        self.b = tail;
        Ok(head)
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<&'a [u8], DecodeError> {
        let n = usize::try_from(self.u64()?).map_err(|_| DecodeError("field too long"))?;
        self.take(n)
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| DecodeError("text is not UTF-8"))
    }
}

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
    }
}

fn mem_hash(device: i32, program: &Program<'_>, target: Target) -> u64 {
    let mut h = DefaultHasher::new();
    device.hash(&mut h);
    target.hash(&mut h);
    program.hash(&mut h);
    h.finish()
}

/// The disk part's configuration and, once checked, its state.
struct Disk {
    /// The folder asked for; `None`: memory only by configuration.
    dir: Option<PathBuf>,
    /// `None` until first used; then the folder's secret, or why it is refused.
    state: Option<std::result::Result<CacheSecret, String>>,
}

/// The disk folder in use and its secret.
struct DiskInUse {
    dir: PathBuf,
    secret: CacheSecret,
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

/// Prints `reason` on standard error, the first time a cache folder is refused in this
/// process.
fn say_once(reason: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!("cuda-rt: {reason}");
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
    /// folder created, and its secret read or made) on first use, then remembered.
    fn disk(&self) -> Option<DiskInUse> {
        let mut d = self.lock_disk();
        let dir = d.dir.clone()?;
        let state = d.state.get_or_insert_with(|| {
            CacheSecret::load_or_create(&dir).map_err(|why| {
                let reason = format!(
                    "kernels are cached in memory only: {why} (the folder must be owned by this user and writable by nobody else; set {CACHE_DIR_VAR} to such a folder)"
                );
                say_once(&reason);
                reason
            })
        });
        match state {
            Ok(secret) => Some(DiskInUse {
                dir,
                secret: secret.clone(),
            }),
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
    /// user's, writable by group or others, not a folder, or its secret file is not
    /// trusted) and the message names it and says why. See the [module docs](self).
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
    pub fn clear_memory(&self) {
        if let Ok(mut m) = self.modules.lock() {
            m.clear();
        }
    }

    /// The path of `key`'s file, if there is a disk part.
    pub fn file_path(&self, key: &CacheKey) -> Option<PathBuf> {
        self.disk_dir().map(|d| d.join(key.file_name()))
    }

    /// The compile stored on disk under `key`, if there is a disk part and a usable
    /// file: a regular file of the user's (a link at its name is not followed), whole,
    /// for this key and format, with a tag that verifies. Counts a hit, or an unusable
    /// file. No NVRTC call.
    pub fn load(&self, key: &CacheKey) -> Option<Compiled> {
        let disk = self.disk()?;
        self.load_from(&disk, key)
    }

    fn load_from(&self, disk: &DiskInUse, key: &CacheKey) -> Option<Compiled> {
        let read = disk::read_private(&disk.dir.join(key.file_name()));
        let decoded = match read {
            Ok(None) => return None,
            Ok(Some(bytes)) => decode(&disk.secret, &bytes, key).ok(),
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

    /// Writes `compiled` to disk under `key` (atomically, tagged with the folder's
    /// secret). An error when the cache is in memory only (with the reason) or the
    /// write fails (counted in [`KernelCacheStats::disk_write_failures`]).
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
        let written = write_atomically(&disk.dir, key, &encode(&disk.secret, key, compiled));
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
        let module = RawModule::load(device, compiled)?;
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

/// Writes `bytes` to `dir/<key>.kcache` atomically; see [`write_file_atomically`].
pub fn write_atomically(dir: &Path, key: &CacheKey, bytes: &[u8]) -> std::io::Result<()> {
    write_file_atomically(dir, &key.file_name(), bytes)
}

/// Writes `bytes` to `dir/name` through a temporary file with an unpredictable name in
/// the same folder (created exclusively, mode 0600, not following links) and a rename,
/// so the file appears whole or not at all and no link planted in the folder is written
/// through. `dir` is created (mode 0700) if missing, and refused, with an error saying
/// why, unless it is the user's and writable by nobody else ([`check_dir`]).
pub fn write_file_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    disk::write_atomically_in(dir, name, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Compiled {
        Compiled {
            image: vec![0x7f, b'E', b'L', b'F', 1, 2, 3],
            output: Output::Cubin,
            arch: 90,
            log: "warning: something".into(),
            lowered_names: vec![("k<float>".into(), "_Z1kIfEvv".into())],
        }
    }

    #[test]
    fn fnv128_matches_reference_vectors() {
        assert_eq!(
            Fnv128::new().finish(),
            0x6c62272e07bb014262b821756295c58du128.to_be_bytes()
        );
        let mut h = Fnv128::new();
        h.write(b"a");
        assert_eq!(
            h.finish(),
            0xd228cb696f1a8caf78912b704e4a8964u128.to_be_bytes()
        );
    }

    #[test]
    fn cache_key_is_stable_across_builds() {
        let p = Program::new("extern \"C\" __global__ void k() {}").options(&["-O3"]);
        let k = cache_key(&p, Target::cubin(90), (13, 0));
        // A fixed value, computed independently (Python) from the documented layout:
        // changing it invalidates every user's disk cache.
        assert_eq!(k.to_hex(), "9beb27f2cc1d8f7a4a72e0170780c523");
        assert_eq!(k.to_hex().len(), 32);
        assert_eq!(k.file_name(), format!("{}.kcache", k.to_hex()));
    }

    #[test]
    fn cache_key_changes_with_every_input() {
        let base = Program::new("src")
            .options(&["-a"])
            .name_expressions(&["f<int>"]);
        let k = |p: &Program<'_>, t: Target, v: (i32, i32)| cache_key(p, t, v);
        let k0 = k(&base, Target::cubin(90), (13, 0));
        assert_ne!(k0, k(&base.options(&["-b"]), Target::cubin(90), (13, 0)));
        assert_ne!(
            k0,
            k(&base.options(&["-a", ""]), Target::cubin(90), (13, 0))
        );
        assert_ne!(
            k0,
            k(
                &Program {
                    source: "src2",
                    ..base
                },
                Target::cubin(90),
                (13, 0)
            )
        );
        assert_ne!(
            k0,
            k(&base.name_expressions(&[]), Target::cubin(90), (13, 0))
        );
        assert_ne!(k0, k(&base.source_name("x.cu"), Target::cubin(90), (13, 0)));
        assert_ne!(k0, k(&base, Target::cubin(80), (13, 0)));
        assert_ne!(k0, k(&base, Target::ptx(90), (13, 0)));
        assert_ne!(k0, k(&base, Target::cubin(90), (12, 9)));
        // Field boundaries matter: ["ab"] is not ["a", "b"].
        assert_ne!(
            k(&base.options(&["ab"]), Target::cubin(90), (13, 0)),
            k(&base.options(&["a", "b"]), Target::cubin(90), (13, 0))
        );
    }

    const SECRET: CacheSecret = CacheSecret::from_bytes([0x5a; SECRET_LEN]);

    #[test]
    fn encode_decode_round_trips() {
        let key = CacheKey([7; 16]);
        let c = sample();
        assert_eq!(decode(&SECRET, &encode(&SECRET, &key, &c), &key), Ok(c));
    }

    #[test]
    fn every_truncation_is_a_decode_error() {
        let key = CacheKey([1; 16]);
        let bytes = encode(&SECRET, &key, &sample());
        for n in 0..bytes.len() {
            assert!(
                decode(&SECRET, &bytes[..n], &key).is_err(),
                "truncated at {n}"
            );
        }
    }

    #[test]
    fn every_flipped_byte_is_a_decode_error() {
        let key = CacheKey([1; 16]);
        let bytes = encode(&SECRET, &key, &sample());
        for i in 0..bytes.len() {
            let mut b = bytes.clone();
            b[i] ^= 0x20;
            assert!(decode(&SECRET, &b, &key).is_err(), "flip at {i}");
        }
    }

    #[test]
    fn a_file_for_another_key_is_a_miss() {
        let bytes = encode(&SECRET, &CacheKey([1; 16]), &sample());
        assert_eq!(
            decode(&SECRET, &bytes, &CacheKey([2; 16])),
            Err(DecodeError("written for another key"))
        );
    }

    #[test]
    fn an_entry_tagged_with_another_secret_is_a_miss() {
        let key = CacheKey([3; 16]);
        let mut forged = sample();
        forged.image = b"\x7fELF attacker's cubin".to_vec();
        let bytes = encode(&CacheSecret::from_bytes([0xa5; SECRET_LEN]), &key, &forged);
        assert_eq!(
            decode(&SECRET, &bytes, &key),
            Err(DecodeError(
                "the tag does not verify (corrupt, or not written by this user's cache)"
            ))
        );
    }

    /// A file of format 1: the same header and payload, then an unkeyed FNV-1a
    /// checksum, which anyone could compute for a cubin of their choosing.
    fn format_1(key: &CacheKey, compiled: &Compiled) -> Vec<u8> {
        let v2 = encode(&SECRET, key, compiled);
        let mut out = v2[..v2.len() - TAG_LEN].to_vec();
        out[8..12].copy_from_slice(&1u32.to_le_bytes());
        let mut h = Fnv128::new();
        h.write(&out);
        out.extend_from_slice(&h.finish());
        out
    }

    #[test]
    fn a_format_1_entry_with_a_valid_checksum_is_a_miss() {
        let key = CacheKey([4; 16]);
        let bytes = format_1(&key, &sample());
        assert_eq!(
            decode(&SECRET, &bytes, &key),
            Err(DecodeError("another format version"))
        );
        // Even relabelled as format 2, its checksum is no tag.
        let mut relabelled = bytes.clone();
        relabelled[8..12].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
        assert!(decode(&SECRET, &relabelled, &key).is_err());
    }

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
