//! `numpy`: NumPy arrays. One edge array (rows `(E, 2|3)` or columns `(2|3, E)`), or a
//! directory holding `edges.npy` and, by name, node features, labels and node splits; or a
//! typed directory (`edges_eK.npy` per edge type, `node_types.tsv`, `edge_types.tsv`, arrays
//! per type as `features_tI.npy`, ...).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::plugin::{has_suffix, missing, sorted_entries, usage, EdgeSource, Inputs, SourcePlan};
use crate::convert::edges::{BatchSink, EdgeInput, EdgeStream};
use crate::convert::nodes::NpyColumn;
use crate::convert::numpy::{check_range, inspect_edges};
use crate::convert::options::StoredFeatureDtype;
use crate::convert::{
    convert_numpy, convert_typed_numpy, file_len, ConvertOptions, EdgeLayout, GraphOptions,
    NodeColumns, NumpyJob, NumpyOptions, Summary, TypedEdgeInput, TypedNumpyJob, TypedNumpyOptions,
};
use crate::error::{Result, StoreError};
use crate::npy::DType;
use crate::registry::Named;
use strata_io::progress::Progress;

#[derive(Debug)]
pub struct Numpy;

impl Named for Numpy {
    const NAME: &'static str = "numpy";
    const HELP: &'static str =
        "NumPy edge arrays (.npy), or a directory of them with node features, labels and splits";
}

/// A directory's arrays by role, each role's accepted names in order of preference.
const NAMES: [(&str, &[&str]); 8] = [
    ("edges", &["edges.npy", "edge_index.npy"]),
    ("valid", &["valid_edges.npy"]),
    ("test", &["test_edges.npy"]),
    ("features", &["features.npy", "x.npy", "node_feat.npy"]),
    ("labels", &["labels.npy", "y.npy", "node_label.npy"]),
    (
        "node_train",
        &["train_idx.npy", "train_mask.npy", "node_train.npy"],
    ),
    (
        "node_valid",
        &[
            "valid_idx.npy",
            "val_idx.npy",
            "valid_mask.npy",
            "val_mask.npy",
            "node_valid.npy",
        ],
    ),
    (
        "node_test",
        &["test_idx.npy", "test_mask.npy", "node_test.npy"],
    ),
];

/// The node types file of a typed directory.
const NODE_TYPES_FILE: &str = "node_types.tsv";
/// The edge types file of a typed directory.
const EDGE_TYPES_FILE: &str = "edge_types.tsv";
const SPLITS: [&str; 3] = ["train", "valid", "test"];

const OPTIONS: &[&str] = &[
    "relations",
    "layout",
    "features",
    "feature_dtype",
    "labels",
    "node_train",
    "node_valid",
    "node_test",
    "node_split",
];
const TYPED_OPTIONS: &[&str] = &["layout", "feature_dtype", "node_types", "edge_types"];

/// The first existing file of `role` in `dir`.
fn found(dir: &Path, role: &str) -> Option<PathBuf> {
    let (_, names) = NAMES.iter().find(|(r, _)| *r == role)?;
    names.iter().map(|n| dir.join(n)).find(|p| p.exists())
}

/// Whether `dir` is a typed NumPy directory: an `edges_eK.npy` and node types (a
/// `node_types.tsv`, or `--node-types`).
fn is_typed(dir: &Path, opts: &ConvertOptions) -> bool {
    let has_types = opts.node_types.is_some() || dir.join(NODE_TYPES_FILE).exists();
    has_types
        && sorted_entries(dir).is_ok_and(|entries| {
            entries.iter().any(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("edges_e") && n.ends_with(".npy"))
            })
        })
}

impl EdgeSource for Numpy {
    fn detect(&self, inputs: &Inputs) -> bool {
        match inputs.dir {
            Some(dir) => is_typed(dir, inputs.opts) || found(dir, "edges").is_some(),
            None => inputs.files.iter().all(|p| has_suffix(p, &[".npy"])),
        }
    }

    fn plan(&self, inputs: &Inputs, opts: &ConvertOptions) -> Result<SourcePlan> {
        let mut plan = match inputs.dir {
            Some(dir) if is_typed(dir, opts) => {
                let mut plan = SourcePlan::edges(&Numpy, vec![], vec![], vec![]);
                plan.kind = "numpy-typed".into();
                plan.typed = Some(dir.to_path_buf());
                plan.options = TYPED_OPTIONS;
                return Ok(plan);
            }
            Some(dir) => {
                let Some(edges) = found(dir, "edges") else {
                    return Err(missing(dir, "no edges.npy"));
                };
                let mut plan = SourcePlan::edges(&Numpy, vec![edges], vec![], vec![]);
                plan.files = NAMES
                    .iter()
                    .filter_map(|(role, _)| Some((role.to_string(), found(dir, role)?)))
                    .collect();
                plan
            }
            None => {
                if inputs.files.len() != 1 {
                    return Err(usage(
                        "convert: numpy takes one edges .npy (use --valid/--test for more)",
                    ));
                }
                SourcePlan::edges(&Numpy, inputs.files.to_vec(), vec![], vec![])
            }
        };
        plan.options = OPTIONS;
        Ok(plan)
    }

