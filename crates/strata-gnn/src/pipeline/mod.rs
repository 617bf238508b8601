//! The batch pipeline that feeds GNN training (GIDS's accumulator and window buffering, Helios's
//! overlapped stages): training seeds (or, for link prediction, training edges) in, in-order
//! mini-batches with their sampled blocks and feature rows out.
//!
//! # Stages
//!
//! 1. **Sampling**: `sampler_threads` workers sample different batches; the results are put
//!    back in batch order before the window (a worker finishing early waits in a reorder
//!    buffer, never overtakes).
//! 2. **Window + lookup**: up to `window` sampled batches are kept ahead of the one being
//!    looked up, each pinned in the dynamic cache ([`FeatureTiers::pin_window`]) as it enters,
//!    so rows that a near-future batch needs survive until it is served (GIDS §3.4). The batch
//!    leaving the window is looked up in memory: which of its rows the hot set, the cache or
//!    the device tier hold, and which must come from disk (its misses). Nothing is copied yet,
//!    and the batch keeps its pins, so its cache hits stay cached until its assembly.
//! 3. **Accumulator** ([`crate::accumulator`]): the misses of consecutive batches are merged
//!    until their distinct rows reach the in-flight target (GIDS §3.2), at most
//!    `max(window, 1)` batches (the most the look-ahead can provide without waiting for
//!    batches it cannot sample yet), then read as one deduplicated gather through
//!    [`FeatureTiers::reader`] on one of `io_threads` I/O threads. The gather is submitted
//!    first and completed after: while an I/O thread completes one read, it submits the next
//!    one the accumulator has ready (without waiting for it), so the device's queue stays
//!    deep across the end of one read and the assembly of its batches.
//! 4. **Completion/assembly**: one batch at a time, in order, its feature buffer is made and
//!    filled: its memory rows copied from the tiers (releasing its hits' pins), its disk rows
//!    from the read, which are offered to the dynamic cache ([`FeatureTiers::admit`],
//!    releasing the rest). A read's rows are freed with its last batch.
//!
//! With `pipeline = true` each stage runs on its own thread(s), connected by bounded channels;
//! with `pipeline = false` the same code runs stage after stage on the caller's thread inside
//! [`Iterator::next`] (Helios's NoPipe ablation).
//!
//! The code: this file holds the configuration, [`Batch`], [`NodeLoader`] and the statistics;
//! `stages` the work of each stage, `serial` and `threads` the two ways of running them, and
//! `pins` the per-batch record of window pins.
//!
//! # Link batches
//!
//! An epoch is over seed nodes ([`NodeLoader::new`]) or over positive edges
//! ([`NodeLoader::links`]): the edges are shuffled as pairs and cut into `batch_size` edges,
//! and sampling a batch calls [`NeighborSampler::sample_links`] instead of
//! [`NeighborSampler::sample`], with the same [`batch_key`]. Its seeds are the distinct
//! endpoints of its edges and negatives, and [`Batch::links`] says where each pair sits among
//! them. Every stage after sampling sees only the sample, so pins, reads, determinism and
//! shutdown are the same for both.
//!
//! # Window pins
//!
//! Every pin a batch takes is released exactly once (the rule of [`crate::tiers`]): at its
//! assembly, the hits' as they are copied, the misses' as their rows are admitted. Each batch
//! carries the list of node occurrences whose pins it still holds (all its cacheable nodes
//! from its pinning to its assembly, none after). A batch dropped before its assembly,
//! because the loader was dropped mid-epoch or an error ended the epoch, hands exactly that
//! list to [`FeatureTiers::unpin_window`], wherever it was: in the window, in the
//! accumulator, in a channel, or in the read that failed. So when the loader is dropped, or
//! [`Iterator::next`] returns an error, no pin of the epoch is left (the threads are joined
//! first in pipelined mode), and the cache can evict every row again.
//!
//! # Determinism
//!
//! A batch's seeds (or edges) depend only on `(seed, epoch)` and its sample only on the
//! sampler's seed and [`batch_key`]`(epoch, index)`; its feature rows are the file's bytes
//! whichever tier served them. So the batches are bit-identical with the pipeline on or off, the accumulator
//! on or off, any window and any thread count. What may vary from run to run is the split of
//! rows between the cache and the disk (it depends on when earlier reads were admitted) and
//! hence the statistics.
//!
//! # Memory
//!
//! Batches alive at once are bounded, and only three hold feature buffers: the one being
//! assembled, one in the output channel and the one the consumer holds. A batch gets its
//! buffer at assembly, after its read, so merging many batches into one read costs their
//! samples, not their features. The others hold their samples (and, when there is a dynamic
//! cache, the list of their pinned occurrences, 4 bytes per non-hot sampled node): `window`
//! ahead, at most `2 x sampler_threads` sampled but not yet in the window, one accumulating
//! read and at most `io_threads + 1` merged reads issued but not yet assembled (one more than
//! the I/O threads: the read submitted while another completes), each of at most
//! `max(window, 1)` batches (one with the accumulator off). Each issued read holds its
//! distinct rows (fewer than the in-flight target plus one batch's rows, as it is flushed once
//! they reach the target) and, while pending, its gather's plan and read buffers (see
//! [`strata_graph::features::FeatureReader::submit_gather`]).
//!
//! # Errors and shutdown
//!
//! An error in any stage (a seed out of range, a read error) reaches the iterator as `Err` in
//! batch order: the batches before the failing one are delivered first, then the error, then
//! the iterator ends. Dropping the loader (at any point) stops every stage and joins its
//! threads; the read an I/O thread is completing is finished first, and one it submitted
//! after it is abandoned (the engine finishes its requests and frees their buffers). Either way the batches not delivered release
//! their window pins (see above). A panic in a stage is re-raised on the thread calling
//! [`Iterator::next`].

