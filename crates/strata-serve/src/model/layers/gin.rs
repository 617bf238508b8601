//! GIN: `MLP((1 + eps) x_v + sum_u x_u)` with a two-layer MLP.
//!
//! Tensors of `convs.{i}`: `lin1.weight (d_out, d_in)`, `lin1.bias (d_out)`,
//! `lin2.weight (d_out, d_out)`, `lin2.bias (d_out)`, `eps ()`.

use strata_graph::Block;
use strata_store::registry::Named;

use super::super::kernels::{add_row, row};
use super::super::precision::Precision;
use super::super::tensor::Tensor;
use super::{Layer, LayerKind, Linear};

/// GIN.
pub struct Gin;

impl Named for Gin {
    const NAME: &'static str = "gin";
    const HELP: &'static str = "GIN: MLP((1 + eps) x_v + sum_u x_u) with a two-layer MLP";
}

impl LayerKind for Gin {
    fn tensors(&self, d_in: usize, d_out: usize) -> Vec<(&'static str, Vec<usize>)> {
        vec![
            ("lin1.weight", vec![d_out, d_in]),
            ("lin1.bias", vec![d_out]),
            ("lin2.weight", vec![d_out, d_out]),
            ("lin2.bias", vec![d_out]),
            ("eps", vec![]),
        ]
    }

    fn build(&self, take: &mut dyn FnMut(&str) -> Tensor, precision: Precision) -> Box<dyn Layer> {
        Box::new(GinLayer {
            lin1: Linear::take(take, "lin1", true, precision),
            lin2: Linear::take(take, "lin2", true, precision),
            eps: take("eps").data[0],
        })
    }
}

/// `lin2(ReLU(lin1((1 + eps) x_v + sum_u x_u)))`.
struct GinLayer {
    eps: f32,
    lin1: Linear,
    lin2: Linear,
}

impl Layer for GinLayer {
    fn forward(&self, block: &Block, x: &[f32]) -> Vec<f32> {
        let n_dst = block.num_dst;
        let mut hidden = self
            .lin1
            .apply(&gin_sum(block, x, self.lin1.in_dim, self.eps), n_dst);
        hidden.iter_mut().for_each(|v| *v = v.max(0.0));
        self.lin2.apply(&hidden, n_dst)
    }

    fn bytes(&self) -> u64 {
        4 + self.lin1.bytes() + self.lin2.bytes()
    }
}

/// GIN's aggregation `(1 + eps) x_v + sum_u x_u` for each destination `v`: `(num_dst, d)`.
fn gin_sum(block: &Block, x: &[f32], d: usize, eps: f32) -> Vec<f32> {
    let scale = 1.0 + eps;
    let mut out: Vec<f32> = x[..block.num_dst * d].iter().map(|v| v * scale).collect();
    for (v, acc) in out.chunks_exact_mut(d).enumerate() {
        for &u in block.sources(v) {
            add_row(acc, row(x, u, d));
        }
    }
    out
}
