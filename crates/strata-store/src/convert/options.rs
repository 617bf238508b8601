//! The `[convert]` config section ([`ConvertOptions`]): every option of `strata convert`. The
//! input formats ([`super::source`]) plan the inputs from the checked values (format
//! detection, file roles) and build their converter's job from them. The section sits below
//! the formats, which read it, so the format it names is a [`FormatName`]; the checks that
//! need the registry of formats (`Section::validate`, the schema of `format`) are `source`'s.

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::config::Size;

/// Three fractions (train, valid, test) in [0, 1] summing to 1 with train > 0. Accepts a list
/// or a string such as `0.9,0.05,0.05`; serializes as the list. Its schema says
/// `"x-kind": "fractions"`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(transparent)]
pub struct Fractions(pub [f64; 3]);

impl Fractions {
    /// `f` if it is a split (see [`Fractions`]), else why not.
    pub fn check(f: [f64; 3]) -> Result<Fractions, String> {
        if f.iter().any(|x| !(0.0..=1.0).contains(x))
            || (f.iter().sum::<f64>() - 1.0).abs() > 1e-6
            || f[0] <= 0.0
        {
            return Err(format!(
                "expected three fractions (train, valid, test) in [0, 1] summing to 1 with train > 0, got {f:?}"
            ));
        }
        Ok(Fractions(f))
    }
}

impl<'de> Deserialize<'de> for Fractions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Fractions, D::Error> {
        struct FractionsVisitor;
        impl<'de> Visitor<'de> for FractionsVisitor {
            type Value = Fractions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("three fractions like 0.9,0.05,0.05")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Fractions, E> {
                let parts: Result<Vec<f64>, _> = v.split(',').map(|p| p.trim().parse()).collect();
                match parts.ok().and_then(|p| <[f64; 3]>::try_from(p).ok()) {
                    Some(f) => Fractions::check(f).map_err(E::custom),
                    None => Err(E::custom(format!(
                        "expected three fractions like 0.9,0.05,0.05, got '{v}'"
                    ))),
                }
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Fractions, A::Error> {
                let mut parts = Vec::new();
                while let Some(x) = seq.next_element::<f64>()? {
                    parts.push(x);
                }
                let n = parts.len();
                let f = <[f64; 3]>::try_from(parts).map_err(|_| {
                    serde::de::Error::custom(format!("expected three fractions, got {n}"))
                })?;
                Fractions::check(f).map_err(serde::de::Error::custom)
            }
        }
        d.deserialize_any(FractionsVisitor)
    }
}

impl JsonSchema for Fractions {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Fractions".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": ["array", "string"],
            "items": {"type": "number"},
            "x-kind": "fractions",
        })
    }
}

/// The stored feature dtype, or `auto` (float16 stays, everything else becomes float32).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StoredFeatureDtype {
    #[default]
    Auto,
    Float32,
    Float16,
}

/// How fields are separated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Delimiter {
    /// Decide per file from its first data line: tab if it has one, else comma, else spaces.
    Auto,
    /// Tab-separated.
    Tab,
    /// CSV: comma-separated, fields may be double-quoted with `""` as an escaped quote.
    Comma,
    /// Any run of spaces and tabs.
    Whitespace,
}

/// How ids in a column are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum IdKind {
    /// Integers if the first lines hold only canonical integers (no sign, no leading zero),
    /// names otherwise.
    Auto,
    /// Arbitrary names, renumbered densely in sorted order.
    String,
    /// Non-negative integers used as dense ids directly.
    Int,
}

/// How an edge array is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EdgeLayout {
    /// `(E, 2|3)` rows unless the shape only fits `(2|3, E)`.
    #[default]
    Auto,
    /// One edge per row: `(E, 2)` as (src, dst) or `(E, 3)` as (src, rel, dst).
    Rows,
    /// One edge per column, like PyG's `edge_index`: `(2, E)` or `(3, E)`.
    Columns,
}

/// The I/O request size of a conversion unless the section says otherwise.
pub(crate) fn default_io_chunk() -> Size {
    Size(crate::array::IO_CHUNK as u64)
}

/// The input format the `[convert]` section names: `auto` or a registered format's name
/// (checked, and turned into the format, by `source`; its schema lists the registered
/// formats with their help).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FormatName(pub(crate) String);

impl FormatName {
    /// The name as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for FormatName {
    /// `auto`: decided from the inputs.
    fn default() -> Self {
        FormatName("auto".into())
    }
}

