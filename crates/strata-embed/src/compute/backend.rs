//! The compute seam: the one trait a training step runs through. The epoch loops (single
//! process and distributed), the planner and the run format know nothing of how a piece of a
//! bucket is trained; they hand each piece to the job's [`Compute`], chosen once where the job
//! starts ([`crate::compute::device::for_device`], by the `device` option). The CPU kernels
//! ([`CpuCompute`]: the worker threads of [`crate::train::worker`]) are its first
//! implementation; the device backend ([`crate::compute::device`]: torch on a GPU or on its
//! CPU twin) the second, without touching the epoch loop.
//!
//! # Contract
//!
//! - **Input.** One piece of bucket `(a, b)`: `chunks`, each `(group, edges, weights)` with
//!   `edges` rows `[source local row, relation id, destination local row]` (`i32`, local to the
//!   bucket's partitions) and `weights` one `f32` per edge or empty (unweighted); `group`
//!   indexes `ctxs`, the [`BucketCtx`] its chunk trains against (one per entity-type group of a
//!   typed run, one otherwise). Chunks hold at most `chunk_size` edges, in training order.
//! - **Buffers.** The caller owns every buffer. The embedding and optimizer-state rows of the
//!   resident partitions are the partition buffer's host slots, lent through
//!   `BucketCtx::parts` (rows of `dim` `f32`, or bf16 in a bf16 table, then the optimizer
//!   state: see [`crate::storage::table::TableLayout`]); relation rows through `BucketCtx::rels`; banks
//!   (negatives of partitions on disk) through `BucketCtx::pool`. A backend may copy them
//!   anywhere while it runs, but by the time `train_piece` returns every update (Adagrad step
//!   of each touched node and relation row, bank gradient) is in those host buffers: the epoch
//!   loop writes slots back to the table files right after.
//! - **Units.** Loss is the sum over chunks and corrupted sides of the model's loss (per
//!   positive edge-direction summed, weights applied, regularizer added); `directions` counts
//!   positive edge-directions; `flops` floating-point operations of the steps (the model's
//!   count); `busy` seconds spent in steps. Counters accumulate from `reset_counters` on.
//! - **Determinism.** Chunk `c` of a piece draws its negatives (and, with `corrupt =
//!   bernoulli`, its edges' sides) from `derive(key, c)` only, so what a chunk samples does not
//!   depend on which thread or device trains it. With one thread the updates are applied in
//!   chunk order and a fixed seed gives byte-identical tables; with more, chunks run
//!   concurrently (Hogwild-style), and only the interleaving of their updates varies.
//!
//! # Slot hooks (Legend's placement)
//!
//! A backend that computes elsewhere (a GPU) keeps the slots there instead of copying them
//! per piece. The epoch loop tells it when a slot's host memory changes hands
//! ([`Compute::slot_filled`]: the I/O engine has just filled it from the table file, so the
//! device copies it in) and when the host memory is about to be read
//! ([`Compute::slot_leaving`]: before a write-back or an eviction, the device copies its rows
//! out into the host buffer first). Relations go through the same two hooks at the start and
//! end of each epoch, where the engine checkpoints them. A slot the backend holds is trained
//! there; the host buffer is stale until `slot_leaving`. [`CpuCompute`] trains the host
//! buffers in place, so its hooks do nothing.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use strata_store::rng::derive;

use crate::error::Result;
use crate::storage::shared::SharedRows;
use crate::train::worker::{BucketCtx, Worker};

/// A victim's rows on their way out of a device ([`Compute::slot_evicting`]): called once,
/// from any thread, right before the I/O engine writes the slot, it puts the rows into the
/// slot's host memory (waiting for the copy out where it still runs).
pub type Landing = Box<dyn FnOnce() -> Result<()> + Send>;

/// A chunk of a piece: its group (an index into the piece's [`BucketCtx`]s), its edges and
/// their weights (empty: unweighted).
pub type PieceChunk<'a> = (usize, &'a [[i32; 3]], &'a [f32]);

/// What the steps of an epoch added up to (see the module's units).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepCounters {
    pub loss: f64,
    pub directions: u64,
    pub flops: f64,
    pub busy: f64,
}

/// What a device backend adds to an epoch's counters (zero for the CPU kernels): seconds the
/// device computed (CUDA events on a GPU, the step's wall seconds on the CPU twin), bytes
/// copied host -> device and device -> host, seconds the compute waited for a copy, the
/// seconds the slot copies into the device took, and the loss of the pieces whose
/// `train_piece` returned before the device had trained them (a GPU reads a piece's loss one
/// piece late, so that the host never waits for the piece it just queued).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DeviceCounters {
    pub busy: f64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
    pub copy_wait: f64,
    pub slot_in_seconds: f64,
    pub late_loss: f64,
}

