//! Owner mode's run directories and epoch commit (docs/distributed.md, `dist_storage =
//! owners`): every rank keeps the partitions it owns in its own run directory `RUN/rank-R`,
//! prepares each epoch there (tables synced, relations saved, a `prepared-e{E}` marker), and
//! writes rank 0's commit of the epoch as its own `run.json`. On restart a rank that prepared
//! an epoch rank 0 committed, but died before writing the commit, adopts its prepared table.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_io::progress::Progress;

use crate::error::{io_err, EmbedError, Result};
use crate::run::run_dir::{sync_dir, Checkpoint, EpochRecord, Run, RunMeta};
use crate::storage::buffer::{Load, PartitionBuffer};
use crate::storage::relations::Relations;
use crate::storage::table::TableFile;
use crate::train::dist::{owner_of, Cluster, PartitionSource};
use crate::train::iteration::ScheduleState;

/// Rank `rank`'s own run directory inside the `--run-dir` every rank is given.
pub fn rank_dir(run_dir: &Path, rank: usize) -> PathBuf {
    run_dir.join(format!("rank-{rank}"))
}

/// What rank 0 committed, as every rank writes it into its own `run.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Commit {
    pub current: Checkpoint,
    pub best: Checkpoint,
    pub best_mrr: Option<f64>,
    /// The committed epoch's record (none before the first epoch).
    pub record: Option<EpochRecord>,
    /// Rank 0's learning-rate schedule and early-stopping decision.
    #[serde(default)]
    pub schedule: Option<ScheduleState>,
}

impl Commit {
    /// The last commit recorded in `meta`.
    pub fn of(meta: &RunMeta) -> Commit {
        Commit {
            current: meta.current.clone(),
            best: meta.best.clone(),
            best_mrr: meta.best_mrr,
            record: meta.history.last().cloned(),
            schedule: meta.schedule.clone(),
        }
    }

    /// Records this commit in `meta` (one epoch after the one `meta` is at).
    pub fn apply(&self, meta: &mut RunMeta) {
        meta.current = self.current.clone();
        meta.best = self.best.clone();
        meta.best_mrr = self.best_mrr;
        meta.history.extend(self.record.clone());
        meta.schedule = self.schedule.clone();
        meta.test = None;
    }
}

fn marker(dir: &Path, epoch: usize) -> PathBuf {
    dir.join(format!("prepared-e{epoch}"))
}

/// Marks `ckpt` prepared in `run`'s directory: its table and relation files are durable (the
/// caller synced them) and hold this rank's part of the epoch.
pub fn prepare(run: &Run, ckpt: &Checkpoint) -> Result<()> {
    let path = marker(&run.dir, ckpt.epoch);
    let text = serde_json::to_string(ckpt).expect("a checkpoint serialises");
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut f = std::fs::File::create(&path)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    };
    write().map_err(|e| io_err("write", &path, e))?;
    sync_dir(&run.dir)
}

