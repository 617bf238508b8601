//! Node data: the node columns an input format brings ([`NodeColumns`], which a format hands
//! out through `EdgeSource::node_columns`), written into the store in batches of about
//! `io_chunk` bytes: features (cast to float32/float16), labels, node splits (id arrays or
//! masks, or an exact random split over the labelled nodes). No column is held whole: a
//! random split reads the labels twice, and given splits keep one byte per node to check that
//! they are disjoint (counted against the budget).

use std::path::{Path, PathBuf};

use crate::array::{decode_f32, decode_ints, NpyWriter, RowReader};
use crate::error::{Result, StoreError};
use crate::manifest::{FeatureInfo, LabelInfo, SPLITS};
use crate::npy::{read_header, DType, NpyHeader};
use crate::store::StoreBuilder;
use strata_io::progress::{Meter, Progress};

use super::spool::Splitter;
use super::{file_len, NodeData};

/// A column of per-node values an input brings (features, labels, a node split), read in
/// order in batches of whole rows.
pub trait NodeColumn: Send + Sync {
    /// Where it is read from (named in messages).
    fn path(&self) -> &Path;

    /// Its element type.
    fn dtype(&self) -> DType;

    /// Its shape, rows first.
    fn shape(&self) -> &[u64];

    /// Bytes of its input.
    fn input_bytes(&self) -> Result<u64>;

    /// Streams the rows in order, in batches of whole rows of about `io_chunk` bytes, into
    /// `sink`; an error from `sink` stops the stream.
    fn stream(&self, io_chunk: usize, sink: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()>;
}

/// A NumPy array (`.npy`, C order) as a node column, read in place.
pub struct NpyColumn {
    path: PathBuf,
    header: NpyHeader,
}

impl NpyColumn {
    /// Opens `path`'s header; an array of rows wider than one value must be in C order.
    pub fn open(path: &Path) -> Result<Box<dyn NodeColumn>> {
        let header = read_header(path)?;
        if header.fortran_order && header.shape.iter().skip(1).product::<u64>() > 1 {
            return Err(StoreError::bad_file(
                path,
                "is in Fortran order; save it with np.ascontiguousarray(a)",
            ));
        }
        Ok(Box::new(NpyColumn {
            path: path.to_path_buf(),
            header,
        }))
    }
}

impl NodeColumn for NpyColumn {
    fn path(&self) -> &Path {
        &self.path
    }

    fn dtype(&self) -> DType {
        self.header.dtype
    }

    fn shape(&self) -> &[u64] {
        &self.header.shape
    }

    fn input_bytes(&self) -> Result<u64> {
        file_len(&self.path)
    }

    fn stream(&self, io_chunk: usize, sink: &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> {
        let mut reader = RowReader::open(&self.path, &self.header, io_chunk)?;
        while let Some(bytes) = reader.next_batch()? {
            sink(bytes)?;
        }
        Ok(())
    }
}

/// The node columns of an input: of every node, or of one node type of a typed input (its
/// arrays indexed by the type's local ids).
#[derive(Default)]
pub struct NodeColumns {
    /// The node type (the line of the node types file), or `None` for every node.
    pub node_type: Option<usize>,
    /// `(nodes, dim)` numbers.
    pub features: Option<Box<dyn NodeColumn>>,
    /// `(nodes,)` or `(nodes, 1)` integers, -1 for unlabelled.
    pub labels: Option<Box<dyn NodeColumn>>,
    /// Node splits (train, valid, test): node ids, or a boolean mask with one entry per node.
    pub splits: [Option<Box<dyn NodeColumn>>; 3],
}

impl NodeColumns {
    /// The columns given, in order (features, labels, splits).
    fn given(&self) -> impl Iterator<Item = &dyn NodeColumn> {
        [&self.features, &self.labels]
            .into_iter()
            .chain(&self.splits)
            .flatten()
            .map(|c| c.as_ref())
    }

    /// Rows of the features and labels, which must agree; `None` when neither is given.
    pub(crate) fn rows(&self) -> Result<Option<(u64, &Path)>> {
        let mut rows: Option<(u64, &Path)> = None;
        for c in [&self.features, &self.labels].into_iter().flatten() {
            let Some(&r) = c.shape().first() else {
                return Err(StoreError::bad_file(c.path(), "is a 0-dimensional array"));
            };
            if let Some((prev, prev_path)) = rows.filter(|(prev, _)| *prev != r) {
                return Err(StoreError::bad_file(
                    c.path(),
                    format!("has {r} rows but {} has {prev}: features and labels must have one row per node", prev_path.display()),
                ));
            }
            rows = Some((r, c.path()));
        }
        Ok(rows)
    }

