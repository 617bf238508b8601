//! Which buckets a rank trains in an epoch, and in what order: the bucket scheduler of a
//! training job. A single process follows its ordering's precomputed schedule, renamed by a
//! seeded permutation each epoch ([`SingleMachine`]); a rank of a torchrun group takes its
//! buckets one grant at a time from the group's scheduler and commits through rank 0
//! ([`Distributed`], the epoch of [`crate::train::dist_epoch`]). The coordinator in [`crate::train::job`]
//! runs either the same way.

use std::path::Path;

use strata_io::profile::DeviceProfile;
use strata_io::progress::Progress;
use strata_store::rng::{derive, Rng};

use crate::config::{DistStorage, TrainConfig};
use crate::error::{EmbedError, Result};
use crate::ordering::{schedule, Schedule};
use crate::plan::budget::{EmbedPlan, RankNeeds};
use crate::run::run_dir::{EpochRecord, Run};
use crate::storage::relations::Relations;
use crate::train::checkpoint::{CheckpointManager, EpochTables, Trained};
use crate::train::dist::{
    check_holdings, describe_rank, fault_point, Cluster, PartitionSource, RankReport, TableCrc,
};
use crate::train::epoch::Trainer;
use crate::train::group::{Group, LocalCluster, Ranks};
use crate::train::overlap::{self, EdgeRate};
use crate::train::owner::{self, Commit};

/// How a job's epochs are scheduled and committed across its group.
pub trait BucketScheduler {
    /// The group the job runs in.
    fn group(&mut self) -> &mut dyn Group;
    /// Owner mode (`dist_storage = owners`): this rank's number; its run holds the partitions
    /// it owns.
    fn owner(&self) -> Option<usize>;
    /// What this rank's memory plan leaves to its group (none for a single process).
    fn rank_needs(&self, cfg: &TrainConfig) -> Option<RankNeeds>;
    /// After the run is set up: brings a resumed owner-mode run to the epoch rank 0 committed.
    fn join(
        &mut self,
        ckpt: &mut CheckpointManager,
        relations: &mut Relations,
        progress: &dyn Progress,
    ) -> Result<()>;
    /// Tells the user whether partition swaps can hide behind training (Theorem 3), at `rate`
    /// (`None`: the CPU kernels' rate, measured now).
    fn describe_overlap(
        &self,
        trainer: &Trainer,
        plan: &EmbedPlan,
        run_dir: &Path,
        rate: Option<EdgeRate>,
        progress: &dyn Progress,
    ) -> Result<()>;
    /// Trains epoch `epoch` from `tables.current` into `tables.next`. Returns what this rank
    /// commits, or None when rank 0 commits the epoch and this rank has taken its commit.
    fn train_epoch(
        &mut self,
        trainer: &mut Trainer,
        ckpt: &mut CheckpointManager,
        epoch: usize,
        tables: &EpochTables,
        progress: &dyn Progress,
    ) -> Result<Option<Trained>>;
    /// After this rank committed an epoch: lets the group know.
    fn committed(&mut self, run: &Run) -> Result<()>;
    /// Owner mode's partition transport: where the partitions other ranks own come from.
    fn peers(&mut self) -> Option<&mut (dyn PartitionSource + '_)>;
}

/// The scheduler of a job: distributed with a `cluster` (in owner mode with `peers`, which it
/// needs exactly when `cfg.dist_storage` is `owners`), else single-machine.
pub fn for_job<'a, 'c: 'a, 'p: 'a>(
    cfg: &TrainConfig,
    cluster: Option<&'a mut (dyn Cluster + 'c)>,
    peers: Option<&'a mut (dyn PartitionSource + 'p)>,
) -> Result<Box<dyn BucketScheduler + 'a>> {
    let owners = cluster.is_some() && cfg.dist_storage == DistStorage::Owners;
    if owners != peers.is_some() {
        return Err(EmbedError::Config(format!(
            "embed.train.dist_storage is {:?} but the group {} partition transport",
            cfg.dist_storage,
            if peers.is_some() { "has a" } else { "has no" }
        )));
    }
    Ok(match cluster {
        Some(cluster) => Box::new(Distributed {
            ranks: Ranks(cluster),
            peers: peers.map(|p| p as &mut dyn PartitionSource),
            epochs: cfg.epochs,
        }),
        None => Box::new(SingleMachine {
            local: LocalCluster,
        }),
    })
}

