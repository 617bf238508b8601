use super::*;
use strata_store::rng::Rng;

pub(super) fn rand_vec(len: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ((x >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn loss_of(model: &ScoreModel, loss: &Loss, c: &Chunk) -> f64 {
    chunk_step(
        model,
        loss,
        c,
        &mut Grads::default(),
        &mut Scratch::default(),
    )
}

/// The chunk of `b` edges and `n` negatives whose rows are `inputs` (src, rel, dst, neg), with
/// edge `weights` (`b`, or empty).
fn chunk<'a>(b: usize, n: usize, inputs: &'a [Vec<f32>; 4], weights: &'a [f32]) -> Chunk<'a> {
    Chunk {
        b,
        n,
        src: &inputs[0],
        rel: &inputs[1],
        dst: &inputs[2],
        neg: &inputs[3],
        weights,
        pos_query: None,
    }
}

/// Every named model, with TransE in both norms.
const NAMED: [(ScoreKind, u8); 6] = [
    (ScoreKind::Dot, 2),
    (ScoreKind::DistMult, 2),
    (ScoreKind::ComplEx, 2),
    (ScoreKind::TransE, 1),
    (ScoreKind::TransE, 2),
    (ScoreKind::RotatE, 2),
];

/// Named model `kind` of `dim` reals (TransE-L2).
fn named(kind: ScoreKind, dim: usize) -> ScoreModel {
    ScoreModel {
        kind,
        dim,
        transe_norm: 2,
        pbg: PbgForm::default(),
    }
}

/// Random rows of a chunk of `b` edges and `n` negatives of `model` (src, rel, dst, neg).
fn random_inputs(model: &ScoreModel, b: usize, n: usize) -> [Vec<f32>; 4] {
    let d = model.dim;
    [
        rand_vec(b * d, 1),
        rand_vec(b * model.rel_dim(), 2),
        rand_vec(b * d, 3),
        rand_vec(n * d, 4),
    ]
}

/// Central finite differences of `f` at every element of `inputs` against `analytic`.
pub(super) fn check_gradients(
    what: &str,
    inputs: &[Vec<f32>; 4],
    analytic: &[Vec<f32>; 4],
    f: impl Fn(&[Vec<f32>; 4]) -> f64,
) {
    let h = 1e-3f32;
    for (which, grad) in analytic.iter().enumerate() {
        for idx in 0..inputs[which].len() {
            let mut up = inputs.clone();
            up[which][idx] += h;
            let mut down = inputs.clone();
            down[which][idx] -= h;
            let numeric = (f(&up) - f(&down)) / (2.0 * h as f64);
            let got = grad[idx] as f64;
            let tol = 2e-2 * numeric.abs().max(got.abs()).max(0.05);
            assert!(
                (numeric - got).abs() <= tol,
                "{what}: input {which} element {idx}: numeric {numeric} vs analytic {got}"
            );
        }
    }
}

/// The step's gradients of `c`'s inputs (src, rel, dst, neg).
fn gradients(model: &ScoreModel, loss: &Loss, c: &Chunk) -> [Vec<f32>; 4] {
    let mut g = Grads::default();
    chunk_step(model, loss, c, &mut g, &mut Scratch::default());
    [g.src, g.rel, g.dst, g.neg]
}

/// Central finite differences against the analytic gradient of every input.
fn check(kind: ScoreKind, norm: u8, loss: LossKind) {
    check_model(
        &ScoreModel {
            kind,
            dim: 6,
            transe_norm: norm,
            pbg: PbgForm::default(),
        },
        loss,
    )
}

/// [`check`] for any model (of any `dim`).
pub(super) fn check_model(model: &ScoreModel, loss: LossKind) {
    let (b, n) = (3usize, 4usize);
    let loss = Loss::plain(loss, 0.5);
    let inputs = random_inputs(model, b, n);
    let analytic = gradients(model, &loss, &chunk(b, n, &inputs, &[]));
    check_gradients(&format!("{model:?} {loss:?}"), &inputs, &analytic, |x| {
        loss_of(model, &loss, &chunk(b, n, x, &[]))
    });
}

#[test]
fn gradients_match_finite_differences() {
    for loss in [LossKind::Softmax, LossKind::Logistic, LossKind::Margin] {
        check(ScoreKind::Dot, 2, loss);
        check(ScoreKind::DistMult, 2, loss);
        check(ScoreKind::ComplEx, 2, loss);
        check(ScoreKind::TransE, 2, loss);
        check(ScoreKind::TransE, 1, loss);
        check(ScoreKind::RotatE, 2, loss);
    }
}

#[test]
fn complex_scores_are_the_real_part_of_the_trilinear_product() {
    // One coordinate: s = 1 + 2i, r = 3 - i, t = 0.5 + 4i: Re(s r conj t) = Re((5 + 5i)(0.5 - 4i)) = 22.5
    let model = ScoreModel {
        kind: ScoreKind::ComplEx,
        dim: 2,
        transe_norm: 2,
        pbg: PbgForm::default(),
    };
    let (src, rel, dst, neg) = ([1.0, 2.0], [3.0, -1.0], [0.5, 4.0], [0.5, 4.0]);
    let mut g = Grads::default();
    let mut s = Scratch::default();
    // With the negative equal to the positive, softmax loss is ln 2 whatever the score.
    let c = Chunk {
        b: 1,
        n: 1,
        src: &src,
        rel: &rel,
        dst: &dst,
        neg: &neg,
        weights: &[],
        pos_query: None,
    };
    let l = chunk_step(
        &model,
        &Loss::plain(LossKind::Softmax, 0.0),
        &c,
        &mut g,
        &mut s,
    );
    assert!((l - std::f64::consts::LN_2).abs() < 1e-6);
    assert!((s.pos[0] - 22.5).abs() < 1e-5, "{}", s.pos[0]);
}

#[test]
fn candidate_scores_agree_with_training_scores() {
    // The evaluation scorer and the training step must rank with the same function: with one
    // negative equal to the positive target, softmax weights of the two are equal.
    for (kind, norm) in NAMED {
        let (b, n, d) = (3usize, 5usize, 8usize);
        let model = ScoreModel {
            kind,
            dim: d,
            transe_norm: norm,
            pbg: PbgForm::default(),
        };
        let src = rand_vec(b * d, 11);
        let rel = rand_vec(b * model.rel_dim(), 12);
        let cands = rand_vec(n * d, 13);
        let mut out = vec![0.0f32; b * n];
        let mut s = Scratch::default();
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
            &mut s,
        );
        for i in 0..b {
            for j in 0..n {
                // Score (src_i, rel_i, cand_j) as a positive through the training path.
                let mut g = Grads::default();
                let mut s2 = Scratch::default();
                let dst = cands[j * d..(j + 1) * d].to_vec();
                let c = Chunk {
                    b: 1,
                    n: 1,
                    src: &src[i * d..(i + 1) * d],
                    rel: &rel[i * model.rel_dim()..(i + 1) * model.rel_dim()],
                    dst: &dst,
                    neg: &dst,
                    weights: &[],
                    pos_query: None,
                };
                chunk_step(
                    &model,
                    &Loss::plain(LossKind::Softmax, 0.0),
                    &c,
                    &mut g,
                    &mut s2,
                );
                assert!(
                    (s2.pos[0] - out[i * n + j]).abs() < 1e-4,
                    "{kind:?}: {} vs {}",
                    s2.pos[0],
                    out[i * n + j]
                );
            }
        }
    }
}

/// A head query through the reversed relation scores exactly the triple it corrupts:
/// score(h, r, t) == score(t, reverse(r), h).
#[test]
fn reversed_relation_scores_the_same_triple() {
    let d = 8;
    for (kind, norm) in [
        (ScoreKind::DistMult, 2),
        (ScoreKind::ComplEx, 2),
        (ScoreKind::TransE, 1),
        (ScoreKind::TransE, 2),
        (ScoreKind::RotatE, 2),
    ] {
        let model = ScoreModel {
            kind,
            dim: d,
            transe_norm: norm,
            pbg: PbgForm::default(),
        };
        let (h, t) = (rand_vec(d, 11), rand_vec(d, 12));
        let r = rand_vec(model.rel_dim(), 13);
        let mut r_rev = r.clone();
        model.reverse_relation(&mut r_rev);
        let mut s = Scratch::default();
        let (mut forward, mut backward) = ([0.0f32], [0.0f32]);
        score_candidates(
            &model,
            &ScoreBatch {
                b: 1,
                n: 1,
                src: &h,
                rel: &r,
                cands: &t,
            },
            &mut forward,
            &mut s,
        );
        score_candidates(
            &model,
            &ScoreBatch {
                b: 1,
                n: 1,
                src: &t,
                rel: &r_rev,
                cands: &h,
            },
            &mut backward,
            &mut s,
        );
        assert!(
            (forward[0] - backward[0]).abs() < 1e-5,
            "{kind:?}: {forward:?} vs {backward:?}"
        );
        if kind != ScoreKind::DistMult {
            // Without the reversal the head score would differ (so the test can fail).
            score_candidates(
                &model,
                &ScoreBatch {
                    b: 1,
                    n: 1,
                    src: &t,
                    rel: &r,
                    cands: &h,
                },
                &mut backward,
                &mut s,
            );
            assert!((forward[0] - backward[0]).abs() > 1e-4, "{kind:?}");
        }
    }
}

/// Initial relations give a node little preference for itself as its own answer, unlike the
/// identity relation (ones for DistMult, 1 + 0i for ComplEx, no rotation or offset).
#[test]
fn initial_relations_have_no_self_preference() {
    let d = 64;
    let mut rng = Rng::new(5);
    // Mean of score(h, r, h) - score(h, r, t) over random h, t.
    let self_gap = |model: &ScoreModel, r: &[f32]| -> f64 {
        let mut s = Scratch::default();
        let (mut a, mut b) = ([0.0f32], [0.0f32]);
        let mut gap = 0.0;
        for i in 0..200 {
            let (h, t) = (rand_vec(d, 100 + i), rand_vec(d, 10_000 + i));
            score_candidates(
                model,
                &ScoreBatch {
                    b: 1,
                    n: 1,
                    src: &h,
                    rel: r,
                    cands: &h,
                },
                &mut a,
                &mut s,
            );
            score_candidates(
                model,
                &ScoreBatch {
                    b: 1,
                    n: 1,
                    src: &h,
                    rel: r,
                    cands: &t,
                },
                &mut b,
                &mut s,
            );
            gap += (a[0] - b[0]) as f64;
        }
        gap / 200.0
    };
    // (TransE prefers the node itself until it learns a long enough translation, whatever
    // small offset it starts from, so it is not checked.)
    for kind in [ScoreKind::DistMult, ScoreKind::ComplEx, ScoreKind::RotatE] {
        let model = ScoreModel {
            kind,
            dim: d,
            transe_norm: 2,
            pbg: PbgForm::default(),
        };
        let mut identity = vec![0.0f32; model.rel_dim()];
        match kind {
            ScoreKind::DistMult => identity.fill(1.0),
            ScoreKind::ComplEx => identity[..d / 2].fill(1.0),
            _ => {}
        }
        let mut r = vec![0.0f32; model.rel_dim()];
        model.init_relation(&mut r, &mut rng, 0.1);
        let (random, ident) = (self_gap(&model, &r), self_gap(&model, &identity));
        assert!(
            ident > 1.0,
            "{kind:?}: the identity prefers the node itself ({ident})"
        );
        assert!(
            random.abs() < 0.35 * ident,
            "{kind:?}: initial relation self gap {random} vs identity {ident}"
        );
    }
}

/// A score written out from its formula, one triple at a time, independently of the chunk
/// code: `s`, `t` hold `d` reals, `r` the relation row.
pub(super) fn reference_score(model: &ScoreModel, s: &[f32], r: &[f32], t: &[f32]) -> f32 {
    let d = model.dim;
    let h = d / 2;
    match model.kind.name() {
        "dot" => (0..d).map(|k| s[k] * t[k]).sum(),
        "distmult" => (0..d).map(|k| s[k] * r[k] * t[k]).sum(),
        // Re(s r conj t) per complex coordinate.
        "complex" => (0..h)
            .map(|k| {
                let (sr, si, rr, ri, tr, ti) = (s[k], s[h + k], r[k], r[h + k], t[k], t[h + k]);
                (sr * rr - si * ri) * tr + (sr * ri + si * rr) * ti
            })
            .sum(),
        "transe" if model.transe_norm == 1 => {
            -(0..d).map(|k| (s[k] + r[k] - t[k]).abs()).sum::<f32>()
        }
        "transe" => -(0..d)
            .map(|k| (s[k] + r[k] - t[k]).powi(2))
            .sum::<f32>()
            .sqrt(),
        // |s_k e^{iθ_k} − t_k| per complex coordinate.
        "rotate" => -(0..h)
            .map(|k| {
                let (c, sn) = (r[k].cos(), r[k].sin());
                let re = s[k] * c - s[h + k] * sn - t[k];
                let im = s[k] * sn + s[h + k] * c - t[h + k];
                (re * re + im * im).sqrt()
            })
            .sum::<f32>(),
        "pbg" => super::pbg_tests::reference_score(model, s, r, t),
        other => panic!("no reference formula for registered model {other}: add one here"),
    }
}

/// Every registered model: a unique name that parses back, and scores of a small batch equal
/// to its formula written out triple by triple.
#[test]
fn every_registered_model_scores_its_formula() {
    let names = ScoreKind::names();
    let mut unique = names.clone();
    unique.sort_unstable();
    unique.dedup();
    assert_eq!(unique.len(), names.len(), "{names:?}");
    for &kind in ScoreKind::ALL {
        assert_eq!(kind.name().parse::<ScoreKind>().unwrap(), kind);
        for norm in [1, 2] {
            let (b, n, d) = (3usize, 4usize, 8usize);
            let model = ScoreModel {
                kind,
                dim: d,
                transe_norm: norm,
                pbg: PbgForm::default(),
            };
            let rd = model.rel_dim();
            let (src, rel, cands) = (
                rand_vec(b * d, 21),
                rand_vec(b * rd, 22),
                rand_vec(n * d, 23),
            );
            let mut out = vec![0.0f32; b * n];
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
                &mut Scratch::default(),
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
                        "{kind}/{norm} ({i}, {j}): {got} vs {want}"
                    );
                }
            }
        }
    }
}

