//! What the orders share: the [`NodeOrder`] trait they implement, the adjacency [`Input`] they
//! read, and the helpers they build on (sorting by a key, the label vote, the inverse
//! permutation). It sits beside the registry in `mod.rs`, so the orders need nothing of their
//! parent.

use std::cmp::Reverse;

use crate::error::Result;
use crate::Topology;

/// The adjacency an order reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// Each node's out-neighbours followed by its in-neighbours (the CSR of a symmetrized
    /// store): the graph as undirected.
    Undirected,
    /// The in-neighbour lists (the CSC), the direction the sampler walks.
    InNeighbours,
}

/// A node order: a deterministic function of the adjacency [`NodeOrder::input`] names.
/// Implementations are unit types registered in `OrderKind` with their
/// [`strata_store::registry::Named`] name and help.
pub trait NodeOrder: Sync {
    /// The adjacency [`NodeOrder::order`] takes.
    fn input(&self) -> Input;

    /// Bytes of work memory per node the order holds beside its input and its result, and per
    /// adjacency entry (an upper bound: what the memory plan sets aside).
    fn work_bytes(&self) -> (u64, u64);

    /// The new order of `adj`'s nodes: `result[new] = old`, a permutation of
    /// `0..adj.num_nodes()`.
    fn order(&self, adj: &Topology) -> Result<Vec<u32>>;
}

/// The nodes of `adj` sorted by `key` (ties: the lower id first).
pub(super) fn sorted_by<K: Ord>(adj: &Topology, key: impl Fn(u32) -> K) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..adj.num_nodes() as u32).collect();
    ids.sort_by_key(|&v| (key(v), v));
    ids
}

/// Nodes by decreasing degree (ties: the lower id).
pub(super) fn by_decreasing_degree(adj: &Topology) -> Vec<u32> {
    sorted_by(adj, |v| Reverse(adj.degree(v)))
}

/// The inverse of `old_of_new`: `new_of_old[old] = new`.
pub fn inverse(old_of_new: &[u32]) -> Vec<u32> {
    let mut new_of_old = vec![0u32; old_of_new.len()];
    for (new, &old) in old_of_new.iter().enumerate() {
        new_of_old[old as usize] = new as u32;
    }
    new_of_old
}

/// The label a vote elects: each entry of `labels` (sorted here) is one vote; the label with
/// the most votes wins, ties going to the largest `key(label)`. `None` when there are no votes.
pub fn most_frequent<K: Ord>(labels: &mut [u32], key: impl Fn(u32) -> K) -> Option<u32> {
    labels.sort_unstable();
    let mut best: Option<(usize, K, u32)> = None;
    for run in labels.chunk_by(|a, b| a == b) {
        let (label, count) = (run[0], run.len());
        let better = match &best {
            None => true,
            Some((c, _, _)) if count != *c => count > *c,
            Some((_, k, _)) => key(label) > *k,
        };
        if better {
            best = Some((count, key(label), label));
        }
    }
    best.map(|(_, _, label)| label)
}

/// Mean `|new_of_old[u] - new_of_old[v]|` over the entries `u -> v` of `adj` (0 without
/// entries); `None` for the current ids.
pub fn mean_span(adj: &Topology, new_of_old: Option<&[u32]>) -> f64 {
    let id = |v: u32| new_of_old.map_or(v, |m| m[v as usize]) as i64;
    let total: u128 = (0..adj.num_nodes() as u32)
        .map(|u| {
            adj.neighbors(u)
                .iter()
                .map(|&v| (id(u) - id(v)).unsigned_abs() as u128)
                .sum::<u128>()
        })
        .sum();
    match adj.num_edges() {
        0 => 0.0,
        e => total as f64 / e as f64,
    }
}
