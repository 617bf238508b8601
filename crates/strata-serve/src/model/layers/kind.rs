//! What a layer kind is ([`LayerKind`]: its tensors, and building a layer from them) and what
//! the layer it builds does ([`Layer`]).

use strata_graph::Block;

use super::super::precision::Precision;
use super::super::tensor::Tensor;

/// A kind of GNN layer the service runs (every layer of a model has the same kind).
pub trait LayerKind: Sync {
    /// The tensors of one layer from rows `d_in` wide to rows `d_out` wide: each name after
    /// `convs.{i}.` and its shape (`torch.nn.Linear` weights are `(out, in)`).
    fn tensors(&self, d_in: usize, d_out: usize) -> Vec<(&'static str, Vec<usize>)>;

    /// The layer from its tensors, each handed over by `take(name)` (checked against
    /// [`LayerKind::tensors`]), its linear parts in `precision`.
    fn build(&self, take: &mut dyn FnMut(&str) -> Tensor, precision: Precision) -> Box<dyn Layer>;
}

/// One GNN layer with its weights.
pub trait Layer: Send + Sync {
    /// The layer over `block` on its input rows `x` (`(block.num_src, d_in)`, row-major);
    /// returns `(block.num_dst, d_out)`. The block was validated.
    fn forward(&self, block: &Block, x: &[f32]) -> Vec<f32>;

    /// Bytes of the layer's weights as held in memory.
    fn bytes(&self) -> u64;
}