/// The scores of a chunk from the candidate scorer (not the training step): positives `b` and
/// negatives `b x n`, in f64.
fn scores_of(model: &ScoreModel, b: usize, n: usize, x: &[Vec<f32>; 4]) -> (Vec<f64>, Vec<f64>) {
    let (d, rd) = (model.dim, model.rel_dim());
    let mut s = Scratch::default();
    let mut neg = vec![0.0f32; b * n];
    score_candidates(
        model,
        &ScoreBatch {
            b,
            n,
            src: &x[0],
            rel: &x[1],
            cands: &x[3],
        },
        &mut neg,
        &mut s,
    );
    let pos = (0..b)
        .map(|i| {
            let mut out = [0.0f32];
            let row = |v: &[f32], w: usize| v[i * w..(i + 1) * w].to_vec();
            let (src, rel, dst) = (row(&x[0], d), row(&x[1], rd), row(&x[2], d));
            score_candidates(
                model,
                &ScoreBatch {
                    b: 1,
                    n: 1,
                    src: &src,
                    rel: &rel,
                    cands: &dst,
                },
                &mut out,
                &mut s,
            );
            out[0] as f64
        })
        .collect();
    (pos, neg.iter().map(|&v| v as f64).collect())
}

/// RotatE's `softmax_j(alpha · score_ij)` of each edge's negatives at the rows `x`.
fn adversarial_probabilities(
    model: &ScoreModel,
    alpha: f64,
    b: usize,
    n: usize,
    x: &[Vec<f32>; 4],
) -> Vec<f64> {
    let (_, neg) = scores_of(model, b, n, x);
    neg.chunks(n)
        .flat_map(|row| {
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(alpha * v));
            let e: Vec<f64> = row.iter().map(|&v| (alpha * v - max).exp()).collect();
            let z: f64 = e.iter().sum();
            e.into_iter().map(move |v| v / z)
        })
        .collect()
}

