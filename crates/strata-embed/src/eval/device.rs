//! The device side of the evaluation seam: a [`Ranker`] that hands each block of candidates to
//! a [`DeviceRank`] (the torch evaluator of the Python package, registered by the extension
//! with [`register_device_rank`]), described in plain values ([`RankJob`]). The evaluator
//! decides the candidates, the filters and the tie rule; the device scores and counts.

use std::sync::OnceLock;

use crate::error::{EmbedError, Result};
use crate::eval::rank::{rank_of, CpuRanker, PartScan, Ranker, RoundRows, SampledCands};
use crate::model::ScoreModel;
use crate::storage::table::Rows;

/// One block of candidates against a round's queries, in plain values: query `i` is ranked
/// against candidates `lo[i] .. hi[i]`, except its run of `excluded_per_query[i]` candidates
/// in `excluded_cand` (the queries' runs one after another), and gets the counts of those
/// scoring above and equal to `true_score[i]` (a NaN true score: every competing candidate
/// above).
pub struct RankJob<'a> {
    /// The config's spelling of the model (`dot`, `distmult`, `complex`, `transe`, `rotate`, ...).
    pub model: &'static str,
    /// `pbg`'s operator and comparator ([`ScoreModel::pbg_names`]).
    pub pbg: Option<(&'static str, &'static str)>,
    pub dim: usize,
    pub transe_norm: u8,
    /// `q x dim` source rows, `q x rel_dim` relation rows, `q` true scores.
    pub src: &'a [f32],
    pub rel: &'a [f32],
    pub true_score: &'a [f32],
    /// `n x dim` candidate rows: `f32`, or `bf16` (the table's dtype, widened on the device).
    pub cands: &'a [u8],
    pub cands_dtype: &'static str,
    pub n: usize,
    pub lo: Vec<u64>,
    pub hi: Vec<u64>,
    /// A filtered round's runs reach millions of candidates (FB15k-237's validation: 8.4M),
    /// so a query's are counted rather than each paired with its query, and in 32 bits.
    pub excluded_per_query: Vec<u32>,
    pub excluded_cand: Vec<u32>,
}

/// Scoring and counting on a device: `(above, equal)` per query of the job, or why not.
pub trait DeviceRank: Send {
    fn count(&mut self, job: &RankJob) -> std::result::Result<Vec<(u64, u64)>, String>;
}

/// Makes the device evaluator of a `device` option (`cuda`, `cuda:N`, `torch-cpu`), or says
/// why it cannot (no torch, no CUDA).
pub type DeviceRankFactory = fn(&str) -> std::result::Result<Box<dyn DeviceRank>, String>;

static FACTORY: OnceLock<DeviceRankFactory> = OnceLock::new();

/// Registers the maker of device evaluators (the Python extension does, when it loads).
pub fn register_device_rank(factory: DeviceRankFactory) {
    let _ = FACTORY.set(factory);
}

/// The ranker of an evaluation on `device`: the CPU kernels on `threads` threads for `cpu`,
/// the registered device evaluator otherwise.
pub fn ranker_for(device: &str, threads: usize) -> Result<Box<dyn Ranker>> {
    if device == "cpu" {
        return Ok(Box::new(CpuRanker { threads }));
    }
    let Some(factory) = FACTORY.get() else {
        return Err(EmbedError::Config(format!(
            "device = {device} needs the torch evaluator of the Python package: evaluate with \
             `strata embed eval` or strata.embed (or use device = cpu)"
        )));
    };
    let device_rank = factory(device).map_err(EmbedError::Config)?;
    Ok(Box::new(DeviceRanker { device_rank }))
}

/// A [`Ranker`] on a [`DeviceRank`].
pub(crate) struct DeviceRanker {
    pub(crate) device_rank: Box<dyn DeviceRank>,
}

