//! Errors of the graph primitives.

use strata_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    /// A store or file error, naming the path.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An argument out of range or contradicting the data (a fanout below 1, a row past the
    /// end of a feature file, arrays that do not describe a graph); names the option or file.
    #[error("{0}")]
    Config(String),
    /// An update of a store whose rows cannot change (a feature file opened for reading);
    /// names the file.
    #[error("{0} is read-only: its feature rows cannot be updated")]
    ReadOnly(String),
}

impl From<strata_io::IoError> for GraphError {
    fn from(e: strata_io::IoError) -> Self {
        GraphError::Store(StoreError::Io(e))
    }
}

pub type Result<T> = std::result::Result<T, GraphError>;
