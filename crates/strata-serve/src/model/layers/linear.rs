//! The dense layers inside every layer kind, in the served precision (their products are in
//! [`super::super::kernels`]).

use super::super::precision::Precision;
use super::super::quant::QuantMatrix;
use super::super::tensor::Tensor;

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
