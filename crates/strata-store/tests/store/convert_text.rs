//! The text converter: round trips for any chunking, budget, thread count and split, and the
//! bad inputs it must reject cleanly.

use std::path::{Path, PathBuf};

use crate::common::*;
use proptest::prelude::*;
use strata_store::convert::{convert_text, TextJob};
use strata_store::{NoProgress, Store, StoreError};

fn text_job(
    inputs: &[(PathBuf, &str)],
    out: &Path,
    memory: u64,
    columns: &[&str],
    ids: &str,
    extra: serde_json::Value,
) -> TextJob {
    let inputs: Vec<_> = inputs
        .iter()
        .map(|(p, s)| serde_json::json!({"path": p, "split": s}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "graph": graph_opts(out, memory, extra),
        "text": {
            "inputs": inputs,
            "columns": columns,
            "delimiter": "auto",
            "comment": "#",
            "header": false,
            "ids": ids,
            "relation_ids": ids,
        }
    }))
    .unwrap()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = String::from("# generated\n");
    for l in lines {
        text.push_str(l);
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// Name of entity `i` in generated inputs: varied lengths so name tables have real offsets.
fn ent(i: u32) -> String {
    format!("/m/{}{}", "x".repeat((i % 5) as usize), i)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn string_ids_round_trip_for_any_budget(
        input in proptest::collection::vec((0u32..60, 0u32..4, 0u32..60, 0usize..3), 1..300),
        with_rel in any::<bool>(),
        memory_kib in prop_oneof![Just(48u64), Just(96), Just(100_000)],
        threads in 1usize..4,
        symmetrize in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut splits: [Vec<String>; 3] = Default::default();
        let mut want: [Vec<(String, String, String)>; 3] = Default::default();
        for &(s, r, d, split) in &input {
            let split = if split > 0 && input.len() < 3 { 0 } else { split };
            let rel = format!("rel/{r}");
            splits[split].push(if with_rel { format!("{}\t{rel}\t{}", ent(s), ent(d)) } else { format!("{}\t{}", ent(s), ent(d)) });
            want[split].push((ent(s), rel, ent(d)));
        }
        let mut inputs = Vec::new();
        for (i, name) in ["train", "valid", "test"].iter().enumerate() {
            if !splits[i].is_empty() {
                let p = dir.path().join(format!("{name}.txt"));
                write_lines(&p, &splits[i]);
                inputs.push((p, *name));
            }
        }
        prop_assume!(!splits[0].is_empty());
        let cols: &[&str] = if with_rel { &["src", "rel", "dst"] } else { &["src", "dst"] };
        let extra = serde_json::json!({"threads": threads, "symmetrize": symmetrize});
        let small = text_job(&inputs, &dir.path().join("small.strata"), memory_kib << 10, cols, "string", extra.clone());
        let summary = match convert_text(&small, &NoProgress) {
            Ok(s) => s,
            Err(StoreError::Budget { .. }) => return Ok(()),
            Err(e) => panic!("{e}"),
        };
        let store = Store::open(&summary.store).unwrap();
        let node_names = names(&store, "node_names");
        let mut distinct: Vec<String> = want.iter().flatten().flat_map(|(s, _, d)| [s.clone(), d.clone()]).collect();
        distinct.sort();
        distinct.dedup();
        prop_assert_eq!(&node_names, &distinct);
        let rel_names = if with_rel { names(&store, "relation_names") } else { Vec::new() };
        for (i, split) in ["train", "valid", "test"].iter().enumerate() {
            if want[i].is_empty() {
                let name = format!("edges_{split}");
                prop_assert!(store.array(&name).is_none());
                continue;
            }
            let got: Vec<(String, String, String)> = edges(&store, split)
                .into_iter()
                .map(|(s, r, d)| (
                    node_names[s as usize].clone(),
                    if with_rel { rel_names[r as usize].clone() } else { String::new() },
                    node_names[d as usize].clone(),
                ))
                .collect();
            let expect: Vec<_> = want[i].iter().map(|(s, r, d)| (s.clone(), if with_rel { r.clone() } else { String::new() }, d.clone())).collect();
            prop_assert_eq!(got, expect);
        }
        let train = edges(&store, "train");
        let n = node_names.len();
        prop_assert_eq!(adjacency(&store, "csr"), reference_adjacency(n, &train, false, symmetrize));
        prop_assert_eq!(adjacency(&store, "csc"), reference_adjacency(n, &train, !symmetrize, symmetrize));
        let out_deg: Vec<i64> = reference_adjacency(n, &train, false, symmetrize).iter().map(|a| a.len() as i64).collect();
        prop_assert_eq!(ints(&store, "out_degree"), out_deg);

        // Whatever the budget and threads, the arrays are byte-identical to a roomy conversion.
        let big = text_job(&inputs, &dir.path().join("big.strata"), 1 << 30, cols, "string", serde_json::json!({"threads": 1, "symmetrize": symmetrize}));
        let reference = Store::open(&convert_text(&big, &NoProgress).unwrap().store).unwrap();
        prop_assert_eq!(array_bytes(&store), array_bytes(&reference));
    }

    #[test]
    fn random_split_is_exact_and_complete(n_edges in 1usize..400, seed in any::<u64>(), valid in 0.0f64..0.3, test in 0.0f64..0.3) {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = (0..n_edges).map(|i| format!("{} {}", i % 17, (i * 7) % 23)).collect();
        let p = dir.path().join("e.txt");
        write_lines(&p, &lines);
        let fr = [1.0 - valid - test, valid, test];
        let nv = (n_edges as f64 * valid).round() as usize;
        let nt = ((n_edges as f64 * test).round() as usize).min(n_edges - nv);
        // A split that leaves no train edge is refused (see the test below), not converted.
        prop_assume!(nv + nt < n_edges);
        let job = text_job(&[(p, "train")], &dir.path().join("s.strata"), 64 << 20, &["src", "dst"], "int", serde_json::json!({"split": fr, "seed": seed}));
        let store = Store::open(&convert_text(&job, &NoProgress).unwrap().store).unwrap();
        prop_assert_eq!(edges(&store, "valid").len(), nv);
        prop_assert_eq!(edges(&store, "test").len(), nt);
        let mut all: Vec<_> = ["train", "valid", "test"].iter().flat_map(|s| edges(&store, s)).collect();
        all.sort();
        let mut expect: Vec<_> = (0..n_edges).map(|i| ((i % 17) as i64, -1, ((i * 7) % 23) as i64)).collect();
        expect.sort();
        prop_assert_eq!(all, expect);
    }
}

#[test]
fn dictionary_larger_than_budget_encodes_in_several_passes() {
    let dir = tempfile::tempdir().unwrap();
    // 20,000 names: their dictionary (about 1.3 MiB) is several times what a 600 KiB budget
    // leaves beside the parse blocks.
    let lines: Vec<String> = (0..30_000u32)
        .map(|i| format!("{}\t{}", ent(i * 13 % 20_000), ent(i * 7 % 19_999)))
        .collect();
    let p = dir.path().join("e.tsv");
    write_lines(&p, &lines);
    let job = text_job(
        &[(p.clone(), "train")],
        &dir.path().join("a.strata"),
        600 << 10,
        &["src", "dst"],
        "string",
        serde_json::json!({"threads": 2}),
    );
    let summary = convert_text(&job, &NoProgress).unwrap();
    assert!(
        summary
            .plan
            .iter()
            .any(|l| l.contains("sorted runs merged")),
        "{:?}",
        summary.plan
    );
    let store = Store::open(&summary.store).unwrap();
    let big = text_job(
        &[(p, "train")],
        &dir.path().join("b.strata"),
        1 << 30,
        &["src", "dst"],
        "string",
        serde_json::json!({}),
    );
    let reference = Store::open(&convert_text(&big, &NoProgress).unwrap().store).unwrap();
    assert_eq!(array_bytes(&store), array_bytes(&reference));
    assert!(adjacency(&store, "csr").iter().map(Vec::len).sum::<usize>() == 30_000);
}

#[test]
fn integer_ids_keep_their_values_and_auto_detects_them() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.txt");
    std::fs::write(
        &p,
        "% matrix-market style comment is data here? no: comment is '#'\n".replace(
            "% matrix-market style comment is data here? no: comment is '#'\n",
            "# c\n0 5\n5 2\n2 0\n",
        ),
    )
    .unwrap();
    let job = text_job(
        &[(p, "train")],
        &dir.path().join("s.strata"),
        64 << 20,
        &["src", "dst"],
        "auto",
        serde_json::json!({}),
    );
    let store = Store::open(&convert_text(&job, &NoProgress).unwrap().store).unwrap();
    assert_eq!(store.manifest().graph.num_nodes, 6);
    assert!(!store.manifest().graph.node_names);
    assert_eq!(
        edges(&store, "train"),
        vec![(0, -1, 5), (5, -1, 2), (2, -1, 0)]
    );
}