/// The loss of a chunk written out from its definition: each edge's term (softmax
/// cross-entropy, logistic, or margin ranking) times its weight, with the negatives of the
/// logistic and margin losses weighted by `p` (self-adversarial probabilities, held fixed:
/// RotatE's constants) or uniformly.
fn reference_loss(
    model: &ScoreModel,
    loss: &Loss,
    b: usize,
    n: usize,
    x: &[Vec<f32>; 4],
    weights: &[f32],
    p: Option<&[f64]>,
) -> f64 {
    let softplus = |v: f64| (1.0 + v.exp()).ln();
    let (pos, neg) = scores_of(model, b, n, x);
    (0..b)
        .map(|i| {
            let row = &neg[i * n..(i + 1) * n];
            let u = |j: usize| p.map_or(1.0 / n as f64, |p| p[i * n + j]);
            let term = match loss.kind {
                LossKind::Softmax => {
                    let z: f64 = row.iter().map(|v| v.exp()).sum::<f64>() + pos[i].exp();
                    z.ln() - pos[i]
                }
                LossKind::Logistic => {
                    let g = loss.gamma as f64;
                    softplus(-(pos[i] + g))
                        + (0..n).map(|j| u(j) * softplus(row[j] + g)).sum::<f64>()
                }
                LossKind::Margin => (0..n)
                    .map(|j| n as f64 * u(j) * (loss.margin as f64 - pos[i] + row[j]).max(0.0))
                    .sum(),
            };
            weights.get(i).map_or(1.0, |&w| w as f64) * term
        })
        .collect::<Vec<f64>>()
        .iter()
        .sum()
}

