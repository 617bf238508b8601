//! Training: the job (a coordinator of an iteration manager, a checkpoint manager and a bucket scheduler over a group of ranks), the epoch loops (single-process and distributed), the worker threads, negatives and corruption, owner mode and the cluster seam.

pub(crate) mod all_entities;
pub(crate) mod arrange;
pub(crate) mod bernoulli;
pub(crate) mod checkpoint;
pub(crate) mod dist;
pub(crate) mod dist_epoch;
pub(crate) mod epoch;
pub(crate) mod group;
pub(crate) mod iteration;
pub(crate) mod job;
pub(crate) mod overlap;
pub(crate) mod owner;
pub(crate) mod schedule;
pub(crate) mod typed_negatives;
#[cfg(test)]
mod typed_tests;
pub(crate) mod vs_all;
pub(crate) mod worker;
