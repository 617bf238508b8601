//! Graph reorganization (GLIST §4.3.2, Alg. 2): renumbers vertices so that a vertex and its
//! `h`-hop neighbourhood get consecutive ids. Feature rows are stored in id order, so the rows a
//! sampled request reads then share pages instead of touching one page each.
//!
//! The algorithm, with the paper's parameters:
//!
//! 1. **Important vertices (centres).** The `Cn` ([`ReorderParams::centers`]) highest
//!    in-degree vertices whose in-degree is below `Td` ([`ReorderParams::max_degree`]); ties go
//!    to the lower id. `Td` keeps hubs out: a hub's neighbourhood spans many pages, so placing
//!    it contiguously gains little. As in the paper's Fig. 5 example, `Td = 0` means no limit.
//! 2. **Working sets.** A centre's working set is the centre plus every vertex within `h`
//!    ([`ReorderParams::hops`]) hops along the neighbour lists. For the overlap comparison a set
//!    of `N` vertices is represented, as in the paper, by `ceil(sqrt(N))` of them, chosen at
//!    random but *coordinated*: each vertex has one random rank (a hash of the seed and its id)
//!    and a set keeps its lowest-ranked members (a bottom-k sketch). Independent samples of two
//!    sets would almost never share a vertex, even for identical sets; coordinated samples share
//!    a vertex whenever it ranks low in both. Sets of at most
//!    [`ReorderParams::sample_above`] vertices are compared exactly.
//! 3. **Chain.** Starting from the highest-degree centre, repeatedly append the remaining
//!    centre whose (sampled) working set shares the most vertices with the current one's.
//! 4. **New ids.** Walking the chain, each centre and then its true (unsampled) neighbourhood
//!    in breadth-first order take the next free ids; a vertex keeps the id of its first
//!    appearance. Vertices in no working set follow in increasing old-id order.
//!
//! The paper gives no default for `h`, `Cn` or `Td`. Ours ([`ReorderParams::default`]):
//! `h = 1`, because every sampled request reads its seed's first-hop neighbours, which are
//! therefore the rows worth putting on the seed's page, while 2-hop sets are `degree` times
//! larger and overlap so much that they stop telling localities apart; `Cn` chosen so that the
//! working sets cover the graph (see [`ReorderParams::centers`]); `Td` unlimited, because the
//! degree at which a neighbourhood outgrows a page depends on the feature row size, which only
//! the caller knows.

use std::cmp::Reverse;

use strata_store::registry::Named;
use strata_store::rng::{derive, Rng};

use super::{inverse, Bfs, Input, NodeOrder};
use crate::error::{GraphError, Result};
use crate::topology::Adjacency;
use crate::Topology;

/// Default [`ReorderParams::sample_above`]: sets this small cost no more to compare exactly
/// than through a sample, and exact counts keep small overlaps (2 vs 3 shared vertices, as in
/// the paper's example) apart.
pub const DEFAULT_SAMPLE_ABOVE: usize = 64;

/// Largest accepted [`ReorderParams::hops`].
pub const MAX_HOPS: u32 = 4;

/// Upper bound on the automatic centre count: the chain's inverted index and counters are
/// per centre, so this caps their memory on huge sparse graphs.
const MAX_AUTO_CENTERS: usize = 1_000_000;

/// Streams derived from a seed, one per use, so that the working-set ranks and the metric's
/// vertex draws are unrelated even under the same seed.
const RANK_STREAM: u64 = 1;
const PAGES_STREAM: u64 = 2;

/// Parameters of [`reorganize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReorderParams {
    /// `h`: hops of a centre's working set, `1..=MAX_HOPS`.
    pub hops: u32,
    /// `Cn`: number of centres. 0 = enough to cover the graph: with `d` the mean in-degree and
    /// `n` the vertex count, a working set holds about `s = min(n, 1 + d + ... + d^h)`
    /// vertices, so `ceil(n / s)` centres (at most 1,000,000 and at most `n`).
    pub centers: usize,
    /// `Td`: only vertices with in-degree strictly below this become centres; 0 = no limit.
    pub max_degree: u64,
    /// Working sets of more than this many vertices are compared through a `ceil(sqrt(N))`
    /// sample; 0 = [`DEFAULT_SAMPLE_ABOVE`].
    pub sample_above: usize,
    /// Seed of the sampling; the same seed gives the same reordering.
    pub seed: u64,
}