/// Every model and loss with edge weights, and with self-adversarial weighting where it
/// applies: the step's loss is the loss written out from its definition, and its gradients
/// are that loss's finite differences with the adversarial probabilities held fixed.
#[test]
fn weighted_and_self_adversarial_steps_match_their_definition() {
    let (b, n) = (3usize, 4usize);
    let weights = [0.5f32, 2.0, 1.25];
    let mut models: Vec<ScoreModel> = NAMED
        .into_iter()
        .map(|(kind, transe_norm)| ScoreModel {
            kind,
            dim: 6,
            transe_norm,
            pbg: PbgForm::default(),
        })
        .collect();
    for (operator, comparator) in [
        (Operator::Linear, Comparator::Cos),
        (Operator::Affine, Comparator::L2),
        (Operator::ComplexDiagonal, Comparator::SquaredL2),
    ] {
        models.push(ScoreModel {
            kind: ScoreKind::Pbg,
            dim: 4,
            transe_norm: 2,
            pbg: PbgForm {
                operator,
                comparator,
            },
        });
    }
    for model in &models {
        let x = random_inputs(model, b, n);
        for kind in [LossKind::Softmax, LossKind::Logistic, LossKind::Margin] {
            let temperatures: &[Option<f32>] = if kind.takes_adversarial() {
                &[None, Some(0.7)]
            } else {
                &[None]
            };
            for &adversarial in temperatures {
                let loss = Loss {
                    kind,
                    margin: 0.5,
                    gamma: if kind == LossKind::Logistic { 1.5 } else { 0.0 },
                    adversarial,
                };
                let p = adversarial.map(|a| adversarial_probabilities(model, a as f64, b, n, &x));
                let c = chunk(b, n, &x, &weights);
                let want = reference_loss(model, &loss, b, n, &x, &weights, p.as_deref());
                let got = loss_of(model, &loss, &c);
                assert!(
                    (got - want).abs() < 1e-4 * want.abs().max(1.0),
                    "{model:?} {loss:?}: loss {got} vs {want}"
                );
                let analytic = gradients(model, &loss, &c);
                check_gradients(&format!("{model:?} {loss:?}"), &x, &analytic, |y| {
                    reference_loss(model, &loss, b, n, y, &weights, p.as_deref())
                });
            }
        }
    }
}

