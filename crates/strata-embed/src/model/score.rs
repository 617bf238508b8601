//! What a score function is: the [`ScoreFunction`] trait the registered models implement, the
//! [`Shape`] of the model they score for, a chunk's inputs, gradients and scratch, and the
//! losses. It sits beside the registry in `mod.rs`, so the models need nothing of their parent.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use strata_store::rng::Rng;

use super::form::{Comparator, PbgForm};
use crate::compute::kernels::{self, exp_sum};

/// What a score function reads of the model it scores for: the widths and the options of
/// `ScoreModel`, without the registry's kind (so that the functions need nothing of the
/// registry that lists them).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Shape {
    /// Reals per node embedding.
    pub dim: usize,
    /// 1 or 2: the norm of TransE.
    pub transe_norm: u8,
    /// The operator and comparator of `pbg`.
    pub pbg: PbgForm,
    /// Reals per relation row (the model's [`ScoreFunction::rel_dim`]).
    rel_dim: usize,
}

impl Shape {
    /// The shape of a model of `dim` reals per node row, `rel_dim` per relation row.
    pub fn new(dim: usize, transe_norm: u8, pbg: PbgForm, rel_dim: usize) -> Shape {
        Shape {
            dim,
            transe_norm,
            pbg,
            rel_dim,
        }
    }

    /// Reals per relation row.
    pub fn rel_dim(&self) -> usize {
        self.rel_dim
    }
}

/// A score function: how relation rows are shaped and initialised, and the training step and
/// candidate scoring of one chunk. Implementations are unit types, registered in
/// `ScoreKind` with their [`strata_store::registry::Named`] name and help.
pub trait ScoreFunction: Sync {
    /// Reals per relation row of `model` (0: no relation rows).
    fn rel_dim(&self, dim: usize, pbg: PbgForm) -> usize;

    /// Why node embeddings of `dim` reals do not fit the model (a message for `embed.train.dim`).
    fn check_dim(&self, _dim: usize) -> Result<(), String> {
        Ok(())
    }

    /// Draws the initial value of relation row `row` (`rel_dim` reals) from `rng`; `scale` is
    /// the standard deviation of the node embeddings. See `ScoreModel::init_relation`.
    fn init_relation(&self, model: &Shape, row: &mut [f32], rng: &mut Rng, scale: f32);

    /// Turns relation row `r` of `(h, r, t)` into the row that scores `(t, r', h)` like a tail
    /// query; linear and its own transpose. See `ScoreModel::reverse_relation`.
    fn reverse_relation(&self, model: &Shape, row: &mut [f32]);

    /// `b x n` score matrices a worker keeps per chunk besides the scores (the budget's worker
    /// scratch): 0 unless the step keeps another (TransE's distances).
    fn extra_score_matrices(&self) -> u64 {
        0
    }

    /// How the reals of `model`'s node rows and relation rows group into the coordinates a
    /// regularizer measures: `(nodes, relations)`.
    fn layouts(&self, model: &Shape) -> (Layout, Layout);

    /// The comparator of the model's geometry: what `embed neighbors` compares embeddings by
    /// when asked for the model's own metric.
    fn natural_comparator(&self, model: &Shape) -> Comparator;

    /// PyTorch-BigGraph's operator and comparator that score exactly as `model`, or why none
    /// does (a message naming the model).
    fn pbg_form(&self, model: &Shape) -> Result<PbgForm, String>;

    /// One chunk direction: the loss, with every gradient in `g`. See `chunk_step`.
    fn step(&self, model: &Shape, loss: &Loss, c: &Chunk, g: &mut Grads, s: &mut Scratch) -> f64;

    /// Scores of `q`'s queries against its candidates into `out`. See `score_candidates`.
    fn score(&self, model: &Shape, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch);

    /// The query rows of a model whose score is a product `q(s, r) · t` with the target row,
    /// which 1vsAll and KvsAll score against every entity as one matrix product; or why the
    /// model's score is not one (`ScoreModel::product_query` puts the model's name before it).
    fn product_query(&self, _model: &Shape) -> Result<ProductQuery, String> {
        Err(
            "scores by a distance, not a product with the target row; scoring every entity \
             would need a full-table distance kernel of its own, which Strata does not have (use \
             a bilinear model: dot, distmult, complex, or pbg with comparator dot)"
                .into(),
        )
    }
}

