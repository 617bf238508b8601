//! The static hot set: which nodes' feature rows stay in RAM for the whole run (GIDS' constant
//! CPU buffer, §3.3; Helios' static pre-sampling cache, §3.2). This module ranks nodes by how
//! often their features are expected to be read and keeps the index of the chosen ones; filling
//! the rows is the feature tier's job.
//!
//! Three rankings ([`HotRanking`]):
//!
//! - **Reverse PageRank** ([`reverse_pagerank`], GIDS after Data Tiering): a random walk that
//!   moves the way feature reads spread during sampling.
//! - **Pre-sampling** ([`presampling_counts`], Helios after GNNLab/Legion): sample one epoch of
//!   batches ahead of training and count how often each node appears. The most faithful
//!   estimate, at the cost of one epoch of sampling.
//! - **Degree** ([`degree_scores`], [`reverse_degree_scores`]): the cheapest proxy.
//!
//! # Direction
//!
//! The sampler works on the in-neighbour CSC: node `v` aggregates the sources `u` of its
//! in-edges `u -> v` (message flow `u -> v`), so **`u`'s features are read when some `v` that
//! `u` points to is in the frontier and picks `u`**. Read frequency therefore flows *against*
//! message flow, from `v` to its in-neighbours. A node with many out-edges (many nodes may pick
//! it) is read often; a node with many in-edges only reads a lot.
//!
//! # Reverse PageRank, exactly
//!
//! GIDS' `evaluation/page_rank_node_list_gen.py` runs, with `pv = 1/N` and `K` iterations:
//!
//! ```text
//! pv <- pv / in_degree                        # per node
//! pv(y) <- sum over edges x -> y of pv(x)     # DGL copy_u / sum
//! pv <- (1 - d) / N + d * pv
//! ```
//!
//! [`reverse_pagerank`] runs these three steps with `in_degree` = the number of in-neighbours a
//! node samples from (its in-degree in message flow) and the sum taken over the *reversed*
//! edges, so each node `v` splits its score evenly over its in-neighbours:
//!
//! ```text
//! share(v) = pv(v) / in_degree(v)             (0 when v has no in-neighbours)
//! pv'(u)   = (1 - d) / N + d * sum over message-flow edges u -> v of share(v)
//! ```
//!
//! In matrix form `pv' = (1 - d)/N + d * A * D^-1 * pv` with `A[u][v]` the number of edges
//! `u -> v` and `D = diag(in_degree)`: ordinary PageRank on the reversed graph, whose out-degree
//! is the message-flow in-degree. `share(v)` is the chance that `v`'s uniform neighbour pick
//! lands on a given in-neighbour, so the score estimates how often a node is read (Data
//! Tiering's weighted reverse PageRank, up to the fanout factor). Mass of nodes without
//! in-neighbours is dropped, not redistributed, as in the script, so the scores need not sum to
//! one; only their order matters.
//!
//! Note: the script itself, applied to a DGL graph whose edges point along message flow, sums
//! over the forward edges (`A^T * D^-1`), which ranks nodes by what they *read*; the two agree
//! on symmetric graphs. This module follows the direction the method intends.
//!
//! Worked example (`d = 0.85`, `N = 4`, base `(1 - d)/N = 0.0375`), message-flow edges
//! `0 -> 2, 1 -> 2, 0 -> 3, 2 -> 3`: in-degrees `[0, 0, 2, 2]`.
//!
//! ```text
//! iteration 1: shares  v2: 0.25/2 = 0.125 to {0, 1};  v3: 0.125 to {0, 2}
//!              sums    [0.25, 0.125, 0.125, 0]
//!              pv      [0.25, 0.14375, 0.14375, 0.0375]
//! iteration 2: shares  v2: 0.071875 to {0, 1};  v3: 0.01875 to {0, 2}
//!              sums    [0.090625, 0.071875, 0.01875, 0]
//!              pv      [0.11453125, 0.09859375, 0.0534375, 0.0375]
//! ```
//!
//! Node 0 is read whenever 2 or 3 samples and ranks first; node 3, which nobody reads from,
//! ranks last. [`reverse_pagerank`] takes the **CSR** (out-neighbours along message flow,
//! `Topology::load(store, Direction::Out)`, or [`transpose`] of the CSC): the pull
//! `pv'(u) = ... sum over out-neighbours v of share(v)` then writes each node once, which
//! splits across threads without atomics and sums in a fixed order, so the result does not
//! depend on the thread count.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;
use strata_io::resolve_threads;

