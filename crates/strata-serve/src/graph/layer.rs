//! The layers of mutations laid over a store version, and a view of the graph through them
//! (see [`super::overlay`] for how layers are made, frozen and folded).
//!
//! A layer holds complete replacement neighbour lists for the vertices its mutations touched
//! (copied on first touch), so a reader finds a vertex's list in one place: the newest layer
//! that has it, else the base. The sampler therefore borrows lists as slices, as it does from
//! the store's CSC.

use std::collections::{HashMap, HashSet};

use strata_graph::{Adjacency, Topology};

use super::version::BaseGraph;

/// The changes of a run of mutations: totals after them, and the lists and rows they replaced.
#[derive(Debug, Default, Clone)]
pub struct Layer {
    pub(super) in_lists: HashMap<u32, Vec<u32>>,
    pub(super) out_lists: HashMap<u32, Vec<u32>>,
    pub(super) features: HashMap<u32, Vec<f32>>,
    pub(super) removed: HashSet<u32>,
    /// Vertex ids handed out, removed ones included, after this layer.
    pub num_nodes: u32,
    /// Vertices not removed, after this layer.
    pub live_nodes: u64,
    /// Edges, after this layer.
    pub num_edges: u64,
    /// Mutations applied in this layer.
    pub mutations: u64,
}

impl Layer {
    /// The feature row a mutation of this layer wrote for `v`, if any.
    pub fn feature_row(&self, v: u32) -> Option<&[f32]> {
        self.features.get(&v).map(Vec::as_slice)
    }

    /// Sets `v`'s feature row (see `GraphFeatures::update`, its only writer).
    pub(super) fn set_feature_row(&mut self, v: u32, row: Vec<f32>) {
        self.features.insert(v, row);
    }

    /// An empty layer over a graph with these totals.
    pub fn starting_at(num_nodes: u32, live_nodes: u64, num_edges: u64) -> Layer {
        Layer {
            num_nodes,
            live_nodes,
            num_edges,
            ..Layer::default()
        }
    }

    /// Bytes held, roughly (lists, rows and set entries).
    pub fn bytes(&self) -> u64 {
        let lists: usize = self
            .in_lists
            .values()
            .chain(self.out_lists.values())
            .map(|l| l.len() * 4 + 48)
            .sum();
        let rows: usize = self.features.values().map(|r| r.len() * 4 + 48).sum();
        (lists + rows + self.removed.len() * 8) as u64
    }
}

/// The graph as of the newest layer: the layers (newest first) over the base.
#[derive(Clone, Copy)]
pub struct View<'a> {
    base: &'a BaseGraph,
    /// Totals of the whole view (from the newest layer, or the base).
    totals: (u32, u64, u64),
    layers: &'a [&'a Layer],
}

impl<'a> View<'a> {
    /// A view of `base` under `layers` (newest first); `base_edges` and `base_live` are the
    /// base's totals.
    pub fn new(base: &'a BaseGraph, layers: &'a [&'a Layer], base_live: u64) -> View<'a> {
        let totals = match layers.first() {
            Some(l) => (l.num_nodes, l.live_nodes, l.num_edges),
            None => (base.num_nodes(), base_live, base.csc.num_edges()),
        };
        View {
            base,
            totals,
            layers,
        }
    }

    pub fn num_nodes(&self) -> u32 {
        self.totals.0
    }

    pub fn live_nodes(&self) -> u64 {
        self.totals.1
    }

    pub fn num_edges(&self) -> u64 {
        self.totals.2
    }

    /// Whether `v` (< num_nodes) has been removed.
    pub fn is_removed(&self, v: u32) -> bool {
        self.layers.iter().any(|l| l.removed.contains(&v))
            || self.base.removed.get(v as usize).copied().unwrap_or(false)
    }

    pub fn in_neighbors(&self, v: u32) -> &'a [u32] {
        self.list(v, |l| &l.in_lists, &self.base.csc)
    }

    pub fn out_neighbors(&self, v: u32) -> &'a [u32] {
        self.list(v, |l| &l.out_lists, &self.base.csr)
    }

    /// The feature row a mutation wrote for `v`, if any (else the base store's row holds).
    pub fn feature_row(&self, v: u32) -> Option<&'a [f32]> {
        self.layers.iter().find_map(|l| l.feature_row(v))
    }

    fn list(
        &self,
        v: u32,
        pick: fn(&Layer) -> &HashMap<u32, Vec<u32>>,
        base: &'a Topology,
    ) -> &'a [u32] {
        if let Some(list) = self.layers.iter().find_map(|l| pick(l).get(&v)) {
            return list;
        }
        if (v as usize) < base.num_nodes() {
            base.neighbors(v)
        } else {
            &[]
        }
    }
}

impl Adjacency for View<'_> {
    fn num_nodes(&self) -> usize {
        self.totals.0 as usize
    }

    fn neighbors(&self, v: u32) -> &[u32] {
        self.in_neighbors(v)
    }
}
