//! PyTorch-BigGraph's score functions (`model = "pbg"`): a relation operator applied to the
//! source row, `a = op_r(s)`, then a comparator between `a` and each target, `score = cmp(a, t)`.
//!
//! PBG applies its operator to the right-hand side and compares with the left; here it is
//! applied to the query side, as in the named models, so one operator row `r` scores
//! `(h, r, t)` as PBG's row scores `(t, r, h)` (for `linear`, the transposed matrix). Heads are
//! corrupted with reciprocal relation rows as in PBG's dynamic relations, or, for the pairs
//! whose score is symmetric under a reversed row (see [`PbgForm::reversible`]), with that row.
//!
//! Every comparator is computed through the bilinear family's matrix products: `dot` is
//! `a · t`; `cos` is the dot product of rows normalised to unit length (PBG's `prepare`);
//! `squared_l2` and `l2` expand `‖a − t‖² = ‖a‖² − 2 a · t + ‖t‖²`. The operators that are
//! named models already reuse their rows' code: `none` is [`Dot`]'s, `translation` TransE's,
//! `diagonal` DistMult's, `complex_diagonal` ComplEx's; `linear` (`a = M s`) and `affine`
//! (`a = M s + v`) are here.

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::bilinear::Bilinear;
use super::complex::ComplEx;
use super::distmult::DistMult;
use super::dot::Dot;
use super::pairwise::Pairwise;
use super::score::{
    apply_loss, back_rows, combine_rows, fit, Chunk, Combine, Grads, Layout, Loss, ProductQuery,
    ScoreBatch, ScoreFunction, Scratch, Shape,
};
use super::transe::TransE;
use super::{Comparator, Operator, PbgForm};
use crate::compute::kernels::{dot, gemm_ab, gemm_abt, gemm_atb};

/// Below this length a row is not scaled up to unit length by `cos` (PBG clamps the norm too).
const MIN_NORM: f32 = 1e-12;

/// Added to squared distances under the square root of `l2`, so that its gradient stays finite
/// at distance 0 (as TransE-L2).
const DIST_EPS: f32 = 1e-9;

/// A relation operator's backward pass, next to its forward pass ([`Combine`]).
trait OperatorRows: Combine {
    /// From `da = d loss / d a` (`d` reals), the gradients of the source row (`gs`, `d` reals)
    /// and of the relation row (`gr`, its `rel_dim` reals), both overwritten.
    fn back(d: usize, da: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]);
}

/// The named bilinear models whose `φ(s, r)` is a PBG operator.
macro_rules! bilinear_operator {
    ($($model:ty),*) => {$(
        impl OperatorRows for $model {
            fn back(d: usize, da: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
                <$model as Bilinear>::back(d, da, si, ri, gs, gr)
            }
        }
    )*};
}

bilinear_operator!(Dot, DistMult, ComplEx);

/// TransE's `s + r`: its backward pass does not read the query row.
impl OperatorRows for TransE {
    fn back(d: usize, da: &[f32], _si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        <TransE as Pairwise>::back(d, da, &[], ri, gs, gr)
    }
}

/// `a = M s`.
struct Linear;

impl Combine for Linear {
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]) {
        for (k, a) in ai.iter_mut().enumerate().take(d) {
            *a = dot(&ri[k * d..(k + 1) * d], si);
        }
    }
}

impl OperatorRows for Linear {
    /// `gs = Mᵀ da`, `gM = da sᵀ`.
    fn back(d: usize, da: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        gs[..d].fill(0.0);
        for k in 0..d {
            let (m, g) = (&ri[k * d..(k + 1) * d], &mut gr[k * d..(k + 1) * d]);
            let dk = da[k];
            for l in 0..d {
                gs[l] += dk * m[l];
                g[l] = dk * si[l];
            }
        }
    }
}

/// `a = M s + v`: [`Linear`]'s rows followed by the translation `v`.
struct Affine;

