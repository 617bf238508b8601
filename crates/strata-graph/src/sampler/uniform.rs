//! Uniform choice of `k` of `d` positions without replacement (Floyd's algorithm): the
//! sampler's default, and the temporal sampler's "uniform" strategy over the eligible edges.

use std::collections::HashSet;
use std::hash::BuildHasherDefault;

use strata_store::rng::Rng;

use super::ids::IdHasher;

/// Up to this many picks, Floyd's membership test scans the picks so far; beyond, a hash set
/// keeps it O(1) (a linear scan over a 1000-neighbour pick would be quadratic).
pub(super) const LINEAR_PICKS: usize = 32;

/// Scratch of Floyd's sampling, reused across the nodes of a chunk so that a hub costs
/// O(fanout) memory, never O(degree).
#[derive(Default)]
pub(super) struct Picks {
    pub(super) positions: Vec<u64>,
    seen: HashSet<u64, BuildHasherDefault<IdHasher>>,
}

impl Picks {
    /// Leaves in `positions` `k` distinct positions out of `0..d`, every k-subset equally
    /// likely (Floyd's algorithm: k draws, whatever `d`), in increasing order so that the
    /// neighbours are read in adjacency order.
    pub(super) fn choose(&mut self, rng: &mut Rng, d: u64, k: usize) {
        debug_assert!(k as u64 <= d);
        self.positions.clear();
        let linear = k <= LINEAR_PICKS;
        if !linear {
            self.seen.clear();
        }
        for j in d - k as u64..d {
            let t = rng.below(j + 1);
            // j itself was out of reach of every earlier draw, so it is always new.
            let fresh = if linear {
                !self.positions.contains(&t)
            } else {
                self.seen.insert(t)
            };
            let pick = if fresh { t } else { j };
            if !linear && !fresh {
                self.seen.insert(j);
            }
            self.positions.push(pick);
        }
        self.positions.sort_unstable();
    }
}

/// `k` distinct positions out of `0..d` (`k` at most `d`), every k-subset equally likely, in
/// increasing order: a uniform draw without replacement in O(k) time and memory, whatever `d`.
pub fn distinct(rng: &mut Rng, d: u64, k: usize) -> Vec<u64> {
    let mut picks = Picks::default();
    picks.choose(rng, d, k);
    picks.positions
}
