//! A run directory: the durable state of one training run.
//!
//! ```text
//! RUN/run.json                  what the run is and which files hold its checkpoints
//! RUN/table-{0,1,2}.bin         node tables; at most two are referenced (current, best)
//! RUN/relations-e{K}.npy        relation rows after epoch K, and their optimizer state in
//! RUN/relation_state-e{K}.npy   (only the epochs run.json references are kept)
//! RUN/metrics.jsonl             one line per epoch (regenerated from run.json on resume)
//! RUN/timeline.jsonl            compute and I/O intervals of every buffer state
//! ```
//!
//! An epoch writes only the spare table file (referenced by nothing) and new relation files;
//! `run.json` is then replaced atomically (write, fsync, rename, fsync the directory). A kill at
//! any moment leaves the last committed checkpoint intact, and resuming repeats the
//! interrupted epoch from it.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_store::Store;

use crate::config::{TrainConfig, Which};
use crate::error::{io_err, EmbedError, Result};
use crate::eval::Metrics;
use crate::model::ScoreModel;
use crate::storage::layout::TableLayout;
use crate::storage::partitioning::Partitioning;
use crate::storage::relations::Relations;
use crate::train::dist::{RankReport, TableCrc};
use crate::train::epoch::{EpochReport, Interval};
use crate::train::iteration::ScheduleState;

pub const RUN_FORMAT: &str = "strata-embed-run";
pub const RUN_VERSION: u32 = 1;
const TABLES: [&str; 3] = ["table-0.bin", "table-1.bin", "table-2.bin"];

/// A committed state: after `epoch` epochs, in table file `table` with relations `e{epoch}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub epoch: usize,
    pub table: String,
}

/// One epoch's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EpochRecord {
    #[serde(flatten)]
    pub report: EpochReport,
    pub valid: Option<Metrics>,
    /// This epoch became the best checkpoint.
    pub best: bool,
    /// In a distributed run, what each rank did (the report above is the group's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ranks: Option<Vec<RankReport>>,
    /// In a distributed run, the CRC-32s of the table the epoch started from and of the table
    /// it committed; rank 0 commits an epoch only if its start is the last epoch's end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub table_crc: Option<TableCrc>,
    /// The learning rate the epoch trained with (absent in runs written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// The rate the epoch's validation dropped it to (reduce on plateau).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_dropped_to: Option<f64>,
    /// Why training stopped after this epoch, when its validation stopped it early.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
}

/// `run.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunMeta {
    pub format: String,
    pub format_version: u32,
    /// The store trained on (absolute path) and the size of its train edges (a staleness check).
    pub store: PathBuf,
    /// The store's path relative to the run directory, so that a store moved or copied with
    /// its runs inside (or beside them) is found where it lies now (absent in older runs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_relative: Option<PathBuf>,
    pub store_train_bytes: u64,
    pub num_nodes: u64,
    pub num_relations: u64,
    pub config: TrainConfig,
    pub partitioning: Partitioning,
    pub layout: TableLayout,
    pub current: Checkpoint,
    pub best: Checkpoint,
    /// Validation MRR of the best checkpoint (absent without validation).
    pub best_mrr: Option<f64>,
    pub history: Vec<EpochRecord>,
    /// Test metrics of the best checkpoint, once training has finished.
    pub test: Option<Metrics>,
    /// Single-thread SGEMM FLOP/s measured on this machine, the reference for the step's rate.
    pub sgemm_flops: f64,
    /// The memory plan of the latest start (absent in runs written before plans were saved).
    #[serde(default)]
    pub memory_plan: Option<strata_store::budget::MemoryPlan>,
    /// The device budget's plan of the latest start of a run trained on a torch device
    /// (`device_memory`; absent for the CPU engine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_memory_plan: Option<strata_store::budget::MemoryPlan>,
    /// Ranks of the latest start (1: a single process; absent in older runs).
    #[serde(default = "one")]
    pub world_size: usize,
    /// Owner mode (`dist_storage = owners`): this directory is rank `owner_rank`'s and its
    /// tables hold only the partitions that rank owns (`p mod world_size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner_rank: Option<usize>,
    /// The learning-rate schedule and early stopping as of the current checkpoint (absent in
    /// runs written before they were kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<ScheduleState>,
}

