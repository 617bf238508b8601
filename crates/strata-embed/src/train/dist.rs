//! What a distributed run needs from its group of ranks (see docs/distributed.md): buckets
//! and partition locks from the scheduler on rank 0, relation rounds, barriers and a gather for
//! the epoch's reports. The engine knows nothing of torch: `strata-py` implements [`Cluster`]
//! over `torch.distributed`, and a single-process run has no cluster at all.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{EmbedError, Result};
use crate::ordering::Bucket;
use crate::storage::layout::TableLayout;
use crate::storage::table::TableFile;
use crate::train::epoch::EpochReport;

/// The scheduler's answer to a rank asking for work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// Train `bucket`: first write back and release `evict` (resident partitions of this rank),
    /// then load the bucket's partitions that are not resident; a partition in `written` was
    /// already written back this epoch and is read from the epoch's output table.
    Bucket {
        bucket: Bucket,
        evict: Vec<u32>,
        written: Vec<u32>,
    },
    /// Buckets remain, but each needs a partition another rank holds: write back and release
    /// everything, join a relation round, ask again.
    Wait,
    /// Every bucket of the epoch has been handed out.
    Done,
}

/// A group of ranks training one run.
pub trait Cluster: Send {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// The next grant for this rank in `epoch`; it holds `held` (its resident partitions) in
    /// a buffer of `capacity` slots, of a table of `partitions` partitions.
    fn acquire(
        &mut self,
        epoch: usize,
        held: &[u32],
        partitions: u32,
        capacity: usize,
    ) -> Result<Grant>;
    /// `parts` are written back to the epoch's output table and no longer held by this rank.
    fn release(&mut self, epoch: usize, parts: &[u32]) -> Result<()>;
    /// One relation round: sums `values` over the ranks in place. `done`: this rank has no more
    /// buckets this epoch. Returns whether every rank is done.
    fn sync(&mut self, values: &mut [f32], done: bool) -> Result<bool>;
    /// Waits until every rank arrives; `what` names the point in errors.
    fn barrier(&mut self, what: &str) -> Result<()>;
    /// Every rank's `mine`, in rank order, on rank 0; empty on the other ranks.
    fn gather(&mut self, mine: String) -> Result<Vec<String>>;
    /// Rank 0's `text` on every rank (what the other ranks pass is ignored).
    fn broadcast(&mut self, text: String) -> Result<String>;
    /// Bytes this rank has sent and received through the group so far.
    fn traffic(&self) -> (u64, u64);
    /// This process's anonymous memory (`RssAnon`, bytes) measured once torch was imported and
    /// the group started: what torch and gloo hold beside the engine, for the rank's plan.
    /// None where it was not measured.
    fn group_anon_bytes(&self) -> Option<u64> {
        None
    }
}

/// The rank that owns partition `p` in owner mode (`dist_storage = owners`) with `world_size`
/// ranks: it keeps `p` in its own tables and serves it to the rank that trains it.
pub fn owner_of(p: u32, world_size: usize) -> usize {
    p as usize % world_size
}

/// Partitions owned by other ranks (owner mode): read from and written back to their owner.
/// A partition's region is the bytes of its region in a table file (`TableLayout::part_bytes`:
/// embeddings, then optimizer state, padded). `strata-py` implements this over
/// torch.distributed point-to-point transfers.
pub trait PartitionSource: Send {
    /// Makes this rank's tables of `epoch` (`current`, read only, and `next`, read and
    /// written) available to the other ranks until the next call.
    fn serve(
        &mut self,
        epoch: usize,
        current: &Arc<TableFile>,
        next: &Arc<TableFile>,
        layout: &TableLayout,
    ) -> Result<()>;
    /// Fills `into` (one region) with partition `p` from its owner: from the owner's `next`
    /// table when `written` (written back earlier this epoch), else from its `current`.
    fn read(&mut self, epoch: usize, p: u32, written: bool, into: &mut [u8]) -> Result<()>;
    /// Writes partition `p`'s region to its owner's `next` table; returns once it is written.
    fn write(&mut self, epoch: usize, p: u32, region: &[u8]) -> Result<()>;
    /// Bytes of partition regions (and their requests) sent and received so far.
    fn traffic(&self) -> (u64, u64);
}

