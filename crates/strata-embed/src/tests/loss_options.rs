//! Edge weights from the store through the bucket index into training, and the Bernoulli
//! counts of distinct heads and tails, on small generated stores.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::{Corrupt, TrainConfig, Which};
use crate::run::run_dir::Run;
use crate::storage::entity_types::EntityType;
use crate::storage::partitioning::{buckets, Partitioning};
use crate::train::bernoulli::count_sides;
use crate::train::job::train;
use strata_io::Engine;
use strata_store::array::read_all_bytes;
use strata_store::convert::{convert_text, TextJob};
use strata_store::{NoProgress, Store};

const NODES: u64 = 200;

/// The edges of the test graph `(head, relation, tail)`: relation 0 one-to-many (10 heads),
/// relation 1 many-to-one (10 tails), relation 2 uniform.
fn edges(count: usize) -> Vec<[u64; 3]> {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    (0..count)
        .map(|i| {
            let rel = i as u64 % 3;
            let (a, b) = (next() % NODES, next() % NODES);
            match rel {
                0 => [a % 10, 0, b],
                1 => [a, 1, b % 10],
                _ => [a, 2, b],
            }
        })
        .collect()
}

/// A store of `edges` (all train, but every tenth in valid and test), with `weight(i)` as the
/// weight of edge `i` when given.
fn make_store(
    dir: &Path,
    name: &str,
    edges: &[[u64; 3]],
    weight: Option<&dyn Fn(usize) -> f32>,
) -> PathBuf {
    let mut lines = [String::new(), String::new(), String::new()];
    for (i, [h, r, t]) in edges.iter().enumerate() {
        let split = match i % 20 {
            18 => 1,
            19 => 2,
            _ => 0,
        };
        let w = weight.map(|f| format!("\t{}", f(i))).unwrap_or_default();
        lines[split].push_str(&format!("{h}\t{r}\t{t}{w}\n"));
    }
    let files = ["train.txt", "valid.txt", "test.txt"].map(|f| dir.join(format!("{name}-{f}")));
    for (path, text) in files.iter().zip(&lines) {
        std::fs::write(path, text).unwrap();
    }
    let out = dir.join(format!("{name}.strata"));
    let mut columns = vec!["src", "rel", "dst"];
    if weight.is_some() {
        columns.push("weight");
    }
    let job: TextJob = serde_json::from_value(serde_json::json!({
        "graph": {"out": out, "memory": 64u64 << 20, "io_chunk": 4096, "num_nodes": NODES, "num_relations": 3},
        "text": {
            "inputs": files.iter().zip(["train", "valid", "test"]).map(|(f, s)| serde_json::json!({"path": f, "split": s})).collect::<Vec<_>>(),
            "columns": columns, "delimiter": "auto", "comment": "#", "header": false,
            "ids": "int", "relation_ids": "int",
        }
    }))
    .unwrap();
    convert_text(&job, &NoProgress).unwrap();
    out
}

fn array<T: bytemuck::Pod>(path: &Path) -> Vec<T> {
    bytemuck::cast_slice(&read_all_bytes(path).unwrap().1).to_vec()
}

#[test]
fn weights_are_bucketed_with_their_edges() {
    let dir = tempfile::tempdir().unwrap();
    let all = edges(3000);
    let weight = |i: usize| (i % 7) as f32 * 0.5;
    let store = Store::open(&make_store(dir.path(), "w", &all, Some(&weight))).unwrap();
    let partitioning = Partitioning::new(NODES, 3, 5).unwrap();
    // A budget of a few thousand edges: several bucketing passes.
    let b = buckets(&store, &partitioning, 40 << 10, &NoProgress).unwrap();
    let summary = b.weights.as_ref().expect("the store has weights");
    assert_eq!(
        (summary.min, summary.max, summary.first_bad.clone()),
        (0.0, 3.0, None)
    );
    let rows: Vec<[i32; 3]> = array(&b.edges_path());
    let weights: Vec<f32> = array(&b.weights_path());
    assert_eq!(rows.len(), weights.len());
    let locator = partitioning.locator();
    let mut got = Vec::new();
    for a in 0..3 {
        for c in 0..3 {
            for i in b.range(a, c) {
                let [s, r, t] = rows[i as usize];
                let (h, t) = (locator.node(a, s as u32), locator.node(c, t as u32));
                got.push((h, r as u64, t, weights[i as usize].to_bits()));
            }
        }
    }
    let mut want: Vec<(u64, u64, u64, u32)> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 20 < 18)
        .map(|(i, e)| (e[0], e[1], e[2], weight(i).to_bits()))
        .collect();
    got.sort_unstable();
    want.sort_unstable();
    assert_eq!(got, want);
    assert!(
        (summary.sum - want.iter().map(|w| f32::from_bits(w.3) as f64).sum::<f64>()).abs() < 1e-6
    );
}

