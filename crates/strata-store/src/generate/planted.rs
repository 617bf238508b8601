//! Pieces shared by the planted-community generators ([`super::sbm`], [`super::hetsbm`]): nodes
//! in communities with Chung–Lu popularity, class centroids and noisy feature rows, exact node
//! split counts, and the checks of the options they share.

use crate::error::{Result, StoreError};
use crate::npy::DType;
use crate::perm::Perm;
use crate::rng::{derive, Rng};

use super::check_fraction;

/// Element type of generated node features.
#[derive(
    serde::Deserialize,
    serde::Serialize,
    schemars::JsonSchema,
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
)]
#[serde(rename_all = "lowercase")]
pub enum FeatureDtype {
    /// IEEE single precision, 4 bytes per value.
    #[default]
    Float32,
    /// IEEE half precision, 2 bytes per value.
    Float16,
}

impl FeatureDtype {
    pub(super) fn dtype(self) -> DType {
        match self {
            FeatureDtype::Float32 => DType::F32,
            FeatureDtype::Float16 => DType::F16,
        }
    }
}

/// `n` nodes in `classes` communities with degree-corrected (Chung–Lu) popularity.
///
/// Node `j` in canonical order has class `j % classes` and popularity rank `j / classes` within
/// it; its id is a keyed permutation of `j`, so neither class nor rank can be read off the id.
pub(super) struct Blocks {
    classes: u64,
    ids: Perm,
    /// `1 - alpha` for Chung–Lu weights `(rank + 1)^-alpha`, and its inverse.
    exponent: f64,
    inv_exponent: f64,
    /// Per class: its size and the normaliser `(size + 1)^(1 - alpha) - 1` of its weight CDF.
    size: Vec<u64>,
    mass: Vec<f64>,
}

impl Blocks {
    /// Blocks of `n >= classes >= 1` nodes whose popularity gives a power-law degree
    /// distribution of exponent `power_law` (> 2); ids permuted by a permutation keyed by `key`.
    pub fn new(n: u64, classes: u64, power_law: f64, key: u64) -> Blocks {
        let exponent = 1.0 - 1.0 / (power_law - 1.0);
        let size: Vec<u64> = (0..classes).map(|c| (n - c).div_ceil(classes)).collect();
        let mass = size.iter().map(|&s| cdf_mass(s, exponent)).collect();
        Blocks {
            classes,
            ids: Perm::new(n, key),
            exponent,
            inv_exponent: 1.0 / exponent,
            size,
            mass,
        }
    }

    /// The canonical index `j` of node `id`.
    #[inline]
    pub fn canonical(&self, id: u64) -> u64 {
        self.ids.invert(id)
    }

    /// The class of node `id`.
    #[inline]
    pub fn class_of(&self, id: u64) -> u64 {
        self.canonical(id) % self.classes
    }

    /// A node of class `c` drawn with probability proportional to its weight, from uniform `u`.
    #[inline]
    pub fn draw(&self, c: u64, u: f64) -> u64 {
        let c_ = c as usize;
        self.pick(c, self.mass[c_], self.size[c_], u)
    }

    /// Like [`Blocks::draw`] among the `limit` most popular members of class `c` (`limit` in
    /// `[1, size of c]`), which are the members with the smallest canonical indices.
    #[inline]
    pub fn draw_among(&self, c: u64, limit: u64, u: f64) -> u64 {
        self.pick(c, cdf_mass(limit, self.exponent), limit, u)
    }

    /// Members of class `c` whose canonical index is below `j`.
    #[inline]
    pub fn count_before(&self, c: u64, j: u64) -> u64 {
        j.saturating_sub(c).div_ceil(self.classes)
    }

    /// Rank by the closed-form inverse CDF of the density `(x + 1)^-alpha` on `[0, limit)`
    /// (`mass` its normaliser): no per-node table.
    #[inline]
    fn pick(&self, c: u64, mass: f64, limit: u64, u: f64) -> u64 {
        let x = (1.0 + u * mass).powf(self.inv_exponent) - 1.0;
        let rank = (x as u64).min(limit - 1);
        self.ids.apply(c + self.classes * rank)
    }
}

/// The normaliser `(size + 1)^exponent - 1` of a Chung–Lu weight CDF over `size` ranks.
fn cdf_mass(size: u64, exponent: f64) -> f64 {
    ((size + 1) as f64).powf(exponent) - 1.0
}

/// A uniformly drawn class other than `c` (of `classes >= 2`).
#[inline]
pub(super) fn other_class(rng: &mut Rng, c: u64, classes: u64) -> u64 {
    (c + 1 + rng.below(classes - 1)) % classes
}

/// Row-major `classes x dim` centroids with coordinates N(0, 1/dim): norm about 1 and pairwise
/// distance about sqrt(2) whatever the dimension. Class `c`'s row comes from `derive(key, c)`.
pub(super) fn centroids(key: u64, classes: u64, dim: usize) -> Vec<f32> {
    let scale = 1.0 / (dim as f64).sqrt();
    let mut out = Vec::with_capacity(classes as usize * dim);
    for c in 0..classes {
        let mut rng = Rng::new(derive(key, c));
        out.extend(normals(&mut rng, dim).map(|z| (z * scale) as f32));
    }
    out
}

