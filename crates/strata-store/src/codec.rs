//! Row codecs for float32 feature rows held in memory: the rows stay float32 on disk, and a
//! tier that holds them encoded fits more of them in the same bytes. Shared by the serve
//! engine (int8 activations and weights) and the GNN feature tiers (hot set and cache).
//!
//! - **f32**: the row as it is, 4 bytes a value.
//! - **f16**: IEEE half precision, 2 bytes a value; relative error at most 2^-11 for values in
//!   f16's normal range (about 6.1e-5 to 65,504 in magnitude); larger ones become infinite.
//! - **int8**: symmetric with one scale per row, 1 byte a value plus a 4-byte scale.
//!   Symmetric quantization maps `v` to `round(v / s)` with `s = max|v| / 127`, so the
//!   largest magnitude becomes ±127 and zero stays exactly zero (ReLU outputs, padding and the
//!   zeros of sparse bag-of-words features cost nothing). The error of a value is at most
//!   `s / 2`. A per-row scale keeps one large row from crushing the resolution of the others.
//!
//! Encoded rows are byte strings (no alignment needed): f16 values little-endian; int8 rows
//! the scale as a little-endian float32, then the values.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// How a float32 row is held in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum FeatureCodec {
    /// float32 as on disk (4 bytes a value)
    #[default]
    F32,
    /// float16 (2 bytes a value: twice the rows)
    F16,
    /// int8 with one float32 scale per row (1 byte a value + 4: about four times the rows)
    Int8,
}

/// Bytes of the per-row scale of an int8 row.
const SCALE_BYTES: usize = 4;

impl FeatureCodec {
    /// `f32`, `f16` or `int8`, as the config spells it.
    pub fn name(self) -> &'static str {
        match self {
            FeatureCodec::F32 => "f32",
            FeatureCodec::F16 => "f16",
            FeatureCodec::Int8 => "int8",
        }
    }

    /// Bytes of one encoded row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            FeatureCodec::F32 => 4 * dim,
            FeatureCodec::F16 => 2 * dim,
            FeatureCodec::Int8 => dim + SCALE_BYTES,
        }
    }

    /// Encodes the float32 row `src` (`4 * dim` little-endian bytes) into `dst`
    /// ([`FeatureCodec::row_bytes`]`(dim)` bytes).
    ///
    /// Panics if the lengths disagree.
    pub fn encode(self, src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len() % 4, 0, "a float32 row of {} bytes", src.len());
        let dim = src.len() / 4;
        assert_eq!(
            dst.len(),
            self.row_bytes(dim),
            "{} row of {dim} values",
            self.name()
        );
        let values = src
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        match self {
            FeatureCodec::F32 => dst.copy_from_slice(src),
            FeatureCodec::F16 => {
                for (d, v) in dst.chunks_exact_mut(2).zip(values) {
                    d.copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                }
            }
            FeatureCodec::Int8 => {
                let row: Vec<f32> = values.collect();
                let (scale, q) = dst.split_at_mut(SCALE_BYTES);
                let s = quantize_row(&row, bytemuck::cast_slice_mut(q));
                scale.copy_from_slice(&s.to_le_bytes());
            }
        }
    }

    /// Decodes the encoded row `src` ([`FeatureCodec::row_bytes`]`(dim)` bytes) into the
    /// float32 row `dst` (`4 * dim` little-endian bytes).
    ///
    /// Panics if the lengths disagree.
    pub fn decode(self, src: &[u8], dst: &mut [u8]) {
        assert_eq!(dst.len() % 4, 0, "a float32 row of {} bytes", dst.len());
        let dim = dst.len() / 4;
        assert_eq!(
            src.len(),
            self.row_bytes(dim),
            "{} row of {dim} values",
            self.name()
        );
        let out = dst.chunks_exact_mut(4);
        match self {
            FeatureCodec::F32 => dst.copy_from_slice(src),
            FeatureCodec::F16 => {
                for (d, c) in out.zip(src.chunks_exact(2)) {
                    let v = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                    d.copy_from_slice(&v.to_le_bytes());
                }
            }
            FeatureCodec::Int8 => {
                let (scale, q) = src.split_at(SCALE_BYTES);
                let s = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
                for (d, &b) in out.zip(q) {
                    d.copy_from_slice(&(f32::from(b as i8) * s).to_le_bytes());
                }
            }
        }
    }
}