use strata_graph::sampler::NeighborSampler;
use strata_graph::topology::Topology;

use crate::error::{GnnError, Result};

/// GIDS' damping factor (`--damp`).
pub const DEFAULT_DAMPING: f64 = 0.85;

/// GIDS' iteration count (`--K`).
pub const DEFAULT_ITERATIONS: usize = 20;

/// Nodes plus edges below which PageRank runs on the calling thread: spawning threads costs
/// tens of microseconds per iteration, more than a small graph's whole sweep.
const MIN_PARALLEL_WORK: u64 = 1 << 16;

/// Slot marker of a node outside the hot set.
const NOT_HOT: u32 = u32::MAX;

/// How the static hot set is ranked.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum HotRanking {
    /// Reverse PageRank ([`reverse_pagerank`]; GIDS' default).
    #[serde(rename = "reverse_pagerank")]
    ReversePageRank,
    /// Appearances over one pre-sampled epoch ([`presampling_counts`]; Helios).
    PreSampling,
    /// Degree ([`degree_scores`]).
    Degree,
    /// No hot set.
    None,
}

impl HotRanking {
    /// The name in config files.
    pub fn name(self) -> &'static str {
        match self {
            HotRanking::ReversePageRank => "reverse_pagerank",
            HotRanking::PreSampling => "presampling",
            HotRanking::Degree => "degree",
            HotRanking::None => "none",
        }
    }
}

/// Reverse PageRank scores, one per node (see the module docs for the exact update and the
/// direction).
///
/// `topo_out` is the **CSR**: `topo_out.neighbors(u)` are the nodes `v` with a message-flow
/// edge `u -> v` (the nodes that may sample `u`). GIDS uses `damping` [`DEFAULT_DAMPING`] and
/// `iterations` [`DEFAULT_ITERATIONS`]; `threads` 0 means one per core. Deterministic: each
/// node's sum runs in adjacency order whatever the thread count.
///
/// Memory: 20 bytes per node (two `f64` score vectors and a `u32` in-degree) besides the
/// topology. Time: `iterations` passes over the edges.
pub fn reverse_pagerank(
    topo_out: &Topology,
    damping: f64,
    iterations: usize,
    threads: usize,
) -> Vec<f64> {
    reverse_pagerank_with(topo_out, damping, iterations, threads, MIN_PARALLEL_WORK)
}

fn reverse_pagerank_with(
    topo_out: &Topology,
    damping: f64,
    iterations: usize,
    threads: usize,
    min_parallel_work: u64,
) -> Vec<f64> {
    let n = topo_out.num_nodes();
    if n == 0 {
        return Vec::new();
    }
    // Message-flow in-degree of v = how often v appears in the CSR's neighbour lists.
    let in_degree = occurrences(topo_out);
    let work = topo_out.num_edges() + n as u64;
    let parts = if work < min_parallel_work {
        1
    } else {
        resolve_threads(threads)
    };
    let bounds = balanced_bounds(&topo_out.indptr, parts);
    let base = (1.0 - damping) / n as f64;
    let mut pv = vec![1.0 / n as f64; n];
    let mut next = vec![0.0f64; n];
    for _ in 0..iterations {
        // pv <- pv / in_degree. A node without in-neighbours is never read below (nothing
        // samples from it), so its share is set to 0 only to keep infinities out.
        for_each_range(&bounds, &mut pv, |start, chunk| {
            for (x, &d) in chunk.iter_mut().zip(&in_degree[start..]) {
                *x = if d == 0 { 0.0 } else { *x / d as f64 };
            }
        });
        // pv'(u) = base + d * sum of the shares of the nodes that may sample u.
        let shares = &pv;
        for_each_range(&bounds, &mut next, |start, chunk| {
            for (i, out) in chunk.iter_mut().enumerate() {
                let u = (start + i) as u32;
                let sum: f64 = topo_out
                    .neighbors(u)
                    .iter()
                    .map(|&v| shares[v as usize])
                    .sum();
                *out = base + damping * sum;
            }
        });
        std::mem::swap(&mut pv, &mut next);
    }
    pv
}

