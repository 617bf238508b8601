//! The NumPy and raw int32 converters: layouts, node data, and bad inputs.

use std::path::Path;

use crate::common::*;
use proptest::prelude::*;
use strata_store::array::{decode_f32, read_all_bytes};
use strata_store::convert::{convert_binary, BinaryJob};
use strata_store::{DType, NoProgress, Store};

fn numpy_job(out: &Path, numpy: serde_json::Value, extra: serde_json::Value) -> serde_json::Value {
    serde_json::json!({ "graph": graph_opts(out, 64 << 20, extra), "numpy": numpy })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// (E, k) rows, (k, E) columns and Fortran-ordered (E, k) all read the same edges.
    #[test]
    fn every_layout_reads_the_same_edges(
        raw in proptest::collection::vec((0i64..500, 0i64..5, 0i64..500), 1..700),
        with_rel in any::<bool>(),
        wide in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let w = if with_rel { 3 } else { 2 };
        let (descr, width) = if wide { ("<i8", 8) } else { ("<i4", 4) };
        let rows: Vec<i64> = raw.iter().flat_map(|&(s, r, d)| if with_rel { vec![s, r, d] } else { vec![s, d] }).collect();
        let mut cols = Vec::new();
        for j in 0..w {
            cols.extend(rows.iter().skip(j).step_by(w).copied());
        }
        let e = raw.len();
        let cases = [
            ("rows.npy", false, vec![e, w], &rows),
            ("cols.npy", false, vec![w, e], &cols),
            ("fortran.npy", true, vec![e, w], &cols),
        ];
        let expect: Vec<(i64, i64, i64)> = raw.iter().map(|&(s, r, d)| (s, if with_rel { r } else { -1 }, d)).collect();
        for (name, fortran, shape, data) in cases {
            let p = dir.path().join(name);
            write_npy(&p, descr, fortran, &shape, &le_ints(data, width));
            let layout = if e == w || (e <= 3 && name == "cols.npy") { if name == "rows.npy" { "rows" } else { "columns" } } else { "auto" };
            let layout = if name == "fortran.npy" && layout == "columns" { "rows" } else { layout };
            let job = numpy_job(&dir.path().join(format!("{name}.strata")), serde_json::json!({"edges": p, "layout": layout}), serde_json::json!({}));
            let store = Store::open(&convert_numpy_json(job, &NoProgress).unwrap().store).unwrap();
            prop_assert_eq!(edges(&store, "train"), expect.clone());
            let n = store.manifest().graph.num_nodes as usize;
            prop_assert_eq!(adjacency(&store, "csc"), reference_adjacency(n, &expect, true, false));
        }
    }
}

