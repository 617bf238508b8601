//! The epoch loop: executes an ordering's schedule on the partition buffer, training each
//! bucket's edges on the worker threads while partition swaps and bucket reads run in the
//! background.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Receiver;
use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_io::Engine;
use strata_store::rng::derive;

use crate::compute::backend::{Compute, Landing, PieceChunk, SlotKind};
use crate::config::{NegativePool, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::model::ScoreModel;
use crate::ordering::{Bucket, Schedule, Step};
use crate::storage::bank::Banks;
use crate::storage::buffer::PartitionBuffer;
use crate::storage::edge_cache::EdgeCache;
use crate::storage::entity_types::TypedTraining;
use crate::storage::epoch_io::{
    prefetch_edges, Behind, BucketEdges, Groups, KeptEdges, Swap, Swapper,
};
use crate::storage::partitioning::Buckets;
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;
use crate::storage::write_behind::WriteBehind;
use crate::train::arrange::{arrange, ArrangedAhead};
use crate::train::typed_negatives::{NegSpace, SpaceInputs};
use crate::train::worker::{BucketCtx, PartRows, Pool};

/// What one epoch did.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochReport {
    pub epoch: usize,
    /// Mean loss per trained edge-direction.
    pub loss: f64,
    pub seconds: f64,
    /// Train edges per second (each trained in both directions when both are corrupted).
    pub edges_per_second: f64,
    /// Seconds the trainer waited for partition swaps and bucket edges.
    pub io_wait_seconds: f64,
    pub io_wait_fraction: f64,
    pub partition_loads: usize,
    /// Loads whose partition the swap spare had read ahead, so the swap handed it over at
    /// once and wrote its victim behind.
    #[serde(default)]
    pub loads_read_ahead: usize,
    pub partition_bytes_read: u64,
    pub partition_bytes_written: u64,
    pub edge_bytes_read: u64,
    pub buffer_states: usize,
    pub swaps: usize,
    /// Floating-point operations per second of one worker thread in the training step, and
    /// of all threads over the epoch's compute time.
    pub step_flops_per_thread: f64,
    pub step_flops_total: f64,
    /// A device run's own counters (absent for the CPU kernels).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceReport>,
    /// The table's write, when the job wrote it behind the epoch (absent: the epoch wrote it
    /// back before it ended, inside `seconds` and `io_wait_seconds`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_behind: Option<WrittenBehind>,
}

/// The write of an epoch's table behind the job ([`crate::storage::write_behind`]).
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct WrittenBehind {
    /// Seconds the write and its sync took, beside the relations' save and validation.
    pub seconds: f64,
    /// Seconds the commit then waited for it (0 when validation took longer).
    pub wait_seconds: f64,
}

/// What the device did in an epoch (`device` other than `cpu`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeviceReport {
    /// Seconds the device computed (CUDA events on a GPU; the step's wall seconds on the CPU
    /// twin), and their share of the epoch.
    pub busy_seconds: f64,
    pub busy_share: f64,
    /// Bytes copied host -> device (slots filled, edge pieces, relations) and device -> host
    /// (slots written back or evicted, relations at checkpoints).
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    /// Seconds the compute waited for a copy (a slot written back before its swap).
    pub copy_wait_seconds: f64,
    /// Partition bytes read from the table into slots over the seconds of that I/O (the I/O
    /// engine's fills and swaps) plus the slot copies into the device.
    pub ssd_to_device_bytes_per_second: f64,
}

/// One interval of the epoch's timeline (seconds from the epoch's start), for the plots.
#[derive(Debug, Clone, Serialize)]
pub struct Interval {
    /// `compute` (training a bucket piece), `io` (a swap, fill or write-back on the I/O
    /// threads) or `wait` (the trainer blocked on I/O).
    pub lane: &'static str,
    /// Buffer state index.
    pub step: usize,
    pub start: f64,
    pub end: f64,
    pub label: String,
}

pub(crate) struct Timeline {
    pub(crate) origin: Instant,
    pub(crate) events: Vec<Interval>,
}

impl Timeline {
    pub(crate) fn add(
        &mut self,
        lane: &'static str,
        step: usize,
        from: Instant,
        to: Instant,
        label: impl Into<String>,
    ) {
        self.events.push(Interval {
            lane,
            step,
            start: from.saturating_duration_since(self.origin).as_secs_f64(),
            end: to.saturating_duration_since(self.origin).as_secs_f64(),
            label: label.into(),
        });
    }
}

/// Running totals of one epoch.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) io_wait: f64,
    pub(crate) edge_bytes: u64,
    pub(crate) trained: u64,
    pub(crate) loads: usize,
    /// Seconds the I/O engine spent on fills and swaps (writes behind and reads ahead
    /// included).
    pub(crate) slot_io: f64,
    /// Loads whose partition was read ahead into the swap spare.
    pub(crate) read_ahead: usize,
}

