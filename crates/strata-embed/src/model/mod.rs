//! Score functions and losses, forward and backward for one chunk in one direction.
//!
//! A chunk is `b` true edges `(s, r, t)` and `n` candidate targets shared by all of them
//! (negatives). The step corrupts targets; the other direction is the same step on
//! `(t, r⁻¹, s)` with reciprocal relation rows (see `epoch`). For the bilinear models
//! (dot, DistMult, ComplEx) the score is `φ(s, r) · t`, so all `b x n` negative scores are one
//! matrix product and the backward pass is two more, reusing `φ` and the loss weights computed
//! in the forward pass (Legend §6 on a CPU; `bilinear`). TransE-L2 expands `‖a − t‖²` into the
//! same products. TransE-L1 and RotatE are computed pairwise (`pairwise`). PyTorch-BigGraph's
//! operators and comparators (`pbg`) reuse the named models' operator rows and run every
//! comparator through the same three products. `regularizer` adds N3 or L2 terms of a chunk's
//! rows.
//!
//! Each score function is a unit type in a file of its own implementing [`ScoreFunction`],
//! listed once in the [`ScoreKind`] registry below; the config's `model` option, its help and
//! schema, the budget and the run record take the list from there. A chunk dispatches once to
//! its model, whose loops are generic over it (no dynamic call per edge).

/// The `step` and `score` methods of a [`ScoreFunction`] whose loops are those of `$family`
/// (`bilinear` or `pairwise`), instantiated for `Self`: for use inside its `impl`.
macro_rules! family_methods {
    ($family:ident) => {
        fn step(
            &self,
            model: &$crate::model::Shape,
            loss: &$crate::model::Loss,
            c: &$crate::model::Chunk,
            g: &mut $crate::model::Grads,
            s: &mut $crate::model::Scratch,
        ) -> f64 {
            $crate::model::$family::step::<Self>(model, loss, c, g, s)
        }

        fn score(
            &self,
            model: &$crate::model::Shape,
            q: &$crate::model::ScoreBatch,
            out: &mut [f32],
            s: &mut $crate::model::Scratch,
        ) {
            $crate::model::$family::score::<Self>(model, q, out, s)
        }
    };
}

mod all_entities;
mod bilinear;
mod complex;
mod distmult;
mod dot;
mod dropout;
mod form;
mod pairwise;
mod pbg;
mod regularizer;
mod rotate;
mod score;
mod transe;

use strata_store::rng::Rng;

pub use all_entities::{all_step, AllBatch, AllScratch, Labels};
pub use dropout::{Dropout, DropoutMasks, Dropped};
pub use form::{Comparator, Operator, PbgForm};
pub use regularizer::{regularize, regularize_table, RegScope, Regularizer, RegularizerKind};
pub use score::{
    Chunk, Grads, Layout, Loss, LossKind, PosQuery, ProductQuery, ScoreBatch, ScoreFunction,
    Scratch, Shape,
};

use score::fit;

strata_store::registry! {
    /// Which score function (registered by name; see [`ScoreFunction`]).
    pub enum ScoreKind: dyn ScoreFunction, "score function", "score function" {
        dot::Dot,
        transe::TransE,
        distmult::DistMult,
        complex::ComplEx,
        rotate::RotatE,
        pbg::Pbg,
    }
}

/// A score function of a given dimension.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreModel {
    pub kind: ScoreKind,
    /// Reals per node embedding.
    pub dim: usize,
    /// 1 or 2: the norm of TransE.
    pub transe_norm: u8,
    /// The operator and comparator of `pbg`.
    pub pbg: PbgForm,
}

impl ScoreModel {
    /// Reals per relation row (0 for dot).
    pub fn rel_dim(&self) -> usize {
        self.kind.get().rel_dim(self.dim, self.pbg)
    }

    /// What the score function reads of the model.
    pub fn shape(&self) -> Shape {
        Shape::new(self.dim, self.transe_norm, self.pbg, self.rel_dim())
    }

    /// The initial value of a relation row, drawn from `rng`. Not the identity: an identity
    /// relation scores a node against itself highest (`‖h‖²` for ComplEx and DistMult, distance
    /// 0 for TransE and RotatE), and since a node is almost never its own sampled negative, that
    /// bias survives training and ranks the query's own node first. Unit complex numbers with
    /// random phases (ComplEx, RotatE) and random signs (DistMult) start every relation as an
    /// isometry without a preferred self-score; TransE starts from normal offsets of the node
    /// embeddings' scale (`scale`) and must learn translations long enough to leave the node.
    pub fn init_relation(&self, row: &mut [f32], rng: &mut Rng, scale: f32) {
        self.kind
            .get()
            .init_relation(&self.shape(), row, rng, scale)
    }

    /// `pbg`'s operator and comparator as the config spells them; `None` for the named models.
    pub fn pbg_names(&self) -> Option<(&'static str, &'static str)> {
        (self.kind == ScoreKind::Pbg)
            .then(|| (self.pbg.operator.name(), self.pbg.comparator.name()))
    }

    /// The coordinate layouts of node rows and relation rows (see [`ScoreFunction::layouts`]).
    pub fn layouts(&self) -> (Layout, Layout) {
        self.kind.get().layouts(&self.shape())
    }

    /// The comparator of the model's geometry (see [`ScoreFunction::natural_comparator`]).
    pub fn natural_comparator(&self) -> Comparator {
        self.kind.get().natural_comparator(&self.shape())
    }

