//! Vertex data shared by the compute threads: arrays of relaxed atomics (same size and layout
//! as plain values) and an activity bitmap.
//!
//! In column order the thread that streams a column owns its destination chunk, so writes to
//! destinations are plain load/store pairs; the `*_shared` operations are read-modify-writes
//! for the sides no thread owns.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};

/// `f32` values.
pub struct F32Array(Vec<AtomicU32>);

impl F32Array {
    /// `n` copies of `value`.
    pub fn filled(n: usize, value: f32) -> F32Array {
        F32Array((0..n).map(|_| AtomicU32::new(value.to_bits())).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline]
    pub fn get(&self, i: usize) -> f32 {
        f32::from_bits(self.0[i].load(Relaxed))
    }

    #[inline]
    pub fn set(&self, i: usize, v: f32) {
        self.0[i].store(v.to_bits(), Relaxed)
    }

    /// Adds to a value this thread owns.
    #[inline]
    pub fn add_owned(&self, i: usize, v: f32) {
        self.set(i, self.get(i) + v)
    }

    /// Adds to a value other threads may update at the same time.
    #[inline]
    pub fn add_shared(&self, i: usize, v: f32) {
        let _ = self.0[i].fetch_update(Relaxed, Relaxed, |x| {
            Some((f32::from_bits(x) + v).to_bits())
        });
    }

    /// The values as plain floats, in the same allocation (after the threads are done).
    pub fn into_vec(self) -> Vec<f32> {
        self.0
            .into_iter()
            .map(|a| f32::from_bits(a.into_inner()))
            .collect()
    }
}

/// `f64` values (ranks, distances).
pub struct F64Array(Vec<AtomicU64>);

impl F64Array {
    pub fn filled(n: usize, value: f64) -> F64Array {
        F64Array((0..n).map(|_| AtomicU64::new(value.to_bits())).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline]
    pub fn get(&self, i: usize) -> f64 {
        f64::from_bits(self.0[i].load(Relaxed))
    }

    #[inline]
    pub fn set(&self, i: usize, v: f64) {
        self.0[i].store(v.to_bits(), Relaxed)
    }

    /// Adds to a value this thread owns.
    #[inline]
    pub fn add_owned(&self, i: usize, v: f64) {
        self.set(i, self.get(i) + v)
    }

    /// Adds to a value other threads may update at the same time.
    #[inline]
    pub fn add_shared(&self, i: usize, v: f64) {
        let _ = self.0[i].fetch_update(Relaxed, Relaxed, |x| {
            Some((f64::from_bits(x) + v).to_bits())
        });
    }

    /// Lowers a non-negative value to non-negative `v` if smaller (the bit patterns of
    /// non-negative floats order like their values); true if it changed.
    #[inline]
    pub fn min_shared(&self, i: usize, v: f64) -> bool {
        debug_assert!(v >= 0.0);
        self.0[i].fetch_min(v.to_bits(), Relaxed) > v.to_bits()
    }

    /// The values, in the same allocation.
    pub fn into_vec(self) -> Vec<f64> {
        self.0
            .into_iter()
            .map(|a| f64::from_bits(a.into_inner()))
            .collect()
    }
}

/// `u64` values (ids, levels, labels, counts).
pub struct U64Array(Vec<AtomicU64>);

impl U64Array {
    pub fn filled(n: usize, value: u64) -> U64Array {
        U64Array((0..n).map(|_| AtomicU64::new(value)).collect())
    }

