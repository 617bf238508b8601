//! Link-prediction evaluation: each edge `(h, r, t)` of a split asks two queries, `(h, r, ?)`
//! answered by `t` and `(t, r⁻¹, ?)` answered by `h` (with the relation itself when relations
//! are not reciprocal), and the answer's rank among candidates gives MRR, MR and Hits@k.
//!
//! - **filtered** (FB15k-237, WN18RR): every node is a candidate except the other known true
//!   answers of the same query in any split. Partitions are scanned one at a time, so the
//!   table need not fit in memory.
//! - **sampled** (large graphs, PyTorch-BigGraph and Marius): queries in batches share
//!   `N` uniform candidates and `N` degree-weighted ones (answers of the batch's queries,
//!   which appear in proportion to their degree); unfiltered.
//!
//! Ties count half: rank = 1 + (candidates scoring higher) + (candidates scoring equal) / 2.
//!
//! In a typed run (`typed_eval`) an answer is ranked against the entities of its own type
//! only (the relation's destination type for tail queries, its source type for head queries):
//! queries are evaluated grouped by that type, the filtered scan covers only the types' rows
//! of each region, and the sampled protocol draws its uniform candidates from the type.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::array::{decode_ints, RowReader, IO_CHUNK};
use strata_store::ids::IdCheck;
use strata_store::rng::{derive, Rng};
use strata_store::Store;

use crate::config::{Corrupt, Protocol};
use crate::error::{EmbedError, Result};
use crate::model::{score_candidates, ScoreBatch, ScoreModel, Scratch};
use crate::sizes::QUERY_BATCH;
use crate::storage::buffer::{Load, PartitionBuffer};
use crate::storage::entity_types::TypedLayout;
use crate::storage::partitioning::{Locator, Partitioning};
use crate::storage::relations::Relations;

pub mod device;
pub mod rank;

use rank::{rank_of, PartScan, Ranker, RoundRows, SampledCands};

/// How to evaluate.
#[derive(Debug, Clone)]
pub struct EvalSpec {
    pub protocol: Protocol,
    /// Uniform (and as many degree-weighted) candidates per batch of the sampled protocol.
    pub negatives: usize,
    /// Queries per sampled batch (they share candidates).
    pub batch: usize,
    /// Evaluate at most this many queries (0: all), a seeded sample of the split's edges.
    pub max_queries: usize,
    pub corrupt: Corrupt,
    pub seed: u64,
    pub threads: usize,
    /// Queries per round: each round gathers its rows in one scan of the table (bounds memory).
    pub round: usize,
}

/// Ranking metrics of one split.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Metrics {
    pub split: String,
    pub protocol: Protocol,
    pub queries: u64,
    pub mrr: f64,
    pub mr: f64,
    #[serde(rename = "hits@1")]
    pub hits_at_1: f64,
    #[serde(rename = "hits@3")]
    pub hits_at_3: f64,
    #[serde(rename = "hits@10")]
    pub hits_at_10: f64,
    /// MRR of tail queries `(h, r, ?)` and of head queries `(?, r, t)`.
    pub tail_mrr: Option<f64>,
    pub head_mrr: Option<f64>,
    pub seconds: f64,
}

impl Metrics {
    /// Metrics of ranks, with `head[i]` telling which direction query `i` was.
    pub fn from_ranks(
        split: &str,
        protocol: Protocol,
        ranks: &[f64],
        head: &[bool],
        seconds: f64,
    ) -> Metrics {
        let q = ranks.len().max(1) as f64;
        let hits = |k: f64| ranks.iter().filter(|&&r| r <= k).count() as f64 / q;
        let mrr_of = |want: bool| -> Option<f64> {
            let (sum, count) = ranks
                .iter()
                .zip(head)
                .filter(|(_, &h)| h == want)
                .fold((0.0, 0usize), |(s, c), (r, _)| (s + 1.0 / r, c + 1));
            (count > 0).then(|| sum / count as f64)
        };
        Metrics {
            split: split.to_string(),
            protocol,
            queries: ranks.len() as u64,
            mrr: ranks.iter().map(|r| 1.0 / r).sum::<f64>() / q,
            mr: ranks.iter().sum::<f64>() / q,
            hits_at_1: hits(1.0),
            hits_at_3: hits(3.0),
            hits_at_10: hits(10.0),
            tail_mrr: mrr_of(false),
            head_mrr: mrr_of(true),
            seconds,
        }
    }
}

