//! The embedding engine's config sections: `embed.train` (training options), `embed.plan`,
//! `embed.eval`, `embed.predict` and `embed.export` (their `///` comments are the help texts
//! `--help` shows).

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::config::{AutoSize, ConfigError, Section, Size};

use crate::model::{
    Comparator, Dropout, DropoutMasks, Loss, LossKind, Operator, PbgForm, RegScope, Regularizer,
    RegularizerKind, ScoreKind,
};
use crate::ordering::OrderingKind;

/// Most edges per chunk and negatives per side: a worker's update tag holds the row in 29 bits.
pub const MAX_ROWS: usize = 1 << 29;

/// Which checkpoint to use.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    serde::Serialize,
    serde::Deserialize,
    schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    /// The best by validation MRR.
    #[default]
    Best,
    /// The last committed.
    Last,
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExportFormat {
    /// float32 arrays in id order plus name files.
    Npy,
    /// name<TAB>values lines.
    Tsv,
    /// id, name and embedding columns, written by a `RowSink` (the Python package's
    /// Parquet writer: pyarrow, the parquet extra).
    Parquet,
    /// a PyTorch-BigGraph checkpoint directory (`crate::run::pbg::export`; HDF5 through h5py, the
    /// hdf5 extra).
    Pbg,
}

impl ExportFormat {
    /// The file name ending of its files.
    pub(crate) fn suffix(self) -> &'static str {
        match self {
            ExportFormat::Npy => "npy",
            ExportFormat::Tsv => "tsv",
            ExportFormat::Parquet => "parquet",
            ExportFormat::Pbg => "h5",
        }
    }
}

/// Adagrad's state: one accumulator per element, or one per row (half the state, as PBG's
/// row-wise Adagrad).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    Adagrad,
    AdagradRow,
}

/// How rows start (config `init`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InitKind {
    /// Node rows `N(0, init_scale)`, relation rows as the model starts them.
    #[default]
    Normal,
    /// Every real of node and relation rows `U(init_low, init_high)`.
    Uniform,
    /// torch's `xavier_normal_` on each table (LibKGE's `initialize: xavier_normal_`).
    #[serde(rename = "xavier_normal")]
    XavierNormal,
    /// torch's `xavier_uniform_` on each table (LibKGE's `initialize: xavier_uniform_`).
    #[serde(rename = "xavier_uniform")]
    XavierUniform,
}

/// The distribution initial rows are drawn from (see [`TrainConfig::row_init`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RowInit {
    /// Node reals `N(0, scale)`; relation rows by the model's own start at this scale.
    Normal(f32),
    /// Every real of node and relation rows uniform in `[low, high)`.
    Uniform { low: f32, high: f32 },
    /// Glorot and Bengio's start, as torch's `xavier_normal_` and `xavier_uniform_` give it to
    /// a `rows x reals` table (fan in `reals`, fan out `rows`): every real of the node table
    /// and of the relation table `N(0, gain·√(2 / (rows + reals)))`, or uniform in
    /// `±gain·√(6 / (rows + reals))`.
    Xavier { gain: f32, uniform: bool },
}

/// The distribution of every real of one table (see [`RowInit::reals`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RealDraw {
    /// `N(0, std)`.
    Normal(f32),
    /// Uniform in `[low, high)`.
    Uniform { low: f32, high: f32 },
}

impl RowInit {
    /// How each real of a table of `rows` rows of `reals` reals is drawn. For relation rows
    /// `RowInit::Normal` means the model's own start instead (see
    /// [`crate::storage::relations::Relations::new`]).
    pub fn reals(self, rows: u64, reals: usize) -> RealDraw {
        match self {
            RowInit::Normal(scale) => RealDraw::Normal(scale),
            RowInit::Uniform { low, high } => RealDraw::Uniform { low, high },
            RowInit::Xavier { gain, uniform } => {
                let fans = (rows as f64 + reals as f64).max(1.0);
                if uniform {
                    let a = (gain as f64 * (6.0 / fans).sqrt()) as f32;
                    RealDraw::Uniform { low: -a, high: a }
                } else {
                    RealDraw::Normal((gain as f64 * (2.0 / fans).sqrt()) as f32)
                }
            }
        }
    }
}

/// How the node table stores its values (embeddings and Adagrad state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum TableDtype {
    /// IEEE float32.
    #[default]
    F32,
    /// bfloat16: the upper half of a float32 (8 significant bits, same range).
    Bf16,
}

impl TableDtype {
    /// Bytes per stored value.
    pub fn bytes(self) -> usize {
        match self {
            TableDtype::F32 => 4,
            TableDtype::Bf16 => 2,
        }
    }

    /// The config's spelling.
    pub fn name(self) -> &'static str {
        match self {
            TableDtype::F32 => "f32",
            TableDtype::Bf16 => "bf16",
        }
    }
}

/// Which side of each edge is corrupted to make negatives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Corrupt {
    /// Both sides of every edge, each against its own negatives.
    Both,
    /// The tail of every edge only.
    Tail,
    /// The head of every edge only.
    Head,
    /// One side per edge, the head with probability tph / (tph + hpt) of its relation (Wang
    /// et al. 2014, TransH), counted from the training edges at start.
    Bernoulli,
}

/// Where uniform negatives come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NegativePool {
    /// The partition of the corrupted side of the bucket (PyTorch-BigGraph): over an epoch a
    /// node meets negatives from every partition in proportion to its edges.
    Partition,
    /// Every resident partition (Marius, Legend): with few partitions resident, the softmax
    /// only ever sees a fraction of the nodes.
    Resident,
    /// Every node: resident partitions directly, partitions on disk through a block of their
    /// rows kept in memory (`bank_rows` per partition; see the `bank` module).
    All,
}

/// How a chunk's positive edges are trained (LibKGE's `train.type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TrainingMode {
    /// Each edge against a chunk's shared sampled negatives.
    #[default]
    #[serde(rename = "negative_sampling")]
    NegativeSampling,
    /// Each edge's query against every entity, the true one the class (Lacroix et al. 2018).
    #[serde(rename = "1vsAll")]
    OneVsAll,
    /// Each distinct query against every entity, its known answers the labels (ConvE).
    #[serde(rename = "KvsAll")]
    KvsAll,
}

impl TrainingMode {
    /// Its name in config files.
    pub fn name(self) -> &'static str {
        match self {
            TrainingMode::NegativeSampling => "negative_sampling",
            TrainingMode::OneVsAll => "1vsAll",
            TrainingMode::KvsAll => "KvsAll",
        }
    }
}

/// Which entities 1vsAll scores a query against.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum VsAllCandidates {
    /// Every entity: the whole table must be in memory.
    #[default]
    All,
    /// The entities of the resident partitions (out of core; an approximation).
    Resident,
}

/// Precision of a torch device's training products (config `device_matmul`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeviceMatmul {
    /// Full float32 products.
    #[default]
    Float32,
    /// TF32 tensor-core products on CUDA.
    Tf32,
}

impl DeviceMatmul {
    /// Its name in config files.
    pub fn name(self) -> &'static str {
        match self {
            DeviceMatmul::Float32 => "float32",
            DeviceMatmul::Tf32 => "tf32",
        }
    }
}

