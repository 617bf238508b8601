//! Using a trained run: evaluation of a checkpoint, top-k prediction, scores of triples, nearest neighbours, and the service backend.

pub mod neighbors;
pub mod query;
pub mod score;
pub mod serving;
