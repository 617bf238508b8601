//! `manifest.json`: what a store holds, and the shape every array must have.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::npy::DType;

/// The `format` field of every manifest.
pub const FORMAT_NAME: &str = "strata-store";
/// The format version this Strata writes and the newest it reads.
pub const FORMAT_VERSION: u32 = 1;

/// Edge splits, in the order they are listed everywhere.
pub const SPLITS: [&str; 3] = ["train", "valid", "test"];

/// One array of a store: its file (relative to the store) and what its header must say.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayInfo {
    pub file: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
}

impl ArrayInfo {
    /// Size of the data in bytes.
    pub fn data_bytes(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.size() as u64
    }
}

/// The graph's sizes and id layout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GraphInfo {
    pub num_nodes: u64,
    /// Number of relation types; 0 when edges have no relation column.
    pub num_relations: u64,
    /// Integer type of node and relation ids in every id array (int32 when they fit).
    pub id_dtype: DType,
    /// Edges per split (`train`, and `valid`/`test` when the store has them).
    pub num_edges: BTreeMap<String, u64>,
    /// Edges in CSR/CSC: the train edges, doubled when `symmetrized`.
    pub num_topology_edges: u64,
    /// CSR and CSC hold every train edge in both directions (and are then the same arrays).
    pub symmetrized: bool,
    /// The store maps original node names to dense ids (`node_names_*` arrays).
    pub node_names: bool,
    /// The store keeps relation names (`relation_names_*` arrays).
    pub relation_names: bool,
}

impl GraphInfo {
    /// Columns of each edge array.
    pub fn edge_columns(&self) -> &'static [&'static str] {
        if self.num_relations > 0 {
            &["src", "rel", "dst"]
        } else {
            &["src", "dst"]
        }
    }

    /// Integer type of the degree arrays: int32 while every degree fits.
    pub fn degree_dtype(&self) -> DType {
        if self.num_topology_edges <= i32::MAX as u64 {
            DType::I32
        } else {
            DType::I64
        }
    }
}

/// The narrowest id type that holds ids in `[0, max_exclusive)`.
pub fn id_dtype_for(max_exclusive: u64) -> DType {
    if max_exclusive <= i32::MAX as u64 + 1 {
        DType::I32
    } else {
        DType::I64
    }
}

/// Node features: one row of `dim` values per node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureInfo {
    pub dim: u64,
    pub dtype: DType,
}

/// Node labels: `int32`, `-1` for unlabelled nodes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelInfo {
    pub num_classes: u64,
}

/// Summary of a degree distribution (exact).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DegreeStats {
    pub min: u64,
    pub max: u64,
    pub mean: f64,
    pub median: u64,
    pub p90: u64,
    pub p99: u64,
    /// Nodes with degree zero.
    pub zeros: u64,
}

/// Statistics computed at conversion time, so `strata info` is instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GraphStats {
    pub out_degree: DegreeStats,
    pub in_degree: DegreeStats,
}

/// The whole manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub format_version: u32,
    pub strata_version: String,
    pub name: String,
    pub graph: GraphInfo,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeatureInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelInfo>,
    /// Number of nodes in each node split (`node_train`, ... arrays of node ids).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_splits: BTreeMap<String, u64>,
    pub stats: GraphStats,
    pub arrays: BTreeMap<String, ArrayInfo>,
    /// Where the store came from: converter, inputs, options, timings.
    #[serde(default)]
    pub provenance: serde_json::Value,
}

/// An array the manifest requires: its name, dtype and exact shape (`None` entries are free).
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Option<u64>>,
}

impl Manifest {
    /// Every array this manifest's contents require, with dtype and shape.
    pub fn expected_arrays(&self) -> Vec<Expected> {
        let g = &self.graph;
        let n = g.num_nodes;
        let e = |name: &str, dtype: DType, shape: &[Option<u64>]| Expected {
            name: name.to_string(),
            dtype,
            shape: shape.to_vec(),
        };
        let mut out = Vec::new();
        let cols = g.edge_columns().len() as u64;
        for (split, &count) in &g.num_edges {
            out.push(e(
                &format!("edges_{split}"),
                g.id_dtype,
                &[Some(count), Some(cols)],
            ));
        }
        for dir in ["csr", "csc"] {
            out.push(e(&format!("{dir}_indptr"), DType::I64, &[Some(n + 1)]));
            out.push(e(
                &format!("{dir}_indices"),
                g.id_dtype,
                &[Some(g.num_topology_edges)],
            ));
        }
        out.push(e("out_degree", g.degree_dtype(), &[Some(n)]));
        out.push(e("in_degree", g.degree_dtype(), &[Some(n)]));
        if g.node_names {
            out.push(e("node_names_offsets", DType::I64, &[Some(n + 1)]));
            out.push(e("node_names_bytes", DType::U8, &[None]));
        }
        if g.relation_names {
            out.push(e(
                "relation_names_offsets",
                DType::I64,
                &[Some(g.num_relations + 1)],
            ));
            out.push(e("relation_names_bytes", DType::U8, &[None]));
        }
        if let Some(f) = &self.features {
            out.push(e("features", f.dtype, &[Some(n), Some(f.dim)]));
        }
        if self.labels.is_some() {
            out.push(e("labels", DType::I32, &[Some(n)]));
        }
        for (split, &count) in &self.node_splits {
            out.push(e(&format!("node_{split}"), g.id_dtype, &[Some(count)]));
        }
        out
    }
}
