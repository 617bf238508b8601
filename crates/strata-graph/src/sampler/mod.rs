//! Multi-layer neighbour sampling (GraphSAGE; DGL's `MultiLayerNeighborSampler`, PyG's
//! `NeighborLoader`): turns a batch of seed nodes into the message-flow blocks a mini-batch GNN
//! computes over.
//!
//! This module grows the frontier hop by hop, deduplicates the nodes reached and builds the
//! blocks; which edges a node keeps is [`choose`]'s: uniformly ([`uniform`]), by edge weight
//! ([`weighted`]), only edges no later than the seed's time ([`temporal`], which makes the
//! sample disjoint per seed), and per edge type ([`typed`], which also groups a sample by
//! type).
//!
//! Every random choice is a pure function of `(seed, batch_key, layer, node)` (and, in a
//! temporal sample, the node's seed and its time) through [`strata_store::rng::derive`], so a
//! batch's sample does not depend on the thread count, on how the frontier was split, or on
//! which other nodes share the batch.

mod choose;
mod ids;
mod sample;
pub mod temporal;
pub mod typed;
mod uniform;
mod weighted;

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hash};

use strata_store::rng::{derive, Rng};

use crate::error::{GraphError, Result};
use crate::topology::Adjacency;
#[cfg(test)]
use crate::topology::Topology;
use choose::{Fanout, Rule, Scratch};
use ids::{DisjointMap, IdHasher, IdMap};
pub use sample::{Block, LinkSample, Sample};
use temporal::SeedTimes;
pub use temporal::TemporalStrategy;
pub use typed::HeteroSample;
pub use uniform::distinct;
#[cfg(test)]
use uniform::LINEAR_PICKS;

/// Domain separators, so the neighbour choices and the negative destinations of the same
/// `(seed, batch_key)` are unrelated streams.
const NEIGHBOR_STREAM: u64 = 0x5a3f_1e00;
const NEGATIVE_STREAM: u64 = 0x4e6a_7100;

/// Frontier nodes below which a layer is sampled on the calling thread: spawning threads costs
/// tens of microseconds, more than sampling a few hundred nodes.
const MIN_CHUNK: usize = 512;

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
    /// Draw each node's neighbours with probability proportional to edge weight, without
    /// replacement (PyG's `weight_attr`); zero-weight edges are never drawn, and a fanout of
    /// -1 keeps every edge of positive weight. Needs an adjacency with weights.
    #[serde(default)]
    pub weighted: bool,
    /// Temporal sampling (PyG's `time_attr` on edges): each seed comes with a time and its
    /// tree only takes edges no later than it ([`NeighborSampler::sample_temporal`]); the
    /// strategy says how the eligible edges are drawn. None: times are not looked at. Needs an
    /// adjacency with times.
    #[serde(default)]
    pub temporal: Option<TemporalStrategy>,
    /// Fanouts per edge type (PyG's `num_neighbors` dict), indexed by edge-type id, each with
    /// one entry per hop like `fanouts` (0: no edges of that type at that hop). Given, it
    /// replaces `fanouts` (which must then be empty), and the adjacency must carry exactly
    /// this many edge types.
    #[serde(default)]
    pub edge_type_fanouts: Vec<Vec<i32>>,
    /// Record each sampled edge's id (its row in the store's `edges_train`; PyG's `e_id`) in
    /// [`Sample::edge_ids`]. Needs an adjacency with edge ids.
    #[serde(default)]
    pub edge_ids: bool,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            fanouts: vec![15, 10],
            seed: 0,
            threads: 0,
            weighted: false,
            temporal: None,
            edge_type_fanouts: Vec::new(),
            edge_ids: false,
        }
    }
}

impl SamplerConfig {
    /// Number of hops (GNN layers) sampled.
    pub fn hops(&self) -> usize {
        match self.edge_type_fanouts.first() {
            Some(first) => first.len(),
            None => self.fanouts.len(),
        }
    }

