//! Which epochs a training job still runs, which of them validate, and what each validation
//! decides: the learning rate of the epochs after it (reduce on plateau) and whether training
//! stops early. A run's resume point is the number of epochs its last commit holds (`run.json`'s
//! current checkpoint): an epoch is trained whole or not at all, so a job killed part-way
//! resumes at the start of the epoch it was in. Within an epoch the buckets' edges are read in
//! pieces (`piece_rows`) and trained in chunks (`chunk_size`), neither of which is a resume
//! point. The schedule's state is committed with each epoch ([`ScheduleState`] in `run.json`),
//! so a resumed run continues it exactly.

use serde::{Deserialize, Serialize};

use crate::config::{LrScheduler, ThresholdMode, TrainConfig};

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

/// PyTorch's `eps` of ReduceLROnPlateau: a drop smaller than this is not made.
const PLATEAU_EPS: f64 = 1e-8;

/// The learning-rate schedule and early stopping as a run carries them from one validation to
/// the next (`run.json`'s `schedule`). The plateau fields are PyTorch's ReduceLROnPlateau's
/// (`best`, `num_bad_epochs`, `cooldown_counter`) counted in validations, as LibKGE steps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleState {
    /// The rate the next epoch trains with.
    pub lr: f64,
    /// The configured `lr` the rate started from: a resumed run given another `lr` starts the
    /// rate again from that one.
    pub base_lr: f32,
    /// The best validation MRR by the plateau's threshold rule (None before the first
    /// validation: PyTorch's `-inf`).
    pub plateau_best: Option<f64>,
    /// Validations in a row that did not beat `plateau_best` (PyTorch's `num_bad_epochs`).
    pub bad_validations: usize,
    /// Validations left in the cooldown after a drop (PyTorch's `cooldown_counter`).
    pub cooldown: usize,
    /// Validations since the best validation MRR (the `best` checkpoint's): early stopping's
    /// count, LibKGE's.
    pub since_best: usize,
    /// Why training stopped before its last epoch, once it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// What a validation decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The rate dropped from `.0` to `.1`.
    pub lr_drop: Option<(f64, f64)>,
    /// Training stops here, for this reason.
    pub stop: Option<String>,
}

impl ScheduleState {
    /// A new run's schedule: the configured rate, nothing validated yet.
    pub fn new(cfg: &TrainConfig) -> ScheduleState {
        ScheduleState {
            lr: decimal(cfg.lr),
            base_lr: cfg.lr,
            plateau_best: None,
            bad_validations: 0,
            cooldown: 0,
            since_best: 0,
            stopped: None,
        }
    }

    /// The schedule a resumed run continues with under `cfg`: `prior` as committed (a run
    /// committed before schedules were saved starts one), the rate started again from a changed
    /// `lr`, and a stop kept only while `cfg` still asks for it after `epochs_done` epochs
    /// (a run stopped early resumes when given a larger patience, say).
    pub fn resumed(
        prior: Option<ScheduleState>,
        cfg: &TrainConfig,
        epochs_done: usize,
        best_mrr: Option<f64>,
    ) -> ScheduleState {
        let mut s = prior.unwrap_or_else(|| ScheduleState::new(cfg));
        if s.base_lr != cfg.lr {
            s.lr = decimal(cfg.lr);
            s.base_lr = cfg.lr;
        }
        if s.stopped.is_some() {
            s.stopped = s.stop_reason(cfg, epochs_done, best_mrr);
        }
        s
    }

    /// Steps the schedule with a validation after `epochs_done` epochs: its MRR `mrr`, whether
    /// it became the best checkpoint (`improved`, strictly above the best before it) and the
    /// best MRR since (`best_mrr`, this one's when it improved).
    pub fn validated(
        &mut self,
        cfg: &TrainConfig,
        epochs_done: usize,
        mrr: f64,
        improved: bool,
        best_mrr: f64,
    ) -> Decision {
        let lr_drop = match cfg.lr_scheduler {
            LrScheduler::None => None,
            LrScheduler::ReduceOnPlateau => self.plateau_step(cfg, mrr),
        };
        self.since_best = if improved { 0 } else { self.since_best + 1 };
        self.stopped = self
            .stop_reason(cfg, epochs_done, Some(best_mrr))
            .filter(|_| epochs_done < cfg.epochs);
        Decision {
            lr_drop,
            stop: self.stopped.clone(),
        }
    }