/// One edge of the dot model by hand: `s = (1, 0)`, `t = (0, 1)`, negatives `(1, 0)` and
/// `(0.5, 0)`, so the positive scores 0 and the negatives 1 and 0.5.
#[test]
fn self_adversarial_weights_by_hand() {
    let model = named(ScoreKind::Dot, 2);
    let x = [
        vec![1.0, 0.0],
        vec![],
        vec![0.0, 1.0],
        vec![1.0, 0.0, 0.5, 0.0],
    ];
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    let softplus = |v: f64| (1.0 + v.exp()).ln();
    // α = 2: p = (e², e¹) / (e² + e¹).
    let (p1, p2) = (1.0 / (1.0 + (-1.0f64).exp()), 1.0 / (1.0 + 1.0f64.exp()));
    let alpha = Some(2.0);
    let logistic = Loss {
        kind: LossKind::Logistic,
        margin: 0.0,
        gamma: 0.0,
        adversarial: alpha,
    };
    let c = chunk(1, 2, &x, &[]);
    let mut g = Grads::default();
    let mut s = Scratch::default();
    let l = chunk_step(&model, &logistic, &c, &mut g, &mut s);
    let want = 2f64.ln() + p1 * softplus(1.0) + p2 * softplus(0.5);
    assert!((l - want).abs() < 1e-6, "{l} vs {want}");
    // d/d neg_j = p_j σ(score_j) s ; d/d s = −σ(0) t + Σ_j p_j σ(score_j) neg_j.
    let (w1, w2) = (p1 * sigmoid(1.0), p2 * sigmoid(0.5));
    let close = |a: &[f32], b: &[f64]| a.iter().zip(b).all(|(&x, &y)| (x as f64 - y).abs() < 1e-6);
    assert!(close(&g.neg, &[w1, 0.0, w2, 0.0]), "{:?}", g.neg);
    assert!(close(&g.src, &[w1 + 0.5 * w2, -0.5]), "{:?}", g.src);
    // Margin 1: both negatives violate (1 − 0 + 1, 1 − 0 + 0.5), weighted 2 p_j.
    let margin = Loss {
        kind: LossKind::Margin,
        margin: 1.0,
        gamma: 0.0,
        adversarial: alpha,
    };
    let l = chunk_step(&model, &margin, &c, &mut g, &mut s);
    let want = 2.0 * (p1 * 2.0 + p2 * 1.5);
    assert!((l - want).abs() < 1e-5, "{l} vs {want}");
    assert!(
        close(&g.neg, &[2.0 * p1, 0.0, 2.0 * p2, 0.0]),
        "{:?}",
        g.neg
    );
    assert!(close(&g.dst, &[-2.0, 0.0]), "{:?}", g.dst);
    // Without the weighting the margin loss is 2 + 1.5 whatever α would say.
    let l = loss_of(&model, &Loss::plain(LossKind::Margin, 1.0), &c);
    assert!((l - 3.5).abs() < 1e-6, "{l}");
}