impl Default for ReorderParams {
    fn default() -> Self {
        ReorderParams {
            hops: 1,
            centers: 0,
            max_degree: 0,
            sample_above: DEFAULT_SAMPLE_ABOVE,
            seed: 0,
        }
    }
}

/// The result of [`reorganize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reordering {
    /// `new_of_old[old] = new`: a permutation of `0..num_nodes`.
    pub new_of_old: Vec<u32>,
    /// The centres in chain order, old ids.
    pub sequence: Vec<u32>,
    /// Number of vertices placed through a centre's working set; they hold new ids
    /// `0..covered`, the rest follow in old-id order.
    pub covered: usize,
}

impl Reordering {
    /// The inverse permutation: `old_of_new[new] = old`, i.e. the old ids in storage order.
    pub fn old_of_new(&self) -> Vec<u32> {
        inverse(&self.new_of_old)
    }
}

/// GLIST's Alg. 2 with its default parameters ([`ReorderParams::default`]), over the
/// in-neighbour lists, as the graph service registers a store.
pub struct Glist;

impl Named for Glist {
    const NAME: &'static str = "glist";
    const HELP: &'static str = "GLIST's Alg. 2 vertex re-ordering with the graph service's default parameters: chained centres, each followed by its in-neighbours, over the CSC";
}

impl NodeOrder for Glist {
    fn input(&self) -> Input {
        Input::InNeighbours
    }

    /// Per vertex: the centre candidates (16 bytes), the inverted index's offsets and live
    /// lengths (16), the centres' flags and counters (5), the search's stamps (4) and the two
    /// permutations (8); per entry: the working sets' samples and their inverted index (8).
    fn work_bytes(&self) -> (u64, u64) {
        (49, 8)
    }

    fn order(&self, adj: &Topology) -> Result<Vec<u32>> {
        Ok(reorganize(adj, &ReorderParams::default())?.old_of_new())
    }
}

/// Renumbers the vertices of `adj` (whose neighbour lists are the in-neighbours, the direction
/// the sampler walks) by GLIST's Alg. 2; see the module documentation.
///
/// Time: the breadth-first searches of the centres' neighbourhoods (twice: once to sample,
/// once to assign ids), a sort of the vertices by degree, and the chain's overlap counting,
/// which touches only the centres that share a sampled vertex with the current one.
pub fn reorganize<A: Adjacency + ?Sized>(adj: &A, params: &ReorderParams) -> Result<Reordering> {
    if params.hops == 0 || params.hops > MAX_HOPS {
        return Err(GraphError::Config(format!(
            "hops must be in 1..={MAX_HOPS}, got {}: an h-hop neighbourhood grows like \
             degree^h, so beyond {MAX_HOPS} hops working sets span most of the graph and no \
             longer tell localities apart",
            params.hops
        )));
    }
    let n = adj.num_nodes();
    if n > u32::MAX as usize {
        return Err(GraphError::Config(format!(
            "adj: {n} vertices do not fit 32-bit ids"
        )));
    }
    let centres = important_vertices(adj, params);
    let sample_above = match params.sample_above {
        0 => DEFAULT_SAMPLE_ABOVE,
        s => s,
    };
    let mut bfs = Bfs::new(n);
    let samples = sample_working_sets(adj, &centres, params, sample_above, &mut bfs);
    let chain = chain_by_overlap(n, &samples);
    let sequence: Vec<u32> = chain.iter().map(|&c| centres[c]).collect();

    const UNASSIGNED: u32 = u32::MAX;
    let mut new_of_old = vec![UNASSIGNED; n];
    let mut next_id = 0u32;
    for &centre in &sequence {
        // The true neighbourhood, not the sample: every vertex the sampler may read next to
        // the centre should land near it.
        for &v in bfs.run(adj, centre, params.hops) {
            if new_of_old[v as usize] == UNASSIGNED {
                new_of_old[v as usize] = next_id;
                next_id += 1;
            }
        }
    }
    let covered = next_id as usize;
    for id in new_of_old.iter_mut().filter(|id| **id == UNASSIGNED) {
        *id = next_id;
        next_id += 1;
    }
    Ok(Reordering {
        new_of_old,
        sequence,
        covered,
    })
}

