//! What the pipeline's stages share: the loader's configuration, a batch and its statistics,
//! the epoch's plan of batches, and the stages' busy counters.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use strata_graph::features::ReadStats;
use strata_graph::sampler::Sample;
use strata_store::rng::{derive, Rng};

use crate::accumulator::TargetSource;
use crate::error::{GnnError, Result};

/// Domain separators, so the shuffle and the batch keys are unrelated streams.
pub(super) const SHUFFLE_STREAM: u64 = 0x5348_5546_4c45;
const BATCH_STREAM: u64 = 0x0042_4154_4348;

/// The sampler's key of batch `index` of `epoch` (a pure function, so Python, link loaders or a
/// re-run can reproduce a batch's sample without the loader).
pub fn batch_key(epoch: u64, index: usize) -> u64 {
    derive(derive(BATCH_STREAM, epoch), index as u64)
}

/// How a [`NodeLoader`] cuts, samples and reads an epoch's batches.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LoaderConfig {
    /// Seeds (training nodes) per batch, at least 1 (default 1024, GIDS's default).
    pub batch_size: usize,
    /// Shuffle the seeds each epoch (default true); the order is a pure function of `(seed,
    /// epoch)`.
    pub shuffle: bool,
    /// Root of the shuffle's randomness (the sampler has its own seed).
    pub seed: u64,
    /// Drop the last batch when it has fewer than `batch_size` seeds (default false).
    pub drop_last: bool,
    /// GIDS's window depth `W` (default 8): batches sampled and pinned ahead of the one being
    /// served; 0 serves each batch as soon as it is sampled (no look-ahead, no accumulation).
    pub window: usize,
    /// Merge the disk reads of consecutive batches until the in-flight target is reached
    /// (default true); false reads each batch's misses alone.
    pub accumulator: bool,
    /// Distinct disk rows a merged read aims for (about the reads it keeps in flight); 0
    /// (default) derives it from the device profile of the features' file with GIDS's model
    /// `p / (1 - p) x IOPS x latency` at `p = 0.95`, or takes the engine's depth when the
    /// device was not profiled.
    pub in_flight_target: usize,
    /// Where a non-zero `in_flight_target` came from when the caller derived it (reported in
    /// [`super::PipelineStats::in_flight_source`]); `None`: the configuration.
    pub in_flight_source: Option<TargetSource>,
    /// Run the stages on their own threads (default true); false runs them one after the
    /// other on the caller's thread (the Helios-NoPipe ablation).
    pub pipeline: bool,
    /// Threads sampling different batches at once (default 2, at least 1; pipelined only).
    /// Each may also split a large layer over the sampler's own threads.
    pub sampler_threads: usize,
    /// I/O threads, each completing one merged read at a time (default 1, at least 1;
    /// pipelined only); one read more than this is issued, submitted while another completes.
    /// One gather already keeps the engine's depth of requests in flight.
    pub io_threads: usize,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            batch_size: 1024,
            shuffle: true,
            seed: 0,
            drop_last: false,
            window: 8,
            accumulator: true,
            in_flight_target: 0,
            in_flight_source: None,
            pipeline: true,
            sampler_threads: 2,
            io_threads: 1,
        }
    }
}

impl LoaderConfig {
    /// Checks every value's range; errors name the option.
    pub fn validate(&self) -> Result<()> {
        let at_least_one = [
            ("batch_size", self.batch_size),
            ("sampler_threads", self.sampler_threads),
            ("io_threads", self.io_threads),
        ];
        for (name, value) in at_least_one {
            if value == 0 {
                return Err(GnnError::Config(format!(
                    "gnn.loader.{name}: must be at least 1"
                )));
            }
        }
        Ok(())
    }
}

/// What one batch cost and where its rows came from.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct BatchStats {
    /// Seconds spent sampling this batch (on whichever thread sampled it).
    pub sample_secs: f64,
    /// Rows left to the device tier (see [`Batch::device_positions`]).
    pub device_rows: usize,
    /// Rows copied from memory (hot set or dynamic cache) when the batch was served.
    pub memory_rows: usize,
    /// Rows read from disk for this batch.
    pub disk_rows: usize,
    /// Batches whose misses were merged into the read that served this one (1 when it was
    /// read alone; 0 when it had no miss and no read was needed).
    pub merged_batches: usize,
    /// Distinct rows of that merged read.
    pub merged_rows: usize,
}

