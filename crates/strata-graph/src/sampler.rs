//! Multi-layer uniform neighbour sampling (GraphSAGE; DGL's `MultiLayerNeighborSampler`, PyG's
//! `NeighborLoader`): turns a batch of seed nodes into the message-flow blocks a mini-batch GNN
//! computes over.
//!
//! Every random choice is a pure function of `(seed, batch_key, layer, node)` through
//! [`strata_store::rng::derive`], so a batch's sample does not depend on the thread count, on
//! how the frontier was split, or on which other nodes share the batch.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

use strata_store::rng::{derive, Rng};

use crate::error::{GraphError, Result};
use crate::topology::Adjacency;
#[cfg(test)]
use crate::topology::Topology;

/// Domain separators, so the neighbour choices and the negative destinations of the same
/// `(seed, batch_key)` are unrelated streams.
const NEIGHBOR_STREAM: u64 = 0x5a3f_1e00;
const NEGATIVE_STREAM: u64 = 0x4e6a_7100;

/// Frontier nodes below which a layer is sampled on the calling thread: spawning threads costs
/// tens of microseconds, more than sampling a few hundred nodes.
const MIN_CHUNK: usize = 512;

/// Up to this many picks, Floyd's membership test scans the picks so far; beyond, a hash set
/// keeps it O(1) (a linear scan over a 1000-neighbour pick would be quadratic).
const LINEAR_PICKS: usize = 32;

/// How a batch is sampled.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplerConfig {
    /// Neighbours kept per node at each hop, from the seeds outwards as in PyG's
    /// `num_neighbors` (`[15, 10]`: 15 neighbours of each seed, then 10 of each node known
    /// after the first hop); `-1` keeps the whole neighbourhood (layer-wise inference). One
    /// entry per GNN layer. Note that DGL lists its fanouts the other way round (input layer
    /// first).
    pub fanouts: Vec<i32>,
    /// Root of all randomness; with the batch key it fixes the sample.
    pub seed: u64,
    /// Threads sampling a layer's frontier; 0 means one per core.
    pub threads: usize,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            fanouts: vec![15, 10],
            seed: 0,
            threads: 0,
        }
    }
}

impl SamplerConfig {
    /// Checks every value's range; errors name the option as it appears in the config file.
    pub fn validate(&self) -> Result<()> {
        if self.fanouts.is_empty() {
            return Err(GraphError::Config(
                "gnn.fanouts: must list at least one hop (one fanout per GNN layer)".into(),
            ));
        }
        if let Some((hop, &f)) = self
            .fanouts
            .iter()
            .enumerate()
            .find(|(_, &f)| f != -1 && f < 1)
        {
            return Err(GraphError::Config(format!(
                "gnn.fanouts: entry {hop} is {f}; each fanout must be at least 1, or -1 for the \
                 full neighbourhood"
            )));
        }
        Ok(())
    }
}

/// One GNN layer's bipartite message-flow graph (DGL's block) in local ids.
///
/// Destination `i` is `Sample::nodes[i]` for `i < num_dst`, source `j` is `Sample::nodes[j]`
/// for `j < num_src`; since destinations are a prefix of sources, a layer's output rows for
/// the destinations are the first `num_dst` rows of its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Source (input) nodes: the first `num_src` of the sample's nodes.
    pub num_src: usize,
    /// Destination (output) nodes: the first `num_dst` of the sample's nodes; `num_dst <=
    /// num_src`.
    pub num_dst: usize,
    /// CSC over destinations, `num_dst + 1` offsets into `indices`: the sampled in-edges of
    /// destination `i` come from `indices[indptr[i]..indptr[i + 1]]`.
    pub indptr: Vec<u64>,
    /// Local source ids, each `< num_src`.
    pub indices: Vec<u32>,
}

impl Block {
    /// Sampled edges in this block.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// Local sources of destination `i`.
    pub fn sources(&self, i: usize) -> &[u32] {
        &self.indices[self.indptr[i] as usize..self.indptr[i + 1] as usize]
    }
}

