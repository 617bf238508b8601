use std::path::{Path, PathBuf};

use strata_store::array::{read_all_bytes, NpyWriter};
use strata_store::convert::{convert, ConvertOptions};
use strata_store::npy::DType;
use strata_store::{NoProgress, Store};

use super::*;

/// Writes a `.npy` of `rows` rows of `dtype` elements (`row` values each) at `path`.
fn npy(path: &Path, dtype: DType, row: u64, values: &[i64]) {
    let shape: Vec<u64> = if row > 1 { vec![row] } else { vec![] };
    let mut w = NpyWriter::create(path, dtype, &shape, 1 << 16).unwrap();
    match dtype {
        DType::F32 => w
            .write(&values.iter().map(|&v| v as f32).collect::<Vec<_>>())
            .unwrap(),
        _ => w.write_ints(values).unwrap(),
    }
    w.finish().unwrap();
}

/// A store of `n` nodes: edges `(k % n, k * 31 % n)` for the first 3n values of k (a
/// connected-ish graph with repeats), features `(n, 3)`, labels and node splits.
fn store(dir: &Path, n: i64, symmetrize: bool) -> PathBuf {
    let raw = dir.join("raw");
    std::fs::create_dir_all(&raw).unwrap();
    let edges: Vec<i64> = (0..3 * n).flat_map(|k| [k % n, k * 31 % (n - 3)]).collect();
    npy(&raw.join("edges.npy"), DType::I64, 2, &edges);
    let features: Vec<i64> = (0..3 * n).collect();
    npy(&raw.join("features.npy"), DType::F32, 3, &features);
    npy(
        &raw.join("labels.npy"),
        DType::I32,
        1,
        &(0..n).map(|v| v % 4).collect::<Vec<_>>(),
    );
    npy(
        &raw.join("train.npy"),
        DType::I64,
        1,
        &(0..n).step_by(3).collect::<Vec<_>>(),
    );
    let out = dir.join(if symmetrize { "s.strata" } else { "d.strata" });
    let section: ConvertOptions = strata_store::config::check(&serde_json::json!({
        "inputs": [raw.join("edges.npy")], "out": out, "memory": 64u64 << 20,
        "symmetrize": symmetrize, "num_nodes": n, "features": raw.join("features.npy"),
        "labels": raw.join("labels.npy"), "node_train": raw.join("train.npy"),
    }))
    .unwrap();
    convert(&section, serde_json::Value::Null, &NoProgress).unwrap();
    out
}

fn ints(store: &Store, name: &str) -> Vec<i64> {
    let (header, bytes) = read_all_bytes(&store.array_path(name).unwrap()).unwrap();
    let mut out = Vec::new();
    strata_store::array::decode_ints(&bytes, header.dtype, &mut out);
    out
}

fn floats(store: &Store, name: &str) -> Vec<f32> {
    let (header, bytes) = read_all_bytes(&store.array_path(name).unwrap()).unwrap();
    let mut out = Vec::new();
    strata_store::array::decode_f32(&bytes, header.dtype, &mut out);
    out
}

fn options(src: &Path, out: &Path, order: OrderKind) -> ReorderOptions {
    ReorderOptions {
        store: src.to_path_buf(),
        out: out.to_path_buf(),
        order: Some(order),
        ..ReorderOptions::default()
    }
}

/// Checks that `b`'s `original_id` maps every node-indexed array and id of `b` back to `a`'s
/// (97 nodes): edges, both topologies segment by segment, features, labels, node splits.
fn assert_maps_back(a: &Store, b: &Store, what: &str) {
    let orig = ints(b, "original_id");
    let mut sorted = orig.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..97).collect::<Vec<_>>(), "{what}");
    let back = |v: i64| orig[v as usize];
    let edges_b: Vec<i64> = ints(b, "edges_train").into_iter().map(back).collect();
    assert_eq!(edges_b, ints(a, "edges_train"), "{what}");
    for prefix in ["csr", "csc"] {
        let (ip_a, ix_a) = (
            ints(a, &format!("{prefix}_indptr")),
            ints(a, &format!("{prefix}_indices")),
        );
        let (ip_b, ix_b) = (
            ints(b, &format!("{prefix}_indptr")),
            ints(b, &format!("{prefix}_indices")),
        );
        for v in 0..97usize {
            let old = orig[v] as usize;
            let seg_b: Vec<i64> = ix_b[ip_b[v] as usize..ip_b[v + 1] as usize]
                .iter()
                .map(|&x| back(x))
                .collect();
            assert_eq!(
                seg_b,
                ix_a[ip_a[old] as usize..ip_a[old + 1] as usize],
                "{what} {prefix} {v}"
            );
        }
    }
    let (fa, fb) = (floats(a, "features"), floats(b, "features"));
    for v in 0..97usize {
        let old = orig[v] as usize;
        assert_eq!(fb[3 * v..3 * v + 3], fa[3 * old..3 * old + 3], "{what}");
    }
    let (la, lb) = (ints(a, "labels"), ints(b, "labels"));
    assert!((0..97).all(|v| lb[v] == la[orig[v] as usize]), "{what}");
    let train_b: Vec<i64> = ints(b, "node_train").into_iter().map(back).collect();
    assert_eq!(train_b, ints(a, "node_train"), "{what}");
}

