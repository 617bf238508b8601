//! Streaming converters from common graph formats into a store.
//!
//! Every converter stages edges in spool arrays, then shares one tail ([`finish`]): the exact
//! random split (if asked), the final `edges_*` arrays, CSR/CSC and degrees within the budget,
//! the manifest, and the atomic rename of the finished store.

mod bags;
mod dict;
pub mod edges;
mod nodes;
mod numpy;
mod numpy_typed;
mod options;
pub mod source;
mod spool;
mod text;
mod text_job;
mod topology;
mod types;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::config::Size;
use crate::error::{Result, StoreError};
use crate::manifest::{
    etype_dtype_for, id_dtype_for, EdgeAttributes, FeatureInfo, GraphInfo, LabelInfo, Manifest,
    FORMAT_NAME, FORMAT_VERSION,
};
use crate::npy::DType;
use crate::store::StoreBuilder;
use crate::units::fmt_bytes;
use strata_io::progress::Progress;

pub use nodes::{NodeColumn, NodeColumns, NpyColumn};
pub use numpy::{convert_binary, convert_numpy, BinaryJob, NumpyJob, NumpyOptions};
pub use numpy_typed::{convert_typed_numpy, TypedEdgeInput, TypedNumpyJob, TypedNumpyOptions};
pub(crate) use options::default_io_chunk;
pub use options::{
    ConvertOptions, Delimiter, EdgeLayout, FormatName, Fractions, IdKind, StoredFeatureDtype,
};
pub use source::{convert, plan_inputs, EdgeSource, InputFormat, SourcePlan};
pub use text_job::{convert_text, EdgeTypeFile, TextJob, TextOptions};
pub use topology::DegreeHistogram;

use spool::{finalize_edges, Spooled};
pub(crate) use topology::{build_topology, Payload, TopologyInput};
pub(crate) use types::Types;

/// Options every converter shares.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GraphOptions {
    /// Destination store directory (must not exist unless `overwrite`).
    pub out: PathBuf,
    /// Dataset name recorded in the manifest; defaults to the output directory's stem.
    #[serde(default)]
    pub name: Option<String>,
    /// Replace an existing store at `out` (atomically, once the new one is complete).
    #[serde(default)]
    pub overwrite: bool,
    /// Memory budget of the whole conversion.
    pub memory: Size,
    /// Worker threads for parsing; 0 means one per core.
    #[serde(default)]
    pub threads: usize,
    /// Store CSR/CSC with every edge in both directions (an undirected graph).
    #[serde(default)]
    pub symmetrize: bool,
    /// Random edge split as fractions (train, valid, test), exact counts, seeded by `seed`.
    #[serde(default)]
    pub split: Option<[f64; 3]>,
    /// Seed of the random split.
    #[serde(default)]
    pub seed: u64,
    /// Number of nodes for integer ids (default: largest id + 1).
    #[serde(default)]
    pub num_nodes: Option<u64>,
    /// Number of relations for integer relation ids (default: largest id + 1).
    #[serde(default)]
    pub num_relations: Option<u64>,
    /// Size of each aligned I/O request and staging buffer (a multiple of 4096).
    #[serde(default = "default_io_chunk")]
    pub io_chunk: Size,
    /// What the front end wants recorded in the manifest (command line, config).
    #[serde(default)]
    pub provenance: serde_json::Value,
}

impl GraphOptions {
    fn validate(&self) -> Result<()> {
        let Size(io_chunk) = self.io_chunk;
        if io_chunk == 0 || !io_chunk.is_multiple_of(strata_io::ALIGN as u64) {
            return Err(StoreError::option(
                "io_chunk",
                format!("must be a positive multiple of 4096, got {io_chunk}"),
            ));
        }
        if let Some(f) = self.split {
            Fractions::check(f).map_err(|msg| StoreError::option("split", msg))?;
        }
        if self.num_nodes == Some(0) {
            return Err(StoreError::option("num_nodes", "must be positive"));
        }
        Ok(())
    }

    fn threads(&self) -> usize {
        if self.threads > 0 {
            self.threads
        } else {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        }
    }

