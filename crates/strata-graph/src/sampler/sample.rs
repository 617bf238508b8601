//! What a sampler returns: a batch's sampled computation graph ([`Sample`]) as one
//! [`Block`] per GNN layer, and a link-prediction batch ([`LinkSample`]).

/// One GNN layer's bipartite message-flow graph (DGL's block) in local ids.
///
/// Destination `i` is `Sample::nodes[i]` for `i < num_dst`, source `j` is `Sample::nodes[j]`
/// for `j < num_src`; since destinations are a prefix of sources, a layer's output rows for
/// the destinations are the first `num_dst` rows of its input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// Source (input) nodes: the first `num_src` of the sample's nodes.
    pub num_src: usize,
    /// Destination (output) nodes: the first `num_dst` of the sample's nodes; `num_dst <=
    /// num_src`.
    pub num_dst: usize,
    /// CSC over destinations, `num_dst + 1` offsets into `indices`: the sampled in-edges of
    /// destination `i` come from `indices[indptr[i]..indptr[i + 1]]`.
    pub indptr: Vec<u64>,
    /// Local source ids, each `< num_src`.
    pub indices: Vec<u32>,
}

impl Block {
    /// Sampled edges in this block.
    pub fn num_edges(&self) -> usize {
        self.indices.len()
    }

    /// Local sources of destination `i`.
    pub fn sources(&self, i: usize) -> &[u32] {
        &self.indices[self.indptr[i] as usize..self.indptr[i + 1] as usize]
    }
}

/// The sampled computation graph of one batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// Global ids of all nodes, indexed by local id: the seeds first (local ids `0..` number
    /// of seeds, in the order given), then the nodes first reached at hop 1, then hop 2, and
    /// so on. Feature rows are gathered in this order. Distinct, except in a disjoint
    /// (temporal) sample, where they are distinct per seed (see `batch`).
    pub nodes: Vec<u32>,
    /// Nodes first reached at each hop, `hops + 1` entries (hop 0: the seeds); PyG's
    /// `num_sampled_nodes`.
    pub hop_counts: Vec<usize>,
    /// One block per GNN layer in DGL order: `blocks[0]` is the input layer (outermost hop,
    /// sources = all nodes) and `blocks.last()` produces the seeds. The block of hop `h` is
    /// `blocks[hops - h]`.
    pub blocks: Vec<Block>,
    /// Sampled edges at each hop, hop 1 first, `hops` entries; PyG's `num_sampled_edges`.
    pub edges_per_hop: Vec<usize>,
    /// The edge type of every sampled edge, one list per block parallel to its `indices`,
    /// when the adjacency carries edge types; empty lists otherwise.
    pub edge_types: Vec<Vec<u32>>,
    /// The id of every sampled edge (its row in the store's `edges_train`), one list per
    /// block parallel to its `indices`, when the config asks for `edge_ids`; empty lists
    /// otherwise.
    pub edge_ids: Vec<Vec<u64>>,
    /// In a disjoint (temporal) sample, the seed each node belongs to (index into the seeds),
    /// parallel to `nodes`; PyG's `batch`. Empty otherwise.
    pub batch: Vec<u32>,
}

impl Sample {
    /// Number of seeds: the first rows of `nodes` and the destinations of the last block.
    pub fn num_seeds(&self) -> usize {
        self.hop_counts[0]
    }

    /// Sampled edges over all hops.
    pub fn num_edges(&self) -> usize {
        self.edges_per_hop.iter().sum()
    }

    /// A per-block edge column (`edge_types` or `edge_ids`) in [`Sample::edge_index`]'s
    /// order: hop 1's edges first.
    pub fn by_hop<T: Copy>(column: &[Vec<T>]) -> Vec<T> {
        column.iter().rev().flatten().copied().collect()
    }

    /// All sampled edges in one COO list, `(row, col)` = (local source, local destination),
    /// both of length `num_edges()`: hop 1's edges first, then hop 2's, ..., so slicing by
    /// `edges_per_hop` recovers each hop (PyG's `edge_index` in `source_to_target` flow, which
    /// its `trim_to_layer` slices the same way).
    ///
    /// Unlike PyG, which expands only the nodes first reached at the previous hop, each hop
    /// here re-samples every node known so far (DGL's blocks), so hop `h >= 2` also holds
    /// fresh edges into nodes of earlier hops.
    pub fn edge_index(&self) -> (Vec<u32>, Vec<u32>) {
        let total = self.num_edges();
        let (mut row, mut col) = (Vec::with_capacity(total), Vec::with_capacity(total));
        for block in self.blocks.iter().rev() {
            for dst in 0..block.num_dst {
                let sources = block.sources(dst);
                row.extend_from_slice(sources);
                col.resize(row.len(), dst as u32);
            }
        }
        (row, col)
    }
}

/// A link-prediction batch: the positive edges, their negatives, and the sample around all
/// their endpoints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkSample {
    /// Sampled around the distinct endpoints (sources, then destinations, then negative
    /// destinations, in order of first appearance), which are its seeds.
    pub sample: Sample,
    /// Local id of each positive edge's source, one per edge.
    pub src_local: Vec<u32>,
    /// Local id of each positive edge's destination, one per edge.
    pub dst_local: Vec<u32>,
    /// Local ids of the negative destinations, `negatives_per_edge` per edge, edge-major
    /// (edge `i`'s are `[i * negatives_per_edge, (i + 1) * negatives_per_edge)`); each pairs
    /// with `src_local[i]`.
    pub neg_dst_local: Vec<u32>,
}
