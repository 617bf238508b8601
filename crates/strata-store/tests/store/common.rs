//! Helpers shared by the converter integration tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;

use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::convert::{
    convert_numpy, convert_typed_numpy, NodeColumns, NpyColumn, NumpyJob, Summary, TypedNumpyJob,
};
use strata_store::strtab::NameTable;
use strata_store::Store;

/// Reads a whole integer array of a store.
pub fn ints(store: &Store, name: &str) -> Vec<i64> {
    let (h, bytes) = read_all_bytes(&store.array_path(name).unwrap()).unwrap();
    let mut out = Vec::new();
    decode_ints(&bytes, h.dtype, &mut out);
    out
}

/// Rows of an edge array as (src, rel, dst) with rel = -1 when there is no relation column.
pub fn edges(store: &Store, split: &str) -> Vec<(i64, i64, i64)> {
    let info = store.require(&format!("edges_{split}")).unwrap().clone();
    let cols = info.shape[1] as usize;
    ints(store, &format!("edges_{split}"))
        .chunks_exact(cols)
        .map(|r| (r[0], if cols == 3 { r[1] } else { -1 }, r[cols - 1]))
        .collect()
}

/// Neighbour lists from indptr/indices.
pub fn adjacency(store: &Store, side: &str) -> Vec<Vec<i64>> {
    let ptr = ints(store, &format!("{side}_indptr"));
    let idx = ints(store, &format!("{side}_indices"));
    ptr.windows(2)
        .map(|w| idx[w[0] as usize..w[1] as usize].to_vec())
        .collect()
}

/// The adjacency a correct converter must produce: neighbours in edge-list order.
pub fn reference_adjacency(
    n: usize,
    edges: &[(i64, i64, i64)],
    by_dst: bool,
    symmetrize: bool,
) -> Vec<Vec<i64>> {
    let mut adj = vec![Vec::new(); n];
    for &(s, _, d) in edges {
        let (k, v) = if by_dst { (d, s) } else { (s, d) };
        adj[k as usize].push(v);
        if symmetrize {
            adj[v as usize].push(k);
        }
    }
    adj
}

/// Node names of a store, by id.
pub fn names(store: &Store, prefix: &str) -> Vec<String> {
    let t = NameTable::open(store, prefix).unwrap();
    (0..t.len())
        .map(|i| String::from_utf8(t.get(i).unwrap().to_vec()).unwrap())
        .collect()
}

/// Every array file's bytes, keyed by array name (for comparing two conversions).
pub fn array_bytes(store: &Store) -> BTreeMap<String, Vec<u8>> {
    store
        .manifest()
        .arrays
        .iter()
        .map(|(name, info)| {
            (
                name.clone(),
                std::fs::read(store.path().join(&info.file)).unwrap(),
            )
        })
        .collect()
}

/// Graph options as the Python front end sends them.
pub fn graph_opts(out: &Path, memory: u64, extra: serde_json::Value) -> serde_json::Value {
    let mut g = serde_json::json!({ "out": out, "memory": memory, "io_chunk": 4096 });
    if let serde_json::Value::Object(m) = extra {
        for (k, v) in m {
            g[k] = v;
        }
    }
    g
}

/// Lists what is left in a directory (to check that a failed conversion left nothing behind).
pub fn entries(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// Writes a `.npy` file the way NumPy does (header padded to 64 bytes, not 4096).
pub fn write_npy(path: &Path, descr: &str, fortran: bool, shape: &[usize], data: &[u8]) {
    let shape_str = match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let dict = format!(
        "{{'descr': '{descr}', 'fortran_order': {}, 'shape': {shape_str}, }}",
        if fortran { "True" } else { "False" }
    );
    let mut header = dict.into_bytes();
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(b' ');
    }
    header.push(b'\n');
    let mut out = b"\x93NUMPY\x01\x00".to_vec();
    out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(data);
    std::fs::write(path, out).unwrap();
}

/// Little-endian bytes of i64 values narrowed to `width` bytes (4 or 8).
pub fn le_ints(vals: &[i64], width: usize) -> Vec<u8> {
    vals.iter()
        .flat_map(|&v| {
            if width == 4 {
                (v as i32).to_le_bytes().to_vec()
            } else {
                v.to_le_bytes().to_vec()
            }
        })
        .collect()
}

/// Takes the node files (`features`, `labels`, `node_train`, `node_valid`, `node_test`) out
/// of a NumPy job's JSON object `spec` and opens them as node columns (of `node_type`, for a
/// typed job), as the numpy input format hands them to its converter.
pub fn take_node_columns(
    spec: &mut serde_json::Value,
    node_type: Option<usize>,
) -> strata_store::Result<NodeColumns> {
    let mut take = |role: &str| {
        let path = spec.as_object_mut().and_then(|m| m.remove(role));
        path.and_then(|p| p.as_str().map(std::path::PathBuf::from))
            .map(|p| NpyColumn::open(&p))
            .transpose()
    };
    Ok(NodeColumns {
        node_type,
        features: take("features")?,
        labels: take("labels")?,
        splits: [take("node_train")?, take("node_valid")?, take("node_test")?],
    })
}

/// Converts a NumPy job given as JSON (`{"graph": ..., "numpy": ...}`, node files in `numpy`).
pub fn convert_numpy_json(
    mut job: serde_json::Value,
    progress: &dyn strata_store::Progress,
) -> strata_store::Result<Summary> {
    let nodes = take_node_columns(&mut job["numpy"], None)?;
    let job: NumpyJob = serde_json::from_value(job).unwrap();
    convert_numpy(&job, &nodes, progress)
}

/// Converts a typed NumPy job given as JSON (`{"graph": ..., "typed_numpy": ...}`, with a
/// `nodes` list of `{"node_type": I, "features": ..., ...}` in `typed_numpy`).
pub fn convert_typed_numpy_json(
    mut job: serde_json::Value,
    progress: &dyn strata_store::Progress,
) -> strata_store::Result<Summary> {
    let specs = job["typed_numpy"]
        .as_object_mut()
        .and_then(|m| m.remove("nodes"))
        .unwrap_or_default();
    let mut nodes = Vec::new();
    for mut spec in specs.as_array().cloned().unwrap_or_default() {
        let node_type = spec["node_type"].as_u64().map(|t| t as usize);
        nodes.push(take_node_columns(&mut spec, node_type)?);
    }
    let job: TypedNumpyJob = serde_json::from_value(job).unwrap();
    convert_typed_numpy(&job, &nodes, progress)
}
