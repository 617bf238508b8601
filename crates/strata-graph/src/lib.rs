//! Graph primitives every engine may use: the adjacency in RAM with its edge columns
//! ([`Topology`] and the [`Adjacency`] trait), the multi-layer neighbour sampler
//! ([`NeighborSampler`]: uniform, weighted, temporal and per edge type), the reader of node
//! features on disk ([`features::FeatureReader`]), and the small interface every holder of
//! feature rows implements ([`FeatureStore`]); and the interface a service reads trained
//! embedding runs through ([`embedding_run::EmbeddingBackend`]); the locality-aware node orders
//! ([`order`]: breadth-first, Cuthill-McKee, GLIST's, label-propagation communities) and the
//! writer of a store renumbered by one ([`reorder`], `strata reorder`).
//!
//! This crate sits between the foundation (`strata-io`, `strata-store`) and the engines; the
//! engines share these types through it and never depend on each other (see
//! `docs/architecture.md`).

pub mod embedding_run;
pub mod error;
pub mod feature_store;
pub mod features;
pub mod order;
pub mod reorder;
pub mod sampler;
pub mod topology;

pub use error::{GraphError, Result};
pub use feature_store::{FeatureStore, Pending, PendingRead};
pub use sampler::{
    Block, HeteroSample, LinkSample, NeighborSampler, Sample, SamplerConfig, TemporalStrategy,
};
pub use topology::{Adjacency, ColumnSet, Direction, EdgeColumns, Edges, Topology};
