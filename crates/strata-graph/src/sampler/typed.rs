//! Heterogeneous sampling (PyG's `num_neighbors` dict keyed by edge type): a node takes, for
//! each edge type into it, that type's fanout of its in-edges of the type; and the sample
//! grouped by node type and edge type, as PyG's `HeteroSamplerOutput` holds it.
//!
//! A store's CSC keeps each node's segment ordered by (edge type, edge id), so the edges of
//! one type are one run, found by binary search. Node types are contiguous global id ranges,
//! so a sampled node's type is a binary search of the type offsets.

use std::ops::Range;

use super::Sample;
use crate::error::{GraphError, Result};

/// The runs of equal edge type in a segment's `types` (sorted), in order: `(type, positions)`.
pub(super) fn runs(types: &[u32]) -> impl Iterator<Item = (u32, Range<usize>)> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        let &t = types.get(start)?;
        let len = types[start..].partition_point(|&x| x <= t);
        let run = start..start + len;
        start += len;
        Some((t, run))
    })
}

/// A [`Sample`] grouped by type: PyG's heterogeneous sampler output. `N` node types, `R`
/// edge types, `H` hops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeteroSample {
    /// Per node type (`N` lists): the sampled nodes of the type as type-local ids (global id
    /// minus the type's offset), in the sample's order (seeds first, then hop by hop).
    pub nodes: Vec<Vec<u32>>,
    /// Per node type: nodes first reached at each hop, `H + 1` entries (hop 0: the seeds);
    /// PyG's `num_sampled_nodes`.
    pub hop_counts: Vec<Vec<usize>>,
    /// Per node type, for a disjoint (temporal) sample: the seed (index into the seeds) each
    /// node belongs to, parallel to `nodes`; empty lists otherwise. PyG's `batch`.
    pub batch: Vec<Vec<u32>>,
    /// Per edge type (`R` lists): each sampled edge's source as an index into the source
    /// type's `nodes`, hop 1's edges first. PyG's `row`.
    pub rows: Vec<Vec<u32>>,
    /// Per edge type: each sampled edge's destination as an index into the destination
    /// type's `nodes`, parallel to `rows`. PyG's `col`.
    pub cols: Vec<Vec<u32>>,
    /// Per edge type: sampled edges at each hop, `H` entries; PyG's `num_sampled_edges`.
    pub edges_per_hop: Vec<Vec<usize>>,
    /// Per edge type, when the sample has edge ids: each sampled edge's id (its row in the
    /// store's `edges_train`), parallel to `rows`; PyG's `edge`. Empty lists otherwise.
    pub edge_ids: Vec<Vec<u64>>,
}

impl HeteroSample {
    /// Groups `sample` (drawn from an adjacency with edge types) by the node types starting
    /// at `type_offsets` (ascending, the first 0: type `t` holds ids `type_offsets[t]..` up to
    /// the next offset) and `num_edge_types` edge types.
    pub fn new(
        sample: &Sample,
        type_offsets: &[u64],
        num_edge_types: usize,
    ) -> Result<HeteroSample> {
        if type_offsets.first() != Some(&0) || type_offsets.windows(2).any(|w| w[0] > w[1]) {
            return Err(GraphError::Config(format!(
                "sampler: node type offsets {type_offsets:?} must start at 0 and not decrease"
            )));
        }
        let hops = sample.blocks.len();
        let num_types = type_offsets.len();
        let disjoint = !sample.batch.is_empty();
        let mut out = HeteroSample {
            nodes: vec![Vec::new(); num_types],
            hop_counts: vec![vec![0; hops + 1]; num_types],
            batch: vec![Vec::new(); num_types],
            rows: vec![Vec::new(); num_edge_types],
            cols: vec![Vec::new(); num_edge_types],
            edges_per_hop: vec![vec![0; hops]; num_edge_types],
            edge_ids: vec![Vec::new(); num_edge_types],
        };
        // Each sample node's index among the nodes of its type.
        let mut type_local = Vec::with_capacity(sample.nodes.len());
        let mut hop_of = sample
            .hop_counts
            .iter()
            .enumerate()
            .flat_map(|(hop, &count)| std::iter::repeat_n(hop, count));
        for (j, &v) in sample.nodes.iter().enumerate() {
            let t = type_offsets.partition_point(|&o| o <= v as u64) - 1;
            type_local.push(out.nodes[t].len() as u32);
            out.nodes[t].push((v as u64 - type_offsets[t]) as u32);
            if disjoint {
                out.batch[t].push(sample.batch[j]);
            }
            let hop = hop_of.next().expect("hop_counts sum to the node count");
            out.hop_counts[t][hop] += 1;
        }
        for hop in 1..=hops {
            let block = &sample.blocks[hops - hop];
            let types = &sample.edge_types[hops - hop];
            let ids = &sample.edge_ids[hops - hop];
            if types.len() != block.num_edges() {
                return Err(GraphError::Config(
                    "sampler: the sample carries no edge types (its graph has none)".into(),
                ));
            }
            for dst in 0..block.num_dst {
                let first = block.indptr[dst] as usize;
                for (i, &src) in block.sources(dst).iter().enumerate() {
                    let e = types[first + i] as usize;
                    if e >= num_edge_types {
                        return Err(GraphError::Config(format!(
                            "sampler: edge type {e} is out of range ({num_edge_types} edge types)"
                        )));
                    }
                    out.rows[e].push(type_local[src as usize]);
                    out.cols[e].push(type_local[dst]);
                    out.edges_per_hop[e][hop - 1] += 1;
                    if let Some(&id) = ids.get(first + i) {
                        out.edge_ids[e].push(id);
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_split_sorted_types() {
        let got: Vec<_> = runs(&[0, 0, 2, 2, 2, 5]).collect();
        assert_eq!(got, [(0, 0..2), (2, 2..5), (5, 5..6)]);
        assert_eq!(runs(&[]).count(), 0);
        assert_eq!(runs(&[3]).collect::<Vec<_>>(), [(3, 0..1)]);
    }
}
