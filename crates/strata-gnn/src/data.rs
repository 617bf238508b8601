//! A store opened for GNN training: topology in RAM, the sampler, and the feature tiers sized
//! by the budget plan. This is what the Python loaders and `strata gnn train` hold; each epoch
//! is a [`NodeLoader`] over it.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::codec::FeatureCodec;
use strata_store::config::{unset_if_zero, AutoSize, ConfigError, Section, Size};
use strata_store::{open_checked, NoProgress, Store};

use strata_graph::features::FeatureReader;
use strata_graph::sampler::{distinct, NeighborSampler, SamplerConfig};
use strata_graph::topology::{Direction, Topology};

use crate::accumulator::{in_flight_target, TargetSource};
use crate::budget::{self, GnnPlan, PlanInputs, Runtime};
use crate::cache::Eviction;
use crate::error::{GnnError, Result};
use crate::hotset::HotRanking;
use crate::pipeline::{LinkEdges, LoaderConfig, NodeLoader};
use crate::tiers::{held_row_bytes, rank_hot_nodes_within, FeatureTiers};
use strata_store::budget::{physical_memory, Planned, Planning};
use strata_store::rng::{derive, Rng};

/// Everything that decides how a store's features are sampled and served: the `[gnn.train]`
/// config section's data-path options (the model's options are Python's, declared in front of
/// these). The doc comments are the help texts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct DataConfig {
    /// neighbours per hop from the seeds outwards; -1 keeps all
    #[schemars(inner(range(min = -1)))]
    pub fanouts: Vec<i32>,
    /// seed nodes per mini-batch
    #[schemars(range(min = 1))]
    pub batch_size: usize,
    /// budget of the whole process: torch and model (anonymous memory measured at start, and
    /// 96 MiB of code pages), training, topology, features, batches
    pub memory: Size,
    /// cap on the feature tiers (hot set + cache); unset: what --memory leaves (0, as older
    /// configs say, reads as unset)
    #[serde(deserialize_with = "unset_if_zero")]
    pub feature_memory: Option<Size>,
    /// GPU memory for the device tier (the hottest rows in a device tensor, outside --memory):
    /// auto (a quarter of the free memory on CUDA, none on cpu), 0 (off) or a size such as 8G
    pub device_memory: AutoSize,
    /// ranking of the static hot set: reverse PageRank (GIDS), pre-sampling (Helios), degree
    pub hot_ranking: HotRanking,
    /// share of the feature budget for the static hot set (rest: dynamic cache)
    #[schemars(range(min = 0.0, max = 1.0))]
    pub hot_share: f64,
    /// eviction policy of the dynamic cache
    pub eviction: Eviction,
    /// how the hot set and the dynamic cache hold feature rows in memory: f32 as on disk, f16
    /// (2x the rows in the same bytes) or int8 with a scale per row (about 4x); the file stays
    /// float32 and batches are decoded to float32 (float32 feature files only)
    pub feature_codec: FeatureCodec,
    /// GIDS window: batches sampled and pinned ahead
    pub window: usize,
    /// merge the disk reads of consecutive batches (GIDS accumulator)
    pub accumulator: bool,
    /// reads to keep in flight; 0: p/(1-p) x IOPS x latency from the profile
    pub in_flight_target: usize,
    /// run sampling, lookup, I/O and assembly on their own threads
    pub pipeline: bool,
    /// threads sampling batches (0: one per core)
    pub sampler_threads: usize,
    /// I/O threads, each completing one merged read at a time (and submitting the next one
    /// while it completes)
    #[schemars(range(min = 1))]
    pub io_threads: usize,
    /// seed of sampling, shuffling and model initialisation
    pub seed: u64,
}

/// The `[gnn.train]` section's default `memory`, and so also the default of a Python loader,
/// which takes the section's defaults. `strata gnn train`'s budget holds the whole process (the
/// interpreter, torch and the model, measured as anonymous memory when the store opens plus
/// [`crate::budget::CODE_PAGES_BYTES`] of library code pages, besides the data path); a loader
/// in a caller's own script budgets only the data path and a runtime reserve.
pub const TRAIN_MEMORY: Size = Size(1 << 30);

