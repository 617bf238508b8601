//! Using a trained run: evaluation of a checkpoint and top-k link prediction, within a memory
//! budget (partitions are scanned through the buffer when the table does not fit).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::Path;

use serde::Serialize;
use strata_io::progress::{Meter, Progress};
use strata_io::Engine;
use strata_store::config::Size;
use strata_store::strtab::NameTable;
use strata_store::Store;

use crate::config::{Protocol, TrainConfig, Which};
use crate::error::{EmbedError, Result};
use crate::eval::{known_answers, EvalSet, Metrics, Query, Scorer};
use crate::model::{score_candidates, ScoreBatch, ScoreModel, Scratch};
use crate::plan::budget::{self, EmbedPlan};
use crate::run::run_dir::Run;
use crate::storage::buffer::PartitionBuffer;
use crate::storage::entity_types::{load_bags, node_shape, relation_types};
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;
use crate::train::job::eval_spec;
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
    /// run's own) and `threads` threads (0: the run's own), planned as training would plan it
    /// (the plan's lines go to `progress`).
    pub fn open(
        dir: &Path,
        which: Which,
        memory: u64,
        threads: usize,
        progress: &dyn Progress,
    ) -> Result<Loaded> {
        Loaded::open_planned(dir, which, |run, store, cfg, model| {
            if memory > 0 {
                cfg.memory = Size(memory);
            }
            if threads > 0 {
                cfg.threads = threads;
            }
            let shape = node_shape(store, cfg)?;
            let plan = budget::plan_fitting(cfg, model, &shape, run.meta.num_relations, None)?;
            plan.memory_plan()
                .describe()
                .iter()
                .for_each(|l| progress.message(l));
            Ok(plan)
        })
    }

    /// Opens checkpoint `which` of the run in `dir` with the plan `plan` makes from the run,
    /// its store, its config (which it may change) and its model; the buffer gets the plan's
    /// capacity (and a typed run's pinned region a slot of its own).
    pub fn open_planned(
        dir: &Path,
        which: Which,
        plan: impl FnOnce(&Run, &Store, &mut TrainConfig, &ScoreModel) -> Result<EmbedPlan>,
    ) -> Result<Loaded> {
        let run = Run::open_whole(dir)?;
        let store = run.store()?;
        let mut cfg = run.meta.config.clone();
        cfg.partitions = run.meta.partitioning.partitions;
        let model = run.meta.model();
        let plan = plan(&run, &store, &mut cfg, &model)?;
        let ckpt = run.checkpoint(which).clone();
        let relations = run.relations(&ckpt)?;
        let engine = Engine::shared();
        let mut buffer = PartitionBuffer::new(engine.clone(), run.meta.layout, plan.capacity);
        let table = TableFile::open(&engine, &run.table_path(&ckpt.table), false)?;
        // A typed run's pinned region is held from the start, as in training (its featurized
        // entities are read through their features).
        if let Some(layout) = run.meta.partitioning.typed_layout() {
            buffer.set_bags(load_bags(&store, &layout)?);
        }
        if let Some(pinned) = run.meta.partitioning.pinned() {
            buffer.load(0, pinned, &table)?;
        }
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
        let rel_types = self.answer_types();
        let mut scorer = Scorer {
            model: self.model,
            relations: &self.relations,
            partitioning: &self.run.meta.partitioning,
            buffer: &mut self.buffer,
            load: &mut |b, slot, p| b.load(slot, p, &self.table),
            rel_types,
        };
        scorer.evaluate(&set, &spec, progress)
    }

    /// A typed run's relation types when its evaluation and predictions rank answers
    /// against their own type (`typed_eval`).
    pub fn answer_types(&self) -> Option<Vec<(usize, usize)>> {
        (self.cfg.typed_eval && self.run.meta.partitioning.types.is_some())
            .then(|| relation_types(&self.store))
    }

    /// Bytes the budget leaves beside the partition buffer for a query's own arrays: what
    /// training would give to edges, evaluation and workers, plus what the plan leaves unused,
    /// less the widened tile of candidates a scan of a bf16 table holds.
    pub fn spare_bytes(&self) -> u64 {
        (self.plan.memory.saturating_sub(self.plan.total())
            + self.plan.eval_bytes
            + self.plan.edge_bytes
            + self.plan.worker_bytes)
            .saturating_sub(budget::widened_tile_bytes(
                self.cfg.table_dtype,
                self.model.dim,
            ))
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
        let mut lists = self.predict_many(&[query], k, exclude_known, progress)?;
        let names = self.node_names()?;
        lists
            .pop()
            .expect("one list per query")
            .into_iter()
            .map(|(score, node, known)| {
                Ok(Prediction {
                    node,
                    name: name_of(names.as_ref(), node)?,
                    score,
                    known,
                })
            })
            .collect()
    }

    /// [`Loaded::predict`] for many queries (`answer` unused), without names: per query its
    /// `k` best `(score, node, known)`, best first (ties: lower id first). Queries share scans
    /// of the table, as many in one scan as the budget's spare bytes hold (a tile of scores, a
    /// heap, the query's rows); the rest in further scans. In a typed run with `typed_eval`
    /// each query is answered with entities of its relation's type at the answer's end, so
    /// queries share a scan only with queries of the same answer type. Ids must be in range.
    pub fn predict_many(
        &mut self,
        queries: &[Query],
        k: usize,
        exclude_known: bool,
        progress: &dyn Progress,
    ) -> Result<Vec<Vec<(f32, u64, bool)>>> {
        let known = known_answers(&self.store, queries, progress)?;
        let (d, rd) = (self.model.dim, self.model.rel_dim());
        let tile = crate::sizes::TILE;
        let per_query = ((d + rd + tile) * 4 + (k + 1) * 16) as u64;
        let per_scan = (self.spare_bytes() / per_query).max(1) as usize;
        let types = self.answer_types();
        let answer_type = |q: &Query| {
            types.as_ref().map(|t| {
                let (src, dst) = t[q.rel as usize];
                if q.head {
                    src
                } else {
                    dst
                }
            })
        };
        let groups = scan_groups(queries.len(), |i| answer_type(&queries[i]), per_scan);
        let scans = groups.len() as u64;
        let n = self.run.meta.num_nodes;
        let mut meter = Meter::new(progress, "predict", scans * n * d as u64 * 4, scans * n);
        let mut lists = vec![Vec::new(); queries.len()];
        for indices in &groups {
            let group: Vec<&Query> = indices.iter().map(|&i| &queries[i]).collect();
            let nodes: Vec<u64> = group.iter().map(|q| q.src).collect();
            let src_rows = single_rows(self, &nodes)?;
            let mut rel_rows = vec![0.0f32; group.len() * rd];
            if rd > 0 {
                for (q, row) in group.iter().zip(rel_rows.chunks_exact_mut(rd)) {
                    self.relations.query_row(&self.model, q.rel, q.head, row);
                }
            }
            let filters: Vec<&[u64]> = group
                .iter()
                .map(|q| {
                    known
                        .get(&(q.src, q.rel, q.head))
                        .map_or(&[][..], |v| &v[..])
                })
                .collect();
            let scan = Scan {
                src_rows: &src_rows,
                rel_rows: &rel_rows,
                filters: &filters,
                answer_type: answer_type(group[0]),
            };
            let best = self.scan_top(&scan, k, exclude_known, &mut meter)?;
            for (&i, list) in indices.iter().zip(best) {
                lists[i] = list;
            }
        }
        meter.finish()?;
        Ok(lists)
    }

    /// One scan of every partition for the queries of `scan`: per query its `k` best
    /// `(score, node, known)`, best first, `known` from its sorted filter list (left out with
    /// `exclude_known`); only entities of the scan's answer type are candidates.
    fn scan_top(
        &mut self,
        scan: &Scan,
        k: usize,
        exclude_known: bool,
        meter: &mut Meter,
    ) -> Result<Vec<Vec<(f32, u64, bool)>>> {
        let d = self.model.dim;
        let b = scan.filters.len();
        let model = self.model;
        let partitioning = self.run.meta.partitioning.clone();
        let locator = partitioning.locator();
        let mut heaps: Vec<Best> = (0..b).map(|_| Best::with_capacity(k + 1)).collect();
        let mut scratch = Scratch::default();
        let (mut out, mut widened) = (Vec::new(), Vec::new());
        let all = partitioning.regions();
        let typed = partitioning.typed_layout().zip(scan.answer_type);
        self.buffer.visit(&all, &self.table, |p, emb| {
            let size = partitioning.size_of(p) as usize;
            let rows = candidate_rows(&partitioning, typed.as_ref().map(|(l, t)| (l, *t)), p);
            for lo in rows.clone().step_by(crate::sizes::TILE) {
                let t = crate::sizes::TILE.min(rows.end - lo);
                out.resize(b * t, 0.0);
                score_candidates(
                    &model,
                    &ScoreBatch {
                        b,
                        n: t,
                        src: scan.src_rows,
                        rel: scan.rel_rows,
                        cands: emb.span(lo * d, t * d, &mut widened),
                    },
                    &mut out,
                    &mut scratch,
                );
                for (i, heap) in heaps.iter_mut().enumerate() {
                    for (j, &s) in out[i * t..(i + 1) * t].iter().enumerate() {
                        let node = locator.node(p, (lo + j) as u32);
                        if s.is_nan()
                            || (exclude_known && scan.filters[i].binary_search(&node).is_ok())
                        {
                            continue;
                        }
                        heap.push(Reverse((OrdF32(s), Reverse(node))));
                        if heap.len() > k {
                            heap.pop();
                        }
                    }
                }
            }
            meter.add(size as u64, (size * d * 4) as u64)?;
            Ok(())
        })?;
        Ok(heaps
            .into_iter()
            .zip(scan.filters)
            .map(|(heap, known)| {
                let mut best: Vec<(f32, u64, bool)> = heap
                    .into_iter()
                    .map(|Reverse((s, Reverse(n)))| (s.0, n, known.binary_search(&n).is_ok()))
                    .collect();
                best.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
                best
            })
            .collect())
    }
}