    /// PyTorch's `ReduceLROnPlateau.step(mrr)` in mode max; returns the drop it made.
    fn plateau_step(&mut self, cfg: &TrainConfig, mrr: f64) -> Option<(f64, f64)> {
        if plateau_better(cfg, mrr, self.plateau_best) {
            self.plateau_best = Some(mrr);
            self.bad_validations = 0;
        } else {
            self.bad_validations += 1;
        }
        if self.cooldown > 0 {
            self.cooldown -= 1;
            self.bad_validations = 0;
        }
        if self.bad_validations <= cfg.lr_patience {
            return None;
        }
        self.cooldown = cfg.lr_cooldown;
        self.bad_validations = 0;
        let old = self.lr;
        let new = (old * cfg.lr_factor).max(cfg.lr_min);
        (old - new > PLATEAU_EPS).then(|| {
            self.lr = new;
            (old, new)
        })
    }

    /// LibKGE's early-stopping checks after `epochs_done` epochs with best validation MRR
    /// `best_mrr`: no improvement on the best in the last `early_stopping_patience`
    /// validations, or a best still below `early_stopping_threshold_mrr` after more than
    /// `early_stopping_threshold_epochs` epochs.
    fn stop_reason(
        &self,
        cfg: &TrainConfig,
        epochs_done: usize,
        best_mrr: Option<f64>,
    ) -> Option<String> {
        let best = best_mrr.unwrap_or(0.0);
        let patience = cfg.early_stopping_patience;
        if patience > 0 && self.since_best >= patience {
            return Some(format!(
                "validation MRR did not improve on its best ({best:.4}) in the last {patience} validations (early_stopping_patience)"
            ));
        }
        let target = cfg.early_stopping_threshold_mrr;
        if epochs_done > cfg.early_stopping_threshold_epochs && target > best {
            return Some(format!(
                "best validation MRR {best:.4} is below early_stopping_threshold_mrr {target} after {epochs_done} epochs"
            ));
        }
        None
    }
}

/// The configured rate as the decimal the user wrote (0.1, not f32's 0.10000000149...), so the
/// schedule's arithmetic is PyTorch's on that number; the kernels get it back as the same f32.
fn decimal(lr: f32) -> f64 {
    lr.to_string().parse().unwrap_or(f64::from(lr))
}