/// Step 1: the centres, highest in-degree first (ties: lower id).
fn important_vertices<A: Adjacency + ?Sized>(adj: &A, params: &ReorderParams) -> Vec<u32> {
    let n = adj.num_nodes();
    let degree = |v: u32| adj.neighbors(v).len() as u64;
    let mut eligible: Vec<(Reverse<u64>, u32)> = (0..n as u32)
        .map(|v| (Reverse(degree(v)), v))
        .filter(|&(Reverse(d), _)| params.max_degree == 0 || d < params.max_degree)
        .collect();
    let wanted = match params.centers {
        0 => auto_centers(adj, params.hops),
        c => c,
    };
    let count = wanted.min(eligible.len());
    if count == 0 {
        return Vec::new();
    }
    // Only the top `count` need sorting; on a large graph they are a small fraction.
    if count < eligible.len() {
        eligible.select_nth_unstable(count - 1);
        eligible.truncate(count);
    }
    eligible.sort_unstable();
    eligible.into_iter().map(|(_, v)| v).collect()
}

/// The automatic `Cn`: enough centres for their working sets to cover the graph, estimating a
/// working set's size from the mean in-degree.
fn auto_centers<A: Adjacency + ?Sized>(adj: &A, hops: u32) -> usize {
    let n = adj.num_nodes();
    if n == 0 {
        return 0;
    }
    let edges: u64 = (0..n as u32).map(|v| adj.neighbors(v).len() as u64).sum();
    let mean_degree = edges as f64 / n as f64;
    let set_size = (0..=hops)
        .map(|k| mean_degree.powi(k as i32))
        .sum::<f64>()
        .min(n as f64);
    let centres = (n as f64 / set_size).ceil() as usize;
    centres.clamp(1, MAX_AUTO_CENTERS.min(n))
}

/// Working-set samples of all centres, flattened: centre `c`'s are
/// `vertices[offsets[c]..offsets[c + 1]]`.
struct Samples {
    offsets: Vec<usize>,
    vertices: Vec<u32>,
}

impl Samples {
    fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    fn of(&self, centre: usize) -> &[u32] {
        &self.vertices[self.offsets[centre]..self.offsets[centre + 1]]
    }
}

/// Step 2: each centre's working set, reduced to a coordinated `ceil(sqrt(N))` sample when it
/// has more than `sample_above` vertices.
fn sample_working_sets<A: Adjacency + ?Sized>(
    adj: &A,
    centres: &[u32],
    params: &ReorderParams,
    sample_above: usize,
    bfs: &mut Bfs,
) -> Samples {
    let rank_key = derive(params.seed, RANK_STREAM);
    let mut samples = Samples {
        offsets: vec![0],
        vertices: Vec::new(),
    };
    let mut ranked: Vec<(u64, u32)> = Vec::new();
    for &centre in centres {
        let set = bfs.run(adj, centre, params.hops);
        if set.len() <= sample_above {
            samples.vertices.extend_from_slice(set);
        } else {
            let keep = (set.len() as f64).sqrt().ceil() as usize;
            ranked.clear();
            ranked.extend(set.iter().map(|&v| (derive(rank_key, v as u64), v)));
            ranked.select_nth_unstable(keep - 1);
            samples
                .vertices
                .extend(ranked[..keep].iter().map(|&(_, v)| v));
        }
        samples.offsets.push(samples.vertices.len());
    }
    samples
}

/// Step 3: the greedy chain over centre indices (index = degree rank, so a lower index is a
/// higher degree). Overlaps with the current centre are counted through an inverted index
/// (vertex -> centres whose sample holds it), so only centres that share a vertex with the
/// current one are looked at, instead of comparing every pair.
fn chain_by_overlap(n: usize, samples: &Samples) -> Vec<usize> {
    let centres = samples.len();
    if centres == 0 {
        return Vec::new();
    }
    // Inverted index in compressed form; a list holds centres in increasing index.
    let mut starts = vec![0usize; n + 1];
    for &v in &samples.vertices {
        starts[v as usize + 1] += 1;
    }
    for v in 0..n {
        starts[v + 1] += starts[v];
    }
    let mut holders = vec![0u32; samples.vertices.len()];
    // Live length of each list: chained centres are dropped when a scan meets them, so each
    // index entry is skipped at most once after its centre is used.
    let mut live = vec![0usize; n];
    for c in 0..centres {
        for &v in samples.of(c) {
            holders[starts[v as usize] + live[v as usize]] = c as u32;
            live[v as usize] += 1;
        }
    }

    let mut used = vec![false; centres];
    let mut shared = vec![0u32; centres];
    let mut touched: Vec<usize> = Vec::new();
    let mut first_unused = 0;
    let mut current = 0;
    used[0] = true;
    let mut chain = Vec::with_capacity(centres);
    chain.push(0);
    for _ in 1..centres {
        for &v in samples.of(current) {
            let v = v as usize;
            let list = &mut holders[starts[v]..starts[v] + live[v]];
            let mut kept = 0;
            for i in 0..list.len() {
                let c = list[i] as usize;
                if used[c] {
                    continue;
                }
                list[kept] = c as u32;
                kept += 1;
                if shared[c] == 0 {
                    touched.push(c);
                }
                shared[c] += 1;
            }
            live[v] = kept;
        }
        // Most shared vertices; ties to the higher degree, i.e. the lower index.
        let best = touched
            .iter()
            .copied()
            .max_by_key(|&c| (shared[c], Reverse(c)));
        for &c in &touched {
            shared[c] = 0;
        }
        touched.clear();
        let next = match best {
            Some(c) => c,
            None => {
                // No remaining centre overlaps: restart from the highest-degree one left.
                while used[first_unused] {
                    first_unused += 1;
                }
                first_unused
            }
        };
        used[next] = true;
        chain.push(next);
        current = next;
    }
    chain
}