/// One epoch's pass on this process: its epoch, timeline, running totals and progress bar.
pub(crate) struct Pass<'p> {
    pub(crate) epoch: usize,
    pub(crate) tl: Timeline,
    pub(crate) tally: Tally,
    pub(crate) meter: Meter<'p>,
    /// The bucket whose edges to keep for the next epoch, if they come as one piece (the
    /// epoch's only bucket), and the copy once kept.
    keep: Option<(u32, u32)>,
    kept: Option<KeptEdges>,
}

impl<'p> Pass<'p> {
    /// A pass of `epoch` starting now, its bar `label` counting up to `rows` edges (0: unknown).
    pub(crate) fn start(epoch: usize, progress: &'p dyn Progress, label: &str, rows: u64) -> Self {
        let origin = Instant::now();
        Pass {
            epoch,
            tl: Timeline {
                origin,
                events: Vec::new(),
            },
            tally: Tally::default(),
            meter: Meter::new(progress, label, 0, rows),
            keep: None,
            kept: None,
        }
    }

    /// Adds the swap thread's I/O `behind` the swaps of state `step` (the victims' writes
    /// behind them, the next partitions' reads ahead) to the timeline and the slot I/O.
    fn add_behind(&mut self, step: usize, behind: &[Behind]) {
        for &(started, finished) in behind {
            self.tl
                .add("io", step, started, finished, "write behind, read ahead");
            self.tally.slot_io += (finished - started).as_secs_f64();
        }
    }
}

/// The tables a single-process epoch swaps partitions between, which partitions it wrote
/// back to `next` so far (a later load reads those from there), and the step of each
/// partition's last eviction (with partitions kept in memory, the only one written back).
struct SwapTables<'a> {
    current: &'a Arc<TableFile>,
    next: &'a Arc<TableFile>,
    written: Vec<bool>,
    last_eviction: Vec<Option<usize>>,
}

impl SwapTables<'_> {
    /// The table partition `p` is read from: `next` once the epoch wrote it there.
    fn source(&self, p: u32) -> Arc<TableFile> {
        if self.written[p as usize] {
            self.next.clone()
        } else {
            self.current.clone()
        }
    }
}

/// The partition the first swap at or after state `from` of `sched` loads.
fn next_load(sched: &Schedule, from: usize) -> Option<u32> {
    sched.steps.get(from..)?.iter().find_map(|s| s.loaded)
}

/// Model state in memory: relation rows, the partition buffer and the compute backend.
pub struct Trainer {
    pub cfg: TrainConfig,
    pub model: ScoreModel,
    pub buckets: Arc<Buckets>,
    pub buffer: PartitionBuffer,
    pub relations: Relations,
    /// The backend every piece is trained through ([`crate::compute::backend`]).
    pub(crate) compute: Box<dyn Compute>,
    /// Edges per piece read from a bucket (bounds edge memory).
    pub(crate) piece_rows: u64,
    /// Buffer slots kept for a distributed rank's lookahead (`dist_prefetch`), beyond those
    /// the scheduler plans with; 0 outside distributed runs.
    pub(crate) prefetch_slots: usize,
    /// Rows of the partitions on disk, for the `all` negative pool (`None` when every
    /// partition is resident or another pool is used).
    pub(crate) banks: Option<Banks>,
    /// A typed run's entity types (None: one table of all nodes).
    pub typed: Option<TypedTraining>,
    /// `corrupt = bernoulli`: the probability of corrupting the head, by relation id (empty
    /// otherwise; see [`crate::train::bernoulli`]).
    pub head_prob: Vec<f32>,
    /// 1vsAll or KvsAll training (None: negative sampling).
    pub vs_all: Option<crate::train::all_entities::VsAllTraining>,
    /// The last epoch's edges, when it had one bucket read as one piece, and the next
    /// epoch's arrangement of them, made ahead.
    kept_edges: Option<Arc<KeptEdges>>,
    ahead: Option<ArrangedAhead>,
    /// Whether this epoch leaves its table to be written behind the job (the plan's
    /// write-behind copy, which only a resident table has), the copy's buffers between
    /// epochs, and the last epoch's copy waiting for its write
    /// ([`crate::storage::write_behind`]).
    pub(crate) writes_behind: bool,
    spare_copy: Vec<strata_io::AlignedBuf>,
    write_behind: Option<WriteBehind>,
    /// The plan's swap spare (one or two slot-sized buffers the next swap's partition is read
    /// ahead into), lent to each epoch's swap thread; empty: none.
    pub(crate) swap_spare: Vec<strata_io::AlignedBuf>,
    /// The training edges kept in memory after their first read, when the plan holds them
    /// (`None`: every epoch reads its edges from the SSD).
    pub(crate) edge_cache: Option<Arc<EdgeCache>>,
}

impl Drop for Trainer {
    fn drop(&mut self) {
        // Before the fields drop: the buffer's slots are freed after the backend let go.
        self.compute.release_host();
    }
}

