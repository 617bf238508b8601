//! The layers of a loaded model: which tensors each architecture needs (the names and shapes
//! of `strata.gnn.models.GNN.state_dict()`), checked against a weights file and turned into
//! linear layers in the served precision.
//!
//! Each layer kind is a unit type in a file of its own implementing [`LayerKind`] (its
//! tensors, and building a [`Layer`] from them), registered in [`super::ModelKind`]; the
//! layer it builds runs its own kernel ([`Layer::forward`]), over the aggregations of
//! [`super::kernels`].
//!
//! Tensor names, for layer `i` with input width `d_in` and output width `d_out`
//! (`torch.nn.Linear` weights are `(out, in)`):
//!
//! | kind | tensors of `convs.{i}` |
//! |---|---|
//! | sage_mean | `self_lin.weight (d_out, d_in)`, `self_lin.bias (d_out)`, `neigh_lin.weight (d_out, d_in)` |
//! | sage_pool | the three of sage_mean, `pool_lin.weight (d_in, d_in)`, `pool_lin.bias (d_in)` |
//! | gcn | `lin.weight (d_out, d_in)`, `lin.bias (d_out)` |
//! | gin | `lin1.weight (d_out, d_in)`, `lin1.bias (d_out)`, `lin2.weight (d_out, d_out)`, `lin2.bias (d_out)`, `eps ()` |

pub(super) mod gcn;
pub(super) mod gin;
pub(super) mod sage_mean;
pub(super) mod sage_pool;

use std::collections::BTreeMap;

use strata_graph::Block;

use super::file::Tensor;
use super::quant::QuantMatrix;
use super::{Architecture, Precision};
use crate::error::{Result, ServeError};

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

/// A dense layer `y = x W^T (+ b)` over rows of `in_dim` values.
pub struct Linear {
    pub in_dim: usize,
    pub out_dim: usize,
    pub weight: Weight,
    /// `out_dim` values, added after the product.
    pub bias: Option<Vec<f32>>,
}

/// A weight matrix `(out_dim, in_dim)` in the served precision.
pub enum Weight {
    /// Row-major float32.
    F32(Vec<f32>),
    /// Int8 with one scale per output row.
    Int8(QuantMatrix),
}

impl Linear {
    /// The linear layer `name` of a layer's tensors: `{name}.weight`, and `{name}.bias` when
    /// `bias`.
    pub fn take(
        take: &mut dyn FnMut(&str) -> Tensor,
        name: &str,
        bias: bool,
        precision: Precision,
    ) -> Linear {
        let weight = take(&format!("{name}.weight"));
        let bias = bias.then(|| take(&format!("{name}.bias")));
        Linear::new(weight, bias, precision)
    }

    fn new(weight: Tensor, bias: Option<Tensor>, precision: Precision) -> Linear {
        let (out_dim, in_dim) = (weight.shape[0], weight.shape[1]);
        let weight = match precision {
            Precision::Fp32 => Weight::F32(weight.data),
            Precision::Int8 => Weight::Int8(QuantMatrix::quantize(&weight.data, out_dim, in_dim)),
        };
        Linear {
            in_dim,
            out_dim,
            weight,
            bias: bias.map(|b| b.data),
        }
    }

    /// Bytes of the weights and bias as held in memory.
    pub fn bytes(&self) -> u64 {
        let weight = match &self.weight {
            Weight::F32(w) => 4 * w.len() as u64,
            Weight::Int8(q) => q.bytes(),
        };
        weight + self.bias.as_ref().map_or(0, |b| 4 * b.len() as u64)
    }
}

/// The tensors (name, shape) of layer `i` of `arch`, in the module table's order.
pub(crate) fn layer_tensors(arch: &Architecture, i: usize) -> Vec<(String, Vec<usize>)> {
    let (d_in, d_out) = arch.layer_dims(i);
    arch.kind
        .get()
        .tensors(d_in, d_out)
        .into_iter()
        .map(|(suffix, shape)| (format!("convs.{i}.{suffix}"), shape))
        .collect()
}

/// Whether a tensor of shape `found` can serve as `expected`: equal, or a one-element `[1]`
/// for a scalar (PyG's GINConv keeps `eps` as a 1-element vector).
fn shape_fits(expected: &[usize], found: &[usize]) -> bool {
    expected == found || (expected.is_empty() && found == [1])
}

/// Checks that `tensors` are exactly the tensors `arch` needs, with its shapes, and builds the
/// layers in `precision`. A missing or extra tensor means a file of a different architecture
/// (FailedPrecondition, naming them); a wrong shape is a malformed file (InvalidArgument,
/// naming the tensor, the expected and the found shape). `source` names the file.
pub fn build(
    arch: &Architecture,
    mut tensors: BTreeMap<String, Tensor>,
    precision: Precision,
    source: &str,
) -> Result<Vec<Box<dyn Layer>>> {
    let expected: Vec<Vec<(String, Vec<usize>)>> =
        (0..arch.layers).map(|i| layer_tensors(arch, i)).collect();
    let missing: Vec<&str> = expected
        .iter()
        .flatten()
        .filter(|(name, _)| !tensors.contains_key(name))
        .map(|(name, _)| name.as_str())
        .collect();
    let described = || {
        format!(
            "a {}-layer {} model ({} -> {} -> {})",
            arch.layers, arch.kind, arch.in_dim, arch.hidden_dim, arch.out_dim
        )
    };
    if !missing.is_empty() {
        return Err(ServeError::FailedPrecondition(format!(
            "{source}: missing tensors that {} needs: {} (is the file for a different \
             architecture?)",
            described(),
            missing.join(", ")
        )));
    }
    if tensors.len() > expected.iter().map(Vec::len).sum() {
        let wanted: Vec<&String> = expected.iter().flatten().map(|(n, _)| n).collect();
        let extra: Vec<&str> = tensors
            .keys()
            .filter(|n| !wanted.contains(n))
            .map(String::as_str)
            .collect();
        return Err(ServeError::FailedPrecondition(format!(
            "{source}: tensors that {} does not have: {} (is the file for a different \
             architecture?)",
            described(),
            extra.join(", ")
        )));
    }
    for (name, shape) in expected.iter().flatten() {
        let found = &tensors[name].shape;
        if !shape_fits(shape, found) {
            return Err(ServeError::InvalidArgument(format!(
                "{source}: tensor {name}: expected shape {shape:?} for {}, found {found:?}",
                described()
            )));
        }
    }

    let layers = (0..arch.layers)
        .map(|i| {
            let mut take = |suffix: &str| {
                tensors
                    .remove(&format!("convs.{i}.{suffix}"))
                    .expect("checked above")
            };
            arch.kind.get().build(&mut take, precision)
        })
        .collect();
    Ok(layers)
}
