//! Score functions and losses, forward and backward for one chunk in one direction.
//!
//! A chunk is `b` true edges `(s, r, t)` and `n` candidate targets shared by all of them
//! (negatives). The step corrupts targets; the other direction is the same step on
//! `(t, r⁻¹, s)` with reciprocal relation rows (see `epoch`). For the multiplicative models
//! (dot, DistMult, ComplEx) the score is `φ(s, r) · t`, so all `b x n` negative scores are one
//! matrix product and the backward pass is two more, reusing `φ` and the loss weights computed
//! in the forward pass (Legend §6 on a CPU). TransE-L2 expands `‖a − t‖²` into the same products.
//! TransE-L1 and RotatE are computed pairwise.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use strata_store::rng::Rng;

use crate::kernels::{dot, exp_sum, gemm_ab, gemm_abt, gemm_atb};

/// Which score function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ScoreKind {
    /// `s · t`: graph embeddings without relation types.
    Dot,
    /// `−‖s + r − t‖` in the L1 or L2 norm.
    TransE,
    /// `⟨s, r, t⟩`.
    DistMult,
    /// `Re⟨s, r, conj t⟩` with `d/2` complex coordinates.
    ComplEx,
    /// `−Σ_k |s_k r_k − t_k|` with `r` unit complex numbers (phases).
    RotatE,
}

/// Which loss over a positive score and its negatives.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// Cross-entropy of the positive among `[positive, negatives]` (the Legend/Marius loss).
    Softmax,
    /// `softplus(−pos) + mean_j softplus(neg_j)`.
    Logistic,
    /// `Σ_j max(0, margin − pos + neg_j)`.
    Margin,
}

/// A score function of a given dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreModel {
    pub kind: ScoreKind,
    /// Reals per node embedding.
    pub dim: usize,
    /// 1 or 2: the norm of TransE.
    pub transe_norm: u8,
}

impl ScoreModel {
    /// Reals per relation row (0 for dot).
    pub fn rel_dim(&self) -> usize {
        match self.kind {
            ScoreKind::Dot => 0,
            ScoreKind::RotatE => self.dim / 2,
            _ => self.dim,
        }
    }

    /// The initial value of a relation row, drawn from `rng`. Not the identity: an identity
    /// relation scores a node against itself highest (`‖h‖²` for ComplEx and DistMult, distance
    /// 0 for TransE and RotatE), and since a node is almost never its own sampled negative, that
    /// bias survives training and ranks the query's own node first. Unit complex numbers with
    /// random phases (ComplEx, RotatE) and random signs (DistMult) start every relation as an
    /// isometry without a preferred self-score; TransE starts from normal offsets of the node
    /// embeddings' scale (`scale`) and must learn translations long enough to leave the node.
    pub fn init_relation(&self, row: &mut [f32], rng: &mut Rng, scale: f32) {
        let phase =
            |rng: &mut Rng| (rng.next_f64() * std::f64::consts::TAU - std::f64::consts::PI) as f32;
        match self.kind {
            ScoreKind::Dot => {}
            ScoreKind::DistMult => row
                .iter_mut()
                .for_each(|v| *v = if rng.below(2) == 0 { 1.0 } else { -1.0 }),
            ScoreKind::ComplEx => {
                let h = self.dim / 2;
                for k in 0..h {
                    let theta = phase(rng);
                    row[k] = theta.cos();
                    row[h + k] = theta.sin();
                }
            }
            ScoreKind::RotatE => row.iter_mut().for_each(|v| *v = phase(rng)),
            ScoreKind::TransE => {
                for pair in row.chunks_mut(2) {
                    let (a, b) = rng.normal_pair();
                    pair[0] = a as f32 * scale;
                    if pair.len() > 1 {
                        pair[1] = b as f32 * scale;
                    }
                }
            }
        }
    }

    /// Turns relation row `r` of `(h, r, t)` into the row that scores `(t, r', h)` like a tail
    /// query, so that heads can be corrupted without reciprocal relations: the conjugate for
    /// ComplEx, the opposite rotation for RotatE, `-r` for TransE, `r` itself for DistMult.
    /// The map is linear and its own transpose, so it also carries the gradient of `r'` back
    /// to `r`.
    pub fn reverse_relation(&self, row: &mut [f32]) {
        match self.kind {
            ScoreKind::Dot | ScoreKind::DistMult => {}
            ScoreKind::ComplEx => row[self.dim / 2..].iter_mut().for_each(|v| *v = -*v),
            ScoreKind::TransE | ScoreKind::RotatE => row.iter_mut().for_each(|v| *v = -*v),
        }
    }