/// What one rank did in one epoch (one entry of an epoch record's `ranks`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankReport {
    pub rank: usize,
    #[serde(flatten)]
    pub report: EpochReport,
    /// Buckets this rank trained.
    pub buckets: usize,
    /// Relation rounds it joined, and the times the scheduler had nothing it could take.
    pub relation_rounds: usize,
    pub waits: usize,
    /// Seconds spent waiting for the scheduler's answers and in relation rounds.
    pub group_wait_seconds: f64,
    /// Bytes sent to and received from the other ranks (scheduler messages, relation rounds,
    /// and in owner mode partition regions and their requests).
    pub bytes_sent: u64,
    pub bytes_received: u64,
    /// Seconds the trainer was blocked on partition loads and write-backs (the rest of
    /// `io_wait_seconds` is bucket edges and the epoch's sync), and that as a share of the
    /// epoch's seconds (the rank's data-wait share).
    #[serde(default)]
    pub partition_wait_seconds: f64,
    #[serde(default)]
    pub partition_wait_share: f64,
    /// Bytes of partition regions this rank loaded (from its tables or their owners).
    #[serde(default)]
    pub partition_bytes_loaded: u64,
    /// Loads started while the previous bucket trained (`dist_prefetch`'s lookahead).
    #[serde(default)]
    pub prefetched_loads: usize,
    /// Every partition this rank held in the epoch, in order: carried to rank 0 by the gather,
    /// checked there ([`check_holdings`]) and not kept in `run.json`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holdings: Vec<Holding>,
}

/// One holding of a partition by a rank: loaded, trained, written back. The CRC-32s are of
/// the partition's whole region (`TableLayout::part_bytes`) as read and as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Holding {
    pub part: u32,
    /// Read from the committed table (else from the epoch's output table, after another
    /// holding of the epoch wrote it there).
    pub committed: bool,
    pub read: u32,
    pub written: u32,
}

/// CRC-32s of the table an epoch started from and of the table it committed, as 8 hex digits:
/// the CRC-32 of the partitions' CRC-32s in partition order, each as 4 little-endian bytes
/// (`zlib.crc32` over the regions of the table file gives the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableCrc {
    pub start: String,
    pub end: String,
}

/// The CRC-32 of a table from its partitions' CRC-32s (see [`TableCrc`]).
pub fn table_crc(parts: &[u32]) -> String {
    let bytes: Vec<u8> = parts.iter().flat_map(|c| c.to_le_bytes()).collect();
    format!("{:08x}", crc32fast::hash(&bytes))
}

/// Checks that the ranks of epoch `epoch` trained one table: for every partition, one holding
/// read it from the committed table and every other holding read exactly what an earlier
/// holding wrote, so the holdings form one chain. Returns the CRCs of the table the epoch
/// started from and of the table it leaves in the output file (each chain's last write).
pub fn check_holdings(epoch: usize, partitions: u32, ranks: &[RankReport]) -> Result<TableCrc> {
    let broken = |p: u32, why: String| {
        EmbedError::Corrupt(format!(
            "epoch {}: partition {p} {why}; the ranks did not train one table, so the epoch is not committed",
            epoch + 1
        ))
    };
    let mut by_part: Vec<Vec<Holding>> = vec![Vec::new(); partitions as usize];
    for h in ranks.iter().flat_map(|r| &r.holdings) {
        let list = by_part
            .get_mut(h.part as usize)
            .ok_or_else(|| broken(h.part, format!("is outside the table's {partitions}")))?;
        list.push(*h);
    }
    let (mut start, mut end) = (Vec::new(), Vec::new());
    for (p, mut left) in (0u32..).zip(by_part) {
        let first: Vec<usize> = (0..left.len()).filter(|&i| left[i].committed).collect();
        if first.len() != 1 {
            return Err(broken(
                p,
                format!(
                    "was read from the committed table {} times, not once",
                    first.len()
                ),
            ));
        }
        let first = left.swap_remove(first[0]);
        let mut now = first.written;
        // A holding that changed nothing (its buckets had no edges) leaves the version as it
        // was; every other one moves the chain to a version no holding has read yet.
        while let Some(i) = (0..left.len())
            .filter(|&i| left[i].read == now)
            .min_by_key(|&i| left[i].written != now)
        {
            now = left.swap_remove(i).written;
        }
        if let Some(h) = left.first() {
            return Err(broken(
                p,
                format!(
                    "was read from the epoch's table as version {:08x}, which no holding wrote",
                    h.read
                ),
            ));
        }
        start.push(first.read);
        end.push(now);
    }
    Ok(TableCrc {
        start: table_crc(&start),
        end: table_crc(&end),
    })
}