/// Distinct heads (`side` 0) or tails (`side` 2) of each of the 3 relations among the train
/// edges of `all` (as [`make_store`] splits them).
fn distinct_ends(all: &[[u64; 3]], side: usize) -> Vec<u64> {
    (0..3)
        .map(|rel| {
            let nodes: HashSet<u64> = all
                .iter()
                .enumerate()
                .filter(|(i, e)| i % 20 < 18 && e[1] == rel)
                .map(|(_, e)| e[side])
                .collect();
            nodes.len() as u64
        })
        .collect()
}

#[test]
fn bernoulli_counts_match_a_brute_force_count_at_any_budget() {
    let dir = tempfile::tempdir().unwrap();
    let all = edges(3000);
    let store = Store::open(&make_store(dir.path(), "b", &all, None)).unwrap();
    let (want_heads, want_tails) = (distinct_ends(&all, 0), distinct_ends(&all, 2));
    assert_eq!(want_heads[0], 10);
    assert_eq!(want_tails[1], 10);
    let partitioning = Partitioning::new(NODES, 3, 5).unwrap();
    let b = Arc::new(buckets(&store, &partitioning, 1 << 20, &NoProgress).unwrap());
    let engine = Engine::shared();
    let piece_rows = 100;
    // Roomy: one pass per partition. Tight: bitsets of 64 ids, two ranges per partition of 67.
    for (budget, passes) in [(1u64 << 20, 3), (4 * piece_rows * 12 + 48, 6)] {
        let counts = count_sides(&engine, &b, 3, None, budget, piece_rows, &NoProgress).unwrap();
        assert_eq!(counts.heads, want_heads, "budget {budget}");
        assert_eq!(counts.tails, want_tails, "budget {budget}");
        assert_eq!(counts.passes, passes, "budget {budget}");
        let p = counts.head_probabilities();
        // One-to-many relation 0: heads corrupted far more often; many-to-one 1: tails.
        assert!(p[0] > 0.9 && p[1] < 0.1, "{p:?}");
        let t = want_tails[2] as f32;
        assert!((p[2] - t / (want_heads[2] as f32 + t)).abs() < 1e-6);
    }
}