impl Default for DataConfig {
    fn default() -> Self {
        DataConfig {
            fanouts: vec![15, 10],
            batch_size: 1024,
            memory: TRAIN_MEMORY,
            feature_memory: None,
            device_memory: AutoSize::Auto,
            hot_ranking: HotRanking::ReversePageRank,
            hot_share: budget::DEFAULT_HOT_SHARE,
            eviction: Eviction::Sieve,
            feature_codec: FeatureCodec::F32,
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

impl Section for DataConfig {
    const NAME: &'static str = "gnn.train";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        if self.fanouts.is_empty() || self.fanouts.iter().any(|&f| f != -1 && f < 1) {
            return Err(ConfigError::new(
                Self::NAME,
                "fanouts",
                format!("each hop needs a fanout >= 1 or -1, got {:?}", self.fanouts),
            ));
        }
        Ok(())
    }
}

impl DataConfig {
    /// Bytes of the device tier. `auto` is the consumer's to resolve, as it knows its device
    /// (the Python loaders take a share of a CUDA device's free memory); the data path given
    /// `auto` keeps no device tier.
    pub fn device_bytes(&self) -> u64 {
        self.device_memory.bytes_or(0)
    }
}

/// What the consumer of the batches (a training loop) tells the plan about itself.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Consumer {
    /// Its process's anonymous memory (`RssAnon`) as measured when it opens the store (the
    /// interpreter, torch's heap, the model and optimizer built), planned with
    /// [`budget::CODE_PAGES_BYTES`] for the libraries' code; None: the
    /// [`budget::RUNTIME_BYTES`] reserve.
    pub anon_bytes: Option<u64>,
    /// Bytes training holds per layer of the model, input layer first (one per hop): see
    /// [`LayerCost`]. Empty: nothing is planned for training.
    pub layers: Vec<LayerCost>,
    /// Bytes training adds whatever the batch: the parameters' gradients and the optimizer's
    /// state, allocated at the first step.
    pub fixed_bytes: u64,
    /// The feature rows this process holds when the features are split across ranks: node
    /// ids `[start, end)`. The others are left to the consumer as the device tier's are
    /// (batch positions, never read here: `strata.gnn.features` fetches them from their
    /// owners), and the plan holds only these. None: every row.
    pub owned_rows: Option<[u64; 2]>,
}

impl Consumer {
    /// The rows this process holds (all `num_nodes` without `owned_rows`), checked.
    fn owned(&self, num_nodes: u64) -> Result<std::ops::Range<u32>> {
        let [start, end] = self.owned_rows.unwrap_or([0, num_nodes]);
        if start > end || end > num_nodes {
            return Err(GnnError::Config(format!(
                "owned rows [{start}, {end}) are not a range of the graph's {num_nodes} nodes"
            )));
        }
        // `FeatureTiers::build` refuses graphs beyond 32-bit node ids first.
        Ok(start as u32..end.min(u32::MAX as u64) as u32)
    }
}

/// Bytes one layer's training holds (forward activations kept for the backward pass and
/// their gradients), per source row, destination row and edge of the layer's block.
#[derive(Debug, Clone, Copy, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerCost {
    pub src_row: u64,
    pub dst_row: u64,
    pub edge: u64,
}

/// A store ready to serve batches.
pub struct GnnData {
    pub config: DataConfig,
    pub topology: Arc<Topology>,
    pub sampler: Arc<NeighborSampler>,
    pub tiers: Arc<FeatureTiers>,
    pub plan: GnnPlan,
    /// The merged reads' target the plan was made for.
    pub read_target: ReadTarget,
    /// Seconds spent ranking and loading the hot set.
    pub hot_seconds: f64,
}

/// Batches sampled at open to size the batch buffers.
const ESTIMATE_BATCHES: usize = 8;

/// Headroom over the largest pre-sampled batch: batches vary (hubs among the seeds), and a
/// batch larger than planned only overshoots the plan by its excess.
const ESTIMATE_MARGIN: f64 = 1.25;

/// Sampled batches whose rows share the feature file's pages this many times over are read
/// together by default where the budget allows (see [`read_target`]): merging a window of
/// them reads at most half the pages reading them one by one does.
const MERGE_PAGE_SHARING: f64 = 2.0;

