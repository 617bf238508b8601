//! Dense kernels of the training step: matrix products (`gemm`: an own AVX-512 kernel, or
//! matrixmultiply's AVX2/FMA/portable ones, chosen at run time) and a vectorised softmax whose
//! hot loop is compiled for AVX-512 and AVX2 and chosen at run time, so one build runs
//! everywhere and fast here.

use strata_store::rng::Rng;

pub use crate::compute::gemm::{gemm_ab, gemm_abt, gemm_atb};

/// `exp(x)` for `x <= 0` to within 4e-6 relative error: `2^(x log2 e)` split into an integer
/// power (built in the exponent bits) and a degree-6 polynomial on `[-0.5, 0.5]`. Written as
/// straight-line arithmetic without library calls (`floor`, not `round`, which has no vector
/// instruction) so that the compiler vectorises it.
#[inline(always)]
fn exp_neg(x: f32) -> f32 {
    // Not `clamp`, which passes NaN through; max/min map it to -87.
    #[allow(clippy::manual_clamp)]
    let x = x.max(-87.0).min(0.0);
    let t = x * std::f32::consts::LOG2_E;
    let k = (t + 0.5).floor();
    let f = t - k;
    // 2^f on [-0.5, 0.5] (minimax-like Taylor coefficients of e^(f ln 2)).
    let p = 1.0
        + f * (std::f32::consts::LN_2
            + f * (0.240_226_5
                + f * (0.055_504_11
                    + f * (0.009_618_129 + f * (0.001_333_356 + f * 0.000_154_035_3)))));
    // SAFETY: k is an integer in [-126, 0] (x is clamped, NaN included, to [-87, 0]), so the
    // unchecked conversion (one vector instruction, unlike `as`) is exact.
    let k: i32 = unsafe { k.to_int_unchecked() };
    let bits = ((k + 127) as u32) << 23;
    p * f32::from_bits(bits)
}

/// Lanes of the partial sums: independent accumulators let the loop vectorise without
/// reassociating float additions.
const LANES: usize = 16;

