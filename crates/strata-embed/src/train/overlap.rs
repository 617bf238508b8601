//! Whether partition swaps can hide behind training (Legend's Theorem 3), checked with the
//! device profile and a measured compute time per edge: at start for the CPU kernels (their
//! step timed on synthetic rows), after the first epoch on a device (the rate it trained that
//! epoch at: the host's step says nothing of a GPU's).
//!
//! The paper's condition: I/O is fully hidden when `|E|/|V|² ≥ 96 d² / (M t (w + r))`, with
//! `M` the buffer bytes, `t` the compute time per edge and `w`, `r` the write and read
//! throughput. It assumes uniform bucket sizes, a swap taking `2P/(w + r)` and a node row of
//! `8d` bytes (float32 embedding and per-element Adagrad state); with a node row of `R` bytes
//! the same proof gives `1.5 R² / (M t (w + r))`, which Strata checks, so that bf16 tables and
//! a row-wise Adagrad count their smaller partitions (`R = 8d` is the paper's form). Strata also
//! checks the schedule it will actually run: for every swap, the edges of the buckets that
//! train while it is in flight, times `t`, against the swap's write-then-read time
//! `P/w + P/r` (the swap thread writes the evicted partition, then reads the next one). With
//! the plan's swap spare the next partition is read ahead as soon as the disk is free, so a
//! swap's I/O also overlaps the training before it: the check then follows the disk through
//! the epoch, each swap's partition ready `P/w + P/r` after the one before it was handed over
//! (the victim written behind, then the next read; with two spares the two at once, so
//! `max(P/w, P/r)`), and the trainer waits only where it reaches a swap before then.

use serde::Serialize;
use strata_io::profile::DeviceProfile;
use strata_store::rng::Rng;

use crate::config::TrainConfig;
use crate::model::ScoreModel;
use crate::ordering::Schedule;
use crate::storage::partitioning::Buckets;
use crate::storage::shared::SharedRows;
use crate::train::epoch::EpochReport;
use crate::train::vs_all::VsAll;
use crate::train::worker::{BucketCtx, PartRows, Pool, Worker};

/// Seconds of training per edge (all threads together), and where they were measured.
#[derive(Debug, Clone, Copy)]
pub struct EdgeRate {
    pub seconds: f64,
    /// From an epoch a device trained, not from the host's step.
    pub from_device_epoch: bool,
}

impl EdgeRate {
    /// The CPU kernels' rate on `threads` threads ([`measure_edge_seconds`]); a 1vsAll or
    /// KvsAll chunk scores `candidates` entities.
    pub fn host(model: &ScoreModel, cfg: &TrainConfig, threads: usize, candidates: u64) -> Self {
        let seconds = measure_edge_seconds(model, cfg, threads, candidates);
        EdgeRate {
            seconds,
            from_device_epoch: false,
        }
    }

    /// The rate an epoch trained at on a device: its seconds less its I/O wait, per edge (the
    /// first epoch's include its graph captures, so this errs slow).
    pub fn device_epoch(report: &EpochReport) -> Self {
        let edges = (report.edges_per_second * report.seconds).max(1.0);
        EdgeRate {
            seconds: (report.seconds - report.io_wait_seconds).max(0.0) / edges,
            from_device_epoch: true,
        }
    }
}

impl std::fmt::Display for EdgeRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let us = self.seconds * 1e6;
        match self.from_device_epoch {
            true => write!(f, "the device trained {us:.3} us/edge in its first epoch"),
            false => write!(f, "training takes {us:.3} us/edge here"),
        }
    }
}

/// The check's inputs and verdicts.
#[derive(Debug, Clone, Serialize)]
pub struct OverlapCheck {
    /// Measured seconds of training per edge (all threads together).
    pub edge_seconds: f64,
    pub write_bytes_per_s: f64,
    pub read_bytes_per_s: f64,
    /// `|E| / |V|²` and the paper's threshold `1.5 R² / (M t (w + r))` for node rows of `R`
    /// bytes (`96 d²` in the numerator for the paper's `R = 8d`).
    pub density: f64,
    pub node_bytes: usize,
    pub threshold: f64,
    pub paper_holds: bool,
    /// Swaps in the schedule, and how many have enough overlapping training to hide them.
    pub swaps: usize,
    pub hidden_swaps: usize,
    /// Seconds per swap (write then read one partition).
    pub swap_seconds: f64,
    /// Whether the next swap's partition is read ahead (the plan's swap spare).
    pub read_ahead: bool,
    /// Expected seconds per epoch the trainer waits on swaps.
    pub exposed_seconds: f64,
    /// Expected seconds per epoch of training.
    pub compute_seconds: f64,
}