    pub fn from_fn(n: usize, f: impl Fn(usize) -> u64) -> U64Array {
        U64Array((0..n).map(|i| AtomicU64::new(f(i))).collect())
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    #[inline]
    pub fn get(&self, i: usize) -> u64 {
        self.0[i].load(Relaxed)
    }

    #[inline]
    pub fn set(&self, i: usize, v: u64) {
        self.0[i].store(v, Relaxed)
    }

    /// Lowers the value to `v` if smaller, whoever else is writing; true if it changed.
    #[inline]
    pub fn min_shared(&self, i: usize, v: u64) -> bool {
        self.0[i].fetch_min(v, Relaxed) > v
    }

    /// Sets the value to `new` if it is `old`, whoever else is writing; true if it did.
    #[inline]
    pub fn cas_shared(&self, i: usize, old: u64, new: u64) -> bool {
        self.0[i]
            .compare_exchange(old, new, Relaxed, Relaxed)
            .is_ok()
    }

    #[inline]
    pub fn add_shared(&self, i: usize, v: u64) -> u64 {
        self.0[i].fetch_add(v, Relaxed)
    }

    #[inline]
    pub fn sub_shared(&self, i: usize, v: u64) -> u64 {
        self.0[i].fetch_sub(v, Relaxed)
    }

    /// The values, in the same allocation.
    pub fn into_vec(self) -> Vec<u64> {
        self.0.into_iter().map(AtomicU64::into_inner).collect()
    }
}

/// One bit per vertex.
pub struct Bitmap {
    words: Vec<AtomicU64>,
    len: usize,
}

impl Bitmap {
    pub fn new(len: usize) -> Bitmap {
        Bitmap {
            words: (0..len.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
            len,
        }
    }

    /// A bitmap with every bit set.
    pub fn full(len: usize) -> Bitmap {
        let b = Bitmap::new(len);
        b.fill(true);
        b
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    #[inline]
    pub fn get(&self, i: usize) -> bool {
        self.words[i / 64].load(Relaxed) & (1 << (i % 64)) != 0
    }

    #[inline]
    pub fn set(&self, i: usize) {
        self.words[i / 64].fetch_or(1 << (i % 64), Relaxed);
    }

    /// Sets or clears every bit.
    pub fn fill(&self, on: bool) {
        for (k, w) in self.words.iter().enumerate() {
            let bits = if !on {
                0
            } else if (k + 1) * 64 <= self.len {
                u64::MAX
            } else {
                (1u64 << (self.len - k * 64)) - 1
            };
            w.store(bits, Relaxed);
        }
    }

    /// Makes this bitmap a copy of `other` (same length) and clears `other`.
    pub fn take_from(&self, other: &Bitmap) {
        for (w, o) in self.words.iter().zip(&other.words) {
            w.store(o.swap(0, Relaxed), Relaxed);
        }
    }

    /// Bits set in `[start, end)`.
    pub fn count_range(&self, start: usize, end: usize) -> u64 {
        (start..end).filter(|&i| self.get(i)).count() as u64
    }

    /// Bits set.
    pub fn count(&self) -> u64 {
        self.words
            .iter()
            .map(|w| w.load(Relaxed).count_ones() as u64)
            .sum()
    }

    /// Whether any bit in `[start, end)` is set.
    pub fn any_range(&self, start: usize, end: usize) -> bool {
        let mut i = start;
        while i < end {
            if i.is_multiple_of(64) && i + 64 <= end {
                if self.words[i / 64].load(Relaxed) != 0 {
                    return true;
                }
                i += 64;
            } else {
                if self.get(i) {
                    return true;
                }
                i += 1;
            }
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bitmap_ranges() {
        let b = Bitmap::new(200);
        assert!(!b.any_range(0, 200));
        b.set(130);
        assert!(b.any_range(100, 131) && !b.any_range(131, 200) && !b.any_range(0, 130));
        assert_eq!(b.count(), 1);
        b.fill(true);
        assert_eq!(b.count(), 200);
        assert_eq!(b.count_range(190, 200), 10);
    }

    #[test]
    fn shared_updates() {
        let a = F32Array::filled(2, 1.0);
        a.add_shared(0, 2.5);
        a.add_owned(1, 0.5);
        assert_eq!(a.into_vec(), vec![3.5, 1.5]);
        let u = U64Array::filled(1, 10);
        assert!(u.min_shared(0, 4));
        assert!(!u.min_shared(0, 7));
        assert_eq!(u.get(0), 4);
    }
}