/// Defines `pub fn NAME(args) -> ret` that runs the `#[inline(always)]` function `generic`
/// compiled for AVX-512, for AVX2 or for the baseline, the widest the CPU has (detected at run
/// time), so that one build runs everywhere and uses the vector unit it finds.
macro_rules! widest {
    ($(#[$doc:meta])* pub fn $name:ident($($arg:ident: $ty:ty),*) -> $ret:ty = $generic:ident) => {
        $(#[$doc])*
        pub fn $name($($arg: $ty),*) -> $ret {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512dq,fma")]
                unsafe fn avx512($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) -> $ret {
                    $generic($($arg),*)
                }
                if std::is_x86_feature_detected!("avx512f")
                    && std::is_x86_feature_detected!("avx512dq")
                {
                    // SAFETY: the features were detected at run time.
                    return unsafe { avx512($($arg),*) };
                }
                if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
                    // SAFETY: as above.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $generic($($arg),*)
        }
    };
}

/// Shifts `row` by `shift`, exponentiates it in place and returns the sum (all inputs `<= shift`).
#[inline(always)]
fn exp_sum_generic(row: &mut [f32], shift: f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            let v = exp_neg(c[l] - shift);
            c[l] = v;
            acc[l] += v;
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for v in chunks.into_remainder() {
        *v = exp_neg(*v - shift);
        sum += *v;
    }
    sum
}

widest! {
    /// `row[i] = exp(row[i] - shift)`, returning the sum (every `row[i] <= shift`).
    pub fn exp_sum(row: &mut [f32], shift: f32) -> f32 = exp_sum_generic
}

/// The largest value of `row` (NaNs ignored; -inf when empty or all NaN).
#[inline(always)]
fn max_generic(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            acc[l] = if c[l] > acc[l] { c[l] } else { acc[l] };
        }
    }
    chunks
        .remainder()
        .iter()
        .chain(&acc)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

widest! {
    /// The largest value of `row` (NaNs ignored; -inf when empty or all NaN).
    pub fn max(row: &[f32]) -> f32 = max_generic
}

/// `out[j] = −Σ_k |a_k − c_jk|` for each row `c_j` of `cands` (`a.len()` reals each).
#[inline(always)]
fn l1_scores_generic(a: &[f32], cands: &[f32], out: &mut [f32]) {
    for (o, c) in out.iter_mut().zip(cands.chunks_exact(a.len())) {
        let mut acc = [0.0f32; LANES];
        let (mut ax, mut cx) = (a.chunks_exact(LANES), c.chunks_exact(LANES));
        for (x, y) in (&mut ax).zip(&mut cx) {
            for l in 0..LANES {
                acc[l] += (x[l] - y[l]).abs();
            }
        }
        let tail = ax.remainder().iter().zip(cx.remainder());
        *o = -(acc.iter().sum::<f32>() + tail.map(|(x, y)| (x - y).abs()).sum::<f32>());
    }
}

widest! {
    /// TransE-L1 scores of one query row `a` (`d` reals) against the rows of `cands` (`n`
    /// rows of `d`) into `out` (`n`): `out[j] = −Σ_k |a_k − c_jk|`.
    pub fn l1_scores(a: &[f32], cands: &[f32], out: &mut [f32]) -> () = l1_scores_generic
}

/// The modulus `sqrt(x² + y² + 1e-9)` of each complex coordinate, summed: `−Σ_k |a_k − c_jk|`
/// over `a.len() / 2` complex coordinates stored as real halves then imaginary halves.
#[inline(always)]
fn modulus_scores_generic(a: &[f32], cands: &[f32], out: &mut [f32]) {
    let h = a.len() / 2;
    let (ar, ai) = a.split_at(h);
    let modulus = |xr: f32, xi: f32| (xr * xr + xi * xi + 1e-9).sqrt();
    let lanes = |v| <[f32]>::chunks_exact(v, LANES);
    for (o, c) in out.iter_mut().zip(cands.chunks_exact(a.len())) {
        let (cr, ci) = c.split_at(h);
        let mut acc = [0.0f32; LANES];
        let mut parts = lanes(ar).zip(lanes(ai)).zip(lanes(cr).zip(lanes(ci)));
        for ((xr, xi), (yr, yi)) in &mut parts {
            for l in 0..LANES {
                acc[l] += modulus(xr[l] - yr[l], xi[l] - yi[l]);
            }
        }
        let done = h - h % LANES;
        let tail: f32 = (done..h)
            .map(|k| modulus(ar[k] - cr[k], ai[k] - ci[k]))
            .sum();
        *o = -(acc.iter().sum::<f32>() + tail);
    }
}

widest! {
    /// RotatE scores of one rotated query row `a` (`d` reals: `d/2` real parts, then `d/2`
    /// imaginary parts) against the rows of `cands` (`n` rows of `d`) into `out` (`n`):
    /// `out[j] = −Σ_k |a_k − c_jk|`, the moduli of the complex differences.
    pub fn modulus_scores(a: &[f32], cands: &[f32], out: &mut [f32]) -> () = modulus_scores_generic
}

/// The gradients of [`l1_scores_generic`], weighted by `w` (rows with `w_j = 0` skipped).
#[inline(always)]
fn l1_grads_generic(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]) {
    let d = a.len();
    let rows = cands.chunks_exact(d).zip(dcands.chunks_exact_mut(d));
    for ((c, dc), &wj) in rows.zip(w) {
        if wj == 0.0 {
            continue;
        }
        // Re-cut to `d` as in modulus_grads_generic: no bounds checks, a vectorised loop.
        let (a, c, da, dc) = (&a[..d], &c[..d], &mut da[..d], &mut dc[..d]);
        for k in 0..d {
            let g = wj * (a[k] - c[k]).signum();
            da[k] -= g;
            dc[k] += g;
        }
    }
}

widest! {
    /// Adds `w_j · d/da` and `w_j · d/dc_j` of the TransE-L1 score `−Σ_k |a_k − c_jk|` to `da`
    /// (`d`) and to row `j` of `dcands` (`n` rows of `d`), for each `j` with `w_j ≠ 0`.
    pub fn l1_grads(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]) -> () = l1_grads_generic
}

/// The gradients of [`modulus_scores_generic`], weighted by `w` (rows with `w_j = 0` skipped).
#[inline(always)]
fn modulus_grads_generic(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]) {
    let (d, h) = (a.len(), a.len() / 2);
    let (ar, ai) = a.split_at(h);
    let (dar, dai) = da.split_at_mut(h);
    let rows = cands.chunks_exact(d).zip(dcands.chunks_exact_mut(d));
    for ((c, dc), &wj) in rows.zip(w) {
        if wj == 0.0 {
            continue;
        }
        let ((cr, ci), (dcr, dci)) = (c.split_at(h), dc.split_at_mut(h));
        // Every slice re-cut to `h` so that the compiler drops the bounds checks and
        // vectorises the loop.
        let (ar, ai, cr, ci) = (&ar[..h], &ai[..h], &cr[..h], &ci[..h]);
        let (dar, dai, dcr, dci) = (&mut dar[..h], &mut dai[..h], &mut dcr[..h], &mut dci[..h]);
        for k in 0..h {
            let (er, ei) = (ar[k] - cr[k], ai[k] - ci[k]);
            // d|e|/de = e / |e|, with the score's 1e-9 inside the modulus.
            let g = wj / (er * er + ei * ei + 1e-9).sqrt();
            dar[k] -= g * er;
            dai[k] -= g * ei;
            dcr[k] += g * er;
            dci[k] += g * ei;
        }
    }
}

