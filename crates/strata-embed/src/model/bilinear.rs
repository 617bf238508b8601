//! The bilinear family (dot, DistMult, ComplEx): score `φ(s, r) · t`, so a chunk's `b x n`
//! negative scores are one matrix product and its backward pass two more, reusing `φ` and the
//! loss weights of the forward pass.

use super::score::{
    apply_loss, back_rows, combine_rows, fit, pos_query_rows, Chunk, Combine, Grads, Loss,
    ProductQuery, ScoreBatch, Scratch, Shape,
};
use crate::compute::kernels::{dot, gemm_ab, gemm_abt, gemm_atb};

/// A bilinear score function: its [`Combine`] is `φ(s, r)`, linear in `s` and in `r`.
pub(super) trait Bilinear: Combine {
    /// Back through `φ` for one row: from `dphi = d loss / d φ` (`d` reals), the gradients of
    /// the source row (`gs`, `d` reals) and of the relation row (`gr`, `rel_dim` reals).
    fn back(d: usize, dphi: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]);
}

/// The training step of a bilinear model (see [`super::chunk_step`]).
pub(super) fn step<M: Bilinear>(
    model: &Shape,
    loss: &Loss,
    c: &Chunk,
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    let (b, n) = (c.b, c.n);
    let d = model.dim;
    fit(&mut s.phi, b * d);
    combine_rows::<M>(model, b, c.src, c.rel, &mut s.phi);
    let own = pos_query_rows::<M>(model, c, s);
    let phi_pos = if own { &s.phi_pos } else { &s.phi };
    for i in 0..b {
        s.pos[i] = dot(&phi_pos[i * d..(i + 1) * d], &c.dst[i * d..(i + 1) * d]);
    }
    gemm_abt(b, n, d, 1.0, &s.phi, c.neg, 0.0, &mut s.scores);
    let total = apply_loss(loss, c, s);
    // dφ = dpos ∘ t + W · neg ;  dt = dpos ∘ φ ;  dneg = Wᵀ · φ  (the positives' dpos ∘ t
    // goes to their own φ when they have one)
    fit(&mut s.dphi, b * d);
    gemm_ab(b, d, n, 1.0, &s.scores, c.neg, 0.0, &mut s.dphi);
    let (phi_pos, dphi_pos) = if own {
        (&s.phi_pos, &mut s.dphi_pos)
    } else {
        (&s.phi, &mut s.dphi)
    };
    for i in 0..b {
        let dp = s.dpos[i];
        let (dphi, t, phi, gt) = (
            &mut dphi_pos[i * d..(i + 1) * d],
            &c.dst[i * d..(i + 1) * d],
            &phi_pos[i * d..(i + 1) * d],
            &mut g.dst[i * d..(i + 1) * d],
        );
        for k in 0..d {
            dphi[k] += dp * t[k];
            gt[k] = dp * phi[k];
        }
    }
    gemm_atb(n, d, b, 1.0, &s.scores, &s.phi, 0.0, &mut g.neg);
    back_bilinear::<M>(model, b, &s.dphi, c.src, c.rel, &mut g.src, &mut g.rel);
    if let Some(q) = c.pos_query {
        back_bilinear::<M>(
            model,
            b,
            &s.dphi_pos,
            q.src,
            q.rel,
            &mut g.pos_src,
            &mut g.pos_rel,
        );
    }
    total
}

/// [`Bilinear::back`] for each of `b` rows (see [`ProductQuery::back`]).
fn back_bilinear<M: Bilinear>(
    model: &Shape,
    b: usize,
    dphi: &[f32],
    src: &[f32],
    rel: &[f32],
    gs: &mut [f32],
    gr: &mut [f32],
) {
    back_rows(model, b, dphi, src, rel, gs, gr, M::back)
}

/// The query rows of a bilinear model: `φ(s, r)` and its backward pass.
pub(super) fn product_query<M: Bilinear>() -> ProductQuery {
    ProductQuery {
        combine: combine_rows::<M>,
        back: back_bilinear::<M>,
    }
}

/// Candidate scores of a bilinear model (see [`super::score_candidates`]).
pub(super) fn score<M: Bilinear>(model: &Shape, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch) {
    let ScoreBatch {
        b,
        n,
        src,
        rel,
        cands,
    } = *q;
    combine_rows::<M>(model, b, src, rel, &mut s.phi);
    gemm_abt(b, n, model.dim, 1.0, &s.phi, cands, 0.0, out)
}
