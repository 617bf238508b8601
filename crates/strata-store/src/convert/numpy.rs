//! Converters from binary inputs: NumPy edge arrays (with the node columns their format brings:
//! features, labels, node splits) and raw little-endian int32 edge pairs (the GridGraph /
//! converted-SNAP format).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use strata_io::SeqReader;

use super::nodes::{write_node_data, NodeColumns, NodeOptions};
use super::options::EdgeLayout;
use super::spool::{split_index, Attrs, EdgeBatch, Spool};
use super::{
    announce, check_inputs, file_len, finish, resolve_num_nodes, Clock, GraphOptions, Ingested,
    InputFile, NodeData, Summary, Types,
};
use crate::array::{IntCursor, RowReader};
use crate::error::{Result, StoreError};
use crate::manifest::id_dtype_for;
use crate::npy::{read_header, DType, NpyHeader};
use crate::store::StoreBuilder;
use crate::units::fmt_bytes;
use strata_io::progress::{Meter, Progress};

/// NumPy edge inputs (the node columns come from the format: `EdgeSource::node_columns`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumpyOptions {
    /// Train edges (or all edges, with a random split).
    pub edges: PathBuf,
    #[serde(default)]
    pub valid_edges: Option<PathBuf>,
    #[serde(default)]
    pub test_edges: Option<PathBuf>,
    #[serde(default)]
    pub layout: EdgeLayout,
    /// Stored feature dtype: float32 or float16 (default: float16 stays, all else float32).
    #[serde(default)]
    pub feature_dtype: Option<DType>,
    /// Random node split (train, valid, test) over labelled nodes, seeded by `seed`.
    #[serde(default)]
    pub node_split: Option<[f64; 3]>,
    /// The edge arrays are said to be `(src, rel, dst)` triples (`--relations`): arrays of two
    /// columns are refused rather than converted without relations.
    #[serde(default)]
    pub relations: bool,
}

/// A NumPy conversion.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NumpyJob {
    pub graph: GraphOptions,
    pub numpy: NumpyOptions,
}

/// How to read one edge file.
pub(super) struct EdgeArray {
    pub path: PathBuf,
    pub header: NpyHeader,
    /// Rows (one edge per row) or columns (each column a contiguous run of E ids).
    columns: bool,
    pub width: usize,
    pub edges: u64,
}

pub(super) fn inspect_edges(path: &Path, layout: EdgeLayout) -> Result<EdgeArray> {
    let header = read_header(path)?;
    if !header.dtype.is_int() {
        return Err(StoreError::bad_file(
            path,
            format!("edge ids must be integers, found {}", header.dtype),
        ));
    }
    let [a, b] = header.shape[..] else {
        return Err(StoreError::bad_file(
            path,
            format!(
                "edges must be a 2-D array, (E, 2|3) or (2|3, E); found shape {:?}",
                header.shape
            ),
        ));
    };
    let fits = |k: u64| k == 2 || k == 3;
    // In C order an (E, k) array is rows; in Fortran order the same bytes are columns.
    let as_rows = match layout {
        EdgeLayout::Rows => true,
        EdgeLayout::Columns => false,
        EdgeLayout::Auto => fits(b) || !fits(a),
    };
    let (width, edges) = if as_rows { (b, a) } else { (a, b) };
    if !fits(width) {
        return Err(StoreError::bad_file(
            path,
            format!("shape {:?} read as {} has {width} ids per edge; expected 2 (src, dst) or 3 (src, rel, dst)", header.shape, if as_rows { "rows" } else { "columns" }),
        ));
    }
    Ok(EdgeArray {
        path: path.to_path_buf(),
        columns: as_rows == header.fortran_order,
        width: width as usize,
        edges,
        header,
    })
}

