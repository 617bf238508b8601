//! What a training job saves, when, and where it resumes from (the run directory's format is
//! [`crate::run::run_dir`]'s). A run keeps three table files: the current checkpoint's, the best
//! one's and a spare. Epoch `E` reads the current table and writes the spare (or, written
//! behind, the job writes it beside validation: [`crate::storage::write_behind`]); once it is
//! synced, the epoch's relations are saved and `run.json` is committed with the spare as the
//! current checkpoint `E + 1` (and as the best when validation improved), so a kill at any
//! point leaves the last commit intact and a restart resumes after it. In owner mode every
//! rank first marks its part of `E + 1` prepared, and adopts rank 0's commit as its own.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use strata_io::progress::{Meter, Progress};
use strata_io::Engine;
use strata_store::units::fmt_bytes;
use strata_store::Store;

use crate::config::{OptimizerKind, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::eval::Metrics;
use crate::model::ScoreModel;
use crate::run::run_dir::{is_run, sync_dir, Checkpoint, EpochRecord, Run, RunMeta};
use crate::storage::buffer::PartitionBuffer;
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::Partitioning;
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;
use crate::storage::write_behind::Written;
use crate::train::dist::{owner_of, RankReport, TableCrc};
use crate::train::epoch::{EpochReport, Interval, Timeline, WrittenBehind};
use crate::train::iteration::ScheduleState;
use crate::train::owner::{self, Commit};

/// What an epoch's training hands its commit: the (group's) report, this rank's timeline,
/// and in a distributed run every rank's report and the CRC-32s of the table it started from
/// and ended with.
pub struct Trained {
    pub report: EpochReport,
    pub timeline: Vec<Interval>,
    pub ranks: Option<Vec<RankReport>>,
    pub table_crc: Option<TableCrc>,
}

impl Trained {
    /// Adds the write of the epoch's table behind the job (`written`; the epoch's timeline
    /// starts at `origin`, its last buffer state is `step`) to the report and timeline: its
    /// bytes, its seconds, and the wait of a commit that was ready at `ready`.
    pub(crate) fn add_written_behind(
        &mut self,
        written: &Written,
        origin: Instant,
        step: usize,
        ready: Instant,
    ) {
        let wait = written.finished.saturating_duration_since(ready);
        let report = &mut self.report;
        report.partition_bytes_written += written.bytes;
        report.written_behind = Some(WrittenBehind {
            seconds: (written.finished - written.started).as_secs_f64(),
            wait_seconds: wait.as_secs_f64(),
        });
        let mut tl = Timeline {
            origin,
            events: std::mem::take(&mut self.timeline),
        };
        tl.add(
            "io",
            step,
            written.started,
            written.finished,
            "write-behind",
        );
        if !wait.is_zero() {
            tl.add("wait", step, ready, written.finished, "write-behind");
        }
        self.timeline = tl.events;
    }
}

/// The tables of one epoch: it reads `current` and writes `next`, the file `spare` names.
pub struct EpochTables {
    pub current: Arc<TableFile>,
    pub next: Arc<TableFile>,
    pub spare: &'static str,
}

/// The run being trained, and when each of its files is written.
pub struct CheckpointManager {
    pub run: Run,
}

impl CheckpointManager {
    /// The tables of the epoch after the current checkpoint.
    pub fn tables(&self, engine: &Arc<Engine>) -> Result<EpochTables> {
        let run = &self.run;
        let spare = run.meta.spare();
        Ok(EpochTables {
            current: Arc::new(TableFile::open(
                engine,
                &run.table_path(&run.meta.current.table),
                false,
            )?),
            next: Arc::new(TableFile::open(engine, &run.table_path(spare), false)?),
            spare,
        })
    }

    /// Saves `relations` as the relation files of the checkpoint after `epoch`.
    pub fn save_relations(&self, epoch: usize, relations: &Relations) -> Result<()> {
        let (rp, sp) = self.run.relation_paths(epoch + 1);
        relations.save(&rp, &sp)
    }

    /// Owner mode: this rank's directory holds all of the checkpoint after `epoch` (its part of
    /// the table in `spare`, synced by the epoch) but the commit: saves the relations and marks
    /// the checkpoint prepared.
    pub fn prepare(&self, epoch: usize, spare: &str, relations: &Relations) -> Result<()> {
        self.save_relations(epoch, relations)?;
        let ckpt = Checkpoint {
            epoch: epoch + 1,
            table: spare.to_string(),
        };
        owner::prepare(&self.run, &ckpt)
    }

    /// Commits epoch `epoch`, whose table is `spare`, with its validation metrics `valid`
    /// (`validating`: the job validates at all) and what they decide for the rate of the
    /// epochs after it and whether training stops ([`ScheduleState`], under the run's config);
    /// returns the epoch's record, also appended to the run's logs. Test metrics belong to a
    /// finished run's best checkpoint: training on drops them.
    pub fn commit_epoch(
        &mut self,
        epoch: usize,
        spare: &str,
        trained: Trained,
        valid: Option<Metrics>,
        validating: bool,
    ) -> Result<EpochRecord> {
        let ckpt = Checkpoint {
            epoch: epoch + 1,
            table: spare.to_string(),
        };
        let meta = &mut self.run.meta;
        let improved = improves(valid.as_ref(), meta.best_mrr, validating);
        meta.current = ckpt.clone();
        if improved {
            meta.best = ckpt;
            meta.best_mrr = valid.as_ref().map(|m| m.mrr);
        }
        let schedule = meta
            .schedule
            .get_or_insert_with(|| ScheduleState::new(&meta.config));
        let lr = schedule.lr;
        let decision = match (&valid, meta.best_mrr) {
            (Some(m), Some(best)) => {
                Some(schedule.validated(&meta.config, epoch + 1, m.mrr, improved, best))
            }
            _ => None,
        };
        let (lr_dropped_to, stopped) =
            decision.map_or((None, None), |d| (d.lr_drop.map(|(_, new)| new), d.stop));
        let record = EpochRecord {
            report: trained.report,
            valid,
            best: improved,
            ranks: trained.ranks,
            table_crc: trained.table_crc,
            lr: Some(lr),
            lr_dropped_to,
            stopped,
        };
        meta.history.push(record.clone());
        meta.test = None;
        self.run.commit()?;
        self.run.append_logs(&record, &trained.timeline)?;
        Ok(record)
    }

    /// Owner mode, a rank other than 0: writes rank 0's `commit` of the epoch as this rank's
    /// own, and the epoch's record with this rank's `timeline` to its logs.
    pub fn adopt(&mut self, commit: &Commit, timeline: &[Interval]) -> Result<()> {
        commit.apply(&mut self.run.meta);
        self.run.commit()?;
        owner::clear_prepared(&self.run);
        if let Some(record) = &commit.record {
            self.run.append_logs(record, timeline)?;
        }
        Ok(())
    }

    /// A rank other than 0 sharing rank 0's run directory: reads the run as rank 0 committed it.
    pub fn reopen(&mut self) -> Result<()> {
        self.run = Run::open(&self.run.dir)?;
        Ok(())
    }

    /// Records the best checkpoint's test metrics.
    pub fn commit_test(&mut self, test: Metrics) -> Result<()> {
        self.run.meta.test = Some(test);
        self.run.commit()
    }
}

/// Whether an epoch with validation metrics `valid` becomes the best checkpoint, the best so
/// far having validation MRR `best_mrr`. Without validation (`validating` false) the latest
/// checkpoint is the best one known.
pub fn improves(valid: Option<&Metrics>, best_mrr: Option<f64>, validating: bool) -> bool {
    match (valid, best_mrr) {
        (Some(m), Some(best)) => m.mrr > best,
        (Some(_), None) => true,
        (None, _) => !validating,
    }
}

/// Fields that shape the stored state: a resumed run must keep them.
pub fn same_shape(a: &TrainConfig, b: &TrainConfig) -> Option<&'static str> {
    let checks: [(&'static str, bool); 14] = [
        ("model", a.model == b.model),
        ("operator", a.pbg_form().operator == b.pbg_form().operator),
        (
            "comparator",
            a.pbg_form().comparator == b.pbg_form().comparator,
        ),
        ("dim", a.dim == b.dim),
        ("transe_norm", a.transe_norm == b.transe_norm),
        ("optimizer", a.optimizer == b.optimizer),
        ("table_dtype", a.table_dtype == b.table_dtype),
        ("reciprocal", a.reciprocal == b.reciprocal),
        ("seed", a.seed == b.seed),
        ("init_from", a.init_from == b.init_from),
        ("entity_types", a.entity_types == b.entity_types),
        (
            "entity_partitions",
            a.entity_partitions == b.entity_partitions,
        ),
        ("featurized", a.featurized == b.featurized),
        (
            "partitions",
            a.partitions == 0 || b.partitions == 0 || a.partitions == b.partitions,
        ),
    ];
    checks.iter().find(|(_, same)| !same).map(|(name, _)| *name)
}

/// Where this rank stands in its group when it opens its run: `owner` is its rank in owner
/// mode (its run holds only the partitions it owns), of `world_size` ranks.
#[derive(Debug, Clone, Copy)]
pub struct Seat {
    pub owner: Option<usize>,
    pub world_size: usize,
}

/// The run in `run_dir` to resume (unless `fresh`), checked against `cfg` (whose partitions it
/// then takes), this rank's `seat` and `store` (opened from `store_path`); None when there is
/// none to resume.
pub fn open_prior(
    run_dir: &Path,
    store_path: &Path,
    cfg: &mut TrainConfig,
    fresh: bool,
    seat: Seat,
    store: &Store,
) -> Result<Option<Run>> {
    if !is_run(run_dir) || fresh {
        return Ok(None);
    }
    let run = Run::open(run_dir)?;
    if let Some(field) = same_shape(&run.meta.config, cfg) {
        return Err(EmbedError::Config(format!(
            "run {} was trained with a different embed.train.{field}; pass --fresh to start over or choose another --run-dir",
            run_dir.display()
        )));
    }
    if seat.owner.is_some()
        && (run.meta.owner_rank != seat.owner || run.meta.world_size != seat.world_size)
    {
        return Err(EmbedError::Config(format!(
            "run {} holds the partitions of rank {:?} of {} (owner mode); resume it with the same ranks, or pass --fresh",
            run_dir.display(),
            run.meta.owner_rank,
            run.meta.world_size
        )));
    }
    if run.store()?.path().canonicalize().ok() != store.path().canonicalize().ok() {
        return Err(EmbedError::Config(format!(
            "run {} belongs to store {}, not {}",
            run_dir.display(),
            run.meta.store.display(),
            store_path.display()
        )));
    }
    let held = run.meta.partitioning.partitions;
    // 0 is auto, which the run resolved when it started; another count would be ignored.
    if cfg.partitions != 0 && cfg.partitions != held {
        return Err(EmbedError::Config(format!(
            "run {} holds {held} partition(s), not the {} asked for; resume it without --partitions, or pass --fresh to repartition",
            run_dir.display(),
            cfg.partitions
        )));
    }
    cfg.partitions = held;
    Ok(Some(run))
}

/// An I/O error on the run directory `dir`.
fn dir_error(dir: &Path, op: &'static str, e: std::io::Error) -> EmbedError {
    EmbedError::Store(strata_store::StoreError::Io(strata_io::IoError::os(
        op, dir, 0, e,
    )))
}

/// Whether `name` is a file a run writes into its directory.
fn ours(name: &str) -> bool {
    name.starts_with("run.json")
        || name == "metrics.jsonl"
        || name == "timeline.jsonl"
        || name.starts_with("table-")
        || name.starts_with("relations-e")
        || name.starts_with("relation_state-e")
        || name.starts_with("prepared-e")
        || name.starts_with("events.out.tfevents")
}

/// Empties `dir` of a run's files before a new run is created in it; refuses a directory that
/// is no run and holds other files.
fn clear_for_new_run(dir: &Path) -> Result<()> {
    if !dir.exists() {
        return Ok(());
    }
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map_err(|e| dir_error(dir, "list", e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    // A directory that is no run yet holds only a run's files is a creation (or a --fresh
    // restart) killed before its first commit: starting again is what the user asked for.
    if !is_run(dir) && names.iter().any(|n| !ours(n)) {
        return Err(EmbedError::Config(format!(
            "{} exists and is not a run directory; choose an empty or new --run-dir",
            dir.display()
        )));
    }
    // run.json goes first: from then on the directory is no run, and a kill part-way
    // through leaves only files that the next start removes.
    names.sort_by_key(|n| n != "run.json");
    for name in names.iter().filter(|n| ours(n)) {
        std::fs::remove_file(dir.join(name)).map_err(|e| dir_error(dir, "remove", e))?;
    }
    Ok(())
}

/// A new run's settings: its store, config, model, partitioning and table layout, and in
/// owner mode `(rank, world_size)`.
pub struct NewRun<'a> {
    pub store: &'a Store,
    pub cfg: &'a TrainConfig,
    pub model: &'a ScoreModel,
    pub partitioning: Partitioning,
    pub layout: TableLayout,
    pub owned: Option<(usize, usize)>,
}

/// Creates a new run in `dir`: initial table and relations, committed as epoch 0. With
/// `owned = (rank, world_size)` (owner mode) only that rank's partitions (and a typed run's
/// pinned region) are initialised; the others' regions stay holes of the full-sized files.
pub fn create(
    dir: &Path,
    new: NewRun,
    buffer: &mut PartitionBuffer,
    progress: &dyn Progress,
) -> Result<Run> {
    clear_for_new_run(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| dir_error(dir, "mkdir", e))?;
    let graph = &new.store.manifest().graph;
    let table_bytes = new.layout.table_bytes(new.partitioning.partitions);
    progress.message(&format!(
        "new run {}: {} nodes x {} dims ({:?}), table {} per checkpoint file",
        dir.display(),
        graph.num_nodes,
        new.cfg.dim,
        new.cfg.optimizer,
        fmt_bytes(table_bytes)
    ));
    create_tables(dir, buffer.engine(), table_bytes, new.owned.is_some())?;
    init_table(dir, &new, buffer, progress)?;
    let cfg = new.cfg;
    let run = Run {
        dir: dir.to_path_buf(),
        meta: RunMeta::fresh(new.store, cfg.clone(), new.partitioning, new.layout)?,
    };
    let relations = Relations::new(
        new.model,
        graph.num_relations,
        cfg.reciprocal,
        cfg.optimizer == OptimizerKind::AdagradRow,
        cfg.seed,
        cfg.row_init(),
    );
    let (rp, sp) = run.relation_paths(0);
    relations.save(&rp, &sp)?;
    sync_dir(dir)?;
    Ok(run)
}

/// Creates the run's three table files, `full` (owner mode) at their whole size from the
/// start, so that a table whose last partitions are another owner's (holes) has the size
/// every reader checks.
fn create_tables(dir: &Path, engine: &Arc<Engine>, table_bytes: u64, full: bool) -> Result<()> {
    for name in ["table-0.bin", "table-1.bin", "table-2.bin"] {
        let path = dir.join(name);
        TableFile::open(engine, &path, true)?;
        if full {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_len(table_bytes))
                .map_err(|e| dir_error(dir, "resize", e))?;
        }
    }
    Ok(())
}

/// Initialises the partitions of the first table (in owner mode this rank's only, and a typed
/// run's pinned region, which every rank holds) through the buffer's slots, and syncs it.
fn init_table(
    dir: &Path,
    new: &NewRun,
    buffer: &mut PartitionBuffer,
    progress: &dyn Progress,
) -> Result<()> {
    let first = TableFile::open(buffer.engine(), &dir.join("table-0.bin"), false)?;
    let p = &new.partitioning;
    let table_rows = p.regions().iter().map(|&part| p.stored_rows(part)).sum();
    let draw = new.cfg.row_init().reals(table_rows, new.cfg.dim);
    let mine = |part| {
        let owns = |(rank, world)| owner_of(part, world) == rank || p.pinned() == Some(part);
        new.owned.is_none_or(owns)
    };
    let parts: Vec<u32> = p.regions().into_iter().filter(|&part| mine(part)).collect();
    // The bar counts the rows drawn and the bytes written.
    let (rows, bytes) = parts.iter().fold((0, 0), |(r, b), &part| {
        (r + p.stored_rows(part), b + new.layout.region_bytes(part))
    });
    let mut meter = Meter::new(progress, "init table", bytes, rows);
    for part in parts {
        let rows = p.stored_rows(part);
        buffer.init(&first, part, rows, (draw, new.cfg.seed), new.cfg.threads)?;
        meter.add(rows, new.layout.region_bytes(part))?;
    }
    first.sync()?;
    meter.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Protocol;

    fn metrics(mrr: f64) -> Metrics {
        Metrics {
            split: "valid".into(),
            protocol: Protocol::Filtered,
            queries: 10,
            mrr,
            mr: 1.0 / mrr.max(1e-9),
            hits_at_1: mrr,
            hits_at_3: mrr,
            hits_at_10: mrr,
            tail_mrr: None,
            head_mrr: None,
            seconds: 0.0,
        }
    }

    #[test]
    fn an_epoch_is_the_best_when_its_validation_improves_or_nothing_validates() {
        assert!(improves(Some(&metrics(0.3)), Some(0.2), true));
        assert!(!improves(Some(&metrics(0.2)), Some(0.2), true));
        assert!(!improves(Some(&metrics(0.1)), Some(0.2), true));
        // The first validated epoch is the best so far.
        assert!(improves(Some(&metrics(0.0)), None, true));
        // An epoch between validations keeps the best; without validation the latest is it.
        assert!(!improves(None, Some(0.2), true));
        assert!(improves(None, None, false));
    }

    #[test]
    fn a_run_resumes_only_with_the_fields_that_shape_its_state() {
        let a = TrainConfig::default();
        assert_eq!(same_shape(&a, &a), None);
        let b = TrainConfig {
            dim: a.dim + 1,
            ..a.clone()
        };
        assert_eq!(same_shape(&a, &b), Some("dim"));
        // An unset partition count takes the run's; a set one must match it.
        let (p0, p4, p8) = (
            TrainConfig {
                partitions: 0,
                ..a.clone()
            },
            TrainConfig {
                partitions: 4,
                ..a.clone()
            },
            TrainConfig {
                partitions: 8,
                ..a.clone()
            },
        );
        assert_eq!(same_shape(&p0, &p4), None);
        assert_eq!(same_shape(&p4, &p8), Some("partitions"));
        // Training settings are not shape: a resumed run may change them.
        let c = TrainConfig {
            epochs: a.epochs + 3,
            lr: a.lr * 2.0,
            ..a.clone()
        };
        assert_eq!(same_shape(&a, &c), None);
    }

    #[test]
    fn only_a_runs_own_files_are_cleared_for_a_new_run() {
        for name in [
            "run.json",
            "run.json.tmp",
            "metrics.jsonl",
            "table-2.bin",
            "relations-e3.bin",
            "prepared-e4",
        ] {
            assert!(ours(name), "{name}");
        }
        for name in ["notes.txt", "store", "rank-0"] {
            assert!(!ours(name), "{name}");
        }
    }
}