#[test]
fn bernoulli_counts_a_typed_runs_pinned_region_as_its_own_nodes() {
    // Type a (nodes 0..150) in 3 partitions, type b (150..200) held in memory: relation 0
    // joins a to a, 1 a to b, 2 b to b, so b's ends lie in the diagonal buckets.
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let all: Vec<[u64; 3]> = (0..3000)
        .map(|i| match i % 3 {
            0 => [next() % 150, 0, next() % 150],
            1 => [next() % 10, 1, 150 + next() % 50],
            _ => [150 + next() % 50, 2, 150 + next() % 7],
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(&make_store(dir.path(), "typed", &all, None)).unwrap();
    let types = vec![
        EntityType {
            name: "a".into(),
            first: 0,
            count: 150,
            partitioned: true,
            features: None,
        },
        EntityType {
            name: "b".into(),
            first: 150,
            count: 50,
            partitioned: false,
            features: None,
        },
    ];
    let partitioning = Partitioning::typed(types, 3, 5).unwrap();
    assert_eq!(partitioning.pinned(), Some(3));
    let b = Arc::new(buckets(&store, &partitioning, 1 << 20, &NoProgress).unwrap());
    let ends = [(false, false), (false, true), (true, true)];
    let counts = count_sides(
        &Engine::shared(),
        &b,
        3,
        Some(&ends[..]),
        1 << 20,
        100,
        &NoProgress,
    )
    .unwrap();
    assert_eq!(counts.heads, distinct_ends(&all, 0));
    assert_eq!(counts.tails, distinct_ends(&all, 2));
    assert_eq!((counts.tails[2], counts.passes), (7, 4));
}

fn config() -> TrainConfig {
    TrainConfig {
        dim: 16,
        chunk_size: 100,
        negatives: 32,
        epochs: 2,
        partitions: 3,
        buffer: 3,
        threads: 1,
        memory: strata_store::config::Size(256 << 20),
        ..TrainConfig::default()
    }
}

fn trained_table(store: &Path, run: &Path, cfg: TrainConfig) -> Vec<u8> {
    train(store, run, cfg, false, None, &NoProgress, &mut |_| {}).unwrap();
    let r = Run::open(run).unwrap();
    std::fs::read(r.table_path(&r.checkpoint(Which::Last).table)).unwrap()
}

#[test]
fn unit_weights_and_ignored_weights_train_as_no_weights() {
    let dir = tempfile::tempdir().unwrap();
    let all = edges(3000);
    let plain = make_store(dir.path(), "plain", &all, None);
    let ones = make_store(dir.path(), "ones", &all, Some(&|_| 1.0));
    let varied = make_store(dir.path(), "varied", &all, Some(&|i| (i % 3) as f32));
    let run = |store: &Path, name: &str, cfg: TrainConfig| {
        trained_table(store, &dir.path().join(name), cfg)
    };
    let base = run(&plain, "plain", config());
    assert!(
        base == run(&ones, "ones", config()),
        "weights of 1 changed training"
    );
    let ignored = TrainConfig {
        edge_weights: false,
        ..config()
    };
    assert!(
        base == run(&varied, "ignored", ignored),
        "ignored weights changed training"
    );
    assert!(
        base != run(&varied, "varied", config()),
        "weights changed nothing"
    );
    // Bernoulli corruption trains (and differs from both sides corrupted).
    let bern = TrainConfig {
        corrupt: Corrupt::Bernoulli,
        ..config()
    };
    assert!(base != run(&plain, "bern", bern));
}

#[test]
fn negative_or_nan_weights_are_refused_unless_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let all = edges(600);
    let store = make_store(
        dir.path(),
        "neg",
        &all,
        Some(&|i| if i == 41 { -2.0 } else { 1.0 }),
    );
    let err = train(
        &store,
        &dir.path().join("r"),
        config(),
        false,
        None,
        &NoProgress,
        &mut |_| {},
    )
    .unwrap_err()
    .to_string();
    // Edge 41 is train row 37 (edges 18 and 19 of every 20 went to valid and test).
    assert!(
        err.contains("edge_weights_train row 37: weight -2")
            && err.contains("edge_weights = false"),
        "{err}"
    );
    assert!(!dir.path().join("r").join("run.json").exists());
    let ignored = TrainConfig {
        edge_weights: false,
        ..config()
    };
    train(
        &store,
        &dir.path().join("r"),
        ignored,
        false,
        None,
        &NoProgress,
        &mut |_| {},
    )
    .unwrap();
}

#[test]
fn uniform_init_starts_relation_rows_between_its_bounds_and_bad_bounds_are_refused() {
    use crate::config::{InitKind, RowInit};
    use crate::model::ScoreKind;
    use crate::model::ScoreModel;
    use crate::storage::relations::Relations;

    let cfg = TrainConfig {
        model: ScoreKind::ComplEx,
        dim: 8,
        init: InitKind::Uniform,
        init_low: Some(-0.8328),
        ..TrainConfig::default()
    };
    let init = cfg.row_init();
    assert_eq!(
        init,
        RowInit::Uniform {
            low: -0.8328,
            high: 1.0
        }
    );
    let model = ScoreModel {
        kind: ScoreKind::ComplEx,
        dim: 8,
        transe_norm: 2,
        pbg: Default::default(),
    };
    let rel = Relations::new(&model, 50, true, false, 3, init);
    // Every real of every row (the inverse rows too), not unit complex numbers.
    assert_eq!(rel.params.len(), 100 * 8);
    assert!(rel.params.iter().all(|&v| (-0.8328..=1.0).contains(&v)));
    assert!(rel.params.iter().any(|&v| v < -0.5) && rel.params.iter().any(|&v| v > 0.8));
    // The default start is unchanged: unit complex numbers.
    let normal = Relations::new(&model, 50, true, false, 3, RowInit::Normal(1e-3));
    for c in normal.params.chunks(8) {
        for k in 0..4 {
            assert!(((c[k] * c[k] + c[k + 4] * c[k + 4]) - 1.0).abs() < 1e-5);
        }
    }
    let key = super::refused_key;
    assert_eq!(key(cfg.clone()), None);
    let swapped = TrainConfig {
        init_low: Some(1.0),
        init_high: Some(-1.0),
        ..cfg.clone()
    };
    assert_eq!(key(swapped).as_deref(), Some("embed.train.init_low"));
    let bounds_without_uniform = TrainConfig {
        init_high: Some(0.5),
        ..TrainConfig::default()
    };
    assert_eq!(
        key(bounds_without_uniform).as_deref(),
        Some("embed.train.init_high")
    );
}

#[test]
fn xavier_init_scales_each_table_by_its_rows_and_reals_as_torch_does() {
    use crate::config::{InitKind, RealDraw, RowInit};
    use crate::model::{ScoreKind, ScoreModel};
    use crate::storage::relations::Relations;

    // torch.nn.init.xavier_normal_ on a 40,943 x 512 weight: std sqrt(2 / 41,455).
    let normal = TrainConfig {
        init: InitKind::XavierNormal,
        ..TrainConfig::default()
    };
    assert_eq!(
        normal.row_init(),
        RowInit::Xavier {
            gain: 1.0,
            uniform: false
        }
    );
    let RealDraw::Normal(std) = normal.row_init().reals(40_943, 512) else {
        panic!("xavier_normal draws normals");
    };
    assert!((std - (2.0f32 / 41_455.0).sqrt()).abs() < 1e-9, "{std}");
    // xavier_uniform_ with gain 2 on 100 x 20: bound 2 sqrt(6 / 120).
    let uniform = TrainConfig {
        init: InitKind::XavierUniform,
        init_gain: Some(2.0),
        ..TrainConfig::default()
    };
    let RealDraw::Uniform { low, high } = uniform.row_init().reals(100, 20) else {
        panic!("xavier_uniform draws uniform reals");
    };
    assert!(
        (high - 2.0 * 0.05f32.sqrt()).abs() < 1e-6 && low == -high,
        "{low} {high}"
    );

    // Relation rows: every real of the table, inverse rows counted (TransE: 2 x 11 rows of 64
    // reals, std sqrt(2 / 86)), not the model's own start.
    let model = ScoreModel {
        kind: ScoreKind::TransE,
        dim: 64,
        transe_norm: 2,
        pbg: Default::default(),
    };
    let rel = Relations::new(&model, 11, true, false, 3, normal.row_init());
    let n = rel.params.len() as f64;
    assert_eq!(n, 22.0 * 64.0);
    let mean = rel.params.iter().map(|&v| v as f64).sum::<f64>() / n;
    let sd = (rel
        .params
        .iter()
        .map(|&v| (v as f64 - mean).powi(2))
        .sum::<f64>()
        / n)
        .sqrt();
    let want = (2.0f64 / 86.0).sqrt();
    // 1,408 normals: the sample deviation is within 6% of its own at 3 standard errors.
    assert!(mean.abs() < 3.0 * want / n.sqrt(), "{mean}");
    assert!((sd / want - 1.0).abs() < 0.06, "{sd} against {want}");

    let key = super::refused_key;
    assert_eq!(key(normal.clone()), None);
    assert_eq!(key(uniform), None);
    let gain_without_xavier = TrainConfig {
        init_gain: Some(1.0),
        ..TrainConfig::default()
    };
    assert_eq!(
        key(gain_without_xavier).as_deref(),
        Some("embed.train.init_gain")
    );
    let zero_gain = TrainConfig {
        init_gain: Some(0.0),
        ..normal.clone()
    };
    assert_eq!(key(zero_gain).as_deref(), Some("embed.train.init_gain"));
    let bounds_with_xavier = TrainConfig {
        init_low: Some(-0.1),
        ..normal
    };
    assert_eq!(
        key(bounds_with_xavier).as_deref(),
        Some("embed.train.init_low")
    );
}

#[test]
fn negatives_head_counts_the_head_side_and_is_refused_where_no_head_is_corrupted() {
    use crate::config::{Corrupt, TrainingMode};

    let cfg = TrainConfig {
        negatives: 402,
        negatives_head: Some(255),
        ..TrainConfig::default()
    };
    assert_eq!(
        (cfg.negatives_of(true), cfg.negatives_of(false)),
        (402, 255)
    );
    assert_eq!(
        TrainConfig::default().negatives_of(false),
        TrainConfig::default().negatives
    );
    // The budget's scratch holds the larger side.
    let wider_head = TrainConfig {
        negatives_head: Some(1500),
        ..cfg.clone()
    };
    assert_eq!(wider_head.scored_per_chunk(0), 1500);
    let key = super::refused_key;
    assert_eq!(key(cfg.clone()), None);
    let tail_only = TrainConfig {
        corrupt: Corrupt::Tail,
        reciprocal: false,
        ..cfg.clone()
    };
    assert_eq!(
        key(tail_only).as_deref(),
        Some("embed.train.negatives_head")
    );
    let kvsall = TrainConfig {
        training: TrainingMode::KvsAll,
        ..cfg
    };
    assert_eq!(key(kvsall).as_deref(), Some("embed.train.negatives_head"));
}
