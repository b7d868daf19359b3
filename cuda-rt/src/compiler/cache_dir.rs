//! The kernel cache's folder: the trust check, the per-user secret that keys the
//! entries' tags, and file access that follows no link planted at a file's name.
//!
//! A folder is trusted when it is a folder (links to it are followed), owned by the
//! effective user and writable by nobody else (no group or other write bit). Missing
//! folders are created mode 0700 (missing parents too). In a trusted folder:
//! - files are opened with `O_NOFOLLOW` (and `O_NONBLOCK`, so a FIFO cannot block),
//!   and used only if they are regular files owned by the user and writable by nobody
//!   else;
//! - new files are written to a temporary with a random name made by the `tempfile`
//!   crate, created exclusively (`O_CREAT | O_EXCL`, which never follows a link at the
//!   name) mode 0600, then renamed into place (a rename replaces a link at the name,
//!   it never writes through it);
//! - the secret, [`SECRET_FILE`], holds 32 random bytes from the system's random
//!   source (the `getrandom` crate), mode 0600, created once and published without
//!   replacing anything (`renameat2(RENAME_NOREPLACE)`, or `link(2)` where that is
//!   missing) so that concurrent processes agree on one.

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;
use std::sync::{Mutex, OnceLock};

use tempfile::NamedTempFile;

/// The file in the cache folder holding the per-user secret.
pub const SECRET_FILE: &str = "kcache.secret";

/// Length of the secret, in bytes.
pub const SECRET_LEN: usize = 32;

/// Length of an entry's tag, in bytes.
pub const TAG_LEN: usize = 32;

/// Context under which the tags' key is derived from the secret, so the secret keys
/// nothing else by accident. v3: the key is derived (v2 hashed this string in front of
/// each entry, which put the entry off BLAKE3's chunk boundaries: one chunk more was
/// hashed serially, a tenth of a warm hit's time).
/// v4: the tagged message is padded to whole batches of [`TAG_BATCH`].
const TAG_CONTEXT: &[u8] = b"cuda-rt kernel cache entry v4\0";

/// BLAKE3 hashes up to eight whole 1 KiB chunks side by side (AVX2, AVX-512); the chunks
/// of a last batch of one to seven go four, two and one at a time (the H100 host: 2.46
/// us for a 5196-byte entry, 1.2 us for 4096 bytes). So the tagged message is the
/// entry, zeros, and the entry's length (8 bytes, little-endian), filling whole batches
/// of 8 KiB: every chunk is hashed eight at a time, and the length makes the padding
/// unambiguous.
pub const TAG_BATCH: usize = 8 << 10;

/// The length of the tagged message of a `len`-byte entry.
fn tagged_len(len: usize) -> usize {
    (len + 8).next_multiple_of(TAG_BATCH)
}

/// The per-user secret keying the cache entries' tags (BLAKE3 in keyed mode). Its
/// `Debug` does not show it.
#[derive(Clone)]
pub struct CacheSecret {
    bytes: [u8; SECRET_LEN],
    /// The tags' key, derived from `bytes` on first use and kept: the secrets this
    /// process reads are made with it derived, so every cache's copy carries it and a
    /// new cache's lookup derives nothing.
    tag_key: OnceLock<[u8; 32]>,
}

impl PartialEq for CacheSecret {
    fn eq(&self, other: &CacheSecret) -> bool {
        self.bytes == other.bytes
    }
}

impl Eq for CacheSecret {}

impl std::fmt::Debug for CacheSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CacheSecret(..)")
    }
}

impl CacheSecret {
    /// A secret from its bytes (tests and tools; the cache makes its own).
    pub const fn from_bytes(bytes: [u8; SECRET_LEN]) -> CacheSecret {
        CacheSecret {
            bytes,
            tag_key: OnceLock::new(),
        }
    }

    /// A secret from its bytes with its tags' key derived now, for secrets that are
    /// kept and copied (see `tag_key`).
    fn derived(bytes: [u8; SECRET_LEN]) -> CacheSecret {
        let secret = CacheSecret::from_bytes(bytes);
        secret.tag_key();
        secret
    }

    /// The key of the tags: BLAKE3 keyed with the secret over a fixed context string,
    /// derived once per secret.
    fn tag_key(&self) -> &[u8; 32] {
        self.tag_key
            .get_or_init(|| *blake3::keyed_hash(&self.bytes, TAG_CONTEXT).as_bytes())
    }

