//! The `[convert]` config section: every option of `strata convert`, checked here. The front
//! end plans the inputs (format detection, file roles, Planetoid reading) and builds one of
//! the jobs ([`TextJob`](super::TextJob), [`BinaryJob`](super::BinaryJob),
//! [`NumpyJob`](super::NumpyJob)) from the checked values.

use std::fmt;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::de::{SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use super::{Delimiter, EdgeLayout, IdKind};
use crate::config::{ConfigError, Section, Size};

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

/// The input format, or `auto` to decide from the file names and contents; `parquet` is
/// Apache Parquet edge tables, read through pyarrow (the `parquet` extra).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum InputFormat {
    #[default]
    Auto,
    Text,
    Numpy,
    Bin32,
    Planetoid,
    Parquet,
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
    pub format: InputFormat,
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
            format: InputFormat::Auto,
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
            io_chunk: Size(super::default_io_chunk()),
            overwrite: false,
        }
    }
}

impl Section for ConvertOptions {
    const NAME: &'static str = "convert";

    fn validate(&self) -> Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        if self.out.as_os_str().is_empty() {
            return refuse("out", "needs a store directory to create".into());
        }
        if !self.columns.is_empty()
            && self.relations
            && !self.columns.split(',').any(|c| c.trim() == "rel")
        {
            return refuse(
                "columns",
                format!("--relations needs a 'rel' column, got '{}'", self.columns),
            );
        }
        if self.split.is_some() && !(self.valid.is_empty() && self.test.is_empty()) {
            return refuse(
                "split",
                "a random split cannot be combined with --valid/--test files".into(),
            );
        }
        if self.io_chunk.0 == 0 || !self.io_chunk.0.is_multiple_of(strata_io::ALIGN as u64) {
            return refuse(
                "io_chunk",
                format!(
                    "must be a positive multiple of 4096, got {}",
                    self.io_chunk.0
                ),
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::check;

    fn err(v: serde_json::Value) -> String {
        check::<ConvertOptions>(&v).unwrap_err().to_string()
    }

    #[test]
    fn splits_parse_from_text_or_lists_and_must_sum_to_one() {
        let c: ConvertOptions =
            check(&serde_json::json!({"out": "g", "split": "0.8,0.1,0.1"})).unwrap();
        assert_eq!(c.split, Some(Fractions([0.8, 0.1, 0.1])));
        assert!(
            err(serde_json::json!({"out": "g", "split": [0.5, 0.1, 0.1]}))
                .starts_with("convert.split: expected three fractions (train, valid, test)")
        );
        assert!(
            err(serde_json::json!({"out": "g", "node_split": "0.5,0.5"}))
                .starts_with("convert.node_split: expected three fractions like")
        );
    }

    #[test]
    fn refusals_name_the_option() {
        assert_eq!(
            err(serde_json::json!({"out": "g", "io_chunk": 1000})),
            "convert.io_chunk: must be a positive multiple of 4096, got 1000"
        );
        assert_eq!(
            err(serde_json::json!({"out": "g", "relations": true, "columns": "src,dst"})),
            "convert.columns: --relations needs a 'rel' column, got 'src,dst'"
        );
        assert_eq!(
            err(serde_json::json!({"inputs": ["e.tsv"]})),
            "convert.out: needs a store directory to create"
        );
    }
}
