//! The sequential order (PyTorch-BigGraph style): a buffer of two partitions, one pair at a
//! time, snaking so that each step swaps one partition:
//! {0,1} {0,2} .. {0,n-1} {1,n-1} .. {1,2} {2,3} .. {2,n-1} {3,n-1} ..

use strata_store::registry::Named;

use super::{Capacity, Ordering};

/// One pair of partitions at a time.
pub struct Sequential;

impl Named for Sequential {
    const NAME: &'static str = "sequential";
    const HELP: &'static str = "one pair at a time; buffer 2";
}

impl Ordering for Sequential {
    fn capacity(&self) -> Capacity {
        Capacity::Exactly(2)
    }

    fn capacity_hint(&self) -> &'static str {
        "the sequential order keeps one pair of partitions resident"
    }

    /// A buffer of 2 is what the order is, partitioned or not.
    fn capacity_always(&self) -> bool {
        true
    }

    fn orders(&self, n: usize, _capacity: usize) -> Vec<Vec<Vec<u32>>> {
        vec![states(n)]
    }
}

/// Buffer states of the sequential order for `n` partitions.
fn states(n: usize) -> Vec<Vec<u32>> {
    if n <= 2 {
        return vec![(0..n as u32).collect()];
    }
    let n = n as u32;
    let mut states = Vec::new();
    for a in 0..n - 1 {
        let partners: Vec<u32> = if a % 2 == 0 {
            (a + 1..n).collect()
        } else {
            (a + 1..n).rev().collect()
        };
        for b in partners {
            states.push(vec![a, b]);
        }
    }
    states
}
