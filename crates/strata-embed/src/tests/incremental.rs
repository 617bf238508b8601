//! Incremental training (`init_from`): known rows carried bit for bit to their new ids, new
//! rows fresh, the streaming remap equal to the in-memory one, mismatches refused.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::compute::bf16;
use crate::config::{OptimizerKind, RowInit, TableDtype, TrainConfig};
use crate::model::ScoreModel;
use crate::run::incremental::{node_map, relation_map, remap_relations, remap_table, TableSide};
use crate::run::run_dir::Run;
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::Partitioning;
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;
use crate::train::job::train;
use strata_io::{AlignedBuf, Engine};
use strata_store::convert::{convert_text, TextJob};
use strata_store::rng::Rng;
use strata_store::strtab::NameTable;
use strata_store::{NoProgress, Store};

/// Triples `(head, rel, tail)` of a graph with planted structure over `n` named entities.
fn triples(n: u64, r: u64, edges: usize) -> Vec<(u64, u64, u64)> {
    let mut rng = Rng::new(7);
    (0..edges)
        .map(|_| {
            let h = rng.below(n);
            let rel = rng.below(r);
            (h, rel, (h * (rel + 1) + rng.below(3)) % n)
        })
        .collect()
}

/// A store of `edges` with names `e{id}` and `r{rel}` (one in ten edges each for valid and
/// test), converted in `dir/name.strata`.
fn named_store(dir: &Path, name: &str, edges: &[(u64, u64, u64)]) -> PathBuf {
    let mut lines = [String::new(), String::new(), String::new()];
    for (i, (h, r, t)) in edges.iter().enumerate() {
        lines[[0, 0, 0, 0, 0, 0, 0, 0, 1, 2][i % 10]].push_str(&format!("e{h}\tr{r}\te{t}\n"));
    }
    let files: Vec<PathBuf> = ["train", "valid", "test"]
        .iter()
        .map(|s| dir.join(format!("{name}-{s}.txt")))
        .collect();
    for (f, text) in files.iter().zip(&lines) {
        std::fs::write(f, text).unwrap();
    }
    let out = dir.join(format!("{name}.strata"));
    let job: TextJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 64u64 << 20, "io_chunk": 4096},
        "text": {
            "inputs": files.iter().zip(["train", "valid", "test"]).map(|(f, s)| serde_json::json!({"path": f, "split": s})).collect::<Vec<_>>(),
            "columns": ["src", "rel", "dst"], "delimiter": "auto", "comment": "#", "header": false,
            "ids": "string", "relation_ids": "string",
        }
    }))
    .unwrap();
    convert_text(&job, &NoProgress).unwrap();
    out
}

fn config(partitions: u32) -> TrainConfig {
    TrainConfig {
        dim: 16,
        chunk_size: 100,
        negatives: 50,
        epochs: 1,
        partitions,
        buffer: 3,
        threads: 1,
        memory: strata_store::config::Size(256 << 20),
        ..TrainConfig::default()
    }
}

