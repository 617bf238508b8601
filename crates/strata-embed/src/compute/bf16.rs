//! bfloat16, the storage type of a `table_dtype = "bf16"` table: the upper 16 bits of an IEEE
//! float32 (same exponent range, 8 significant bits). Values are widened to float32 for every
//! computation and rounded back only when stored, so a table trained in bf16 is readable on
//! any CPU: nothing here needs AVX512-BF16 (the conversions are shifts and adds, which the
//! compiler vectorises).

/// The float32 that bf16 `h` stands for (exact).
#[inline(always)]
pub fn to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` rounded to the nearest bf16, ties to even; a NaN stays a (quiet) NaN.
#[inline(always)]
pub fn round(x: f32) -> u16 {
    round_with(x, 0x7fff + ((x.to_bits() >> 16) & 1))
}

/// `x` rounded up or down to a neighbouring bf16 with probabilities that make the rounding
/// unbiased (stochastic rounding), the randomness taken from the low 16 bits of `noise`.
///
/// An optimizer step smaller than half a bf16 step (1/512 of the value) would be lost under
/// round-to-nearest every time; rounded stochastically it moves the value by a whole step with
/// the matching probability, so the expected update is the float32 one.
#[inline(always)]
pub fn round_stochastic(x: f32, noise: u32) -> u16 {
    round_with(x, noise & 0xffff)
}

#[inline(always)]
fn round_with(x: f32, add: u32) -> u16 {
    let b = x.to_bits();
    // The sum cannot overflow for a non-NaN: |x| <= inf is at most 0xff80_0000.
    let rounded = (b.wrapping_add(add) >> 16) as u16;
    if x.is_nan() {
        ((b >> 16) as u16) | 0x40
    } else {
        rounded
    }
}

/// A 32-bit hash of `a` and `b` (a multiply-xorshift mix), the noise of stochastic rounding:
/// a pure function of the values involved, so that a one-thread run stays deterministic.
#[inline(always)]
pub fn mix(a: u32, b: u32) -> u32 {
    let mut x = a ^ b.rotate_left(16) ^ 0x9e37_79b9;
    x ^= x >> 16;
    x = x.wrapping_mul(0x7feb_352d);
    x ^= x >> 15;
    x = x.wrapping_mul(0x846c_a68b);
    x ^ (x >> 16)
}

/// The rounding noise of the value at `position` of a table (its index in the table's values)
/// for an update salted `salt`: [`mix`] of the salt's low half and the position with the
/// salt's high half.
#[inline(always)]
pub fn noise(salt: u64, position: usize) -> u32 {
    mix(salt as u32, position as u32 ^ (salt >> 32) as u32)
}

/// The salt of an Adagrad state's rounding, given its row's `salt`: another input of [`mix`],
/// so that the state rounds independently of the row. (`!salt` would not do: [`noise`] XORs
/// both halves of the salt into `mix`'s first step, and their two complements cancel there.)
#[inline(always)]
pub fn state_salt(salt: u64) -> u64 {
    salt ^ 0x5851_f42d_4c95_7f2d
}

/// Widens `src` into `dst` (same length).
pub fn widen(src: &[u16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = to_f32(*s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_to_nearest_even() {
        for x in [
            0.0f32,
            -0.0,
            1.0,
            -2.5,
            3.140625,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ] {
            assert_eq!(to_f32(round(x)).to_bits(), x.to_bits(), "{x} is a bf16");
        }
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even significand (1).
        assert_eq!(to_f32(round(1.0 + 1.0 / 256.0)), 1.0);
        // 1 + 3 * 2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(to_f32(round(1.0 + 3.0 / 256.0)), 1.0 + 1.0 / 64.0);
        assert_eq!(to_f32(round(1.0 + 1.0 / 200.0)), 1.0 + 1.0 / 128.0);
        assert!(to_f32(round(f32::NAN)).is_nan());
        assert!(to_f32(round_stochastic(f32::NAN, 0xffff)).is_nan());
        assert_eq!(to_f32(round(f32::MAX)), f32::INFINITY);
        let h = [1.0f32, -0.5, 1e-3].map(round);
        let mut back = [0.0f32; 3];
        widen(&h, &mut back);
        assert_eq!(&back[..2], &[1.0, -0.5]);
        assert!((back[2] - 1e-3).abs() < 1e-3 / 128.0);
    }

    #[test]
    fn a_state_rounds_independently_of_its_row() {
        // At the same positions, the row's noise and its state's fall on the same side of
        // the middle as often as two independent coins do (2,048 of 4,096, sd 32).
        let salt = 0x1234_5678_9abc_def0u64;
        let same = (0..4096)
            .filter(|&p| (noise(salt, p) & 0x8000) == (noise(state_salt(salt), p) & 0x8000))
            .count();
        assert!(same.abs_diff(2048) < 160, "{same}");
        // `!salt` would give the row's very noise.
        assert!((0..4096).all(|p| noise(!salt, p) == noise(salt, p)));
    }

    #[test]
    fn stochastic_rounding_is_unbiased() {
        // A value a quarter of the way from 1 to the next bf16 rounds up a quarter of the time.
        let x = 1.0 + 0.25 / 128.0;
        let n = 100_000u32;
        let mut sum = 0.0f64;
        for i in 0..n {
            let h = round_stochastic(x, mix(i, 7));
            let v = to_f32(h);
            assert!(v == 1.0 || v == 1.0 + 1.0 / 128.0, "{v}");
            sum += v as f64;
        }
        let mean = sum / n as f64;
        assert!((mean - x as f64).abs() < 2e-5, "{mean} against {x}");
        // Exact values never move.
        assert_eq!(to_f32(round_stochastic(0.75, 0xffff)), 0.75);
    }
}