impl Combine for Affine {
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]) {
        Linear::combine(d, si, ri, ai);
        for (a, v) in ai.iter_mut().zip(&ri[d * d..d * d + d]) {
            *a += v;
        }
    }
}

impl OperatorRows for Affine {
    fn back(d: usize, da: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        Linear::back(d, da, si, ri, gs, gr);
        gr[d * d..d * d + d].copy_from_slice(&da[..d]);
    }
}

/// `M` with random signs on its diagonal and zeros elsewhere: an isometry without a preferred
/// self-score, as DistMult's start (see [`Shape::init_relation`]; PBG starts from the
/// identity).
fn signed_diagonal(d: usize, row: &mut [f32], rng: &mut Rng) {
    row[..d * d].fill(0.0);
    for k in 0..d {
        row[k * d + k] = if rng.below(2) == 0 { 1.0 } else { -1.0 };
    }
}

/// PBG's score functions: `model = "pbg"` with `operator` and `comparator`.
pub struct Pbg;

impl Named for Pbg {
    const NAME: &'static str = "pbg";
    const HELP: &'static str =
        "PyTorch-BigGraph's comparator(operator(s, r), t); see the operator and comparator options";
}

/// Calls `$f::<O>` with `O` the operator type of `$model` (one instantiation per operator).
macro_rules! with_operator {
    ($model:expr, $f:ident ( $($arg:expr),* )) => {
        match $model.pbg.operator {
            Operator::None => $f::<Dot>($($arg),*),
            Operator::Translation => $f::<TransE>($($arg),*),
            Operator::Diagonal => $f::<DistMult>($($arg),*),
            Operator::Linear => $f::<Linear>($($arg),*),
            Operator::Affine => $f::<Affine>($($arg),*),
            Operator::ComplexDiagonal => $f::<ComplEx>($($arg),*),
        }
    };
}

impl ScoreFunction for Pbg {
    fn rel_dim(&self, dim: usize, pbg: PbgForm) -> usize {
        pbg.operator.rel_dim(dim)
    }

    fn layouts(&self, model: &Shape) -> (Layout, Layout) {
        if model.pbg.operator == Operator::ComplexDiagonal {
            (Layout::Complex, Layout::Complex)
        } else {
            (Layout::Real, Layout::Real)
        }
    }

    fn natural_comparator(&self, model: &Shape) -> Comparator {
        model.pbg.comparator
    }

    fn pbg_form(&self, model: &Shape) -> Result<PbgForm, String> {
        Ok(model.pbg)
    }

    /// The named models' starts for the operators that are theirs; for `linear` and `affine`,
    /// a signed diagonal matrix (and a zero translation).
    fn init_relation(&self, model: &Shape, row: &mut [f32], rng: &mut Rng, scale: f32) {
        let d = model.dim;
        match model.pbg.operator {
            Operator::None => {}
            Operator::Translation => TransE.init_relation(model, row, rng, scale),
            Operator::Diagonal => DistMult.init_relation(model, row, rng, scale),
            Operator::ComplexDiagonal => ComplEx.init_relation(model, row, rng, scale),
            Operator::Linear => signed_diagonal(d, row, rng),
            Operator::Affine => {
                signed_diagonal(d, row, rng);
                row[d * d..].fill(0.0);
            }
        }
    }

    /// `−r` (translation), `r` (diagonal), the conjugate (complex_diagonal), `Mᵀ` (linear);
    /// only called for the forms that are [`PbgForm::reversible`] (the config refuses the
    /// others without reciprocal relations).
    fn reverse_relation(&self, model: &Shape, row: &mut [f32]) {
        let d = model.dim;
        match model.pbg.operator {
            Operator::None | Operator::Diagonal => {}
            Operator::Translation => TransE.reverse_relation(model, row),
            Operator::ComplexDiagonal => ComplEx.reverse_relation(model, row),
            Operator::Linear => {
                for k in 0..d {
                    for l in k + 1..d {
                        row.swap(k * d + l, l * d + k);
                    }
                }
            }
            Operator::Affine => unreachable!("affine needs reciprocal relations (validated)"),
        }
    }

