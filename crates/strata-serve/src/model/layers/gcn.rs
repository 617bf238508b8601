//! Kipf and Welling's GCN with a self loop and symmetric normalisation over block degrees.
//!
//! Tensors of `convs.{i}`: `lin.weight (d_out, d_in)`, `lin.bias (d_out)`.

use strata_graph::Block;
use strata_store::registry::Named;

use super::super::kernels::{add_row, row};
use super::super::precision::Precision;
use super::super::tensor::Tensor;
use super::{Layer, LayerKind, Linear};

/// GCN.
pub struct Gcn;

impl Named for Gcn {
    const NAME: &'static str = "gcn";
    const HELP: &'static str =
        "Kipf and Welling's GCN with a self loop and symmetric normalisation over block degrees";
}

impl LayerKind for Gcn {
    fn tensors(&self, d_in: usize, d_out: usize) -> Vec<(&'static str, Vec<usize>)> {
        vec![("lin.weight", vec![d_out, d_in]), ("lin.bias", vec![d_out])]
    }

    /// The product is taken without bias (`lin.bias` is the layer's `bias`), as GCNConv adds
    /// it after aggregating.
    fn build(&self, take: &mut dyn FnMut(&str) -> Tensor, precision: Precision) -> Box<dyn Layer> {
        let lin = Linear::take(take, "lin", false, precision);
        let bias = take("lin.bias").data;
        Box::new(GcnLayer { lin, bias })
    }
}

/// `sum over v and its sources u of (x_u W^T) / sqrt(deg_u deg_v) + bias`.
struct GcnLayer {
    lin: Linear,
    bias: Vec<f32>,
}

impl Layer for GcnLayer {
    fn forward(&self, block: &Block, x: &[f32]) -> Vec<f32> {
        gcn(block, &self.lin.apply(x, block.num_src), &self.bias)
    }

    fn bytes(&self) -> u64 {
        self.lin.bytes() + 4 * self.bias.len() as u64
    }
}

/// GCN's aggregation of the transformed rows `h` (`(num_src, d)`) as GCNConv does on a
/// block: each destination `v` sums `h_u / sqrt(deg_u deg_v)` over its sources and itself,
/// with `deg_v` = in-degree + 1 (the self loop) and `deg_u` = the source's out-degree in the
/// block (+ 1 when it is a destination, for its loop); then adds `bias`.
fn gcn(block: &Block, h: &[f32], bias: &[f32]) -> Vec<f32> {
    let d = bias.len();
    let mut deg_src = vec![0f32; block.num_src];
    for &u in &block.indices {
        deg_src[u as usize] += 1.0;
    }
    deg_src[..block.num_dst].iter_mut().for_each(|g| *g += 1.0);
    let mut out = vec![0f32; block.num_dst * d];
    for (v, acc) in out.chunks_exact_mut(d).enumerate() {
        let sources = block.sources(v);
        let deg_v = sources.len() as f32 + 1.0;
        let self_norm = 1.0 / (deg_src[v] * deg_v).sqrt();
        for (a, &hv) in acc.iter_mut().zip(row(h, v as u32, d)) {
            *a = hv * self_norm;
        }
        for &u in sources {
            let norm = 1.0 / (deg_src[u as usize] * deg_v).sqrt();
            for (a, &hu) in acc.iter_mut().zip(row(h, u, d)) {
                *a += hu * norm;
            }
        }
        add_row(acc, bias);
    }
    out
}