widest! {
    /// Adds `w_j · d/da` and `w_j · d/dc_j` of the RotatE score `−Σ_k |a_k − c_jk|` (see
    /// [`modulus_scores`]) to `da` (`d`) and to row `j` of `dcands` (`n` rows of `d`), for
    /// each `j` with `w_j ≠ 0`.
    pub fn modulus_grads(a: &[f32], cands: &[f32], w: &[f32], da: &mut [f32], dcands: &mut [f32]) -> () = modulus_grads_generic
}

/// `sum_i a[i] * b[i]`.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight partial sums let the compiler vectorise without reassociation flags.
    let mut acc = [0.0f32; 8];
    let chunks = a.len() / 8;
    for c in 0..chunks {
        for l in 0..8 {
            acc[l] += a[c * 8 + l] * b[c * 8 + l];
        }
    }
    let mut s: f32 = acc.iter().sum();
    for i in chunks * 8..a.len() {
        s += a[i] * b[i];
    }
    s
}

/// Draws of [`drop_scaled`]'s blocks: 512 reals a block, their random bits on the stack.
const DROP_BLOCK: usize = 256;

#[inline(always)]
fn drop_scaled_generic(
    keep: f32,
    cut: u64,
    rows: &[f32],
    out: &mut [f32],
    mask: &mut [f32],
    rng: &mut Rng,
) {
    let mut bits = [0u64; DROP_BLOCK];
    let blocks = rows
        .chunks(2 * DROP_BLOCK)
        .zip(out.chunks_mut(2 * DROP_BLOCK))
        .zip(mask.chunks_mut(2 * DROP_BLOCK));
    // A comparison picks each factor, not a branch: the comparison is a coin flip, which a
    // branch predictor mispredicts often enough to cost 9 ns a real.
    let factor = |half: u64| keep * f32::from(u8::from(half >= cut));
    for ((x, o), m) in blocks {
        let bits = &mut bits[..x.len().div_ceil(2)];
        rng.fill(bits);
        let mut pairs = m.chunks_exact_mut(2);
        for (pair, &b) in (&mut pairs).zip(bits.iter()) {
            pair[0] = factor(b & 0xffff_ffff);
            pair[1] = factor(b >> 32);
        }
        if let [last] = pairs.into_remainder() {
            *last = factor(bits[bits.len() - 1] & 0xffff_ffff);
        }
        for ((o, x), m) in o.iter_mut().zip(x).zip(m.iter()) {
            *o = x * m;
        }
    }
}

widest! {
    /// Inverted dropout of `rows` into `out` (as long): each real's factor, written to `mask`,
    /// is `keep` unless its 32 random bits fall below `cut`, then 0. Two reals a draw of `rng`
    /// (the low half first; an odd last real takes a draw of its own), so the masks are those
    /// of as many `next_u64` calls; the draws come a block at a time ([`Rng::fill`]), which the
    /// vector unit computes eight at once.
    pub fn drop_scaled(
        keep: f32,
        cut: u64,
        rows: &[f32],
        out: &mut [f32],
        mask: &mut [f32],
        rng: &mut Rng
    ) -> () = drop_scaled_generic
}

