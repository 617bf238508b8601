//! Using a trained run: evaluation of a checkpoint and top-k link prediction, within a memory
//! budget (partitions are scanned through the buffer when the table does not fit).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use serde::Serialize;
use strata_io::progress::Progress;
use strata_io::Engine;
use strata_store::strtab::NameTable;
use strata_store::Store;

use crate::budget::{self, EmbedPlan};
use crate::buffer::PartitionBuffer;
use crate::config::{Protocol, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::eval::{known_answers, EvalSet, Metrics, Query, Scorer};
use crate::job::eval_spec;
use crate::model::{score_candidates, ScoreModel, Scratch};
use crate::relations::Relations;
use crate::run_dir::{Run, Which};
use crate::table::TableFile;
use strata_store::budget::Planned;

/// A checkpoint ready to score: store, relations, buffer and table file.
pub struct Loaded {
    pub run: Run,
    pub store: Store,
    pub cfg: TrainConfig,
    pub model: ScoreModel,
    pub plan: EmbedPlan,
    pub relations: Relations,
    pub buffer: PartitionBuffer,
    pub table: TableFile,
    pub epoch: usize,
}

impl Loaded {
    /// Opens checkpoint `which` of the run in `dir` with a budget of `memory` bytes (0: the
    /// run's own) and `threads` threads (0: the run's own).
    pub fn open(
        dir: &Path,
        which: Which,
        memory: u64,
        threads: usize,
        progress: &dyn Progress,
    ) -> Result<Loaded> {
        let run = Run::open(dir)?;
        if let (Some(rank), true) = (run.meta.owner_rank, run.meta.world_size > 1) {
            return Err(EmbedError::Config(format!(
                "{} is rank {rank}'s directory of an owner-mode run of {} ranks (dist_storage = owners) and holds only the partitions that rank owns; run `strata embed gather OUT` with every rank's directory (`{}/rank-*`), then use OUT",
                dir.display(),
                run.meta.world_size,
                dir.parent().unwrap_or(dir).display()
            )));
        }
        let store = run.store()?;
        let mut cfg = run.meta.config.clone();
        cfg.partitions = run.meta.partitioning.partitions;
        if memory > 0 {
            cfg.memory = memory;
        }
        if threads > 0 {
            cfg.threads = threads;
        }
        let model = run.meta.model();
        let plan = budget::plan_fitting(
            &cfg,
            &model,
            run.meta.num_nodes,
            run.meta.num_relations,
            None,
        )?;
        plan.memory_plan()
            .describe()
            .iter()
            .for_each(|l| progress.message(l));
        let ckpt = run.checkpoint(which).clone();
        let relations = run.relations(&ckpt)?;
        let engine = Engine::shared();
        let buffer = PartitionBuffer::new(engine.clone(), run.meta.layout, plan.capacity);
        let table = TableFile::open(&engine, &run.table_path(&ckpt.table), false)?;
        Ok(Loaded {
            store,
            cfg,
            model,
            plan,
            relations,
            buffer,
            table,
            epoch: ckpt.epoch,
            run,
        })
    }

    /// Evaluates `split` with `protocol` (default: the run's) on at most `max_queries` queries
    /// (0: the run's setting).
    pub fn evaluate(
        &mut self,
        split: &str,
        protocol: Option<Protocol>,
        max_queries: usize,
        progress: &dyn Progress,
    ) -> Result<Metrics> {
        let mut spec = eval_spec(&self.cfg, &self.plan, self.plan.threads);
        if let Some(p) = protocol {
            spec.protocol = p;
        }
        if max_queries > 0 {
            spec.max_queries = max_queries;
        }
        let set = EvalSet::new(&self.store, split, &spec, progress)?;
        let mut scorer = Scorer {
            model: self.model,
            relations: &self.relations,
            partitioning: &self.run.meta.partitioning,
            buffer: &mut self.buffer,
            load: &mut |b, slot, p| b.load(slot, p, &self.table),
        };
        scorer.evaluate(&set, &spec, progress)
    }

    /// Bytes the budget leaves beside the partition buffer for a query's own arrays: what
    /// training would give to edges, evaluation and workers, plus what the plan leaves unused.
    pub fn spare_bytes(&self) -> u64 {
        self.plan.memory.saturating_sub(self.plan.total())
            + self.plan.eval_bytes
            + self.plan.edge_bytes
            + self.plan.worker_bytes
    }

    /// The id of node `name` (a name from the store's id map, or a number when it has none).
    pub fn node_id(&self, name: &str) -> Result<u64> {
        lookup(
            &self.store,
            "node_names",
            name,
            self.run.meta.num_nodes,
            "node",
        )
    }

    /// The id of relation `name`.
    pub fn relation_id(&self, name: &str) -> Result<u32> {
        let count = self.run.meta.num_relations.max(1);
        lookup(&self.store, "relation_names", name, count, "relation").map(|r| r as u32)
    }

    /// The store's node names, if it has them.
    pub fn node_names(&self) -> Result<Option<NameTable>> {
        if self.store.manifest().graph.node_names {
            Ok(Some(NameTable::open(&self.store, "node_names")?))
        } else {
            Ok(None)
        }
    }

    /// The `k` best answers of `(src, rel, ?)` (tails) or, with `head`, of `(?, rel, src)`,
    /// best first. Known true answers from any split are marked, or left out with `exclude_known`.
    pub fn predict(
        &mut self,
        src: u64,
        rel: u32,
        head: bool,
        k: usize,
        exclude_known: bool,
        progress: &dyn Progress,
    ) -> Result<Vec<Prediction>> {
        let query = Query {
            src,
            rel,
            answer: src,
            head,
        };
        let known = known_answers(&self.store, &[query], progress)?
            .remove(&(src, rel, head))
            .unwrap_or_default();
        let (d, rd) = (self.model.dim, self.model.rel_dim());
        let locator = self.run.meta.partitioning.locator();
        let (p, l) = locator.locate(src);
        let mut src_row = vec![0.0f32; d];
        self.buffer.visit(&[p], &self.table, |_, emb| {
            emb.copy(l as usize * d, &mut src_row);
            Ok(())
        })?;
        let mut rel_row = vec![0.0f32; rd];
        if rd > 0 {
            self.relations
                .query_row(&self.model, rel, head, &mut rel_row);
        }
        let model = self.model;
        let partitioning = self.run.meta.partitioning.clone();
        let mut heap: BinaryHeap<Reverse<(OrdF32, u64)>> = BinaryHeap::with_capacity(k + 1);
        let mut scratch = Scratch::default();
        let (mut out, mut widened) = (Vec::new(), Vec::new());
        let all: Vec<u32> = (0..partitioning.partitions).collect();
        self.buffer.visit(&all, &self.table, |p, emb| {
            let size = partitioning.size_of(p) as usize;
            for lo in (0..size).step_by(crate::eval::TILE) {
                let t = crate::eval::TILE.min(size - lo);
                out.resize(t, 0.0);
                score_candidates(
                    &model,
                    1,
                    t,
                    &src_row,
                    &rel_row,
                    emb.span(lo * d, t * d, &mut widened),
                    &mut out,
                    &mut scratch,
                );
                for (j, &s) in out.iter().enumerate() {
                    let node = locator.node(p, (lo + j) as u32);
                    if s.is_nan() || (exclude_known && known.binary_search(&node).is_ok()) {
                        continue;
                    }
                    heap.push(Reverse((OrdF32(s), node)));
                    if heap.len() > k {
                        heap.pop();
                    }
                }
            }
            Ok(())
        })?;
        let names = self.node_names()?;
        let mut best: Vec<(f32, u64)> = heap.into_iter().map(|Reverse((s, n))| (s.0, n)).collect();
        best.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        best.into_iter()
            .map(|(score, node)| {
                Ok(Prediction {
                    node,
                    name: name_of(names.as_ref(), node)?,
                    score,
                    known: known.binary_search(&node).is_ok(),
                })
            })
            .collect()
    }
}

/// One predicted answer.
#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub node: u64,
    pub name: String,
    pub score: f32,
    /// The edge is in one of the store's splits.
    pub known: bool,
}

