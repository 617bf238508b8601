//! Strata's out-of-core graph embedding training, after Legend (`../shared/papers/legend.txt`).

pub mod compute;
pub mod config;
pub mod error;
pub mod eval;
pub mod model;
pub mod ordering;
pub mod plan;
pub mod run;
pub mod serve;
pub mod sizes;
pub mod storage;
pub mod train;
