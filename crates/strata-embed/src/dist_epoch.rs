//! An epoch of a distributed run (docs/distributed.md): buckets come one at a time from the
//! group's scheduler instead of a precomputed schedule, partitions are locked while resident,
//! and the relation rows are combined across ranks by all-reduce of their deltas.
//!
//! With a shared run directory, partitions move through its table files: a rank writes a
//! partition back to the epoch's output table before it releases it, and the next holder
//! reads it from there. In owner mode a partition another rank owns is read from and written
//! back to that owner through a [`PartitionSource`]; the owner's tables play the same roles.
//! Swaps are synchronous here (each counted as I/O wait); the bucket's edges are still read
//! ahead piece by piece while the previous piece trains.
//!
//! Negative banks (the `all` pool) are shared this way: at the start of an epoch every rank
//! reads the bank blocks of the partitions it owns ([`owner_of`]) from the committed table and
//! the blocks are summed over the ranks, so every rank starts with the same exact blocks. A
//! rank refreshes a block when it evicts the partition and applies its own pending gradient
//! when it loads one, as a single process does; meanwhile a block of a partition another rank
//! trains is stale, by up to one epoch. After every rank is done, what gradient is left is
//! summed over the ranks and applied by each partition's owner, which reads the partition from
//! the epoch's output table and writes it back: no rank holds any partition then, and each is
//! flushed by one rank, so the write-back extends the partition's holdings chain like any other.

use std::sync::Arc;
use std::time::Instant;

use strata_io::progress::{Meter, Progress};

use crate::buffer::PartitionBuffer;
use crate::dist::{fault_point, owner_of, Cluster, Grant, Holding, PartitionSource, RankReport};
use crate::epoch::{Interval, Tally, Timeline, Trainer};
use crate::epoch_io::prefetch_edges;
use crate::error::{EmbedError, Result};
use crate::relations::Relations;
use crate::table::TableFile;

/// The relation rows (parameters, then optimizer state) as of the last round, identical on
/// every rank: a round sums each rank's change since then.
struct RelationRounds {
    base: Vec<f32>,
    scratch: Vec<f32>,
    rounds: usize,
}

impl RelationRounds {
    fn new(rel: &Relations) -> RelationRounds {
        let base: Vec<f32> = rel.params.iter().chain(&rel.state).copied().collect();
        RelationRounds {
            scratch: vec![0.0; base.len()],
            base,
            rounds: 0,
        }
    }

    /// One round: every rank's delta summed into the base, which becomes every rank's rows.
    /// Returns whether every rank is done with the epoch.
    fn round(
        &mut self,
        rel: &mut Relations,
        cluster: &mut dyn Cluster,
        done: bool,
    ) -> Result<bool> {
        let split = rel.params.len();
        for (d, (now, base)) in self
            .scratch
            .iter_mut()
            .zip(rel.params.iter().chain(&rel.state).zip(&self.base))
        {
            *d = now - base;
        }
        let all_done = cluster.sync(&mut self.scratch, done)?;
        for (base, d) in self.base.iter_mut().zip(&self.scratch) {
            *base += d;
        }
        rel.params.copy_from_slice(&self.base[..split]);
        rel.state.copy_from_slice(&self.base[split..]);
        self.rounds += 1;
        Ok(all_done)
    }
}

/// The partitions a rank held this epoch, with the CRC-32 of what it read and wrote.
#[derive(Default)]
struct Ledger {
    holdings: Vec<Holding>,
    /// The open holding of each resident partition: `(partition, index in holdings)`.
    open: Vec<(u32, usize)>,
}

impl Ledger {
    fn loaded(&mut self, part: u32, committed: bool, read: u32) {
        self.open.push((part, self.holdings.len()));
        self.holdings.push(Holding {
            part,
            committed,
            read,
            written: read,
        });
    }

    fn written(&mut self, part: u32, crc: u32) {
        let at = self.open.iter().position(|&(p, _)| p == part);
        let (_, i) = self
            .open
            .swap_remove(at.expect("a written partition was loaded"));
        self.holdings[i].written = crc;
    }
}

