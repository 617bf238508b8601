//! Crash-safe file updates.
//!
//! On Linux a file's bytes and the directory entry that names it are made durable separately:
//! `fdatasync` on the file persists its data, but a file that was just created, renamed or
//! removed can still vanish (or reappear) after a crash until its directory has been fsynced.
//! These helpers do both halves, so callers cannot forget one.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Replaces the contents of `path` with `bytes` so that a crash at any moment leaves either the
/// old contents or the new ones, never a mix: the bytes go to a temporary file in the same
/// directory (a rename is only atomic within one file system), which is fdatasynced and then
/// renamed over `path`; finally the directory is fsynced so the rename itself survives a crash.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = parent_of(path);
    let temp = temp_path(path)?;
    let written = write_synced(&temp, bytes).and_then(|()| {
        std::fs::rename(&temp, path).map_err(|e| {
            ServeError::io(
                format!("rename {} to {}", temp.display(), path.display()),
                e,
            )
        })
    });
    if let Err(e) = written {
        // The temporary file is garbage now; failing to remove it only leaves litter.
        let _ = std::fs::remove_file(&temp);
        return Err(e);
    }
    sync_dir(&dir)
}

/// Writes `bytes` to a new file at `path` and fdatasyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let context = || format!("write {}", path.display());
    // `create_new`: never write through a file someone else is using.
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| ServeError::io(context(), e))?;
    file.write_all(bytes)
        .map_err(|e| ServeError::io(context(), e))?;
    file.sync_data().map_err(|e| ServeError::io(context(), e))
}

/// A temporary name next to `path`, unique within this machine at this moment (process id and
/// a per-process counter), hidden and marked so that litter left by a crash is recognisable.
fn temp_path(path: &Path) -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().ok_or_else(|| {
        ServeError::InvalidArgument(format!("{} does not name a file", path.display()))
    })?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(format!(
        ".tmp-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    Ok(parent_of(path).join(temp))
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

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn write_atomic_creates_and_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        write_atomic(&path, b"first").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        write_atomic(&path, b"second, longer").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"second, longer");
        write_atomic(&path, b"").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"");
        // No temporary file is left behind.
        assert_eq!(names(dir.path()), ["state.json"]);
    }

    #[test]
    fn failed_write_atomic_keeps_the_old_contents_and_no_litter() {
        let dir = tempfile::tempdir().unwrap();
        // A rename cannot replace a non-empty directory: the last step fails.
        let path = dir.path().join("taken");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"old").unwrap();
        let e = write_atomic(&path, b"new").unwrap_err().to_string();
        assert!(e.contains("rename") && e.contains("taken"), "{e}");
        assert_eq!(std::fs::read(path.join("inside")).unwrap(), b"old");
        assert_eq!(names(dir.path()), ["taken"]);
        // A missing directory fails at the first step, naming the file.
        let e = write_atomic(&dir.path().join("no/such/file"), b"x")
            .unwrap_err()
            .to_string();
        assert!(e.contains("no/such/.file.tmp-"), "{e}");
    }

    #[test]
    fn write_atomic_to_a_bare_file_name_has_a_directory() {
        assert_eq!(parent_of(Path::new("file")), PathBuf::from("."));
        assert_eq!(parent_of(Path::new("a/file")), PathBuf::from("a"));
        let e = write_atomic(Path::new("/"), b"x").unwrap_err().to_string();
        assert!(e.contains("does not name a file"), "{e}");
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
