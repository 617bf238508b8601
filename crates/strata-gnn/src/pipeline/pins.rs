//! The window pins one batch still holds, released exactly once whatever ends the batch.
//!
//! A batch takes one pin per cacheable node occurrence when it enters the look-ahead window
//! ([`FeatureTiers::pin_window`]) and keeps them all while it waits for its disk rows: its
//! lookup only classifies its nodes (hot, cached, device, disk), so that no feature buffer
//! exists before its rows are read. Filling its buffer then copies its cache hits (releasing
//! their pins) and admits its disk rows (releasing the rest; see the pin accounting in
//! [`crate::tiers`]). A batch can also be abandoned before that: the loader dropped mid-epoch,
//! or an error ending the epoch, leaves batches in the window, in the accumulator, in channels
//! or in a read that failed. [`WindowPins`] travels with the batch and records exactly the
//! occurrences whose pins are still held, so that dropping it (wherever the batch is dropped,
//! on whichever thread) hands those, and only those, to [`FeatureTiers::unpin_window`]:
//!
//! | the batch was | pins still held | released on drop |
//! |---|---|---|
//! | pinned, or looked up | every cacheable occurrence | all of them |
//! | filled | none | nothing |

use std::sync::Arc;

use crate::tiers::{FeatureTiers, Lookup};

/// The pins one batch holds in the dynamic cache; see the module docs. Dropping it releases
/// them.
pub(super) struct WindowPins {
    tiers: Arc<FeatureTiers>,
    /// The occurrences pinned and not yet released (cacheable nodes only, repeats kept).
    held: Vec<u32>,
}

impl WindowPins {
    /// The batch with these sampled nodes enters the window: pins them
    /// ([`FeatureTiers::pin_window`]).
    pub(super) fn pin(tiers: &Arc<FeatureTiers>, nodes: &[u32]) -> WindowPins {
        WindowPins {
            tiers: tiers.clone(),
            held: tiers.pin_window_held(nodes),
        }
    }

    /// Looks the batch up in memory ([`FeatureTiers::lookup_pinned`]): which rows come from
    /// the disk, which from the device tier; returns that and the misses' nodes. Every pin
    /// stays held, so the memory rows stay where the lookup found them until
    /// [`WindowPins::fill`].
    pub(super) fn lookup(&self, nodes: &[u32]) -> (Lookup, Vec<u32>) {
        let lookup = self.tiers.lookup_pinned(nodes);
        let miss_nodes: Vec<u32> = lookup.misses.iter().map(|&i| nodes[i as usize]).collect();
        (lookup, miss_nodes)
    }

    /// Fills `out` (the batch's feature buffer, `nodes.len() * row_bytes` bytes) once its disk
    /// rows were read: the memory rows from the tiers ([`FeatureTiers::copy_pinned_hits`]),
    /// then `disk_rows` (one row per miss, in `lookup.misses`' order) at the misses' positions,
    /// which are offered to the cache ([`FeatureTiers::admit`] with `unpin = true`). Every pin
    /// the batch held is released.
    pub(super) fn fill(
        mut self,
        nodes: &[u32],
        lookup: &Lookup,
        miss_nodes: &[u32],
        disk_rows: &[u8],
        out: &mut [u8],
    ) {
        let rb = self.tiers.row_bytes();
        self.tiers.copy_pinned_hits(nodes, lookup, out);
        for (&i, row) in lookup.misses.iter().zip(disk_rows.chunks_exact(rb)) {
            out[i as usize * rb..][..rb].copy_from_slice(row);
        }
        self.tiers.admit(miss_nodes, disk_rows, true);
        self.held.clear();
    }
}

impl Drop for WindowPins {
    fn drop(&mut self) {
        if !self.held.is_empty() {
            self.tiers.unpin_window(&self.held);
        }
    }
}
