//! The kernels of native GNN inference (the forward pass is [`super::Model::forward`]), with
//! the same formulas as the PyTorch reference so that an exported model gives the same
//! outputs here.
//!
//! Dense products go through `matrixmultiply::sgemm` (fp32) or the int8 kernel of
//! [`super::quant`]; each layer kind's aggregation (mean, max, sum, GCN normalisation), in
//! its file under `layers/`, is a float32 loop over each destination's sampled sources.

use super::layers::{Linear, Weight};

/// Row `i` of the row-major matrix `x` of width `d`.
#[inline]
pub(super) fn row(x: &[f32], i: u32, d: usize) -> &[f32] {
    let start = i as usize * d;
    &x[start..start + d]
}

/// `acc += src`, elementwise.
#[inline]
pub(super) fn add_row(acc: &mut [f32], src: &[f32]) {
    for (a, &s) in acc.iter_mut().zip(src) {
        *a += s;
    }
}

impl Linear {
    /// `x W^T + b` for the `n` row-major rows of `x` (`n * in_dim` values): `(n, out_dim)`.
    pub fn apply(&self, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * self.out_dim];
        self.apply_add(x, n, &mut out);
        out
    }

    /// `out += x W^T + b` for the `n` rows of `x`; `out` is `(n, out_dim)`.
    pub fn apply_add(&self, x: &[f32], n: usize, out: &mut [f32]) {
        let (k, m) = (self.in_dim, self.out_dim);
        assert_eq!(x.len(), n * k, "input of {n} rows x {k}");
        assert_eq!(out.len(), n * m, "output of {n} rows x {m}");
        match &self.weight {
            Weight::F32(w) => {
                // SAFETY: x is n x k (row stride k), W is m x k row-major so W^T is k x m with
                // row stride 1 and column stride k, out is n x m (row stride m). x and out
                // were checked above and W's m x k shape when the model was loaded, so every
                // element sgemm touches is in bounds.
                unsafe {
                    matrixmultiply::sgemm(
                        n,
                        k,
                        m,
                        1.0,
                        x.as_ptr(),
                        k as isize,
                        1,
                        w.as_ptr(),
                        1,
                        k as isize,
                        1.0,
                        out.as_mut_ptr(),
                        m as isize,
                        1,
                    );
                }
            }
            Weight::Int8(q) => q.matmul_add(x, n, out),
        }
        if let Some(b) = &self.bias {
            for out_row in out.chunks_exact_mut(m) {
                add_row(out_row, b);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::error::ServeError;
    use crate::model::file::tests::safetensors;
    use crate::model::{Model, Precision};
    use strata_graph::Block;

    /// A model of `kind` (one layer unless `arch` says otherwise) from named tensors.
    fn model(arch: &str, tensors: &[(&str, &[usize], &[f32])], precision: Precision) -> Model {
        Model::from_bytes(&safetensors(tensors, Some(arch)), None, None, precision).unwrap()
    }

    fn one_layer(kind: &str, out_dim: usize) -> String {
        format!(
            r#"{{"kind":"{kind}","in_dim":2,"hidden_dim":2,"out_dim":{out_dim},"layers":1,"fanouts":[-1]}}"#
        )
    }

    /// 4 sources, 3 destinations: 0 <- {1, 3}, 1 <- {} (no sampled source), 2 <- {0}.
    fn block() -> Block {
        Block {
            num_src: 4,
            num_dst: 3,
            indptr: vec![0, 2, 2, 3],
            indices: vec![1, 3, 0],
        }
    }

    const X: [f32; 8] = [1., 2., 3., 4., 5., 6., -1., 0.];
    const IDENTITY: [f32; 4] = [1., 0., 0., 1.];

    fn assert_close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn sage_is_self_plus_mean_of_sources() {
        let m = model(
            &one_layer("sage", 2),
            &[
                ("convs.0.self_lin.weight", &[2, 2], &IDENTITY),
                ("convs.0.self_lin.bias", &[2], &[0.5, -0.5]),
                ("convs.0.neigh_lin.weight", &[2, 2], &[1., 1., 0., 2.]),
            ],
            Precision::Fp32,
        );
        // v0: [1.5, 1.5] + W_neigh [1, 2]; v1 has no sources: self only; v2: x2 + b + W_neigh x0.
        let out = m.forward(&[block()], &X).unwrap();
        assert_close(&out, &[4.5, 5.5, 3.5, 3.5, 8.5, 9.5]);
    }

    #[test]
    fn sage_pool_is_self_plus_max_of_pooled_sources() {
        let m = model(
            &one_layer("sage_pool", 2),
            &[
                ("convs.0.pool_lin.weight", &[2, 2], &[1., 0., 0., -1.]),
                ("convs.0.pool_lin.bias", &[2], &[0., 1.]),
                ("convs.0.self_lin.weight", &[2, 2], &IDENTITY),
                ("convs.0.self_lin.bias", &[2], &[0., 0.]),
                ("convs.0.neigh_lin.weight", &[2, 2], &IDENTITY),
            ],
            Precision::Fp32,
        );
        // Pooled rows ReLU([x_0, 1 - x_1]): [1, 0], [3, 0], [5, 0], [0, 1].
        // v0: x0 + max([3, 0], [0, 1]); v1: x1 + zeros; v2: x2 + [1, 0].
        let out = m.forward(&[block()], &X).unwrap();
        assert_close(&out, &[4., 3., 3., 4., 6., 6.]);
    }

    #[test]
    fn gcn_normalises_by_block_degrees_with_self_loops() {
        let m = model(
            &one_layer("gcn", 2),
            &[
                ("convs.0.lin.weight", &[2, 2], &IDENTITY),
                ("convs.0.lin.bias", &[2], &[0.1, 0.2]),
            ],
            Precision::Fp32,
        );
        // Source degrees (out-degree + loop for destinations): 2, 2, 1, 1; destination
        // degrees (in-degree + loop): 3, 1, 2.
        let (s2, s3, s6) = (2f32.sqrt(), 3f32.sqrt(), 6f32.sqrt());
        let want = [
            (1. + 3.) / s6 - 1. / s3 + 0.1,
            (2. + 4.) / s6 + 0.2,
            3. / s2 + 0.1,
            4. / s2 + 0.2,
            5. / s2 + 1. / 2. + 0.1,
            6. / s2 + 2. / 2. + 0.2,
        ];
        assert_close(&m.forward(&[block()], &X).unwrap(), &want);
    }

    #[test]
    fn gin_applies_its_mlp_to_the_eps_weighted_sum() {
        let m = model(
            &one_layer("gin", 2),
            &[
                ("convs.0.lin1.weight", &[2, 2], &IDENTITY),
                ("convs.0.lin1.bias", &[2], &[0., -10.]),
                ("convs.0.lin2.weight", &[2, 2], &[1., 1., 1., -1.]),
                ("convs.0.lin2.bias", &[2], &[0., 0.]),
                ("convs.0.eps", &[], &[0.5]),
            ],
            Precision::Fp32,
        );
        // Sums 1.5 x_v + sum x_u: [3.5, 7], [4.5, 6], [8.5, 11]; lin1 + ReLU: [3.5, 0],
        // [4.5, 0], [8.5, 1]; lin2: [a + b, a - b].
        let out = m.forward(&[block()], &X).unwrap();
        assert_close(&out, &[3.5, 3.5, 4.5, 4.5, 9.5, 7.5]);
    }

    /// A 2-layer sage whose first layer negates the second feature, so the ReLU between
    /// layers decides the result.
    fn two_layer() -> Model {
        model(
            r#"{"kind":"sage","in_dim":2,"hidden_dim":2,"out_dim":1,"layers":2,"fanouts":[2,2]}"#,
            &[
                ("convs.0.self_lin.weight", &[2, 2], &[1., 0., 0., -1.]),
                ("convs.0.self_lin.bias", &[2], &[0., 0.]),
                ("convs.0.neigh_lin.weight", &[2, 2], &[0., 0., 0., 0.]),
                ("convs.1.self_lin.weight", &[1, 2], &[1., 1.]),
                ("convs.1.self_lin.bias", &[1], &[0.]),
                ("convs.1.neigh_lin.weight", &[1, 2], &[1., 1.]),
            ],
            Precision::Fp32,
        )
    }

    fn seeds_block() -> Block {
        Block {
            num_src: 3,
            num_dst: 1,
            indptr: vec![0, 2],
            indices: vec![1, 2],
        }
    }

    #[test]
    fn layers_chain_with_relu_between() {
        // Layer 0 gives [x_v0, -x_v1] -> ReLU -> [1, 0], [3, 0], [5, 0]; layer 1 at the seed:
        // 1 + mean(3, 5) = 5 (without the ReLU it would be -2).
        let out = two_layer().forward(&[block(), seeds_block()], &X).unwrap();
        assert_close(&out, &[5.]);
    }

    #[test]
    fn malformed_inputs_are_named() {
        let m = two_layer();
        let err = |blocks: &[Block], x: &[f32]| m.forward(blocks, x).unwrap_err().to_string();
        assert!(err(&[block()], &X).contains("needs 2 blocks, got 1"));
        assert!(err(&[block(), seeds_block()], &X[..6])
            .contains("x: expected blocks[0].num_src x in_dim = 4 x 2 = 8 values, got 6"));
        let mut b = block();
        b.indices[0] = 4;
        assert!(err(&[b, seeds_block()], &X)
            .contains("blocks[0]: source index 4 is out of range (num_src 4)"));
        let mut b = block();
        b.indptr = vec![0, 2, 3];
        assert!(err(&[b, seeds_block()], &X)
            .contains("blocks[0]: indptr has 3 offsets, expected num_dst + 1 = 4"));
        let mut b = block();
        b.indptr = vec![0, 2, 1, 3];
        assert!(err(&[b, seeds_block()], &X).contains("never decrease"));
        let mut b = block();
        b.indptr[3] = 2;
        assert!(err(&[b, seeds_block()], &X).contains("indptr ends at 2 but there are 3 indices"));
        let mut s = seeds_block();
        s.num_src = 4;
        s.num_dst = 1;
        assert!(
            err(&[block(), s], &X).contains("blocks[1]: num_src 4 must equal blocks[0].num_dst 3")
        );
        let mut b = block();
        b.num_dst = 5;
        assert!(err(&[b, seeds_block()], &X).contains("num_dst 5 exceeds num_src 4"));
        assert!(matches!(
            m.forward(&[block()], &X),
            Err(ServeError::InvalidArgument(_))
        ));
    }

    /// A deterministic pseudo-random generator (xorshift64*) for test data.
    struct Rng(u64);

    impl Rng {
        /// Uniform in [-1, 1).
        fn next(&mut self) -> f32 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            let bits = self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 40;
            bits as f32 / (1u64 << 23) as f32 - 1.0
        }

        fn below(&mut self, n: usize) -> usize {
            ((self.next() + 1.0) * 0.5 * n as f32) as usize % n
        }

        fn vec(&mut self, n: usize) -> Vec<f32> {
            (0..n).map(|_| self.next()).collect()
        }
    }

    /// A random block of `num_src` sources and `num_dst` destinations with up to 5 sources
    /// each.
    fn random_block(rng: &mut Rng, num_src: usize, num_dst: usize) -> Block {
        let mut indptr = vec![0u64];
        let mut indices = Vec::new();
        for _ in 0..num_dst {
            for _ in 0..rng.below(6) {
                indices.push(rng.below(num_src) as u32);
            }
            indptr.push(indices.len() as u64);
        }
        Block {
            num_src,
            num_dst,
            indptr,
            indices,
        }
    }

    #[test]
    fn int8_is_close_to_fp32_on_random_data() {
        let (d_in, hidden, d_out) = (24, 32, 8);
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for kind in ["sage", "sage_pool", "gcn", "gin"] {
            let arch = format!(
                r#"{{"kind":"{kind}","in_dim":{d_in},"hidden_dim":{hidden},"out_dim":{d_out},"layers":2,"fanouts":[5,5]}}"#
            );
            let arch_value: crate::model::Architecture = serde_json::from_str(&arch).unwrap();
            // Every tensor the architecture needs, with random values.
            let names: Vec<(String, Vec<usize>)> = (0..2)
                .flat_map(|i| crate::model::assemble::layer_tensors(&arch_value, i))
                .collect();
            let values: Vec<Vec<f32>> = names
                .iter()
                .map(|(_, s)| rng.vec(s.iter().product()))
                .collect();
            let tensors: Vec<(&str, &[usize], &[f32])> = names
                .iter()
                .zip(&values)
                .map(|((n, s), v)| (n.as_str(), s.as_slice(), v.as_slice()))
                .collect();
            let fp32 = model(&arch, &tensors, Precision::Fp32);
            let int8 = model(&arch, &tensors, Precision::Int8);
            assert!(
                int8.bytes() < fp32.bytes() / 2,
                "{kind}: {} vs {}",
                int8.bytes(),
                fp32.bytes()
            );
            assert_eq!(int8.parameters(), fp32.parameters());
            let blocks = [
                random_block(&mut rng, 60, 20),
                random_block(&mut rng, 20, 7),
            ];
            let x = rng.vec(60 * d_in);
            let a = fp32.forward(&blocks, &x).unwrap();
            let b = int8.forward(&blocks, &x).unwrap();
            assert_eq!(a.len(), 7 * d_out);
            let scale = a.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = a
                .iter()
                .zip(&b)
                .fold(0f32, |m, (p, q)| m.max((p - q).abs()));
            assert!(
                err <= 0.05 * scale,
                "{kind}: int8 max error {err} vs output scale {scale}"
            );
        }
    }
}
