//! A store opened for GNN training: topology in RAM, the sampler, and the feature tiers sized
//! by the budget plan. This is what the Python loaders and `strata gnn train` hold; each epoch
//! is a [`NodeLoader`] over it.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::Store;

use strata_graph::features::FeatureReader;
use strata_graph::sampler::{NeighborSampler, SamplerConfig};
use strata_graph::topology::{Direction, Topology};

use crate::accumulator::in_flight_target;
use crate::budget::{self, GnnBudgetPlan};
use crate::cache::Eviction;
use crate::error::{GnnError, Result};
use crate::hotset::HotRanking;
use crate::pipeline::{LinkEdges, LoaderConfig, NodeLoader};
use crate::tiers::{rank_hot_nodes, FeatureTiers};
use strata_store::rng::{derive, Rng};

/// Everything that decides how a store's features are sampled and served (the Rust side of
/// the `[gnn.train]` config section; field names are the config's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// Neighbours per hop from the seeds outwards (`[25, 10]`); -1 keeps all.
    pub fanouts: Vec<i32>,
    /// Seeds per batch.
    pub batch_size: usize,
    /// Memory budget in bytes for topology, feature tiers, batches and runtime.
    pub memory: u64,
    /// At most this many bytes for the feature tiers (hot set + cache), 0: all that `memory`
    /// leaves. Caps what small graphs keep resident, so that they too read from disk.
    pub feature_memory: u64,
    /// Bytes of device (GPU) memory for the device tier: the hottest rows, held by the
    /// consumer in a device tensor, outside `memory` (0: no device tier).
    pub device_memory: u64,
    /// How the static hot set is ranked.
    pub hot_ranking: HotRanking,
    /// Fraction of the feature budget for the static hot set (the rest: the dynamic cache).
    pub hot_share: f64,
    /// Eviction policy of the dynamic cache.
    pub eviction: Eviction,
    /// GIDS window depth: batches sampled and pinned ahead.
    pub window: usize,
    /// Merge the disk reads of consecutive batches (GIDS accumulator).
    pub accumulator: bool,
    /// Reads to keep in flight; 0 derives it from the device profile.
    pub in_flight_target: usize,
    /// Stages on their own threads (false: serial, the Helios-NoPipe ablation).
    pub pipeline: bool,
    /// Threads sampling batches (0: one per core).
    pub sampler_threads: usize,
    /// Merged reads in flight at once.
    pub io_threads: usize,
    /// Root of sampling and shuffling randomness.
    pub seed: u64,
}

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            fanouts: vec![15, 10],
            batch_size: 1024,
            memory: 1 << 30,
            feature_memory: 0,
            device_memory: 0,
            hot_ranking: HotRanking::ReversePageRank,
            hot_share: budget::DEFAULT_HOT_SHARE,
            eviction: Eviction::Sieve,
            window: 8,
            accumulator: true,
            in_flight_target: 0,
            pipeline: true,
            sampler_threads: 0,
            io_threads: 1,
            seed: 0,
        }
    }
}

/// A store ready to serve batches.
pub struct GnnData {
    pub config: DataConfig,
    pub topology: Arc<Topology>,
    pub sampler: Arc<NeighborSampler>,
    pub tiers: Arc<FeatureTiers>,
    pub plan: GnnBudgetPlan,
    /// Seconds spent ranking and loading the hot set.
    pub hot_seconds: f64,
}

/// Batches sampled at open to size the batch buffers.
const ESTIMATE_BATCHES: usize = 8;

/// Headroom over the largest pre-sampled batch: batches vary (hubs among the seeds), and a
/// batch larger than planned only overshoots the plan by its excess.
const ESTIMATE_MARGIN: f64 = 1.25;

/// Sampled rows per batch the budget plans for: the largest of [`ESTIMATE_BATCHES`] batches of
/// `batch_size` seeds drawn from `seeds` (all nodes when empty) and sampled as training would,
/// plus [`ESTIMATE_MARGIN`], never above [`batch_rows_bound`]. Overlap between neighbourhoods
/// makes real batches far smaller than the bound on large graphs (42k rows instead of 170k
/// for 1024 seeds with fanouts 15,10 on a 10M-node power-law graph), and every row of
/// overestimate per batch in flight is a feature row the tiers cannot hold.
fn batch_rows_estimate(
    sampler: &NeighborSampler,
    topo: &Topology,
    seeds: &[u32],
    batch_size: usize,
    seed: u64,
) -> Result<u64> {
    let n = topo.num_nodes() as u64;
    let bound = batch_rows_bound(&sampler.config().fanouts, batch_size, n);
    if n == 0 {
        return Ok(0);
    }
    let mut rng = Rng::new(derive(seed, ESTIMATE_STREAM));
    let mut largest = 0u64;
    for b in 0..ESTIMATE_BATCHES {
        let mut batch: Vec<u32> = (0..batch_size)
            .map(|_| {
                if seeds.is_empty() {
                    rng.below(n) as u32
                } else {
                    seeds[rng.below(seeds.len() as u64) as usize]
                }
            })
            .collect();
        batch.sort_unstable();
        batch.dedup();
        let sample = sampler.sample(topo, &batch, derive(ESTIMATE_STREAM, b as u64))?;
        largest = largest.max(sample.nodes.len() as u64);
    }
    Ok(((largest as f64 * ESTIMATE_MARGIN).ceil() as u64).min(bound))
}

