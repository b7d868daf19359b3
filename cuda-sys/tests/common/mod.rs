//! Helpers shared by cuda-sys's test files.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A fresh folder, removed with everything in it when dropped, also when the test
/// panics (a run leaves nothing in the temp folder).
pub struct Scratch(tempfile::TempDir);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        self.0.path()
    }
}

// The folder passed where a path or a variable's value is taken.
impl From<&Scratch> for PathBuf {
    fn from(s: &Scratch) -> PathBuf {
        s.to_path_buf()
    }
}

impl From<&Scratch> for std::ffi::OsString {
    fn from(s: &Scratch) -> std::ffi::OsString {
        s.as_os_str().to_owned()
    }
}

/// A fresh folder named `<prefix>-<tag>-...` in the temp folder.
pub fn scratch(prefix: &str, tag: &str) -> Scratch {
    Scratch(
        tempfile::Builder::new()
            .prefix(&format!("{prefix}-{tag}-"))
            .tempdir()
            .unwrap(),
    )
}
