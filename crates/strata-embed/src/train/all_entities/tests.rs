use super::*;
use crate::model::{
    Dropout, Loss, LossKind, PbgForm, RegScope, Regularizer, RegularizerKind, ScoreKind,
};
use crate::storage::shared::SharedRows;
use crate::train::worker::{PartRows, Pool};

#[test]
fn answers_list_each_querys_answers_in_order_and_count_distinct_queries() {
    let edges = [[1, 0, 5], [1, 0, 3], [2, 0, 3], [1, 1, 3], [1, 0, 3]];
    let a = Answers::new(&edges);
    let tails = |s, r| a.of(0, s, r).iter().map(|x| x[2]).collect::<Vec<_>>();
    assert_eq!(tails(1, 0), [3, 5]);
    assert_eq!(tails(1, 1), [3]);
    assert!(tails(0, 0).is_empty());
    let heads = |t, r| a.of(1, t, r).iter().map(|x| x[2]).collect::<Vec<_>>();
    assert_eq!(heads(3, 0), [1, 2]);
    // (1, 0), (1, 1), (2, 0) as tail queries; (3, 0), (3, 1), (5, 0) as head queries.
    assert_eq!((a.queries(0), a.queries(1)), (3, 3));
}

/// A table of `rows` nodes of `dim` reals and two relations with their inverses, trained by
/// one chunk through [`Worker::train_chunk`].
struct Table {
    params: Vec<f32>,
    state: Vec<f32>,
    rel: Vec<f32>,
    rel_state: Vec<f32>,
}

const ROWS: usize = 7;
const DIM: usize = 4;
const RELS: usize = 4;

fn complex() -> ScoreModel {
    ScoreModel {
        kind: ScoreKind::ComplEx,
        dim: DIM,
        transe_norm: 2,
        pbg: PbgForm::default(),
    }
}

impl Table {
    fn new() -> Table {
        let v = |len, seed| {
            let mut rng = strata_store::rng::Rng::new(seed);
            (0..len)
                .map(|_| rng.next_f64() as f32 - 0.5)
                .collect::<Vec<f32>>()
        };
        Table {
            params: v(ROWS * DIM, 1),
            state: vec![0.0; ROWS * DIM],
            rel: v(RELS * DIM, 2),
            rel_state: vec![0.0; RELS * DIM],
        }
    }

    /// Trains `chunk` once (chunk key 5) with `reg` and `dropout`; returns the worker's loss
    /// and queries.
    fn train(
        &mut self,
        v: &VsAll,
        corrupt: Corrupt,
        inverse: bool,
        lr: f32,
        reg: Regularizer,
        dropout: Dropout,
    ) -> (f64, u64) {
        let model = complex();
        let ctx = BucketCtx {
            model,
            loss: Loss::plain(LossKind::Softmax, 0.0),
            lr,
            parts: vec![PartRows {
                rows: SharedRows::new(&mut self.params, &mut self.state, DIM, DIM),
                size: ROWS as u32,
            }],
            src_part: 0,
            dst_part: 0,
            rels: Some(SharedRows::new(
                &mut self.rel,
                &mut self.rel_state,
                DIM,
                DIM,
            )),
            inverse_offset: if inverse { 2 } else { 0 },
            corrupt,
            head_prob: &[],
            negatives: 1,
            negatives_head: 1,
            shared_negatives: true,
            degree_fraction: 0.0,
            pool: Pool::Resident,
            reg,
            dropout,
            negs: None,
            feat: None,
            vs_all: Some(*v),
        };
        let mut w = Worker::default();
        w.train_chunk(&ctx, &CHUNK, &[], 5);
        (w.loss, w.edges)
    }
}

const CHUNK: [[i32; 3]; 4] = [[0, 0, 3], [2, 1, 3], [0, 0, 5], [6, 1, 0]];

/// With an Adagrad state so large that a step is `−g` exactly (state `1e8` absorbs `g²`,
/// `lr = 1e4` cancels `√state`), one chunk moves every node and relation row by minus the
/// gradient of the chunk's loss: checked against central finite differences of that loss,
/// for 1vsAll and KvsAll, with reciprocal or reversed relations, both sides or one, plain or
/// with dropout and weighted N3 (the masks are the chunk key's, the same at every point).
#[test]
fn a_chunk_steps_every_row_by_its_summed_gradient() {
    let plain = (
        Regularizer {
            kind: RegularizerKind::N3,
            weight: 0.3,
            ..Regularizer::default()
        },
        Dropout::default(),
    );
    let recipe = (
        Regularizer {
            kind: RegularizerKind::N3,
            weight: 0.3,
            rel_weight: Some(0.2),
            weighted: true,
            ..Regularizer::default()
        },
        Dropout {
            entity: 0.3,
            relation: 0.2,
            ..Dropout::default()
        },
    );
    // LibKGE's unweighted L2 over the whole table (its WN18RR recipes), with dropout.
    let table = (
        Regularizer {
            kind: RegularizerKind::L2,
            weight: 0.05,
            rel_weight: Some(0.1),
            scope: RegScope::Table,
            ..Regularizer::default()
        },
        Dropout {
            entity: 0.3,
            relation: 0.2,
            ..Dropout::default()
        },
    );
    for (reg, dropout) in [plain, recipe, table] {
        steps_match_finite_differences(reg, dropout);
    }
}