/// Embedding row and optimizer state of node `v` in `table` of `run`.
fn row(run: &Run, table: &str, v: u64) -> (Vec<f32>, Vec<f32>) {
    let engine = Engine::shared();
    let f = TableFile::open(&engine, &run.table_path(table), false).unwrap();
    let (p, l) = run.meta.partitioning.locator().locate(v);
    let layout = &run.meta.layout;
    let mut emb = vec![0f32; layout.dim];
    let mut state = vec![0f32; layout.state_per_row];
    f.read_rows(&engine, layout, p, l as u64, &mut emb).unwrap();
    f.read_state_rows(&engine, layout, p, l as u64, &mut state)
        .unwrap();
    (emb, state)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn known_rows_carry_to_their_new_ids_and_new_rows_are_fresh() {
    let dir = tempfile::tempdir().unwrap();
    let mut all = triples(500, 6, 7200);
    // The old graph: 90% of the edges; entities 500..539 are only in the other 10%.
    all.extend((0..800).map(|i| (500 + i % 40, i % 6, i % 500)));
    let old_store = named_store(dir.path(), "old", &all[..7200]);
    let new_store = named_store(dir.path(), "new", &all);
    let (old_run, init_run, fresh_run) = (
        dir.path().join("old-run"),
        dir.path().join("init-run"),
        dir.path().join("fresh-run"),
    );
    train(
        &old_store,
        &old_run,
        config(3),
        false,
        None,
        &NoProgress,
        &mut |_| {},
    )
    .unwrap();
    let init_cfg = TrainConfig {
        init_from: Some(old_run.clone()),
        ..config(4)
    };
    for (run, cfg) in [(&init_run, init_cfg), (&fresh_run, config(4))] {
        train(&new_store, run, cfg, false, None, &NoProgress, &mut |_| {}).unwrap();
    }
    let (old, init, fresh) = (
        Run::open(&old_run).unwrap(),
        Run::open(&init_run).unwrap(),
        Run::open(&fresh_run).unwrap(),
    );
    // One epoch wrote the spare table: table-0.bin still holds each new run's epoch 0.
    assert_eq!(init.meta.current.table, "table-1.bin");
    let (os, ns) = (
        Store::open(&old_store).unwrap(),
        Store::open(&new_store).unwrap(),
    );
    let map = node_map(&os, &ns).unwrap();
    let (on, nn) = (
        NameTable::open(&os, "node_names").unwrap(),
        NameTable::open(&ns, "node_names").unwrap(),
    );
    assert!(ns.manifest().graph.num_nodes > os.manifest().graph.num_nodes);
    let mut known = vec![false; nn.len()];
    let mut trained = 0;
    for (v, &w) in map.iter().enumerate() {
        assert_eq!(on.get(v).unwrap(), nn.get(w as usize).unwrap());
        known[w as usize] = true;
        let (oe, ost) = row(&old, &old.meta.best.table, v as u64);
        let (ie, ist) = row(&init, "table-0.bin", w);
        assert_eq!(bits(&oe), bits(&ie), "embedding of node {v} -> {w}");
        assert_eq!(bits(&ost), bits(&ist), "optimizer state of node {v} -> {w}");
        trained += ost.iter().any(|&s| s > 0.0) as usize;
    }
    for w in (0..nn.len() as u64).filter(|&w| !known[w as usize]) {
        let (ie, ist) = row(&init, "table-0.bin", w);
        let (fe, fst) = row(&fresh, "table-0.bin", w);
        assert_eq!(
            bits(&ie),
            bits(&fe),
            "new node {w} starts as in a fresh run"
        );
        assert!(ist.iter().all(|&s| s == 0.0) && fst.iter().all(|&s| s == 0.0));
    }
    assert!(
        trained * 10 > map.len() * 9,
        "the carried state is trained state"
    );
    assert!(known.iter().any(|k| !k), "the new store has new nodes");
    // A resumed incremental run keeps its origin; another origin is a different run.
    let err = train(
        &new_store,
        &init_run,
        TrainConfig {
            init_from: Some(fresh_run.clone()),
            epochs: 2,
            ..config(4)
        },
        false,
        None,
        &NoProgress,
        &mut |_| {},
    )
    .unwrap_err();
    assert!(err.to_string().contains("embed.train.init_from"), "{err}");
}

#[test]
fn relations_and_their_inverses_carry_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let all = triples(60, 5, 600);
    // The old graph lacks relation r0, so every old relation moves down one id.
    let old_edges: Vec<_> = all.iter().copied().filter(|e| e.1 != 0).collect();
    let os = Store::open(&named_store(dir.path(), "old", &old_edges)).unwrap();
    let ns = Store::open(&named_store(dir.path(), "new", &all)).unwrap();
    let map = relation_map(&os, &ns).unwrap();
    assert_eq!(map, vec![1, 2, 3, 4]);
    let model = ScoreModel {
        kind: TrainConfig::default().model,
        dim: 8,
        transe_norm: 2,
        pbg: Default::default(),
    };
    let mut old = Relations::new(&model, 4, true, false, 1, RowInit::Normal(0.1));
    old.state
        .iter_mut()
        .enumerate()
        .for_each(|(i, s)| *s = i as f32);
    let mut new = Relations::new(&model, 5, true, false, 2, RowInit::Normal(0.1));
    let before = new.params.clone();
    remap_relations(&old, &mut new, &map);
    let d = new.dim;
    for (r, &to) in map.iter().enumerate() {
        for (from, to) in [(r, to as usize), (r + 4, to as usize + 5)] {
            assert_eq!(
                new.params[to * d..(to + 1) * d],
                old.params[from * d..(from + 1) * d]
            );
            assert_eq!(
                new.state[to * d..(to + 1) * d],
                old.state[from * d..(from + 1) * d]
            );
        }
    }
    for fresh in [0, 5] {
        assert_eq!(
            new.params[fresh * d..(fresh + 1) * d],
            before[fresh * d..(fresh + 1) * d]
        );
    }
}

