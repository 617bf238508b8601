//! Weighted choice without replacement (PyG's `weight_attr`): each successive draw takes one of
//! the edges left with probability proportional to its weight.
//!
//! Efraimidis and Spirakis ("Weighted random sampling with a reservoir", 2006) show that
//! giving edge `i` the key `u_i^(1 / w_i)`, `u_i` uniform in (0, 1], and keeping the `k`
//! largest keys draws exactly that distribution. The keys here are their logarithms,
//! `ln(u_i) / w_i`, which order the same and do not underflow for small weights.

use strata_store::rng::Rng;

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
        // 1 - u lies in (0, 1], so the logarithm is finite (0 for u = 0).
        let u = 1.0 - rng.next_f64();
        (u.ln() / weights[p] as f64, p)
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
