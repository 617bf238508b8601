//! Crash-safe file updates.
//!
//! On Linux a file's bytes and the directory entry that names it are made durable separately:
//! `fdatasync` on the file persists its data, but a file that was just created, renamed or
//! removed can still vanish (or reappear) after a crash until its directory has been fsynced.
//! These helpers do both halves, so callers cannot forget one. Replacing a file's contents is
//! `strata_io::durable::replace_file`.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Result, ServeError};

/// Makes the entries of directory `dir` durable (files created, renamed or removed in it).
pub fn sync_dir(dir: &Path) -> Result<()> {
    let handle = File::open(dir)
        .map_err(|e| ServeError::io(format!("open directory {}", dir.display()), e))?;
    handle
        .sync_all()
        .map_err(|e| ServeError::io(format!("fsync directory {}", dir.display()), e))
}

/// Creates directory `dir` and any missing ancestors, and makes each new entry durable by
/// fsyncing the directory that holds it. An existing directory is left as it is.
pub fn create_dir_all(dir: &Path) -> Result<()> {
    // The directories about to be created, deepest first.
    let mut missing: Vec<&Path> = Vec::new();
    let mut probe = Some(dir);
    while let Some(p) = probe.filter(|p| !p.as_os_str().is_empty() && !p.exists()) {
        missing.push(p);
        probe = p.parent();
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| ServeError::io(format!("create directory {}", dir.display()), e))?;
    for created in missing.iter().rev() {
        sync_dir(&parent_of(created))?;
    }
    Ok(())
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bare_file_name_has_a_directory() {
        assert_eq!(parent_of(Path::new("file")), PathBuf::from("."));
        assert_eq!(parent_of(Path::new("a/file")), PathBuf::from("a"));
    }

    #[test]
    fn sync_dir_and_create_dir_all() {
        let dir = tempfile::tempdir().unwrap();
        sync_dir(dir.path()).unwrap();
        let deep = dir.path().join("a/b/c");
        create_dir_all(&deep).unwrap();
        assert!(deep.is_dir());
        // Again: nothing to do.
        create_dir_all(&deep).unwrap();
        let e = sync_dir(&dir.path().join("missing"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("open directory") && e.contains("missing"), "{e}");
        // A file where a directory is wanted.
        std::fs::write(dir.path().join("f"), b"").unwrap();
        let e = create_dir_all(&dir.path().join("f/sub"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("create directory") && e.contains("f/sub"), "{e}");
    }
}