#[test]
fn a_node_missing_from_the_new_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let all = triples(80, 3, 800);
    let os = Store::open(&named_store(dir.path(), "old", &all)).unwrap();
    let ns = Store::open(&named_store(dir.path(), "new", &all[..100])).unwrap();
    let err = node_map(&os, &ns).unwrap_err().to_string();
    assert!(
        err.contains("node(s) of the old run's store") && err.contains("'e"),
        "{err}"
    );
}

/// A table of `p`'s regions (its partitions and a typed run's pinned region) with random
/// embeddings and state.
fn random_table(path: &Path, p: &Partitioning, layout: &TableLayout, seed: u64) {
    let engine = Engine::shared();
    let f = TableFile::open(&engine, path, true).unwrap();
    let mut rng = Rng::new(seed);
    for q in p.regions() {
        let bytes = layout.region(q).part_bytes() as usize;
        let mut buf = AlignedBuf::new(bytes);
        let floats: &mut [f32] = bytemuck::cast_slice_mut(&mut buf.full_mut()[..bytes]);
        floats
            .iter_mut()
            .for_each(|x| *x = rng.below(1 << 20) as f32 / 7.0);
        f.write_partition(&engine, layout, q, &mut buf).unwrap();
    }
    f.sync().unwrap();
}

/// Node `v`'s embedding and state rows (of 8 reals) in the table `f` of `l` and `p`.
fn node_rows(f: &TableFile, l: &TableLayout, p: &Partitioning, v: u64) -> (Vec<f32>, Vec<f32>) {
    let engine = Engine::shared();
    let (q, i) = p.locator().locate(v);
    let (mut e, mut s) = (vec![0f32; 8], vec![0f32; 8]);
    f.read_rows(&engine, l, q, i as u64, &mut e).unwrap();
    f.read_state_rows(&engine, l, q, i as u64, &mut s).unwrap();
    (e, s)
}