mod batch;
mod pins;
mod serial;
mod stages;
#[cfg(test)]
mod tests;
mod threads;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use strata_graph::features::ReadStats;
use strata_graph::sampler::NeighborSampler;
use strata_graph::topology::Topology;

use crate::accumulator::{in_flight_target, TargetSource};
use crate::error::{GnnError, Result};
use crate::tiers::{FeatureTiers, TierStats};

pub use batch::{batch_key, Batch, BatchStats, LinkEdges, LinkIndex, LoaderConfig};
use batch::{Counters, Items, Plan};
use serial::Serial;
use stages::{FrontConfig, ReadFault, Stages};
use threads::Threads;

/// What an epoch did so far, for reports: counts, per-stage busy time and the merged reads.
///
/// Busy times are seconds a stage spent working (summed over its threads), not waiting on a
/// channel; with the pipeline on their sum exceeds `wall_secs` by the overlap achieved.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PipelineStats {
    /// Stages ran on their own threads.
    pub pipelined: bool,
    /// Look-ahead window depth, in batches.
    pub window: usize,
    /// The accumulator was on.
    pub accumulator: bool,
    /// Most batches merged into one read.
    pub max_batches_per_read: usize,
    /// Distinct disk rows a merged read aims for.
    pub in_flight_target: usize,
    /// Where that target came from.
    pub in_flight_source: Option<TargetSource>,
    /// The I/O engine's depth: the most requests in flight at once, over all reads.
    pub engine_depth: usize,
    /// Batches delivered.
    pub batches: u64,
    /// Seeds in those batches (for link batches, their distinct endpoints).
    pub seeds: u64,
    /// Positive edges in those batches (link batches only).
    pub positive_edges: u64,
    /// Sampled nodes (feature rows) in those batches.
    pub sampled_nodes: u64,
    /// Sampled edges in those batches.
    pub edges: u64,
    /// Seconds from the loader's creation to the end of the epoch (or now).
    pub wall_secs: f64,
    /// Seconds the caller spent inside `next()`: waiting for batches when pipelined, doing all
    /// the work when not.
    pub next_secs: f64,
    /// Busy seconds sampling.
    pub sample_busy_secs: f64,
    /// Busy seconds pinning and serving from memory.
    pub lookup_busy_secs: f64,
    /// Busy seconds merging misses.
    pub accumulate_busy_secs: f64,
    /// Busy seconds in disk reads (the gather's wall time: submitting, waiting on the device,
    /// copying out).
    pub io_busy_secs: f64,
    /// Busy seconds scattering read rows into batches and admitting them to the cache.
    pub assemble_busy_secs: f64,
    /// Merged reads issued (those with at least one row).
    pub reads: u64,
    /// Batches served by those reads.
    pub read_batches: u64,
    /// Distinct rows read by them.
    pub read_rows: u64,
    /// Largest merged read, in rows.
    pub max_rows_per_read: u64,
    /// `read_rows / reads` (0 without reads).
    pub mean_rows_per_read: f64,
    /// `read_batches / reads` (0 without reads).
    pub mean_batches_per_read: f64,
    /// The reader's counts over those reads (requests, bytes, amplification).
    pub read: ReadStats,
    /// The tiers' counters over this epoch ([`FeatureTiers::take_stats`], taken when the
    /// loader was created, so earlier activity is excluded).
    pub tiers: TierStats,
}

impl PipelineStats {
    /// Sum of the stages' busy seconds.
    pub fn busy_secs(&self) -> f64 {
        self.sample_busy_secs
            + self.lookup_busy_secs
            + self.accumulate_busy_secs
            + self.io_busy_secs
            + self.assemble_busy_secs
    }