/// Where the partitions of a distributed run live (docs/distributed.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DistStorage {
    /// Every rank opens the same run directory (one machine, or a shared file system as
    /// PyTorch-BigGraph requires for its checkpoints); partitions move through its tables.
    Shared,
    /// Partition p lives in rank p mod W's own directory RUN/rank-R and moves between ranks
    /// point-to-point; no file system is shared.
    Owners,
}

/// Evaluation protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Rank the true entity against every entity, skipping other known true triples.
    Filtered,
    /// Rank against `eval_negatives` uniform plus as many degree-weighted candidates.
    Sampled,
}

/// How the learning rate changes over a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LrScheduler {
    /// The configured lr throughout.
    #[default]
    None,
    /// PyTorch's ReduceLROnPlateau (mode max) on the validation MRR.
    ReduceOnPlateau,
}

/// How reduce_on_plateau's threshold compares a validation MRR with the best one (PyTorch's
/// `threshold_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ThresholdMode {
    /// Better than best x (1 + threshold).
    #[default]
    Rel,
    /// Better than best + threshold.
    Abs,
}

/// Everything a training run is set up with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    // The help text lists the registered models (`ScoreKind::describe`).
    pub model: ScoreKind,
    /// reals per node embedding (complex and rotate use half as complex coordinates)
    #[schemars(range(min = 1))]
    pub dim: usize,
    /// norm of transe: 1 or 2
    #[schemars(range(min = 1, max = 2))]
    pub transe_norm: u8,
    /// model pbg: the relation operator applied to the source, none (default), translation
    /// (s + r), diagonal (s ∘ r), linear (M s; RESCAL with dot), affine (M s + v) or
    /// complex_diagonal (complex s r)
    pub operator: Option<Operator>,
    /// model pbg: how the operator's output is compared with the target, cos (default), dot,
    /// l2 (−‖a − t‖) or squared_l2 (−‖a − t‖²)
    pub comparator: Option<Comparator>,
    /// softmax: cross-entropy of the true edge among its negatives; logistic; margin ranking
    pub loss: LossKind,
    /// self-adversarial negative weighting (RotatE; DGL-KE's -adv): each negative of the
    /// logistic or margin loss weighs softmax(temperature x score) over its edge's negatives,
    /// held constant in the gradient; unset: uniform weights
    pub adversarial_temperature: Option<f32>,
    /// scale each train edge's loss by its weight in the store (edge_weights_train, from
    /// convert --columns ...,weight), as PyTorch-BigGraph does; false ignores the weights
    pub edge_weights: bool,
    /// none; n3 (Σ|x|³, moduli of complex coordinates: ComplEx-N3) or l2 (Σx²) of the source,
    /// target and relation rows of each chunk, times reg_weight / chunk edges
    pub regularizer: RegularizerKind,
    /// weight of the regularizer
    #[schemars(range(min = 0.0))]
    pub reg_weight: f32,
    // Training-step options of LibKGE's recipes (dropout, weighted regularization).
    /// LibKGE's weighted regularization (regularize_args.weighted): each chunk penalises the
    /// rows its edges reference once per reference, reg_weight / p · Σ |x|^p (p = 3 for n3, 2
    /// for l2), so a node weighs by its frequency; the chunk's loss is summed over its edges,
    /// so LibKGE's weights (relative to a loss averaged over the batch) carry over; false: the
    /// plain term, reg_weight / chunk edges per chunk direction
    pub reg_weighted: bool,
    /// weight of the regularizer on relation rows (LibKGE's relation_embedder
    /// regularize_weight); unset: reg_weight
    #[schemars(range(min = 0.0))]
    pub relation_reg_weight: Option<f32>,
    /// which entity rows the regularizer penalises: chunk (the rows each chunk's edges
    /// reference) or table (1vsAll and KvsAll: every entity row in every chunk, reg_weight ·
    /// chunk edges / p · Σ |x|^p, LibKGE's unweighted lp, which penalises the whole embedding
    /// table each batch); relation rows keep the chunk's scope
    pub reg_scope: RegScope,
    /// dropout rate of the entity rows a training step gathers (sources, targets, negatives):
    /// each real zeroed with this probability and the others scaled by 1 / (1 - rate), in
    /// training only (LibKGE's entity_embedder.dropout); 0: off
    #[schemars(range(min = 0.0, max = 1.0))]
    pub entity_dropout: f32,
    /// dropout rate of the relation rows a training step gathers (LibKGE's
    /// relation_embedder.dropout); 0: off
    #[schemars(range(min = 0.0, max = 1.0))]
    pub relation_dropout: f32,
    /// negative sampling with dropout: shared (one mask per gathered row, the positive and its
    /// negatives scored from the same dropped query) or independent (the positive's source and
    /// relation rows dropped again with masks of their own, as LibKGE, which looks them up once
    /// for the positive and once for the negatives: a stronger regularizer at the same rates)
    pub dropout_masks: DropoutMasks,
    /// margin of the margin-ranking loss
    #[schemars(range(min = 0.0))]
    pub margin: f32,
    /// logistic loss: γ added to every score inside it, softplus(−(pos + γ)) + mean_j
    /// softplus(neg_j + γ) (RotatE's and DGL-KE's gamma, for the distance models transe and
    /// rotate, whose scores −‖·‖ are never positive); 0 is PyTorch-BigGraph's logistic loss
    pub gamma: f32,
    /// learning rate
    pub lr: f32,
    /// Adagrad with one accumulator per element, or per row (half the optimizer state)
    pub optimizer: OptimizerKind,
    /// storage of the node table (embeddings and Adagrad state, on disk and in the buffer):
    /// f32, or bf16 (half the bytes: twice the rows per partition slot, half the I/O; values
    /// are widened to f32 for every computation and rounded stochastically when an update
    /// stores them; readable on any CPU)
    pub table_dtype: TableDtype,
    /// standard deviation of the initial node embeddings (init = "normal")
    pub init_scale: f32,
    /// how rows start: normal (node rows N(0, init_scale), relation rows as the model starts
    /// them: unit complex numbers, random signs), uniform (every real of the node and
    /// relation rows drawn from U(init_low, init_high), LibKGE's uniform_ initializer), or
    /// xavier_normal / xavier_uniform (torch's initializers of those names, LibKGE's
    /// xavier_normal_ and xavier_uniform_, on the node table and on the relation table:
    /// every real N(0, init_gain * sqrt(2 / (rows + reals))) or U(+-init_gain * sqrt(6 /
    /// (rows + reals))), rows counting the inverse relations)
    pub init: InitKind,
    /// lower bound of init = "uniform" (LibKGE's initialize_args.uniform_.a); default -1
    pub init_low: Option<f32>,
    /// upper bound of init = "uniform" (LibKGE's uniform_.b: torch's default 1.0 when a
    /// configuration gives only a); default 1
    pub init_high: Option<f32>,
    /// gain of init = "xavier_normal" or "xavier_uniform" (LibKGE's initialize_args
    /// xavier_normal_.gain); default 1
    pub init_gain: Option<f32>,
    /// epochs to train (a resumed run trains up to this many in total)
    #[schemars(range(min = 1))]
    pub epochs: usize,
    /// positive edges per chunk; a chunk shares one set of negatives (see shared_negatives)
    #[schemars(range(min = 1, max = MAX_ROWS - 1))]
    pub chunk_size: usize,
    /// negatives per chunk and corrupted side (per edge with shared_negatives = false); with
    /// negatives_head, the tails' count alone (LibKGE's num_samples.o)
    #[schemars(range(min = 1, max = MAX_ROWS - 1))]
    pub negatives: usize,
    /// negatives of the side that corrupts heads, in place of negatives (LibKGE's
    /// num_samples.s; with reciprocal relations the inverse relations' side); default
    /// negatives
    #[schemars(range(min = 1, max = MAX_ROWS - 1))]
    pub negatives_head: Option<usize>,
    /// true: a chunk's edges share one set of negatives per corrupted side, scored as one
    /// matrix product (PyTorch-BigGraph, Marius, Legend); false: each edge draws its own
    /// (LibKGE's and PyKEEN's sampling), chunk_size times the rows gathered and updated
    pub shared_negatives: bool,
    /// fraction of negatives drawn in proportion to degree; the rest are uniform (see
    /// negative_pool)
    #[schemars(range(min = 0.0, max = 1.0))]
    pub degree_fraction: f32,
    /// uniform negatives over all nodes (partitions on disk through in-memory banks of
    /// bank_rows rows), over the resident partitions (Marius, Legend), or over the corrupted
    /// side's partition (PyTorch-BigGraph)
    pub negative_pool: NegativePool,
    /// rows of each partition kept in memory as negatives while it is on disk
    pub bank_rows: usize,
    /// which side of each edge is corrupted: both, tail, head, or bernoulli (one side per edge,
    /// the head with probability tph/(tph+hpt) of its relation, TransH)
    pub corrupt: Corrupt,
    /// relations get inverse rows used when heads are corrupted (reciprocal relations)
    pub reciprocal: bool,
    /// node partitions; 0 plans the fewest that fit --memory (typed stores: of every entity type
    /// entity_partitions leaves out)
    pub partitions: u32,
    /// typed stores: node types are PyTorch-BigGraph's entity types (each partitioned on its
    /// own or held in memory, negatives and ranking of the right type); false: one table of
    /// every node, as an untyped store
    pub entity_types: bool,
    /// typed stores: partitions of entity types as TYPE=N items (N = 1: unpartitioned, held in
    /// memory all epoch, PBG's num_partitions = 1); types left out take --partitions; every
    /// partitioned type has the same count, as in PBG
    pub entity_partitions: Vec<String>,
    /// typed stores: entity types whose entities are bags of features (the store's feature
    /// bags, strata convert --node-bags): an entity's embedding is the mean of its features'
    /// (PBG's featurized); such types are unpartitioned
    pub featurized: Vec<String>,
    /// typed stores: uniform negatives come from the corrupted side's entity type (false: from
    /// every node of the pool)
    pub typed_negatives: bool,
    /// typed stores: evaluation ranks each answer against the entities of its type only
    /// (false: against every node)
    pub typed_eval: bool,
    /// partitions resident at once when the table is partitioned
    #[schemars(range(min = 1))]
    pub buffer: usize,
    // The help text lists the registered orderings (`OrderingKind::describe`).
    pub ordering: OrderingKind,
    /// worker threads over a bucket's chunks; 0 means one per core
    pub threads: usize,
    /// seed of initialisation, partitioning, shuffling and negatives
    pub seed: u64,
    /// memory budget (buffer, edges, workers, evaluation, relations, runtime)
    pub memory: Size,
    /// validate every this many epochs (0: no evaluation at all)
    pub eval_every: usize,
    /// filtered: rank against every node (FB15k-237, WN18RR); sampled: against N uniform + N
    /// degree-weighted candidates (large graphs)
    pub eval_protocol: Protocol,
    /// N of the sampled protocol
    #[schemars(range(min = 1))]
    pub eval_negatives: usize,
    /// evaluate at most this many queries per split (0: all)
    pub eval_max_queries: usize,
    /// distributed runs (under torchrun): buckets a rank trains between two all-reduces of the
    /// relation parameters' deltas; 1 is the synchronous variant (see docs/distributed.md)
    #[schemars(range(min = 1))]
    pub relation_sync_every: usize,
    /// distributed runs with negative banks: every this many relation rounds the ranks also sum
    /// their pending bank gradient, the rank holding each partition applies it at once, and
    /// every rank's block of a held partition is refreshed from its holder (two bank-sized
    /// all-reduces); 0: only at the epoch's end (see docs/distributed.md)
    pub bank_sync_every: usize,
    /// distributed runs: seconds any wait on another rank may take (rendezvous, the bucket
    /// scheduler's answers, barriers, all-reduces) before the run fails naming what timed out
    #[schemars(range(min = 1))]
    pub dist_timeout: u64,
    /// distributed runs: shared (every rank opens the same --run-dir: one machine or a shared
    /// file system) or owners (each rank keeps the partitions it owns, p mod ranks, in its own
    /// RUN/rank-R and ships them point-to-point; no shared file system; gather before eval)
    pub dist_storage: DistStorage,
    /// distributed runs: while a rank trains a bucket it asks for its next one and loads that
    /// bucket's partitions in the background (up to 2 partition slots beyond buffer; when
    /// --memory cannot hold them the plan says so and the rank asks one bucket at a time); on
    /// a quiet machine it cut partition waits from 20% to 7% and epochs by 10-17% (B7)
    pub dist_prefetch: bool,
    /// a run whose table is resident (one process, no swaps) copies the table at the end of
    /// each epoch that validates and writes the copy to the SSD while it validates, committing
    /// the epoch once the copy is synced, when --memory holds the copy beside the rest (the
    /// plan says so); false: each epoch writes its table back before it ends (no copy)
    pub write_behind: bool,
    /// out of core in one process: two spare partition buffers beside the slots (one when
    /// --memory holds only one beside the rest; the plan says so), so the partition each
    /// swap loads is read ahead as soon as the disk is free and the swap hands it over at
    /// once, its victim written behind beside the next read; false: each swap writes the
    /// evicted partition, then reads the next into its slot
    pub swap_spare: bool,
    /// in one process: the training edges read in the first epoch stay in memory for the
    /// later ones when --memory holds them beside the rest (the plan says so), so an
    /// out-of-core epoch's disk moves only partitions; false: every epoch reads its edges
    /// from the SSD
    pub keep_edges: bool,
    /// out of core in one process: an evicted partition stays in memory, so a later load takes
    /// it from there instead of the SSD (its last eviction of an epoch is written to the SSD
    /// behind the training), when --memory holds every partition beside the rest (the plan
    /// says so; it replaces the swap spare). A run trained on a device whose budget splits the
    /// table then swaps between host and device memory; false: every load reads the SSD
    pub keep_partitions: bool,
    /// start a new run from the best checkpoint of this earlier run (incremental training on a
    /// store that gained nodes and edges): known nodes, matched by name (by id in stores
    /// without names), and relations keep their rows and optimizer state, new ones start fresh;
    /// same model, dim, optimizer and reciprocal; applies when the run is created
    pub init_from: Option<PathBuf>,
    // Learning-rate schedule and early stopping, decided on the validation MRR every
    // eval_every epochs (LibKGE's lr_scheduler and valid.early_stopping).
    /// learning-rate schedule: none (lr throughout) or reduce_on_plateau (PyTorch's
    /// ReduceLROnPlateau in mode max, stepped with each validation MRR: once more than
    /// lr_patience validations in a row fail to improve on the best, the rate is multiplied by
    /// lr_factor)
    pub lr_scheduler: LrScheduler,
    /// reduce_on_plateau: what the rate is multiplied by when it drops (between 0 and 1)
    pub lr_factor: f64,
    /// reduce_on_plateau: validations in a row without improvement tolerated before the rate
    /// drops (counted in validations, every eval_every epochs)
    pub lr_patience: usize,
    /// reduce_on_plateau: how much a validation MRR must beat the best to count as an
    /// improvement (see lr_threshold_mode)
    #[schemars(range(min = 0.0))]
    pub lr_threshold: f64,
    /// reduce_on_plateau: rel (better than best x (1 + lr_threshold)) or abs (better than best +
    /// lr_threshold)
    pub lr_threshold_mode: ThresholdMode,
    /// reduce_on_plateau: validations after a drop during which none counts as bad
    pub lr_cooldown: usize,
    /// reduce_on_plateau: the rate never drops below this
    #[schemars(range(min = 0.0))]
    pub lr_min: f64,
    /// stop training once the validation MRR has not improved on its best in this many
    /// validations in a row (0: never; LibKGE's valid.early_stopping.patience)
    pub early_stopping_patience: usize,
    /// stop training at a validation after more than this many epochs when the best
    /// validation MRR is still below early_stopping_threshold_mrr (LibKGE's
    /// valid.early_stopping.threshold.epochs)
    pub early_stopping_threshold_epochs: usize,
    /// the validation MRR a run must have reached after early_stopping_threshold_epochs
    /// epochs (0: no threshold; LibKGE's valid.early_stopping.threshold.metric_value)
    #[schemars(range(min = 0.0, max = 1.0))]
    pub early_stopping_threshold_mrr: f64,

    // 1vsAll and KvsAll training (docs/embed.md, "1vsAll and KvsAll").
    /// negative_sampling (a chunk's shared sampled negatives); 1vsAll (each edge's query scored
    /// against every entity as one matrix product per chunk: loss softmax is the cross-entropy
    /// of the true entity, logistic the BCE over all entities); KvsAll (each distinct query
    /// (h, r) and (t, r⁻¹) of the training edges once per epoch, labelled with all its known
    /// answers: softmax is the cross-entropy against the normalised labels, LibKGE's kl;
    /// logistic the BCE of ConvE). Both need the entity table in memory (see vsall_candidates)
    pub training: TrainingMode,
    /// 1vsAll and KvsAll: labels become (1 − label_smoothing) y + 1/entities (LibKGE's and
    /// ConvE's label smoothing); 0 is off
    #[schemars(range(min = 0.0, max = 1.0))]
    pub label_smoothing: f32,
    /// 1vsAll: all (every entity; the table must fit --memory in one partition) or resident
    /// (out of core: each chunk scores against the entities of the resident partitions only,
    /// an approximation whose cost in MRR docs/benchmarks.md measures)
    pub vsall_candidates: VsAllCandidates,
    // The device backend's options.
    /// where the training steps run: cpu (the Rust engine on the CPU's threads), cuda or
    /// cuda:N (torch on that GPU: the partition slots trained on the device, as PyTorch-BigGraph's
    /// and Marius's GPU trainers), or torch-cpu (the same torch code on the CPU, for machines
    /// without a GPU); the run format is the same for all
    pub device: String,
    /// a torch device's budget for the partition slots, relations, staged edges and step
    /// scratch (outside --memory): auto (80% of the free GPU memory as torch reports it; on
    /// torch-cpu the host buffer's slots) or a size such as 8G, which sets how many partitions
    /// the table needs on torch-cpu exactly as on cuda
    pub device_memory: AutoSize,
    /// precision of a torch device's training products: float32 (full float32, the Rust
    /// engine's arithmetic within float rounding) or tf32 (CUDA's tensor cores: a 10-bit
    /// mantissa, about 1e-3 relative error a product, for several times float32's rate on
    /// Ampere and Hopper GPUs; evaluation stays float32); the CPU twin has no TF32
    pub device_matmul: DeviceMatmul,
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            model: ScoreKind::ComplEx,
            dim: 100,
            transe_norm: 2,
            operator: None,
            comparator: None,
            loss: LossKind::Softmax,
            adversarial_temperature: None,
            edge_weights: true,
            regularizer: RegularizerKind::None,
            reg_weight: 0.0,
            reg_weighted: false,
            relation_reg_weight: None,
            reg_scope: RegScope::Chunk,
            entity_dropout: 0.0,
            relation_dropout: 0.0,
            dropout_masks: DropoutMasks::Shared,
            margin: 0.1,
            gamma: 0.0,
            lr: 0.1,
            optimizer: OptimizerKind::Adagrad,
            table_dtype: TableDtype::F32,
            init_scale: 1e-3,
            init: InitKind::Normal,
            init_low: None,
            init_high: None,
            init_gain: None,
            epochs: 10,
            chunk_size: 1000,
            negatives: 1000,
            negatives_head: None,
            shared_negatives: true,
            degree_fraction: 0.0,
            negative_pool: NegativePool::All,
            bank_rows: 4096,
            corrupt: Corrupt::Both,
            reciprocal: true,
            partitions: 0,
            entity_types: true,
            entity_partitions: Vec::new(),
            featurized: Vec::new(),
            typed_negatives: true,
            typed_eval: true,
            buffer: 3,
            ordering: OrderingKind::Legend,
            threads: 0,
            seed: 0,
            memory: Size(1 << 30),
            eval_every: 1,
            eval_protocol: Protocol::Filtered,
            eval_negatives: 1000,
            eval_max_queries: 0,
            relation_sync_every: 4,
            bank_sync_every: 0,
            dist_timeout: 600,
            dist_storage: DistStorage::Shared,
            dist_prefetch: true,
            write_behind: true,
            swap_spare: true,
            keep_edges: true,
            keep_partitions: true,
            init_from: None,
            lr_scheduler: LrScheduler::None,
            lr_factor: 0.1,
            lr_patience: 10,
            lr_threshold: 1e-4,
            lr_threshold_mode: ThresholdMode::Rel,
            lr_cooldown: 0,
            lr_min: 0.0,
            early_stopping_patience: 0,
            early_stopping_threshold_epochs: 0,
            early_stopping_threshold_mrr: 0.0,
            training: TrainingMode::NegativeSampling,
            label_smoothing: 0.0,
            vsall_candidates: VsAllCandidates::All,
            device: "cpu".into(),
            device_memory: AutoSize::Auto,
            device_matmul: DeviceMatmul::Float32,
        }
    }
}