/// With pages shared, a merged read gathers the misses of batches until they reach this many
/// batches' rows (the estimate's), so that it holds under one batch's rows more.
const MERGED_READ_BATCHES: u64 = 2;

/// The larger reads are planned only if the memory tiers keep this share of the rows they
/// would hold otherwise: rows in memory save more reads than merging does once the reads
/// take their room (G6's graph at `--memory 330M`: 7.2 s an epoch with two thirds of the rows
/// in the tiers and reads of one batch, 8.6 s with 2% and merged reads).
const MERGE_KEEPS_TIER_ROWS: f64 = 0.9;

/// The batches the budget plans for: `rows` sampled per batch, and per block (input layer
/// first) its sources, destinations and edges.
#[derive(Debug, Clone, Default, PartialEq)]
struct BatchEstimate {
    rows: u64,
    blocks: Vec<[u64; 3]>,
    /// How many times over the sampled batches read the feature file's 4 KiB pages: the sum
    /// of each batch's distinct pages over the pages of all of them (1 when no two batches
    /// share a page, up to the number of batches when all read the same pages).
    page_sharing: f64,
}

/// Where a row lies in the feature file: the page of its first byte.
#[derive(Debug, Clone, Copy)]
struct FileLayout {
    data_offset: u64,
    row_bytes: u64,
}

impl FileLayout {
    fn page(&self, v: u32) -> u64 {
        (self.data_offset + v as u64 * self.row_bytes) / 4096
    }
}

impl BatchEstimate {
    /// Bytes training a batch of this shape holds with `consumer`'s model.
    fn training_bytes(&self, consumer: &Consumer) -> Result<u64> {
        if consumer.layers.is_empty() {
            return Ok(consumer.fixed_bytes);
        }
        if consumer.layers.len() != self.blocks.len() {
            return Err(GnnError::Config(format!(
                "the model has {} layers but the sampler makes {} blocks (one per fanout)",
                consumer.layers.len(),
                self.blocks.len()
            )));
        }
        Ok(consumer.layers.iter().zip(&self.blocks).fold(
            consumer.fixed_bytes,
            |acc, (c, &[src, dst, edges])| {
                acc.saturating_add(
                    (src.saturating_mul(c.src_row))
                        .saturating_add(dst.saturating_mul(c.dst_row))
                        .saturating_add(edges.saturating_mul(c.edge)),
                )
            },
        ))
    }
}

/// The batches the budget plans for: the largest of [`ESTIMATE_BATCHES`] batches of
/// `batch_size` seeds drawn from `seeds` (all nodes when empty) and sampled as training would
/// (rows, and each block's sources, destinations and edges, each the largest seen), plus
/// [`ESTIMATE_MARGIN`]; rows never above [`batch_rows_bound`]. Overlap between
/// neighbourhoods makes real batches far smaller than the bound on large graphs (42k rows
/// instead of 170k for 1024 seeds with fanouts 15,10 on a 10M-node power-law graph), and
/// every row of overestimate per batch in flight is a feature row the tiers cannot hold.
/// Also how much the batches share the pages of the feature file laid out as `layout`.
fn batch_estimate(
    sampler: &NeighborSampler,
    topo: &Topology,
    seeds: &[u32],
    batch_size: usize,
    seed: u64,
    layout: FileLayout,
) -> Result<BatchEstimate> {
    let n = topo.num_nodes() as u64;
    let bound = batch_rows_bound(&sampler.config().fanouts, batch_size, n);
    if n == 0 {
        return Ok(BatchEstimate::default());
    }
    let mut rng = Rng::new(derive(seed, ESTIMATE_STREAM));
    let mut largest = 0u64;
    let mut blocks: Vec<[u64; 3]> = Vec::new();
    let (mut pages_alone, mut pages_together) = (0u64, HashSet::new());
    // A batch holds distinct seeds, never more than there are: a batch size beyond the seeds
    // is one batch of them all.
    let universe = if seeds.is_empty() {
        n
    } else {
        seeds.len() as u64
    };
    let k = batch_size.min(usize::try_from(universe).unwrap_or(usize::MAX));
    for b in 0..ESTIMATE_BATCHES {
        let picks = distinct(&mut rng, universe, k).into_iter();
        let mut batch: Vec<u32> = match seeds {
            [] => picks.map(|v| v as u32).collect(),
            _ => picks.map(|i| seeds[i as usize]).collect(),
        };
        batch.sort_unstable();
        batch.dedup();
        let sample = sampler.sample(topo, &batch, derive(ESTIMATE_STREAM, b as u64))?;
        largest = largest.max(sample.nodes.len() as u64);
        let pages: HashSet<u64> = sample.nodes.iter().map(|&v| layout.page(v)).collect();
        pages_alone += pages.len() as u64;
        pages_together.extend(pages);
        blocks.resize(sample.blocks.len(), [0; 3]);
        for (max, block) in blocks.iter_mut().zip(&sample.blocks) {
            let shape = [block.num_src, block.num_dst, block.indices.len()];
            for (m, x) in max.iter_mut().zip(shape) {
                *m = (*m).max(x as u64);
            }
        }
    }
    let margin = |x: u64| (x as f64 * ESTIMATE_MARGIN).ceil() as u64;
    Ok(BatchEstimate {
        rows: margin(largest).min(bound),
        blocks: blocks.iter().map(|b| b.map(margin)).collect(),
        page_sharing: pages_alone as f64 / pages_together.len().max(1) as f64,
    })
}

