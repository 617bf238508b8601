//! Typed, weighted and timestamped text conversions (format 2): the store's CSR/CSC payload
//! columns against a plain in-memory reference, the same store under a budget that forces
//! bucket files (and single-node ranges for a hub), `strata check` on the result, and
//! version-1 output for inputs that use none of format 2's parts.

use std::path::{Path, PathBuf};

use strata_store::array::read_all_bytes;
use strata_store::check::check_store;
use strata_store::convert::{convert_text, TextJob};
use strata_store::rng::Rng;
use strata_store::{NoProgress, Store};

const TYPES: [(&str, u64); 3] = [("paper", 600), ("author", 300), ("venue", 20)];
/// (source type, relation, destination type) by edge-type id.
const EDGE_TYPES: [(usize, &str, usize); 4] = [
    (0, "cites", 0),
    (1, "writes", 0),
    (0, "written by", 1),
    (0, "at", 2),
];

struct Edge {
    src: u64,
    etype: usize,
    dst: u64,
    weight: f32,
    time: i64,
}

fn offset(t: usize) -> u64 {
    TYPES[..t].iter().map(|x| x.1).sum()
}

/// Random edges of every type, with a hub (paper 0) that cites a lot and receives about a
/// quarter of the edges (10,000 of 40,000: 320 KB of in-edges, more than a 1 MiB budget's
/// adjacency slice, so the hub gets a single-node range of its own).
fn edges(n: usize) -> Vec<Edge> {
    let mut rng = Rng::new(11);
    (0..n)
        .map(|i| {
            let etype = rng.below(4) as usize;
            let (s, _, d) = EDGE_TYPES[etype];
            let pick = |rng: &mut Rng, t: usize| offset(t) + rng.below(TYPES[t].1);
            let mut src = pick(&mut rng, s);
            let dst = if i % 2 == 0 && d == 0 {
                0
            } else {
                pick(&mut rng, d)
            };
            if i % 5 == 0 && s == 0 {
                src = 0;
            }
            Edge {
                src,
                etype,
                dst,
                weight: rng.below(1000) as f32 / 8.0,
                time: rng.below(1 << 40) as i64 - (1 << 39),
            }
        })
        .collect()
}

fn write_inputs(dir: &Path, edges: &[Edge]) -> (PathBuf, PathBuf, PathBuf) {
    let nodes = dir.join("node_types.tsv");
    let types: String = TYPES.iter().map(|(n, c)| format!("{n}\t{c}\n")).collect();
    std::fs::write(&nodes, types).unwrap();
    let etypes = dir.join("edge_types.tsv");
    let lines: String = EDGE_TYPES
        .iter()
        .map(|(s, r, d)| format!("{}\t{r}\t{}\n", TYPES[*s].0, TYPES[*d].0))
        .collect();
    std::fs::write(&etypes, lines).unwrap();
    let input = dir.join("edges.csv");
    let text: String = edges
        .iter()
        .map(|e| {
            format!(
                "{},{},{},{},{}\n",
                e.src, EDGE_TYPES[e.etype].1, e.dst, e.weight, e.time
            )
        })
        .collect();
    std::fs::write(&input, text).unwrap();
    (nodes, etypes, input)
}

fn job(
    out: &Path,
    input: &Path,
    types: Option<(&Path, &Path)>,
    columns: &[&str],
    memory: u64,
) -> TextJob {
    serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": memory, "threads": 2, "io_chunk": 16384},
        "text": {"inputs": [{"path": input}], "columns": columns, "delimiter": "auto",
                 "comment": "#", "header": false, "ids": "int", "relation_ids": "auto",
                 "node_types": types.map(|t| t.0), "edge_types": types.map(|t| t.1)},
    }))
    .unwrap()
}

fn array(store: &Store, name: &str) -> Vec<u8> {
    read_all_bytes(&store.array_path(name).unwrap()).unwrap().1
}

fn ints(store: &Store, name: &str) -> Vec<i64> {
    let info = store.require(name).unwrap();
    let mut out = Vec::new();
    strata_store::array::decode_ints(&array(store, name), info.dtype, &mut out);
    out
}

