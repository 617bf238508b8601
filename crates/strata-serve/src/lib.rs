//! Strata's near-data graph learning service (GLIST, ATC'21): a gRPC server next to the data
//! that registers graphs and models, applies durable mutations, and answers analysis requests
//! (embeddings, classes, link scores) with native GNN inference over sampled neighbourhoods,
//! and serves trained embedding runs (top-k, scores, neighbours) through an embedding backend,
//! so that only small results cross the network.

pub mod budget;
pub mod commit;
pub mod config;
pub mod durable;
pub mod embeddings;
pub mod error;
pub mod executor;
pub mod graph;
pub mod idle;
pub mod memory;
pub mod model;
pub mod page_cache;
pub mod proto;
pub mod registered;
pub mod registry;
pub mod roots;
pub mod schedule;
pub mod server;
pub mod service;
pub mod service_embed;
pub mod shared;
pub mod store_plan;
pub mod wal;
pub mod wire;

pub use error::{Result, ServeError};
