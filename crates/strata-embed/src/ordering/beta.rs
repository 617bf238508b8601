//! Marius's BETA order (Mohoney et al., OSDI'21) for any buffer capacity `c >= 2`: keep `c - 1`
//! partitions fixed and stream every other unfinished partition through the last slot; then
//! swap new fixed partitions in one at a time (the old ones are finished) and repeat. Shuffles
//! are seeded, so the order is a pure function of its inputs. Strata completes the order
//! exactly once at most four partitions are unfinished, which saves one load at every size of
//! the Legend paper's Table 8.

use strata_store::registry::Named;
use strata_store::rng::{derive, Rng};

use super::coverage::Coverage;
use super::tail::exact_finish;
use super::{Capacity, Ordering};

/// Marius's BETA.
pub struct Beta;

impl Named for Beta {
    const NAME: &'static str = "beta";
    const HELP: &'static str = "Marius's BETA; any buffer >= 2";
}

/// Seed of BETA's shuffles.
const BETA_SEED: u64 = 1;

impl Ordering for Beta {
    fn capacity(&self) -> Capacity {
        Capacity::AtLeast(2)
    }

    fn capacity_hint(&self) -> &'static str {
        "two partitions must be resident to train the buckets between them"
    }

    fn orders(&self, n: usize, capacity: usize) -> Vec<Vec<Vec<u32>>> {
        vec![states(n, capacity, BETA_SEED)]
    }
}

const EXACT_TAIL: usize = 4;

fn shuffle(v: &mut [u32], rng: &mut Rng) {
    for i in (1..v.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        v.swap(i, j);
    }
}

/// BETA's buffer states for `n` partitions and capacity `c`, shuffled by `seed`.
fn states(n: usize, c: usize, seed: u64) -> Vec<Vec<u32>> {
    let mut rng = Rng::new(derive(0xbe7a, seed));
    let mut parts: Vec<u32> = (0..n as u32).collect();
    shuffle(&mut parts, &mut rng);
    if n <= c {
        return vec![sorted(&parts)];
    }
    let mut buf: Vec<u32> = parts[..c].to_vec();
    let mut disk: Vec<u32> = parts[c..].to_vec();
    let mut states = vec![sorted(&buf)];
    let mut cov = Coverage::new(n);
    cov.cover(&buf);
    while !disk.is_empty() {
        if disk.len() < EXACT_TAIL {
            if let Some(rest) = exact_finish(&cov, &buf) {
                states.extend(rest);
                return states;
            }
        }
        shuffle(&mut buf, &mut rng);
        shuffle(&mut disk, &mut rng);
        for slot in disk.iter_mut() {
            std::mem::swap(slot, buf.last_mut().unwrap());
            cov.cover(&buf);
            states.push(sorted(&buf));
        }
        shuffle(&mut disk, &mut rng);
        let replaced = (c - 1).min(disk.len());
        for i in 0..replaced {
            buf[i] = disk[i];
            cov.cover(&buf);
            states.push(sorted(&buf));
        }
        disk.drain(..replaced);
    }
    states
}

fn sorted(buf: &[u32]) -> Vec<u32> {
    let mut s = buf.to_vec();
    s.sort_unstable();
    s
}