    fn convert(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        graph: GraphOptions,
        progress: &dyn Progress,
    ) -> Result<Summary> {
        let nodes = self.node_columns(plan, opts)?;
        if let Some(dir) = &plan.typed {
            let (typed_numpy, _) = typed_options(dir, opts)?;
            let job = TypedNumpyJob { graph, typed_numpy };
            return convert_typed_numpy(&job, &nodes, progress);
        }
        let numpy = numpy_options(plan, opts)?;
        let none = NodeColumns::default();
        let nodes = nodes.first().unwrap_or(&none);
        convert_numpy(&NumpyJob { graph, numpy }, nodes, progress)
    }

    fn node_columns(&self, plan: &SourcePlan, opts: &ConvertOptions) -> Result<Vec<NodeColumns>> {
        let open = |p: Option<PathBuf>| p.as_deref().map(NpyColumn::open).transpose();
        if let Some(dir) = &plan.typed {
            let (_, nodes) = typed_options(dir, opts)?;
            return nodes
                .into_iter()
                .map(|(node_type, mut files)| {
                    let mut take = |role| open(files.remove(role));
                    Ok(NodeColumns {
                        node_type: Some(node_type),
                        features: take("features")?,
                        labels: take("labels")?,
                        splits: [take("node_train")?, take("node_valid")?, take("node_test")?],
                    })
                })
                .collect();
        }
        // A flag names a column; else the directory's file of its role.
        let pick = |given: &Option<PathBuf>, role: &str| {
            open(given.clone().or_else(|| plan.files.get(role).cloned()))
        };
        let cols = NodeColumns {
            node_type: None,
            features: pick(&opts.features, "features")?,
            labels: pick(&opts.labels, "labels")?,
            splits: [
                pick(&opts.node_train, "node_train")?,
                pick(&opts.node_valid, "node_valid")?,
                pick(&opts.node_test, "node_test")?,
            ],
        };
        Ok(if cols.is_empty() {
            Vec::new()
        } else {
            vec![cols]
        })
    }

    fn open(
        &self,
        plan: &SourcePlan,
        opts: &ConvertOptions,
        _: &Path,
        _: &dyn Progress,
    ) -> Result<EdgeInput> {
        if plan.typed.is_some() {
            return Err(StoreError::option(
                "format",
                "typed graphs (node and edge types) need a store: convert them with `strata convert`",
            ));
        }
        let path = &plan.train[0];
        if inspect_edges(path, opts.layout)?.edges == 0 {
            return Err(StoreError::bad_file(path, "holds no edges"));
        }
        Ok(EdgeInput::new(EdgeArrayFile {
            path: path.clone(),
            layout: opts.layout,
        }))
    }

    fn streams(&self) -> bool {
        true
    }
}

/// The stored feature dtype the converters take (`None`: float16 stays, the rest float32).
fn feature_dtype(opts: &ConvertOptions) -> Option<DType> {
    match opts.feature_dtype {
        StoredFeatureDtype::Auto => None,
        StoredFeatureDtype::Float32 => Some(DType::F32),
        StoredFeatureDtype::Float16 => Some(DType::F16),
    }
}

/// The NumPy converter's edge inputs: the given options, else the directory's files.
fn numpy_options(plan: &SourcePlan, opts: &ConvertOptions) -> Result<NumpyOptions> {
    if opts.valid.len() > 1 || opts.test.len() > 1 {
        return Err(usage(
            "convert: numpy takes at most one --valid and one --test .npy",
        ));
    }
    let split = |given: &[PathBuf], role: &str| {
        given
            .first()
            .cloned()
            .or_else(|| plan.files.get(role).cloned())
    };
    Ok(NumpyOptions {
        edges: plan.train[0].clone(),
        valid_edges: split(&opts.valid, "valid"),
        test_edges: split(&opts.test, "test"),
        layout: opts.layout,
        feature_dtype: feature_dtype(opts),
        node_split: opts.node_split.map(|f| f.0),
        relations: opts.relations,
    })
}

/// The files of each node type of a typed directory, by role (`features`, `labels`,
/// `node_train`, ...).
type TypedNodeFiles = BTreeMap<usize, BTreeMap<String, PathBuf>>;