impl EdgeArray {
    /// Streams the edges in batches into `sink`, with the input bytes each batch took;
    /// negative ids are refused naming the edge.
    pub(super) fn stream<E: From<StoreError>>(
        &self,
        io_chunk: usize,
        mut sink: impl FnMut(&EdgeBatch, u64) -> std::result::Result<(), E>,
    ) -> std::result::Result<(), E> {
        let w = self.width;
        let mut batch = EdgeBatch::default();
        let check = |batch: &EdgeBatch, first: u64| -> Result<()> {
            for (role, col) in [
                ("src", &batch.src),
                ("rel", &batch.rel),
                ("dst", &batch.dst),
            ] {
                if let Some(i) = col.iter().position(|&v| v < 0) {
                    return Err(StoreError::bad_file(
                        &self.path,
                        format!(
                            "edge {}: {role} id {} is negative",
                            first + i as u64,
                            col[i]
                        ),
                    ));
                }
            }
            Ok(())
        };
        let mut done = 0u64;
        if self.columns {
            let size = self.header.dtype.size() as u64;
            let mut cols = Vec::new();
            for j in 0..w as u64 {
                let h = NpyHeader {
                    shape: vec![self.edges],
                    data_offset: self.header.data_offset + j * self.edges * size,
                    ..self.header.clone()
                };
                cols.push(IntCursor::new(
                    RowReader::open(&self.path, &h, io_chunk)?,
                    h.dtype,
                ));
            }
            let per = (io_chunk / 8).max(1);
            while done < self.edges {
                let k = per.min((self.edges - done) as usize);
                batch.clear();
                cols[0].take(k, &mut batch.src)?;
                cols[w - 1].take(k, &mut batch.dst)?;
                if w == 3 {
                    cols[1].take(k, &mut batch.rel)?;
                }
                check(&batch, done)?;
                sink(&batch, (k * w) as u64 * size)?;
                done += k as u64;
            }
            return Ok(());
        }
        let mut reader = RowReader::open(&self.path, &self.header, io_chunk)?;
        let mut vals = Vec::new();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            crate::array::decode_ints(bytes, self.header.dtype, &mut vals);
            batch.clear();
            for row in vals.chunks_exact(w) {
                batch.src.push(row[0]);
                batch.dst.push(row[w - 1]);
                if w == 3 {
                    batch.rel.push(row[1]);
                }
            }
            check(&batch, done)?;
            done += batch.len() as u64;
            sink(&batch, bytes.len() as u64)?;
        }
        Ok(())
    }
}

/// Checks ids of a batch against known node and relation counts; an error names the node
/// count as `nodes_from` (`num_nodes`, or where it was learnt).
pub(super) fn check_range(
    batch: &EdgeBatch,
    first: u64,
    num_nodes: Option<u64>,
    nodes_from: &str,
    num_relations: Option<u64>,
    path: &Path,
    what: &str,
) -> Result<()> {
    let over = |col: &[i64], n: Option<u64>| {
        n.and_then(|n| col.iter().position(|&v| v as u64 >= n).map(|i| (i, n)))
    };
    for (role, col, n, name) in [
        ("src", &batch.src, num_nodes, nodes_from),
        ("dst", &batch.dst, num_nodes, nodes_from),
        ("rel", &batch.rel, num_relations, "num_relations"),
    ] {
        if let Some((i, n)) = over(col, n) {
            return Err(StoreError::bad_file(
                path,
                format!(
                    "{what} {}: {role} id {} is out of range: {name} is {n}",
                    first + i as u64,
                    col[i]
                ),
            ));
        }
    }
    Ok(())
}