/// The test-only fault point `embed.dist.eE.WHAT`, `E` the epoch being trained counted from 1
/// (see `strata_io::durable`; the name is built only when a fault is armed).
pub fn fault_point(epoch: usize, what: &str) {
    if strata_io::durable::fault_armed() {
        strata_io::durable::fault_point(&format!("embed.dist.e{}.{what}", epoch + 1));
    }
}

impl RankReport {
    /// The group's epoch: edges per second of all ranks together over the slowest rank's
    /// time, loss weighted by each rank's edges, loads, bytes and waits summed.
    pub fn combine(ranks: &[RankReport]) -> EpochReport {
        let first = &ranks[0].report;
        let edges = |r: &EpochReport| r.edges_per_second * r.seconds;
        let total_edges: f64 = ranks.iter().map(|r| edges(&r.report)).sum();
        let seconds = ranks.iter().map(|r| r.report.seconds).fold(0.0, f64::max);
        let sum_f = |f: fn(&EpochReport) -> f64| ranks.iter().map(|r| f(&r.report)).sum::<f64>();
        let sum_u = |f: fn(&EpochReport) -> u64| ranks.iter().map(|r| f(&r.report)).sum::<u64>();
        let sum_n = |f: fn(&EpochReport) -> usize| ranks.iter().map(|r| f(&r.report)).sum();
        let io_wait = sum_f(|r| r.io_wait_seconds);
        EpochReport {
            epoch: first.epoch,
            loss: ranks
                .iter()
                .map(|r| r.report.loss * edges(&r.report))
                .sum::<f64>()
                / total_edges.max(1.0),
            seconds,
            edges_per_second: total_edges / seconds.max(1e-9),
            io_wait_seconds: io_wait,
            io_wait_fraction: io_wait / sum_f(|r| r.seconds).max(1e-9),
            partition_loads: sum_n(|r| r.partition_loads),
            loads_read_ahead: sum_n(|r| r.loads_read_ahead),
            partition_bytes_read: sum_u(|r| r.partition_bytes_read),
            partition_bytes_written: sum_u(|r| r.partition_bytes_written),
            edge_bytes_read: sum_u(|r| r.edge_bytes_read),
            buffer_states: sum_n(|r| r.buffer_states),
            swaps: sum_n(|r| r.swaps),
            step_flops_per_thread: sum_f(|r| r.step_flops_per_thread) / ranks.len() as f64,
            step_flops_total: sum_f(|r| r.step_flops_total),
            // Each rank's device counters stay in its own report.
            device: None,
            // Ranks write their parts back within their epochs.
            written_behind: None,
        }
    }
}

/// One line of what a rank did in an epoch of `epochs`.
pub fn describe_rank(r: &RankReport, epochs: usize) -> String {
    let e = &r.report;
    format!(
        "rank {} epoch {}/{}: {} buckets, loss {:.4}, {:.2} s, {:.0} edges/s, {} partition loads ({} prefetched), I/O wait {:.2} s, partition wait {:.2} s ({:.1}%), {} relation rounds, {} waits ({:.2} s on the group), sent {}, received {}",
        r.rank,
        e.epoch,
        epochs,
        r.buckets,
        e.loss,
        e.seconds,
        e.edges_per_second,
        e.partition_loads,
        r.prefetched_loads,
        e.io_wait_seconds,
        r.partition_wait_seconds,
        100.0 * r.partition_wait_share,
        r.relation_rounds,
        r.waits,
        r.group_wait_seconds,
        strata_store::units::fmt_bytes(r.bytes_sent),
        strata_store::units::fmt_bytes(r.bytes_received)
    )
}

/// Rank `rank` of a group of two for unit tests: no scheduler, and a relation round adds
/// `peer` (the other rank's changes since the last round) to the values it sums (`None`: no
/// round runs in the test).
#[cfg(test)]
pub(crate) struct TestRank {
    pub rank: usize,
    pub peer: Option<Vec<f32>>,
}