/// Batches alive at once as the pipeline runs (see "Memory" in [`crate::pipeline`]):
/// `(with feature buffers, sampled structure only)`. A merged read holds the batches whose
/// misses reach the in-flight target (at most the window); one read accumulates, one per I/O
/// thread is in flight, one is handed out, one batch waits in the output channel and the
/// consumer holds one. Ahead of them wait the window and up to two batches per sampler thread.
fn batches_alive(config: &DataConfig, reader: &FeatureReader, batch_rows: u64) -> (usize, usize) {
    let merged = if config.accumulator {
        let (target, _) = in_flight_target(config.in_flight_target, reader);
        (target as u64)
            .div_ceil(batch_rows.max(1))
            .clamp(1, config.window.max(1) as u64) as usize
    } else {
        1
    };
    let sampler_threads = strata_io::resolve_threads(config.sampler_threads);
    (
        merged * (config.io_threads.max(1) + 2) + 2,
        config.window + 2 * sampler_threads,
    )
}

/// Domain separator of the estimate's draws.
const ESTIMATE_STREAM: u64 = 0x4553_5449_4d41;

/// Sampled rows per batch at most: every seed and every sampled neighbour distinct, capped at
/// the graph.
fn batch_rows_bound(fanouts: &[i32], batch_size: usize, num_nodes: u64) -> u64 {
    let mut frontier = batch_size as u64;
    let mut total = frontier;
    for &f in fanouts {
        frontier = if f < 0 {
            num_nodes
        } else {
            frontier.saturating_mul(f as u64)
        };
        total = total.saturating_add(frontier);
        if total >= num_nodes {
            return num_nodes;
        }
    }
    total
}

impl GnnData {
    /// Opens `store` (which must hold node features), loads its in-neighbour topology, plans
    /// the budget (printing the plan through `progress`), ranks and loads the hot set.
    /// `train_nodes` are the seeds the pre-sampling ranking samples one epoch of.
    pub fn open(
        store_path: &Path,
        config: DataConfig,
        train_nodes: &[u32],
        progress: &dyn Progress,
    ) -> Result<GnnData> {
        if config.batch_size == 0 {
            return Err(GnnError::Config("gnn.batch_size: need at least 1".into()));
        }
        let store = Store::open(store_path)?;
        let features = store.array_path("features").map_err(|_| {
            GnnError::Config(format!(
                "{}: the store has no node features (features.npy); GNN training needs them \
                 (convert with --features, or generate sbm)",
                store_path.display()
            ))
        })?;
        let sampler = NeighborSampler::new(SamplerConfig {
            fanouts: config.fanouts.clone(),
            seed: config.seed,
            threads: 1,
        })?;
        let topology = Topology::load(&store, Direction::In)?;
        let reader = FeatureReader::open(&features)?;
        let meta = reader.meta().clone();
        let n = topology.num_nodes() as u64;
        let batch_rows = batch_rows_estimate(
            &sampler,
            &topology,
            train_nodes,
            config.batch_size,
            config.seed,
        )?;
        let device_rows = (config.device_memory / meta.row_bytes as u64).min(n);
        let (buffered, waiting) = batches_alive(&config, &reader, batch_rows);
        let plan_for = |memory| {
            budget::plan(
                memory,
                n,
                meta.row_bytes,
                topology.bytes(),
                batch_rows,
                buffered,
                waiting,
                config.hot_share,
                config.eviction,
                device_rows,
            )
        };
        let mut plan = plan_for(config.memory)?;
        if config.feature_memory > 0 && plan.hot_bytes + plan.cache_bytes > config.feature_memory {
            plan = plan_for(plan.fixed_bytes() + config.feature_memory)?;
        }
        plan.describe().iter().for_each(|l| progress.message(l));
        let t = std::time::Instant::now();
        let presample: Vec<Vec<u32>>;
        let presample_arg = if config.hot_ranking == HotRanking::PreSampling {
            presample = train_nodes
                .chunks(config.batch_size)
                .map(<[u32]>::to_vec)
                .collect();
            Some((&sampler, presample.as_slice()))
        } else {
            None
        };
        let threads = strata_io::resolve_threads(0);
        // One ranking for both tiers: the device takes the best rows, the hot set the next.
        let mut hot = rank_hot_nodes(
            config.hot_ranking,
            (plan.device_rows + plan.hot_rows) as usize,
            &topology,
            threads,
            presample_arg,
        )?;
        let device: Vec<u32> = hot
            .drain(..(plan.device_rows as usize).min(hot.len()))
            .collect();
        let mut meter = Meter::new(progress, "hot set", 0, hot.len() as u64);
        let tiers = FeatureTiers::build(reader, &hot, plan.cache_rows as usize, config.eviction)?
            .with_device_tier(&device)?;
        meter.add(hot.len() as u64, hot.len() as u64 * meta.row_bytes as u64)?;
        meter.finish()?;
        let hot_seconds = t.elapsed().as_secs_f64();
        progress.message(&format!(
            "hot set: {} rows ranked by {} and loaded in {hot_seconds:.2} s; dynamic cache: {} rows ({:?})",
            hot.len(),
            config.hot_ranking.name(),
            plan.cache_rows,
            config.eviction
        ));
        Ok(GnnData {
            config,
            topology: Arc::new(topology),
            sampler: Arc::new(sampler),
            tiers: Arc::new(tiers),
            plan,
            hot_seconds,
        })
    }

