//! Free space on a filesystem, for jobs that refuse to start what the disk cannot hold.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::error::{IoError, Result};

/// Bytes an unprivileged writer may still write on the filesystem holding `dir` (`statvfs`'s
/// `f_bavail` blocks of `f_frsize` bytes).
pub fn available(dir: &Path) -> Result<u64> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| IoError::Invalid(format!("{}: the path holds a NUL byte", dir.display())))?;
    // SAFETY: `c` is a NUL-terminated path and `st` a plain C struct statvfs fills.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(IoError::os(
            "statvfs",
            dir,
            0,
            std::io::Error::last_os_error(),
        ));
    }
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_directory_has_some_room() {
        let dir = tempfile::tempdir().unwrap();
        assert!(available(dir.path()).unwrap() > 0);
    }

    #[test]
    fn a_missing_directory_is_an_os_error_naming_it() {
        let err = available(Path::new("/nonexistent/strata-disk-room"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("statvfs /nonexistent/strata-disk-room"),
            "{err}"
        );
    }
}