    /// Busy seconds per wall second: above 1 when stages overlapped (0 before any time passed).
    pub fn overlap(&self) -> f64 {
        if self.wall_secs > 0.0 {
            self.busy_secs() / self.wall_secs
        } else {
            0.0
        }
    }
}

/// An epoch of mini-batches for node-level tasks ([`NodeLoader::new`]) or link prediction
/// ([`NodeLoader::links`]); an iterator of `Result<Batch>` in batch order. Created per epoch;
/// see the module docs.
pub struct NodeLoader {
    mode: Mode,
    tiers: Arc<FeatureTiers>,
    counters: Arc<Counters>,
    num_batches: usize,
    /// Batches handed out, and what they held.
    delivered: usize,
    seeds: u64,
    positive_edges: u64,
    sampled_nodes: u64,
    edges: u64,
    next_ns: u64,
    started: Instant,
    /// When the iterator ended (all batches out, or an error).
    ended: Option<Instant>,
    /// Tier counters taken so far (a mutex so `stats(&self)` can take more).
    tier_stats: Mutex<TierStats>,
    fixed: PipelineStats,
}

impl NodeLoader {
    /// Starts an epoch over `seeds` (training nodes; shuffled per `(cfg.seed, epoch)` when
    /// `cfg.shuffle`, cut into `cfg.batch_size` chunks). With `cfg.pipeline` the stage threads
    /// start here and begin sampling at once.
    ///
    /// Seeds are checked when their batch is sampled: one out of range (or repeated within a
    /// batch) ends the epoch with an `Err` after the batches before it.
    ///
    /// Errors: an invalid `cfg`, or features with fewer rows than the graph has nodes.
    pub fn new(
        topo: Arc<Topology>,
        sampler: Arc<NeighborSampler>,
        tiers: Arc<FeatureTiers>,
        seeds: Vec<u32>,
        epoch: u64,
        cfg: LoaderConfig,
    ) -> Result<NodeLoader> {
        let items = Items::Nodes(seeds);
        Self::start(
            topo,
            sampler,
            tiers,
            items,
            epoch,
            cfg,
            ReadFault::default(),
        )
    }

    /// Starts a link-prediction epoch over `edges` (positive pairs, shuffled together per
    /// `(cfg.seed, epoch)` when `cfg.shuffle`, cut into `cfg.batch_size` edges); each batch is
    /// sampled by [`NeighborSampler::sample_links`] with [`batch_key`]`(epoch, index)`, and
    /// carries [`Batch::links`]. Otherwise as [`NodeLoader::new`]: endpoints are checked when
    /// their batch is sampled, and one out of range ends the epoch with an `Err` after the
    /// batches before it.
    ///
    /// Errors: as [`NodeLoader::new`], and `src` and `dst` of different lengths.
    pub fn links(
        topo: Arc<Topology>,
        sampler: Arc<NeighborSampler>,
        tiers: Arc<FeatureTiers>,
        edges: LinkEdges,
        epoch: u64,
        cfg: LoaderConfig,
    ) -> Result<NodeLoader> {
        if edges.src.len() != edges.dst.len() {
            return Err(GnnError::Config(format!(
                "link loader: {} edge sources but {} destinations; they must pair up",
                edges.src.len(),
                edges.dst.len()
            )));
        }
        let items = Items::Links(edges);
        Self::start(
            topo,
            sampler,
            tiers,
            items,
            epoch,
            cfg,
            ReadFault::default(),
        )
    }