/// The logistic loss's `γ` by hand on TransE (L2): `s = (0, 0)`, `r = (1, 0)`, `t = (1, 0)`
/// and negatives `(4, 0)` and `(1, 3)`, so the positive scores 0 and the negatives −3 and −3.
#[test]
fn logistic_gamma_shifts_every_score_by_hand() {
    let model = named(ScoreKind::TransE, 2);
    let x = [
        vec![0.0, 0.0],
        vec![1.0, 0.0],
        vec![1.0, 0.0],
        vec![4.0, 0.0, 1.0, 3.0],
    ];
    let softplus = |v: f64| (1.0 + v.exp()).ln();
    let sigmoid = |v: f64| 1.0 / (1.0 + (-v).exp());
    let c = chunk(1, 2, &x, &[]);
    let (mut g, mut s) = (Grads::default(), Scratch::default());
    let gamma = Loss {
        gamma: 2.0,
        ..Loss::plain(LossKind::Logistic, 0.0)
    };
    // softplus(−(0 + 2)) + mean(softplus(−3 + 2), softplus(−3 + 2)).
    let l = chunk_step(&model, &gamma, &c, &mut g, &mut s);
    let want = softplus(-2.0) + softplus(-1.0);
    assert!((l - want).abs() < 1e-4, "{l} vs {want}");
    // d/d neg_1 = ½ σ(−1) d(−‖a − n_1‖)/d n_1 = ½ σ(−1) (a − n_1)/‖a − n_1‖ with a = (1, 0).
    let w = 0.5 * sigmoid(-1.0);
    let close = |a: &[f32], b: &[f64]| a.iter().zip(b).all(|(&x, &y)| (x as f64 - y).abs() < 1e-4);
    assert!(close(&g.neg, &[-w, 0.0, 0.0, -w]), "{:?}", g.neg);
    // Without γ the same edge's loss is softplus(0) + softplus(−3).
    let l = loss_of(&model, &Loss::plain(LossKind::Logistic, 0.0), &c);
    assert!((l - (softplus(0.0) + softplus(-3.0))).abs() < 1e-4, "{l}");
}

