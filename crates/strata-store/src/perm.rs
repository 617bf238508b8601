//! Keyed pseudo-random permutations of `[0, n)` in O(1) memory: a Feistel network on the
//! smallest power-of-two domain covering `n`, restricted to `[0, n)` by cycle-walking.

use crate::rng::derive;

/// Feistel rounds: with four, a Feistel network of pseudo-random round functions is already a
/// pseudo-random permutation; two more make up for the cheap round function.
const ROUNDS: usize = 6;

/// Odd multiplier of the round function (2^64 / golden ratio).
const ROUND_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// The round function: one multiplication, folding the high half of the product (which depends
/// on every input bit) onto the low bits that are kept. A full 64-bit mixer per round would
/// double the cost of R-MAT's two permutations per edge without any visible benefit.
#[inline]
fn round(r: u64, key: u64) -> u64 {
    let y = (r ^ key).wrapping_mul(ROUND_MUL);
    y ^ (y >> 32)
}

/// A keyed bijection on `[0, n)`. Evaluating it costs six multiplications per cycle-walking
/// step, and fewer than two steps are needed on average because the Feistel domain is below `2n`.
#[derive(Debug, Clone)]
pub struct Perm {
    n: u64,
    /// Bits of the high and low halves of the Feistel domain `[0, 2^(hi + lo))`.
    hi: u32,
    lo: u32,
    keys: [u64; ROUNDS],
}

#[inline]
fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

impl Perm {
    /// The permutation of `[0, n)` selected by `key`; `n` must be in `[1, 2^62]`.
    pub fn new(n: u64, key: u64) -> Perm {
        assert!((1..=1 << 62).contains(&n), "Perm domain {n} out of range");
        let bits = 64 - (n - 1).leading_zeros();
        Perm {
            n,
            hi: bits - bits / 2,
            lo: bits / 2,
            keys: std::array::from_fn(|i| derive(key, i as u64)),
        }
    }

    /// The image of `x` (< n).
    #[inline]
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// The preimage of `y` (< n): `invert(apply(x)) == x`.
    #[inline]
    pub fn invert(&self, y: u64) -> u64 {
        debug_assert!(y < self.n);
        let mut x = self.decrypt(y);
        while x >= self.n {
            x = self.decrypt(x);
        }
        x
    }

    /// One pass of the unbalanced Feistel network on `[0, 2^(hi + lo))`. Each round maps
    /// `(l, r)` to `(r, l ^ F(r))`, so the halves swap widths; an even number of rounds restores
    /// them.
    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        let (mut wl, mut wr) = (self.hi, self.lo);
        let (mut l, mut r) = (x >> wr, x & mask(wr));
        for &k in &self.keys {
            (l, r) = (r, l ^ (round(r, k) & mask(wl)));
            (wl, wr) = (wr, wl);
        }
        (l << wr) | r
    }

    #[inline]
    fn decrypt(&self, y: u64) -> u64 {
        let (mut wl, mut wr) = (self.hi, self.lo);
        let (mut l, mut r) = (y >> wr, y & mask(wr));
        for &k in self.keys.iter().rev() {
            // The round produced (l, r) = (r0, l0 ^ F(r0)) with l0 as wide as r is now.
            (l, r) = (r ^ (round(l, k) & mask(wr)), l);
            (wl, wr) = (wr, wl);
        }
        (l << wr) | r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn check_bijection(n: u64, key: u64) {
        let p = Perm::new(n, key);
        let mut seen = vec![false; n as usize];
        for x in 0..n {
            let y = p.apply(x);
            assert!(y < n, "n={n}: {x} -> {y}");
            assert!(!seen[y as usize], "n={n}: {y} hit twice");
            seen[y as usize] = true;
            assert_eq!(p.invert(y), x, "n={n}");
        }
    }

    #[test]
    fn bijection_for_many_sizes() {
        for n in (1..=300).chain([
            511, 512, 513, 1000, 1023, 1024, 1025, 4097, 65_535, 65_536, 100_003,
        ]) {
            check_bijection(n, n.wrapping_mul(31) ^ 5);
        }
    }

    proptest! {
        #[test]
        fn bijection_for_random_sizes(n in 1u64..20_000, key in any::<u64>()) {
            check_bijection(n, key);
        }

        #[test]
        fn inverse_on_huge_domains(n in (1u64 << 40)..(1u64 << 62), key in any::<u64>(), xs in proptest::collection::vec(any::<u64>(), 20)) {
            let p = Perm::new(n, key);
            for x in xs {
                let x = x % n;
                let y = p.apply(x);
                prop_assert!(y < n);
                prop_assert_eq!(p.invert(y), x);
            }
        }
    }

    #[test]
    fn looks_random() {
        let n = 10_000u64;
        let p = Perm::new(n, 42);
        let fixed = (0..n).filter(|&x| p.apply(x) == x).count();
        assert!(
            fixed < 10,
            "{fixed} fixed points (a random permutation has about 1)"
        );
        let ascending =
            (1..n).filter(|&x| p.apply(x) > p.apply(x - 1)).count() as f64 / (n - 1) as f64;
        assert!(
            (ascending - 0.5).abs() < 0.03,
            "ascending fraction {ascending}"
        );
        let q = Perm::new(n, 43);
        let same = (0..n).filter(|&x| p.apply(x) == q.apply(x)).count();
        assert!(same < 10, "keys 42 and 43 agree on {same} points");
        let mean_low_half = (0..n / 2).map(|x| p.apply(x) as f64).sum::<f64>() / (n / 2) as f64;
        assert!(
            (mean_low_half / n as f64 - 0.5).abs() < 0.02,
            "the first half maps to mean {mean_low_half}"
        );
        // Pearson correlation of x and p(x): about N(0, 1/n) for a random permutation.
        let mean = (n - 1) as f64 / 2.0;
        let cov: f64 = (0..n)
            .map(|x| (x as f64 - mean) * (p.apply(x) as f64 - mean))
            .sum();
        let var: f64 = (0..n).map(|x| (x as f64 - mean).powi(2)).sum();
        assert!((cov / var).abs() < 0.04, "correlation {}", cov / var);
        // Neighbouring inputs land far apart: flipped output bits average about half the width.
        let flips: u32 = (1..n)
            .map(|x| (p.apply(x) ^ p.apply(x - 1)).count_ones())
            .sum();
        let mean_flips = flips as f64 / (n - 1) as f64;
        assert!(
            (mean_flips - 6.5).abs() < 0.5,
            "neighbours differ in {mean_flips} of 14 bits"
        );
    }
}