    /// [`NodeLoader::new`] or [`NodeLoader::links`] with a read fault for the tests (inert
    /// outside them).
    fn start(
        topo: Arc<Topology>,
        sampler: Arc<NeighborSampler>,
        tiers: Arc<FeatureTiers>,
        items: Items,
        epoch: u64,
        cfg: LoaderConfig,
        fault: ReadFault,
    ) -> Result<NodeLoader> {
        cfg.validate()?;
        if (topo.num_nodes() as u64) > tiers.num_rows() {
            return Err(GnnError::Config(format!(
                "{}: {} feature rows but the graph has {} nodes; every node needs a row",
                tiers.reader().meta().path.display(),
                tiers.num_rows(),
                topo.num_nodes()
            )));
        }
        let (target, source) = in_flight_target(cfg.in_flight_target, tiers.reader());
        // The caller's source names a target it set; a derived one keeps its own.
        let source = cfg
            .in_flight_source
            .filter(|_| cfg.in_flight_target > 0)
            .unwrap_or(source);
        let max_batches = if cfg.accumulator {
            cfg.window.max(1)
        } else {
            1
        };
        let plan = Arc::new(Plan::new(items, epoch, &cfg));
        let num_batches = plan.num_batches;
        let counters = Arc::new(Counters::default());
        // Counters from before this epoch are not ours.
        tiers.take_stats();
        let fixed = PipelineStats {
            pipelined: cfg.pipeline,
            window: cfg.window,
            accumulator: cfg.accumulator,
            max_batches_per_read: max_batches,
            in_flight_target: target,
            in_flight_source: Some(source),
            engine_depth: tiers.reader().engine().depth(),
            ..PipelineStats::default()
        };
        let front_cfg = FrontConfig {
            window: cfg.window,
            target,
            max_batches,
        };
        let stages = Stages {
            topo,
            sampler,
            tiers: tiers.clone(),
            plan,
            counters: counters.clone(),
            fault,
        };
        // The clock starts before the stage threads do.
        let started = Instant::now();
        let mode = if cfg.pipeline {
            Mode::Threads(Threads::spawn(stages, front_cfg, &cfg))
        } else {
            Mode::Serial(Box::new(Serial::new(stages, front_cfg)))
        };
        Ok(NodeLoader {
            mode,
            tiers,
            counters,
            num_batches,
            delivered: 0,
            seeds: 0,
            positive_edges: 0,
            sampled_nodes: 0,
            edges: 0,
            next_ns: 0,
            started,
            ended: None,
            tier_stats: Mutex::new(TierStats::default()),
            fixed,
        })
    }

    /// Batches in the epoch (fewer are delivered if an error ends it early).
    pub fn num_batches(&self) -> usize {
        self.num_batches
    }

    /// The in-flight target in use (distinct disk rows per merged read).
    pub fn in_flight_target(&self) -> usize {
        self.fixed.in_flight_target
    }

    /// What the epoch did so far (see [`PipelineStats`]).
    pub fn stats(&self) -> PipelineStats {
        let c = &self.counters;
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        let reads = c.reads.load(Ordering::Relaxed);
        let read_rows = c.read_rows.load(Ordering::Relaxed);
        let read_batches = c.read_batches.load(Ordering::Relaxed);
        let per_read = |x: u64| {
            if reads == 0 {
                0.0
            } else {
                x as f64 / reads as f64
            }
        };
        let tiers = {
            let mut taken = self.tier_stats.lock().unwrap_or_else(|p| p.into_inner());
            taken.add(&self.tiers.take_stats());
            taken.clone()
        };
        PipelineStats {
            batches: self.delivered as u64,
            seeds: self.seeds,
            positive_edges: self.positive_edges,
            sampled_nodes: self.sampled_nodes,
            edges: self.edges,
            wall_secs: self
                .ended
                .unwrap_or_else(Instant::now)
                .duration_since(self.started)
                .as_secs_f64(),
            next_secs: self.next_ns as f64 * 1e-9,
            sample_busy_secs: secs(&c.sample_ns),
            lookup_busy_secs: secs(&c.lookup_ns),
            accumulate_busy_secs: secs(&c.accumulate_ns),
            io_busy_secs: secs(&c.io_ns),
            assemble_busy_secs: secs(&c.assemble_ns),
            reads,
            read_batches,
            read_rows,
            max_rows_per_read: c.max_read_rows.load(Ordering::Relaxed),
            mean_rows_per_read: per_read(read_rows),
            mean_batches_per_read: per_read(read_batches),
            read: *c.read.lock().unwrap_or_else(|p| p.into_inner()),
            tiers,
            ..self.fixed.clone()
        }
    }

    fn end(&mut self) {
        self.ended.get_or_insert_with(Instant::now);
    }
}

impl Iterator for NodeLoader {
    type Item = Result<Batch>;

    fn next(&mut self) -> Option<Result<Batch>> {
        let t = Instant::now();
        let item = match &mut self.mode {
            Mode::Serial(s) => s.next(),
            Mode::Threads(t) => t.next(),
        };
        self.next_ns += t.elapsed().as_nanos() as u64;
        match &item {
            Some(Ok(b)) => {
                debug_assert_eq!(b.index, self.delivered, "batches arrive in order");
                self.delivered += 1;
                self.seeds += b.seeds.len() as u64;
                if let Some(links) = &b.links {
                    self.positive_edges += links.src_local.len() as u64;
                }
                self.sampled_nodes += b.sample.nodes.len() as u64;
                self.edges += b.sample.num_edges() as u64;
                if self.delivered == self.num_batches {
                    self.end();
                }
            }
            Some(Err(_)) | None => self.end(),
        }
        item
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = if self.ended.is_some() {
            0
        } else {
            self.num_batches - self.delivered
        };
        // An error may end the epoch early.
        (left.min(1), Some(left))
    }
}

/// How the stages run: see [`serial`] and [`threads`].
enum Mode {
    Serial(Box<Serial>),
    Threads(Threads),
}