impl Section for TrainConfig {
    const NAME: &'static str = "embed.train";

    /// What the types and declared bounds leave: the model's parity, finite rates, and the
    /// buffer each ordering needs.
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        self.model
            .get()
            .check_dim(self.dim)
            .or_else(|msg| bad("dim", msg))?;
        for (key, v) in [("lr", self.lr), ("init_scale", self.init_scale)] {
            if !(v > 0.0 && v.is_finite()) {
                return bad(key, format!("must be a positive number, got {v}"));
            }
        }
        if !(self.reg_weight >= 0.0 && self.reg_weight.is_finite()) {
            return bad(
                "reg_weight",
                format!("must be a number >= 0, got {}", self.reg_weight),
            );
        }
        if !self.margin.is_finite() {
            return bad(
                "margin",
                format!("must be a finite number, got {}", self.margin),
            );
        }
        self.check_pbg().or_else(|(key, msg)| bad(key, msg))?;
        self.check_recipe_options()
            .or_else(|(key, msg)| bad(key, msg))?;
        self.check_init().or_else(|(key, msg)| bad(key, msg))?;
        check_device(&self.device).or_else(|msg| bad("device", msg))?;
        if self.device == "cpu" && self.device_matmul != DeviceMatmul::Float32 {
            return bad(
                "device_matmul",
                format!(
                    "{:?} applies to a torch device (device = cuda, cuda:N or torch-cpu); \
                     device = \"cpu\" computes in float32",
                    self.device_matmul.name()
                ),
            );
        }
        if self.device == "cpu" && self.device_memory != AutoSize::Auto {
            return bad(
                "device_memory",
                "applies to a torch device (device = cuda, cuda:N or torch-cpu); device = \"cpu\" \
                 trains within --memory alone"
                    .into(),
            );
        }
        if !self.gamma.is_finite() {
            return bad(
                "gamma",
                format!("must be a finite number, got {}", self.gamma),
            );
        }
        if self.gamma != 0.0 && self.loss != LossKind::Logistic {
            return bad(
                "gamma",
                "applies to loss \"logistic\" only (softmax and margin ranking compare \
                 scores, so a shift of all of them changes nothing)"
                    .into(),
            );
        }
        if let Some(t) = self.adversarial_temperature {
            if !(t > 0.0 && t.is_finite()) {
                return bad(
                    "adversarial_temperature",
                    format!("must be a positive number, got {t}"),
                );
            }
            if !self.loss.takes_adversarial() {
                return bad(
                    "adversarial_temperature",
                    "self-adversarial weighting applies to loss \"logistic\" or \"margin\", not \
                     \"softmax\" (softmax's gradient already weights each negative by its softmax \
                     probability)"
                        .into(),
                );
            }
        }
        if self.negatives_head.is_some() && self.corrupt == Corrupt::Tail {
            return bad(
                "negatives_head",
                "applies where heads are corrupted (corrupt \"both\", \"head\" or \"bernoulli\"); \
                 corrupt is \"tail\""
                    .into(),
            );
        }
        self.check_schedule().or_else(|(key, msg)| bad(key, msg))?;
        self.check_vs_all().or_else(|(key, msg)| bad(key, msg))?;
        self.check_unread().or_else(|(key, msg)| bad(key, msg))?;
        let rows = self.gathered_per_chunk(0);
        if !self.scores_all() && rows >= MAX_ROWS as u64 {
            return bad(
                "negatives",
                format!(
                    "with shared_negatives = false a chunk side gathers chunk_size x negatives = {rows} rows, more than the {} a chunk can hold; lower chunk_size or negatives",
                    MAX_ROWS - 1
                ),
            );
        }
        let partitioned = self.partitions as usize > self.buffer;
        self.ordering
            .check_buffer(self.buffer, partitioned)
            .or_else(|msg| bad("buffer", msg))
    }
}