/// Converts NumPy edge arrays and the node columns `nodes` into a store.
pub fn convert_numpy(
    job: &NumpyJob,
    nodes: &NodeColumns,
    progress: &dyn Progress,
) -> Result<Summary> {
    let graph = &job.graph;
    let opts = &job.numpy;
    graph.validate()?;
    let mut files = vec![(opts.edges.clone(), 0usize)];
    files.extend(opts.valid_edges.iter().map(|p| (p.clone(), 1)));
    files.extend(opts.test_edges.iter().map(|p| (p.clone(), 2)));
    if graph.split.is_some() && files.len() > 1 {
        return Err(StoreError::option(
            "split",
            "a random split cannot be combined with given valid/test edges",
        ));
    }
    let arrays = files
        .iter()
        .map(|(p, _)| inspect_edges(p, opts.layout))
        .collect::<Result<Vec<_>>>()?;
    if arrays.iter().any(|a| a.width != arrays[0].width) {
        return Err(StoreError::option(
            "numpy",
            "edge arrays differ in width: all must have a relation column, or none",
        ));
    }
    let hint = nodes.rows()?;
    if let (Some(n), Some((h, _))) = (graph.num_nodes, hint) {
        if n != h {
            return Err(StoreError::option(
                "num_nodes",
                format!("is {n} but the features/labels have {h} rows"),
            ));
        }
    }
    let known_nodes = graph.num_nodes.or(hint.map(|(h, _)| h));
    // Without --num-nodes, the node columns' rows are the node count: an edge beyond them is
    // as likely a short feature file as a bad edge, so the error says where the count came from.
    let nodes_from = match (graph.num_nodes, hint) {
        (None, Some((_, path))) => {
            format!("num_nodes (the rows of {}, one per node)", path.display())
        }
        _ => "num_nodes".to_string(),
    };
    let has_rel = arrays[0].width == 3;
    if opts.relations && !has_rel {
        return Err(StoreError::bad_file(
            &arrays[0].path,
            "--relations: the edge array has 2 columns (src, dst); (src, rel, dst) triples need 3",
        ));
    }
    let mut clock = Clock::new();
    let mut builder = StoreBuilder::create(&graph.out, graph.overwrite)?;
    let io_chunk = graph.io_chunk();
    let spool_dtype = match known_nodes {
        Some(n) => id_dtype_for(n.max(graph.num_relations.unwrap_or(0))),
        None => DType::I64,
    };
    let plan = announce(
        progress,
        vec![format!(
            "budget {}: streaming {} edge array(s) in {} chunks{}",
            fmt_bytes(graph.memory.0),
            arrays.len(),
            fmt_bytes(io_chunk as u64),
            if has_rel { " with relations" } else { "" }
        )],
    );
    let mut spool = Spool::new(
        &builder.scratch()?,
        "np",
        spool_dtype,
        if has_rel { 3 } else { 2 },
        Attrs::default(),
        io_chunk,
    );
    let total_bytes: u64 = arrays.iter().map(|a| a.header.data_bytes()).sum();
    let mut meter = Meter::new(
        progress,
        "edges",
        total_bytes,
        arrays.iter().map(|a| a.edges).sum(),
    );
    for (a, (_, split)) in arrays.iter().zip(&files) {
        let mut first = 0u64;
        a.stream(io_chunk, |batch, bytes| {
            check_range(
                batch,
                first,
                known_nodes,
                &nodes_from,
                graph.num_relations,
                &a.path,
                "edge",
            )?;
            first += batch.len() as u64;
            spool.append(*split, batch)?;
            Ok::<_, StoreError>(meter.add(batch.len() as u64, bytes)?)
        })?;
        if a.edges == 0 {
            return Err(StoreError::bad_file(&a.path, "holds no edges"));
        }
    }
    meter.finish()?;
    let spooled = spool.finish()?;
    clock.lap("edges in");
    let num_nodes = match known_nodes {
        Some(n) => n,
        None => resolve_num_nodes(graph, spooled.max_node, spooled.total_rows())?,
    };
    let num_relations = if has_rel {
        graph.num_relations.unwrap_or((spooled.max_rel + 1) as u64)
    } else {
        0
    };
    let how = NodeOptions {
        feature_dtype: opts.feature_dtype,
        node_split: opts.node_split,
        seed: graph.seed,
        memory: graph.memory.0,
    };
    let node_data = write_node_data(
        &mut builder,
        nodes,
        &how,
        num_nodes,
        id_dtype_for(num_nodes.max(num_relations)),
        io_chunk,
        progress,
    )?;
    clock.lap("node data");
    let input_bytes = files
        .iter()
        .map(|(p, _)| file_len(p))
        .sum::<Result<u64>>()?
        + nodes.input_bytes()?;
    let ingested = Ingested {
        types: Types::default(),
        converter: "numpy",
        plan,
        input_rows: spooled.total_rows(),
        spooled,
        num_nodes,
        num_relations,
        node_names: false,
        relation_names: false,
        input_files: files.len(),
        input_bytes,
    };
    finish(builder, graph, ingested, node_data, clock, progress)
}