fn expect_error(job: &TextJob, needle: &[&str]) {
    let out = job.graph.out.clone();
    let err = convert_text(job, &NoProgress).unwrap_err().to_string();
    for n in needle {
        assert!(err.contains(n), "error {err:?} should mention {n:?}");
    }
    assert!(
        !out.exists(),
        "a failed conversion must not leave {}",
        out.display()
    );
    let parent = out.parent().unwrap();
    assert!(
        entries(parent).iter().all(|e| !e.contains(".partial-")),
        "partial directory left: {:?}",
        entries(parent)
    );
}

#[test]
fn bad_inputs_are_rejected_with_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = d.join("out.strata");
    let write = |name: &str, text: &str| {
        let p = d.join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // Inconsistent column count.
    let p = write("cols.tsv", "a\tr\tb\nc\td\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "rel", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["cols.tsv:2:", "expected 3 fields, found 2"],
    );
    // Empty name field.
    let p = write("blank.tsv", "a\tb\n\tb\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["blank.tsv:2:", "src field is empty"],
    );
    // Malformed integer id.
    let p = write("ints.txt", "1 2\n3 x4\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "int",
            serde_json::json!({}),
        ),
        &["ints.txt:2:", "dst 'x4' is not a non-negative integer"],
    );
    // A huge malformed field is quoted by its start, not whole.
    let p = write("long.txt", &format!("1 2\n3 x{}\n", "4".repeat(10 << 20)));
    let job = text_job(
        &[(p, "train")],
        &out,
        64 << 20,
        &["src", "dst"],
        "int",
        serde_json::json!({}),
    );
    let err = convert_text(&job, &NoProgress).unwrap_err().to_string();
    assert!(err.len() < 300, "{} bytes of error", err.len());
    let start = format!("dst 'x{}...' (10485761 bytes) is not", "4".repeat(39));
    assert!(err.contains(&start), "{err}");
    // Negative integer id.
    let p = write("neg.txt", "1 2\n-3 4\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "int",
            serde_json::json!({}),
        ),
        &["neg.txt:2:", "src '-3'"],
    );
    // Id out of range of a declared node count.
    let p = write("range.txt", "1 2\n3 10\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "int",
            serde_json::json!({"num_nodes": 10}),
        ),
        &["range.txt:2:", "dst id 10 is out of range: num_nodes is 10"],
    );
    // Empty file, and a file of comments only.
    let p = write("empty.txt", "");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["empty.txt", "no edges"],
    );
    let p = write("comments.txt", "# nothing\n\n# here\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["comments.txt", "no edges"],
    );
    // A valid train file and an empty test file.
    let good = write("good.txt", "a b\n");
    let empty = write("empty_test.txt", "\n");
    expect_error(
        &text_job(
            &[(good.clone(), "train"), (empty, "test")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["empty_test.txt", "no edges"],
    );
    // Missing input.
    expect_error(
        &text_job(
            &[(d.join("nope.tsv"), "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["nope.tsv"],
    );
    // Sparse integer ids.
    let p = write("sparse.txt", "1 99999999999\n");
    expect_error(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "int",
            serde_json::json!({}),
        ),
        &["sparse", "ids = \"string\""],
    );
    // Budget too small to parse at all.
    expect_error(
        &text_job(
            &[(good.clone(), "train")],
            &out,
            1000,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &["memory budget", "too small"],
    );
    // Bad split fractions.
    expect_error(
        &text_job(
            &[(good.clone(), "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({"split": [0.5, 0.1, 0.1]}),
        ),
        &["option split"],
    );
    // Output exists.
    std::fs::create_dir(&out).unwrap();
    let err = convert_text(
        &text_job(
            &[(good, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &NoProgress,
    )
    .unwrap_err();
    assert!(matches!(err, StoreError::Exists { .. }), "{err}");
}

#[test]
fn overwrite_replaces_a_store_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.txt");
    std::fs::write(&p, "a b\nb c\n").unwrap();
    let out = dir.path().join("g.strata");
    convert_text(
        &text_job(
            &[(p.clone(), "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({}),
        ),
        &NoProgress,
    )
    .unwrap();
    std::fs::write(&p, "a b\nb c\nc d\n").unwrap();
    let s = convert_text(
        &text_job(
            &[(p, "train")],
            &out,
            64 << 20,
            &["src", "dst"],
            "string",
            serde_json::json!({"overwrite": true}),
        ),
        &NoProgress,
    )
    .unwrap();
    assert_eq!(s.num_nodes, 4);
    assert_eq!(
        entries(dir.path()),
        vec!["e.txt".to_string(), "g.strata".to_string()]
    );
}

#[test]
fn a_split_that_leaves_no_train_edge_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("e.txt");
    write_lines(&p, &["0 1".to_string()]);
    let out = dir.path().join("s.strata");
    let job = text_job(
        &[(p, "train")],
        &out,
        64 << 20,
        &["src", "dst"],
        "int",
        serde_json::json!({"split": [0.2, 0.5, 0.3]}),
    );
    let err = convert_text(&job, &NoProgress).unwrap_err().to_string();
    assert!(err.contains("no train edges"), "{err}");
    assert!(!out.exists());
}