/// Appends one feature row, `centroid + noise * z` with `z` standard normal from `rng`, encoded
/// as `dtype` (little-endian).
pub(super) fn push_features(
    out: &mut Vec<u8>,
    centroid: &[f32],
    noise: f64,
    rng: &mut Rng,
    dtype: FeatureDtype,
) {
    for (&mu, z) in centroid.iter().zip(normals(rng, centroid.len())) {
        let x = mu + (noise * z) as f32;
        match dtype {
            FeatureDtype::Float32 => out.extend_from_slice(&x.to_le_bytes()),
            FeatureDtype::Float16 => out.extend_from_slice(&half::f16::from_f32(x).to_le_bytes()),
        }
    }
}

/// `count` standard normal values from `rng`, drawn in Box–Muller pairs.
fn normals(rng: &mut Rng, count: usize) -> impl Iterator<Item = f64> + '_ {
    (0..count.div_ceil(2))
        .flat_map(move |_| {
            let (a, b) = rng.normal_pair();
            [a, b]
        })
        .take(count)
}

/// Train, valid and test sizes for `n` nodes and `fractions` (checked by
/// [`check_split_fractions`]): valid and test rounded, train the remainder when the fractions
/// sum to 1 and rounded otherwise.
pub(super) fn split_counts(n: u64, fractions: [f64; 3]) -> [u64; 3] {
    let count = |f: f64| (n as f64 * f).round() as u64;
    // Rounding both evaluation splits up can overshoot by one node when the fractions sum to 1.
    let n_valid = count(fractions[1]).min(n);
    let n_test = count(fractions[2]).min(n - n_valid);
    let rest = n - n_valid - n_test;
    let n_train = if fractions.iter().sum::<f64>() >= 1.0 - 1e-9 {
        rest
    } else {
        count(fractions[0]).min(rest)
    };
    [n_train, n_valid, n_test]
}

/// The split of the node ranked `rank` (train first, then valid, then test): 0, 1, 2, or 3 for
/// none.
#[inline]
pub(super) fn split_slot(rank: u64, counts: &[u64; 3]) -> usize {
    let mut r = rank;
    for (k, &count) in counts.iter().enumerate() {
        if r < count {
            return k;
        }
        r -= count;
    }
    3
}

/// Checks the three split fractions of a generator's nodes; an excess is blamed on
/// `test_fraction`.
pub(super) fn check_split_fractions(fractions: [f64; 3]) -> Result<()> {
    check_fraction("train_fraction", fractions[0])?;
    check_fraction("valid_fraction", fractions[1])?;
    check_fraction("test_fraction", fractions[2])?;
    if fractions.iter().sum::<f64>() > 1.0 + 1e-9 {
        return Err(StoreError::option(
            "test_fraction",
            "train_fraction + valid_fraction + test_fraction must not exceed 1",
        ));
    }
    Ok(())
}

/// Checks a power-law exponent option (finite, above 2).
pub(super) fn check_power_law(value: f64) -> Result<()> {
    if value > 2.0 && value.is_finite() {
        Ok(())
    } else {
        Err(StoreError::option(
            "power_law",
            format!("must be a finite exponent above 2, got {value}"),
        ))
    }
}

/// Checks a feature dimension option (1 to 2^20).
pub(super) fn check_feature_dim(value: u64) -> Result<()> {
    if (1..=1 << 20).contains(&value) {
        Ok(())
    } else {
        Err(StoreError::option(
            "feature_dim",
            format!("must be within [1, 2^20], got {value}"),
        ))
    }
}

/// Checks a noise standard deviation option `field` (finite, non-negative).
pub(super) fn check_noise(field: &str, value: f64) -> Result<()> {
    if value >= 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(StoreError::option(
            field,
            format!("must be a finite non-negative standard deviation, got {value}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_stay_in_their_class_and_among_the_most_popular() {
        let b = Blocks::new(1003, 7, 2.5, 9);
        let mut rng = Rng::new(1);
        let mut hits = vec![0u64; 1003];
        for _ in 0..20_000 {
            let c = rng.below(7);
            let v = b.draw(c, rng.next_f64());
            assert_eq!(b.class_of(v), c);
            hits[b.canonical(v) as usize] += 1;
            let limit = 1 + rng.below(b.count_before(c, 1003));
            let w = b.draw_among(c, limit, rng.next_f64());
            assert_eq!(b.class_of(w), c);
            assert!(
                b.canonical(w) / 7 < limit,
                "rank {} >= {limit}",
                b.canonical(w) / 7
            );
        }
        // Popularity falls with the rank: the first rank of each class gets the most draws.
        assert!(hits[..7].iter().sum::<u64>() > hits[7..14].iter().sum::<u64>());
        assert_eq!(b.count_before(3, 3), 0);
        assert_eq!(b.count_before(3, 4), 1);
        assert_eq!(b.count_before(3, 11), 2);
        assert_eq!(b.count_before(0, 1003), 144);
    }

    #[test]
    fn split_counts_are_exact() {
        assert_eq!(split_counts(1000, [0.6, 0.2, 0.2]), [600, 200, 200]);
        assert_eq!(split_counts(1000, [0.1, 0.05, 0.3]), [100, 50, 300]);
        // Both evaluation splits round up; train takes what is left.
        assert_eq!(split_counts(5, [0.0, 0.5, 0.5]), [0, 3, 2]);
        let counts = [2, 1, 1];
        let slots: Vec<usize> = (0..6).map(|r| split_slot(r, &counts)).collect();
        assert_eq!(slots, [0, 0, 1, 2, 3, 3]);
    }
}
