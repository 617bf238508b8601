//! Embedding training from Python.

use pyo3::prelude::*;
use pythonize::pythonize;
use strata_embed::ordering::{schedule, OrderingKind};

use std::path::PathBuf;

use strata_embed::config::{Protocol, TrainConfig};
use strata_embed::error::EmbedError;
use strata_embed::export::{export, ExportFormat};
use strata_embed::job::train;
use strata_embed::query::Loaded;
use strata_embed::run_dir::{Run, Which};

use crate::callback::CallbackError;
use crate::config::section;
use crate::errors::{config_error, ToPyErr};
use crate::{job, run};

/// The epoch schedule of `ordering` (a registered name: `OrderingKind::names`) for `partitions` and a
/// buffer of `capacity`, with its load and overlap figures.
#[pyfunction]
fn embed_plan(
    py: Python<'_>,
    ordering: &str,
    partitions: usize,
    capacity: usize,
) -> PyResult<Py<PyAny>> {
    let kind: OrderingKind = ordering
        .parse()
        .map_err(|e| config_error(py, &format!("embed.plan.ordering: {e}")))?;
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

fn which(py: Python<'_>, checkpoint: &str) -> PyResult<Which> {
    match checkpoint {
        "best" => Ok(Which::Best),
        "last" => Ok(Which::Last),
        other => Err(config_error(
            py,
            &format!("checkpoint must be 'best' or 'last', got '{other}'"),
        )),
    }
}

/// Evaluates `split` on a checkpoint of the run in `run_dir`.
#[pyfunction]
#[pyo3(signature = (run_dir, split="test", checkpoint="best", protocol=None, max_queries=0, memory=0, threads=0, progress=None))]
#[allow(clippy::too_many_arguments)]
fn embed_eval(
    py: Python<'_>,
    run_dir: PathBuf,
    split: &str,
    checkpoint: &str,
    protocol: Option<&Bound<'_, PyAny>>,
    max_queries: usize,
    memory: u64,
    threads: usize,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let which = which(py, checkpoint)?;
    let protocol: Option<Protocol> = protocol.map(job).transpose()?;
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, which, memory, threads, p)?;
        let metrics = l.evaluate(split, protocol, max_queries, p)?;
        Ok::<_, EmbedError>(serde_json::json!({"epoch": l.epoch, "metrics": metrics}))
    })
}

/// The `top` best answers of `(node, relation, ?)` (or `(?, relation, node)` with `head`).
#[pyfunction]
#[pyo3(signature = (run_dir, node, relation=None, head=false, top=10, exclude_known=false, checkpoint="best", memory=0, progress=None))]
#[allow(clippy::too_many_arguments)]
fn embed_predict(
    py: Python<'_>,
    run_dir: PathBuf,
    node: &str,
    relation: Option<&str>,
    head: bool,
    top: usize,
    exclude_known: bool,
    checkpoint: &str,
    memory: u64,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let which = which(py, checkpoint)?;
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, which, memory, 0, p)?;
        let src = l.node_id(node)?;
        let rel = match relation {
            Some(r) => l.relation_id(r)?,
            None if l.run.meta.num_relations > 1 => {
                return Err(EmbedError::Config(format!(
                    "the store has {} relation types: give --relation",
                    l.run.meta.num_relations
                )))
            }
            None => 0,
        };
        let predictions = l.predict(src, rel, head, top, exclude_known, p)?;
        Ok(
            serde_json::json!({"epoch": l.epoch, "node": src, "relation": rel, "predictions": predictions}),
        )
    })
}

/// Exports a checkpoint to directory `out` as `npy` or `tsv`.
#[pyfunction]
#[pyo3(signature = (run_dir, out, format="npy", checkpoint="best", overwrite=false, memory=0, progress=None))]
#[allow(clippy::too_many_arguments)]
fn embed_export(
    py: Python<'_>,
    run_dir: PathBuf,
    out: PathBuf,
    format: &str,
    checkpoint: &str,
    overwrite: bool,
    memory: u64,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let which = which(py, checkpoint)?;
    let format = match format {
        "npy" => ExportFormat::Npy,
        "tsv" => ExportFormat::Tsv,
        other => {
            return Err(config_error(
                py,
                &format!("format must be 'npy' or 'tsv', got '{other}'"),
            ))
        }
    };
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, which, memory, 0, p)?;
        export(&mut l, &out, format, overwrite, p)
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
