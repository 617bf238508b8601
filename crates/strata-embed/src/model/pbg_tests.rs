//! `pbg` models: every operator x comparator against hand computations, finite differences and
//! the reversed relation rows; the config's refusals.

use super::tests::{check_model, rand_vec};
use super::*;
use crate::config::TrainConfig;
use crate::tests::refused_key;

const OPERATORS: [Operator; 6] = [
    Operator::None,
    Operator::Translation,
    Operator::Diagonal,
    Operator::Linear,
    Operator::Affine,
    Operator::ComplexDiagonal,
];

const COMPARATORS: [Comparator; 4] = [
    Comparator::Dot,
    Comparator::Cos,
    Comparator::L2,
    Comparator::SquaredL2,
];

fn pbg(operator: Operator, comparator: Comparator, dim: usize) -> ScoreModel {
    ScoreModel {
        kind: ScoreKind::Pbg,
        dim,
        transe_norm: 2,
        pbg: PbgForm {
            operator,
            comparator,
        },
    }
}

/// The training step's positive score and the candidate scorer's score of `(s, r, t)`.
fn both_scores(model: &ScoreModel, s: &[f32], r: &[f32], t: &[f32]) -> (f32, f32) {
    let mut out = [0.0f32];
    let mut scratch = Scratch::default();
    score_candidates(
        model,
        &ScoreBatch {
            b: 1,
            n: 1,
            src: s,
            rel: r,
            cands: t,
        },
        &mut out,
        &mut scratch,
    );
    let c = Chunk {
        b: 1,
        n: 1,
        src: s,
        rel: r,
        dst: t,
        neg: t,
        weights: &[],
        pos_query: None,
    };
    let loss = Loss::plain(LossKind::Softmax, 0.0);
    chunk_step(model, &loss, &c, &mut Grads::default(), &mut scratch);
    (scratch.pos[0], out[0])
}

#[test]
fn every_operator_and_comparator_scores_as_computed_by_hand() {
    // s = (1, 2), t = (0.5, -1). Each operator's row and its a = op(s):
    let cases: [(Operator, &[f32], [f32; 4]); 6] = [
        // a = (1, 2): a·t = -1.5, ‖a‖‖t‖ = √5 √1.25 = 2.5, a − t = (0.5, 3).
        (Operator::None, &[], [-1.5, -0.6, -(9.25f32).sqrt(), -9.25]),
        // r = (0.5, 1), a = (1.5, 3): a·t = -2.25, ‖a‖‖t‖ = 3.75, a − t = (1, 4).
        (
            Operator::Translation,
            &[0.5, 1.0],
            [-2.25, -0.6, -(17.0f32).sqrt(), -17.0],
        ),
        // r = (2, -1), a = (2, -2): a·t = 3, ‖a‖‖t‖ = √10, a − t = (1.5, -1).
        (
            Operator::Diagonal,
            &[2.0, -1.0],
            [3.0, 3.0 / 10f32.sqrt(), -(3.25f32).sqrt(), -3.25],
        ),
        // M = [[0, 1], [2, 0]], a = (2, 2): a·t = -1, ‖a‖‖t‖ = √10, a − t = (1.5, 3).
        (
            Operator::Linear,
            &[0.0, 1.0, 2.0, 0.0],
            [-1.0, -1.0 / 10f32.sqrt(), -(11.25f32).sqrt(), -11.25],
        ),
        // The same M and v = (1, -1), a = (3, 1): a·t = 0.5, ‖a‖‖t‖ = √12.5, a − t = (2.5, 2).
        (
            Operator::Affine,
            &[0.0, 1.0, 2.0, 0.0, 1.0, -1.0],
            [0.5, 0.5 / 12.5f32.sqrt(), -(10.25f32).sqrt(), -10.25],
        ),
        // s = 1 + 2i, r = 3 - i, a = 5 + 5i: a·t = -2.5, ‖a‖‖t‖ = √62.5, a − t = (4.5, 6).
        (
            Operator::ComplexDiagonal,
            &[3.0, -1.0],
            [-2.5, -2.5 / 62.5f32.sqrt(), -7.5, -56.25],
        ),
    ];
    let (s, t) = ([1.0f32, 2.0], [0.5f32, -1.0]);
    for (op, r, expected) in cases {
        for (cmp, want) in COMPARATORS.into_iter().zip(expected) {
            let model = pbg(op, cmp, 2);
            assert_eq!(model.rel_dim(), r.len(), "{op:?}");
            let (train, cands) = both_scores(&model, &s, r, &t);
            for got in [train, cands] {
                assert!(
                    (got - want).abs() < 1e-4,
                    "{op:?}/{cmp:?}: got {got}, computed {want}"
                );
            }
        }
    }
}

#[test]
fn relation_rows_have_the_operators_sizes() {
    let sizes: Vec<usize> = OPERATORS
        .iter()
        .map(|&op| pbg(op, Comparator::Dot, 10).rel_dim())
        .collect();
    assert_eq!(sizes, [0, 10, 10, 100, 110, 10]);
}

#[test]
fn gradients_match_finite_differences() {
    for op in OPERATORS {
        for cmp in COMPARATORS {
            for loss in [LossKind::Softmax, LossKind::Logistic, LossKind::Margin] {
                check_model(&pbg(op, cmp, 4), loss);
            }
        }
    }
}

