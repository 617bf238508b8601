//! `manifest.json`: what a store holds, and the shape every array must have.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::npy::DType;

/// The `format` field of every manifest.
pub const FORMAT_NAME: &str = "strata-store";
/// The newest format version this Strata reads and writes. A store that uses none of version
/// 2's parts (node and edge types, edge attributes) is still written as version 1.
pub const FORMAT_VERSION: u32 = 2;

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

/// One node type (format 2): it owns the global ids `offset .. offset + count`, and its
/// per-type arrays (`features_tI`, `labels_tI`, `node_SPLIT_tI`, with `I` its index in
/// `node_types`) are indexed by the local id `global - offset`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeType {
    pub name: String,
    pub offset: u64,
    pub count: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeatureInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<LabelInfo>,
    /// Nodes in each node split of this type (`node_SPLIT_tI` arrays of local ids).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_splits: BTreeMap<String, u64>,
    /// Each node of this type as a bag of feature ids (`bag_offsets_tI`, `bag_features_tI`,
    /// feature names `bag_names_tI_*`): PyTorch-BigGraph's featurized entities.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bags: Option<BagInfo>,
}

/// A node type's feature bags: node `i`'s features are
/// `bag_features_tI[bag_offsets_tI[i]..bag_offsets_tI[i + 1]]`, ids below `num_features`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BagInfo {
    pub num_features: u64,
    /// Feature ids listed over all the type's bags.
    pub entries: u64,
}

/// One edge type (format 2): its id is its index in `edge_types`, which the edge lists'
/// relation column and `csr_etype`/`csc_etype` hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeType {
    /// Index of the source node type.
    pub src_type: u64,
    pub relation: String,
    /// Index of the destination node type.
    pub dst_type: u64,
}

/// Per-edge attributes (format 2), stored parallel to each edge list and to CSR/CSC.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EdgeAttributes {
    /// float32 weights: `edge_weights_SPLIT`, `csr_weights`, `csc_weights`.
    #[serde(default)]
    pub weights: bool,
    /// int64 timestamps: `edge_times_SPLIT`, `csr_times`, `csc_times`.
    #[serde(default)]
    pub times: bool,
    /// Features of the train edges (`edge_features_train`, fetched through `csr_eid`/`csc_eid`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<FeatureInfo>,
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
    /// Node types in id order (format 2); empty in an untyped store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_types: Vec<NodeType>,
    /// Edge types by id (format 2); present exactly when `node_types` is.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edge_types: Vec<EdgeType>,
    /// Per-edge weights, times and features (format 2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_attributes: Option<EdgeAttributes>,
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

/// Integer type of `csr_etype`/`csc_etype` for `num_edge_types` edge types: the smallest
/// unsigned type that holds every edge-type id.
pub fn etype_dtype_for(num_edge_types: u64) -> DType {
    if num_edge_types <= 1 << 8 {
        DType::U8
    } else if num_edge_types <= 1 << 16 {
        DType::U16
    } else {
        DType::U32
    }
}

impl Manifest {
    /// The store has node and edge types.
    pub fn is_typed(&self) -> bool {
        !self.node_types.is_empty()
    }

    /// The format version these contents need: 2 when they use node or edge types or edge
    /// attributes, else 1 (so plain stores stay readable by older readers).
    pub fn required_version(&self) -> u32 {
        if self.is_typed() || self.edge_attributes.is_some() {
            2
        } else {
            1
        }
    }

    /// Integer type of `csr_eid`/`csc_eid` (ids into `edges_train`).
    pub fn eid_dtype(&self) -> DType {
        id_dtype_for(self.graph.num_edges.get("train").copied().unwrap_or(0))
    }

    /// The node type owning global id `node` (binary search over the offsets), if typed.
    pub fn node_type_of(&self, node: u64) -> Option<usize> {
        let t = self.node_types.partition_point(|t| t.offset <= node);
        (t > 0 && node < self.graph.num_nodes).then(|| t - 1)
    }