/// The queries of one scan of [`Loaded::scan_top`].
struct Scan<'a> {
    /// Their source rows (`b x dim`) and relation rows (`b x rel_dim`).
    src_rows: &'a [f32],
    rel_rows: &'a [f32],
    /// Per query its known answers, sorted.
    filters: &'a [&'a [u64]],
    /// The entity type of every answer (None: any node).
    answer_type: Option<usize>,
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

/// The embedding rows of `nodes` (`nodes.len() x dim`), each read on its own (from the buffer
/// when its partition is resident): a few query rows should not load, and so evict, whole
/// partitions that the scan then has to read again.
pub(crate) fn single_rows(l: &Loaded, nodes: &[u64]) -> Result<Vec<f32>> {
    let d = l.model.dim;
    let locator = l.run.meta.partitioning.locator();
    let engine = l.buffer.engine().clone();
    let mut rows = vec![0.0f32; nodes.len() * d];
    for (&v, out) in nodes.iter().zip(rows.chunks_exact_mut(d)) {
        let (p, local) = locator.locate(v);
        if l.buffer.slot_of(p).is_some() {
            let at = local as usize * d;
            l.buffer.embeddings(p).copy(at, out);
        } else {
            l.table
                .read_rows(&engine, &l.buffer.layout, p, local as u64, out)?;
        }
    }
    Ok(rows)
}