impl OverlapCheck {
    /// The check as lines for the user.
    pub fn describe(&self) -> Vec<String> {
        vec![
            format!(
                "Theorem 3: |E|/|V|^2 = {:.3e} {} 1.5 R^2/(M t (w+r)) = {:.3e} with R = {} bytes a node row (the paper's 8d: 96 d^2), t = {:.3} us/edge, w = {:.0} MB/s, r = {:.0} MB/s: the paper's condition {}",
                self.density,
                if self.paper_holds { ">=" } else { "<" },
                self.threshold,
                self.node_bytes,
                self.edge_seconds * 1e6,
                self.write_bytes_per_s / 1e6,
                self.read_bytes_per_s / 1e6,
                if self.paper_holds { "holds, I/O can be fully hidden" } else { "fails, I/O cannot be fully hidden" }
            ),
            format!(
                "  this schedule: {}/{} swaps of {:.2} s each have enough {} training; expected I/O wait {:.1} s of {:.1} s compute per epoch",
                self.hidden_swaps,
                self.swaps,
                self.swap_seconds,
                if self.read_ahead { "earlier (read ahead)" } else { "overlapping" },
                self.exposed_seconds,
                self.compute_seconds
            ),
        ]
    }
}

/// Seconds per edge of the training step on `threads` threads (both directions when both are
/// corrupted), measured on synthetic rows with the run's model and chunk shape. A 1vsAll or
/// KvsAll step, whose every term grows with the entities it scores, is timed against 8,192
/// of them and scaled to `candidates`.
pub fn measure_edge_seconds(
    model: &ScoreModel,
    cfg: &TrainConfig,
    threads: usize,
    candidates: u64,
) -> f64 {
    let rows = 8192usize.max(cfg.most_negatives());
    let d = model.dim;
    let mut rng = Rng::new(0x7e57);
    let mut params: Vec<f32> = (0..rows * d)
        .map(|_| (rng.next_f64() as f32 - 0.5) * 1e-2)
        .collect();
    let mut state = vec![0.0f32; rows * d];
    let rd = model.rel_dim().max(1);
    let mut rel_params = vec![0.5f32; 2 * rd];
    let mut rel_state = vec![0.0f32; 2 * rd];
    let b = cfg.chunk_size.max(1);
    let chunks: Vec<Vec<[i32; 3]>> = (0..threads * 2)
        .map(|_| {
            (0..b)
                .map(|_| {
                    [
                        rng.below(rows as u64) as i32,
                        0,
                        rng.below(rows as u64) as i32,
                    ]
                })
                .collect()
        })
        .collect();
    let part = PartRows {
        rows: SharedRows::new(&mut params, &mut state, d, d),
        size: rows as u32,
    };
    let ctx = BucketCtx {
        model: *model,
        loss: cfg.loss_fn(),
        lr: 1e-6,
        parts: vec![part],
        src_part: 0,
        dst_part: 0,
        rels: (model.rel_dim() > 0)
            .then(|| SharedRows::new(&mut rel_params, &mut rel_state, rd, rd)),
        inverse_offset: 1,
        corrupt: cfg.corrupt,
        // The synthetic edges are of relation 0: an even split of their sides.
        head_prob: &[0.5],
        negatives: cfg.negatives,
        negatives_head: cfg.negatives_of(false),
        shared_negatives: cfg.shared_negatives,
        degree_fraction: cfg.degree_fraction,
        pool: Pool::Resident,
        reg: cfg.regularizer(),
        dropout: cfg.dropout(),
        negs: None,
        feat: None,
        // The config refuses 1vsAll and KvsAll with a model whose score is no product.
        vs_all: model
            .product_query()
            .ok()
            .filter(|_| cfg.scores_all())
            .map(|query| VsAll {
                label_smoothing: cfg.label_smoothing,
                query,
                answers: None,
            }),
    };
    let mut workers: Vec<Worker> = (0..threads).map(|_| Worker::default()).collect();
    // One warm-up chunk per worker (allocations), then the timed ones.
    let run = |workers: &mut [Worker], chunks: &[Vec<[i32; 3]>]| {
        let start = std::time::Instant::now();
        std::thread::scope(|s| {
            for (w, worker) in workers.iter_mut().enumerate() {
                let (ctx, chunks) = (&ctx, chunks);
                s.spawn(move || {
                    for c in chunks.iter().skip(w).step_by(threads) {
                        worker.train_chunk(ctx, c, &[], 1);
                    }
                });
            }
        });
        start.elapsed().as_secs_f64()
    };
    run(&mut workers, &chunks[..threads]);
    let per_edge = run(&mut workers, &chunks) / (chunks.len() * b) as f64;
    if cfg.scores_all() {
        per_edge * candidates as f64 / rows as f64
    } else {
        per_edge
    }
}

