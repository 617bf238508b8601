//! Typed NumPy conversion (format 2): node types with counts, one edge array per edge type in
//! that type's local ids (PyG's `edge_index_dict`), optional per-edge weights and times, and
//! per-type node features, labels and splits.
//!
//! The types come from the same two files as a typed text conversion (see [`super::types`]):
//! node type `I` is line `I` of the node types file, edge type `K` line `K` of the edge types
//! file. Edge arrays are streamed in chunks, their local ids checked against their edge type's
//! source and destination counts and shifted to global ids on the way into the spool. The
//! node columns of each type come from the format (`EdgeSource::node_columns`).

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::nodes::{write_node_data, NodeColumns, NodeOptions};
use super::numpy::{inspect_edges, EdgeArray};
use super::options::EdgeLayout;
use super::spool::{split_index, Attrs, Spool};
use super::{announce, default_split, file_len, finish, Clock, GraphOptions, Ingested, NodeData};
use super::{Summary, Types};
use crate::array::{IntCursor, RowReader};
use crate::error::{Result, StoreError};
use crate::manifest::{id_dtype_for, NodeType};
use crate::npy::{read_header, DType};
use crate::store::StoreBuilder;
use crate::units::fmt_bytes;
use strata_io::progress::{Meter, Progress};

/// The edges of one edge type in one split.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedEdgeInput {
    /// Edge-type id: the line of the edge types file, from 0.
    pub edge_type: usize,
    /// `train`, `valid` or `test`.
    #[serde(default = "default_split")]
    pub split: String,
    /// `(2, E)` (PyG's `edge_index`) or `(E, 2)` integers: (src, dst) as local ids of the edge
    /// type's source and destination node types.
    pub edges: PathBuf,
    /// `(E,)` weights (any float or integer dtype, stored as finite float32).
    #[serde(default)]
    pub weights: Option<PathBuf>,
    /// `(E,)` integer timestamps (stored as int64).
    #[serde(default)]
    pub times: Option<PathBuf>,
}

/// Typed NumPy inputs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedNumpyOptions {
    /// `NAME<TAB>COUNT` lines in id order.
    pub node_types: PathBuf,
    /// `SRC_TYPE<TAB>RELATION<TAB>DST_TYPE` lines.
    pub edge_types: PathBuf,
    pub edges: Vec<TypedEdgeInput>,
    /// `auto` reads `(2, E)` as columns and `(E, 2)` as rows (a `(2, 2)` array as columns).
    #[serde(default)]
    pub layout: EdgeLayout,
    /// Stored feature dtype: float32 or float16 (default: float16 stays, all else float32).
    #[serde(default)]
    pub feature_dtype: Option<DType>,
}

/// A typed NumPy conversion.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypedNumpyJob {
    pub graph: GraphOptions,
    pub typed_numpy: TypedNumpyOptions,
}

/// Nodes `0 .. count` of a node type, for messages.
fn describe_type(t: &NodeType) -> String {
    format!("node type '{}' has {} nodes", t.name, t.count)
}

/// Opens an edge array of a typed input: two ids per edge, `(2, E)` read as columns unless
/// the layout says otherwise.
fn open_edges(path: &Path, layout: EdgeLayout) -> Result<EdgeArray> {
    let h = read_header(path)?;
    let layout = match (layout, &h.shape[..]) {
        (EdgeLayout::Auto, [2, _]) => EdgeLayout::Columns,
        (EdgeLayout::Auto, [_, 2]) => EdgeLayout::Rows,
        (EdgeLayout::Auto, shape) => {
            return Err(StoreError::bad_file(
                path,
                format!("a typed edge array must have shape (2, E) or (E, 2) as (src, dst) local ids; found {shape:?}"),
            ))
        }
        (given, _) => given,
    };
    let a = inspect_edges(path, layout)?;
    if a.width != 2 {
        return Err(StoreError::bad_file(
            path,
            format!(
                "shape {:?} has {} ids per edge; a typed edge array holds 2 (src, dst): its file gives the edge type",
                a.header.shape, a.width
            ),
        ));
    }
    Ok(a)
}

/// A per-edge column (weights or times) read in step with its edge array.
struct EdgeColumn {
    path: PathBuf,
    /// Floats are read as integers of their width (their bit patterns) and decoded here.
    dtype: DType,
    cursor: IntCursor,
    vals: Vec<i64>,
}

