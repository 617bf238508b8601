//! GIDS's dynamic storage access accumulator (§3.2): merge the disk reads of several
//! consecutive mini-batches into one gather, so that the device sees enough concurrent reads to
//! run near its peak.
//!
//! One small batch's misses are too few to fill an SSD's queues: a gather's ramp-up and drain
//! (the model's `T_i + T_t`) then dominate its steady state. GIDS's queueing model says that
//! reaching a fraction `p` of peak IOPS needs `N = p / (1 - p) x IOPS_peak x latency` reads in
//! flight ([`strata_io::profile::gids_in_flight`]). The accumulator therefore collects the
//! misses of consecutive batches (after the memory tiers served what they hold, which plays the
//! role of GIDS's threshold raise for redirected accesses: only reads that reach the disk
//! count) until their distinct rows reach that target, and issues them as one deduplicated
//! read. A cap on the number of batches merged bounds the samples held while waiting (the
//! batches get their feature buffers only after the read).
//!
//! This module is the policy (pure, no I/O); [`crate::pipeline`] runs it.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

use strata_io::profile::DeviceProfile;

use strata_graph::features::FeatureReader;

/// GIDS's default fraction of peak IOPS to aim for (`peak_percent = 0.95` in its scripts).
pub const GIDS_PEAK_FRACTION: f64 = 0.95;

/// Where the in-flight target came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TargetSource {
    /// Set explicitly in the configuration.
    Config,
    /// GIDS's model over the measured profile of the device holding the features
    /// (`strata bench-disk`), at [`GIDS_PEAK_FRACTION`] of peak.
    Profile,
    /// No profile measured: the I/O engine's depth (the most requests it keeps in flight).
    EngineDepth,
    /// The sampled batches share the feature file's pages: the rows of a few batches, so
    /// that a read fetches a shared page once for all of them (`strata_gnn::data`).
    PageSharing,
}

/// The number of disk rows a merged read should reach: `requested` when positive, else GIDS's
/// model over the device profile of the features' file (`p = 0.95`), else the engine's depth.
/// Always at least 1.
pub fn in_flight_target(requested: usize, reader: &FeatureReader) -> (usize, TargetSource) {
    if requested > 0 {
        return (requested, TargetSource::Config);
    }
    match DeviceProfile::for_path(&reader.meta().path) {
        // A profile without measurements would give 1; the engine depth is a better guess.
        Some(p) if p.peak_iops() > 0.0 && p.unloaded_latency_us() > 0.0 => (
            p.target_in_flight(GIDS_PEAK_FRACTION).max(1),
            TargetSource::Profile,
        ),
        _ => (reader.engine().depth().max(1), TargetSource::EngineDepth),
    }
}

/// Identity hash for node ids: they are already well spread, and SipHash would dominate the
/// cost of a set insertion.
#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Multiply so that hashbrown's top-bit tag sees the low bits too.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }

    fn write(&mut self, _: &[u8]) {
        unreachable!("node ids hash as u32")
    }

    fn write_u32(&mut self, v: u32) {
        self.0 = v as u64;
    }
}

/// What a flush hands over: the merged batches, in the order they were pushed, and the rows to
/// read for all of them.
#[derive(Debug)]
pub struct Merged<T> {
    /// The batches (whatever the caller tracks per batch), oldest first.
    pub items: Vec<T>,
    /// Per batch, the disk rows it was pushed with (repeats and order kept).
    pub item_rows: Vec<Vec<u32>>,
    /// Distinct rows (node ids) missed by any of them, sorted ascending.
    pub rows: Vec<u32>,
}

/// Collects consecutive batches and the union of their disk rows until a flush is due.
#[derive(Debug)]
pub struct Accumulator<T> {
    target: usize,
    max_batches: usize,
    items: Vec<T>,
    item_rows: Vec<Vec<u32>>,
    rows: HashSet<u32, BuildHasherDefault<IdHasher>>,
}

