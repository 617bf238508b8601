//! The memory plan: how a byte budget splits between the partition buffer, edge pieces, the
//! workers' scratch, evaluation and relations, and from that how many partitions the table
//! needs. Everything the process allocates for training is counted here; the plan is printed
//! at start and the run refuses to start when the minimum does not fit.

use serde::Serialize;
use strata_store::budget::{group_bytes, group_takes, MemoryPlan, Planned};
use strata_store::units::fmt_bytes;

use crate::bank::Banks;
use crate::config::{NegativePool, OptimizerKind, Protocol, TableDtype, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::eval;
use crate::model::ScoreModel;
use crate::table::region_bytes;

/// Bytes reserved for the process itself: interpreter, libraries, allocator slack, I/O engine
/// rings and bounce buffers.
pub const RUNTIME_BYTES: u64 = 64 << 20;
/// Most edges per bucket piece.
const MAX_PIECE_ROWS: u64 = 1 << 20;
/// Edge pieces alive at once: two read ahead, one training, one being read.
const PIECES_ALIVE: u64 = 4;
/// Share of the budget evaluation may use for its rounds (queries, candidates, tiles).
const EVAL_SHARE: u64 = 8;
/// Share of the budget for negative banks when the table is partitioned.
const BANK_SHARE: u64 = 16;

/// Partition slots a rank's lookahead wants beyond the buffer: while the current bucket
/// trains, the next grant's loads (at most two partitions) go into free slots, since up to
/// both of the current bucket's partitions stay in use until it is trained.
pub const PREFETCH_SLOTS: usize = 2;

/// What a rank of a distributed run adds to its plan.
#[derive(Debug, Clone, Copy, Default)]
pub struct RankNeeds {
    /// The process's anonymous memory (`RssAnon`) after torch's import and the group's start,
    /// as the front end measured it (None: not measured).
    pub group_anon_bytes: Option<u64>,
    /// Whether the rank wants [`PREFETCH_SLOTS`] slots for its lookahead (`dist_prefetch`).
    pub prefetch: bool,
}

/// How the budget is spent.
#[derive(Debug, Clone, Serialize)]
pub struct EmbedPlan {
    pub memory: u64,
    pub partitions: u32,
    /// Partition slots in the buffer.
    pub capacity: usize,
    /// Bytes of one partition (embeddings + optimizer state, padded).
    pub part_bytes: u64,
    pub buffer_bytes: u64,
    /// The whole table on disk (one file).
    pub table_bytes: u64,
    pub piece_rows: u64,
    pub edge_bytes: u64,
    pub threads: usize,
    /// Workers one per core would have been (more than `threads` when the budget held fewer).
    pub cores: usize,
    pub worker_bytes: u64,
    /// Queries per evaluation round and the bytes a round uses.
    pub eval_round: usize,
    pub eval_bytes: u64,
    pub relation_bytes: u64,
    /// Rows per partition of the negative banks (0: no banks) and their bytes.
    pub bank_rows: usize,
    pub bank_bytes: u64,
    pub runtime_bytes: u64,
    /// A rank's torch and gloo: its measured anonymous memory after the group started plus
    /// their code pages ([`group_bytes`]; 0 outside a distributed run, or where it was not
    /// measured).
    pub group_bytes: u64,
    /// Slots beyond `capacity` for a distributed rank's lookahead, and their bytes (0: none).
    pub prefetch_slots: usize,
    pub prefetch_bytes: u64,
    /// Why a rank that asked for the lookahead has fewer than [`PREFETCH_SLOTS`] slots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefetch_note: Option<String>,
    /// The smallest budget that holds the fixed parts and the buffer's slots with one node
    /// per partition (the configured partitions, when set).
    pub minimum: u64,
}

impl EmbedPlan {
    /// Total planned bytes.
    pub fn total(&self) -> u64 {
        self.buffer_bytes
            + self.edge_bytes
            + self.worker_bytes
            + self.eval_bytes
            + self.relation_bytes
            + self.bank_bytes
            + self.runtime_bytes
            + self.group_bytes
            + self.prefetch_bytes
    }

    /// Whether every partition stays resident (no swaps during an epoch).
    pub fn in_memory(&self) -> bool {
        self.capacity >= self.partitions as usize
    }
}

impl Planned for EmbedPlan {
    /// Parts: the partition buffer, edge pieces, workers, evaluation, relations, negative
    /// banks, runtime; data: the embedding table (the buffer's share of it resident, the rest
    /// on the SSD).
    fn memory_plan(&self) -> MemoryPlan {
        let mode = if self.in_memory() {
            "the whole table resident".to_string()
        } else {
            format!(
                "{} partitions on disk, {} resident at a time",
                self.partitions, self.capacity
            )
        };
        let mut plan = MemoryPlan::new("embed", self.memory)
            .minimum(self.minimum)
            .part(
                "partition buffer",
                self.buffer_bytes,
                format!(
                    "{} x {} ({mode})",
                    self.capacity,
                    fmt_bytes(self.part_bytes)
                ),
            );
        if let Some(note) = &self.prefetch_note {
            plan = plan.part("prefetch slots", self.prefetch_bytes, note.clone());
        } else if self.prefetch_slots > 0 {
            plan = plan.part(
                "prefetch slots",
                self.prefetch_bytes,
                format!(
                    "{} x {} for the next grant's partitions, loaded while a bucket trains",
                    self.prefetch_slots,
                    fmt_bytes(self.part_bytes)
                ),
            );
        }
        plan = plan
            .part(
                "edge pieces",
                self.edge_bytes,
                format!("{PIECES_ALIVE} pieces of {} edges", self.piece_rows),
            )
            .part(
                "workers",
                self.worker_bytes,
                if self.threads < self.cores {
                    format!(
                        "{} threads (of {} cores: --memory holds no more)",
                        self.threads, self.cores
                    )
                } else {
                    format!("{} threads", self.threads)
                },
            )
            .part(
                "evaluation",
                self.eval_bytes,
                format!("rounds of {} queries", self.eval_round),
            )
            .part("relations", self.relation_bytes, "")
            .part(
                "negative banks",
                self.bank_bytes,
                if self.bank_rows > 0 {
                    format!("{} rows per partition", self.bank_rows)
                } else {
                    "none".to_string()
                },
            )
            .part("runtime", self.runtime_bytes, "reserve")
            .group_part(self.group_bytes);
        plan.data(
            "embedding table",
            self.table_bytes,
            if self.in_memory() {
                self.table_bytes
            } else {
                self.buffer_bytes
            },
            "SSD",
        )
    }
}

/// Bytes of one partition of `rows` nodes stored in `dtype`.
pub fn part_bytes(rows: u64, dim: usize, optimizer: OptimizerKind, dtype: TableDtype) -> u64 {
    let state = match optimizer {
        OptimizerKind::Adagrad => dim,
        OptimizerKind::AdagradRow => 1,
    };
    region_bytes(rows, dim, state, dtype)
}

/// Scratch of one worker for chunks of `b` edges and `n` negatives (scores, loaded rows,
/// gradients, update keys).
fn worker_bytes(model: &ScoreModel, b: u64, n: u64) -> u64 {
    let d = model.dim as u64;
    // Relation rows and their gradients: `dim` reals or more (`linear`: dim²).
    let rd = (model.rel_dim() as u64).max(d);
    let scores = 4 * b * n * (1 + model.kind.get().extra_score_matrices());
    scores + 8 * (3 * b + n) * d + 8 * b * rd + 16 * (2 * b + n)
}

/// Plans `cfg` with the workers it asks for, or (`threads` 0: one per core) with as many of the
/// cores' workers as the budget holds: each needs its scratch and an evaluation tile, which
/// many cores and a small `--memory` cannot all have (halving down to one; the refusal is then
/// the one-worker plan's).
pub fn plan_fitting(
    cfg: &TrainConfig,
    model: &ScoreModel,
    num_nodes: u64,
    num_relations: u64,
    rank: Option<RankNeeds>,
) -> Result<EmbedPlan> {
    let cores = strata_io::resolve_threads(cfg.threads);
    let mut threads = cores;
    loop {
        match plan(cfg, model, num_nodes, num_relations, threads, rank) {
            Err(EmbedError::Budget(_)) if cfg.threads == 0 && threads > 1 => threads /= 2,
            Ok(mut p) => {
                p.cores = cores;
                return Ok(p);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Plans `cfg` for a graph of `num_nodes` nodes and `num_relations` relation types with
/// `threads` workers; `rank`: this process is a rank of a distributed run.
/// `cfg.partitions == 0` picks the fewest partitions that fit (with a rank's prefetch slots
/// when it wants them).
pub fn plan(
    cfg: &TrainConfig,
    model: &ScoreModel,
    num_nodes: u64,
    num_relations: u64,
    threads: usize,
    rank: Option<RankNeeds>,
) -> Result<EmbedPlan> {
    let memory = cfg.memory;
    let rank = rank.unwrap_or_default();
    let group_bytes = group_bytes(rank.group_anon_bytes);
    if group_bytes > 0 && RUNTIME_BYTES + group_bytes >= memory {
        return Err(EmbedError::Budget(format!(
            "memory budget {} cannot hold this rank's process: {}, beside the {} runtime reserve; give each rank --memory well above {}",
            fmt_bytes(memory),
            group_takes(group_bytes),
            fmt_bytes(RUNTIME_BYTES),
            fmt_bytes(RUNTIME_BYTES + group_bytes)
        )));
    }
    let d = model.dim as u64;
    let rd = model.rel_dim() as u64;
    let rel_rows = num_relations.max(1) * if cfg.reciprocal { 2 } else { 1 };
    let rel_state = match cfg.optimizer {
        OptimizerKind::Adagrad => rd,
        OptimizerKind::AdagradRow => 1,
    };
    let relation_bytes = if rd == 0 {
        0
    } else {
        rel_rows * (rd + rel_state) * 4
    };
    let piece_rows = (memory / 64 / 12).clamp(cfg.chunk_size as u64, MAX_PIECE_ROWS);
    let edge_bytes = PIECES_ALIVE * piece_rows * 12;
    let worker_bytes =
        threads as u64 * worker_bytes(model, cfg.chunk_size as u64, cfg.negatives as u64);
    // Evaluation: per query its source, answer and relation rows, and (sampled) its share of
    // the batch's candidates, or (filtered) its known answers; plus each thread's score tile.
    let per_query = 4 * (2 * d + rd)
        + 16
        + match cfg.eval_protocol {
            Protocol::Filtered => 256,
            Protocol::Sampled => {
                2 * cfg.eval_negatives as u64 * (d * 4 + 8) / cfg.chunk_size.max(1) as u64
            }
        };
    // Each thread's score tile, and for a bf16 table its tile of candidates widened to f32.
    let widened = match cfg.table_dtype {
        TableDtype::F32 => 0,
        TableDtype::Bf16 => eval::TILE as u64 * d,
    };
    let tiles = threads as u64
        * 4
        * (widened
            + match cfg.eval_protocol {
                Protocol::Filtered => (eval::QUERY_BATCH * eval::TILE) as u64,
                Protocol::Sampled => cfg.chunk_size as u64 * 2 * cfg.eval_negatives as u64,
            });
    let eval_share = (memory / EVAL_SHARE).max(tiles + per_query * eval::QUERY_BATCH as u64);
    let eval_round =
        ((eval_share - tiles) / per_query).clamp(eval::QUERY_BATCH as u64, 1 << 20) as usize;
    let eval_bytes = tiles + per_query * eval_round as u64;
    let fixed =
        RUNTIME_BYTES + group_bytes + edge_bytes + worker_bytes + eval_bytes + relation_bytes;
    let refuse = |what: String| -> EmbedError {
        EmbedError::Budget(format!(
            "memory budget {} cannot hold {what} (fixed needs {}: runtime {}, torch + gloo {}, edges {}, workers {}, evaluation {}, relations {})",
            fmt_bytes(memory),
            fmt_bytes(fixed),
            fmt_bytes(RUNTIME_BYTES),
            fmt_bytes(group_bytes),
            fmt_bytes(edge_bytes),
            fmt_bytes(worker_bytes),
            fmt_bytes(eval_bytes),
            fmt_bytes(relation_bytes)
        ))
    };
    let available = memory.saturating_sub(fixed);
    let size = |n: u64| {
        part_bytes(
            num_nodes.div_ceil(n),
            model.dim,
            cfg.optimizer,
            cfg.table_dtype,
        )
    };
    // (partitions, buffer slots) whose slots and `extra` more fit `available`.
    let solve = |available: u64, extra: usize| -> Result<(u64, usize)> {
        let (n, c) = if cfg.partitions == 0 {
            if size(1) <= available {
                return Ok((1, 1));
            }
            let c = cfg.buffer.max(1) as u64;
            let slots = c + extra as u64;
            // The smallest n whose slots fit: slots * size(n) is non-increasing in n.
            let (mut lo, mut hi) = (c + 1, num_nodes.max(c + 1));
            if slots * size(hi) > available {
                return Err(refuse(format!(
                    "{c} partition slots even with one node per partition; the table of {num_nodes} nodes needs {} — raise --memory",
                    fmt_bytes(size(1))
                )));
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if slots * size(mid) <= available {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            (lo, c as usize)
        } else {
            let n = cfg.partitions as u64;
            let c = cfg.buffer.min(cfg.partitions as usize).max(1);
            let slots = (c + extra.min(cfg.partitions as usize - c)) as u64;
            if slots * size(n) > available {
                return Err(refuse(format!(
                    "{c} slot(s) of {} for {n} partition(s) (needs {}; use more partitions or raise --memory to at least {})",
                    fmt_bytes(size(n)),
                    fmt_bytes(c as u64 * size(n)),
                    fmt_bytes(memory - available + c as u64 * size(n))
                )));
            }
            (n, c)
        };
        if n > u32::MAX as u64 || n > num_nodes.max(1) {
            return Err(refuse(format!(
                "{n} partitions of a graph of {num_nodes} nodes"
            )));
        }
        Ok((n, c))
    };
    // A rank's lookahead: as many of the slots it wants as fit, fewest partitions first.
    let want = if rank.prefetch { PREFETCH_SLOTS } else { 0 };
    let (mut partitions, mut capacity, mut prefetch_slots) = match (1..=want)
        .rev()
        .find_map(|x| solve(available, x).ok().map(|(n, c)| (n, c, x)))
    {
        Some(found) => found,
        None => {
            let (n, c) = solve(available, 0)?;
            (n, c, 0)
        }
    };
    // With n - c partitions outside the buffer, a grant loads at most that many.
    prefetch_slots = prefetch_slots.min(partitions as usize - capacity);
    let prefetch_note = (prefetch_slots < want.min(partitions as usize - capacity)).then(|| {
        if prefetch_slots == 0 {
            "none: --memory leaves no room for a slot beyond the buffer, so this rank asks for one bucket at a time (no lookahead)".to_string()
        } else {
            format!("{prefetch_slots} of {want} wanted (--memory): a next grant needing more loads the rest after the bucket trains")
        }
    });
    // Negative banks for partitions on disk (the `all` pool): a share of the budget, or what
    // the buffer leaves when that share would not fit.
    let mut bank_rows = 0usize;
    if cfg.negative_pool == NegativePool::All && partitions > capacity as u64 {
        let share = memory / BANK_SHARE;
        let leftover = |n: u64, c: usize, avail: u64| {
            avail.saturating_sub((c + prefetch_slots) as u64 * size(n))
        };
        let (n, c, room) = match solve(available.saturating_sub(share), prefetch_slots) {
            Ok((n, c)) => (
                n,
                c,
                share + leftover(n, c, available.saturating_sub(share)),
            ),
            Err(_) => (
                partitions,
                capacity,
                leftover(partitions, capacity, available),
            ),
        };
        (partitions, capacity) = (n, c);
        bank_rows = (cfg.bank_rows as u64)
            .min(num_nodes.div_ceil(n))
            .min(room / Banks::bytes(n as u32, 1, model.dim).max(1)) as usize;
    }
    let bank_bytes = Banks::bytes(partitions as u32, bank_rows, model.dim);
    let part_bytes = size(partitions);
    let fewest_rows = if cfg.partitions == 0 {
        size(num_nodes.max(1))
    } else {
        size(cfg.partitions as u64)
    };
    let minimum = fixed + capacity as u64 * fewest_rows;
    Ok(EmbedPlan {
        memory,
        partitions: partitions as u32,
        capacity,
        part_bytes,
        buffer_bytes: capacity as u64 * part_bytes,
        table_bytes: partitions * part_bytes,
        piece_rows,
        edge_bytes,
        threads,
        cores: threads,
        worker_bytes,
        eval_round,
        eval_bytes,
        relation_bytes,
        bank_rows,
        bank_bytes,
        runtime_bytes: RUNTIME_BYTES,
        group_bytes,
        prefetch_slots,
        prefetch_bytes: prefetch_slots as u64 * part_bytes,
        prefetch_note,
        minimum,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PbgForm, ScoreKind};
    use strata_store::budget::CODE_PAGES_BYTES;

    fn model(dim: usize) -> ScoreModel {
        ScoreModel {
            kind: ScoreKind::ComplEx,
            dim,
            transe_norm: 2,
            pbg: PbgForm::default(),
        }
    }

    #[test]
    fn one_worker_per_core_shrinks_to_what_the_budget_holds() {
        // The make demo setting that a 16-core machine refused: 100k nodes in 128 MiB, where
        // each worker's evaluation tile alone is 8 MiB.
        let one = TrainConfig {
            memory: 128 << 20,
            threads: 1,
            ..TrainConfig::default()
        };
        let fits_one = plan(&one, &model(100), 100_000, 40, 1, None).unwrap();
        let many = plan(&one, &model(100), 100_000, 40, 64, None);
        assert!(
            matches!(many, Err(EmbedError::Budget(_))),
            "64 workers must not fit"
        );
        let auto = TrainConfig {
            threads: 0,
            ..one.clone()
        };
        let p = plan_fitting(&auto, &model(100), 100_000, 40, None).unwrap();
        assert_eq!(p.cores, strata_io::resolve_threads(0));
        assert!(
            p.threads >= 1 && p.threads <= p.cores && p.total() <= auto.memory,
            "{p:?}"
        );
        if p.threads < p.cores {
            let line = p.memory_plan().describe().join("\n");
            assert!(line.contains("cores: --memory holds no more"), "{line}");
        }
        // Asked for explicitly, 64 workers are refused rather than shrunk.
        let explicit = TrainConfig { threads: 64, ..one };
        assert!(matches!(
            plan_fitting(&explicit, &model(100), 100_000, 40, None),
            Err(EmbedError::Budget(_))
        ));
        assert_eq!(fits_one.threads, 1);
    }

    #[test]
    fn small_graph_stays_in_memory() {
        let cfg = TrainConfig::default();
        let p = plan(&cfg, &model(100), 14_541, 237, 2, None).unwrap();
        assert_eq!((p.partitions, p.capacity), (1, 1));
        assert!(p.total() <= cfg.memory, "{p:?}");
    }

    #[test]
    fn large_table_is_partitioned_within_budget() {
        let cfg = TrainConfig {
            memory: 1 << 30,
            ..TrainConfig::default()
        };
        // 10M nodes x 100 dims x 2 x 4 bytes = 8 GB of table.
        let p = plan(&cfg, &model(100), 10_000_000, 10, 2, None).unwrap();
        assert_eq!(p.capacity, 3);
        assert!(p.partitions > 3 && p.total() <= cfg.memory, "{p:?}");
        // Negative banks get their share of the budget (and what the buffer leaves)...
        assert!(
            p.bank_rows > 0 && p.bank_bytes >= cfg.memory / BANK_SHARE / 2,
            "{p:?}"
        );
        // ...and with it reserved, one partition fewer would not fit.
        let fewer = part_bytes(
            10_000_000u64.div_ceil(p.partitions as u64 - 1),
            100,
            OptimizerKind::Adagrad,
            TableDtype::F32,
        );
        let fixed = p.total() - p.buffer_bytes - p.bank_bytes;
        assert!(fixed + cfg.memory / BANK_SHARE + 3 * fewer > cfg.memory);
    }

    #[test]
    fn refuses_what_cannot_fit() {
        let cfg = TrainConfig {
            memory: 64 << 20,
            ..TrainConfig::default()
        };
        let e = plan(&cfg, &model(100), 10_000_000, 10, 2, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory budget 64.0 MiB cannot hold"), "{e}");
        let cfg = TrainConfig {
            memory: 512 << 20,
            partitions: 4,
            ..TrainConfig::default()
        };
        let e = plan(&cfg, &model(100), 10_000_000, 10, 2, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("use more partitions or raise --memory"), "{e}");
    }

    #[test]
    fn a_rank_plans_its_torch_runtime_and_prefetch_slots() {
        // Resident negatives: banks take a share of whatever budget is left, which would
        // hand the tight budget below its slot back.
        let cfg = TrainConfig {
            memory: 1 << 30,
            partitions: 16,
            negative_pool: NegativePool::Resident,
            ..TrainConfig::default()
        };
        let rank = |anon: u64, prefetch| {
            Some(RankNeeds {
                group_anon_bytes: Some(anon),
                prefetch,
            })
        };
        let alone = plan(&cfg, &model(100), 1_000_000, 10, 2, None).unwrap();
        let p = plan(&cfg, &model(100), 1_000_000, 10, 2, rank(300 << 20, true)).unwrap();
        assert_eq!(p.group_bytes, (300 << 20) + CODE_PAGES_BYTES);
        assert_eq!((p.capacity, p.prefetch_slots), (3, PREFETCH_SLOTS));
        assert!(
            p.prefetch_note.is_none() && p.total() <= cfg.memory,
            "{p:?}"
        );
        let lines = p.memory_plan().describe().join("\n");
        assert!(
            lines.contains("torch + gloo") && lines.contains("prefetch slots"),
            "{lines}"
        );
        assert_eq!(alone.group_bytes + alone.prefetch_bytes, 0);
        // Shrinking the budget a quarter slot at a time, the lookahead goes before the buffer
        // does (evaluation also shrinks with the budget, so the step is found, not computed):
        // a budget with room for the buffer but not a slot more plans no lookahead and says so.
        let part = part_bytes(
            1_000_000u64.div_ceil(16),
            100,
            OptimizerKind::Adagrad,
            TableDtype::F32,
        );
        let q = (1..64)
            .map_while(|k| {
                let tight = TrainConfig {
                    memory: p.total() - k * part / 4,
                    ..cfg.clone()
                };
                plan(&tight, &model(100), 1_000_000, 10, 2, rank(300 << 20, true)).ok()
            })
            .find(|q| q.prefetch_slots == 0)
            .expect("a budget that holds the buffer but no prefetch slot");
        assert_eq!(q.capacity, 3, "{q:?}");
        assert!(
            q.prefetch_note.as_deref().unwrap().contains("no lookahead"),
            "{q:?}"
        );
        // A budget below what torch and gloo hold is refused naming the figure.
        let small = TrainConfig {
            memory: 100 << 20,
            ..cfg
        };
        let e = plan(&small, &model(100), 1_000_000, 10, 2, rank(300 << 20, true))
            .unwrap_err()
            .to_string();
        assert!(e.contains("torch and gloo take 396 MiB"), "{e}");
    }
}