fn one() -> usize {
    1
}

impl RunMeta {
    /// The record of a new run on `store` before its first epoch: epoch 0 in `table-0.bin`
    /// (current and best), no history, one process.
    pub fn fresh(
        store: &Store,
        config: TrainConfig,
        partitioning: Partitioning,
        layout: TableLayout,
    ) -> Result<RunMeta> {
        let graph = &store.manifest().graph;
        let first = Checkpoint {
            epoch: 0,
            table: TABLES[0].into(),
        };
        Ok(RunMeta {
            format: RUN_FORMAT.into(),
            format_version: RUN_VERSION,
            store: store
                .path()
                .canonicalize()
                .unwrap_or_else(|_| store.path().to_path_buf()),
            store_relative: None,
            store_train_bytes: train_bytes(store)?,
            num_nodes: graph.num_nodes,
            num_relations: graph.num_relations,
            config: config.clone(),
            partitioning,
            layout,
            current: first.clone(),
            best: first,
            best_mrr: None,
            history: Vec::new(),
            test: None,
            sgemm_flops: 0.0,
            memory_plan: None,
            device_memory_plan: None,
            world_size: 1,
            owner_rank: None,
            schedule: Some(ScheduleState::new(&config)),
        })
    }

    /// Whether the run trained on `store`: its node count and the size of its train edges are
    /// the run's (the staleness check every reader of a run's store makes).
    pub fn trained_on(&self, store: &Store) -> Result<bool> {
        Ok(store.manifest().graph.num_nodes == self.num_nodes
            && train_bytes(store)? == self.store_train_bytes)
    }

    pub fn model(&self) -> ScoreModel {
        ScoreModel {
            kind: self.config.model,
            dim: self.config.dim,
            transe_norm: self.config.transe_norm,
            pbg: self.config.pbg_form(),
        }
    }

    /// The table file no checkpoint references (the next epoch writes it).
    pub fn spare(&self) -> &'static str {
        TABLES
            .iter()
            .find(|t| **t != self.current.table && **t != self.best.table)
            .expect("three files, at most two referenced")
    }

    /// Relation rows shaped for this run, as initialised.
    pub fn empty_relations(&self) -> Relations {
        Relations::new(
            &self.model(),
            self.num_relations,
            self.config.reciprocal,
            self.config.optimizer == crate::config::OptimizerKind::AdagradRow,
            self.config.seed,
            self.config.row_init(),
        )
    }
}

/// An opened run directory.
pub struct Run {
    pub dir: PathBuf,
    pub meta: RunMeta,
}

/// Whether `dir` holds a run.
pub fn is_run(dir: &Path) -> bool {
    dir.join("run.json").is_file()
}

/// Where the store of the run in `dir` lies now: at its path relative to the run when the
/// run's store is there (the store was moved or copied with its runs), else at the absolute
/// path recorded (a run copied alone, as the service's snapshot of it, finds no store there).
fn located_store(dir: &Path, meta: &RunMeta) -> PathBuf {
    meta.store_relative
        .as_ref()
        .map(|rel| dir.join(rel))
        .filter(|store| is_store_of(store, meta))
        .and_then(|store| store.canonicalize().ok())
        .unwrap_or_else(|| meta.store.clone())
}

/// Whether `path` holds the store `meta`'s run trained on ([`RunMeta::trained_on`]).
fn is_store_of(path: &Path, meta: &RunMeta) -> bool {
    Store::open(path).is_ok_and(|store| meta.trained_on(&store).unwrap_or(false))
}