    /// The batches of one epoch over `seeds`, delivered in order.
    pub fn epoch(
        &self,
        seeds: Vec<u32>,
        epoch: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> Result<NodeLoader> {
        NodeLoader::new(
            self.topology.clone(),
            self.sampler.clone(),
            self.tiers.clone(),
            seeds,
            epoch,
            self.loader_config(shuffle, drop_last),
        )
    }

    /// The link-prediction batches of one epoch over the positive edges `src[i] -> dst[i]`,
    /// `batch_size` edges each with `negatives_per_edge` uniform negative destinations,
    /// delivered in order (see [`NodeLoader::links`]).
    pub fn link_epoch(
        &self,
        src: Vec<u32>,
        dst: Vec<u32>,
        negatives_per_edge: usize,
        epoch: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> Result<NodeLoader> {
        let edges = LinkEdges {
            src,
            dst,
            negatives_per_edge,
        };
        NodeLoader::links(
            self.topology.clone(),
            self.sampler.clone(),
            self.tiers.clone(),
            edges,
            epoch,
            self.loader_config(shuffle, drop_last),
        )
    }

    fn loader_config(&self, shuffle: bool, drop_last: bool) -> LoaderConfig {
        let c = &self.config;
        LoaderConfig {
            batch_size: c.batch_size,
            shuffle,
            seed: c.seed,
            drop_last,
            window: c.window,
            accumulator: c.accumulator,
            in_flight_target: c.in_flight_target,
            pipeline: c.pipeline,
            sampler_threads: strata_io::resolve_threads(c.sampler_threads),
            io_threads: c.io_threads.max(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_rows_bound_is_capped_by_the_graph() {
        assert_eq!(
            batch_rows_bound(&[15, 10], 1024, 1 << 30),
            1024 * (1 + 15 + 150)
        );
        assert_eq!(batch_rows_bound(&[15, 10], 1024, 10_000), 10_000);
        assert_eq!(batch_rows_bound(&[-1], 4, 1_000), 1_000);
    }

    #[test]
    fn batch_rows_estimate_follows_the_sampled_batches() {
        // A ring of 1000 nodes: node v's in-neighbours are v-1 and v+1, so one seed with
        // fanouts 2,2 samples at most 5 distinct nodes; batches of 10 seeds out of the first
        // 100 overlap little.
        let n = 1000u32;
        let indices: Vec<u32> = (0..n)
            .flat_map(|v| [(v + n - 1) % n, (v + 1) % n])
            .collect();
        let indptr: Vec<u64> = (0..=n as u64).map(|v| 2 * v).collect();
        let topo = Topology::new(indptr, indices).unwrap();
        let sampler = NeighborSampler::new(SamplerConfig {
            fanouts: vec![2, 2],
            seed: 0,
            threads: 1,
        })
        .unwrap();
        let seeds: Vec<u32> = (0..100).collect();
        let est = batch_rows_estimate(&sampler, &topo, &seeds, 10, 0).unwrap();
        let bound = batch_rows_bound(&[2, 2], 10, n as u64);
        assert_eq!(bound, 70);
        // At most 10 seeds x 5 nodes x the margin; at least what one seed's ring gives.
        assert!((5..=63).contains(&est), "{est}");
        // Tiny graphs: the bound (the whole graph) wins.
        let est = batch_rows_estimate(&sampler, &topo, &[], 1000, 0).unwrap();
        assert!(est <= n as u64, "{est}");
    }
}
