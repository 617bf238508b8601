//! The I/O engine from Python: configuration, counters, the disk benchmark, device profiles.

use std::path::PathBuf;

use pyo3::prelude::*;
use pythonize::pythonize;
use strata_io::bench::{bench_disk as run_bench, BenchOptions};
use strata_io::profile::{profile_path, DeviceProfile, ProfileReport};
use strata_io::{Engine, EngineConfig};

use crate::bench_disk::BenchDiskOptions;
use crate::call::{job, run};
use crate::config::section;
use crate::errors::ToPyErr;

fn io_err(py: Python<'_>, e: strata_io::IoError) -> PyErr {
    strata_store::StoreError::from(e).to_py(py)
}

/// Sets the shared engine's configuration (`backend`, `depth`, `threads`,
/// `register_files`); an error once the engine already runs differently.
#[pyfunction]
fn io_configure(py: Python<'_>, config: &Bound<'_, PyAny>) -> PyResult<()> {
    let cfg: EngineConfig = job(config)?;
    Engine::configure_shared(cfg).map_err(|e| io_err(py, e))
}

/// The shared engine's backend, the reason for a fallback, and its depth.
#[pyfunction]
fn io_info(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let e = Engine::shared();
    let info = serde_json::json!({
        "backend": e.kind().name(),
        "fallback_reason": e.fallback_reason(),
        "depth": e.depth(),
    });
    Ok(pythonize(py, &info)?.unbind())
}

/// Counters of the shared engine: ops, bytes, latency percentiles, in-flight depth.
#[pyfunction]
fn io_stats(py: Python<'_>) -> PyResult<Py<PyAny>> {
    Ok(pythonize(py, &Engine::shared().stats().summary())?.unbind())
}

/// Measures the disk (see `strata_io::bench`) with `options` (the `[bench_disk]` section's,
/// checked as it) on an engine of its backend deep enough for the largest queue depth; returns
/// the profile with its derived figures.
#[pyfunction]
#[pyo3(signature = (options, progress=None))]
fn bench_disk(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: BenchDiskOptions = section(options)?;
    let backend = o.backend;
    let opts = BenchOptions {
        dir: o.dir,
        size: o.size.0,
        file: o.file,
        queue_depths: o.queue_depths,
        seconds: o.seconds,
        seq_depth: o.seq_depth,
        keep: o.keep,
    };
    let depth = opts
        .queue_depths
        .iter()
        .copied()
        .chain([opts.seq_depth])
        .max()
        .unwrap_or(1);
    let engine = Engine::new(&EngineConfig {
        backend,
        depth,
        threads: depth,
        ..EngineConfig::default()
    })
    .map_err(|e| io_err(py, e))?;
    run(py, progress, move |p| {
        Ok::<_, strata_store::StoreError>(ProfileReport::from(run_bench(&engine, &opts, p)?))
    })
}

/// Saves a profile (as returned by `bench_disk`) to `path`.
#[pyfunction]
fn save_profile(py: Python<'_>, profile: &Bound<'_, PyAny>, path: PathBuf) -> PyResult<()> {
    let p: DeviceProfile = pythonize::depythonize(profile)
        .map_err(|e| crate::errors::config_error(py, &e.to_string()))?;
    p.save(&path).map_err(|e| io_err(py, e))
}

/// The default profile file of the device holding `path`.
#[pyfunction]
fn default_profile_path(py: Python<'_>, path: PathBuf) -> PyResult<PathBuf> {
    profile_path(&path).map_err(|e| io_err(py, e))
}

/// The saved profile of the device holding `path`, with derived figures, or None.
#[pyfunction]
fn load_profile(py: Python<'_>, path: PathBuf) -> PyResult<Option<Py<PyAny>>> {
    let found = if path.extension().is_some_and(|e| e == "json") {
        Some(DeviceProfile::load(&path).map_err(|e| io_err(py, e))?)
    } else {
        DeviceProfile::for_path(&path)
    };
    found
        .map(|p| Ok(pythonize(py, &ProfileReport::from(p))?.unbind()))
        .transpose()
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(io_configure, m)?)?;
    m.add_function(wrap_pyfunction!(io_info, m)?)?;
    m.add_function(wrap_pyfunction!(io_stats, m)?)?;
    m.add_function(wrap_pyfunction!(bench_disk, m)?)?;
    m.add_function(wrap_pyfunction!(save_profile, m)?)?;
    m.add_function(wrap_pyfunction!(default_profile_path, m)?)?;
    m.add_function(wrap_pyfunction!(load_profile, m)?)?;
    Ok(())
}
