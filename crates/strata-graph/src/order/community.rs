//! The `community` order: communities by label propagation (Raghavan, Albert and Kumara), laid
//! out one after another, largest first, each by decreasing degree; a node's neighbours, mostly
//! in its community, get nearby ids (the idea of Rabbit order, without its hierarchy).

use std::cmp::Reverse;

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::shared::sorted_by;
use super::{most_frequent, Input, NodeOrder};
use crate::error::Result;
use crate::topology::Adjacency;
use crate::Topology;

/// Label propagation rounds of the `community` order.
pub const COMMUNITY_ROUNDS: u32 = 5;

/// Communities by label propagation.
pub struct Community;

impl Named for Community {
    const NAME: &'static str = "community";
    const HELP: &'static str = "communities by label propagation (5 synchronous rounds), largest first, each by decreasing degree";
}

impl NodeOrder for Community {
    fn input(&self) -> Input {
        Input::Undirected
    }

    /// Two label arrays, the community sizes and the sorted ids (4 bytes a node each), and one
    /// node's votes at a time (at most one label an entry).
    fn work_bytes(&self) -> (u64, u64) {
        (16, 4)
    }

    fn order(&self, adj: &Topology) -> Result<Vec<u32>> {
        let label = communities(adj, COMMUNITY_ROUNDS);
        let mut size = vec![0u32; label.len()];
        for &l in &label {
            size[l as usize] += 1;
        }
        Ok(sorted_by(adj, |v| {
            let l = label[v as usize];
            (Reverse(size[l as usize]), l, Reverse(adj.degree(v)))
        }))
    }
}

/// Label propagation over `adj`: every node starts with its own id as label; each of `rounds`
/// synchronous rounds gives every node the most frequent label among itself and its neighbours
/// (a multigraph's parallel edges count), ties going to the smallest hash of (label, round), a
/// deterministic stand-in for the random tie-break of Raghavan et al. (ties to the smallest
/// label would spread the lowest ids over whole components). Returns the labels, `(N,)`, each
/// a node id.
pub fn communities<A: Adjacency + ?Sized>(adj: &A, rounds: u32) -> Vec<u32> {
    let n = adj.num_nodes();
    let mut label: Vec<u32> = (0..n as u32).collect();
    let mut next = vec![0u32; n];
    let mut votes: Vec<u32> = Vec::new();
    for round in 0..rounds {
        // SplitMix64's output at (label + (round + 1) * golden): a hash of both.
        let hash = |l: u32| Rng::seek(l as u64, round as u64).next_u64();
        for v in 0..n as u32 {
            votes.clear();
            votes.extend(adj.neighbors(v).iter().map(|&u| label[u as usize]));
            votes.push(label[v as usize]);
            next[v as usize] = most_frequent(&mut votes, |l| Reverse(hash(l)))
                .expect("a node votes for its own label");
        }
        std::mem::swap(&mut label, &mut next);
    }
    label
}
