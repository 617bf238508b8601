//! The evaluation's compute seam: every score the evaluator ranks by is computed through
//! [`Ranker`], which takes a round's prepared query rows and a block of candidates and counts,
//! per query, the candidates scoring above and equal to its true answer. [`CpuRanker`] is the
//! CPU kernels on the evaluator's threads; the device ranker (`eval::device`) hands the same
//! blocks to a torch device. Candidates, filters and the tie rule are the evaluator's and the
//! same for both: a ranker only scores and counts.

use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use crate::error::Result;
use crate::model::{score_candidates, ScoreBatch, ScoreModel, Scratch};
use crate::sizes::{QUERY_BATCH, TILE};
use crate::storage::table::Rows;

/// The queries of one round, prepared by the evaluator.
pub struct RoundRows {
    /// `q x dim` source rows.
    pub src: Vec<f32>,
    /// `q x rel_dim` relation rows, each already the row its query is scored with (the inverse
    /// row of a reciprocal head query, or the row reversed by the model).
    pub rel: Vec<f32>,
    /// `q` scores of the true answers.
    pub true_score: Vec<f32>,
}

/// One partition's rows as the candidates of a filtered round.
pub struct PartScan<'a> {
    pub p: u32,
    /// The partition's embedding rows (`dim` values each).
    pub emb: Rows<'a>,
    /// The local rows query `i` is ranked against (all of them, or its answer type's).
    pub ranges: &'a [Range<usize>],
    /// Each query's candidates that do not compete (its answer and the other known answers),
    /// as sorted `partition << 32 | local row` keys over every partition.
    pub excluded: &'a [&'a [u64]],
}

/// The candidates of a sampled round: the queries of batch `b` (`batch` queries each, the
/// last one shorter) are ranked against candidates `b * per_batch .. (b + 1) * per_batch`.
pub struct SampledCands<'a> {
    pub batch: usize,
    pub per_batch: usize,
    /// `candidates x dim` rows.
    pub rows: &'a [f32],
    /// Each candidate's node.
    pub ids: &'a [u64],
    /// Each query's answer: a candidate that is the answer does not compete with it.
    pub answers: &'a [u64],
    /// In a typed evaluation each candidate's type and each query's answer type: candidates
    /// of another type do not compete.
    pub types: Option<(&'a [usize], &'a [usize])>,
}

impl PartScan<'_> {
    /// Query `q`'s excluded candidates among this partition's local rows `rows`, as local
    /// rows, ascending.
    pub fn excluded_in(
        &self,
        q: usize,
        rows: Range<usize>,
    ) -> impl ExactSizeIterator<Item = usize> + '_ {
        let base = (self.p as u64) << 32;
        let (lo, hi) = (base | rows.start as u64, base | rows.end as u64);
        let ex = self.excluded[q];
        let first = ex.partition_point(|&k| k < lo);
        let end = first + ex[first..].partition_point(|&k| k < hi);
        ex[first..end].iter().map(move |&k| (k - base) as usize)
    }
}

impl SampledCands<'_> {
    /// Whether candidate `j` (of the round) does not compete with query `q`.
    pub fn excluded(&self, q: usize, j: usize) -> bool {
        self.ids[j] == self.answers[q] || self.types.is_some_and(|(c, a)| c[j] != a[q])
    }
}

/// Scores a round's queries against blocks of candidates and counts.
pub trait Ranker: Send {
    /// Adds to `counts[i]` the candidates of `part` in `part.ranges[i]`, excluded ones left
    /// out, scoring above and equal to query `i`'s true score.
    fn filtered(
        &mut self,
        model: &ScoreModel,
        rows: &RoundRows,
        part: &PartScan,
        counts: &mut [(u64, u64)],
    ) -> Result<()>;

    /// The ranks of a sampled round's queries (`1 + above + equal / 2`).
    fn sampled(
        &mut self,
        model: &ScoreModel,
        rows: &RoundRows,
        cands: &SampledCands,
    ) -> Result<Vec<f64>>;
}

/// The CPU kernels: query batches of [`QUERY_BATCH`] (filtered) or of the sampled batch
/// spread over `threads` threads, candidates scored [`TILE`] rows at a time.
pub struct CpuRanker {
    pub threads: usize,
}

