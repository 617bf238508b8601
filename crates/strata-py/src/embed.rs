//! Embedding training from Python.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyTuple};
use pythonize::pythonize;
use strata_embed::schedule;

use std::path::PathBuf;
use std::sync::Arc;

use strata_embed::{
    export_with, gather, neighbors, resolve_queries, score_file, score_named, train_group, Cluster,
    EmbedError, EvalOptions, ExportFormat, ExportOptions, GatherOptions, Grant, Loaded, Metric,
    NeighborsOptions, PartitionSource, PlanOptions, PredictOptions, RowSink, Run, ScoreOptions,
    TableFile, TableLayout, TrainConfig,
};
use strata_io::{AlignedBuf, Engine};

use crate::call::run;
use crate::callback::CallbackError;
use crate::config::section;
use crate::errors::{config_error, ToPyErr};

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

/// A distributed run's group as the engine sees it: calls into a Python object
/// (`strata.embed.dist.Group`) that speaks torch.distributed. Its first exception is kept, and
/// raised as itself once the job returns.
struct PyCluster<'a> {
    group: Py<PyAny>,
    rank: usize,
    world_size: usize,
    /// The group's `anon_bytes`: the process's RssAnon once torch and gloo started.
    anon_bytes: Option<u64>,
    error: &'a CallbackError,
}

/// `obj.method(*args(py))` with the GIL (see [`CallbackError::call_method`]); an exception
/// becomes `EmbedError::Group` with its message.
fn call_kept<T>(
    obj: &Py<PyAny>,
    error: &CallbackError,
    method: &str,
    args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
) -> strata_embed::Result<T>
where
    T: for<'a, 'py> FromPyObject<'a, 'py>,
{
    error
        .call_method(obj, method, args)
        .map_err(EmbedError::Group)
}

impl PyCluster<'_> {
    fn call<T>(
        &self,
        method: &str,
        args: impl for<'py> FnOnce(Python<'py>) -> PyResult<Bound<'py, PyTuple>>,
    ) -> strata_embed::Result<T>
    where
        T: for<'a, 'py> FromPyObject<'a, 'py>,
    {
        call_kept(&self.group, self.error, method, args)
    }
}

impl Cluster for PyCluster<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world_size(&self) -> usize {
        self.world_size
    }

    fn acquire(
        &mut self,
        epoch: usize,
        held: &[u32],
        partitions: u32,
        capacity: usize,
    ) -> strata_embed::Result<Grant> {
        let (kind, bucket, evict, written): (String, (u32, u32), Vec<u32>, Vec<u32>) = self
            .call("acquire", |py| {
                (epoch, held.to_vec(), partitions, capacity).into_pyobject(py)
            })?;
        match kind.as_str() {
            "bucket" => Ok(Grant::Bucket {
                bucket,
                evict,
                written,
            }),
            "wait" => Ok(Grant::Wait),
            "done" => Ok(Grant::Done),
            other => Err(EmbedError::Group(format!(
                "the scheduler answered '{other}' (bucket, wait or done expected)"
            ))),
        }
    }

    fn release(&mut self, epoch: usize, parts: &[u32]) -> strata_embed::Result<()> {
        self.call::<Py<PyAny>>("release", |py| (epoch, parts.to_vec()).into_pyobject(py))
            .map(drop)
    }

    fn sync(&mut self, values: &mut [f32], done: bool) -> strata_embed::Result<bool> {
        let bytes: &[u8] = bytemuck::cast_slice(values);
        let (summed, all_done): (Vec<u8>, bool) = self.call("sync", |py| {
            (PyBytes::new(py, bytes), done).into_pyobject(py)
        })?;
        if summed.len() != values.len() * 4 {
            return Err(EmbedError::Group(format!(
                "a relation round returned {} bytes for {} values",
                summed.len(),
                values.len()
            )));
        }
        for (v, b) in values.iter_mut().zip(summed.chunks_exact(4)) {
            *v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
        }
        Ok(all_done)
    }

    fn barrier(&mut self, what: &str) -> strata_embed::Result<()> {
        self.call::<Py<PyAny>>("barrier", |py| (what,).into_pyobject(py))
            .map(drop)
    }

    fn gather(&mut self, mine: String) -> strata_embed::Result<Vec<String>> {
        self.call("gather", |py| (mine,).into_pyobject(py))
    }

    fn broadcast(&mut self, text: String) -> strata_embed::Result<String> {
        self.call("broadcast", |py| (text,).into_pyobject(py))
    }

    fn traffic(&self) -> (u64, u64) {
        // A failure is kept and raised when the job returns; the figures read 0 meanwhile.
        self.call("traffic", |py| Ok(PyTuple::empty(py)))
            .unwrap_or((0, 0))
    }

    fn group_anon_bytes(&self) -> Option<u64> {
        self.anon_bytes
    }
}

