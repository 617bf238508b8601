//! Negative banks: a block of rows of every partition kept in memory, so that negatives can be
//! drawn uniformly over all nodes although only a few partitions are resident.
//!
//! Drawing negatives only from the resident partitions (Marius, Legend) restricts the softmax to
//! a fraction of the nodes, and on FB15k-237 with 8 partitions and a buffer of 3 that costs
//! about 0.02 filtered MRR. A non-resident partition does not change while it is on disk, so a
//! copy of some of its rows, taken when it is evicted (or at the start of the epoch, read or
//! copied from the partition kept in memory), is exactly current: those rows serve as negatives. Their own gradient is summed in the bank
//! and applied, as one Adagrad step per row, when the partition is next loaded (or at the end
//! of the epoch), against the very values it was computed from.
//!
//! Nodes are spread over partitions by a random permutation, so a contiguous block of local
//! rows is a uniform sample of the partition's nodes and is read with one request. In a typed
//! run a partition's bank holds one such block per partitioned entity type (a *segment*),
//! each its type's share of the rows (at least one), so negatives of every type can be drawn
//! from it.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::sync::Arc;

use strata_io::Engine;
use strata_store::rng::{derive, Rng};

use crate::error::Result;
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::Partitioning;
use crate::storage::shared::SharedRows;
use crate::storage::table::{Rows, TableFile};

/// One block of rows per partition (per partition and partitioned entity type in a typed
/// run), with the gradient the rows received as negatives.
pub struct Banks {
    dim: usize,
    /// Rows held per partition (at most).
    capacity: usize,
    /// Rows the blocks of one partition share (`capacity` less one per extra segment).
    rows: usize,
    /// Segments per partition: 1, or a typed run's partitioned entity types.
    segs: usize,
    /// `partitions x capacity x dim`.
    data: Vec<f32>,
    /// Summed gradients of the rows, same shape; workers add to them concurrently (relaxed
    /// atomics, the same race policy as the embedding rows).
    grad: Vec<AtomicU32>,
    /// Whether a partition's block has gradient not yet applied.
    pending: Vec<AtomicBool>,
    /// Per `(partition, segment)`: rows held, first local row in the partition and first
    /// row in the partition's bank.
    len: Vec<u32>,
    first: Vec<u64>,
    at: Vec<u32>,
    /// Salt of the stochastic rounding of pending gradient applied to a bf16 table (drawn
    /// with the blocks: a pure function of the seed and the epoch).
    salt: u64,
    /// Counts the changes of `data`, so that a device holding a copy of it knows when to copy
    /// it again.
    version: u64,
}

impl Banks {
    /// Bytes held for `partitions` banks of `rows` rows of `dim` floats (rows and gradients)
    /// in `segs` segments each (each segment's share rounds up by at most one row).
    pub fn bytes(partitions: u32, rows: usize, dim: usize, segs: usize) -> u64 {
        2 * partitions as u64 * (rows + segs.max(1) - 1) as u64 * dim as u64 * 4
    }

    /// Banks of `rows` rows per partition in `segs` segments (1, or a typed run's partitioned
    /// entity types).
    pub fn new(partitions: u32, rows: usize, dim: usize, segs: usize) -> Banks {
        let segs = segs.max(1);
        let capacity = rows + segs - 1;
        let floats = partitions as usize * capacity * dim;
        let blocks = partitions as usize * segs;
        Banks {
            dim,
            capacity,
            rows,
            segs,
            data: vec![0.0; floats],
            grad: (0..floats).map(|_| AtomicU32::new(0)).collect(),
            pending: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
            len: vec![0; blocks],
            first: vec![0; blocks],
            at: vec![0; blocks],
            salt: 0,
            version: 0,
        }
    }

    /// Picks this epoch's block of every partition (a function of `seed` and `epoch`), except
    /// for partitions whose gradient is still pending: they keep the block it belongs to. In
    /// a typed run each partitioned entity type gets a block within its section, sized by its
    /// share of the partition's rows.
    pub fn choose_blocks(&mut self, p: &Partitioning, seed: u64, epoch: usize) {
        self.salt = derive(derive(seed, 0x5a17), epoch as u64);
        let mut rng = Rng::new(derive(derive(seed, 0xba4c), epoch as u64));
        let typed = p.typed_layout();
        let sections: Vec<usize> = match &typed {
            Some(l) => (0..l.types.len())
                .filter(|&t| l.types[t].partitioned)
                .collect(),
            None => vec![0],
        };
        debug_assert_eq!(sections.len(), self.segs);
        for part in 0..p.partitions {
            let total = p.size_of(part);
            let mut at = 0u32;
            for (s, &t) in sections.iter().enumerate() {
                let range = match &typed {
                    Some(l) => l.section(t, part),
                    None => 0..total,
                };
                let size = range.end - range.start;
                let len = if self.segs == 1 {
                    size.min(self.rows as u64)
                } else {
                    (self.rows as u64 * size / total.max(1)).max(1).min(size)
                };
                let first = range.start + rng.below(size - len + 1);
                let i = part as usize * self.segs + s;
                if !self.has_pending(part) {
                    (self.len[i], self.first[i], self.at[i]) = (len as u32, first, at);
                }
                at += self.len[i];
            }
        }
    }