/// Table scope: one term per chunk of `w · B / 2 · Σ x²` over every entity row of the table
/// (LibKGE's unweighted L2 beside a loss averaged over a batch of `B`), whether the chunk's
/// edges reference a row or not, and none of the per-side entity terms; relation rows keep the
/// chunk's scope (here weighed 0).
#[test]
fn table_scope_penalises_every_entity_row_once_per_chunk() {
    let query = complex().product_query().unwrap();
    let v = VsAll {
        label_smoothing: 0.0,
        query,
        answers: None,
    };
    let w = 0.07;
    let table = Regularizer {
        kind: RegularizerKind::L2,
        weight: w,
        rel_weight: Some(0.0),
        scope: RegScope::Table,
        ..Regularizer::default()
    };
    let t = Table::new();
    let squares: f64 = t.params.iter().map(|&x| (x as f64) * (x as f64)).sum();
    for corrupt in [Corrupt::Both, Corrupt::Tail] {
        let loss = |reg| {
            Table::new()
                .train(&v, corrupt, true, 0.0, reg, Dropout::default())
                .0
        };
        let term = loss(table) - loss(Regularizer::default());
        let want = w as f64 * CHUNK.len() as f64 / 2.0 * squares;
        assert!(
            (term - want).abs() <= 1e-5 * want,
            "{corrupt:?}: {term} vs {want}"
        );
    }
}

fn steps_match_finite_differences(reg: Regularizer, dropout: Dropout) {
    let answers = Answers::new(&[[0, 0, 3], [0, 0, 5], [2, 1, 3], [6, 1, 0], [2, 0, 4]]);
    let query = complex().product_query().unwrap();
    let one = VsAll {
        label_smoothing: 0.0,
        query,
        answers: None,
    };
    let kvs = VsAll {
        label_smoothing: 0.1,
        query,
        answers: Some(&answers),
    };
    for (name, v) in [("1vsAll", one), ("KvsAll", kvs)] {
        for (corrupt, inverse) in [
            (Corrupt::Both, true),
            (Corrupt::Both, false),
            (Corrupt::Tail, true),
        ] {
            let what = format!("{name} {corrupt:?} reciprocal {inverse} {reg:?} {dropout:?}");
            let start = Table::new();
            let mut stepped = Table::new();
            stepped.state.fill(1e8);
            stepped.rel_state.fill(1e8);
            let (_, queries) = stepped.train(&v, corrupt, inverse, 1e4, reg, dropout);
            let expected = match (name, corrupt) {
                ("1vsAll", Corrupt::Both) => 8,
                ("1vsAll", _) => 4,
                // Tail queries (0,0) (asked by [0,0,3] only), (2,1), (6,1); head queries
                // (3,0), (3,1), (5,0), (0,1).
                (_, Corrupt::Both) => 7,
                _ => 3,
            };
            assert_eq!(queries, expected, "{what}");
            let loss_at = |params: &[f32], rel: &[f32]| {
                let mut t = Table::new();
                t.params.copy_from_slice(params);
                t.rel.copy_from_slice(rel);
                // lr 0: the loss of the chunk at these rows, nothing moved.
                t.train(&v, corrupt, inverse, 0.0, reg, dropout).0
            };
            let h = 1e-3f32;
            let check = |which: &str, i: usize, numeric: f64, moved: f32| {
                let got = -moved as f64;
                let tol = 2e-2 * numeric.abs().max(got.abs()).max(0.02);
                assert!(
                    (numeric - got).abs() <= tol,
                    "{what}: {which} {i}: numeric {numeric} vs step {got}"
                );
            };
            for i in 0..start.params.len() {
                let (mut up, mut down) = (start.params.clone(), start.params.clone());
                up[i] += h;
                down[i] -= h;
                let numeric =
                    (loss_at(&up, &start.rel) - loss_at(&down, &start.rel)) / (2.0 * h as f64);
                check(
                    "node element",
                    i,
                    numeric,
                    stepped.params[i] - start.params[i],
                );
            }
            for i in 0..start.rel.len() {
                let (mut up, mut down) = (start.rel.clone(), start.rel.clone());
                up[i] += h;
                down[i] -= h;
                let numeric = (loss_at(&start.params, &up) - loss_at(&start.params, &down))
                    / (2.0 * h as f64);
                check(
                    "relation element",
                    i,
                    numeric,
                    stepped.rel[i] - start.rel[i],
                );
            }
        }
    }
}