/// What the pipeline holds at once (see "Memory" in [`crate::pipeline`]), for batches of
/// `batch_rows` rows and merged reads flushed at `target` distinct rows.
struct Alive {
    /// Batches with feature buffers: one being assembled, one in the output channel, one the
    /// consumer holds.
    buffered: usize,
    /// The distinct disk rows of the merged reads issued and not yet assembled (at most
    /// `io_threads + 1`, each flushed once its rows reach the in-flight target, so under the
    /// target plus one batch's rows, and under the rows of the batches it may merge).
    read_rows: u64,
    /// Batches holding their samples only: the window and up to two batches per sampler
    /// thread ahead, the read accumulating and the reads issued, each of at most
    /// `max(window, 1)` batches with the accumulator (one without).
    structure_only: usize,
}

fn batches_alive(config: &DataConfig, target: usize, batch_rows: u64) -> Alive {
    let reads = config.io_threads.max(1) + 1;
    let (merged, rows_per_read) = if config.accumulator {
        let merged = config.window.max(1);
        let rows = (target as u64)
            .saturating_add(batch_rows)
            .min(batch_rows.saturating_mul(merged as u64));
        (merged, rows)
    } else {
        (1, batch_rows)
    };
    let sampler_threads = strata_io::resolve_threads(config.sampler_threads);
    Alive {
        buffered: 3,
        read_rows: rows_per_read.saturating_mul(reads as u64),
        structure_only: config.window + 2 * sampler_threads + merged * (reads + 1),
    }
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

/// What planning loads: the sampler, the in-neighbour topology, the feature reader, and the
/// plan made from them.
struct Loaded {
    sampler: NeighborSampler,
    topology: Topology,
    reader: FeatureReader,
    plan: GnnPlan,
    /// The merged reads' target the plan was made for.
    read_target: ReadTarget,
}

/// Opens `store_path` (which must hold node features), loads its in-neighbour topology,
/// estimates a batch from `train_nodes` and plans `config`'s budget for `consumer`.
fn load_and_plan(
    store_path: &Path,
    config: &DataConfig,
    train_nodes: &[u32],
    consumer: &Consumer,
) -> Result<Loaded> {
    if config.batch_size == 0 {
        return Err(GnnError::Config("gnn.batch_size: need at least 1".into()));
    }
    let store = open_checked(store_path, &NoProgress)?;
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
        ..SamplerConfig::default()
    })?;
    let topology = Topology::load(&store, Direction::In)?;
    let reader = FeatureReader::open(&features)?;
    let meta = reader.meta().clone();
    held_row_bytes(config.feature_codec, &meta)?;
    let n = topology.num_nodes() as u64;
    let layout = FileLayout {
        data_offset: meta.data_offset,
        row_bytes: meta.row_bytes as u64,
    };
    let estimate = batch_estimate(
        &sampler,
        &topology,
        train_nodes,
        config.batch_size,
        config.seed,
        layout,
    )?;
    let batch_rows = estimate.rows;
    let training_bytes = estimate.training_bytes(consumer)?;
    let runtime = match consumer.anon_bytes {
        Some(anon) => Runtime::measured(anon, training_bytes),
        None => Runtime {
            training_bytes,
            ..Runtime::reserve()
        },
    };
    let device_rows = (config.device_bytes() / meta.row_bytes as u64).min(n);
    let owned = consumer.owned(n)?;
    let remote_rows = n - owned.len() as u64;
    if remote_rows > 0 && device_rows > 0 {
        return Err(GnnError::Config(
            "device_memory: a device tier together with features split across ranks is not \
             supported yet; set device_memory = 0"
                .into(),
        ));
    }
    let base = PlanInputs {
        num_nodes: n,
        row_bytes: meta.row_bytes,
        topology_bytes: topology.bytes(),
        batch_rows_estimate: batch_rows,
        in_flight_batches: 0,
        read_rows: 0,
        window_batches: 0,
        hot_share: config.hot_share,
        eviction: config.eviction,
        device_rows: device_rows + remote_rows,
        runtime,
        codec: config.feature_codec,
    };
    // The plan for merged reads flushed at `target` rows.
    let plan_with = |target: usize| {
        let alive = batches_alive(config, target, batch_rows);
        let inputs = PlanInputs {
            in_flight_batches: alive.buffered,
            read_rows: alive.read_rows,
            window_batches: alive.structure_only,
            ..base
        };
        let plan_within = |memory| {
            budget::plan(memory, &inputs).map(|p| if remote_rows > 0 { p.remote() } else { p })
        };
        let plan = plan_within(config.memory)?;
        match config.feature_memory {
            Some(Size(cap)) if plan.hot_bytes + plan.cache_bytes > cap => {
                plan_within(Size(plan.fixed_bytes() + cap))
            }
            _ => Ok(plan),
        }
    };
    let gids = in_flight_target(config.in_flight_target, &reader);
    let (read_target, plan) = read_target(config, gids, &estimate, plan_with)?;
    Ok(Loaded {
        sampler,
        topology,
        reader,
        plan,
        read_target,
    })
}

