//! The typed NumPy converter: one edge array per edge type in local ids, weights and times,
//! per-type node data, the same store under a tiny budget, `strata check` on the result, and
//! each bad input refused with its file named and no store left behind.

use std::path::{Path, PathBuf};

use crate::common::*;
use strata_store::array::read_all_bytes;
use strata_store::check::check_store;
use strata_store::{NoProgress, Store};

/// paper 0..5, author 5..8, venue 8..10.
const NODE_TYPES: &str = "paper\t5\nauthor\t3\nvenue\t2\n";
const EDGE_TYPES: &str = "paper\tcites\tpaper\nauthor\twrites\tpaper\npaper\tat\tvenue\n";
/// Local (src, dst) per edge type.
const CITES: [(i64, i64); 4] = [(0, 1), (2, 1), (4, 0), (3, 2)];
const WRITES: [(i64, i64); 3] = [(2, 4), (0, 1), (1, 1)];
const AT: [(i64, i64); 2] = [(1, 0), (4, 1)];

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f64_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Writes `pairs` as a (2, E) int64 array or, with `rows`, an (E, 2) int32 array.
fn write_edges(path: &Path, pairs: &[(i64, i64)], rows: bool) {
    if rows {
        let flat: Vec<i64> = pairs.iter().flat_map(|&(s, d)| [s, d]).collect();
        write_npy(path, "<i4", false, &[pairs.len(), 2], &le_ints(&flat, 4));
    } else {
        let flat: Vec<i64> = pairs
            .iter()
            .map(|p| p.0)
            .chain(pairs.iter().map(|p| p.1))
            .collect();
        write_npy(path, "<i8", false, &[2, pairs.len()], &le_ints(&flat, 8));
    }
}

/// The inputs of a typed conversion in `dir`, as the job's `typed_numpy` value.
fn inputs(dir: &Path) -> serde_json::Value {
    let p = |n: &str| dir.join(n);
    std::fs::write(p("node_types.tsv"), NODE_TYPES).unwrap();
    std::fs::write(p("edge_types.tsv"), EDGE_TYPES).unwrap();
    write_edges(&p("edges_e0.npy"), &CITES, false);
    write_edges(&p("edges_e1.npy"), &WRITES, true);
    write_edges(&p("edges_e2.npy"), &AT, false);
    // Weights in three dtypes: float32, float64, int64.
    write_npy(
        &p("w0.npy"),
        "<f4",
        false,
        &[4],
        &f32_bytes(&[0.5, 1.5, 2.5, 3.5]),
    );
    write_npy(
        &p("w1.npy"),
        "<f8",
        false,
        &[3],
        &f64_bytes(&[0.25, 1.0, 4.0]),
    );
    write_npy(&p("w2.npy"), "<i8", false, &[2], &le_ints(&[7, 9], 8));
    for (k, times) in [&[10i64, -20, 30, 40][..], &[1, 2, 3], &[100, 200]]
        .iter()
        .enumerate()
    {
        write_npy(
            &p(&format!("t{k}.npy")),
            "<i8",
            false,
            &[times.len()],
            &le_ints(times, 8),
        );
    }
    let feats: Vec<f32> = (0..20).map(|i| i as f32 / 4.0).collect();
    write_npy(
        &p("features_t0.npy"),
        "<f4",
        false,
        &[5, 4],
        &f32_bytes(&feats),
    );
    write_npy(
        &p("labels_t0.npy"),
        "<i8",
        false,
        &[5],
        &le_ints(&[1, -1, 0, 2, 1], 8),
    );
    write_npy(
        &p("node_train_t0.npy"),
        "<i8",
        false,
        &[2],
        &le_ints(&[0, 3], 8),
    );
    write_npy(
        &p("node_test_t0.npy"),
        "<i8",
        false,
        &[1],
        &le_ints(&[4], 8),
    );
    let author: Vec<f64> = (0..6).map(|i| -(i as f64)).collect();
    write_npy(
        &p("features_t1.npy"),
        "<f8",
        false,
        &[3, 2],
        &f64_bytes(&author),
    );
    serde_json::json!({
        "node_types": p("node_types.tsv"),
        "edge_types": p("edge_types.tsv"),
        "edges": [
            {"edge_type": 0, "edges": p("edges_e0.npy"), "weights": p("w0.npy"), "times": p("t0.npy")},
            {"edge_type": 1, "edges": p("edges_e1.npy"), "weights": p("w1.npy"), "times": p("t1.npy")},
            {"edge_type": 2, "edges": p("edges_e2.npy"), "weights": p("w2.npy"), "times": p("t2.npy")},
        ],
        "nodes": [
            {"node_type": 0, "features": p("features_t0.npy"), "labels": p("labels_t0.npy"),
             "node_train": p("node_train_t0.npy"), "node_test": p("node_test_t0.npy")},
            {"node_type": 1, "features": p("features_t1.npy")},
        ],
    })
}

