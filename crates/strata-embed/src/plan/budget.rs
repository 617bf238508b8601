//! The memory plan: how a byte budget splits between the partition buffer, edge pieces, the
//! workers' scratch, evaluation and relations, and from that how many partitions the table
//! needs. Everything the process allocates for training is counted here; the plan is printed
//! at start and the run refuses to start when the minimum does not fit.

use serde::Serialize;
use strata_store::budget::{group_bytes, group_takes, physical_memory, MemoryPlan, Planned};
use strata_store::units::fmt_bytes;

use crate::config::{
    Corrupt, NegativePool, OptimizerKind, Protocol, TableDtype, TrainConfig, TrainingMode,
    VsAllCandidates,
};
use crate::error::{EmbedError, Result};
use crate::model::{Dropped, ScoreModel};
use crate::plan::device::{self, DeviceBudget, DevicePlan};
use crate::sizes::{part_bytes, QUERY_BATCH, TILE};
use crate::storage::bank::Banks;
use crate::storage::entity_types::NodeShape;

pub use strata_store::budget::RUNTIME_BYTES;
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
    /// A typed run's pinned region in memory (0: none) and its rows.
    pub pinned_bytes: u64,
    pub pinned_rows: u64,
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
    /// A copy of the resident table that an epoch's end writes to the SSD behind the job
    /// (beside the relations' save and validation), and its bytes: the whole table when the
    /// run asks for it (`write_behind`), the table is resident, the process is alone and the
    /// budget holds it beside the rest; 0 otherwise (the epoch writes its table back before
    /// it ends).
    pub write_behind_bytes: u64,
    /// Spare partition buffers the partition of each next swap is read ahead into (while the
    /// last swap's victim is written behind, with two), and their bytes: two partitions, or
    /// one, when the run asks for them (`swap_spare`), partitions swap, the process is alone
    /// and the budget holds them beside the rest; 0 otherwise (a swap writes, then reads,
    /// through one slot).
    pub swap_spare_bytes: u64,
    /// The training edges kept in memory after their first read ([`EmbedPlan::keep_edges`]),
    /// and their bytes (0: every epoch reads its edges from the SSD).
    pub kept_edge_bytes: u64,
    /// The partitions kept in memory once evicted ([`EmbedPlan::keep_partitions`]), and their
    /// bytes (0: every load reads the SSD).
    pub kept_partition_bytes: u64,
    /// Bytes `--memory` lacks to keep them, where the run asked for it and partitions swap
    /// (0: kept, or not asked for), so the plan can say what would keep them.
    pub kept_partitions_short: u64,
    /// The smallest budget that holds the fixed parts and the buffer's slots with one node
    /// per partition (the configured partitions, when set).
    pub minimum: u64,
    /// A torch device's plan (`None`: the CPU engine).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device: Option<DevicePlan>,
}

impl EmbedPlan {
    /// Refuses a plan that holds more than this machine's memory, naming both
    /// ([`MemoryPlan::check_machine`]).
    pub fn check_machine(&self) -> Result<()> {
        self.memory_plan()
            .check_machine(physical_memory())
            .map_err(EmbedError::Budget)
    }

    /// Total planned bytes.
    pub fn total(&self) -> u64 {
        self.buffer_bytes
            + self.pinned_bytes
            + self.edge_bytes
            + self.worker_bytes
            + self.eval_bytes
            + self.relation_bytes
            + self.bank_bytes
            + self.runtime_bytes
            + self.group_bytes
            + self.prefetch_bytes
            + self.write_behind_bytes
            + self.swap_spare_bytes
            + self.kept_edge_bytes
            + self.kept_partition_bytes
    }

    /// Keeps a run's `edge_rows` training edges (`row_bytes` each, their weight included) in
    /// memory after their first read when `cfg` asks for it (`keep_edges`), the process is
    /// `alone`, the edges take more than the one piece a one-partition run keeps already, and
    /// the budget holds them beside the rest of the plan.
    pub fn keep_edges(
        mut self,
        cfg: &TrainConfig,
        alone: bool,
        edge_rows: u64,
        row_bytes: u64,
    ) -> Self {
        let bytes = edge_rows * row_bytes;
        let one_piece = self.partitions == 1 && edge_rows <= self.piece_rows;
        let left = self.memory.saturating_sub(self.total());
        self.kept_edge_bytes = if cfg.keep_edges && alone && !one_piece && bytes <= left {
            bytes
        } else {
            0
        };
        self
    }

    /// Keeps the partitions outside the buffer's slots in memory once evicted when `cfg` asks
    /// for it (`keep_partitions`), the process is `alone`, partitions swap, and the budget
    /// holds them beside the rest of the plan; the swap spare's bytes count toward them (the
    /// kept partitions' free buffers replace it).
    pub fn keep_partitions(mut self, cfg: &TrainConfig, alone: bool) -> Self {
        let outside = (self.partitions as u64).saturating_sub(self.capacity as u64);
        let bytes = outside * self.part_bytes;
        let left = (self.memory + self.swap_spare_bytes).saturating_sub(self.total());
        if cfg.keep_partitions && alone && !self.in_memory() {
            if bytes <= left {
                self.kept_partition_bytes = bytes;
                self.swap_spare_bytes = 0;
            } else {
                self.kept_partitions_short = bytes - left;
            }
        }
        self
    }

    /// The swap spare's partition buffers (0, 1 or 2).
    pub fn swap_spares(&self) -> u64 {
        self.swap_spare_bytes / self.part_bytes.max(1)
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
        if self.pinned_bytes > 0 {
            plan = plan.part(
                "in-memory entity types",
                self.pinned_bytes,
                format!(
                    "{} rows of unpartitioned and featurized types, resident all epoch",
                    self.pinned_rows
                ),
            );
        }
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
                "write-behind copy",
                self.write_behind_bytes,
                if self.write_behind_bytes > 0 {
                    "the table, written to the SSD while the job validates".to_string()
                } else {
                    "none: each epoch writes its table back before it ends".to_string()
                },
            );
        if !self.in_memory() && self.kept_partition_bytes == 0 {
            plan = plan.part(
                "swap spare",
                self.swap_spare_bytes,
                match self.swap_spares() {
                    0 => "none: each swap writes the evicted partition, then reads the next",
                    1 => "1 partition: the next swap's partition read ahead after the last victim is written behind",
                    _ => "2 partitions: the next swap's partition read ahead while the last victim is written behind",
                },
            );
        }
        if self.kept_edge_bytes > 0 {
            plan = plan.part(
                "edges in memory",
                self.kept_edge_bytes,
                "the training edges, kept after the first epoch's read: later epochs read only partitions",
            );
        }
        if self.kept_partitions_short > 0 {
            plan = plan.part(
                "partitions in memory",
                0,
                format!(
                    "none: --memory {} more would keep the {} partitions outside the slots; every load reads the SSD",
                    fmt_bytes(self.kept_partitions_short),
                    self.partitions as usize - self.capacity
                ),
            );
        } else if self.kept_partition_bytes > 0 {
            plan = plan.part(
                "partitions in memory",
                self.kept_partition_bytes,
                format!(
                    "{} x {} kept once evicted (written back at its last eviction of an epoch): loads come from memory",
                    self.partitions as usize - self.capacity,
                    fmt_bytes(self.part_bytes)
                ),
            );
        }
        plan = plan
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
                self.buffer_bytes + self.pinned_bytes.min(self.table_bytes)
            },
            "SSD",
        )
    }
}

