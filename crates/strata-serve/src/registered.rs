//! The directories of registered graphs, models and embedding runs: checking a name before
//! it becomes a directory, listing the registered ones, and removing one atomically.

use std::path::{Path, PathBuf};

use crate::durable::sync_dir;
use crate::error::{Result, ServeError};

/// Names become directory names: keep them to a safe alphabet.
pub fn check_name(name: &str, what: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ServeError::InvalidArgument(format!(
            "{what} name {name:?}: expected 1 to 128 characters of letters, digits, '.', '_' or '-', \
             not starting with '.'"
        )))
    }
}

/// Subdirectories of `dir` (name, path), skipping hidden ones and removing leftovers of an
/// interrupted registration (`.partial-*`) or removal (`.removed-*`).
pub(crate) fn list_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut out = Vec::new();
    let entries =
        std::fs::read_dir(dir).map_err(|e| ServeError::io(dir.display().to_string(), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| ServeError::io(dir.display().to_string(), e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if name.starts_with(".partial-") || name.starts_with(".removed-") {
            std::fs::remove_dir_all(&path)
                .map_err(|e| ServeError::io(path.display().to_string(), e))?;
        } else if !name.starts_with('.') && path.is_dir() {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

/// Renames `dir/name` out of the way (atomic: after a crash it is either registered or
/// gone), then deletes it.
pub(crate) fn remove_registered(dir: &Path, name: &str) -> Result<()> {
    let from = dir.join(name);
    let to = dir.join(format!(".removed-{name}"));
    std::fs::rename(&from, &to).map_err(|e| ServeError::io(from.display().to_string(), e))?;
    sync_dir(dir)?;
    std::fs::remove_dir_all(&to).map_err(|e| ServeError::io(to.display().to_string(), e))
}
