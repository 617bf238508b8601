//! Typed text conversions whose edges hold node names: ids follow (node type, name) order, each
//! node type's range holds its names sorted, the same name may name nodes of two types, and the
//! store is the same whether the name dictionary fits the budget or spills sorted runs and
//! encodes in several passes.

use std::path::Path;

use crate::common::{array_bytes, edges, names};
use strata_store::check::check_store;
use strata_store::convert::{convert_text, TextJob};
use strata_store::rng::Rng;
use strata_store::strtab::NameTable;
use strata_store::{NoProgress, Store};

/// Node types in id order.
const TYPES: [&str; 2] = ["paper", "author"];
/// (source type, relation, destination type) by edge-type id.
const EDGE_TYPES: [(usize, &str, usize); 3] =
    [(0, "cites", 0), (1, "writes", 0), (0, "written by", 1)];

/// Names of node `i` of type `t`: papers and authors share the names `n0 .. n999`, so a name
/// alone does not say which node it is.
fn name(t: usize, i: u64) -> String {
    match t {
        0 => format!("n{i}"),
        _ => format!("n{}", i % 1000),
    }
}

fn job(out: &Path, dir: &Path, memory: u64) -> TextJob {
    serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": memory, "threads": 2, "io_chunk": 16384},
        "text": {"inputs": [{"path": dir.join("edges.tsv")}], "columns": ["src", "rel", "dst", "time"],
                 "delimiter": "tab", "comment": "#", "header": false, "ids": "auto",
                 "relation_ids": "auto", "node_types": dir.join("node_types.txt"),
                 "edge_types": dir.join("edge_types.tsv")},
    }))
    .unwrap()
}

/// Writes the types files and `n` random edges; returns the edges as
/// (source name, edge type, destination name, time).
fn write_inputs(dir: &Path, n: usize) -> Vec<(String, usize, String, i64)> {
    std::fs::write(
        dir.join("node_types.txt"),
        "# types, no counts\npaper\nauthor\n",
    )
    .unwrap();
    let lines: String = EDGE_TYPES
        .iter()
        .map(|(s, r, d)| format!("{}\t{r}\t{}\n", TYPES[*s], TYPES[*d]))
        .collect();
    std::fs::write(dir.join("edge_types.tsv"), lines).unwrap();
    let mut rng = Rng::new(5);
    let edges: Vec<_> = (0..n)
        .map(|_| {
            let etype = rng.below(3) as usize;
            let (s, _, d) = EDGE_TYPES[etype];
            let (u, v) = (rng.below(12_000), rng.below(12_000));
            (name(s, u), etype, name(d, v), rng.below(1000) as i64 - 500)
        })
        .collect();
    let text: String = edges
        .iter()
        .map(|(s, t, d, time)| format!("{s}\t{}\t{d}\t{time}\n", EDGE_TYPES[*t].1))
        .collect();
    std::fs::write(dir.join("edges.tsv"), text).unwrap();
    edges
}

#[test]
fn typed_names_fill_sorted_type_ranges_under_any_budget() {
    let dir = tempfile::tempdir().unwrap();
    write_inputs(dir.path(), 30_000);
    let big = convert_text(
        &job(&dir.path().join("big.strata"), dir.path(), 1 << 30),
        &NoProgress,
    )
    .unwrap();
    // About 13,000 names (1 MiB of dictionary) against a 600 KiB budget: sorted runs spill and
    // the encode pass runs once per range of the name table.
    let small = convert_text(
        &job(&dir.path().join("small.strata"), dir.path(), 600 << 10),
        &NoProgress,
    )
    .unwrap();
    assert!(
        small.plan.iter().any(|l| l.contains("sorted runs merged")),
        "{:?}",
        small.plan
    );
    assert_eq!(big.node_types.len(), 2);
    assert_eq!(
        big.edge_types[2],
        ("paper".into(), "written by".into(), "author".into())
    );
    let (big, small) = (
        Store::open(&big.store).unwrap(),
        Store::open(&small.store).unwrap(),
    );
    assert_eq!(array_bytes(&big), array_bytes(&small));
    assert_eq!(big.manifest().node_types, small.manifest().node_types);
}