    /// The I/O chunk actually used (see [`io_chunk_within`]).
    fn io_chunk(&self) -> usize {
        io_chunk_within(self.memory.0, self.io_chunk.0)
    }

    fn store_name(&self) -> String {
        self.name.clone().unwrap_or_else(|| {
            let stem = self
                .out
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned());
            stem.unwrap_or_else(|| "graph".into())
        })
    }
}

/// The I/O chunk a step with budget `memory` (bytes) uses: `configured` (bytes, a multiple of
/// 4096), shrunk so that the step's fixed buffers (about a dozen chunks) stay a small part of a
/// small budget.
pub(crate) fn io_chunk_within(memory: u64, configured: u64) -> usize {
    let fit = strata_io::align_down(memory / 64).max(strata_io::ALIGN as u64);
    configured.min(fit) as usize
}

/// One input file and the split its edges belong to.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    pub path: PathBuf,
    /// `train`, `valid` or `test`.
    #[serde(default = "default_split")]
    pub split: String,
}

fn default_split() -> String {
    "train".into()
}

/// Checks inputs exist and name valid splits; returns their total size in bytes.
fn check_inputs(inputs: &[InputFile], graph: &GraphOptions) -> Result<u64> {
    if inputs.is_empty() {
        return Err(StoreError::option("inputs", "no input files given"));
    }
    let mut total = 0;
    for f in inputs {
        if spool::split_index(&f.split).is_none() {
            return Err(StoreError::option(
                "inputs",
                format!(
                    "{}: unknown split '{}' (train, valid, test)",
                    f.path.display(),
                    f.split
                ),
            ));
        }
        let meta = std::fs::metadata(&f.path).map_err(|e| StoreError::os("open", &f.path, e))?;
        if meta.is_dir() {
            return Err(StoreError::bad_file(
                &f.path,
                "is a directory, expected a file",
            ));
        }
        std::fs::File::open(&f.path).map_err(|e| StoreError::os("open", &f.path, e))?;
        total += meta.len();
    }
    if !inputs.iter().any(|f| f.split == "train") {
        return Err(StoreError::option(
            "inputs",
            "no train input: at least one file must hold train edges",
        ));
    }
    if graph.split.is_some() && inputs.iter().any(|f| f.split != "train") {
        return Err(StoreError::option(
            "split",
            "a random split cannot be combined with given valid/test files",
        ));
    }
    Ok(total)
}

/// Per-stage wall time of a conversion.
#[derive(Debug, Clone, Serialize)]
pub struct StageTime {
    pub name: String,
    pub seconds: f64,
}

/// What a conversion did, for the front end's summary paragraph.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub store: PathBuf,
    pub name: String,
    pub converter: String,
    pub num_nodes: u64,
    pub num_relations: u64,
    /// A typed store's node types as (name, count), in id order; empty for an untyped one.
    pub node_types: Vec<(String, u64)>,
    /// A typed store's edge types as (source type, relation, destination type) names.
    pub edge_types: Vec<(String, String, String)>,
    pub num_edges: BTreeMap<String, u64>,
    pub num_topology_edges: u64,
    pub id_dtype: DType,
    pub input_files: usize,
    /// Bytes of the inputs on disk (compressed size for `.gz`).
    pub input_bytes: u64,
    /// Data rows read (edges or triples).
    pub input_rows: u64,
    pub seconds: f64,
    pub stages: Vec<StageTime>,
    pub store_bytes: u64,
    pub memory: u64,
    pub plan: Vec<String>,
    pub features: Option<FeatureInfo>,
    pub labels: Option<LabelInfo>,
    pub node_splits: BTreeMap<String, u64>,
}

/// Times stages of a conversion.
pub(crate) struct Clock {
    start: Instant,
    last: Instant,
    stages: Vec<StageTime>,
}

impl Clock {
    fn new() -> Self {
        let now = Instant::now();
        Clock {
            start: now,
            last: now,
            stages: Vec::new(),
        }
    }