/// The query rows of a model whose score is `q(s, r) · t` (see
/// [`ScoreFunction::product_query`]): the rows themselves and their backward pass.
#[derive(Clone, Copy)]
pub struct ProductQuery {
    /// `(model, b, src, rel, out)`: the `b` query rows of `src` (`b x d`) and `rel`
    /// (`b x rel_dim`) into `out` (`b x d`).
    pub combine: fn(&Shape, usize, &[f32], &[f32], &mut [f32]),
    /// `(model, b, dq, src, rel, gs, gr)`: from `dq = d loss / d q` (`b x d`), the gradients
    /// of `src` into `gs` and of `rel` into `gr` (same shapes, overwritten).
    #[allow(clippy::type_complexity)]
    pub back: fn(&Shape, usize, &[f32], &[f32], &[f32], &mut [f32], &mut [f32]),
}

/// How the reals of a row group into coordinates (what a regularizer takes magnitudes of).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Every real is a coordinate.
    Real,
    /// `d/2` real parts, then `d/2` imaginary parts (the row's first `d` reals).
    Complex,
    /// Not regularized.
    Skip,
}

/// How a model turns a source row and a relation row into the query row `a` its targets are
/// scored against (`φ(s, r)` of the bilinear models, `s ⊕ r` of the translations).
pub(super) trait Combine {
    /// `a = s ⊗ r` for one row: `si` and `ai` hold `d` reals, `ri` the relation row.
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]);
}

/// [`Combine::combine`] for each of `b` rows of `src` and `rel` into `a` (`b x d`).
pub(super) fn combine_rows<C: Combine>(
    model: &Shape,
    b: usize,
    src: &[f32],
    rel: &[f32],
    a: &mut [f32],
) {
    let (d, rd) = (model.dim, model.rel_dim());
    for i in 0..b {
        C::combine(
            d,
            &src[i * d..(i + 1) * d],
            &rel[i * rd..(i + 1) * rd],
            &mut a[i * d..(i + 1) * d],
        );
    }
}

/// The query rows the positives are scored from: with [`Chunk::pos_query`], their own
/// `combine(pos src, pos rel)` in `s.phi_pos` (and `s.dphi_pos` zeroed for their gradients),
/// returning true; else false, the positives sharing `s.phi` with the negatives.
pub(super) fn pos_query_rows<C: Combine>(model: &Shape, c: &Chunk, s: &mut Scratch) -> bool {
    let Some(q) = c.pos_query else {
        return false;
    };
    fit(&mut s.phi_pos, c.b * model.dim);
    combine_rows::<C>(model, c.b, q.src, q.rel, &mut s.phi_pos);
    zeroed(&mut s.dphi_pos, c.b * model.dim);
    true
}

/// A row's backward pass through a query row: from `da` (`d` reals), the source row's
/// gradient `gs` (`d` reals) and the relation row's `gr` (`rel_dim` reals), both overwritten.
type BackRow = fn(usize, &[f32], &[f32], &[f32], &mut [f32], &mut [f32]);

/// `back` for each of `b` rows: `da` (`b x d`), `src` (`b x d`) and `rel` (`b x rel_dim`) into
/// `gs` and `gr` of the same shapes.
#[allow(clippy::too_many_arguments)] // the step's arrays, named as in a step
pub(super) fn back_rows(
    model: &Shape,
    b: usize,
    da: &[f32],
    src: &[f32],
    rel: &[f32],
    gs: &mut [f32],
    gr: &mut [f32],
    back: BackRow,
) {
    let (d, rd) = (model.dim, model.rel_dim());
    for i in 0..b {
        back(
            d,
            &da[i * d..(i + 1) * d],
            &src[i * d..(i + 1) * d],
            &rel[i * rd..(i + 1) * rd],
            &mut gs[i * d..(i + 1) * d],
            &mut gr[i * rd..(i + 1) * rd],
        );
    }
}

/// The message of a model whose coordinates are complex numbers (`d/2` real parts, then `d/2`
/// imaginary parts) for an odd `dim`.
pub(super) fn even_dim(name: &str, dim: usize) -> Result<(), String> {
    if dim.is_multiple_of(2) {
        Ok(())
    } else {
        Err(format!(
            "{name} needs an even dim (real and imaginary halves), got {dim}"
        ))
    }
}

/// A uniform phase in `[-π, π)`.
pub(super) fn phase(rng: &mut Rng) -> f32 {
    (rng.next_f64() * std::f64::consts::TAU - std::f64::consts::PI) as f32
}
/// Which loss over a positive score and its negatives.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum LossKind {
    /// Cross-entropy of the positive among `[positive, negatives]` (the Legend/Marius loss).
    Softmax,
    /// `softplus(−(pos + γ)) + mean_j softplus(neg_j + γ)`.
    Logistic,
    /// `Σ_j max(0, margin − pos + neg_j)`.
    Margin,
}

