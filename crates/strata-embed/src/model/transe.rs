//! TransE: `−‖s + r − t‖` in the L1 or L2 norm (`transe_norm`). The L2 norm expands
//! `‖a − t‖²` into the bilinear family's matrix products; the L1 norm is computed pairwise.

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::pairwise::{self, Pairwise};
use super::score::{
    apply_loss, combine_rows, fit, pos_query_rows, Chunk, Combine, Grads, Layout, Loss, ScoreBatch,
    ScoreFunction, Scratch, Shape,
};
use super::{Comparator, Operator, PbgForm};
use crate::compute::kernels::{dot, gemm_ab, gemm_abt, gemm_atb, l1_grads, l1_scores};

/// `−‖s + r − t‖`.
pub struct TransE;

impl Named for TransE {
    const NAME: &'static str = "transe";
    const HELP: &'static str = "−‖s + r − t‖ in the L1 or L2 norm (transe_norm)";
}

impl Combine for TransE {
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]) {
        for k in 0..d {
            ai[k] = si[k] + ri[k];
        }
    }
}

/// The L1 norm, pair by pair.
impl Pairwise for TransE {
    fn pair_scores(a: &[f32], cands: &[f32], out: &mut [f32]) {
        l1_scores(a, cands, out);
    }

    fn pair_grads(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]) {
        l1_grads(a, cands, w, da, dcands);
    }

    fn back(_d: usize, da: &[f32], _a: &[f32], _ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        gs.copy_from_slice(da);
        gr.copy_from_slice(da);
    }
}

impl ScoreFunction for TransE {
    fn rel_dim(&self, dim: usize, _pbg: PbgForm) -> usize {
        dim
    }

    fn layouts(&self, _model: &Shape) -> (Layout, Layout) {
        (Layout::Real, Layout::Real)
    }

    fn natural_comparator(&self, _model: &Shape) -> Comparator {
        // It scores by distances.
        Comparator::L2
    }

    fn pbg_form(&self, model: &Shape) -> Result<PbgForm, String> {
        if model.transe_norm == 2 {
            Ok(PbgForm {
                operator: Operator::Translation,
                comparator: Comparator::L2,
            })
        } else {
            Err("model transe with transe_norm = 1 has no PyTorch-BigGraph form: PBG's comparators are dot, cos, l2 and squared_l2 (no L1 distance)".into())
        }
    }

    /// Normal offsets of the node embeddings' scale (see [`Shape::init_relation`]).
    fn init_relation(&self, _model: &Shape, row: &mut [f32], rng: &mut Rng, scale: f32) {
        for pair in row.chunks_mut(2) {
            let (a, b) = rng.normal_pair();
            pair[0] = a as f32 * scale;
            if pair.len() > 1 {
                pair[1] = b as f32 * scale;
            }
        }
    }

    /// `-r`.
    fn reverse_relation(&self, _model: &Shape, row: &mut [f32]) {
        row.iter_mut().for_each(|v| *v = -*v);
    }

    /// The L2 step keeps the distances next to the scores.
    fn extra_score_matrices(&self) -> u64 {
        1
    }

    fn step(&self, model: &Shape, loss: &Loss, c: &Chunk, g: &mut Grads, s: &mut Scratch) -> f64 {
        if model.transe_norm == 2 {
            step_l2(model, loss, c, g, s)
        } else {
            pairwise::step::<Self>(model, loss, c, g, s)
        }
    }

    fn score(&self, model: &Shape, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch) {
        if model.transe_norm != 2 {
            return pairwise::score::<Self>(model, q, out, s);
        }
        let ScoreBatch {
            b,
            n,
            src,
            rel,
            cands,
        } = *q;
        let d = model.dim;
        combine_rows::<Self>(model, b, src, rel, &mut s.phi);
        gemm_abt(b, n, d, -2.0, &s.phi, cands, 0.0, out);
        // The candidates' squared norms once per batch, not once per pair: per pair they
        // cost as much as the product itself.
        let a_sq = squared_norms(&s.phi[..b * d], d);
        let c_sq = squared_norms(&cands[..n * d], d);
        for (row, a_sq) in out[..b * n].chunks_exact_mut(n).zip(a_sq) {
            for (o, &c_sq) in row.iter_mut().zip(&c_sq) {
                *o = -distance(*o, a_sq, c_sq);
            }
        }
    }
}