/// One epoch's tables of this rank, handed to its owner server (`strata.embed.dist_owner`)
/// to answer the other ranks' reads and writes of the partitions it owns, through the I/O
/// engine. Valid until the next epoch's tables replace it.
#[pyclass(frozen)]
struct ServedTables {
    engine: Arc<Engine>,
    current: Arc<TableFile>,
    next: Arc<TableFile>,
    layout: TableLayout,
}

#[pymethods]
impl ServedTables {
    /// Bytes of one partition region (embeddings, then optimizer state, padded).
    #[getter]
    fn part_bytes(&self) -> u64 {
        self.layout.part_bytes()
    }

    /// Partition `p`'s region, from the epoch's output table when `written`, else from the
    /// committed one.
    fn read<'py>(
        &self,
        py: Python<'py>,
        p: u32,
        written: bool,
    ) -> PyResult<Bound<'py, PyByteArray>> {
        let n = self.layout.part_bytes() as usize;
        let mut buf = AlignedBuf::new(n);
        let table = if written { &self.next } else { &self.current };
        py.detach(|| table.read_partition(&self.engine, &self.layout, p, &mut buf))
            .map_err(|e| e.to_py(py))?;
        Ok(PyByteArray::new(py, buf.prefix(n)))
    }

    /// Writes `region` (one partition region) as partition `p` of the epoch's output table.
    fn write(&self, py: Python<'_>, p: u32, region: &[u8]) -> PyResult<()> {
        let n = self.layout.part_bytes() as usize;
        if region.len() != n {
            return Err(config_error(
                py,
                &format!(
                    "partition {p}: a region of {} bytes, expected {n}",
                    region.len()
                ),
            ));
        }
        let mut buf = AlignedBuf::new(n);
        buf.full_mut()[..n].copy_from_slice(region);
        py.detach(|| {
            self.next
                .write_partition(&self.engine, &self.layout, p, &mut buf)
        })
        .map_err(|e| e.to_py(py))
    }
}

/// Owner mode's partition transport as the engine sees it: calls into a Python object
/// (`strata.embed.dist_owner.Owners`) that moves regions over torch.distributed
/// point-to-point. Its first exception is kept, and raised as itself once the job returns.
struct PyPartitions<'a> {
    owners: Py<PyAny>,
    engine: Arc<Engine>,
    error: &'a CallbackError,
}

impl PartitionSource for PyPartitions<'_> {
    fn serve(
        &mut self,
        epoch: usize,
        current: &Arc<TableFile>,
        next: &Arc<TableFile>,
        layout: &TableLayout,
    ) -> strata_embed::Result<()> {
        let tables = ServedTables {
            engine: self.engine.clone(),
            current: current.clone(),
            next: next.clone(),
            layout: *layout,
        };
        call_kept::<Py<PyAny>>(&self.owners, self.error, "serve", |py| {
            (epoch, Bound::new(py, tables)?).into_pyobject(py)
        })
        .map(drop)
    }

    fn read(
        &mut self,
        epoch: usize,
        p: u32,
        written: bool,
        into: &mut [u8],
    ) -> strata_embed::Result<()> {
        let data: Py<PyBytes> = call_kept(&self.owners, self.error, "read", |py| {
            (epoch, p, written, into.len()).into_pyobject(py)
        })?;
        Python::attach(|py| {
            let bytes = data.as_bytes(py);
            if bytes.len() != into.len() {
                return Err(EmbedError::Group(format!(
                    "partition {p} arrived with {} bytes, expected {}",
                    bytes.len(),
                    into.len()
                )));
            }
            into.copy_from_slice(bytes);
            Ok(())
        })
    }

    fn write(&mut self, epoch: usize, p: u32, region: &[u8]) -> strata_embed::Result<()> {
        call_kept::<Py<PyAny>>(&self.owners, self.error, "write", |py| {
            (epoch, p, PyByteArray::new(py, region)).into_pyobject(py)
        })
        .map(drop)
    }

    fn traffic(&self) -> (u64, u64) {
        // As for the cluster: a failure is raised when the job returns.
        call_kept(&self.owners, self.error, "traffic", |py| {
            Ok(PyTuple::empty(py))
        })
        .unwrap_or((0, 0))
    }
}

