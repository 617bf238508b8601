//! Dot: `s · t`, for graphs without relation types (no relation rows).

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::bilinear::Bilinear;
use super::score::{Combine, Layout, ProductQuery, ScoreFunction, Shape};
use super::{Comparator, Operator, PbgForm};

/// `s · t`.
pub struct Dot;

impl Named for Dot {
    const NAME: &'static str = "dot";
    const HELP: &'static str = "s · t; graphs without relation types";
}

impl Combine for Dot {
    fn combine(_d: usize, si: &[f32], _ri: &[f32], ai: &mut [f32]) {
        ai.copy_from_slice(si);
    }
}

impl Bilinear for Dot {
    fn back(_d: usize, dphi: &[f32], _si: &[f32], _ri: &[f32], gs: &mut [f32], _gr: &mut [f32]) {
        gs.copy_from_slice(dphi);
    }
}

impl ScoreFunction for Dot {
    fn rel_dim(&self, _dim: usize, _pbg: PbgForm) -> usize {
        0
    }

    fn layouts(&self, _model: &Shape) -> (Layout, Layout) {
        (Layout::Real, Layout::Real)
    }

    fn natural_comparator(&self, _model: &Shape) -> Comparator {
        // Its score is the dot product.
        Comparator::Dot
    }

    fn pbg_form(&self, _model: &Shape) -> Result<PbgForm, String> {
        Ok(PbgForm {
            operator: Operator::None,
            comparator: Comparator::Dot,
        })
    }

    fn init_relation(&self, _model: &Shape, _row: &mut [f32], _rng: &mut Rng, _scale: f32) {}

    fn reverse_relation(&self, _model: &Shape, _row: &mut [f32]) {}

    fn product_query(&self, _model: &Shape) -> Result<ProductQuery, String> {
        Ok(super::bilinear::product_query::<Self>())
    }

    family_methods!(bilinear);
}