    /// Checks every value's range; errors name the option as it appears in the config file.
    pub fn validate(&self) -> Result<()> {
        if self.weighted && self.temporal == Some(TemporalStrategy::Last) {
            return Err(GraphError::Config(
                "gnn.weighted: the temporal strategy \"last\" takes the most recent edges, so it \
                 cannot also draw by weight; use temporal_strategy \"uniform\" with weights"
                    .into(),
            ));
        }
        if !self.edge_type_fanouts.is_empty() {
            return self.validate_per_type();
        }
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

    fn validate_per_type(&self) -> Result<()> {
        let bad = |m: String| Err(GraphError::Config(format!("gnn.fanouts: {m}")));
        if !self.fanouts.is_empty() {
            return bad(
                "per-edge-type fanouts replace the list of fanouts; give one or the other".into(),
            );
        }
        let hops = self.hops();
        if hops == 0 {
            return bad("must list at least one hop (one fanout per GNN layer)".into());
        }
        for (t, list) in self.edge_type_fanouts.iter().enumerate() {
            if list.len() != hops {
                return bad(format!(
                    "edge type {t} lists {} hops but edge type 0 lists {hops}; every edge type \
                     needs the same number of hops",
                    list.len()
                ));
            }
            if let Some((hop, &f)) = list.iter().enumerate().find(|(_, &f)| f < -1) {
                return bad(format!(
                    "edge type {t}, hop {hop} is {f}; each fanout must be at least 0, or -1 for \
                     all the edges of the type"
                ));
            }
        }
        Ok(())
    }

    /// The fanout rule of hop `hop` (0-based).
    fn rule<'a>(&'a self, hop: usize, per_type: &'a [i32]) -> Rule<'a> {
        let fanout = if self.edge_type_fanouts.is_empty() {
            Fanout::All(self.fanouts[hop])
        } else {
            Fanout::PerType(per_type)
        };
        Rule {
            fanout,
            weighted: self.weighted,
            temporal: self.temporal,
        }
    }
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
    /// more, or if the fanout is -1); by weight when the config is `weighted`; per edge type
    /// with `edge_type_fanouts`. With a multigraph, distinct edges are chosen, so a neighbour
    /// may repeat. `batch_key` distinguishes batches (e.g. `epoch << 32 | batch`): the same
    /// `(seed, batch_key)` gives the same sample. A temporal config needs seed times:
    /// [`NeighborSampler::sample_temporal`].
    pub fn sample<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        seeds: &[u32],
        batch_key: u64,
    ) -> Result<Sample> {
        self.check_columns(topo)?;
        if self.config.temporal.is_some() {
            return Err(GraphError::Config(
                "sampler: temporal sampling needs a time per seed (sample_temporal)".into(),
            ));
        }
        check_in_range(topo, seeds, "seeds")?;
        let mut local = IdMap::with_capacity_and_hasher(seeds.len(), Default::default());
        for (i, &v) in seeds.iter().enumerate() {
            if local.insert(v, i as u32).is_some() {
                return Err(GraphError::Config(format!(
                    "sampler: seeds must be distinct; node {v} appears twice"
                )));
            }
        }
        Ok(self.expand(topo, seeds.to_vec(), local, None, batch_key, |_, u| u))
    }

