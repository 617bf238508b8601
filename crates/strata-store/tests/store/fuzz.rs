//! Property tests that feed random and mutated bytes to every converter input format (text edge
//! lists with and without relations, CSV/TSV, gzip, NumPy `.npy`, raw int32 pairs) and to the
//! store reader (mutated `manifest.json`, `.npy` headers and file sizes). Each input either
//! converts into a store that opens, or fails with a typed error that names the input; none
//! panics, and a failure leaves nothing behind.
//!
//! The number of cases per property is small by default so that `cargo test` stays fast; set
//! `PROPTEST_CASES` for a longer session, e.g.
//! `PROPTEST_CASES=100000 cargo test --release -p strata-store --test fuzz`.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::common::*;
use proptest::prelude::*;
use strata_store::array::{decode_ints, read_all_bytes};
use strata_store::convert::{convert_binary, convert_text, BinaryJob, Summary, TextJob};
use strata_store::{NoProgress, Store, StoreError};

/// Cases per property: `PROPTEST_CASES` if set, else `default`.
fn cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// One byte-level edit: (position seed, kind, byte).
type Edit = (u32, u8, u8);

fn edits() -> impl Strategy<Value = Vec<Edit>> {
    proptest::collection::vec((any::<u32>(), 0u8..6, any::<u8>()), 0..8)
}

/// Applies `edits` to `bytes`: overwrite, bit flip, insert, delete, truncate, duplicate a run.
fn mutate(mut bytes: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
    for &(pos, kind, b) in edits {
        let at = |len: usize| if len == 0 { 0 } else { pos as usize % len };
        match kind {
            0 if !bytes.is_empty() => {
                let i = at(bytes.len());
                bytes[i] = b;
            }
            1 if !bytes.is_empty() => {
                let i = at(bytes.len());
                bytes[i] ^= 1 << (b % 8);
            }
            2 => {
                let i = at(bytes.len() + 1);
                bytes.insert(i, b);
            }
            3 if !bytes.is_empty() => {
                let i = at(bytes.len());
                bytes.remove(i);
            }
            4 => bytes.truncate(at(bytes.len() + 1)),
            5 if !bytes.is_empty() => {
                let i = at(bytes.len());
                let run: Vec<u8> = bytes[i..(i + b as usize).min(bytes.len())].to_vec();
                bytes.splice(i..i, run);
            }
            _ => {}
        }
    }
    bytes
}

/// Tokens that exercise the text parser: ids, names, UTF-8, NUL, invalid UTF-8, CSV quoting,
/// signs, leading zeros, huge numbers, comment markers, blanks.
const TOKENS: &[&[u8]] = &[
    b"0",
    b"1",
    b"7",
    b"42",
    b"a",
    b"b",
    b"r1",
    "\u{e9}t\u{e9}".as_bytes(),
    "\u{540d}".as_bytes(),
    b"nul\0byte",
    b"\xff\xfe",
    b"ok\xc3",
    b"\"q,\"\"x\"\"\"",
    b"\"open",
    b"",
    b" ",
    b"#",
    b"-3",
    b"007",
    b"99999999999999999999999",
    b"4611686018427387903",
];

const SEPARATORS: &[&[u8]] = &[b"\t", b",", b" ", b"  "];
const LINE_ENDS: &[&[u8]] = &[b"\n", b"\r\n", b"\n\n"];

/// Text made of lines of tokens, separators and line ends picked by the index triples.
fn token_text(lines: &[Vec<(u8, u8)>], ends: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for (line, &end) in lines.iter().zip(ends.iter().cycle()) {
        for (k, &(t, s)) in line.iter().enumerate() {
            if k > 0 {
                out.extend_from_slice(SEPARATORS[s as usize % SEPARATORS.len()]);
            }
            out.extend_from_slice(TOKENS[t as usize % TOKENS.len()]);
        }
        out.extend_from_slice(LINE_ENDS[end as usize % LINE_ENDS.len()]);
    }
    out
}