/// Quantizes `src` into `dst` (same length) symmetrically (see the module docs); returns the
/// scale (0 for an all-zero row, whose values all quantize to 0).
pub fn quantize_row(src: &[f32], dst: &mut [i8]) -> f32 {
    let max = src.iter().fold(0f32, |m, v| m.max(v.abs()));
    if max == 0.0 || !max.is_finite() {
        // A zero row is exact at scale 0; a non-finite row has no meaningful scale, and
        // zeroing it keeps NaN/inf from turning into arbitrary integers.
        dst.fill(0);
        return 0.0;
    }
    let inv = 127.0 / max;
    for (d, &v) in dst.iter_mut().zip(src) {
        *d = (v * inv).round().clamp(-127.0, 127.0) as i8;
    }
    max / 127.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn floats(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn round_trip(codec: FeatureCodec, v: &[f32]) -> Vec<f32> {
        let mut enc = vec![0u8; codec.row_bytes(v.len())];
        codec.encode(&bytes(v), &mut enc);
        let mut dec = vec![0u8; 4 * v.len()];
        codec.decode(&enc, &mut dec);
        floats(&dec)
    }

    #[test]
    fn quantize_row_is_symmetric_and_exact_at_the_extremes() {
        let mut q = [0i8; 4];
        let s = quantize_row(&[0.0, 1.0, -2.0, 0.5], &mut q);
        assert_eq!(s, 2.0 / 127.0);
        assert_eq!(q, [0, 64, -127, 32]);
        assert_eq!(quantize_row(&[0.0; 4], &mut q), 0.0);
        assert_eq!(q, [0; 4]);
    }

    #[test]
    fn row_bytes_halve_and_quarter_plus_the_scale() {
        assert_eq!(FeatureCodec::F32.row_bytes(100), 400);
        assert_eq!(FeatureCodec::F16.row_bytes(100), 200);
        assert_eq!(FeatureCodec::Int8.row_bytes(100), 104);
    }

    #[test]
    fn int8_keeps_zeros_and_the_largest_magnitude_exact() {
        let v = [0.0, 3.0, -1.5, 0.0];
        assert_eq!(round_trip(FeatureCodec::Int8, &v)[..2], [0.0, 3.0]);
        assert_eq!(round_trip(FeatureCodec::Int8, &[0.0; 3]), [0.0; 3]);
    }

    proptest! {
        #[test]
        fn f32_is_exact(v in proptest::collection::vec(-1e30f32..1e30, 1..64)) {
            prop_assert_eq!(round_trip(FeatureCodec::F32, &v), v);
        }

        /// f16 keeps 11 significant bits: a relative error of at most 2^-11 in its normal range.
        #[test]
        fn f16_error_is_relative(
            v in proptest::collection::vec(
                prop_oneof![-60000f32..-1e-4, 1e-4f32..60000.0], 1..64)
        ) {
            for (got, want) in round_trip(FeatureCodec::F16, &v).iter().zip(&v) {
                prop_assert!((got - want).abs() <= want.abs() * 2f32.powi(-11), "{got} vs {want}");
            }
        }

        /// int8 rounds each value to the nearest step of its row's scale: at most half a step
        /// off (and a hair of float32 rounding in the scale's multiplication).
        #[test]
        fn int8_error_is_half_the_row_scale(v in proptest::collection::vec(-1e6f32..1e6, 1..64)) {
            let scale = v.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
            for (got, want) in round_trip(FeatureCodec::Int8, &v).iter().zip(&v) {
                prop_assert!(
                    (got - want).abs() <= scale / 2.0 * (1.0 + 1e-5) + want.abs() * 1e-6,
                    "{got} vs {want} (scale {scale})"
                );
            }
        }
    }
}
