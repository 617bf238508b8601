//! Node data from NumPy arrays: features, labels and node splits.

use std::path::{Path, PathBuf};

use crate::array::{decode_f32, decode_ints, RowReader};
use crate::error::{Result, StoreError};
use crate::manifest::{FeatureInfo, LabelInfo, SPLITS};
use crate::npy::{read_header, DType, NpyHeader};
use crate::store::StoreBuilder;
use strata_io::progress::{Meter, Progress};

use super::spool::Splitter;
use super::NodeData;

/// Node data inputs of a NumPy conversion.
pub(crate) struct NodeInputs<'a> {
    pub features: Option<&'a Path>,
    /// Output dtype of features (float32 or float16); `None` keeps float16 and makes
    /// everything else float32.
    pub feature_dtype: Option<DType>,
    pub labels: Option<&'a Path>,
    /// Given node splits: index arrays or boolean masks, per split.
    pub splits: [Option<&'a PathBuf>; 3],
    /// Random node split fractions (over labelled nodes when there are labels).
    pub node_split: Option<[f64; 3]>,
    pub seed: u64,
    /// Appended to every array name: empty for a plain store, `_tI` for node type `I` of a
    /// typed one (`features_tI`, `labels_tI`, `node_SPLIT_tI`).
    pub suffix: &'a str,
}

/// Rows of features and labels, which must agree; `None` when neither is given.
pub(crate) fn node_count_hint(inputs: &NodeInputs) -> Result<Option<u64>> {
    let mut hint: Option<(u64, &Path)> = None;
    for path in [inputs.features, inputs.labels].into_iter().flatten() {
        let h = read_header(path)?;
        let rows = *h
            .shape
            .first()
            .ok_or_else(|| StoreError::bad_file(path, "is a 0-dimensional array"))?;
        if let Some((prev, prev_path)) = hint {
            if prev != rows {
                return Err(StoreError::bad_file(
                    path,
                    format!("has {rows} rows but {} has {prev}: features and labels must have one row per node", prev_path.display()),
                ));
            }
        }
        hint = Some((rows, path));
    }
    Ok(hint.map(|(r, _)| r))
}