/// The sampled computation graph of one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Global ids of all distinct nodes, indexed by local id: the seeds first (local ids `0..`
    /// number of seeds, in the order given), then the nodes first reached at hop 1, then hop 2,
    /// and so on. Feature rows are gathered in this order.
    pub nodes: Vec<u32>,
    /// Nodes first reached at each hop, `fanouts.len() + 1` entries (hop 0: the seeds); PyG's
    /// `num_sampled_nodes`.
    pub hop_counts: Vec<usize>,
    /// One block per GNN layer in DGL order: `blocks[0]` is the input layer (outermost hop,
    /// sources = all nodes) and `blocks.last()` produces the seeds. The block of hop `h` is
    /// `blocks[fanouts.len() - h]`.
    pub blocks: Vec<Block>,
    /// Sampled edges at each hop, hop 1 first, `fanouts.len()` entries; PyG's
    /// `num_sampled_edges`.
    pub edges_per_hop: Vec<usize>,
}

impl Sample {
    /// Number of seeds: the first rows of `nodes` and the destinations of the last block.
    pub fn num_seeds(&self) -> usize {
        self.hop_counts[0]
    }

    /// Sampled edges over all hops.
    pub fn num_edges(&self) -> usize {
        self.edges_per_hop.iter().sum()
    }

    /// All sampled edges in one COO list, `(row, col)` = (local source, local destination),
    /// both of length `num_edges()`: hop 1's edges first, then hop 2's, ..., so slicing by
    /// `edges_per_hop` recovers each hop (PyG's `edge_index` in `source_to_target` flow, which
    /// its `trim_to_layer` slices the same way).
    ///
    /// Unlike PyG, which expands only the nodes first reached at the previous hop, each hop
    /// here re-samples every node known so far (DGL's blocks), so hop `h >= 2` also holds
    /// fresh edges into nodes of earlier hops.
    pub fn edge_index(&self) -> (Vec<u32>, Vec<u32>) {
        let total = self.num_edges();
        let (mut row, mut col) = (Vec::with_capacity(total), Vec::with_capacity(total));
        for block in self.blocks.iter().rev() {
            for dst in 0..block.num_dst {
                let sources = block.sources(dst);
                row.extend_from_slice(sources);
                col.resize(row.len(), dst as u32);
            }
        }
        (row, col)
    }
}

/// A link-prediction batch: the positive edges, their negatives, and the sample around all
/// their endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSample {
    /// Sampled around the distinct endpoints (sources, then destinations, then negative
    /// destinations, in order of first appearance), which are its seeds.
    pub sample: Sample,
    /// Local id of each positive edge's source, one per edge.
    pub src_local: Vec<u32>,
    /// Local id of each positive edge's destination, one per edge.
    pub dst_local: Vec<u32>,
    /// Local ids of the negative destinations, `negatives_per_edge` per edge, edge-major
    /// (edge `i`'s are `[i * negatives_per_edge, (i + 1) * negatives_per_edge)`); each pairs
    /// with `src_local[i]`.
    pub neg_dst_local: Vec<u32>,
}

/// Samples batches; cheap to share between threads (`&self`).
#[derive(Debug, Clone)]
pub struct NeighborSampler {
    config: SamplerConfig,
    threads: usize,
    min_chunk: usize,
}

impl NeighborSampler {
    /// Validates the config and resolves `threads = 0` to the core count.
    pub fn new(config: SamplerConfig) -> Result<NeighborSampler> {
        config.validate()?;
        let threads = strata_io::resolve_threads(config.threads);
        Ok(NeighborSampler {
            config,
            threads,
            min_chunk: MIN_CHUNK,
        })
    }

    /// The validated config (`threads` as given, 0 unresolved).
    pub fn config(&self) -> &SamplerConfig {
        &self.config
    }