/// Theorem 3's density threshold for node rows of `node_bytes` (embedding and optimizer
/// state), buffer `M` bytes, `t` seconds per edge and `w`, `r` bytes per second:
/// `1.5 R² / (M t (w + r))`. The paper's proof with `R` for its `8d` bytes: a partition is `M/3`
/// bytes, so `n = 3|V|R/M`; an exchange takes `(M/3)/(w + r)` and two buckets of `|E|/n²`
/// edges each must cover it, `2t|E|/n² ≥ M/(3(w + r))`. `R = 8d` gives the paper's `96 d²`.
pub fn paper_threshold(
    node_bytes: usize,
    buffer_bytes: f64,
    edge_seconds: f64,
    w: f64,
    r: f64,
) -> f64 {
    1.5 * (node_bytes * node_bytes) as f64 / (buffer_bytes * edge_seconds * (w + r))
}

/// Checks `schedule` over `buckets` with `edge_seconds` per edge and the device `profile`,
/// each swap's partition read ahead into the plan's `spares` (0: none, no read ahead).
/// `None` when every partition stays resident (there are no swaps to hide).
#[allow(clippy::too_many_arguments)]
pub fn check(
    schedule: &Schedule,
    buckets: &Buckets,
    node_bytes: usize,
    buffer_bytes: u64,
    part_bytes: u64,
    edge_seconds: f64,
    profile: &DeviceProfile,
    spares: u64,
) -> Option<OverlapCheck> {
    if schedule.swaps() == 0 {
        return None;
    }
    let w = profile.seq_write_mb_s * 1e6;
    let r = profile.seq_read_mb_s * 1e6;
    let v = buckets.partitioning.num_nodes as f64;
    let density = buckets.num_edges as f64 / (v * v);
    let threshold = paper_threshold(node_bytes, buffer_bytes as f64, edge_seconds, w, r);
    let swap_seconds = part_bytes as f64 / w + part_bytes as f64 / r;
    let seconds = |buckets_of: &[(u32, u32)]| {
        let edges: u64 = buckets_of
            .iter()
            .map(|&(a, b)| buckets.range(a, b).end - buckets.range(a, b).start)
            .sum();
        edges as f64 * edge_seconds
    };
    let steps: Vec<StepSeconds> = schedule
        .steps
        .iter()
        .map(|s| StepSeconds {
            overlap: seconds(&s.overlap),
            after: seconds(&s.after_load),
            swaps: s.loaded.is_some(),
        })
        .collect();
    let waits = swap_waits(&steps, part_bytes as f64 / w, part_bytes as f64 / r, spares);
    let hidden = waits.iter().filter(|&&t| t <= 0.0).count();
    let exposed = waits.iter().sum();
    Some(OverlapCheck {
        edge_seconds,
        write_bytes_per_s: w,
        read_bytes_per_s: r,
        density,
        node_bytes,
        threshold,
        paper_holds: density >= threshold,
        swaps: schedule.swaps(),
        hidden_swaps: hidden,
        swap_seconds,
        read_ahead: spares > 0,
        exposed_seconds: exposed,
        compute_seconds: buckets.num_edges as f64 * edge_seconds,
    })
}

/// A buffer state's training seconds: while its swap is in flight, and after it (or the
/// whole state's, for a state reached without a swap).
#[derive(Debug, Clone, Copy)]
struct StepSeconds {
    overlap: f64,
    after: f64,
    swaps: bool,
}

