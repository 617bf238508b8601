//! The out-of-core GNN data path after GIDS and Helios: the feature tiers (hot set, dynamic
//! cache, device tier) over the feature reader, the accumulator and the batch pipeline. The
//! topology, sampler and reader it builds on are `strata-graph`'s.

pub mod accumulator;
pub mod budget;
pub mod cache;
pub mod data;
pub mod error;
pub mod hotset;
pub mod pipeline;
pub mod tiers;

pub use error::{GnnError, Result};
