//! The engines' config sections, handed to Python: their schemas (option names, types,
//! defaults, bounds, help) and the one check every section's values go through.

use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};
use serde_json::Value;
use strata_embed::{
    EvalOptions, ExportOptions, GatherOptions, ImportPbgOptions, NeighborsOptions, PlanOptions,
    PredictOptions, ScoreOptions, TrainConfig,
};
use strata_farmem::config::ServeOptions as FarmemServeOptions;
use strata_gnn::data::DataConfig;
use strata_graph::reorder::ReorderOptions;
use strata_grid::config::{BuildOptions, RunOptions};
use strata_serve::config::ServeOptions;
use strata_store::check::CheckOptions;
use strata_store::config::{check_address, normalize, schema, ConfigError, Section};
use strata_store::convert::ConvertOptions;
use strata_store::generate::{HetSbmOptions, KgOptions, RmatOptions, SbmOptions};

use crate::bench_disk::BenchDiskOptions;
use crate::errors::config_error;

/// One section: its schema and its check.
struct Entry {
    name: &'static str,
    schema: fn() -> Value,
    check: fn(&Value) -> Result<Value, ConfigError>,
}

const fn entry<S: Section>() -> Entry {
    Entry {
        name: S::NAME,
        schema: schema::<S>,
        check: normalize::<S>,
    }
}

/// Every section whose options an engine declares.
const SECTIONS: &[Entry] = &[
    entry::<ServeOptions>(),
    entry::<RunOptions>(),
    entry::<BuildOptions>(),
    entry::<TrainConfig>(),
    entry::<PlanOptions>(),
    entry::<EvalOptions>(),
    entry::<PredictOptions>(),
    entry::<ExportOptions>(),
    entry::<NeighborsOptions>(),
    entry::<ScoreOptions>(),
    entry::<GatherOptions>(),
    entry::<ImportPbgOptions>(),
    entry::<DataConfig>(),
    entry::<FarmemServeOptions>(),
    entry::<RmatOptions>(),
    entry::<KgOptions>(),
    entry::<SbmOptions>(),
    entry::<HetSbmOptions>(),
    entry::<BenchDiskOptions>(),
    entry::<ConvertOptions>(),
    entry::<ReorderOptions>(),
    entry::<CheckOptions>(),
];

/// Checks `values` as section `S` and builds it, or raises ConfigError naming `section.key`.
pub fn section<S: Section>(values: &Bound<'_, PyAny>) -> PyResult<S> {
    let py = values.py();
    let values: Value =
        depythonize(values).map_err(|e| config_error(py, &format!("{}: {e}", S::NAME)))?;
    strata_store::config::check::<S>(&values).map_err(|e| config_error(py, &e.to_string()))
}

/// {section name: JSON schema} of every engine's config section.
#[pyfunction]
fn config_schema(py: Python<'_>) -> PyResult<Py<PyAny>> {
    let all: serde_json::Map<String, Value> = SECTIONS
        .iter()
        .map(|e| (e.name.to_string(), (e.schema)()))
        .collect();
    Ok(pythonize(py, &all)?.unbind())
}

/// Checks `values` (some of section `name`'s options) and returns all of them, defaults
/// filled in; raises ConfigError naming `section.key` and what was expected.
#[pyfunction]
fn config_check(py: Python<'_>, name: &str, values: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let Some(entry) = SECTIONS.iter().find(|e| e.name == name) else {
        return Err(config_error(
            py,
            &format!("no engine config section '{name}'"),
        ));
    };
    let values: Value = depythonize(values).map_err(|e| {
        // Name the option whose value has no JSON form (an integer beyond 64 bits).
        let key = values.cast::<pyo3::types::PyDict>().ok().and_then(|d| {
            d.iter()
                .find(|(_, v)| depythonize::<Value>(v).is_err())
                .map(|(k, _)| k.to_string())
        });
        let at = key.map_or(name.to_string(), |k| format!("{name}.{k}"));
        config_error(
            py,
            &format!("{at}: {e}: numbers must lie within [-2^63, 2^64 - 1]"),
        )
    })?;
    let checked = (entry.check)(&values).map_err(|e| config_error(py, &e.to_string()))?;
    Ok(pythonize(py, &checked)?.unbind())
}

/// Checks that `addr` is HOST:PORT, for option `key` of a section declared in Python (a client's
/// server address); raises ConfigError naming `section.key`.
#[pyfunction]
fn config_check_address(py: Python<'_>, section: &str, key: &str, addr: &str) -> PyResult<()> {
    check_address(section, key, addr).map_err(|e| config_error(py, &e.to_string()))
}

/// Why `name` is not one of `known` (a config section or option, a choice, a dataset), with
/// the closest known name when one is close: `strata_store::registry::unknown_name`, so that
/// Python's did-you-means read and match like the engines'.
#[pyfunction]
fn unknown_name(what: &str, name: &str, known: Vec<String>) -> String {
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    strata_store::registry::unknown_name(what, name, &known)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(config_schema, m)?)?;
    m.add_function(wrap_pyfunction!(config_check, m)?)?;
    m.add_function(wrap_pyfunction!(config_check_address, m)?)?;
    m.add_function(wrap_pyfunction!(unknown_name, m)?)?;
    Ok(())
}
