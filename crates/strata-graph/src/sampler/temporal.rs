//! Temporal sampling (PyG's `time_attr` on edges with `temporal_strategy`): a node sampled on
//! behalf of a seed only takes edges whose time is no later than the seed's time.
//!
//! As in PyG, temporal samples are disjoint: each seed grows its own tree, so a node reached
//! from two seeds appears once per seed (with `Sample::batch` naming the seed), because what
//! it may see depends on the seed's time.

use std::cmp::Reverse;

use strata_store::rng::derive;

/// How the eligible edges (time <= the seed's time) of a node are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TemporalStrategy {
    /// Uniformly without replacement (or by weight, when the sampler is also weighted).
    Uniform,
    /// The most recent ones: largest time first, ties to the later edge in the node's
    /// segment (edge type, then edge id order: within an edge type, the larger edge id).
    Last,
}

/// The seeds of a temporal batch: each one's time, and the salt of its random streams.
pub(super) struct SeedTimes<'a> {
    pub(super) times: &'a [i64],
    /// `derive(node, time)` per seed: a seed's subtree depends on who and when it is, not on
    /// its position in the batch, and two seeds at the same node at different times draw
    /// independently.
    pub(super) salts: Vec<u64>,
}

impl<'a> SeedTimes<'a> {
    /// `times[i]` is the time of `seeds[i]`; the lengths are checked by the caller.
    pub(super) fn new(seeds: &[u32], times: &'a [i64]) -> SeedTimes<'a> {
        let salts = seeds
            .iter()
            .zip(times)
            .map(|(&v, &t)| derive(v as u64, t as u64))
            .collect();
        SeedTimes { times, salts }
    }
}

/// Appends to `out` the `k` most recent of `candidates` (positions into `times`, `k <
/// candidates.len()`): largest time first, ties to the larger position; in increasing
/// position order.
pub(super) fn choose_last(candidates: &mut [usize], times: &[i64], k: usize, out: &mut Vec<usize>) {
    debug_assert!(k < candidates.len());
    let newest = |&p: &usize| Reverse((times[p], p));
    if k > 0 {
        candidates.select_nth_unstable_by_key(k - 1, newest);
    }
    let start = out.len();
    out.extend_from_slice(&candidates[..k]);
    out[start..].sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_takes_the_newest_and_breaks_ties_by_position() {
        let times = [5, 9, 1, 9, 7, 3];
        let mut out = Vec::new();
        choose_last(&mut [0, 1, 2, 3, 4, 5], &times, 3, &mut out);
        assert_eq!(out, [1, 3, 4]);
        out.clear();
        // Tied at 9: the later position wins.
        choose_last(&mut [0, 1, 2, 3, 4, 5], &times, 1, &mut out);
        assert_eq!(out, [3]);
        out.clear();
        choose_last(&mut [5, 2, 0], &times, 2, &mut out);
        assert_eq!(out, [0, 5]);
    }

    #[test]
    fn salts_name_the_seed_and_its_time() {
        let s = SeedTimes::new(&[4, 4, 7], &[10, 11, 10]);
        assert_ne!(s.salts[0], s.salts[1]);
        assert_ne!(s.salts[0], s.salts[2]);
        assert_eq!(s.salts[0], SeedTimes::new(&[4], &[10]).salts[0]);
    }
}
