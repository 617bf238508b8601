use std::path::Path;

use super::*;
use crate::config::check;
use crate::convert::Fractions;

fn opts(v: serde_json::Value) -> ConvertOptions {
    let mut v = v;
    v["out"] = "unused".into();
    check(&v).unwrap()
}

fn plan(v: serde_json::Value) -> Result<SourcePlan> {
    plan_inputs(&opts(v))
}

fn touch(dir: &Path, names: &[&str]) {
    for n in names {
        std::fs::write(dir.join(n), b"x").unwrap();
    }
}

#[test]
fn auto_detects_each_format_from_the_names() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    touch(
        d,
        &[
            "e.tsv",
            "e.npy",
            "e.bin",
            "e.parquet",
            "train.txt",
            "valid.tsv",
        ],
    );
    let kind =
        |inputs: serde_json::Value| plan(serde_json::json!({"inputs": inputs})).unwrap().kind;
    assert_eq!(kind(serde_json::json!([d.join("e.tsv")])), "text");
    assert_eq!(kind(serde_json::json!([d.join("e.npy")])), "numpy");
    assert_eq!(kind(serde_json::json!([d.join("e.bin")])), "bin32");
    assert_eq!(kind(serde_json::json!([d.join("e.parquet")])), "parquet");
    assert_eq!(kind(serde_json::json!([d.join("ind.cora")])), "planetoid");
    let p = plan(serde_json::json!({"inputs": [d]})).unwrap();
    assert_eq!(
        (p.kind.as_str(), p.train.len(), p.valid.len()),
        ("text", 1, 1)
    );
    assert_eq!(p.bytes, 2, "the planned files' sizes");
    touch(d, &["edges.npy", "features.npy"]);
    let p = plan(serde_json::json!({"inputs": [d]})).unwrap();
    assert_eq!(p.kind, "numpy");
    assert_eq!(p.files["features"], d.join("features.npy"));
    touch(d, &["node_types.tsv", "edges_e0.npy"]);
    let p = plan(serde_json::json!({"inputs": [d]})).unwrap();
    assert_eq!(
        (p.kind.as_str(), p.typed.as_deref()),
        ("numpy-typed", Some(d))
    );
    let p = plan(serde_json::json!({"inputs": [d], "format": "text"})).unwrap();
    assert_eq!(p.kind, "text", "a given format is not second-guessed");
}

#[test]
fn refusals_name_the_input_and_the_option() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    let err = |v| plan(v).unwrap_err().to_string();
    assert_eq!(
        err(serde_json::json!({"inputs": [d.join("nope.tsv")]})),
        format!(
            "{}: no such file or directory",
            d.join("nope.tsv").display()
        )
    );
    assert!(err(serde_json::json!({"inputs": [d]})).ends_with(
        ": found no train file (train.txt, train.tsv, ...), edges.npy, or Planetoid files"
    ));
    assert!(err(serde_json::json!({"inputs": [d], "format": "numpy"})).ends_with(": no edges.npy"));
    // A store given as the input of a conversion.
    let store = d.join("g.strata");
    std::fs::create_dir(&store).unwrap();
    touch(&store, &["manifest.json", "csr_indices.npy"]);
    assert!(err(serde_json::json!({"inputs": [&store]})).contains("is a Strata store already"));
    touch(d, &["a.npy", "b.npy"]);
    assert_eq!(
        err(serde_json::json!({"inputs": [d.join("a.npy"), d.join("b.npy")]})),
        "convert: numpy takes one edges .npy (use --valid/--test for more)"
    );
    assert_eq!(
        err(serde_json::json!({"inputs": [d.join("a.npy")], "node_types": "t.tsv"})),
        "convert: --node-types and --edge-types apply to text and Parquet edge lists and typed NumPy directories, not numpy inputs"
    );
    assert_eq!(
        err(serde_json::json!({"edges_of": ["a:b=x"]})),
        "convert.edges_of: expected SRC_TYPE:RELATION:DST_TYPE=FILE, got 'a:b=x'"
    );
    let e = format!("a:r:b={}", d.join("a.npy").display());
    assert_eq!(
        err(serde_json::json!({"edges_of": [e], "inputs": [d.join("a.npy")]})),
        "convert: --edges-of files hold the train edges: give no input, --valid or --test files beside them (--split makes a random split)"
    );
}