    /// Bytes of the features and labels read (what a summary counts as node input).
    pub(crate) fn input_bytes(&self) -> Result<u64> {
        [&self.features, &self.labels]
            .into_iter()
            .flatten()
            .map(|c| c.input_bytes())
            .sum()
    }

    /// Whether no column is given.
    pub fn is_empty(&self) -> bool {
        self.given().next().is_none()
    }
}

/// How node columns are stored, beside the columns themselves.
pub(crate) struct NodeOptions {
    /// Output dtype of features (float32 or float16); `None` keeps float16 and makes
    /// everything else float32.
    pub feature_dtype: Option<DType>,
    /// Random node split fractions (over labelled nodes when there are labels).
    pub node_split: Option<[f64; 3]>,
    pub seed: u64,
    /// The conversion's memory budget (bytes).
    pub memory: u64,
}

/// Writes the features, labels and node splits of `cols` for `n` nodes into `builder`, named
/// with the node type's suffix (`features_tI`, `labels_tI`, `node_SPLIT_tI`) when it has one.
pub(crate) fn write_node_data(
    builder: &mut StoreBuilder,
    cols: &NodeColumns,
    how: &NodeOptions,
    n: u64,
    id_dtype: DType,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<NodeData> {
    let suffix = cols.node_type.map_or(String::new(), |t| format!("_t{t}"));
    let mut data = NodeData::default();
    if let Some(c) = &cols.features {
        let info = write_features(builder, c.as_ref(), how, n, &suffix, io_chunk, progress)?;
        data.features = Some(info);
    }
    let mut labelled = None;
    if let Some(c) = &cols.labels {
        let (info, count) = write_labels(builder, c.as_ref(), n, &suffix, io_chunk)?;
        data.labels = Some(info);
        labelled = Some(count);
    }
    let given = cols.splits.iter().any(Option::is_some);
    if given && how.node_split.is_some() {
        return Err(StoreError::option(
            "node_split",
            "a random node split cannot be combined with given node split arrays",
        ));
    }
    let mut writers = SplitWriters::new(&suffix, id_dtype, io_chunk);
    if given {
        write_given_splits(builder, &mut writers, cols, n, how.memory, io_chunk)?;
    } else if let Some(fractions) = how.node_split {
        writers.open_all(builder)?;
        let pool = labelled.unwrap_or(n);
        let mut splitter = Splitter::new(pool, fractions, how.seed);
        let mut assign = |ids: &mut dyn Iterator<Item = i64>| -> Result<()> {
            for v in ids {
                writers.push(splitter.next(), v)?;
            }
            writers.flush()
        };
        match &cols.labels {
            // The labelled nodes, in order: the labels read a second time.
            Some(c) => stream_ints(c.as_ref(), io_chunk, &mut |first, vals| {
                let mut ids = (first..).zip(vals).filter(|(_, &l)| l >= 0).map(|(i, _)| i);
                assign(&mut ids)
            })?,
            None => {
                let per = (io_chunk / 8).max(1) as i64;
                for start in (0..n as i64).step_by(per as usize) {
                    assign(&mut (start..(start + per).min(n as i64)))?;
                }
            }
        }
    }
    writers.finish(builder, &mut data)?;
    Ok(data)
}

/// Streams an integer column's values in batches, with the index of each batch's first.
fn stream_ints(
    c: &dyn NodeColumn,
    io_chunk: usize,
    sink: &mut dyn FnMut(i64, &[i64]) -> Result<()>,
) -> Result<()> {
    let mut vals = Vec::new();
    let mut first = 0i64;
    c.stream(io_chunk, &mut |bytes| {
        vals.clear();
        decode_ints(bytes, c.dtype(), &mut vals);
        sink(first, &vals)?;
        first += vals.len() as i64;
        Ok(())
    })
}

/// The writers of the node split arrays (`node_SPLIT{suffix}`), fed id by id.
struct SplitWriters<'a> {
    suffix: &'a str,
    id_dtype: DType,
    io_chunk: usize,
    open: [Option<(NpyWriter, Vec<i64>, u64)>; 3],
}

impl<'a> SplitWriters<'a> {
    fn new(suffix: &'a str, id_dtype: DType, io_chunk: usize) -> Self {
        SplitWriters {
            suffix,
            id_dtype,
            io_chunk,
            open: Default::default(),
        }
    }