    /// Ends the current stage under `name`.
    fn lap(&mut self, name: &str) {
        let now = Instant::now();
        self.stages.push(StageTime {
            name: name.into(),
            seconds: (now - self.last).as_secs_f64(),
        });
        self.last = now;
    }
}

/// Everything an edge source produced, handed to [`finish`].
pub(crate) struct Ingested {
    /// Name of the converter, recorded in the manifest.
    pub converter: &'static str,
    /// Budget plan lines so far.
    pub plan: Vec<String>,
    /// Spooled edges; in a typed conversion the relation column holds the edge type.
    pub spooled: Spooled,
    /// Node and edge types (empty for an untyped graph).
    pub types: Types,
    pub num_nodes: u64,
    pub num_relations: u64,
    pub node_names: bool,
    pub relation_names: bool,
    pub input_files: usize,
    pub input_bytes: u64,
    pub input_rows: u64,
}

/// Node data (features, labels, node splits) already written into the builder.
#[derive(Default)]
pub(crate) struct NodeData {
    pub features: Option<FeatureInfo>,
    pub labels: Option<LabelInfo>,
    pub node_splits: BTreeMap<String, u64>,
}

/// Decides `num_nodes` for integer ids and rejects ids that look too sparse to store densely.
pub(crate) fn resolve_num_nodes(
    graph: &GraphOptions,
    max_node: i64,
    total_edges: u64,
) -> Result<u64> {
    num_nodes_for(graph.num_nodes, max_node, total_edges)
}

/// The node count of integer ids: `given`, else the largest id (`max_node`) + 1, refused when
/// ids that sparse for `total_edges` edges would waste memory on empty nodes.
pub fn num_nodes_for(given: Option<u64>, max_node: i64, total_edges: u64) -> Result<u64> {
    if let Some(n) = given {
        return Ok(n);
    }
    let n = (max_node + 1).max(0) as u64;
    let limit = (1u64 << 20).max(32 * total_edges);
    if n > limit {
        return Err(StoreError::option(
            "num_nodes",
            format!(
                "the largest node id is {max_node} for only {total_edges} edges: ids this sparse would waste {} on empty nodes; use ids = \"string\" to renumber them densely, or set num_nodes to accept it",
                fmt_bytes(n * 24)
            ),
        ));
    }
    Ok(n)
}

