//! The pairwise family (TransE-L1, RotatE): `a = s ⊕ r`, score `−Σ_k dist_k(a, t)` computed
//! for every (query, target) pair.

use super::score::{
    apply_loss, back_rows, combine_rows, fit, pos_query_rows, zeroed, Chunk, Combine, Grads, Loss,
    ScoreBatch, Scratch, Shape,
};

/// A score function computed pair by pair from the query row `a` of its [`Combine`].
pub(super) trait Pairwise: Combine {
    /// The scores of query row `a` (`d` reals) against each row of `cands` (`out.len()` rows
    /// of `d` reals), into `out`.
    fn pair_scores(a: &[f32], cands: &[f32], out: &mut [f32]);

    /// The score of query row `a` against target row `t` (`d` reals each): the same
    /// arithmetic as [`Pairwise::pair_scores`].
    fn pair_score(a: &[f32], t: &[f32]) -> f32 {
        let mut out = [0.0];
        Self::pair_scores(a, t, &mut out);
        out[0]
    }

    /// For each row `c_j` of `cands` (`w.len()` rows of `d` reals) with `w_j ≠ 0`: adds
    /// `w_j · d score(a, c_j) / d a` to `da` and `w_j · d score(a, c_j) / d c_j` to row `j`
    /// of `dcands`.
    fn pair_grads(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]);

    /// [`Pairwise::pair_grads`] for one target row `t` and its gradient `dt`.
    fn pair_grad(a: &[f32], t: &[f32], w: f32, da: &mut [f32], dt: &mut [f32]) {
        Self::pair_grads(a, t, &[w], da, dt);
    }

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
        s.pos[i] = M::pair_score(&phi_pos[i * d..(i + 1) * d], &c.dst[i * d..(i + 1) * d]);
        M::pair_scores(a, &c.neg[..n * d], &mut s.scores[i * n..(i + 1) * n]);
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
            &phi_pos[i * d..(i + 1) * d],
            &c.dst[i * d..(i + 1) * d],
            s.dpos[i],
            &mut dphi_pos[i * d..(i + 1) * d],
            &mut g.dst[i * d..(i + 1) * d],
        );
    }
    for i in 0..b {
        M::pair_grads(
            &s.phi[i * d..(i + 1) * d],
            &c.neg[..n * d],
            &s.scores[i * n..(i + 1) * n],
            &mut s.dphi[i * d..(i + 1) * d],
            &mut g.neg[..n * d],
        );
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
        M::pair_scores(a, &cands[..n * d], &mut out[i * n..(i + 1) * n]);
    }
}
