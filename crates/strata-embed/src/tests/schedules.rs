//! The learning-rate schedule and early stopping through whole training jobs: killed and
//! resumed runs continue them exactly, and a stopped run stays stopped until its config says
//! otherwise.

use std::path::Path;

use crate::config::{LrScheduler, ThresholdMode, TrainConfig, Which};
use crate::ordering::OrderingKind;
use crate::run::run_dir::{EpochRecord, Run, RunMeta};
use crate::train::job::train;
use strata_store::NoProgress;

use super::train_eval::make_store;

/// Reduce on plateau with a threshold no small graph's MRR keeps beating, so the rate drops
/// within a few epochs; out of core (4 partitions, 3 resident) on one thread (deterministic).
fn plateau(epochs: usize) -> TrainConfig {
    TrainConfig {
        dim: 16,
        chunk_size: 100,
        negatives: 50,
        epochs,
        partitions: 4,
        buffer: 3,
        ordering: OrderingKind::Legend,
        threads: 1,
        memory: strata_store::config::Size(256 << 20),
        lr: 0.2,
        lr_scheduler: LrScheduler::ReduceOnPlateau,
        lr_factor: 0.5,
        lr_patience: 0,
        lr_threshold: 0.2,
        lr_threshold_mode: ThresholdMode::Rel,
        ..TrainConfig::default()
    }
}

fn run(store: &Path, dir: &Path, cfg: TrainConfig) -> RunMeta {
    train(store, dir, cfg, false, None, &NoProgress, &mut |_| {}).unwrap()
}

/// An epoch's rate, the rate its validation dropped it to, its stop and its validation MRR.
type Decided = (Option<f64>, Option<f64>, Option<String>, f64);

/// What the schedule decided, epoch by epoch.
fn decisions(history: &[EpochRecord]) -> Vec<Decided> {
    history
        .iter()
        .map(|r| {
            let mrr = r.valid.as_ref().unwrap().mrr;
            (r.lr, r.lr_dropped_to, r.stopped.clone(), mrr)
        })
        .collect()
}

#[test]
fn a_resumed_run_continues_the_learning_rate_schedule_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path(), 300, 4, 6000);
    let (whole, split) = (dir.path().join("whole"), dir.path().join("split"));
    let a = run(&store, &whole, plateau(6));
    let rates: Vec<f64> = a.history.iter().map(|r| r.lr.unwrap()).collect();
    assert_eq!(rates[0], 0.2);
    assert!(
        rates.windows(2).any(|w| w[1] < w[0]),
        "the rate never dropped: {:?}",
        decisions(&a.history)
    );
    // Each epoch trains at the rate the one before left.
    for w in a.history.windows(2) {
        assert_eq!(w[1].lr, w[0].lr_dropped_to.or(w[0].lr));
    }
    // Killed after epoch 3 (a job of 3 epochs), then resumed to 6: the same decisions, rates
    // and table as the run that went through.
    let first = run(&store, &split, plateau(3));
    assert_eq!(first.history.len(), 3);
    let b = run(&store, &split, plateau(6));
    assert_eq!(decisions(&b.history), decisions(&a.history));
    assert_eq!(b.schedule, a.schedule);
    let table = |dir: &Path| {
        let r = Run::open(dir).unwrap();
        std::fs::read(r.table_path(&r.checkpoint(Which::Last).table)).unwrap()
    };
    assert!(table(&whole) == table(&split), "the resumed table differs");
}

#[test]
fn early_stopping_ends_the_run_and_a_resume_keeps_it_stopped_unless_the_config_lets_it_go_on() {
    let dir = tempfile::tempdir().unwrap();
    let store = make_store(dir.path(), 300, 4, 6000);
    let out = dir.path().join("run");
    // An MRR no small run reaches: after more than 2 epochs it stops, at its next validation.
    let cfg = TrainConfig {
        lr_scheduler: LrScheduler::None,
        early_stopping_threshold_epochs: 2,
        early_stopping_threshold_mrr: 0.99,
        ..plateau(6)
    };
    let meta = run(&store, &out, cfg.clone());
    assert_eq!(meta.current.epoch, 3);
    let why = meta.history[2].stopped.clone().unwrap();
    assert!(why.contains("early_stopping_threshold_mrr"), "{why}");
    assert_eq!(meta.schedule.as_ref().unwrap().stopped, Some(why));
    // The best checkpoint was tested all the same.
    assert!(meta.test.is_some());
    // Resumed as it was: nothing to train.
    assert_eq!(run(&store, &out, cfg.clone()).current.epoch, 3);
    // Without the threshold it goes on to its last epoch.
    let on = TrainConfig {
        early_stopping_threshold_mrr: 0.0,
        ..cfg
    };
    let meta = run(&store, &out, on);
    assert_eq!(meta.current.epoch, 6);
    assert_eq!(meta.schedule.unwrap().stopped, None);
}