impl DeviceRanker {
    fn count(&mut self, job: &RankJob) -> Result<Vec<(u64, u64)>> {
        let counts = self
            .device_rank
            .count(job)
            .map_err(|e| EmbedError::Config(format!("device evaluation: {e}")))?;
        if counts.len() != job.true_score.len() {
            return Err(EmbedError::Config(format!(
                "device evaluation: {} counts for {} queries",
                counts.len(),
                job.true_score.len()
            )));
        }
        Ok(counts)
    }
}

/// The bytes and dtype name of `rows`' first `values` values.
fn raw<'a>(rows: &Rows<'a>, values: usize) -> (&'a [u8], &'static str) {
    match *rows {
        Rows::F32(v) => (bytemuck::cast_slice(&v[..values]), "f32"),
        Rows::Bf16(v) => (bytemuck::cast_slice(&v[..values]), "bf16"),
    }
}

impl Ranker for DeviceRanker {
    fn filtered(
        &mut self,
        model: &ScoreModel,
        rows: &RoundRows,
        part: &PartScan,
        counts: &mut [(u64, u64)],
    ) -> Result<()> {
        let n = part.ranges.iter().map(|r| r.end).max().unwrap_or(0);
        let (cands, cands_dtype) = raw(&part.emb, n * model.dim);
        let runs: Vec<_> = part
            .ranges
            .iter()
            .enumerate()
            .map(|(q, range)| part.excluded_in(q, range.clone()))
            .collect();
        let excluded_per_query: Vec<u32> = runs.iter().map(|run| run.len() as u32).collect();
        let total = runs.iter().map(|run| run.len()).sum();
        let mut excluded_cand = Vec::with_capacity(total);
        for run in runs {
            // Local rows of a partition: below 2^32.
            excluded_cand.extend(run.map(|k| k as u32));
        }
        let got = self.count(&RankJob {
            model: model.kind.name(),
            pbg: model.pbg_names(),
            dim: model.dim,
            transe_norm: model.transe_norm,
            src: &rows.src,
            rel: &rows.rel,
            true_score: &rows.true_score,
            cands,
            cands_dtype,
            n,
            lo: part.ranges.iter().map(|r| r.start as u64).collect(),
            hi: part.ranges.iter().map(|r| r.end as u64).collect(),
            excluded_per_query,
            excluded_cand,
        })?;
        for (c, (g, e)) in counts.iter_mut().zip(got) {
            c.0 += g;
            c.1 += e;
        }
        Ok(())
    }

    fn sampled(
        &mut self,
        model: &ScoreModel,
        rows: &RoundRows,
        cands: &SampledCands,
    ) -> Result<Vec<f64>> {
        let queries = rows.true_score.len();
        if u32::try_from(cands.ids.len()).is_err() {
            return Err(EmbedError::Config(format!(
                "device evaluation: {} sampled candidates in one round; the device ranker takes at most 2^32",
                cands.ids.len()
            )));
        }
        let block = |q: usize| (q / cands.batch * cands.per_batch) as u64;
        let (mut excluded_per_query, mut excluded_cand) = (Vec::with_capacity(queries), Vec::new());
        for q in 0..queries {
            let c0 = block(q) as usize;
            let before = excluded_cand.len();
            excluded_cand.extend(
                (c0..c0 + cands.per_batch)
                    .filter(|&j| cands.excluded(q, j))
                    .map(|j| j as u32),
            );
            excluded_per_query.push((excluded_cand.len() - before) as u32);
        }
        let got = self.count(&RankJob {
            model: model.kind.name(),
            pbg: model.pbg_names(),
            dim: model.dim,
            transe_norm: model.transe_norm,
            src: &rows.src,
            rel: &rows.rel,
            true_score: &rows.true_score,
            cands: bytemuck::cast_slice(cands.rows),
            cands_dtype: "f32",
            n: cands.ids.len(),
            lo: (0..queries).map(block).collect(),
            hi: (0..queries)
                .map(|q| block(q) + cands.per_batch as u64)
                .collect(),
            excluded_per_query,
            excluded_cand,
        })?;
        Ok(got.into_iter().map(|(g, e)| rank_of(g, e)).collect())
    }
}