#[test]
fn a_reordered_store_maps_back_to_its_input() {
    let dir = tempfile::tempdir().unwrap();
    for symmetrize in [true, false] {
        let src = store(dir.path(), 97, symmetrize);
        for &order in OrderKind::ALL {
            let out = dir.path().join(format!("{order}-{symmetrize}.strata"));
            let summary = reorder_store(&options(&src, &out, order), &NoProgress).unwrap();
            assert_eq!(summary.nodes, 97);
            let (a, b) = (Store::open(&src).unwrap(), Store::open(&out).unwrap());
            assert_maps_back(&a, &b, order.name());
            assert_eq!(a.manifest().arrays.len() + 1, b.manifest().arrays.len());
            for (name, info) in &a.manifest().arrays {
                assert_eq!(&b.manifest().arrays[name], info, "{order} {name}");
            }
            assert_eq!(b.manifest().provenance["reorder"]["order"], order.name());
        }
    }
}

#[test]
fn a_store_reordered_again_maps_back_to_the_first_input() {
    // It was refused ("already reordered ... reorder that input instead"), which needs the
    // input kept; original_id composes instead: the first input's id of each node.
    let dir = tempfile::tempdir().unwrap();
    let src = store(dir.path(), 97, false);
    let (once, twice) = (
        dir.path().join("once.strata"),
        dir.path().join("twice.strata"),
    );
    reorder_store(&options(&src, &once, OrderKind::BreadthFirst), &NoProgress).unwrap();
    reorder_store(&options(&once, &twice, OrderKind::Degree), &NoProgress).unwrap();
    let (a, b) = (Store::open(&src).unwrap(), Store::open(&twice).unwrap());
    assert_maps_back(&a, &b, "bfs then degree");
    assert_eq!(
        a.manifest().arrays.len() + 1,
        b.manifest().arrays.len(),
        "one original_id"
    );
    assert_eq!(
        b.manifest().provenance["reorder"]["input_provenance"]["reorder"]["order"],
        "bfs"
    );
}

#[test]
fn refusals_name_the_reason_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let src = store(dir.path(), 50, true);
    let out = dir.path().join("r.strata");
    let bfs = options(&src, &out, OrderKind::BreadthFirst);
    let tiny = ReorderOptions {
        memory: Size(4096),
        ..bfs.clone()
    };
    let err = reorder_store(&tiny, &NoProgress).unwrap_err().to_string();
    assert!(
        err.contains("memory budget of 4.00 KiB is too small") && err.contains("reorder.memory"),
        "{err}"
    );
    let same = options(&src, &src, OrderKind::Degree);
    let err = reorder_store(&same, &NoProgress).unwrap_err().to_string();
    assert!(err.contains("is the input store"), "{err}");
    reorder_store(&bfs, &NoProgress).unwrap();
    let err = reorder_store(&bfs, &NoProgress).unwrap_err();
    assert!(
        matches!(err, GraphError::Store(StoreError::Exists { .. })),
        "{err}"
    );
    let overwrite = ReorderOptions {
        overwrite: true,
        ..options(&src, &out, OrderKind::CuthillMcKee)
    };
    reorder_store(&overwrite, &NoProgress).unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".partial-"))
        .collect();
    assert!(leftovers.is_empty());
}

#[test]
fn the_plan_bounds_what_the_order_and_the_writes_hold() {
    let dir = tempfile::tempdir().unwrap();
    let src = store(dir.path(), 500, false);
    let store = Store::open(&src).unwrap();
    let plan = plan_for(&store, OrderKind::Community, 64 << 20, 256).unwrap();
    // 500 nodes, CSR + CSC of 1500 edges each: three offset arrays and 3000 entries.
    assert_eq!(plan.entries, 3000);
    assert_eq!(plan.adjacency_bytes, 3 * 8 * 501 + 4 * 3000);
    assert_eq!(plan.order_bytes, 16 * 500 + 4 * 3000);
    assert_eq!(plan.chunk_rows, CHUNK_ROWS);
    let small = plan_for(&store, OrderKind::Community, plan.minimum, 256).unwrap();
    assert!(small.chunk_rows >= 1 && small.minimum <= plan.minimum);
    assert!(plan_for(&store, OrderKind::Community, plan.minimum - 1, 256).is_err());
    let lines = plan.memory_plan().describe();
    assert!(lines[0].starts_with("reorder budget 64.0 MiB"), "{lines:?}");
}