    /// The secret of the cache folder `dir`: read from [`SECRET_FILE`], or made from
    /// fresh random bytes and written there when there is none. `dir` is created (mode
    /// 0700) if missing. An error, in words, when `dir` or the file is not trusted
    /// (see [what the disk cache trusts](super#what-the-disk-cache-trusts)) or cannot be
    /// read or written.
    pub fn load_or_create(dir: &Path) -> Result<CacheSecret, String> {
        Self::load_or_create_as(dir, euid())
    }

    /// [`load_or_create`](Self::load_or_create) for the effective user `me`.
    pub(super) fn load_or_create_as(dir: &Path, me: u32) -> Result<CacheSecret, String> {
        check_dir_as(dir, me)?;
        let path = dir.join(SECRET_FILE);
        // Read; else create and publish; if another process published first, read
        // theirs. Two rounds are enough: a published secret is never removed by us.
        for _ in 0..2 {
            if let Some(secret) = read_secret(&path, me)? {
                return Ok(secret);
            }
            let mut bytes = [0u8; SECRET_LEN];
            getrandom::fill(&mut bytes)
                .map_err(|e| format!("no random bytes for the kernel cache secret: {e}"))?;
            let tmp = write_temporary(dir, SECRET_FILE, RANDOM_NAME, &bytes).map_err(|e| {
                format!(
                    "cannot write the kernel cache secret in {}: {e}",
                    dir.display()
                )
            })?;
            // Published only if the name is free, whatever is there (a file, a link):
            // the secret appears whole, once. On failure the temporary is removed.
            match tmp.persist_noclobber(&path) {
                Ok(_) => return Ok(CacheSecret::derived(bytes)),
                Err(e) if e.error.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(tempfile::PersistError { error: e, .. }) => {
                    return Err(format!(
                        "cannot create the kernel cache secret {}: {e}",
                        path.display()
                    ))
                }
            }
        }
        Err(format!(
            "the kernel cache secret {} keeps changing",
            path.display()
        ))
    }

    /// The tag of `bytes`: BLAKE3, keyed with a key derived from the secret under a
    /// fixed context string (derived once per secret), over `bytes` padded to whole
    /// batches of [`TAG_BATCH`] (zeros, then the length of `bytes`). Pure.
    pub fn tag(&self, bytes: &[u8]) -> [u8; TAG_LEN] {
        let mut message = Vec::with_capacity(tagged_len(bytes.len()));
        message.extend_from_slice(bytes);
        self.tag_in_place(&mut message)
    }

    /// [`tag`](Self::tag) of the bytes in `buf`, padded in `buf`'s own spare capacity
    /// (grown only if it is short) and cut back after: `buf` is left as it was.
    pub fn tag_in_place(&self, buf: &mut Vec<u8>) -> [u8; TAG_LEN] {
        let len = buf.len();
        let end = tagged_len(len);
        buf.resize(end - 8, 0);
        buf.extend_from_slice(&(len as u64).to_le_bytes());
        let tag = *blake3::keyed_hash(self.tag_key(), buf).as_bytes();
        buf.truncate(len);
        tag
    }

    /// Whether `tag` is the tag of `bytes` (compared in constant time). Pure.
    pub fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        Self::same_tag(&self.tag(bytes), tag)
    }

    /// Whether `tag` is `expected` (compared in constant time).
    pub fn same_tag(expected: &[u8; TAG_LEN], tag: &[u8]) -> bool {
        let Ok(tag) = <[u8; TAG_LEN]>::try_from(tag) else {
            return false;
        };
        blake3::Hash::from(tag) == blake3::Hash::from(*expected)
    }
}