fn job(out: &Path, memory: u64, typed: serde_json::Value) -> serde_json::Value {
    serde_json::json!({
        "graph": graph_opts(out, memory, serde_json::json!({})),
        "typed_numpy": typed,
    })
}

fn floats(store: &Store, name: &str) -> Vec<f32> {
    let (_, bytes) = read_all_bytes(&store.array_path(name).unwrap()).unwrap();
    bytemuck::cast_slice(&bytes).to_vec()
}

#[test]
fn typed_arrays_become_a_typed_store_with_global_ids() {
    let dir = tempfile::tempdir().unwrap();
    let typed = inputs(dir.path());
    let mut stores: Vec<PathBuf> = Vec::new();
    for (name, memory) in [("big.strata", 256u64 << 20), ("small.strata", 1 << 20)] {
        let out = dir.path().join(name);
        convert_typed_numpy_json(job(&out, memory, typed.clone()), &NoProgress).unwrap();
        stores.push(out);
    }
    let store = Store::open(&stores[0]).unwrap();
    let m = store.manifest();
    assert_eq!(m.format_version, 2);
    assert_eq!(
        m.node_types
            .iter()
            .map(|t| (t.name.as_str(), t.offset, t.count))
            .collect::<Vec<_>>(),
        [("paper", 0, 5), ("author", 5, 3), ("venue", 8, 2)]
    );
    assert_eq!(m.graph.num_relations, 3);
    // Local ids shifted by each endpoint type's offset, edge arrays in input order.
    let mut want = Vec::new();
    for (k, pairs, (so, dof)) in [
        (0, &CITES[..], (0, 0)),
        (1, &WRITES[..], (5, 0)),
        (2, &AT[..], (0, 8)),
    ] {
        want.extend(pairs.iter().map(|&(s, d)| (s + so, k, d + dof)));
    }
    assert_eq!(edges(&store, "train"), want);
    assert_eq!(
        floats(&store, "edge_weights_train"),
        [0.5, 1.5, 2.5, 3.5, 0.25, 1.0, 4.0, 7.0, 9.0]
    );
    assert_eq!(
        ints(&store, "edge_times_train"),
        [10, -20, 30, 40, 1, 2, 3, 100, 200]
    );
    let paper = &m.node_types[0];
    assert_eq!(paper.features.as_ref().unwrap().dim, 4);
    assert_eq!(paper.labels.as_ref().unwrap().num_classes, 3);
    assert_eq!(paper.node_splits.get("train"), Some(&2));
    assert_eq!(paper.node_splits.get("test"), Some(&1));
    assert!(m.node_types[2].features.is_none() && m.features.is_none());
    let feats: Vec<f32> = (0..20).map(|i| i as f32 / 4.0).collect();
    assert_eq!(floats(&store, "features_t0"), feats);
    assert_eq!(
        floats(&store, "features_t1"),
        [0.0, -1.0, -2.0, -3.0, -4.0, -5.0]
    );
    assert_eq!(ints(&store, "labels_t0"), [1, -1, 0, 2, 1]);
    assert_eq!(ints(&store, "node_train_t0"), [0, 3]);
    assert_eq!(ints(&store, "node_test_t0"), [4]);
    // Paper 1's in-edges: cites from papers 0 and 2 (type 0), then its authors, local 0 and 1
    // = global 5 and 6 (type 1), ordered by (edge type, edge id).
    let (ptr, idx) = (ints(&store, "csc_indptr"), ints(&store, "csc_indices"));
    assert_eq!(&idx[ptr[1] as usize..ptr[2] as usize], [0, 2, 5, 6]);
    for out in &stores {
        let checked = check_store(out, 20, &NoProgress).unwrap();
        assert!(checked.problems.is_empty(), "{:?}", checked.problems.listed);
    }
    // The budget changes how the store is built, never what it holds.
    let small = Store::open(&stores[1]).unwrap();
    assert_eq!(array_bytes(&store), array_bytes(&small));
}