/// Where each partition of an epoch is read from and written back to: this rank's tables,
/// or (owner mode) the rank that owns it; every load and write-back is noted in the ledger.
struct Homes<'a, 'b> {
    epoch: usize,
    current: &'a TableFile,
    next: &'a TableFile,
    rank: usize,
    world_size: usize,
    peers: Option<&'a mut (dyn PartitionSource + 'b)>,
    ledger: Ledger,
}

impl<'b> Homes<'_, 'b> {
    fn remote(&mut self, p: u32) -> Option<&mut (dyn PartitionSource + 'b)> {
        let local = owner_of(p, self.world_size) == self.rank;
        match self.peers.as_deref_mut() {
            Some(peers) if !local => Some(peers),
            _ => None,
        }
    }

    /// Loads `p` into `slot`: from `next` when `written` this epoch, else from `current`.
    fn load(
        &mut self,
        buffer: &mut PartitionBuffer,
        slot: usize,
        p: u32,
        written: bool,
    ) -> Result<()> {
        let epoch = self.epoch;
        match self.remote(p) {
            Some(peers) => buffer.load_with(slot, p, |into| peers.read(epoch, p, written, into))?,
            None => buffer.load(slot, p, if written { self.next } else { self.current })?,
        }
        self.ledger.loaded(p, !written, buffer.checksum(p));
        Ok(())
    }

    /// Writes resident `p` back to `next` (its owner's, in owner mode) and frees its slot.
    fn evict(&mut self, buffer: &mut PartitionBuffer, p: u32) -> Result<()> {
        let epoch = self.epoch;
        self.ledger.written(p, buffer.checksum(p));
        match self.remote(p) {
            Some(peers) => {
                peers.write(epoch, p, buffer.region(p))?;
                buffer.forget(p);
                Ok(())
            }
            None => buffer.evict(p, self.next),
        }
    }

    fn traffic(&self) -> (u64, u64) {
        self.peers.as_ref().map_or((0, 0), |p| p.traffic())
    }
}

/// Floats summed in one all-reduce when banks are shared (bounds the transport's copies).
const SUM_PIECE: usize = 1 << 22;

/// Sums `values` over the ranks in place, in pieces of at most [`SUM_PIECE`] floats.
fn sum_over_ranks(cluster: &mut dyn Cluster, values: &mut [f32]) -> Result<()> {
    for piece in values.chunks_mut(SUM_PIECE) {
        cluster.sync(piece, false)?;
    }
    Ok(())
}

impl Trainer {
    /// Fills this epoch's bank blocks, the same on every rank: each rank reads the blocks of
    /// the partitions it owns from `current` (the committed table) and the blocks are summed
    /// over the ranks. No-op without banks (the same on every rank: one config, one plan).
    fn share_banks(
        &mut self,
        epoch: usize,
        current: &TableFile,
        cluster: &mut dyn Cluster,
    ) -> Result<()> {
        let Some(banks) = &mut self.banks else {
            return Ok(());
        };
        let (rank, world_size) = (cluster.rank(), cluster.world_size());
        // The sums below need one shape on every rank: each rank plans bank rows within its
        // own --memory, so check that they agree.
        let mut rows = [banks.capacity() as f32];
        cluster.sync(&mut rows, false)?;
        if rows[0] != (banks.capacity() * world_size) as f32 {
            return Err(EmbedError::Config(format!(
                "rank {rank} planned {} negative bank rows per partition, another rank planned a different number; give every rank the same --memory and embed.train.bank_rows",
                banks.capacity()
            )));
        }
        let partitioning = &self.buckets.partitioning;
        banks.choose_blocks(partitioning, self.cfg.seed, epoch);
        banks.rows_mut().fill(0.0);
        for p in (0..partitioning.partitions).filter(|&p| owner_of(p, world_size) == rank) {
            banks.read(p, current, self.buffer.engine(), &self.buffer.layout)?;
        }
        sum_over_ranks(cluster, banks.rows_mut())
    }

