//! The I/O engine from Python: configuration, counters, the disk benchmark, device profiles.

use std::path::PathBuf;

use pyo3::prelude::*;
use pythonize::pythonize;
use strata_io::bench::{bench_disk as run_bench, BenchOptions};
use strata_io::profile::{profile_path, DeviceProfile, ProfileReport};
use strata_io::{BackendKind, Engine, EngineConfig};
use strata_store::config::{check_seconds, ConfigError, Section, Size};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::config::section;
use crate::errors::ToPyErr;
use crate::{job, run};

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

/// The `[bench_disk]` section: what `strata bench-disk` measures and how. It is declared here,
/// where the benchmark ([`BenchOptions`]) and the engine choice meet, because strata-io sits
/// below the config mechanism (`strata_store::config`). Saving the profile is Python's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BenchDiskOptions {
    /// directory on the device to measure (the benchmark file goes there)
    #[schemars(extend("x-kind" = "path"))]
    pub dir: PathBuf,
    /// size of the benchmark file
    pub size: Size,
    /// benchmark file: created (write test) and kept if absent, measured read-only if present;
    /// default a temporary file in --dir
    #[schemars(extend("x-kind" = "path"))]
    pub file: Option<PathBuf>,
    /// queue depths of the 4 KiB random-read test
    #[schemars(inner(range(min = 1)))]
    pub queue_depths: Vec<usize>,
    /// seconds per random-read queue depth
    pub seconds: f64,
    /// 1 MiB requests in flight in the sequential tests
    #[schemars(range(min = 1))]
    pub seq_depth: usize,
    /// I/O backend to measure
    pub backend: BackendKind,
    /// keep the benchmark file
    pub keep: bool,
}

/// The smallest benchmark file created: the sequential tests need a few 1 MiB requests.
const MIN_BENCH_FILE: u64 = 4 << 20;

impl Default for BenchDiskOptions {
    fn default() -> Self {
        BenchDiskOptions {
            dir: PathBuf::from("."),
            size: Size(4 << 30),
            file: None,
            queue_depths: vec![1, 4, 16, 64, 128, 256],
            seconds: 3.0,
            seq_depth: 32,
            backend: BackendKind::Auto,
            keep: false,
        }
    }
}

impl Section for BenchDiskOptions {
    const NAME: &'static str = "bench_disk";

    fn validate(&self) -> Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        if self.queue_depths.is_empty() {
            return refuse("queue_depths", "needs at least one queue depth".into());
        }
        if !(self.seconds > 0.0 && self.seconds.is_finite()) {
            return refuse("seconds", format!("must be positive, got {}", self.seconds));
        }
        check_seconds(Self::NAME, "seconds", self.seconds, 1.0)?;
        if self.size.0 < MIN_BENCH_FILE && self.file.is_none() {
            return refuse("size", format!("at least 4M, got {}", self.size.0));
        }
        Ok(())
    }
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