    /// The distances of `l2`, kept for the backward pass.
    fn extra_score_matrices(&self) -> u64 {
        1
    }

    fn step(&self, model: &Shape, loss: &Loss, c: &Chunk, g: &mut Grads, s: &mut Scratch) -> f64 {
        with_operator!(model, step(model, loss, c, g, s))
    }

    fn score(&self, model: &Shape, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch) {
        with_operator!(model, score(model, q, out, s))
    }

    /// Comparator `dot` only: `op(s) · t`. The others scale or subtract the target row.
    fn product_query(&self, model: &Shape) -> Result<ProductQuery, String> {
        if model.pbg.comparator != Comparator::Dot {
            return Err(format!(
                "with comparator {} is not a product with the target row (comparator \
                 dot is); scoring every entity would need a full-table kernel of its own",
                model.pbg.comparator.name()
            ));
        }
        Ok(with_operator!(model, operator_query()))
    }
}

/// The query rows `op(s)` of operator `O` and their backward pass.
fn operator_query<O: OperatorRows>() -> ProductQuery {
    ProductQuery {
        combine: combine_rows::<O>,
        back: back_operator::<O>,
    }
}

/// [`OperatorRows::back`] for each of `b` rows (see [`ProductQuery::back`]).
fn back_operator<O: OperatorRows>(
    model: &Shape,
    b: usize,
    da: &[f32],
    src: &[f32],
    rel: &[f32],
    gs: &mut [f32],
    gr: &mut [f32],
) {
    back_rows(model, b, da, src, rel, gs, gr, O::back)
}

/// Scales each `d`-real row of `x` to unit length in place, writing its length to `norms`.
fn normalize_rows(d: usize, x: &mut [f32], norms: &mut [f32]) {
    for (row, len) in x.chunks_exact_mut(d).zip(norms.iter_mut()) {
        *len = dot(row, row).sqrt().max(MIN_NORM);
        let inv = 1.0 / *len;
        row.iter_mut().for_each(|v| *v *= inv);
    }
}

/// Back through [`normalize_rows`] in place: `dx = (dx̂ − x̂ (x̂ · dx̂)) / ‖x‖` per row, with
/// `unit` the normalised rows.
fn normalize_back(d: usize, unit: &[f32], norms: &[f32], grad: &mut [f32]) {
    for ((u, g), len) in unit
        .chunks_exact(d)
        .zip(grad.chunks_exact_mut(d))
        .zip(norms)
    {
        let along = dot(u, g);
        let inv = 1.0 / len;
        for (gk, uk) in g.iter_mut().zip(u) {
            *gk = (*gk - uk * along) * inv;
        }
    }
}

/// Squared distances `‖q_i − t_j‖²` from the products `prod = q · tᵀ` in place (`b x n`).
fn squared_distances(d: usize, q: &[f32], t: &[f32], prod: &mut [f32]) {
    let t_sq: Vec<f32> = t.chunks_exact(d).map(|r| dot(r, r)).collect();
    let n = t_sq.len();
    for (row, qi) in prod.chunks_exact_mut(n).zip(q.chunks_exact(d)) {
        let q_sq = dot(qi, qi);
        for (v, tj) in row.iter_mut().zip(&t_sq) {
            *v = (q_sq - 2.0 * *v + tj).max(0.0);
        }
    }
}

/// The score of query row `q` against target row `t` under `cmp` (`cos` on unit rows).
fn pair_score(cmp: Comparator, q: &[f32], t: &[f32]) -> f32 {
    match cmp {
        Comparator::Dot | Comparator::Cos => dot(q, t),
        Comparator::L2 | Comparator::SquaredL2 => {
            let sq: f32 = q.iter().zip(t).map(|(x, y)| (x - y) * (x - y)).sum();
            if cmp == Comparator::L2 {
                -(sq + DIST_EPS).sqrt()
            } else {
                -sq
            }
        }
    }
}