    /// Multiply-adds per chunk direction for `b` edges and `n` negatives (forward + backward),
    /// for the FLOP/s report.
    pub fn flops(&self, b: usize, n: usize) -> f64 {
        // Three b x n x d products (scores, dφ, dneg) at 2 FLOPs per multiply-add, plus the
        // pairwise models' elementwise work of the same order.
        6.0 * (b * n * self.dim) as f64
    }
}

/// Gradients of one chunk direction (same shapes as the inputs).
#[derive(Default)]
pub struct Grads {
    pub src: Vec<f32>,
    pub rel: Vec<f32>,
    pub dst: Vec<f32>,
    pub neg: Vec<f32>,
}

/// Buffers reused across chunks.
#[derive(Default)]
pub struct Scratch {
    phi: Vec<f32>,
    dphi: Vec<f32>,
    scores: Vec<f32>,
    pos: Vec<f32>,
    dpos: Vec<f32>,
    aux: Vec<f32>,
}

/// Sizes a scratch buffer to `len` without clearing it: every caller overwrites it (matrix
/// products with beta 0, element assignments) unless it zeroes it with [`zeroed`].
fn fit(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

/// Sizes a buffer to `len` zeros (for gradients accumulated with `+=`).
fn zeroed(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

/// Loss of one chunk direction, with every gradient written into `g` (resized to fit).
/// `src: b x d`, `rel: b x rel_dim`, `dst: b x d`, `neg: n x d`, all row-major.
#[allow(clippy::too_many_arguments)]
pub fn chunk_step(
    model: &ScoreModel,
    loss: LossKind,
    margin: f32,
    b: usize,
    n: usize,
    src: &[f32],
    rel: &[f32],
    dst: &[f32],
    neg: &[f32],
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    let d = model.dim;
    fit(&mut g.src, b * d);
    fit(&mut g.rel, b * model.rel_dim());
    fit(&mut g.dst, b * d);
    fit(&mut g.neg, n * d);
    fit(&mut s.scores, b * n);
    fit(&mut s.pos, b);
    fit(&mut s.dpos, b);
    match model.kind {
        ScoreKind::Dot | ScoreKind::DistMult | ScoreKind::ComplEx => {
            multiplicative(model, loss, margin, b, n, src, rel, dst, neg, g, s)
        }
        ScoreKind::TransE if model.transe_norm == 2 => {
            transe_l2(model, loss, margin, b, n, src, rel, dst, neg, g, s)
        }
        ScoreKind::TransE | ScoreKind::RotatE => {
            pairwise(model, loss, margin, b, n, src, rel, dst, neg, g, s)
        }
    }
}

/// Turns scores into the loss and, in place, into `d loss / d score` (for negatives in
/// `s.scores`, for positives in `s.dpos`).
fn apply_loss(loss: LossKind, margin: f32, b: usize, n: usize, s: &mut Scratch) -> f64 {
    let mut total = 0.0f64;
    for i in 0..b {
        let pos = s.pos[i];
        let row = &mut s.scores[i * n..(i + 1) * n];
        match loss {
            LossKind::Softmax => {
                // log Σ exp over [pos, negs], shifted by the max for stability.
                let shift = pos.max(max_of(row));
                let neg_sum = exp_sum(row, shift);
                let pos_exp = (pos - shift).exp();
                let z = neg_sum + pos_exp;
                total += (shift + z.ln() - pos) as f64;
                let inv = 1.0 / z;
                for v in row.iter_mut() {
                    *v *= inv;
                }
                s.dpos[i] = pos_exp * inv - 1.0;
            }
            LossKind::Logistic => {
                let inv_n = 1.0 / n as f32;
                total += softplus(-pos) as f64;
                s.dpos[i] = -sigmoid(-pos);
                for v in row.iter_mut() {
                    total += (softplus(*v) * inv_n) as f64;
                    *v = sigmoid(*v) * inv_n;
                }
            }
            LossKind::Margin => {
                let mut active = 0.0f32;
                for v in row.iter_mut() {
                    let l = margin - pos + *v;
                    if l > 0.0 {
                        total += l as f64;
                        active += 1.0;
                        *v = 1.0;
                    } else {
                        *v = 0.0;
                    }
                }
                s.dpos[i] = -active;
            }
        }
    }
    total
}

/// The largest value of `row` (NaNs ignored), in independent lanes so that it vectorises.
fn max_of(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for l in 0..16 {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&acc)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

#[allow(clippy::too_many_arguments)]
fn multiplicative(
    model: &ScoreModel,
    loss: LossKind,
    margin: f32,
    b: usize,
    n: usize,
    src: &[f32],
    rel: &[f32],
    dst: &[f32],
    neg: &[f32],
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    let d = model.dim;
    let h = d / 2;
    // φ = s ⊗ r.
    fit(&mut s.phi, b * d);
    combine(model, b, src, rel, &mut s.phi);
    for i in 0..b {
        s.pos[i] = dot(&s.phi[i * d..(i + 1) * d], &dst[i * d..(i + 1) * d]);
    }
    gemm_abt(b, n, d, 1.0, &s.phi, neg, 0.0, &mut s.scores);
    let total = apply_loss(loss, margin, b, n, s);
    // dφ = dpos ∘ t + W · neg ;  dt = dpos ∘ φ ;  dneg = Wᵀ · φ
    fit(&mut s.dphi, b * d);
    gemm_ab(b, d, n, 1.0, &s.scores, neg, 0.0, &mut s.dphi);
    for i in 0..b {
        let dp = s.dpos[i];
        let (dphi, t, phi, gt) = (
            &mut s.dphi[i * d..(i + 1) * d],
            &dst[i * d..(i + 1) * d],
            &s.phi[i * d..(i + 1) * d],
            &mut g.dst[i * d..(i + 1) * d],
        );
        for k in 0..d {
            dphi[k] += dp * t[k];
            gt[k] = dp * phi[k];
        }
    }
    gemm_atb(n, d, b, 1.0, &s.scores, &s.phi, 0.0, &mut g.neg);
    // Back through φ.
    for i in 0..b {
        let (dphi, si, gs) = (
            &s.dphi[i * d..(i + 1) * d],
            &src[i * d..(i + 1) * d],
            &mut g.src[i * d..(i + 1) * d],
        );
        match model.kind {
            ScoreKind::Dot => gs.copy_from_slice(dphi),
            ScoreKind::DistMult => {
                let (ri, gr) = (&rel[i * d..(i + 1) * d], &mut g.rel[i * d..(i + 1) * d]);
                for k in 0..d {
                    gs[k] = dphi[k] * ri[k];
                    gr[k] = dphi[k] * si[k];
                }
            }
            _ => {
                let (ri, gr) = (&rel[i * d..(i + 1) * d], &mut g.rel[i * d..(i + 1) * d]);
                for k in 0..h {
                    let (pr, pi) = (dphi[k], dphi[h + k]);
                    let (sr, sim, rr, rim) = (si[k], si[h + k], ri[k], ri[h + k]);
                    gs[k] = pr * rr + pi * rim;
                    gs[h + k] = -pr * rim + pi * rr;
                    gr[k] = pr * sr + pi * sim;
                    gr[h + k] = -pr * sim + pi * sr;
                }
            }
        }
    }
    total
}

#[allow(clippy::too_many_arguments, clippy::needless_range_loop)] // index loops over parallel arrays
fn transe_l2(
    model: &ScoreModel,
    loss: LossKind,
    margin: f32,
    b: usize,
    n: usize,
    src: &[f32],
    rel: &[f32],
    dst: &[f32],
    neg: &[f32],
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    const EPS: f32 = 1e-9;
    let d = model.dim;
    fit(&mut s.phi, b * d);
    combine(model, b, src, rel, &mut s.phi);
    let a_sq: Vec<f32> = (0..b)
        .map(|i| dot(&s.phi[i * d..(i + 1) * d], &s.phi[i * d..(i + 1) * d]))
        .collect();
    let n_sq: Vec<f32> = (0..n)
        .map(|j| dot(&neg[j * d..(j + 1) * d], &neg[j * d..(j + 1) * d]))
        .collect();
    for i in 0..b {
        let (a, t) = (&s.phi[i * d..(i + 1) * d], &dst[i * d..(i + 1) * d]);
        let dist: f32 = a.iter().zip(t).map(|(x, y)| (x - y) * (x - y)).sum::<f32>();
        s.pos[i] = -(dist + EPS).sqrt();
    }
    gemm_abt(b, n, d, -2.0, &s.phi, neg, 0.0, &mut s.scores);
    // Keep the distances for the backward pass; scores = −dist.
    fit(&mut s.aux, b * n);
    for i in 0..b {
        for j in 0..n {
            let sq = (s.scores[i * n + j] + a_sq[i] + n_sq[j]).max(0.0);
            let dist = (sq + EPS).sqrt();
            s.aux[i * n + j] = dist;
            s.scores[i * n + j] = -dist;
        }
    }
    let total = apply_loss(loss, margin, b, n, s);
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
    gemm_ab(b, d, n, -2.0, &s.scores, neg, 0.0, &mut s.dphi);
    gemm_atb(n, d, b, -2.0, &s.scores, &s.phi, 0.0, &mut g.neg);
    for j in 0..n {
        for k in 0..d {
            g.neg[j * d + k] += 2.0 * col_sum[j] * neg[j * d + k];
        }
    }
    for i in 0..b {
        let (a, t) = (&s.phi[i * d..(i + 1) * d], &dst[i * d..(i + 1) * d]);
        let dist = -s.pos[i];
        let dp = s.dpos[i];
        for k in 0..d {
            let diff = a[k] - t[k];
            let da = s.dphi[i * d + k] + 2.0 * row_sum[i] * a[k] - dp * diff / dist;
            g.src[i * d + k] = da;
            g.rel[i * d + k] = da;
            g.dst[i * d + k] = dp * diff / dist;
        }
    }
    total
}

/// TransE-L1 and RotatE: `a = s ⊕ r`, score `−Σ_k dist_k(a, t)` computed for every pair.
#[allow(clippy::too_many_arguments)]
fn pairwise(
    model: &ScoreModel,
    loss: LossKind,
    margin: f32,
    b: usize,
    n: usize,
    src: &[f32],
    rel: &[f32],
    dst: &[f32],
    neg: &[f32],
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    let d = model.dim;
    let h = d / 2;
    let rotate = model.kind == ScoreKind::RotatE;
    fit(&mut s.phi, b * d);
    combine(model, b, src, rel, &mut s.phi);
    let score = |a: &[f32], t: &[f32]| -> f32 {
        if rotate {
            -(0..h)
                .map(|k| ((a[k] - t[k]).powi(2) + (a[h + k] - t[h + k]).powi(2) + 1e-9).sqrt())
                .sum::<f32>()
        } else {
            -a.iter().zip(t).map(|(x, y)| (x - y).abs()).sum::<f32>()
        }
    };
    for i in 0..b {
        s.pos[i] = score(&s.phi[i * d..(i + 1) * d], &dst[i * d..(i + 1) * d]);
        for j in 0..n {
            s.scores[i * n + j] = score(&s.phi[i * d..(i + 1) * d], &neg[j * d..(j + 1) * d]);
        }
    }
    let total = apply_loss(loss, margin, b, n, s);
    // d score / d a and d score / d t for one pair, accumulated with weight w.
    let grad_pair = |a: &[f32], t: &[f32], w: f32, da: &mut [f32], dt: &mut [f32]| {
        if rotate {
            for k in 0..h {
                let (xr, xi) = (a[k] - t[k], a[h + k] - t[h + k]);
                let m = (xr * xr + xi * xi + 1e-9).sqrt();
                da[k] -= w * xr / m;
                da[h + k] -= w * xi / m;
                dt[k] += w * xr / m;
                dt[h + k] += w * xi / m;
            }
        } else {
            for k in 0..d {
                let sg = (a[k] - t[k]).signum();
                da[k] -= w * sg;
                dt[k] += w * sg;
            }
        }
    };
    zeroed(&mut g.dst, b * d);
    zeroed(&mut g.neg, n * d);
    zeroed(&mut s.dphi, b * d);
    for i in 0..b {
        let a = &s.phi[i * d..(i + 1) * d];
        let da = &mut s.dphi[i * d..(i + 1) * d];
        grad_pair(
            a,
            &dst[i * d..(i + 1) * d],
            s.dpos[i],
            da,
            &mut g.dst[i * d..(i + 1) * d],
        );
        for j in 0..n {
            let w = s.scores[i * n + j];
            if w != 0.0 {
                grad_pair(
                    a,
                    &neg[j * d..(j + 1) * d],
                    w,
                    da,
                    &mut g.neg[j * d..(j + 1) * d],
                );
            }
        }
    }
    for i in 0..b {
        let da = &s.dphi[i * d..(i + 1) * d];
        if rotate {
            let a = &s.phi[i * d..(i + 1) * d];
            let ri = &rel[i * h..(i + 1) * h];
            for k in 0..h {
                let (c, sn) = (ri[k].cos(), ri[k].sin());
                g.src[i * d + k] = da[k] * c + da[h + k] * sn;
                g.src[i * d + h + k] = -da[k] * sn + da[h + k] * c;
                g.rel[i * h + k] = -da[k] * a[h + k] + da[h + k] * a[k];
            }
        } else {
            g.src[i * d..(i + 1) * d].copy_from_slice(da);
            g.rel[i * d..(i + 1) * d].copy_from_slice(da);
        }
    }
    total
}

/// Scores of `b` queries `(src, rel)` against `n` candidate targets, forward only, into
/// `out` (`b x n`): the same score functions as training, for evaluation and prediction.
#[allow(clippy::too_many_arguments)]
pub fn score_candidates(
    model: &ScoreModel,
    b: usize,
    n: usize,
    src: &[f32],
    rel: &[f32],
    cands: &[f32],
    out: &mut [f32],
    s: &mut Scratch,
) {
    let d = model.dim;
    let h = d / 2;
    fit(&mut s.phi, b * d);
    combine(model, b, src, rel, &mut s.phi);
    match model.kind {
        ScoreKind::Dot | ScoreKind::DistMult | ScoreKind::ComplEx => {
            gemm_abt(b, n, d, 1.0, &s.phi, cands, 0.0, out)
        }
        ScoreKind::TransE if model.transe_norm == 2 => {
            gemm_abt(b, n, d, -2.0, &s.phi, cands, 0.0, out);
            for i in 0..b {
                let a_sq = dot(&s.phi[i * d..(i + 1) * d], &s.phi[i * d..(i + 1) * d]);
                for j in 0..n {
                    let c = &cands[j * d..(j + 1) * d];
                    let sq = (out[i * n + j] + a_sq + dot(c, c)).max(0.0);
                    out[i * n + j] = -(sq + 1e-9).sqrt();
                }
            }
        }
        ScoreKind::TransE => {
            for i in 0..b {
                let a = &s.phi[i * d..(i + 1) * d];
                for j in 0..n {
                    let c = &cands[j * d..(j + 1) * d];
                    out[i * n + j] = -a.iter().zip(c).map(|(x, y)| (x - y).abs()).sum::<f32>();
                }
            }
        }
        ScoreKind::RotatE => {
            for i in 0..b {
                let a = &s.phi[i * d..(i + 1) * d];
                for j in 0..n {
                    let c = &cands[j * d..(j + 1) * d];
                    out[i * n + j] = -(0..h)
                        .map(|k| {
                            ((a[k] - c[k]).powi(2) + (a[h + k] - c[h + k]).powi(2) + 1e-9).sqrt()
                        })
                        .sum::<f32>();
                }
            }
        }
    }
}

/// `a = src ⊗ rel` row by row: the query vector the targets are scored against.
fn combine(model: &ScoreModel, b: usize, src: &[f32], rel: &[f32], a: &mut [f32]) {
    let d = model.dim;
    let h = d / 2;
    for i in 0..b {
        let (si, ai) = (&src[i * d..(i + 1) * d], &mut a[i * d..(i + 1) * d]);
        match model.kind {
            ScoreKind::Dot => ai.copy_from_slice(si),
            ScoreKind::DistMult => {
                let ri = &rel[i * d..(i + 1) * d];
                for k in 0..d {
                    ai[k] = si[k] * ri[k];
                }
            }
            ScoreKind::ComplEx => {
                let ri = &rel[i * d..(i + 1) * d];
                for k in 0..h {
                    let (sr, sim, rr, rim) = (si[k], si[h + k], ri[k], ri[h + k]);
                    ai[k] = sr * rr - sim * rim;
                    ai[h + k] = sr * rim + sim * rr;
                }
            }
            ScoreKind::TransE => {
                let ri = &rel[i * d..(i + 1) * d];
                for k in 0..d {
                    ai[k] = si[k] + ri[k];
                }
            }
            ScoreKind::RotatE => {
                let ri = &rel[i * h..(i + 1) * h];
                for k in 0..h {
                    let (c, sn) = (ri[k].cos(), ri[k].sin());
                    ai[k] = si[k] * c - si[h + k] * sn;
                    ai[h + k] = si[k] * sn + si[h + k] * c;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