#[test]
fn bad_typed_inputs_name_the_file_and_leave_no_store() {
    let dir = tempfile::tempdir().unwrap();
    let good = inputs(dir.path());
    let p = |n: &str| dir.path().join(n);
    // As many edges as the weights and times they keep, one id past its type's count.
    write_edges(
        &p("cites_far.npy"),
        &[(0, 1), (1, 5), (2, 2), (3, 3)],
        false,
    );
    write_edges(&p("writes_far.npy"), &[(3, 0), (0, 0), (1, 1)], true);
    write_npy(&p("three.npy"), "<i8", false, &[3, 3], &le_ints(&[0; 9], 8));
    write_npy(
        &p("floats.npy"),
        "<f4",
        false,
        &[2, 1],
        &f32_bytes(&[0.0, 1.0]),
    );
    write_npy(&p("w_short.npy"), "<f4", false, &[3], &f32_bytes(&[1.0; 3]));
    write_npy(
        &p("w_nan.npy"),
        "<f4",
        false,
        &[4],
        &f32_bytes(&[1.0, f32::NAN, 1.0, 1.0]),
    );
    write_npy(&p("t_float.npy"), "<f8", false, &[4], &f64_bytes(&[1.0; 4]));
    write_npy(
        &p("feat_rows.npy"),
        "<f4",
        false,
        &[4, 4],
        &f32_bytes(&[0.0; 16]),
    );
    write_npy(
        &p("labels_2d.npy"),
        "<i8",
        false,
        &[5, 2],
        &le_ints(&[0; 10], 8),
    );
    write_npy(&p("split_far.npy"), "<i8", false, &[1], &le_ints(&[5], 8));
    std::fs::write(p("edge_types_bad.tsv"), "paper\tcites\tjournal\n").unwrap();
    let with = |path: &str, value: serde_json::Value| {
        let mut v = good.clone();
        *v.pointer_mut(path).unwrap() = value;
        v
    };
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        (
            with("/edges/0/edges", p("cites_far.npy").to_str().unwrap().into()),
            "cites_far.npy",
            "edge 1: dst id 5 is outside [0, 5): node type 'paper' has 5 nodes (edge type 0 is (paper, cites, paper)",
        ),
        (
            with("/edges/1/edges", p("writes_far.npy").to_str().unwrap().into()),
            "writes_far.npy",
            "edge 0: src id 3 is outside [0, 3): node type 'author' has 3 nodes",
        ),
        (
            with("/edges/2/edge_type", 3.into()),
            "edges_e2.npy",
            "edge type 3 is not declared: ",
        ),
        (
            with("/edges/0/edges", p("three.npy").to_str().unwrap().into()),
            "three.npy",
            "a typed edge array must have shape (2, E) or (E, 2)",
        ),
        (
            with("/edges/0/edges", p("floats.npy").to_str().unwrap().into()),
            "floats.npy",
            "edge ids must be integers, found float32",
        ),
        (
            with("/edges/0/weights", p("w_short.npy").to_str().unwrap().into()),
            "w_short.npy",
            "weights must have shape (4,), one per edge of its edge array; found [3]",
        ),
        (
            with("/edges/0/weights", p("w_nan.npy").to_str().unwrap().into()),
            "w_nan.npy",
            "edge 1: weight NaN is not finite",
        ),
        (
            with("/edges/1/weights", serde_json::Value::Null),
            "edges_e1.npy",
            "has no weights array but other edge arrays do",
        ),
        (
            with("/edges/0/times", p("t_float.npy").to_str().unwrap().into()),
            "t_float.npy",
            "times must be integers",
        ),
        (
            with("/nodes/0/features", p("feat_rows.npy").to_str().unwrap().into()),
            "feat_rows.npy",
            "features must have shape (5, dim): node type 'paper' has 5 nodes; found [4, 4]",
        ),
        (
            with("/nodes/0/labels", p("labels_2d.npy").to_str().unwrap().into()),
            "labels_2d.npy",
            "labels must have shape (5,)",
        ),
        (
            with("/nodes/0/node_train", p("split_far.npy").to_str().unwrap().into()),
            "split_far.npy",
            "entry 0 is node 5, outside [0, 5)",
        ),
        (
            with("/nodes/1/node_type", 7.into()),
            "node_types.tsv",
            "node type 7 is not declared",
        ),
        (
            with("/nodes/1/node_type", 0.into()),
            "typed_numpy.nodes",
            "node type 0 ('paper') is given twice",
        ),
        (
            with("/edge_types", p("edge_types_bad.tsv").to_str().unwrap().into()),
            "edge_types_bad.tsv:1",
            "destination type 'journal' is not a node type",
        ),
    ];
    for (typed, file, needle) in cases {
        let out = dir.path().join("bad.strata");
        let err = convert_typed_numpy_json(job(&out, 64 << 20, typed), &NoProgress)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(file) && err.contains(needle),
            "{file}: {needle}\n  got: {err}"
        );
        assert!(
            !entries(dir.path()).iter().any(|e| e.contains("bad.strata")),
            "a failed conversion left {:?}",
            entries(dir.path())
        );
    }
}