/// When a merged read is issued: once its distinct disk rows reach `rows`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ReadTarget {
    pub rows: usize,
    pub source: TargetSource,
    /// How many times over the batches sampled at open read the file's pages.
    pub page_sharing: f64,
}

impl ReadTarget {
    /// One line for the run's output, e.g. `merged reads: issued at 65378 distinct rows (2
    /// batches' rows, as the batches sampled at open read each page 5.8 times over)`.
    pub fn describe(&self) -> String {
        let sharing = format!(
            "the batches sampled at open read each page {:.1} times over",
            self.page_sharing
        );
        let why = match self.source {
            TargetSource::Config => format!("in_flight_target; {sharing}"),
            TargetSource::Profile => format!("GIDS's target for the device profile; {sharing}"),
            TargetSource::EngineDepth => {
                format!("the I/O engine's depth, no device profile; {sharing}")
            }
            TargetSource::PageSharing => {
                format!("{MERGED_READ_BATCHES} batches' rows, as {sharing}")
            }
        };
        format!(
            "merged reads: issued at {} distinct rows ({why})",
            self.rows
        )
    }
}

/// The rows at which a merged read is issued, and the plan made for it: `target` (from
/// `in_flight_target` when configured, else GIDS's: [`in_flight_target`]), raised to [`MERGED_READ_BATCHES`]
/// batches' rows when the sampled batches share the feature file's pages
/// ([`MERGE_PAGE_SHARING`]), some rows must come from disk, and the budget holds the larger
/// reads besides nearly every row the tiers would hold ([`MERGE_KEEPS_TIER_ROWS`]; e.g. under
/// a `feature_memory` cap).
fn read_target(
    config: &DataConfig,
    (target, source): (usize, TargetSource),
    estimate: &BatchEstimate,
    plan_with: impl Fn(usize) -> Result<GnnPlan>,
) -> Result<(ReadTarget, GnnPlan)> {
    let chosen = |rows, source| ReadTarget {
        rows,
        source,
        page_sharing: estimate.page_sharing,
    };
    let plan = plan_with(target)?;
    let shared = usize::try_from(MERGED_READ_BATCHES.saturating_mul(estimate.rows))
        .unwrap_or(usize::MAX)
        .max(target);
    let merge = config.accumulator
        && source != TargetSource::Config
        && estimate.page_sharing >= MERGE_PAGE_SHARING
        && !plan.all_resident()
        && shared > target;
    if !merge {
        return Ok((chosen(target, source), plan));
    }
    let held = |p: &GnnPlan| (p.hot_rows + p.cache_rows) as f64;
    match plan_with(shared) {
        Ok(merged) if held(&merged) >= MERGE_KEEPS_TIER_ROWS * held(&plan) => {
            Ok((chosen(shared, TargetSource::PageSharing), merged))
        }
        Ok(_) | Err(GnnError::Budget(_)) => Ok((chosen(target, source), plan)),
        Err(e) => Err(e),
    }
}

