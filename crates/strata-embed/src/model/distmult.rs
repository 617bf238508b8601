//! DistMult: `⟨s, r, t⟩`, a diagonal bilinear form per relation.

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::bilinear::Bilinear;
use super::score::{Combine, Layout, ProductQuery, ScoreFunction, Shape};
use super::{Comparator, Operator, PbgForm};

/// `⟨s, r, t⟩`.
pub struct DistMult;

impl Named for DistMult {
    const NAME: &'static str = "distmult";
    const HELP: &'static str = "⟨s, r, t⟩";
}

impl Combine for DistMult {
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]) {
        for k in 0..d {
            ai[k] = si[k] * ri[k];
        }
    }
}

impl Bilinear for DistMult {
    fn back(d: usize, dphi: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        for k in 0..d {
            gs[k] = dphi[k] * ri[k];
            gr[k] = dphi[k] * si[k];
        }
    }
}

impl ScoreFunction for DistMult {
    fn rel_dim(&self, dim: usize, _pbg: PbgForm) -> usize {
        dim
    }

    fn layouts(&self, _model: &Shape) -> (Layout, Layout) {
        (Layout::Real, Layout::Real)
    }

    fn natural_comparator(&self, _model: &Shape) -> Comparator {
        // Scores weight coordinates by the relation: only directions compare across relations.
        Comparator::Cos
    }

    fn pbg_form(&self, _model: &Shape) -> Result<PbgForm, String> {
        Ok(PbgForm {
            operator: Operator::Diagonal,
            comparator: Comparator::Dot,
        })
    }

    /// Random signs: an isometry without a preferred self-score (see
    /// [`Shape::init_relation`]).
    fn init_relation(&self, _model: &Shape, row: &mut [f32], rng: &mut Rng, _scale: f32) {
        row.iter_mut()
            .for_each(|v| *v = if rng.below(2) == 0 { 1.0 } else { -1.0 });
    }

    /// DistMult is symmetric: `r` scores `(t, r, h)` as it scores `(h, r, t)`.
    fn reverse_relation(&self, _model: &Shape, _row: &mut [f32]) {}

    fn product_query(&self, _model: &Shape) -> Result<ProductQuery, String> {
        Ok(super::bilinear::product_query::<Self>())
    }

    family_methods!(bilinear);
}