impl TrainConfig {
    /// Options set away from their defaults that the chosen model, loss, regularizer or
    /// negative pool never reads: refused (the key and why) rather than ignored.
    fn check_unread(&self) -> Result<(), (&'static str, String)> {
        let d = TrainConfig::default();
        let name = |v: &dyn std::fmt::Debug| format!("{v:?}").to_lowercase();
        let unread = [
            (
                "transe_norm",
                self.transe_norm != d.transe_norm && self.model != ScoreKind::TransE,
                format!("applies to model \"transe\" only (model is {:?})", self.model.to_string()),
            ),
            (
                "margin",
                self.margin != d.margin && self.loss != LossKind::Margin,
                format!("applies to loss \"margin\" only (loss is \"{}\")", name(&self.loss)),
            ),
            (
                "reg_weight",
                self.reg_weight != d.reg_weight && self.regularizer == RegularizerKind::None,
                "applies with regularizer \"n3\" or \"l2\" (regularizer is \"none\")".into(),
            ),
            (
                "bank_rows",
                self.bank_rows != d.bank_rows
                    && self.negative_pool != NegativePool::All
                    && !self.scores_all(),
                format!(
                    "applies to negative_pool \"all\", whose banks stand in for partitions on disk (negative_pool is \"{}\")",
                    name(&self.negative_pool)
                ),
            ),
        ];
        unread
            .into_iter()
            .find(|(_, unread, _)| *unread)
            .map_or(Ok(()), |(key, _, msg)| Err((key, msg)))
    }