/// The plan `strata gnn train` makes for `store_path` with `config` (`strata info --memory`):
/// [`GnnData::open`]'s plan with the store's `node_train` seeds (none without a train split)
/// and a consumer that says nothing (the runtime reserve, no training), without ranking or
/// loading the hot set. Loads the topology and samples a few batches, as opening does.
/// A budget below the minimum is [`Planning::Refused`].
pub fn plan_for(store_path: &Path, config: &DataConfig) -> Result<Planning> {
    let train_nodes = train_nodes(&Store::open(store_path)?)?;
    match load_and_plan(store_path, config, &train_nodes, &Consumer::default()) {
        Ok(loaded) => Ok(Planning::of(&loaded.plan)),
        Err(GnnError::Budget(why)) => Ok(Planning::Refused(why)),
        Err(e) => Err(e),
    }
}

/// The store's `node_train` ids (empty without a train split): the seeds a training run
/// estimates its batches from.
fn train_nodes(store: &Store) -> Result<Vec<u32>> {
    let Ok(path) = store.array_path("node_train") else {
        return Ok(Vec::new());
    };
    let (header, bytes) = read_all_bytes(&path)?;
    let mut ids = Vec::new();
    decode_ints(&bytes, header.dtype, &mut ids);
    Ok(ids.into_iter().map(|i| i as u32).collect())
}

