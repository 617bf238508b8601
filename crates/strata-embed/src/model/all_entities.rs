//! 1vsAll and KvsAll (LibKGE's `train.type`): `b` queries `(s, r, ?)` scored against `n`
//! candidate entities as one matrix product `q(s, r) · candᵀ` (`b x d` by `d x n`), with a
//! loss over every candidate, and the backward pass as two more products (to the query rows
//! and to every candidate row), as the negative-sampling step does with its negatives.
//!
//! Labels: 1vsAll labels each query with its one true candidate (Lacroix et al. 2018),
//! KvsAll with every known answer of the query (Dettmers et al. 2018). With label smoothing
//! `ls > 0` the label row `y` becomes `(1 − ls) y + 1/n` (LibKGE's and ConvE's formula).
//! Losses: `softmax` is the cross-entropy of the softmax over all candidates against `y`
//! normalised to sum 1 (LibKGE's `kl`; for an unsmoothed 1vsAll label, its `ce`), gradient
//! `p − ŷ`; `logistic` is the BCE of each candidate's score shifted by `γ` (LibKGE's `bce`
//! with `loss_arg`), `Σ_j softplus(x_j) − y_j x_j`, gradient `σ(x) − y`. Each query's term is
//! scaled by its weight, and the loss is summed over queries (Strata's unit; LibKGE divides by
//! the batch size, which Adagrad's step does not see).

use super::score::{fit, sigmoid, softplus, Loss, LossKind, ProductQuery, Shape};
use crate::compute::kernels::{self, exp_sum, gemm_ab, gemm_abt, gemm_atb};

/// Each query's true candidates (indices below `n`).
#[derive(Debug, Clone, Copy)]
pub enum Labels<'a> {
    /// 1vsAll: query `i`'s one true candidate is `one[i]`.
    One(&'a [u32]),
    /// KvsAll: query `i`'s are `ids[offsets[i]..offsets[i + 1]]` (distinct; `b + 1` offsets).
    Many { offsets: &'a [u32], ids: &'a [u32] },
}

impl Labels<'_> {
    /// Query `i`'s true candidates.
    fn of(&self, i: usize) -> &[u32] {
        match self {
            Labels::One(one) => std::slice::from_ref(&one[i]),
            Labels::Many { offsets, ids } => &ids[offsets[i] as usize..offsets[i + 1] as usize],
        }
    }
}

/// One step's inputs: `b` queries (source rows `src`, `b x d`; relation rows `rel`,
/// `b x rel_dim`) against `n` candidate rows `cands` (`n x d`), row-major.
#[derive(Debug, Clone, Copy)]
pub struct AllBatch<'a> {
    pub b: usize,
    pub n: usize,
    pub src: &'a [f32],
    pub rel: &'a [f32],
    pub cands: &'a [f32],
    pub labels: Labels<'a>,
    /// Each query's weight (`b`), or empty: every weight 1.
    pub weights: &'a [f32],
    /// `ls` of the labels `(1 − ls) y + 1/n`; 0: unsmoothed.
    pub label_smoothing: f32,
}

/// Buffers reused across steps, and the gradients of the last one.
#[derive(Default)]
pub struct AllScratch {
    /// The query rows, `b x d`.
    q: Vec<f32>,
    /// `d loss / d q`, `b x d`.
    dq: Vec<f32>,
    /// Scores, then `d loss / d score` in place, `b x n`.
    scores: Vec<f32>,
    /// Gradients of the source rows (`b x d`), relation rows (`b x rel_dim`) and candidate
    /// rows (`n x d`).
    pub g_src: Vec<f32>,
    pub g_rel: Vec<f32>,
    pub g_cands: Vec<f32>,
}