impl EdgeColumn {
    /// Opens `path`, which must hold one value per edge (`edges`) of an accepted dtype.
    fn open(path: &Path, edges: u64, weights: bool, io_chunk: usize) -> Result<Self> {
        let h = read_header(path)?;
        let what = if weights { "weights" } else { "times" };
        if h.shape != [edges] {
            return Err(StoreError::bad_file(
                path,
                format!(
                    "{what} must have shape ({edges},), one per edge of its edge array; found {:?}",
                    h.shape
                ),
            ));
        }
        let ok = if weights {
            h.dtype != DType::Bool
        } else {
            h.dtype.is_int()
        };
        if !ok {
            let want = if weights {
                "numbers"
            } else {
                "integers (int64 units such as seconds)"
            };
            return Err(StoreError::bad_file(
                path,
                format!("{what} must be {want}, found {}", h.dtype),
            ));
        }
        let bits = match h.dtype {
            DType::F16 => DType::U16,
            DType::F32 => DType::U32,
            DType::F64 => DType::U64,
            d => d,
        };
        let reader = RowReader::open(path, &h, io_chunk)?;
        Ok(EdgeColumn {
            path: path.to_path_buf(),
            dtype: h.dtype,
            cursor: IntCursor::new(reader, bits),
            vals: Vec::new(),
        })
    }

    /// Appends the next `n` weights to `out`, refusing non-finite ones (edge ids from `first`).
    fn weights(&mut self, n: usize, first: u64, out: &mut Vec<f32>) -> Result<()> {
        self.cursor.take(n, &mut self.vals)?;
        for (i, &v) in self.vals.iter().enumerate() {
            let w = match self.dtype {
                DType::F16 => half::f16::from_bits(v as u16).to_f32(),
                DType::F32 => f32::from_bits(v as u32),
                DType::F64 => f64::from_bits(v as u64) as f32,
                DType::U64 => v as u64 as f32,
                _ => v as f32,
            };
            if !w.is_finite() {
                return Err(StoreError::bad_file(
                    &self.path,
                    format!(
                        "edge {}: weight {w} is not finite (as float32)",
                        first + i as u64
                    ),
                ));
            }
            out.push(w);
        }
        Ok(())
    }

    /// Appends the next `n` times to `out` (edge ids from `first`).
    fn times(&mut self, n: usize, first: u64, out: &mut Vec<i64>) -> Result<()> {
        self.cursor.take(n, &mut self.vals)?;
        if self.dtype == DType::U64 {
            if let Some(i) = self.vals.iter().position(|&v| v < 0) {
                return Err(StoreError::bad_file(
                    &self.path,
                    format!(
                        "edge {}: time {} is out of the int64 range",
                        first + i as u64,
                        self.vals[i] as u64
                    ),
                ));
            }
        }
        out.extend_from_slice(&self.vals);
        Ok(())
    }
}

/// Checks the shapes of a node type's columns against its count before anything is written.
fn check_node_columns(cols: &NodeColumns, t: &NodeType) -> Result<()> {
    let n = t.count;
    if let Some(c) = &cols.features {
        if c.shape().len() != 2 || c.shape()[0] != n {
            return Err(StoreError::bad_file(
                c.path(),
                format!(
                    "features must have shape ({n}, dim): {}; found {:?}",
                    describe_type(t),
                    c.shape()
                ),
            ));
        }
    }
    if let Some(c) = &cols.labels {
        if c.shape() != [n] && c.shape() != [n, 1] {
            return Err(StoreError::bad_file(
                c.path(),
                format!(
                    "labels must have shape ({n},): {}; found {:?}",
                    describe_type(t),
                    c.shape()
                ),
            ));
        }
    }
    for c in cols.splits.iter().flatten() {
        let mask_len_wrong = c.dtype() == DType::Bool && c.shape() != [n];
        if c.shape().len() != 1 || mask_len_wrong {
            return Err(StoreError::bad_file(
                c.path(),
                format!(
                    "a node split must be 1-D local ids in [0, {n}) or a boolean mask of length {n}: {}; found {} {:?}",
                    describe_type(t),
                    c.dtype(),
                    c.shape()
                ),
            ));
        }
    }
    Ok(())
}