/// One query `(src, rel, ?)` whose true answer is `answer`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    pub src: u64,
    /// Relation id (the inverse row is chosen by `head` and reciprocity).
    pub rel: u32,
    pub answer: u64,
    /// A head query `(?, r, t)`, asked as `(t, r⁻¹, ?)`.
    pub head: bool,
}

/// The `(src, rel, dst)` rows of `split` (relation 0 for stores without relation types).
pub fn read_triples(store: &Store, split: &str) -> Result<Vec<[u64; 3]>> {
    let name = format!("edges_{split}");
    let info = store
        .array(&name)
        .ok_or_else(|| {
            EmbedError::Config(format!(
                "store {} has no '{split}' split",
                store.path().display()
            ))
        })?
        .clone();
    let cols = info.shape[1] as usize;
    let mut out = Vec::with_capacity(info.shape[0] as usize);
    let mut reader = RowReader::open_array(store.path(), &info, IO_CHUNK)?;
    let mut ids = IdCheck::edges(store, &name)?;
    let mut vals = Vec::new();
    while let Some(bytes) = reader.next_batch()? {
        vals.clear();
        decode_ints(bytes, info.dtype, &mut vals);
        ids.check(&vals)?;
        out.extend(vals.chunks_exact(cols).map(|r| {
            [
                r[0] as u64,
                if cols == 3 { r[1] as u64 } else { 0 },
                r[cols - 1] as u64,
            ]
        }));
    }
    Ok(out)
}

/// The queries of `triples` in the directions `corrupt` asks (both for Bernoulli corruption,
/// which trains both), at most `max` (0: all) from a seeded sample of the triples.
pub fn make_queries(triples: &[[u64; 3]], corrupt: Corrupt, max: usize, seed: u64) -> Vec<Query> {
    let dirs: &[bool] = match corrupt {
        Corrupt::Both | Corrupt::Bernoulli => &[false, true],
        Corrupt::Tail => &[false],
        Corrupt::Head => &[true],
    };
    let mut picked: Vec<usize> = (0..triples.len()).collect();
    let want = if max == 0 {
        triples.len()
    } else {
        max.div_ceil(dirs.len()).min(triples.len())
    };
    if want < triples.len() {
        let mut rng = Rng::new(derive(seed, 0xe7a1));
        for i in 0..want {
            let j = i + rng.below((triples.len() - i) as u64) as usize;
            picked.swap(i, j);
        }
        picked.truncate(want);
        picked.sort_unstable();
    }
    let mut out = Vec::with_capacity(picked.len() * dirs.len());
    for &i in &picked {
        let [h, r, t] = triples[i];
        for &head in dirs {
            let (src, answer) = if head { (t, h) } else { (h, t) };
            out.push(Query {
                src,
                rel: r as u32,
                answer,
                head,
            });
        }
    }
    out
}

/// Known true answers of each query key `(src, rel, head)` over every split of the store, for
/// the keys of `queries` only (so memory follows the evaluated queries, not the graph).
pub fn known_answers(
    store: &Store,
    queries: &[Query],
    progress: &dyn Progress,
) -> Result<KnownAnswers> {
    let mut map: KnownAnswers = queries
        .iter()
        .map(|q| ((q.src, q.rel, q.head), Vec::new()))
        .collect();
    for split in ["train", "valid", "test"] {
        let name = format!("edges_{split}");
        let Some(info) = store.array(&name).cloned() else {
            continue;
        };
        let cols = info.shape[1] as usize;
        let mut meter = Meter::new(
            progress,
            &format!("filter {split}"),
            info.data_bytes(),
            info.shape[0],
        );
        let mut reader = RowReader::open_array(store.path(), &info, IO_CHUNK)?;
        let mut ids = IdCheck::edges(store, &name)?;
        let mut vals = Vec::new();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, info.dtype, &mut vals);
            ids.check(&vals)?;
            for row in vals.chunks_exact(cols) {
                let (h, r, t) = (
                    row[0] as u64,
                    if cols == 3 { row[1] as u32 } else { 0 },
                    row[cols - 1] as u64,
                );
                if let Some(v) = map.get_mut(&(h, r, false)) {
                    v.push(t);
                }
                if let Some(v) = map.get_mut(&(t, r, true)) {
                    v.push(h);
                }
            }
            meter.add((vals.len() / cols) as u64, bytes.len() as u64)?;
        }
        meter.finish()?;
    }
    for v in map.values_mut() {
        v.sort_unstable();
        v.dedup();
    }
    Ok(map)
}

