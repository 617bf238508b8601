//! Using a trained run: evaluation of a checkpoint, top-k prediction, scores of triples, nearest neighbours, and the service backend.

pub(crate) mod neighbors;
pub(crate) mod query;
pub(crate) mod score;
pub(crate) mod serving;