/// Bytes of the relation rows and their optimizer state of `num_relations` relation types
/// (doubled with reciprocal relations), as [`crate::storage::relations::Relations`] holds them.
pub fn relation_bytes(cfg: &TrainConfig, model: &ScoreModel, num_relations: u64) -> u64 {
    let rd = model.rel_dim() as u64;
    let rel_rows = num_relations.max(1) * if cfg.reciprocal { 2 } else { 1 };
    let rel_state = match cfg.optimizer {
        OptimizerKind::Adagrad => rd,
        OptimizerKind::AdagradRow => 1,
    };
    if rd == 0 {
        0
    } else {
        rel_rows * (rd + rel_state) * 4
    }
}

/// Bytes a run opened to answer queries keeps beside its buffer and relations: the query
/// rows, score tiles and heaps of a scan (queries beyond what it holds go in further scans).
pub const QUERY_SCRATCH_BYTES: u64 = 8 << 20;

/// The node table of a run opened to answer queries, for [`plan_queries`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ServedTable {
    pub partitions: u32,
    /// Bytes of one partition region.
    pub part_bytes: u64,
    /// The whole table file (partitions and a typed run's pinned region).
    pub table_bytes: u64,
    /// A typed run's pinned region: its stored rows, and its bytes in memory (rows, entity
    /// view, feature bags; [`NodeShape::pinned_bytes`]); 0 without one.
    pub pinned_rows: u64,
    pub pinned_bytes: u64,
}

/// The plan of a run opened to answer queries (`strata serve`): its relations, a typed run's
/// pinned region (always resident), the query scratch ([`QUERY_SCRATCH_BYTES`]) and as many
/// resident partitions as `memory` holds (`None`: all of them, the whole table resident).
/// Nothing for a runtime, edges, workers or evaluation: the serving process plans its own.
/// Refuses (`Budget`, naming both sizes) a `memory` below one partition, the pinned region,
/// the relations and the scratch.
pub fn plan_queries(
    table: ServedTable,
    relation_bytes: u64,
    memory: Option<u64>,
) -> Result<EmbedPlan> {
    let ServedTable {
        partitions,
        part_bytes,
        pinned_bytes,
        ..
    } = table;
    let fixed = relation_bytes + QUERY_SCRATCH_BYTES + pinned_bytes;
    let minimum = fixed + part_bytes;
    let capacity = match memory {
        None => partitions as usize,
        Some(m) if m < minimum => {
            return Err(EmbedError::Budget(format!(
                "memory {} cannot hold a served run's minimum of {}: one partition of {}, relations {}, query scratch {}{}",
                fmt_bytes(m),
                fmt_bytes(minimum),
                fmt_bytes(part_bytes),
                fmt_bytes(relation_bytes),
                fmt_bytes(QUERY_SCRATCH_BYTES),
                if pinned_bytes > 0 {
                    format!(", in-memory entity types {}", fmt_bytes(pinned_bytes))
                } else {
                    String::new()
                }
            )))
        }
        Some(m) => ((m - fixed) / part_bytes.max(1)).min(partitions as u64) as usize,
    };
    let buffer_bytes = capacity as u64 * part_bytes;
    Ok(EmbedPlan {
        memory: fixed + buffer_bytes,
        partitions,
        capacity,
        part_bytes,
        buffer_bytes,
        table_bytes: table.table_bytes,
        pinned_bytes,
        pinned_rows: table.pinned_rows,
        piece_rows: 0,
        edge_bytes: 0,
        threads: 1,
        cores: 1,
        worker_bytes: 0,
        eval_round: 0,
        eval_bytes: QUERY_SCRATCH_BYTES,
        relation_bytes,
        bank_rows: 0,
        bank_bytes: 0,
        runtime_bytes: 0,
        group_bytes: 0,
        prefetch_slots: 0,
        prefetch_bytes: 0,
        prefetch_note: None,
        write_behind_bytes: 0,
        swap_spare_bytes: 0,
        kept_edge_bytes: 0,
        kept_partition_bytes: 0,
        kept_partitions_short: 0,
        minimum,
        device: None,
    })
}

/// Scratch of one worker for `cfg`'s chunks of `b` edges and `n` negatives (scores, loaded
/// rows, gradients, update keys; self-adversarial weights of one edge's negatives; the
/// chunk's edges and weights split by side for Bernoulli corruption; dropped rows). 1vsAll and
/// KvsAll score against up to every one of `nodes` entities instead of `n` negatives; with
/// negatives per edge a side gathers `b x n` negative rows, and one edge's gradients beside.
fn worker_bytes(model: &ScoreModel, cfg: &TrainConfig, nodes: u64) -> u64 {
    let (b, n) = (cfg.chunk_size as u64, cfg.scored_per_chunk(nodes));
    let (d, neg_rows) = (model.dim as u64, cfg.gathered_per_chunk(nodes));
    let edge_grads = if cfg.shared_negatives {
        0
    } else {
        4 * (3 + n) * d
    };
    // Relation rows and their gradients: `dim` reals or more (`linear`: dim²).
    let rd = (model.rel_dim() as u64).max(d);
    let scores = 4 * b * n * (1 + model.kind.get().extra_score_matrices());
    let adversarial = if cfg.adversarial_temperature.is_some() {
        4 * n
    } else {
        0
    };
    let split = if cfg.corrupt == Corrupt::Bernoulli {
        16 * b
    } else {
        0
    };
    // Dropout: both sides' dropped rows and masks.
    let dropout = if cfg.dropout().active(model.rel_dim()) {
        2 * Dropped::bytes(b, neg_rows, d, model.rel_dim() as u64)
    } else {
        0
    };
    let rows = 8 * (3 * b + neg_rows) * d + 8 * b * rd + edge_grads;
    scores + rows + 16 * (2 * b + neg_rows) + adversarial + split + dropout
}