/// What an evaluation needs to score: model, relations and where node rows live.
pub struct Scorer<'a> {
    pub model: ScoreModel,
    pub relations: &'a Relations,
    pub partitioning: &'a Partitioning,
    pub buffer: &'a mut PartitionBuffer,
    /// Brings a partition that is not resident into a slot: from the table file the
    /// buffer's slots mirror, or in owner mode from the partition's owner.
    pub load: &'a mut Load<'a>,
    /// A typed run ranking each answer against its own type: the (source, destination)
    /// entity types of each relation (None: against every node).
    pub rel_types: Option<Vec<(usize, usize)>>,
    /// Scores and counts every block of candidates: the CPU kernels or a device.
    pub ranker: &'a mut dyn Ranker,
}

/// The answer types of one round of a typed evaluation.
struct RoundTypes<'l> {
    layout: &'l TypedLayout,
    /// The entity type of each query's answer.
    answer: Vec<usize>,
}

/// Known true answers of query keys `(src, rel, head)`.
pub type KnownAnswers = HashMap<(u64, u32, bool), Vec<u64>>;

/// The candidates that do not compete with each query key `(src, rel, head)` of a filtered
/// evaluation (its known answers, the set's own answers among them), as sorted `partition <<
/// 32 | local row` keys of `partitioning`: made once per evaluation set, so that each
/// evaluation (every validation of a run) only looks its queries' keys up.
pub struct Excluded {
    pub partitioning: Partitioning,
    pub keys: HashMap<(u64, u32, bool), Vec<u64>>,
}

impl Excluded {
    /// `known` (for `queries`' keys) as keys of `partitioning`, each query's own answer
    /// included whether or not the store's splits hold it.
    pub fn new(
        queries: &[Query],
        mut known: KnownAnswers,
        partitioning: &Partitioning,
    ) -> Excluded {
        for q in queries {
            known
                .entry((q.src, q.rel, q.head))
                .or_default()
                .push(q.answer);
        }
        let locator = partitioning.locator();
        for answers in known.values_mut() {
            for v in answers.iter_mut() {
                let (p, l) = locator.locate(*v);
                *v = ((p as u64) << 32) | l as u64;
            }
            answers.sort_unstable();
            answers.dedup();
        }
        Excluded {
            partitioning: partitioning.clone(),
            keys: known,
        }
    }
}

/// The queries of one split and, for the filtered protocol, the candidates each query's
/// rank leaves out: built once and evaluated as often as needed (every validation of a run).
pub struct EvalSet {
    pub split: String,
    pub protocol: Protocol,
    pub queries: Vec<Query>,
    pub excluded: Option<Excluded>,
}

impl EvalSet {
    /// The queries of `split` under `spec` (and, when filtered, their known answers as keys
    /// of `partitioning`, the run's).
    pub fn new(
        store: &Store,
        split: &str,
        spec: &EvalSpec,
        partitioning: &Partitioning,
        progress: &dyn Progress,
    ) -> Result<EvalSet> {
        let triples = read_triples(store, split)?;
        let queries = make_queries(&triples, spec.corrupt, spec.max_queries, spec.seed);
        let excluded = match spec.protocol {
            Protocol::Filtered => {
                let known = known_answers(store, &queries, progress)?;
                Some(Excluded::new(&queries, known, partitioning))
            }
            Protocol::Sampled => None,
        };
        Ok(EvalSet {
            split: split.to_string(),
            protocol: spec.protocol,
            queries,
            excluded,
        })
    }
}