/// The effective user id. Asked once per use of the cache's folder (a lookup, the
/// folder's first check) and handed to every check of that use: each call is a
/// system call, and a lookup makes three checks.
pub(super) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Why a file or folder with metadata `m` must not be trusted by the effective user
/// `me`, if it must not: owned by another user, or writable by group or others.
fn untrusted_owner_or_mode(m: &Metadata, me: u32) -> Option<String> {
    if m.uid() != me {
        return Some(format!(
            "it is owned by user {}, not by this user ({me})",
            m.uid()
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Some(format!(
            "it is writable by group or others (mode {:o})",
            m.mode() & 0o7777
        ));
    }
    None
}

/// Creates `dir` (mode 0700, missing parents too) if it is missing, and checks that it
/// can be trusted: a folder owned by the effective user, writable by nobody else. The
/// error says which folder and why, in words.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    check_dir_as(dir, euid())
}

/// [`check_dir`] for the effective user `me`.
pub(super) fn check_dir_as(dir: &Path, me: u32) -> Result<(), String> {
    let shown = dir.display();
    let unreadable = |e: io::Error| format!("the kernel cache folder {shown} cannot be read: {e}");
    // Asked first, created only when missing: the folder exists on every use but the
    // first, and a new process's first kernel pays for each call here (mkdir on an
    // existing folder costs a failed mkdir and a stat before ours).
    let m = match std::fs::metadata(dir) {
        Ok(m) => m,
        // Missing, or not reachable (a file where a parent should be): creating it
        // says why in the words users expect.
        Err(_) => {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| format!("the kernel cache folder {shown} cannot be created: {e}"))?;
            std::fs::metadata(dir).map_err(unreadable)?
        }
    };
    if !m.is_dir() {
        return Err(format!("the kernel cache folder {shown} is not a folder"));
    }
    match untrusted_owner_or_mode(&m, me) {
        Some(why) => Err(format!(
            "the kernel cache folder {shown} is not trusted: {why}"
        )),
        None => Ok(()),
    }
}

/// Opens `path` for reading without following a link at its last component and
/// without blocking (a FIFO), and checks that it is a regular file owned by the user
/// `me` and writable by nobody else. `Ok(None)` when there is no such file.
fn open_private(path: &Path, me: u32) -> io::Result<Option<(File, Metadata)>> {
    let f = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(io::Error::other("it is a symbolic link"))
        }
        Err(e) => return Err(e),
    };
    let m = f.metadata()?;
    if !m.is_file() {
        return Err(io::Error::other("it is not a regular file"));
    }
    if let Some(why) = untrusted_owner_or_mode(&m, me) {
        return Err(io::Error::other(why));
    }
    Ok(Some((f, m)))
}

/// Reads the file at `path` in a trusted folder as [`open_private`] opens it:
/// `Ok(None)` when missing, an error when it is a link, not a regular file, or not
/// the user `me`'s alone to write.
pub fn read_private(path: &Path, me: u32) -> io::Result<Option<Vec<u8>>> {
    let Some((mut f, m)) = open_private(path, me)? else {
        return Ok(None);
    };
    // One read of the length fstat gave: entries are replaced by rename, never
    // rewritten in place, so the open file keeps that length (a plain read_to_end
    // would make a second read only to see the end; through `take` the end is known
    // without one). Read into spare capacity: zeroing it first cost more than the read.
    // A file that is shorter fails here; one that grew is cut at that length, and its
    // tag no longer verifies.
    let len = usize::try_from(m.len()).map_err(|_| io::Error::other("file too large"))?;
    // With room for the padding of its tag's message, so checking it allocates nothing.
    let mut bytes = Vec::with_capacity(len.next_multiple_of(TAG_BATCH));
    (&mut f).take(m.len()).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(bytes))
}

