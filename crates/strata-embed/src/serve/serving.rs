//! A trained run as the service's embedding backend (`strata_graph::embedding_run`): a copy
//! of one checkpoint, opened with a planned resident set ([`budget::plan_queries`]), answering
//! top-k, score and neighbour queries with the same code as `strata embed predict`, `score`
//! and `neighbors` ([`Loaded::predict_many`], [`score_ids`], [`neighbors`]).

use std::path::Path;

use strata_graph::embedding_run::{
    EmbeddingBackend, EmbeddingError, EmbeddingResult, EmbeddingRun, LinkQuery, Ranked, RunInfo,
};
use strata_io::progress::Progress;
use strata_store::strtab::NameTable;
use strata_store::Store;

use crate::config::Which;
use crate::error::{io_err, EmbedError, Result};
use crate::eval::Query;
use crate::plan::budget::{self, EmbedPlan, ServedTable};
use crate::run::loaded::{name_of, Loaded};
use crate::run::run_dir::{Checkpoint, Run};
use crate::serve::neighbors::{neighbors, Metric};
use crate::serve::score::score_ids;
use crate::storage::entity_types::node_shape;

/// The table file of a snapshot (its only checkpoint).
const SNAPSHOT_TABLE: &str = "table-0.bin";

/// Trained runs served by `strata serve`.
pub struct Backend;

/// An embedding error of the service's kinds: configuration errors are the caller's
/// (`InvalidArgument`), budget refusals `Budget`, the rest failures naming their file.
fn kind(e: EmbedError) -> EmbeddingError {
    match e {
        EmbedError::Config(m) => EmbeddingError::InvalidArgument(m),
        EmbedError::Budget(m) => EmbeddingError::Budget(m),
        EmbedError::Cancelled => EmbeddingError::Cancelled,
        other => EmbeddingError::Failed(other.to_string()),
    }
}

/// Checkpoint `best` or `last`.
fn which(name: &str) -> EmbeddingResult<Which> {
    match name {
        "" | "best" => Ok(Which::Best),
        "last" => Ok(Which::Last),
        other => Err(EmbeddingError::InvalidArgument(format!(
            "checkpoint: expected 'best' or 'last', got '{other}'"
        ))),
    }
}

/// The plan of serving `run` with `memory` bytes (`None`: the whole table resident); a typed
/// run's pinned region is always resident.
fn query_plan(run: &Run, store: &Store, memory: Option<u64>) -> Result<EmbedPlan> {
    let model = run.meta.model();
    let mut cfg = run.meta.config.clone();
    cfg.partitions = run.meta.partitioning.partitions;
    let shape = node_shape(store, &cfg)?;
    let layout = &run.meta.layout;
    budget::plan_queries(
        ServedTable {
            partitions: cfg.partitions,
            part_bytes: layout.part_bytes(),
            table_bytes: layout.table_bytes(cfg.partitions),
            pinned_rows: shape.pinned_rows,
            pinned_bytes: shape.pinned_bytes(model.dim, cfg.optimizer, cfg.table_dtype),
        },
        budget::relation_bytes(&cfg, &model, run.meta.num_relations),
        memory,
    )
}

/// Copies checkpoint `which` of the run at `source` into the new directory `dest`: its table
/// file (as `table-0.bin`), its relation files and a `run.json` whose current and best
/// checkpoints are both that one. Every file is synced before `run.json` names it.
pub fn snapshot(source: &Path, which: Which, dest: &Path) -> Result<()> {
    let run = Run::open_whole(source)?;
    let ckpt = run.checkpoint(which).clone();
    std::fs::create_dir(dest).map_err(|e| io_err("mkdir", dest, e))?;
    let copy = |from: &Path, name: &str| -> Result<()> {
        let to = dest.join(name);
        std::fs::copy(from, &to).map_err(|e| io_err("copy", from, e))?;
        std::fs::File::open(&to)
            .and_then(|f| f.sync_all())
            .map_err(|e| io_err("fsync", &to, e))
    };
    copy(&run.table_path(&ckpt.table), SNAPSHOT_TABLE)?;
    let (params, state) = run.relation_paths(ckpt.epoch);
    for path in [&params, &state] {
        let name = path.file_name().expect("a file name").to_string_lossy();
        copy(path, &name)?;
    }
    let mut meta = run.meta.clone();
    let only = Checkpoint {
        epoch: ckpt.epoch,
        table: SNAPSHOT_TABLE.into(),
    };
    meta.current = only.clone();
    meta.best = only;
    Run {
        dir: dest.to_path_buf(),
        meta,
    }
    .commit()
}

impl EmbeddingBackend for Backend {
    fn snapshot(&self, source: &Path, checkpoint: &str, dest: &Path) -> EmbeddingResult<()> {
        snapshot(source, which(checkpoint)?, dest).map_err(kind)
    }

    fn resident_bytes(&self, dir: &Path, memory: Option<u64>) -> EmbeddingResult<u64> {
        let run = Run::open_whole(dir).map_err(kind)?;
        let store = run.store().map_err(kind)?;
        Ok(query_plan(&run, &store, memory).map_err(kind)?.memory)
    }

