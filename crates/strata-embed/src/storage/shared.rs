//! Parameter rows shared by the worker threads of a bucket.
//!
//! Race policy (documented for users in docs/embed.md): workers train disjoint chunks of one
//! bucket at the same time and update embedding and relation rows without locks, Hogwild-style.
//! Every float is a relaxed atomic (a plain load or store on x86), so concurrent updates are
//! well defined: when two workers update the same row at once, one worker's update of an
//! element may be lost. With one thread training is exactly deterministic for a seed.

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering::Relaxed};

use crate::compute::bf16;
use crate::config::TableDtype;
use crate::storage::layout::TableLayout;

/// Adagrad's epsilon (the Legend repository's value).
const EPS: f32 = 1e-9;

/// Values viewed as shared atomics, in their storage type.
#[derive(Clone, Copy)]
enum Cells<'a> {
    F32(&'a [AtomicU32]),
    Bf16(&'a [AtomicU16]),
}

impl Cells<'_> {
    /// Calls `f(o, v)` for each value `o` of `out` and the stored value `v` at its place from
    /// `at` on, widened to float32.
    #[inline]
    fn widened(&self, at: usize, out: &mut [f32], f: impl Fn(&mut f32, f32)) {
        let end = at + out.len();
        match self {
            Cells::F32(c) => {
                for (o, w) in out.iter_mut().zip(&c[at..end]) {
                    f(o, f32::from_bits(w.load(Relaxed)));
                }
            }
            Cells::Bf16(c) => {
                for (o, w) in out.iter_mut().zip(&c[at..end]) {
                    f(o, bf16::to_f32(w.load(Relaxed)));
                }
            }
        }
    }

    /// Copies the values from `at` on into `out`, widened to float32.
    #[inline]
    fn read(&self, at: usize, out: &mut [f32]) {
        self.widened(at, out, |o, v| *o = v);
    }

    /// Adds the values from `at` on to `out`, widened to float32.
    #[inline]
    fn add(&self, at: usize, out: &mut [f32]) {
        self.widened(at, out, |o, v| *o += v);
    }

    /// Stores `v` from `at` on: bf16 values rounded stochastically with noise drawn from
    /// `salt` (an update's result), or to nearest (`None`).
    ///
    /// The noise hashes the position and the salt, which the caller varies from one update to
    /// the next (the chunk's key), and never the value: noise that depends on the value it
    /// rounds is correlated with the rounding error and biases it (a row of 1.0 stepped 2000
    /// times by 1/40 of a bf16 step ends 16% short of float32 with noise hashed from the
    /// value, within 0.3% with noise from the salt). The salt is a pure function of the
    /// schedule, so a one-thread run and its resumption stay deterministic.
    #[inline]
    fn write(&self, at: usize, v: &[f32], salt: Option<u64>) {
        match self {
            Cells::F32(c) => {
                for (w, x) in c[at..at + v.len()].iter().zip(v) {
                    w.store(x.to_bits(), Relaxed);
                }
            }
            Cells::Bf16(c) => {
                for (k, (w, x)) in c[at..at + v.len()].iter().zip(v).enumerate() {
                    let h = match salt {
                        Some(s) => bf16::round_stochastic(*x, bf16::noise(s, at + k)),
                        None => bf16::round(*x),
                    };
                    w.store(h, Relaxed);
                }
            }
        }
    }

    /// Prefetches the cache lines of `len` values from `at` on.
    #[inline]
    fn prefetch(&self, at: usize, len: usize) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let (start, bytes) = match self {
                Cells::F32(c) => (c[at..at + len].as_ptr() as *const i8, len * 4),
                Cells::Bf16(c) => (c[at..at + len].as_ptr() as *const i8, len * 2),
            };
            for off in (0..bytes).step_by(64).chain(bytes.checked_sub(1)) {
                // SAFETY: a prefetch never faults, and the address lies within the slice.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(start.add(off)) };
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (at, len);
    }

    fn len(&self) -> usize {
        match self {
            Cells::F32(c) => c.len(),
            Cells::Bf16(c) => c.len(),
        }
    }
}

/// Rows of parameters with their Adagrad state, viewed as shared atomics.
#[derive(Clone, Copy)]
pub struct SharedRows<'a> {
    params: Cells<'a>,
    state: Cells<'a>,
    pub dim: usize,
    /// State values per row: `dim` (per-element Adagrad) or 1 (per-row).
    pub state_per_row: usize,
    /// Bytes of host memory from the params on that are the rows' own buffer for the whole job
    /// (a partition slot's allocation: a device backend may page-lock it in place); 0 when the
    /// rows are not a buffer of their own.
    pub span: usize,
}

impl<'a> SharedRows<'a> {
    /// Views float32 `params` (`rows x dim`) and `state` (`rows x state_per_row`).
    pub fn new(
        params: &'a mut [f32],
        state: &'a mut [f32],
        dim: usize,
        state_per_row: usize,
    ) -> Self {
        SharedRows {
            params: Cells::F32(as_atomic(params)),
            state: Cells::F32(as_atomic(state)),
            dim,
            state_per_row,
            span: 0,
        }
    }