/// Which file a secret was read from, and in what state: a secret file whose
/// metadata still shows all of these is the file read then, unchanged (writing to it,
/// `chmod`, `chown` or a link change its `ctime`; a replacement is another inode).
#[derive(Clone, Copy, PartialEq, Eq)]
struct SecretFileId {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl SecretFileId {
    fn of(m: &Metadata) -> SecretFileId {
        SecretFileId {
            dev: m.dev(),
            ino: m.ino(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// The secrets this process has read, by their file: a new [`KernelCache`]'s first
/// use (a new cache on the same folder) still checks the folder and the secret file's
/// metadata, but reads the file again only if it changed.
///
/// [`KernelCache`]: super::KernelCache
fn secrets_read() -> &'static Mutex<Vec<(SecretFileId, CacheSecret)>> {
    static READ: OnceLock<Mutex<Vec<(SecretFileId, CacheSecret)>>> = OnceLock::new();
    READ.get_or_init(|| Mutex::new(Vec::new()))
}

/// Why the secret file with metadata `m` (not followed through a link) must not be
/// used, if it must not: the rules of [`open_private`], readable by group or others,
/// or not [`SECRET_LEN`] bytes long.
fn untrusted_secret(m: &Metadata, me: u32) -> Option<String> {
    if !m.is_file() {
        return Some("it is not a regular file".to_owned());
    }
    if let Some(why) = untrusted_owner_or_mode(m, me) {
        return Some(why);
    }
    if m.mode() & 0o077 != 0 {
        return Some(format!(
            "others may read it (mode {:o}, expected 600)",
            m.mode() & 0o7777
        ));
    }
    if m.len() != SECRET_LEN as u64 {
        return Some(format!("it is {} bytes long, not {SECRET_LEN}", m.len()));
    }
    None
}

/// The secret this process already read from the file at `path`, if that file is still
/// there unchanged and passes every check a read makes: one `lstat` instead of an
/// open, `fstat`, read and close. `None` otherwise (then the file is opened and
/// checked as usual, which also words any refusal).
fn known_secret(path: &Path, me: u32) -> Option<CacheSecret> {
    let m = std::fs::symlink_metadata(path).ok()?;
    if untrusted_secret(&m, me).is_some() {
        return None;
    }
    let id = SecretFileId::of(&m);
    let known = secrets_read().lock().unwrap_or_else(|p| p.into_inner());
    known.iter().find(|(k, _)| *k == id).map(|(_, s)| s.clone())
}

fn remember_secret(m: &Metadata, secret: &CacheSecret) {
    let id = SecretFileId::of(m);
    let mut known = secrets_read().lock().unwrap_or_else(|p| p.into_inner());
    if !known.iter().any(|(k, _)| *k == id) {
        known.push((id, secret.clone()));
    }
}

fn read_secret(path: &Path, me: u32) -> Result<Option<CacheSecret>, String> {
    if let Some(secret) = known_secret(path, me) {
        return Ok(Some(secret));
    }
    let refuse = |why: String| {
        format!(
            "the kernel cache secret {} is not trusted: {why}",
            path.display()
        )
    };
    let Some((mut f, m)) = open_private(path, me).map_err(|e| refuse(e.to_string()))? else {
        return Ok(None);
    };
    if let Some(why) = untrusted_secret(&m, me) {
        return Err(refuse(why));
    }
    let mut bytes = [0u8; SECRET_LEN];
    f.read_exact(&mut bytes)
        .map_err(|e| refuse(e.to_string()))?;
    let secret = CacheSecret::derived(bytes);
    remember_secret(&m, &secret);
    Ok(Some(secret))
}

/// Random characters in a temporary's name (`tempfile`'s alphabet of 62: 72 bits).
const RANDOM_NAME: usize = 12;

/// Writes `bytes` to a new temporary beside `name` in `dir`, `.<name>.<random>.tmp`
/// with `random_chars` random characters (0 only in tests, to plant something at the
/// name), created exclusively and mode 0600, and flushed to disk. The file is removed
/// when the returned handle drops, unless it is persisted.
fn write_temporary(
    dir: &Path,
    name: &str,
    random_chars: usize,
    bytes: &[u8],
) -> io::Result<NamedTempFile> {
    let mut tmp = tempfile::Builder::new()
        .prefix(&format!(".{name}."))
        .suffix(".tmp")
        .rand_bytes(random_chars)
        .permissions(Permissions::from_mode(0o600))
        .tempfile_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.as_file().sync_data()?;
    Ok(tmp)
}

/// Writes `bytes` to `dir/name` through a temporary ([`write_temporary`]) and a rename.
fn write_via(dir: &Path, random_chars: usize, name: &str, bytes: &[u8]) -> io::Result<()> {
    let tmp = write_temporary(dir, name, random_chars, bytes)?;
    // On failure the error holds the temporary, removed as it drops.
    tmp.persist(dir.join(name)).map(drop).map_err(|e| e.error)
}

/// Writes `bytes` to `dir/name` atomically (a temporary with a random name,
/// then a rename), after checking that `dir` can be trusted ([`check_dir`]; it is
/// created if missing). Never writes through a link.
pub fn write_atomically_in(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    check_dir(dir).map_err(io::Error::other)?;
    write_via(dir, RANDOM_NAME, name, bytes)
}

/// Writes `bytes` to `dir/name` through a temporary file with a random name in
/// the same folder (created exclusively, mode 0600, not following links) and a rename,
/// so the file appears whole or not at all and no link planted in the folder is written
/// through. `dir` is created (mode 0700) if missing, and refused, with an error saying
/// why, unless it is the user's and writable by nobody else ([`check_dir`]).
pub fn write_file_atomically(dir: &Path, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    write_atomically_in(dir, name, bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A private folder removed when dropped, also when the test panics.
    struct Dir(PathBuf, #[allow(dead_code)] tempfile::TempDir);
    impl Dir {
        fn new(tag: &str) -> Dir {
            let d = tempfile::Builder::new()
                .prefix(&format!("cuda-rt-disk-{tag}-"))
                .permissions(Permissions::from_mode(0o700))
                .tempdir()
                .unwrap();
            Dir(d.path().to_path_buf(), d)
        }
    }

    #[test]
    fn a_link_planted_at_the_temporary_name_is_not_followed() {
        let dir = Dir::new("tmp-link");
        let victim = dir.0.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        std::os::unix::fs::symlink(&victim, dir.0.join(".entry..tmp")).unwrap();
        // No random characters: the temporary's name is the link's.
        let err = write_via(&dir.0, 0, "entry", b"attacker's bytes").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert!(!dir.0.join("entry").exists());
    }

    #[test]
    fn a_dangling_link_at_the_temporary_name_creates_no_file() {
        let dir = Dir::new("tmp-dangling");
        let target = dir.0.join("would-be-created");
        std::os::unix::fs::symlink(&target, dir.0.join(".entry..tmp")).unwrap();
        assert!(write_via(&dir.0, 0, "entry", b"x").is_err());
        assert!(!target.exists());
    }

    #[test]
    fn temporaries_have_random_private_names_and_go_away() {
        let dir = Dir::new("tmp-names");
        let a = write_temporary(&dir.0, "k", RANDOM_NAME, b"a").unwrap();
        let b = write_temporary(&dir.0, "k", RANDOM_NAME, b"b").unwrap();
        assert_ne!(a.path(), b.path());
        for t in [&a, &b] {
            let name = t.path().file_name().unwrap().to_str().unwrap().to_owned();
            assert!(name.starts_with(".k.") && name.ends_with(".tmp"), "{name}");
            assert_eq!(name.len(), ".k..tmp".len() + RANDOM_NAME, "{name}");
            let m = std::fs::metadata(t.path()).unwrap();
            assert_eq!(m.mode() & 0o777, 0o600);
        }
        drop((a, b));
        assert_eq!(
            std::fs::read_dir(&dir.0).unwrap().count(),
            0,
            "removed on drop"
        );
    }

    #[test]
    fn written_files_are_private() {
        let dir = Dir::new("private");
        write_atomically_in(&dir.0, "entry", b"bytes").unwrap();
        let m = std::fs::metadata(dir.0.join("entry")).unwrap();
        assert_eq!(m.mode() & 0o777, 0o600);
        assert_eq!(
            read_private(&dir.0.join("entry"), euid()).unwrap().unwrap(),
            b"bytes"
        );
    }

    #[test]
    fn a_missing_folder_is_created_mode_0700() {
        let dir = Dir::new("create");
        let sub = dir.0.join("a").join("b");
        check_dir(&sub).unwrap();
        for p in [&dir.0.join("a"), &sub] {
            assert_eq!(std::fs::metadata(p).unwrap().mode() & 0o777, 0o700);
        }
    }

    #[test]
    fn a_fifo_entry_is_refused_without_blocking() {
        let dir = Dir::new("fifo");
        let p = dir.0.join("entry");
        let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let err = read_private(&p, euid()).unwrap_err();
        assert_eq!(err.to_string(), "it is not a regular file");
    }

    #[test]
    fn the_secret_is_made_once_private_and_read_back() {
        let dir = Dir::new("secret");
        let a = CacheSecret::load_or_create(&dir.0).unwrap();
        let m = std::fs::metadata(dir.0.join(SECRET_FILE)).unwrap();
        assert_eq!((m.mode() & 0o777, m.len()), (0o600, SECRET_LEN as u64));
        assert_eq!(CacheSecret::load_or_create(&dir.0).unwrap(), a);
        // No temporary is left behind.
        let names: Vec<_> = std::fs::read_dir(&dir.0)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [SECRET_FILE]);
    }

    #[test]
    fn threads_racing_to_make_the_secret_agree() {
        let dir = Dir::new("secret-race");
        let secrets: Vec<_> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|_| s.spawn(|| CacheSecret::load_or_create(&dir.0).unwrap()))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(secrets.windows(2).all(|w| w[0] == w[1]));
    }

    #[test]
    fn a_secret_readable_by_others_or_linked_is_refused() {
        let dir = Dir::new("secret-bad");
        let path = dir.0.join(SECRET_FILE);
        std::fs::write(&path, [7u8; SECRET_LEN]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = CacheSecret::load_or_create(&dir.0).unwrap_err();
        assert!(e.contains("others may read it (mode 644"), "{e}");
        std::fs::remove_file(&path).unwrap();
        let elsewhere = dir.0.join("elsewhere");
        std::fs::write(&elsewhere, [7u8; SECRET_LEN]).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = CacheSecret::load_or_create(&dir.0).unwrap_err();
        assert!(e.ends_with("it is a symbolic link"), "{e}");
        assert_eq!(std::fs::read(&elsewhere).unwrap(), [7u8; SECRET_LEN]);
    }

    /// A new cache's first use checks the secret file again even when this process has
    /// read it: a file that is no longer trusted is refused, and one that changed is read
    /// again rather than answered from memory.
    #[test]
    fn a_secret_read_before_is_checked_again_and_read_again_when_changed() {
        let dir = Dir::new("secret-again");
        let path = dir.0.join(SECRET_FILE);
        let a = CacheSecret::load_or_create(&dir.0).unwrap();
        assert_eq!(CacheSecret::load_or_create(&dir.0).unwrap(), a);
        assert!(
            known_secret(&path, euid()).is_some(),
            "read once, then known"
        );
        std::fs::set_permissions(&path, Permissions::from_mode(0o644)).unwrap();
        let e = CacheSecret::load_or_create(&dir.0).unwrap_err();
        assert!(e.contains("others may read it (mode 644"), "{e}");
        std::fs::set_permissions(&path, Permissions::from_mode(0o600)).unwrap();
        // Rewritten in place: same inode and length, new bytes. The modification time
        // is set apart by hand: the kernel's file clock may not have ticked yet.
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        (&f).write_all(&[9; SECRET_LEN]).unwrap();
        f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_000))
            .unwrap();
        drop(f);
        let b = CacheSecret::load_or_create(&dir.0).unwrap();
        assert_eq!(b, CacheSecret::from_bytes([9; SECRET_LEN]));
        // Replaced by a link to a file this process read: refused, never followed.
        let elsewhere = dir.0.join("elsewhere");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = CacheSecret::load_or_create(&dir.0).unwrap_err();
        assert!(e.ends_with("it is a symbolic link"), "{e}");
    }

    #[test]
    fn tags_depend_on_the_secret_and_every_byte() {
        let a = CacheSecret::from_bytes([1; SECRET_LEN]);
        let b = CacheSecret::from_bytes([2; SECRET_LEN]);
        let t = a.tag(b"entry");
        assert!(a.verify(b"entry", &t));
        assert!(!b.verify(b"entry", &t));
        assert!(!a.verify(b"entrY", &t));
        assert!(!a.verify(b"entry", &t[..31]));
        assert_eq!(format!("{a:?}"), "CacheSecret(..)");
    }

    /// The padding to whole batches is not a way to make two entries share a tag: an
    /// entry and the same with zeros after it (what the padding adds) differ, at every
    /// length around a batch's end; and the tag made in a buffer's spare room is the
    /// tag, with the buffer left as it was, whatever room it had.
    #[test]
    fn padded_tags_tell_trailing_zeros_apart_and_leave_the_buffer_as_it_was() {
        let a = CacheSecret::from_bytes([1; SECRET_LEN]);
        for len in [
            0,
            1,
            5196,
            TAG_BATCH - 9,
            TAG_BATCH - 8,
            TAG_BATCH - 1,
            TAG_BATCH,
            3 * TAG_BATCH + 7,
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let t = a.tag(&bytes);
            for extra in [1, 8, TAG_BATCH - len % TAG_BATCH] {
                let mut longer = bytes.clone();
                longer.resize(len + extra, 0);
                assert_ne!(a.tag(&longer), t, "{len} + {extra} zeros");
            }
            for room in [0, 1, TAG_BATCH, 2 * TAG_BATCH] {
                let mut buf = Vec::with_capacity(len + room);
                buf.extend_from_slice(&bytes);
                assert_eq!(a.tag_in_place(&mut buf), t, "{len} with {room} spare");
                assert_eq!(buf, bytes);
            }
        }
    }
}