impl Trainer {
    /// Trains through `compute`; `bank_rows` rows per partition of negative banks (0: none,
    /// the `all` pool then falls back to the resident partitions).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: TrainConfig,
        model: ScoreModel,
        buckets: Arc<Buckets>,
        buffer: PartitionBuffer,
        relations: Relations,
        compute: Box<dyn Compute>,
        piece_rows: u64,
        bank_rows: usize,
    ) -> Self {
        let partitions = buckets.partitioning.partitions;
        let segments = buckets
            .partitioning
            .types
            .as_ref()
            .map_or(1, |t| t.iter().filter(|t| t.partitioned).count());
        let banks = (cfg.negative_pool == NegativePool::All
            && bank_rows > 0
            && partitions as usize > buffer.capacity())
        .then(|| Banks::new(partitions, bank_rows, model.dim, segments));
        Trainer {
            banks,
            compute,
            cfg,
            model,
            buckets,
            buffer,
            relations,
            piece_rows,
            prefetch_slots: 0,
            typed: None,
            head_prob: Vec::new(),
            vs_all: None,
            kept_edges: None,
            ahead: None,
            writes_behind: false,
            spare_copy: Vec::new(),
            write_behind: None,
            swap_spare: Vec::new(),
            edge_cache: None,
        }
    }

    /// Whether training scales each edge's loss by its weight: the store has weights and the
    /// run does not ignore them.
    pub fn weighted(&self) -> bool {
        self.cfg.edge_weights && self.buckets.weights.is_some()
    }

    /// Worker threads of the compute backend.
    pub fn threads(&self) -> usize {
        self.compute.threads()
    }

    /// One epoch on schedule `sched` (the single-machine scheduler's for `epoch`): partitions
    /// are read from `current` (or from `next` once written back this epoch) and every
    /// partition ends up written to `next`, or, written behind, in the copy
    /// [`take_write_behind`](Self::take_write_behind) hands the job to write there. Returns the
    /// report and timeline.
    pub(crate) fn epoch(
        &mut self,
        epoch: usize,
        sched: &Schedule,
        current: &Arc<TableFile>,
        next: &Arc<TableFile>,
        progress: &dyn Progress,
    ) -> Result<(EpochReport, Vec<Interval>)> {
        let engine = self.buffer.engine().clone();
        let io_before = engine.stats();
        let order: Vec<(u32, u32)> = sched.buckets().collect();
        let single = <[_; 1]>::try_from(order.as_slice()).ok().map(|[b]| b);
        // A one-bucket epoch trains the last epoch's copy of its edges when it kept one,
        // arranged while the last epoch ended.
        let kept = self.kept_edges.take().filter(|k| Some(k.bucket) == single);
        let ahead = self.ahead.take().and_then(|a| a.take(epoch, single));
        let (edges_rx, edges_thread) = match ahead {
            Some(rx) => (rx, None),
            None => {
                let (rx, thread) = self.read_edges(&engine, order);
                (rx, Some(thread))
            }
        };
        let swapper = Swapper::start(
            engine.clone(),
            self.buffer.layout,
            std::mem::take(&mut self.swap_spare),
            self.buffer.kept().cloned(),
        );
        let label = format!("epoch {}/{}", epoch + 1, self.cfg.epochs);
        let mut pass = Pass::start(epoch, progress, &label, self.buckets.num_edges);
        if kept.is_none() {
            pass.keep = single;
        }
        self.compute.reset_counters();
        self.fill(&sched.steps[0].state, current, &mut pass)?;
        self.lend_slots()?;
        let mut tables = SwapTables {
            current,
            next,
            written: vec![false; self.buckets.partitioning.partitions as usize],
            last_eviction: sched.last_evictions(),
        };
        // The first swap's partition is read while the first state trains.
        if let Some(p) = next_load(sched, 0) {
            swapper.read_ahead(p, tables.source(p));
        }
        for (i, step) in sched.steps.iter().enumerate() {
            let ahead = next_load(sched, i + 1);
            self.step(i, step, ahead, &swapper, &edges_rx, &mut tables, &mut pass)?;
            let io = engine.stats().since(&io_before);
            let secs = pass.tl.origin.elapsed().as_secs_f64().max(1e-9);
            progress.detail(&format!(
                "state {}/{}  loads {}  read {:.0} MB/s  write {:.0} MB/s",
                i + 1,
                sched.states(),
                pass.tally.loads,
                io.read_bytes as f64 / secs / 1e6,
                io.write_bytes as f64 / secs / 1e6
            ));
        }
        let (spares, behind) = swapper.finish()?;
        self.swap_spare = spares;
        pass.add_behind(sched.states() - 1, &behind);
        let kept = kept.or_else(|| pass.kept.take().map(Arc::new));
        self.arrange_next(epoch, kept.as_ref());
        let t = Instant::now();
        let last = sched.states() - 1;
        self.reclaim_slots()?;
        let label = if self.writes_behind {
            // The plan holds a copy only of a resident table: no swaps, no banks.
            debug_assert!(sched.swaps() == 0 && self.banks.is_none());
            let (engine, layout) = (engine.clone(), self.buffer.layout);
            let spare = std::mem::take(&mut self.spare_copy);
            let slots = self.buffer.trained_slots();
            let copy = WriteBehind::copy(slots, spare, engine, layout, pass.tl.origin, last);
            self.write_behind = Some(copy);
            "write-behind copy"
        } else {
            self.buffer.flush(next)?;
            pass.tally.loads += self.flush_bank_gradient(next)?;
            next.sync()?;
            "write-back"
        };
        let now = Instant::now();
        pass.tally.io_wait += (now - t).as_secs_f64();
        pass.tl.add("io", last, t, now, label);
        pass.tl.add("wait", last, t, now, label);
        drop(edges_rx);
        if let Some(thread) = edges_thread {
            let _ = thread.join();
        }
        self.kept_edges = kept;
        let io = engine.stats().since(&io_before);
        let report = self.report(&pass, &io, sched.states(), sched.swaps())?;
        pass.meter.finish()?;
        Ok((report, pass.tl.events))
    }

    /// The last epoch's table copy for the job to write behind it (None: the epoch wrote its
    /// table back itself).
    pub(crate) fn take_write_behind(&mut self) -> Option<WriteBehind> {
        self.write_behind.take()
    }

    /// Starts arranging the `kept` piece for the epoch after `epoch`, if the run has one, while
    /// this epoch ends.
    fn arrange_next(&mut self, epoch: usize, kept: Option<&Arc<KeptEdges>>) {
        let Some(kept) = kept else { return };
        if epoch + 1 >= self.cfg.epochs {
            return;
        }
        let key = self.piece_key(epoch + 1, kept.bucket, 0);
        let rel_types = self.typed.as_ref().map(|t| t.rel_types.clone());
        self.ahead = Some(ArrangedAhead::start(
            kept.clone(),
            epoch + 1,
            key,
            rel_types,
        ));
    }

    /// The key piece `piece` of `bucket` trains under in `epoch`.
    fn piece_key(&self, epoch: usize, bucket: Bucket, piece: u64) -> u64 {
        let n = self.buckets.partitioning.partitions;
        let bucket_key = derive(
            derive(self.cfg.seed, epoch as u64),
            (bucket.0 * n + bucket.1) as u64,
        );
        derive(bucket_key, piece)
    }

    /// Keeps a written copy's `buffers` for the next epoch's copy.
    pub(crate) fn keep_copy_buffers(&mut self, buffers: Vec<strata_io::AlignedBuf>) {
        self.spare_copy = buffers;
    }

    /// Fills the buffer with the schedule's first state `first` (and the pinned region) from
    /// `current`, and the negative banks.
    fn fill(&mut self, first: &[u32], current: &TableFile, pass: &mut Pass) -> Result<()> {
        pass.tally.loads += first
            .iter()
            .chain(self.buckets.partitioning.pinned().as_ref())
            .filter(|&&p| self.buffer.slot_of(p).is_none())
            .count();
        let t = Instant::now();
        let read = self.buffer.fill(first, current)?;
        pass.tally.io_wait += read;
        pass.tally.slot_io += read;
        self.fill_banks(pass.epoch, current)?;
        pass.tl.add("io", 0, t, Instant::now(), "fill");
        pass.tl.add("wait", 0, t, Instant::now(), "fill");
        Ok(())
    }

    /// Buffer state `i` of the schedule: starts its swap (and the read ahead of `ahead`, the
    /// partition the next swap loads), trains the buckets that overlap it, waits for the swap,
    /// then trains the buckets that needed the loaded partition.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        i: usize,
        step: &Step,
        ahead: Option<u32>,
        swapper: &Swapper,
        rx: &Receiver<BucketEdges>,
        tables: &mut SwapTables,
        pass: &mut Pass,
    ) -> Result<()> {
        let mut pending = None;
        let mut leaving = None;
        if let (Some(e), Some(l)) = (step.evicted, step.loaded) {
            let mut landing = self.slot_evicting(e)?;
            if let Some(banks) = &mut self.banks {
                // The partition leaves as it is now: its bank stays exact while on disk. Its
                // rows must have landed first (a device holds them until then), so with banks
                // the victim's copy out does not overlap the retained partitions' compute.
                landing()?;
                landing = Box::new(|| Ok(()));
                banks.copy_from(e, self.buffer.embeddings(e));
            }
            let (slot, buf) = self.buffer.take(e);
            let from = tables.source(l);
            // Kept in memory, a partition the epoch loads again stays there (its buffer the
            // newest copy); its last eviction writes it to the table the epoch commits.
            let write_back =
                self.buffer.kept().is_none() || tables.last_eviction[e as usize] == Some(i);
            tables.written[e as usize] |= write_back;
            let swap = Swap {
                slot,
                buf,
                evict: Some((e, tables.next.clone())),
                load: (l, from),
                write_back,
            };
            // Read after this swap's write: the next partition may be the one it evicts.
            let ahead = ahead.map(|p| (p, tables.source(p)));
            leaving = Some((landing, swap, ahead));
            pending = Some((e, l));
            pass.tally.loads += 1;
        }
        // Legend's order: the victim's rows land in its slot (a device copies them out beside
        // the overlap buckets' compute) and its swap starts, on a thread of its own, while the
        // retained partitions train.
        std::thread::scope(|scope| -> Result<()> {
            let lander = leaving.map(|(landing, swap, ahead)| {
                scope.spawn(move || -> Result<()> {
                    landing()?;
                    swapper.start_swap(swap);
                    if let Some((p, from)) = ahead {
                        swapper.read_ahead(p, from);
                    }
                    Ok(())
                })
            });
            let trained = step
                .overlap
                .iter()
                .try_for_each(|&bucket| self.run_bucket(rx, bucket, i, pass));
            let landed = lander.map_or(Ok(()), |h| h.join().expect("the landing thread"));
            // A landing that failed started no swap: stop before waiting for one.
            landed.and(trained)
        })?;
        if let Some((e, l)) = pending {
            let t = Instant::now();
            let done = swapper.wait();
            let now = Instant::now();
            pass.tally.io_wait += (now - t).as_secs_f64();
            pass.tl.add("wait", i, t, now, format!("swap {e}->{l}"));
            let label = format!("swap {e}->{l}");
            pass.tl.add("io", i, done.started, done.finished, label);
            pass.tally.slot_io += (done.finished - done.started).as_secs_f64();
            pass.add_behind(i, &done.behind);
            pass.tally.read_ahead += usize::from(done.read_ahead);
            done.result?;
            self.buffer.put(done.slot, done.buf, l);
            // Before the backend takes the rows (a device copies them).
            self.apply_bank_gradient(l);
            self.slot_filled(l)?;
        }
        for &bucket in &step.after_load {
            self.run_bucket(rx, bucket, i, pass)?;
        }
        Ok(())
    }

    /// Hands the compute backend the epoch's slots as they are after the fill (it forgets
    /// what it held: an evaluation may have read other partitions into them since), and the
    /// relations (a device keeps its copy from the last epoch).
    fn lend_slots(&mut self) -> Result<()> {
        self.compute.forget_partitions();
        let compute = &mut self.compute;
        let pinned = self.buffer.layout.pinned.map(|r| r.region);
        for (p, rows) in self.buffer.rows_mut() {
            compute.slot_filled(slot_kind(pinned, p), rows)?;
        }
        if let Some(rels) = self.relations.shared() {
            compute.slot_filled(SlotKind::Relations, rels)?;
        }
        Ok(())
    }

    /// Partition `p` was just read into its slot: the backend takes it (the single-process
    /// epoch's swaps and the distributed epoch's loads).
    pub(super) fn slot_filled(&mut self, p: u32) -> Result<()> {
        let kind = slot_kind(self.buffer.layout.pinned.map(|r| r.region), p);
        let rows = resident_rows(&mut self.buffer, p);
        self.compute.slot_filled(kind, rows)
    }

    /// Partition `p` is evicted (written back, its slot reused): the backend starts putting
    /// its rows into the slot; the returned landing finishes that.
    fn slot_evicting(&mut self, p: u32) -> Result<Landing> {
        let rows = resident_rows(&mut self.buffer, p);
        self.compute.slot_evicting(rows)
    }

    /// Partition `p` is about to be written back (`evict`: and its slot reused): the backend
    /// puts its rows into the slot first.
    pub(super) fn slot_leaving(&mut self, p: u32, evict: bool) -> Result<()> {
        let rows = resident_rows(&mut self.buffer, p);
        self.compute.slot_leaving(rows, evict)
    }

    /// Before the epoch's write-back: every resident slot and the relations get the
    /// backend's rows (which it keeps: the slots stay resident into the next epoch).
    fn reclaim_slots(&mut self) -> Result<()> {
        let compute = &mut self.compute;
        for (_, rows) in self.buffer.rows_mut() {
            compute.slot_leaving(rows, false)?;
        }
        if let Some(rels) = self.relations.shared() {
            compute.slot_leaving(rels, false)?;
        }
        Ok(())
    }

    /// The report of `pass` from its running totals, the I/O engine's counters over the epoch
    /// (`io`) and the buffer states and swaps it went through; an error when its loss is not
    /// finite (the epoch is not committed, and a rank stops before it joins the group's).
    pub(crate) fn report(
        &mut self,
        pass: &Pass,
        io: &strata_io::StatsSnapshot,
        states: usize,
        swaps: usize,
    ) -> Result<EpochReport> {
        let (epoch, tally) = (pass.epoch, &pass.tally);
        let seconds = pass.tl.origin.elapsed().as_secs_f64();
        // The device's counters first: they bring in the loss of its last pieces.
        let device = self.compute.device_counters();
        let c = self.compute.counters();
        let (flops, busy) = (c.flops, c.busy);
        let partition_bytes_read = io.read_bytes.saturating_sub(tally.edge_bytes);
        let device = device.map(|d| DeviceReport {
            busy_seconds: d.busy,
            busy_share: d.busy / seconds.max(1e-9),
            h2d_bytes: d.h2d_bytes,
            d2h_bytes: d.d2h_bytes,
            copy_wait_seconds: d.copy_wait,
            ssd_to_device_bytes_per_second: partition_bytes_read as f64
                / (tally.slot_io + d.slot_in_seconds).max(1e-9),
        });
        let loss = c.loss / c.directions.max(1) as f64;
        if !loss.is_finite() {
            return Err(diverged(epoch, loss, &self.cfg));
        }
        Ok(EpochReport {
            epoch: epoch + 1,
            loss,
            seconds,
            edges_per_second: tally.trained as f64 / seconds,
            io_wait_seconds: tally.io_wait,
            io_wait_fraction: tally.io_wait / seconds,
            partition_loads: tally.loads,
            loads_read_ahead: tally.read_ahead,
            partition_bytes_read,
            partition_bytes_written: io.write_bytes,
            edge_bytes_read: tally.edge_bytes,
            buffer_states: states,
            swaps,
            step_flops_per_thread: flops / busy.max(1e-9),
            step_flops_total: flops / (seconds - tally.io_wait).max(1e-9),
            device,
            written_behind: None,
        })
    }

    /// The edges of `order`'s buckets read ahead in pieces ([`prefetch_edges`], two pieces
    /// ahead), checked against this run's partitions and relations, with their weights when
    /// training is weighted; from the edge cache when an earlier epoch kept them there.
    pub(crate) fn read_edges(
        &self,
        engine: &Arc<Engine>,
        order: impl IntoIterator<Item = (u32, u32)> + Send + 'static,
    ) -> (Receiver<BucketEdges>, JoinHandle<()>) {
        prefetch_edges(
            engine.clone(),
            self.buckets.clone(),
            order,
            self.piece_rows,
            2,
            self.relation_ids(),
            self.weighted(),
            self.edge_cache.clone(),
        )
    }

    /// Relation ids the bucketed edges may hold: the forward relation rows the model indexes
    /// (inverse rows follow them when reciprocal), any for a model without relation rows.
    pub(crate) fn relation_ids(&self) -> u64 {
        match (self.relations.rows(), self.relations.inverse_offset) {
            (0, _) => u64::MAX,
            (rows, 0) => rows as u64,
            (_, base) => base as u64,
        }
    }

    /// Trains every piece of `bucket` as the prefetcher delivers them (at buffer state or
    /// bucket number `step`, for the timeline).
    pub(crate) fn run_bucket(
        &mut self,
        rx: &Receiver<BucketEdges>,
        bucket: Bucket,
        step: usize,
        pass: &mut Pass,
    ) -> Result<()> {
        for piece in 0u64.. {
            let t = Instant::now();
            let got = rx
                .recv()
                .map_err(|_| EmbedError::Corrupt("the edge prefetcher stopped".into()))?;
            let now = Instant::now();
            pass.tally.io_wait += (now - t).as_secs_f64();
            if now - t > std::time::Duration::from_micros(200) {
                pass.tl
                    .add("wait", step, t, now, format!("edges {bucket:?}"));
            }
            debug_assert_eq!(got.bucket, bucket);
            let (mut edges, mut weights) = got.edges?;
            let groups = got.groups;
            if piece == 0 && got.last && pass.keep == Some(bucket) {
                // Kept before training shuffles the piece.
                pass.kept = Some(KeptEdges {
                    bucket,
                    edges: edges.clone(),
                    weights: weights.clone(),
                });
            }
            pass.tally.edge_bytes += got.bytes;
            let start = Instant::now();
            let key = self.piece_key(pass.epoch, bucket, piece);
            self.train_piece(bucket, &mut edges, &mut weights, key, groups);
            if let Some(e) = self.compute.failure() {
                return Err(EmbedError::Config(e));
            }
            let label = format!("bucket ({}, {})", bucket.0, bucket.1);
            pass.tl.add("compute", step, start, Instant::now(), label);
            pass.tally.trained += edges.len() as u64;
            // Edge bytes are in the I/O figures of the detail line; the bar counts edges.
            pass.meter.add(edges.len() as u64, 0)?;
            if got.last {
                break;
            }
        }
        Ok(())
    }

    /// Chooses this epoch's bank blocks and fills them from the resident partitions, the
    /// partitions kept in memory and, for the others, from `current`.
    fn fill_banks(&mut self, epoch: usize, current: &TableFile) -> Result<()> {
        let Some(banks) = &mut self.banks else {
            return Ok(());
        };
        let partitioning = &self.buckets.partitioning;
        banks.choose_blocks(partitioning, self.cfg.seed, epoch);
        for p in 0..partitioning.partitions {
            if self.buffer.slot_of(p).is_some() {
                banks.copy_from(p, self.buffer.embeddings(p));
            } else if (self.buffer)
                .with_kept_embeddings(p, |rows| banks.copy_from(p, rows))
                .is_none()
            {
                banks.read(p, current, self.buffer.engine(), &self.buffer.layout)?;
            }
        }
        for p in 0..partitioning.partitions {
            if self.buffer.slot_of(p).is_some() {
                self.apply_bank_gradient(p);
            }
        }
        Ok(())
    }

    /// Applies the gradient partition `p` (just made resident) received as a bank negative.
    pub(crate) fn apply_bank_gradient(&mut self, p: u32) {
        let Some(banks) = &self.banks else { return };
        if !banks.has_pending(p) {
            return;
        }
        let resident = self.buffer.rows_mut();
        let (_, rows) = resident
            .iter()
            .find(|(q, _)| *q == p)
            .expect("partition resident");
        banks.apply_pending(p, rows, self.cfg.lr);
    }

    /// At the end of an epoch, brings every partition on disk with pending bank gradient in
    /// from `next`, applies it and writes it back, so that the checkpoint is complete. Returns
    /// the partitions read.
    fn flush_bank_gradient(&mut self, next: &TableFile) -> Result<usize> {
        let pending: Vec<u32> = match &self.banks {
            Some(banks) => (0..self.buckets.partitioning.partitions)
                .filter(|&p| banks.has_pending(p))
                .collect(),
            None => return Ok(0),
        };
        let mut loads = 0;
        for (k, &p) in pending.iter().enumerate() {
            if self.buffer.slot_of(p).is_none() {
                self.buffer.load(k % self.buffer.capacity(), p, next)?;
                loads += 1;
            }
            self.apply_bank_gradient(p);
            self.buffer.write(p, next)?;
        }
        Ok(loads)
    }

    /// Trains one piece of bucket `(a, b)`'s edges (with their `weights`, one per edge or
    /// none) through the compute backend, arranged for `key` ([`arrange`]: shuffled, or in a
    /// typed run grouped by entity types) unless it comes arranged (`groups`).
    fn train_piece(
        &mut self,
        bucket: Bucket,
        edges: &mut [[i32; 3]],
        weights: &mut [f32],
        key: u64,
        groups: Option<Groups>,
    ) {
        if edges.is_empty() {
            return;
        }
        let groups = groups.unwrap_or_else(|| {
            let rel_types = self.typed.as_ref().map(|t| t.rel_types.as_slice());
            arrange(edges, weights, key, rel_types)
        });
        let resident = self.buffer.rows_mut();
        let slots = Slots {
            cfg: &self.cfg,
            model: self.model,
            partitioning: &self.buckets.partitioning,
            typed: self.typed.as_ref(),
            banks: self.banks.as_ref(),
            head_prob: &self.head_prob,
            inverse_offset: self.relations.inverse_offset,
            rels: self.relations.shared(),
            resident: &resident,
            vs_all: self.vs_all.as_ref().map(|v| v.view()),
        };
        let ctxs = slots.contexts(bucket, &groups);
        let chunks = chunks(&groups, edges, weights, self.cfg.chunk_size.max(1));
        self.compute.train_piece(&ctxs, &chunks, key);
    }
}