/// `strata convert`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ConvertOptions {
    /// input files (train edges), or one directory holding train/valid/test files, NumPy
    /// arrays (edges.npy, ...) or Planetoid files (ind.NAME.*)
    #[schemars(extend("x-positional" = true, "x-kind" = "path"))]
    pub inputs: Vec<PathBuf>,
    /// store directory to create
    #[schemars(extend("x-required" = true, "x-short" = "o", "x-kind" = "path"))]
    pub out: PathBuf,
    /// input format; auto decides from the file names and contents
    pub format: FormatName,
    /// files of validation edges (text or bin32), or one .npy for numpy
    #[schemars(extend("x-kind" = "path"))]
    pub valid: Vec<PathBuf>,
    /// files of test edges (text or bin32), or one .npy for numpy
    #[schemars(extend("x-kind" = "path"))]
    pub test: Vec<PathBuf>,
    /// text lines are (src, relation, dst) triples; same as columns = src,rel,dst
    pub relations: bool,
    /// meaning of each text field, comma-separated: src, dst, rel, weight (float32), time
    /// (int64), feat:D (D float32 edge features), or _ to ignore (default src,dst; src,rel,dst
    /// with --relations); for Parquet inputs ROLE or ROLE=COLUMN names the column each role
    /// reads (default: the role's name), feat=COLUMN repeated for features
    pub columns: String,
    /// typed graph: file of node types in id order, one `NAME<TAB>COUNT` line each (edges hold
    /// integer global ids, each type owning the next COUNT) or one `NAME` line each (edges hold
    /// node names, numbered by type then name); needs --edge-types
    #[schemars(extend("x-kind" = "path"))]
    pub node_types: Option<PathBuf>,
    /// typed graph: file of edge types, one `SRC_TYPE<TAB>RELATION<TAB>DST_TYPE` line each;
    /// the rel column (if any) names the relation
    #[schemars(extend("x-kind" = "path"))]
    pub edge_types: Option<PathBuf>,
    /// typed graph: edge files of one edge type each, `SRC_TYPE:RELATION:DST_TYPE=FILE` (as
    /// GraphBolt writes edge types), in place of input files (like PyG's edge_index_dict):
    /// lines hold src and dst, no rel column; integer ids are local to each node type; without
    /// --edge-types the edge types are these, in order
    pub edges_of: Vec<String>,
    /// typed graph: feature bags of a node type, TYPE=FILE with lines NODE<TAB>FEATURE
    /// FEATURE ... (a node by name, or by local id without names; features are names):
    /// PyTorch-BigGraph's featurized entities (strata embed train --featurized TYPE)
    pub node_bags: Vec<String>,
    /// field separator of text inputs; auto detects per file from its first data line
    pub delimiter: Delimiter,
    /// lines starting with this are skipped; empty for none
    pub comment: String,
    /// each text file starts with a header line to skip
    pub header: bool,
    /// node ids: int uses non-negative integers as ids directly, string renumbers names densely
    /// (sorted order); auto picks int when the first lines hold only plain integers
    pub ids: IdKind,
    /// relation ids, as for ids
    pub relation_ids: IdKind,
    /// number of nodes with integer ids (default: largest id + 1)
    #[schemars(range(min = 1))]
    pub num_nodes: Option<u64>,
    /// number of relations with integer relation ids
    pub num_relations: Option<u64>,
    /// random edge split train,valid,test, e.g. 0.9,0.05,0.05 (exact counts; not with
    /// --valid/--test)
    pub split: Option<Fractions>,
    /// seed of the random edge and node splits
    pub seed: u64,
    /// treat the graph as undirected: CSR/CSC hold every edge both ways
    pub symmetrize: bool,
    /// numpy: node features (nodes, dim)
    #[schemars(extend("x-kind" = "path"))]
    pub features: Option<PathBuf>,
    /// stored feature dtype; auto keeps float16 and stores everything else as float32
    pub feature_dtype: StoredFeatureDtype,
    /// numpy: node labels (nodes,), -1 for unlabelled
    #[schemars(extend("x-kind" = "path"))]
    pub labels: Option<PathBuf>,
    /// numpy: train nodes (ids, or a boolean mask)
    #[schemars(extend("x-kind" = "path"))]
    pub node_train: Option<PathBuf>,
    /// numpy: validation nodes (ids, or a boolean mask)
    #[schemars(extend("x-kind" = "path"))]
    pub node_valid: Option<PathBuf>,
    /// numpy: test nodes (ids, or a boolean mask)
    #[schemars(extend("x-kind" = "path"))]
    pub node_test: Option<PathBuf>,
    /// numpy: random node split over labelled nodes
    pub node_split: Option<Fractions>,
    /// numpy edges as rows (E, 2|3) or columns (2|3, E) like PyG's edge_index
    pub layout: EdgeLayout,
    /// dataset name in the manifest (default: the store's name); for Planetoid, which dataset
    /// of the directory (cora, citeseer)
    pub name: Option<String>,
    /// memory budget of the conversion
    pub memory: Size,
    /// parsing threads; 0 = one per core
    pub threads: usize,
    /// size of each aligned I/O request
    #[schemars(extend("x-flag" = false))]
    pub io_chunk: Size,
    /// replace an existing store (atomically, once the new one is complete)
    pub overwrite: bool,
}

impl Default for ConvertOptions {
    /// `out` is required (empty is refused).
    fn default() -> Self {
        ConvertOptions {
            inputs: Vec::new(),
            out: PathBuf::new(),
            format: FormatName::default(),
            valid: Vec::new(),
            test: Vec::new(),
            relations: false,
            columns: String::new(),
            node_types: None,
            edge_types: None,
            edges_of: Vec::new(),
            node_bags: Vec::new(),
            delimiter: Delimiter::Auto,
            comment: "#".into(),
            header: false,
            ids: IdKind::Auto,
            relation_ids: IdKind::Auto,
            num_nodes: None,
            num_relations: None,
            split: None,
            seed: 0,
            symmetrize: false,
            features: None,
            feature_dtype: StoredFeatureDtype::Auto,
            labels: None,
            node_train: None,
            node_valid: None,
            node_test: None,
            node_split: None,
            layout: EdgeLayout::Auto,
            name: None,
            memory: Size(1 << 30),
            threads: 0,
            io_chunk: default_io_chunk(),
            overwrite: false,
        }
    }
}
