//! One node's choice of in-edges for one hop: split into edge-type runs when the fanouts are
//! per edge type, keep the edges a temporal seed may see, then draw uniformly, by weight, or
//! the most recent.

use std::ops::Range;

use strata_store::rng::Rng;

use super::temporal::{self, TemporalStrategy};
use super::typed;
use super::uniform::Picks;
use super::weighted;
use crate::topology::Edges;

/// A hop's fanout: one for all of a node's edges, or one per edge type (0: none of that
/// type). -1 keeps them all.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fanout<'a> {
    All(i32),
    PerType(&'a [i32]),
}

/// What decides the choice at every node of one hop.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule<'a> {
    pub(super) fanout: Fanout<'a>,
    /// Draw by weight (zero-weight edges never).
    pub(super) weighted: bool,
    /// With a seed time per node (disjoint samples): how the eligible edges are drawn.
    pub(super) temporal: Option<TemporalStrategy>,
}

/// Buffers reused across the nodes of a chunk.
#[derive(Default)]
pub(super) struct Scratch {
    picks: Picks,
    candidates: Vec<usize>,
    keyed: Vec<(f64, usize)>,
}

/// Appends to `out` the positions in `edges` of the edges kept, each run's in increasing
/// order. `cutoff` is the seed's time when the rule is temporal (edges later than it are
/// never kept); `rng` is the node's stream.
pub(super) fn choose(
    rule: &Rule<'_>,
    edges: &Edges<'_>,
    cutoff: Option<i64>,
    rng: &mut Rng,
    scratch: &mut Scratch,
    out: &mut Vec<usize>,
) {
    match rule.fanout {
        Fanout::All(fanout) => choose_run(
            rule,
            edges,
            0..edges.neighbors.len(),
            fanout,
            cutoff,
            rng,
            scratch,
            out,
        ),
        Fanout::PerType(fanouts) => {
            for (t, run) in typed::runs(edges.types) {
                let fanout = fanouts[t as usize];
                if fanout != 0 {
                    choose_run(rule, edges, run, fanout, cutoff, rng, scratch, out);
                }
            }
        }
    }
}

#[allow(clippy::too_many_arguments)] // a run's whole context; bundling it would only rename it
fn choose_run(
    rule: &Rule<'_>,
    edges: &Edges<'_>,
    run: Range<usize>,
    fanout: i32,
    cutoff: Option<i64>,
    rng: &mut Rng,
    scratch: &mut Scratch,
    out: &mut Vec<usize>,
) {
    let k = usize::try_from(fanout).unwrap_or(usize::MAX);
    if !rule.weighted && cutoff.is_none() {
        // Plain uniform: no candidate list, so a hub costs O(fanout).
        if k >= run.len() {
            out.extend(run);
        } else {
            let start = run.start;
            pick_uniform(&mut scratch.picks, rng, run.len(), k, out, |i| start + i);
        }
        return;
    }
    let candidates = &mut scratch.candidates;
    candidates.clear();
    candidates.extend(run.filter(|&p| {
        cutoff.is_none_or(|c| edges.times[p] <= c) && (!rule.weighted || edges.weights[p] > 0.0)
    }));
    if k >= candidates.len() {
        out.extend_from_slice(candidates);
    } else if rule.temporal == Some(TemporalStrategy::Last) {
        temporal::choose_last(candidates, edges.times, k, out);
    } else if rule.weighted {
        weighted::choose(rng, candidates, edges.weights, k, &mut scratch.keyed, out);
    } else {
        pick_uniform(&mut scratch.picks, rng, candidates.len(), k, out, |i| {
            candidates[i]
        });
    }
}

/// Appends `position(i)` for `k` of the indices `0..n` drawn uniformly without replacement,
/// in increasing index order.
fn pick_uniform(
    picks: &mut Picks,
    rng: &mut Rng,
    n: usize,
    k: usize,
    out: &mut Vec<usize>,
    position: impl Fn(usize) -> usize,
) {
    picks.choose(rng, n as u64, k);
    out.extend(picks.positions.iter().map(|&i| position(i as usize)));
}