    /// Samples the disjoint temporal computation graphs of `seeds` at `times` (`times[i]` is
    /// the time of `seeds[i]`, in the unit of the adjacency's edge times; PyG's
    /// `input_time`): as [`NeighborSampler::sample`], except that every node in the tree of
    /// seed `i` only takes edges whose time is `<= times[i]`, drawn by the config's
    /// [`TemporalStrategy`]. Each seed grows its own tree (PyG's `disjoint=True`, which PyG
    /// turns on for temporal sampling): a node appears once per seed that reaches it, and
    /// `Sample::batch` names each node's seed. So seeds may repeat (the same node at two
    /// times).
    pub fn sample_temporal<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        seeds: &[u32],
        times: &[i64],
        batch_key: u64,
    ) -> Result<Sample> {
        self.check_columns(topo)?;
        if self.config.temporal.is_none() {
            return Err(GraphError::Config(
                "gnn.temporal_strategy: seed times were given but the sampler is not temporal"
                    .into(),
            ));
        }
        if seeds.len() != times.len() {
            return Err(GraphError::Config(format!(
                "sampler: {} seeds but {} seed times; give one time per seed",
                seeds.len(),
                times.len()
            )));
        }
        check_in_range(topo, seeds, "seeds")?;
        // Disjoint keys: (seed index, node), so each seed's tree deduplicates on its own.
        let local: DisjointMap = (0..seeds.len() as u32)
            .map(|i| (disjoint_key(i, seeds[i as usize]), i))
            .collect();
        let seed_times = SeedTimes::new(seeds, times);
        Ok(self.expand(
            topo,
            seeds.to_vec(),
            local,
            Some(&seed_times),
            batch_key,
            disjoint_key,
        ))
    }

    /// Samples a link-prediction batch: positive edges `src[i] -> dst[i]` (equal lengths;
    /// repeated endpoints are fine), each with `negatives_per_edge` destinations drawn
    /// uniformly from all nodes (they may occasionally be true neighbours, as with PyG's
    /// `neg_sampling="binary"`), and the neighbourhood sample of every endpoint. Temporal and
    /// per-edge-type configs are refused: their negatives would need a time and a type.
    pub fn sample_links<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        src: &[u32],
        dst: &[u32],
        negatives_per_edge: usize,
        batch_key: u64,
    ) -> Result<LinkSample> {
        self.check_columns(topo)?;
        if self.config.temporal.is_some() || !self.config.edge_type_fanouts.is_empty() {
            return Err(GraphError::Config(
                "sampler: link batches are sampled uniformly or by weight; temporal and \
                 per-edge-type link sampling are not supported"
                    .into(),
            ));
        }
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
            sample: self.expand(topo, seeds, local, None, batch_key, |_, u| u),
            src_local,
            dst_local,
            neg_dst_local,
        })
    }

    /// The config's needs against the columns `topo` carries; errors name the option.
    fn check_columns<A: Adjacency + ?Sized>(&self, topo: &A) -> Result<()> {
        let have = topo.columns();
        let c = &self.config;
        if c.weighted && !have.weights {
            return Err(GraphError::Config(
                "gnn.weighted: the graph has no edge weights (convert with --columns \
                 src,dst,weight)"
                    .into(),
            ));
        }
        if c.temporal.is_some() && !have.times {
            return Err(GraphError::Config(
                "gnn.temporal_strategy: the graph has no edge times (convert with --columns \
                 src,dst,time)"
                    .into(),
            ));
        }
        if c.edge_ids && !have.ids {
            return Err(GraphError::Config(
                "sampler: edge ids were asked for but the graph carries none (a format-1 \
                 store's edges have no ids)"
                    .into(),
            ));
        }
        let typed = c.edge_type_fanouts.len();
        if typed > 0 && typed != have.edge_types {
            return Err(GraphError::Config(if have.edge_types == 0 {
                "gnn.fanouts: per-edge-type fanouts need a graph with edge types".into()
            } else {
                format!(
                    "gnn.fanouts: {typed} per-edge-type fanout lists for a graph with {} edge \
                     types; give one per edge type",
                    have.edge_types
                )
            }));
        }
        Ok(())
    }

    /// Runs the hops from validated `seeds` whose keys are already in `local`: `key(seed
    /// index, node)` names a node (the node alone, or with its seed in a disjoint sample,
    /// which `seed_times` makes temporal).
    fn expand<A, K>(
        &self,
        topo: &A,
        seeds: Vec<u32>,
        mut local: HashMap<K, u32, BuildHasherDefault<IdHasher>>,
        seed_times: Option<&SeedTimes<'_>>,
        batch_key: u64,
        key: impl Fn(u32, u32) -> K,
    ) -> Sample
    where
        A: Adjacency + ?Sized,
        K: Hash + Eq,
    {
        let batch_seed = derive(derive(self.config.seed, NEIGHBOR_STREAM), batch_key);
        let hops = self.config.hops();
        let typed = topo.columns().edge_types > 0;
        let mut batch: Vec<u32> = match seed_times {
            Some(_) => (0..seeds.len() as u32).collect(),
            None => Vec::new(),
        };
        let mut nodes = seeds;
        let mut hop_counts = vec![nodes.len()];
        let mut blocks = Vec::with_capacity(hops);
        let mut edge_types = Vec::with_capacity(hops);
        let mut edge_ids = Vec::with_capacity(hops);
        for hop in 0..hops {
            let num_dst = nodes.len();
            let per_type: Vec<i32> = self
                .config
                .edge_type_fanouts
                .iter()
                .map(|f| f[hop])
                .collect();
            let layer = Layer {
                rule: self.config.rule(hop, &per_type),
                key: derive(batch_seed, hop as u64),
                batch: &batch,
                seed_times,
                typed,
                ids: self.config.edge_ids,
            };
            let chunks = self.sample_layer(topo, &nodes, &layer);
            // Relabelling is serial and in destination order, so local ids do not depend on
            // how the frontier was split.
            let total = chunks.iter().map(|c| c.neighbors.len()).sum();
            let mut indptr = Vec::with_capacity(num_dst + 1);
            indptr.push(0u64);
            let mut indices = Vec::with_capacity(total);
            let mut types = Vec::with_capacity(if typed { total } else { 0 });
            let mut ids = Vec::with_capacity(if layer.ids { total } else { 0 });
            let mut dst = 0;
            for chunk in &chunks {
                let mut at = 0;
                for &kept in &chunk.kept {
                    let owner = if seed_times.is_some() { batch[dst] } else { 0 };
                    for &u in &chunk.neighbors[at..at + kept] {
                        let next = nodes.len() as u32;
                        indices.push(*local.entry(key(owner, u)).or_insert_with(|| {
                            nodes.push(u);
                            if seed_times.is_some() {
                                batch.push(owner);
                            }
                            next
                        }));
                    }
                    at += kept;
                    dst += 1;
                    indptr.push(indices.len() as u64);
                }
                types.extend_from_slice(&chunk.types);
                ids.extend_from_slice(&chunk.ids);
            }
            hop_counts.push(nodes.len() - num_dst);
            blocks.push(Block {
                num_src: nodes.len(),
                num_dst,
                indptr,
                indices,
            });
            edge_types.push(types);
            edge_ids.push(ids);
        }
        blocks.reverse();
        edge_types.reverse();
        edge_ids.reverse();
        let edges_per_hop = blocks.iter().rev().map(Block::num_edges).collect();
        Sample {
            nodes,
            hop_counts,
            blocks,
            edges_per_hop,
            edge_types,
            edge_ids,
            batch,
        }
    }

    /// Samples the edges of every node of `frontier`, in order, split over threads.
    fn sample_layer<A: Adjacency + ?Sized>(
        &self,
        topo: &A,
        frontier: &[u32],
        layer: &Layer<'_>,
    ) -> Vec<Chunk> {
        let parts = self.threads.min(frontier.len().div_ceil(self.min_chunk));
        if parts <= 1 {
            return vec![sample_chunk(topo, frontier, 0, layer)];
        }
        let chunk_len = frontier.len().div_ceil(parts);
        std::thread::scope(|scope| {
            let handles: Vec<_> = frontier
                .chunks(chunk_len)
                .enumerate()
                .map(|(i, part)| {
                    scope.spawn(move || sample_chunk(topo, part, i * chunk_len, layer))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        })
    }
}

/// What every node of one hop's frontier is sampled with.
struct Layer<'a> {
    rule: Rule<'a>,
    /// The hop's key: a node's stream derives from it.
    key: u64,
    /// Disjoint samples: the seed of each frontier node (empty otherwise).
    batch: &'a [u32],
    seed_times: Option<&'a SeedTimes<'a>>,
    /// Record each kept edge's type.
    typed: bool,
    /// Record each kept edge's id.
    ids: bool,
}

