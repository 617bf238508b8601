//! Opening a store validates it and names exactly what is wrong.

use std::path::{Path, PathBuf};

use crate::common::*;
use strata_store::convert::{convert_text, TextJob};
use strata_store::{NoProgress, Store, StoreError};

fn make_store(dir: &Path) -> PathBuf {
    let p = dir.join("e.tsv");
    std::fs::write(&p, "a\tr1\tb\nb\tr2\tc\nc\tr1\ta\n").unwrap();
    let job: TextJob = serde_json::from_value(serde_json::json!({
        "graph": graph_opts(&dir.join("g.strata"), 64 << 20, serde_json::json!({})),
        "text": {"inputs": [{"path": p}], "columns": ["src", "rel", "dst"], "delimiter": "tab", "comment": "#",
                 "header": false, "ids": "string", "relation_ids": "string"},
    }))
    .unwrap();
    convert_text(&job, &NoProgress).unwrap().store
}

fn open_err(path: &Path) -> String {
    let e = Store::open(path).unwrap_err();
    e.to_string()
}

#[test]
fn a_fresh_store_opens() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(&make_store(dir.path())).unwrap();
    assert_eq!(s.manifest().graph.num_relations, 2);
    assert_eq!(names(&s, "relation_names"), vec!["r1", "r2"]);
}

#[test]
fn truncated_array_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path());
    let f = store.join("csr_indices.npy");
    let len = std::fs::metadata(&f).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(len - 4)
        .unwrap();
    let e = open_err(&store);
    assert!(
        e.contains("'csr_indices'")
            && e.contains("truncated")
            && e.contains(&format!("expected {len} bytes")),
        "{e}"
    );
}

#[test]
fn missing_array_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path());
    std::fs::remove_file(store.join("in_degree.npy")).unwrap();
    let e = open_err(&store);
    assert!(e.contains("'in_degree'") && e.contains("missing"), "{e}");
}

fn edit_manifest(store: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = store.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut m);
    std::fs::write(&p, serde_json::to_string_pretty(&m).unwrap()).unwrap();
}

#[test]
fn newer_format_version_asks_for_an_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path());
    edit_manifest(&store, |m| m["format_version"] = 99.into());
    let err = Store::open(&store).unwrap_err();
    assert!(
        matches!(err, StoreError::NewerFormat { found: 99, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("upgrade Strata"), "{err}");
}

#[test]
fn shape_mismatch_between_manifest_and_graph_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path());
    edit_manifest(&store, |m| m["graph"]["num_nodes"] = 4.into());
    let e = open_err(&store);
    assert!(
        e.contains("csr_indptr") && e.contains("requires int64 (5)"),
        "{e}"
    );
}

#[test]
fn header_disagreeing_with_manifest_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path());
    // Swap two same-sized files so each header disagrees with its manifest entry.
    let (a, b) = (store.join("out_degree.npy"), store.join("csr_indptr.npy"));
    let (ba, bb) = (std::fs::read(&a).unwrap(), std::fs::read(&b).unwrap());
    std::fs::write(&a, bb).unwrap();
    std::fs::write(&b, ba).unwrap();
    let e = open_err(&store);
    assert!(
        e.contains("holds") && e.contains("but the manifest says"),
        "{e}"
    );
}

#[test]
fn not_a_store_and_corrupt_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    assert!(open_err(&plain).contains("manifest.json is missing"));
    // Strata's other directories and a file say what they are.
    std::fs::write(plain.join("run.json"), "{}").unwrap();
    assert!(open_err(&plain).contains("not a Strata store but a run directory"));
    std::fs::write(plain.join("grid.json"), "{}").unwrap();
    assert!(open_err(&plain).contains("not a Strata store but a grid (`strata grid info`"));
    assert!(open_err(&plain.join("grid.json")).contains("a file, where a store is a directory"));
    let store = make_store(dir.path());
    std::fs::write(store.join("manifest.json"), "{ not json").unwrap();
    assert!(open_err(&store).contains("not valid JSON"));
    assert!(open_err(&dir.path().join("absent")).contains("no such store"));
}

#[test]
fn a_partial_directory_never_opens_even_with_a_manifest() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path());
    let partial = dir.path().join("g.strata.partial-4242");
    std::fs::rename(&store, &partial).unwrap();
    for path in [partial.clone(), partial.join(".")] {
        let e = Store::open(&path).unwrap_err();
        assert!(matches!(e, StoreError::Invalid { .. }), "{e:?}");
        assert!(e.to_string().contains("unfinished output"), "{e}");
    }
    std::fs::rename(&partial, &store).unwrap();
    Store::open(&store).unwrap();
}
