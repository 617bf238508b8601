//! Memory plans from Python: one function that calls an engine's own planner for a store and
//! a config (`strata info --memory`), and the plans' text. Nothing here estimates: every
//! figure comes from the planner the engine runs at start.

use std::path::{Path, PathBuf};

use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};
use serde_json::Value;
use strata_serve::config::ServeOptions;
use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::budget::{MemoryPlan, Planned};
use strata_store::config::check;
use strata_store::Store;

use crate::errors::{config_error, raise, ToPyErr};

/// What a planner said: its plan, why the budget cannot hold the engine's minimum, or why
/// there is nothing to plan yet.
enum Outcome {
    Plan(MemoryPlan),
    Refused(String),
    NotPlanned(String),
}

fn embed(py: Python<'_>, store: &Path, config: Value) -> PyResult<Outcome> {
    use strata_embed::{EmbedError, ScoreModel, TrainConfig};
    let cfg = check::<TrainConfig>(&config).map_err(|e| config_error(py, &e.to_string()))?;
    let store = Store::open(store).map_err(|e| e.to_py(py))?;
    let graph = store.manifest().graph.clone();
    let shape = strata_embed::node_shape(&store, &cfg).map_err(|e| e.to_py(py))?;
    let model = ScoreModel {
        kind: cfg.model,
        dim: cfg.dim,
        transe_norm: cfg.transe_norm,
        pbg: cfg.pbg_form(),
    };
    match strata_embed::plan_fitting(&cfg, &model, &shape, graph.num_relations, None) {
        Ok(p) => Ok(Outcome::Plan(p.memory_plan())),
        Err(EmbedError::Budget(m)) => Ok(Outcome::Refused(m)),
        Err(e) => Err(e.to_py(py)),
    }
}

/// The store's `node_train` ids (empty without a train split): the seeds `strata gnn train`
/// estimates its batches from.
fn train_nodes(store: &Store) -> Result<Vec<u32>, strata_store::StoreError> {
    let Ok(path) = store.array_path("node_train") else {
        return Ok(Vec::new());
    };
    let (header, bytes) = read_all_bytes(&path)?;
    let mut ids = Vec::new();
    decode_ints(&bytes, header.dtype, &mut ids);
    Ok(ids.into_iter().map(|i| i as u32).collect())
}

fn gnn(py: Python<'_>, store: &Path, config: Value) -> PyResult<Outcome> {
    use strata_gnn::data::{plan, Consumer, DataConfig};
    use strata_gnn::GnnError;
    let cfg = check::<DataConfig>(&config).map_err(|e| config_error(py, &e.to_string()))?;
    let nodes =
        train_nodes(&Store::open(store).map_err(|e| e.to_py(py))?).map_err(|e| e.to_py(py))?;
    match py.detach(|| plan(store, &cfg, &nodes, &Consumer::default())) {
        Ok(p) => Ok(Outcome::Plan(p.memory_plan())),
        Err(GnnError::Budget(m)) => Ok(Outcome::Refused(m)),
        Err(e) => Err(e.to_py(py)),
    }
}

fn grid(py: Python<'_>, store: &Path, config: Value) -> PyResult<Outcome> {
    use strata_grid::config::RunOptions;
    use strata_grid::grid::Grid;
    use strata_grid::GridError;
    let mut options = config;
    if let Value::Object(fields) = &mut options {
        fields.insert("store".into(), Value::from(store.to_string_lossy()));
    }
    let job = check::<RunOptions>(&options)
        .and_then(|o| o.job())
        .map_err(|e| config_error(py, &e.to_string()))?;
    let algo = &job.algorithm;
    let wanted = job.weights_wanted().map_err(|e| e.to_py(py))?;
    let found = Grid::find(
        &job.store,
        job.grid.as_deref(),
        wanted.as_ref(),
        (algo.needs_symmetric(), algo.needs_simple()),
    )
    .map_err(|e| e.to_py(py))?;
    let Some(dir) = found else {
        // The segments, and so the fetch buffers and where each segment lives, follow the edge
        // count of every block, which only the build's pass over the edges finds.
        return Ok(Outcome::NotPlanned(format!(
            "no grid for {name} in {store} yet, and the plan needs one: it sizes segments and fetch buffers from the edge count of each of the grid's blocks, which the store's counts do not give; `strata grid build {store}` or a first `strata run {name}` builds it, then this plans it",
            name = algo.name(),
            store = store.display(),
        )));
    };
    let grid = Grid::open(&dir).map_err(|e| e.to_py(py))?;
    let threads = strata_io::resolve_threads(job.threads);
    match strata_grid::budget::plan(
        &job,
        &grid,
        threads,
        None,
        0..grid.layout().partitions,
        None,
    ) {
        Ok(p) => Ok(Outcome::Plan(p.memory_plan())),
        Err(GridError::Budget(m)) => Ok(Outcome::Refused(m)),
        Err(e) => Err(e.to_py(py)),
    }
}

fn serve(py: Python<'_>, store: &Path, config: Value) -> PyResult<Outcome> {
    let o = check::<ServeOptions>(&config).map_err(|e| config_error(py, &e.to_string()))?;
    let graphs = strata_serve::memory::store_graph_bytes(store)
        .map_err(|e| raise(py, "StoreFormatError", &e.to_string()))?;
    let registered = strata_serve::budget::Registered {
        graphs,
        ..Default::default()
    };
    match strata_serve::budget::plan(
        o.memory.0,
        registered,
        o.embedding_cache,
        usize::try_from(o.max_message.0).unwrap_or(usize::MAX),
    ) {
        Ok(p) => Ok(Outcome::Plan(p.memory_plan())),
        Err(e) => Ok(Outcome::Refused(e.to_string())),
    }
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
        "embed" => embed(py, &store, config)?,
        "gnn" => gnn(py, &store, config)?,
        "grid" => grid(py, &store, config)?,
        "serve" => serve(py, &store, config)?,
        other => {
            return Err(config_error(
                py,
                &format!("memory_plan: unknown engine '{other}' (embed, gnn, grid, serve)"),
            ))
        }
    };
    let v = match outcome {
        Outcome::Plan(p) => serde_json::to_value(p).expect("plans serialise"),
        Outcome::Refused(error) => {
            serde_json::json!({"engine": engine, "memory": memory, "error": error})
        }
        Outcome::NotPlanned(why) => {
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
