//! The ranker seam: what the device ranker hands a device (ranges and excluded pairs) counts
//! the same as the CPU kernels, checked with a device that scores each query on its own.

use std::ops::Range;

use strata_store::rng::Rng;

use super::device::{DeviceRank, DeviceRanker, RankJob};
use super::rank::{CpuRanker, PartScan, Ranker, RoundRows, SampledCands};
use super::{Excluded, KnownAnswers, Query};
use crate::model::{score_candidates, PbgForm, ScoreBatch, ScoreKind, ScoreModel, Scratch};
use crate::storage::partitioning::Partitioning;
use crate::storage::table::Rows;

/// A device that scores query by query through the CPU score functions.
struct OneByOne {
    model: ScoreModel,
}

impl DeviceRank for OneByOne {
    fn count(&mut self, job: &RankJob) -> Result<Vec<(u64, u64)>, String> {
        let (d, rd) = (self.model.dim, self.model.rel_dim());
        assert_eq!((job.model, job.dim, job.cands_dtype), ("complex", d, "f32"));
        let cands: &[f32] = bytemuck::cast_slice(job.cands);
        assert_eq!(cands.len(), job.n * d);
        let mut scratch = Scratch::default();
        let mut out = Vec::new();
        let counts = (0..job.true_score.len())
            .map(|i| {
                let (lo, hi) = (job.lo[i] as usize, job.hi[i] as usize);
                out.resize(hi - lo, 0.0);
                score_candidates(
                    &self.model,
                    &ScoreBatch {
                        b: 1,
                        n: hi - lo,
                        src: &job.src[i * d..(i + 1) * d],
                        rel: &job.rel[i * rd..(i + 1) * rd],
                        cands: &cands[lo * d..hi * d],
                    },
                    &mut out,
                    &mut scratch,
                );
                let s = job.true_score[i];
                let first: usize = job.excluded_per_query[..i]
                    .iter()
                    .map(|&c| c as usize)
                    .sum();
                let mine = &job.excluded_cand[first..first + job.excluded_per_query[i] as usize];
                let competing = (lo..hi).filter(|&j| !mine.contains(&(j as u32)));
                competing.fold((0, 0), |(g, e), j| {
                    let v = out[j - lo];
                    (g + (v > s) as u64, e + (v == s) as u64)
                })
            })
            .collect();
        Ok(counts)
    }
}

fn random(n: usize, rng: &mut Rng) -> Vec<f32> {
    (0..n).map(|_| rng.normal_pair().0 as f32).collect()
}

#[test]
fn device_ranker_counts_as_the_cpu_kernels() {
    let model = ScoreModel {
        kind: ScoreKind::ComplEx,
        dim: 8,
        transe_norm: 2,
        pbg: PbgForm::default(),
    };
    let (q, n, d) = (9, 37, 8);
    let mut rng = Rng::new(11);
    let rows = RoundRows {
        src: random(q * d, &mut rng),
        rel: random(q * d, &mut rng),
        true_score: random(q, &mut rng),
    };
    let emb = random(n * d, &mut rng);
    // Whole partitions, and typed sections of it.
    let ranges: Vec<Range<usize>> = (0..q)
        .map(|i| if i % 3 == 0 { 5..30 } else { 0..n })
        .collect();
    // Keys of partition 1 (some outside a query's range) and of another partition.
    let excluded: Vec<Vec<u64>> = (0..q)
        .map(|i| {
            let mut keys = vec![(1u64 << 32) | (i as u64 * 4), (1 << 32) | 33, 2 << 32];
            keys.sort_unstable();
            keys.dedup();
            keys
        })
        .collect();
    let excluded: Vec<&[u64]> = excluded.iter().map(Vec::as_slice).collect();
    let part = PartScan {
        p: 1,
        emb: Rows::F32(&emb),
        ranges: &ranges,
        excluded: &excluded,
    };
    let mut cpu = vec![(0, 0); q];
    CpuRanker { threads: 2 }
        .filtered(&model, &rows, &part, &mut cpu)
        .unwrap();
    let mut device = DeviceRanker {
        device_rank: Box::new(OneByOne { model }),
    };
    let mut dev = vec![(0, 0); q];
    device.filtered(&model, &rows, &part, &mut dev).unwrap();
    assert_eq!(dev, cpu);
    assert!(cpu.iter().all(|&(g, e)| g + e > 0));

    // Sampled: batches of 4 queries share 10 candidates; some are an answer, some another type.
    let ids: Vec<u64> = (0..30).map(|j| j % 13).collect();
    let answers: Vec<u64> = (0..q as u64).collect();
    let cand_types: Vec<usize> = ids.iter().map(|&v| (v % 2) as usize).collect();
    let answer_types: Vec<usize> = answers.iter().map(|&v| (v % 2) as usize).collect();
    for types in [None, Some((&cand_types[..], &answer_types[..]))] {
        let cands = SampledCands {
            batch: 4,
            per_batch: 10,
            rows: &emb[..30 * d],
            ids: &ids,
            answers: &answers,
            types,
        };
        let cpu = CpuRanker { threads: 2 }
            .sampled(&model, &rows, &cands)
            .unwrap();
        assert_eq!(device.sampled(&model, &rows, &cands).unwrap(), cpu);
    }
}

#[test]
fn known_answers_are_keyed_once_with_each_query_answer_among_them() {
    // 4 partitions of 100 nodes (a seeded permutation): keys follow the locator, not the ids.
    let nodes = Partitioning::new(100, 4, 7).unwrap();
    let locator = nodes.locator();
    let key = |v: u64| {
        let (p, l) = locator.locate(v);
        ((p as u64) << 32) | l as u64
    };
    let query = |src, answer| Query {
        src,
        rel: 2,
        answer,
        head: false,
    };
    // Two queries share a key; the store's splits know 9 and 41 for it (41 twice), but not
    // the second query's answer 77; the third query's key has no known answer at all.
    let queries = [query(5, 41), query(5, 77), query(6, 3)];
    let known: KnownAnswers = [((5, 2, false), vec![9, 41, 41])].into_iter().collect();
    let excluded = Excluded::new(&queries, known, &nodes);
    let mut want: Vec<u64> = [9, 41, 77].map(key).to_vec();
    want.sort_unstable();
    assert_eq!(excluded.keys[&(5, 2, false)], want);
    assert_eq!(excluded.keys[&(6, 2, false)], vec![key(3)]);
    assert_eq!(excluded.keys.len(), 2);
    assert_eq!(excluded.partitioning, nodes);
}