/// The run's base schedule: its ordering's over `partitions` partitions and `cfg.buffer`
/// slots.
pub fn base_schedule(cfg: &TrainConfig, partitions: u32) -> Result<Schedule> {
    schedule(cfg.ordering, partitions as usize, cfg.buffer)
        .map_err(|e| EmbedError::Config(format!("ordering: {e}")))
}

/// Epoch `epoch`'s seeded shuffle of the partitions, and the key that shuffles each step's
/// buckets.
fn shuffle(seed: u64, partitions: usize, epoch: usize) -> (Vec<u32>, u64) {
    let key = derive(derive(seed, 0x5c4e), epoch as u64);
    let mut rng = Rng::new(key);
    let mut perm: Vec<u32> = (0..partitions as u32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    (perm, derive(key, 1))
}

/// Epoch `epoch`'s names for `base`'s partitions, and the key that shuffles each step's
/// buckets: the epoch's seeded shuffle, changed only so that the epoch's first buffer state
/// is the state the epoch before it ended in (those partitions stay resident across the
/// boundary, so the epoch reads nothing before its first bucket). Epoch 0 takes its shuffle
/// as it is; each later one depends on the one before, so this walks from epoch 0 (a few
/// vectors of `partitions` names an epoch).
fn permutation(base: &Schedule, seed: u64, epoch: usize) -> (Vec<u32>, u64) {
    let (mut perm, mut key) = shuffle(seed, base.partitions, 0);
    let (Some(first), Some(last)) = (base.steps.first(), base.steps.last()) else {
        return (perm, key);
    };
    for e in 1..=epoch {
        let ended: Vec<u32> = last.state.iter().map(|&p| perm[p as usize]).collect();
        (perm, key) = shuffle(seed, base.partitions, e);
        chain(&mut perm, &first.state, &ended);
    }
    (perm, key)
}

/// Swaps names in `perm` so that as many partitions of `first` as there can be are named
/// after partitions of `ended`: each partition of `first` named outside `ended` trades names
/// with a partition outside `first` named inside it, in order. Still a permutation.
fn chain(perm: &mut [u32], first: &[u32], ended: &[u32]) {
    let in_first = |p: usize| first.contains(&(p as u32));
    let outside: Vec<usize> = (0..perm.len())
        .filter(|&p| in_first(p) && !ended.contains(&perm[p]))
        .collect();
    let inside: Vec<usize> = (0..perm.len())
        .filter(|&p| !in_first(p) && ended.contains(&perm[p]))
        .collect();
    for (&a, &b) in outside.iter().zip(&inside) {
        perm.swap(a, b);
    }
}

/// The schedule of `epoch`: `base` with partitions renamed by a seeded permutation, so each
/// epoch trains the partition pairs in another order, starting where the epoch before ended.
pub fn epoch_schedule(base: &Schedule, seed: u64, epoch: usize) -> Schedule {
    let (perm, key) = permutation(base, seed, epoch);
    base.relabel(&perm, key)
}

/// A single process: the ordering's schedule, a group of one.
pub struct SingleMachine {
    local: LocalCluster,
}

impl BucketScheduler for SingleMachine {
    fn group(&mut self) -> &mut dyn Group {
        &mut self.local
    }

    fn owner(&self) -> Option<usize> {
        None
    }

    fn rank_needs(&self, _: &TrainConfig) -> Option<RankNeeds> {
        None
    }

    fn join(
        &mut self,
        _: &mut CheckpointManager,
        _: &mut Relations,
        _: &dyn Progress,
    ) -> Result<()> {
        Ok(())
    }

    fn describe_overlap(
        &self,
        trainer: &Trainer,
        plan: &EmbedPlan,
        run_dir: &Path,
        rate: Option<EdgeRate>,
        progress: &dyn Progress,
    ) -> Result<()> {
        let sched = base_schedule(&trainer.cfg, trainer.buckets.partitioning.partitions)?;
        let rate = rate.unwrap_or_else(|| host_rate(trainer, plan));
        match DeviceProfile::for_path(run_dir) {
            _ if sched.swaps() == 0 => progress.message(&format!(
                "Theorem 3: all {} partition(s) stay resident, no swaps to hide ({rate})",
                plan.partitions,
            )),
            Some(profile) => {
                let node_bytes = trainer.buffer.layout.node_bytes();
                // The swap spare reads each swap's partition ahead (kept partitions need none).
                let spares = match plan.kept_partition_bytes {
                    0 => plan.swap_spares(),
                    _ => 0,
                };
                let c = overlap::check(&sched, &trainer.buckets, node_bytes, plan.buffer_bytes, plan.part_bytes, rate.seconds, &profile, spares)
                    .expect("the schedule has swaps");
                c.describe().iter().for_each(|l| progress.message(l));
                if rate.from_device_epoch {
                    progress.message(&format!("    (t: {rate})"));
                }
                if let Some(why) = profile.caveat() {
                    progress.message(&format!(
                        "    (the check's rates may be too high: {why}; `strata bench-disk --dir {}` measures the disk itself with a 4 GiB file)",
                        run_dir.display()
                    ));
                }
            }
            None => progress.message(&format!(
                "Theorem 3: no device profile for the disk holding {} ({rate}); run `strata bench-disk --dir {}` to check whether swaps can hide",
                run_dir.display(),
                run_dir.display()
            )),
        }
        Ok(())
    }

    fn train_epoch(
        &mut self,
        trainer: &mut Trainer,
        _: &mut CheckpointManager,
        epoch: usize,
        tables: &EpochTables,
        progress: &dyn Progress,
    ) -> Result<Option<Trained>> {
        let base = base_schedule(&trainer.cfg, trainer.buckets.partitioning.partitions)?;
        let sched = epoch_schedule(&base, trainer.cfg.seed, epoch);
        let (report, timeline) =
            trainer.epoch(epoch, &sched, &tables.current, &tables.next, progress)?;
        Ok(Some(Trained {
            report,
            timeline,
            ranks: None,
            table_crc: None,
        }))
    }

    fn committed(&mut self, _: &Run) -> Result<()> {
        Ok(())
    }

    fn peers(&mut self) -> Option<&mut (dyn PartitionSource + '_)> {
        None
    }
}

/// A rank of a torchrun group: buckets from the group's scheduler, epochs committed by rank 0
/// once every rank's part is synced (docs/distributed.md).
pub struct Distributed<'a> {
    ranks: Ranks<'a>,
    /// Owner mode's partition transport.
    peers: Option<&'a mut dyn PartitionSource>,
    epochs: usize,
}