/// A valid edge list of named nodes (with a relation column when `rel`), to be mutated.
fn valid_text(rows: &[(u8, u8, u8)], rel: bool) -> Vec<u8> {
    let mut out = b"# src\tdst\n".to_vec();
    for &(s, r, d) in rows {
        let line = if rel {
            format!("n{s}\tr{}\tn{d}\n", r % 4)
        } else {
            format!("n{s}\tn{d}\n")
        };
        out.extend_from_slice(line.as_bytes());
    }
    out
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// Checks the outcome of converting bad or odd input: a store that opens, or an error of a
/// class that blames the input or an option (never an I/O error, never a panic), naming one of
/// `inputs` when it blames a file; and in both cases nothing but the store in `dir`.
fn check_outcome(result: Result<Summary, StoreError>, dir: &Path, out: &Path, inputs: &[PathBuf]) {
    match result {
        Ok(_) => {
            let store = Store::open(out).expect("a store that converted opens");
            for name in store.manifest().arrays.keys() {
                read_all_bytes(&store.array_path(name).unwrap()).unwrap();
            }
            std::fs::remove_dir_all(out).unwrap();
        }
        Err(e) => {
            let msg = e.to_string();
            match &e {
                StoreError::Input { path, .. } | StoreError::BadFile { path, .. } => {
                    assert!(inputs.contains(path), "error blames {path:?}: {msg}");
                }
                StoreError::Option { .. } | StoreError::Budget { .. } => {}
                other => panic!("bad input gave an error of the wrong class: {other:?}"),
            }
            assert!(!out.exists(), "a failed conversion left {out:?}: {msg}");
        }
    }
    let left: Vec<String> = entries(dir)
        .into_iter()
        .filter(|n| n.contains(".partial-"))
        .collect();
    assert!(left.is_empty(), "partial output left behind: {left:?}");
}

fn text_job(inputs: &[PathBuf], out: &Path, rel: bool, ids: &str, header: bool) -> TextJob {
    let columns: &[&str] = if rel {
        &["src", "rel", "dst"]
    } else {
        &["src", "dst"]
    };
    let inputs: Vec<_> = inputs
        .iter()
        .zip(["train", "valid", "test"])
        .map(|(p, s)| serde_json::json!({"path": p, "split": s}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "graph": graph_opts(out, 32 << 20, serde_json::json!({"threads": 2})),
        "text": {"inputs": inputs, "columns": columns, "delimiter": "auto", "comment": "#",
                 "header": header, "ids": ids, "relation_ids": ids},
    }))
    .unwrap()
}

/// Converts `files` (train, then valid and test) as text and checks the outcome.
fn convert_text_files(files: &[Vec<u8>], rel: bool, ids: &str, header: bool) {
    let dir = tempfile::tempdir().unwrap();
    let paths: Vec<PathBuf> = files
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            let p = dir.path().join(format!("in{i}.txt"));
            std::fs::write(&p, bytes).unwrap();
            p
        })
        .collect();
    let out = dir.path().join("g.strata");
    let result = convert_text(&text_job(&paths, &out, rel, ids, header), &NoProgress);
    check_outcome(result, dir.path(), &out, &paths);
}

const IDS: [&str; 3] = ["auto", "string", "int"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    #[test]
    fn text_of_random_tokens(
        lines in proptest::collection::vec(proptest::collection::vec((any::<u8>(), any::<u8>()), 1..5), 0..40),
        ends in proptest::collection::vec(any::<u8>(), 1..4),
        rel in any::<bool>(), ids in 0usize..3, header in any::<bool>(),
    ) {
        convert_text_files(&[token_text(&lines, &ends)], rel, IDS[ids], header);
    }

    #[test]
    fn text_of_random_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..3000), rel in any::<bool>(), ids in 0usize..3) {
        convert_text_files(&[bytes], rel, IDS[ids], false);
    }

    #[test]
    fn mutated_edge_lists_with_splits(
        rows in proptest::collection::vec((0u8..40, any::<u8>(), 0u8..40), 1..120),
        train_edits in edits(), valid_edits in edits(), rel in any::<bool>(), ids in 0usize..3,
    ) {
        let text = valid_text(&rows, rel);
        let valid = valid_text(&rows[..rows.len().min(5)], rel);
        convert_text_files(&[mutate(text, &train_edits), mutate(valid, &valid_edits)], rel, IDS[ids], false);
    }

    #[test]
    fn gzip_inputs_whole_mutated_or_truncated(
        rows in proptest::collection::vec((0u8..40, any::<u8>(), 0u8..40), 1..200),
        plain_edits in edits(), gz_edits in edits(), rel in any::<bool>(),
    ) {
        let gz = gzip(&mutate(valid_text(&rows, rel), &plain_edits));
        // Keep the magic bytes so the file is still read as gzip.
        let mut bad = gz[..2].to_vec();
        bad.extend(mutate(gz[2..].to_vec(), &gz_edits));
        convert_text_files(&[bad], rel, "auto", false);
    }
}

