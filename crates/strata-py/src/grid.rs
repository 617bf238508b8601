//! Graph analytics and the far-memory server from Python.

use std::path::PathBuf;

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};
use pythonize::pythonize;
use strata_farmem::config::ServeOptions;
use strata_farmem::Server;
use strata_grid::build::build;
use strata_grid::config::{BuildOptions, RunOptions};
use strata_grid::dist::{Collective, Reduce};
use strata_grid::input::{build_input, InputBuildJob};
use strata_grid::run::{run as run_grid, run_distributed};
use strata_grid::{Grid, GridError};

use crate::call::run;
use crate::callback::CallbackError;
use crate::config::section;
use crate::errors::{config_error, raise, ToPyErr};

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

/// Builds a grid straight from an input edge list; `options` are the `grid.build` section
/// with `out` set, `provenance` what `grid.json` records of the front end.
#[pyfunction]
#[pyo3(signature = (options, provenance=None, progress=None))]
fn grid_build_input(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    provenance: Option<&Bound<'_, PyAny>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: BuildOptions = section(options)?;
    let provenance: serde_json::Value = match provenance {
        Some(p) => {
            pythonize::depythonize(p).map_err(|e| config_error(py, &format!("provenance: {e}")))?
        }
        None => serde_json::Value::Null,
    };
    let j = InputBuildJob::from_section(&o, provenance).map_err(|e| e.to_py(py))?;
    run(py, progress, |p| build_input(&j, p))
}

/// The manifest of the grid in `dir`.
#[pyfunction]
fn grid_info(py: Python<'_>, dir: PathBuf) -> PyResult<Py<PyAny>> {
    let g = py.detach(|| Grid::open(&dir)).map_err(|e| e.to_py(py))?;
    Ok(pythonize(py, g.manifest())?.unbind())
}

/// The ranks of a distributed run as the grid engine sees them: calls into a Python object
/// (`strata.grid.dist.Exchange`) that speaks torch.distributed. Its first exception is kept,
/// and raised as itself once the run returns.
struct PyGroup<'a> {
    group: Py<PyAny>,
    rank: usize,
    world_size: usize,
    /// torchrun's restarts of the group before this attempt.
    restart: usize,
    /// The process's anonymous memory after the group started (`Exchange.anon_bytes`).
    anon_bytes: Option<u64>,
    error: &'a CallbackError,
}

impl PyGroup<'_> {
    /// `group.method(*args(py))` with the GIL (see [`CallbackError::call_method`]); an
    /// exception becomes `GridError::Group` with its message.
    fn call<T>(
        &self,
        method: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
    ) -> strata_grid::Result<T>
    where
        T: for<'a, 'py> FromPyObject<'a, 'py>,
    {
        self.error
            .call_method(&self.group, method, args)
            .map_err(GridError::Group)
    }
}

impl Collective for PyGroup<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn all_gather(&mut self, mine: &[u8]) -> strata_grid::Result<Vec<Vec<u8>>> {
        let parts: Vec<Vec<u8>> = self.call("all_gather", |py| {
            (PyBytes::new(py, mine),).into_pyobject(py)
        })?;
        if parts.len() != self.world_size {
            return Err(GridError::Group(format!(
                "an all-gather returned {} parts for {} ranks",
                parts.len(),
                self.world_size
            )));
        }
        Ok(parts)
    }

    fn all_reduce(&mut self, values: &mut [f64], op: Reduce) -> strata_grid::Result<()> {
        let name = match op {
            Reduce::Sum => "sum",
            Reduce::Min => "min",
        };
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let reduced: Vec<u8> = self.call("all_reduce", |py| {
            (PyBytes::new(py, bytes), name).into_pyobject(py)
        })?;
        if reduced.len() != values.len() * 8 {
            return Err(GridError::Group(format!(
                "an all-reduce returned {} bytes for {} values",
                reduced.len(),
                values.len()
            )));
        }
        for (v, b) in values.iter_mut().zip(reduced.chunks_exact(8)) {
            *v = f64::from_le_bytes(b.try_into().expect("8 bytes"));
        }
        Ok(())
    }

    fn barrier(&mut self, what: &str) -> strata_grid::Result<()> {
        self.call::<Py<PyAny>>("barrier", |py| (what,).into_pyobject(py))
            .map(drop)
    }

    fn same_data(&mut self, grid: &std::path::Path, digest: &str) -> strata_grid::Result<()> {
        let grid = grid.to_string_lossy().into_owned();
        self.call::<Py<PyAny>>("same_data", |py| (grid, digest).into_pyobject(py))
            .map(drop)
    }

    fn restarted(&self) -> bool {
        self.restart > 0
    }

    fn group_anon_bytes(&self) -> Option<u64> {
        self.anon_bytes
    }

    fn traffic(&self) -> (u64, u64) {
        // A failure is kept and raised when the run returns; the figures read 0 meanwhile.
        self.call("traffic", |py| Ok(PyTuple::empty(py)))
            .unwrap_or((0, 0))
    }
}

/// Runs an algorithm; `options` are the `run` section (`strata_grid::config::RunOptions`);
/// `on_iteration(record)` sees each iteration as it ends. Returns the run summary. With
/// `group` (a `strata.grid.dist.Exchange`, whose `rank` and `world_size` it reads) this
/// process is one rank of a distributed run.
#[pyfunction]
#[pyo3(signature = (options, progress=None, on_iteration=None, group=None))]
fn grid_run(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
    on_iteration: Option<Py<PyAny>>,
    group: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j = section::<RunOptions>(options)?
        .job()
        .map_err(|e| config_error(py, &e.to_string()))?;
    let callback_error = CallbackError::default();
    let mut group = match group {
        Some(g) => {
            let rank: usize = g.getattr(py, "rank")?.extract(py)?;
            let world_size: usize = g.getattr(py, "world_size")?.extract(py)?;
            let restart: usize = g.getattr(py, "restart")?.extract(py)?;
            let anon_bytes: Option<u64> = g.getattr(py, "anon_bytes")?.extract(py)?;
            Some(PyGroup {
                group: g,
                rank,
                world_size,
                restart,
                anon_bytes,
                error: &callback_error,
            })
        }
        None => None,
    };
    let result = run(py, progress, |p| {
        let mut each = |it: &strata_grid::algo::Iteration| {
            if let Some(cb) = &on_iteration {
                callback_error.call(cb, it);
                if callback_error.is_set() {
                    return Err(GridError::Cancelled);
                }
            }
            Ok(())
        };
        match group.as_mut() {
            Some(g) => run_distributed(&j, g, p, &mut each),
            None => run_grid(&j, p, &mut each),
        }
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
    m.add_function(wrap_pyfunction!(grid_build_input, m)?)?;
    m.add_function(wrap_pyfunction!(grid_info, m)?)?;
    m.add_function(wrap_pyfunction!(grid_run, m)?)?;
    m.add_function(wrap_pyfunction!(grid_algorithms, m)?)?;
    m.add_function(wrap_pyfunction!(farmem_serve, m)?)?;
    Ok(())
}