    fn name(&self, slot: usize) -> String {
        format!("node_{}{}", SPLITS[slot], self.suffix)
    }

    fn open(&mut self, builder: &mut StoreBuilder, slot: usize) -> Result<()> {
        let w = builder.writer(&self.name(slot), self.id_dtype, &[], self.io_chunk)?;
        self.open[slot] = Some((w, Vec::new(), 0));
        Ok(())
    }

    fn open_all(&mut self, builder: &mut StoreBuilder) -> Result<()> {
        (0..3).try_for_each(|slot| self.open(builder, slot))
    }

    /// Appends node `v` to split `slot` (opened).
    fn push(&mut self, slot: usize, v: i64) -> Result<()> {
        let (w, buf, count) = self.open[slot].as_mut().expect("an opened split");
        buf.push(v);
        *count += 1;
        if buf.len() * 8 >= self.io_chunk {
            w.write_ints(buf)?;
            buf.clear();
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        for (w, buf, _) in self.open.iter_mut().flatten() {
            w.write_ints(buf)?;
            buf.clear();
        }
        Ok(())
    }

    /// Finishes the opened splits and records their sizes.
    fn finish(mut self, builder: &mut StoreBuilder, data: &mut NodeData) -> Result<()> {
        self.flush()?;
        for (slot, split) in SPLITS.iter().enumerate() {
            if let Some((w, _, count)) = self.open[slot].take() {
                builder.add(&self.name(slot), w.finish()?);
                data.node_splits.insert(split.to_string(), count);
            }
        }
        Ok(())
    }
}

/// Writes the given node splits (id arrays or boolean masks), refusing a node in two splits:
/// one byte per node (`n` bytes of the `memory` budget) records its split.
fn write_given_splits(
    builder: &mut StoreBuilder,
    writers: &mut SplitWriters,
    cols: &NodeColumns,
    n: u64,
    memory: u64,
    io_chunk: usize,
) -> Result<()> {
    if n > memory {
        return Err(StoreError::Budget {
            budget: memory,
            needed: n,
            what: format!("checking that the node splits are disjoint ({n} nodes, a byte each)"),
        });
    }
    let mut member = vec![0u8; n as usize];
    for (slot, c) in cols.splits.iter().enumerate() {
        let Some(c) = c else { continue };
        let c = c.as_ref();
        let mask = check_split(c, n)?;
        writers.open(builder, slot)?;
        stream_ints(c, io_chunk, &mut |first, vals| {
            for (i, &v) in (first..).zip(vals) {
                let v = match mask {
                    true if v == 0 => continue,
                    true => i,
                    false if v < 0 || v as u64 >= n => {
                        return Err(StoreError::bad_file(
                            c.path(),
                            format!("entry {i} is node {v}, outside [0, {n})"),
                        ))
                    }
                    false => v,
                };
                let prev = std::mem::replace(&mut member[v as usize], slot as u8 + 1);
                if prev != 0 && prev != slot as u8 + 1 {
                    return Err(StoreError::bad_file(
                        c.path(),
                        format!(
                            "node {v} is also in node_{}: node splits must be disjoint",
                            SPLITS[prev as usize - 1]
                        ),
                    ));
                }
                writers.push(slot, v)?;
            }
            Ok(())
        })?;
    }
    Ok(())
}

/// Checks a node split's shape and type; returns whether it is a boolean mask.
fn check_split(c: &dyn NodeColumn, n: u64) -> Result<bool> {
    let shape = c.shape();
    if shape.len() != 1 {
        return Err(StoreError::bad_file(
            c.path(),
            format!("a node split must be 1-D (ids or a mask), found shape {shape:?}"),
        ));
    }
    let mask = c.dtype() == DType::Bool;
    if mask && shape[0] != n {
        return Err(StoreError::bad_file(
            c.path(),
            format!(
                "a boolean mask must have one entry per node ({n}), found {}",
                shape[0]
            ),
        ));
    }
    if !c.dtype().is_int() && !mask {
        return Err(StoreError::bad_file(
            c.path(),
            format!(
                "node ids must be integers or a boolean mask, found {}",
                c.dtype()
            ),
        ));
    }
    Ok(mask)
}

fn write_features(
    builder: &mut StoreBuilder,
    c: &dyn NodeColumn,
    how: &NodeOptions,
    n: u64,
    suffix: &str,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<FeatureInfo> {
    let name = format!("features{suffix}");
    let (path, dtype) = (c.path(), c.dtype());
    let [rows, dim] = c.shape()[..] else {
        return Err(StoreError::bad_file(
            path,
            format!(
                "features must be a 2-D array (nodes, dim), found shape {:?}",
                c.shape()
            ),
        ));
    };
    if rows != n {
        return Err(StoreError::bad_file(
            path,
            format!("has {rows} rows but the graph has {n} nodes"),
        ));
    }
    if dtype == DType::Bool {
        return Err(StoreError::bad_file(
            path,
            "features must be numbers, found bool",
        ));
    }
    let out = match how.feature_dtype {
        Some(d @ (DType::F32 | DType::F16)) => d,
        Some(d) => {
            return Err(StoreError::option(
                "feature_dtype",
                format!("must be float32 or float16, got {d}"),
            ))
        }
        None if dtype == DType::F16 => DType::F16,
        None => DType::F32,
    };
    let mut w = builder.writer(&name, out, &[dim], io_chunk)?;
    let row_bytes = (dim as usize * dtype.size()).max(1) as u64;
    let mut meter = Meter::new(progress, "features", rows * row_bytes, rows);
    let mut vals = Vec::new();
    let mut halves: Vec<half::f16> = Vec::new();
    let mut first = 0u64;
    c.stream(io_chunk, &mut |bytes| {
        vals.clear();
        decode_f32(bytes, dtype, &mut vals);
        if out == DType::F16 {
            halves.clear();
            halves.extend(vals.iter().map(|&v| half::f16::from_f32(v)));
        }
        // Checked as stored: a float64 beyond float32's range, or a float32 beyond float16's,
        // becomes an infinity the store's own check (and every model reading the row) refuses.
        let stored_finite = |i: usize| match out {
            DType::F16 => halves[i].is_finite(),
            _ => vals[i].is_finite(),
        };
        if let Some(i) = (0..vals.len()).find(|&i| !stored_finite(i)) {
            let at = first + i as u64;
            return Err(StoreError::bad_file(
                path,
                format!(
                    "row {}, column {}: {} is not a finite {out} number (NaN, an infinity, or \
                     beyond {out}'s range)",
                    at / dim.max(1),
                    at % dim.max(1),
                    vals[i]
                ),
            ));
        }
        first += vals.len() as u64;
        match (dtype == out, out) {
            (true, _) => w.write_bytes(bytes)?,
            (false, DType::F16) => w.write(&halves)?,
            (false, _) => w.write(&vals)?,
        }
        meter.add(bytes.len() as u64 / row_bytes, bytes.len() as u64)?;
        Ok(())
    })?;
    meter.finish()?;
    builder.add(&name, w.finish()?);
    Ok(FeatureInfo { dim, dtype: out })
}

/// Writes the labels (one per node; -1 for unlabelled); returns their info and how many
/// nodes have a label.
fn write_labels(
    builder: &mut StoreBuilder,
    c: &dyn NodeColumn,
    n: u64,
    suffix: &str,
    io_chunk: usize,
) -> Result<(LabelInfo, u64)> {
    let path = c.path();
    let shape = c.shape();
    if shape != [n] && shape != [n, 1] {
        return Err(StoreError::bad_file(
            path,
            format!("labels must have shape ({n},) or ({n}, 1), found {shape:?}"),
        ));
    }
    if !c.dtype().is_int() {
        return Err(StoreError::bad_file(
            path,
            format!("labels must be integers, found {}", c.dtype()),
        ));
    }
    let name = format!("labels{suffix}");
    let mut w = builder.writer(&name, DType::I32, &[], io_chunk)?;
    let (mut max, mut labelled) = (-1i64, 0u64);
    let mut labels: Vec<i32> = Vec::new();
    stream_ints(c, io_chunk, &mut |first, vals| {
        labels.clear();
        for (i, &v) in (first..).zip(vals) {
            if !(-1..=i32::MAX as i64).contains(&v) {
                return Err(StoreError::bad_file(
                    path,
                    format!("node {i} has label {v}; labels must be >= 0, or -1 for unlabelled"),
                ));
            }
            max = max.max(v);
            labelled += u64::from(v >= 0);
            labels.push(v as i32);
        }
        w.write(&labels)
    })?;
    if max < 0 {
        return Err(StoreError::bad_file(
            path,
            "no node has a label (all are -1)",
        ));
    }
    builder.add(&name, w.finish()?);
    Ok((
        LabelInfo {
            num_classes: (max + 1) as u64,
        },
        labelled,
    ))
}
