//! Counter-based randomness: every random value is a pure function of `(seed, stream, index)`,
//! so the output never depends on which thread computed what, or in which order.

/// 2^64 / golden ratio, SplitMix64's increment (odd, so successive states never repeat).
const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

/// SplitMix64's output function (Stafford's "mix 13"): a bijection on `u64` in which every
/// input bit affects every output bit.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Advances a bare SplitMix64 `state` and returns its next output: the stream of
/// [`Rng::new`]`(state)`, for callers that keep the state as a plain `u64`.
#[inline]
pub fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(GOLDEN);
    mix64(*state)
}

/// The key of child `index` of `key`. For a fixed `key`, distinct indices give distinct
/// children (a composition of bijections), and unrelated-looking ones.
#[inline]
pub fn derive(key: u64, index: u64) -> u64 {
    mix64(key ^ mix64(index.wrapping_add(GOLDEN)))
}

/// A SplitMix64 stream started at a derived key: cheap to create for every edge or row.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// The stream of `key` (usually `derive(stream_key, index)`).
    #[inline]
    pub fn new(key: u64) -> Rng {
        Rng(key)
    }

    /// The stream of `key` after `position` draws: items that need a fixed number of draws can
    /// take consecutive blocks of one stream instead of deriving a key each.
    #[inline]
    pub fn seek(key: u64, position: u64) -> Rng {
        Rng(key.wrapping_add(position.wrapping_mul(GOLDEN)))
    }

    /// The next 64 uniformly random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        splitmix(&mut self.0)
    }

    /// Fills `out` with the stream's next `out.len()` draws, as that many [`Rng::next_u64`]
    /// calls would return them. Each draw is a function of its position alone, so a caller
    /// compiled for a vector unit computes several at once (`mix64` of eight states in one
    /// AVX-512 pass).
    #[inline(always)]
    pub fn fill(&mut self, out: &mut [u64]) {
        for o in out.iter_mut() {
            *o = splitmix(&mut self.0);
        }
    }

    /// Uniform in `[0, 1)`, with 53 random bits.
    #[inline]
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `[0, n)` by Lemire's multiply-shift (bias below `n / 2^64`, far below anything
    /// measurable at graph sizes).
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// [`Rng::below`]`(n)` and the low 64 bits of its product: the draw's position within
    /// its value's share of the range, a uniform word of its own for a second choice made
    /// from the same draw ([`scale`]), so that a caller addressing draws by position (a
    /// device step) takes one draw per choice whatever the first one chose.
    #[inline]
    pub fn below_and_rest(&mut self, n: u64) -> (u64, u64) {
        let product = self.next_u64() as u128 * n as u128;
        ((product >> 64) as u64, product as u64)
    }

    /// Two independent standard normal values (Box–Muller).
    #[inline]
    pub fn normal_pair(&mut self) -> (f64, f64) {
        // 1 - u lies in (0, 1], so the logarithm is finite.
        let radius = (-2.0 * (1.0 - self.next_f64()).ln()).sqrt();
        let (sin, cos) = (std::f64::consts::TAU * self.next_f64()).sin_cos();
        (radius * cos, radius * sin)
    }
}

/// Uniform `bits` scaled into `[0, n)` (Lemire's multiply-shift, as [`Rng::below`]).
#[inline]
pub fn scale(bits: u64, n: u64) -> u64 {
    ((bits as u128 * n as u128) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_are_distinct_and_stable() {
        let key = derive(7, 1);
        let children: std::collections::HashSet<u64> =
            (0..100_000).map(|i| derive(key, i)).collect();
        assert_eq!(children.len(), 100_000);
        assert_eq!(derive(7, 1), key, "derivation is a pure function");
        assert_ne!(derive(8, 1), key);
        let mut from_start = Rng::new(key);
        let skipped: Vec<u64> = (0..10).map(|_| from_start.next_u64()).skip(7).collect();
        let mut sought = Rng::seek(key, 7);
        assert_eq!(
            skipped,
            [sought.next_u64(), sought.next_u64(), sought.next_u64()]
        );
    }

    #[test]
    fn a_filled_block_is_the_stream_s_next_draws() {
        let (mut one, mut block) = (Rng::new(derive(3, 4)), Rng::new(derive(3, 4)));
        let mut out = [0u64; 13];
        for len in [13, 0, 1, 8] {
            block.fill(&mut out[..len]);
            let expect: Vec<u64> = (0..len).map(|_| one.next_u64()).collect();
            assert_eq!(out[..len], expect[..], "a block of {len}");
        }
        assert_eq!(
            block.next_u64(),
            one.next_u64(),
            "the stream goes on after the blocks"
        );
    }

    #[test]
    fn uniform_and_normal_moments() {
        let mut rng = Rng::new(derive(1, 2));
        let n = 200_000;
        let mean = (0..n).map(|_| rng.next_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.005, "uniform mean {mean}");
        let mut counts = [0u32; 10];
        for _ in 0..n {
            counts[rng.below(10) as usize] += 1;
        }
        for c in counts {
            assert!((c as f64 - n as f64 / 10.0).abs() < 600.0, "{counts:?}");
        }
        let (mut s1, mut s2, mut s4) = (0.0, 0.0, 0.0);
        for _ in 0..n / 2 {
            let (a, b) = rng.normal_pair();
            for z in [a, b] {
                s1 += z;
                s2 += z * z;
                s4 += z * z * z * z;
            }
        }
        let (m1, m2, m4) = (s1 / n as f64, s2 / n as f64, s4 / n as f64);
        assert!(
            m1.abs() < 0.01 && (m2 - 1.0).abs() < 0.02 && (m4 - 3.0).abs() < 0.1,
            "moments {m1} {m2} {m4}"
        );
    }

    #[test]
    fn the_rest_of_a_draw_is_uniform_within_each_first_choice() {
        // Six first choices (an even range: the rest's low bit is always zero) by five second
        // ones: every pair about equally often, as two independent draws would give them.
        let mut rng = Rng::new(derive(5, 6));
        let (n, draws) = (6u64, 300_000);
        let mut counts = [[0u32; 5]; 6];
        let mut plain = Rng::new(derive(5, 6));
        for _ in 0..draws {
            let (first, rest) = rng.below_and_rest(n);
            assert_eq!(first, plain.below(n), "the first choice is below()'s");
            counts[first as usize][scale(rest, 5) as usize] += 1;
        }
        let expect = draws as f64 / 30.0;
        for c in counts.iter().flatten() {
            assert!(
                (*c as f64 - expect).abs() < 5.0 * expect.sqrt(),
                "{counts:?}"
            );
        }
    }
}