/// One mini-batch, ready for training.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Position in the epoch: 0, 1, 2, ... in delivery order.
    pub index: usize,
    /// The batch's seeds (global ids), in the order of the sample's first rows; for a link
    /// batch, the distinct endpoints of its edges and negatives.
    pub seeds: Vec<u32>,
    /// For a link batch, its edges and negatives as local ids (rows of `sample.nodes`).
    pub links: Option<LinkIndex>,
    /// The sampled computation graph; `sample.nodes` lists the rows of `features`.
    pub sample: Sample,
    /// Raw little-endian feature rows, `sample.nodes.len() * row_bytes` bytes: row `i` holds
    /// the features of `sample.nodes[i]`, except at the device positions (zeros there).
    pub features: Vec<u8>,
    /// Positions of `sample.nodes` (ascending) whose rows the device tier holds
    /// ([`FeatureTiers::with_device_tier`]), and
    pub device_positions: Vec<u32>,
    /// their slots in the consumer's device tensor (same length).
    pub device_slots: Vec<u32>,
    /// What this batch cost.
    pub stats: BatchStats,
}

/// The edges of a link batch as local ids: position `i` of each list indexes `sample.nodes`
/// (and so the rows of the batch's features).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkIndex {
    /// Source of each positive edge, one per edge.
    pub src_local: Vec<u32>,
    /// Destination of each positive edge, one per edge.
    pub dst_local: Vec<u32>,
    /// Negative destinations, `negatives_per_edge` per edge, edge-major; edge `i`'s pair with
    /// `src_local[i]`.
    pub neg_dst_local: Vec<u32>,
}

/// The positive edges of a link-prediction epoch: `src[i] -> dst[i]` (global ids).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkEdges {
    pub src: Vec<u32>,
    pub dst: Vec<u32>,
    /// Destinations drawn uniformly per edge as negatives (0: positives only).
    pub negatives_per_edge: usize,
}

// ---- the epoch's batches ----

/// What an epoch's batches are cut from.
pub(super) enum Items {
    /// Seed nodes.
    Nodes(Vec<u32>),
    /// Positive edges (`src` and `dst` of equal length), with negatives drawn per batch.
    Links(LinkEdges),
}

impl Items {
    pub(super) fn len(&self) -> usize {
        match self {
            Items::Nodes(seeds) => seeds.len(),
            Items::Links(edges) => edges.src.len(),
        }
    }
}

/// The epoch's seeds or edges in their shuffled order, cut into batches.
pub(super) struct Plan {
    pub(super) items: Items,
    pub(super) batch_size: usize,
    pub(super) num_batches: usize,
    pub(super) epoch: u64,
}

impl Plan {
    pub(super) fn new(mut items: Items, epoch: u64, cfg: &LoaderConfig) -> Plan {
        let n = items.len();
        if cfg.shuffle {
            // Fisher-Yates over one stream of (seed, epoch); an edge's endpoints move together.
            let mut rng = Rng::new(derive(derive(cfg.seed, SHUFFLE_STREAM), epoch));
            for i in (1..n).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                match &mut items {
                    Items::Nodes(seeds) => seeds.swap(i, j),
                    Items::Links(edges) => {
                        edges.src.swap(i, j);
                        edges.dst.swap(i, j);
                    }
                }
            }
        }
        let num_batches = if cfg.drop_last {
            n / cfg.batch_size
        } else {
            n.div_ceil(cfg.batch_size)
        };
        Plan {
            items,
            batch_size: cfg.batch_size,
            num_batches,
            epoch,
        }
    }

    /// The positions of batch `b` in the shuffled order.
    pub(super) fn range(&self, b: usize) -> Range<usize> {
        let start = b * self.batch_size;
        start..(start + self.batch_size).min(self.items.len())
    }
}

/// Busy time and read counters shared by the stages (nanoseconds and counts).
#[derive(Default)]
pub(super) struct Counters {
    pub(super) sample_ns: AtomicU64,
    pub(super) lookup_ns: AtomicU64,
    pub(super) accumulate_ns: AtomicU64,
    pub(super) io_ns: AtomicU64,
    pub(super) assemble_ns: AtomicU64,
    pub(super) reads: AtomicU64,
    pub(super) read_rows: AtomicU64,
    pub(super) read_batches: AtomicU64,
    pub(super) max_read_rows: AtomicU64,
    pub(super) read: Mutex<ReadStats>,
}

pub(super) fn add_busy(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}