/// The checkpoint this rank prepared for `epoch`, if it did.
pub fn prepared(dir: &Path, epoch: usize) -> Result<Option<Checkpoint>> {
    let path = marker(dir, epoch);
    match std::fs::read_to_string(&path) {
        Ok(text) => serde_json::from_str(&text).map(Some).map_err(|e| {
            EmbedError::Corrupt(format!(
                "{}: not a prepared checkpoint: {e}",
                path.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err("read", &path, e)),
    }
}

/// Removes the markers of epochs up to the committed one (they are settled).
pub fn clear_prepared(run: &Run) {
    for epoch in 0..=run.meta.current.epoch {
        let _ = std::fs::remove_file(marker(&run.dir, epoch));
    }
}

/// How a restarting rank's committed state relates to rank 0's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resume {
    /// Both committed the same epoch.
    Same,
    /// This rank is one epoch behind but prepared exactly the epoch rank 0 committed: it
    /// died between the prepare barrier and writing the commit, and its prepared table is
    /// complete (rank 0 commits only after every rank prepared).
    Adopt,
}

/// The adopt rule: `local` is this rank's committed checkpoint, `prepared` what it prepared
/// for the epoch after it, `leader` rank 0's committed checkpoint. Anything but the same
/// epoch, or one behind with that very epoch prepared, is a mix of runs that no rule can
/// settle: the error says what each has.
pub fn reconcile(
    local: &Checkpoint,
    prepared: Option<&Checkpoint>,
    leader: &Checkpoint,
) -> std::result::Result<Resume, String> {
    if local == leader {
        return Ok(Resume::Same);
    }
    if local.epoch + 1 == leader.epoch && prepared == Some(leader) {
        return Ok(Resume::Adopt);
    }
    Err(format!(
        "its run is at epoch {} ({}){}, rank 0's at epoch {} ({})",
        local.epoch,
        local.table,
        prepared.map_or(String::new(), |p| format!(
            " with epoch {} prepared in {}",
            p.epoch, p.table
        )),
        leader.epoch,
        leader.table
    ))
}

/// Brings this rank's run to the epoch rank 0 committed (after a restart): rank 0 broadcasts
/// its commit; a rank one epoch behind that prepared it adopts it (and its saved relations).
/// Every rank then writes its `run.json`.
pub fn resume(
    run: &mut Run,
    relations: &mut Relations,
    cluster: &mut dyn Cluster,
    progress: &dyn Progress,
) -> Result<()> {
    let rank = cluster.rank();
    let text =
        cluster.broadcast(serde_json::to_string(&Commit::of(&run.meta)).expect("serialises"))?;
    let leader: Commit = serde_json::from_str(&text)
        .map_err(|e| EmbedError::Group(format!("rank 0's commit: {e}")))?;
    let mine = prepared(&run.dir, run.meta.current.epoch + 1)?;
    let resume = reconcile(&run.meta.current, mine.as_ref(), &leader.current).map_err(|why| {
        EmbedError::Config(format!(
            "rank {rank} cannot resume {} with rank 0: {why}; give every rank the same --run-dir layout, or pass --fresh to all ranks",
            run.dir.display()
        ))
    })?;
    if resume == Resume::Adopt {
        progress.message(&format!(
            "adopting epoch {} ({}), which this rank prepared and rank 0 committed before the restart",
            leader.current.epoch, leader.current.table
        ));
        leader.apply(&mut run.meta);
        let (rp, sp) = run.relation_paths(run.meta.current.epoch);
        relations.load(&rp, &sp)?;
        if let Some(record) = &leader.record {
            run.append_logs(record, &[])?;
        }
    }
    // Rank 0 decides the schedule (a resumed run's rate and whether it stopped) for all.
    run.meta.schedule = leader.schedule;
    run.commit()?;
    clear_prepared(run);
    Ok(())
}

/// How rank `rank` brings partitions into its buffer to evaluate (a [`Load`]): from `table`,
/// its copy of the table evaluated, when there are no `peers` or it owns the partition; in
/// owner mode any other partition is streamed from its owner's copy, which the owner serves as
/// `epoch`'s `next` table when `written`, else as its `current` ([`PartitionSource::serve`]).
/// Each partition goes into a slot of the rank's buffer, so evaluation stays within its plan.
pub fn eval_loader<'a, 'b: 'a>(
    table: &'a TableFile,
    peers: Option<&'a mut (dyn PartitionSource + 'b)>,
    rank: usize,
    world_size: usize,
    epoch: usize,
    written: bool,
) -> Box<Load<'a>> {
    match peers {
        Some(peers) => Box::new(move |buffer: &mut PartitionBuffer, slot, p| {
            if owner_of(p, world_size) == rank {
                buffer.load(slot, p, table)
            } else {
                buffer.load_with(slot, p, |into| peers.read(epoch, p, written, into))
            }
        }),
        None => Box::new(move |buffer: &mut PartitionBuffer, slot, p| buffer.load(slot, p, table)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ck(epoch: usize, table: &str) -> Checkpoint {
        Checkpoint {
            epoch,
            table: table.into(),
        }
    }

    #[test]
    fn a_rank_adopts_only_the_epoch_rank_0_committed_and_it_prepared() {
        let leader = ck(4, "table-1.bin");
        assert_eq!(reconcile(&leader, None, &leader), Ok(Resume::Same));
        // Prepared the next epoch too (rank 0 died before committing it): stay.
        assert_eq!(
            reconcile(&leader, Some(&ck(5, "table-2.bin")), &leader),
            Ok(Resume::Same)
        );
        let behind = ck(3, "table-0.bin");
        assert_eq!(
            reconcile(&behind, Some(&leader), &leader),
            Ok(Resume::Adopt)
        );
        // One behind without the marker: it never prepared, rank 0 could not have committed.
        let e = reconcile(&behind, None, &leader).unwrap_err();
        assert!(e.contains("epoch 3") && e.contains("epoch 4"), "{e}");
        // A prepared table that is not the committed one is no evidence.
        assert!(reconcile(&behind, Some(&ck(4, "table-2.bin")), &leader).is_err());
        // Two behind, or ahead of rank 0: another run's directory.
        assert!(reconcile(&ck(2, "table-0.bin"), None, &leader).is_err());
        assert!(reconcile(&ck(5, "table-2.bin"), None, &leader).is_err());
    }
}
