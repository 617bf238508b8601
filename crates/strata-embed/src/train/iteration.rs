//! Which epochs a training job still runs, and which of them validate. A run's resume point
//! is the number of epochs its last commit holds (`run.json`'s current checkpoint): an epoch
//! is trained whole or not at all, so a job killed part-way resumes at the start of the epoch
//! it was in. Within an epoch the buckets' edges are read in pieces (`piece_rows`) and trained
//! in chunks (`chunk_size`), neither of which is a resume point.

/// One epoch to train: its number (from 0) and whether it ends with a validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Iteration {
    pub epoch: usize,
    /// Validation is due after this epoch (when the store has a validation split): every
    /// `eval_every` epochs, and after the last.
    pub validate: bool,
}

/// The epochs of a job from its resume point on.
#[derive(Debug, Clone, Copy)]
pub struct IterationManager {
    /// Epochs the run is configured for in all.
    epochs: usize,
    /// Validation every this many epochs (0: none; the last epoch validates if any does).
    eval_every: usize,
    /// Epochs already committed: the first to train.
    start: usize,
}

impl IterationManager {
    /// A job of `epochs` epochs validating every `eval_every`, of which `committed` are done.
    pub fn new(epochs: usize, eval_every: usize, committed: usize) -> IterationManager {
        IterationManager {
            epochs,
            eval_every,
            start: committed,
        }
    }

    /// Epochs in all.
    pub fn epochs(&self) -> usize {
        self.epochs
    }

    /// The first epoch this job trains (the epochs its run has committed).
    pub fn start(&self) -> usize {
        self.start
    }

    /// Whether any epoch is left to train.
    pub fn remaining(&self) -> bool {
        self.start < self.epochs
    }

    /// Whether validation is due after `epoch` (numbered from 0).
    pub fn validation_due(&self, epoch: usize) -> bool {
        (epoch + 1).is_multiple_of(self.eval_every.max(1)) || epoch + 1 == self.epochs
    }

    /// The epochs left, in order.
    pub fn iter(&self) -> impl Iterator<Item = Iteration> + '_ {
        (self.start..self.epochs).map(|epoch| Iteration {
            epoch,
            validate: self.validation_due(epoch),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn epochs(m: &IterationManager) -> Vec<(usize, bool)> {
        m.iter().map(|i| (i.epoch, i.validate)).collect()
    }

    #[test]
    fn a_fresh_job_trains_every_epoch_and_validates_every_eval_every_and_the_last() {
        let m = IterationManager::new(5, 2, 0);
        assert!(m.remaining());
        assert_eq!(
            epochs(&m),
            [(0, false), (1, true), (2, false), (3, true), (4, true)]
        );
        // eval_every = 0 still marks the epochs (every one); the job validates only when it
        // has a validation set, which eval_every = 0 leaves out.
        assert!(IterationManager::new(3, 0, 0).iter().all(|i| i.validate));
    }

    #[test]
    fn a_resumed_job_starts_after_the_committed_epochs() {
        let m = IterationManager::new(5, 3, 2);
        assert_eq!(m.start(), 2);
        assert_eq!(epochs(&m), [(2, true), (3, false), (4, true)]);
        // Done, or configured for fewer epochs than committed: nothing left.
        for committed in [5, 7] {
            let m = IterationManager::new(5, 3, committed);
            assert!(!m.remaining());
            assert_eq!(m.iter().count(), 0);
        }
    }
}
