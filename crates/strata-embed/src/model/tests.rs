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

fn loss_of(model: &ScoreModel, loss: LossKind, b: usize, n: usize, inputs: &[Vec<f32>; 4]) -> f64 {
    let mut g = Grads::default();
    let mut s = Scratch::default();
    chunk_step(model, loss, 0.5, &chunk(b, n, inputs), &mut g, &mut s)
}

/// The chunk of `b` edges and `n` negatives whose rows are `inputs` (src, rel, dst, neg).
fn chunk(b: usize, n: usize, inputs: &[Vec<f32>; 4]) -> Chunk<'_> {
    Chunk {
        b,
        n,
        src: &inputs[0],
        rel: &inputs[1],
        dst: &inputs[2],
        neg: &inputs[3],
    }
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
    let (b, n, d) = (3usize, 4usize, model.dim);
    let model = *model;
    let inputs = [
        rand_vec(b * d, 1),
        rand_vec(b * model.rel_dim(), 2),
        rand_vec(b * d, 3),
        rand_vec(n * d, 4),
    ];
    let mut g = Grads::default();
    let mut s = Scratch::default();
    chunk_step(&model, loss, 0.5, &chunk(b, n, &inputs), &mut g, &mut s);
    let analytic = [g.src.clone(), g.rel.clone(), g.dst.clone(), g.neg.clone()];
    let h = 1e-3f32;
    for (which, grad) in analytic.iter().enumerate() {
        for idx in 0..inputs[which].len() {
            let mut up = inputs.clone();
            up[which][idx] += h;
            let mut down = inputs.clone();
            down[which][idx] -= h;
            let numeric = (loss_of(&model, loss, b, n, &up) - loss_of(&model, loss, b, n, &down))
                / (2.0 * h as f64);
            let got = grad[idx] as f64;
            let tol = 2e-2 * numeric.abs().max(got.abs()).max(0.05);
            assert!(
                (numeric - got).abs() <= tol,
                "{model:?} {loss:?}: input {which} element {idx}: numeric {numeric} vs analytic {got}"
            );
        }
    }
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
    };
    let l = chunk_step(&model, LossKind::Softmax, 0.0, &c, &mut g, &mut s);
    assert!((l - std::f64::consts::LN_2).abs() < 1e-6);
    assert!((s.pos[0] - 22.5).abs() < 1e-5, "{}", s.pos[0]);
}

#[test]
fn candidate_scores_agree_with_training_scores() {
    // The evaluation scorer and the training step must rank with the same function: with one
    // negative equal to the positive target, softmax weights of the two are equal.
    for (kind, norm) in [
        (ScoreKind::Dot, 2),
        (ScoreKind::DistMult, 2),
        (ScoreKind::ComplEx, 2),
        (ScoreKind::TransE, 1),
        (ScoreKind::TransE, 2),
        (ScoreKind::RotatE, 2),
    ] {
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
        score_candidates(&model, b, n, &src, &rel, &cands, &mut out, &mut s);
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
                };
                chunk_step(&model, LossKind::Softmax, 0.0, &c, &mut g, &mut s2);
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
        score_candidates(&model, 1, 1, &h, &r, &t, &mut forward, &mut s);
        score_candidates(&model, 1, 1, &t, &r_rev, &h, &mut backward, &mut s);
        assert!(
            (forward[0] - backward[0]).abs() < 1e-5,
            "{kind:?}: {forward:?} vs {backward:?}"
        );
        if kind != ScoreKind::DistMult {
            // Without the reversal the head score would differ (so the test can fail).
            score_candidates(&model, 1, 1, &t, &r, &h, &mut backward, &mut s);
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
            score_candidates(model, 1, 1, &h, r, &h, &mut a, &mut s);
            score_candidates(model, 1, 1, &h, r, &t, &mut b, &mut s);
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
                b,
                n,
                &src,
                &rel,
                &cands,
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