/// Which table a slot hook is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A partition's embeddings and optimizer state (one buffer slot).
    Partition,
    /// A typed run's pinned region (unpartitioned and featurized types): resident all epoch,
    /// and of its own size (a device gives it a slot of that size).
    Pinned,
    /// The relation rows and their optimizer state (kept on a device for the whole run).
    Relations,
}

/// A training backend: trains pieces of buckets into the partition slots (see the module's
/// contract).
pub trait Compute: Send {
    /// Parallel workers of the backend (the CPU's threads); the evaluation sizes its own
    /// threads by it.
    fn threads(&self) -> usize;
    /// Zeroes the counters (at the start of an epoch).
    fn reset_counters(&mut self);
    /// The counters since the last reset.
    fn counters(&self) -> StepCounters;
    /// Trains every chunk of one piece against `ctxs`; `key` is the piece's seed.
    fn train_piece(&mut self, ctxs: &[BucketCtx], chunks: &[PieceChunk], key: u64);
    /// Why a step could not train (a backend that can fail keeps its first failure and trains
    /// nothing after it); the epoch loop asks after each piece and stops the job with it.
    fn failure(&mut self) -> Option<String> {
        None
    }
    /// `rows` (a slot of `kind`) now hold what the table file holds: a device copies them in
    /// (relations only when it holds none yet: its copy is newer than the host's).
    fn slot_filled(&mut self, _kind: SlotKind, _rows: SharedRows) -> Result<()> {
        Ok(())
    }
    /// `rows` are about to be written back (`evict`: and then reused for another partition):
    /// a device copies its rows out into them first, and with `evict` forgets its copy.
    fn slot_leaving(&mut self, _rows: SharedRows, _evict: bool) -> Result<()> {
        Ok(())
    }
    /// [`Compute::slot_leaving`] with `evict`, except that the copy out may still run when it
    /// returns (Legend's order: the victim leaves while the retained partitions compute): the
    /// caller hands the slot to the I/O engine only after calling the [`Landing`], and trains
    /// no piece of the victim's partition in between.
    fn slot_evicting(&mut self, rows: SharedRows) -> Result<Landing> {
        self.slot_leaving(rows, true)?;
        Ok(Box::new(|| Ok(())))
    }
    /// Forgets every partition slot the backend holds (their host buffers may change outside
    /// the hooks: an evaluation reads other partitions into them between epochs).
    fn forget_partitions(&mut self) {}
    /// Lets go of host memory the backend page-locked in place (the partition slots' buffers),
    /// before the buffer frees it: when the trainer ends.
    fn release_host(&mut self) {}
    /// The device's own counters since the last reset (`None`: a host backend). Called
    /// before [`Compute::counters`] at an epoch's end: it adds the loss of the pieces the
    /// device trained after their `train_piece` returned.
    fn device_counters(&mut self) -> Option<DeviceCounters> {
        None
    }
    /// A line for the run's output about where and how the backend computes (`None`: the
    /// CPU kernels, nothing to say).
    fn describe(&mut self) -> Option<String> {
        None
    }
}

/// The CPU kernels: one [`Worker`] per thread, each taking the next chunk when free.
pub struct CpuCompute {
    workers: Vec<Worker>,
}

impl CpuCompute {
    /// `threads` workers, at least 1.
    pub fn new(threads: usize) -> CpuCompute {
        CpuCompute {
            workers: (0..threads.max(1)).map(|_| Worker::default()).collect(),
        }
    }
}

impl Compute for CpuCompute {
    fn threads(&self) -> usize {
        self.workers.len()
    }

    fn reset_counters(&mut self) {
        self.workers.iter_mut().for_each(Worker::reset_counters);
    }

    fn counters(&self) -> StepCounters {
        self.workers
            .iter()
            .fold(StepCounters::default(), |c, w| StepCounters {
                loss: c.loss + w.loss,
                directions: c.directions + w.edges,
                flops: c.flops + w.flops,
                busy: c.busy + w.busy,
            })
    }