/// A min-heap of the best `(key, node)` seen, higher key better, lower node on ties.
pub(crate) type Best = BinaryHeap<Reverse<(OrdF32, Reverse<u64>)>>;

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

/// The name of node (or relation) `id`: from `names`, or the id itself without a table.
pub(crate) fn name_of(names: Option<&NameTable>, id: u64) -> Result<String> {
    match names {
        Some(t) => Ok(t.name(id as usize)?),
        None => Ok(id.to_string()),
    }
}

/// The id of `name` in name table `table` of `store`, or `name` as a number below `count`
/// when the store has no such table.
pub(crate) fn lookup(
    store: &Store,
    table: &str,
    name: &str,
    count: u64,
    what: &str,
) -> Result<u64> {
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

/// Query indices `0..n` in scan groups: grouped by `key` (a stable sort, so each key's queries
/// keep their order), each group at most `per_scan` long.
pub(crate) fn scan_groups<K: Ord>(
    n: usize,
    key: impl Fn(usize) -> K,
    per_scan: usize,
) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| key(i));
    order
        .chunk_by(|&i, &j| key(i) == key(j))
        .flat_map(|same| same.chunks(per_scan))
        .map(<[usize]>::to_vec)
        .collect()
}

/// The rows of region `p` a scan scores: `within`'s type section in a typed run, else all.
pub(crate) fn candidate_rows(
    partitioning: &crate::storage::partitioning::Partitioning,
    within: Option<(&crate::storage::entity_types::TypedLayout, usize)>,
    p: u32,
) -> std::ops::Range<usize> {
    match within {
        Some((layout, ty)) => {
            let s = layout.section(ty, p);
            s.start as usize..s.end as usize
        }
        None => 0..partitioning.size_of(p) as usize,
    }
}