/// The degree of each node in `topo` (its neighbour-list length) as a score.
///
/// For in-neighbour sampling the degree that predicts reads is the message-flow out-degree (how
/// many nodes may pick this one): pass the CSR, or call [`reverse_degree_scores`] on the CSC.
/// Passing the CSC ranks by in-degree, which many tools use and which is the same on symmetric
/// graphs.
pub fn degree_scores(topo: &Topology) -> Vec<f64> {
    topo.indptr
        .windows(2)
        .map(|w| (w[1] - w[0]) as f64)
        .collect()
}

/// How many times each node appears as a neighbour in `topo`: its degree in the other
/// direction (the message-flow out-degree when `topo` is the CSC), without building the
/// transpose.
pub fn reverse_degree_scores(topo: &Topology) -> Vec<f64> {
    occurrences(topo).into_iter().map(|c| c as f64).collect()
}

/// The same graph with every edge reversed: the CSR from the CSC and back. Neighbour lists come
/// out in increasing order of the original row (a counting sort, O(nodes + edges)).
///
/// Memory: a second topology, plus 8 bytes per node while building.
pub fn transpose(topo: &Topology) -> Topology {
    let n = topo.num_nodes();
    let mut indptr = vec![0u64; n + 1];
    for &v in &topo.indices {
        indptr[v as usize + 1] += 1;
    }
    for i in 0..n {
        indptr[i + 1] += indptr[i];
    }
    let mut fill = indptr[..n].to_vec();
    let mut indices = vec![0u32; topo.indices.len()];
    for u in 0..n as u32 {
        for &v in topo.neighbors(u) {
            let at = &mut fill[v as usize];
            indices[*at as usize] = u;
            *at += 1;
        }
    }
    Topology {
        indptr,
        indices,
        columns: Default::default(),
    }
}

/// How many times each node appears in `Sample::nodes` over one pre-sampling epoch (Helios
/// §3.2: "one epoch of pre-sampling ... collect all vertices' hotness").
///
/// Batch `i` of `batches` is sampled with `batch_key = i`, exactly as
/// [`NeighborSampler::sample`] would for that key; a node counts at most once per batch (the
/// sample's nodes are distinct), so a count is at most `batches.len()`. Batches are spread over
/// `threads` workers (0: one per core); the counts do not depend on the thread count. The
/// sampler may split large frontiers over its own threads too, so with many workers give it
/// `threads: 1`.
///
/// Errors: the first sampler error by batch index (e.g. a seed out of range or repeated).
/// Memory: 4 bytes per node, plus one sample per worker.
pub fn presampling_counts<B: AsRef<[u32]> + Sync>(
    sampler: &NeighborSampler,
    topo: &Topology,
    batches: &[B],
    threads: usize,
) -> Result<Vec<u32>> {
    let counts: Vec<AtomicU32> = (0..topo.num_nodes()).map(|_| AtomicU32::new(0)).collect();
    let workers = resolve_threads(threads).min(batches.len()).max(1);
    // Workers take batches in increasing order, so when one fails every lower batch has been
    // taken and will finish: the lowest failing index is found whatever the timing.
    let cursor = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let failure: Mutex<Option<(usize, GnnError)>> = Mutex::new(None);
    let work = || loop {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let i = cursor.fetch_add(1, Ordering::Relaxed);
        let Some(batch) = batches.get(i) else {
            return;
        };
        match sampler.sample(topo, batch.as_ref(), i as u64) {
            Ok(sample) => {
                for &v in &sample.nodes {
                    // Addition commutes, so relaxed increments give the same totals in any
                    // order.
                    counts[v as usize].fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                let mut slot = failure.lock().unwrap_or_else(|p| p.into_inner());
                let lower = match slot.as_ref() {
                    Some((j, _)) => i < *j,
                    None => true,
                };
                if lower {
                    *slot = Some((i, e.into()));
                }
                return;
            }
        }
    };
    if workers == 1 {
        work();
    } else {
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(work);
            }
        });
    }
    if let Some((_, e)) = failure.into_inner().unwrap_or_else(|p| p.into_inner()) {
        return Err(e);
    }
    Ok(counts.into_iter().map(AtomicU32::into_inner).collect())
}