/// The piece's chunks of at most `size` edges, group by group.
fn chunks<'a>(
    groups: &Groups,
    edges: &'a [[i32; 3]],
    weights: &'a [f32],
    size: usize,
) -> Vec<PieceChunk<'a>> {
    groups
        .iter()
        .enumerate()
        .flat_map(|(g, (range, _))| {
            range.clone().step_by(size).map(move |lo| {
                let hi = (lo + size).min(range.end);
                let w = if weights.is_empty() {
                    &[][..]
                } else {
                    &weights[lo..hi]
                };
                (g, &edges[lo..hi], w)
            })
        })
        .collect()
}

/// What a piece's [`BucketCtx`]s are made of: the trainer's settings and the resident
/// partitions' rows (borrowed from the buffer for the piece).
struct Slots<'a> {
    cfg: &'a TrainConfig,
    model: ScoreModel,
    partitioning: &'a crate::storage::partitioning::Partitioning,
    typed: Option<&'a TypedTraining>,
    banks: Option<&'a Banks>,
    head_prob: &'a [f32],
    inverse_offset: u32,
    rels: Option<crate::storage::shared::SharedRows<'a>>,
    resident: &'a [(u32, crate::storage::shared::SharedRows<'a>)],
    vs_all: Option<crate::train::vs_all::VsAll<'a>>,
}

