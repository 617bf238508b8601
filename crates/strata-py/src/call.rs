//! How a binding calls into Rust: a Python dict checked into a typed job ([`job`]), and the
//! job run with the GIL released, its progress and errors carried back ([`run`]).

use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::errors::{config_error, ToPyErr};
use crate::progress::PyProgress;

/// Converts a Python dict into a typed job, naming the offending field on failure.
pub(crate) fn job<T: DeserializeOwned>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    depythonize(obj).map_err(|e| config_error(obj.py(), &e.to_string()))
}

/// Runs `f` without the GIL, reporting progress to `callback`, and converts its result. An
/// exception raised by the callback or a hook of the job is raised even when the job finished
/// (a hook of its last step), in place of the job's own error when it stopped because of it.
pub(crate) fn run<T: Serialize + Send, E: ToPyErr + Send>(
    py: Python<'_>,
    callback: Option<Py<PyAny>>,
    f: impl FnOnce(&PyProgress) -> Result<T, E> + Send,
) -> PyResult<Py<PyAny>> {
    let progress = PyProgress::new(callback);
    let outcome = py.detach(|| f(&progress));
    match (progress.take_error(), outcome) {
        (Some(raised), _) => Err(raised),
        (None, Ok(v)) => Ok(pythonize(py, &v)?.unbind()),
        (None, Err(e)) => Err(e.to_py(py)),
    }
}