/// A typed directory's inputs, from its file names (`[valid_|test_]edges_eK.npy`,
/// `edge_weights_eK.npy`, `edge_times_eK.npy`, `features_tI.npy`, `labels_tI.npy`,
/// `node_SPLIT_tI.npy`): the edge inputs and each node type's files, or an error naming a
/// file that does not fit.
fn typed_options(dir: &Path, opts: &ConvertOptions) -> Result<(TypedNumpyOptions, TypedNodeFiles)> {
    let given: Vec<&str> = [
        ("--features", opts.features.is_some()),
        ("--labels", opts.labels.is_some()),
        ("--node-train", opts.node_train.is_some()),
        ("--node-valid", opts.node_valid.is_some()),
        ("--node-test", opts.node_test.is_some()),
        ("--node-split", opts.node_split.is_some()),
        ("--valid", !opts.valid.is_empty()),
        ("--test", !opts.test.is_empty()),
    ]
    .into_iter()
    .filter_map(|(flag, set)| set.then_some(flag))
    .collect();
    if !given.is_empty() {
        return Err(usage(format!(
            "convert: {} do not apply to a typed NumPy directory: name its arrays features_tI.npy, labels_tI.npy, node_train_tI.npy, valid_edges_eK.npy, ... (docs/convert.md)",
            given.join(", ")
        )));
    }
    let mut edges: BTreeMap<(usize, usize), BTreeMap<&str, PathBuf>> = BTreeMap::new();
    let mut nodes = TypedNodeFiles::new();
    for p in sorted_entries(dir)? {
        let name = p
            .file_name()
            .map_or(String::new(), |n| n.to_string_lossy().into_owned());
        let Some(stem) = name.strip_suffix(".npy") else {
            continue;
        };
        if let Some((split, role, k)) = edge_file(stem) {
            edges.entry((split, k)).or_default().insert(role, p);
        } else if let Some((role, i)) = node_file(stem) {
            nodes.entry(i).or_default().insert(role.into(), p);
        } else {
            return Err(StoreError::bad_file(
                &p,
                "not a typed NumPy input name (edges_eK.npy, edge_weights_eK.npy, edge_times_eK.npy, valid_/test_ prefixes, features_tI.npy, labels_tI.npy, node_SPLIT_tI.npy)",
            ));
        }
    }
    let mut out_edges = Vec::new();
    for ((split, k), mut files) in edges {
        let Some(path) = files.remove("edges") else {
            let given = files.values().next().expect("a file of the edge type");
            let prefix = if split == 0 {
                String::new()
            } else {
                format!("{}_", SPLITS[split])
            };
            return Err(StoreError::bad_file(
                given,
                format!("no {prefix}edges_e{k}.npy beside it for its edges"),
            ));
        };
        out_edges.push(TypedEdgeInput {
            edge_type: k,
            split: SPLITS[split].into(),
            edges: path,
            weights: files.remove("weights"),
            times: files.remove("times"),
        });
    }
    if out_edges.is_empty() {
        return Err(missing(
            dir,
            "a typed NumPy directory needs at least one edges_eK.npy",
        ));
    }
    let options = TypedNumpyOptions {
        node_types: opts
            .node_types
            .clone()
            .unwrap_or_else(|| dir.join(NODE_TYPES_FILE)),
        edge_types: opts
            .edge_types
            .clone()
            .unwrap_or_else(|| dir.join(EDGE_TYPES_FILE)),
        edges: out_edges,
        layout: opts.layout,
        feature_dtype: feature_dtype(opts),
    };
    Ok((options, nodes))
}

/// `[valid_|test_](edges|edge_weights|edge_times)_eK` as (split index, role, K).
fn edge_file(stem: &str) -> Option<(usize, &'static str, usize)> {
    let (split, rest) = match stem.split_once('_') {
        Some(("valid", rest)) => (1, rest),
        Some(("test", rest)) => (2, rest),
        _ => (0, stem),
    };
    let (role, k) = rest.rsplit_once("_e")?;
    let role = match role {
        "edges" => "edges",
        "edge_weights" => "weights",
        "edge_times" => "times",
        _ => return None,
    };
    Some((split, role, digits(k)?))
}

/// `(features|labels|node_train|node_valid|node_test)_tI` as (role, I).
fn node_file(stem: &str) -> Option<(&str, usize)> {
    let (role, i) = stem.rsplit_once("_t")?;
    [
        "features",
        "labels",
        "node_train",
        "node_valid",
        "node_test",
    ]
    .contains(&role)
    .then_some(())?;
    Some((role, digits(i)?))
}

/// A run of ASCII digits as a number.
fn digits(s: &str) -> Option<usize> {
    (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .then(|| s.parse().ok())
        .flatten()
}

/// One NumPy edge array, rows `(E, 2|3)` or columns `(2|3, E)`, any integer dtype, read in
/// place.
struct EdgeArrayFile {
    path: PathBuf,
    layout: EdgeLayout,
}

impl EdgeStream for EdgeArrayFile {
    fn format(&self) -> &'static str {
        Numpy::NAME
    }

    fn paths(&self) -> Vec<PathBuf> {
        vec![self.path.clone()]
    }

    fn edges(&self) -> Result<u64> {
        Ok(inspect_edges(&self.path, self.layout)?.edges)
    }

    fn input_bytes(&self) -> Result<u64> {
        file_len(&self.path)
    }

    fn stream_bytes(&self) -> Result<u64> {
        Ok(inspect_edges(&self.path, self.layout)?.header.data_bytes())
    }

    fn stream(&self, num_nodes: Option<u64>, io_chunk: usize, sink: &mut BatchSink) -> Result<()> {
        let a = inspect_edges(&self.path, self.layout)?;
        let mut first = 0u64;
        a.stream(io_chunk, |batch, bytes| {
            check_range(
                batch,
                first,
                num_nodes,
                "num_nodes",
                None,
                &self.path,
                "edge",
            )?;
            first += batch.len() as u64;
            sink(batch, bytes)
        })
    }
}
