//! What the kernel cache needs to know about NVRTC (its version and architectures),
//! without calling it when the disk cache is warm.
//!
//! The `libnvrtc` file the loader *would* open is found by walking its search order
//! ([`cuda_sys::loader::search::candidates`]) over the file system, and identified by
//! its canonical path, size, inode and modification time ([`nvrtc_identity`]). The
//! first time NVRTC is really asked, its answers are written to
//! `nvrtc-<identity>.facts` in the cache folder (atomically, and only if the library
//! NVRTC was opened from is the one predicted); later processes read that file
//! instead of opening `libnvrtc`. When the identity cannot be established (the system
//! loader would find the library by bare name in `ld.so.cache` or a default folder) or
//! the file is missing or unusable, NVRTC is asked as before.

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use cuda_sys::loader::search::{candidates, Candidate, SearchEnv, Source};
use cuda_sys::loader::specs::NVRTC;

use super::cache_dir::write_file_atomically;
use super::hash::{hex, StableHash};
use super::nvrtc;
use super::toolkit::nvrtc_search;
use crate::error::Result;

/// NVRTC's answers to the questions the kernel cache asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcFacts {
    /// `nvrtcVersion`.
    pub version: (i32, i32),
    /// `nvrtcGetSupportedArchs`.
    pub archs: Vec<u32>,
}

/// The `libnvrtc` the loader would open, predicted from the file system.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvrtcIdentity {
    /// The file (canonical).
    pub path: PathBuf,
    /// Found in an `LD_LIBRARY_PATH` folder for the system loader's bare name.
    pub by_bare_name: bool,
    /// Hash of the path, size, device, inode and modification time.
    pub id: [u8; 16],
}

const DEFAULT_DIRS: &[&str] = &[
    "/lib",
    "/usr/lib",
    "/lib64",
    "/usr/lib64",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
];

/// The `libnvrtc` the loader would open given `env` and the system loader's path
/// `ld_library_path`, or `None` when that cannot be told without opening it.
pub fn nvrtc_identity(env: &SearchEnv, ld_library_path: Option<&str>) -> Option<NvrtcIdentity> {
    identity_among(&candidates(&NVRTC, env), ld_library_path)
}

/// [`nvrtc_identity`] given NVRTC's candidates.
fn identity_among(
    candidates: &[Candidate],
    ld_library_path: Option<&str>,
) -> Option<NvrtcIdentity> {
    let mut ld_cache: Option<Option<Vec<u8>>> = None;
    for c in candidates {
        if c.source != Source::SystemLoader {
            if c.path.is_file() {
                return identify(&c.path, false);
            }
            continue;
        }
        // A bare name: where would the system loader find it?
        let name = c.path.as_os_str().as_encoded_bytes();
        let in_ld_path = ld_library_path
            .into_iter()
            .flat_map(|v| v.split(':'))
            .filter(|d| !d.is_empty())
            .map(|d| Path::new(d).join(&c.path))
            .find(|p| p.is_file());
        if let Some(p) = in_ld_path {
            return identify(&p, true);
        }
        let cache = ld_cache.get_or_insert_with(|| std::fs::read("/etc/ld.so.cache").ok());
        let in_cache = match cache {
            Some(bytes) => bytes.windows(name.len()).any(|w| w == name),
            // No cache to read: the loader's answer is unknown.
            None => return None,
        };
        if in_cache
            || DEFAULT_DIRS
                .iter()
                .any(|d| Path::new(d).join(&c.path).exists())
        {
            return None;
        }
    }
    None
}

fn identify(path: &Path, by_bare_name: bool) -> Option<NvrtcIdentity> {
    let path = std::fs::canonicalize(path).ok()?;
    let m = std::fs::metadata(&path).ok()?;
    let mut h = StableHash::new();
    h.field(b"cuda-rt nvrtc identity v1");
    h.field(path.as_os_str().as_encoded_bytes());
    for v in [m.len(), m.dev(), m.ino()] {
        h.write(&v.to_le_bytes());
    }
    h.write(&m.mtime().to_le_bytes());
    h.write(&m.mtime_nsec().to_le_bytes());
    Some(NvrtcIdentity {
        path,
        by_bare_name,
        id: h.finish(),
    })
}

/// First bytes of a facts file. 2: the checksum is BLAKE3's (1's was FNV-1a: such a
/// file is read as missing, and rewritten).
const MAGIC: [u8; 8] = *b"CURTNF2\n";

/// The facts file's name for `id`.
pub fn facts_file_name(id: &[u8; 16]) -> String {
    format!("nvrtc-{}.facts", hex(id))
}

/// The bytes of a facts file. Pure.
pub fn encode_facts(id: &[u8; 16], facts: &NvrtcFacts) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 4 * facts.archs.len());
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(id);
    out.extend_from_slice(&facts.version.0.to_le_bytes());
    out.extend_from_slice(&facts.version.1.to_le_bytes());
    out.extend_from_slice(&(facts.archs.len() as u32).to_le_bytes());
    for a in &facts.archs {
        out.extend_from_slice(&a.to_le_bytes());
    }
    let mut h = StableHash::new();
    h.write(&out);
    out.extend_from_slice(&h.finish());
    out
}

