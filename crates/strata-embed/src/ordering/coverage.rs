//! Which edge buckets `(a, b)` have had both partitions resident together.

/// An `n x n` table of covered buckets with per-partition counts of what is still uncovered.
#[derive(Clone)]
pub(crate) struct Coverage {
    n: usize,
    covered: Vec<bool>,
    /// Uncovered buckets in row `a` plus column `a` (the diagonal counted once).
    open: Vec<usize>,
    remaining: usize,
}

impl Coverage {
    pub fn new(n: usize) -> Self {
        Coverage {
            n,
            covered: vec![false; n * n],
            open: vec![2 * n - 1; n],
            remaining: n * n,
        }
    }

    pub fn is_covered(&self, a: u32, b: u32) -> bool {
        self.covered[a as usize * self.n + b as usize]
    }

    fn cover_one(&mut self, a: u32, b: u32) -> bool {
        let i = a as usize * self.n + b as usize;
        if self.covered[i] {
            return false;
        }
        self.covered[i] = true;
        self.remaining -= 1;
        self.open[a as usize] -= 1;
        if a != b {
            self.open[b as usize] -= 1;
        }
        true
    }

    /// Marks every bucket among `state`; returns how many were new.
    pub fn cover(&mut self, state: &[u32]) -> usize {
        let mut new = 0;
        for &a in state {
            for &b in state {
                new += self.cover_one(a, b) as usize;
            }
        }
        new
    }

    /// Buckets `state` would newly cover.
    pub fn gain(&self, state: &[u32]) -> usize {
        state
            .iter()
            .flat_map(|&a| state.iter().map(move |&b| (a, b)))
            .filter(|&(a, b)| !self.is_covered(a, b))
            .count()
    }

    /// Whether every bucket is covered.
    pub fn complete(&self) -> bool {
        self.remaining == 0
    }

    /// Partitions that still have an uncovered bucket.
    pub fn unfinished(&self) -> Vec<u32> {
        (0..self.n as u32)
            .filter(|&a| self.open[a as usize] > 0)
            .collect()
    }

    /// Uncovered buckets in column `col` (buckets `(r, col)`).
    pub fn open_in_column(&self, col: u32) -> usize {
        (0..self.n as u32)
            .filter(|&r| !self.is_covered(r, col))
            .count()
    }
}
