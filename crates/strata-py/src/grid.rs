//! Graph analytics and the far-memory server from Python.

use std::path::PathBuf;

use pyo3::prelude::*;
use pythonize::pythonize;
use strata_farmem::config::ServeOptions;
use strata_farmem::Server;
use strata_grid::build::build;
use strata_grid::config::{BuildOptions, RunOptions};
use strata_grid::run::run as run_grid;
use strata_grid::Grid;

use crate::callback::CallbackError;
use crate::config::section;
use crate::errors::{config_error, raise, ToPyErr};
use crate::run;

/// Builds a grid; `options` are the `grid.build` section
/// (`strata_grid::config::BuildOptions`).
#[pyfunction]
#[pyo3(signature = (options, progress=None))]
fn grid_build(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j = section::<BuildOptions>(options)?.job();
    run(py, progress, |p| build(&j, p))
}

/// The manifest of the grid in `dir`.
#[pyfunction]
fn grid_info(py: Python<'_>, dir: PathBuf) -> PyResult<Py<PyAny>> {
    let g = py.detach(|| Grid::open(&dir)).map_err(|e| e.to_py(py))?;
    Ok(pythonize(py, g.manifest())?.unbind())
}

/// Runs an algorithm; `options` are the `run` section (`strata_grid::config::RunOptions`);
/// `on_iteration(record)` sees each iteration as it ends. Returns the run summary.
#[pyfunction]
#[pyo3(signature = (options, progress=None, on_iteration=None))]
fn grid_run(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
    on_iteration: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j = section::<RunOptions>(options)?
        .job()
        .map_err(|e| config_error(py, &e.to_string()))?;
    let callback_error = CallbackError::default();
    let result = run(py, progress, |p| {
        run_grid(&j, p, &mut |it| {
            if let Some(cb) = &on_iteration {
                callback_error.call(cb, it);
                if callback_error.is_set() {
                    return Err(strata_grid::GridError::Cancelled);
                }
            }
            Ok(())
        })
    });
    callback_error.or(result)
}

/// The registered algorithms, in order: each one's `name`, `about`, result `arrays`,
/// iteration `value` (`{"kind": "real" | "count", "label": ...}` or `{"kind": "none"}`) and
/// `params` (its option names in the `run` section).
#[pyfunction]
fn grid_algorithms(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let all: Vec<serde_json::Value> = strata_grid::algo::registry::ALGORITHMS
        .iter()
        .map(|e| e.describe())
        .collect();
    Ok(pythonize(py, &all)?.unbind())
}

/// Serves far memory with `options` (the `[farmem.serve]` section's options, checked as that
/// section) until a signal (Ctrl-C, SIGTERM through Python's handler) arrives;
/// `on_ready(address)` is called once listening and `on_stop(counters)` once it stops, however
/// it stops. Returns the counters.
#[pyfunction]
#[pyo3(signature = (options, on_ready=None, on_stop=None))]
fn farmem_serve(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    on_ready: Option<Py<PyAny>>,
    on_stop: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let cfg = section::<ServeOptions>(options)?.server_config();
    let server = py
        .detach(|| Server::bind(&cfg))
        .map_err(|e| raise(py, "ConfigError", &e.to_string()))?;
    if let Some(cb) = &on_ready {
        cb.call1(py, (server.local_addr().to_string(),))?;
    }
    let signal = CallbackError::default();
    let outcome = py.detach(|| server.run_until(&|| signal.signalled()));
    let stats = server.stats();
    let counters = pythonize(
        py,
        &serde_json::json!({
            "served_bytes": stats.bytes_served,
            "received_bytes": stats.bytes_received,
            "requests": stats.requests,
        }),
    )?
    .unbind();
    // The counters reach the caller even when a signal stopped the server.
    if let Some(cb) = &on_stop {
        cb.call1(py, (counters.clone_ref(py),))?;
    }
    signal.or(Ok(()))?;
    outcome.map_err(|e| raise(py, "StrataIOError", &e.to_string()))?;
    Ok(counters)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(grid_build, m)?)?;
    m.add_function(wrap_pyfunction!(grid_info, m)?)?;
    m.add_function(wrap_pyfunction!(grid_run, m)?)?;
    m.add_function(wrap_pyfunction!(grid_algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(farmem_serve, m)?)?;
    Ok(())
}
