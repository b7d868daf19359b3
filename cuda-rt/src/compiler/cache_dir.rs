//! The kernel cache's folder: the trust check, and file access that follows no link
//! planted at a file's name.
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
//!   it never writes through it).

use std::fs::{File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

use tempfile::NamedTempFile;

/// The effective user id. Asked once per use of the cache's folder (a lookup, the
/// folder's first check) and handed to every check of that use: each call is a
/// system call, and a new cache's first lookup makes two checks.
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
    // checksum no longer matches.
    let len = usize::try_from(m.len()).map_err(|_| io::Error::other("file too large"))?;
    let mut bytes = Vec::with_capacity(len);
    (&mut f).take(m.len()).read_to_end(&mut bytes)?;
    if bytes.len() != len {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(Some(bytes))
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

/// Writes `bytes` to `dir/name` through a temporary file with a random name in
/// the same folder (created exclusively, mode 0600, not following links) and a rename,
/// so the file appears whole or not at all and no link planted in the folder is written
/// through. `dir` is created (mode 0700) if missing, and refused, with an error saying
/// why, unless it is the user's and writable by nobody else ([`check_dir`]).
pub fn write_file_atomically(dir: &Path, name: &str, bytes: &[u8]) -> io::Result<()> {
    check_dir(dir).map_err(io::Error::other)?;
    write_via(dir, RANDOM_NAME, name, bytes)
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
        write_file_atomically(&dir.0, "entry", b"bytes").unwrap();
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
}