/// A `.npy` file's bytes written the way NumPy writes them, then mutated.
fn npy_bytes(descr: &str, fortran: bool, shape: &[usize], data: &[u8], edits: &[Edit]) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("a.npy");
    write_npy(&p, descr, fortran, shape, data);
    mutate(std::fs::read(&p).unwrap(), edits)
}

const DESCRS: [&str; 6] = ["<i4", "<i8", "<u2", "|u1", "<f4", ">i4"];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(48)))]

    #[test]
    fn numpy_edges_and_node_arrays(
        ids in proptest::collection::vec(-2i64..60, 0..300),
        descr in 0usize..6, fortran in any::<bool>(), width in 1usize..5,
        edge_edits in edits(), label_edits in edits(), mask_edits in edits(),
        with_labels in any::<bool>(), with_mask in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let rows = ids.len() / width;
        let item = match DESCRS[descr] { "<i8" => 8, "<u2" => 2, "|u1" => 1, _ => 4 };
        let data: Vec<u8> = ids[..rows * width]
            .iter()
            .flat_map(|&v| v.to_le_bytes()[..item].to_vec())
            .collect();
        let edges = d.join("edges.npy");
        std::fs::write(&edges, npy_bytes(DESCRS[descr], fortran, &[rows, width], &data, &edge_edits)).unwrap();
        let mut numpy = serde_json::json!({"edges": edges});
        let mut inputs = vec![edges];
        if with_labels {
            let labels = d.join("labels.npy");
            let vals: Vec<u8> = (0..60i64).flat_map(|v| (v % 3 - 1).to_le_bytes()).collect();
            std::fs::write(&labels, npy_bytes("<i8", false, &[60], &vals, &label_edits)).unwrap();
            numpy["labels"] = serde_json::json!(labels);
            inputs.push(labels);
        }
        if with_mask {
            let mask = d.join("train_mask.npy");
            let vals: Vec<u8> = (0..60u8).map(|v| v % 2).collect();
            std::fs::write(&mask, npy_bytes("|b1", false, &[60], &vals, &mask_edits)).unwrap();
            numpy["node_train"] = serde_json::json!(mask);
            inputs.push(mask);
        }
        let out = d.join("g.strata");
        let job = serde_json::json!({
            "graph": graph_opts(&out, 32 << 20, serde_json::json!({"num_nodes": 60})),
            "numpy": numpy,
        });
        check_outcome(convert_numpy_json(job, &NoProgress), d, &out, &inputs);
    }

    #[test]
    fn raw_int32_pairs(vals in proptest::collection::vec(-3i32..70, 0..400), edits in edits()) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let input = d.join("g.bin");
        std::fs::write(&input, mutate(bytes, &edits)).unwrap();
        let out = d.join("g.strata");
        let job: BinaryJob = serde_json::from_value(serde_json::json!({
            "graph": graph_opts(&out, 32 << 20, serde_json::json!({})),
            "inputs": [{"path": input, "split": "train"}],
        }))
        .unwrap();
        check_outcome(convert_binary(&job, &NoProgress), d, &out, &[input]);
    }
}

/// A copy in `dir` of a small valid store with names, relations and every split (converted once
/// per test binary).
fn small_store(dir: &Path) -> PathBuf {
    static TEMPLATE: std::sync::OnceLock<(tempfile::TempDir, PathBuf)> = std::sync::OnceLock::new();
    let (_, template) = TEMPLATE.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let p = tmp.path().join("e.tsv");
        let text: String = (0..50)
            .map(|i| format!("n{}\tr{}\tn{}\n", i % 13, i % 3, (i * 7) % 11))
            .collect();
        std::fs::write(&p, text).unwrap();
        let out = tmp.path().join("g.strata");
        let job: TextJob = serde_json::from_value(serde_json::json!({
            "graph": graph_opts(&out, 32 << 20, serde_json::json!({"split": [0.8, 0.1, 0.1]})),
            "text": {"inputs": [{"path": p}], "columns": ["src", "rel", "dst"], "delimiter": "tab",
                     "comment": "#", "header": false, "ids": "string", "relation_ids": "string"},
        }))
        .unwrap();
        convert_text(&job, &NoProgress).unwrap();
        (tmp, out)
    });
    let out = dir.join("g.strata");
    std::fs::create_dir(&out).unwrap();
    for entry in std::fs::read_dir(template).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), out.join(entry.file_name())).unwrap();
    }
    out
}