    /// Bank row and rows of segment `seg` (entity type) of `part`'s bank.
    pub fn segment(&self, part: u32, seg: usize) -> (u32, u32) {
        let i = part as usize * self.segs + seg;
        (self.at[i], self.len[i])
    }

    /// `(first bank row, first local row, rows)` of each segment of `part`.
    fn segments(&self, part: u32) -> impl Iterator<Item = (usize, u64, usize)> + '_ {
        let i = part as usize * self.segs;
        (i..i + self.segs).map(|k| (self.at[k] as usize, self.first[k], self.len[k] as usize))
    }

    /// Whether `part`'s block has gradient not yet applied.
    pub fn has_pending(&self, part: u32) -> bool {
        self.pending[part as usize].load(Relaxed)
    }

    /// Adds `g` to the gradient of row `j` of `part`'s block.
    pub fn add_grad(&self, part: u32, j: u32, g: &[f32]) {
        let at = (part as usize * self.capacity + j as usize) * self.dim;
        for (a, v) in self.grad[at..at + self.dim].iter().zip(g) {
            a.store((f32::from_bits(a.load(Relaxed)) + v).to_bits(), Relaxed);
        }
        self.pending[part as usize].store(true, Relaxed);
    }

    /// Applies `part`'s pending gradient to its rows (`rows`, resident) with one Adagrad step
    /// per row, and clears it.
    pub fn apply_pending(&self, part: u32, rows: &SharedRows, lr: f32) {
        if !self.pending[part as usize].swap(false, Relaxed) {
            return;
        }
        let mut g = vec![0.0f32; self.dim];
        let base = part as usize * self.capacity * self.dim;
        let salt = derive(self.salt, part as u64);
        for (at, first, len) in self.segments(part) {
            for j in 0..len {
                let cell = base + (at + j) * self.dim;
                for (v, a) in g.iter_mut().zip(&self.grad[cell..cell + self.dim]) {
                    *v = f32::from_bits(a.swap(0, Relaxed));
                }
                if g.iter().any(|&v| v != 0.0) {
                    rows.adagrad((first + j as u64) as usize, &g, lr, salt);
                }
            }
        }
    }

    /// Copies partition `part`'s block out of its embeddings (`rows x dim`, resident).
    pub fn copy_from(&mut self, part: u32, embeddings: Rows) {
        self.version += 1;
        let base = part as usize * self.capacity * self.dim;
        let d = self.dim;
        let segs: Vec<_> = self.segments(part).collect();
        for (at, first, len) in segs {
            embeddings.copy(
                first as usize * d,
                &mut self.data[base + at * d..base + (at + len) * d],
            );
        }
    }

    /// Reads partition `part`'s block from `table`.
    pub fn read(
        &mut self,
        part: u32,
        table: &TableFile,
        engine: &Arc<Engine>,
        layout: &TableLayout,
    ) -> Result<()> {
        self.version += 1;
        let base = part as usize * self.capacity * self.dim;
        let d = self.dim;
        let segs: Vec<_> = self.segments(part).collect();
        for (at, first, len) in segs {
            let rows = &mut self.data[base + at * d..base + (at + len) * d];
            table.read_rows(engine, layout, part, first, rows)?;
        }
        Ok(())
    }

    /// Floats of one partition's block in [`rows_mut`](Self::rows_mut) (`capacity x dim`).
    pub fn block_floats(&self) -> usize {
        self.capacity * self.dim
    }

    /// Rows held per partition (at most).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Every block's rows (`partitions x capacity x dim`; a block's rows past its `len` stay
    /// zero), for a distributed run to sum each rank's share of the blocks into.
    pub fn rows_mut(&mut self) -> &mut [f32] {
        self.version += 1;
        &mut self.data
    }

    /// Every block's rows (as [`rows_mut`](Self::rows_mut)), and their version: it changes
    /// whenever they may have.
    pub fn rows(&self) -> (&[f32], u64) {
        (&self.data, self.version)
    }

    /// Adds `grad` (shaped as [`take_grad`](Self::take_grad)'s: a device step's sums over a
    /// piece) to the blocks' gradient; a block it adds to has gradient pending.
    pub fn add_grads(&self, grad: &[f32]) {
        let block = self.capacity * self.dim;
        for (part, g) in grad.chunks(block.max(1)).enumerate() {
            if g.iter().all(|&v| v == 0.0) {
                continue;
            }
            let cells = &self.grad[part * block..(part + 1) * block];
            for (a, v) in cells.iter().zip(g) {
                a.store((f32::from_bits(a.load(Relaxed)) + v).to_bits(), Relaxed);
            }
            self.pending[part].store(true, Relaxed);
        }
    }

    /// Takes every block's gradient (shaped as [`rows_mut`](Self::rows_mut)), leaving none
    /// pending.
    pub fn take_grad(&self) -> Vec<f32> {
        self.pending.iter().for_each(|p| p.store(false, Relaxed));
        self.grad
            .iter()
            .map(|a| f32::from_bits(a.swap(0, Relaxed)))
            .collect()
    }

    /// Makes `grad` (shaped as [`take_grad`](Self::take_grad)'s) the pending gradient of the
    /// partitions `keep` selects, where it is not all zero; the other partitions' is dropped.
    pub fn set_grad(&self, grad: &[f32], keep: impl Fn(u32) -> bool) {
        let block = self.capacity * self.dim;
        for (part, g) in (0u32..).zip(grad.chunks(block.max(1))) {
            if !keep(part) || g.iter().all(|&v| v == 0.0) {
                continue;
            }
            let cells = &self.grad[part as usize * block..(part as usize + 1) * block];
            for (a, v) in cells.iter().zip(g) {
                a.store(v.to_bits(), Relaxed);
            }
            self.pending[part as usize].store(true, Relaxed);
        }
    }

    /// Rows held for `part`.
    pub fn len(&self, part: u32) -> u32 {
        self.segments(part).map(|(_, _, n)| n as u32).sum()
    }

    /// Row `j` of `part`'s block.
    pub fn row(&self, part: u32, j: u32) -> &[f32] {
        let at = (part as usize * self.capacity + j as usize) * self.dim;
        &self.data[at..at + self.dim]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_fit_their_partitions_and_copy_rows() {
        let p = Partitioning::new(1000, 3, 7).unwrap();
        let mut b = Banks::new(3, 100, 2, 1);
        b.choose_blocks(&p, 1, 0);
        for part in 0..3 {
            assert_eq!(b.len(part), 100);
            assert!(b.first[part as usize] + 100 <= p.size_of(part));
        }
        let emb: Vec<f32> = (0..334 * 2).map(|i| i as f32).collect();
        b.copy_from(1, Rows::F32(&emb));
        let first = b.first[1] as f32;
        assert_eq!(b.row(1, 0), &[2.0 * first, 2.0 * first + 1.0]);
        assert_eq!(
            b.row(1, 99),
            &[2.0 * (first + 99.0), 2.0 * (first + 99.0) + 1.0]
        );
        // Pending gradient goes to the right rows, once.
        let mut params: Vec<f32> = emb.clone();
        let mut state = vec![0.0f32; params.len()];
        b.add_grad(1, 3, &[1.0, -1.0]);
        assert!(b.has_pending(1) && !b.has_pending(0));
        let rows = SharedRows::new(&mut params, &mut state, 2, 2);
        b.apply_pending(1, &rows, 0.5);
        b.apply_pending(1, &rows, 0.5);
        let mut out = [0.0f32; 2];
        let row = (b.first[1] + 3) as usize;
        rows.load(row, &mut out);
        assert_eq!(out, [emb[2 * row] - 0.5, emb[2 * row + 1] + 0.5]);
        assert!(!b.has_pending(1));
        // A distributed run takes the gradient out, sums it over the ranks and gives each
        // partition's share back to the rank that applies it.
        b.add_grad(2, 1, &[0.5, 0.0]);
        b.add_grad(0, 0, &[0.25, 0.25]);
        let mut g = b.take_grad();
        assert!(!b.has_pending(0) && !b.has_pending(2));
        assert_eq!(g[(2 * 100 + 1) * 2], 0.5);
        g.iter_mut().for_each(|v| *v *= 2.0);
        b.set_grad(&g, |part| part == 2);
        assert!(b.has_pending(2) && !b.has_pending(0) && !b.has_pending(1));
        assert_eq!(b.take_grad(), {
            let mut only = vec![0.0; g.len()];
            only[(2 * 100 + 1) * 2] = 1.0;
            only
        });
        // A device step's sums add in, block by block, making a block with any pending.
        let mut sums = vec![0.0f32; g.len()];
        sums[(2 * 100 + 1) * 2] = 0.5;
        b.add_grad(2, 1, &[0.25, 0.0]);
        b.add_grads(&sums);
        assert!(b.has_pending(2) && !b.has_pending(0) && !b.has_pending(1));
        assert_eq!(b.take_grad()[(2 * 100 + 1) * 2], 0.75);
        let version = b.rows().1;
        b.copy_from(0, Rows::F32(&emb));
        assert_ne!(b.rows().1, version, "a copy changes the version");
        // Another epoch picks other blocks; a small partition is held whole.
        let mut c = Banks::new(3, 100, 2, 1);
        c.choose_blocks(&p, 1, 1);
        assert_ne!(b.first, c.first);
        let mut whole = Banks::new(3, 5000, 2, 1);
        whole.choose_blocks(&p, 1, 0);
        assert_eq!((whole.len(0), whole.first[0]), (334, 0));
    }
}