#[test]
fn typed_names_map_back_to_their_types_and_names() {
    let dir = tempfile::tempdir().unwrap();
    let want = write_inputs(dir.path(), 3_000);
    let s = convert_text(
        &job(&dir.path().join("g.strata"), dir.path(), 1 << 26),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&s.store).unwrap();
    let m = store.manifest();
    assert_eq!(m.format_version, 2);
    assert!(m.graph.node_names);
    let names = names(&store, "node_names");
    // Every type's range holds its distinct names, sorted.
    for (t, nt) in m.node_types.iter().enumerate() {
        let mut distinct: Vec<String> = want
            .iter()
            .flat_map(|(s, e, d, _)| {
                let (st, _, dt) = EDGE_TYPES[*e];
                [(st, s), (dt, d)]
            })
            .filter(|(ty, _)| *ty == t)
            .map(|(_, n)| n.clone())
            .collect();
        distinct.sort();
        distinct.dedup();
        assert_eq!(nt.name, TYPES[t]);
        let range = nt.offset as usize..(nt.offset + nt.count) as usize;
        assert_eq!(names[range], distinct[..]);
    }
    let type_of = |id: i64| {
        m.node_types
            .iter()
            .position(|t| (id as u64) < t.offset + t.count)
            .unwrap()
    };
    for ((s, r, d), (ws, wt, wd, _)) in edges(&store, "train").into_iter().zip(&want) {
        let (st, _, dt) = EDGE_TYPES[*wt];
        assert_eq!(r, *wt as i64);
        assert_eq!((type_of(s), &names[s as usize]), (st, ws));
        assert_eq!((type_of(d), &names[d as usize]), (dt, wd));
    }
    // A name of both types is found within each type, and refused without one; a name of
    // one type is found without it.
    let table = NameTable::open(&store, "node_names").unwrap();
    let (paper, author) = (&m.node_types[0], &m.node_types[1]);
    let papers = &names[..paper.count as usize];
    let shared = names[author.offset as usize..]
        .iter()
        .find(|n| papers.contains(n))
        .expect("a name of both types");
    let a = table
        .find_in(
            shared.as_bytes(),
            author.offset,
            author.offset + author.count,
        )
        .unwrap()
        .unwrap();
    assert_eq!((type_of(a as i64), &names[a as usize]), (1, shared));
    let p = table
        .find_in(shared.as_bytes(), 0, paper.count)
        .unwrap()
        .unwrap();
    assert_eq!((type_of(p as i64), &names[p as usize]), (0, shared));
    let err = table.find(shared.as_bytes()).unwrap_err().to_string();
    assert!(err.contains("of different node types"), "{err}");
    let only = papers
        .iter()
        .find(|n| n.len() >= 5)
        .expect("a paper n1000 or above");
    assert_eq!(
        table
            .find(only.as_bytes())
            .unwrap()
            .map(|i| type_of(i as i64)),
        Some(0)
    );
    let checked = check_store(store.path(), 20, &NoProgress).unwrap();
    assert!(checked.problems.is_empty(), "{:?}", checked.problems.listed);
}

/// A job reading one file per edge type (`edges_of`), without an edge types file.
fn per_edge_type_job(out: &Path, node_types: &Path, files: &[(&Path, [&str; 3])]) -> TextJob {
    let edges_of: Vec<_> = files
        .iter()
        .map(|(p, t)| serde_json::json!({"path": p, "edge_type": t}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 1 << 26, "threads": 2},
        "text": {"inputs": [], "edges_of": edges_of, "columns": ["src", "dst"],
                 "delimiter": "auto", "comment": "#", "header": false, "ids": "auto",
                 "relation_ids": "auto", "node_types": node_types},
    }))
    .unwrap()
}

#[test]
fn per_edge_type_files_take_local_ids_or_names_of_their_types() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let (writes, cites) = (d.join("writes.tsv"), d.join("cites.tsv"));
    std::fs::write(d.join("counted.txt"), "paper\t3\nauthor\t2\n").unwrap();
    std::fs::write(&writes, "0\t2\n1\t0\n").unwrap();
    std::fs::write(&cites, "2\t1\n").unwrap();
    let files = [
        (writes.as_path(), ["author", "writes", "paper"]),
        (cites.as_path(), ["paper", "cites", "paper"]),
    ];
    let s = convert_text(
        &per_edge_type_job(&d.join("ints.strata"), &d.join("counted.txt"), &files),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&s.store).unwrap();
    // Author 0 is global id 3; the edge types are the files', in the order given.
    assert_eq!(
        edges(&store, "train"),
        vec![(3, 0, 2), (4, 0, 0), (2, 1, 1)]
    );
    assert_eq!(
        s.edge_types[0],
        ("author".into(), "writes".into(), "paper".into())
    );

    std::fs::write(d.join("named.txt"), "paper\nauthor\n").unwrap();
    std::fs::write(&writes, "ann\tp1\np2\tp3\n").unwrap();
    std::fs::write(&cites, "p3\tp1\n").unwrap();
    let s = convert_text(
        &per_edge_type_job(&d.join("names.strata"), &d.join("named.txt"), &files),
        &NoProgress,
    )
    .unwrap();
    let store = Store::open(&s.store).unwrap();
    assert_eq!(names(&store, "node_names"), ["p1", "p3", "ann", "p2"]);
    assert_eq!(
        edges(&store, "train"),
        vec![(2, 0, 0), (3, 0, 1), (1, 1, 0)]
    );

    std::fs::write(&writes, "0\t2\n2\t0\n").unwrap();
    let err = convert_text(
        &per_edge_type_job(&d.join("bad.strata"), &d.join("counted.txt"), &files),
        &NoProgress,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("writes.tsv:2: src id 2 is out of range: node type 'author' has 2 nodes"),
        "{err}"
    );
    assert!(!d.join("bad.strata").exists());
}
