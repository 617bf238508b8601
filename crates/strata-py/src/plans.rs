//! Memory plans from Python: one function that checks a config section and hands it to an
//! engine's `plan_for(store, &section)` (`strata info --memory`), and the plans' text. Nothing
//! here estimates: every figure comes from the planner the engine runs at start.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};
use serde_json::Value;
use strata_embed::plan_for as embed_plan_for;
use strata_gnn::data::plan_for as gnn_plan_for;
use strata_grid::budget::plan_for as grid_plan_for;
use strata_serve::store_plan::plan_for as serve_plan_for;
use strata_store::budget::{MemoryPlan, Planning};
use strata_store::config::{check, schema, Section};

use crate::errors::{config_error, raise, ToPyErr};

/// Checks `config` as section `S` and asks the engine's `plan_for` for `store`'s plan, with
/// the GIL released. A section that names its store (grid's `store`) is given `store`.
fn planned<S: Section + Sync, E: Send>(
    py: Python<'_>,
    store: &Path,
    mut config: Value,
    plan_for: fn(&Path, &S) -> Result<Planning, E>,
    to_py: fn(Python<'_>, E) -> PyErr,
) -> PyResult<Planning> {
    let names_store = schema::<S>().pointer("/properties/store").is_some();
    if let (true, Value::Object(fields)) = (names_store, &mut config) {
        fields.insert("store".into(), Value::from(store.to_string_lossy()));
    }
    let section = check::<S>(&config).map_err(|e| config_error(py, &e.to_string()))?;
    py.detach(|| plan_for(store, &section))
        .map_err(|e| to_py(py, e))
}

fn engine_error<E: ToPyErr>(py: Python<'_>, e: E) -> PyErr {
    e.to_py(py)
}

/// The memory plan `engine` (`embed`, `gnn`, `grid`, `serve`) makes for `store` with `config`
/// (a dict of that engine's options, checked as its config section; unset ones take their
/// defaults, and grid's `store` is `store`), as a dict
/// (`engine`, `memory`, `minimum`, `parts`, `data`; bytes). When the budget cannot hold the
/// engine's minimum, the dict is `engine`, `memory` and `error` (the planner's message); when
/// there is nothing to plan yet (grid: no grid built), `engine`, `memory` and `not_planned`.
/// gnn plans with the runtime reserve and no training (no model is given here).
#[pyfunction]
fn memory_plan(
    py: Python<'_>,
    engine: &str,
    store: PathBuf,
    config: &Bound<'_, PyAny>,
) -> PyResult<Py<PyAny>> {
    let config: Value = depythonize(config).map_err(|e| config_error(py, &e.to_string()))?;
    let memory = config.get("memory").cloned().unwrap_or(Value::Null);
    let outcome = match engine {
        "embed" => planned(py, &store, config, embed_plan_for, engine_error)?,
        "gnn" => planned(py, &store, config, gnn_plan_for, engine_error)?,
        "grid" => planned(py, &store, config, grid_plan_for, engine_error)?,
        // A store whose manifest cannot be read, as the other engines' store errors say.
        "serve" => planned(py, &store, config, serve_plan_for, |py, e| {
            raise(py, "StoreFormatError", &e.to_string())
        })?,
        other => {
            return Err(config_error(
                py,
                &format!("memory_plan: unknown engine '{other}' (embed, gnn, grid, serve)"),
            ))
        }
    };
    let v = match outcome {
        Planning::Plan(p) => serde_json::to_value(p).expect("plans serialise"),
        Planning::Refused(error) => {
            serde_json::json!({"engine": engine, "memory": memory, "error": error})
        }
        Planning::NotPlanned(why) => {
            serde_json::json!({"engine": engine, "memory": memory, "not_planned": why})
        }
    };
    Ok(pythonize(py, &v)?.unbind())
}

/// The lines an engine prints for `plan` (a dict as [`memory_plan`] returns it).
#[pyfunction]
fn describe_memory_plan(plan: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    let plan: MemoryPlan =
        depythonize(plan).map_err(|e| config_error(plan.py(), &e.to_string()))?;
    Ok(plan.describe())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(memory_plan, m)?)?;
    m.add_function(wrap_pyfunction!(describe_memory_plan, m)?)?;
    Ok(())
}