/// Checks every input against the types and returns which attributes the edges carry.
fn check_inputs(opts: &TypedNumpyOptions, nodes: &[NodeColumns], types: &Types) -> Result<Attrs> {
    let k = types.edge_types.len();
    if opts.edges.is_empty() {
        return Err(StoreError::option(
            "typed_numpy.edges",
            "no edge arrays given",
        ));
    }
    for e in &opts.edges {
        if e.edge_type >= k {
            return Err(StoreError::bad_file(
                &e.edges,
                format!(
                    "edge type {} is not declared: {} declares {k} edge types (ids 0..{k})",
                    e.edge_type,
                    opts.edge_types.display()
                ),
            ));
        }
        if split_index(&e.split).is_none() {
            return Err(StoreError::bad_file(
                &e.edges,
                format!("unknown split '{}' (train, valid, test)", e.split),
            ));
        }
    }
    if !opts.edges.iter().any(|e| e.split == "train") {
        return Err(StoreError::option(
            "typed_numpy.edges",
            "no train edges: at least one edge array must hold train edges",
        ));
    }
    let attrs = Attrs {
        weights: opts.edges.iter().any(|e| e.weights.is_some()),
        times: opts.edges.iter().any(|e| e.times.is_some()),
        features: 0,
    };
    for e in &opts.edges {
        for (on, given, what) in [
            (attrs.weights, e.weights.is_some(), "weights"),
            (attrs.times, e.times.is_some(), "times"),
        ] {
            if on && !given {
                return Err(StoreError::bad_file(
                    &e.edges,
                    format!("has no {what} array but other edge arrays do: give every edge array its {what}, or none"),
                ));
            }
        }
    }
    let mut seen = vec![false; types.node_types.len()];
    for cols in nodes {
        let Some(node_type) = cols.node_type else {
            return Err(StoreError::option(
                "typed_numpy.nodes",
                "node columns of a typed graph must name their node type",
            ));
        };
        let Some(t) = types.node_types.get(node_type) else {
            let n = types.node_types.len();
            return Err(StoreError::option(
                "typed_numpy.nodes",
                format!(
                    "node type {node_type} is not declared: {} declares {n} node types (ids 0..{n})",
                    opts.node_types.display()
                ),
            ));
        };
        if std::mem::replace(&mut seen[node_type], true) {
            return Err(StoreError::option(
                "typed_numpy.nodes",
                format!("node type {node_type} ('{}') is given twice", t.name),
            ));
        }
        check_node_columns(cols, t)?;
    }
    Ok(attrs)
}

