//! Training, checkpoints, evaluation and export end to end on a small generated knowledge graph.

use std::path::{Path, PathBuf};

use crate::config::{ExportFormat, Protocol, TableDtype, TrainConfig, Which};
use crate::eval::{make_queries, read_triples};
use crate::model::{score_candidates, ScoreBatch, Scratch};
use crate::ordering::OrderingKind;
use crate::run::export::export_with;
use crate::run::loaded::Loaded;
use crate::train::job::train;
use strata_store::convert::{convert_text, TextJob};
use strata_store::{NoProgress, Store};

/// A store of a random graph with planted structure: `n` nodes, `r` relations, tails near
/// `head * (rel + 1)` so that a model can learn something.
pub(super) fn make_store(dir: &Path, n: u64, r: u64, edges: usize) -> PathBuf {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut lines = [String::new(), String::new(), String::new()];
    for i in 0..edges {
        let h = next() % n;
        let rel = next() % r;
        let t = (h * (rel + 1) + next() % 3) % n;
        lines[if i % 10 == 8 {
            1
        } else if i % 10 == 9 {
            2
        } else {
            0
        }]
        .push_str(&format!("{h}\t{rel}\t{t}\n"));
    }
    let names = ["train.txt", "valid.txt", "test.txt"];
    for (name, text) in names.iter().zip(&lines) {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let out = dir.join("g.strata");
    let job: TextJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 64u64 << 20, "io_chunk": 4096, "num_nodes": n, "num_relations": r},
        "text": {
            "inputs": names.iter().zip(["train", "valid", "test"]).map(|(f, s)| serde_json::json!({"path": dir.join(f), "split": s})).collect::<Vec<_>>(),
            "columns": ["src", "rel", "dst"], "delimiter": "auto", "comment": "#", "header": false,
            "ids": "int", "relation_ids": "int",
        }
    }))
    .unwrap();
    convert_text(&job, &NoProgress).unwrap();
    out
}

fn config(partitions: u32, buffer: usize, ordering: OrderingKind) -> TrainConfig {
    TrainConfig {
        dim: 16,
        chunk_size: 100,
        negatives: 50,
        epochs: 2,
        partitions,
        buffer,
        ordering,
        threads: 1,
        memory: strata_store::config::Size(256 << 20),
        ..TrainConfig::default()
    }
}

/// Trains (or resumes) `run` on `store` with `cfg`, no progress shown and no epoch callback.
fn quiet_train(
    store: &Path,
    run: &Path,
    cfg: TrainConfig,
) -> crate::error::Result<crate::run::run_dir::RunMeta> {
    train(store, run, cfg, false, None, &NoProgress, &mut |_| {})
}

fn table_bytes(run: &Path, which: Which) -> Vec<u8> {
    let r = crate::run::run_dir::Run::open(run).unwrap();
    std::fs::read(r.table_path(&r.checkpoint(which).table)).unwrap()
}

#[test]
fn one_thread_training_is_deterministic_and_resume_repeats_it() {
    for dtype in [TableDtype::F32, TableDtype::Bf16] {
        deterministic_and_resumable(dtype);
    }
}

#[test]
fn a_one_bucket_run_arranged_ahead_trains_as_a_run_resumed_each_epoch() {
    // One partition: each epoch after the first trains the kept copy of its edges, arranged
    // while the epoch before it ended. A run resumed at each epoch reads them afresh and
    // arranges them when it trains them: the same order, so the same bytes.
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path(), 300, 4, 6000);
    let cfg = TrainConfig {
        epochs: 3,
        ..config(1, 1, OrderingKind::Legend)
    };
    let (whole, resumed) = (dir.path().join("whole"), dir.path().join("resumed"));
    quiet_train(&store, &whole, cfg.clone()).unwrap();
    for epochs in 1..=3 {
        let cfg = TrainConfig {
            epochs,
            ..cfg.clone()
        };
        quiet_train(&store, &resumed, cfg).unwrap();
    }
    assert!(
        table_bytes(&whole, Which::Last) == table_bytes(&resumed, Which::Last),
        "the epochs arranged ahead differ from those arranged when trained"
    );
}

