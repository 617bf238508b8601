//! Forwards progress of a Rust job to a Python callable, and turns an exception raised by it
//! (Ctrl-C's KeyboardInterrupt, or the callback asking to stop) into a cancellation.

use pyo3::prelude::*;
use serde::Serialize;
use strata_store::Progress;

use crate::callback::CallbackError;

/// Calls `callback(event, *args)`: `("stage", name, total_bytes, total_rows)`,
/// `("update", rows, bytes)` (a false return cancels), `("message", text)` and
/// `("detail", text)`.
pub struct PyProgress {
    callback: Option<Py<PyAny>>,
    error: CallbackError,
}

impl PyProgress {
    pub fn new(callback: Option<Py<PyAny>>) -> Self {
        PyProgress {
            callback,
            error: CallbackError::default(),
        }
    }

    /// The exception raised inside the callback, if the job stopped because of one.
    pub fn take_error(&self) -> Option<PyErr> {
        self.error.take()
    }

    /// Calls a hook of the job, `hook(record)` (e.g. `on_epoch`); an exception it raises is
    /// kept, and the job's next `update` cancels the job, which then raises it.
    pub fn call_hook(&self, hook: &Py<PyAny>, record: &impl Serialize) {
        self.error.call(hook, record);
    }

    /// Runs `f` with the callback; returns false (cancel) if it raised, or returned a false
    /// value other than None, or a signal (Ctrl-C) is pending.
    fn with_callback(
        &self,
        f: impl for<'py> FnOnce(&Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>>,
    ) -> bool {
        Python::attach(|py| {
            let outcome = py.check_signals().and_then(|_| match &self.callback {
                Some(cb) => f(cb.bind(py)).and_then(|r| Ok(r.is_none() || r.is_truthy()?)),
                None => Ok(true),
            });
            outcome.unwrap_or_else(|e| {
                self.error.keep(e);
                false
            })
        })
    }
}

impl Progress for PyProgress {
    fn stage(&self, name: &str, total_bytes: u64, total_rows: u64) {
        self.with_callback(|cb| cb.call1(("stage", name, total_bytes, total_rows)));
    }

    fn update(&self, rows: u64, bytes: u64) -> bool {
        !self.error.is_set() && self.with_callback(|cb| cb.call1(("update", rows, bytes)))
    }

    fn message(&self, text: &str) {
        self.with_callback(|cb| cb.call1(("message", text)));
    }

    fn detail(&self, text: &str) {
        self.with_callback(|cb| cb.call1(("detail", text)));
    }
}