    /// Disagreements between the manifest's fields (format 2's types and attributes against
    /// the graph's sizes), one message each, naming the field; empty when consistent.
    pub fn field_problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let g = &self.graph;
        if self.format_version < self.required_version() {
            out.push(format!(
                "format_version is {} but node_types, edge_types or edge_attributes need version 2",
                self.format_version
            ));
        }
        if self.node_types.is_empty() != self.edge_types.is_empty() {
            out.push(
                "node_types and edge_types must both be present (a typed store) or both absent"
                    .into(),
            );
        }
        let mut next = 0u64;
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.node_types.iter().enumerate() {
            if t.offset != next {
                out.push(format!(
                    "node_types[{i}] ('{}') starts at id {} but the types before it end at {next}: types must cover the ids in order without gaps",
                    t.name, t.offset
                ));
            }
            next = t.offset.saturating_add(t.count);
            if !names.insert(t.name.as_str()) {
                out.push(format!(
                    "node_types[{i}]: the name '{}' is used twice",
                    t.name
                ));
            }
            if t.features.as_ref().is_some_and(|f| f.dim == 0) {
                out.push(format!("node_types[{i}].features.dim must be positive"));
            }
            if t.bags.as_ref().is_some_and(|b| b.num_features == 0) {
                out.push(format!(
                    "node_types[{i}].bags.num_features must be positive"
                ));
            }
            for split in t.node_splits.keys() {
                if !SPLITS.contains(&split.as_str()) {
                    out.push(format!(
                        "node_types[{i}].node_splits: unknown split '{split}' (train, valid, test)"
                    ));
                }
            }
        }
        if self.is_typed() {
            if next != g.num_nodes {
                out.push(format!(
                    "node_types cover ids 0..{next} but graph.num_nodes is {}",
                    g.num_nodes
                ));
            }
            if g.num_relations != self.edge_types.len() as u64 {
                out.push(format!(
                    "graph.num_relations is {} but there are {} edge_types (the relation column holds the edge type)",
                    g.num_relations,
                    self.edge_types.len()
                ));
            }
            for (field, present) in [
                ("features", self.features.is_some()),
                ("labels", self.labels.is_some()),
                ("node_splits", !self.node_splits.is_empty()),
                ("graph.relation_names", g.relation_names),
                ("graph.symmetrized", g.symmetrized),
            ] {
                if present {
                    out.push(format!(
                        "{field} is not allowed in a typed store (node data is per node type, relation names are in edge_types, and reverse edges are edge types of their own)"
                    ));
                }
            }
        }
        let types = self.node_types.len() as u64;
        let mut seen = std::collections::BTreeSet::new();
        for (i, e) in self.edge_types.iter().enumerate() {
            if e.src_type >= types || e.dst_type >= types {
                out.push(format!(
                    "edge_types[{i}] ('{}') names node type {} but there are {types} node types",
                    e.relation,
                    e.src_type.max(e.dst_type)
                ));
            }
            if !seen.insert((e.src_type, e.relation.as_str(), e.dst_type)) {
                out.push(format!(
                    "edge_types[{i}] repeats ({}, '{}', {})",
                    e.src_type, e.relation, e.dst_type
                ));
            }
        }
        if let Some(f) = self
            .edge_attributes
            .as_ref()
            .and_then(|a| a.features.as_ref())
        {
            if f.dim == 0 {
                out.push("edge_attributes.features.dim must be positive".into());
            }
        }
        out
    }

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
        self.expected_v2_arrays(&mut out);
        out
    }

    /// Format 2's arrays: edge-type and edge-id columns of CSR/CSC, edge attributes, and the
    /// per-node-type arrays.
    fn expected_v2_arrays(&self, out: &mut Vec<Expected>) {
        let g = &self.graph;
        let e = |name: String, dtype: DType, shape: &[Option<u64>]| Expected {
            name,
            dtype,
            shape: shape.to_vec(),
        };
        let t = Some(g.num_topology_edges);
        if self.required_version() >= 2 {
            for dir in ["csr", "csc"] {
                out.push(e(format!("{dir}_eid"), self.eid_dtype(), &[t]));
                if self.is_typed() {
                    out.push(e(
                        format!("{dir}_etype"),
                        etype_dtype_for(self.edge_types.len() as u64),
                        &[t],
                    ));
                }
            }
        }
        if let Some(a) = &self.edge_attributes {
            let columns = [
                (a.weights, "weights", DType::F32),
                (a.times, "times", DType::I64),
            ];
            for (_, what, dtype) in columns.iter().filter(|c| c.0) {
                for (split, &count) in &g.num_edges {
                    out.push(e(format!("edge_{what}_{split}"), *dtype, &[Some(count)]));
                }
                for dir in ["csr", "csc"] {
                    out.push(e(format!("{dir}_{what}"), *dtype, &[t]));
                }
            }
            if let Some(f) = &a.features {
                let train = g.num_edges.get("train").copied().unwrap_or(0);
                out.push(e(
                    "edge_features_train".into(),
                    f.dtype,
                    &[Some(train), Some(f.dim)],
                ));
            }
        }
        for (i, nt) in self.node_types.iter().enumerate() {
            if let Some(f) = &nt.features {
                out.push(e(
                    format!("features_t{i}"),
                    f.dtype,
                    &[Some(nt.count), Some(f.dim)],
                ));
            }
            if nt.labels.is_some() {
                out.push(e(format!("labels_t{i}"), DType::I32, &[Some(nt.count)]));
            }
            for (split, &count) in &nt.node_splits {
                out.push(e(format!("node_{split}_t{i}"), g.id_dtype, &[Some(count)]));
            }
            if let Some(b) = &nt.bags {
                out.push(e(
                    format!("bag_offsets_t{i}"),
                    DType::I64,
                    &[Some(nt.count + 1)],
                ));
                out.push(e(
                    format!("bag_features_t{i}"),
                    id_dtype_for(b.num_features),
                    &[Some(b.entries)],
                ));
                out.push(e(
                    format!("bag_names_t{i}_offsets"),
                    DType::I64,
                    &[Some(b.num_features + 1)],
                ));
                out.push(e(format!("bag_names_t{i}_bytes"), DType::U8, &[None]));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A typed manifest: paper ids 0..4, author ids 4..6, two edge types, weights.
    fn typed() -> Manifest {
        serde_json::from_value(serde_json::json!({
            "format": FORMAT_NAME, "format_version": 2, "strata_version": "0", "name": "t",
            "graph": {"num_nodes": 6, "num_relations": 2, "id_dtype": "int32",
                      "num_edges": {"train": 5}, "num_topology_edges": 5, "symmetrized": false,
                      "node_names": false, "relation_names": false},
            "node_types": [{"name": "paper", "offset": 0, "count": 4},
                           {"name": "author", "offset": 4, "count": 2,
                            "labels": {"num_classes": 3}, "node_splits": {"train": 1}}],
            "edge_types": [{"src_type": 0, "relation": "cites", "dst_type": 0},
                           {"src_type": 1, "relation": "writes", "dst_type": 0}],
            "edge_attributes": {"weights": true, "times": false},
            "stats": GraphStats::default(), "arrays": {}
        }))
        .unwrap()
    }

    #[test]
    fn typed_manifest_requires_version_2_arrays() {
        let m = typed();
        assert_eq!(m.required_version(), 2);
        assert!(m.field_problems().is_empty(), "{:?}", m.field_problems());
        assert_eq!(m.node_type_of(3), Some(0));
        assert_eq!(m.node_type_of(4), Some(1));
        assert_eq!(m.node_type_of(6), None);
        let want: BTreeMap<String, (DType, Vec<Option<u64>>)> = m
            .expected_arrays()
            .into_iter()
            .map(|e| (e.name, (e.dtype, e.shape)))
            .collect();
        assert_eq!(want["csc_etype"], (DType::U8, vec![Some(5)]));
        assert_eq!(want["csr_eid"], (DType::I32, vec![Some(5)]));
        assert_eq!(want["edge_weights_train"], (DType::F32, vec![Some(5)]));
        assert_eq!(want["labels_t1"], (DType::I32, vec![Some(2)]));
        assert_eq!(want["node_train_t1"], (DType::I32, vec![Some(1)]));
        assert!(!want.contains_key("csr_times") && !want.contains_key("labels_t0"));
    }

    #[test]
    fn field_problems_name_the_field() {
        let mut m = typed();
        m.node_types[1].offset = 5;
        m.edge_types[1].dst_type = 7;
        m.graph.symmetrized = true;
        m.format_version = 1;
        let p = m.field_problems().join("\n");
        for needle in [
            "format_version is 1 but node_types, edge_types or edge_attributes need version 2",
            "node_types[1] ('author') starts at id 5 but the types before it end at 4",
            "node_types cover ids 0..7 but graph.num_nodes is 6",
            "edge_types[1] ('writes') names node type 7 but there are 2 node types",
            "graph.symmetrized is not allowed in a typed store",
        ] {
            assert!(p.contains(needle), "{needle} not in {p}");
        }
        let mut plain = typed();
        plain.node_types.clear();
        plain.edge_types.clear();
        plain.edge_attributes = None;
        plain.graph.num_relations = 0;
        assert_eq!(plain.required_version(), 1);
        assert!(plain.field_problems().is_empty());
    }

    #[test]
    fn etype_dtype_is_the_smallest_that_fits() {
        assert_eq!(etype_dtype_for(256), DType::U8);
        assert_eq!(etype_dtype_for(257), DType::U16);
        assert_eq!(etype_dtype_for(1 << 16), DType::U16);
        assert_eq!(etype_dtype_for((1 << 16) + 1), DType::U32);
    }
}
