//! The batch pipeline that feeds GNN training (GIDS's accumulator and window buffering, Helios's
//! overlapped stages): training seeds in, in-order mini-batches with their sampled blocks and
//! feature rows out.
//!
//! # Stages
//!
//! 1. **Sampling**: `sampler_threads` workers sample different batches; the results are put
//!    back in batch order before the window (a worker finishing early waits in a reorder
//!    buffer, never overtakes).
//! 2. **Window + lookup**: up to `window` sampled batches are kept ahead of the one being
//!    served, each pinned in the dynamic cache ([`FeatureTiers::pin_window`]) as it enters, so
//!    rows that a near-future batch needs survive until it is served (GIDS §3.4). The batch
//!    leaving the window is served from memory ([`FeatureTiers::serve`]): hot set and cache
//!    rows are copied into its feature buffer, and its misses go on.
//! 3. **Accumulator** ([`crate::accumulator`]): the misses of consecutive batches are merged
//!    until their distinct rows reach the in-flight target (GIDS §3.2), at most
//!    `max(window, 1)` batches (the most the look-ahead can provide without waiting for
//!    batches it cannot sample yet), then read as one deduplicated gather through
//!    [`FeatureTiers::reader`] on one of `io_threads` I/O threads.
//! 4. **Completion/assembly**: the read rows are scattered into each batch's buffer, offered to
//!    the dynamic cache ([`FeatureTiers::admit`], which releases the batch's remaining pins),
//!    and the batches are emitted in order.
//!
//! With `pipeline = true` each stage runs on its own thread(s), connected by bounded channels;
//! with `pipeline = false` the same code runs stage after stage on the caller's thread inside
//! [`Iterator::next`] (Helios's NoPipe ablation).
//!
//! # Determinism
//!
//! A batch's seeds depend only on `(seed, epoch)` and its sample only on the sampler's seed
//! and [`batch_key`]`(epoch, index)`; its feature rows are the file's bytes whichever tier
//! served them. So the batches are bit-identical with the pipeline on or off, the accumulator
//! on or off, any window and any thread count. What may vary from run to run is the split of
//! rows between the cache and the disk (it depends on when earlier reads were admitted) and
//! hence the statistics.
//!
//! # Memory
//!
//! Batches alive at once are bounded: `window` sampled and pinned batches ahead (samples only,
//! no feature buffers), at most `2 x sampler_threads` sampled but not yet in the window, one
//! accumulating read of at most `max(window, 1)` batches, at most `io_threads` merged reads
//! issued but not yet assembled, the batches of one read being handed out, and one in the
//! output channel. With the accumulator off a read is one batch, so that is about `window + 2 x
//! sampler_threads + io_threads + 3` batches.
//!
//! # Errors and shutdown
//!
//! An error in any stage (a seed out of range, a read error) reaches the iterator as `Err` in
//! batch order: the batches before the failing one are delivered first, then the error, then
//! the iterator ends. Dropping the loader (at any point) stops every stage and joins its
//! threads; a read in progress is finished first. A panic in a stage is re-raised on the
//! thread calling [`Iterator::next`].

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, select, unbounded, Receiver, Sender, TryRecvError};
use strata_store::rng::{derive, Rng};

use crate::accumulator::{in_flight_target, Accumulator, Merged, TargetSource};
use crate::error::{GnnError, Result};
use crate::features::ReadStats;
use crate::sampler::{NeighborSampler, Sample};
use crate::tiers::{FeatureTiers, TierStats};
use crate::topology::Topology;

/// Domain separators, so the shuffle and the batch keys are unrelated streams.
const SHUFFLE_STREAM: u64 = 0x5348_5546_4c45;
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
    /// Run the stages on their own threads (default true); false runs them one after the
    /// other on the caller's thread (the Helios-NoPipe ablation).
    pub pipeline: bool,
    /// Threads sampling different batches at once (default 2, at least 1; pipelined only).
    /// Each may also split a large layer over the sampler's own threads.
    pub sampler_threads: usize,
    /// Merged reads in flight at once, each on its own thread (default 1, at least 1;
    /// pipelined only). One gather already keeps the engine's depth of requests in flight.
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
    /// The batch's seeds (global ids), in the order of the sample's first rows.
    pub seeds: Vec<u32>,
    /// The sampled computation graph; `sample.nodes` lists the rows of `features`.
    pub sample: Sample,
    /// Raw little-endian feature rows, `sample.nodes.len() * row_bytes` bytes: row `i` holds
    /// the features of `sample.nodes[i]`.
    pub features: Vec<u8>,
    /// What this batch cost.
    pub stats: BatchStats,
}

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
    /// Seeds in those batches.
    pub seeds: u64,
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