#[test]
fn node_data_features_labels_and_splits() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let n = 6usize;
    write_npy(
        &d.join("edges.npy"),
        "<i8",
        false,
        &[2, 4],
        &le_ints(&[0, 1, 2, 3, 1, 2, 3, 4], 8),
    );
    let feats: Vec<f64> = (0..n * 3).map(|i| i as f64 * 0.5).collect();
    write_npy(
        &d.join("x.npy"),
        "<f8",
        false,
        &[n, 3],
        &feats
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<_>>(),
    );
    write_npy(
        &d.join("y.npy"),
        "<i8",
        false,
        &[n],
        &le_ints(&[0, 2, 1, -1, 2, 0], 8),
    );
    write_npy(
        &d.join("train.npy"),
        "|b1",
        false,
        &[n],
        &[1, 1, 0, 0, 0, 0],
    );
    write_npy(
        &d.join("test.npy"),
        "<i4",
        false,
        &[2],
        &le_ints(&[4, 5], 4),
    );
    let numpy = serde_json::json!({
        "edges": d.join("edges.npy"), "features": d.join("x.npy"), "labels": d.join("y.npy"),
        "node_train": d.join("train.npy"), "node_test": d.join("test.npy"),
    });
    let s = convert_numpy_json(
        numpy_job(&d.join("a.strata"), numpy.clone(), serde_json::json!({})),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&s.store).unwrap();
    let m = store.manifest();
    assert_eq!(m.graph.num_nodes, 6);
    assert_eq!(
        edges(&store, "train"),
        vec![(0, -1, 1), (1, -1, 2), (2, -1, 3), (3, -1, 4)]
    );
    assert_eq!(m.features.as_ref().unwrap().dtype, DType::F32);
    let (_, bytes) = read_all_bytes(&store.array_path("features").unwrap()).unwrap();
    let mut back = Vec::new();
    decode_f32(&bytes, DType::F32, &mut back);
    assert_eq!(back, feats.iter().map(|&v| v as f32).collect::<Vec<_>>());
    assert_eq!(m.labels.as_ref().unwrap().num_classes, 3);
    assert_eq!(ints(&store, "labels"), vec![0, 2, 1, -1, 2, 0]);
    assert_eq!(ints(&store, "node_train"), vec![0, 1]);
    assert_eq!(ints(&store, "node_test"), vec![4, 5]);
    assert!(store.array("node_valid").is_none());

    // float16 on request; a random node split over labelled nodes only.
    let mut numpy16 = serde_json::json!({"edges": d.join("edges.npy"), "features": d.join("x.npy"), "labels": d.join("y.npy"),
        "feature_dtype": "float16", "node_split": [0.6, 0.2, 0.2]});
    let s = convert_numpy_json(
        numpy_job(
            &d.join("b.strata"),
            numpy16.take(),
            serde_json::json!({"seed": 3}),
        ),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&s.store).unwrap();
    assert_eq!(
        store.manifest().features.as_ref().unwrap().dtype,
        DType::F16
    );
    let mut all: Vec<i64> = ["node_train", "node_valid", "node_test"]
        .iter()
        .flat_map(|a| ints(&store, a))
        .collect();
    all.sort();
    assert_eq!(
        all,
        vec![0, 1, 2, 4, 5],
        "node 3 is unlabelled and must not be in a split"
    );
    assert_eq!(s.node_splits["train"], 3);
}

fn numpy_error(d: &Path, numpy: serde_json::Value, needles: &[&str]) {
    let out = d.join("bad.strata");
    let err = convert_numpy_json(numpy_job(&out, numpy, serde_json::json!({})), &NoProgress)
        .unwrap_err()
        .to_string();
    for n in needles {
        assert!(err.contains(n), "error {err:?} should mention {n:?}");
    }
    assert!(!out.exists());
    assert!(
        entries(d).iter().all(|e| !e.contains(".partial-")),
        "{:?}",
        entries(d)
    );
}