/// Trains (or resumes) a run: `config` is the `embed.train` section
/// (`strata_embed::TrainConfig`);
/// `on_epoch(record)` is called after each committed epoch. Returns the run record. With
/// `group` (a `strata.embed.dist.Group`, whose `rank` and `world_size` it reads) this process
/// is one rank of a distributed run; with `owners` too (a `strata.embed.dist_owner.Owners`)
/// it runs in owner mode (`dist_storage = owners`).
#[pyfunction]
#[pyo3(signature = (store, run_dir, config, fresh=false, progress=None, on_epoch=None, group=None, owners=None))]
#[allow(clippy::too_many_arguments)]
fn embed_train(
    py: Python<'_>,
    store: PathBuf,
    run_dir: PathBuf,
    config: &Bound<'_, PyAny>,
    fresh: bool,
    progress: Option<Py<PyAny>>,
    on_epoch: Option<Py<PyAny>>,
    group: Option<Py<PyAny>>,
    owners: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let cfg: TrainConfig = section(config)?;
    let callback_error = CallbackError::default();
    let mut cluster = match group {
        Some(g) => {
            let rank: usize = g.getattr(py, "rank")?.extract(py)?;
            let world_size: usize = g.getattr(py, "world_size")?.extract(py)?;
            let anon_bytes: Option<u64> = g.getattr(py, "anon_bytes")?.extract(py)?;
            Some(PyCluster {
                group: g,
                rank,
                world_size,
                anon_bytes,
                error: &callback_error,
            })
        }
        None => None,
    };
    let mut peers = owners.map(|o| PyPartitions {
        owners: o,
        engine: Engine::shared(),
        error: &callback_error,
    });
    let result = run(py, progress, |p| {
        let cluster = cluster.as_mut().map(|c| c as &mut dyn Cluster);
        let peers = peers.as_mut().map(|o| o as &mut dyn PartitionSource);
        train_group(
            &store,
            &run_dir,
            cfg,
            fresh,
            cluster,
            peers,
            p,
            &mut |record| {
                if let Some(cb) = &on_epoch {
                    p.call_hook(cb, record);
                }
            },
        )
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
        let metrics = l.evaluate(
            o.split.name(),
            o.protocol.protocol(),
            o.max_queries,
            &o.device,
            p,
        )?;
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
        // The query's names are checked before the plan is shown.
        let mut l = Loaded::open_unsaid(&run_dir, o.checkpoint, memory, 0)?;
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
        l.say_plan(p);
        let predictions = l.predict(src, rel, predict_heads, o.top, o.exclude_known, p)?;
        Ok(
            serde_json::json!({"epoch": l.epoch, "node": src, "relation": rel, "predictions": predictions}),
        )
    })
}

/// Exports a checkpoint of the run in `run_dir` with `options` (the `[embed.export]`
/// section's, checked as it).
#[pyfunction]
#[pyo3(signature = (run_dir, options, progress=None, writer=None))]
fn embed_export(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
    writer: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ExportOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    if o.format == ExportFormat::Parquet && writer.is_none() {
        return Err(config_error(
            py,
            "embed.export.format: parquet needs a writer (strata.embed.Run.export passes one)",
        ));
    }
    let error = CallbackError::default();
    let result = run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, 0, p)?;
        let mut sink = writer.map(|w| PyRowSink {
            writer: w,
            error: &error,
        });
        export_with(
            &mut l,
            &o.out,
            o.format,
            o.overwrite,
            sink.as_mut().map(|s| s as &mut dyn RowSink),
            p,
        )
    });
    error.or(result)
}

/// Rows in id order handed to a Python writer (`strata.embed.parquet.Writer`): its `begin`,
/// `rows` (the floats as bytes) and `finish`; its first exception is raised as itself.
struct PyRowSink<'a> {
    writer: Py<PyAny>,
    error: &'a CallbackError,
}

