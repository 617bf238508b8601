//! GraphSAGE with the max-pool aggregator:
//! `W_self x_v + b + W_neigh max_u ReLU(W_pool x_u + b_pool)`.
//!
//! Tensors of `convs.{i}`: those of `sage`, `pool_lin.weight (d_in, d_in)`,
//! `pool_lin.bias (d_in)`.

use strata_graph::Block;
use strata_store::registry::Named;

use super::super::kernels::row;
use super::super::precision::Precision;
use super::super::tensor::Tensor;
use super::{Layer, LayerKind, Linear};

/// GraphSAGE, max-pool aggregator.
pub struct SagePool;

impl Named for SagePool {
    const NAME: &'static str = "sage_pool";
    const HELP: &'static str =
        "GraphSAGE with the max-pool aggregator: W_self x_v + b + W_neigh max_u ReLU(W_pool x_u + b_pool)";
}

impl LayerKind for SagePool {
    fn tensors(&self, d_in: usize, d_out: usize) -> Vec<(&'static str, Vec<usize>)> {
        let mut v = super::sage::Sage.tensors(d_in, d_out);
        v.push(("pool_lin.weight", vec![d_in, d_in]));
        v.push(("pool_lin.bias", vec![d_in]));
        v
    }

    fn build(&self, take: &mut dyn FnMut(&str) -> Tensor, precision: Precision) -> Box<dyn Layer> {
        Box::new(SagePoolLayer {
            pool_lin: Linear::take(take, "pool_lin", true, precision),
            self_lin: Linear::take(take, "self_lin", true, precision),
            neigh_lin: Linear::take(take, "neigh_lin", false, precision),
        })
    }
}

/// `self_lin(x_v) + neigh_lin(max_u ReLU(pool_lin(x_u)))`.
struct SagePoolLayer {
    pool_lin: Linear,
    self_lin: Linear,
    neigh_lin: Linear,
}

impl Layer for SagePoolLayer {
    fn forward(&self, block: &Block, x: &[f32]) -> Vec<f32> {
        let (n_dst, d) = (block.num_dst, self.self_lin.in_dim);
        let mut pooled = self.pool_lin.apply(x, block.num_src);
        pooled.iter_mut().for_each(|v| *v = v.max(0.0));
        let mut out = self.self_lin.apply(&x[..n_dst * d], n_dst);
        self.neigh_lin.apply_add(
            &max_neighbours(block, &pooled, self.pool_lin.out_dim),
            n_dst,
            &mut out,
        );
        out
    }

    fn bytes(&self) -> u64 {
        self.pool_lin.bytes() + self.self_lin.bytes() + self.neigh_lin.bytes()
    }
}

/// Elementwise maximum of each destination's sampled sources' rows of `x` (width `d`):
/// `(num_dst, d)`, zeros for a destination without sources.
fn max_neighbours(block: &Block, x: &[f32], d: usize) -> Vec<f32> {
    let mut out = vec![0f32; block.num_dst * d];
    for (v, acc) in out.chunks_exact_mut(d).enumerate() {
        let sources = block.sources(v);
        if let Some((&first, rest)) = sources.split_first() {
            acc.copy_from_slice(row(x, first, d));
            for &u in rest {
                for (a, &b) in acc.iter_mut().zip(row(x, u, d)) {
                    *a = a.max(b);
                }
            }
        }
    }
    out
}