/// The trainer's expected wait at each swap of `steps`, a swap writing its victim in `write`
/// seconds and reading the next partition in `read`. Without `spares` a swap starts when it
/// is due and only its state's overlapping training covers it. With them the disk works
/// through the epoch: the first swap's partition is read from the epoch's start, each later
/// one once the swap before it was handed over (after its victim is written with one spare,
/// beside that write with two), and a swap is handed over once its partition is in (the
/// trainer waits for that after the overlapping training).
fn swap_waits(steps: &[StepSeconds], write: f64, read: f64, spares: u64) -> Vec<f64> {
    let read_ahead = spares > 0;
    let between = if spares >= 2 {
        write.max(read)
    } else {
        write + read
    };
    let mut waits = Vec::new();
    let (mut now, mut ready) = (0.0, read);
    for s in steps {
        if !s.swaps {
            now += s.overlap + s.after;
            continue;
        }
        let wait = if read_ahead {
            let handed = ready.max(now);
            ready = handed + between;
            (handed - (now + s.overlap)).max(0.0)
        } else {
            (write + read - s.overlap).max(0.0)
        };
        waits.push(wait);
        now += s.overlap + wait + s.after;
    }
    waits
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Swaps of 0.5 s (0.2 to write, 0.3 to read) between states that train 0.1 s while a
    /// swap is in flight and 0.5 s after it: alone each swap shows 0.4 s; read ahead (one
    /// spare), the
    /// 0.6 s a state trains covers the next swap's 0.5 s of I/O, and only the first swap,
    /// whose read has the fill state's 0.05 s before it, shows its 0.15 s.
    #[test]
    fn a_read_ahead_hides_a_swap_behind_the_training_before_it() {
        let fill = StepSeconds {
            overlap: 0.0,
            after: 0.05,
            swaps: false,
        };
        let state = StepSeconds {
            overlap: 0.1,
            after: 0.5,
            swaps: true,
        };
        let steps = [fill, state, state, state];
        let alone = swap_waits(&steps, 0.2, 0.3, 0);
        assert!(alone.iter().all(|&w| (w - 0.4).abs() < 1e-12), "{alone:?}");
        let ahead = swap_waits(&steps, 0.2, 0.3, 1);
        assert!((ahead[0] - 0.15).abs() < 1e-12, "{ahead:?}");
        assert!(ahead[1..].iter().all(|&w| w == 0.0), "{ahead:?}");
        // A disk slower than the training between swaps: after the first, each swap waits the
        // 0.4 s by which its 1 s of I/O outlasts a state's 0.6 s of training.
        let slow = swap_waits(&steps, 0.5, 0.5, 1);
        assert!((slow[0] - 0.35).abs() < 1e-12, "{slow:?}");
        assert!(
            slow[1..].iter().all(|&w| (w - 0.4).abs() < 1e-12),
            "{slow:?}"
        );
        // With two spares the write behind and the next read run at once: 0.5 s of I/O
        // between swaps, hidden by the 0.6 s of training.
        let two = swap_waits(&steps, 0.5, 0.5, 2);
        assert!((two[0] - 0.35).abs() < 1e-12, "{two:?}");
        assert!(two[1..].iter().all(|&w| w == 0.0), "{two:?}");
    }

    #[test]
    fn paper_numbers() {
        // The paper's example (§4): t = 1e-7 s/edge, w = 2 GB/s, r = 3 GB/s, M = 15 GB,
        // d = 100 gives a threshold of about 1.28e-7.
        // d = 100 (float32 rows with per-element state: 800 bytes) gives about 1.28e-7.
        let threshold = paper_threshold(800, 15e9, 1e-7, 2e9, 3e9);
        assert!((threshold - 1.28e-7).abs() < 1e-9, "{threshold}");
        // Twitter (1.46e9 edges, 41.6e6 nodes) is above it, Freebase86M below.
        assert!(1.46e9 / (41.6e6f64 * 41.6e6) > threshold);
        assert!(3.047e8 / (86.1e6f64 * 86.1e6) < threshold);
        // bf16 rows with one state value (202 bytes): the threshold scales with the row's
        // square, and Freebase86M passes it.
        let lean = paper_threshold(202, 15e9, 1e-7, 2e9, 3e9);
        assert!((lean / threshold - (202.0f64 / 800.0).powi(2)).abs() < 1e-12);
        assert!(3.047e8 / (86.1e6f64 * 86.1e6) > lean);
    }

    #[test]
    fn measures_a_positive_edge_time() {
        let cfg = TrainConfig {
            dim: 16,
            chunk_size: 64,
            negatives: 64,
            ..TrainConfig::default()
        };
        let model = ScoreModel {
            kind: cfg.model,
            dim: 16,
            transe_norm: 2,
            pbg: crate::model::PbgForm::default(),
        };
        let t = measure_edge_seconds(&model, &cfg, 2, 0);
        assert!(t > 0.0 && t < 1e-3, "{t}");
        // 1vsAll's step against 8,192 synthetic entities, scaled to a million.
        let one = TrainConfig {
            training: crate::config::TrainingMode::OneVsAll,
            negatives: TrainConfig::default().negatives,
            ..cfg
        };
        let t = measure_edge_seconds(&model, &one, 2, 1 << 20);
        assert!(t.is_finite() && t > 0.0, "{t}");
    }
}