/// Writes features, labels and node splits for `n` nodes into `builder`.
pub(crate) fn write_node_data(
    builder: &mut StoreBuilder,
    inputs: &NodeInputs,
    n: u64,
    id_dtype: DType,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<NodeData> {
    let mut data = NodeData::default();
    if let Some(path) = inputs.features {
        data.features = Some(write_features(
            builder,
            path,
            inputs.feature_dtype,
            n,
            inputs.suffix,
            io_chunk,
            progress,
        )?);
    }
    let mut labels = None;
    if let Some(path) = inputs.labels {
        let (info, values) = write_labels(builder, path, n, inputs.suffix, io_chunk)?;
        data.labels = Some(info);
        labels = Some(values);
    }
    let given = inputs.splits.iter().any(Option::is_some);
    if given && inputs.node_split.is_some() {
        return Err(StoreError::option(
            "node_split",
            "a random node split cannot be combined with given node split arrays",
        ));
    }
    if given {
        let mut member = vec![0u8; n as usize];
        for (slot, path) in inputs.splits.iter().enumerate() {
            let Some(path) = path else { continue };
            let ids = read_node_ids(path, n, io_chunk)?;
            for &v in &ids {
                let prev = std::mem::replace(&mut member[v as usize], slot as u8 + 1);
                if prev != 0 && prev != slot as u8 + 1 {
                    return Err(StoreError::bad_file(
                        path,
                        format!(
                            "node {v} is also in node_{}: node splits must be disjoint",
                            SPLITS[prev as usize - 1]
                        ),
                    ));
                }
            }
            write_split(
                builder,
                slot,
                &ids,
                id_dtype,
                inputs.suffix,
                io_chunk,
                &mut data,
            )?;
        }
    } else if let Some(fractions) = inputs.node_split {
        let pool: Vec<i64> = match &labels {
            Some(l) => (0..n as i64).filter(|&i| l[i as usize] >= 0).collect(),
            None => (0..n as i64).collect(),
        };
        let mut splitter = Splitter::new(pool.len() as u64, fractions, inputs.seed);
        let mut parts: [Vec<i64>; 3] = Default::default();
        for v in pool {
            parts[splitter.next()].push(v);
        }
        for (slot, ids) in parts.iter().enumerate() {
            write_split(
                builder,
                slot,
                ids,
                id_dtype,
                inputs.suffix,
                io_chunk,
                &mut data,
            )?;
        }
    }
    Ok(data)
}

fn write_split(
    builder: &mut StoreBuilder,
    slot: usize,
    ids: &[i64],
    id_dtype: DType,
    suffix: &str,
    io_chunk: usize,
    data: &mut NodeData,
) -> Result<()> {
    let name = format!("node_{}{suffix}", SPLITS[slot]);
    let mut w = builder.writer(&name, id_dtype, &[], io_chunk)?;
    w.write_ints(ids)?;
    builder.add(&name, w.finish()?);
    data.node_splits
        .insert(SPLITS[slot].to_string(), ids.len() as u64);
    Ok(())
}

fn require_c_order(path: &Path, h: &NpyHeader) -> Result<()> {
    if h.fortran_order && h.shape.len() > 1 {
        return Err(StoreError::bad_file(
            path,
            "is in Fortran order; save it with np.ascontiguousarray(a)",
        ));
    }
    Ok(())
}

fn write_features(
    builder: &mut StoreBuilder,
    path: &Path,
    want: Option<DType>,
    n: u64,
    suffix: &str,
    io_chunk: usize,
    progress: &dyn Progress,
) -> Result<FeatureInfo> {
    let name = format!("features{suffix}");
    let h = read_header(path)?;
    require_c_order(path, &h)?;
    let [rows, dim] = h.shape[..] else {
        return Err(StoreError::bad_file(
            path,
            format!(
                "features must be a 2-D array (nodes, dim), found shape {:?}",
                h.shape
            ),
        ));
    };
    if rows != n {
        return Err(StoreError::bad_file(
            path,
            format!("has {rows} rows but the graph has {n} nodes"),
        ));
    }
    if h.dtype == DType::Bool {
        return Err(StoreError::bad_file(
            path,
            "features must be numbers, found bool",
        ));
    }
    let out = match want {
        Some(d @ (DType::F32 | DType::F16)) => d,
        Some(d) => {
            return Err(StoreError::option(
                "feature_dtype",
                format!("must be float32 or float16, got {d}"),
            ))
        }
        None if h.dtype == DType::F16 => DType::F16,
        None => DType::F32,
    };
    let mut w = builder.writer(&name, out, &[dim], io_chunk)?;
    let mut reader = RowReader::open(path, &h, io_chunk)?;
    let mut meter = Meter::new(progress, "features", h.data_bytes(), rows);
    let row_bytes = (dim as usize * h.dtype.size()).max(1) as u64;
    let mut vals = Vec::new();
    let mut halves: Vec<half::f16> = Vec::new();
    while let Some(bytes) = reader.next_batch()? {
        if h.dtype == out {
            w.write_bytes(bytes)?;
        } else {
            vals.clear();
            decode_f32(bytes, h.dtype, &mut vals);
            if out == DType::F32 {
                w.write(&vals)?;
            } else {
                halves.clear();
                halves.extend(vals.iter().map(|&v| half::f16::from_f32(v)));
                w.write(&halves)?;
            }
        }
        meter.add(bytes.len() as u64 / row_bytes, bytes.len() as u64)?;
    }
    meter.finish()?;
    builder.add(&name, w.finish()?);
    Ok(FeatureInfo { dim, dtype: out })
}

/// Writes labels and returns them (one per node; -1 for unlabelled).
fn write_labels(
    builder: &mut StoreBuilder,
    path: &Path,
    n: u64,
    suffix: &str,
    io_chunk: usize,
) -> Result<(LabelInfo, Vec<i32>)> {
    let h = read_header(path)?;
    let ok_shape = h.shape == [n] || h.shape == [n, 1];
    if !ok_shape {
        return Err(StoreError::bad_file(
            path,
            format!(
                "labels must have shape ({n},) or ({n}, 1), found {:?}",
                h.shape
            ),
        ));
    }
    if !h.dtype.is_int() {
        return Err(StoreError::bad_file(
            path,
            format!("labels must be integers, found {}", h.dtype),
        ));
    }
    let mut reader = RowReader::open(path, &h, io_chunk)?;
    let mut labels = Vec::with_capacity(n as usize);
    let mut vals = Vec::new();
    while let Some(bytes) = reader.next_batch()? {
        vals.clear();
        decode_ints(bytes, h.dtype, &mut vals);
        for &v in &vals {
            if !(-1..=i32::MAX as i64).contains(&v) {
                return Err(StoreError::bad_file(
                    path,
                    format!(
                        "node {} has label {v}; labels must be >= 0, or -1 for unlabelled",
                        labels.len()
                    ),
                ));
            }
            labels.push(v as i32);
        }
    }
    let num_classes = labels.iter().copied().max().unwrap_or(-1) + 1;
    if num_classes == 0 {
        return Err(StoreError::bad_file(
            path,
            "no node has a label (all are -1)",
        ));
    }
    let name = format!("labels{suffix}");
    let mut w = builder.writer(&name, DType::I32, &[], io_chunk)?;
    w.write(&labels)?;
    builder.add(&name, w.finish()?);
    Ok((
        LabelInfo {
            num_classes: num_classes as u64,
        },
        labels,
    ))
}

/// Reads a node split: an integer array of node ids, or a boolean mask of length `n`.
fn read_node_ids(path: &Path, n: u64, io_chunk: usize) -> Result<Vec<i64>> {
    let h = read_header(path)?;
    if h.shape.len() != 1 {
        return Err(StoreError::bad_file(
            path,
            format!(
                "a node split must be 1-D (ids or a mask), found shape {:?}",
                h.shape
            ),
        ));
    }
    let mask = h.dtype == DType::Bool;
    if mask && h.shape[0] != n {
        return Err(StoreError::bad_file(
            path,
            format!(
                "a boolean mask must have one entry per node ({n}), found {}",
                h.shape[0]
            ),
        ));
    }
    if !h.dtype.is_int() && !mask {
        return Err(StoreError::bad_file(
            path,
            format!(
                "node ids must be integers or a boolean mask, found {}",
                h.dtype
            ),
        ));
    }
    let mut reader = RowReader::open(path, &h, io_chunk)?;
    let mut vals = Vec::new();
    while let Some(bytes) = reader.next_batch()? {
        decode_ints(bytes, h.dtype, &mut vals);
    }
    if mask {
        return Ok(vals
            .iter()
            .enumerate()
            .filter(|(_, &m)| m != 0)
            .map(|(i, _)| i as i64)
            .collect());
    }
    if let Some((i, v)) = vals
        .iter()
        .enumerate()
        .find(|(_, &v)| v < 0 || v as u64 >= n)
    {
        return Err(StoreError::bad_file(
            path,
            format!("entry {i} is node {v}, outside [0, {n})"),
        ));
    }
    Ok(vals)
}