    /// Makes `p` resident in `slot` through `homes` and applies the gradient its bank rows
    /// received on this rank since.
    fn load_from(&mut self, homes: &mut Homes, slot: usize, p: u32, written: bool) -> Result<()> {
        homes.load(&mut self.buffer, slot, p, written)?;
        self.apply_bank_gradient(p);
        Ok(())
    }

    /// Writes resident `p` back through `homes`, refreshing its bank block as it leaves.
    fn evict_to(&mut self, homes: &mut Homes, p: u32) -> Result<()> {
        if let Some(banks) = &mut self.banks {
            banks.copy_from(p, self.buffer.embeddings(p));
        }
        homes.evict(&mut self.buffer, p)
    }

    /// After every rank is done: sums the bank gradient left on the ranks and applies each
    /// partition's share on its owner, which reads it from `next` and writes it back. Returns
    /// the partitions read.
    fn flush_shared_banks(
        &mut self,
        homes: &mut Homes,
        cluster: &mut dyn Cluster,
    ) -> Result<usize> {
        let Some(banks) = &self.banks else {
            return Ok(0);
        };
        let mut grad = banks.take_grad();
        sum_over_ranks(cluster, &mut grad)?;
        let (rank, world_size) = (cluster.rank(), cluster.world_size());
        banks.set_grad(&grad, |p| owner_of(p, world_size) == rank);
        let mine: Vec<u32> = (0..self.buckets.partitioning.partitions)
            .filter(|&p| banks.has_pending(p))
            .collect();
        for &p in &mine {
            let slot = self
                .buffer
                .free_slot()
                .expect("every partition is written back when all ranks are done");
            self.load_from(homes, slot, p, true)?;
            homes.evict(&mut self.buffer, p)?;
        }
        Ok(mine.len())
    }

