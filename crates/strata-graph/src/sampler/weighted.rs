//! Weighted choice without replacement (PyG's `weight_attr`): each successive draw takes one of
//! the edges left with probability proportional to its weight.
//!
//! Efraimidis and Spirakis ("Weighted random sampling with a reservoir", 2006) show that
//! giving edge `i` the key `u_i^(1 / w_i)`, `u_i` uniform in (0, 1], and keeping the `k`
//! largest keys draws exactly that distribution. The keys here are their logarithms,
//! `ln(u_i) / w_i`, which order the same and do not underflow for small weights.
//!
//! The logarithm is [`ln_unit`]'s, built from IEEE addition, multiplication and division
//! only, each correctly rounded on every CPU and GPU, in a fixed order: a device's own `log`
//! may round its last bit differently, which could swap two nearly tied keys, so the device
//! sampler (`strata.gnn.device.sampler`) computes this same function and draws the same edges.

use std::f64::consts::{LN_2, SQRT_2};

use strata_store::rng::Rng;

/// Terms of `ln_unit`'s series: `|s| <= 0.1716`, so the first term left out is below 2^-60.
const SERIES_TERMS: u32 = 12;

/// `ln(m * 2^-53)` for `1 <= m <= 2^53` (a uniform in (0, 1] from 53 random bits), within a
/// few ulp of the true logarithm, from correctly rounded arithmetic only: `m = f * 2^e` with
/// `f` in [sqrt(1/2), sqrt(2)], and `ln f = 2 atanh(s)`, `s = (f - 1) / (f + 1)`, by its series
/// in `s^2` (Horner, highest term first).
pub(crate) fn ln_unit(m: u64) -> f64 {
    debug_assert!((1..=1 << 53).contains(&m));
    let mut e = 63 - i64::from(m.leading_zeros());
    let mut f = m as f64 / (1u64 << e) as f64;
    if f > SQRT_2 {
        f *= 0.5;
        e += 1;
    }
    let s = (f - 1.0) / (f + 1.0);
    let z = s * s;
    let mut p = 1.0 / f64::from(2 * SERIES_TERMS + 1);
    for n in (0..SERIES_TERMS).rev() {
        p = p * z + 1.0 / f64::from(2 * n + 1);
    }
    2.0 * s * p + (e - 53) as f64 * LN_2
}

/// Appends to `out` `k` of the `candidates` (positions into `weights`, every weight > 0,
/// `k < candidates.len()`) drawn without replacement with probability proportional to
/// weight, in increasing position order. One random draw per candidate, in candidate order,
/// so the choice is a pure function of the stream and the candidates. `keyed` is scratch.
pub(super) fn choose(
    rng: &mut Rng,
    candidates: &[usize],
    weights: &[f32],
    k: usize,
    keyed: &mut Vec<(f64, usize)>,
    out: &mut Vec<usize>,
) {
    debug_assert!(k < candidates.len());
    keyed.clear();
    keyed.extend(candidates.iter().map(|&p| {
        // 1 - u = m * 2^-53 lies in (0, 1], so the logarithm is finite (0 for u = 0).
        let m = (1u64 << 53) - (rng.next_u64() >> 11);
        (ln_unit(m) / weights[p] as f64, p)
    }));
    // Largest key first; ties (probability ~0) by position, so the order is total.
    let larger = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if k > 0 {
        keyed.select_nth_unstable_by(k - 1, larger);
    }
    let start = out.len();
    out.extend(keyed[..k].iter().map(|&(_, p)| p));
    out[start..].sort_unstable();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sampler::modes_tests::chi2;
    use std::collections::HashMap;
    use strata_store::rng::derive;

    #[test]
    fn ln_unit_is_the_logarithm_within_a_few_ulp() {
        let mut rng = Rng::new(derive(5, 5));
        let edges = [1, 2, 3, 1 << 26, (1 << 52) + 1, (1 << 53) - 1, 1 << 53];
        let random = (0..200_000).map(|_| (1u64 << 53) - (rng.next_u64() >> 11));
        for m in edges.into_iter().chain(random) {
            let exact = (m as f64 * (1.0 / (1u64 << 53) as f64)).ln();
            let got = ln_unit(m);
            let ulp = f64::EPSILON * exact.abs().max(f64::MIN_POSITIVE);
            assert!(
                (got - exact).abs() <= 4.0 * ulp,
                "m {m}: {got} against {exact}"
            );
        }
        assert_eq!(ln_unit(1 << 53), 0.0);
    }

    #[test]
    fn one_draw_is_proportional_to_weight() {
        let weights = [1.0f32, 2.0, 3.0, 4.0];
        let candidates = [0, 1, 2, 3];
        let trials = 40_000;
        let mut counts = [0f64; 4];
        let (mut keyed, mut out) = (Vec::new(), Vec::new());
        for t in 0..trials {
            out.clear();
            choose(
                &mut Rng::new(derive(7, t)),
                &candidates,
                &weights,
                1,
                &mut keyed,
                &mut out,
            );
            counts[out[0]] += 1.0;
        }
        let expected: Vec<f64> = weights
            .iter()
            .map(|&w| trials as f64 * w as f64 / 10.0)
            .collect();
        // 3 degrees of freedom: P(chi2 > 25) is about 1.6e-5.
        let stat = chi2(&counts, &expected);
        assert!(stat < 25.0, "chi2 {stat}: {counts:?}");
    }

    #[test]
    fn pairs_follow_successive_draws() {
        // k = 2 of weights 1, 2, 3, 4 (sum 10): P({i, j}) = w_i/10 * w_j/(10 - w_i) + the
        // same with i and j swapped, as PyG's successive weighted draws give.
        let weights = [1.0f32, 2.0, 3.0, 4.0];
        let candidates = [0, 1, 2, 3];
        let trials = 60_000u64;
        let mut counts: HashMap<(usize, usize), f64> = HashMap::new();
        let (mut keyed, mut out) = (Vec::new(), Vec::new());
        for t in 0..trials {
            out.clear();
            choose(
                &mut Rng::new(derive(11, t)),
                &candidates,
                &weights,
                2,
                &mut keyed,
                &mut out,
            );
            assert!(out[0] < out[1], "positions come out increasing: {out:?}");
            *counts.entry((out[0], out[1])).or_default() += 1.0;
        }
        let (mut observed, mut expected) = (Vec::new(), Vec::new());
        for i in 0..4 {
            for j in i + 1..4 {
                let (wi, wj) = (weights[i] as f64, weights[j] as f64);
                let p = wi / 10.0 * wj / (10.0 - wi) + wj / 10.0 * wi / (10.0 - wj);
                observed.push(counts.get(&(i, j)).copied().unwrap_or(0.0));
                expected.push(p * trials as f64);
            }
        }
        // 5 degrees of freedom: P(chi2 > 30) is about 1.5e-5.
        let stat = chi2(&observed, &expected);
        assert!(
            stat < 30.0,
            "chi2 {stat}: {observed:?} against {expected:?}"
        );
    }

    #[test]
    fn tiny_weights_still_order() {
        // Keys are logarithms: weights near f32's smallest normal do not underflow to ties.
        let weights = [1e-38f32, 1.0];
        let (mut keyed, mut out) = (Vec::new(), Vec::new());
        let mut heavy = 0;
        for t in 0..1000 {
            out.clear();
            choose(
                &mut Rng::new(derive(3, t)),
                &[0, 1],
                &weights,
                1,
                &mut keyed,
                &mut out,
            );
            heavy += usize::from(out[0] == 1);
        }
        assert_eq!(heavy, 1000);
    }
}