/// The ids of the `k` highest-scoring nodes, best first; equal scores go to the lower id, and
/// scores that compare with nothing (NaN) rank last. All of them when `k >= scores.len()`.
///
/// O(n + k log k): a selection puts the best `k` in front, then only those are sorted. Memory:
/// 4 bytes per node while selecting.
pub fn top_k<T: PartialOrd + Copy>(scores: &[T], k: usize) -> Vec<u32> {
    let k = k.min(scores.len());
    if k == 0 {
        return Vec::new();
    }
    let better = |&a: &u32, &b: &u32| {
        let (x, y) = (scores[a as usize], scores[b as usize]);
        let by_score = match (y.partial_cmp(&x), x.partial_cmp(&x), y.partial_cmp(&y)) {
            // Higher score first.
            (Some(o), _, _) => o,
            // At least one is NaN-like: it goes last; two of them tie.
            (None, None, None) => std::cmp::Ordering::Equal,
            (None, None, _) => std::cmp::Ordering::Greater,
            (None, _, _) => std::cmp::Ordering::Less,
        };
        by_score.then(a.cmp(&b))
    };
    let mut ids: Vec<u32> = (0..scores.len() as u32).collect();
    if k < ids.len() {
        ids.select_nth_unstable_by(k - 1, better);
        ids.truncate(k);
    }
    // `better` is a total order (ties broken by id), so the unstable sort is deterministic.
    ids.sort_unstable_by(better);
    ids
}

/// The index of the static hot set: node id -> slot in the hot rows, and slot -> node id.
///
/// Memory: 4 bytes per graph node (the slot map, for an O(1) lookup without hashing) plus 4
/// bytes per hot node; the feature rows themselves are held elsewhere, `row_bytes` per slot in
/// slot order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HotSet {
    /// Per graph node: its slot, or `NOT_HOT`.
    slot: Vec<u32>,
    /// Per slot: the node whose row it holds.
    rows: Vec<u32>,
}

impl HotSet {
    /// A hot set of `nodes` (distinct ids below `num_nodes`) in that slot order, usually best
    /// first as from [`top_k`].
    pub fn new(num_nodes: usize, nodes: &[u32]) -> Result<HotSet> {
        if nodes.len() >= NOT_HOT as usize {
            return Err(GnnError::Config(format!(
                "hot set: {} nodes; at most {} fit 32-bit slots",
                nodes.len(),
                NOT_HOT as usize - 1
            )));
        }
        let mut slot = vec![NOT_HOT; num_nodes];
        for (i, &v) in nodes.iter().enumerate() {
            let Some(s) = slot.get_mut(v as usize) else {
                return Err(GnnError::Config(format!(
                    "hot set: node {v} is out of range ({num_nodes} nodes)"
                )));
            };
            if *s != NOT_HOT {
                return Err(GnnError::Config(format!(
                    "hot set: node {v} is listed twice"
                )));
            }
            *s = i as u32;
        }
        Ok(HotSet {
            slot,
            rows: nodes.to_vec(),
        })
    }