/// Converts the spooled edges and node data into the final store and commits it.
pub(crate) fn finish(
    mut builder: StoreBuilder,
    graph: &GraphOptions,
    ingested: Ingested,
    node_data: NodeData,
    mut clock: Clock,
    progress: &dyn Progress,
) -> Result<Summary> {
    let converter = ingested.converter;
    let mut plan = ingested.plan;
    let io_chunk = graph.io_chunk();
    let n = ingested.num_nodes;
    let id_dtype = id_dtype_for(n.max(ingested.num_relations));
    if ingested.spooled.total_rows() == 0 {
        return Err(StoreError::option("inputs", "the inputs hold no edges"));
    }
    let typed = ingested.types.is_typed();
    let attrs = ingested.spooled.attrs;
    let edge_attributes = attrs.any().then_some(EdgeAttributes {
        weights: attrs.weights,
        times: attrs.times,
        features: (attrs.features > 0).then_some(FeatureInfo {
            dim: attrs.features as u64,
            dtype: DType::F32,
        }),
    });
    let random = graph.split.map(|f| (f, graph.seed));
    let num_edges = finalize_edges(
        &mut builder,
        ingested.spooled,
        id_dtype,
        random,
        io_chunk,
        progress,
    )?;
    if num_edges.get("train").copied().unwrap_or(0) == 0 {
        return Err(StoreError::option(
            "inputs",
            "no train edges (the split left none)",
        ));
    }
    clock.lap("edges");
    let edges_info = builder.arrays()["edges_train"].clone();
    let mut info = GraphInfo {
        num_nodes: n,
        num_relations: ingested.num_relations,
        id_dtype,
        num_edges,
        num_topology_edges: if graph.symmetrize {
            2 * edges_info.shape[0]
        } else {
            edges_info.shape[0]
        },
        symmetrized: graph.symmetrize,
        node_names: ingested.node_names,
        relation_names: ingested.relation_names,
    };
    let weights = builder.arrays().get("edge_weights_train").cloned();
    let times = builder.arrays().get("edge_times_train").cloned();
    let payload = (typed || attrs.any()).then(|| Payload {
        num_etypes: ingested.types.edge_types.len() as u64,
        etype_dtype: etype_dtype_for(ingested.types.edge_types.len() as u64),
        eid_dtype: id_dtype_for(edges_info.shape[0]),
        weights: weights.as_ref(),
        times: times.as_ref(),
    });
    let topo = build_topology(
        &mut builder,
        &TopologyInput {
            edges: &edges_info,
            num_nodes: n,
            id_dtype,
            degree_dtype: info.degree_dtype(),
            symmetrize: graph.symmetrize,
            budget: graph.memory.0,
            io_chunk,
            payload,
        },
        progress,
    )?;
    info.num_topology_edges = topo.num_topology_edges;
    plan.extend(topo.plan);
    clock.lap("topology");
    let manifest = Manifest {
        format: FORMAT_NAME.into(),
        format_version: FORMAT_VERSION,
        strata_version: env!("CARGO_PKG_VERSION").into(),
        name: graph.store_name(),
        graph: info,
        features: node_data.features.clone(),
        labels: node_data.labels.clone(),
        node_splits: node_data.node_splits.clone(),
        node_types: ingested.types.node_types.clone(),
        edge_types: ingested.types.edge_types.clone(),
        edge_attributes,
        stats: topo.stats,
        arrays: BTreeMap::new(),
        provenance: serde_json::json!({
            "converter": converter,
            "seconds": clock.start.elapsed().as_secs_f64(),
            "front_end": graph.provenance,
        }),
    };
    let store = builder.commit(manifest)?;
    clock.lap("commit");
    let m = store.manifest();
    let type_name = |t: u64| m.node_types[t as usize].name.clone();
    Ok(Summary {
        store: store.path().to_path_buf(),
        name: m.name.clone(),
        converter: converter.into(),
        num_nodes: m.graph.num_nodes,
        num_relations: m.graph.num_relations,
        node_types: m
            .node_types
            .iter()
            .map(|t| (t.name.clone(), t.count))
            .collect(),
        edge_types: m
            .edge_types
            .iter()
            .map(|e| {
                (
                    type_name(e.src_type),
                    e.relation.clone(),
                    type_name(e.dst_type),
                )
            })
            .collect(),
        num_edges: m.graph.num_edges.clone(),
        num_topology_edges: m.graph.num_topology_edges,
        id_dtype,
        input_files: ingested.input_files,
        input_bytes: ingested.input_bytes,
        input_rows: ingested.input_rows,
        seconds: clock.start.elapsed().as_secs_f64(),
        stages: clock.stages,
        store_bytes: store.disk_usage()?.values().sum(),
        memory: graph.memory.0,
        plan,
        features: node_data.features,
        labels: node_data.labels,
        node_splits: node_data.node_splits,
    })
}

/// Reports the budget plan lines through `progress` and returns them.
pub(crate) fn announce(progress: &dyn Progress, lines: Vec<String>) -> Vec<String> {
    for l in &lines {
        progress.message(l);
    }
    lines
}

/// Size in bytes of a regular file, or an error naming it. Anything else (a device, a pipe, a
/// directory) is refused: its size says nothing about what a read of it returns, and a device
/// such as /dev/zero never ends.
pub(crate) fn file_len(path: &Path) -> Result<u64> {
    use std::os::unix::fs::FileTypeExt;
    let meta = std::fs::metadata(path).map_err(|e| StoreError::os("open", path, e))?;
    let kind = meta.file_type();
    let what = if kind.is_file() {
        return Ok(meta.len());
    } else if kind.is_dir() {
        "a directory"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_fifo() {
        "a pipe"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "a special file"
    };
    Err(StoreError::bad_file(
        path,
        format!("is {what}, not a regular file: give a file of its contents"),
    ))
}
