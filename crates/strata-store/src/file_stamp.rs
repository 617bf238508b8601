//! What identifies one version of a file without reading it: its size and its modification
//! and change times. A record that vouches for files' contents (a passed check, a content
//! digest) keeps the stamps of the files it read and is trusted only while every one of them
//! still matches; a copy or an in-place edit changes a time, so the record is made again.

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};

/// Size and times of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileStamp {
    pub bytes: u64,
    /// Nanoseconds since the Unix epoch.
    pub mtime_ns: i128,
    /// Nanoseconds since the Unix epoch (changes with any write, and is not settable).
    pub ctime_ns: i128,
}

impl FileStamp {
    /// The stamp of the file at `path` as it is now.
    pub fn of(path: &Path) -> Result<FileStamp> {
        let m = std::fs::metadata(path).map_err(|e| StoreError::os("stat", path, e))?;
        Ok(FileStamp {
            bytes: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        })
    }
}

/// The stamps of the files `names` of `dir`, by name.
pub fn stamps<'a>(
    dir: &Path,
    names: impl IntoIterator<Item = &'a str>,
) -> Result<BTreeMap<String, FileStamp>> {
    names
        .into_iter()
        .map(|name| Ok((name.to_string(), FileStamp::of(&dir.join(name))?)))
        .collect()
}

/// Whether `kept` stamps exactly the files `names` of `dir`, each unchanged since.
pub fn unchanged<'a>(
    dir: &Path,
    kept: &BTreeMap<String, FileStamp>,
    names: impl IntoIterator<Item = &'a str>,
) -> bool {
    let names: Vec<&str> = names.into_iter().collect();
    kept.len() == names.len()
        && names.into_iter().all(|name| {
            kept.get(name)
                .is_some_and(|was| FileStamp::of(&dir.join(name)).is_ok_and(|now| *was == now))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewritten_or_missing_file_is_changed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"one").unwrap();
        std::fs::write(dir.path().join("b"), b"two").unwrap();
        let kept = stamps(dir.path(), ["a", "b"]).unwrap();
        assert!(unchanged(dir.path(), &kept, ["a", "b"]));
        assert!(!unchanged(dir.path(), &kept, ["a"]), "a file fewer");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(dir.path().join("b"), b"two").unwrap();
        assert!(
            !unchanged(dir.path(), &kept, ["a", "b"]),
            "same bytes, new times"
        );
        std::fs::remove_file(dir.path().join("a")).unwrap();
        assert!(FileStamp::of(&dir.path().join("a")).is_err());
    }
}