    /// Views a partition region (`layout.part_bytes()` bytes or more: embeddings, then state,
    /// in `layout.dtype`).
    pub fn region(bytes: &'a mut [u8], layout: &TableLayout) -> Self {
        let (emb, rest) = bytes.split_at_mut(layout.emb_bytes());
        let state_values = layout.rows as usize * layout.state_per_row;
        let state = &mut rest[..state_values * layout.dtype.bytes()];
        let cells = |b: &'a mut [u8]| match layout.dtype {
            TableDtype::F32 => Cells::F32(as_atomic(bytemuck::cast_slice_mut(b))),
            TableDtype::Bf16 => Cells::Bf16(as_atomic16(bytemuck::cast_slice_mut(b))),
        };
        SharedRows {
            params: cells(emb),
            state: cells(state),
            dim: layout.dim,
            state_per_row: layout.state_per_row,
            span: 0,
        }
    }

    /// The same rows, known to start a buffer of `bytes` of their own ([`SharedRows::span`]).
    pub fn with_span(mut self, bytes: usize) -> Self {
        self.span = bytes;
        self
    }

    /// The parameters and state as raw memory, `(params, params len, state, state len,
    /// dtype)` with the lengths in values of `dtype`, for a backend that computes on the rows
    /// elsewhere while it holds the view (the compute seam's device backend). Both are in the
    /// table's storage type (a partition region's), or float32 (relations).
    pub fn raw_memory(&self) -> (*mut u8, usize, *mut u8, usize, TableDtype) {
        let raw = |c: Cells| match c {
            Cells::F32(v) => (v.as_ptr() as *mut u8, v.len(), TableDtype::F32),
            Cells::Bf16(v) => (v.as_ptr() as *mut u8, v.len(), TableDtype::Bf16),
        };
        let ((params, params_len, dtype), (state, state_len, _)) =
            (raw(self.params), raw(self.state));
        (params, params_len, state, state_len, dtype)
    }

    pub fn rows(&self) -> usize {
        self.params.len() / self.dim.max(1)
    }

    /// Asks the CPU to bring row `i` into the cache (a hint; nothing where the CPU has no
    /// prefetch instruction).
    #[inline]
    pub fn prefetch(&self, i: usize) {
        self.params.prefetch(i * self.dim, self.dim);
    }

    /// [`SharedRows::prefetch`] for an update of row `i`: its optimizer state too.
    #[inline]
    pub fn prefetch_update(&self, i: usize) {
        self.prefetch(i);
        self.state
            .prefetch(i * self.state_per_row, self.state_per_row);
    }

    /// Copies row `i` into `out`.
    #[inline]
    pub fn load(&self, i: usize, out: &mut [f32]) {
        self.params.read(i * self.dim, out);
    }

    /// Stores `row` as row `i` (rounded to nearest in a bf16 table).
    pub fn store(&self, i: usize, row: &[f32]) {
        self.params.write(i * self.dim, row, None);
    }

    /// Stores `state` as row `i`'s optimizer state (rounded to nearest in a bf16 table).
    pub fn store_state(&self, i: usize, state: &[f32]) {
        self.state.write(i * self.state_per_row, state, None);
    }

    /// Adds row `i` to `out`, widened (a featurized entity sums its features' rows).
    #[inline]
    pub fn add_to(&self, i: usize, out: &mut [f32]) {
        self.params.add(i * self.dim, out);
    }

    /// One Adagrad step on row `i` with gradient `g`: `state += g²`, `w -= lr g / (√state + ε)`
    /// (per-row: the state accumulates the mean of `g²`). `salt` draws the stochastic rounding
    /// of a bf16 table (see [`Cells::write`]; the state's from [`bf16::state_salt`], so that its
    /// rounding is independent of the row's); it must change between updates of a row.
    #[inline]
    pub fn adagrad(&self, i: usize, g: &[f32], lr: f32, salt: u64) {
        let at = i * self.dim;
        // Atomics do not vectorise: copy a block of the row and its state out with relaxed
        // loads, update the copies with vector arithmetic, and store them back.
        let (mut w, mut a) = ([0.0f32; BLOCK], [0.0f32; BLOCK]);
        if self.state_per_row == 1 {
            let mean_sq = g.iter().map(|x| x * x).sum::<f32>() / self.dim as f32;
            self.state.read(i, &mut a[..1]);
            a[0] += mean_sq;
            self.state.write(i, &a[..1], Some(bf16::state_salt(salt)));
            let step = lr / (a[0].sqrt() + EPS);
            for start in (0..self.dim).step_by(BLOCK) {
                let len = BLOCK.min(self.dim - start);
                let (w, gb) = (&mut w[..len], &g[start..start + len]);
                self.params.read(at + start, w);
                for (wk, gk) in w.iter_mut().zip(gb) {
                    *wk -= step * gk;
                }
                self.params.write(at + start, w, Some(salt));
            }
        } else {
            for start in (0..self.dim).step_by(BLOCK) {
                let len = BLOCK.min(self.dim - start);
                let (w, a, gb) = (&mut w[..len], &mut a[..len], &g[start..start + len]);
                self.params.read(at + start, w);
                self.state.read(at + start, a);
                for k in 0..len {
                    a[k] += gb[k] * gb[k];
                    w[k] -= lr * gb[k] / (a[k].sqrt() + EPS);
                }
                self.params.write(at + start, w, Some(salt));
                self.state
                    .write(at + start, a, Some(bf16::state_salt(salt)));
            }
        }
    }
}