    /// The operator and comparator of model pbg (PBG's defaults where unset).
    pub fn pbg_form(&self) -> PbgForm {
        PbgForm {
            operator: self.operator.unwrap_or_default(),
            comparator: self.comparator.unwrap_or_default(),
        }
    }

    /// The loss with its margin, logistic shift and self-adversarial temperature.
    pub fn loss_fn(&self) -> Loss {
        Loss {
            kind: self.loss,
            margin: self.margin,
            gamma: self.gamma,
            adversarial: self.adversarial_temperature,
        }
    }

    /// The regularizer and its weights.
    pub fn regularizer(&self) -> Regularizer {
        Regularizer {
            kind: self.regularizer,
            weight: self.reg_weight,
            rel_weight: self.relation_reg_weight,
            weighted: self.reg_weighted,
            scope: self.reg_scope,
        }
    }

    /// The distribution of the initial rows (`init`, `init_scale`, `init_low`, `init_high`).
    pub fn row_init(&self) -> RowInit {
        match self.init {
            InitKind::Normal => RowInit::Normal(self.init_scale),
            InitKind::Uniform => RowInit::Uniform {
                low: self.init_low.unwrap_or(-1.0),
                high: self.init_high.unwrap_or(1.0),
            },
            InitKind::XavierNormal | InitKind::XavierUniform => RowInit::Xavier {
                gain: self.init_gain.unwrap_or(1.0),
                uniform: self.init == InitKind::XavierUniform,
            },
        }
    }

