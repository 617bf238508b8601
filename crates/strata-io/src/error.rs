use std::path::PathBuf;

/// An I/O failure, with the file and the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{op} {path}: {source}")]
    Os {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: read of {len} bytes at offset {offset} goes past the end of the file ({file_len} bytes)")]
    PastEnd {
        path: PathBuf,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    #[error("{path}: the disk is full (or the file size limit was reached) while writing at offset {offset}")]
    DiskFull { path: PathBuf, offset: u64 },
}

impl IoError {
    /// Wraps an OS error, turning "no space" and "file too large" into [`IoError::DiskFull`].
    pub fn os(
        op: &'static str,
        path: &std::path::Path,
        offset: u64,
        source: std::io::Error,
    ) -> Self {
        match source.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT) => IoError::DiskFull {
                path: path.to_path_buf(),
                offset,
            },
            _ => IoError::Os {
                op,
                path: path.to_path_buf(),
                source,
            },
        }
    }
}

pub type Result<T> = std::result::Result<T, IoError>;
