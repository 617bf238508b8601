//! Errors of embedding training.

use std::path::Path;

use strata_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A configuration value out of range or contradicting the store; names the option.
    #[error("{0}")]
    Config(String),
    /// The memory budget cannot hold the minimum; says what is needed.
    #[error("{0}")]
    Budget(String),
    /// A run directory or index that does not hold what it should.
    #[error("{0}")]
    Corrupt(String),
    /// An epoch's loss is NaN or infinite: the training diverged; nothing of it is committed.
    #[error("{0}")]
    Diverged(String),
    /// Another rank or the group's scheduler failed or could not be reached; says which.
    #[error("distributed run: {0}")]
    Group(String),
    #[error("cancelled")]
    Cancelled,
}

impl From<strata_io::IoError> for EmbedError {
    fn from(e: strata_io::IoError) -> Self {
        EmbedError::Store(StoreError::Io(e))
    }
}

impl From<strata_io::progress::Cancelled> for EmbedError {
    fn from(_: strata_io::progress::Cancelled) -> Self {
        EmbedError::Cancelled
    }
}

pub type Result<T> = std::result::Result<T, EmbedError>;

/// An I/O error on `path` during `op`, as the run's errors report it.
pub(crate) fn io_err(op: &'static str, path: &Path, e: std::io::Error) -> EmbedError {
    EmbedError::Store(StoreError::Io(strata_io::IoError::os(op, path, 0, e)))
}