#[test]
fn a_remap_carries_rows_into_and_out_of_a_pinned_region() {
    use crate::storage::entity_types::tests::ty;
    let dir = tempfile::tempdir().unwrap();
    let engine: Arc<Engine> = Engine::shared();
    // People and films partitioned; the genres held in memory (pinned) or partitioned too.
    let types = |genres_pinned: bool| {
        vec![
            ty("person", 0, 600, true),
            ty("genre", 600, 9, !genres_pinned),
            ty("film", 609, 300, true),
        ]
    };
    let pinned = Partitioning::typed(types(true), 3, 11).unwrap();
    let partitioned = Partitioning::typed(types(false), 4, 12).unwrap();
    assert!(pinned.pinned().is_some() && partitioned.pinned().is_none());
    let layout = |p: &Partitioning| TableLayout::new(p, 8, OptimizerKind::Adagrad, TableDtype::F32);
    let n = 909u64;
    let map: Vec<u64> = (0..n).collect();
    for (from, to) in [(&pinned, &partitioned), (&partitioned, &pinned)] {
        let (old_l, new_l) = (layout(from), layout(to));
        let (old_path, new_path) = (dir.path().join("old.bin"), dir.path().join("new.bin"));
        random_table(&old_path, from, &old_l, 1);
        random_table(&new_path, to, &new_l, 2);
        let old_f = TableFile::open(&engine, &old_path, false).unwrap();
        let new_f = TableFile::open(&engine, &new_path, false).unwrap();
        let side = |file, layout, partitioning| TableSide {
            file,
            layout,
            partitioning,
        };
        // A budget of one region at a time: a pass per region, the pinned one among them.
        let one = to
            .regions()
            .iter()
            .map(|&q| new_l.region(q).part_bytes())
            .max();
        let passes = remap_table(
            &engine,
            &side(&old_f, &old_l, from),
            &side(&new_f, &new_l, to),
            &map,
            one.unwrap() + from.part_size.min(1024) * 2 * 16 * 4,
            &NoProgress,
        )
        .unwrap();
        assert_eq!(passes, to.regions().len());
        for v in 0..n {
            assert_eq!(
                node_rows(&new_f, &new_l, to, v),
                node_rows(&old_f, &old_l, from, v),
                "node {v}"
            );
        }
    }
}

#[test]
fn the_streaming_remap_equals_the_in_memory_one() {
    let dir = tempfile::tempdir().unwrap();
    let (n_old, n_new) = (6000u64, 9000u64);
    let old_p = Partitioning::new(n_old, 4, 11).unwrap();
    let new_p = Partitioning::new(n_new, 7, 12).unwrap();
    let old_l = TableLayout::new(&old_p, 8, OptimizerKind::Adagrad, TableDtype::F32);
    let new_l = TableLayout::new(&new_p, 8, OptimizerKind::Adagrad, TableDtype::F32);
    // Old node v becomes new node (v * 7 + 3) mod n_new: an injection that scatters them.
    let map: Vec<u64> = (0..n_old).map(|v| (v * 7 + 3) % n_new).collect();
    let engine: Arc<Engine> = Engine::shared();
    let old_path = dir.path().join("old.bin");
    random_table(&old_path, &old_p, &old_l, 1);
    let old_f = TableFile::open(&engine, &old_path, false).unwrap();
    let mut outputs = Vec::new();
    for (name, budget) in [
        ("whole.bin", 1u64 << 30),
        // One new partition and the smallest chunk of old rows: a pass per new partition,
        // each reading the old partitions (1500 rows) in two chunks.
        ("streamed.bin", new_l.part_bytes() + 1024 * 2 * 16 * 4),
    ] {
        let path = dir.path().join(name);
        random_table(&path, &new_p, &new_l, 2);
        let f = TableFile::open(&engine, &path, false).unwrap();
        let passes = remap_table(
            &engine,
            &TableSide {
                file: &old_f,
                layout: &old_l,
                partitioning: &old_p,
            },
            &TableSide {
                file: &f,
                layout: &new_l,
                partitioning: &new_p,
            },
            &map,
            budget,
            &NoProgress,
        )
        .unwrap();
        outputs.push((passes, std::fs::read(&path).unwrap()));
    }
    assert_eq!(outputs[0].0, 1);
    assert_eq!(outputs[1].0, 7);
    assert!(outputs[0].1 == outputs[1].1, "the streamed remap differs");
    // Spot checks: carried rows equal the old ones; others keep the new table's values.
    let before = dir.path().join("before.bin");
    random_table(&before, &new_p, &new_l, 2);
    let before_f = TableFile::open(&engine, &before, false).unwrap();
    let after_f = TableFile::open(&engine, &dir.path().join("streamed.bin"), false).unwrap();
    let (ol, nl) = (old_p.locator(), new_p.locator());
    let read = |f: &TableFile, l: &TableLayout, (p, i): (u32, u32)| {
        let (mut e, mut s) = (vec![0f32; 8], vec![0f32; 8]);
        f.read_rows(&engine, l, p, i as u64, &mut e).unwrap();
        f.read_state_rows(&engine, l, p, i as u64, &mut s).unwrap();
        (e, s)
    };
    for v in (0..n_old).step_by(97) {
        let want = read(&old_f, &old_l, ol.locate(v));
        assert_eq!(read(&after_f, &new_l, nl.locate(map[v as usize])), want);
    }
    let carried: std::collections::HashSet<u64> = map.iter().copied().collect();
    for w in (0..n_new).filter(|w| !carried.contains(w)).step_by(31) {
        assert_eq!(
            read(&after_f, &new_l, nl.locate(w)),
            read(&before_f, &new_l, nl.locate(w))
        );
    }
    let err = remap_table(
        &engine,
        &TableSide {
            file: &old_f,
            layout: &old_l,
            partitioning: &old_p,
        },
        &TableSide {
            file: &after_f,
            layout: &new_l,
            partitioning: &new_p,
        },
        &map,
        new_l.part_bytes(),
        &NoProgress,
    )
    .unwrap_err();
    assert!(err.to_string().contains("raise --memory"), "{err}");
}