/// Reads a facts file back; `None` if it is not a whole, intact file for `id`. Pure.
pub fn decode_facts(bytes: &[u8], id: &[u8; 16]) -> Option<NvrtcFacts> {
    let body_len = bytes.len().checked_sub(16)?;
    let (body, sum) = bytes.split_at(body_len);
    let mut h = StableHash::new();
    h.write(body);
    if h.finish()[..] != *sum || body.len() < 36 || body[..8] != MAGIC || body[8..24] != id[..] {
        return None;
    }
    let word = |i: usize| -> Option<[u8; 4]> { body.get(i..i + 4)?.try_into().ok() };
    let version = (i32::from_le_bytes(word(24)?), i32::from_le_bytes(word(28)?));
    let n = usize::try_from(u32::from_le_bytes(word(32)?)).ok()?;
    if body.len() != 36 + 4 * n {
        return None;
    }
    let archs = (0..n)
        .map(|i| word(36 + 4 * i).map(u32::from_le_bytes))
        .collect::<Option<_>>()?;
    Some(NvrtcFacts { version, archs })
}

fn process_identity() -> Option<&'static NvrtcIdentity> {
    static ID: OnceLock<Option<NvrtcIdentity>> = OnceLock::new();
    ID.get_or_init(|| {
        let ld = std::env::var("LD_LIBRARY_PATH").ok();
        // The search the toolkit's include folders use too: one walk per process.
        identity_among(&nvrtc_search().candidates, ld.as_deref())
    })
    .as_ref()
}

/// The facts this process knows (from a facts file or from NVRTC).
static KNOWN: OnceLock<NvrtcFacts> = OnceLock::new();

/// NVRTC's version and architectures: from memory, else from the facts file in
/// `dir` (no NVRTC call), else from NVRTC, then written to `dir` for later processes.
pub fn nvrtc_facts(dir: Option<&Path>) -> Result<&'static NvrtcFacts> {
    let identity = dir.and(process_identity());
    if let Some(f) = KNOWN.get() {
        if let (Some(dir), Some(id)) = (dir, identity) {
            record(dir, id, f);
        }
        return Ok(f);
    }
    if let (Some(dir), Some(id)) = (dir, identity) {
        let read = std::fs::read(dir.join(facts_file_name(&id.id))).ok();
        if let Some(f) = read.and_then(|b| decode_facts(&b, &id.id)) {
            mark_recorded(dir);
            return Ok(KNOWN.get_or_init(|| f));
        }
    }
    let f = NvrtcFacts {
        version: super::nvrtc_version()?,
        archs: super::supported_archs()?,
    };
    let f = KNOWN.get_or_init(|| f);
    if let (Some(dir), Some(id)) = (dir, identity) {
        record(dir, id, f);
    }
    Ok(f)
}

fn recorded() -> &'static Mutex<HashSet<PathBuf>> {
    static DIRS: OnceLock<Mutex<HashSet<PathBuf>>> = OnceLock::new();
    DIRS.get_or_init(|| Mutex::new(HashSet::new()))
}

fn mark_recorded(dir: &Path) {
    recorded()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(dir.to_owned());
}

/// Writes the facts file into `dir` once per process, if NVRTC is open from the
/// predicted file (otherwise the prediction is wrong and nothing is written).
fn record(dir: &Path, id: &NvrtcIdentity, f: &NvrtcFacts) {
    if recorded()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .contains(dir)
    {
        return;
    }
    let Some(loaded) = nvrtc::loaded_path() else {
        return;
    };
    let loaded = Path::new(&loaded);
    let matches = if loaded.is_absolute() {
        std::fs::canonicalize(loaded).is_ok_and(|p| p == id.path)
    } else {
        id.by_bare_name && id.path.file_name() == Some(loaded.as_os_str())
    };
    if !matches {
        return;
    }
    let name = facts_file_name(&id.id);
    let present = std::fs::read(dir.join(&name))
        .ok()
        .and_then(|b| decode_facts(&b, &id.id))
        .is_some_and(|old| old == *f);
    if present || write_file_atomically(dir, &name, &encode_facts(&id.id, f)).is_ok() {
        mark_recorded(dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> NvrtcFacts {
        NvrtcFacts {
            version: (13, 0),
            archs: vec![75, 80, 90, 120],
        }
    }

    #[test]
    fn facts_round_trip_and_reject_damage() {
        let id = [3; 16];
        let b = encode_facts(&id, &sample());
        assert_eq!(decode_facts(&b, &id), Some(sample()));
        assert_eq!(decode_facts(&b, &[4; 16]), None);
        for n in 0..b.len() {
            assert_eq!(decode_facts(&b[..n], &id), None, "truncated at {n}");
        }
        for i in 0..b.len() {
            let mut d = b.clone();
            d[i] ^= 0x10;
            assert_eq!(decode_facts(&d, &id), None, "flip at {i}");
        }
    }

    #[test]
    fn identity_follows_the_first_existing_file_and_its_metadata() {
        let root = std::env::temp_dir().join(format!("cuda-rt-facts-{}", std::process::id()));
        let lib = root.join("cuda").join("lib64");
        std::fs::create_dir_all(&lib).unwrap();
        let file = lib.join(NVRTC.files[0]);
        std::fs::write(&file, b"one").unwrap();
        let env = SearchEnv::with_root(&root).var("CUDA_PATH", root.join("cuda"));
        let a = nvrtc_identity(&env, None).unwrap();
        assert_eq!(a.path, std::fs::canonicalize(&file).unwrap());
        assert!(!a.by_bare_name);
        assert_eq!(nvrtc_identity(&env, None), Some(a.clone()));
        std::fs::write(&file, b"a different build").unwrap();
        assert_ne!(nvrtc_identity(&env, None).unwrap().id, a.id);
        // Found by bare name in LD_LIBRARY_PATH (no CUDA_PATH).
        let ld = lib.to_string_lossy().into_owned();
        let env = SearchEnv::with_root(&root);
        let b = nvrtc_identity(&env, Some(&ld)).unwrap();
        assert!(b.by_bare_name);
        assert_eq!(b.path, a.path);
        let _ = std::fs::remove_dir_all(&root);
    }
}
