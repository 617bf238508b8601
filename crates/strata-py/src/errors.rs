//! Maps Strata's typed errors to the exception classes defined in `strata/errors.py`.

use pyo3::prelude::*;
use strata_embed::EmbedError;
use strata_gnn::GnnError;
use strata_graph::GraphError;
use strata_io::IoError;
use strata_store::StoreError;

/// Instantiates exception class `class` of `strata.errors` with `msg`.
pub fn raise(py: Python<'_>, class: &str, msg: &str) -> PyErr {
    match py.import("strata.errors").and_then(|m| m.getattr(class)) {
        Ok(cls) => match cls.call1((msg,)) {
            Ok(exc) => PyErr::from_value(exc),
            Err(e) => e,
        },
        Err(e) => e,
    }
}

/// A `strata.errors.ConfigError` with `msg`.
pub fn config_error(py: Python<'_>, msg: &str) -> PyErr {
    raise(py, "ConfigError", msg)
}

/// A Rust error that maps to one of the exception classes of `strata.errors`.
pub trait ToPyErr {
    fn to_py(&self, py: Python<'_>) -> PyErr;
}

impl ToPyErr for StoreError {
    fn to_py(&self, py: Python<'_>) -> PyErr {
        store_error(py, self)
    }
}

impl ToPyErr for EmbedError {
    fn to_py(&self, py: Python<'_>) -> PyErr {
        match self {
            EmbedError::Store(e) => store_error(py, e),
            EmbedError::Config(m) => raise(py, "ConfigError", m),
            EmbedError::Budget(m) => raise(py, "BudgetError", m),
            EmbedError::Corrupt(m) => raise(py, "RunError", m),
            EmbedError::Group(m) => raise(py, "GroupError", m),
            EmbedError::Diverged(m) => raise(py, "DivergedError", m),
            EmbedError::Cancelled => pyo3::exceptions::PyKeyboardInterrupt::new_err("cancelled"),
        }
    }
}

impl ToPyErr for GnnError {
    fn to_py(&self, py: Python<'_>) -> PyErr {
        match self {
            GnnError::Store(e) => store_error(py, e),
            GnnError::Graph(e) => e.to_py(py),
            GnnError::Config(m) => raise(py, "ConfigError", m),
            GnnError::Budget(m) => raise(py, "BudgetError", m),
            GnnError::Cancelled => pyo3::exceptions::PyKeyboardInterrupt::new_err("cancelled"),
        }
    }
}

impl ToPyErr for GraphError {
    fn to_py(&self, py: Python<'_>) -> PyErr {
        match self {
            GraphError::Store(e) => store_error(py, e),
            GraphError::Config(m) => raise(py, "ConfigError", m),
            GraphError::ReadOnly(_) => raise(py, "ConfigError", &self.to_string()),
        }
    }
}

impl ToPyErr for strata_grid::GridError {
    fn to_py(&self, py: Python<'_>) -> PyErr {
        use strata_grid::GridError;
        match self {
            GridError::Store(e) => store_error(py, e),
            GridError::Invalid { .. } => raise(py, "StoreFormatError", &self.to_string()),
            GridError::Config { .. } => raise(py, "ConfigError", &self.to_string()),
            GridError::Budget(m) => raise(py, "BudgetError", m),
            GridError::Group(m) => raise(py, "GroupError", m),
            GridError::Program(m) => raise(py, "ProgramError", m),
            GridError::Checkpoint { .. } => raise(py, "StoreFormatError", &self.to_string()),
            GridError::Cancelled => pyo3::exceptions::PyKeyboardInterrupt::new_err("cancelled"),
        }
    }
}

/// The Python exception for a store or I/O error.
fn store_error(py: Python<'_>, e: &StoreError) -> PyErr {
    let class = match e {
        StoreError::Input { .. } | StoreError::BadFile { .. } => "InputError",
        StoreError::Invalid { .. } | StoreError::NewerFormat { .. } => "StoreFormatError",
        StoreError::Budget { .. } | StoreError::DiskRoom { .. } => "BudgetError",
        StoreError::Option { .. } | StoreError::Usage(_) => "ConfigError",
        StoreError::Missing { .. } => "InputNotFoundError",
        StoreError::Exists { .. } => "StoreExistsError",
        StoreError::Cancelled | StoreError::Io(IoError::Cancelled) => {
            return pyo3::exceptions::PyKeyboardInterrupt::new_err("cancelled")
        }
        StoreError::Io(IoError::Invalid(_) | IoError::Unsupported(_)) => "ConfigError",
        StoreError::Io(IoError::DiskFull { .. }) => "DiskFullError",
        StoreError::Io(IoError::Os { source, .. })
            if source.kind() == std::io::ErrorKind::NotFound =>
        {
            "InputNotFoundError"
        }
        // A path that names the wrong kind of thing, or one too long: the user's to mend.
        StoreError::Io(IoError::Os { source, .. })
            if matches!(
                source.kind(),
                std::io::ErrorKind::IsADirectory
                    | std::io::ErrorKind::NotADirectory
                    | std::io::ErrorKind::InvalidFilename
            ) =>
        {
            "InputError"
        }
        StoreError::Io(_) => "StrataIOError",
    };
    raise(py, class, &e.to_string())
}