    /// The `k` best nodes by `scores` ([`top_k`]), best in slot 0.
    pub fn from_scores<T: PartialOrd + Copy>(scores: &[T], k: usize) -> HotSet {
        HotSet::new(scores.len(), &top_k(scores, k)).expect("top_k returns distinct ids")
    }

    /// The slot holding `v`'s row, or `None` when `v` is not hot (or out of range).
    #[inline]
    pub fn lookup(&self, v: u32) -> Option<u32> {
        match self.slot.get(v as usize) {
            Some(&s) if s != NOT_HOT => Some(s),
            _ => None,
        }
    }

    /// Whether `v` is hot.
    #[inline]
    pub fn contains(&self, v: u32) -> bool {
        self.lookup(v).is_some()
    }

    /// Hot nodes (rows).
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no node is hot.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The node of each slot, in slot order: the order the feature rows are to be loaded in.
    pub fn nodes(&self) -> &[u32] {
        &self.rows
    }

    /// Nodes of the graph the index covers.
    pub fn num_nodes(&self) -> usize {
        self.slot.len()
    }

    /// Bytes the index holds: 4 per graph node plus 4 per hot node (rows not included).
    pub fn bytes(&self) -> u64 {
        4 * (self.slot.len() as u64 + self.rows.len() as u64)
    }
}

/// Per node, how many times it appears in `topo`'s neighbour lists (saturating at `u32::MAX`).
fn occurrences(topo: &Topology) -> Vec<u32> {
    let mut counts = vec![0u32; topo.num_nodes()];
    for &v in &topo.indices {
        let c = &mut counts[v as usize];
        *c = c.saturating_add(1);
    }
    counts
}