/// Opens `store` after damage: an error must be a store-format error; a store that opens must
/// have arrays whose every byte can be read and decoded.
fn open_damaged(store: &Path) {
    match Store::open(store) {
        Ok(s) => {
            for (name, info) in &s.manifest().arrays {
                let (h, bytes) = read_all_bytes(&s.array_path(name).unwrap()).unwrap();
                assert_eq!(h.dtype, info.dtype);
                if h.dtype.is_int() {
                    let mut v = Vec::new();
                    decode_ints(&bytes, h.dtype, &mut v);
                }
            }
        }
        Err(e) => assert!(
            matches!(
                e,
                StoreError::Invalid { .. } | StoreError::NewerFormat { .. }
            ),
            "damage gave {e:?}"
        ),
    }
}

/// A JSON edit: the path of object keys and array indices it descends, then the new value.
fn json_values() -> impl Strategy<Value = serde_json::Value> {
    prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        (0u64..100).prop_map(serde_json::Value::from),
        any::<f64>().prop_map(|f| serde_json::json!(f)),
        prop_oneof![
            Just("int8"),
            Just("int64"),
            Just("float32"),
            Just("../x.npy"),
            Just("csr_indptr.npy"),
            Just(""),
            Just("strata-store")
        ]
        .prop_map(serde_json::Value::from),
        Just(serde_json::json!([])),
        Just(serde_json::json!([1, 2])),
        Just(serde_json::json!({})),
    ]
}

/// Replaces the value found by walking `steps` (each picks a key or index by modulo; a scalar
/// ends the walk early).
fn edit_json(v: &mut serde_json::Value, steps: &[u8], new: serde_json::Value) {
    let Some((&s, rest)) = steps.split_first() else {
        *v = new;
        return;
    };
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            let k = m.keys().nth(s as usize % m.len()).unwrap().clone();
            edit_json(m.get_mut(&k).unwrap(), rest, new);
        }
        serde_json::Value::Array(a) if !a.is_empty() => {
            let n = a.len();
            edit_json(&mut a[s as usize % n], rest, new);
        }
        _ => *v = new,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(64)))]

    #[test]
    fn store_reader_survives_damaged_manifests(
        steps in proptest::collection::vec(any::<u8>(), 1..5), value in json_values(),
        byte_edits in edits(), structured in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = small_store(dir.path());
        let path = store.join("manifest.json");
        let text = std::fs::read(&path).unwrap();
        let damaged = if structured {
            let mut v: serde_json::Value = serde_json::from_slice(&text).unwrap();
            edit_json(&mut v, &steps, value);
            serde_json::to_vec(&v).unwrap()
        } else {
            mutate(text, &byte_edits)
        };
        std::fs::write(&path, damaged).unwrap();
        open_damaged(&store);
    }

    #[test]
    fn store_reader_survives_damaged_arrays(
        pick in any::<u8>(), header_edits in edits(), new_len in proptest::option::of(0u64..10_000),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let store = small_store(dir.path());
        let mut files: Vec<PathBuf> = std::fs::read_dir(&store)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "npy"))
            .collect();
        files.sort();
        let f = &files[pick as usize % files.len()];
        let bytes = std::fs::read(f).unwrap();
        // Damage the header block (the first 4096 bytes), then maybe the length.
        let (head, data) = bytes.split_at(4096.min(bytes.len()));
        let mut damaged = mutate(head.to_vec(), &header_edits);
        damaged.extend_from_slice(data);
        if let Some(len) = new_len {
            damaged.resize(len as usize, 0);
        }
        std::fs::write(f, damaged).unwrap();
        open_damaged(&store);
    }
}
