//! The pairwise family (TransE-L1, RotatE): `a = s ⊕ r`, score `−Σ_k dist_k(a, t)` computed
//! for every (query, target) pair.

use super::score::{
    apply_loss, back_rows, combine_rows, fit, pos_query_rows, zeroed, Chunk, Combine, Grads, Loss,
    ScoreBatch, Scratch, Shape,
};

/// A score function computed pair by pair from the query row `a` of its [`Combine`].
pub(super) trait Pairwise: Combine {
    /// The score of query row `a` against target row `t` (`d` reals each).
    fn pair_score(d: usize, a: &[f32], t: &[f32]) -> f32;

    /// Adds `w · d score / d a` to `da` and `w · d score / d t` to `dt`.
    fn pair_grad(d: usize, a: &[f32], t: &[f32], w: f32, da: &mut [f32], dt: &mut [f32]);

    /// Back through the combination for one row: from `da = d loss / d a`, the gradients of
    /// the source row (`gs`, `d` reals) and of the relation row (`gr`, `rel_dim` reals); `a`
    /// is the query row, `ri` the relation row.
    fn back(d: usize, da: &[f32], a: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]);
}

/// The training step of a pairwise model (see [`super::chunk_step`]).
pub(super) fn step<M: Pairwise>(
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
        let a = &s.phi[i * d..(i + 1) * d];
        s.pos[i] = M::pair_score(d, &phi_pos[i * d..(i + 1) * d], &c.dst[i * d..(i + 1) * d]);
        for j in 0..n {
            s.scores[i * n + j] = M::pair_score(d, a, &c.neg[j * d..(j + 1) * d]);
        }
    }
    let total = apply_loss(loss, c, s);
    zeroed(&mut g.dst, b * d);
    zeroed(&mut g.neg, n * d);
    zeroed(&mut s.dphi, b * d);
    // The positives' term, into their own query rows' gradients when they have them.
    let (phi_pos, dphi_pos) = if own {
        (&s.phi_pos, &mut s.dphi_pos)
    } else {
        (&s.phi, &mut s.dphi)
    };
    for i in 0..b {
        M::pair_grad(
            d,
            &phi_pos[i * d..(i + 1) * d],
            &c.dst[i * d..(i + 1) * d],
            s.dpos[i],
            &mut dphi_pos[i * d..(i + 1) * d],
            &mut g.dst[i * d..(i + 1) * d],
        );
    }
    for i in 0..b {
        let a = &s.phi[i * d..(i + 1) * d];
        let da = &mut s.dphi[i * d..(i + 1) * d];
        for j in 0..n {
            let w = s.scores[i * n + j];
            if w != 0.0 {
                M::pair_grad(
                    d,
                    a,
                    &c.neg[j * d..(j + 1) * d],
                    w,
                    da,
                    &mut g.neg[j * d..(j + 1) * d],
                );
            }
        }
    }
    // Pairwise::back reads the query row where a bilinear back reads the source row.
    back_rows(
        model,
        b,
        &s.dphi,
        &s.phi,
        c.rel,
        &mut g.src,
        &mut g.rel,
        M::back,
    );
    if let Some(q) = c.pos_query {
        let (dq, q_pos) = (&s.dphi_pos, &s.phi_pos);
        back_rows(
            model,
            b,
            dq,
            q_pos,
            q.rel,
            &mut g.pos_src,
            &mut g.pos_rel,
            M::back,
        );
    }
    total
}

/// Candidate scores of a pairwise model (see [`super::score_candidates`]).
pub(super) fn score<M: Pairwise>(model: &Shape, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch) {
    let ScoreBatch {
        b,
        n,
        src,
        rel,
        cands,
    } = *q;
    let d = model.dim;
    combine_rows::<M>(model, b, src, rel, &mut s.phi);
    for i in 0..b {
        let a = &s.phi[i * d..(i + 1) * d];
        for j in 0..n {
            out[i * n + j] = M::pair_score(d, a, &cands[j * d..(j + 1) * d]);
        }
    }
}