#[cfg(test)]
impl Cluster for TestRank {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        2
    }
    fn acquire(&mut self, _: usize, _: &[u32], _: u32, _: usize) -> Result<Grant> {
        unreachable!("no epoch runs here")
    }
    fn release(&mut self, _: usize, _: &[u32]) -> Result<()> {
        unreachable!("no epoch runs here")
    }
    fn sync(&mut self, values: &mut [f32], done: bool) -> Result<bool> {
        let peer = self.peer.as_ref().expect("no round runs here");
        assert_eq!(values.len(), peer.len());
        values.iter_mut().zip(peer).for_each(|(v, p)| *v += p);
        Ok(done)
    }
    fn barrier(&mut self, _: &str) -> Result<()> {
        Ok(())
    }
    fn gather(&mut self, _: String) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
    fn broadcast(&mut self, text: String) -> Result<String> {
        Ok(text)
    }
    fn traffic(&self) -> (u64, u64) {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(rank: usize, seconds: f64, edges: f64, loss: f64, loads: usize) -> RankReport {
        RankReport {
            rank,
            report: EpochReport {
                epoch: 3,
                loss,
                seconds,
                edges_per_second: edges / seconds,
                io_wait_seconds: 0.5,
                io_wait_fraction: 0.5 / seconds,
                partition_loads: loads,
                loads_read_ahead: 0,
                partition_bytes_read: 100,
                partition_bytes_written: 10,
                edge_bytes_read: 1,
                buffer_states: 4,
                swaps: 2,
                step_flops_per_thread: 2.0,
                step_flops_total: 2.0,
                device: None,
                written_behind: None,
            },
            buckets: 4,
            relation_rounds: 2,
            waits: 0,
            group_wait_seconds: 0.0,
            bytes_sent: 5,
            bytes_received: 5,
            partition_wait_seconds: 0.25,
            partition_wait_share: 0.25 / seconds,
            partition_bytes_loaded: 100,
            prefetched_loads: 1,
            holdings: Vec::new(),
        }
    }

    fn held(part: u32, committed: bool, read: u32, written: u32) -> Holding {
        Holding {
            part,
            committed,
            read,
            written,
        }
    }

    #[test]
    fn holdings_chain_from_the_committed_table_to_the_last_write() {
        let mut a = rank(0, 1.0, 1.0, 1.0, 1);
        let mut b = rank(1, 1.0, 1.0, 1.0, 1);
        // Partition 0: rank 0 reads 10 and writes 11, rank 1 then writes 12, rank 0 changes
        // nothing (an empty bucket), then writes 13. Partition 1: one holding.
        a.holdings = vec![
            held(0, true, 10, 11),
            held(1, true, 20, 21),
            held(0, false, 12, 12),
        ];
        b.holdings = vec![held(0, false, 12, 13), held(0, false, 11, 12)];
        let crc = check_holdings(0, 2, &[a.clone(), b.clone()]).unwrap();
        assert_eq!(crc.start, table_crc(&[10, 20]));
        assert_eq!(crc.end, table_crc(&[13, 21]));
        // The same bytes through zlib's CRC-32 (what the tests compute from the file).
        assert_eq!(table_crc(&[]), "00000000");
        assert_eq!(
            table_crc(&[0x6f72_6c64]),
            format!("{:08x}", crc32fast::hash(b"dlro"))
        );
        // A rank that read a version of partition 0 no holding wrote (a table left by another
        // attempt, say) breaks the chain.
        b.holdings[0].read = 99;
        let err = check_holdings(2, 2, &[a.clone(), b.clone()]).unwrap_err();
        assert!(err.to_string().contains("epoch 3: partition 0"), "{err}");
        // Two reads from the committed table: one of them is not the epoch's start.
        b.holdings = vec![held(0, true, 10, 11)];
        assert!(check_holdings(0, 2, &[a.clone(), b]).is_err());
        // A partition nobody trained.
        a.holdings = vec![held(0, true, 10, 11)];
        let err = check_holdings(0, 2, &[a]).unwrap_err();
        assert!(
            err.to_string()
                .contains("partition 1 was read from the committed table 0 times"),
            "{err}"
        );
    }

    #[test]
    fn the_groups_epoch_sums_the_ranks_over_the_slowest() {
        let g = RankReport::combine(&[rank(0, 2.0, 300.0, 1.0, 3), rank(1, 4.0, 100.0, 2.0, 5)]);
        assert_eq!(g.epoch, 3);
        assert_eq!(g.seconds, 4.0);
        assert!((g.edges_per_second - 100.0).abs() < 1e-9);
        assert!((g.loss - 1.25).abs() < 1e-12, "{}", g.loss);
        assert_eq!((g.partition_loads, g.partition_bytes_read), (8, 200));
        assert!((g.io_wait_fraction - 1.0 / 6.0).abs() < 1e-12);
    }
}
