//! Strata's out-of-core graph embedding training, after Legend (`../shared/papers/legend.txt`).

pub mod ordering;