/// An epoch of mini-batches for node-level tasks; an iterator of `Result<Batch>` in batch
/// order. Created per epoch; see the module docs.
pub struct NodeLoader {
    mode: Mode,
    tiers: Arc<FeatureTiers>,
    counters: Arc<Counters>,
    num_batches: usize,
    /// Batches handed out, and what they held.
    delivered: usize,
    seeds: u64,
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
        let max_batches = if cfg.accumulator {
            cfg.window.max(1)
        } else {
            1
        };
        let plan = Arc::new(Plan::new(seeds, epoch, &cfg));
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

// ---- the epoch's batches ----

/// The epoch's seed order, cut into batches.
struct Plan {
    order: Vec<u32>,
    batch_size: usize,
    num_batches: usize,
    epoch: u64,
}

impl Plan {
    fn new(mut order: Vec<u32>, epoch: u64, cfg: &LoaderConfig) -> Plan {
        if cfg.shuffle {
            // Fisher-Yates over one stream of (seed, epoch).
            let mut rng = Rng::new(derive(derive(cfg.seed, SHUFFLE_STREAM), epoch));
            for i in (1..order.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
        }
        let n = order.len();
        let num_batches = if cfg.drop_last {
            n / cfg.batch_size
        } else {
            n.div_ceil(cfg.batch_size)
        };
        Plan {
            order,
            batch_size: cfg.batch_size,
            num_batches,
            epoch,
        }
    }

    fn seeds(&self, b: usize) -> &[u32] {
        let start = b * self.batch_size;
        &self.order[start..(start + self.batch_size).min(self.order.len())]
    }
}

/// Busy time and read counters shared by the stages (nanoseconds and counts).
#[derive(Default)]
struct Counters {
    sample_ns: AtomicU64,
    lookup_ns: AtomicU64,
    accumulate_ns: AtomicU64,
    io_ns: AtomicU64,
    assemble_ns: AtomicU64,
    reads: AtomicU64,
    read_rows: AtomicU64,
    read_batches: AtomicU64,
    max_read_rows: AtomicU64,
    read: Mutex<ReadStats>,
}

fn add_busy(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// What every stage shares.
#[derive(Clone)]
struct Stages {
    topo: Arc<Topology>,
    sampler: Arc<NeighborSampler>,
    tiers: Arc<FeatureTiers>,
    plan: Arc<Plan>,
    counters: Arc<Counters>,
}

/// A sampled batch.
struct Sampled {
    index: usize,
    seeds: Vec<u32>,
    sample: Sample,
    sample_secs: f64,
}

fn sample_batch(st: &Stages, index: usize) -> Result<Sampled> {
    let t = Instant::now();
    let seeds = st.plan.seeds(index).to_vec();
    let sample = st
        .sampler
        .sample(&st.topo, &seeds, batch_key(st.plan.epoch, index));
    add_busy(&st.counters.sample_ns, t);
    Ok(Sampled {
        index,
        seeds,
        sample: sample?,
        sample_secs: t.elapsed().as_secs_f64(),
    })
}

/// A batch served from memory: its feature buffer holds every memory row, and `misses` lists
/// the positions still to come from disk (each still holding one window pin).
struct Served {
    batch: Sampled,
    features: Vec<u8>,
    misses: Vec<u32>,
}

/// Where the front gets its sampled batches from, in batch order.
trait SampleSource {
    /// The next batch in order; `None` when all were handed out (or the loader is stopping).
    fn next_sampled(&mut self) -> Option<Result<Sampled>>;
    /// Whether the loader is stopping.
    fn cancelled(&self) -> bool;
}

/// What the front hands to the I/O stage.
enum Work {
    Read(Merged<Served>),
    /// The epoch ends with this error, after every earlier read.
    Fail(GnnError),
}

#[derive(Clone, Copy)]
struct FrontConfig {
    window: usize,
    target: usize,
    max_batches: usize,
}

/// Stages 2 and 3: the look-ahead window (pins), the lookup, the accumulator.
struct Front<S> {
    source: S,
    tiers: Arc<FeatureTiers>,
    counters: Arc<Counters>,
    window: usize,
    /// Sampled and pinned, not yet served, oldest first.
    ahead: VecDeque<Sampled>,
    acc: Accumulator<Served>,
    /// The source has nothing more (or failed).
    exhausted: bool,
    /// The error that ends the epoch once the batches before it are out.
    failed: Option<GnnError>,
    finished: bool,
}

impl<S: SampleSource> Front<S> {
    fn new(source: S, st: &Stages, cfg: FrontConfig) -> Front<S> {
        Front {
            source,
            tiers: st.tiers.clone(),
            counters: st.counters.clone(),
            window: cfg.window,
            ahead: VecDeque::with_capacity(cfg.window + 1),
            acc: Accumulator::new(cfg.target, cfg.max_batches),
            exhausted: false,
            failed: None,
            finished: false,
        }
    }

    /// Samples until `window` batches wait behind the next one to serve: pinning them first
    /// means rows read for the current batch that they also need are protected the moment
    /// they are admitted.
    fn fill(&mut self) {
        while !self.exhausted && self.ahead.len() <= self.window {
            match self.source.next_sampled() {
                None => self.exhausted = true,
                Some(Err(e)) => {
                    // Nothing after a failed batch is delivered: stop sampling, drain the
                    // batches before it, then report.
                    self.failed = Some(e);
                    self.exhausted = true;
                }
                Some(Ok(s)) => {
                    let t = Instant::now();
                    self.tiers.pin_window(&s.sample.nodes);
                    add_busy(&self.counters.lookup_ns, t);
                    self.ahead.push_back(s);
                }
            }
        }
    }

    fn serve(&self, batch: Sampled) -> Served {
        let t = Instant::now();
        let nodes = &batch.sample.nodes;
        let mut features = vec![0u8; nodes.len() * self.tiers.row_bytes()];
        let misses = self.tiers.serve(nodes, &mut features, true);
        add_busy(&self.counters.lookup_ns, t);
        Served {
            batch,
            features,
            misses,
        }
    }

    /// The next merged read, the error that ends the epoch, or `None` at the end.
    fn next_work(&mut self) -> Option<Work> {
        if self.finished {
            return None;
        }
        loop {
            if self.source.cancelled() {
                self.finished = true;
                return None;
            }
            self.fill();
            let Some(batch) = self.ahead.pop_front() else {
                break;
            };
            let served = self.serve(batch);
            let t = Instant::now();
            let nodes = &served.batch.sample.nodes;
            let miss_nodes = served.misses.iter().map(|&i| nodes[i as usize]).collect();
            self.acc.push(served, miss_nodes);
            let full = self.acc.is_full();
            add_busy(&self.counters.accumulate_ns, t);
            if full {
                break;
            }
        }
        if !self.acc.is_empty() {
            let t = Instant::now();
            let merged = self.acc.take();
            add_busy(&self.counters.accumulate_ns, t);
            return Some(Work::Read(merged));
        }
        self.finished = true;
        self.failed.take().map(Work::Fail)
    }
}

/// A merged read done: its rows (`rows[k]`'s bytes at `k * row_bytes` of `data`).
struct ReadDone {
    merged: Merged<Served>,
    data: Vec<u8>,
}

/// Stage 3's I/O: one deduplicated gather for all the merged batches' misses.
fn read_merged(st: &Stages, merged: Merged<Served>) -> Result<ReadDone> {
    let rows = &merged.rows;
    let mut data = vec![0u8; rows.len() * st.tiers.row_bytes()];
    if !rows.is_empty() {
        let t = Instant::now();
        let read = st.tiers.reader().gather(rows, &mut data);
        add_busy(&st.counters.io_ns, t);
        let read = read?;
        st.tiers.record_disk_reads(&read);
        let c = &st.counters;
        c.reads.fetch_add(1, Ordering::Relaxed);
        c.read_rows.fetch_add(rows.len() as u64, Ordering::Relaxed);
        c.read_batches
            .fetch_add(merged.items.len() as u64, Ordering::Relaxed);
        c.max_read_rows
            .fetch_max(rows.len() as u64, Ordering::Relaxed);
        c.read.lock().unwrap_or_else(|p| p.into_inner()).add(&read);
    }
    Ok(ReadDone { merged, data })
}

/// Stage 4: read rows into their batches, admitted to the cache, batches out.
struct Assembler {
    tiers: Arc<FeatureTiers>,
    counters: Arc<Counters>,
    /// Scratch for one batch's admitted rows (reused).
    rows: Vec<u8>,
}

impl Assembler {
    fn new(st: &Stages) -> Assembler {
        Assembler {
            tiers: st.tiers.clone(),
            counters: st.counters.clone(),
            rows: Vec::new(),
        }
    }

    fn assemble(&mut self, done: ReadDone) -> Vec<Batch> {
        let t = Instant::now();
        let rb = self.tiers.row_bytes();
        let ReadDone { merged, data } = done;
        let merged_batches = merged.items.len();
        let merged_rows = merged.rows.len();
        let mut out = Vec::with_capacity(merged_batches);
        for (served, miss_nodes) in merged.items.into_iter().zip(merged.item_rows) {
            let Served {
                batch,
                mut features,
                misses,
            } = served;
            self.rows.clear();
            for (&i, &v) in misses.iter().zip(&miss_nodes) {
                let k = merged
                    .rows
                    .binary_search(&v)
                    .expect("every miss is in its merged read");
                let row = &data[k * rb..][..rb];
                features[i as usize * rb..][..rb].copy_from_slice(row);
                self.rows.extend_from_slice(row);
            }
            // Releases the pins the batch still holds (one per miss), whether or not the
            // cache keeps the rows.
            self.tiers.admit(&miss_nodes, &self.rows, true);
            let stats = BatchStats {
                sample_secs: batch.sample_secs,
                memory_rows: batch.sample.nodes.len() - misses.len(),
                disk_rows: misses.len(),
                merged_batches: if merged_rows > 0 { merged_batches } else { 0 },
                merged_rows,
            };
            out.push(Batch {
                index: batch.index,
                seeds: batch.seeds,
                sample: batch.sample,
                features,
                stats,
            });
        }
        // Keep the scratch from growing to the largest batch forever.
        if self.rows.capacity() > 64 << 20 {
            self.rows = Vec::new();
        }
        add_busy(&self.counters.assemble_ns, t);
        out
    }
}

// ---- serial mode (pipeline = false) ----

enum Mode {
    Serial(Box<Serial>),
    Threads(Threads),
}

/// Samples on the caller's thread.
struct InlineSource {
    st: Stages,
    next: usize,
}

impl SampleSource for InlineSource {
    fn next_sampled(&mut self) -> Option<Result<Sampled>> {
        if self.next == self.st.plan.num_batches {
            return None;
        }
        let b = self.next;
        self.next += 1;
        Some(sample_batch(&self.st, b))
    }

    fn cancelled(&self) -> bool {
        false
    }
}

/// Every stage in turn on the caller's thread.
struct Serial {
    st: Stages,
    front: Front<InlineSource>,
    assembler: Assembler,
    ready: VecDeque<Batch>,
    done: bool,
}

impl Serial {
    fn new(st: Stages, cfg: FrontConfig) -> Serial {
        let source = InlineSource {
            st: st.clone(),
            next: 0,
        };
        Serial {
            front: Front::new(source, &st, cfg),
            assembler: Assembler::new(&st),
            st,
            ready: VecDeque::new(),
            done: false,
        }
    }

    fn next(&mut self) -> Option<Result<Batch>> {
        loop {
            if let Some(b) = self.ready.pop_front() {
                return Some(Ok(b));
            }
            if self.done {
                return None;
            }
            let result = match self.front.next_work() {
                None => {
                    self.done = true;
                    continue;
                }
                Some(Work::Fail(e)) => Err(e),
                Some(Work::Read(merged)) => read_merged(&self.st, merged),
            };
            match result {
                Ok(done) => self.ready.extend(self.assembler.assemble(done)),
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

// ---- pipelined mode ----

/// A sampling worker's answer: the batch, or the payload of a panic to re-raise.
type SampleMsg = (usize, std::thread::Result<Result<Sampled>>);
/// An I/O worker's answer for read `seq`.
type DoneMsg = (u64, std::thread::Result<Result<ReadDone>>);

/// Receives from `rx` unless the loader stops first (`None` then, or when `rx` is closed).
fn recv_or_stop<T>(rx: &Receiver<T>, stop: &Receiver<()>) -> Option<T> {
    select! {
        recv(rx) -> m => m.ok(),
        recv(stop) -> _ => None,
    }
}

/// Sends on `tx` unless the loader stops first; false when it did (or `tx` is closed).
fn send_or_stop<T>(tx: &Sender<T>, item: T, stop: &Receiver<()>) -> bool {
    select! {
        send(tx, item) -> r => r.is_ok(),
        recv(stop) -> _ => false,
    }
}

fn stopped(stop: &Receiver<()>) -> bool {
    matches!(stop.try_recv(), Err(TryRecvError::Disconnected))
}

/// Batches from the sampling workers, put back in order. It asks for at most
/// `max_outstanding` batches beyond the next one expected, which bounds the reorder buffer.
struct FeedSource {
    jobs: Sender<usize>,
    results: Receiver<SampleMsg>,
    stop: Receiver<()>,
    reorder: BTreeMap<usize, Result<Sampled>>,
    next_issue: usize,
    next_expected: usize,
    max_outstanding: usize,
    num_batches: usize,
}

impl SampleSource for FeedSource {
    fn next_sampled(&mut self) -> Option<Result<Sampled>> {
        if self.next_expected == self.num_batches {
            return None;
        }
        while self.next_issue < self.num_batches
            && self.next_issue - self.next_expected < self.max_outstanding
        {
            // Unbounded, never blocks; fails only when every worker is gone.
            self.jobs.send(self.next_issue).ok()?;
            self.next_issue += 1;
        }
        loop {
            if let Some(r) = self.reorder.remove(&self.next_expected) {
                self.next_expected += 1;
                return Some(r);
            }
            let (b, r) = recv_or_stop(&self.results, &self.stop)?;
            match r {
                Ok(r) => {
                    self.reorder.insert(b, r);
                }
                // A bug in the sampler: re-raise here, which tears the pipeline down and
                // reaches the caller through the join.
                Err(payload) => panic::resume_unwind(payload),
            }
        }
    }

    fn cancelled(&self) -> bool {
        stopped(&self.stop)
    }
}

/// The stage threads and the channel the batches come out of.
struct Threads {
    out: Option<Receiver<Result<Batch>>>,
    /// Never sent on: dropping it closes the channel, which wakes every blocked stage.
    stop: Option<Sender<()>>,
    handles: Vec<JoinHandle<()>>,
}

impl Threads {
    fn spawn(st: Stages, fcfg: FrontConfig, cfg: &LoaderConfig) -> Threads {
        let (stop_tx, stop) = bounded::<()>(0);
        // The front bounds what is outstanding on these two, so they need no bound of their
        // own (and a worker never blocks on a send).
        let (jobs_tx, jobs_rx) = unbounded::<usize>();
        let (samples_tx, samples_rx) = unbounded::<SampleMsg>();
        let (work_tx, work_rx) = bounded::<(u64, Work)>(cfg.io_threads);
        // Bounded by the tickets: at most `io_threads` reads issued and not yet assembled.
        let (done_tx, done_rx) = unbounded::<DoneMsg>();
        let (ticket_tx, ticket_rx) = bounded::<()>(cfg.io_threads);
        for _ in 0..cfg.io_threads {
            ticket_tx.send(()).expect("room for every ticket");
        }
        let (out_tx, out_rx) = bounded::<Result<Batch>>(1);
        let mut handles = Vec::new();
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name)
                .spawn(f)
                .expect("spawn a GNN pipeline thread")
        };

        for w in 0..cfg.sampler_threads {
            let (st, jobs, tx, stop) = (
                st.clone(),
                jobs_rx.clone(),
                samples_tx.clone(),
                stop.clone(),
            );
            handles.push(spawn(
                format!("strata-gnn-sample-{w}"),
                Box::new(move || {
                    while let Some(b) = recv_or_stop(&jobs, &stop) {
                        let r = panic::catch_unwind(AssertUnwindSafe(|| sample_batch(&st, b)));
                        let panicked = r.is_err();
                        if tx.send((b, r)).is_err() || panicked {
                            return;
                        }
                    }
                }),
            ));
        }
        drop((jobs_rx, samples_tx));

        {
            let source = FeedSource {
                jobs: jobs_tx,
                results: samples_rx,
                stop: stop.clone(),
                reorder: BTreeMap::new(),
                next_issue: 0,
                next_expected: 0,
                max_outstanding: 2 * cfg.sampler_threads,
                num_batches: st.plan.num_batches,
            };
            let mut front = Front::new(source, &st, fcfg);
            let stop = stop.clone();
            handles.push(spawn(
                "strata-gnn-window".into(),
                Box::new(move || {
                    let mut seq = 0u64;
                    while let Some(work) = front.next_work() {
                        // A read is issued only while fewer than `io_threads` are being read
                        // or waiting for assembly: this bounds the batches alive.
                        if recv_or_stop(&ticket_rx, &stop).is_none()
                            || !send_or_stop(&work_tx, (seq, work), &stop)
                        {
                            return;
                        }
                        seq += 1;
                    }
                }),
            ));
        }

        for w in 0..cfg.io_threads {
            let (st, rx, tx, stop) = (st.clone(), work_rx.clone(), done_tx.clone(), stop.clone());
            handles.push(spawn(
                format!("strata-gnn-io-{w}"),
                Box::new(move || {
                    while let Some((seq, work)) = recv_or_stop(&rx, &stop) {
                        let r = panic::catch_unwind(AssertUnwindSafe(|| match work {
                            Work::Read(merged) => read_merged(&st, merged),
                            Work::Fail(e) => Err(e),
                        }));
                        let panicked = r.is_err();
                        if tx.send((seq, r)).is_err() || panicked {
                            return;
                        }
                    }
                }),
            ));
        }
        drop((work_rx, done_tx));

        {
            let mut assembler = Assembler::new(&st);
            let stop = stop.clone();
            handles.push(spawn(
                "strata-gnn-assemble".into(),
                Box::new(move || {
                    // Reads finish in any order when several are in flight; batches leave in
                    // order.
                    let mut reorder: BTreeMap<u64, Result<ReadDone>> = BTreeMap::new();
                    let mut next = 0u64;
                    while let Some((seq, r)) = recv_or_stop(&done_rx, &stop) {
                        match r {
                            Ok(r) => {
                                reorder.insert(seq, r);
                            }
                            Err(payload) => panic::resume_unwind(payload),
                        }
                        while let Some(r) = reorder.remove(&next) {
                            next += 1;
                            match r {
                                Ok(done) => {
                                    let batches = assembler.assemble(done);
                                    // The read's slot is free; never blocks (one ticket per
                                    // slot).
                                    let _ = ticket_tx.try_send(());
                                    for b in batches {
                                        if !send_or_stop(&out_tx, Ok(b), &stop) {
                                            return;
                                        }
                                    }
                                }
                                Err(e) => {
                                    send_or_stop(&out_tx, Err(e), &stop);
                                    return;
                                }
                            }
                        }
                    }
                }),
            ));
        }

        Threads {
            out: Some(out_rx),
            stop: Some(stop_tx),
            handles,
        }
    }

    fn next(&mut self) -> Option<Result<Batch>> {
        let out = self.out.as_ref()?;
        match out.recv() {
            Ok(Ok(b)) => Some(Ok(b)),
            Ok(Err(e)) => {
                self.shutdown();
                Some(Err(e))
            }
            // The assembler finished (every batch out) or a stage panicked.
            Err(_) => {
                if let Some(payload) = self.shutdown() {
                    panic::resume_unwind(payload);
                }
                None
            }
        }
    }

    /// Stops every stage and joins the threads; returns the first panic among them.
    fn shutdown(&mut self) -> Option<Box<dyn Any + Send>> {
        self.stop.take();
        self.out.take();
        let mut first = None;
        for h in self.handles.drain(..) {
            if let Err(p) = h.join() {
                first.get_or_insert(p);
            }
        }
        first
    }
}

impl Drop for Threads {
    fn drop(&mut self) {
        // A panic nobody asked about stays unreported rather than aborting in a destructor.
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::Eviction;
    use crate::features::{FeatureReader, ReadOptions};
    use crate::sampler::SamplerConfig;
    use std::path::{Path, PathBuf};
    use std::sync::OnceLock;
    use std::time::Duration;
    use strata_io::{BackendKind, Engine, EngineConfig};
    use strata_store::npy::{self, DType};

    /// Nodes of the test graph.
    const N: u32 = 2000;
    /// Floats per row: 96-byte rows, so several share a page and the reader coalesces.
    const DIM: usize = 24;
    /// Training seeds: every third node, 667 of them, so 14 batches of 50 (the last of 17).
    const BATCH: usize = 50;
    const NUM_BATCHES: usize = 14;

    fn splitmix(state: &mut u64) -> u64 {
        *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A small engine on the thread-pool backend: the window is small, so gathers wait for
    /// room, and it works on every file system.
    fn engine() -> Arc<Engine> {
        static ENGINE: OnceLock<Arc<Engine>> = OnceLock::new();
        ENGINE
            .get_or_init(|| {
                Engine::new(&EngineConfig {
                    backend: BackendKind::Threads,
                    depth: 16,
                    threads: 4,
                    ..EngineConfig::default()
                })
                .unwrap()
            })
            .clone()
    }

    /// `n` nodes with 0..12 in-neighbours each, drawn as the smaller of two uniform ids: low
    /// ids are hubs, so batches overlap and the tiers hit.
    fn graph(n: u32, seed: u64) -> Topology {
        let mut s = seed;
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        for _ in 0..n {
            for _ in 0..splitmix(&mut s) % 12 {
                let a = splitmix(&mut s) % n as u64;
                let b = splitmix(&mut s) % n as u64;
                indices.push(a.min(b) as u32);
            }
            indptr.push(indices.len() as u64);
        }
        Topology::new(indptr, indices).unwrap()
    }

    /// A `(rows, dim)` float32 `.npy` with its data at byte 4096 (Strata's header); element
    /// `(r, c)` is `r * dim + c + 0.5`, so every row is distinct.
    fn write_features(dir: &Path, rows: u64, dim: usize) -> PathBuf {
        let path = dir.join(format!("features-{rows}.npy"));
        let mut bytes = npy::header_block(DType::F32, &[rows, dim as u64]);
        assert_eq!(bytes.len(), 4096);
        for r in 0..rows as usize {
            for c in 0..dim {
                bytes.extend_from_slice(&((r * dim + c) as f32 + 0.5).to_le_bytes());
            }
        }
        std::fs::write(&path, bytes).unwrap();
        path
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        path: PathBuf,
        /// The whole feature file, for direct reads.
        file: Vec<u8>,
        topo: Arc<Topology>,
        sampler: Arc<NeighborSampler>,
        train: Vec<u32>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), N as u64, DIM);
        let sampler = NeighborSampler::new(SamplerConfig {
            fanouts: vec![5, 3],
            seed: 7,
            threads: 1,
        })
        .unwrap();
        Fixture {
            file: std::fs::read(&path).unwrap(),
            path,
            _dir: dir,
            topo: Arc::new(graph(N, 3)),
            sampler: Arc::new(sampler),
            train: (0..N).step_by(3).collect(),
        }
    }

    impl Fixture {
        /// Tiers with the `hot` lowest ids (the hubs) in the hot set and a cache of
        /// `cache_rows` rows.
        fn tiers(&self, hot: u32, cache_rows: usize) -> Arc<FeatureTiers> {
            let reader =
                FeatureReader::with_engine(&self.path, engine(), ReadOptions::default()).unwrap();
            let hot: Vec<u32> = (0..hot).collect();
            Arc::new(FeatureTiers::build(reader, &hot, cache_rows, Eviction::Clock).unwrap())
        }

        fn loader(
            &self,
            tiers: &Arc<FeatureTiers>,
            seeds: Vec<u32>,
            epoch: u64,
            cfg: LoaderConfig,
        ) -> NodeLoader {
            NodeLoader::new(
                self.topo.clone(),
                self.sampler.clone(),
                tiers.clone(),
                seeds,
                epoch,
                cfg,
            )
            .unwrap()
        }

        /// Every batch of an epoch over the training seeds, and the stats.
        fn epoch(
            &self,
            tiers: &Arc<FeatureTiers>,
            epoch: u64,
            cfg: LoaderConfig,
        ) -> (Vec<Batch>, PipelineStats) {
            let mut loader = self.loader(tiers, self.train.clone(), epoch, cfg);
            let batches: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
            (batches, loader.stats())
        }

        /// The rows of `nodes` read plainly from the file.
        fn expected(&self, nodes: &[u32]) -> Vec<u8> {
            let rb = DIM * 4;
            let mut out = Vec::with_capacity(nodes.len() * rb);
            for &v in nodes {
                out.extend_from_slice(&self.file[4096 + v as usize * rb..][..rb]);
            }
            out
        }

        fn check_batches(&self, batches: &[Batch]) {
            for (i, b) in batches.iter().enumerate() {
                assert_eq!(b.index, i, "batches arrive in order");
                assert_eq!(&b.sample.nodes[..b.seeds.len()], &b.seeds[..]);
                assert_eq!(b.features.len(), b.sample.nodes.len() * DIM * 4);
                assert!(
                    b.features == self.expected(&b.sample.nodes),
                    "batch {i}: features differ from the file's rows"
                );
                assert_eq!(
                    b.stats.memory_rows + b.stats.disk_rows,
                    b.sample.nodes.len()
                );
            }
        }
    }

    /// Every pin taken for the window was released.
    fn check_no_pins(tiers: &FeatureTiers) {
        let cache = tiers.cache_for_tests();
        assert_eq!(cache.pinned_rows(), 0, "pinned cached rows after the epoch");
        if let Some(v) = (0..N).find(|&v| cache.pins(v) != 0) {
            panic!("node {v} still holds {} pins", cache.pins(v));
        }
    }

    fn cfg() -> LoaderConfig {
        LoaderConfig {
            batch_size: BATCH,
            window: 4,
            in_flight_target: 64,
            sampler_threads: 2,
            io_threads: 2,
            ..LoaderConfig::default()
        }
    }

    #[test]
    fn batches_hold_the_file_rows_in_order_and_cover_every_seed_once() {
        let f = fixture();
        for pipeline in [true, false] {
            let tiers = f.tiers(100, 300);
            let cfg = LoaderConfig { pipeline, ..cfg() };
            let mut loader = f.loader(&tiers, f.train.clone(), 0, cfg);
            assert_eq!(loader.num_batches(), NUM_BATCHES);
            assert_eq!(loader.size_hint(), (1, Some(NUM_BATCHES)));
            let batches: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
            let stats = loader.stats();
            assert_eq!(batches.len(), NUM_BATCHES);
            f.check_batches(&batches);
            assert!(batches[..NUM_BATCHES - 1]
                .iter()
                .all(|b| b.seeds.len() == BATCH));
            assert_eq!(batches[NUM_BATCHES - 1].seeds.len(), f.train.len() % BATCH);
            let mut seen: Vec<u32> = batches.iter().flat_map(|b| b.seeds.clone()).collect();
            seen.sort_unstable();
            assert_eq!(seen, f.train, "each training seed exactly once");
            check_no_pins(&tiers);

            assert_eq!(stats.batches, NUM_BATCHES as u64);
            assert_eq!(stats.seeds, f.train.len() as u64);
            let nodes: usize = batches.iter().map(|b| b.sample.nodes.len()).sum();
            assert_eq!(stats.sampled_nodes, nodes as u64);
            assert_eq!(
                stats.tiers.rows, nodes as u64,
                "every row went through the tiers"
            );
            assert!(stats.tiers.hot_rows > 0 && stats.tiers.disk_rows > 0);
            assert_eq!(stats.read.rows_distinct, stats.read_rows);
            assert_eq!(stats.tiers.disk_requests, stats.read.requests);
            assert_eq!(stats.pipelined, pipeline);
            assert!(stats.wall_secs > 0.0 && stats.sample_busy_secs > 0.0);
            assert!(stats.io_busy_secs > 0.0 && stats.lookup_busy_secs > 0.0);
            assert!(stats.busy_secs() > 0.0 && stats.overlap() > 0.0);
            let json = serde_json::to_string(&stats).unwrap();
            assert!(json.contains("\"assemble_busy_secs\""), "{json}");
        }
    }

    #[test]
    fn batches_are_identical_however_the_pipeline_runs() {
        let f = fixture();
        let base_cfg = LoaderConfig {
            pipeline: false,
            accumulator: false,
            window: 0,
            ..cfg()
        };
        let (base, _) = f.epoch(&f.tiers(0, 0), 5, base_cfg);
        f.check_batches(&base);
        // One set of tiers for all runs: the cache carries rows over, which must not change
        // a byte.
        let tiers = f.tiers(60, 250);
        for pipeline in [false, true] {
            for accumulator in [false, true] {
                for window in [0, 4, 8] {
                    for sampler_threads in [1, 3] {
                        let cfg = LoaderConfig {
                            pipeline,
                            accumulator,
                            window,
                            sampler_threads,
                            io_threads: sampler_threads.min(2),
                            ..cfg()
                        };
                        let what = format!("{cfg:?}");
                        let (batches, _) = f.epoch(&tiers, 5, cfg);
                        assert_eq!(batches.len(), base.len(), "{what}");
                        for (a, b) in base.iter().zip(&batches) {
                            assert_eq!(a.index, b.index, "{what}");
                            assert_eq!(a.seeds, b.seeds, "{what}");
                            assert_eq!(a.sample, b.sample, "{what}");
                            assert!(a.features == b.features, "{what}: batch {}", a.index);
                        }
                        check_no_pins(&tiers);
                    }
                }
            }
        }
    }

    #[test]
    fn shuffle_is_a_function_of_seed_and_epoch() {
        let f = fixture();
        let tiers = f.tiers(0, 100);
        let order = |epoch: u64, cfg: LoaderConfig| -> Vec<u32> {
            let (batches, _) = f.epoch(&tiers, epoch, cfg);
            batches.into_iter().flat_map(|b| b.seeds).collect()
        };
        let a = order(0, cfg());
        assert_eq!(a, order(0, cfg()));
        assert_ne!(a, f.train, "shuffled");
        assert_ne!(a, order(1, cfg()), "another epoch, another order");
        assert_ne!(a, order(0, LoaderConfig { seed: 9, ..cfg() }));
        let plain = LoaderConfig {
            shuffle: false,
            ..cfg()
        };
        assert_eq!(order(0, plain.clone()), f.train);
        assert_eq!(order(3, plain), f.train, "unshuffled: the given order");

        let cfg = LoaderConfig {
            drop_last: true,
            ..cfg()
        };
        let (batches, _) = f.epoch(&tiers, 0, cfg);
        assert_eq!(batches.len(), f.train.len() / BATCH);
        assert!(batches.iter().all(|b| b.seeds.len() == BATCH));
        // The samples depend on the batch key only: a batch re-sampled alone matches.
        let b = &batches[2];
        assert_eq!(
            f.sampler
                .sample(&f.topo, &b.seeds, batch_key(0, 2))
                .unwrap(),
            b.sample
        );
        check_no_pins(&tiers);
    }

    #[test]
    fn the_window_pins_batches_ahead_until_they_are_served() {
        let f = fixture();
        let tiers = f.tiers(0, 300);
        let pinned = |t: &FeatureTiers| -> u64 {
            let cache = t.cache_for_tests();
            (0..N).map(|v| cache.pins(v) as u64).sum()
        };
        let cfg = LoaderConfig {
            pipeline: false,
            window: 4,
            ..cfg()
        };
        let mut loader = f.loader(&tiers, f.train.clone(), 0, cfg);
        let first = loader.next().unwrap().unwrap();
        // Serial: batch 0 was served and admitted (its misses exceed the target, so it was
        // read alone); batches 1 to 4 wait in the window, each node pinned once per batch.
        let held = pinned(&tiers);
        assert!(held > 0, "no pin held for the batches ahead");
        assert!(held as usize > first.sample.nodes.len() / 2);
        let rest: Vec<Batch> = loader.by_ref().map(|b| b.unwrap()).collect();
        assert_eq!(rest.len(), NUM_BATCHES - 1);
        assert_eq!(pinned(&tiers), 0);
        check_no_pins(&tiers);
    }

    #[test]
    fn the_accumulator_merges_batches_up_to_the_window() {
        let f = fixture();
        for pipeline in [true, false] {
            // No memory tier: every row of every batch is a disk row.
            let tiers = f.tiers(0, 0);
            let run = |accumulator: bool, target: usize| {
                let cfg = LoaderConfig {
                    pipeline,
                    accumulator,
                    in_flight_target: target,
                    window: 4,
                    ..cfg()
                };
                let (batches, stats) = f.epoch(&tiers, 0, cfg);
                f.check_batches(&batches);
                assert_eq!(stats.in_flight_target, target.max(1));
                (batches, stats)
            };
            let (alone, off) = run(false, 1 << 30);
            assert_eq!(off.reads, NUM_BATCHES as u64);
            assert_eq!(off.max_batches_per_read, 1);
            assert!(alone.iter().all(|b| b.stats.merged_batches == 1));
            let per_batch = alone.iter().map(|b| b.sample.nodes.len()).max().unwrap();

            // A target no batch reaches: merged up to the window (4), 14 = 4 + 4 + 4 + 2.
            let (merged, on) = run(true, 1 << 30);
            assert_eq!(on.reads, 4, "{on:?}");
            assert_eq!(on.read_batches, NUM_BATCHES as u64);
            assert_eq!(on.max_batches_per_read, 4);
            assert_eq!(on.mean_batches_per_read, 3.5);
            let sizes: Vec<usize> = merged.iter().map(|b| b.stats.merged_batches).collect();
            assert_eq!(sizes, [4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 2, 2]);
            assert!(
                on.mean_rows_per_read > per_batch as f64,
                "merged reads ({}) exceed the largest batch ({per_batch})",
                on.mean_rows_per_read
            );
            assert!(on.mean_rows_per_read > off.mean_rows_per_read);
            // Rows shared by merged batches are read once.
            assert!(
                on.read_rows < off.read_rows,
                "{} vs {}",
                on.read_rows,
                off.read_rows
            );

            // A target every batch reaches alone: no merging.
            let (_, small) = run(true, 1);
            assert_eq!(small.reads, NUM_BATCHES as u64);
            assert_eq!(small.max_batches_per_read, 4);
        }
    }

    #[test]
    fn the_in_flight_target_defaults_to_the_device_or_the_engine() {
        let f = fixture();
        let tiers = f.tiers(0, 0);
        let loader = f.loader(
            &tiers,
            f.train.clone(),
            0,
            LoaderConfig {
                in_flight_target: 0,
                ..cfg()
            },
        );
        let stats = loader.stats();
        assert!(loader.in_flight_target() >= 1);
        match stats.in_flight_source {
            Some(TargetSource::EngineDepth) => assert_eq!(loader.in_flight_target(), 16),
            Some(TargetSource::Profile) => {}
            other => panic!("unexpected source {other:?}"),
        }
    }

    #[test]
    fn errors_arrive_in_order_and_end_the_epoch() {
        let f = fixture();
        // Batch 3 (unshuffled) holds a node the graph does not have.
        let mut seeds = f.train.clone();
        seeds[3 * BATCH + 7] = N + 5;
        for pipeline in [true, false] {
            for accumulator in [true, false] {
                let tiers = f.tiers(10, 100);
                let cfg = LoaderConfig {
                    pipeline,
                    accumulator,
                    shuffle: false,
                    sampler_threads: 3,
                    ..cfg()
                };
                let mut loader = f.loader(&tiers, seeds.clone(), 0, cfg);
                for i in 0..3 {
                    let b = loader.next().unwrap().unwrap();
                    assert_eq!(b.index, i);
                    assert!(b.features == f.expected(&b.sample.nodes));
                }
                let e = loader.next().unwrap().unwrap_err().to_string();
                assert!(e.contains("out of range"), "{e}");
                assert!(loader.next().is_none());
                assert!(loader.next().is_none());
                assert_eq!(loader.size_hint(), (0, Some(0)));
                assert_eq!(loader.stats().batches, 3);
            }
        }
    }

    /// Runs `f` on another thread and fails if it does not return in time (a hang).
    fn within(secs: u64, what: &str, f: impl FnOnce() + Send + 'static) {
        let (tx, rx) = crossbeam_channel::bounded(1);
        let h = std::thread::spawn(move || {
            f();
            let _ = tx.send(());
        });
        match rx.recv_timeout(Duration::from_secs(secs)) {
            Ok(()) => h.join().unwrap(),
            // The thread panicked: report its panic.
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                if let Err(p) = h.join() {
                    panic::resume_unwind(p)
                }
            }
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => panic!("{what}: hung"),
        }
    }

    #[test]
    fn dropping_the_loader_mid_epoch_stops_every_stage() {
        let f = Arc::new(fixture());
        for take in [0usize, 1, 5, NUM_BATCHES, NUM_BATCHES + 1] {
            for (window, io_threads) in [(0, 1), (8, 2)] {
                let f = f.clone();
                within(60, &format!("drop after {take} batches"), move || {
                    let tiers = f.tiers(10, 50);
                    let cfg = LoaderConfig {
                        window,
                        io_threads,
                        sampler_threads: 3,
                        ..cfg()
                    };
                    let mut loader = f.loader(&tiers, f.train.clone(), 0, cfg);
                    for _ in 0..take {
                        if let Some(b) = loader.next() {
                            b.unwrap();
                        }
                    }
                    drop(loader);
                    // Every stage thread held the tiers; joined threads released them.
                    assert_eq!(Arc::strong_count(&tiers), 1, "a stage thread outlived drop");
                });
            }
        }
    }

    #[test]
    fn configuration_errors_and_empty_epochs() {
        let f = fixture();
        let tiers = f.tiers(0, 10);
        let new = |cfg: LoaderConfig| {
            NodeLoader::new(
                f.topo.clone(),
                f.sampler.clone(),
                tiers.clone(),
                f.train.clone(),
                0,
                cfg,
            )
        };
        for (cfg, option) in [
            (
                LoaderConfig {
                    batch_size: 0,
                    ..cfg()
                },
                "batch_size",
            ),
            (
                LoaderConfig {
                    sampler_threads: 0,
                    ..cfg()
                },
                "sampler_threads",
            ),
            (
                LoaderConfig {
                    io_threads: 0,
                    ..cfg()
                },
                "io_threads",
            ),
        ] {
            let e = new(cfg).err().expect("rejected").to_string();
            assert!(e.contains(option), "{e}");
        }

        // Features with fewer rows than the graph has nodes.
        let small = write_features(f._dir.path(), 100, DIM);
        let reader = FeatureReader::with_engine(&small, engine(), ReadOptions::default()).unwrap();
        let small = Arc::new(FeatureTiers::build(reader, &[], 10, Eviction::Clock).unwrap());
        let e = NodeLoader::new(
            f.topo.clone(),
            f.sampler.clone(),
            small,
            f.train.clone(),
            0,
            cfg(),
        )
        .err()
        .expect("rejected")
        .to_string();
        assert!(e.contains("100 feature rows"), "{e}");

        for pipeline in [true, false] {
            let mut loader = f.loader(&tiers, Vec::new(), 0, LoaderConfig { pipeline, ..cfg() });
            assert_eq!(loader.num_batches(), 0);
            assert!(loader.next().is_none());
            assert_eq!(loader.stats().batches, 0);
        }

        let d = LoaderConfig::default();
        assert!(d.shuffle && d.accumulator && d.pipeline && !d.drop_last);
        assert_eq!((d.window, d.in_flight_target, d.batch_size), (8, 0, 1024));
        let parsed: LoaderConfig = serde_json::from_str(r#"{"window": 2}"#).unwrap();
        assert_eq!(parsed.window, 2);
        assert!(serde_json::from_str::<LoaderConfig>(r#"{"windw": 2}"#).is_err());
    }

    #[test]
    fn loader_is_send() {
        fn check<T: Send>() {}
        check::<NodeLoader>();
        check::<Batch>();
    }
}