    fn open(&self, dir: &Path, memory: Option<u64>) -> EmbeddingResult<Box<dyn EmbeddingRun>> {
        let loaded = Loaded::open_planned(dir, Which::Best, |run, store, _, _| {
            query_plan(run, store, memory)
        })
        .map_err(kind)?;
        let names = loaded.node_names().map_err(kind)?;
        let meta = &loaded.run.meta;
        let info = RunInfo {
            store: meta.store.display().to_string(),
            epoch: loaded.epoch as u64,
            model: meta.config.model.name().to_string(),
            dim: loaded.model.dim as u64,
            num_nodes: meta.num_nodes,
            num_relations: meta.num_relations,
            partitions: meta.partitioning.partitions as u64,
            resident_partitions: loaded.plan.capacity as u64,
            table_bytes: loaded.plan.table_bytes,
            resident_bytes: loaded.plan.memory,
        };
        Ok(Box::new(Served {
            loaded,
            names,
            info,
        }))
    }
}

/// An opened snapshot.
struct Served {
    loaded: Loaded,
    names: Option<NameTable>,
    info: RunInfo,
}

impl Served {
    /// Refuses node ids at or past the run's node count, naming `field[i]`.
    fn check_nodes(&self, field: &str, ids: impl Iterator<Item = u64>) -> EmbeddingResult<()> {
        let n = self.info.num_nodes;
        for (i, v) in ids.enumerate() {
            if v >= n {
                return Err(EmbeddingError::InvalidArgument(format!(
                    "{field}[{i}]: node id {v} is out of range: the run has {n} nodes"
                )));
            }
        }
        Ok(())
    }

    /// Refuses relation ids at or past the run's relation count, naming `field[i]`.
    fn check_relations(&self, field: &str, ids: impl Iterator<Item = u32>) -> EmbeddingResult<()> {
        let count = self.info.num_relations.max(1);
        for (i, r) in ids.enumerate() {
            if r as u64 >= count {
                return Err(EmbeddingError::InvalidArgument(format!(
                    "{field}[{i}]: relation id {r} is out of range: the run has {count} relation types"
                )));
            }
        }
        Ok(())
    }
}

/// An unknown name is the caller's `NotFound`, named by its place in the request.
fn not_found(field: &str, i: usize, e: EmbedError) -> EmbeddingError {
    match e {
        EmbedError::Config(m) => EmbeddingError::NotFound(format!("{field}[{i}]: {m}")),
        other => kind(other),
    }
}

impl EmbeddingRun for Served {
    fn info(&self) -> &RunInfo {
        &self.info
    }

    fn node_ids(&self, field: &str, names: &[String]) -> EmbeddingResult<Vec<u64>> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| self.loaded.node_id(n).map_err(|e| not_found(field, i, e)))
            .collect()
    }

    fn relation_ids(&self, names: &[String]) -> EmbeddingResult<Vec<u32>> {
        names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                self.loaded
                    .relation_id(n)
                    .map_err(|e| not_found("relations", i, e))
            })
            .collect()
    }

    fn node_names(&self, ids: &[u64]) -> EmbeddingResult<Vec<String>> {
        self.check_nodes("ids", ids.iter().copied())?;
        ids.iter()
            .map(|&v| name_of(self.names.as_ref(), v).map_err(kind))
            .collect()
    }

    fn top_k(
        &mut self,
        queries: &[LinkQuery],
        k: usize,
        filtered: bool,
        progress: &dyn Progress,
    ) -> EmbeddingResult<Vec<Vec<Ranked>>> {
        self.check_nodes("nodes", queries.iter().map(|q| q.node))?;
        self.check_relations("relations", queries.iter().map(|q| q.relation))?;
        let queries: Vec<Query> = queries
            .iter()
            .map(|q| Query {
                src: q.node,
                rel: q.relation,
                answer: q.node,
                head: q.head,
            })
            .collect();
        let lists = self
            .loaded
            .predict_many(&queries, k, filtered, progress)
            .map_err(kind)?;
        Ok(lists
            .into_iter()
            .map(|list| {
                list.into_iter()
                    .map(|(score, node, known)| Ranked { node, score, known })
                    .collect()
            })
            .collect())
    }

    fn score(
        &mut self,
        triples: &[(u64, u32, u64)],
        _progress: &dyn Progress,
    ) -> EmbeddingResult<Vec<f32>> {
        self.check_nodes("heads", triples.iter().map(|t| t.0))?;
        self.check_relations("relations", triples.iter().map(|t| t.1))?;
        self.check_nodes("tails", triples.iter().map(|t| t.2))?;
        score_ids(&mut self.loaded, triples).map_err(kind)
    }

    fn neighbors(
        &mut self,
        nodes: &[u64],
        k: usize,
        metric: &str,
        any_type: bool,
        progress: &dyn Progress,
    ) -> EmbeddingResult<(String, Vec<Vec<Ranked>>)> {
        self.check_nodes("nodes", nodes.iter().copied())?;
        let metric: Metric = serde_json::from_value(serde_json::Value::String(metric.into()))
            .map_err(|_| {
                EmbeddingError::InvalidArgument(format!(
                    "metric: expected model, cos, dot or l2, got '{metric}'"
                ))
            })?;
        let report =
            neighbors(&mut self.loaded, nodes, k, metric, any_type, progress).map_err(kind)?;
        let lists = report
            .results
            .into_iter()
            .map(|r| {
                r.neighbors
                    .into_iter()
                    .map(|n| Ranked {
                        node: n.node,
                        score: n.score,
                        known: false,
                    })
                    .collect()
            })
            .collect();
        Ok((report.metric.to_string(), lists))
    }
}
