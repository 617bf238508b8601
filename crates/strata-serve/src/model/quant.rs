//! Int8 linear layers (GLIST serves 8-bit fixed point, §5.1): weights quantized once at load,
//! symmetric with one scale per output channel; activations quantized per row at run time;
//! products in integers with int32 accumulation, rescaled to float32. The quantization itself
//! ([`quantize_row`]) is shared with the GNN feature tiers in `strata_store::codec`, which
//! explains it.
//!
//! An int32 sum of `k` products of at most 127² each cannot overflow for
//! `k < 2^31 / 127² ≈ 133,000` inputs, far above any layer width served here.

use strata_store::codec::quantize_row;

/// A matrix `(rows, cols)` of int8 values, row `r` scaled by `scales[r]`:
/// `value[r][c] ≈ values[r * cols + c] as f32 * scales[r]`.
pub struct QuantMatrix {
    pub rows: usize,
    pub cols: usize,
    pub values: Vec<i8>,
    pub scales: Vec<f32>,
}

/// `sum a[i] * b[i]` in int32. A plain zip-map-sum over contiguous slices, which the compiler
/// vectorises (widening multiply-add) without intrinsics.
#[inline]
pub fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    a.iter()
        .zip(b)
        .map(|(&x, &y)| i32::from(x) * i32::from(y))
        .sum()
}

impl QuantMatrix {
    /// Quantizes the row-major float matrix `w` of `(rows, cols)`, one scale per row.
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> QuantMatrix {
        assert_eq!(w.len(), rows * cols, "matrix of {rows} x {cols}");
        let mut values = vec![0i8; w.len()];
        let scales = if cols == 0 {
            vec![0.0; rows]
        } else {
            w.chunks_exact(cols)
                .zip(values.chunks_exact_mut(cols))
                .map(|(src, dst)| quantize_row(src, dst))
                .collect()
        };
        QuantMatrix {
            rows,
            cols,
            values,
            scales,
        }
    }

    /// Bytes held: one per value plus a float32 scale per row.
    pub fn bytes(&self) -> u64 {
        self.values.len() as u64 + 4 * self.scales.len() as u64
    }

    /// `out += x W^T` for the `n` row-major rows of `x` (`n * cols` values): `out` is `(n,
    /// rows)`. Each row of `x` is quantized with its own scale, multiplied in int8 with int32
    /// accumulation and rescaled by both scales.
    pub fn matmul_add(&self, x: &[f32], n: usize, out: &mut [f32]) {
        assert_eq!(x.len(), n * self.cols, "input of {n} rows x {}", self.cols);
        assert_eq!(
            out.len(),
            n * self.rows,
            "output of {n} rows x {}",
            self.rows
        );
        if self.cols == 0 {
            return;
        }
        let mut xq = vec![0i8; self.cols];
        for (x_row, out_row) in x
            .chunks_exact(self.cols)
            .zip(out.chunks_exact_mut(self.rows))
        {
            let x_scale = quantize_row(x_row, &mut xq);
            if x_scale == 0.0 {
                continue; // the row is all zeros: nothing to add
            }
            let w_rows = self.values.chunks_exact(self.cols);
            for ((o, w_row), &w_scale) in out_row.iter_mut().zip(w_rows).zip(&self.scales) {
                *o += dot_i8(&xq, w_row) as f32 * (x_scale * w_scale);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_accumulates_in_int32() {
        let a = vec![127i8; 1000];
        let b = vec![-127i8; 1000];
        assert_eq!(dot_i8(&a, &b), -127 * 127 * 1000);
    }

    #[test]
    fn matmul_is_close_to_float() {
        // W (2, 3), x (2, 3): compare with the float product.
        let w = [0.5, -1.0, 0.25, 2.0, 0.0, -0.75];
        let x = [1.0, 2.0, 3.0, -0.5, 0.1, 0.0];
        let q = QuantMatrix::quantize(&w, 2, 3);
        assert_eq!(q.bytes(), 6 + 8);
        let mut out = vec![1.0; 4];
        q.matmul_add(&x, 2, &mut out);
        let max_abs = |v: &[f32]| v.iter().fold(0f32, |m, a| m.max(a.abs()));
        for r in 0..2 {
            let (xr, sx) = (&x[r * 3..r * 3 + 3], max_abs(&x[r * 3..r * 3 + 3]) / 127.0);
            for o in 0..2 {
                let (wo, sw) = (&w[o * 3..o * 3 + 3], max_abs(&w[o * 3..o * 3 + 3]) / 127.0);
                let want: f32 = 1.0 + xr.iter().zip(wo).map(|(a, b)| a * b).sum::<f32>();
                // Rounding moves each value by at most half a step: the product's error bound.
                let bound: f32 = xr
                    .iter()
                    .zip(wo)
                    .map(|(a, b)| b.abs() * sx / 2.0 + a.abs() * sw / 2.0 + sx * sw / 4.0)
                    .sum();
                let got = out[r * 2 + o];
                assert!(
                    (got - want).abs() <= bound * 1.001,
                    "{r},{o}: {got} vs {want} (bound {bound})"
                );
            }
        }
    }
}