/// PyTorch's `_is_better` in mode max: `mrr` beats `best` (None: `-inf`) by the threshold.
fn plateau_better(cfg: &TrainConfig, mrr: f64, best: Option<f64>) -> bool {
    let Some(best) = best else {
        return true;
    };
    match cfg.lr_threshold_mode {
        ThresholdMode::Rel => mrr > best * (cfg.lr_threshold + 1.0),
        ThresholdMode::Abs => mrr > best + cfg.lr_threshold,
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

    fn plateau(patience: usize, cooldown: usize) -> TrainConfig {
        TrainConfig {
            lr: 1.0,
            lr_scheduler: LrScheduler::ReduceOnPlateau,
            lr_factor: 0.5,
            lr_patience: patience,
            lr_cooldown: cooldown,
            lr_threshold: 0.0,
            epochs: 100,
            ..TrainConfig::default()
        }
    }

    /// The rates after each validation of `mrrs` (the best checkpoint's rule: strictly above).
    fn rates(cfg: &TrainConfig, mrrs: &[f64]) -> Vec<f64> {
        let mut s = ScheduleState::new(cfg);
        let mut best: Option<f64> = None;
        mrrs.iter()
            .enumerate()
            .map(|(i, &m)| {
                let improved = best.is_none_or(|b| m > b);
                if improved {
                    best = Some(m);
                }
                s.validated(cfg, i + 1, m, improved, best.unwrap());
                s.lr
            })
            .collect()
    }

    #[test]
    fn the_rate_drops_after_more_than_patience_bad_validations_as_pytorchs_plateau() {
        // Patience 1: the second bad validation in a row drops the rate, and the count
        // starts again.
        let c = plateau(1, 0);
        let m = [0.1, 0.2, 0.2, 0.15, 0.3, 0.3, 0.3, 0.3, 0.3];
        assert_eq!(
            rates(&c, &m),
            [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.125]
        );
        // Cooldown 2: the two validations after a drop count as good.
        let c = plateau(0, 2);
        let m = [0.1, 0.1, 0.1, 0.1, 0.1, 0.1];
        assert_eq!(rates(&c, &m), [1.0, 0.5, 0.5, 0.5, 0.25, 0.25]);
        // The floor, and PyTorch's eps: a drop smaller than 1e-8 is not made.
        let c = TrainConfig {
            lr_min: 0.3,
            ..plateau(0, 0)
        };
        assert_eq!(rates(&c, &[0.1, 0.1, 0.1, 0.1]), [1.0, 0.5, 0.3, 0.3]);
        // Without a scheduler the rate stays.
        let c = TrainConfig {
            lr_scheduler: LrScheduler::None,
            ..plateau(0, 0)
        };
        assert_eq!(rates(&c, &[0.1, 0.1, 0.1]), [1.0, 1.0, 1.0]);
    }

    #[test]
    fn the_threshold_decides_what_counts_as_better() {
        let rel = TrainConfig {
            lr_threshold: 0.1,
            ..plateau(0, 0)
        };
        // 0.21 is not 10% above 0.2 (relative): bad, the rate drops.
        assert_eq!(rates(&rel, &[0.2, 0.21]), [1.0, 0.5]);
        assert_eq!(rates(&rel, &[0.2, 0.23]), [1.0, 1.0]);
        let abs = TrainConfig {
            lr_threshold_mode: ThresholdMode::Abs,
            lr_threshold: 0.05,
            ..plateau(0, 0)
        };
        assert_eq!(rates(&abs, &[0.2, 0.24]), [1.0, 0.5]);
        assert_eq!(rates(&abs, &[0.2, 0.26]), [1.0, 1.0]);
    }

    #[test]
    fn early_stopping_counts_validations_since_the_best_as_libkge() {
        let c = TrainConfig {
            early_stopping_patience: 2,
            epochs: 10,
            ..TrainConfig::default()
        };
        let mut s = ScheduleState::new(&c);
        assert_eq!(s.validated(&c, 1, 0.2, true, 0.2).stop, None);
        assert_eq!(s.validated(&c, 2, 0.1, false, 0.2).stop, None);
        // An equal MRR is no improvement (the best checkpoint's rule).
        let d = s.validated(&c, 3, 0.2, false, 0.2);
        assert!(d.stop.unwrap().contains("last 2 validations"));
        // A stop at the last epoch is no early stop.
        let mut s = ScheduleState::new(&c);
        s.since_best = 5;
        assert_eq!(s.validated(&c, 10, 0.1, false, 0.2).stop, None);
        // The threshold: after more than 3 epochs the best must reach 0.25.
        let t = TrainConfig {
            early_stopping_threshold_epochs: 3,
            early_stopping_threshold_mrr: 0.25,
            epochs: 10,
            ..TrainConfig::default()
        };
        let mut s = ScheduleState::new(&t);
        assert_eq!(s.validated(&t, 3, 0.2, true, 0.2).stop, None);
        assert!(s
            .validated(&t, 4, 0.24, true, 0.24)
            .stop
            .unwrap()
            .contains("below early_stopping_threshold_mrr"));
        assert_eq!(
            ScheduleState::new(&t).validated(&t, 4, 0.3, true, 0.3).stop,
            None
        );
    }

    #[test]
    fn a_resumed_schedule_keeps_its_state_restarts_a_changed_rate_and_rechecks_a_stop() {
        let c = TrainConfig {
            early_stopping_patience: 1,
            ..plateau(0, 0)
        };
        let mut s = ScheduleState::new(&c);
        s.validated(&c, 1, 0.2, true, 0.2);
        s.validated(&c, 2, 0.1, false, 0.2);
        assert_eq!(s.lr, 0.5);
        assert!(s.stopped.is_some());
        let same = ScheduleState::resumed(Some(s.clone()), &c, 2, Some(0.2));
        assert_eq!(same, s);
        // A larger patience lets the stopped run go on, with its rate.
        let patient = TrainConfig {
            early_stopping_patience: 3,
            ..c.clone()
        };
        let on = ScheduleState::resumed(Some(s.clone()), &patient, 2, Some(0.2));
        assert_eq!((on.stopped, on.lr), (None, 0.5));
        // Another lr starts the rate again from it.
        let faster = TrainConfig { lr: 2.0, ..patient };
        assert_eq!(
            ScheduleState::resumed(Some(s), &faster, 2, Some(0.2)).lr,
            2.0
        );
        // A run committed before schedules were saved starts one.
        assert_eq!(
            ScheduleState::resumed(None, &c, 2, None),
            ScheduleState::new(&c)
        );
    }
}