/// As the temperature goes to 0 the weighting is uniform: the plain loss and gradients.
#[test]
fn self_adversarial_at_zero_temperature_is_the_plain_loss() {
    let model = named(ScoreKind::ComplEx, 6);
    let (b, n) = (3usize, 5usize);
    let x = random_inputs(&model, b, n);
    for kind in [LossKind::Logistic, LossKind::Margin] {
        let plain = Loss::plain(kind, 0.5);
        let cold = Loss {
            adversarial: Some(1e-9),
            ..plain
        };
        let hot = Loss {
            adversarial: Some(5.0),
            ..plain
        };
        let c = chunk(b, n, &x, &[]);
        let (gp, gc, gh) = (
            gradients(&model, &plain, &c),
            gradients(&model, &cold, &c),
            gradients(&model, &hot, &c),
        );
        let diff = |a: &[Vec<f32>; 4], b: &[Vec<f32>; 4]| -> f32 {
            a.iter()
                .flatten()
                .zip(b.iter().flatten())
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        };
        assert!(diff(&gp, &gc) < 1e-6, "{kind:?}");
        // A high temperature does change them (so the comparison can fail).
        assert!(diff(&gp, &gh) > 1e-3, "{kind:?}");
        let (lp, lc) = (loss_of(&model, &plain, &c), loss_of(&model, &cold, &c));
        assert!((lp - lc).abs() < 1e-6, "{kind:?}: {lp} vs {lc}");
    }
}

/// An edge of weight 2 trains as the same edge twice in the chunk (negatives are shared by
/// the chunk, so an edge's term depends on its own rows only), and weight 0 as no edge.
#[test]
fn an_integer_weight_is_the_edge_repeated() {
    let model = named(ScoreKind::DistMult, 6);
    let (d, n) = (6usize, 4usize);
    let x = random_inputs(&model, 3, n);
    // Edges 0, 1, 1 unweighted against edges 0, 1, 2 weighted 1, 2, 0.
    let pick = |v: &[f32], rows: &[usize]| -> Vec<f32> {
        rows.iter()
            .flat_map(|&r| v[r * d..(r + 1) * d].to_vec())
            .collect()
    };
    let repeated = [
        pick(&x[0], &[0, 1, 1]),
        pick(&x[1], &[0, 1, 1]),
        pick(&x[2], &[0, 1, 1]),
        x[3].clone(),
    ];
    for kind in [LossKind::Softmax, LossKind::Logistic, LossKind::Margin] {
        let loss = Loss::plain(kind, 0.5);
        let weights = [1.0f32, 2.0, 0.0];
        let (cw, cr) = (chunk(3, n, &x, &weights), chunk(3, n, &repeated, &[]));
        let (lw, lr) = (loss_of(&model, &loss, &cw), loss_of(&model, &loss, &cr));
        assert!((lw - lr).abs() < 1e-5, "{kind:?}: {lw} vs {lr}");
        let (gw, gr) = (gradients(&model, &loss, &cw), gradients(&model, &loss, &cr));
        for k in 0..d {
            let close = |a: f32, b: f32| (a - b).abs() < 1e-5;
            assert!(close(gw[0][k], gr[0][k]), "{kind:?}");
            assert!(
                close(gw[0][d + k], gr[0][d + k] + gr[0][2 * d + k]),
                "{kind:?}"
            );
            assert_eq!(gw[0][2 * d + k], 0.0, "{kind:?}: weight 0 trains nothing");
        }
        for (a, b) in gw[3].iter().zip(&gr[3]) {
            assert!((a - b).abs() < 1e-5, "{kind:?}: negatives {a} vs {b}");
        }
    }
}

