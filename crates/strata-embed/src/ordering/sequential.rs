//! The sequential order (PyTorch-BigGraph style): a buffer of two partitions, one pair at a
//! time, snaking so that each step swaps one partition:
//! {0,1} {0,2} .. {0,n-1} {1,n-1} .. {1,2} {2,3} .. {2,n-1} {3,n-1} ..

/// Buffer states of the sequential order for `n` partitions.
pub(crate) fn states(n: usize) -> Vec<Vec<u32>> {
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