/// Raw int32 pair inputs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BinaryJob {
    pub graph: GraphOptions,
    pub inputs: Vec<InputFile>,
}

/// Converts raw little-endian int32 (src, dst) pair files into a store.
pub fn convert_binary(job: &BinaryJob, progress: &dyn Progress) -> Result<Summary> {
    let graph = &job.graph;
    graph.validate()?;
    let input_bytes = check_inputs(&job.inputs, graph)?;
    for f in &job.inputs {
        check_bin32(&f.path)?;
    }
    let mut clock = Clock::new();
    let builder = StoreBuilder::create(&graph.out, graph.overwrite)?;
    let io_chunk = graph.io_chunk();
    let plan = announce(
        progress,
        vec![format!(
            "budget {}: streaming int32 pairs in {} chunks",
            fmt_bytes(graph.memory.0),
            fmt_bytes(io_chunk as u64)
        )],
    );
    let mut spool = Spool::new(
        &builder.scratch()?,
        "bin",
        DType::I32,
        2,
        Attrs::default(),
        io_chunk,
    );
    let mut meter = Meter::new(progress, "edges", input_bytes, input_bytes / 8);
    for f in &job.inputs {
        let split = split_index(&f.split).expect("validated split");
        stream_bin32(&f.path, graph.num_nodes, io_chunk, |batch, bytes| {
            spool.append(split, batch)?;
            Ok::<_, StoreError>(meter.add(batch.len() as u64, bytes)?)
        })?;
    }
    meter.finish()?;
    let spooled = spool.finish()?;
    clock.lap("edges in");
    let num_nodes = resolve_num_nodes(graph, spooled.max_node, spooled.total_rows())?;
    let ingested = Ingested {
        types: Types::default(),
        converter: "bin32",
        plan,
        input_rows: spooled.total_rows(),
        spooled,
        num_nodes,
        num_relations: 0,
        node_names: false,
        relation_names: false,
        input_files: job.inputs.len(),
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

/// Checks a raw int32 pair file's length: a positive whole number of 8-byte pairs.
pub(super) fn check_bin32(path: &Path) -> Result<u64> {
    let len = file_len(path)?;
    if len == 0 {
        return Err(StoreError::bad_file(path, "is empty: no edges"));
    }
    if len % 8 != 0 {
        return Err(StoreError::bad_file(
            path,
            format!("is {len} bytes, not a whole number of 8-byte int32 (src, dst) pairs"),
        ));
    }
    Ok(len)
}

/// Streams a raw little-endian int32 `(src, dst)` pair file in batches into `sink`, with the
/// bytes each batch took; a negative id, or one at or above `num_nodes` when given, is
/// refused naming the pair and its byte offset.
pub(super) fn stream_bin32<E: From<StoreError>>(
    path: &Path,
    num_nodes: Option<u64>,
    io_chunk: usize,
    mut sink: impl FnMut(&EdgeBatch, u64) -> std::result::Result<(), E>,
) -> std::result::Result<(), E> {
    let mut reader = SeqReader::open(path, 0, io_chunk).map_err(StoreError::from)?;
    let mut batch = EdgeBatch::default();
    let mut first = 0u64;
    while let Some(bytes) = reader.next_chunk().map_err(StoreError::from)? {
        batch.clear();
        for pair in bytes.chunks_exact(8) {
            batch
                .src
                .push(i32::from_le_bytes(pair[..4].try_into().unwrap()) as i64);
            batch
                .dst
                .push(i32::from_le_bytes(pair[4..].try_into().unwrap()) as i64);
        }
        for (role, col) in [("src", &batch.src), ("dst", &batch.dst)] {
            if let Some(i) = col.iter().position(|&v| v < 0) {
                return Err(StoreError::bad_file(
                    path,
                    format!(
                        "pair {} (byte {}): {role} id {} is negative",
                        first + i as u64,
                        (first + i as u64) * 8,
                        col[i]
                    ),
                )
                .into());
            }
        }
        check_range(&batch, first, num_nodes, "num_nodes", None, path, "pair")?;
        first += batch.len() as u64;
        sink(&batch, bytes.len() as u64)?;
    }
    Ok(())
}
