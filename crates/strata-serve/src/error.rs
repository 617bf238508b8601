//! Errors of the graph service. Each kind maps to one gRPC status code (see `service.rs`), so
//! a client learns what went wrong and the server keeps serving.

use strata_graph::GraphError;
use strata_store::StoreError;

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// An unknown graph, model, request id, vertex or edge; names it.
    #[error("{0}")]
    NotFound(String),
    /// A malformed request: out-of-range ids, a tensor whose bytes do not match its shape,
    /// a bad option value. Names the field and what was expected.
    #[error("{0}")]
    InvalidArgument(String),
    /// A name already registered.
    #[error("{0}")]
    AlreadyExists(String),
    /// A well-formed request the current state cannot serve (a model whose input width is not
    /// the graph's feature width, a weights file missing a tensor the architecture needs).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A path outside the server's data roots (`--data-root`); names the path as the client
    /// sent it, and never whether it exists.
    #[error("{0}")]
    PermissionDenied(String),
    /// A size or rate limit; says which and by how much.
    #[error("{0}")]
    ResourceExhausted(String),
    /// A message over the size limit (`--max-message`): a request as it is decoded, or a reply
    /// whose computed size is over it, refused before it is built. Names the sizes.
    #[error("{0}")]
    OutOfRange(String),
    /// The server is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// The call's deadline passed before it was answered.
    #[error("{0}")]
    DeadlineExceeded(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Graph(#[from] GraphError),
    /// A file or socket operation failed; names the path.
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
}

impl ServeError {
    /// An I/O error with the path or operation it concerns.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> ServeError {
        ServeError::Io {
            context: context.into(),
            source,
        }
    }

    /// The same error (same kind, so the same status code) with `place` before its message,
    /// e.g. `mutations[3]` for one mutation of a batch.
    pub fn within(self, place: &str) -> ServeError {
        let at = |m: String| format!("{place}: {m}");
        match self {
            ServeError::NotFound(m) => ServeError::NotFound(at(m)),
            ServeError::InvalidArgument(m) => ServeError::InvalidArgument(at(m)),
            ServeError::AlreadyExists(m) => ServeError::AlreadyExists(at(m)),
            ServeError::FailedPrecondition(m) => ServeError::FailedPrecondition(at(m)),
            ServeError::PermissionDenied(m) => ServeError::PermissionDenied(at(m)),
            ServeError::ResourceExhausted(m) => ServeError::ResourceExhausted(at(m)),
            ServeError::OutOfRange(m) => ServeError::OutOfRange(at(m)),
            ServeError::Unavailable(m) => ServeError::Unavailable(at(m)),
            ServeError::DeadlineExceeded(m) => ServeError::DeadlineExceeded(at(m)),
            ServeError::Io { context, source } => ServeError::Io {
                context: at(context),
                source,
            },
            // Errors of other crates keep their own type, and with it their status code.
            other @ (ServeError::Store(_) | ServeError::Graph(_)) => other,
        }
    }
}

impl From<strata_io::IoError> for ServeError {
    fn from(e: strata_io::IoError) -> Self {
        ServeError::Store(StoreError::Io(e))
    }
}

pub type Result<T> = std::result::Result<T, ServeError>;
