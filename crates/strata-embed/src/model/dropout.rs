//! Dropout on the rows a training step gathers (LibKGE's `entity_embedder.dropout` and
//! `relation_embedder.dropout`): inverted dropout, each real of a gathered source, target,
//! negative (entity rate) or relation row (relation rate) kept with probability `1 - rate` and
//! scaled by `1 / (1 - rate)`, during training only. The scores and their gradients are those
//! of the dropped rows; the gradient reaches the stored rows through the same mask. The
//! regularizer sees the rows as stored (LibKGE penalises the embedding parameters, not their
//! dropped lookups). Masks come from the chunk's counter-based generator, so a one-thread run
//! stays deterministic for a seed.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::rng::Rng;

use super::{Grads, PosQuery};
use crate::compute::kernels;

/// How a positive and its negatives share dropout masks (config `dropout_masks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DropoutMasks {
    /// One mask per gathered row: an edge's positive and negative scores see the same
    /// dropped query.
    #[default]
    Shared,
    /// The positive's source and relation rows carry masks of their own (LibKGE's).
    Independent,
}

/// Dropout rates of entity and relation rows (config `entity_dropout`, `relation_dropout`),
/// each in `[0, 1)`; 0 is off.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Dropout {
    pub entity: f32,
    pub relation: f32,
    /// Config `dropout_masks = "independent"`: the positive score's source and relation rows
    /// carry masks of their own, drawn apart from those its negatives are scored with (LibKGE
    /// looks the rows up, and so drops them, once for the positive and again for the
    /// negatives); false: one mask per gathered row serves both.
    pub independent: bool,
}

impl Dropout {
    /// Whether any rows are dropped (`rel_dim`: reals per relation row, 0 without them).
    pub fn active(&self, rel_dim: usize) -> bool {
        self.entity > 0.0 || (self.relation > 0.0 && rel_dim > 0)
    }
}

/// One chunk side's dropped rows and their masks (each real's factor: 0 or `1 / (1 - rate)`).
#[derive(Default)]
pub struct Dropped {
    pub src: Vec<f32>,
    pub rel: Vec<f32>,
    pub dst: Vec<f32>,
    pub neg: Vec<f32>,
    /// With independent masks: the positives' own dropped source and relation rows (empty
    /// without).
    pub pos_src: Vec<f32>,
    pub pos_rel: Vec<f32>,
    masks: [Vec<f32>; 4],
    pos_masks: [Vec<f32>; 2],
}

/// Writes `rows` dropped at `rate` into `out` and each real's factor into `mask` (`rate` 0:
/// a copy, factors 1).
fn drop_rows(rate: f32, rows: &[f32], out: &mut Vec<f32>, mask: &mut Vec<f32>, rng: &mut Rng) {
    if rate <= 0.0 {
        out.clear();
        out.extend_from_slice(rows);
        mask.clear();
        mask.resize(rows.len(), 1.0);
        return;
    }
    // A real is dropped when its 32 random bits fall below rate · 2^32 (two reals a draw).
    let cut = (rate as f64 * 4_294_967_296.0) as u64;
    // Every element is written: a buffer as long as the last step's is not cleared.
    out.resize(rows.len(), 0.0);
    mask.resize(rows.len(), 0.0);
    kernels::drop_scaled(1.0 / (1.0 - rate), cut, rows, out, mask, rng);
}