#[test]
fn reversed_rows_score_heads_as_the_rows_score_tails() {
    let d = 6;
    let (h, t) = (rand_vec(d, 21), rand_vec(d, 22));
    for op in OPERATORS {
        for cmp in COMPARATORS {
            let model = pbg(op, cmp, d);
            if !model.pbg.reversible() {
                continue;
            }
            let r = rand_vec(model.rel_dim(), 23);
            let mut reversed = r.clone();
            model.reverse_relation(&mut reversed);
            let (forward, _) = both_scores(&model, &h, &r, &t);
            let (backward, _) = both_scores(&model, &t, &reversed, &h);
            assert!(
                (forward - backward).abs() < 1e-5,
                "{op:?}/{cmp:?}: {forward} vs {backward}"
            );
        }
    }
}

#[test]
fn the_config_refuses_what_pbg_cannot_do() {
    let base = TrainConfig {
        model: ScoreKind::Pbg,
        ..TrainConfig::default()
    };
    assert_eq!(refused_key(base.clone()), None);
    let other = TrainConfig {
        model: ScoreKind::ComplEx,
        operator: Some(Operator::Linear),
        ..base.clone()
    };
    assert_eq!(refused_key(other).as_deref(), Some("embed.train.operator"));
    let other = TrainConfig {
        model: ScoreKind::DistMult,
        comparator: Some(Comparator::L2),
        ..base.clone()
    };
    assert_eq!(
        refused_key(other).as_deref(),
        Some("embed.train.comparator")
    );
    let odd = TrainConfig {
        operator: Some(Operator::ComplexDiagonal),
        dim: 5,
        ..base.clone()
    };
    assert_eq!(refused_key(odd).as_deref(), Some("embed.train.dim"));
    let affine = TrainConfig {
        operator: Some(Operator::Affine),
        comparator: Some(Comparator::Dot),
        reciprocal: false,
        ..base.clone()
    };
    assert_eq!(
        refused_key(affine).as_deref(),
        Some("embed.train.reciprocal")
    );
    let rescal = TrainConfig {
        operator: Some(Operator::Linear),
        comparator: Some(Comparator::Dot),
        reciprocal: false,
        ..base
    };
    assert_eq!(refused_key(rescal), None);
}

/// `pbg`'s score written out from PBG's formulas for one triple (`s`, `t`: `d` reals; `r`: the
/// operator's row), independently of the chunk code.
pub(super) fn reference_score(model: &ScoreModel, s: &[f32], r: &[f32], t: &[f32]) -> f32 {
    let d = model.dim;
    let h = d / 2;
    let matvec = |k: usize| (0..d).map(|l| r[k * d + l] * s[l]).sum::<f32>();
    let a: Vec<f32> = match model.pbg.operator {
        Operator::None => s.to_vec(),
        Operator::Translation => (0..d).map(|k| s[k] + r[k]).collect(),
        Operator::Diagonal => (0..d).map(|k| s[k] * r[k]).collect(),
        Operator::Linear => (0..d).map(matvec).collect(),
        Operator::Affine => (0..d).map(|k| matvec(k) + r[d * d + k]).collect(),
        Operator::ComplexDiagonal => (0..d)
            .map(|k| {
                let c = k % h;
                let (sr, si, rr, ri) = (s[c], s[h + c], r[c], r[h + c]);
                if k < h {
                    sr * rr - si * ri
                } else {
                    sr * ri + si * rr
                }
            })
            .collect(),
    };
    let dot: f32 = (0..d).map(|k| a[k] * t[k]).sum();
    let sq: f32 = (0..d).map(|k| (a[k] - t[k]).powi(2)).sum();
    let norm = |x: &[f32]| x.iter().map(|v| v * v).sum::<f32>().sqrt();
    match model.pbg.comparator {
        Comparator::Dot => dot,
        Comparator::Cos => dot / (norm(&a) * norm(t)),
        Comparator::L2 => -sq.sqrt(),
        Comparator::SquaredL2 => -sq,
    }
}

#[test]
fn batches_score_every_pair_by_the_formula() {
    let (b, n, d) = (3usize, 4usize, 6usize);
    for op in OPERATORS {
        for cmp in COMPARATORS {
            let model = pbg(op, cmp, d);
            let rd = model.rel_dim();
            let (src, rel, cands) = (
                rand_vec(b * d, 31),
                rand_vec(b * rd, 32),
                rand_vec(n * d, 33),
            );
            let mut out = vec![0.0f32; b * n];
            let mut scratch = Scratch::default();
            score_candidates(
                &model,
                &ScoreBatch {
                    b,
                    n,
                    src: &src,
                    rel: &rel,
                    cands: &cands,
                },
                &mut out,
                &mut scratch,
            );
            for i in 0..b {
                for j in 0..n {
                    let want = reference_score(
                        &model,
                        &src[i * d..(i + 1) * d],
                        &rel[i * rd..(i + 1) * rd],
                        &cands[j * d..(j + 1) * d],
                    );
                    let got = out[i * n + j];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{op:?}/{cmp:?} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}
