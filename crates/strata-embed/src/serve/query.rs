//! Using a trained run: evaluation of a checkpoint and top-k link prediction, within a memory
//! budget (partitions are scanned through the buffer when the table does not fit).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use serde::Serialize;
use strata_io::progress::{Meter, Progress};

use crate::config::Protocol;
use crate::error::Result;
use crate::eval::device::ranker_for;
use crate::eval::{known_answers, EvalSet, Metrics, Query, Scorer};
use crate::model::{score_candidates, ScoreBatch, Scratch};
use crate::run::loaded::{name_of, Loaded};
use crate::train::job::eval_spec;

impl Loaded {
    /// Evaluates `split` with `protocol` (default: the run's) on at most `max_queries` queries
    /// (0: the run's setting), scoring on `device` (`cpu`: the CPU kernels; `torch-cpu`,
    /// `cuda`, `cuda:N`: the torch evaluator).
    pub fn evaluate(
        &mut self,
        split: &str,
        protocol: Option<Protocol>,
        max_queries: usize,
        device: &str,
        progress: &dyn Progress,
    ) -> Result<Metrics> {
        let mut spec = eval_spec(&self.cfg, &self.plan, self.plan.threads);
        if let Some(p) = protocol {
            spec.protocol = p;
        }
        if max_queries > 0 {
            spec.max_queries = max_queries;
        }
        let mut ranker = ranker_for(device, spec.threads)?;
        let nodes = &self.run.meta.partitioning;
        let set = EvalSet::new(&self.store, split, &spec, nodes, progress)?;
        let rel_types = self.answer_types();
        let mut scorer = Scorer {
            model: self.model,
            relations: &self.relations,
            partitioning: &self.run.meta.partitioning,
            buffer: &mut self.buffer,
            load: &mut |b, slot, p| b.load(slot, p, &self.table),
            rel_types,
            ranker: &mut *ranker,
        };
        scorer.evaluate(&set, &spec, progress)
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
        // No more answers than nodes, whatever `k` asks for: it sizes the heaps.
        let k = k.min(usize::try_from(self.run.meta.partitioning.num_nodes).unwrap_or(usize::MAX));
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
