//! Bernoulli head/tail corruption (Wang et al. 2014, TransH §3.2): the head of an edge of
//! relation `r` is corrupted with probability `tph / (tph + hpt)`, its tail otherwise, where
//! `tph` is the mean number of tails per head and `hpt` the mean number of heads per tail of
//! `r`. A one-to-many relation has its heads corrupted more often, since a replaced tail would
//! too often be another true tail.
//!
//! With `E_r` edges, `H_r` distinct heads and `T_r` distinct tails, `tph = E_r / H_r` and
//! `hpt = E_r / T_r`, so the probability is `T_r / (H_r + T_r)` (PyKEEN's
//! `BernoulliNegativeSampler` and OpenKE's `bern` count the same). The distinct heads and tails
//! are counted from the bucketed train edges at start, in bounded memory: a node's edges as a
//! head all lie in its partition's row of buckets and as a tail in its column, so partitions
//! are counted one at a time, over ranges of their local ids whose bitsets (one bit per
//! relation and id, for heads and for tails) fit the budget, each range one read of the
//! partition's row and column of buckets. In a typed run the pinned region is counted as one
//! more partition: its nodes' edges lie in the diagonal buckets `(q, q)` (see
//! [`crate::storage::partitioning::bucket_of`]), and in a partition's buckets only the ends that are
//! not pinned are that partition's nodes.

use std::sync::Arc;

use strata_io::progress::{Meter, Progress};
use strata_io::Engine;
use strata_store::units::fmt_bytes;

use crate::error::{EmbedError, Result};
use crate::storage::epoch_io::prefetch_edges;
use crate::storage::partitioning::Buckets;

/// Edge pieces the counting pass holds at once (two read ahead, one counted, one being read).
const PIECES_ALIVE: u64 = 4;
/// Bytes of one bucketed edge row.
const ROW_BYTES: u64 = 12;

/// Distinct heads and tails of each relation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SideCounts {
    pub heads: Vec<u64>,
    pub tails: Vec<u64>,
    /// Reads of a partition's row and column of buckets it took.
    pub passes: usize,
}

impl SideCounts {
    /// The probability of corrupting the head of an edge of each relation,
    /// `T_r / (H_r + T_r)` (0.5 for a relation without edges).
    pub fn head_probabilities(&self) -> Vec<f32> {
        self.heads
            .iter()
            .zip(&self.tails)
            .map(|(&h, &t)| match h + t {
                0 => 0.5,
                sum => (t as f64 / sum as f64) as f32,
            })
            .collect()
    }
}

/// Counts the distinct heads and tails of each of `relations` relations in the train edges of
/// `buckets`, within `budget` bytes (bitsets and the edge pieces in flight, `piece_rows`
/// edges each). `pinned_ends`: in a typed run with a pinned region, whether each relation's
/// source and destination type are pinned (None: no pinned region).
pub fn count_sides(
    engine: &Arc<Engine>,
    buckets: &Arc<Buckets>,
    relations: u64,
    pinned_ends: Option<&[(bool, bool)]>,
    budget: u64,
    piece_rows: u64,
    progress: &dyn Progress,
) -> Result<SideCounts> {
    let p = &buckets.partitioning;
    let n = p.partitions;
    let pinned = p.pinned();
    let r = relations.max(1) as usize;
    let ends = |rel: i32| pinned_ends.map_or((false, false), |e| e[rel as usize]);
    // Ids per range: two bitsets of `r x ids` bits in what the pieces leave, whole words.
    let bits = budget.saturating_sub(PIECES_ALIVE * piece_rows * ROW_BYTES) * 8 / 2;
    let span = (bits / r as u64).min(p.part_size).max(1).div_ceil(64) * 64;
    let ranges = |part: u32| p.size_of(part).div_ceil(span).max(1);
    // The buckets holding region `part`'s edges: a partition's row and column, the pinned
    // region's the diagonal.
    let order_of = |part: u32| -> Vec<(u32, u32)> {
        if Some(part) == pinned {
            return (0..n).map(|q| (q, q)).collect();
        }
        let mut order: Vec<(u32, u32)> = (0..n).map(|q| (part, q)).collect();
        order.extend((0..n).filter(|&q| q != part).map(|q| (q, part)));
        order
    };
    let reads = |part: u32| -> u64 {
        order_of(part)
            .iter()
            .map(|&(a, b)| buckets.range(a, b).count() as u64)
            .sum()
    };
    let regions = p.regions();
    let total: u64 = regions.iter().map(|&part| ranges(part) * reads(part)).sum();
    let mut meter = Meter::new(progress, "Bernoulli counts", 0, total);
    let words = (span / 64) as usize;
    let mut head_bits = vec![0u64; r * words];
    let mut tail_bits = vec![0u64; r * words];
    let mut counts = SideCounts {
        heads: vec![0; r],
        tails: vec![0; r],
        passes: 0,
    };
    for &part in &regions {
        let is_pinned = Some(part) == pinned;
        for k in 0..ranges(part) {
            let (lo, hi) = (k * span, ((k + 1) * span).min(p.size_of(part)));
            head_bits.fill(0);
            tail_bits.fill(0);
            let (rx, handle) = prefetch_edges(
                engine.clone(),
                buckets.clone(),
                order_of(part),
                piece_rows,
                2,
                r as u64,
                false,
                None,
            );
            let set = |bits: &mut [u64], rel: i32, local: i32| {
                let local = local as u64;
                if (lo..hi).contains(&local) {
                    let i = rel as usize * words * 64 + (local - lo) as usize;
                    bits[i / 64] |= 1 << (i % 64);
                }
            };
            for piece in rx.iter() {
                let (edges, _) = piece.edges?;
                for e in &edges {
                    // An end is this region's node when it is pinned exactly when the region is.
                    let (src_pinned, dst_pinned) = ends(e[1]);
                    if src_pinned == is_pinned && (is_pinned || piece.bucket.0 == part) {
                        set(&mut head_bits, e[1], e[0]);
                    }
                    if dst_pinned == is_pinned && (is_pinned || piece.bucket.1 == part) {
                        set(&mut tail_bits, e[1], e[2]);
                    }
                }
                meter.add(edges.len() as u64, piece.bytes)?;
            }
            handle
                .join()
                .map_err(|_| EmbedError::Corrupt("the edge reader panicked".into()))?;
            for rel in 0..r {
                let row = |bits: &[u64]| -> u64 {
                    bits[rel * words..(rel + 1) * words]
                        .iter()
                        .map(|w| w.count_ones() as u64)
                        .sum()
                };
                counts.heads[rel] += row(&head_bits);
                counts.tails[rel] += row(&tail_bits);
            }
            counts.passes += 1;
        }
    }
    meter.finish()?;
    progress.message(&format!(
        "Bernoulli corruption: distinct heads and tails of {} relation(s) counted in {} pass(es) over partitions' buckets within {}",
        r,
        counts.passes,
        fmt_bytes(2 * (r * words * 8) as u64 + PIECES_ALIVE * piece_rows * ROW_BYTES)
    ));
    Ok(counts)
}

/// A line for the user: the spread of the head probabilities.
pub fn describe(head_prob: &[f32]) -> String {
    let mut sorted = head_prob.to_vec();
    sorted.sort_by(f32::total_cmp);
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    format!(
        "Bernoulli corruption: P(corrupt head) per relation min {:.3}, median {:.3}, max {:.3}",
        at(0.0),
        at(0.5),
        at(1.0)
    )
}
