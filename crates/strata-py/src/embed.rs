//! Embedding training from Python.

use pyo3::prelude::*;
use pythonize::pythonize;
use strata_embed::ordering::schedule;

use std::path::PathBuf;

use strata_embed::config::{EvalOptions, ExportOptions, PlanOptions, PredictOptions, TrainConfig};
use strata_embed::error::EmbedError;
use strata_embed::export::export;
use strata_embed::job::train;
use strata_embed::query::Loaded;
use strata_embed::run_dir::Run;

use crate::callback::CallbackError;
use crate::config::section;
use crate::errors::{config_error, ToPyErr};
use crate::run;

/// The epoch schedule of `options` (the `[embed.plan]` section: `ordering`, `partitions`,
/// `buffer`), with its load and overlap figures.
#[pyfunction]
fn embed_plan(py: Python<'_>, options: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let PlanOptions {
        partitions,
        buffer,
        ordering: kind,
    } = section(options)?;
    let s = py
        .detach(|| schedule(kind, partitions as usize, buffer))
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

/// Trains (or resumes) a run: `config` is the `embed.train` section
/// (`strata_embed::config::TrainConfig`);
/// `on_epoch(record)` is called after each committed epoch. Returns the run record.
#[pyfunction]
#[pyo3(signature = (store, run_dir, config, fresh=false, progress=None, on_epoch=None))]
fn embed_train(
    py: Python<'_>,
    store: PathBuf,
    run_dir: PathBuf,
    config: &Bound<'_, PyAny>,
    fresh: bool,
    progress: Option<Py<PyAny>>,
    on_epoch: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let cfg: TrainConfig = section(config)?;
    let callback_error = CallbackError::default();
    let result = run(py, progress, |p| {
        train(&store, &run_dir, cfg, fresh, p, &mut |record| {
            if let Some(cb) = &on_epoch {
                callback_error.call(cb, record);
            }
        })
    });
    callback_error.or(result)
}

/// Evaluates a checkpoint of the run in `run_dir` with `options` (the `[embed.eval]`
/// section's, checked as it).
#[pyfunction]
#[pyo3(signature = (run_dir, options, progress=None))]
fn embed_eval(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: EvalOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, o.threads, p)?;
        let metrics = l.evaluate(o.split.name(), o.protocol.protocol(), o.max_queries, p)?;
        Ok::<_, EmbedError>(serde_json::json!({"epoch": l.epoch, "metrics": metrics}))
    })
}

/// The best answers of the query in `options` (the `[embed.predict]` section's, checked as
/// it): tails of `(head, relation, ?)` or heads of `(?, relation, tail)`.
#[pyfunction]
#[pyo3(signature = (run_dir, options, progress=None))]
fn embed_predict(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: PredictOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    let (node, predict_heads) = o.query().map_err(|e| config_error(py, &e.to_string()))?;
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, 0, p)?;
        let src = l.node_id(node)?;
        let rel = match &o.relation {
            Some(r) => l.relation_id(r)?,
            None if l.run.meta.num_relations > 1 => {
                return Err(EmbedError::Config(format!(
                    "the store has {} relation types: give --relation",
                    l.run.meta.num_relations
                )))
            }
            None => 0,
        };
        let predictions = l.predict(src, rel, predict_heads, o.top, o.exclude_known, p)?;
        Ok(
            serde_json::json!({"epoch": l.epoch, "node": src, "relation": rel, "predictions": predictions}),
        )
    })
}

/// Exports a checkpoint of the run in `run_dir` with `options` (the `[embed.export]`
/// section's, checked as it).
#[pyfunction]
#[pyo3(signature = (run_dir, options, progress=None))]
fn embed_export(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ExportOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, 0, p)?;
        export(&mut l, &o.out, o.format, o.overwrite, p)
    })
}

/// The run record (`run.json`) of `run_dir`, checked.
#[pyfunction]
fn embed_run_info(py: Python<'_>, run_dir: PathBuf) -> PyResult<Py<PyAny>> {
    let meta = py
        .detach(|| Run::open(&run_dir).map(|r| r.meta))
        .map_err(|e| e.to_py(py))?;
    Ok(pythonize(py, &meta)?.unbind())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(embed_plan, m)?)?;
    m.add_function(wrap_pyfunction!(embed_train, m)?)?;
    m.add_function(wrap_pyfunction!(embed_eval, m)?)?;
    m.add_function(wrap_pyfunction!(embed_predict, m)?)?;
    m.add_function(wrap_pyfunction!(embed_export, m)?)?;
    m.add_function(wrap_pyfunction!(embed_run_info, m)?)?;
    Ok(())
}
