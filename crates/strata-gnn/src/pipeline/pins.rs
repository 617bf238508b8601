//! The window pins one batch still holds, released exactly once whatever ends the batch.
//!
//! A batch takes one pin per cacheable node occurrence when it enters the look-ahead window
//! ([`FeatureTiers::pin_window`]); serving it from memory releases the pins of its hits, and
//! admitting its disk rows releases the rest (see the pin accounting in [`crate::tiers`]). A
//! batch can also be abandoned between those steps: the loader dropped mid-epoch, or an error
//! ending the epoch, leaves batches in the window, in the accumulator, in channels or in a
//! read that failed. [`WindowPins`] travels with the batch and records exactly the occurrences
//! whose pins are still held, so that dropping it (wherever the batch is dropped, on whichever
//! thread) hands those, and only those, to [`FeatureTiers::unpin_window`]:
//!
//! | the batch was | pins still held | released on drop |
//! |---|---|---|
//! | pinned | every cacheable occurrence | all of them |
//! | served (`unpin = true`) | the cacheable misses | the misses' |
//! | admitted (`unpin = true`) | none | nothing |

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

    /// Serves the batch from memory ([`FeatureTiers::serve`] with `unpin = true`): copies its
    /// memory rows into `out` and returns what is left (disk misses, device rows) and the
    /// misses' nodes. The hits have released their pins; the misses' pins stay held until
    /// [`WindowPins::admit`].
    pub(super) fn serve(&mut self, nodes: &[u32], out: &mut [u8]) -> (Lookup, Vec<u32>) {
        let lookup = self.tiers.serve(nodes, out, true);
        let miss_nodes: Vec<u32> = lookup.misses.iter().map(|&i| nodes[i as usize]).collect();
        self.held = self.tiers.pinnable(&miss_nodes);
        (lookup, miss_nodes)
    }

    /// The batch's misses were read: offers them to the cache ([`FeatureTiers::admit`] with
    /// `unpin = true`, `miss_nodes` and `rows` as [`WindowPins::serve`] and the read produced
    /// them), which releases every pin the batch still held.
    pub(super) fn admit(mut self, miss_nodes: &[u32], rows: &[u8]) {
        debug_assert_eq!(
            self.tiers.pinnable(miss_nodes),
            self.held,
            "admitted rows are the served misses"
        );
        self.tiers.admit(miss_nodes, rows, true);
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