impl Ranker for CpuRanker {
    fn filtered(
        &mut self,
        model: &ScoreModel,
        rows: &RoundRows,
        part: &PartScan,
        counts: &mut [(u64, u64)],
    ) -> Result<()> {
        let (d, rd) = (model.dim, model.rel_dim());
        let (emb, ranges) = (&part.emb, part.ranges);
        let batches: Vec<Mutex<&mut [(u64, u64)]>> =
            counts.chunks_mut(QUERY_BATCH).map(Mutex::new).collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..self.threads.max(1).min(batches.len()) {
                scope.spawn(|| {
                    let mut scratch = Scratch::default();
                    let (mut out, mut widened) = (Vec::new(), Vec::new());
                    loop {
                        let b = next.fetch_add(1, Relaxed);
                        if b >= batches.len() {
                            break;
                        }
                        let mut cnt = batches[b].lock().expect("not poisoned");
                        let q0 = b * QUERY_BATCH;
                        let qb = cnt.len();
                        let batch = &ranges[q0..q0 + qb];
                        let scan_lo = batch.iter().map(|r| r.start).min().unwrap_or(0);
                        let scan_hi = batch.iter().map(|r| r.end).max().unwrap_or(0);
                        for lo in (scan_lo..scan_hi).step_by(TILE) {
                            let t = TILE.min(scan_hi - lo);
                            out.resize(qb * t, 0.0);
                            score_candidates(
                                model,
                                &ScoreBatch {
                                    b: qb,
                                    n: t,
                                    src: &rows.src[q0 * d..(q0 + qb) * d],
                                    rel: &rows.rel[q0 * rd..(q0 + qb) * rd],
                                    cands: emb.span(lo * d, t * d, &mut widened),
                                },
                                &mut out,
                                &mut scratch,
                            );
                            for (i, c) in cnt.iter_mut().enumerate() {
                                let q = q0 + i;
                                let (a, z) = (ranges[q].start.max(lo), ranges[q].end.min(lo + t));
                                if a >= z {
                                    continue;
                                }
                                let row = &out[i * t + a - lo..i * t + z - lo];
                                let s = rows.true_score[q];
                                let (mut g, mut e) = count_above(row, s);
                                for k in part.excluded_in(q, a..z) {
                                    let v = row[k - a];
                                    if v > s || s.is_nan() {
                                        g -= 1;
                                    } else if v == s {
                                        e -= 1;
                                    }
                                }
                                c.0 += g;
                                c.1 += e;
                            }
                        }
                    }
                });
            }
        });
        Ok(())
    }

    fn sampled(
        &mut self,
        model: &ScoreModel,
        rows: &RoundRows,
        cands: &SampledCands,
    ) -> Result<Vec<f64>> {
        let (d, rd) = (model.dim, model.rel_dim());
        let (batch, per) = (cands.batch, cands.per_batch);
        let queries = rows.true_score.len();
        let ranks: Vec<Mutex<Vec<f64>>> = (0..queries)
            .step_by(batch)
            .map(|q0| Mutex::new(vec![0.0; batch.min(queries - q0)]))
            .collect();
        let next = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..self.threads.max(1).min(ranks.len()) {
                scope.spawn(|| {
                    let mut scratch = Scratch::default();
                    let mut out = Vec::new();
                    loop {
                        let b = next.fetch_add(1, Relaxed);
                        if b >= ranks.len() {
                            break;
                        }
                        let mut rk = ranks[b].lock().expect("not poisoned");
                        let (q0, qb, c0) = (b * batch, rk.len(), b * per);
                        out.resize(qb * per, 0.0);
                        score_candidates(
                            model,
                            &ScoreBatch {
                                b: qb,
                                n: per,
                                src: &rows.src[q0 * d..(q0 + qb) * d],
                                rel: &rows.rel[q0 * rd..(q0 + qb) * rd],
                                cands: &cands.rows[c0 * d..(c0 + per) * d],
                            },
                            &mut out,
                            &mut scratch,
                        );
                        for (i, r) in rk.iter_mut().enumerate() {
                            let q = q0 + i;
                            let row = &out[i * per..(i + 1) * per];
                            let s = rows.true_score[q];
                            let (mut g, mut e) = count_above(row, s);
                            for (j, &v) in row.iter().enumerate() {
                                if cands.excluded(q, c0 + j) {
                                    if v > s || s.is_nan() {
                                        g -= 1;
                                    } else if v == s {
                                        e -= 1;
                                    }
                                }
                            }
                            *r = rank_of(g, e);
                        }
                    }
                });
            }
        });
        Ok(ranks
            .into_iter()
            .flat_map(|r| r.into_inner().expect("not poisoned"))
            .collect())
    }
}

/// The rank of an answer with `above` candidates scoring higher and `equal` scoring the
/// same: ties count half.
pub fn rank_of(above: u64, equal: u64) -> f64 {
    1.0 + above as f64 + equal as f64 / 2.0
}

/// Candidates in `row` scoring above and equal to `s`. A NaN true score ranks last.
fn count_above(row: &[f32], s: f32) -> (u64, u64) {
    if s.is_nan() {
        return (row.len() as u64, 0);
    }
    let (mut g, mut e) = (0u32, 0u32);
    for &v in row {
        g += (v > s) as u32;
        e += (v == s) as u32;
    }
    (g as u64, e as u64)
}