    /// The query rows of the model if its score is a product with the target row (1vsAll and
    /// KvsAll need one), or why not, naming the model (see [`ScoreFunction::product_query`]).
    pub fn product_query(&self) -> Result<ProductQuery, String> {
        self.kind
            .get()
            .product_query(&self.shape())
            .map_err(|why| format!("model {} {why}", self.kind))
    }

    /// PyTorch-BigGraph's form of the model (see [`ScoreFunction::pbg_form`]).
    pub fn pbg_form(&self) -> Result<PbgForm, String> {
        self.kind.get().pbg_form(&self.shape())
    }

    /// Turns relation row `r` of `(h, r, t)` into the row that scores `(t, r', h)` like a tail
    /// query, so that heads can be corrupted without reciprocal relations: the conjugate for
    /// ComplEx, the opposite rotation for RotatE, `-r` for TransE, `r` itself for DistMult.
    /// The map is linear and its own transpose, so it also carries the gradient of `r'` back
    /// to `r`.
    pub fn reverse_relation(&self, row: &mut [f32]) {
        self.kind.get().reverse_relation(&self.shape(), row)
    }

    /// Multiply-adds per chunk direction for `b` edges and `n` negatives (forward + backward),
    /// for the FLOP/s report.
    pub fn flops(&self, b: usize, n: usize) -> f64 {
        // Three b x n x d products (scores, dφ, dneg) at 2 FLOPs per multiply-add, plus the
        // pairwise models' elementwise work of the same order.
        6.0 * (b * n * self.dim) as f64
    }
}

/// Loss of chunk direction `c` under `loss`, with every gradient written into `g` (resized
/// to fit, in the shapes of `c`'s rows). Edge `i`'s term is scaled by its weight `c.weights[i]`.
pub fn chunk_step(
    model: &ScoreModel,
    loss: &Loss,
    c: &Chunk,
    g: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    let (d, b, n) = (model.dim, c.b, c.n);
    debug_assert!(c.weights.is_empty() || c.weights.len() == b);
    fit(&mut g.src, b * d);
    fit(&mut g.rel, b * model.rel_dim());
    fit(&mut g.dst, b * d);
    fit(&mut g.neg, n * d);
    if c.pos_query.is_some() {
        fit(&mut g.pos_src, b * d);
        fit(&mut g.pos_rel, b * model.rel_dim());
    }
    fit(&mut s.scores, b * n);
    fit(&mut s.pos, b);
    fit(&mut s.dpos, b);
    model.kind.get().step(&model.shape(), loss, c, g, s)
}

/// Loss of chunk direction `c` whose edges each have their own `n` negatives (LibKGE's and
/// PyKEEN's sampling): `c.neg` holds `c.b x n` rows, edge `i`'s from row `i * n`, and `c.n`
/// is `c.b * n`. Each edge is stepped as a chunk of one ([`chunk_step`]) with `e` holding its
/// gradients, which are written into `g` in the shapes of `c`'s rows. Edge `i`'s term is
/// scaled by its weight `c.weights[i]`.
pub fn edge_negatives_step(
    model: &ScoreModel,
    loss: &Loss,
    (c, n): (&Chunk, usize),
    g: &mut Grads,
    e: &mut Grads,
    s: &mut Scratch,
) -> f64 {
    let (d, rd, b) = (model.dim, model.rel_dim(), c.b);
    debug_assert_eq!(c.n, b * n);
    fit(&mut g.src, b * d);
    fit(&mut g.rel, b * rd);
    fit(&mut g.dst, b * d);
    fit(&mut g.neg, b * n * d);
    if c.pos_query.is_some() {
        fit(&mut g.pos_src, b * d);
        fit(&mut g.pos_rel, b * rd);
    }
    let mut total = 0.0;
    for i in 0..b {
        let row = |w: usize| i * w..(i + 1) * w;
        let one = Chunk {
            b: 1,
            n,
            src: &c.src[row(d)],
            rel: &c.rel[row(rd)],
            dst: &c.dst[row(d)],
            neg: &c.neg[row(n * d)],
            weights: c.weights.get(i..i + 1).unwrap_or(&[]),
            pos_query: c.pos_query.map(|q| PosQuery {
                src: &q.src[row(d)],
                rel: &q.rel[row(rd)],
            }),
        };
        total += chunk_step(model, loss, &one, e, s);
        for (out, part, w) in [
            (&mut g.src, &e.src, d),
            (&mut g.rel, &e.rel, rd),
            (&mut g.dst, &e.dst, d),
            (&mut g.neg, &e.neg, n * d),
        ] {
            out[i * w..(i + 1) * w].copy_from_slice(part);
        }
        if c.pos_query.is_some() {
            g.pos_src[i * d..(i + 1) * d].copy_from_slice(&e.pos_src);
            g.pos_rel[i * rd..(i + 1) * rd].copy_from_slice(&e.pos_rel);
        }
    }
    total
}

/// Scores of `q`'s `b` queries against its `n` candidate targets, forward only, into `out`
/// (`b x n`): the same score functions as training, for evaluation and prediction.
pub fn score_candidates(model: &ScoreModel, q: &ScoreBatch, out: &mut [f32], s: &mut Scratch) {
    fit(&mut s.phi, q.b * model.dim);
    model.kind.get().score(&model.shape(), q, out, s)
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod pbg_tests;