/// The mean number of distinct pages that a vertex's `hops`-hop neighbourhood (the vertex
/// included) touches, over `sample` vertices drawn uniformly (with replacement) from `seed`.
/// A vertex's feature row sits on page `id / rows_per_page`, with `id` its new id under
/// `new_of_old` (`None`: the current ids). The lower, the fewer page reads a sampled request
/// costs; reorganization should lower it.
///
/// Errors: `rows_per_page == 0`, or a `new_of_old` whose length is not the vertex count.
pub fn mean_pages_per_neighbourhood<A: Adjacency + ?Sized>(
    adj: &A,
    new_of_old: Option<&[u32]>,
    rows_per_page: usize,
    hops: u32,
    sample: usize,
    seed: u64,
) -> Result<f64> {
    let n = adj.num_nodes();
    if rows_per_page == 0 {
        return Err(GraphError::Config(
            "rows_per_page must be at least 1".into(),
        ));
    }
    if let Some(map) = new_of_old {
        if map.len() != n {
            return Err(GraphError::Config(format!(
                "new_of_old has {} entries for {n} vertices",
                map.len()
            )));
        }
    }
    if n == 0 || sample == 0 {
        return Ok(0.0);
    }
    let mut rng = Rng::new(derive(seed, PAGES_STREAM));
    let mut bfs = Bfs::new(n);
    let mut pages: Vec<u64> = Vec::new();
    let mut total = 0usize;
    for _ in 0..sample {
        let root = rng.below(n as u64) as u32;
        pages.clear();
        pages.extend(bfs.run(adj, root, hops).iter().map(|&v| {
            let id = new_of_old.map_or(v, |map| map[v as usize]);
            id as u64 / rows_per_page as u64
        }));
        pages.sort_unstable();
        pages.dedup();
        total += pages.len();
    }
    Ok(total as f64 / sample as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    // Named explicitly: proptest's prelude exports an `Rng` trait too.
    use strata_store::rng::Rng;

    /// A topology from explicit neighbour lists.
    fn graph(lists: &[Vec<u32>]) -> Topology {
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        for list in lists {
            indices.extend_from_slice(list);
            indptr.push(indices.len() as u64);
        }
        Topology::new(indptr, indices).unwrap()
    }

    fn params(hops: u32, centers: usize, max_degree: u64) -> ReorderParams {
        ReorderParams {
            hops,
            centers,
            max_degree,
            ..ReorderParams::default()
        }
    }

    fn working_set(adj: &Topology, v: u32) -> std::collections::BTreeSet<u32> {
        Bfs::new(adj.num_nodes())
            .run(adj, v, 1)
            .iter()
            .copied()
            .collect()
    }

    #[test]
    fn paper_figure_5() {
        // An undirected graph consistent with everything §4.3.2 states about Fig. 5.
        let lists = vec![
            vec![5],             // V0
            vec![2, 8, 7],       // V1
            vec![5, 4, 1, 3],    // V2
            vec![2],             // V3
            vec![5, 2],          // V4
            vec![0, 4, 2, 7, 9], // V5: "its five one-hop neighbors V0, V4, V2, V7, and V9"
            vec![],              // V6: in no working set
            vec![5, 1],          // V7
            vec![1],             // V8
            vec![5],             // V9
        ];
        let adj = graph(&lists);
        for (v, list) in lists.iter().enumerate() {
            for &u in list {
                assert!(
                    lists[u as usize].contains(&(v as u32)),
                    "undirected {v}-{u}"
                );
            }
        }
        // The three important vertices are the top-3 degrees, all distinct.
        let mut by_degree: Vec<(usize, u32)> =
            (0..10).map(|v| (lists[v].len(), v as u32)).collect();
        by_degree.sort_by_key(|&(d, v)| (Reverse(d), v));
        assert_eq!(by_degree[..3], [(5, 5), (4, 2), (3, 1)]);
        assert!(by_degree[3].0 < 3);
        let (ws5, ws2, ws1) = (
            working_set(&adj, 5),
            working_set(&adj, 2),
            working_set(&adj, 1),
        );
        assert_eq!(ws5.intersection(&ws2).count(), 3);
        assert_eq!(ws2.intersection(&ws1).count(), 2);
        assert!(ws1.intersection(&ws5).count() < 3);
        assert!(![&ws5, &ws2, &ws1].iter().any(|ws| ws.contains(&6)));

        let r = reorganize(&adj, &params(1, 3, 0)).unwrap();
        assert_eq!(r.sequence, [5, 2, 1]);
        // "V5 and its five one-hop neighbors V0, V4, V2, V7, and V9 are assigned new IDs V0~V5."
        for (new, old) in [5, 0, 4, 2, 7, 9].into_iter().enumerate() {
            assert_eq!(r.new_of_old[old], new as u32, "old V{old}");
        }
        // "Then V2 and V1 follow": V2's unassigned neighbours V1, V3, then V1's V8.
        assert_eq!(r.new_of_old[1], 6);
        assert_eq!(r.new_of_old[3], 7);
        assert_eq!(r.new_of_old[8], 8);
        assert_eq!(r.covered, 9);
        // "Finally, the procedure finds the remaining vertex ... (V6)".
        assert_eq!(r.new_of_old[6], 9);
        assert_eq!(r.old_of_new(), [5, 0, 4, 2, 7, 9, 1, 3, 8, 6]);
    }

    #[test]
    fn degree_threshold_excludes_hubs_and_centre_count_is_honoured() {
        // A star around V0 (degree 9) and vertices 1..=9 of degree 1..=2.
        let mut lists: Vec<Vec<u32>> = (0..10)
            .map(|v| if v == 0 { vec![] } else { vec![0] })
            .collect();
        lists[0] = (1..10).collect();
        lists[1].push(2);
        lists[2].push(1);
        lists[3].push(4);
        lists[4].push(3);
        let adj = graph(&lists);
        let all = reorganize(&adj, &params(1, 3, 0)).unwrap();
        assert_eq!(all.sequence.len(), 3);
        assert_eq!(all.sequence[0], 0, "the hub leads without a threshold");
        let no_hub = reorganize(&adj, &params(1, 3, 5)).unwrap();
        assert_eq!(no_hub.sequence.len(), 3);
        assert!(!no_hub.sequence.contains(&0), "{:?}", no_hub.sequence);
        assert_eq!(no_hub.sequence[0], 1, "degree 2, lowest id");
        // Td = 2 leaves only degree-1 vertices; Cn larger than that just takes them all.
        let low = reorganize(&adj, &params(1, 100, 2)).unwrap();
        let mut centres = low.sequence.clone();
        centres.sort_unstable();
        assert_eq!(centres, [5, 6, 7, 8, 9]);
        // Nothing qualifies: plain old-id order.
        let none = reorganize(&adj, &params(1, 3, 1)).unwrap();
        assert!(none.sequence.is_empty());
        assert_eq!(none.covered, 0);
        assert_eq!(none.new_of_old, (0..10).collect::<Vec<u32>>());
    }

    #[test]
    fn automatic_centre_count_follows_mean_degree() {
        // A ring: mean degree 2, so a 1-hop working set holds about 3 vertices.
        let n = 30u32;
        let lists: Vec<Vec<u32>> = (0..n).map(|v| vec![(v + n - 1) % n, (v + 1) % n]).collect();
        let adj = graph(&lists);
        let r = reorganize(&adj, &params(1, 0, 0)).unwrap();
        assert_eq!(r.sequence.len(), 10);
        let r2 = reorganize(&adj, &params(2, 0, 0)).unwrap();
        assert_eq!(r2.sequence.len(), 5, "1 + 2 + 4 = 7 vertices a set");
        let empty = graph(&[]);
        let r = reorganize(&empty, &ReorderParams::default()).unwrap();
        assert!(r.new_of_old.is_empty() && r.sequence.is_empty());
    }

    #[test]
    fn rejects_bad_hops() {
        let adj = graph(&[vec![]]);
        for hops in [0, MAX_HOPS + 1] {
            match reorganize(&adj, &params(hops, 0, 0)) {
                Err(GraphError::Config(m)) => assert!(m.contains("hops"), "{m}"),
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(
            mean_pages_per_neighbourhood(&adj, None, 0, 1, 1, 0),
            Err(GraphError::Config(_))
        ));
        assert!(matches!(
            mean_pages_per_neighbourhood(&adj, Some(&[0, 1]), 4, 1, 1, 0),
            Err(GraphError::Config(_))
        ));
    }

    /// A graph of `communities` groups of `size` vertices, each vertex linked both ways to
    /// `degree` random members of its group, with ids shuffled so that no group is contiguous.
    fn planted_communities(communities: u32, size: u32, degree: u32, seed: u64) -> Topology {
        let n = communities * size;
        let mut rng = Rng::new(derive(seed, 1));
        let mut shuffled: Vec<u32> = (0..n).collect();
        for i in (1..n as usize).rev() {
            shuffled.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let mut lists = vec![Vec::new(); n as usize];
        for v in 0..n {
            let base = v / size * size;
            for _ in 0..degree {
                let u = base + rng.below(size as u64) as u32;
                if u != v {
                    let (a, b) = (shuffled[v as usize], shuffled[u as usize]);
                    lists[a as usize].push(b);
                    lists[b as usize].push(a);
                }
            }
        }
        for list in &mut lists {
            list.sort_unstable();
            list.dedup();
        }
        graph(&lists)
    }

    #[test]
    fn reorganization_lowers_pages_per_neighbourhood() {
        let adj = planted_communities(200, 64, 4, 3);
        let r = reorganize(&adj, &ReorderParams::default()).unwrap();
        let before = mean_pages_per_neighbourhood(&adj, None, 32, 1, 2000, 9).unwrap();
        let after =
            mean_pages_per_neighbourhood(&adj, Some(&r.new_of_old), 32, 1, 2000, 9).unwrap();
        assert!(after < before * 0.5, "pages {before} -> {after}");
        // Sampled comparison (sets above 4 vertices) keeps most of the gain.
        let sampled = ReorderParams {
            sample_above: 4,
            ..ReorderParams::default()
        };
        let r = reorganize(&adj, &sampled).unwrap();
        let after_sampled =
            mean_pages_per_neighbourhood(&adj, Some(&r.new_of_old), 32, 1, 2000, 9).unwrap();
        assert!(
            after_sampled < before * 0.6,
            "pages {before} -> {after_sampled}"
        );
    }

    fn arb_graph() -> impl Strategy<Value = Topology> {
        (1usize..60).prop_flat_map(|n| {
            prop::collection::vec(prop::collection::vec(0..n as u32, 0..8), n)
                .prop_map(|lists| graph(&lists))
        })
    }

    fn arb_params() -> impl Strategy<Value = ReorderParams> {
        (
            1u32..=MAX_HOPS,
            0usize..20,
            0u64..8,
            0usize..6,
            any::<u64>(),
        )
            .prop_map(
                |(hops, centers, max_degree, sample_above, seed)| ReorderParams {
                    hops,
                    centers,
                    max_degree,
                    sample_above,
                    seed,
                },
            )
    }

    proptest! {
        #[test]
        fn is_a_deterministic_permutation(adj in arb_graph(), p in arb_params()) {
            let r = reorganize(&adj, &p).unwrap();
            let n = adj.num_nodes();
            let mut seen = vec![false; n];
            for &new in &r.new_of_old {
                prop_assert!((new as usize) < n && !seen[new as usize]);
                seen[new as usize] = true;
            }
            prop_assert_eq!(r.new_of_old.len(), n);
            prop_assert!(r.covered <= n);
            prop_assert!(r.covered >= r.sequence.len());
            // Each centre appears once, and each got a new id below `covered`.
            let mut centres = r.sequence.clone();
            centres.sort_unstable();
            centres.dedup();
            prop_assert_eq!(centres.len(), r.sequence.len());
            for &c in &r.sequence {
                prop_assert!((r.new_of_old[c as usize] as usize) < r.covered);
            }
            prop_assert_eq!(&reorganize(&adj, &p).unwrap(), &r);
        }
    }
}
