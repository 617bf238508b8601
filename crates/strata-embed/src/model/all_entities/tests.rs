use super::*;
use crate::model::tests::{check_gradients, rand_vec, reference_score};
use crate::model::{Comparator, Operator, PbgForm, ScoreKind, ScoreModel};

fn model(kind: ScoreKind, dim: usize, pbg: PbgForm) -> ScoreModel {
    ScoreModel {
        kind,
        dim,
        transe_norm: 2,
        pbg,
    }
}

/// The models whose score is a product with the target row.
fn product_models() -> Vec<ScoreModel> {
    let pbg = |operator| PbgForm {
        operator,
        comparator: Comparator::Dot,
    };
    vec![
        model(ScoreKind::Dot, 6, PbgForm::default()),
        model(ScoreKind::DistMult, 6, PbgForm::default()),
        model(ScoreKind::ComplEx, 6, PbgForm::default()),
        model(ScoreKind::Pbg, 4, pbg(Operator::Linear)),
        model(ScoreKind::Pbg, 4, pbg(Operator::Translation)),
    ]
}

/// The loss written out from each triple's reference score, in f64, independently of the
/// step's products: `inputs` are (src, rel, cands).
fn reference_loss(m: &ScoreModel, loss: &Loss, c: &AllBatch) -> f64 {
    let (d, rd) = (m.dim, m.rel_dim());
    let mut total = 0.0f64;
    for i in 0..c.b {
        let x: Vec<f64> = (0..c.n)
            .map(|j| {
                let (s, r) = (&c.src[i * d..(i + 1) * d], &c.rel[i * rd..(i + 1) * rd]);
                reference_score(m, s, r, &c.cands[j * d..(j + 1) * d]) as f64
            })
            .collect();
        let true_of = c.labels.of(i);
        let ls = c.label_smoothing as f64;
        let y: Vec<f64> = (0..c.n)
            .map(|j| {
                let hot = if true_of.contains(&(j as u32)) {
                    1.0
                } else {
                    0.0
                };
                if ls > 0.0 {
                    (1.0 - ls) * hot + 1.0 / c.n as f64
                } else {
                    hot
                }
            })
            .collect();
        let term: f64 = match loss.kind {
            LossKind::Softmax => {
                let sum_y: f64 = y.iter().sum();
                let lse = x.iter().map(|v| v.exp()).sum::<f64>().ln();
                x.iter()
                    .zip(&y)
                    .map(|(xj, yj)| -yj / sum_y * (xj - lse))
                    .sum()
            }
            _ => x
                .iter()
                .zip(&y)
                .map(|(xj, yj)| {
                    let v = xj + loss.gamma as f64;
                    (1.0 + v.exp()).ln() - yj * v
                })
                .sum(),
        };
        total += c.weights.get(i).map_or(1.0, |&w| w as f64) * term;
    }
    total
}

