use super::*;
use crate::model::{Loss, LossKind, PbgForm, Regularizer, RegularizerKind, ScoreKind};
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

    /// Trains `chunk` once; returns the worker's loss and queries.
    fn train(&mut self, v: &VsAll, corrupt: Corrupt, inverse: bool, lr: f32) -> (f64, u64) {
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
            degree_fraction: 0.0,
            pool: Pool::Resident,
            reg: Regularizer {
                kind: RegularizerKind::N3,
                weight: 0.3,
                ..Regularizer::default()
            },
            dropout: Default::default(),
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
/// for 1vsAll and KvsAll, with reciprocal or reversed relations, both sides or one.
#[test]
fn a_chunk_steps_every_row_by_its_summed_gradient() {
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
            let what = format!("{name} {corrupt:?} reciprocal {inverse}");
            let start = Table::new();
            let mut stepped = Table::new();
            stepped.state.fill(1e8);
            stepped.rel_state.fill(1e8);
            let (_, queries) = stepped.train(&v, corrupt, inverse, 1e4);
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
                t.train(&v, corrupt, inverse, 0.0).0
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
