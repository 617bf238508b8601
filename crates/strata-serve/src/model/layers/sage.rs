//! GraphSAGE with the mean aggregator: `W_self x_v + b + W_neigh mean_u x_u`.
//!
//! Tensors of `convs.{i}`: `self_lin.weight (d_out, d_in)`, `self_lin.bias (d_out)`,
//! `neigh_lin.weight (d_out, d_in)`.

use strata_graph::Block;
use strata_store::registry::Named;

use super::super::kernels::{add_row, row};
use super::super::precision::Precision;
use super::super::tensor::Tensor;
use super::{Layer, LayerKind, Linear};

/// GraphSAGE, mean aggregator.
pub struct Sage;

impl Named for Sage {
    const NAME: &'static str = "sage";
    const HELP: &'static str =
        "GraphSAGE with the mean aggregator: W_self x_v + b + W_neigh mean_u x_u";
}

impl LayerKind for Sage {
    fn tensors(&self, d_in: usize, d_out: usize) -> Vec<(&'static str, Vec<usize>)> {
        vec![
            ("self_lin.weight", vec![d_out, d_in]),
            ("self_lin.bias", vec![d_out]),
            ("neigh_lin.weight", vec![d_out, d_in]),
        ]
    }

    fn build(&self, take: &mut dyn FnMut(&str) -> Tensor, precision: Precision) -> Box<dyn Layer> {
        Box::new(SageLayer {
            self_lin: Linear::take(take, "self_lin", true, precision),
            neigh_lin: Linear::take(take, "neigh_lin", false, precision),
        })
    }
}

/// `self_lin(x_v) + neigh_lin(mean_u x_u)`.
struct SageLayer {
    self_lin: Linear,
    neigh_lin: Linear,
}

impl Layer for SageLayer {
    fn forward(&self, block: &Block, x: &[f32]) -> Vec<f32> {
        let (n_dst, d) = (block.num_dst, self.self_lin.in_dim);
        let mut out = self.self_lin.apply(&x[..n_dst * d], n_dst);
        self.neigh_lin
            .apply_add(&mean_neighbours(block, x, d), n_dst, &mut out);
        out
    }

    fn bytes(&self) -> u64 {
        self.self_lin.bytes() + self.neigh_lin.bytes()
    }
}

/// Mean of each destination's sampled sources' rows of `x` (width `d`): `(num_dst, d)`,
/// zeros for a destination without sources.
fn mean_neighbours(block: &Block, x: &[f32], d: usize) -> Vec<f32> {
    let mut out = vec![0f32; block.num_dst * d];
    for (v, acc) in out.chunks_exact_mut(d).enumerate() {
        let sources = block.sources(v);
        for &u in sources {
            add_row(acc, row(x, u, d));
        }
        if !sources.is_empty() {
            let inv = 1.0 / sources.len() as f32;
            acc.iter_mut().for_each(|a| *a *= inv);
        }
    }
    out
}