    fn train_piece(&mut self, ctxs: &[BucketCtx], chunks: &[PieceChunk], key: u64) {
        let threads = self.workers.len().min(chunks.len());
        if threads == 1 {
            for (c, &(g, chunk, w)) in chunks.iter().enumerate() {
                self.workers[0].train_chunk(&ctxs[g], chunk, w, derive(key, c as u64));
            }
            return;
        }
        // Chunks go to whichever worker is free; each chunk's negatives depend only on its
        // index, so the assignment changes nothing but the interleaving of updates.
        let next = AtomicUsize::new(0);
        let next = &next;
        std::thread::scope(|scope| {
            for worker in self.workers[..threads].iter_mut() {
                scope.spawn(move || loop {
                    let c = next.fetch_add(1, Relaxed);
                    if c >= chunks.len() {
                        break;
                    }
                    let (g, chunk, w) = chunks[c];
                    worker.train_chunk(&ctxs[g], chunk, w, derive(key, c as u64));
                });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Corrupt;
    use crate::model::ScoreModel;
    use crate::model::{Loss, LossKind, PbgForm, Regularizer, RegularizerKind, ScoreKind};
    use crate::train::worker::{PartRows, Pool};
    use strata_store::rng::Rng;

    const D: usize = 4;
    const NODES: usize = 6;

    /// Edges among `NODES` nodes of one partition, in chunks of 4.
    fn edges() -> Vec<[i32; 3]> {
        (0..10).map(|i| [i % 6, 0, (i * 5 + 1) % 6]).collect()
    }

    /// Rows of one partition trained on `edges` (one chunk of at most 4 per piece chunk) by
    /// `train`, which gets the bucket's context and the chunks; the rows after, and the loss.
    fn trained(train: impl FnOnce(&BucketCtx, &[PieceChunk]) -> f64) -> (Vec<f32>, f64) {
        let mut rng = Rng::new(3);
        let mut rows: Vec<f32> = (0..NODES * D).map(|_| rng.normal_pair().0 as f32).collect();
        let mut state = vec![0.0; NODES * D];
        let ctx = BucketCtx {
            model: ScoreModel {
                kind: ScoreKind::Dot,
                dim: D,
                transe_norm: 2,
                pbg: PbgForm::default(),
            },
            loss: Loss::plain(LossKind::Softmax, 0.1),
            lr: 0.1,
            parts: vec![PartRows {
                rows: SharedRows::new(&mut rows, &mut state, D, D),
                size: NODES as u32,
            }],
            src_part: 0,
            dst_part: 0,
            rels: None,
            inverse_offset: 0,
            corrupt: Corrupt::Both,
            head_prob: &[],
            negatives: 3,
            negatives_head: 3,
            shared_negatives: true,
            degree_fraction: 0.0,
            pool: Pool::Partition,
            reg: Regularizer {
                kind: RegularizerKind::None,
                weight: 0.0,
                ..Default::default()
            },
            dropout: Default::default(),
            negs: None,
            feat: None,
            vs_all: None,
        };
        let edges = edges();
        let chunks: Vec<PieceChunk> = edges.chunks(4).map(|c| (0, c, &[][..])).collect();
        let loss = train(&ctx, &chunks);
        drop(ctx);
        (rows, loss)
    }

    #[test]
    fn one_cpu_thread_trains_the_chunks_in_order_each_seeded_by_its_index() {
        let key = 99;
        let (by_hand, loss) = trained(|ctx, chunks| {
            let mut w = Worker::default();
            for (c, &(_, e, wt)) in chunks.iter().enumerate() {
                w.train_chunk(ctx, e, wt, derive(key, c as u64));
            }
            w.loss
        });
        let mut cpu = CpuCompute::new(1);
        let (through, _) = trained(|ctx, chunks| {
            cpu.train_piece(std::slice::from_ref(ctx), chunks, key);
            cpu.counters().loss
        });
        assert_eq!(by_hand, through);
        let c = cpu.counters();
        assert_eq!(c.loss, loss);
        // Both sides of each of the 10 edges were trained.
        assert_eq!(c.directions, 20);
        assert!(c.flops > 0.0);
        cpu.reset_counters();
        assert_eq!(cpu.counters(), StepCounters::default());
    }

    #[test]
    fn more_threads_sample_the_same_chunks_and_count_the_same_work() {
        let mut one = CpuCompute::new(1);
        let mut three = CpuCompute::new(3);
        assert_eq!((one.threads(), three.threads()), (1, 3));
        trained(|ctx, chunks| {
            one.train_piece(std::slice::from_ref(ctx), chunks, 5);
            0.0
        });
        trained(|ctx, chunks| {
            three.train_piece(std::slice::from_ref(ctx), chunks, 5);
            0.0
        });
        let (a, b) = (one.counters(), three.counters());
        assert_eq!(a.directions, b.directions);
        assert_eq!(a.flops, b.flops);
    }
}