/// Sampled neighbours (global ids) of consecutive frontier nodes.
struct Chunk {
    /// Neighbours kept by each node, in frontier order.
    kept: Vec<usize>,
    /// The kept neighbours, node after node, each node's in adjacency order.
    neighbors: Vec<u32>,
    /// Their edge types when the layer records them; empty otherwise.
    types: Vec<u32>,
    /// Their edge ids when the layer records them; empty otherwise.
    ids: Vec<u64>,
}

/// Samples the frontier nodes `part`, which start at frontier position `first`.
fn sample_chunk<A: Adjacency + ?Sized>(
    topo: &A,
    part: &[u32],
    first: usize,
    layer: &Layer<'_>,
) -> Chunk {
    let mut chunk = Chunk {
        kept: Vec::with_capacity(part.len()),
        neighbors: Vec::new(),
        types: Vec::new(),
        ids: Vec::new(),
    };
    let mut scratch = Scratch::default();
    let mut positions = Vec::new();
    for (i, &v) in part.iter().enumerate() {
        let edges = topo.edges(v);
        // A temporal node draws on its seed's stream and sees up to its seed's time.
        let (cutoff, node_key) = match layer.seed_times {
            None => (None, derive(layer.key, v as u64)),
            Some(seeds) => {
                let seed = layer.batch[first + i] as usize;
                let stream = derive(derive(layer.key, seeds.salts[seed]), v as u64);
                (Some(seeds.times[seed]), stream)
            }
        };
        positions.clear();
        choose::choose(
            &layer.rule,
            &edges,
            cutoff,
            &mut Rng::new(node_key),
            &mut scratch,
            &mut positions,
        );
        chunk
            .neighbors
            .extend(positions.iter().map(|&p| edges.neighbors[p]));
        if layer.typed {
            chunk
                .types
                .extend(positions.iter().map(|&p| edges.types[p]));
        }
        if layer.ids {
            chunk.ids.extend(positions.iter().map(|&p| edges.ids[p]));
        }
        chunk.kept.push(positions.len());
    }
    chunk
}

/// A node's key in a disjoint sample: its seed's index and its id.
fn disjoint_key(seed: u32, node: u32) -> u64 {
    (seed as u64) << 32 | node as u64
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
mod modes_tests;
#[cfg(test)]
mod tests;
