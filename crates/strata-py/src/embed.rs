//! Embedding training from Python.

use pyo3::prelude::*;
use pythonize::pythonize;
use strata_embed::ordering::{schedule, OrderingKind};

use crate::errors::config_error;

/// The epoch schedule of `ordering` (`legend`, `beta`, `sequential`) for `partitions` and a
/// buffer of `capacity`, with its load and overlap figures.
#[pyfunction]
fn embed_plan(
    py: Python<'_>,
    ordering: &str,
    partitions: usize,
    capacity: usize,
) -> PyResult<Py<PyAny>> {
    let kind = match ordering {
        "legend" => OrderingKind::Legend,
        "beta" => OrderingKind::Beta,
        "sequential" => OrderingKind::Sequential,
        other => {
            return Err(config_error(
                py,
                &format!("unknown ordering '{other}' (legend, beta, sequential)"),
            ))
        }
    };
    let s = py
        .detach(|| schedule(kind, partitions, capacity))
        .map_err(|e| config_error(py, &format!("embed.plan: {e}")))?;
    let report = serde_json::json!({
        "ordering": kind.name(),
        "partitions": s.partitions,
        "capacity": s.capacity,
        "states": s.states(),
        "swaps": s.swaps(),
        "partition_loads": s.partition_loads(),
        "hidden_swaps": s.hidden_swaps(),
        "volume": s.volume(),
        "steps": s.steps,
    });
    Ok(pythonize(py, &report)?.unbind())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(embed_plan, m)?)?;
    Ok(())
}
