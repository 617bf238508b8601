//! Strata's out-of-core graph embedding training, after Legend (`../shared/papers/legend.txt`).
//!
//! The crate is a house of rooms, each a folder by role, lower rooms never reaching up:
//! the vocabulary at the root (`config`, `error`, `sizes`), pure policy (`model`: score
//! functions and losses; `ordering`: bucket orders), `compute` (dense kernels), `storage`
//! (partitions, the table file and its buffer, banks, relations, entity types, the epoch's
//! I/O), `plan` (the memory plan), `eval`, `train` (the job, epochs, workers, the cluster
//! seam), `run` (the run directory and its ways in and out) and `serve` (using a trained
//! run). The modules are private; what the bindings use is re-exported here.

mod compute;
mod config;
mod error;
mod eval;
mod model;
mod ordering;
mod plan;
mod run;
mod serve;
mod sizes;
mod storage;
#[cfg(test)]
mod tests;
mod train;

/// The `[embed.*]` config sections (their `///` comments are the help texts).
pub use compute::backend::{DeviceCounters, SlotKind, StepCounters};
pub use compute::device::{
    register_device, DeviceBank, DeviceCtx, DeviceFactory, DeviceLanding, DevicePiece, DeviceStep,
    DeviceTable,
};
pub use config::{
    EvalOptions, ExportFormat, ExportOptions, GatherOptions, PlanOptions, PredictOptions,
    TrainConfig,
};
/// The engine's typed error and its `Result`.
pub use error::{EmbedError, Result};
/// The device side of evaluation: the torch evaluator registers itself behind the ranker seam.
pub use eval::device::{register_device_rank, DeviceRank, DeviceRankFactory, RankJob};
/// A run's score function and dimensions, from its config.
pub use model::ScoreModel;
/// An ordering's epoch schedule: buffer states and the buckets trained in each.
pub use ordering::schedule;
/// The memory plan of a training run at a given budget.
pub use plan::budget::plan_fitting;
/// How a torch device's free memory is asked for (`device_memory = auto`).
pub use plan::device::{register_device_memory, DeviceMemoryInfo};
/// The plan `strata embed train` makes for a store, without training.
pub use plan::store_plan::plan_for;
/// Export of a checkpoint in node-id order, to files or to an outside row writer.
pub use run::export::{export_with, RowSink};
/// One ordinary run from the directories of an owner-mode run.
pub use run::gather::gather;
/// A checkpoint opened for evaluation and queries within a memory budget.
pub use run::loaded::Loaded;
/// PyTorch-BigGraph checkpoints both ways, through an outside HDF5 writer and reader.
pub use run::pbg::{export as export_pbg, import as import_pbg, Dataset, Hdf5, ImportPbgOptions};
/// An opened run directory.
pub use run::run_dir::Run;
/// Nearest neighbours of nodes' embeddings.
pub use serve::neighbors::{neighbors, resolve_queries, Metric, NeighborsOptions};
/// Scores of named triples, one by one or from a file.
pub use serve::score::{score_file, score_named, ScoreOptions};
/// A trained run as the service's embedding backend.
pub use serve::serving::Backend as ServingBackend;
/// The node table's node counts for planning (typed or untyped).
pub use storage::entity_types::node_shape;
/// The node table's byte layout.
pub use storage::layout::TableLayout;
/// The node table file, read and written by partition.
pub use storage::table::TableFile;
/// What a distributed run needs from its group of ranks (implemented over torch outside).
pub use train::dist::{Cluster, Grant, PartitionSource};
/// A whole training job, single-process or one rank of a group.
pub use train::job::train_group;
pub use train::typed_negatives::DrawSpan;