/// A large matrix product timed on this machine, in FLOP/s: the reference that the training
/// step's achieved rate is reported against.
pub fn sgemm_reference_flops() -> f64 {
    let (m, k, n) = (1024, 128, 1024);
    let a: Vec<f32> = (0..m * k).map(|i| ((i % 17) as f32) * 0.01).collect();
    let b: Vec<f32> = (0..n * k).map(|i| ((i % 13) as f32) * 0.01).collect();
    let mut c = vec![0.0f32; m * n];
    gemm_abt(m, n, k, 1.0, &a, &b, 0.0, &mut c);
    let reps = 20;
    let start = std::time::Instant::now();
    for _ in 0..reps {
        gemm_abt(m, n, k, 1.0, &a, &b, 0.0, &mut c);
    }
    2.0 * (m * n * k * reps) as f64 / start.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_is_accurate() {
        let mut worst = 0.0f64;
        for i in 0..100_000 {
            let x = -(i as f32) * 0.0008;
            let got = exp_neg(x) as f64;
            let want = (x as f64).exp();
            worst = worst.max((got - want).abs() / want);
        }
        assert!(worst < 5e-6, "{worst}");
        let mut row = vec![0.0f32, -1.0, -2.0, -100.0];
        let s = exp_sum(&mut row, 0.0);
        assert!((s - (1.0 + (-1f32).exp() + (-2f32).exp())).abs() < 1e-6);
        assert!(row[3] >= 0.0 && row[3] < 1e-30);
    }

    #[test]
    fn max_covers_the_remainder_and_ignores_nan() {
        let mut row: Vec<f32> = (0..37).map(|i| -(i as f32)).collect();
        row[36] = 5.0;
        row[3] = f32::NAN;
        assert_eq!(max(&row), 5.0);
        assert_eq!(max(&row[..16]), 0.0);
        assert_eq!(max(&[]), f32::NEG_INFINITY);
    }

    #[test]
    fn dot_covers_the_remainder() {
        assert!((dot(&[1.0; 19], &[2.0; 19]) - 38.0).abs() < 1e-6);
    }

    /// `n` rows of `d` values in [-1, 1).
    fn rows(rng: &mut strata_store::rng::Rng, n: usize, d: usize) -> Vec<f32> {
        (0..n * d)
            .map(|_| rng.next_f64() as f32 * 2.0 - 1.0)
            .collect()
    }

    /// The plain per-pair arithmetic the block kernels replace: RotatE's moduli (`complex`)
    /// or TransE's L1 distance, and its gradient weighted by `w` into `da`, `dt`.
    fn reference(
        complex: bool,
        a: &[f32],
        t: &[f32],
        w: f32,
        da: &mut [f32],
        dt: &mut [f32],
    ) -> f32 {
        let h = a.len() / 2;
        let mut score = 0.0;
        for k in 0..if complex { h } else { a.len() } {
            if complex {
                let (er, ei) = (a[k] - t[k], a[h + k] - t[h + k]);
                let m = (er * er + ei * ei + 1e-9).sqrt();
                score -= m;
                for (i, e) in [(k, er), (h + k, ei)] {
                    da[i] -= w * e / m;
                    dt[i] += w * e / m;
                }
            } else {
                score -= (a[k] - t[k]).abs();
                da[k] -= w * (a[k] - t[k]).signum();
                dt[k] += w * (a[k] - t[k]).signum();
            }
        }
        score
    }

    #[test]
    fn pairwise_block_kernels_match_the_per_pair_arithmetic() {
        let mut rng = strata_store::rng::Rng::new(7);
        // Sizes below, at and past the 16 lanes, with remainders (d = 70: 35 complex).
        for (n, d) in [(1, 2), (5, 32), (9, 70), (3, 64)] {
            let (a, cands) = (rows(&mut rng, 1, d), rows(&mut rng, n, d));
            // Every third weight zero: those rows take no gradient.
            let w: Vec<f32> = (0..n)
                .map(|j| if j % 3 == 1 { 0.0 } else { 0.5 + j as f32 })
                .collect();
            for complex in [true, false] {
                let (mut out, mut da, mut dc) = (vec![0.0; n], vec![0.0; d], vec![0.0; n * d]);
                if complex {
                    modulus_scores(&a, &cands, &mut out);
                    modulus_grads(&a, &cands, &w, &mut da, &mut dc);
                } else {
                    l1_scores(&a, &cands, &mut out);
                    l1_grads(&a, &cands, &w, &mut da, &mut dc);
                }
                let (mut want_da, mut want_dc) = (vec![0.0; d], vec![0.0; n * d]);
                for j in 0..n {
                    let (t, dt) = (&cands[j * d..(j + 1) * d], &mut want_dc[j * d..(j + 1) * d]);
                    let want = reference(complex, &a, t, w[j], &mut want_da, dt);
                    assert!(
                        (out[j] - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{complex} {n}x{d} {j}"
                    );
                }
                for (got, want) in da.iter().chain(&dc).zip(want_da.iter().chain(&want_dc)) {
                    assert!(
                        (got - want).abs() < 1e-4 * (1.0 + want.abs()),
                        "{complex} {n}x{d}: {got} {want}"
                    );
                }
                if n >= 2 {
                    assert!(
                        dc[d..2 * d].iter().all(|&v| v == 0.0),
                        "row 1's zero weight moved it"
                    );
                }
            }
        }
    }
}
