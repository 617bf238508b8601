//! Errors of the grid engine.

use std::path::PathBuf;

use strata_store::StoreError;

/// Everything that can go wrong building, opening or running on a grid. Each variant names
/// the file or option at fault.
#[derive(Debug, thiserror::Error)]
pub enum GridError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// A grid directory whose manifest or arrays do not agree.
    #[error("grid {}: {msg}", dir.display())]
    Invalid { dir: PathBuf, msg: String },
    /// A configuration value out of range or contradicting the graph; names the option.
    #[error("option {field}: {msg}")]
    Config { field: String, msg: String },
    /// The memory budget cannot hold the minimum; says what is needed.
    #[error("{0}")]
    Budget(String),
    /// A collective of a distributed run failed (another rank died, timed out or sent bytes
    /// that make no sense); says which.
    #[error("{0}")]
    Group(String),
    /// An iteration checkpoint that a restarted run cannot resume from; names the file.
    #[error("checkpoint {}: {msg}", path.display())]
    Checkpoint { path: PathBuf, msg: String },
    /// A vertex program that cannot go on (a value its array cannot hold); names the
    /// program, the step and the vertex.
    #[error("{0}")]
    Program(String),
    #[error("cancelled")]
    Cancelled,
}

impl GridError {
    /// A [`GridError::Config`] for option `field`.
    pub fn config(field: &str, msg: impl Into<String>) -> GridError {
        GridError::Config {
            field: field.to_string(),
            msg: msg.into(),
        }
    }

    /// Wraps a `std::io::Error` of operation `op` on `path`.
    pub fn os(op: &'static str, path: &std::path::Path, source: std::io::Error) -> GridError {
        GridError::Store(StoreError::Io(strata_io::IoError::os(op, path, 0, source)))
    }

    /// A [`GridError::Invalid`] for the grid at `dir`.
    pub fn invalid(dir: &std::path::Path, msg: impl Into<String>) -> GridError {
        GridError::Invalid {
            dir: dir.to_path_buf(),
            msg: msg.into(),
        }
    }
}

impl From<strata_io::IoError> for GridError {
    fn from(e: strata_io::IoError) -> Self {
        GridError::Store(StoreError::Io(e))
    }
}

impl From<strata_io::progress::Cancelled> for GridError {
    fn from(_: strata_io::progress::Cancelled) -> Self {
        GridError::Cancelled
    }
}

pub type Result<T> = std::result::Result<T, GridError>;
