//! Whether a filesystem has room for what a job is about to write, checked before it starts:
//! options that ask for more than the disk holds (a node count of 2^40, an edge factor of
//! 10^15) are refused at once, instead of filling the disk for minutes, starving whatever
//! else writes there, and failing at the end.
//!
//! The sizes checked are lower bounds of what the job writes (its largest arrays), so a refusal
//! is certain; a job that passes can still fill a disk that other writers fill meanwhile, which
//! the writers' own `DiskFull` errors report.

use std::path::Path;

use crate::error::{Result, StoreError};

/// Refuses `what` (said lazily: `what()` names the job and its sizes), which writes at least
/// `needed` bytes under `dir`, when the filesystem holding `dir` has less free
/// ([`strata_io::space::available`]).
pub fn ensure(dir: &Path, needed: u64, what: impl FnOnce() -> String) -> Result<()> {
    let free = strata_io::space::available(dir)?;
    if needed > free {
        return Err(StoreError::DiskRoom {
            path: dir.to_path_buf(),
            available: free,
            needed,
            what: what(),
        });
    }
    Ok(())
}

/// `count` items of `size` bytes, saturating at `u64::MAX` (a lower bound that overflows is
/// more than any disk holds).
pub fn bytes(count: u64, size: u64) -> u64 {
    count.saturating_mul(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_directory_has_some_room_and_not_an_exabyte() {
        let dir = tempfile::tempdir().unwrap();
        ensure(dir.path(), 1, || "one byte".into()).unwrap();
        let err = ensure(dir.path(), u64::MAX, || "a test's 16 EiB".into())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("free, too little: a test's 16 EiB writes at least"),
            "{err}"
        );
        let named = format!("the filesystem of {} has", dir.path().display());
        assert!(err.starts_with(&named), "{err}");
    }

    #[test]
    fn sizes_saturate() {
        assert_eq!(bytes(u64::MAX / 2, 3), u64::MAX);
        assert_eq!(bytes(10, 8), 80);
    }
}