impl<T> Accumulator<T> {
    /// Flushes once the distinct rows reach `target` (at least 1) or `max_batches` batches (at
    /// least 1) are held. `max_batches = 1` reads every batch alone (no accumulation).
    pub fn new(target: usize, max_batches: usize) -> Accumulator<T> {
        Accumulator {
            target: target.max(1),
            max_batches: max_batches.max(1),
            items: Vec::new(),
            item_rows: Vec::new(),
            rows: HashSet::default(),
        }
    }

    /// The distinct-row target.
    pub fn target(&self) -> usize {
        self.target
    }

    /// The most batches merged into one read.
    pub fn max_batches(&self) -> usize {
        self.max_batches
    }

    /// Adds a batch and the rows it must read from disk (repeats, within it or with earlier
    /// batches, are read once). The list is handed back with the batch by
    /// [`Accumulator::take`], for the caller's scatter and cache admission.
    pub fn push(&mut self, item: T, rows: Vec<u32>) {
        self.rows.extend(rows.iter().copied());
        self.items.push(item);
        self.item_rows.push(rows);
    }

    /// Batches held.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether no batch is held.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Distinct disk rows of the batches held.
    pub fn distinct_rows(&self) -> usize {
        self.rows.len()
    }

    /// Whether the batches held should be read now: enough distinct rows to keep the device
    /// busy, or as many batches as the cap allows.
    pub fn is_full(&self) -> bool {
        self.rows.len() >= self.target || self.items.len() >= self.max_batches
    }

    /// Hands over the batches held and their rows (sorted, so the read plan and the scatter's
    /// binary search see one order whatever the hash set's), leaving the accumulator empty.
    pub fn take(&mut self) -> Merged<T> {
        let mut rows: Vec<u32> = self.rows.drain().collect();
        rows.sort_unstable();
        Merged {
            items: std::mem::take(&mut self.items),
            item_rows: std::mem::take(&mut self.item_rows),
            rows,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushes_at_the_target_or_the_cap() {
        let mut acc = Accumulator::new(5, 3);
        assert!(acc.is_empty() && !acc.is_full());
        acc.push("a", vec![7, 3, 3]);
        assert_eq!((acc.len(), acc.distinct_rows()), (1, 2));
        assert!(!acc.is_full());
        // Rows shared with an earlier batch count once.
        acc.push("b", vec![3, 7, 9]);
        assert_eq!(acc.distinct_rows(), 3);
        assert!(!acc.is_full());
        acc.push("c", vec![1, 2]);
        assert!(acc.is_full(), "5 distinct rows reach the target");
        let m = acc.take();
        assert_eq!(m.items, ["a", "b", "c"]);
        assert_eq!(m.item_rows, [vec![7, 3, 3], vec![3, 7, 9], vec![1, 2]]);
        assert_eq!(m.rows, [1, 2, 3, 7, 9]);
        assert!(acc.is_empty() && acc.distinct_rows() == 0);

        // Batches that all hit memory: only the cap flushes them.
        for name in ["d", "e"] {
            acc.push(name, vec![]);
            assert!(!acc.is_full());
        }
        acc.push("f", vec![]);
        assert!(acc.is_full());
        let m = acc.take();
        assert_eq!((m.items.len(), m.rows.len()), (3, 0));
    }

    #[test]
    fn one_batch_per_read_without_accumulation() {
        let mut acc = Accumulator::new(usize::MAX, 1);
        acc.push(0u8, vec![5]);
        assert!(acc.is_full());
        // Degenerate settings are raised to 1.
        let acc = Accumulator::<()>::new(0, 0);
        assert_eq!((acc.target(), acc.max_batches()), (1, 1));
    }

    #[test]
    fn rows_come_out_sorted_and_distinct() {
        let mut acc = Accumulator::new(usize::MAX, usize::MAX);
        let mut s = 1u64;
        let mut all = Vec::new();
        for b in 0..20 {
            let rows: Vec<u32> = (0..50)
                .map(|_| {
                    s = strata_store::rng::derive(s, b);
                    (s % 300) as u32
                })
                .collect();
            all.extend_from_slice(&rows);
            acc.push(b, rows);
        }
        all.sort_unstable();
        all.dedup();
        assert_eq!(acc.take().rows, all);
    }
}
