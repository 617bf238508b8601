//! The `degree` order.

use strata_store::registry::Named;

use super::shared::by_decreasing_degree;
use super::{Input, NodeOrder};
use crate::error::Result;
use crate::Topology;

/// Nodes by decreasing degree (out + in; ties: the lower id).
pub struct Degree;

impl Named for Degree {
    const NAME: &'static str = "degree";
    const HELP: &'static str =
        "by decreasing degree (out + in): the rows most often sampled share pages";
}

impl NodeOrder for Degree {
    fn input(&self) -> Input {
        Input::Undirected
    }

    /// The sorted ids: 4 bytes a node.
    fn work_bytes(&self) -> (u64, u64) {
        (4, 0)
    }

    fn order(&self, adj: &Topology) -> Result<Vec<u32>> {
        Ok(by_decreasing_degree(adj))
    }
}