/// Every named model and a few PyTorch-BigGraph forms, with every loss (and self-adversarial
/// weighting where it applies), for the negatives-per-edge tests.
fn models_and_losses() -> Vec<(ScoreModel, Loss)> {
    let mut models: Vec<ScoreModel> = NAMED
        .into_iter()
        .map(|(kind, transe_norm)| ScoreModel {
            transe_norm,
            ..named(kind, 6)
        })
        .collect();
    models.push(ScoreModel {
        kind: ScoreKind::Pbg,
        dim: 4,
        transe_norm: 2,
        pbg: PbgForm {
            operator: Operator::Affine,
            comparator: Comparator::Cos,
        },
    });
    let losses = [
        Loss::plain(LossKind::Softmax, 0.5),
        Loss::plain(LossKind::Margin, 0.5),
        Loss::plain(LossKind::Logistic, 0.5),
        Loss {
            kind: LossKind::Logistic,
            margin: 0.5,
            gamma: 1.5,
            adversarial: Some(0.7),
        },
    ];
    models
        .iter()
        .flat_map(|m| losses.iter().map(move |l| (*m, *l)))
        .collect()
}

/// `edge_negatives_step`'s loss and gradients (src, rel, dst, neg) of `c`, `n` negatives each.
fn edge_step(model: &ScoreModel, loss: &Loss, c: &Chunk, n: usize) -> (f64, [Vec<f32>; 4]) {
    let mut g = Grads::default();
    let (mut e, mut s) = (Grads::default(), Scratch::default());
    let l = edge_negatives_step(model, loss, (c, n), &mut g, &mut e, &mut s);
    (l, [g.src, g.rel, g.dst, g.neg])
}

/// When every edge draws the same negatives, negatives per edge train as shared ones: the
/// same loss and query gradients, and each negative's gradients over the edges summed.
#[test]
fn negatives_per_edge_that_coincide_are_shared_negatives() {
    let (b, n) = (3usize, 4usize);
    let weights = [0.5f32, 2.0, 1.25];
    for (model, loss) in models_and_losses() {
        let x = random_inputs(&model, b, n);
        let repeated: Vec<f32> = (0..b).flat_map(|_| x[3].clone()).collect();
        let per_edge = [x[0].clone(), x[1].clone(), x[2].clone(), repeated];
        let shared = chunk(b, n, &x, &weights);
        let (want_loss, want) = (
            loss_of(&model, &loss, &shared),
            gradients(&model, &loss, &shared),
        );
        let c = chunk(b, b * n, &per_edge, &weights);
        let (got_loss, got) = edge_step(&model, &loss, &c, n);
        let what = format!("{model:?} {loss:?}");
        assert!(
            (got_loss - want_loss).abs() < 1e-5,
            "{what}: {got_loss} vs {want_loss}"
        );
        let close = |a: f32, b: f32| (a - b).abs() < 1e-5 * a.abs().max(1.0);
        for k in 0..3 {
            assert!(
                got[k].iter().zip(&want[k]).all(|(&a, &b)| close(a, b)),
                "{what}: input {k}"
            );
        }
        let nd = n * model.dim;
        for (j, &w) in want[3].iter().enumerate() {
            let sum: f32 = (0..b).map(|i| got[3][i * nd + j]).sum();
            assert!(close(sum, w), "{what}: negative real {j}: {sum} vs {w}");
        }
    }
}

/// Negatives per edge: the step's gradients are those of its loss, each edge's negatives
/// reaching its own term only (central finite differences of every input; self-adversarial
/// weights are constants of the gradient, so not differentiated here).
#[test]
fn negatives_per_edge_gradients_match_finite_differences() {
    let (b, n) = (3usize, 2usize);
    let weights = [0.5f32, 2.0, 1.25];
    let plain = models_and_losses()
        .into_iter()
        .filter(|(_, loss)| loss.adversarial.is_none());
    for (model, loss) in plain {
        let x = random_inputs(&model, b, b * n);
        let c = chunk(b, b * n, &x, &weights);
        let (_, analytic) = edge_step(&model, &loss, &c, n);
        check_gradients(&format!("{model:?} {loss:?}"), &x, &analytic, |y| {
            edge_step(&model, &loss, &chunk(b, b * n, y, &weights), n).0
        });
    }
}