/// Plans `cfg` with the workers it asks for, or (`threads` 0: one per core) with as many of the
/// cores' workers as the budget holds: each needs its scratch and an evaluation tile, which
/// many cores and a small `--memory` cannot all have (halving down to one; the refusal is then
/// the one-worker plan's).
pub fn plan_fitting(
    cfg: &TrainConfig,
    model: &ScoreModel,
    shape: &NodeShape,
    num_relations: u64,
    rank: Option<RankNeeds>,
    device: Option<&DeviceBudget>,
) -> Result<EmbedPlan> {
    let cores = strata_io::resolve_threads(cfg.threads);
    let mut threads = cores;
    loop {
        match plan(cfg, model, shape, num_relations, threads, rank, device) {
            Err(EmbedError::Budget(_)) if cfg.threads == 0 && threads > 1 => threads /= 2,
            Ok(mut p) => {
                p.cores = cores;
                return Ok(p);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Bytes of the float32 copy a scan makes of one tile of candidate rows (`TILE x dim`) from
/// a bf16 table; 0 for a float32 table, whose rows are scored where they lie.
pub fn widened_tile_bytes(dtype: TableDtype, dim: usize) -> u64 {
    match dtype {
        TableDtype::F32 => 0,
        TableDtype::Bf16 => (TILE * dim * 4) as u64,
    }
}

/// Checks that a budget of `memory` bytes holds this rank's process (torch, gloo and the
/// runtime reserve) and returns the bytes the process takes (0 outside a distributed run).
/// Every rank runs it before the group's first barrier, so each one fails on its own with
/// the budget error rather than waiting on a peer that has already exited.
pub fn check_rank_process(memory: u64, rank: &RankNeeds) -> Result<u64> {
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
    Ok(group_bytes)
}

/// Queries per evaluation round and the bytes of a round of them with each of `threads`
/// workers' score tile, within the budget's evaluation share.
fn evaluation(cfg: &TrainConfig, model: &ScoreModel, threads: usize) -> (usize, u64) {
    let memory = cfg.memory.0;
    let (d, rd) = (model.dim as u64, model.rel_dim() as u64);
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
    let tiles = threads as u64
        * (widened_tile_bytes(cfg.table_dtype, model.dim)
            + 4 * match cfg.eval_protocol {
                Protocol::Filtered => (QUERY_BATCH * TILE) as u64,
                Protocol::Sampled => cfg.chunk_size as u64 * 2 * cfg.eval_negatives as u64,
            });
    let eval_share = (memory / EVAL_SHARE).max(tiles + per_query * QUERY_BATCH as u64);
    let eval_round = ((eval_share - tiles) / per_query).clamp(QUERY_BATCH as u64, 1 << 20) as usize;
    (eval_round, tiles + per_query * eval_round as u64)
}

/// What a device holds beside its partition slots and step scratch.
#[derive(Clone, Copy)]
struct DeviceParts<'a> {
    budget: &'a DeviceBudget,
    relations: u64,
    /// A typed run's pinned region and its feature bags.
    pinned: u64,
    /// An edge piece.
    edges: u64,
}

impl DeviceParts<'_> {
    fn total(&self) -> u64 {
        self.relations + self.pinned + self.edges + self.budget.eval_tile
    }

    /// Refuses a device budget of `dev_memory` below these parts, `step` bytes of step scratch
    /// and the ordering's minimum `slots` of `slot` bytes each (`cut`: how the slots were cut).
    fn check_minimum(
        &self,
        dev_memory: u64,
        step: u64,
        (slots, slot, cut): (usize, u64, &str),
        host_memory: u64,
    ) -> Result<()> {
        let minimum = self.total() + step + slots as u64 * slot;
        if dev_memory >= minimum {
            return Ok(());
        }
        Err(EmbedError::Budget(format!(
            "device_memory {} on {} cannot hold the minimum buffer of {slots} partition slot(s): it needs {} ({slots} x {} with {cut}, relations {}, in-memory entity types {}, edge piece {}, step scratch {}, evaluation {}); memory budget (host) {}",
            fmt_bytes(dev_memory),
            self.budget.device,
            fmt_bytes(minimum),
            fmt_bytes(slot),
            fmt_bytes(self.relations),
            fmt_bytes(self.pinned),
            fmt_bytes(self.edges),
            fmt_bytes(step),
            fmt_bytes(self.budget.eval_tile),
            fmt_bytes(host_memory),
        )))
    }
}

/// Plans `cfg` for a node table of `shape` and `num_relations` relation types with
/// `threads` workers; `rank`: this process is a rank of a distributed run.
/// `cfg.partitions == 0` (and no count fixed by the entity types) picks the fewest
/// partitions that fit (with a rank's prefetch slots when it wants them). With a `device`
/// budget the device holds every slot of the buffer too (Legend's placement), so the slots
/// must fit both budgets: the partitions are the fewest whose slots fit the smaller room, and
/// a device budget below its fixed parts and the ordering's minimum slots is refused naming
/// both budgets.
#[allow(clippy::too_many_arguments)]
pub fn plan(
    cfg: &TrainConfig,
    model: &ScoreModel,
    shape: &NodeShape,
    num_relations: u64,
    threads: usize,
    rank: Option<RankNeeds>,
    device: Option<&DeviceBudget>,
) -> Result<EmbedPlan> {
    let memory = cfg.memory.0;
    let alone = rank.is_none();
    let rank = rank.unwrap_or_default();
    let group_bytes = check_rank_process(memory, &rank)?;
    // Bernoulli corruption's head probabilities: one float per relation.
    let head_prob = match cfg.corrupt {
        Corrupt::Bernoulli => num_relations.max(1) * 4,
        _ => 0,
    };
    let relation_bytes = relation_bytes(cfg, model, num_relations) + head_prob;
    let num_nodes = shape.largest();
    let wanted = shape.partitions.unwrap_or(cfg.partitions);
    if wanted as u64 > num_nodes.max(1) {
        // Not a memory limit: a partition holds at least one node.
        return Err(EmbedError::Config(format!(
            "embed.train.partitions: {wanted} partitions of {num_nodes} nodes would leave some \
             empty; use at most {num_nodes} (0 plans the fewest that fit --memory)"
        )));
    }
    let pinned_bytes = shape.pinned_bytes(model.dim, cfg.optimizer, cfg.table_dtype);
    let piece_rows = (memory / 64 / 12).clamp(cfg.chunk_size as u64, MAX_PIECE_ROWS);
    let edge_bytes = PIECES_ALIVE * piece_rows * 12;
    // 1vsAll against the resident partitions scores the rows of the `c` resident of `n`
    // partitions, so its scratch shrinks as the table is cut finer; every other mode's
    // candidates do not depend on the partitioning.
    let candidates = |n: u64, c: usize| cfg.vs_all_candidates(num_nodes, c as u64 * shape.rows(n));
    let workers = |n: u64, c: usize| threads as u64 * worker_bytes(model, cfg, candidates(n, c));
    let (eval_round, eval_bytes) = evaluation(cfg, model, threads);
    // Everything but the workers, whose scratch may depend on the partitioning.
    let fixed_rest =
        RUNTIME_BYTES + group_bytes + edge_bytes + eval_bytes + relation_bytes + pinned_bytes;
    // The refusal of `what`, with the fixed parts of `n` partitions, `c` resident.
    let refuse = |what: String, n: u64, c: usize| -> EmbedError {
        EmbedError::Budget(format!(
            "memory budget {} cannot hold {what} (fixed needs {}: runtime {}, torch + gloo {}, edges {}, workers {}, evaluation {}, relations {}{}){}",
            fmt_bytes(memory),
            fmt_bytes(fixed_rest + workers(n, c)),
            fmt_bytes(RUNTIME_BYTES),
            fmt_bytes(group_bytes),
            fmt_bytes(edge_bytes),
            fmt_bytes(workers(n, c)),
            fmt_bytes(eval_bytes),
            fmt_bytes(relation_bytes),
            if pinned_bytes > 0 {
                format!(", in-memory entity types {}", fmt_bytes(pinned_bytes))
            } else {
                String::new()
            },
            if cfg.training == TrainingMode::OneVsAll
                && cfg.vsall_candidates == VsAllCandidates::All
            {
                "; each 1vsAll worker scores every entity: vsall_candidates = \"resident\" scores the resident partitions' entities only, and plans its scratch for those"
            } else {
                ""
            }
        ))
    };
    let size = |n: u64| part_bytes(shape.rows(n), model.dim, cfg.optimizer, cfg.table_dtype);
    // The most partitions: one node each, or the count asked for.
    let finest = if wanted == 0 {
        num_nodes.max(1)
    } else {
        wanted as u64
    };
    let fewest_rows = size(finest);
    let step = |n: u64, c: usize| device::step_bytes(model, cfg, candidates(n, c));
    let device_parts = device.map(|budget| DeviceParts {
        budget,
        relations: relation_bytes,
        pinned: shape.device_pinned_bytes(model.dim, cfg.optimizer),
        edges: device::edge_bytes(piece_rows),
    });
    if let Some(parts) = device_parts {
        if let Some(dev_memory) = parts.budget.memory {
            let slots = if wanted == 0 {
                cfg.buffer.max(1)
            } else {
                cfg.buffer.min(wanted as usize).max(1)
            };
            let cut = if wanted == 0 {
                "one node per partition".to_string()
            } else {
                format!("{wanted} partitions")
            };
            let minimum = (slots, fewest_rows, cut.as_str());
            parts.check_minimum(dev_memory, step(finest, slots), minimum, memory)?;
        }
    }
    // The slots' room with `n` partitions, `c` resident: what the host budget leaves, and
    // what the device's leaves. Non-decreasing in `n`, as the workers' scratch only shrinks.
    let room = |n: u64, c: usize| {
        let host = memory.saturating_sub(fixed_rest + workers(n, c));
        match device_parts {
            Some(parts) => parts.budget.memory.map_or(host, |dev_memory| {
                host.min(dev_memory.saturating_sub(parts.total() + step(n, c)))
            }),
            None => host,
        }
    };
    // (partitions, buffer slots) whose slots and `extra` more fit the room less `reserve`.
    let solve = |reserve: u64, extra: usize| -> Result<(u64, usize)> {
        let available = |n: u64, c: usize| room(n, c).saturating_sub(reserve);
        let (n, c) = if wanted == 0 {
            if size(1) <= available(1, 1) {
                return Ok((1, 1));
            }
            let c = cfg.buffer.max(1);
            let slots = (c + extra) as u64;
            // The smallest n whose slots fit: slots * size(n) is non-increasing in n, the
            // room non-decreasing.
            let fits = |n: u64| slots * size(n) <= available(n, c);
            let (mut lo, mut hi) = (c as u64 + 1, num_nodes.max(c as u64 + 1));
            if !fits(hi) {
                return Err(refuse(
                    format!(
                        "{c} partition slots even with one node per partition; the table of {num_nodes} nodes needs {} — raise --memory",
                        fmt_bytes(size(1))
                    ),
                    hi,
                    c,
                ));
            }
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if fits(mid) {
                    hi = mid;
                } else {
                    lo = mid + 1;
                }
            }
            (lo, c)
        } else {
            let n = wanted as u64;
            let c = cfg.buffer.min(wanted as usize).max(1);
            let slots = (c + extra.min(wanted as usize - c)) as u64;
            if slots * size(n) > available(n, c) {
                return Err(refuse(
                    format!(
                        "{c} slot(s) of {} for {n} partition(s) (needs {}; use more partitions or raise --memory to at least {})",
                        fmt_bytes(size(n)),
                        fmt_bytes(c as u64 * size(n)),
                        fmt_bytes(memory - available(n, c) + c as u64 * size(n))
                    ),
                    n,
                    c,
                ));
            }
            (n, c)
        };
        if n > u32::MAX as u64 || n > num_nodes.max(1) {
            return Err(refuse(
                format!("{n} partitions of a graph of {num_nodes} nodes"),
                n,
                c,
            ));
        }
        Ok((n, c))
    };
    // A rank's lookahead: as many of the slots it wants as fit, fewest partitions first.
    let want = if rank.prefetch { PREFETCH_SLOTS } else { 0 };
    let (mut partitions, mut capacity, mut prefetch_slots) = match (1..=want)
        .rev()
        .find_map(|x| solve(0, x).ok().map(|(n, c)| (n, c, x)))
    {
        Some(found) => found,
        None => {
            let (n, c) = solve(0, 0)?;
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
    // the buffer leaves when that share would not fit. 1vsAll and KvsAll sample no negatives.
    let mut bank_rows = 0usize;
    if !cfg.scores_all() && cfg.negative_pool == NegativePool::All && partitions > capacity as u64 {
        let share = memory / BANK_SHARE;
        // What the slots leave of the room less `reserve`.
        let leftover = |n: u64, c: usize, reserve: u64| {
            room(n, c)
                .saturating_sub(reserve)
                .saturating_sub((c + prefetch_slots) as u64 * size(n))
        };
        let (n, c, bank_room) = match solve(share, prefetch_slots) {
            Ok((n, c)) => (n, c, share + leftover(n, c, share)),
            Err(_) => (partitions, capacity, leftover(partitions, capacity, 0)),
        };
        (partitions, capacity) = (n, c);
        // A typed run's banks round each entity type's share up: a row per type at most.
        let one = |segs| Banks::bytes(n as u32, 1, model.dim, segs);
        let bank_room = bank_room.saturating_sub(one(shape.segments()) - one(1));
        bank_rows = (cfg.bank_rows as u64)
            .min(shape.rows(n))
            .min(bank_room / one(1).max(1)) as usize;
    }
    let bank_bytes = if bank_rows > 0 {
        Banks::bytes(partitions as u32, bank_rows, model.dim, shape.segments())
    } else {
        0
    };
    let part_bytes = size(partitions);
    let worker_bytes = workers(partitions, capacity);
    let fixed = fixed_rest + worker_bytes;
    let minimum = fixed_rest + workers(finest, capacity) + capacity as u64 * fewest_rows;
    let device = device_parts.map(|parts| {
        let slots = capacity + prefetch_slots;
        let step_bytes = step(partitions, capacity);
        DevicePlan {
            device: parts.budget.device.clone(),
            memory: parts
                .budget
                .memory
                .unwrap_or(parts.total() + step_bytes + slots as u64 * part_bytes),
            auto: parts.budget.auto.clone(),
            slots,
            part_bytes,
            relation_bytes,
            pinned_bytes: parts.pinned,
            edge_bytes: parts.edges,
            step_bytes,
            eval_bytes: parts.budget.eval_tile,
            minimum: parts.total() + step(finest, capacity) + capacity as u64 * fewest_rows,
            bounded: parts.budget.memory.is_some(),
        }
    });
    let table_bytes = partitions * part_bytes
        + if shape.pinned_rows > 0 {
            self::part_bytes(shape.pinned_rows, model.dim, cfg.optimizer, cfg.table_dtype)
        } else {
            0
        };
    let buffer_bytes = capacity as u64 * part_bytes;
    // What the host budget leaves once everything else is planned: a resident table's
    // write-behind copy, or an out-of-core run's swap spare, where one is wanted and fits.
    let left = memory
        .saturating_sub(fixed + buffer_bytes + bank_bytes + prefetch_slots as u64 * part_bytes);
    let resident = partitions <= capacity as u64;
    let spare = |wanted: bool, bytes: u64| (wanted && alone && bytes <= left).then_some(bytes);
    let write_behind_bytes = spare(cfg.write_behind && resident, table_bytes).unwrap_or(0);
    // Two spares when they fit (the next partition read ahead while the last victim is
    // written behind), else one (read ahead once it is written).
    let swap_spare_bytes = spare(cfg.swap_spare && !resident, 2 * part_bytes)
        .or_else(|| spare(cfg.swap_spare && !resident, part_bytes))
        .unwrap_or(0);
    Ok(EmbedPlan {
        memory,
        partitions: partitions as u32,
        capacity,
        part_bytes,
        buffer_bytes,
        table_bytes,
        pinned_bytes,
        pinned_rows: shape.pinned_rows,
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
        write_behind_bytes,
        swap_spare_bytes,
        kept_edge_bytes: 0,
        kept_partition_bytes: 0,
        kept_partitions_short: 0,
        minimum,
        device,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{PbgForm, ScoreKind};
    use strata_store::budget::CODE_PAGES_BYTES;
    use strata_store::config::Size;

    fn untyped(nodes: u64) -> NodeShape {
        NodeShape::untyped(nodes)
    }

    #[test]
    fn a_typed_table_plans_its_in_memory_types_and_fixed_partitions() {
        // Users and items partitioned into 8 (entity_partitions), 1000 categories and 5000
        // featurized documents over 20,000 words held in memory all epoch.
        let shape = NodeShape {
            partitioned: vec![8_000_000, 1_000_000],
            partitions: Some(8),
            pinned_rows: 1_000 + 20_000,
            featurized_entities: 5_000,
            bag_bytes: 5_001 * 8 + 50_000 * 4,
        };
        let cfg = TrainConfig {
            memory: Size(4 << 30),
            negative_pool: NegativePool::Resident,
            ..TrainConfig::default()
        };
        let p = plan(&cfg, &model(100), &shape, 10, 2, None, None).unwrap();
        assert_eq!(p.partitions, 8);
        assert_eq!(
            p.part_bytes,
            part_bytes(
                1_000_000 + 125_000,
                100,
                OptimizerKind::Adagrad,
                TableDtype::F32
            )
        );
        let pinned = part_bytes(21_000, 100, OptimizerKind::Adagrad, TableDtype::F32)
            + 5_000 * 400
            + shape.bag_bytes;
        assert_eq!((p.pinned_bytes, p.pinned_rows), (pinned, 21_000));
        assert!(
            p.total() <= cfg.memory.0 && p.total() >= p.buffer_bytes + pinned,
            "{p:?}"
        );
        let lines = p.memory_plan().describe().join("\n");
        assert!(lines.contains("in-memory entity types"), "{lines}");
        // The untyped shape of the same nodes plans no pinned part.
        let flat = plan(&cfg, &model(100), &untyped(9_026_000), 10, 2, None, None).unwrap();
        assert_eq!(flat.pinned_bytes, 0);
    }

    fn model(dim: usize) -> ScoreModel {
        ScoreModel {
            kind: ScoreKind::ComplEx,
            dim,
            transe_norm: 2,
            pbg: PbgForm::default(),
        }
    }

    /// A served table of 6 partitions of `part` bytes and a pinned region of `pinned` bytes.
    fn served(part: u64, pinned: u64) -> ServedTable {
        ServedTable {
            partitions: 6,
            part_bytes: part,
            table_bytes: 6 * part + pinned,
            pinned_rows: pinned / 64,
            pinned_bytes: pinned,
        }
    }

    #[test]
    fn a_served_run_holds_the_partitions_its_memory_holds() {
        let part = 12 << 10;
        let all = plan_queries(served(part, 0), 2048, None).unwrap();
        assert_eq!((all.capacity, all.buffer_bytes), (6, 6 * part));
        assert_eq!(all.memory, 6 * part + 2048 + QUERY_SCRATCH_BYTES);
        assert!(all.in_memory() && all.total() == all.memory);
        let two = plan_queries(
            served(part, 0),
            2048,
            Some(2048 + QUERY_SCRATCH_BYTES + 2 * part + 100),
        )
        .unwrap();
        assert_eq!(
            (two.capacity, two.memory),
            (2, 2048 + QUERY_SCRATCH_BYTES + 2 * part)
        );
        assert_eq!(two.minimum, 2048 + QUERY_SCRATCH_BYTES + part);
        // More than the table: all of it, and no more bytes than it needs.
        let big = plan_queries(served(part, 0), 2048, Some(1 << 40)).unwrap();
        assert_eq!((big.capacity, big.memory), (6, all.memory));
        let e = plan_queries(served(part, 0), 2048, Some(QUERY_SCRATCH_BYTES))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("cannot hold a served run's minimum")
                && e.contains("one partition of 12.0 KiB"),
            "{e}"
        );
    }

    #[test]
    fn a_served_typed_run_holds_its_pinned_region_beside_the_partitions() {
        let (part, pinned) = (12 << 10, 40 << 10);
        let fixed = 2048 + QUERY_SCRATCH_BYTES + pinned;
        let all = plan_queries(served(part, pinned), 2048, None).unwrap();
        assert_eq!(all.memory, fixed + 6 * part);
        assert_eq!(
            (all.pinned_bytes, all.table_bytes),
            (pinned, 6 * part + pinned)
        );
        assert!(all.total() == all.memory);
        // The pinned region comes first: what is left holds two partitions.
        let two = plan_queries(served(part, pinned), 2048, Some(fixed + 2 * part + 100)).unwrap();
        assert_eq!((two.capacity, two.minimum), (2, fixed + part));
        let e = plan_queries(served(part, pinned), 2048, Some(fixed))
            .unwrap_err()
            .to_string();
        assert!(e.contains("in-memory entity types 40.0 KiB"), "{e}");
    }

    #[test]
    fn one_worker_per_core_shrinks_to_what_the_budget_holds() {
        // The make demo setting that a 16-core machine refused: 100k nodes in 128 MiB, where
        // each worker's evaluation tile alone is 8 MiB.
        let one = TrainConfig {
            memory: Size(128 << 20),
            threads: 1,
            ..TrainConfig::default()
        };
        let fits_one = plan(&one, &model(100), &untyped(100_000), 40, 1, None, None).unwrap();
        let many = plan(&one, &model(100), &untyped(100_000), 40, 64, None, None);
        assert!(
            matches!(many, Err(EmbedError::Budget(_))),
            "64 workers must not fit"
        );
        let auto = TrainConfig {
            threads: 0,
            ..one.clone()
        };
        let p = plan_fitting(&auto, &model(100), &untyped(100_000), 40, None, None).unwrap();
        assert_eq!(p.cores, strata_io::resolve_threads(0));
        assert!(
            p.threads >= 1 && p.threads <= p.cores && p.total() <= auto.memory.0,
            "{p:?}"
        );
        if p.threads < p.cores {
            let line = p.memory_plan().describe().join("\n");
            assert!(line.contains("cores: --memory holds no more"), "{line}");
        }
        // Asked for explicitly, 64 workers are refused rather than shrunk.
        let explicit = TrainConfig { threads: 64, ..one };
        assert!(matches!(
            plan_fitting(&explicit, &model(100), &untyped(100_000), 40, None, None),
            Err(EmbedError::Budget(_))
        ));
        assert_eq!(fits_one.threads, 1);
    }

    #[test]
    fn a_resident_table_is_copied_for_its_write_behind_when_the_budget_holds_it() {
        let (m, nodes) = (model(100), untyped(100_000));
        let cfg = device_cfg();
        let alone = plan(&cfg, &m, &nodes, 10, 1, None, None).unwrap();
        assert_eq!(alone.partitions, 1);
        assert_eq!(alone.write_behind_bytes, alone.table_bytes);
        assert!(alone.total() <= cfg.memory.0, "{alone:?}");
        let line = alone.memory_plan().describe().join("\n");
        assert!(
            line.contains("written to the SSD while the job validates"),
            "{line}"
        );
        // The smallest budget (to an eighth of the table) that holds one partition has no
        // room for a second table: none.
        let p = (1..)
            .map(|i| TrainConfig {
                memory: Size(RUNTIME_BYTES + i * alone.table_bytes / 8),
                partitions: 1,
                ..cfg.clone()
            })
            .find_map(|tight| plan(&tight, &m, &nodes, 10, 1, None, None).ok())
            .unwrap();
        assert_eq!((p.partitions, p.write_behind_bytes), (1, 0), "{p:?}");
        let line = p.memory_plan().describe().join("\n");
        assert!(line.contains("each epoch writes its table back"), "{line}");
        // Partitions on disk, or a rank of a group (whose epochs write their own parts back).
        let parts = TrainConfig {
            partitions: 4,
            buffer: 2,
            ..cfg.clone()
        };
        let p = plan(&parts, &m, &nodes, 10, 1, None, None).unwrap();
        assert_eq!((p.partitions, p.write_behind_bytes), (4, 0));
        let rank = plan(&cfg, &m, &nodes, 10, 1, Some(RankNeeds::default()), None).unwrap();
        assert_eq!(rank.write_behind_bytes, 0);
    }

    /// 100,000 nodes of 100 dims in 4 partitions with a buffer of 2 (swaps), in
    /// [`device_cfg`]'s budget, and its plan.
    fn swapping_plan() -> (TrainConfig, EmbedPlan) {
        let parts = TrainConfig {
            partitions: 4,
            buffer: 2,
            ..device_cfg()
        };
        let p = plan(&parts, &model(100), &untyped(100_000), 10, 1, None, None).unwrap();
        (parts, p)
    }

    #[test]
    fn training_edges_stay_in_memory_only_where_the_plan_leaves_room_for_them() {
        let (m, nodes) = (model(100), untyped(100_000));
        let (parts, p) = swapping_plan();
        let left = parts.memory.0 - p.total();
        // Room for them: kept, within the budget, and the plan says so.
        let rows = left / 16;
        let kept = p.clone().keep_edges(&parts, true, rows, 16);
        assert_eq!(kept.kept_edge_bytes, rows * 16);
        assert!(kept.total() <= parts.memory.0, "{kept:?}");
        let line = kept.memory_plan().describe().join("\n");
        assert!(line.contains("later epochs read only partitions"), "{line}");
        // One row more than the room, asked not to, or a rank of a group: none.
        let over = left / 12 + 1;
        assert_eq!(
            p.clone().keep_edges(&parts, true, over, 12).kept_edge_bytes,
            0
        );
        let off = TrainConfig {
            keep_edges: false,
            ..parts.clone()
        };
        assert_eq!(
            p.clone().keep_edges(&off, true, rows, 16).kept_edge_bytes,
            0
        );
        assert_eq!(
            p.clone()
                .keep_edges(&parts, false, rows, 16)
                .kept_edge_bytes,
            0
        );
        let line = p.memory_plan().describe().join("\n");
        assert!(!line.contains("edges in memory"), "{line}");
        // One partition whose edges come as one piece keeps that piece already; more than a
        // piece are kept.
        let one = plan(&device_cfg(), &m, &nodes, 10, 1, None, None).unwrap();
        assert_eq!(one.partitions, 1);
        let piece = one.piece_rows;
        assert_eq!(
            one.clone()
                .keep_edges(&device_cfg(), true, piece, 12)
                .kept_edge_bytes,
            0
        );
        let more = one.keep_edges(&device_cfg(), true, piece + 1, 12);
        assert_eq!(more.kept_edge_bytes, (piece + 1) * 12);
    }

    #[test]
    fn partitions_stay_in_memory_only_where_the_plan_leaves_room_for_them() {
        let (m, nodes) = (model(100), untyped(100_000));
        let (parts, p) = swapping_plan();
        let outside = 2 * p.part_bytes;
        // Room for the two partitions outside the slots: kept, in place of the swap spare,
        // within the budget, and the plan says so.
        let kept = p.clone().keep_partitions(&parts, true);
        assert_eq!(
            (kept.kept_partition_bytes, kept.swap_spare_bytes),
            (outside, 0)
        );
        assert!(kept.total() <= parts.memory.0, "{kept:?}");
        let line = kept.memory_plan().describe().join("\n");
        assert!(
            line.contains("2 x") && line.contains("loads come from memory"),
            "{line}"
        );
        assert!(!line.contains("swap spare"), "{line}");
        // The spare's bytes count toward them: a budget that holds the spare and one
        // partition more keeps them, one byte less does not (and keeps its spare).
        let exact = p.total() + outside - p.swap_spare_bytes;
        let with = |memory: u64| {
            EmbedPlan {
                memory,
                ..p.clone()
            }
            .keep_partitions(&parts, true)
        };
        assert_eq!(with(exact).kept_partition_bytes, outside);
        let short = with(exact - 1);
        assert_eq!(
            (short.kept_partition_bytes, short.swap_spare_bytes),
            (0, p.swap_spare_bytes)
        );
        // The plan says what --memory lacks to keep them.
        assert_eq!(short.kept_partitions_short, 1);
        let line = short.memory_plan().describe().join("\n");
        assert!(
            line.contains("none: --memory 1 B more would keep the 2 partitions"),
            "{line}"
        );
        // Asked not to, a rank of a group, or a resident table: none.
        let off = TrainConfig {
            keep_partitions: false,
            ..parts.clone()
        };
        assert_eq!(
            p.clone().keep_partitions(&off, true).kept_partition_bytes,
            0
        );
        assert_eq!(
            p.clone()
                .keep_partitions(&parts, false)
                .kept_partition_bytes,
            0
        );
        let resident = plan(&device_cfg(), &m, &nodes, 10, 1, None, None).unwrap();
        assert_eq!(
            resident
                .keep_partitions(&device_cfg(), true)
                .kept_partition_bytes,
            0
        );
    }

    #[test]
    fn partitions_that_swap_get_a_spare_buffer_when_the_budget_holds_it() {
        let (m, nodes) = (model(100), untyped(100_000));
        let (parts, p) = swapping_plan();
        assert_eq!(p.swap_spare_bytes, 2 * p.part_bytes, "{p:?}");
        assert!(p.total() <= parts.memory.0);
        let line = p.memory_plan().describe().join("\n");
        assert!(
            line.contains("2 partitions: the next swap's partition read ahead while the last victim is written behind"),
            "{line}"
        );
        // Room for one spare only (a smaller budget, to an eighth of a partition): one, read
        // into once the last victim is written.
        let one = (1..)
            .map(|i| TrainConfig {
                memory: Size(p.total() - i * p.part_bytes / 8),
                ..parts.clone()
            })
            .map(|smaller| plan(&smaller, &m, &nodes, 10, 1, None, None).unwrap())
            .find(|q| q.swap_spare_bytes < 2 * p.part_bytes)
            .unwrap();
        assert_eq!(
            (one.partitions, one.swap_spare_bytes),
            (4, p.part_bytes),
            "{one:?}"
        );
        let line = one.memory_plan().describe().join("\n");
        assert!(
            line.contains("1 partition: the next swap's partition read ahead after"),
            "{line}"
        );
        // Asked not to, a resident table, a rank of a group, and a budget the buffer fills:
        // none.
        let off = TrainConfig {
            swap_spare: false,
            ..parts.clone()
        };
        assert_eq!(
            plan(&off, &m, &nodes, 10, 1, None, None)
                .unwrap()
                .swap_spare_bytes,
            0
        );
        let resident = plan(&device_cfg(), &m, &nodes, 10, 1, None, None).unwrap();
        assert_eq!((resident.partitions, resident.swap_spare_bytes), (1, 0));
        assert!(!resident
            .memory_plan()
            .describe()
            .join("\n")
            .contains("swap spare"));
        let rank = plan(&parts, &m, &nodes, 10, 1, Some(RankNeeds::default()), None).unwrap();
        assert_eq!(rank.swap_spare_bytes, 0);
        // The smallest budget (to an eighth of a partition) that holds the buffer.
        let t = (1..)
            .map(|i| TrainConfig {
                memory: Size(RUNTIME_BYTES + i * p.part_bytes / 8),
                ..parts.clone()
            })
            .find_map(|tight| plan(&tight, &m, &nodes, 10, 1, None, None).ok())
            .unwrap();
        assert_eq!((t.partitions, t.swap_spare_bytes), (4, 0), "{t:?}");
        let line = t.memory_plan().describe().join("\n");
        assert!(
            line.contains("each swap writes the evicted partition, then reads the next"),
            "{line}"
        );
    }

    /// A run of 1 GiB on the host drawing negatives from the resident partitions (Legend's),
    /// without evaluation.
    fn device_cfg() -> TrainConfig {
        TrainConfig {
            memory: Size(1 << 30),
            negative_pool: NegativePool::Resident,
            eval_every: 0,
            ..TrainConfig::default()
        }
    }

    /// A device budget of `memory` bytes (`None`: the CPU twin's `auto`) without evaluation.
    fn on_device(memory: Option<u64>) -> DeviceBudget {
        DeviceBudget {
            device: "torch-cpu".into(),
            memory,
            auto: None,
            eval_tile: 0,
        }
    }

    #[test]
    fn a_device_plans_1vsall_step_scratch_for_the_resident_partitions_only() {
        let cfg = TrainConfig {
            memory: Size(4 << 30),
            chunk_size: 10,
            training: TrainingMode::OneVsAll,
            vsall_candidates: VsAllCandidates::Resident,
            eval_every: 0,
            ..TrainConfig::default()
        };
        let (m, nodes) = (model(32), untyped(1_000_000));
        // Half the step scratch of a chunk against every entity: the host holds the table,
        // the device only a finer cut of it.
        let budget = device::step_bytes(&m, &cfg, 1_000_000) / 2;
        let on = on_device(Some(budget));
        let p = plan(&cfg, &m, &nodes, 10, 1, None, Some(&on)).unwrap();
        let d = p.device.as_ref().unwrap();
        assert!(p.partitions as usize > p.capacity, "{p:?}");
        let scored = p.capacity as u64 * nodes.rows(p.partitions as u64);
        assert_eq!(d.step_bytes, device::step_bytes(&m, &cfg, scored));
        assert!(d.fixed() + d.slots as u64 * p.part_bytes <= budget, "{d:?}");
    }

    #[test]
    fn a_device_budget_below_the_table_partitions_it_as_its_slots_need() {
        let cfg = device_cfg();
        let (m, nodes) = (model(100), untyped(100_000));
        let host = plan(&cfg, &m, &nodes, 10, 1, None, None).unwrap();
        assert_eq!((host.partitions, host.capacity), (1, 1), "{host:?}");
        // The CPU twin's auto: the host buffer's slots, mirrored on the device.
        let twin = plan(&cfg, &m, &nodes, 10, 1, None, Some(&on_device(None))).unwrap();
        let d = twin.device.as_ref().unwrap();
        assert_eq!((twin.partitions, d.slots), (1, 1));
        assert_eq!(d.memory, d.fixed() + host.part_bytes);
        // A device budget of about a quarter of the table: three slots of the fewest
        // partitions that fit it, and one partition fewer would not fit.
        let table = host.part_bytes;
        let fixed = relation_bytes(&cfg, &m, 10)
            + device::edge_bytes(host.piece_rows)
            + device::step_bytes(&m, &cfg, 100_000);
        let budget = fixed + table / 4;
        let p = plan(
            &cfg,
            &m,
            &nodes,
            10,
            1,
            None,
            Some(&on_device(Some(budget))),
        )
        .unwrap();
        let d = p.device.as_ref().unwrap();
        assert_eq!((p.capacity, d.slots), (3, 3));
        assert!(p.partitions >= 12, "{p:?}");
        assert_eq!(d.fixed(), fixed);
        assert!(d.fixed() + 3 * p.part_bytes <= budget);
        let fewer = part_bytes(
            100_000u64.div_ceil(p.partitions as u64 - 1),
            100,
            OptimizerKind::Adagrad,
            TableDtype::F32,
        );
        assert!(fixed + 3 * fewer > budget);
        let lines = d.memory_plan().describe().join("\n");
        assert!(
            lines.contains("embed device torch-cpu budget") && lines.contains("partition slots"),
            "{lines}"
        );
        // The host plan holds the same slots (they are the device's staging).
        assert_eq!(p.buffer_bytes, 3 * p.part_bytes);
    }

    #[test]
    fn a_typed_runs_pinned_region_is_a_device_slot_of_its_own_size() {
        let cfg = device_cfg();
        let m = model(100);
        // 80,000 partitioned nodes; 30,000 pinned rows, 1,000 of them features of 5,000
        // featurized entities whose bags take 60,000 bytes.
        let shape = NodeShape {
            pinned_rows: 30_000,
            featurized_entities: 5_000,
            bag_bytes: 60_000,
            ..untyped(80_000)
        };
        let pinned = part_bytes(30_000, 100, OptimizerKind::Adagrad, TableDtype::F32) + 120_000;
        let twin = plan(&cfg, &m, &shape, 10, 1, None, Some(&on_device(None))).unwrap();
        let d = twin.device.as_ref().unwrap();
        assert_eq!(d.pinned_bytes, pinned);
        let untyped_twin = plan(
            &cfg,
            &m,
            &untyped(80_000),
            10,
            1,
            None,
            Some(&on_device(None)),
        );
        assert_eq!(
            d.fixed(),
            untyped_twin.unwrap().device.unwrap().fixed() + pinned
        );
        let lines = d.memory_plan().describe().join("\n");
        assert!(lines.contains("in-memory entity types"), "{lines}");
        // A budget that holds the whole table in one slot, but not the pinned slot beside it:
        // the plan partitions the table.
        assert_eq!((twin.partitions, d.slots), (1, 1));
        let small = on_device(Some(d.fixed() - pinned + d.part_bytes));
        let p = plan(&cfg, &m, &shape, 10, 1, None, Some(&small)).unwrap();
        let d = p.device.as_ref().unwrap();
        assert!(p.partitions > 1 && d.planned() <= d.memory, "{p:?}");
    }

    #[test]
    fn a_device_budget_below_its_minimum_is_refused_naming_both_budgets() {
        let cfg = device_cfg();
        let m = model(100);
        let small = on_device(Some(device::step_bytes(&m, &cfg, 100_000)));
        let e = plan(&cfg, &m, &untyped(100_000), 10, 1, None, Some(&small))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("device_memory")
                && e.contains("minimum buffer of 3 partition slot(s)")
                && e.contains("memory budget (host) 1.00 GiB"),
            "{e}"
        );
    }

    #[test]
    fn the_device_step_scratch_follows_the_chunk_shapes() {
        let cfg = TrainConfig {
            chunk_size: 10,
            negatives: 20,
            ..TrainConfig::default()
        };
        let dot = ScoreModel {
            kind: ScoreKind::Dot,
            dim: 4,
            transe_norm: 2,
            pbg: PbgForm::default(),
        };
        // Both sides: 2 x (2 x 10 + 20) = 80 uses; keys 24 x 80; leaf and Adagrad 24 x 80 x 4;
        // rows 2 x 8 x (50 x 4); six 10 x 20 matrices a side.
        let expect = 24 * 80 + 24 * 80 * 4 + 2 * 8 * 50 * 4 + 2 * 6 * 4 * 200;
        assert_eq!(device::step_bytes(&dot, &cfg, 0), expect);
        // RotatE scores pair by pair: its matrices are b x n x dim.
        let rotate = ScoreModel {
            kind: ScoreKind::RotatE,
            ..dot
        };
        assert!(device::step_bytes(&rotate, &cfg, 0) > 2 * 6 * 4 * 200 * 4);
        // Negatives per edge: 200 negative rows a side (2 x (20 + 200) = 440 uses), the score
        // matrices still 10 x 20.
        let per_edge = TrainConfig {
            shared_negatives: false,
            ..cfg.clone()
        };
        let expect = 24 * 440 + 24 * 440 * 4 + 2 * 8 * 230 * 4 + 2 * 6 * 4 * 200;
        assert_eq!(device::step_bytes(&dot, &per_edge, 0), expect);
        // 1vsAll scores against every one of the table's 30 entities instead of 20 negatives.
        let all = TrainConfig {
            training: TrainingMode::OneVsAll,
            ..cfg
        };
        let expect = 24 * 100 + 24 * 100 * 4 + 2 * 8 * 60 * 4 + 2 * 6 * 4 * 300;
        assert_eq!(device::step_bytes(&dot, &all, 30), expect);
    }

    #[test]
    fn negatives_per_edge_count_every_edge_s_rows_in_the_worker_scratch() {
        let shared = TrainConfig {
            chunk_size: 10,
            negatives: 20,
            ..TrainConfig::default()
        };
        let per_edge = TrainConfig {
            shared_negatives: false,
            ..shared.clone()
        };
        let m = model(4);
        // 200 negative rows a side instead of 20: 180 more rows of 4 reals (8 bytes each, row
        // and gradient) and keys (16 bytes), and one edge's gradients (3 + 20 rows).
        let more = 180 * 4 * 8 + 180 * 16 + 4 * 23 * 4;
        assert_eq!(
            worker_bytes(&m, &per_edge, 0),
            worker_bytes(&m, &shared, 0) + more
        );
    }

    #[test]
    fn small_graph_stays_in_memory() {
        let cfg = TrainConfig::default();
        let p = plan(&cfg, &model(100), &untyped(14_541), 237, 2, None, None).unwrap();
        assert_eq!((p.partitions, p.capacity), (1, 1));
        assert!(p.total() <= cfg.memory.0, "{p:?}");
    }

    #[test]
    fn large_table_is_partitioned_within_budget() {
        let cfg = TrainConfig {
            memory: Size(1 << 30),
            ..TrainConfig::default()
        };
        // 10M nodes x 100 dims x 2 x 4 bytes = 8 GB of table.
        let p = plan(&cfg, &model(100), &untyped(10_000_000), 10, 2, None, None).unwrap();
        assert_eq!(p.capacity, 3);
        assert!(p.partitions > 3 && p.total() <= cfg.memory.0, "{p:?}");
        // Negative banks get their share of the budget (and what the buffer leaves)...
        assert!(
            p.bank_rows > 0 && p.bank_bytes >= cfg.memory.0 / BANK_SHARE / 2,
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
        assert!(fixed + cfg.memory.0 / BANK_SHARE + 3 * fewer > cfg.memory.0);
    }

    #[test]
    fn one_vs_all_out_of_core_plans_no_negative_banks() {
        // 8 partitions, 3 resident: negative sampling's `all` pool banks the other 5.
        let sampled = TrainConfig {
            partitions: 8,
            chunk_size: 10,
            ..TrainConfig::default()
        };
        let resident = TrainConfig {
            training: TrainingMode::OneVsAll,
            vsall_candidates: VsAllCandidates::Resident,
            ..sampled.clone()
        };
        let nodes = untyped(100_000);
        let banked = plan(&sampled, &model(32), &nodes, 10, 2, None, None).unwrap();
        assert!(banked.bank_rows > 0 && banked.bank_bytes > 0, "{banked:?}");
        let p = plan(&resident, &model(32), &nodes, 10, 2, None, None).unwrap();
        assert_eq!((p.partitions, p.capacity), (8, 3), "{p:?}");
        assert_eq!((p.bank_rows, p.bank_bytes), (0, 0), "{p:?}");
    }

    #[test]
    fn one_vs_all_against_the_resident_partitions_plans_their_rows_only() {
        // 1M nodes x 32 reals: the table with its Adagrad state is 244 MiB, the scratch of a
        // chunk of 10 edges against every entity 298 MiB.
        let all = TrainConfig {
            memory: Size(256 << 20),
            chunk_size: 10,
            training: TrainingMode::OneVsAll,
            ..TrainConfig::default()
        };
        let resident = TrainConfig {
            vsall_candidates: VsAllCandidates::Resident,
            ..all.clone()
        };
        let (m, nodes) = (model(32), untyped(1_000_000));
        let whole = worker_bytes(&m, &all, 1_000_000);
        assert!(whole > all.memory.0, "{whole}");
        let refused = plan(&all, &m, &nodes, 10, 1, None, None)
            .unwrap_err()
            .to_string();
        let workers = format!("workers {}", fmt_bytes(whole));
        assert!(refused.contains(&workers), "{refused}");
        assert!(
            refused.contains("vsall_candidates = \"resident\""),
            "{refused}"
        );
        // Against the resident partitions a worker scores c x rows(n) of them: the plan cuts
        // the table finer until the slots and that scratch fit together.
        let p = plan(&resident, &m, &nodes, 10, 1, None, None).unwrap();
        let scored = p.capacity as u64 * nodes.rows(p.partitions as u64);
        assert!(p.partitions as usize > p.capacity, "{p:?}");
        assert_eq!(p.worker_bytes, worker_bytes(&m, &resident, scored));
        assert!(p.total() <= resident.memory.0, "{p:?}");
        // ...and no coarser cut fits.
        let n = p.partitions as u64 - 1;
        let coarser = worker_bytes(&m, &resident, p.capacity as u64 * nodes.rows(n));
        let rest = p.total() - p.buffer_bytes - p.worker_bytes - p.prefetch_bytes;
        let slots = (p.capacity + p.prefetch_slots) as u64;
        let coarse_slot = part_bytes(nodes.rows(n), 32, OptimizerKind::Adagrad, TableDtype::F32);
        assert!(
            rest + coarser + slots * coarse_slot > resident.memory.0,
            "{p:?}"
        );
    }

    #[test]
    fn refuses_what_cannot_fit() {
        let cfg = TrainConfig {
            memory: Size(64 << 20),
            ..TrainConfig::default()
        };
        let e = plan(&cfg, &model(100), &untyped(10_000_000), 10, 2, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("memory budget 64.0 MiB cannot hold"), "{e}");
        let cfg = TrainConfig {
            memory: Size(512 << 20),
            partitions: 4,
            ..TrainConfig::default()
        };
        let e = plan(&cfg, &model(100), &untyped(10_000_000), 10, 2, None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("use more partitions or raise --memory"), "{e}");
        // More partitions than nodes is not a memory limit.
        let cfg = TrainConfig {
            partitions: 300,
            ..TrainConfig::default()
        };
        let e = plan(&cfg, &model(100), &untyped(200), 10, 2, None, None)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(
                "embed.train.partitions: 300 partitions of 200 nodes would leave some empty"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_rank_plans_its_torch_runtime_and_prefetch_slots() {
        // Resident negatives: banks take a share of whatever budget is left, which would
        // hand the tight budget below its slot back.
        let cfg = TrainConfig {
            memory: Size(1 << 30),
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
        let alone = plan(&cfg, &model(100), &untyped(1_000_000), 10, 2, None, None).unwrap();
        let p = plan(
            &cfg,
            &model(100),
            &untyped(1_000_000),
            10,
            2,
            rank(300 << 20, true),
            None,
        )
        .unwrap();
        assert_eq!(p.group_bytes, (300 << 20) + CODE_PAGES_BYTES);
        assert_eq!((p.capacity, p.prefetch_slots), (3, PREFETCH_SLOTS));
        assert!(
            p.prefetch_note.is_none() && p.total() <= cfg.memory.0,
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
                    memory: Size(p.total() - k * part / 4),
                    ..cfg.clone()
                };
                plan(
                    &tight,
                    &model(100),
                    &untyped(1_000_000),
                    10,
                    2,
                    rank(300 << 20, true),
                    None,
                )
                .ok()
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
            memory: Size(100 << 20),
            ..cfg
        };
        let e = plan(
            &small,
            &model(100),
            &untyped(1_000_000),
            10,
            2,
            rank(300 << 20, true),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("torch and gloo take 396 MiB"), "{e}");
    }
}
