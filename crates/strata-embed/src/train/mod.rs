//! Training: the job, the epoch loops (single-process and distributed), the worker threads, negatives and corruption, owner mode and the cluster seam.

pub mod bernoulli;
pub mod dist;
pub mod dist_epoch;
pub mod epoch;
pub mod job;
pub mod overlap;
pub mod owner;
pub mod typed_negatives;
#[cfg(test)]
mod typed_tests;
pub mod worker;