/// A bf16 table's stochastic rounding is drawn from the chunks' keys, so it is deterministic
/// and resumable too.
fn deterministic_and_resumable(table_dtype: TableDtype) {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path(), 300, 4, 6000);
    let cfg = TrainConfig {
        table_dtype,
        ..config(4, 3, OrderingKind::Legend)
    };
    let (a, b, c) = (
        dir.path().join("a"),
        dir.path().join("b"),
        dir.path().join("c"),
    );
    quiet_train(&store, &a, cfg.clone()).unwrap();
    quiet_train(&store, &b, cfg.clone()).unwrap();
    assert!(
        table_bytes(&a, Which::Last) == table_bytes(&b, Which::Last),
        "two runs differ"
    );
    // One epoch, then resume to two: the same bytes as two epochs in one go.
    let one = TrainConfig {
        epochs: 1,
        ..cfg.clone()
    };
    let meta = quiet_train(&store, &c, one).unwrap();
    assert_eq!(meta.current.epoch, 1);
    let meta = quiet_train(&store, &c, cfg.clone()).unwrap();
    assert_eq!(meta.current.epoch, 2);
    assert_eq!(meta.history.len(), 2);
    assert!(
        table_bytes(&a, Which::Last) == table_bytes(&c, Which::Last),
        "the resumed run differs"
    );
    // A different shape or dtype cannot resume the run.
    let err = quiet_train(
        &store,
        &c,
        TrainConfig {
            dim: 8,
            ..cfg.clone()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("embed.train.dim"), "{err}");
    let other = match table_dtype {
        TableDtype::F32 => TableDtype::Bf16,
        TableDtype::Bf16 => TableDtype::F32,
    };
    let err = quiet_train(
        &store,
        &c,
        TrainConfig {
            table_dtype: other,
            ..cfg
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("embed.train.table_dtype"), "{err}");
}

/// Filtered ranks from the partition scan equal a brute-force ranking over the exported
/// embeddings (which are in node-id order), for a partitioned table read through one slot,
/// stored in float32 or in bf16 (scanned and exported widened to float32).
#[test]
fn filtered_ranks_match_brute_force() {
    for dtype in [TableDtype::F32, TableDtype::Bf16] {
        ranks_match_brute_force(dtype);
    }
}

fn ranks_match_brute_force(table_dtype: TableDtype) {
    let dir = tempfile::tempdir().unwrap();
    let store_path = make_store(dir.path(), 200, 3, 3000);
    let run = dir.path().join("run");
    let cfg = TrainConfig {
        epochs: 1,
        eval_every: 0,
        table_dtype,
        ..config(5, 2, OrderingKind::Beta)
    };
    quiet_train(&store_path, &run, cfg).unwrap();
    let mut l = Loaded::open(&run, Which::Last, 0, 1, &NoProgress).unwrap();
    let got = l
        .evaluate("test", Some(Protocol::Filtered), 0, "cpu", &NoProgress)
        .unwrap();
    let out = dir.path().join("export");
    export_with(&mut l, &out, ExportFormat::Npy, false, None, &NoProgress).unwrap();
    let (_, bytes) = strata_store::array::read_all_bytes(&out.join("embeddings.npy")).unwrap();
    let emb: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let d = l.model.dim;
    if table_dtype == TableDtype::Bf16 {
        // Exported values are bf16 values widened: their low 16 bits are zero.
        assert!(emb.iter().all(|x| x.to_bits() & 0xffff == 0));
        assert!(emb.iter().any(|&x| x != 0.0));
    }
    let store = Store::open(&store_path).unwrap();
    let mut known = std::collections::HashSet::new();
    for split in ["train", "valid", "test"] {
        for t in read_triples(&store, split).unwrap() {
            known.insert(t);
        }
    }
    let queries = make_queries(&read_triples(&store, "test").unwrap(), l.cfg.corrupt, 0, 0);
    let n = l.run.meta.num_nodes as usize;
    let mut scratch = Scratch::default();
    let mut scores = vec![0.0f32; n];
    let mut rel = vec![0.0f32; l.model.rel_dim()];
    let mut sum_rr = 0.0;
    for q in &queries {
        l.relations.query_row(&l.model, q.rel, q.head, &mut rel);
        let src = &emb[q.src as usize * d..(q.src as usize + 1) * d];
        score_candidates(
            &l.model,
            &ScoreBatch {
                b: 1,
                n,
                src,
                rel: &rel,
                cands: &emb,
            },
            &mut scores,
            &mut scratch,
        );
        let truth = scores[q.answer as usize];
        let (mut greater, mut equal) = (0usize, 0usize);
        for (c, &s) in scores.iter().enumerate() {
            let triple = if q.head {
                [c as u64, q.rel as u64, q.src]
            } else {
                [q.src, q.rel as u64, c as u64]
            };
            if c as u64 == q.answer || known.contains(&triple) {
                continue;
            }
            greater += (s > truth) as usize;
            equal += (s == truth) as usize;
        }
        sum_rr += 1.0 / (1.0 + greater as f64 + equal as f64 / 2.0);
    }
    let want = sum_rr / queries.len() as f64;
    assert_eq!(got.queries as usize, queries.len());
    assert!(
        (got.mrr - want).abs() < 1e-6,
        "scan {} vs brute force {want}",
        got.mrr
    );
}

#[test]
fn out_of_core_training_learns_and_keeps_the_best_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path(), 400, 4, 12000);
    let run = dir.path().join("run");
    let cfg = TrainConfig {
        epochs: 4,
        threads: 2,
        ..config(6, 3, OrderingKind::Legend)
    };
    let mut seen = Vec::new();
    let meta = train(&store, &run, cfg, false, None, &NoProgress, &mut |r| {
        seen.push(r.report.epoch)
    })
    .unwrap();
    assert_eq!(seen, vec![1, 2, 3, 4]);
    let last = &meta.history[3];
    assert!(
        last.report.swaps > 0 && last.report.partition_loads > 3,
        "{last:?}"
    );
    let best = meta
        .history
        .iter()
        .filter_map(|h| h.valid.as_ref())
        .map(|m| m.mrr)
        .fold(0.0, f64::max);
    assert_eq!(meta.best_mrr, Some(best));
    let test = meta.test.expect("test metrics of the best checkpoint");
    // 400 candidates: random ranking gives an MRR near 0.017.
    assert!(test.mrr > 0.15, "{test:?}");
}