impl RowSink for PyRowSink<'_> {
    fn begin(&mut self, path: &std::path::Path, dim: usize) -> strata_embed::Result<()> {
        let path = path.to_path_buf();
        self.error
            .call_method::<Py<PyAny>>(&self.writer, "begin", |py| (path, dim).into_pyobject(py))
            .map(drop)
            .map_err(EmbedError::Config)
    }

    fn rows(&mut self, first: u64, names: &[String], rows: &[f32]) -> strata_embed::Result<()> {
        self.error
            .call_method::<Py<PyAny>>(&self.writer, "rows", |py| {
                let bytes = PyBytes::new(py, bytemuck::cast_slice(rows));
                (first, names.to_vec(), bytes).into_pyobject(py)
            })
            .map(drop)
            .map_err(EmbedError::Config)
    }

    fn finish(&mut self) -> strata_embed::Result<()> {
        self.error
            .call_method::<Py<PyAny>>(&self.writer, "finish", |py| Ok(PyTuple::empty(py)))
            .map(drop)
            .map_err(EmbedError::Config)
    }
}

/// The nearest nodes of the query nodes in `options` (the `[embed.neighbors]` section's,
/// checked as it), by an exact scan of the table within the budget.
#[pyfunction]
#[pyo3(signature = (run_dir, options, progress=None))]
fn embed_neighbors(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: NeighborsOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    run(py, progress, |p| {
        let mut l = Loaded::open_unsaid(&run_dir, o.checkpoint, memory, 0)?;
        let queries = resolve_queries(&l, &o)?;
        l.say_plan(p);
        neighbors(&mut l, &queries, o.top, o.metric, o.any_type, p)
    })
}

/// Scores the triples of the file in `options` (the `[embed.score]` section's, checked as
/// it) into its `out` file, or standard output without one.
#[pyfunction]
#[pyo3(signature = (run_dir, options, progress=None))]
fn embed_score(
    py: Python<'_>,
    run_dir: PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ScoreOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, 0, p)?;
        score_file(&mut l, &o.input, o.out.as_deref(), p)
    })
}

/// Scores of `triples` (`(head, relation, tail)` names) by the run in `run_dir`, in order;
/// `options` as the `[embed.score]` section's (its `input` is not read: the triples are given).
#[pyfunction]
#[pyo3(signature = (run_dir, triples, options, progress=None))]
fn embed_score_triples(
    py: Python<'_>,
    run_dir: PathBuf,
    triples: Vec<[String; 3]>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ScoreOptions = section(options)?;
    let memory = o.memory.map_or(0, |m| m.0);
    run(py, progress, |p| {
        let mut l = Loaded::open(&run_dir, o.checkpoint, memory, 0, p)?;
        score_named(&mut l, &triples, &|i| format!("triple {i}"))
    })
}

/// Gathers an owner-mode run (`dirs`: every rank's directory, `RUN/rank-R`) into one run at
/// `out` with `options` (the `[embed.gather]` section's, checked as it; see
/// `strata_embed::gather`). Returns the gathered run's record.
#[pyfunction]
#[pyo3(signature = (out, dirs, options, progress=None))]
fn embed_gather(
    py: Python<'_>,
    out: PathBuf,
    dirs: Vec<PathBuf>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: GatherOptions = section(options)?;
    run(py, progress, |p| {
        gather(&dirs, &out, o.store.as_deref(), o.overwrite, p)
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

/// The metric `--metric model` stands for with `run_dir`'s score function
/// (`strata_embed::Metric::natural`): "cos", "dot" or "l2".
#[pyfunction]
fn embed_natural_metric(py: Python<'_>, run_dir: PathBuf) -> PyResult<&'static str> {
    let meta = py
        .detach(|| Run::open(&run_dir).map(|r| r.meta))
        .map_err(|e| e.to_py(py))?;
    Ok(Metric::natural(&meta.model()).name())
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(embed_plan, m)?)?;
    m.add_function(wrap_pyfunction!(embed_train, m)?)?;
    m.add_function(wrap_pyfunction!(embed_eval, m)?)?;
    m.add_function(wrap_pyfunction!(embed_predict, m)?)?;
    m.add_function(wrap_pyfunction!(embed_export, m)?)?;
    m.add_function(wrap_pyfunction!(embed_neighbors, m)?)?;
    m.add_function(wrap_pyfunction!(embed_score, m)?)?;
    m.add_function(wrap_pyfunction!(embed_score_triples, m)?)?;
    m.add_function(wrap_pyfunction!(embed_run_info, m)?)?;
    m.add_function(wrap_pyfunction!(embed_natural_metric, m)?)?;
    m.add_function(wrap_pyfunction!(embed_gather, m)?)?;
    Ok(())
}