impl LossKind {
    /// Whether self-adversarial weighting applies: to the losses that score each negative on
    /// its own. Softmax's gradient already weights each negative by its softmax probability.
    pub fn takes_adversarial(self) -> bool {
        matches!(self, LossKind::Logistic | LossKind::Margin)
    }
}

/// The loss of a chunk direction: which one, the margin of the margin loss, the shift `γ` of
/// the logistic loss's scores, and the temperature `α` of self-adversarial negative weighting
/// (RotatE, Sun et al. 2019), if on.
///
/// `γ` is RotatE's and DGL-KE's margin inside the sigmoid: a distance model scores `−‖·‖`,
/// never positive, so `softplus(−pos)` alone pulls every positive pair to distance 0 and the
/// embeddings collapse; `softplus(−(γ + pos))` is satisfied once a positive is within `γ`,
/// and `softplus(neg + γ)` once a negative is beyond it.
///
/// With `α`, negative `j` of edge `i` weighs `p_ij = softmax_j(α · score_ij)` over the edge's
/// negatives, a constant in the gradient (RotatE's `detach`): the logistic loss's
/// `mean_j softplus(neg_j)` becomes `Σ_j p_ij softplus(neg_j)` (DGL-KE's `-adv`, PyKEEN's
/// `NSSALoss` without its margin), and the margin loss's `Σ_j` becomes `Σ_j n p_ij`, so that
/// both are the plain loss as `α → 0`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Loss {
    pub kind: LossKind,
    pub margin: f32,
    pub gamma: f32,
    pub adversarial: Option<f32>,
}

impl Loss {
    /// `kind` with `margin`, without a logistic shift or self-adversarial weighting.
    pub fn plain(kind: LossKind, margin: f32) -> Loss {
        Loss {
            kind,
            margin,
            gamma: 0.0,
            adversarial: None,
        }
    }
}

/// The inputs of one chunk direction: `b` true edges `(s, r, t)` and `n` candidate targets
/// (negatives) shared by all of them. Rows are embeddings (reals, row-major): `dim` reals for
/// node rows, the model's `rel_dim` for relation rows.
#[derive(Debug, Clone, Copy)]
pub struct Chunk<'a> {
    /// True edges: rows of `src`, `rel` and `dst`.
    pub b: usize,
    /// Negatives: rows of `neg`.
    pub n: usize,
    /// Source rows, `b x dim`.
    pub src: &'a [f32],
    /// Relation rows, `b x rel_dim` (empty for a model without relation rows).
    pub rel: &'a [f32],
    /// True target rows, `b x dim`.
    pub dst: &'a [f32],
    /// Negative target rows, `n x dim`, scored against every edge.
    pub neg: &'a [f32],
    /// Each edge's weight, `b` reals (its loss term and so its gradients are scaled by it), or
    /// empty: every weight 1.
    pub weights: &'a [f32],
    /// The positives' own source and relation rows (`b x dim`, `b x rel_dim`), or `None`: the
    /// positives are scored from `src` and `rel` like the negatives. Independent dropout masks
    /// (LibKGE's, where every lookup draws its own) give the positive score its own copy of
    /// the query's rows; their gradients go to `Grads::pos_src` and `Grads::pos_rel`.
    pub pos_query: Option<PosQuery<'a>>,
}

/// The positives' own query rows of a chunk direction (see [`Chunk::pos_query`]).
#[derive(Debug, Clone, Copy)]
pub struct PosQuery<'a> {
    /// Source rows, `b x dim`.
    pub src: &'a [f32],
    /// Relation rows, `b x rel_dim`.
    pub rel: &'a [f32],
}

/// Gradients of one chunk direction (same shapes as the inputs).
#[derive(Default)]
pub struct Grads {
    pub src: Vec<f32>,
    pub rel: Vec<f32>,
    pub dst: Vec<f32>,
    pub neg: Vec<f32>,
    /// With [`Chunk::pos_query`]: the gradients of the positives' own source and relation
    /// rows (the negatives' path is in `src` and `rel`); untouched without.
    pub pos_src: Vec<f32>,
    pub pos_rel: Vec<f32>,
}

/// Buffers reused across chunks.
#[derive(Default)]
pub struct Scratch {
    pub(super) phi: Vec<f32>,
    pub(super) dphi: Vec<f32>,
    /// The positives' own query rows and their gradients, with [`Chunk::pos_query`].
    pub(super) phi_pos: Vec<f32>,
    pub(super) dphi_pos: Vec<f32>,
    pub(super) scores: Vec<f32>,
    pub(super) pos: Vec<f32>,
    pub(super) dpos: Vec<f32>,
    pub(super) aux: Vec<f32>,
    /// One edge's self-adversarial weights of its negatives (`n`).
    pub(super) adv: Vec<f32>,
    pub(super) cos: CosScratch,
}