/// `Σ_k |x_k|³` of a ComplEx row (moduli of its complex coordinates).
fn n3(row: &[f32]) -> f64 {
    let h = row.len() / 2;
    (0..h)
        .map(|k| (row[k] as f64).hypot(row[h + k] as f64).powi(3))
        .sum()
}

/// Weighted N3 (LibKGE's weighted lp, p = 3) in a 1vsAll chunk of both sides: each edge's
/// head and tail once, its relation row once per side that trains it (`r`, and `r⁻¹` with
/// reciprocal relations), divided by 3; in KvsAll each query's source and relation once per
/// query. The term is the chunk's loss with it minus the loss without (lr 0: nothing moves).
#[test]
fn weighted_n3_penalises_each_row_once_per_edge_or_query() {
    let answers = Answers::new(&[[0, 0, 3], [0, 0, 5], [2, 1, 3], [6, 1, 0], [2, 0, 4]]);
    let query = complex().product_query().unwrap();
    let (w, rw) = (0.3, 0.2);
    let weighted = Regularizer {
        kind: RegularizerKind::N3,
        weight: w,
        rel_weight: Some(rw),
        weighted: true,
        ..Regularizer::default()
    };
    let t = Table::new();
    let node = |i: i32| n3(&t.params[i as usize * DIM..(i as usize + 1) * DIM]);
    let rel = |r: i32| n3(&t.rel[r as usize * DIM..(r as usize + 1) * DIM]);
    for (answers, inverse) in [(None, true), (None, false), (Some(&answers), true)] {
        let v = VsAll {
            label_smoothing: 0.0,
            query,
            answers,
        };
        let term = |reg| {
            let loss = |reg| {
                Table::new()
                    .train(&v, Corrupt::Both, inverse, 0.0, reg, Dropout::default())
                    .0
            };
            loss(reg) - loss(Regularizer::default())
        };
        let (nodes, rels) = match answers {
            None => (
                CHUNK.iter().map(|e| node(e[0]) + node(e[2])).sum::<f64>(),
                CHUNK
                    .iter()
                    .map(|e| rel(e[1]) + if inverse { rel(e[1] + 2) } else { 0.0 })
                    .sum::<f64>(),
            ),
            // The chunk's queries: tails of (0,0), (2,1), (6,1); heads of (3,0), (3,1),
            // (5,0), (0,1) through the inverse rows.
            Some(_) => (
                [0, 2, 6, 3, 3, 5, 0].into_iter().map(node).sum::<f64>(),
                [0, 1, 1, 2, 3, 2, 3].into_iter().map(rel).sum::<f64>(),
            ),
        };
        let expected = (w as f64 * nodes + rw as f64 * rels) / 3.0;
        let got = term(weighted);
        assert!(
            (got - expected).abs() <= 1e-4 * expected,
            "KvsAll {} reciprocal {inverse}: {got} vs {expected}",
            answers.is_some()
        );
    }
}

/// Dropout changes what a chunk scores (its loss), draws its masks from the chunk's key (the
/// same chunk trains to the same rows twice), and at rates 0 trains exactly as without it.
#[test]
fn dropout_is_drawn_from_the_chunk_and_off_at_rate_zero() {
    let query = complex().product_query().unwrap();
    let v = VsAll {
        label_smoothing: 0.0,
        query,
        answers: None,
    };
    let run = |dropout| {
        let mut t = Table::new();
        let (loss, _) = t.train(
            &v,
            Corrupt::Both,
            true,
            0.1,
            Regularizer::default(),
            dropout,
        );
        (loss, t.params, t.rel)
    };
    let on = Dropout {
        entity: 0.5,
        relation: 0.5,
        ..Dropout::default()
    };
    let (a, b) = (run(on), run(on));
    assert_eq!((a.0, &a.1, &a.2), (b.0, &b.1, &b.2));
    let plain = run(Dropout::default());
    assert_ne!(a.0, plain.0, "dropout changes the scores");
    let zero = run(Dropout {
        entity: 0.0,
        relation: 0.0,
        ..Dropout::default()
    });
    assert_eq!((zero.0, &zero.1, &zero.2), (plain.0, &plain.1, &plain.2));
}