    /// One epoch of a distributed run on this rank: partitions are read from `current`, or
    /// from `next` when the scheduler says they were written back this epoch, and every
    /// partition this rank held is written back to `next` (synced) by the time it returns.
    /// With `peers` (owner mode) `current` and `next` are this rank's own tables, which hold
    /// the partitions it owns; the others come from and go back to their owners, and this
    /// rank's tables are served to the other ranks.
    pub fn epoch_scheduled(
        &mut self,
        epoch: usize,
        current: &Arc<TableFile>,
        next: &Arc<TableFile>,
        cluster: &mut dyn Cluster,
        mut peers: Option<&mut (dyn PartitionSource + '_)>,
        progress: &dyn Progress,
    ) -> Result<(RankReport, Vec<Interval>)> {
        let engine = self.buffer.engine().clone();
        let origin = Instant::now();
        let mut tl = Timeline {
            origin,
            events: Vec::new(),
        };
        if let Some(p) = peers.as_deref_mut() {
            p.serve(epoch, current, next, &self.buffer.layout)?;
        }
        let mut homes = Homes {
            epoch,
            current,
            next,
            rank: cluster.rank(),
            world_size: cluster.world_size(),
            peers,
            ledger: Ledger::default(),
        };
        let io_before = engine.stats();
        let traffic_before = cluster.traffic();
        let moved_before = homes.traffic();
        let mut tally = Tally::default();
        let mut meter = Meter::new(
            progress,
            &format!(
                "epoch {}/{} (rank {})",
                epoch + 1,
                self.cfg.epochs,
                cluster.rank()
            ),
            0,
            0,
        );
        for w in &mut self.workers {
            w.reset_counters();
        }
        // What this rank held last epoch may have been trained by another rank since.
        self.buffer.clear();
        self.share_banks(epoch, current, cluster)?;
        let mut rounds = RelationRounds::new(&self.relations);
        let (mut trained, mut since_round, mut waits, mut evictions) = (0usize, 0usize, 0, 0);
        let mut group_wait = 0.0;
        loop {
            let held: Vec<u32> = self.buffer.resident().collect();
            let t = Instant::now();
            let grant = cluster.acquire(
                epoch,
                &held,
                self.buckets.partitioning.partitions,
                self.buffer.capacity(),
            )?;
            group_wait += t.elapsed().as_secs_f64();
            match grant {
                Grant::Bucket {
                    bucket,
                    evict,
                    written,
                } => {
                    let t = Instant::now();
                    for &p in &evict {
                        self.evict_to(&mut homes, p)?;
                    }
                    if !evict.is_empty() {
                        cluster.release(epoch, &evict)?;
                        evictions += evict.len();
                    }
                    let mut parts = vec![bucket.0, bucket.1];
                    parts.dedup();
                    for p in parts {
                        if self.buffer.slot_of(p).is_some() {
                            continue;
                        }
                        let slot = self.buffer.free_slot().ok_or_else(|| {
                            EmbedError::Corrupt(format!(
                                "the scheduler granted bucket {bucket:?} without room for partition {p} in a buffer of {}",
                                self.buffer.capacity()
                            ))
                        })?;
                        self.load_from(&mut homes, slot, p, written.contains(&p))?;
                        tally.loads += 1;
                    }
                    let now = Instant::now();
                    if now - t > std::time::Duration::from_micros(50) {
                        tally.io_wait += (now - t).as_secs_f64();
                        tl.add("io", trained, t, now, format!("swap for {bucket:?}"));
                        tl.add("wait", trained, t, now, format!("swap for {bucket:?}"));
                    }
                    let (rx, edges) = prefetch_edges(
                        engine.clone(),
                        self.buckets.clone(),
                        vec![bucket],
                        self.piece_rows,
                        2,
                        self.relation_ids(),
                    );
                    let result = self
                        .run_bucket(&rx, bucket, epoch, trained, &mut tl, &mut tally, &mut meter);
                    drop(rx);
                    let _ = edges.join();
                    result?;
                    trained += 1;
                    fault_point(epoch, "bucket");
                    since_round += 1;
                    if since_round >= self.cfg.relation_sync_every {
                        let t = Instant::now();
                        rounds.round(&mut self.relations, cluster, false)?;
                        group_wait += t.elapsed().as_secs_f64();
                        since_round = 0;
                    }
                }
                Grant::Wait | Grant::Done => {
                    let t = Instant::now();
                    let held: Vec<u32> = self.buffer.resident().collect();
                    for &p in &held {
                        self.evict_to(&mut homes, p)?;
                    }
                    if !held.is_empty() {
                        cluster.release(epoch, &held)?;
                    }
                    tally.io_wait += t.elapsed().as_secs_f64();
                    let done = grant == Grant::Done;
                    waits += usize::from(!done);
                    let t = Instant::now();
                    // Done: keep joining rounds until every rank is, so all leave together.
                    while !rounds.round(&mut self.relations, cluster, done)? && done {}
                    group_wait += t.elapsed().as_secs_f64();
                    if done {
                        break;
                    }
                }
            }
        }
        let t = Instant::now();
        tally.loads += self.flush_shared_banks(&mut homes, cluster)?;
        next.sync()?;
        tally.io_wait += t.elapsed().as_secs_f64();
        meter.finish()?;
        let io = engine.stats().since(&io_before);
        let report = self.report(epoch, origin, &tally, &io, trained, evictions);
        let (sent, received) = cluster.traffic();
        let (moved_out, moved_in) = homes.traffic();
        Ok((
            RankReport {
                rank: cluster.rank(),
                report,
                buckets: trained,
                relation_rounds: rounds.rounds,
                waits,
                group_wait_seconds: group_wait,
                bytes_sent: sent - traffic_before.0 + moved_out - moved_before.0,
                bytes_received: received - traffic_before.1 + moved_in - moved_before.1,
                holdings: homes.ledger.holdings,
            },
            tl.events,
        ))
    }
}