    /// The key and message of an initialization the rows cannot start from: bounds given
    /// without `init = "uniform"`, a gain without a xavier init, bounds that are not finite
    /// with `low < high`, or a gain that is not a finite number above 0.
    fn check_init(&self) -> Result<(), (&'static str, String)> {
        let bounds = [("init_low", self.init_low), ("init_high", self.init_high)];
        let uniform = matches!(self.init, InitKind::Uniform);
        if let Some((key, _)) = bounds.iter().find(|(_, v)| v.is_some() && !uniform) {
            return Err((key, "applies to init = \"uniform\" only".into()));
        }
        let xavier = matches!(self.init, InitKind::XavierNormal | InitKind::XavierUniform);
        if self.init_gain.is_some() && !xavier {
            return Err((
                "init_gain",
                "applies to init = \"xavier_normal\" or \"xavier_uniform\" only".into(),
            ));
        }
        match self.row_init() {
            RowInit::Uniform { low, high }
                if !(low.is_finite() && high.is_finite() && low < high) =>
            {
                Err((
                    "init_low",
                    format!(
                        "init = \"uniform\" needs finite bounds with init_low < init_high, \
                         got [{low}, {high})"
                    ),
                ))
            }
            RowInit::Xavier { gain, .. } if !(gain > 0.0 && gain.is_finite()) => Err((
                "init_gain",
                format!("must be a finite number above 0, got {gain}"),
            )),
            _ => Ok(()),
        }
    }

    /// The dropout rates of the training step.
    pub fn dropout(&self) -> Dropout {
        Dropout {
            entity: self.entity_dropout,
            relation: self.relation_dropout,
            independent: self.dropout_masks == DropoutMasks::Independent,
        }
    }

    /// Why `dropout_masks = "independent"` does not apply: no dropout, a training that scores
    /// the true target among all candidates (one mask, as LibKGE's 1vsAll), or a model whose
    /// kernel has no separate positive query (pbg).
    fn check_independent_masks(&self) -> Result<(), (&'static str, String)> {
        let why = if self.entity_dropout == 0.0 && self.relation_dropout == 0.0 {
            "needs entity_dropout or relation_dropout above 0".to_string()
        } else if self.training != TrainingMode::NegativeSampling {
            format!(
                "applies to negative sampling; training = {:?} scores the true target among all                  candidates from one dropped query, as LibKGE does",
                self.training.name()
            )
        } else if self.model == ScoreKind::Pbg {
            "is not supported for model \"pbg\" (use dropout_masks = \"shared\", or the named \
             model: dot, distmult, complex, transe or rotate)"
                .to_string()
        } else {
            return Ok(());
        };
        Err(("dropout_masks", format!("\"independent\" {why}")))
    }

    /// The key and message of what the recipes' step options do not allow: a rate outside
    /// [0, 1), relation dropout for a model whose relation rows are not embeddings, weighted
    /// or relation weights without a regularizer, and reciprocal relations where one side is
    /// never trained (its inverse rows would answer head queries untrained).
    fn check_recipe_options(&self) -> Result<(), (&'static str, String)> {
        let model = self.model.to_string();
        for (key, rate) in [
            ("entity_dropout", self.entity_dropout),
            ("relation_dropout", self.relation_dropout),
        ] {
            if !(0.0..1.0).contains(&rate) {
                return Err((key, format!("must be a rate in [0, 1), got {rate}")));
            }
        }
        if self.relation_dropout > 0.0 {
            let why = match self.model {
                ScoreKind::Dot => Some("has no relation rows"),
                ScoreKind::RotatE => Some("has relation rows of phases, not embeddings"),
                ScoreKind::Pbg if self.pbg_form().operator == Operator::None => {
                    Some("has no relation rows with operator none")
                }
                _ => None,
            };
            if let Some(why) = why {
                return Err((
                    "relation_dropout",
                    format!("does not apply to model {model:?}, which {why}"),
                ));
            }
        }
        if self.dropout_masks == DropoutMasks::Independent {
            self.check_independent_masks()?;
        }
        if self.regularizer == RegularizerKind::None {
            if self.reg_weighted {
                return Err((
                    "reg_weighted",
                    "applies with regularizer \"n3\" or \"l2\" (regularizer is \"none\")".into(),
                ));
            }
            if self.relation_reg_weight.is_some() {
                return Err((
                    "relation_reg_weight",
                    "applies with regularizer \"n3\" or \"l2\" (regularizer is \"none\")".into(),
                ));
            }
        }
        if self.reg_scope == RegScope::Table {
            let why = if self.training == TrainingMode::NegativeSampling {
                Some(
                    "penalises every entity row in every chunk, which 1vsAll and KvsAll step \
                     anyway; negative sampling steps only the rows a chunk touches: set \
                     training = \"1vsAll\" or \"KvsAll\", or reg_scope = \"chunk\"",
                )
            } else if self.regularizer == RegularizerKind::None {
                Some("applies with regularizer \"n3\" or \"l2\" (regularizer is \"none\")")
            } else if self.reg_weighted {
                Some(
                    "penalises every row once per chunk, and reg_weighted once per reference: \
                     choose one",
                )
            } else {
                None
            };
            if let Some(why) = why {
                return Err(("reg_scope", format!("\"table\" {why}")));
            }
        }
        if let Some(w) = self.relation_reg_weight {
            if !(w >= 0.0 && w.is_finite()) {
                return Err((
                    "relation_reg_weight",
                    format!("must be a number >= 0, got {w}"),
                ));
            }
        }
        if self.reciprocal && matches!(self.corrupt, Corrupt::Tail | Corrupt::Head) {
            let side = if self.corrupt == Corrupt::Tail {
                "tail"
            } else {
                "head"
            };
            return Err((
                "reciprocal",
                format!(
                    "reciprocal relations answer tail queries with the relation rows and head \
                     queries with the inverse rows, and corrupt = \"{side}\" trains only one of \
                     them (the other would answer untrained); corrupt both or bernoulli, or set \
                     reciprocal = false"
                ),
            ));
        }
        Ok(())
    }