#[test]
fn typed_weighted_temporal_store_matches_a_reference_under_any_budget() {
    let dir = tempfile::tempdir().unwrap();
    let edges = edges(40_000);
    let (nodes, etypes, input) = write_inputs(dir.path(), &edges);
    let cols = ["src", "rel", "dst", "weight", "time"];
    let big = dir.path().join("big.strata");
    let small = dir.path().join("small.strata");
    convert_text(
        &job(&big, &input, Some((&nodes, &etypes)), &cols, 1 << 30),
        &NoProgress,
    )
    .unwrap();
    let summary = convert_text(
        &job(&small, &input, Some((&nodes, &etypes)), &cols, 1 << 20),
        &NoProgress,
    )
    .unwrap();
    // The small budget takes the bucket path on both sides, with the hub in a range of its own.
    let buckets: Vec<&String> = summary
        .plan
        .iter()
        .filter(|l| l.contains("bucket files"))
        .collect();
    assert_eq!(buckets.len(), 2, "{:?}", summary.plan);
    let (big, small) = (Store::open(&big).unwrap(), Store::open(&small).unwrap());
    let m = big.manifest();
    assert_eq!(m.format_version, 2);
    assert_eq!(m.node_types.len(), 3);
    assert_eq!((m.node_types[2].offset, m.node_types[2].count), (900, 20));
    assert_eq!(m.edge_types[2].relation, "written by");
    assert_eq!(m.graph.num_relations, 4);
    for name in m.arrays.keys() {
        assert_eq!(
            array(&big, name),
            array(&small, name),
            "{name} depends on the budget"
        );
    }
    // Reference: per destination, (etype, eid) order; the payload columns follow the edges.
    let n = m.graph.num_nodes as usize;
    let mut csc: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n];
    for (eid, e) in edges.iter().enumerate() {
        csc[e.dst as usize].push((e.etype, eid));
    }
    for seg in csc.iter_mut() {
        seg.sort();
    }
    let flat: Vec<(usize, usize)> = csc.into_iter().flatten().collect();
    let eid: Vec<i64> = flat.iter().map(|&(_, e)| e as i64).collect();
    assert_eq!(ints(&big, "csc_eid"), eid);
    assert_eq!(
        ints(&big, "csc_etype"),
        flat.iter().map(|&(t, _)| t as i64).collect::<Vec<_>>()
    );
    assert_eq!(
        big.require("csc_etype").unwrap().dtype,
        strata_store::DType::U8
    );
    assert_eq!(
        ints(&big, "csc_indices"),
        flat.iter()
            .map(|&(_, e)| edges[e].src as i64)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&big, "csc_times"),
        flat.iter().map(|&(_, e)| edges[e].time).collect::<Vec<_>>()
    );
    let weights: Vec<f32> = bytemuck::cast_slice(&array(&big, "csc_weights")).to_vec();
    assert_eq!(
        weights,
        flat.iter()
            .map(|&(_, e)| edges[e].weight)
            .collect::<Vec<_>>()
    );
    let train_w: Vec<f32> = bytemuck::cast_slice(&array(&big, "edge_weights_train")).to_vec();
    assert_eq!(train_w, edges.iter().map(|e| e.weight).collect::<Vec<_>>());
    let checked = check_store(big.path(), 20, &NoProgress).unwrap();
    assert!(checked.problems.is_empty(), "{:?}", checked.problems.listed);
}

#[test]
fn check_finds_unsorted_segments_and_payload_that_does_not_match() {
    let dir = tempfile::tempdir().unwrap();
    let edges = edges(2_000);
    let (nodes, etypes, input) = write_inputs(dir.path(), &edges);
    let out = dir.path().join("g.strata");
    let cols = ["src", "rel", "dst", "weight", "time"];
    convert_text(
        &job(&out, &input, Some((&nodes, &etypes)), &cols, 1 << 30),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&out).unwrap();
    // Paper 0's in-neighbours span several edge types: swap its first and last etype.
    let seg_end = ints(&store, "csc_indptr")[1] as usize;
    let path = store.array_path("csc_etype").unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.swap(4096, 4096 + seg_end - 1);
    std::fs::write(&path, &bytes).unwrap();
    let path = store.array_path("csr_times").unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let checked = check_store(&out, 20, &NoProgress).unwrap();
    let messages: Vec<&str> = checked
        .problems
        .listed
        .iter()
        .map(|p| p.message.as_str())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("node 0's neighbours are not ordered by (edge type, edge id)")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("csr_indices, csr_eid and the csr attribute columns")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.starts_with("csc_indices, csc_eid and the csc attribute columns")),
        "{messages:?}"
    );
}

#[test]
fn untyped_stores_are_version_1_unless_they_carry_attributes() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("e.tsv");
    std::fs::write(&input, "0\t1\t0.5\t7\n1\t2\t1.5\t-3\n2\t0\t2\t9\n").unwrap();
    let plain = dir.path().join("plain.strata");
    convert_text(
        &job(&plain, &input, None, &["src", "dst", "_", "_"], 1 << 26),
        &NoProgress,
    )
    .unwrap();
    let text = std::fs::read_to_string(plain.join("manifest.json")).unwrap();
    assert!(
        text.contains("\"format_version\": 1")
            && !text.contains("node_types")
            && !text.contains("edge_attributes")
    );
    assert!(!plain.join("csr_eid.npy").exists());
    let weighted = dir.path().join("weighted.strata");
    convert_text(
        &job(
            &weighted,
            &input,
            None,
            &["src", "dst", "weight", "time"],
            1 << 26,
        ),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&weighted).unwrap();
    assert_eq!(store.manifest().format_version, 2);
    assert!(store.array("csr_etype").is_none());
    assert_eq!(ints(&store, "csr_times"), vec![7, -3, 9]);
    assert_eq!(ints(&store, "csc_eid"), vec![2, 0, 1]);
    let checked = check_store(&weighted, 20, &NoProgress).unwrap();
    assert!(checked.problems.is_empty(), "{:?}", checked.problems.listed);
}