/// The query rows `a = op(s)` into `s.phi`, scaled to unit length for `cos` (their lengths
/// into `norms`, `b` reals).
fn queries<O: OperatorRows>(
    model: &Shape,
    b: usize,
    src: &[f32],
    rel: &[f32],
    s: &mut Scratch,
    norms: &mut [f32],
) {
    let d = model.dim;
    fit(&mut s.phi, b * d);
    combine_rows::<O>(model, b, src, rel, &mut s.phi);
    if model.pbg.comparator == Comparator::Cos {
        normalize_rows(d, &mut s.phi, norms);
    }
}

/// Turns the products `q · tᵀ` in `out` (`b x n`) into scores under `cmp`; for `l2`, keeps
/// the distances in `dist` (resized to `b x n`).
fn finish_scores(
    cmp: Comparator,
    d: usize,
    q: &[f32],
    t: &[f32],
    out: &mut [f32],
    dist: &mut Vec<f32>,
) {
    match cmp {
        Comparator::Dot | Comparator::Cos => {}
        Comparator::SquaredL2 => {
            squared_distances(d, q, t, out);
            out.iter_mut().for_each(|v| *v = -*v);
        }
        Comparator::L2 => {
            squared_distances(d, q, t, out);
            fit(dist, out.len());
            for (v, dv) in out.iter_mut().zip(dist.iter_mut()) {
                *dv = (*v + DIST_EPS).sqrt();
                *v = -*dv;
            }
        }
    }
}

/// Candidate scores of a `pbg` model (see [`super::score_candidates`]).
fn score<O: OperatorRows>(model: &Shape, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch) {
    let ScoreBatch {
        b,
        n,
        src,
        rel,
        cands,
    } = *q;
    let (d, cmp) = (model.dim, model.pbg.comparator);
    // Taken out of the scratch so that its rows can be read while the rest is written.
    let mut cs = std::mem::take(&mut s.cos);
    fit(&mut cs.norms, b + n);
    let (q_norms, c_norms) = cs.norms.split_at_mut(b);
    queries::<O>(model, b, src, rel, s, q_norms);
    let cands = if cmp == Comparator::Cos {
        cs.neg.clear();
        cs.neg.extend_from_slice(cands);
        normalize_rows(d, &mut cs.neg, c_norms);
        &cs.neg[..]
    } else {
        cands
    };
    gemm_abt(b, n, d, 1.0, &s.phi, cands, 0.0, out);
    finish_scores(cmp, d, &s.phi, cands, out, &mut s.aux);
    s.cos = cs;
}