    /// The key and message of what the learning-rate schedule and early stopping do not allow:
    /// a factor outside (0, 1) (PyTorch refuses a factor of 1 or more), a negative or infinite
    /// threshold or floor, or either without validation to decide on.
    fn check_schedule(&self) -> Result<(), (&'static str, String)> {
        if !(self.lr_factor > 0.0 && self.lr_factor < 1.0) {
            return Err((
                "lr_factor",
                format!(
                    "must be between 0 and 1 (exclusive), got {}",
                    self.lr_factor
                ),
            ));
        }
        for (key, v) in [("lr_threshold", self.lr_threshold), ("lr_min", self.lr_min)] {
            if !(v >= 0.0 && v.is_finite()) {
                return Err((key, format!("must be a number >= 0, got {v}")));
            }
        }
        let t = self.early_stopping_threshold_mrr;
        if !(0.0..=1.0).contains(&t) {
            return Err((
                "early_stopping_threshold_mrr",
                format!("must be an MRR between 0 and 1, got {t}"),
            ));
        }
        if self.eval_every == 0 {
            let needs = [
                ("lr_scheduler", self.lr_scheduler != LrScheduler::None),
                ("early_stopping_patience", self.early_stopping_patience > 0),
                ("early_stopping_threshold_mrr", t > 0.0),
            ];
            if let Some((key, _)) = needs.iter().find(|(_, on)| *on) {
                return Err((
                    key,
                    "decides on the validation MRR, but eval_every = 0 turns validation off; \
                     set eval_every >= 1"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    /// Whether the learning-rate schedule or early stopping is on (they need a validation split).
    pub fn schedules(&self) -> Option<&'static str> {
        if self.lr_scheduler != LrScheduler::None {
            Some("lr_scheduler")
        } else if self.early_stopping_patience > 0 {
            Some("early_stopping_patience")
        } else if self.early_stopping_threshold_mrr > 0.0 {
            Some("early_stopping_threshold_mrr")
        } else {
            None
        }
    }

    /// The key and message of what model pbg's options do not allow: an operator or
    /// comparator for another model, an odd dim for complex_diagonal, or no reciprocal
    /// relations where a reversed relation row does not score heads as the row scores tails.
    fn check_pbg(&self) -> Result<(), (&'static str, String)> {
        if self.model != ScoreKind::Pbg {
            let set = [
                ("operator", self.operator.map(Operator::name)),
                ("comparator", self.comparator.map(Comparator::name)),
            ];
            return match set.into_iter().find_map(|(k, v)| Some(k).zip(v)) {
                Some((key, value)) => Err((
                    key,
                    format!(
                        "{key} = {value:?} applies to model \"pbg\" only (model is {:?})",
                        self.model.to_string()
                    ),
                )),
                None => Ok(()),
            };
        }
        let form = self.pbg_form();
        if form.operator == Operator::ComplexDiagonal && !self.dim.is_multiple_of(2) {
            return Err((
                "dim",
                format!(
                    "operator complex_diagonal needs an even dim (real and imaginary halves), got {}",
                    self.dim
                ),
            ));
        }
        if !self.reciprocal && !form.reversible() {
            return Err((
                "reciprocal",
                format!(
                    "operator {} with comparator {} scores heads only through reciprocal \
                     relations (a reversed relation row does not score the same)",
                    form.operator.name(),
                    form.comparator.name()
                ),
            ));
        }
        Ok(())
    }
}

// 1vsAll and KvsAll training.
impl TrainConfig {
    /// Whether chunks are scored against every entity (1vsAll or KvsAll).
    pub fn scores_all(&self) -> bool {
        self.training != TrainingMode::NegativeSampling
    }

    /// Entities a 1vsAll or KvsAll chunk scores among `nodes`: every one, or (1vsAll with
    /// `vsall_candidates = "resident"`) the `resident_rows` of the buffer's partitions.
    pub fn vs_all_candidates(&self, nodes: u64, resident_rows: u64) -> u64 {
        if self.training == TrainingMode::OneVsAll
            && self.vsall_candidates == VsAllCandidates::Resident
        {
            resident_rows.min(nodes)
        } else {
            nodes
        }
    }

    /// Candidate rows a chunk side gathers, for the budgets: what it scores against
    /// ([`TrainConfig::scored_per_chunk`]), times `chunk_size` when each edge draws its own
    /// negatives (`shared_negatives = false`).
    pub fn gathered_per_chunk(&self, nodes: u64) -> u64 {
        let sets = if self.shared_negatives {
            1
        } else {
            self.chunk_size as u64
        };
        sets * self.scored_per_chunk(nodes)
    }

    /// Candidates a chunk side scores against, for the budget's worker scratch: the sampled
    /// negatives, or (1vsAll, KvsAll) at most every one of `nodes` entities.
    pub fn scored_per_chunk(&self, nodes: u64) -> u64 {
        if self.scores_all() {
            nodes
        } else {
            self.most_negatives() as u64
        }
    }

    /// The larger side's negatives per chunk (per edge with `shared_negatives = false`).
    pub fn most_negatives(&self) -> usize {
        self.negatives_of(true).max(self.negatives_of(false))
    }

    /// Negatives per chunk (per edge with `shared_negatives = false`) of the side that
    /// corrupts tails (`tail`) or heads: `negatives`, or `negatives_head` for heads.
    pub fn negatives_of(&self, tail: bool) -> usize {
        match self.negatives_head {
            Some(n) if !tail => n,
            _ => self.negatives,
        }
    }

    /// The key and message of what `training`, `label_smoothing` and `vsall_candidates` do
    /// not allow with the other options (among them every negative-sampling option set).
    fn check_vs_all(&self) -> Result<(), (&'static str, String)> {
        let ls = self.label_smoothing;
        if !(0.0..1.0).contains(&ls) {
            return Err((
                "label_smoothing",
                format!("must be a number in [0, 1), got {ls}"),
            ));
        }
        let mode = self.training.name();
        if !self.scores_all() {
            if ls != 0.0 {
                return Err((
                    "label_smoothing",
                    "applies to training \"1vsAll\" or \"KvsAll\" only (negative sampling has no labels over all entities)".into(),
                ));
            }
            if self.vsall_candidates != VsAllCandidates::All {
                return Err((
                    "vsall_candidates",
                    "applies to training \"1vsAll\" only".into(),
                ));
            }
            return Ok(());
        }
        // The negative-sampling options, where they differ from their defaults: 1vsAll and
        // KvsAll would otherwise ignore them without a word.
        let sampling = Self::default();
        for (key, set) in [
            ("shared_negatives", !self.shared_negatives),
            ("negatives_head", self.negatives_head.is_some()),
            ("negatives", self.negatives != sampling.negatives),
            (
                "degree_fraction",
                self.degree_fraction != sampling.degree_fraction,
            ),
            (
                "negative_pool",
                self.negative_pool != sampling.negative_pool,
            ),
            ("bank_rows", self.bank_rows != sampling.bank_rows),
        ] {
            if set {
                return Err((
                    key,
                    format!("applies to training \"negative_sampling\" (training {mode:?} scores every entity)"),
                ));
            }
        }
        if self.training == TrainingMode::KvsAll && self.vsall_candidates != VsAllCandidates::All {
            return Err((
                "vsall_candidates",
                "KvsAll labels every query with all its known answers, so it scores every entity; \"resident\" applies to training \"1vsAll\" only".into(),
            ));
        }
        if self.loss == LossKind::Margin {
            return Err((
                "loss",
                format!("training {mode:?} takes loss \"softmax\" (cross-entropy) or \"logistic\" (BCE), not \"margin\""),
            ));
        }
        if self.adversarial_temperature.is_some() {
            return Err((
                "adversarial_temperature",
                format!("self-adversarial weighting weighs sampled negatives; training {mode:?} scores every entity"),
            ));
        }
        if self.corrupt == Corrupt::Bernoulli {
            return Err((
                "corrupt",
                format!("training {mode:?} asks both queries of an edge, or one side (tail, head); \"bernoulli\" samples negatives"),
            ));
        }
        let model = crate::model::ScoreModel {
            kind: self.model,
            dim: self.dim,
            transe_norm: self.transe_norm,
            pbg: self.pbg_form(),
        };
        match model.product_query() {
            Ok(_) => Ok(()),
            Err(why) => Err(("training", format!("training {mode:?}: {why}"))),
        }
    }
}

/// The `[embed.plan]` section: an epoch schedule to show (`strata embed plan`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PlanOptions {
    /// number of node partitions n
    #[schemars(range(min = 1), extend("x-required" = true))]
    pub partitions: u32,
    /// partitions resident at once (legend needs 3; sequential needs 2)
    #[schemars(range(min = 1))]
    pub buffer: usize,
    /// partition order: legend (Legend's Alg. 1+2, built for prefetching; buffer 3), beta
    /// (Marius's BETA; any buffer >= 2), sequential (one pair at a time; buffer 2)
    pub ordering: OrderingKind,
}

impl Default for PlanOptions {
    /// `partitions` is required (0 is refused).
    fn default() -> Self {
        PlanOptions {
            partitions: 0,
            buffer: 3,
            ordering: OrderingKind::Legend,
        }
    }
}

impl Section for PlanOptions {
    const NAME: &'static str = "embed.plan";
}

/// Which edges `strata embed eval` ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum EvalSplit {
    Valid,
    #[default]
    Test,
    Train,
}

impl EvalSplit {
    /// The split's name in the store.
    pub fn name(self) -> &'static str {
        match self {
            EvalSplit::Valid => "valid",
            EvalSplit::Test => "test",
            EvalSplit::Train => "train",
        }
    }
}

/// The evaluation protocol `strata embed eval` uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema, Default)]
#[serde(rename_all = "lowercase")]
pub enum EvalProtocol {
    /// The run's own (its `eval_protocol`).
    #[default]
    Run,
    /// Against every entity, other known true triples skipped.
    Filtered,
    /// Against sampled candidates.
    Sampled,
}

impl EvalProtocol {
    /// The protocol to evaluate with; None: the run's.
    pub fn protocol(self) -> Option<Protocol> {
        match self {
            EvalProtocol::Run => None,
            EvalProtocol::Filtered => Some(Protocol::Filtered),
            EvalProtocol::Sampled => Some(Protocol::Sampled),
        }
    }
}

/// The `[embed.eval]` section: ranking metrics of a run's checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EvalOptions {
    /// edges to rank
    pub split: EvalSplit,
    /// checkpoint to use: best (by validation MRR) or last
    pub checkpoint: Which,
    /// evaluation protocol (run: the run's own)
    pub protocol: EvalProtocol,
    /// at most this many queries (0: the run's setting)
    pub max_queries: usize,
    /// memory budget (default: the run's)
    pub memory: Option<Size>,
    /// threads (0: the run's setting)
    pub threads: usize,
    /// where the scores are computed: cpu (the Rust kernels), cuda or cuda:N (torch on that
    /// GPU), or torch-cpu (the same torch code on the CPU); the ranks are the same
    pub device: String,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            split: EvalSplit::default(),
            checkpoint: Which::default(),
            protocol: EvalProtocol::default(),
            max_queries: 0,
            memory: None,
            threads: 0,
            device: "cpu".into(),
        }
    }
}