/// A float ordered by `total_cmp` (scores are never NaN here).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct OrdF32(pub(crate) f32);

impl Eq for OrdF32 {}

impl PartialOrd for OrdF32 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrdF32 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The id of `name` in name table `table` of `store`, or `name` as a number below `count`
/// when the store has no such table.
/// The name of node (or relation) `id`: from `names`, or the id itself without a table.
pub(crate) fn name_of(names: Option<&NameTable>, id: u64) -> Result<String> {
    match names {
        Some(t) => Ok(t.name(id as usize)?),
        None => Ok(id.to_string()),
    }
}

fn lookup(store: &Store, table: &str, name: &str, count: u64, what: &str) -> Result<u64> {
    let has_names = store.array(&format!("{table}_offsets")).is_some();
    if has_names {
        let t = NameTable::open(store, table)?;
        return t.find(name.as_bytes())?.ok_or_else(|| {
            EmbedError::Config(format!(
                "{what} '{name}' is not in store {} (names are case-sensitive)",
                store.path().display()
            ))
        });
    }
    match name.parse::<u64>() {
        Ok(id) if id < count => Ok(id),
        _ => Err(EmbedError::Config(format!(
            "store {} has no {what} names: give a {what} id between 0 and {}, got '{name}'",
            store.path().display(),
            count - 1
        ))),
    }
}