impl Distributed<'_> {
    /// Rank 0: checks every rank's epoch report (the partitions' holdings chain, and that the
    /// epoch started from the table the last one committed) and combines them.
    fn combine(
        &self,
        epoch: usize,
        all: &[String],
        run: &Run,
        timeline: Vec<crate::train::epoch::Interval>,
    ) -> Result<Trained> {
        let mut ranks = all
            .iter()
            .map(|text| {
                serde_json::from_str::<RankReport>(text)
                    .map_err(|e| EmbedError::Corrupt(format!("a rank's epoch report: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        // A typed run's pinned region is one more region, held by rank 0.
        let p = &run.meta.partitioning;
        let regions = p.partitions + u32::from(p.pinned().is_some());
        let crc = check_holdings(epoch, regions, &ranks)?;
        check_start(&run.meta.history, epoch, &crc)?;
        ranks.iter_mut().for_each(|r| r.holdings.clear());
        Ok(Trained {
            report: RankReport::combine(&ranks),
            timeline,
            ranks: Some(ranks),
            table_crc: Some(crc),
        })
    }
}

impl BucketScheduler for Distributed<'_> {
    fn group(&mut self) -> &mut dyn Group {
        &mut self.ranks
    }

    fn owner(&self) -> Option<usize> {
        self.peers.is_some().then(|| self.ranks.rank())
    }

    fn rank_needs(&self, cfg: &TrainConfig) -> Option<RankNeeds> {
        Some(RankNeeds {
            group_anon_bytes: self.ranks.0.group_anon_bytes(),
            prefetch: cfg.dist_prefetch,
        })
    }

    fn join(
        &mut self,
        ckpt: &mut CheckpointManager,
        relations: &mut Relations,
        progress: &dyn Progress,
    ) -> Result<()> {
        match self.peers {
            Some(_) => owner::resume(&mut ckpt.run, relations, self.ranks.0, progress),
            None => Ok(()),
        }
    }

    fn describe_overlap(
        &self,
        trainer: &Trainer,
        plan: &EmbedPlan,
        _: &Path,
        rate: Option<EdgeRate>,
        progress: &dyn Progress,
    ) -> Result<()> {
        if !self.ranks.leads() {
            return Ok(());
        }
        let rate = rate.unwrap_or_else(|| host_rate(trainer, plan));
        progress.message(&format!(
            "Theorem 3 is not checked in a distributed run: its buckets come from the scheduler, not a precomputed schedule ({}; each rank's epoch line gives its partition wait); on rank 0 {rate}",
            if plan.prefetch_slots > 0 {
                "rank 0 loads its next grant's partitions while it trains"
            } else {
                "rank 0 loads each grant's partitions before it trains"
            },
        ));
        Ok(())
    }

    fn train_epoch(
        &mut self,
        trainer: &mut Trainer,
        ckpt: &mut CheckpointManager,
        epoch: usize,
        tables: &EpochTables,
        progress: &dyn Progress,
    ) -> Result<Option<Trained>> {
        let (current, next) = (&tables.current, &tables.next);
        // Every rank reaches this point of every epoch, whatever buckets the scheduler grants
        // it: a fault here kills a rank after the previous epoch's commit, always.
        fault_point(epoch, "started");
        let peers = self.peers.as_deref_mut();
        let (mine, timeline) =
            trainer.epoch_scheduled(epoch, current, next, self.ranks.0, peers, progress)?;
        progress.message(&describe_rank(&mine, self.epochs));
        if self.peers.is_some() {
            // Each rank's directory must hold all of epoch E+1 but the commit marker.
            ckpt.prepare(epoch, tables.spare, &trainer.relations)?;
        }
        // Every rank has synced its partitions of `next` before it contributes: the gather is
        // the commit's prepare barrier.
        let all = self
            .ranks
            .gather(serde_json::to_string(&mine).expect("serialises"))?;
        fault_point(epoch, "prepared");
        if self.ranks.leads() {
            return self.combine(epoch, &all, &ckpt.run, timeline).map(Some);
        }
        if self.peers.is_some() {
            let text = self.ranks.broadcast(String::new())?;
            let commit: Commit = serde_json::from_str(&text)
                .map_err(|e| EmbedError::Group(format!("rank 0's commit: {e}")))?;
            ckpt.adopt(&commit, &timeline)?;
            self.ranks.barrier("epoch committed by rank 0")?;
        } else {
            self.ranks.barrier("epoch committed by rank 0")?;
            ckpt.reopen()?;
        }
        Ok(None)
    }

    fn committed(&mut self, run: &Run) -> Result<()> {
        if self.peers.is_some() {
            owner::clear_prepared(run);
            let commit = serde_json::to_string(&Commit::of(&run.meta)).expect("serialises");
            self.ranks.broadcast(commit)?;
        }
        self.ranks.barrier("epoch committed by rank 0")
    }

    fn peers(&mut self) -> Option<&mut (dyn PartitionSource + '_)> {
        match &mut self.peers {
            Some(p) => Some(&mut **p),
            None => None,
        }
    }
}

/// Refuses to commit distributed epoch `epoch` unless the table its ranks started from is the
/// one the last epoch committed (when that epoch recorded it: a distributed one).
fn check_start(history: &[EpochRecord], epoch: usize, crc: &TableCrc) -> Result<()> {
    match history.last().and_then(|r| r.table_crc.as_ref()) {
        Some(last) if last.end != crc.start => Err(EmbedError::Corrupt(format!(
            "epoch {}: the ranks started from a table with CRC-32 {}, but epoch {} committed {}; refusing to commit a mix of epochs",
            epoch + 1,
            crc.start,
            epoch,
            last.end
        ))),
        _ => Ok(()),
    }
}

/// The CPU kernels' rate for `trainer`'s step, a 1vsAll or KvsAll chunk scoring the entities
/// `plan` gives it.
fn host_rate(trainer: &Trainer, plan: &EmbedPlan) -> EdgeRate {
    let p = &trainer.buckets.partitioning;
    let parts = p.partitions.max(1);
    let resident = plan.capacity.min(parts as usize) as u64 * p.num_nodes.div_ceil(parts as u64);
    let candidates = trainer.cfg.vs_all_candidates(p.num_nodes, resident);
    EdgeRate::host(&trainer.model, &trainer.cfg, trainer.threads(), candidates)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::ordering::OrderingKind;
    use crate::train::dist::TestRank;

    fn cfg(ordering: OrderingKind, buffer: usize) -> TrainConfig {
        TrainConfig {
            ordering,
            buffer,
            seed: 7,
            ..TrainConfig::default()
        }
    }

    #[test]
    fn the_single_machine_order_is_the_orderings_schedule_renamed_each_epoch() {
        let n = 6;
        for (kind, buffer) in [(OrderingKind::Legend, 3), (OrderingKind::Sequential, 2)] {
            let c = cfg(kind, buffer);
            let base = base_schedule(&c, n).unwrap();
            assert_eq!(
                base.states(),
                schedule(kind, n as usize, buffer).unwrap().states()
            );
            for epoch in 0..3 {
                let sched = epoch_schedule(&base, c.seed, epoch);
                let (perm, _) = permutation(&base, c.seed, epoch);
                assert_eq!(sched.steps.len(), base.steps.len());
                // Step by step: the ordering's buffer states, swaps and buckets under the
                // epoch's names (each step's buckets shuffled among themselves).
                for (s, b) in sched.steps.iter().zip(&base.steps) {
                    let mut state: Vec<u32> = b.state.iter().map(|&p| perm[p as usize]).collect();
                    state.sort_unstable();
                    assert_eq!(s.state, state);
                    assert_eq!(s.evicted, b.evicted.map(|p| perm[p as usize]));
                    assert_eq!(s.loaded, b.loaded.map(|p| perm[p as usize]));
                    let renamed = |bs: &[(u32, u32)]| -> BTreeSet<(u32, u32)> {
                        bs.iter()
                            .map(|&(x, y)| (perm[x as usize], perm[y as usize]))
                            .collect()
                    };
                    let set = |bs: &[(u32, u32)]| -> BTreeSet<(u32, u32)> {
                        bs.iter().copied().collect()
                    };
                    assert_eq!(set(&s.overlap), renamed(&b.overlap));
                    assert_eq!(set(&s.after_load), renamed(&b.after_load));
                }
                // Every bucket once, the same order for the same seed and epoch.
                let order: Vec<_> = sched.buckets().collect();
                assert_eq!(order.len(), (n * n) as usize);
                assert_eq!(order.iter().collect::<BTreeSet<_>>().len(), order.len());
                let again: Vec<_> = epoch_schedule(&base, c.seed, epoch).buckets().collect();
                assert_eq!(order, again);
            }
            // Another epoch renames the partitions anew, and starts in the state the epoch
            // before ended in.
            let scheds: Vec<_> = (0..4).map(|e| epoch_schedule(&base, c.seed, e)).collect();
            let orders: BTreeSet<Vec<_>> = scheds.iter().map(|s| s.buckets().collect()).collect();
            assert!(orders.len() > 1);
            for pair in scheds.windows(2) {
                let ended = &pair[0].steps.last().unwrap().state;
                assert_eq!(&pair[1].steps[0].state, ended, "{kind:?}");
            }
        }
    }

    #[test]
    fn chained_names_stay_a_permutation_and_start_where_the_last_epoch_ended() {
        // Six partitions, a first state of three, an ended state partly named already.
        let mut perm = vec![3, 0, 5, 1, 4, 2];
        chain(&mut perm, &[0, 1, 2], &[2, 4, 5]);
        let mut sorted = perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..6).collect::<Vec<u32>>());
        let mut named: Vec<u32> = [0, 1, 2].iter().map(|&p| perm[p]).collect();
        named.sort_unstable();
        assert_eq!(named, [2, 4, 5]);
        // Partition 2 already had a name in the ended state: it keeps it.
        assert_eq!(perm[2], 5);
        // A first state larger than the ended one takes all of it.
        let mut perm = vec![0, 1, 2, 3];
        chain(&mut perm, &[0, 1, 2], &[3]);
        assert!([0, 1, 2].iter().any(|&p| perm[p] == 3));
    }

    /// Rank 1 of a group of two that is asked for no epoch here (and its partition transport).
    fn idle() -> TestRank {
        TestRank {
            rank: 1,
            peer: None,
        }
    }

    impl PartitionSource for TestRank {
        fn serve(
            &mut self,
            _: usize,
            _: &std::sync::Arc<crate::storage::table::TableFile>,
            _: &std::sync::Arc<crate::storage::table::TableFile>,
            _: &crate::storage::layout::TableLayout,
        ) -> Result<()> {
            Ok(())
        }
        fn read(&mut self, _: usize, _: u32, _: bool, _: &mut [u8]) -> Result<()> {
            unreachable!("no partition moves here")
        }
        fn write(&mut self, _: usize, _: u32, _: &[u8]) -> Result<()> {
            unreachable!("no partition moves here")
        }
        fn traffic(&self) -> (u64, u64) {
            (0, 0)
        }
    }

    #[test]
    fn a_job_is_distributed_with_a_cluster_and_in_owner_mode_with_a_transport_only() {
        let shared = TrainConfig::default();
        let owners = TrainConfig {
            dist_storage: DistStorage::Owners,
            ..TrainConfig::default()
        };
        // Without a cluster the job is a single process, a group of one, whatever dist_storage.
        let mut single = for_job(&owners, None, None).unwrap();
        assert_eq!(single.owner(), None);
        assert!(single.rank_needs(&owners).is_none());
        assert_eq!(single.group().world_size(), 1);
        // A rank of a group: its group's seat, in owner mode its rank as the owner.
        let (mut c, mut p) = (idle(), idle());
        let mut rank = for_job(&owners, Some(&mut c), Some(&mut p)).unwrap();
        assert_eq!(rank.owner(), Some(1));
        assert_eq!((rank.group().rank(), rank.group().world_size()), (1, 2));
        assert!(rank.rank_needs(&owners).is_some());
        drop(rank);
        let mut c = idle();
        let rank = for_job(&shared, Some(&mut c), None).unwrap();
        assert_eq!(rank.owner(), None);
        drop(rank);
        // The transport comes exactly with owner mode.
        let mut c = idle();
        let e = for_job(&owners, Some(&mut c), None)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("has no partition transport"), "{e}");
        let (mut c, mut p) = (idle(), idle());
        let e = for_job(&shared, Some(&mut c), Some(&mut p))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("has a partition transport"), "{e}");
    }

    fn record(start: &str, end: &str) -> EpochRecord {
        let report: crate::train::epoch::EpochReport = serde_json::from_value(serde_json::json!({
            "epoch": 1, "loss": 0.0, "seconds": 0.0, "edges_per_second": 0.0,
            "io_wait_seconds": 0.0, "io_wait_fraction": 0.0, "partition_loads": 0,
            "partition_bytes_read": 0, "partition_bytes_written": 0, "edge_bytes_read": 0,
            "buffer_states": 0, "swaps": 0, "step_flops_per_thread": 0.0, "step_flops_total": 0.0
        }))
        .unwrap();
        EpochRecord {
            report,
            valid: None,
            best: true,
            ranks: None,
            table_crc: Some(TableCrc {
                start: start.into(),
                end: end.into(),
            }),
            lr: None,
            lr_dropped_to: None,
            stopped: None,
        }
    }

    #[test]
    fn a_distributed_epoch_commits_only_from_the_last_committed_table() {
        let crc = |start: &str| TableCrc {
            start: start.into(),
            end: "c".into(),
        };
        // No distributed epoch before: nothing to compare with.
        check_start(&[], 0, &crc("x")).unwrap();
        let history = [record("a", "b")];
        check_start(&history, 1, &crc("b")).unwrap();
        let e = check_start(&history, 1, &crc("x")).unwrap_err().to_string();
        assert!(e.contains("epoch 2") && e.contains("refusing"), "{e}");
    }
}