impl<'a> Slots<'a> {
    /// Index into the resident partitions of partition `p`.
    fn index_of(&self, p: u32) -> usize {
        self.resident
            .iter()
            .position(|(q, _)| *q == p)
            .expect("bucket partitions are resident")
    }

    /// The rows and node count of each resident partition.
    fn parts(&self) -> Vec<PartRows<'a>> {
        let layout = self.typed.map(|t| &t.layout);
        self.resident
            .iter()
            .map(|&(p, rows)| PartRows {
                rows,
                size: layout.map_or_else(|| self.partitioning.size_of(p), |l| l.entities_in(p))
                    as u32,
            })
            .collect()
    }

    /// Index into the resident partitions of each partition (None: on disk), when the `all`
    /// pool draws the others' negatives from banks.
    fn banked(&self) -> Option<Arc<Vec<Option<usize>>>> {
        if self.banks.is_none() || self.cfg.negative_pool != NegativePool::All {
            return None;
        }
        let mut part_of = vec![None; self.partitioning.partitions as usize];
        for (i, (p, _)) in self.resident.iter().enumerate() {
            if let Some(slot) = part_of.get_mut(*p as usize) {
                *slot = Some(i);
            }
        }
        Some(Arc::new(part_of))
    }

    /// Where a chunk's uniform negatives come from.
    fn pool(&self, banked: &Option<Arc<Vec<Option<usize>>>>) -> Pool<'a> {
        match (self.banks, banked, self.cfg.negative_pool) {
            (_, _, NegativePool::Partition) => Pool::Partition,
            (Some(banks), Some(part_of), NegativePool::All) => Pool::All {
                banks,
                part_of: part_of.to_vec(),
                part_size: self.partitioning.part_size,
                num_nodes: self.partitioning.num_nodes,
            },
            // Everything resident (or no room for banks): the resident partitions are all.
            _ => Pool::Resident,
        }
    }

    /// One context per group of the piece of bucket `(a, b)`.
    fn contexts(&self, (a, b): Bucket, groups: &Groups) -> Vec<BucketCtx<'a>> {
        let parts = self.parts();
        let regions: Vec<u32> = self.resident.iter().map(|(p, _)| *p).collect();
        let banked = self.banked();
        groups
            .iter()
            .map(|(_, types)| {
                let (mut src_part, mut dst_part) = (self.index_of(a), self.index_of(b));
                let mut negs = None;
                if let (Some(typed), Some((ts, td))) = (self.typed, *types) {
                    let l = &typed.layout;
                    if !l.types[ts].partitioned {
                        src_part = self.index_of(l.partitions);
                    }
                    if !l.types[td].partitioned {
                        dst_part = self.index_of(l.partitions);
                    }
                    let inputs = SpaceInputs {
                        layout: l,
                        pool: self.cfg.negative_pool,
                        regions: &regions,
                        banked: banked.clone(),
                    };
                    negs = Some([
                        NegSpace::new(&inputs, &typed.negative_types(td), dst_part),
                        NegSpace::new(&inputs, &typed.negative_types(ts), src_part),
                    ]);
                }
                self.context(parts.clone(), src_part, dst_part, self.pool(&banked), negs)
            })
            .collect()
    }

    /// A context of the piece with its parts, bucket sides, negative pool and typed spaces.
    fn context(
        &self,
        parts: Vec<PartRows<'a>>,
        src_part: usize,
        dst_part: usize,
        pool: Pool<'a>,
        negs: Option<[NegSpace; 2]>,
    ) -> BucketCtx<'a> {
        let cfg = self.cfg;
        BucketCtx {
            model: self.model,
            loss: cfg.loss_fn(),
            lr: cfg.lr,
            parts,
            src_part,
            dst_part,
            rels: self.rels,
            inverse_offset: self.inverse_offset,
            corrupt: cfg.corrupt,
            head_prob: self.head_prob,
            negatives: cfg.negatives,
            negatives_head: cfg.negatives_of(false),
            shared_negatives: cfg.shared_negatives,
            degree_fraction: cfg.degree_fraction,
            pool,
            reg: cfg.regularizer(),
            dropout: cfg.dropout(),
            negs,
            feat: self.typed.and_then(|t| {
                let bags = t.bags.as_deref()?;
                Some((self.index_of(t.layout.partitions), bags))
            }),
            vs_all: self.vs_all,
        }
    }
}