/// Values per block of the vectorised Adagrad update.
const BLOCK: usize = 64;

/// Views a float slice as atomics (same size and alignment; exclusive borrow for the lifetime).
fn as_atomic(v: &mut [f32]) -> &[AtomicU32] {
    // SAFETY: AtomicU32 has the size and alignment of f32/u32; the exclusive borrow guarantees
    // no non-atomic access happens while the atomic view exists.
    unsafe { std::slice::from_raw_parts(v.as_mut_ptr() as *const AtomicU32, v.len()) }
}

/// Views bf16 values as atomics (as [`as_atomic`]).
fn as_atomic16(v: &mut [u16]) -> &[AtomicU16] {
    // SAFETY: AtomicU16 has the size and alignment of u16; exclusive borrow as above.
    unsafe { std::slice::from_raw_parts(v.as_mut_ptr() as *const AtomicU16, v.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adagrad_steps() {
        let mut p = vec![1.0f32, 2.0];
        let mut s = vec![0.0f32; 2];
        let rows = SharedRows::new(&mut p, &mut s, 2, 2);
        rows.adagrad(0, &[0.5, -1.0], 0.1, 0);
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
        rows.adagrad(0, &[3.0, 4.0], 1.0, 0);
        rows.load(0, &mut out);
        // mean g² = 12.5, step = 1/√12.5
        let step = 1.0 / 12.5f32.sqrt();
        assert!((out[0] - (1.0 - 3.0 * step)).abs() < 1e-6);
    }
    /// A bf16 region of `rows` rows of `dim` values and per-element state.
    fn bf16_region(rows: u64, dim: usize) -> (TableLayout, Vec<u8>) {
        let layout = TableLayout {
            rows,
            dim,
            state_per_row: dim,
            pinned: None,
            dtype: TableDtype::Bf16,
        };
        let bytes = vec![0u8; layout.part_bytes() as usize];
        (layout, bytes)
    }

    #[test]
    fn a_bf16_region_stores_rounded_values_after_the_embeddings() {
        let (layout, mut bytes) = bf16_region(3, 4);
        assert_eq!(layout.emb_bytes(), 3 * 4 * 2);
        let rows = SharedRows::region(&mut bytes, &layout);
        rows.store(1, &[1.0, -0.5, 1.0 + 1.0 / 200.0, 3.0]);
        rows.store_state(2, &[0.25, 0.0, 0.0, 8.0]);
        let mut out = [0.0f32; 4];
        rows.load(1, &mut out);
        assert_eq!(out, [1.0, -0.5, 1.0 + 1.0 / 128.0, 3.0]);
        // Row 1 is bytes 8..16 of the embeddings; row 2's state starts after all embeddings.
        let h: &[u16] = bytemuck::cast_slice(&bytes);
        assert_eq!(bf16::to_f32(h[4]), 1.0);
        assert_eq!(bf16::to_f32(h[12 + 8]), 0.25);
        assert_eq!(bf16::to_f32(h[12 + 11]), 8.0);
    }

    #[test]
    fn bf16_adagrad_keeps_steps_below_its_resolution_on_average() {
        // Steps of 1/4096 on values near 1, where bf16 holds steps of 1/128: rounded to
        // nearest, every step would be lost; stochastically rounded, their sum survives.
        let (layout, mut bytes) = bf16_region(1, 64);
        let rows = SharedRows::region(&mut bytes, &layout);
        rows.store(0, &[1.0; 64]);
        let g = [1.0f32; 64];
        let mut p32 = vec![1.0f32; 64];
        let mut s32 = vec![0.0f32; 64];
        let exact = SharedRows::new(&mut p32, &mut s32, 64, 64);
        for t in 0..2000 {
            rows.adagrad(0, &g, 1.0 / 4096.0 * 20.0, t);
            exact.adagrad(0, &g, 1.0 / 4096.0 * 20.0, t);
        }
        let (mut got, mut want) = ([0.0f32; 64], [0.0f32; 64]);
        rows.load(0, &mut got);
        exact.load(0, &mut want);
        let mean = got.iter().sum::<f32>() / 64.0;
        assert!(want[0] < 0.9, "the exact run moved: {}", want[0]);
        assert!(
            (mean - want[0]).abs() < 0.01,
            "bf16 mean {mean} against f32 {}",
            want[0]
        );
    }
}