impl Dropped {
    /// Drops one side's gathered rows (`src`, `dst`, `neg` at the entity rate, `rel` at the
    /// relation rate) into this side's buffers, drawing the masks from `rng` in that order;
    /// with independent masks, then the positives' own copies of `src` and `rel`.
    pub fn apply(&mut self, rates: Dropout, rows: [&[f32]; 4], rng: &mut Rng) {
        let [src, rel, dst, neg] = rows;
        let [m_src, m_rel, m_dst, m_neg] = &mut self.masks;
        drop_rows(rates.entity, src, &mut self.src, m_src, rng);
        drop_rows(rates.entity, dst, &mut self.dst, m_dst, rng);
        drop_rows(rates.entity, neg, &mut self.neg, m_neg, rng);
        drop_rows(rates.relation, rel, &mut self.rel, m_rel, rng);
        let [p_src, p_rel] = &mut self.pos_masks;
        if rates.independent {
            drop_rows(rates.entity, src, &mut self.pos_src, p_src, rng);
            drop_rows(rates.relation, rel, &mut self.pos_rel, p_rel, rng);
        } else {
            for v in [&mut self.pos_src, &mut self.pos_rel, p_src, p_rel] {
                v.clear();
            }
        }
    }

    /// The positives' own query rows for [`Chunk::pos_query`](super::Chunk::pos_query), with
    /// independent masks; `None` with shared ones.
    pub fn pos_query(&self) -> Option<PosQuery<'_>> {
        (!self.pos_masks[0].is_empty()).then_some(PosQuery {
            src: &self.pos_src,
            rel: &self.pos_rel,
        })
    }

    /// Turns gradients with respect to the dropped rows into gradients with respect to the
    /// gathered rows (the chain rule through `x · mask`); with independent masks a source or
    /// relation row's gradient sums its two paths, each through its own mask.
    pub fn backward(&self, g: &mut Grads) {
        let [m_src, m_rel, m_dst, m_neg] = &self.masks;
        for (grad, mask) in [
            (&mut g.src, m_src),
            (&mut g.rel, m_rel),
            (&mut g.dst, m_dst),
            (&mut g.neg, m_neg),
        ] {
            for (x, m) in grad.iter_mut().zip(mask) {
                *x *= m;
            }
        }
        let [p_src, p_rel] = &self.pos_masks;
        for (grad, pos_grad, mask) in [
            (&mut g.src, &g.pos_src, p_src),
            (&mut g.rel, &g.pos_rel, p_rel),
        ] {
            for ((x, p), m) in grad.iter_mut().zip(pos_grad).zip(mask) {
                *x += p * m;
            }
        }
    }

    /// Bytes of one side's buffers for rows of `d` reals (`rd` per relation row), `b` edges
    /// and `n` negatives: the dropped rows and their masks, with the positives' own query
    /// rows of independent masks.
    pub fn bytes(b: u64, n: u64, d: u64, rd: u64) -> u64 {
        2 * 4 * ((3 * b + n) * d + 2 * b * rd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{chunk_step, Chunk, Loss, LossKind, ScoreModel};

    #[test]
    fn kept_reals_are_scaled_and_the_dropped_fraction_follows_the_rate() {
        let rows: Vec<f32> = (0..40_000).map(|i| 1.0 + (i % 5) as f32).collect();
        let (mut out, mut mask) = (Vec::new(), Vec::new());
        drop_rows(0.25, &rows, &mut out, &mut mask, &mut Rng::new(5));
        let dropped = mask.iter().filter(|&&m| m == 0.0).count() as f64 / rows.len() as f64;
        // 40,000 draws: 4 standard deviations are below 0.01.
        assert!((dropped - 0.25).abs() < 0.01, "{dropped}");
        for ((&x, &y), &m) in rows.iter().zip(&out).zip(&mask) {
            assert!(m == 0.0 || m == 1.0 / 0.75);
            assert_eq!(y, x * m);
        }
        // The mean is kept (inverted dropout).
        let mean = |v: &[f32]| v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64;
        assert!((mean(&out) / mean(&rows) - 1.0).abs() < 0.02);
        // Same generator, same masks; rate 0 copies.
        let (mut again, mut mask2) = (Vec::new(), Vec::new());
        drop_rows(0.25, &rows, &mut again, &mut mask2, &mut Rng::new(5));
        assert_eq!((&out, &mask), (&again, &mask2));
        drop_rows(0.0, &rows, &mut again, &mut mask2, &mut Rng::new(5));
        assert_eq!(again, rows);
    }

    /// The mask as the plain loop defines it: a draw per pair of reals, low half first.
    fn drop_rows_by_pairs(rate: f32, rows: &[f32], rng: &mut Rng) -> (Vec<f32>, Vec<f32>) {
        let cut = (rate as f64 * 4_294_967_296.0) as u64;
        let keep = 1.0 / (1.0 - rate);
        let mut mask = Vec::new();
        for pair in rows.chunks(2) {
            let bits = rng.next_u64();
            for half in [bits & 0xffff_ffff, bits >> 32].iter().take(pair.len()) {
                mask.push(if *half >= cut { keep } else { 0.0 });
            }
        }
        let out = rows.iter().zip(&mask).map(|(x, m)| x * m).collect();
        (out, mask)
    }

    #[test]
    fn the_blocked_mask_is_the_pairwise_one_bit_for_bit() {
        // Lengths around the 512-real blocks, odd ones included.
        for len in [0, 1, 2, 511, 512, 513, 1024, 1537] {
            let rows: Vec<f32> = (0..len).map(|i| 0.5 + (i % 7) as f32).collect();
            let (mut out, mut mask) = (vec![9.0; 3], Vec::new());
            let (mut a, mut b) = (Rng::new(11), Rng::new(11));
            drop_rows(0.37, &rows, &mut out, &mut mask, &mut a);
            assert_eq!(
                (out, mask),
                drop_rows_by_pairs(0.37, &rows, &mut b),
                "{len} reals"
            );
            assert_eq!(
                a.next_u64(),
                b.next_u64(),
                "{len} reals: the stream goes on alike"
            );
        }
    }

    #[test]
    fn backward_multiplies_each_gradient_by_its_mask() {
        let mut d = Dropped::default();
        let rows = [
            &[1.0f32, 2.0, 3.0, 4.0][..],
            &[5.0, 6.0],
            &[7.0, 8.0, 9.0, 10.0],
            &[],
        ];
        d.apply(
            Dropout {
                entity: 0.5,
                relation: 0.0,
                independent: false,
            },
            rows,
            &mut Rng::new(1),
        );
        let mut g = Grads {
            src: vec![1.0; 4],
            rel: vec![1.0; 2],
            dst: vec![1.0; 4],
            neg: Vec::new(),
            ..Default::default()
        };
        d.backward(&mut g);
        // d(x · m)/dx = m: the gradient of a unit upstream gradient is the mask itself, which
        // the dropped row divided by the row shows where the real was kept.
        for (grad, (out, x)) in g.src.iter().zip(d.src.iter().zip(rows[0])) {
            assert_eq!(*grad, out / x);
        }
        assert_eq!(
            g.rel,
            [1.0, 1.0],
            "relation rate 0 leaves relation rows alone"
        );
        assert_eq!(d.rel, rows[1]);
    }

    #[test]
    fn gradients_through_the_masks_match_finite_differences() {
        use crate::model::{PbgForm, ScoreKind, ScoreModel};
        let model = |kind, transe_norm| ScoreModel {
            kind,
            dim: 4,
            transe_norm,
            pbg: PbgForm::default(),
        };
        // Every kernel that takes the positives' own query rows, with both kinds of masks.
        for m in [
            model(ScoreKind::ComplEx, 2),
            model(ScoreKind::DistMult, 2),
            model(ScoreKind::TransE, 2),
            model(ScoreKind::TransE, 1),
            model(ScoreKind::RotatE, 2),
        ] {
            for independent in [false, true] {
                check_finite_differences(m, independent);
            }
        }
    }

    /// The step of `model` on rows dropped with the masks of one generator: its gradients with
    /// respect to the gathered rows against central differences of its loss.
    fn check_finite_differences(model: ScoreModel, independent: bool) {
        let (b, n, d, rd) = (2usize, 3usize, model.dim, model.rel_dim());
        let rates = Dropout {
            entity: 0.4,
            relation: 0.3,
            independent,
        };
        let mut rng = Rng::new(11);
        let mut draw = |len: usize| -> Vec<f32> {
            (0..len).map(|_| rng.normal_pair().0 as f32 * 0.7).collect()
        };
        let rows = [draw(b * d), draw(b * rd), draw(b * d), draw(n * d)];
        let run = |rows: &[Vec<f32>; 4], g: &mut Grads| {
            let mut dr = Dropped::default();
            dr.apply(
                rates,
                [&rows[0], &rows[1], &rows[2], &rows[3]],
                &mut Rng::new(9),
            );
            let c = Chunk {
                b,
                n,
                src: &dr.src,
                rel: &dr.rel,
                dst: &dr.dst,
                neg: &dr.neg,
                weights: &[],
                pos_query: dr.pos_query(),
            };
            let loss = Loss::plain(LossKind::Softmax, 0.0);
            let total = chunk_step(&model, &loss, &c, g, &mut Default::default());
            dr.backward(g);
            (total, dr)
        };
        let mut g = Grads::default();
        let (_, dr) = run(&rows, &mut g);
        assert!(dr.src.contains(&0.0), "some reals are dropped");
        assert_eq!(dr.pos_query().is_some(), independent);
        let analytic = [&g.src, &g.rel, &g.dst, &g.neg];
        let h = 1e-3f32;
        for (which, grad) in analytic.iter().enumerate() {
            for k in 0..rows[which].len() {
                let (mut up, mut down) = (rows.clone(), rows.clone());
                up[which][k] += h;
                down[which][k] -= h;
                let numeric = (run(&up, &mut Grads::default()).0
                    - run(&down, &mut Grads::default()).0)
                    / (2.0 * h as f64);
                assert!(
                    (numeric - grad[k] as f64).abs() < 5e-3,
                    "{:?} independent {independent}, rows {which} real {k}: {numeric} vs {}",
                    model.kind,
                    grad[k]
                );
            }
        }
    }

    #[test]
    fn independent_masks_drop_the_positives_query_again_and_leave_the_shared_draws() {
        let rows: Vec<Vec<f32>> = (0..4).map(|k| vec![1.0 + k as f32; 64]).collect();
        let rows = [&rows[0][..], &rows[1], &rows[2], &rows[3]];
        let rates = |independent| Dropout {
            entity: 0.5,
            relation: 0.5,
            independent,
        };
        let (mut shared, mut own) = (Dropped::default(), Dropped::default());
        shared.apply(rates(false), rows, &mut Rng::new(3));
        own.apply(rates(true), rows, &mut Rng::new(3));
        // The negatives' rows are the shared run's, draw for draw.
        assert_eq!(
            (&own.src, &own.rel, &own.dst, &own.neg),
            (&shared.src, &shared.rel, &shared.dst, &shared.neg)
        );
        assert!(shared.pos_query().is_none());
        let q = own
            .pos_query()
            .expect("independent masks give the positives rows");
        // Another mask over the same rows: the kept reals are the rows' own, scaled by 2.
        assert_ne!(q.src, &own.src[..]);
        assert_ne!(q.rel, &own.rel[..]);
        assert!(q.src.iter().all(|&x| x == 0.0 || x == 2.0));
        // Back through both paths: a unit gradient on each gives the sum of the two masks.
        let mut g = Grads {
            src: vec![1.0; 64],
            rel: vec![1.0; 64],
            pos_src: vec![1.0; 64],
            pos_rel: vec![1.0; 64],
            ..Grads::default()
        };
        own.backward(&mut g);
        for k in 0..64 {
            assert_eq!(g.src[k], own.src[k] / 1.0 + q.src[k] / 1.0);
            assert_eq!(g.rel[k], (own.rel[k] + q.rel[k]) / 2.0);
        }
    }
}