#[test]
fn numpy_bad_inputs() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write_npy(
        &d.join("edges.npy"),
        "<i8",
        false,
        &[2, 2],
        &le_ints(&[0, 1, 1, 2], 8),
    );
    write_npy(
        &d.join("neg.npy"),
        "<i8",
        false,
        &[2, 2],
        &le_ints(&[0, 1, -1, 2], 8),
    );
    write_npy(&d.join("float.npy"), "<f4", false, &[2, 2], &[0u8; 16]);
    write_npy(&d.join("wide.npy"), "<i8", false, &[4, 5], &[0u8; 160]);
    write_npy(&d.join("x5.npy"), "<f4", false, &[5, 2], &[0u8; 40]);
    write_npy(
        &d.join("y3.npy"),
        "<i8",
        false,
        &[3],
        &le_ints(&[0, 1, -2], 8),
    );
    write_npy(
        &d.join("overlap.npy"),
        "<i8",
        false,
        &[2],
        &le_ints(&[0, 1], 8),
    );
    std::fs::write(
        d.join("short.npy"),
        &std::fs::read(d.join("edges.npy")).unwrap()[..90],
    )
    .unwrap();
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("neg.npy")}),
        &["neg.npy", "edge 1: src id -1 is negative"],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("float.npy")}),
        &["float.npy", "must be integers"],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("wide.npy")}),
        &["wide.npy", "expected 2 (src, dst) or 3"],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("short.npy")}),
        &["short.npy", "truncated"],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("missing.npy")}),
        &["missing.npy"],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("edges.npy"), "features": d.join("x5.npy"), "labels": d.join("y3.npy")}),
        &["y3.npy", "has 3 rows", "x5.npy"],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("edges.npy"), "labels": d.join("y3.npy")}),
        &["y3.npy", "node 2 has label -2"],
    );
    // Without num_nodes, the labels' rows are the node count: the edge beyond them says so.
    write_npy(&d.join("y2.npy"), "<i8", false, &[2], &le_ints(&[0, 1], 8));
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("edges.npy"), "labels": d.join("y2.npy")}),
        &[
            "edges.npy: edge 1: dst id 2 is out of range: num_nodes (the rows of",
            "y2.npy, one per node) is 2",
        ],
    );
    numpy_error(
        d,
        serde_json::json!({"edges": d.join("edges.npy"), "node_train": d.join("overlap.npy"), "node_test": d.join("overlap.npy")}),
        &["overlap.npy", "node 0 is also in node_train"],
    );
    let err = convert_numpy_json(
        numpy_job(
            &d.join("c.strata"),
            serde_json::json!({"edges": d.join("edges.npy")}),
            serde_json::json!({"num_nodes": 2}),
        ),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("dst id 2 is out of range: num_nodes is 2"),
        "{err}"
    );
}

#[test]
fn binary_pairs_round_trip_and_reject_bad_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let pairs: Vec<i64> = (0..1000).flat_map(|i| [i % 97, (i * 31) % 89]).collect();
    std::fs::write(d.join("g.bin"), le_ints(&pairs, 4)).unwrap();
    let job: BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": graph_opts(&d.join("g.strata"), 1 << 20, serde_json::json!({"split": [0.8, 0.1, 0.1]})),
        "inputs": [{"path": d.join("g.bin"), "split": "train"}],
    }))
    .unwrap();
    let s = convert_binary(&job, &NoProgress).unwrap();
    assert_eq!(s.num_edges.values().sum::<u64>(), 1000);
    assert_eq!((s.num_edges["valid"], s.num_edges["test"]), (100, 100));
    assert_eq!(s.num_nodes, 97);
    std::fs::write(d.join("odd.bin"), [0u8; 12]).unwrap();
    let bad: BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": graph_opts(&d.join("h.strata"), 1 << 20, serde_json::json!({})),
        "inputs": [{"path": d.join("odd.bin")}],
    }))
    .unwrap();
    let err = convert_binary(&bad, &NoProgress).unwrap_err().to_string();
    assert!(
        err.contains("odd.bin") && err.contains("not a whole number of 8-byte"),
        "{err}"
    );
    std::fs::write(d.join("neg.bin"), le_ints(&[1, 2, 3, -4], 4)).unwrap();
    let bad: BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": graph_opts(&d.join("h.strata"), 1 << 20, serde_json::json!({})),
        "inputs": [{"path": d.join("neg.bin")}],
    }))
    .unwrap();
    let err = convert_binary(&bad, &NoProgress).unwrap_err().to_string();
    assert!(
        err.contains("pair 1 (byte 8): dst id -4 is negative"),
        "{err}"
    );
    // A device reports no size and never ends: it is refused for what it is, not as empty.
    let bad: BinaryJob = serde_json::from_value(serde_json::json!({
        "graph": graph_opts(&d.join("h.strata"), 1 << 20, serde_json::json!({})),
        "inputs": [{"path": "/dev/zero"}],
    }))
    .unwrap();
    let err = convert_binary(&bad, &NoProgress).unwrap_err().to_string();
    assert_eq!(
        err,
        "/dev/zero: is a character device, not a regular file: give a file of its contents"
    );
}