impl Scorer<'_> {
    /// Ranks the queries of `set` (with `spec`'s batches, threads and rounds).
    pub fn evaluate(
        &mut self,
        set: &EvalSet,
        spec: &EvalSpec,
        progress: &dyn Progress,
    ) -> Result<Metrics> {
        let start = Instant::now();
        let locator = self.partitioning.locator();
        let layout = self.partitioning.typed_layout();
        let rel_types = self.rel_types.clone();
        let typed = layout.as_ref().zip(rel_types.as_deref());
        let answer_type = |q: &Query| {
            typed.map(|(_, rel)| {
                let (src, dst) = rel[q.rel as usize];
                if q.head {
                    src
                } else {
                    dst
                }
            })
        };
        // A typed evaluation takes the queries grouped by answer type, so that a batch (and
        // the rows its scan covers) is mostly of one type.
        let mut order: Vec<usize> = (0..set.queries.len()).collect();
        order.sort_by_key(|&i| answer_type(&set.queries[i]));
        let queries: Vec<Query> = order.iter().map(|&i| set.queries[i]).collect();
        let mut ranks = vec![0.0; queries.len()];
        let mut meter = Meter::new(
            progress,
            &format!("eval {}", set.split),
            0,
            queries.len() as u64,
        );
        let per_round = spec.round.max(QUERY_BATCH);
        for (r, round) in queries.chunks(per_round).enumerate() {
            let types = typed.map(|(layout, _)| RoundTypes {
                layout,
                answer: round
                    .iter()
                    .map(|q| answer_type(q).expect("typed"))
                    .collect(),
            });
            let got = match &set.excluded {
                Some(excluded) => self.filtered_round(round, excluded, &locator, types.as_ref())?,
                None => self.sampled_round(
                    round,
                    &locator,
                    types.as_ref(),
                    spec,
                    derive(spec.seed, r as u64),
                )?,
            };
            for (k, rank) in got.into_iter().enumerate() {
                ranks[order[r * per_round + k]] = rank;
            }
            meter.add(round.len() as u64, 0)?;
        }
        meter.finish()?;
        let head: Vec<bool> = set.queries.iter().map(|q| q.head).collect();
        Ok(Metrics::from_ranks(
            &set.split,
            set.protocol,
            &ranks,
            &head,
            start.elapsed().as_secs_f64(),
        ))
    }

    /// Copies the embedding rows of `nodes` into `out` (`nodes.len() x dim`), scanning the
    /// partitions that hold them once.
    fn gather(&mut self, nodes: &[u64], locator: &Locator, out: &mut Vec<f32>) -> Result<()> {
        let d = self.model.dim;
        out.clear();
        out.resize(nodes.len() * d, 0.0);
        let mut located: Vec<(u32, u32, usize)> = nodes
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let (p, l) = locator.locate(v);
                (p, l, i)
            })
            .collect();
        located.sort_unstable();
        let mut parts: Vec<u32> = located.iter().map(|x| x.0).collect();
        parts.dedup();
        self.buffer.visit_with(&parts, self.load, |p, emb| {
            let lo = located.partition_point(|x| x.0 < p);
            for &(_, l, i) in located[lo..].iter().take_while(|x| x.0 == p) {
                emb.copy(l as usize * d, &mut out[i * d..(i + 1) * d]);
            }
            Ok(())
        })
    }

    /// Relation rows of the queries, the gathered source rows and the true answers' scores.
    fn prepare(&mut self, round: &[Query], locator: &Locator) -> Result<RoundRows> {
        let (d, rd) = (self.model.dim, self.model.rel_dim());
        let mut src = Vec::new();
        let mut ans = Vec::new();
        self.gather(
            &round.iter().map(|q| q.src).collect::<Vec<_>>(),
            locator,
            &mut src,
        )?;
        self.gather(
            &round.iter().map(|q| q.answer).collect::<Vec<_>>(),
            locator,
            &mut ans,
        )?;
        let mut rel = vec![0.0f32; round.len() * rd];
        if rd > 0 {
            for (i, q) in round.iter().enumerate() {
                self.relations.query_row(
                    &self.model,
                    q.rel,
                    q.head,
                    &mut rel[i * rd..(i + 1) * rd],
                );
            }
        }
        let mut scratch = Scratch::default();
        let mut true_score = vec![0.0f32; round.len()];
        for i in 0..round.len() {
            score_candidates(
                &self.model,
                &ScoreBatch {
                    b: 1,
                    n: 1,
                    src: &src[i * d..(i + 1) * d],
                    rel: &rel[i * rd..(i + 1) * rd],
                    cands: &ans[i * d..(i + 1) * d],
                },
                &mut true_score[i..i + 1],
                &mut scratch,
            );
        }
        Ok(RoundRows {
            src,
            rel,
            true_score,
        })
    }

    /// Filtered ranks of one round against every node, partition by partition.
    fn filtered_round(
        &mut self,
        round: &[Query],
        excluded: &Excluded,
        locator: &Locator,
        types: Option<&RoundTypes>,
    ) -> Result<Vec<f64>> {
        if excluded.partitioning != *self.partitioning {
            return Err(EmbedError::Config(format!(
                "evaluation of {} queries: their known answers were keyed for another partitioning of the nodes",
                round.len()
            )));
        }
        let rows = self.prepare(round, locator)?;
        let excluded: Vec<&[u64]> = round
            .iter()
            .map(|q| excluded.keys[&(q.src, q.rel, q.head)].as_slice())
            .collect();
        let mut counts = vec![(0u64, 0u64); round.len()];
        let all = self.partitioning.regions();
        let (model, partitioning) = (self.model, self.partitioning);
        let ranker = &mut *self.ranker;
        self.buffer.visit_with(&all, self.load, |p, emb| {
            let size = partitioning.size_of(p) as usize;
            // The rows each query ranks against here: its answer type's, or all of them.
            let ranges: Vec<std::ops::Range<usize>> = match types {
                Some(t) => t
                    .answer
                    .iter()
                    .map(|&ty| {
                        let s = t.layout.section(ty, p);
                        s.start as usize..s.end as usize
                    })
                    .collect(),
                None => vec![0..size; round.len()],
            };
            let part = PartScan {
                p,
                emb,
                ranges: &ranges,
                excluded: &excluded,
            };
            ranker.filtered(&model, &rows, &part, &mut counts)
        })?;
        Ok(counts.into_iter().map(|(g, e)| rank_of(g, e)).collect())
    }

    /// Sampled ranks of one round: batches of queries share uniform and degree-weighted candidates.
    fn sampled_round(
        &mut self,
        round: &[Query],
        locator: &Locator,
        types: Option<&RoundTypes>,
        spec: &EvalSpec,
        key: u64,
    ) -> Result<Vec<f64>> {
        let rows = self.prepare(round, locator)?;
        let batch = spec.batch.max(1);
        let n = spec.negatives.max(1);
        let num_nodes = self.partitioning.num_nodes;
        let mut cand_ids: Vec<u64> = Vec::with_capacity(round.len().div_ceil(batch) * 2 * n);
        for (b, qs) in round.chunks(batch).enumerate() {
            let mut rng = Rng::new(derive(key, b as u64));
            match types {
                // Uniform over the entities of the batch's answer types.
                Some(t) => {
                    let mut present: Vec<usize> =
                        t.answer[b * batch..b * batch + qs.len()].to_vec();
                    present.sort_unstable();
                    present.dedup();
                    let counts: Vec<u64> =
                        present.iter().map(|&ty| t.layout.types[ty].count).collect();
                    let total: u64 = counts.iter().sum();
                    cand_ids.extend((0..n).map(|_| {
                        let (mut w, mut k) = (rng.below(total.max(1)), 0);
                        while w >= counts[k] {
                            w -= counts[k];
                            k += 1;
                        }
                        t.layout.types[present[k]].first + w
                    }));
                }
                None => cand_ids.extend((0..n).map(|_| rng.below(num_nodes))),
            }
            cand_ids.extend((0..n).map(|_| qs[rng.below(qs.len() as u64) as usize].answer));
        }
        // Each candidate's type, where a batch mixes answer types (its queries skip the others).
        let cand_types: Option<Vec<usize>> =
            types.map(|t| cand_ids.iter().map(|&v| t.layout.type_of(v)).collect());
        let mut cands = Vec::new();
        self.gather(&cand_ids, locator, &mut cands)?;
        let answers: Vec<u64> = round.iter().map(|q| q.answer).collect();
        let cands = SampledCands {
            batch,
            per_batch: 2 * n,
            rows: &cands,
            ids: &cand_ids,
            answers: &answers,
            types: types
                .zip(cand_types.as_deref())
                .map(|(t, c)| (c, t.answer.as_slice())),
        };
        self.ranker.sampled(&self.model, &rows, &cands)
    }
}

#[cfg(test)]
mod tests;
