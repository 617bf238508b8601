//! RotatE: `−Σ_k |s_k r_k − t_k|` with `r` unit complex numbers, stored as their phases
//! (`dim/2` reals per relation row).

use strata_store::registry::Named;
use strata_store::rng::Rng;

use super::pairwise::Pairwise;
use super::score::{even_dim, phase, Combine, Layout, ScoreFunction, Shape};
use super::{Comparator, PbgForm};
use crate::compute::kernels::{modulus_grads, modulus_scores};

/// `−Σ_k |s_k r_k − t_k|`.
pub struct RotatE;

impl Named for RotatE {
    const NAME: &'static str = "rotate";
    const HELP: &'static str = "−Σ_k |s_k r_k − t_k| with r unit complex numbers (phases)";
}

impl Combine for RotatE {
    fn combine(d: usize, si: &[f32], ri: &[f32], ai: &mut [f32]) {
        let h = d / 2;
        for k in 0..h {
            let (c, sn) = (ri[k].cos(), ri[k].sin());
            ai[k] = si[k] * c - si[h + k] * sn;
            ai[h + k] = si[k] * sn + si[h + k] * c;
        }
    }
}

impl Pairwise for RotatE {
    fn pair_scores(a: &[f32], cands: &[f32], out: &mut [f32]) {
        modulus_scores(a, cands, out);
    }

    fn pair_grads(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]) {
        modulus_grads(a, cands, w, da, dcands);
    }

    fn back(d: usize, da: &[f32], a: &[f32], ri: &[f32], gs: &mut [f32], gr: &mut [f32]) {
        let h = d / 2;
        for k in 0..h {
            let (c, sn) = (ri[k].cos(), ri[k].sin());
            gs[k] = da[k] * c + da[h + k] * sn;
            gs[h + k] = -da[k] * sn + da[h + k] * c;
            gr[k] = -da[k] * a[h + k] + da[h + k] * a[k];
        }
    }
}

impl ScoreFunction for RotatE {
    fn rel_dim(&self, dim: usize, _pbg: PbgForm) -> usize {
        dim / 2
    }

    fn layouts(&self, _model: &Shape) -> (Layout, Layout) {
        // Relation rows are phases, not regularized.
        (Layout::Complex, Layout::Skip)
    }

    fn natural_comparator(&self, _model: &Shape) -> Comparator {
        // It scores by distances.
        Comparator::L2
    }

    fn pbg_form(&self, _model: &Shape) -> Result<PbgForm, String> {
        Err("model rotate has no PyTorch-BigGraph form: RotatE sums the moduli of complex differences, which no PBG comparator computes".into())
    }

    fn check_dim(&self, dim: usize) -> Result<(), String> {
        even_dim(Self::NAME, dim)
    }

    /// Random phases (see [`Shape::init_relation`]).
    fn init_relation(&self, _model: &Shape, row: &mut [f32], rng: &mut Rng, _scale: f32) {
        row.iter_mut().for_each(|v| *v = phase(rng));
    }

    /// The opposite rotation.
    fn reverse_relation(&self, _model: &Shape, row: &mut [f32]) {
        row.iter_mut().for_each(|v| *v = -*v);
    }

    family_methods!(pairwise);
}
