use std::path::PathBuf;

/// An I/O failure, with the file and the operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    #[error("{op} {}: {source}", path.display())]
    Os {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: read of {len} bytes at offset {offset} goes past the end of the file ({file_len} bytes)", path.display())]
    PastEnd {
        path: PathBuf,
        offset: u64,
        len: u64,
        file_len: u64,
    },
    #[error("{}: the disk is full (or the file size limit was reached) while writing at offset {offset}", path.display())]
    DiskFull { path: PathBuf, offset: u64 },
    /// A request the engine cannot perform as asked (a programming error in the caller).
    #[error("invalid I/O request: {0}")]
    Invalid(String),
    /// The requested backend or feature is not available on this system.
    #[error("{0}")]
    Unsupported(String),
    /// The user asked to stop.
    #[error("cancelled")]
    Cancelled,
}

impl From<crate::progress::Cancelled> for IoError {
    fn from(_: crate::progress::Cancelled) -> Self {
        IoError::Cancelled
    }
}

/// Back to an OS error for callers that speak `std::io`: an OS failure is its own error as it
/// was (its kind and errno kept); a full disk is `StorageFull`; an invalid request is
/// `InvalidInput`; the rest `Other`.
impl From<IoError> for std::io::Error {
    fn from(e: IoError) -> Self {
        match e {
            IoError::Os { source, .. } => source,
            IoError::Invalid(msg) => std::io::Error::new(std::io::ErrorKind::InvalidInput, msg),
            e @ IoError::DiskFull { .. } => std::io::Error::new(std::io::ErrorKind::StorageFull, e),
            e => std::io::Error::other(e),
        }
    }
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