/// `write_behind` moves the table's write from the epoch's end to beside validation and
/// changes nothing that is written.
#[test]
fn a_table_written_behind_validation_equals_one_written_back_by_its_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path(), 300, 4, 6000);
    let cfg = config(1, 1, OrderingKind::Legend);
    let run = |name: &str, write_behind: bool, epochs: usize| {
        let out = dir.path().join(name);
        let c = TrainConfig {
            write_behind,
            epochs,
            ..cfg.clone()
        };
        let meta = quiet_train(&store, &out, c).unwrap();
        (out, meta)
    };
    let (behind, behind_meta) = run("behind", true, 2);
    let (back, back_meta) = run("back", false, 2);
    // Each epoch counts the table's bytes as written (the engine's counters are the
    // process's: other tests' writes may add to the epoch written back).
    let table = table_bytes(&behind, Which::Last).len() as u64;
    for (record, other) in behind_meta.history.iter().zip(&back_meta.history) {
        let w = record.report.written_behind.expect("written behind");
        // No relation between the two is asserted: they are timings (the job's wait for the
        // write can outlast the write's own seconds by a thread's wake-up).
        assert!(w.seconds > 0.0 && w.wait_seconds >= 0.0, "{w:?}");
        assert!(other.report.written_behind.is_none());
        assert!(record.report.partition_bytes_written >= table);
        assert!(other.report.partition_bytes_written >= table);
        let mrr = |r: &crate::run::run_dir::EpochRecord| r.valid.as_ref().map(|m| m.mrr);
        assert_eq!(mrr(record), mrr(other), "validation saw the same table");
    }
    assert_eq!(behind_meta.history.len(), 2);
    for which in [Which::Last, Which::Best] {
        assert!(
            table_bytes(&behind, which) == table_bytes(&back, which),
            "the tables differ"
        );
    }
    // Either resumes with the other setting: a third epoch on each gives the same table.
    let (behind, _) = run("behind", false, 3);
    let (back, _) = run("back", true, 3);
    assert!(table_bytes(&behind, Which::Last) == table_bytes(&back, Which::Last));
}