/// The loss of `c`'s queries against all its candidates under `loss` (softmax or logistic,
/// with the logistic shift `γ`), with the gradients of the source, relation and candidate
/// rows left in `s.g_src`, `s.g_rel` and `s.g_cands`. Three matrix products of
/// `b x n x d` multiply-adds.
pub fn all_step(
    model: &Shape,
    loss: &Loss,
    query: &ProductQuery,
    c: &AllBatch,
    s: &mut AllScratch,
) -> f64 {
    let (b, n, d) = (c.b, c.n, model.dim);
    debug_assert!(c.weights.is_empty() || c.weights.len() == b);
    fit(&mut s.q, b * d);
    fit(&mut s.dq, b * d);
    fit(&mut s.scores, b * n);
    fit(&mut s.g_src, b * d);
    fit(&mut s.g_rel, b * model.rel_dim());
    fit(&mut s.g_cands, n * d);
    (query.combine)(model, b, c.src, c.rel, &mut s.q);
    gemm_abt(b, n, d, 1.0, &s.q, c.cands, 0.0, &mut s.scores);
    let mut total = 0.0f64;
    for i in 0..b {
        let row = &mut s.scores[i * n..(i + 1) * n];
        let term = match loss.kind {
            LossKind::Softmax => softmax_row(row, c.labels.of(i), c.label_smoothing),
            LossKind::Logistic => bce_row(row, c.labels.of(i), c.label_smoothing, loss.gamma),
            LossKind::Margin => unreachable!("the config refuses loss margin with 1vsAll/KvsAll"),
        };
        match c.weights.get(i) {
            Some(&w) => {
                total += w as f64 * term;
                row.iter_mut().for_each(|v| *v *= w);
            }
            None => total += term,
        }
    }
    // dq = G · cands ;  dcands = Gᵀ · q
    gemm_ab(b, d, n, 1.0, &s.scores, c.cands, 0.0, &mut s.dq);
    gemm_atb(n, d, b, 1.0, &s.scores, &s.q, 0.0, &mut s.g_cands);
    (query.back)(model, b, &s.dq, c.src, c.rel, &mut s.g_src, &mut s.g_rel);
    total
}

/// The smoothed label of a true candidate and of every other one, `(on, off)`, of a row of
/// `n` candidates: `(1, 0)` unsmoothed, `(1 − ls + 1/n, 1/n)` smoothed.
fn label_values(ls: f32, n: usize) -> (f32, f32) {
    if ls > 0.0 {
        let off = 1.0 / n as f32;
        (1.0 - ls + off, off)
    } else {
        (1.0, 0.0)
    }
}

/// Cross-entropy of `softmax(row)` against the labels normalised to sum 1; `row` becomes
/// `d loss / d row = p − ŷ`.
fn softmax_row(row: &mut [f32], labels: &[u32], ls: f32) -> f64 {
    let n = row.len();
    let (on, off) = label_values(ls, n);
    let mass = on * labels.len() as f32 + off * (n - labels.len()) as f32;
    let (on, off) = (on / mass, off / mass);
    // Σ_j ŷ_j x_j before the row turns into probabilities.
    let mut target = 0.0f64;
    if off > 0.0 {
        target += off as f64 * row.iter().map(|&x| x as f64).sum::<f64>();
    }
    for &j in labels {
        target += (on - off) as f64 * row[j as usize] as f64;
    }
    let shift = kernels::max(row);
    let z = exp_sum(row, shift);
    let inv = 1.0 / z;
    for v in row.iter_mut() {
        *v = *v * inv - off;
    }
    for &j in labels {
        row[j as usize] -= on - off;
    }
    // Σ ŷ = 1, so −Σ ŷ log p = log Σ exp(x) − Σ ŷ x.
    (shift + z.ln()) as f64 - target
}

/// `Σ_j softplus(x_j) − y_j x_j` with `x = row + γ`; `row` becomes `σ(x) − y`.
fn bce_row(row: &mut [f32], labels: &[u32], ls: f32, gamma: f32) -> f64 {
    let (on, off) = label_values(ls, row.len());
    // The true candidates' part of −Σ y x beyond `off`, before the row is overwritten.
    let mut total: f64 = labels
        .iter()
        .map(|&j| -((on - off) * (row[j as usize] + gamma)) as f64)
        .sum();
    for v in row.iter_mut() {
        let x = *v + gamma;
        total += (softplus(x) - off * x) as f64;
        *v = sigmoid(x) - off;
    }
    for &j in labels {
        row[j as usize] -= on - off;
    }
    total
}

#[cfg(test)]
mod tests;