/// `‖x‖²` of each `d`-real row of `rows`.
fn squared_norms(rows: &[f32], d: usize) -> Vec<f32> {
    rows.chunks_exact(d).map(|r| dot(r, r)).collect()
}

/// `‖a − c‖` from the product term `−2 a·c` and the squared norms, clamped at 0 against
/// rounding and kept off 0 so that its gradient stays finite.
fn distance(minus_2_dot: f32, a_sq: f32, c_sq: f32) -> f32 {
    ((minus_2_dot + a_sq + c_sq).max(0.0) + EPS).sqrt()
}

/// Keeps a distance (and the division by it in the gradient) away from 0.
const EPS: f32 = 1e-9;

/// The TransE-L2 training step: `‖a − t‖²` expanded into matrix products.
#[allow(clippy::needless_range_loop)] // index loops over parallel arrays
fn step_l2(model: &Shape, loss: &Loss, c: &Chunk, g: &mut Grads, s: &mut Scratch) -> f64 {
    let (b, n) = (c.b, c.n);
    let d = model.dim;
    fit(&mut s.phi, b * d);
    combine_rows::<TransE>(model, b, c.src, c.rel, &mut s.phi);
    let a_sq = squared_norms(&s.phi[..b * d], d);
    let n_sq = squared_norms(&c.neg[..n * d], d);
    let own = pos_query_rows::<TransE>(model, c, s);
    let phi_pos = if own { &s.phi_pos } else { &s.phi };
    for i in 0..b {
        let (a, t) = (&phi_pos[i * d..(i + 1) * d], &c.dst[i * d..(i + 1) * d]);
        let dist: f32 = a.iter().zip(t).map(|(x, y)| (x - y) * (x - y)).sum::<f32>();
        s.pos[i] = -(dist + EPS).sqrt();
    }
    gemm_abt(b, n, d, -2.0, &s.phi, c.neg, 0.0, &mut s.scores);
    // Keep the distances for the backward pass; scores = −dist.
    fit(&mut s.aux, b * n);
    for i in 0..b {
        for j in 0..n {
            let dist = distance(s.scores[i * n + j], a_sq[i], n_sq[j]);
            s.aux[i * n + j] = dist;
            s.scores[i * n + j] = -dist;
        }
    }
    let total = apply_loss(loss, c, s);
    // d score/d(dist²) = −1 / (2 dist): W becomes the weight on the squared distance.
    let mut row_sum = vec![0.0f32; b];
    let mut col_sum = vec![0.0f32; n];
    for i in 0..b {
        for j in 0..n {
            let w = -s.scores[i * n + j] / (2.0 * s.aux[i * n + j]);
            s.scores[i * n + j] = w;
            row_sum[i] += w;
            col_sum[j] += w;
        }
    }
    // d dist²/da = 2(a − n) ; d dist²/dn = 2(n − a)
    fit(&mut s.dphi, b * d);
    gemm_ab(b, d, n, -2.0, &s.scores, c.neg, 0.0, &mut s.dphi);
    gemm_atb(n, d, b, -2.0, &s.scores, &s.phi, 0.0, &mut g.neg);
    for j in 0..n {
        for k in 0..d {
            g.neg[j * d + k] += 2.0 * col_sum[j] * c.neg[j * d + k];
        }
    }
    // a = s + r: the source and relation rows take the query row's gradient; the positives'
    // term goes to their own rows when they have them.
    let phi_pos = if own { &s.phi_pos } else { &s.phi };
    for i in 0..b {
        let (a, a_pos, t) = (
            &s.phi[i * d..(i + 1) * d],
            &phi_pos[i * d..(i + 1) * d],
            &c.dst[i * d..(i + 1) * d],
        );
        let dist = -s.pos[i];
        let dp = s.dpos[i];
        for k in 0..d {
            let dt = dp * (a_pos[k] - t[k]) / dist;
            let da = s.dphi[i * d + k] + 2.0 * row_sum[i] * a[k];
            g.dst[i * d + k] = dt;
            if own {
                (g.src[i * d + k], g.rel[i * d + k]) = (da, da);
                (g.pos_src[i * d + k], g.pos_rel[i * d + k]) = (-dt, -dt);
            } else {
                (g.src[i * d + k], g.rel[i * d + k]) = (da - dt, da - dt);
            }
        }
    }
    total
}
