//! The layers of a loaded model: which tensors each architecture needs (the names and shapes
//! of `strata.gnn.models.GNN.state_dict()`), checked against a weights file and turned into
//! linear layers in the served precision.
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

use std::collections::BTreeMap;

use super::file::Tensor;
use super::quant::QuantMatrix;
use super::{Architecture, ModelKind, Precision};
use crate::error::{Result, ServeError};

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
    fn bytes(&self) -> u64 {
        let weight = match &self.weight {
            Weight::F32(w) => 4 * w.len() as u64,
            Weight::Int8(q) => q.bytes(),
        };
        weight + self.bias.as_ref().map_or(0, |b| 4 * b.len() as u64)
    }
}

/// One GNN layer with its weights (see the module table for the tensors).
pub enum Layer {
    /// `self_lin(x_v) + neigh_lin(mean_u x_u)`.
    SageMean { self_lin: Linear, neigh_lin: Linear },
    /// `self_lin(x_v) + neigh_lin(max_u ReLU(pool_lin(x_u)))`.
    SagePool {
        pool_lin: Linear,
        self_lin: Linear,
        neigh_lin: Linear,
    },
    /// `sum over v and its sources u of (x_u W^T) / sqrt(deg_u deg_v) + bias`; the product is
    /// taken without bias (`lin.bias` is `bias`), as GCNConv adds it after aggregating.
    Gcn { lin: Linear, bias: Vec<f32> },
    /// `lin2(ReLU(lin1((1 + eps) x_v + sum_u x_u)))`.
    Gin {
        eps: f32,
        lin1: Linear,
        lin2: Linear,
    },
}

impl Layer {
    /// Bytes of the layer's weights as held in memory.
    pub fn bytes(&self) -> u64 {
        match self {
            Layer::SageMean {
                self_lin,
                neigh_lin,
            } => self_lin.bytes() + neigh_lin.bytes(),
            Layer::SagePool {
                pool_lin,
                self_lin,
                neigh_lin,
            } => pool_lin.bytes() + self_lin.bytes() + neigh_lin.bytes(),
            Layer::Gcn { lin, bias } => lin.bytes() + 4 * bias.len() as u64,
            Layer::Gin { lin1, lin2, .. } => 4 + lin1.bytes() + lin2.bytes(),
        }
    }
}

/// The tensors (name, shape) of layer `i` of `arch`, in the module table's order.
pub(crate) fn layer_tensors(arch: &Architecture, i: usize) -> Vec<(String, Vec<usize>)> {
    let (d_in, d_out) = arch.layer_dims(i);
    let t = |suffix: &str, shape: &[usize]| (format!("convs.{i}.{suffix}"), shape.to_vec());
    let sage = [
        t("self_lin.weight", &[d_out, d_in]),
        t("self_lin.bias", &[d_out]),
        t("neigh_lin.weight", &[d_out, d_in]),
    ];
    match arch.kind {
        ModelKind::SageMean => sage.to_vec(),
        ModelKind::SagePool => {
            let mut v = sage.to_vec();
            v.push(t("pool_lin.weight", &[d_in, d_in]));
            v.push(t("pool_lin.bias", &[d_in]));
            v
        }
        ModelKind::Gcn => vec![t("lin.weight", &[d_out, d_in]), t("lin.bias", &[d_out])],
        ModelKind::Gin => vec![
            t("lin1.weight", &[d_out, d_in]),
            t("lin1.bias", &[d_out]),
            t("lin2.weight", &[d_out, d_out]),
            t("lin2.bias", &[d_out]),
            t("eps", &[]),
        ],
    }
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
) -> Result<Vec<Layer>> {
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

    let mut take = |i: usize, suffix: &str| {
        tensors
            .remove(&format!("convs.{i}.{suffix}"))
            .expect("checked above")
    };
    let layers = (0..arch.layers)
        .map(|i| {
            let mut linear = |name: &str, bias: bool| {
                let w = take(i, &format!("{name}.weight"));
                let b = bias.then(|| take(i, &format!("{name}.bias")));
                Linear::new(w, b, precision)
            };
            match arch.kind {
                ModelKind::SageMean => Layer::SageMean {
                    self_lin: linear("self_lin", true),
                    neigh_lin: linear("neigh_lin", false),
                },
                ModelKind::SagePool => Layer::SagePool {
                    pool_lin: linear("pool_lin", true),
                    self_lin: linear("self_lin", true),
                    neigh_lin: linear("neigh_lin", false),
                },
                ModelKind::Gcn => {
                    let lin = linear("lin", false);
                    let bias = take(i, "lin.bias").data;
                    Layer::Gcn { lin, bias }
                }
                ModelKind::Gin => Layer::Gin {
                    lin1: linear("lin1", true),
                    lin2: linear("lin2", true),
                    eps: take(i, "eps").data[0],
                },
            }
        })
        .collect();
    Ok(layers)
}