/// The training step of a `pbg` model (see [`super::chunk_step`]).
#[allow(clippy::needless_range_loop)] // index loops over parallel arrays
fn step<O: OperatorRows>(
    model: &Shape,
    loss: &Loss,
    c: &Chunk,
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    debug_assert!(
        c.pos_query.is_none(),
        "the config refuses independent dropout masks for pbg"
    );
    let (b, n) = (c.b, c.n);
    let (d, rd, cmp) = (model.dim, model.rel_dim(), model.pbg.comparator);
    let cos = cmp == Comparator::Cos;
    // Taken out of the scratch so that its rows can be read while the rest is written.
    let mut cs = std::mem::take(&mut s.cos);
    fit(&mut cs.norms, 2 * b + n);
    let (q_norms, rest) = cs.norms.split_at_mut(b);
    let (dst_norms, neg_norms) = rest.split_at_mut(b);
    queries::<O>(model, b, c.src, c.rel, s, q_norms);
    // The targets as compared: unit-length copies for cos.
    let (dst, neg) = if cos {
        cs.dst.clear();
        cs.dst.extend_from_slice(c.dst);
        cs.neg.clear();
        cs.neg.extend_from_slice(c.neg);
        normalize_rows(d, &mut cs.dst, dst_norms);
        normalize_rows(d, &mut cs.neg, neg_norms);
        (&cs.dst[..], &cs.neg[..])
    } else {
        (c.dst, c.neg)
    };
    for i in 0..b {
        s.pos[i] = pair_score(cmp, &s.phi[i * d..(i + 1) * d], &dst[i * d..(i + 1) * d]);
    }
    gemm_abt(b, n, d, 1.0, &s.phi, neg, 0.0, &mut s.scores);
    finish_scores(cmp, d, &s.phi, neg, &mut s.scores, &mut s.aux);
    let total = apply_loss(loss, c, s);

    // The weights W = d loss / d score become the weights of the products q · tᵀ (in
    // s.scores) and, for the distances, of ‖q_i‖² (row sums) and ‖t_j‖² (column sums):
    // score = f(‖q‖² − 2 q · t + ‖t‖²).
    let mut row_w = vec![0.0f32; b];
    let mut col_w = vec![0.0f32; n];
    if matches!(cmp, Comparator::L2 | Comparator::SquaredL2) {
        for i in 0..b {
            for j in 0..n {
                let w = s.scores[i * n + j];
                // f'(sq): −1 for squared_l2, −1 / (2 dist) for l2.
                let w_sq = if cmp == Comparator::L2 {
                    -w / (2.0 * s.aux[i * n + j])
                } else {
                    -w
                };
                row_w[i] += w_sq;
                col_w[j] += w_sq;
                s.scores[i * n + j] = -2.0 * w_sq;
            }
        }
    }
    fit(&mut s.dphi, b * d);
    gemm_ab(b, d, n, 1.0, &s.scores, neg, 0.0, &mut s.dphi);
    gemm_atb(n, d, b, 1.0, &s.scores, &s.phi, 0.0, &mut g.neg);
    for (j, w) in col_w.iter().enumerate() {
        if *w != 0.0 {
            let (gn, t) = (&mut g.neg[j * d..(j + 1) * d], &neg[j * d..(j + 1) * d]);
            gn.iter_mut()
                .zip(t)
                .for_each(|(gk, tk)| *gk += 2.0 * w * tk);
        }
    }
    for i in 0..b {
        let (q, t) = (&s.phi[i * d..(i + 1) * d], &dst[i * d..(i + 1) * d]);
        let (dq, gt) = (
            &mut s.dphi[i * d..(i + 1) * d],
            &mut g.dst[i * d..(i + 1) * d],
        );
        let dp = s.dpos[i];
        // d pos / d q = ∂q, d pos / d t = ∂t, each times dp.
        let (wq, wt) = match cmp {
            Comparator::Dot | Comparator::Cos => (0.0, 0.0),
            Comparator::SquaredL2 => (-2.0 * dp, 2.0 * dp),
            Comparator::L2 => {
                let dist = -s.pos[i];
                (-dp / dist, dp / dist)
            }
        };
        for k in 0..d {
            dq[k] += 2.0 * row_w[i] * q[k];
            if matches!(cmp, Comparator::Dot | Comparator::Cos) {
                dq[k] += dp * t[k];
                gt[k] = dp * q[k];
            } else {
                let diff = q[k] - t[k];
                dq[k] += wq * diff;
                gt[k] = wt * diff;
            }
        }
    }
    if cos {
        normalize_back(d, &s.phi, q_norms, &mut s.dphi);
        normalize_back(d, dst, dst_norms, &mut g.dst);
        normalize_back(d, neg, neg_norms, &mut g.neg);
    }
    for i in 0..b {
        O::back(
            d,
            &s.dphi[i * d..(i + 1) * d],
            &c.src[i * d..(i + 1) * d],
            &c.rel[i * rd..(i + 1) * rd],
            &mut g.src[i * d..(i + 1) * d],
            &mut g.rel[i * rd..(i + 1) * rd],
        );
    }
    s.cos = cs;
    total
}