/// Every product model, both losses, both label kinds, with and without smoothing and
/// weights: the loss equals its reference and the gradients of the source, relation and
/// candidate rows equal central finite differences.
#[test]
fn every_product_model_matches_its_reference_loss_and_finite_differences() {
    let (b, n) = (3usize, 5usize);
    let one = [2u32, 0, 4];
    let (offsets, ids) = ([0u32, 1, 3, 5], [2u32, 1, 3, 0, 4]);
    for m in product_models() {
        let query = m.product_query().expect("a product model");
        let (d, rd) = (m.dim, m.rel_dim());
        let inputs = [
            rand_vec(b * d, 11),
            rand_vec(b * rd, 12),
            rand_vec(n * d, 13),
            Vec::new(),
        ];
        let losses = [
            Loss::plain(LossKind::Softmax, 0.0),
            Loss {
                gamma: 0.5,
                ..Loss::plain(LossKind::Logistic, 0.0)
            },
        ];
        let labels = [
            Labels::One(&one),
            Labels::Many {
                offsets: &offsets,
                ids: &ids,
            },
        ];
        for loss in losses {
            for labels in labels {
                for (ls, weights) in [(0.0, &[][..]), (0.1, &[0.5f32, 2.0, 1.0][..])] {
                    let batch = |x: &[Vec<f32>; 4]| -> f64 {
                        let c = AllBatch {
                            b,
                            n,
                            src: &x[0],
                            rel: &x[1],
                            cands: &x[2],
                            labels,
                            weights,
                            label_smoothing: ls,
                        };
                        all_step(&m.shape(), &loss, &query, &c, &mut AllScratch::default())
                    };
                    let c = AllBatch {
                        b,
                        n,
                        src: &inputs[0],
                        rel: &inputs[1],
                        cands: &inputs[2],
                        labels,
                        weights,
                        label_smoothing: ls,
                    };
                    let mut s = AllScratch::default();
                    let got = all_step(&m.shape(), &loss, &query, &c, &mut s);
                    let want = reference_loss(&m, &loss, &c);
                    let what = format!("{} {:?} {labels:?} ls {ls}", m.kind, loss.kind);
                    assert!(
                        (got - want).abs() <= 1e-4 * want.abs().max(1.0),
                        "{what}: loss {got} vs reference {want}"
                    );
                    let analytic = [s.g_src, s.g_rel, s.g_cands, Vec::new()];
                    check_gradients(&what, &inputs, &analytic, batch);
                }
            }
        }
    }
}

/// Two candidates by hand: cross-entropy `log(e^a + e^b) − a`, gradient `(p_a − 1, p_b)`;
/// BCE `softplus(a) − a + softplus(b)`, gradient `(σ(a) − 1, σ(b))`; the label 1/n
/// smoothing of ConvE turns `(1, 0)` into `(1 − ls + 1/2, 1/2)`.
#[test]
fn two_candidates_by_hand() {
    let (a, b) = (0.3f32, -0.2f32);
    let pa = a.exp() / (a.exp() + b.exp());
    let mut row = [a, b];
    let l = softmax_row(&mut row, &[0], 0.0);
    assert!((l - ((a.exp() + b.exp()).ln() - a) as f64).abs() < 1e-6);
    assert!((row[0] - (pa - 1.0)).abs() < 1e-6 && (row[1] - (1.0 - pa)).abs() < 1e-6);
    let mut row = [a, b];
    let l = bce_row(&mut row, &[0], 0.0, 0.0);
    let sp = |x: f32| (1.0 + x.exp()).ln();
    let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
    assert!((l - (sp(a) - a + sp(b)) as f64).abs() < 1e-6);
    assert!((row[0] - (sig(a) - 1.0)).abs() < 1e-6 && (row[1] - sig(b)).abs() < 1e-6);
    assert_eq!(label_values(0.2, 2), (1.3, 0.5));
    // Smoothed softmax: the labels (1.3, 0.5) normalised to (1.3/1.8, 0.5/1.8).
    let mut row = [a, b];
    softmax_row(&mut row, &[0], 0.2);
    assert!((row[0] - (pa - 1.3 / 1.8)).abs() < 1e-6);
    assert!((row[1] - (1.0 - pa - 0.5 / 1.8)).abs() < 1e-6);
}

/// Distance models and pbg's other comparators have no product query: each refuses, naming
/// itself.
#[test]
fn models_whose_score_is_no_product_refuse_naming_themselves() {
    for kind in [ScoreKind::TransE, ScoreKind::RotatE] {
        let m = model(kind, 4, PbgForm::default());
        let why = m.product_query().err().expect("refused");
        assert!(
            why.contains(kind.name()) && why.contains("distance"),
            "{why}"
        );
    }
    for comparator in [Comparator::Cos, Comparator::L2, Comparator::SquaredL2] {
        let form = PbgForm {
            operator: Operator::Diagonal,
            comparator,
        };
        let m = model(ScoreKind::Pbg, 4, form);
        let why = m.product_query().err().expect("refused");
        assert!(why.contains(comparator.name()), "{why}");
    }
}