/// How the backend holds region `p` of a table whose pinned region is `pinned`.
fn slot_kind(pinned: Option<u32>, p: u32) -> SlotKind {
    if pinned == Some(p) {
        SlotKind::Pinned
    } else {
        SlotKind::Partition
    }
}

/// The host slot of resident partition `p`.
fn resident_rows(buffer: &mut PartitionBuffer, p: u32) -> crate::storage::shared::SharedRows<'_> {
    let (_, rows) = buffer
        .rows_mut()
        .into_iter()
        .find(|(q, _)| *q == p)
        .expect("partition resident");
    rows
}

/// The error of 0-based epoch `epoch`, whose mean loss `loss` is not finite under `cfg`.
fn diverged(epoch: usize, loss: f64, cfg: &TrainConfig) -> EmbedError {
    let kept = match epoch {
        0 => "its initial table".to_string(),
        e => format!("its checkpoint of epoch {e}"),
    };
    // Debug prints 1e30 as `1e30`, where Display writes out all 31 digits.
    EmbedError::Diverged(format!(
        "epoch {}: the loss is {loss}: the training diverged at learning rate {:?} (init_scale {:?}); \
         nothing of this epoch is committed, so the run keeps {kept}. \
         Lower --lr and start again to resume from it, or pass --fresh with a smaller --init-scale",
        epoch + 1,
        cfg.lr,
        cfg.init_scale
    ))
}
