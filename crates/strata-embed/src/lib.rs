//! Strata's out-of-core graph embedding training, after Legend (`../shared/papers/legend.txt`).

pub mod bank;
pub mod bernoulli;
pub mod bf16;
pub mod budget;
pub mod buffer;
pub mod config;
pub mod dist;
pub mod dist_epoch;
pub mod entity_types;
pub mod epoch;
pub mod epoch_io;
pub mod error;
pub mod eval;
pub mod export;
pub mod gather;
pub mod gemm;
pub mod incremental;
pub mod job;
pub mod kernels;
pub mod model;
pub mod neighbors;
pub mod ordering;
pub mod overlap;
pub mod owner;
pub mod partitioning;
pub mod pbg;
pub mod query;
pub mod relations;
pub mod run_dir;
pub mod score;
pub mod serving;
pub mod shared;
pub mod table;
pub mod typed_negatives;
#[cfg(test)]
mod typed_tests;
pub mod worker;