impl GnnData {
    /// Opens `store` (which must hold node features), loads its in-neighbour topology, plans
    /// the budget (printing the plan through `progress`), ranks and loads the hot set.
    /// `train_nodes` are the seeds the pre-sampling ranking samples one epoch of; `consumer`
    /// says what the process and its training take beside the data path.
    pub fn open(
        store_path: &Path,
        config: DataConfig,
        train_nodes: &[u32],
        consumer: &Consumer,
        progress: &dyn Progress,
    ) -> Result<GnnData> {
        let Loaded {
            sampler,
            topology,
            reader,
            plan,
            read_target,
        } = load_and_plan(store_path, &config, train_nodes, consumer)?;
        let meta = reader.meta().clone();
        let memory_plan = plan.memory_plan();
        memory_plan
            .check_machine(physical_memory())
            .map_err(GnnError::Budget)?;
        memory_plan
            .describe()
            .iter()
            .for_each(|l| progress.message(l));
        if config.accumulator && !plan.all_resident() {
            progress.message(&read_target.describe());
        }
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
        let owned = consumer.owned(topology.num_nodes() as u64)?;
        // One ranking for both tiers: the device takes the best rows, the hot set the next;
        // both among the rows this process owns.
        let mut hot = rank_hot_nodes_within(
            config.hot_ranking,
            (plan.device_rows + plan.hot_rows) as usize,
            &topology,
            threads,
            presample_arg,
            owned.clone(),
        )?;
        let device: Vec<u32> = if plan.remote_rows > 0 {
            // The rows of other ranks take the device tier's place: left to the consumer.
            (0..owned.start)
                .chain(owned.end..topology.num_nodes() as u32)
                .collect()
        } else {
            hot.drain(..(plan.device_rows as usize).min(hot.len()))
                .collect()
        };
        let mut meter = Meter::new(progress, "hot set", 0, hot.len() as u64);
        let tiers = FeatureTiers::build_encoded(
            reader,
            &hot,
            plan.cache_rows as usize,
            config.eviction,
            config.feature_codec,
        )?
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
            read_target,
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
            in_flight_target: self.read_target.rows,
            in_flight_source: Some(self.read_target.source),
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
    fn owned_rows_are_checked_against_the_graph() {
        let owning = |r| Consumer {
            owned_rows: r,
            ..Consumer::default()
        };
        assert_eq!(owning(None).owned(10).unwrap(), 0..10);
        assert_eq!(owning(Some([5, 10])).owned(10).unwrap(), 5..10);
        for bad in [[6, 5], [0, 11]] {
            let e = owning(Some(bad)).owned(10).unwrap_err().to_string();
            assert!(e.contains("owned rows") && e.contains("10 nodes"), "{e}");
        }
    }

    #[test]
    fn the_plan_counts_what_the_pipeline_holds() {
        let config = |accumulator, window| DataConfig {
            accumulator,
            window,
            io_threads: 2,
            sampler_threads: 1,
            ..DataConfig::default()
        };
        let rows = |a: &Alive| (a.buffered, a.read_rows, a.structure_only);
        // Three reads (two I/O threads, one more submitted while another completes), each
        // flushed under the target plus a batch: 3 x (100 + 1000) rows.
        let merging = batches_alive(&config(true, 8), 100, 1000);
        assert_eq!(rows(&merging), (3, 3 * 1100, 8 + 2 + 8 * 4));
        // A target past a window's rows: a read holds at most the window's 8 batches.
        let window = batches_alive(&config(true, 8), 1 << 30, 1000);
        assert_eq!(window.read_rows, 3 * 8000);
        // No accumulator: a read is one batch.
        let alone = batches_alive(&config(false, 8), 1 << 30, 1000);
        assert_eq!(rows(&alone), (3, 3 * 1000, 8 + 2 + 4));
        // Whatever a read merges, only three batches hold feature buffers.
        assert_eq!(window.buffered, alone.buffered);
    }

    #[test]
    fn reads_merge_where_pages_are_shared_and_the_tiers_keep_their_rows() {
        // A plan for `target` whose tiers hold `rows(target)` of 1000 rows, or a refusal.
        let plan_of = |rows: fn(usize) -> Option<u64>| {
            move |target: usize| -> Result<GnnPlan> {
                let held = rows(target).ok_or_else(|| GnnError::Budget("no room".into()))?;
                let inputs = PlanInputs {
                    num_nodes: 1000,
                    row_bytes: 64,
                    topology_bytes: 0,
                    batch_rows_estimate: 100,
                    in_flight_batches: 1,
                    read_rows: 0,
                    window_batches: 0,
                    hot_share: 1.0,
                    eviction: Eviction::Clock,
                    device_rows: 0,
                    runtime: Runtime::reserve(),
                    codec: FeatureCodec::F32,
                };
                let mut p = budget::plan(Size(1 << 30), &inputs)?;
                (p.hot_rows, p.cache_rows) = (held, 0);
                Ok(p)
            }
        };
        let estimate = |page_sharing| BatchEstimate {
            rows: 100,
            blocks: Vec::new(),
            page_sharing,
        };
        let gids = (16, TargetSource::Profile);
        let config = DataConfig::default();
        let pick = |config: &DataConfig, sharing, rows: fn(usize) -> Option<u64>| {
            let (t, plan) = read_target(config, gids, &estimate(sharing), plan_of(rows)).unwrap();
            assert_eq!(plan.hot_rows, rows(t.rows).unwrap());
            (t.rows, t.source)
        };
        let shared = (200, TargetSource::PageSharing);
        // Shared pages, room for the larger reads beside the tiers' rows: two batches' rows.
        assert_eq!(pick(&config, 5.0, |_| Some(500)), shared);
        // Within the tiers' allowance (90% of their rows kept), and past it.
        assert_eq!(
            pick(&config, 5.0, |t| Some(if t > 16 { 450 } else { 500 })),
            shared
        );
        assert_eq!(
            pick(&config, 5.0, |t| Some(if t > 16 { 449 } else { 500 })),
            gids
        );
        // No room at all for them.
        assert_eq!(pick(&config, 5.0, |t| (t == 16).then_some(500)), gids);
        // Pages seldom shared; every row in memory (nothing to read).
        assert_eq!(pick(&config, 1.9, |_| Some(500)), gids);
        assert_eq!(pick(&config, 5.0, |_| Some(1000)), gids);
        // A configured target, or no accumulator: as asked.
        let configured = (16, TargetSource::Config);
        let (t, _) =
            read_target(&config, configured, &estimate(5.0), plan_of(|_| Some(500))).unwrap();
        assert_eq!((t.rows, t.source), configured);
        let off = DataConfig {
            accumulator: false,
            ..DataConfig::default()
        };
        assert_eq!(pick(&off, 5.0, |_| Some(500)), gids);
        // Another error is the caller's.
        let failing = |_: usize| -> Result<GnnPlan> { Err(GnnError::Config("bad".into())) };
        assert!(read_target(&config, gids, &estimate(5.0), failing).is_err());
    }

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
            ..SamplerConfig::default()
        })
        .unwrap();
        let seeds: Vec<u32> = (0..100).collect();
        let rows_of = |row_bytes| FileLayout {
            data_offset: 0,
            row_bytes,
        };
        let est = batch_estimate(&sampler, &topo, &seeds, 10, 0, rows_of(4096)).unwrap();
        // A page a row: the batches share some of their rows' pages (those among the first
        // 100 nodes and their ring neighbours)...
        assert!(
            est.page_sharing > 1.0 && est.page_sharing < ESTIMATE_BATCHES as f64,
            "{est:?}"
        );
        // ...and every page when the whole file is one page.
        let one_page = batch_estimate(&sampler, &topo, &seeds, 10, 0, rows_of(4)).unwrap();
        assert_eq!(one_page.page_sharing, ESTIMATE_BATCHES as f64);
        assert_eq!((one_page.rows, &one_page.blocks), (est.rows, &est.blocks));
        let bound = batch_rows_bound(&[2, 2], 10, n as u64);
        assert_eq!(bound, 70);
        // At most 10 seeds x 5 nodes x the margin; at least what one seed's ring gives.
        assert!((5..=63).contains(&est.rows), "{est:?}");
        // Two blocks, input layer first: its destinations are the next block's sources, and
        // each destination has at most 2 sampled in-edges.
        let [[src0, dst0, e0], [src1, dst1, e1]] = est.blocks[..] else {
            panic!("{est:?}")
        };
        assert!(src0 >= dst0 && src1 >= dst1, "{est:?}");
        assert_eq!(dst0, src1, "{est:?}");
        assert!(
            e0 <= 2 * dst0 + 1 && e1 <= 2 * dst1 + 1 && dst1 <= 13,
            "{est:?}"
        );
        // Training costs: per layer, sources, destinations and edges times their bytes.
        let layer = |src_row, dst_row, edge| LayerCost {
            src_row,
            dst_row,
            edge,
        };
        let consumer = Consumer {
            anon_bytes: None,
            layers: vec![layer(1, 0, 0), layer(0, 10, 100)],
            fixed_bytes: 7,
            owned_rows: None,
        };
        assert_eq!(
            est.training_bytes(&consumer).unwrap(),
            7 + src0 + 10 * dst1 + 100 * e1
        );
        let one_layer = Consumer {
            layers: vec![layer(1, 1, 1)],
            ..Consumer::default()
        };
        let e = est.training_bytes(&one_layer).unwrap_err().to_string();
        assert!(
            e.contains("the model has 1 layers but the sampler makes 2 blocks"),
            "{e}"
        );
        // Tiny graphs: the bound (the whole graph) wins.
        let est = batch_estimate(&sampler, &topo, &[], 1000, 0, rows_of(4096)).unwrap();
        assert!(est.rows <= n as u64, "{est:?}");
        // A batch size beyond the seeds is one batch of them all, drawn once each (and in no
        // time): nodes 0..100 and the two ring neighbours on either side, every batch alike.
        let all = batch_estimate(&sampler, &topo, &seeds, 1 << 40, 0, rows_of(4096)).unwrap();
        assert_eq!(all.rows, (104.0 * ESTIMATE_MARGIN).ceil() as u64, "{all:?}");
        assert_eq!(all.page_sharing, ESTIMATE_BATCHES as f64, "{all:?}");
    }
}
