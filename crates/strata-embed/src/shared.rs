//! Parameter rows shared by the worker threads of a bucket.
//!
//! Race policy (documented for users in docs/embed.md): workers train disjoint chunks of one
//! bucket at the same time and update embedding and relation rows without locks, Hogwild-style.
//! Every float is a relaxed atomic (a plain load or store on x86), so concurrent updates are
//! well defined: when two workers update the same row at once, one worker's update of an
//! element may be lost. With one thread training is exactly deterministic for a seed.

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

/// Adagrad's epsilon (the Legend repository's value).
const EPS: f32 = 1e-9;

/// Rows of parameters with their Adagrad state, viewed as shared atomics.
#[derive(Clone, Copy)]
pub struct SharedRows<'a> {
    params: &'a [AtomicU32],
    state: &'a [AtomicU32],
    pub dim: usize,
    /// State floats per row: `dim` (per-element Adagrad) or 1 (per-row).
    pub state_per_row: usize,
}

impl<'a> SharedRows<'a> {
    /// Views `params` (`rows x dim`) and `state` (`rows x state_per_row`).
    pub fn new(
        params: &'a mut [f32],
        state: &'a mut [f32],
        dim: usize,
        state_per_row: usize,
    ) -> Self {
        SharedRows {
            params: as_atomic(params),
            state: as_atomic(state),
            dim,
            state_per_row,
        }
    }

    pub fn rows(&self) -> usize {
        self.params.len() / self.dim.max(1)
    }

    /// Copies row `i` into `out`.
    #[inline]
    pub fn load(&self, i: usize, out: &mut [f32]) {
        let row = &self.params[i * self.dim..(i + 1) * self.dim];
        for (o, w) in out.iter_mut().zip(row) {
            *o = f32::from_bits(w.load(Relaxed));
        }
    }

    /// Adds row `i` to `out` (a featurized entity sums its features' rows).
    #[inline]
    pub fn add_to(&self, i: usize, out: &mut [f32]) {
        let row = &self.params[i * self.dim..(i + 1) * self.dim];
        for (o, w) in out.iter_mut().zip(row) {
            *o += f32::from_bits(w.load(Relaxed));
        }
    }

    /// One Adagrad step on row `i` with gradient `g`: `state += g²`, `w -= lr g / (√state + ε)`
    /// (per-row: the state accumulates the mean of `g²`).
    #[inline]
    pub fn adagrad(&self, i: usize, g: &[f32], lr: f32) {
        let row = &self.params[i * self.dim..(i + 1) * self.dim];
        if self.state_per_row == 1 {
            let st = &self.state[i];
            let mean_sq = g.iter().map(|x| x * x).sum::<f32>() / self.dim as f32;
            let s = f32::from_bits(st.load(Relaxed)) + mean_sq;
            st.store(s.to_bits(), Relaxed);
            let step = lr / (s.sqrt() + EPS);
            for (w, gk) in row.iter().zip(g) {
                w.store(
                    (f32::from_bits(w.load(Relaxed)) - step * gk).to_bits(),
                    Relaxed,
                );
            }
        } else {
            // Atomics do not vectorise: copy a block of the row and its state out with relaxed
            // loads, update the copies with vector arithmetic, and store them back.
            let st = &self.state[i * self.dim..(i + 1) * self.dim];
            let (mut w, mut a) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
            for start in (0..self.dim).step_by(BLOCK) {
                let len = BLOCK.min(self.dim - start);
                let (rw, ra, gb) = (
                    &row[start..start + len],
                    &st[start..start + len],
                    &g[start..start + len],
                );
                for k in 0..len {
                    w[k] = f32::from_bits(rw[k].load(Relaxed));
                    a[k] = f32::from_bits(ra[k].load(Relaxed));
                }
                for k in 0..len {
                    a[k] += gb[k] * gb[k];
                    w[k] -= lr * gb[k] / (a[k].sqrt() + EPS);
                }
                for k in 0..len {
                    rw[k].store(w[k].to_bits(), Relaxed);
                    ra[k].store(a[k].to_bits(), Relaxed);
                }
            }
        }
    }
}

/// Floats per block of the vectorised Adagrad update.
const BLOCK: usize = 64;

/// Views a float slice as atomics (same size and alignment; exclusive borrow for the lifetime).
fn as_atomic(v: &mut [f32]) -> &[AtomicU32] {
    // SAFETY: AtomicU32 has the size and alignment of f32/u32; the exclusive borrow guarantees
    // no non-atomic access happens while the atomic view exists.
    unsafe { std::slice::from_raw_parts(v.as_mut_ptr() as *const AtomicU32, v.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adagrad_steps() {
        let mut p = vec![1.0f32, 2.0];
        let mut s = vec![0.0f32; 2];
        let rows = SharedRows::new(&mut p, &mut s, 2, 2);
        rows.adagrad(0, &[0.5, -1.0], 0.1);
        let mut out = [0.0f32; 2];
        rows.load(0, &mut out);
        // state = g², step = lr · g / |g| = ±lr
        assert!(
            (out[0] - 0.9).abs() < 1e-6 && (out[1] - 2.1).abs() < 1e-6,
            "{out:?}"
        );
        let mut p = vec![1.0f32, 1.0];
        let mut s = vec![0.0f32];
        let rows = SharedRows::new(&mut p, &mut s, 2, 1);
        rows.adagrad(0, &[3.0, 4.0], 1.0);
        rows.load(0, &mut out);
        // mean g² = 12.5, step = 1/√12.5
        let step = 1.0 / 12.5f32.sqrt();
        assert!((out[0] - (1.0 - 3.0 * step)).abs() < 1e-6);
    }
}
