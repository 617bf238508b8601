//! Errors of the GNN data path.

use strata_graph::GraphError;
use strata_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum GnnError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// An error of the topology, sampler or feature reader (`strata-graph`).
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A configuration value out of range or contradicting the store; names the option.
    #[error("{0}")]
    Config(String),
    /// The memory budget cannot hold the minimum; says what is needed.
    #[error("{0}")]
    Budget(String),
    #[error("cancelled")]
    Cancelled,
}

impl From<strata_io::IoError> for GnnError {
    fn from(e: strata_io::IoError) -> Self {
        GnnError::Store(StoreError::Io(e))
    }
}

impl From<strata_io::progress::Cancelled> for GnnError {
    fn from(_: strata_io::progress::Cancelled) -> Self {
        GnnError::Cancelled
    }
}

pub type Result<T> = std::result::Result<T, GnnError>;
