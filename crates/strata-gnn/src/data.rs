//! A store opened for GNN training: topology in RAM, the sampler, and the feature tiers sized
//! by the budget plan. This is what the Python loaders and `strata gnn train` hold; each epoch
//! is a [`NodeLoader`] over it.

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::Store;

use crate::budget::{self, GnnBudgetPlan};
use crate::cache::Eviction;
use crate::error::{GnnError, Result};
use crate::features::FeatureReader;
use crate::hotset::HotRanking;
use crate::pipeline::{LoaderConfig, NodeLoader};
use crate::sampler::{NeighborSampler, SamplerConfig};
use crate::tiers::{rank_hot_nodes, FeatureTiers};
use crate::topology::{Direction, Topology};

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

/// Sampled rows per batch assumed by the budget: every seed and every sampled neighbour
/// distinct, capped at the graph (an upper bound; overlap only lowers it).
fn batch_rows_estimate(fanouts: &[i32], batch_size: usize, num_nodes: u64) -> u64 {
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
        let plan_for = |memory| {
            budget::plan(
                memory,
                n,
                meta.row_bytes,
                topology.bytes(),
                batch_rows_estimate(&config.fanouts, config.batch_size, n),
                config.window + 2,
                config.hot_share,
                config.eviction,
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
        let hot = rank_hot_nodes(
            config.hot_ranking,
            plan.hot_rows as usize,
            &topology,
            threads,
            presample_arg,
        )?;
        let mut meter = Meter::new(progress, "hot set", 0, hot.len() as u64);
        let tiers = FeatureTiers::build(reader, &hot, plan.cache_rows as usize, config.eviction)?;
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
        let c = &self.config;
        let cfg = LoaderConfig {
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
        };
        NodeLoader::new(
            self.topology.clone(),
            self.sampler.clone(),
            self.tiers.clone(),
            seeds,
            epoch,
            cfg,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_rows_estimate_is_capped_by_the_graph() {
        assert_eq!(
            batch_rows_estimate(&[15, 10], 1024, 1 << 30),
            1024 * (1 + 15 + 150)
        );
        assert_eq!(batch_rows_estimate(&[15, 10], 1024, 10_000), 10_000);
        assert_eq!(batch_rows_estimate(&[-1], 4, 1_000), 1_000);
    }
}