#[test]
fn a_remap_into_a_bf16_table_rounds_the_old_rows() {
    let dir = tempfile::tempdir().unwrap();
    let n = 3000u64;
    let old_p = Partitioning::new(n, 3, 11).unwrap();
    let new_p = Partitioning::new(n, 2, 12).unwrap();
    let old_l = TableLayout::new(&old_p, 8, OptimizerKind::AdagradRow, TableDtype::F32);
    let new_l = TableLayout::new(&new_p, 8, OptimizerKind::AdagradRow, TableDtype::Bf16);
    let map: Vec<u64> = (0..n).map(|v| (v * 7 + 3) % n).collect();
    let engine: Arc<Engine> = Engine::shared();
    let old_path = dir.path().join("old.bin");
    random_table(&old_path, &old_p, &old_l, 1);
    let old_f = TableFile::open(&engine, &old_path, false).unwrap();
    let path = dir.path().join("new.bin");
    let f = TableFile::open(&engine, &path, true).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .and_then(|x| x.set_len(new_p.partitions as u64 * new_l.part_bytes()))
        .unwrap();
    let side = |file, layout, partitioning| TableSide {
        file,
        layout,
        partitioning,
    };
    remap_table(
        &engine,
        &side(&old_f, &old_l, &old_p),
        &side(&f, &new_l, &new_p),
        &map,
        1 << 30,
        &NoProgress,
    )
    .unwrap();
    let (ol, nl) = (old_p.locator(), new_p.locator());
    for v in (0..n).step_by(41) {
        let ((op, oi), (np, ni)) = (ol.locate(v), nl.locate(map[v as usize]));
        let (mut old_row, mut new_row) = (vec![0f32; 8], vec![0f32; 8]);
        old_f
            .read_rows(&engine, &old_l, op, oi as u64, &mut old_row)
            .unwrap();
        f.read_rows(&engine, &new_l, np, ni as u64, &mut new_row)
            .unwrap();
        let rounded: Vec<f32> = old_row
            .iter()
            .map(|&x| bf16::to_f32(bf16::round(x)))
            .collect();
        assert_eq!(new_row, rounded, "node {v}");
        let (mut old_s, mut new_s) = (vec![0f32; 1], vec![0f32; 1]);
        old_f
            .read_state_rows(&engine, &old_l, op, oi as u64, &mut old_s)
            .unwrap();
        f.read_state_rows(&engine, &new_l, np, ni as u64, &mut new_s)
            .unwrap();
        assert_eq!(new_s[0], bf16::to_f32(bf16::round(old_s[0])), "node {v}");
    }
}