impl Section for EvalOptions {
    const NAME: &'static str = "embed.eval";

    fn validate(&self) -> Result<(), ConfigError> {
        check_device(&self.device).map_err(|msg| ConfigError::new(Self::NAME, "device", msg))
    }
}

/// Whether `device` is one the engine knows: `cpu`, `torch-cpu`, `cuda` or `cuda:N`.
fn check_device(device: &str) -> Result<(), String> {
    let cuda_n = |d: &str| {
        d.strip_prefix("cuda:")
            .is_some_and(|n| n.parse::<u32>().is_ok())
    };
    if matches!(device, "cpu" | "torch-cpu" | "cuda") || cuda_n(device) {
        return Ok(());
    }
    Err(format!(
        "expected cpu, torch-cpu, cuda or cuda:N, got {device:?}"
    ))
}

/// The `[embed.predict]` section: the best answers of one query of a run's checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PredictOptions {
    /// predict tails of (HEAD, RELATION, ?): a node name, or id without names
    pub head: Option<String>,
    /// predict heads of (?, RELATION, TAIL)
    pub tail: Option<String>,
    /// relation name (or id); may be left out when the graph has one type
    pub relation: Option<String>,
    /// answers to print
    #[schemars(range(min = 1))]
    pub top: usize,
    /// leave out answers already in the graph (any split)
    pub exclude_known: bool,
    /// checkpoint to use: best (by validation MRR) or last
    pub checkpoint: Which,
    /// memory budget (default: the run's)
    pub memory: Option<Size>,
}

impl Default for PredictOptions {
    fn default() -> Self {
        PredictOptions {
            head: None,
            tail: None,
            relation: None,
            top: 10,
            exclude_known: false,
            checkpoint: Which::Best,
            memory: None,
        }
    }
}

impl Section for PredictOptions {
    const NAME: &'static str = "embed.predict";

    fn validate(&self) -> Result<(), ConfigError> {
        self.query().map(drop)
    }
}

impl PredictOptions {
    /// The query's node and whether heads are predicted (`(?, relation, tail)`), or an error
    /// unless exactly one of `head` and `tail` is given.
    pub fn query(&self) -> Result<(&str, bool), ConfigError> {
        match (&self.head, &self.tail) {
            (Some(head), None) => Ok((head, false)),
            (None, Some(tail)) => Ok((tail, true)),
            _ => Err(ConfigError::new(
                Self::NAME,
                "head",
                "give exactly one of --head and --tail",
            )),
        }
    }
}

/// The `[embed.export]` section: a run's checkpoint written out in node-id order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ExportOptions {
    /// directory to write (embeddings, relations, id maps, export.json)
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// npy: float32 arrays in id order plus name files; tsv: name<TAB>values; parquet: id,
    /// name, embedding columns (pyarrow); pbg: a PyTorch-BigGraph checkpoint directory (h5py)
    pub format: ExportFormat,
    /// checkpoint to use: best (by validation MRR) or last
    pub checkpoint: Which,
    /// replace OUT if it exists
    pub overwrite: bool,
    /// memory budget (default: the run's)
    pub memory: Option<Size>,
}

impl Default for ExportOptions {
    /// `out` is required (empty is refused).
    fn default() -> Self {
        ExportOptions {
            out: PathBuf::new(),
            format: ExportFormat::Npy,
            checkpoint: Which::Best,
            overwrite: false,
            memory: None,
        }
    }
}

/// The `[embed.gather]` section: one run from every rank's directory of an owner-mode run
/// (`dist_storage = owners`); which directories, and where to, are the command's arguments.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct GatherOptions {
    /// this machine's copy of the store (default: the path rank 0 trained on)
    #[schemars(extend("x-kind" = "path"))]
    pub store: Option<PathBuf>,
    /// replace OUT if it holds a run
    pub overwrite: bool,
}

impl Section for GatherOptions {
    const NAME: &'static str = "embed.gather";
}

impl Section for ExportOptions {
    const NAME: &'static str = "embed.export";

    fn validate(&self) -> Result<(), ConfigError> {
        if self.out.as_os_str().is_empty() {
            return Err(ConfigError::new(
                Self::NAME,
                "out",
                "needs an output directory",
            ));
        }
        Ok(())
    }
}
