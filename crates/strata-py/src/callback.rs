//! Python callbacks called from Rust jobs that run without the GIL: the first exception a
//! callback raises is kept and raised once the job has returned.

use std::sync::Mutex;

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pythonize::pythonize;
use serde::Serialize;

/// The first exception raised by a callback during a job.
#[derive(Default)]
pub struct CallbackError(Mutex<Option<PyErr>>);

impl CallbackError {
    /// Keeps `e` unless an earlier exception is kept already.
    pub fn keep(&self, e: PyErr) {
        self.0.lock().unwrap().get_or_insert(e);
    }

    /// Whether an exception is kept.
    pub fn is_set(&self) -> bool {
        self.0.lock().unwrap().is_some()
    }

    /// Calls `callback(record)` with the GIL, `record` converted to Python objects; keeps
    /// the exception if the conversion or the call raises.
    pub fn call(&self, callback: &Py<PyAny>, record: &impl Serialize) {
        Python::attach(|py| {
            let outcome = pythonize(py, record)
                .map_err(PyErr::from)
                .and_then(|r| callback.call1(py, (r,)));
            if let Err(e) = outcome {
                self.keep(e);
            }
        });
    }

    /// `obj.method(*args(py))` with the GIL, its result extracted as `T`. An exception is
    /// kept (to be raised as itself when the job returns) and its message returned, for the
    /// engine's own error type.
    pub fn call_method<T>(
        &self,
        obj: &Py<PyAny>,
        method: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
    ) -> Result<T, String>
    where
        T: for<'a, 'py> FromPyObject<'a, 'py>,
    {
        Python::attach(|py| {
            let outcome = args(py)
                .and_then(|a| obj.call_method1(py, method, a))
                .and_then(|v| v.extract::<T>(py).map_err(Into::into));
            outcome.map_err(|e| {
                let message = e.to_string();
                self.keep(e);
                message
            })
        })
    }

    /// Checks for a pending signal (Ctrl-C) with the GIL; keeps its exception and returns
    /// true when there is one.
    pub fn signalled(&self) -> bool {
        Python::attach(|py| match py.check_signals() {
            Ok(()) => false,
            Err(e) => {
                self.keep(e);
                true
            }
        })
    }

    /// The kept exception, taken out.
    pub fn take(&self) -> Option<PyErr> {
        self.0.lock().unwrap().take()
    }

    /// The kept exception if there is one, else the job's `result`.
    pub fn or<T>(self, result: PyResult<T>) -> PyResult<T> {
        match self.0.into_inner().unwrap() {
            Some(e) => Err(e),
            None => result,
        }
    }
}