    /// Samples the GNN computation graph of `seeds` (global node ids, distinct, in the order
    /// the output rows should have).
    ///
    /// At hop `h` (1-based), every node known after hop `h - 1` keeps `fanouts[h - 1]` of its
    /// neighbours in `topo` chosen uniformly without replacement (all of them if it has no
    /// more, or if the fanout is -1). With a multigraph, distinct edges are chosen, so a
    /// neighbour may repeat. `batch_key` distinguishes batches (e.g. `epoch << 32 | batch`):
    /// the same `(seed, batch_key)` gives the same sample.
    pub fn sample<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        seeds: &[u32],
        batch_key: u64,
    ) -> Result<Sample> {
        check_in_range(topo, seeds, "seeds")?;
        let mut local = IdMap::with_capacity_and_hasher(seeds.len(), Default::default());
        for (i, &v) in seeds.iter().enumerate() {
            if local.insert(v, i as u32).is_some() {
                return Err(GraphError::Config(format!(
                    "sampler: seeds must be distinct; node {v} appears twice"
                )));
            }
        }
        Ok(self.expand(topo, seeds.to_vec(), local, batch_key))
    }

    /// Samples a link-prediction batch: positive edges `src[i] -> dst[i]` (equal lengths;
    /// repeated endpoints are fine), each with `negatives_per_edge` destinations drawn
    /// uniformly from all nodes (they may occasionally be true neighbours, as with PyG's
    /// `neg_sampling="binary"`), and the neighbourhood sample of every endpoint.
    pub fn sample_links<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        src: &[u32],
        dst: &[u32],
        negatives_per_edge: usize,
        batch_key: u64,
    ) -> Result<LinkSample> {
        if src.len() != dst.len() {
            return Err(GraphError::Config(format!(
                "sampler: {} edge sources but {} destinations; they must pair up",
                src.len(),
                dst.len()
            )));
        }
        check_in_range(topo, src, "edge sources")?;
        check_in_range(topo, dst, "edge destinations")?;
        let num_negatives = src.len().checked_mul(negatives_per_edge).ok_or_else(|| {
            GraphError::Config(format!(
                "sampler: {} edges times {negatives_per_edge} negatives overflows",
                src.len()
            ))
        })?;
        // Uniform over all nodes; a checked range above means there is at least one when
        // there are edges to draw for.
        let num_nodes = topo.num_nodes() as u64;
        let mut rng = Rng::new(derive(derive(self.config.seed, NEGATIVE_STREAM), batch_key));
        let negatives: Vec<u32> = (0..num_negatives)
            .map(|_| rng.below(num_nodes) as u32)
            .collect();

        let mut seeds = Vec::new();
        let mut local = IdMap::default();
        let mut to_local = |v: u32| {
            let next = seeds.len() as u32;
            *local.entry(v).or_insert_with(|| {
                seeds.push(v);
                next
            })
        };
        let src_local: Vec<u32> = src.iter().map(|&v| to_local(v)).collect();
        let dst_local: Vec<u32> = dst.iter().map(|&v| to_local(v)).collect();
        let neg_dst_local: Vec<u32> = negatives.iter().map(|&v| to_local(v)).collect();
        Ok(LinkSample {
            sample: self.expand(topo, seeds, local, batch_key),
            src_local,
            dst_local,
            neg_dst_local,
        })
    }

    /// Runs the hops from validated, distinct `seeds` whose local ids are already in `local`.
    fn expand<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        seeds: Vec<u32>,
        mut local: IdMap,
        batch_key: u64,
    ) -> Sample {
        let batch = derive(derive(self.config.seed, NEIGHBOR_STREAM), batch_key);
        let hops = self.config.fanouts.len();
        let mut nodes = seeds;
        let mut hop_counts = vec![nodes.len()];
        let mut blocks = Vec::with_capacity(hops);
        for (hop, &fanout) in self.config.fanouts.iter().enumerate() {
            let num_dst = nodes.len();
            let chunks = self.sample_layer(topo, &nodes, fanout, derive(batch, hop as u64));
            // Relabelling is serial and in destination order, so local ids do not depend on
            // how the frontier was split.
            let total = chunks.iter().map(|c| c.neighbors.len()).sum();
            let mut indptr = Vec::with_capacity(num_dst + 1);
            indptr.push(0u64);
            let mut indices = Vec::with_capacity(total);
            for chunk in &chunks {
                let mut at = 0;
                for &kept in &chunk.kept {
                    for &u in &chunk.neighbors[at..at + kept] {
                        let next = nodes.len() as u32;
                        indices.push(*local.entry(u).or_insert_with(|| {
                            nodes.push(u);
                            next
                        }));
                    }
                    at += kept;
                    indptr.push(indices.len() as u64);
                }
            }
            hop_counts.push(nodes.len() - num_dst);
            blocks.push(Block {
                num_src: nodes.len(),
                num_dst,
                indptr,
                indices,
            });
        }
        blocks.reverse();
        let edges_per_hop = blocks.iter().rev().map(Block::num_edges).collect();
        Sample {
            nodes,
            hop_counts,
            blocks,
            edges_per_hop,
        }
    }

    /// Samples the neighbours of every node of `frontier`, in order, split over threads.
    fn sample_layer<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        frontier: &[u32],
        fanout: i32,
        layer_key: u64,
    ) -> Vec<Chunk> {
        let parts = self.threads.min(frontier.len().div_ceil(self.min_chunk));
        if parts <= 1 {
            return vec![sample_chunk(topo, frontier, fanout, layer_key)];
        }
        let chunk_len = frontier.len().div_ceil(parts);
        std::thread::scope(|scope| {
            let handles: Vec<_> = frontier
                .chunks(chunk_len)
                .map(|part| scope.spawn(move || sample_chunk(topo, part, fanout, layer_key)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }
}

/// Sampled neighbours (global ids) of consecutive frontier nodes.
struct Chunk {
    /// Neighbours kept by each node, in frontier order.
    kept: Vec<usize>,
    /// The kept neighbours, node after node, each node's in adjacency order.
    neighbors: Vec<u32>,
}

fn sample_chunk<A: Adjacency + ?Sized>(
    topo: &A,
    part: &[u32],
    fanout: i32,
    layer_key: u64,
) -> Chunk {
    let mut chunk = Chunk {
        kept: Vec::with_capacity(part.len()),
        neighbors: Vec::new(),
    };
    let mut picks = Picks::default();
    for &v in part {
        let adjacency = topo.neighbors(v);
        let before = chunk.neighbors.len();
        if fanout < 0 || adjacency.len() <= fanout as usize {
            chunk.neighbors.extend_from_slice(adjacency);
        } else {
            let mut rng = Rng::new(derive(layer_key, v as u64));
            picks.choose(&mut rng, adjacency.len() as u64, fanout as usize);
            chunk
                .neighbors
                .extend(picks.positions.iter().map(|&p| adjacency[p as usize]));
        }
        chunk.kept.push(chunk.neighbors.len() - before);
    }
    chunk
}

/// Scratch of Floyd's sampling, reused across the nodes of a chunk so that a hub costs
/// O(fanout) memory, never O(degree).
#[derive(Default)]
struct Picks {
    positions: Vec<u64>,
    seen: HashSet<u64, BuildHasherDefault<IdHasher>>,
}

impl Picks {
    /// Leaves in `positions` `k` distinct positions out of `0..d`, every k-subset equally
    /// likely (Floyd's algorithm: k draws, whatever `d`), in increasing order so that the
    /// neighbours are read in adjacency order.
    fn choose(&mut self, rng: &mut Rng, d: u64, k: usize) {
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

/// Global node id -> local id. Node ids are not adversarial, so the std SipHash's
/// flood resistance is not worth its cost on this hot path.
type IdMap = HashMap<u32, u32, BuildHasherDefault<IdHasher>>;

/// FxHash-style multiplicative hashing for integer keys.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // The product's high bits are its best mixed; the table indexes buckets by the low
        // bits, so rotate them down (as rustc-hash 2 does).
        self.0.rotate_left(26)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(b as u64);
        }
    }

    fn write_u32(&mut self, x: u32) {
        self.write_u64(x as u64);
    }

    fn write_u64(&mut self, x: u64) {
        self.0 = (self.0.rotate_left(5) ^ x).wrapping_mul(0xF135_7AEA_2E62_A9C5);
    }
}

fn check_in_range<A: Adjacency + ?Sized>(topo: &A, ids: &[u32], what: &str) -> Result<()> {
    let n = topo.num_nodes();
    match ids.iter().find(|&&v| v as usize >= n) {
        Some(v) => Err(GraphError::Config(format!(
            "sampler: {what} include node {v}, out of range (the graph has {n} nodes)"
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn sampler(fanouts: &[i32], threads: usize) -> NeighborSampler {
        let mut s = NeighborSampler::new(SamplerConfig {
            fanouts: fanouts.to_vec(),
            seed: 42,
            threads,
        })
        .unwrap();
        // Split even tiny frontiers, so the tests exercise the threaded path.
        s.min_chunk = 1;
        s
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

    /// Node 0 points to `1..=degree`; the others have no neighbours.
    fn star(degree: u32) -> Topology {
        let mut lists = vec![(1..=degree).collect::<Vec<_>>()];
        lists.resize(degree as usize + 1, Vec::new());
        from_lists(&lists)
    }

    /// Random graphs without parallel edges, a distinct seed list and fanouts.
    fn case() -> impl Strategy<Value = (Topology, Vec<u32>, Vec<i32>)> {
        (1usize..40)
            .prop_flat_map(|n| {
                let lists = prop::collection::vec(
                    prop::collection::btree_set(0..n as u32, 0..n.min(12)),
                    n,
                );
                let seeds = Just((0..n as u32).collect::<Vec<_>>()).prop_shuffle();
                (lists, seeds, 1..=n)
            })
            .prop_flat_map(|(lists, seeds, num_seeds)| {
                let lists: Vec<Vec<u32>> =
                    lists.into_iter().map(|s| s.into_iter().collect()).collect();
                let fanouts = prop::collection::vec(prop_oneof![Just(-1), 1i32..6], 1..4);
                (
                    Just(from_lists(&lists)),
                    Just(seeds[..num_seeds].to_vec()),
                    fanouts,
                )
            })
    }

    /// Every structural promise of `Sample`, checked against the topology.
    fn check_sample(topo: &Topology, seeds: &[u32], fanouts: &[i32], s: &Sample) {
        let hops = fanouts.len();
        assert_eq!(&s.nodes[..seeds.len()], seeds);
        assert_eq!(s.hop_counts.len(), hops + 1);
        assert_eq!(s.hop_counts[0], seeds.len());
        assert_eq!(s.hop_counts.iter().sum::<usize>(), s.nodes.len());
        assert_eq!(s.blocks.len(), hops);
        assert_eq!(s.edges_per_hop.len(), hops);
        let distinct: BTreeSet<u32> = s.nodes.iter().copied().collect();
        assert_eq!(distinct.len(), s.nodes.len(), "nodes repeat");

        for hop in 1..=hops {
            let block = &s.blocks[hops - hop];
            let known_before: usize = s.hop_counts[..hop].iter().sum();
            assert_eq!(block.num_dst, known_before);
            assert_eq!(block.num_src, known_before + s.hop_counts[hop]);
            assert_eq!(block.indptr.len(), block.num_dst + 1);
            assert_eq!(*block.indptr.last().unwrap() as usize, block.indices.len());
            assert_eq!(s.edges_per_hop[hop - 1], block.num_edges());
            let mut reached = BTreeSet::new();
            for dst in 0..block.num_dst {
                let v = s.nodes[dst];
                let adjacency: BTreeSet<u32> = topo.neighbors(v).iter().copied().collect();
                let sources = block.sources(dst);
                let chosen: BTreeSet<u32> = sources
                    .iter()
                    .map(|&j| {
                        assert!((j as usize) < block.num_src, "source id out of range");
                        reached.insert(j);
                        s.nodes[j as usize]
                    })
                    .collect();
                assert_eq!(chosen.len(), sources.len(), "a neighbour is kept twice");
                assert!(
                    chosen.is_subset(&adjacency),
                    "a sampled edge is not in the graph"
                );
                let fanout = fanouts[hop - 1];
                let want = if fanout < 0 {
                    adjacency.len()
                } else {
                    adjacency.len().min(fanout as usize)
                };
                assert_eq!(sources.len(), want, "node {v} at hop {hop}");
                if fanout < 0 {
                    assert_eq!(chosen, adjacency);
                }
            }
            // The nodes new at this hop are exactly the sources not seen before.
            let new: BTreeSet<u32> = (known_before as u32..block.num_src as u32).collect();
            let reached_new: BTreeSet<u32> = reached
                .into_iter()
                .filter(|&j| j as usize >= known_before)
                .collect();
            assert_eq!(reached_new, new);
        }
        // Consecutive blocks chain: a layer's outputs are the next layer's inputs.
        for pair in s.blocks.windows(2) {
            assert_eq!(pair[0].num_dst, pair[1].num_src);
        }
        if let Some(last) = s.blocks.last() {
            assert_eq!(last.num_dst, seeds.len());
        }
        assert_eq!(s.blocks[0].num_src, s.nodes.len());

        let (row, col) = s.edge_index();
        assert_eq!(row.len(), s.num_edges());
        assert_eq!(col.len(), s.num_edges());
        let mut at = 0;
        for hop in 1..=hops {
            let block = &s.blocks[hops - hop];
            for dst in 0..block.num_dst {
                for &src in block.sources(dst) {
                    assert_eq!((row[at], col[at]), (src, dst as u32));
                    at += 1;
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn samples_are_well_formed((topo, seeds, fanouts) in case(), key in any::<u64>()) {
            let s = sampler(&fanouts, 3).sample(&topo, &seeds, key).unwrap();
            check_sample(&topo, &seeds, &fanouts, &s);
        }

        #[test]
        fn thread_count_does_not_matter((topo, seeds, fanouts) in case(), key in any::<u64>()) {
            let one = sampler(&fanouts, 1).sample(&topo, &seeds, key).unwrap();
            let three = sampler(&fanouts, 3).sample(&topo, &seeds, key).unwrap();
            prop_assert_eq!(one, three);
        }

        #[test]
        fn link_ids_map_back(
            (topo, nodes, fanouts) in case(),
            picks in prop::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>()), 0..10),
            negatives in 0usize..4,
            key in any::<u64>(),
        ) {
            let src: Vec<u32> = picks.iter().map(|(a, _)| *a.get(&nodes)).collect();
            let dst: Vec<u32> = picks.iter().map(|(_, b)| *b.get(&nodes)).collect();
            let links = sampler(&fanouts, 2)
                .sample_links(&topo, &src, &dst, negatives, key)
                .unwrap();
            let s = &links.sample;
            let global = |l: &[u32]| l.iter().map(|&i| s.nodes[i as usize]).collect::<Vec<_>>();
            prop_assert_eq!(global(&links.src_local), src.clone());
            prop_assert_eq!(global(&links.dst_local), dst.clone());
            prop_assert_eq!(links.neg_dst_local.len(), src.len() * negatives);
            let mut seeds: Vec<u32> = Vec::new();
            for v in src.iter().chain(&dst).chain(&global(&links.neg_dst_local)) {
                if !seeds.contains(v) {
                    seeds.push(*v);
                }
            }
            prop_assert_eq!(s.num_seeds(), seeds.len());
            for &i in links.src_local.iter().chain(&links.dst_local).chain(&links.neg_dst_local) {
                prop_assert!((i as usize) < s.num_seeds());
            }
            check_sample(&topo, &seeds, &fanouts, s);
        }
    }

    #[test]
    fn neighbours_do_not_depend_on_the_rest_of_the_batch() {
        let topo = star(50);
        let alone = sampler(&[5], 1).sample(&topo, &[0], 9).unwrap();
        let shared = sampler(&[5], 1).sample(&topo, &[3, 0], 9).unwrap();
        let globals = |s: &Sample, dst: usize| -> Vec<u32> {
            let b = s.blocks.last().unwrap();
            b.sources(dst)
                .iter()
                .map(|&j| s.nodes[j as usize])
                .collect()
        };
        assert_eq!(globals(&alone, 0), globals(&shared, 1));
    }

    #[test]
    fn batch_keys_and_seeds_change_the_sample() {
        let topo = star(50);
        let s = sampler(&[5], 1);
        let samples: BTreeSet<Vec<u32>> = (0..10)
            .map(|k| s.sample(&topo, &[0], k).unwrap().nodes)
            .collect();
        assert!(
            samples.len() >= 9,
            "only {} distinct samples",
            samples.len()
        );
        let reseeded = NeighborSampler::new(SamplerConfig {
            seed: 43,
            ..s.config().clone()
        })
        .unwrap();
        assert_ne!(
            s.sample(&topo, &[0], 0).unwrap(),
            reseeded.sample(&topo, &[0], 0).unwrap()
        );
        // And a fixed key gives the same sample again.
        assert_eq!(
            s.sample(&topo, &[0], 7).unwrap(),
            s.sample(&topo, &[0], 7).unwrap()
        );
    }

    #[test]
    fn choices_are_uniform() {
        // Degree 10, fanout 2: each neighbour is kept with probability 1/5 and each of the 45
        // pairs with probability 1/45.
        let topo = star(10);
        let s = sampler(&[2], 1);
        let trials = 20_000;
        let mut singles = [0u32; 10];
        let mut pairs = HashMap::new();
        for key in 0..trials {
            let sample = s.sample(&topo, &[0], key).unwrap();
            let kept: Vec<u32> = sample.nodes[1..].to_vec();
            assert_eq!(kept.len(), 2);
            for &v in &kept {
                singles[v as usize - 1] += 1;
            }
            let (a, b) = (kept[0].min(kept[1]), kept[0].max(kept[1]));
            *pairs.entry((a, b)).or_insert(0u32) += 1;
        }
        let chi2 = |counts: &[u32], expected: f64| -> f64 {
            counts
                .iter()
                .map(|&c| (c as f64 - expected).powi(2) / expected)
                .sum()
        };
        for &c in &singles {
            let freq = c as f64 / trials as f64;
            assert!((freq - 0.2).abs() < 0.015, "frequencies {singles:?}");
        }
        // 9 degrees of freedom: P(chi2 > 40) is about 1e-5.
        let single_chi2 = chi2(&singles, trials as f64 * 2.0 / 10.0);
        assert!(single_chi2 < 40.0, "chi2 {single_chi2}: {singles:?}");
        assert_eq!(pairs.len(), 45);
        // 44 degrees of freedom: P(chi2 > 100) is below 1e-5.
        let pair_counts: Vec<u32> = pairs.values().copied().collect();
        let pair_chi2 = chi2(&pair_counts, trials as f64 / 45.0);
        assert!(pair_chi2 < 100.0, "chi2 {pair_chi2}");
    }

    #[test]
    fn hubs_keep_distinct_neighbours_both_ways() {
        let topo = star(100_000);
        for fanout in [LINEAR_PICKS as i32, LINEAR_PICKS as i32 + 1, 1000] {
            let s = sampler(&[fanout], 1).sample(&topo, &[0], 5).unwrap();
            check_sample(&topo, &[0], &[fanout], &s);
            assert_eq!(s.num_edges(), fanout as usize);
        }
        let full = sampler(&[-1], 1).sample(&topo, &[0], 5).unwrap();
        assert_eq!(full.nodes.len(), 100_001);
    }

    #[test]
    fn large_frontiers_split_the_same_way_at_the_default_chunk_size() {
        // Enough nodes that the default chunking really spreads over threads.
        let n = 5000u32;
        let lists: Vec<Vec<u32>> = (0..n)
            .map(|v| (1..=7).map(|d| (v * 31 + d * 977) % n).collect())
            .collect();
        let topo = from_lists(&lists);
        let seeds: Vec<u32> = (0..n).step_by(3).collect();
        let config = |threads| SamplerConfig {
            fanouts: vec![3, 2],
            seed: 1,
            threads,
        };
        let one = NeighborSampler::new(config(1)).unwrap();
        let many = NeighborSampler::new(config(4)).unwrap();
        let all = NeighborSampler::new(config(0)).unwrap();
        let s = one.sample(&topo, &seeds, 11).unwrap();
        assert_eq!(s, many.sample(&topo, &seeds, 11).unwrap());
        assert_eq!(s, all.sample(&topo, &seeds, 11).unwrap());
    }

    #[test]
    fn empty_batches_are_empty() {
        let topo = star(3);
        let s = sampler(&[2, 2], 2).sample(&topo, &[], 0).unwrap();
        assert!(s.nodes.is_empty());
        assert_eq!(s.hop_counts, [0, 0, 0]);
        assert_eq!(s.blocks.len(), 2);
        assert_eq!(s.edge_index(), (vec![], vec![]));
        let links = sampler(&[2], 1)
            .sample_links(&topo, &[], &[], 3, 0)
            .unwrap();
        assert!(links.neg_dst_local.is_empty() && links.sample.nodes.is_empty());
    }

    #[test]
    fn rejects_bad_config_and_inputs() {
        let err = |r: Result<NeighborSampler>| r.unwrap_err().to_string();
        let cfg = |fanouts: Vec<i32>| SamplerConfig {
            fanouts,
            ..SamplerConfig::default()
        };
        assert!(err(NeighborSampler::new(cfg(vec![]))).starts_with("gnn.fanouts:"));
        for bad in [vec![0], vec![5, -2], vec![i32::MIN]] {
            let msg = err(NeighborSampler::new(cfg(bad)));
            assert!(msg.starts_with("gnn.fanouts:"), "{msg}");
        }
        assert!(NeighborSampler::new(cfg(vec![-1, 1, i32::MAX])).is_ok());

        let topo = star(4);
        let s = sampler(&[2], 1);
        let msg = s.sample(&topo, &[1, 2, 1], 0).unwrap_err().to_string();
        assert!(msg.contains("node 1 appears twice"), "{msg}");
        let msg = s.sample(&topo, &[1, 5], 0).unwrap_err().to_string();
        assert!(msg.contains("node 5") && msg.contains("5 nodes"), "{msg}");
        let msg = s
            .sample_links(&topo, &[1, 2], &[3], 1, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("2 edge sources but 1 destinations"), "{msg}");
        let msg = s
            .sample_links(&topo, &[1], &[9], 1, 0)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("destinations include node 9"), "{msg}");
    }

    #[test]
    fn config_reads_from_json() {
        let c: SamplerConfig =
            serde_json::from_str(r#"{"fanouts": [25, 10], "seed": 3, "threads": 2}"#).unwrap();
        assert_eq!(c.fanouts, [25, 10]);
        assert!(serde_json::from_str::<SamplerConfig>(
            r#"{"fanouts": [1], "seed": 0, "threads": 0, "replace": true}"#
        )
        .is_err());
    }
}
