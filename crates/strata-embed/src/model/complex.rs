//! ComplEx: `Re⟨s, r, conj t⟩` with `d/2` complex coordinates (real parts, then imaginary).

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::bilinear::Bilinear;
use super::score::{even_dim, phase, Combine, Layout, ProductQuery, ScoreFunction, Shape};
use super::{Comparator, Operator, PbgForm};

/// `Re⟨s, r, conj t⟩`.
pub struct ComplEx;

impl Named for ComplEx {
    const NAME: &'static str = "complex";
    const HELP: &'static str = "Re⟨s, r, conj t⟩ with dim/2 complex coordinates";
}

impl Combine for ComplEx {
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]) {
        let h = d / 2;
        for k in 0..h {
            let (sr, sim, rr, rim) = (si[k], si[h + k], ri[k], ri[h + k]);
            ai[k] = sr * rr - sim * rim;
            ai[h + k] = sr * rim + sim * rr;
        }
    }
}

impl Bilinear for ComplEx {
    fn back(d: usize, dphi: &[f32], si: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        let h = d / 2;
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

impl ScoreFunction for ComplEx {
    fn rel_dim(&self, dim: usize, _pbg: PbgForm) -> usize {
        dim
    }

    fn layouts(&self, _model: &Shape) -> (Layout, Layout) {
        (Layout::Complex, Layout::Complex)
    }

    fn natural_comparator(&self, _model: &Shape) -> Comparator {
        // Scores weight coordinates by the relation: only directions compare across relations.
        Comparator::Cos
    }

    fn pbg_form(&self, _model: &Shape) -> Result<PbgForm, String> {
        Ok(PbgForm {
            operator: Operator::ComplexDiagonal,
            comparator: Comparator::Dot,
        })
    }

    fn check_dim(&self, dim: usize) -> Result<(), String> {
        even_dim(Self::NAME, dim)
    }

    /// Unit complex numbers with random phases (see [`Shape::init_relation`]).
    fn init_relation(&self, model: &Shape, row: &mut [f32], rng: &mut Rng, _scale: f32) {
        let h = model.dim / 2;
        for k in 0..h {
            let theta = phase(rng);
            row[k] = theta.cos();
            row[h + k] = theta.sin();
        }
    }

    /// The conjugate.
    fn reverse_relation(&self, model: &Shape, row: &mut [f32]) {
        row[model.dim / 2..].iter_mut().for_each(|v| *v = -*v);
    }

    fn product_query(&self, _model: &Shape) -> Result<ProductQuery, String> {
        Ok(super::bilinear::product_query::<Self>())
    }

    family_methods!(bilinear);
}