/// The path of `to` relative to the directory `from` (`../g.strata`), both resolved first;
/// None when either cannot be resolved.
fn relative_path(from: &Path, to: &Path) -> Option<PathBuf> {
    let (from, to) = (from.canonicalize().ok()?, to.canonicalize().ok()?);
    let common = from
        .components()
        .zip(to.components())
        .take_while(|(a, b)| a == b)
        .count();
    let up = from.components().skip(common).map(|_| Component::ParentDir);
    Some(up.chain(to.components().skip(common)).collect())
}

/// An exclusive lock on a run directory, held by the process that writes it for as long as
/// this lives: a second trainer of the same directory is refused instead of interleaving its
/// commits with the first one's.
pub struct RunLock {
    dir: PathBuf,
    /// The lock created the directory: dropped with the directory still empty (the job was
    /// refused before it wrote anything), it removes it again, leaving no trace.
    created: bool,
    // Held only for its descriptor: the lock goes when it closes.
    _handle: std::fs::File,
}

impl RunLock {
    /// Creates `dir` if it is missing and locks it.
    pub fn take(dir: &Path) -> Result<RunLock> {
        let created = !dir.exists();
        std::fs::create_dir_all(dir).map_err(|e| io_err("mkdir", dir, e))?;
        let handle = match strata_io::durable::lock_dir(dir) {
            Ok(Some(handle)) => handle,
            Ok(None) => return Err(EmbedError::Config(format!(
                "run directory {} is being trained by another job (this process or another); wait for it to end, or choose another --run-dir",
                dir.display()
            ))),
            Err(e) => return Err(io_err("lock", dir, e)),
        };
        Ok(RunLock {
            dir: dir.to_path_buf(),
            created,
            _handle: handle,
        })
    }
}

impl Drop for RunLock {
    fn drop(&mut self) {
        if self.created {
            // Fails, as it should, once the job wrote anything there.
            let _ = std::fs::remove_dir(&self.dir);
        }
    }
}

impl Run {
    /// Opens the run in `dir`.
    pub fn open(dir: &Path) -> Result<Run> {
        let path = dir.join("run.json");
        if strata_io::durable::is_partial(dir) {
            return Err(EmbedError::Corrupt(format!(
                "{}: a `.partial-PID` directory is an unfinished output and never a run",
                dir.display()
            )));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| io_err("read", &path, e))?;
        let meta: RunMeta = serde_json::from_str(&text).map_err(|e| {
            EmbedError::Corrupt(format!("{}: not a run record: {e}", path.display()))
        })?;
        if meta.format != RUN_FORMAT {
            return Err(EmbedError::Corrupt(format!(
                "{}: format is '{}', expected '{RUN_FORMAT}'",
                path.display(),
                meta.format
            )));
        }
        if meta.format_version > RUN_VERSION {
            return Err(EmbedError::Corrupt(format!(
                "{}: run format version {} is newer than this Strata's {RUN_VERSION}; upgrade Strata",
                path.display(),
                meta.format_version
            )));
        }
        for ckpt in [&meta.current, &meta.best] {
            let table = dir.join(&ckpt.table);
            let want = meta.layout.table_bytes(meta.partitioning.partitions);
            let have = std::fs::metadata(&table)
                .map_err(|e| io_err("stat", &table, e))?
                .len();
            if have < want {
                return Err(EmbedError::Corrupt(format!(
                    "{}: {have} bytes, expected {want}",
                    table.display()
                )));
            }
        }
        Ok(Run {
            dir: dir.to_path_buf(),
            meta: RunMeta {
                store: located_store(dir, &meta),
                ..meta
            },
        })
    }