#[test]
fn front_end_formats_say_what_they_are_staged_as() {
    let tmp = tempfile::tempdir().unwrap();
    touch(tmp.path(), &["e.parquet"]);
    let o = opts(serde_json::json!({"inputs": [tmp.path().join("e.parquet")]}));
    let p = plan_inputs(&o).unwrap();
    assert_eq!(p.staged_as, Some("text"));
    let err = convert(
        &o,
        serde_json::Value::Null,
        &strata_io::progress::NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("parquet inputs are read by the front end"),
        "{err}"
    );
    assert_eq!(streamable(), ["numpy", "bin32", "text"]);
}

fn err(v: serde_json::Value) -> String {
    check::<ConvertOptions>(&v).unwrap_err().to_string()
}

#[test]
fn splits_parse_from_text_or_lists_and_must_sum_to_one() {
    let c: ConvertOptions =
        check(&serde_json::json!({"out": "g", "split": "0.8,0.1,0.1"})).unwrap();
    assert_eq!(c.split, Some(Fractions([0.8, 0.1, 0.1])));
    assert!(
        err(serde_json::json!({"out": "g", "split": [0.5, 0.1, 0.1]}))
            .starts_with("convert.split: expected three fractions (train, valid, test)")
    );
    assert!(
        err(serde_json::json!({"out": "g", "node_split": "0.5,0.5"}))
            .starts_with("convert.node_split: expected three fractions like")
    );
}

#[test]
fn refusals_name_the_option() {
    assert_eq!(
        err(serde_json::json!({"out": "g", "io_chunk": 1000})),
        "convert.io_chunk: must be a positive multiple of 4096, got 1000"
    );
    assert_eq!(
        err(serde_json::json!({"out": "g", "relations": true, "columns": "src,dst"})),
        "convert.columns: --relations needs a 'rel' column, got 'src,dst'"
    );
    assert_eq!(
        err(serde_json::json!({"inputs": ["e.tsv"]})),
        "convert.out: needs a store directory to create"
    );
}

#[test]
fn text_options_and_mixed_edge_files_are_refused_by_the_plan() {
    let tmp = tempfile::tempdir().unwrap();
    let d = tmp.path();
    touch(d, &["e.parquet", "e.tsv", "e.npy", "e.bin"]);
    let err = |v| plan(v).unwrap_err().to_string();
    let parquet = d.join("e.parquet");
    let text = d.join("e.tsv");
    for (option, value) in [
        ("header", serde_json::json!(true)),
        ("delimiter", serde_json::json!("tab")),
        ("comment", serde_json::json!("%")),
    ] {
        let mut v = serde_json::json!({"inputs": [parquet]});
        v[option] = value;
        assert_eq!(
            err(v),
            "convert: --header, --delimiter and --comment apply to text inputs, not parquet inputs",
            "{option}"
        );
    }
    assert!(
        err(serde_json::json!({"inputs": [d.join("e.npy")], "header": true}))
            .ends_with("not numpy inputs")
    );
    assert!(plan(serde_json::json!({"inputs": [text], "header": true})).is_ok());
    // Read by no converter of the input's format: these were dropped without a word (a
    // text edge list with --features made a store without features).
    for (input, option, value, flag) in [
        (&text, "features", serde_json::json!("x.npy"), "--features"),
        (&text, "layout", serde_json::json!("columns"), "--layout"),
        (
            &parquet,
            "node_split",
            serde_json::json!("0.5,0.25,0.25"),
            "--node-split",
        ),
        (
            &d.join("e.npy"),
            "ids",
            serde_json::json!("string"),
            "--ids",
        ),
        (
            &d.join("e.bin"),
            "relations",
            serde_json::json!(true),
            "--relations",
        ),
    ] {
        let mut v = serde_json::json!({"inputs": [input]});
        v[option] = value;
        assert!(
            err(v).starts_with(&format!("convert: {flag} would be ignored: the ")),
            "{option}"
        );
    }
    assert!(plan(serde_json::json!({"inputs": [d.join("e.npy")], "layout": "columns"})).is_ok());
    assert_eq!(
        err(serde_json::json!({"inputs": [parquet], "valid": [text]})),
        format!(
            "convert: give Parquet files only, or text files only; {} is not Parquet",
            text.display()
        )
    );
    assert_eq!(
        err(serde_json::json!({"inputs": [text], "test": [parquet]})),
        format!(
            "convert: give Parquet files only, or text files only; {} is Parquet",
            parquet.display()
        )
    );
}