/// `parts + 1` node boundaries splitting `0..n` into ranges of about equal nodes + edges (a
/// pull costs one visit per node and one per edge; splitting by nodes alone would leave a
/// thread with all the hubs).
fn balanced_bounds(indptr: &[u64], parts: usize) -> Vec<usize> {
    let n = indptr.len() - 1;
    let total = indptr[n] + n as u64;
    let parts = parts.clamp(1, n.max(1));
    let mut bounds: Vec<usize> = (0..=parts)
        .map(|p| {
            let target = (total as u128 * p as u128 / parts as u128) as u64;
            // First node whose start (edges before it + nodes before it) reaches the target.
            let (mut lo, mut hi) = (0usize, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if indptr[mid] + (mid as u64) < target {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        })
        .collect();
    bounds[parts] = n;
    bounds.dedup();
    if bounds.len() == 1 {
        bounds.push(n);
    }
    bounds
}

/// Runs `f(start, chunk)` over the ranges `bounds[i]..bounds[i + 1]` of `data`, one thread per
/// range (on the calling thread when there is one).
fn for_each_range<F>(bounds: &[usize], data: &mut [f64], f: F)
where
    F: Fn(usize, &mut [f64]) + Sync,
{
    if bounds.len() <= 2 {
        f(0, data);
        return;
    }
    std::thread::scope(|s| {
        let mut rest = data;
        for w in bounds.windows(2) {
            let (chunk, tail) = rest.split_at_mut(w[1] - w[0]);
            rest = tail;
            let f = &f;
            s.spawn(move || f(w[0], chunk));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use strata_graph::sampler::SamplerConfig;

    /// CSR from message-flow edges `(u, v)` (`u -> v`), neighbour lists in edge order.
    fn csr(n: usize, edges: &[(u32, u32)]) -> Topology {
        let mut lists = vec![Vec::new(); n];
        for &(u, v) in edges {
            lists[u as usize].push(v);
        }
        from_lists(&lists)
    }

    fn from_lists(lists: &[Vec<u32>]) -> Topology {
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        for l in lists {
            indices.extend_from_slice(l);
            indptr.push(indices.len() as u64);
        }
        Topology::new(indptr, indices).unwrap()
    }

    /// Dense reference: `pv' = (1 - d)/N + d * M * pv` with `M[u][v] = (edges u -> v) /
    /// in_degree(v)`.
    fn dense_reverse_pagerank(n: usize, edges: &[(u32, u32)], d: f64, k: usize) -> Vec<f64> {
        let mut in_degree = vec![0.0; n];
        for &(_, v) in edges {
            in_degree[v as usize] += 1.0;
        }
        let mut m = vec![vec![0.0; n]; n];
        for &(u, v) in edges {
            m[u as usize][v as usize] += 1.0 / in_degree[v as usize];
        }
        let mut pv = vec![1.0 / n as f64; n];
        for _ in 0..k {
            pv = (0..n)
                .map(|u| (1.0 - d) / n as f64 + d * (0..n).map(|v| m[u][v] * pv[v]).sum::<f64>())
                .collect();
        }
        pv
    }

    fn assert_close(a: &[f64], b: &[f64]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!(
                (x - y).abs() < 1e-12,
                "node {i}: {x} vs {y} ({a:?} vs {b:?})"
            );
        }
    }

    #[test]
    fn reverse_pagerank_matches_the_hand_computed_example() {
        // The module docs' example. Message flow 0 -> 2, 1 -> 2, 0 -> 3, 2 -> 3; in-degrees
        // [0, 0, 2, 2]; base (1 - 0.85)/4 = 0.0375.
        let topo = csr(4, &[(0, 2), (1, 2), (0, 3), (2, 3)]);
        // Iteration 1 from pv = 0.25: v2 sends 0.25/2 = 0.125 to each in-neighbour (0, 1), v3
        // sends 0.125 to 0 and 2; nodes 0 and 1 have no in-neighbours and send nothing.
        // Sums [0.25, 0.125, 0.125, 0] -> 0.0375 + 0.85 * sums.
        let one = [0.25, 0.14375, 0.14375, 0.0375];
        assert_close(&reverse_pagerank(&topo, 0.85, 1, 1), &one);
        // Iteration 2: v2 sends 0.14375/2 = 0.071875 to 0 and 1, v3 sends 0.0375/2 = 0.01875
        // to 0 and 2. Sums [0.090625, 0.071875, 0.01875, 0].
        let two = [0.11453125, 0.09859375, 0.0534375, 0.0375];
        assert_close(&reverse_pagerank(&topo, 0.85, 2, 1), &two);
        // Node 0 feeds both sampled-from nodes and ranks first; 3 is read by nobody.
        assert_eq!(top_k(&two, 4), [0, 1, 2, 3]);
        // The CSC gives the same through transpose.
        let csc = transpose(&topo);
        assert_eq!(csc.neighbors(2), &[0, 1]);
        assert_eq!(csc.neighbors(3), &[0, 2]);
        assert_eq!(transpose(&csc), topo);
        // Zero iterations leave the uniform start.
        assert_close(&reverse_pagerank(&topo, 0.85, 0, 1), &[0.25; 4]);
        assert!(reverse_pagerank(&csr(0, &[]), 0.85, 20, 1).is_empty());
    }

    #[test]
    fn reverse_pagerank_favours_what_is_read_not_what_reads() {
        // A star along message flow: the centre 0 aggregates leaves 1..=5 (edges i -> 0).
        // Sampling 0 reads the leaves; nothing ever reads 0 as a neighbour.
        let edges: Vec<(u32, u32)> = (1..=5).map(|i| (i, 0)).collect();
        let pr = reverse_pagerank(&csr(6, &edges), DEFAULT_DAMPING, DEFAULT_ITERATIONS, 1);
        for leaf in 1..=5 {
            assert!(pr[leaf] > pr[0], "{pr:?}");
        }
        // Reversed (0 -> i): each leaf samples only 0, which is then read by all of them.
        let edges: Vec<(u32, u32)> = (1..=5).map(|i| (0, i)).collect();
        let pr = reverse_pagerank(&csr(6, &edges), DEFAULT_DAMPING, DEFAULT_ITERATIONS, 1);
        assert_eq!(top_k(&pr, 1), [0]);
    }

    #[test]
    fn reverse_pagerank_splits_large_graphs_the_same_way() {
        let n = 20_000u32;
        let edges: Vec<(u32, u32)> = (0..n)
            .flat_map(|u| (1..=4).map(move |j| (u, (u * 7 + j * j * 131) % n)))
            .chain((0..100).map(|u| (0, u)))
            .collect();
        let topo = csr(n as usize, &edges);
        let one = reverse_pagerank(&topo, 0.85, 5, 1);
        assert_eq!(one, reverse_pagerank(&topo, 0.85, 5, 4));
        assert_eq!(one, reverse_pagerank(&topo, 0.85, 5, 0));
    }

    fn graph() -> impl Strategy<Value = (usize, Vec<(u32, u32)>)> {
        (1usize..12).prop_flat_map(|n| {
            (
                Just(n),
                prop::collection::vec((0..n as u32, 0..n as u32), 0..40),
            )
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn reverse_pagerank_matches_the_dense_reference(
            (n, edges) in graph(),
            d in 0.0f64..1.0,
            k in 0usize..25,
            threads in 1usize..5,
        ) {
            let topo = csr(n, &edges);
            let want = dense_reverse_pagerank(n, &edges, d, k);
            assert_close(&reverse_pagerank_with(&topo, d, k, 1, 0), &want);
            // Split over threads even when tiny: the same bits.
            prop_assert_eq!(
                reverse_pagerank_with(&topo, d, k, threads, 0),
                reverse_pagerank_with(&topo, d, k, 1, 0)
            );
        }

        #[test]
        fn degrees_and_transpose_agree((n, mut edges) in graph()) {
            // Transposing lists neighbours in increasing order, so twice gives sorted lists.
            edges.sort_unstable();
            let out = csr(n, &edges);
            let csc = transpose(&out);
            prop_assert_eq!(csc.num_edges(), out.num_edges());
            prop_assert_eq!(transpose(&csc), out.clone());
            prop_assert_eq!(degree_scores(&out), reverse_degree_scores(&csc));
            prop_assert_eq!(degree_scores(&csc), reverse_degree_scores(&out));
            for v in 0..n as u32 {
                let ins = edges.iter().filter(|e| e.1 == v).count() as u64;
                prop_assert_eq!(csc.degree(v), ins);
            }
        }

        #[test]
        fn top_k_matches_a_full_sort(
            scores in prop::collection::vec(prop_oneof![
                (0u8..6).prop_map(|x| x as f64),
                Just(f64::NAN),
                any::<f64>(),
            ], 0..60),
            k in 0usize..70,
        ) {
            let mut all: Vec<u32> = (0..scores.len() as u32).collect();
            // Full sort: NaN last, then by score descending, then by id.
            all.sort_by(|&a, &b| {
                let (x, y) = (scores[a as usize], scores[b as usize]);
                x.is_nan()
                    .cmp(&y.is_nan())
                    .then(y.partial_cmp(&x).unwrap_or(std::cmp::Ordering::Equal))
                    .then(a.cmp(&b))
            });
            all.truncate(k);
            prop_assert_eq!(top_k(&scores, k), all);
        }

        #[test]
        fn presampling_counts_equal_a_brute_force_count(
            lists in prop::collection::vec(prop::collection::btree_set(0u32..30, 0..6), 30),
            batches in prop::collection::vec(prop::collection::btree_set(0u32..30, 0..8), 0..12),
            threads in 1usize..5,
        ) {
            let lists: Vec<Vec<u32>> = lists.into_iter().map(|s| s.into_iter().collect()).collect();
            let topo = from_lists(&lists);
            let batches: Vec<Vec<u32>> = batches.into_iter().map(|s| s.into_iter().collect()).collect();
            let sampler = NeighborSampler::new(SamplerConfig {
                fanouts: vec![2, 2],
                seed: 7,
                threads: 1,
                ..SamplerConfig::default()
            })
            .unwrap();
            let mut want = vec![0u32; 30];
            for (i, b) in batches.iter().enumerate() {
                for &v in &sampler.sample(&topo, b, i as u64).unwrap().nodes {
                    want[v as usize] += 1;
                }
            }
            prop_assert_eq!(presampling_counts(&sampler, &topo, &batches, threads).unwrap(), want);
        }
    }

    #[test]
    fn presampling_reports_the_first_bad_batch() {
        let topo = from_lists(&[vec![1], vec![0], vec![]]);
        let sampler = NeighborSampler::new(SamplerConfig {
            fanouts: vec![1],
            seed: 0,
            threads: 1,
            ..SamplerConfig::default()
        })
        .unwrap();
        let batches = vec![vec![0u32], vec![1], vec![2, 2], vec![0], vec![9]];
        for threads in [1, 2, 4] {
            let msg = presampling_counts(&sampler, &topo, &batches, threads)
                .unwrap_err()
                .to_string();
            assert!(msg.contains("node 2 appears twice"), "{msg}");
        }
        let empty: &[Vec<u32>] = &[];
        assert_eq!(
            presampling_counts(&sampler, &topo, empty, 0).unwrap(),
            [0, 0, 0]
        );
        // Slices work as batches too.
        let slices: Vec<&[u32]> = vec![&[0], &[2]];
        assert_eq!(
            presampling_counts(&sampler, &topo, &slices, 2).unwrap(),
            [1, 1, 1]
        );
    }

    #[test]
    fn hot_set_indexes_slots() {
        let hot = HotSet::new(6, &[4, 1, 5]).unwrap();
        assert_eq!(hot.len(), 3);
        assert_eq!(hot.lookup(4), Some(0));
        assert_eq!(hot.lookup(1), Some(1));
        assert_eq!(hot.lookup(5), Some(2));
        assert_eq!(hot.lookup(0), None);
        assert_eq!(hot.lookup(99), None);
        assert!(hot.contains(5) && !hot.contains(3));
        assert_eq!(hot.nodes(), &[4, 1, 5]);
        assert_eq!(hot.num_nodes(), 6);
        assert_eq!(hot.bytes(), 4 * 9);

        let hot = HotSet::from_scores(&[0.1, 0.9, 0.5, 0.9], 2);
        assert_eq!(hot.nodes(), &[1, 3]);
        assert!(HotSet::from_scores::<f64>(&[], 5).is_empty());

        let msg = HotSet::new(3, &[0, 3]).unwrap_err().to_string();
        assert!(msg.contains("node 3 is out of range"), "{msg}");
        let msg = HotSet::new(3, &[1, 0, 1]).unwrap_err().to_string();
        assert!(msg.contains("node 1 is listed twice"), "{msg}");
    }

    #[test]
    fn rankings_have_config_names() {
        for (r, name) in [
            (HotRanking::ReversePageRank, "reverse_pagerank"),
            (HotRanking::PreSampling, "presampling"),
            (HotRanking::Degree, "degree"),
            (HotRanking::None, "none"),
        ] {
            assert_eq!(r.name(), name);
            assert_eq!(serde_json::to_string(&r).unwrap(), format!("\"{name}\""));
            assert_eq!(
                serde_json::from_str::<HotRanking>(&format!("\"{name}\"")).unwrap(),
                r
            );
        }
        assert!(serde_json::from_str::<HotRanking>("\"pagerank\"").is_err());
    }

    #[test]
    fn balanced_bounds_cover_every_node() {
        let indptr = [0u64, 100, 100, 101, 102, 103, 200];
        for parts in 1..10 {
            let b = balanced_bounds(&indptr, parts);
            assert_eq!(b[0], 0);
            assert_eq!(*b.last().unwrap(), 6);
            assert!(b.windows(2).all(|w| w[0] < w[1]), "{b:?}");
        }
        assert_eq!(balanced_bounds(&[0], 4), [0, 0]);
    }
}