    /// Opens the run in `dir`, refusing one rank's directory of an owner-mode run (it holds
    /// only the partitions that rank owns).
    pub fn open_whole(dir: &Path) -> Result<Run> {
        let run = Run::open(dir)?;
        if let (Some(rank), true) = (run.meta.owner_rank, run.meta.world_size > 1) {
            return Err(EmbedError::Config(format!(
                "{} is rank {rank}'s directory of an owner-mode run of {} ranks (dist_storage = owners) and holds only the partitions that rank owns; run `strata embed gather OUT` with every rank's directory (`{}/rank-*`), then use OUT",
                dir.display(),
                run.meta.world_size,
                dir.parent().unwrap_or(dir).display()
            )));
        }
        Ok(run)
    }

    /// Opens the store the run trained on, checking it still holds the same train edges.
    pub fn store(&self) -> Result<Store> {
        if !self.meta.store.exists() {
            return Err(EmbedError::Config(format!(
                "run {} trained on store {}, which is no longer there; a store moved with its runs inside (or beside them) is found where it lies, so move the run with its store",
                self.dir.display(),
                self.meta.store.display()
            )));
        }
        let store = Store::open(&self.meta.store)?;
        if !self.meta.trained_on(&store)? {
            return Err(EmbedError::Config(format!(
                "store {} changed since run {} trained on it (different nodes or train edges)",
                self.meta.store.display(),
                self.dir.display()
            )));
        }
        Ok(store)
    }

    pub fn checkpoint(&self, which: Which) -> &Checkpoint {
        match which {
            Which::Best => &self.meta.best,
            Which::Last => &self.meta.current,
        }
    }

    pub fn table_path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Paths of the relation rows and state saved after `epoch`.
    pub fn relation_paths(&self, epoch: usize) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("relations-e{epoch}.npy")),
            self.dir.join(format!("relation_state-e{epoch}.npy")),
        )
    }

    /// The relation rows of a checkpoint.
    pub fn relations(&self, ckpt: &Checkpoint) -> Result<Relations> {
        let mut rel = self.meta.empty_relations();
        let (p, s) = self.relation_paths(ckpt.epoch);
        rel.load(&p, &s)?;
        Ok(rel)
    }

    /// Replaces `run.json` atomically with `self.meta`, then removes relation files no
    /// checkpoint references and temporary files of killed writers.
    pub fn commit(&self) -> Result<()> {
        let path = self.dir.join("run.json");
        let meta = RunMeta {
            store_relative: relative_path(&self.dir, &self.meta.store),
            ..self.meta.clone()
        };
        let text = serde_json::to_string_pretty(&meta).expect("run metadata serialises");
        strata_io::durable::fault_point("embed.checkpoint_written");
        strata_io::durable::replace_file_by(
            &path,
            |tmp| std::fs::write(tmp, &text).map_err(|e| io_err("write", tmp, e)),
            // the new run.json is durable beside the old one, not yet renamed over it
            || strata_io::durable::fault_point("embed.run_json_written"),
        )?;
        strata_io::durable::fault_point("embed.committed");
        let keep = [self.meta.current.epoch, self.meta.best.epoch];
        for entry in std::fs::read_dir(&self.dir)
            .map_err(|e| io_err("list", &self.dir, e))?
            .flatten()
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let epoch = name
                .strip_prefix("relations-e")
                .or_else(|| name.strip_prefix("relation_state-e"))
                .and_then(|rest| rest.strip_suffix(".npy"))
                .and_then(|k| k.parse::<usize>().ok());
            // A temporary file of a killed writer is never renamed into place.
            let orphan = strata_io::durable::is_orphan_temp(&name);
            if orphan || epoch.is_some_and(|k| !keep.contains(&k)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        Ok(())
    }

    /// Rewrites `metrics.jsonl` from the history and drops timeline lines of uncommitted
    /// epochs (after a resume).
    pub fn rewrite_logs(&self) -> Result<()> {
        let path = self.dir.join("metrics.jsonl");
        let mut text = String::new();
        for rec in &self.meta.history {
            text.push_str(&serde_json::to_string(rec).expect("serialises"));
            text.push('\n');
        }
        std::fs::write(&path, text).map_err(|e| io_err("write", &path, e))?;
        let tl = self.dir.join("timeline.jsonl");
        if let Ok(old) = std::fs::read_to_string(&tl) {
            let done = self.meta.current.epoch as u64;
            let kept: String = old
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v["epoch"].as_u64())
                        .is_some_and(|e| e <= done)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            std::fs::write(&tl, kept).map_err(|e| io_err("write", &tl, e))?;
        }
        Ok(())
    }

    /// Appends an epoch's metrics line and timeline.
    pub fn append_logs(&self, rec: &EpochRecord, timeline: &[Interval]) -> Result<()> {
        let append = |name: &str, text: String| -> Result<()> {
            let path = self.dir.join(name);
            let mut f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io_err("open", &path, e))?;
            f.write_all(text.as_bytes())
                .map_err(|e| io_err("write", &path, e))
        };
        append(
            "metrics.jsonl",
            format!("{}\n", serde_json::to_string(rec).expect("serialises")),
        )?;
        let epoch = rec.report.epoch;
        let mut text = String::new();
        for iv in timeline {
            let mut v = serde_json::to_value(iv).expect("serialises");
            v["epoch"] = epoch.into();
            text.push_str(&v.to_string());
            text.push('\n');
        }
        append("timeline.jsonl", text)
    }
}