/// Buffers of the `cos` comparator: unit-length copies of the targets and every row's length.
#[derive(Default)]
pub(super) struct CosScratch {
    /// Unit-length true targets, `b x d`.
    pub(super) dst: Vec<f32>,
    /// Unit-length negatives or candidates, `n x d`.
    pub(super) neg: Vec<f32>,
    /// Lengths of the query rows (`b`), true targets (`b`) and negatives (`n`).
    pub(super) norms: Vec<f32>,
}

/// Sizes a scratch buffer to `len` without clearing it: every caller overwrites it (matrix
/// products with beta 0, element assignments) unless it zeroes it with [`zeroed`].
pub(super) fn fit(v: &mut Vec<f32>, len: usize) {
    v.resize(len, 0.0);
}

/// Sizes a buffer to `len` zeros (for gradients accumulated with `+=`).
pub(super) fn zeroed(v: &mut Vec<f32>, len: usize) {
    v.clear();
    v.resize(len, 0.0);
}

/// Turns the scores of `c` (positives in `s.pos`, negatives in `s.scores`) into the loss and,
/// in place, into `d loss / d score` (for negatives in `s.scores`, for positives in `s.dpos`).
pub(super) fn apply_loss(loss: &Loss, c: &Chunk, s: &mut Scratch) -> f64 {
    let (b, n) = (c.b, c.n);
    let mut total = 0.0f64;
    if loss.adversarial.is_some() {
        fit(&mut s.adv, n);
    }
    for i in 0..b {
        let pos = s.pos[i];
        let row = &mut s.scores[i * n..(i + 1) * n];
        // The weight of each negative relative to the plain loss's (`None`: 1).
        let adv = match loss.adversarial {
            Some(alpha) if loss.kind.takes_adversarial() => {
                adversarial_weights(alpha, row, &mut s.adv);
                Some(&s.adv[..])
            }
            _ => None,
        };
        let term = match loss.kind {
            LossKind::Softmax => {
                // log Σ exp over [pos, negs], shifted by the max for stability.
                let shift = pos.max(kernels::max(row));
                let neg_sum = exp_sum(row, shift);
                let pos_exp = (pos - shift).exp();
                let z = neg_sum + pos_exp;
                let inv = 1.0 / z;
                for v in row.iter_mut() {
                    *v *= inv;
                }
                s.dpos[i] = pos_exp * inv - 1.0;
                (shift + z.ln() - pos) as f64
            }
            LossKind::Logistic => {
                let (inv_n, g) = (1.0 / n as f32, loss.gamma);
                let mut l = softplus(-(pos + g)) as f64;
                s.dpos[i] = -sigmoid(-(pos + g));
                for (j, v) in row.iter_mut().enumerate() {
                    let u = adv.map_or(inv_n, |a| a[j] * inv_n);
                    l += (softplus(*v + g) * u) as f64;
                    *v = sigmoid(*v + g) * u;
                }
                l
            }
            LossKind::Margin => {
                let (mut l, mut active) = (0.0f64, 0.0f32);
                for (j, v) in row.iter_mut().enumerate() {
                    let u = adv.map_or(1.0, |a| a[j]);
                    let h = loss.margin - pos + *v;
                    if h > 0.0 {
                        l += (h * u) as f64;
                        active += u;
                        *v = u;
                    } else {
                        *v = 0.0;
                    }
                }
                s.dpos[i] = -active;
                l
            }
        };
        match c.weights.get(i) {
            Some(&w) => {
                total += w as f64 * term;
                s.dpos[i] *= w;
                row.iter_mut().for_each(|v| *v *= w);
            }
            None => total += term,
        }
    }
    total
}

/// `n · softmax(alpha · scores)` into `out` (`n` reals): self-adversarial weights relative to
/// a uniform negative's, so that they average 1.
fn adversarial_weights(alpha: f32, scores: &[f32], out: &mut [f32]) {
    for (o, &v) in out.iter_mut().zip(scores) {
        *o = alpha * v;
    }
    let sum = exp_sum(out, kernels::max(out));
    let scale = out.len() as f32 / sum;
    out.iter_mut().for_each(|o| *o *= scale);
}

pub(super) fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

pub(super) fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        x.exp().ln_1p()
    }
}

/// `b` queries to score against `n` candidate targets: source rows `src` (`b x dim`),
/// relation rows `rel` (`b x rel_dim`) and candidates `cands` (`n x dim`), row-major.
#[derive(Debug, Clone, Copy)]
pub struct ScoreBatch<'a> {
    pub b: usize,
    pub n: usize,
    pub src: &'a [f32],
    pub rel: &'a [f32],
    pub cands: &'a [f32],
}
