//! The out-of-core GNN data path after GIDS and Helios: topology in RAM, node features on disk
//! read through the I/O engine, a neighbour sampler producing message-flow blocks.

pub mod accumulator;
pub mod budget;
pub mod cache;
pub mod data;
pub mod error;
pub mod features;
pub mod hotset;
pub mod pipeline;
pub mod sampler;
pub mod tiers;
pub mod topology;

pub use error::{GnnError, Result};
pub use sampler::{Block, LinkSample, NeighborSampler, Sample, SamplerConfig};
pub use topology::{Adjacency, Topology};