/// Size of the store's train-edge array in bytes.
pub fn train_bytes(store: &Store) -> Result<u64> {
    let path = store.array_path("edges_train")?;
    Ok(std::fs::metadata(&path)
        .map_err(|e| io_err("stat", &path, e))?
        .len())
}

/// Flushes a directory's entries (a rename inside it) to the device.
pub fn sync_dir(dir: &Path) -> Result<()> {
    Ok(strata_io::durable::sync_dir(dir)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_locked_run_directory_refuses_a_second_job_until_the_first_ends() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("run");
        let first = RunLock::take(&dir).unwrap();
        assert!(dir.is_dir(), "taking the lock creates the directory");
        // A second open of the directory is a second lock holder, even in this process.
        let err = RunLock::take(&dir)
            .err()
            .expect("the second job is refused");
        let msg = err.to_string();
        assert!(msg.contains("being trained by another job"), "{msg}");
        assert!(msg.contains(&dir.display().to_string()), "{msg}");
        std::fs::write(dir.join("run.json"), b"{}").unwrap();
        drop(first);
        assert!(dir.is_dir(), "a directory the job wrote stays");
        RunLock::take(&dir).expect("free once the first job ends");
    }

    #[test]
    fn a_job_refused_before_writing_leaves_no_directory_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let (new, old) = (tmp.path().join("new"), tmp.path().join("old"));
        drop(RunLock::take(&new).unwrap());
        assert!(!new.exists(), "the lock's own empty directory is removed");
        std::fs::create_dir(&old).unwrap();
        drop(RunLock::take(&old).unwrap());
        assert!(old.is_dir(), "a directory the user made stays");
    }

    #[test]
    fn a_store_path_relative_to_its_run_climbs_to_the_common_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let (store, beside) = (tmp.path().join("g.strata"), tmp.path().join("runs/a"));
        let inside = store.join("runs/embed");
        for dir in [&inside, &beside] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let rel = |from: &Path| relative_path(from, &store).unwrap();
        assert_eq!(rel(&inside), Path::new("../.."));
        assert_eq!(rel(&beside), Path::new("../../g.strata"));
        assert_eq!(relative_path(&tmp.path().join("gone"), &store), None);
    }

    #[test]
    fn a_run_directory_path_that_is_a_file_is_an_io_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("run");
        std::fs::write(&file, b"not a directory").unwrap();
        let msg = RunLock::take(&file).err().unwrap().to_string();
        assert!(msg.contains(&file.display().to_string()), "{msg}");
    }
}