/// Converts typed NumPy edge arrays and the node columns of each node type (`nodes`) into a
/// typed store (format 2).
pub fn convert_typed_numpy(
    job: &TypedNumpyJob,
    nodes: &[NodeColumns],
    progress: &dyn Progress,
) -> Result<Summary> {
    let opts = &job.typed_numpy;
    job.graph.validate()?;
    if job.graph.symmetrize {
        return Err(StoreError::option(
            "symmetrize",
            "is not supported for typed graphs: declare the reverse edge types and give their edges instead",
        ));
    }
    if job.graph.num_relations.is_some() {
        return Err(StoreError::option(
            "num_relations",
            "does not apply to a typed graph: its edge types file lists the relations",
        ));
    }
    let mut types = Types::read(&opts.node_types, Some(&opts.edge_types))?;
    let num_nodes = types.num_nodes();
    if num_nodes == 0 {
        return Err(StoreError::bad_file(
            &opts.node_types,
            "the node types hold no nodes: typed NumPy inputs need NAME<TAB>COUNT lines",
        ));
    }
    if let Some(n) = job.graph.num_nodes.filter(|&n| n != num_nodes) {
        return Err(StoreError::option(
            "num_nodes",
            format!(
                "is {n} but the node types of {} add up to {num_nodes}",
                opts.node_types.display()
            ),
        ));
    }
    let graph = &GraphOptions {
        num_nodes: Some(num_nodes),
        ..job.graph.clone()
    };
    let attrs = check_inputs(opts, nodes, &types)?;
    let arrays = opts
        .edges
        .iter()
        .map(|e| open_edges(&e.edges, opts.layout))
        .collect::<Result<Vec<_>>>()?;
    let io_chunk = graph.io_chunk();
    // Open (and so check) every weights and times array before the store is created.
    let mut columns = opts
        .edges
        .iter()
        .zip(&arrays)
        .map(|(e, a)| {
            let open = |p: &Option<PathBuf>, weights| {
                p.as_ref()
                    .map(|p| EdgeColumn::open(p, a.edges, weights, io_chunk))
                    .transpose()
            };
            Ok::<_, StoreError>((open(&e.weights, true)?, open(&e.times, false)?))
        })
        .collect::<Result<Vec<_>>>()?;

    let num_etypes = types.edge_types.len() as u64;
    let id_dtype = id_dtype_for(num_nodes.max(num_etypes));
    let mut clock = Clock::new();
    let mut builder = StoreBuilder::create(&graph.out, graph.overwrite)?;
    let plan = announce(
        progress,
        vec![format!(
            "budget {}: streaming {} edge array(s) of {} edge type(s) in {} chunks{}{}",
            fmt_bytes(graph.memory.0),
            arrays.len(),
            num_etypes,
            fmt_bytes(io_chunk as u64),
            if attrs.weights { ", with weights" } else { "" },
            if attrs.times { ", with times" } else { "" },
        )],
    );
    let spool_dtype = if attrs.any() { DType::I64 } else { id_dtype };
    let mut spool = Spool::new(&builder.scratch()?, "tnp", spool_dtype, 3, attrs, io_chunk);
    let total_bytes: u64 = arrays.iter().map(|a| a.header.data_bytes()).sum();
    let total_edges: u64 = arrays.iter().map(|a| a.edges).sum();
    let mut meter = Meter::new(progress, "edges", total_bytes, total_edges);
    for ((input, a), (weights, times)) in opts.edges.iter().zip(&arrays).zip(&mut columns) {
        let et = &types.edge_types[input.edge_type];
        let (ts, td) = (
            &types.node_types[et.src_type as usize],
            &types.node_types[et.dst_type as usize],
        );
        let split = split_index(&input.split).expect("checked split");
        let mut first = 0u64;
        a.stream(io_chunk, |batch, bytes| {
            let mut global = batch.clone();
            for (role, col, t) in [("src", &mut global.src, ts), ("dst", &mut global.dst, td)] {
                if let Some(i) = col.iter().position(|&v| v as u64 >= t.count) {
                    return Err(StoreError::bad_file(
                        &a.path,
                        format!(
                            "edge {}: {role} id {} is outside [0, {}): {} (edge type {} is ({}, {}, {}), local ids)",
                            first + i as u64,
                            col[i],
                            t.count,
                            describe_type(t),
                            input.edge_type,
                            ts.name,
                            et.relation,
                            td.name
                        ),
                    ));
                }
                col.iter_mut().for_each(|v| *v += t.offset as i64);
            }
            global.rel = vec![input.edge_type as i64; global.len()];
            if let Some(w) = weights.as_mut() {
                w.weights(global.len(), first, &mut global.weight)?;
            }
            if let Some(t) = times.as_mut() {
                t.times(global.len(), first, &mut global.time)?;
            }
            first += global.len() as u64;
            spool.append(split, &global)?;
            Ok(meter.add(global.len() as u64, bytes)?)
        })?;
    }
    meter.finish()?;
    let spooled = spool.finish()?;
    clock.lap("edges in");

    let mut input_bytes = opts
        .edges
        .iter()
        .flat_map(|e| [Some(&e.edges), e.weights.as_ref(), e.times.as_ref()])
        .flatten()
        .map(|p| file_len(p))
        .sum::<Result<u64>>()?;
    let how = NodeOptions {
        feature_dtype: opts.feature_dtype,
        node_split: None,
        seed: graph.seed,
        memory: graph.memory.0,
    };
    for cols in nodes {
        let t = &mut types.node_types[cols.node_type.expect("checked: a node type")];
        let data = write_node_data(
            &mut builder,
            cols,
            &how,
            t.count,
            id_dtype,
            io_chunk,
            progress,
        )?;
        t.features = data.features;
        t.labels = data.labels;
        t.node_splits = data.node_splits;
        input_bytes += cols.input_bytes()?;
    }
    clock.lap("node data");
    let ingested = Ingested {
        converter: "numpy",
        plan,
        input_rows: spooled.total_rows(),
        spooled,
        types,
        num_nodes,
        num_relations: num_etypes,
        node_names: false,
        relation_names: false,
        input_files: arrays.len(),
        input_bytes,
    };
    finish(
        builder,
        graph,
        ingested,
        NodeData::default(),
        clock,
        progress,
    )
}
