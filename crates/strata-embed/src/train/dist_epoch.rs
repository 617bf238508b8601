//! An epoch of a distributed run (docs/distributed.md): buckets come one at a time from the
//! group's scheduler instead of a precomputed schedule, partitions are locked while resident,
//! and the relation rows are combined across ranks by all-reduce of their deltas.
//!
//! With a shared run directory, partitions move through its table files: a rank writes a
//! partition back to the epoch's output table before it releases it, and the next holder
//! reads it from there. In owner mode a partition another rank owns is read from and written
//! back to that owner through a [`PartitionSource`]; the owner's tables play the same roles.
//!
//! Partitions move on a mover thread. With `dist_prefetch` (and prefetch slots in the plan) a
//! rank asks for its next grant before it trains the current bucket, and the mover loads that
//! grant's partitions into free slots, and writes back the partitions it evicts that the
//! current bucket does not use, while the bucket trains (a lookahead of one grant). What the
//! lookahead could not start (write-backs of the current bucket's partitions, loads without a
//! free slot) moves after the bucket, while the trainer waits. A partition is released to the
//! scheduler only once its write-back returned, and the next grant is asked for only after
//! the previous one's releases, so the scheduler's locks cover every move in flight.
//!
//! A typed run's pinned region (its unpartitioned and featurized entity types) is every rank's:
//! each reads it from the committed table when the epoch starts and trains it with its buckets,
//! and the relation rounds sum its changes over the ranks with the relation rows'. After the
//! last round every rank holds the same region, and rank 0 writes it back: its holding is the
//! region's chain in the epoch's table check. In owner mode every rank keeps a copy in its own
//! tables (each initialises it alike and writes it back after the last round). In a bf16 table
//! the rounds sum the region in float32 and round each sum back stochastically with noise of
//! the run's seed, the epoch, the round and the value's position, which every rank draws alike.
//!
//! Negative banks (the `all` pool) are shared this way: at the start of an epoch every rank
//! reads the bank blocks of the partitions it owns ([`owner_of`]) from the committed table and
//! the blocks are summed over the ranks, so every rank starts with the same exact blocks. A
//! rank refreshes a block when it writes the partition back and applies its own pending
//! gradient when a load of it lands, as a single process does; meanwhile a block of a
//! partition another rank trains is stale, by up to one epoch. With `bank_sync_every` the
//! ranks also sum their pending gradient at relation rounds, and the rank holding a partition
//! applies it then instead of at the next load. After every rank is done, what
//! gradient is left is summed over the ranks and applied by each partition's owner, which reads
//! the partition from the epoch's output table and writes it back: no rank holds any partition
//! then, and each is flushed by one rank, so the write-back extends the partition's holdings
//! chain like any other.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{unbounded, Receiver, Sender};
use strata_io::progress::Progress;
use strata_io::{AlignedBuf, Engine};
use strata_store::rng::derive;

use crate::compute::backend::SlotKind;
use crate::compute::bf16;
use crate::config::{DistStorage, TableDtype};
use crate::error::{EmbedError, Result};
use crate::ordering::Bucket;
use crate::storage::epoch_io::BucketEdges;
use crate::storage::layout::TableLayout;
use crate::storage::table::TableFile;
use crate::train::dist::{
    fault_point, owner_of, Cluster, Grant, Holding, PartitionSource, RankReport,
};
use crate::train::epoch::{EpochReport, Interval, Pass, Tally, Timeline, Trainer};

/// Key of the epoch salts of the relation rounds' bf16 roundings (derived from the run's seed).
const ROUND_SALT: u64 = 0x50d5;

/// How long a rank told to wait pauses before it asks again, when no round is due.
const WAIT_PAUSE: Duration = Duration::from_millis(20);

/// The epoch's edge reader ([`prefetch_edges`]) with the channel that feeds it buckets. On drop
/// (the epoch's end or an error) it hangs up both ways and joins the reader.
struct EdgeFeed {
    buckets: Option<Sender<(u32, u32)>>,
    pieces: Option<Receiver<BucketEdges>>,
    reader: Option<std::thread::JoinHandle<()>>,
}

impl EdgeFeed {
    fn start(trainer: &Trainer, engine: &Arc<Engine>) -> EdgeFeed {
        let (tx, order) = unbounded();
        let (pieces, reader) = trainer.read_edges(engine, order);
        EdgeFeed {
            buckets: Some(tx),
            pieces: Some(pieces),
            reader: Some(reader),
        }
    }

    /// Queues a granted bucket's edges (grants are trained in the order they are queued).
    fn queue(&self, grant: &Grant) {
        if let (Grant::Bucket { bucket, .. }, Some(tx)) = (grant, &self.buckets) {
            // A reader that stopped on an error reports it through `pieces`.
            let _ = tx.send(*bucket);
        }
    }

    fn pieces(&self) -> &Receiver<BucketEdges> {
        self.pieces.as_ref().expect("open until dropped")
    }
}

impl Drop for EdgeFeed {
    fn drop(&mut self) {
        self.buckets.take();
        self.pieces.take();
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// A run of values a relation round keeps identical on every rank, as its table stores them.
enum RoundValues<'a> {
    F32(&'a mut [f32]),
    /// A bf16 table's pinned region (rows and state): widened for the sum, rounded back.
    Bf16(&'a mut [u16]),
}

impl RoundValues<'_> {
    fn len(&self) -> usize {
        match self {
            RoundValues::F32(v) => v.len(),
            RoundValues::Bf16(v) => v.len(),
        }
    }

    /// Writes the values, widened, into `out` (same length).
    fn widen_into(&self, out: &mut [f32]) {
        match self {
            RoundValues::F32(v) => out.copy_from_slice(v),
            RoundValues::Bf16(v) => bf16::widen(v, out),
        }
    }

    /// Stores `sum` (same length) as the values. A bf16 value is rounded stochastically with
    /// the noise of `salt` at its position, so every rank, holding the same sum and salt,
    /// stores the same value; `sum` becomes what was stored.
    fn store(&mut self, sum: &mut [f32], salt: u64) {
        match self {
            RoundValues::F32(v) => v.copy_from_slice(sum),
            RoundValues::Bf16(v) => {
                for (i, (h, x)) in v.iter_mut().zip(sum.iter_mut()).enumerate() {
                    *h = bf16::round_stochastic(*x, bf16::noise(salt, i));
                    *x = bf16::to_f32(*h);
                }
            }
        }
    }
}

/// The values every rank keeps identical ([`Trainer::round_values`]: the relation rows and
/// their optimizer state, and a typed run's pinned region) as of the last round: a round sums
/// each rank's change since then.
struct RelationRounds {
    base: Vec<f32>,
    scratch: Vec<f32>,
    rounds: usize,
    /// The epoch's salt of the bf16 roundings, the same on every rank.
    salt: u64,
}

impl RelationRounds {
    fn new(values: &[RoundValues], salt: u64) -> RelationRounds {
        let mut base = vec![0.0; values.iter().map(RoundValues::len).sum()];
        widen_all(values, &mut base);
        RelationRounds {
            scratch: vec![0.0; base.len()],
            base,
            rounds: 0,
            salt,
        }
    }

    /// One round: every rank's delta summed into the base, which becomes every rank's values
    /// (a bf16 one rounded: the sum of two ranks' changes to a value need not be a bf16).
    /// Returns whether every rank is done with the epoch.
    fn round(
        &mut self,
        values: &mut [RoundValues],
        cluster: &mut dyn Cluster,
        done: bool,
    ) -> Result<bool> {
        widen_all(values, &mut self.scratch);
        for (d, base) in self.scratch.iter_mut().zip(&self.base) {
            *d -= base;
        }
        let all_done = cluster.sync(&mut self.scratch, done)?;
        for (base, d) in self.base.iter_mut().zip(&self.scratch) {
            *base += d;
        }
        let salt = derive(self.salt, self.rounds as u64);
        let mut at = 0;
        for v in values.iter_mut() {
            let n = v.len();
            v.store(&mut self.base[at..at + n], salt);
            at += n;
        }
        self.rounds += 1;
        Ok(all_done)
    }
}

/// `values` widened, one after another, into `out`.
fn widen_all(values: &[RoundValues], out: &mut [f32]) {
    let mut at = 0;
    for v in values {
        v.widen_into(&mut out[at..at + v.len()]);
        at += v.len();
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

/// One partition move, with the slot buffer it fills or empties.
enum Job {
    /// Read partition `p` into `buf` (slot `slot`'s): from `next` when `written` this epoch.
    Read {
        p: u32,
        written: bool,
        slot: usize,
        buf: AlignedBuf,
    },
    /// Write partition `p` from `buf` (taken out of slot `slot`) back to `next`.
    Write {
        p: u32,
        slot: usize,
        buf: AlignedBuf,
    },
}

/// A finished move: the job (its buffer back), the CRC-32 of the region read or written.
struct Moved {
    job: Job,
    crc: u32,
    result: Result<()>,
    started: Instant,
    finished: Instant,
}

/// Where each partition of an epoch is read from and written back to: this rank's tables, or
/// (owner mode) the rank that owns it. Lives on the mover thread.
struct Homes<'a, 'b> {
    epoch: usize,
    engine: Arc<Engine>,
    layout: TableLayout,
    current: Arc<TableFile>,
    next: Arc<TableFile>,
    rank: usize,
    world_size: usize,
    peers: Option<&'a mut (dyn PartitionSource + 'b)>,
}

impl Homes<'_, '_> {
    fn move_one(&mut self, job: &mut Job) -> (Result<()>, u32) {
        let bytes = self.layout.part_bytes() as usize;
        let (epoch, world_size, rank) = (self.epoch, self.world_size, self.rank);
        let remote = |p: u32| owner_of(p, world_size) != rank;
        let result = match job {
            Job::Read {
                p, written, buf, ..
            } => match self.peers.as_deref_mut() {
                Some(peers) if remote(*p) => {
                    peers.read(epoch, *p, *written, &mut buf.full_mut()[..bytes])
                }
                _ => {
                    let from = if *written { &self.next } else { &self.current };
                    from.read_partition(&self.engine, &self.layout, *p, buf)
                }
            },
            Job::Write { p, buf, .. } => match self.peers.as_deref_mut() {
                Some(peers) if remote(*p) => peers.write(epoch, *p, buf.prefix(bytes)),
                _ => self
                    .next
                    .write_partition(&self.engine, &self.layout, *p, buf),
            },
        };
        let buf = match job {
            Job::Read { buf, .. } | Job::Write { buf, .. } => buf,
        };
        (result, crc32fast::hash(buf.prefix(bytes)))
    }

    /// Moves every job in turn until the trainer hangs up; returns the partition traffic.
    fn serve(mut self, jobs: Receiver<Job>, done: Sender<Moved>) -> (u64, u64) {
        for mut job in jobs {
            let started = Instant::now();
            let (result, crc) = self.move_one(&mut job);
            let moved = Moved {
                job,
                crc,
                result,
                started,
                finished: Instant::now(),
            };
            if done.send(moved).is_err() {
                break;
            }
        }
        self.peers.as_ref().map_or((0, 0), |p| p.traffic())
    }
}

/// The trainer's end of the mover thread: jobs sent, and how many are still to be collected.
struct Mover {
    jobs: Sender<Job>,
    done: Receiver<Moved>,
    outstanding: usize,
}

impl Mover {
    fn send(&mut self, job: Job) {
        // The mover only stops when this end hangs up or its owner call panicked; the
        // collection below reports the latter.
        let _ = self.jobs.send(job);
        self.outstanding += 1;
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

/// The loop state of a rank's epoch: its pass, the partitions it held, its relation rounds
/// and what it counts for its report.
struct RankPass<'p> {
    pass: Pass<'p>,
    ledger: Ledger,
    rounds: RelationRounds,
    /// Rounds during the epoch carry relation deltas and bank gradient; with neither (dot
    /// without `bank_sync_every`) the ranks meet once, when all are done, and a rank told to
    /// wait asks again after a pause instead of joining a round.
    rounds_carry: bool,
    /// The scheduler's view of this rank's buffer: the prefetch slots are the lookahead's.
    capacity: usize,
    /// Buckets trained, and since the last relation round.
    trained: usize,
    since_round: usize,
    waits: usize,
    evictions: usize,
    group_wait: f64,
    parts_wait: Waits,
    /// The next grant, asked for while the current bucket trains (`dist_prefetch`).
    ahead: Option<Grant>,
}

impl RankPass<'_> {
    /// This rank's report of the epoch: the pass's `report`, the group `traffic` (bytes sent
    /// and received) and the partition bytes it `loaded`.
    fn rank_report(
        &mut self,
        rank: usize,
        report: EpochReport,
        traffic: (u64, u64),
        loaded: u64,
    ) -> RankReport {
        let parts_wait = self.parts_wait.seconds;
        RankReport {
            rank,
            buckets: self.trained,
            relation_rounds: self.rounds.rounds,
            waits: self.waits,
            group_wait_seconds: self.group_wait,
            bytes_sent: traffic.0,
            bytes_received: traffic.1,
            partition_wait_seconds: parts_wait,
            partition_wait_share: parts_wait / report.seconds.max(1e-9),
            partition_bytes_loaded: loaded,
            prefetched_loads: self.parts_wait.prefetched,
            holdings: std::mem::take(&mut self.ledger.holdings),
            report,
        }
    }
}

/// What the trainer counts while it waits for partitions.
#[derive(Default)]
struct Waits {
    seconds: f64,
    prefetched: usize,
}

impl Trainer {
    /// Collects every move in flight: loaded partitions become resident, written-back ones
    /// free their slots (returned, to be released). Each move's I/O is on the timeline.
    fn settle(
        &mut self,
        mover: &mut Mover,
        ledger: &mut Ledger,
        tl: &mut Timeline,
        step: usize,
    ) -> Result<Vec<u32>> {
        let mut written = Vec::new();
        let mut failed = None;
        while mover.outstanding > 0 {
            let m = mover
                .done
                .recv()
                .map_err(|_| EmbedError::Corrupt("the partition mover stopped".into()))?;
            mover.outstanding -= 1;
            if let Err(e) = m.result {
                failed.get_or_insert(e);
                continue;
            }
            match m.job {
                Job::Read {
                    p,
                    written: w,
                    slot,
                    buf,
                } => {
                    tl.add("io", step, m.started, m.finished, format!("load {p}"));
                    self.buffer.put(slot, buf, p);
                    ledger.loaded(p, !w, m.crc);
                    self.apply_bank_gradient(p);
                    // A device backend trains the slot where it holds it, from now on.
                    self.slot_filled(p)?;
                }
                Job::Write { p, slot, buf } => {
                    tl.add("io", step, m.started, m.finished, format!("write back {p}"));
                    self.buffer.put_free(slot, buf);
                    ledger.written(p, m.crc);
                    written.push(p);
                }
            }
        }
        failed.map_or(Ok(written), Err)
    }

    /// Starts writing resident `p` back, refreshing its bank block as it leaves (a device
    /// backend first puts its rows into the slot and forgets them).
    fn write_back(&mut self, mover: &mut Mover, p: u32) -> Result<()> {
        self.slot_leaving(p, true)?;
        if let Some(banks) = &mut self.banks {
            banks.copy_from(p, self.buffer.embeddings(p));
        }
        let (slot, buf) = self.buffer.take(p);
        mover.send(Job::Write { p, slot, buf });
        Ok(())
    }

    /// Starts loading `p` into a free slot; false when there is none.
    fn start_load(&mut self, mover: &mut Mover, p: u32, written: bool) -> bool {
        match self.buffer.take_free() {
            Some((slot, buf)) => {
                mover.send(Job::Read {
                    p,
                    written,
                    slot,
                    buf,
                });
                true
            }
            None => false,
        }
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
        if let Some(p) = peers.as_deref_mut() {
            p.serve(epoch, current, next, &self.buffer.layout)?;
        }
        self.share_banks(epoch, current, cluster)?;
        let moved_before = peers.as_ref().map_or((0, 0), |p| p.traffic());
        let homes = Homes {
            epoch,
            engine: engine.clone(),
            layout: self.buffer.layout,
            current: current.clone(),
            next: next.clone(),
            rank: cluster.rank(),
            world_size: cluster.world_size(),
            peers,
        };
        let (jobs_tx, jobs_rx) = unbounded::<Job>();
        let (done_tx, done_rx) = unbounded::<Moved>();
        std::thread::scope(|scope| {
            let mover_thread = std::thread::Builder::new()
                .name("strata-embed-mover".into())
                .spawn_scoped(scope, move || homes.serve(jobs_rx, done_tx))
                .expect("spawn the partition mover");
            let mut mover = Mover {
                jobs: jobs_tx,
                done: done_rx,
                outstanding: 0,
            };
            let tables = (current.as_ref(), next);
            let result = self.scheduled_buckets(epoch, tables, cluster, &mut mover, progress);
            // Hang up, so the mover ends once its last job is done.
            drop(mover);
            let moved = mover_thread
                .join()
                .map_err(|_| EmbedError::Corrupt("the partition mover panicked".into()))?;
            let (mut report, events) = result?;
            report.bytes_sent += moved.0 - moved_before.0;
            report.bytes_received += moved.1 - moved_before.1;
            Ok((report, events))
        })
    }

    /// The bucket loop of [`Trainer::epoch_scheduled`] over `(current, next)`, moving
    /// partitions through `mover`.
    fn scheduled_buckets(
        &mut self,
        epoch: usize,
        (current, next): (&TableFile, &Arc<TableFile>),
        cluster: &mut dyn Cluster,
        mover: &mut Mover,
        progress: &dyn Progress,
    ) -> Result<(RankReport, Vec<Interval>)> {
        let engine = self.buffer.engine().clone();
        let rank = cluster.rank();
        let label = format!("epoch {}/{} (rank {rank})", epoch + 1, self.cfg.epochs);
        let pass = Pass::start(epoch, progress, &label, 0);
        let io_before = engine.stats();
        let traffic_before = cluster.traffic();
        self.compute.reset_counters();
        // What this rank held last epoch may have been trained by another rank since.
        self.buffer.clear();
        self.compute.forget_partitions();
        // The relations as every rank has them after the last epoch's final round (a device
        // keeps its copy, the same rows, from that round on).
        if let Some(rels) = self.relations.shared() {
            self.compute.slot_filled(SlotKind::Relations, rels)?;
        }
        let pinned = self.buckets.partitioning.pinned();
        let mut ledger = Ledger::default();
        if let Some(p) = pinned {
            // Every rank reads the pinned region from the committed table and the rounds keep
            // it identical on all of them; rank 0's holding is its chain (it writes it back).
            self.buffer.fill(&[], current)?;
            if rank == 0 {
                ledger.loaded(p, true, crc32fast::hash(self.buffer.region(p)));
            }
            self.slot_filled(p)?;
        }
        let round_salt = derive(derive(self.cfg.seed, ROUND_SALT), epoch as u64);
        let mut rp = RankPass {
            pass,
            ledger,
            rounds: RelationRounds::new(&self.round_values(), round_salt),
            rounds_carry: !self.relations.params.is_empty()
                || pinned.is_some()
                || (self.banks.is_some() && self.cfg.bank_sync_every > 0),
            capacity: self.buffer.capacity() - self.prefetch_slots,
            trained: 0,
            since_round: 0,
            waits: 0,
            evictions: 0,
            group_wait: 0.0,
            parts_wait: Waits::default(),
            ahead: None,
        };
        // One edge reader for the epoch, fed each bucket as soon as it is granted: the
        // lookahead's bucket is read while the current one trains.
        let edges = EdgeFeed::start(self, &engine);
        loop {
            let grant = match rp.ahead.take() {
                Some(g) => g,
                None => self.ask(&mut rp, cluster, &edges)?,
            };
            match grant {
                Grant::Bucket {
                    bucket,
                    evict,
                    written,
                } => {
                    let grant = (bucket, &evict[..], &written[..]);
                    self.train_grant(&mut rp, grant, cluster, mover, &edges)?;
                }
                Grant::Wait | Grant::Done => {
                    if self.idle(&mut rp, cluster, mover, grant == Grant::Done)? {
                        break;
                    }
                }
            }
        }
        let t = Instant::now();
        if let Some(p) = pinned {
            // After the last round every rank holds the same pinned region: rank 0 writes it
            // back (its holding is the region's chain), and in owner mode every rank writes
            // it into its own table, from which it starts the next epoch.
            if rank == 0 || self.cfg.dist_storage == DistStorage::Owners {
                self.buffer.write(p, next)?;
            }
            if rank == 0 {
                rp.ledger.written(p, crc32fast::hash(self.buffer.region(p)));
            }
        }
        let (ledger, tl) = (&mut rp.ledger, &mut rp.pass.tl);
        rp.pass.tally.loads += self.flush_shared_banks(mover, ledger, tl, rp.trained, cluster)?;
        next.sync()?;
        rp.pass.tally.io_wait += t.elapsed().as_secs_f64();
        let io = engine.stats().since(&io_before);
        let report = self.report(&rp.pass, &io, rp.trained, rp.evictions)?;
        let (sent, received) = cluster.traffic();
        let traffic = (sent - traffic_before.0, received - traffic_before.1);
        let loaded = rp.pass.tally.loads as u64 * self.buffer.layout.part_bytes();
        let mine = rp.rank_report(rank, report, traffic, loaded);
        rp.pass.meter.finish()?;
        Ok((mine, rp.pass.tl.events))
    }

    /// Asks the scheduler for this rank's next grant, and queues its bucket's edges.
    fn ask(&self, rp: &mut RankPass, cluster: &mut dyn Cluster, edges: &EdgeFeed) -> Result<Grant> {
        let held: Vec<u32> = self.buffer.resident().collect();
        let partitions = self.buckets.partitioning.partitions;
        let t = Instant::now();
        let g = cluster.acquire(rp.pass.epoch, &held, partitions, rp.capacity)?;
        rp.group_wait += t.elapsed().as_secs_f64();
        edges.queue(&g);
        Ok(g)
    }

    /// Trains a granted bucket `(bucket, evict, written)`: brings its partitions in, asks for
    /// the next grant and starts its moves (`dist_prefetch`), trains, and joins a relation
    /// round when one is due.
    fn train_grant(
        &mut self,
        rp: &mut RankPass,
        grant: (Bucket, &[u32], &[u32]),
        cluster: &mut dyn Cluster,
        mover: &mut Mover,
        edges: &EdgeFeed,
    ) -> Result<()> {
        let bucket = grant.0;
        let parts = self.bring_in(rp, grant, cluster, mover)?;
        if self.prefetch_slots > 0 {
            let coming = self.ask(rp, cluster, edges)?;
            let (tally, waits) = (&mut rp.pass.tally, &mut rp.parts_wait);
            self.look_ahead(mover, &coming, &parts, tally, waits)?;
            rp.ahead = Some(coming);
        }
        self.run_bucket(edges.pieces(), bucket, rp.trained, &mut rp.pass)?;
        rp.trained += 1;
        fault_point(rp.pass.epoch, "bucket");
        rp.since_round += 1;
        if rp.rounds_carry && rp.since_round >= self.cfg.relation_sync_every {
            let t = Instant::now();
            self.round(&mut rp.rounds, cluster, false)?;
            rp.group_wait += t.elapsed().as_secs_f64();
            rp.since_round = 0;
        }
        Ok(())
    }

    /// Makes a granted bucket's partitions resident: collects what the lookahead started
    /// while the previous bucket trained, then the write-backs and loads it could not start,
    /// and releases what was written back. Returns the bucket's partitions.
    fn bring_in(
        &mut self,
        rp: &mut RankPass,
        (bucket, evict, written): (Bucket, &[u32], &[u32]),
        cluster: &mut dyn Cluster,
        mover: &mut Mover,
    ) -> Result<Vec<u32>> {
        let (t, step) = (Instant::now(), rp.trained);
        let mut released = self.settle(mover, &mut rp.ledger, &mut rp.pass.tl, step)?;
        for &p in evict {
            if self.buffer.slot_of(p).is_some() {
                self.write_back(mover, p)?;
            }
        }
        released.extend(self.settle(mover, &mut rp.ledger, &mut rp.pass.tl, step)?);
        let mut parts = vec![bucket.0, bucket.1];
        parts.dedup();
        for &p in &parts {
            if self.buffer.slot_of(p).is_some() {
                continue;
            }
            if !self.start_load(mover, p, written.contains(&p)) {
                return Err(EmbedError::Corrupt(format!(
                    "the scheduler granted bucket {bucket:?} without room for partition {p} in a buffer of {}",
                    rp.capacity
                )));
            }
            rp.pass.tally.loads += 1;
        }
        self.settle(mover, &mut rp.ledger, &mut rp.pass.tl, step)?;
        if !released.is_empty() {
            cluster.release(rp.pass.epoch, &released)?;
            rp.evictions += released.len();
        }
        let now = Instant::now();
        if now - t > Duration::from_micros(50) {
            rp.pass.tally.io_wait += (now - t).as_secs_f64();
            rp.parts_wait.seconds += (now - t).as_secs_f64();
            let label = format!("partitions for {bucket:?}");
            rp.pass.tl.add("wait", step, t, now, label);
        }
        Ok(parts)
    }

    /// The scheduler answered wait (`done` false) or done: writes back and releases every
    /// resident partition, then joins a relation round (or pauses when rounds carry nothing).
    /// Done, it keeps joining rounds until every rank is, so all leave together. Returns
    /// `done`. A lookahead that answered wait or done started no moves.
    fn idle(
        &mut self,
        rp: &mut RankPass,
        cluster: &mut dyn Cluster,
        mover: &mut Mover,
        done: bool,
    ) -> Result<bool> {
        let t = Instant::now();
        let held: Vec<u32> = self.buffer.resident().collect();
        for &p in &held {
            self.write_back(mover, p)?;
        }
        let released = self.settle(mover, &mut rp.ledger, &mut rp.pass.tl, rp.trained)?;
        if !released.is_empty() {
            cluster.release(rp.pass.epoch, &released)?;
        }
        let waited = t.elapsed().as_secs_f64();
        rp.pass.tally.io_wait += waited;
        rp.parts_wait.seconds += waited;
        rp.waits += usize::from(!done);
        let t = Instant::now();
        if done || rp.rounds_carry {
            while !self.round(&mut rp.rounds, cluster, done)? && done {}
        } else {
            std::thread::sleep(WAIT_PAUSE);
        }
        rp.group_wait += t.elapsed().as_secs_f64();
        Ok(done)
    }

    /// A relation round ([`RelationRounds::round`]), with a bank gradient round every
    /// `bank_sync_every` of them unless every rank is done (the epoch's flush follows then).
    /// Every rank joins the same rounds, so the bank all-reduces pair up too.
    fn round(
        &mut self,
        rounds: &mut RelationRounds,
        cluster: &mut dyn Cluster,
        done: bool,
    ) -> Result<bool> {
        // A device holding the relations (and the pinned region) puts its rows out for the
        // sum and takes the sum back.
        let pinned = self.buckets.partitioning.pinned();
        if let Some(rels) = self.relations.shared() {
            self.compute.slot_leaving(rels, true)?;
        }
        if let Some(p) = pinned {
            self.slot_leaving(p, true)?;
        }
        let all_done = rounds.round(&mut self.round_values(), cluster, done)?;
        if let Some(rels) = self.relations.shared() {
            self.compute.slot_filled(SlotKind::Relations, rels)?;
        }
        if let Some(p) = pinned {
            self.slot_filled(p)?;
        }
        let every = self.cfg.bank_sync_every;
        if !all_done && every > 0 && rounds.rounds.is_multiple_of(every) {
            self.sync_bank_gradient(cluster)?;
        }
        Ok(all_done)
    }

    /// The values a relation round keeps identical on every rank: the relation rows and their
    /// optimizer state, and a typed run's pinned region (its rows and their state, in the
    /// table's dtype).
    fn round_values(&mut self) -> Vec<RoundValues<'_>> {
        let pinned = self.buckets.partitioning.pinned();
        let bf16 = self.buffer.layout.dtype == TableDtype::Bf16;
        let mut values = vec![
            RoundValues::F32(&mut self.relations.params[..]),
            RoundValues::F32(&mut self.relations.state[..]),
        ];
        if let Some(p) = pinned {
            let region = self.buffer.region_mut(p);
            values.push(if bf16 {
                RoundValues::Bf16(bytemuck::cast_slice_mut(region))
            } else {
                RoundValues::F32(bytemuck::cast_slice_mut(region))
            });
        }
        values
    }

    /// Sums the pending bank gradient over the ranks, with a count per partition of the ranks
    /// holding it, and keeps each partition's sum on one rank: the one holding it, which
    /// applies it to its resident rows at once (it holds the lock, and the rows reach the
    /// holdings chain at its write-back), or, when no rank holds it, its owner, which applies
    /// it when a load of it lands or in the epoch's flush. A load still in flight does not
    /// count as held: its partition's sum waits on the owner.
    fn sync_bank_gradient(&mut self, cluster: &mut dyn Cluster) -> Result<()> {
        if self.banks.is_none() {
            return Ok(());
        }
        let held: Vec<u32> = self.buffer.resident().collect();
        // The held rows change here and feed the blocks: a device backend puts its rows into
        // the slots first and takes them back after.
        for &p in &held {
            self.slot_leaving(p, false)?;
        }
        self.sum_bank_gradient(cluster, &held)?;
        for &p in &held {
            self.slot_filled(p)?;
        }
        Ok(())
    }

    /// [`sync_bank_gradient`](Self::sync_bank_gradient)'s sums, this rank holding `held`.
    fn sum_bank_gradient(&mut self, cluster: &mut dyn Cluster, held: &[u32]) -> Result<()> {
        let Some(banks) = &self.banks else {
            return Ok(());
        };
        let mut grad = banks.take_grad();
        let split = grad.len();
        grad.extend(
            (0..self.buckets.partitioning.partitions)
                .map(|p| f32::from(u8::from(held.contains(&p)))),
        );
        sum_over_ranks(cluster, &mut grad)?;
        let (rank, world_size) = (cluster.rank(), cluster.world_size());
        let holders = &grad[split..];
        if let Some(p) = holders.iter().position(|&h| h > 1.0) {
            return Err(EmbedError::Corrupt(format!(
                "partition {p} was resident on {} ranks at once at a bank gradient round",
                holders[p]
            )));
        }
        banks.set_grad(&grad[..split], |p| {
            held.contains(&p) || (holders[p as usize] == 0.0 && owner_of(p, world_size) == rank)
        });
        for &p in held {
            self.apply_bank_gradient(p);
        }
        self.refresh_held_blocks(cluster, held, &grad[split..])
    }

    /// After a bank gradient round: every rank's block of a partition some rank holds becomes
    /// the holder's current rows (the holder sends its block, the others zeros, summed), so a
    /// negative drawn from a partition another rank trains is as old as the last round rather
    /// than the last time this rank held it. `holders` counts the ranks holding each partition.
    fn refresh_held_blocks(
        &mut self,
        cluster: &mut dyn Cluster,
        held: &[u32],
        holders: &[f32],
    ) -> Result<()> {
        let Some(banks) = &mut self.banks else {
            return Ok(());
        };
        for &p in held {
            banks.copy_from(p, self.buffer.embeddings(p));
        }
        let block = banks.block_floats();
        let mut rows = banks.rows_mut().to_vec();
        for (p, b) in rows.chunks_mut(block).enumerate() {
            if !held.contains(&(p as u32)) {
                b.fill(0.0);
            }
        }
        sum_over_ranks(cluster, &mut rows)?;
        let mine = banks.rows_mut();
        for (p, (dst, src)) in mine.chunks_mut(block).zip(rows.chunks(block)).enumerate() {
            if holders[p] == 1.0 && !held.contains(&(p as u32)) {
                dst.copy_from_slice(src);
            }
        }
        Ok(())
    }

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

    /// After every rank is done (this rank holds nothing): sums the bank gradient left on the
    /// ranks and applies each partition's share on its owner, which loads it from `next`
    /// through `mover` (the landing load applies the gradient) and writes it back. Returns the
    /// partitions read.
    fn flush_shared_banks(
        &mut self,
        mover: &mut Mover,
        ledger: &mut Ledger,
        tl: &mut Timeline,
        step: usize,
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
            let started = self.start_load(mover, p, true);
            assert!(started, "every slot is free once all ranks are done");
            self.settle(mover, ledger, tl, step)?;
            self.write_back(mover, p)?;
            self.settle(mover, ledger, tl, step)?;
        }
        Ok(mine.len())
    }

    /// Starts what the next grant `coming` needs while the current bucket (partitions
    /// `training`) trains: write-backs of the partitions it evicts outside the current
    /// bucket, and loads of its partitions into free slots, as far as slots allow.
    fn look_ahead(
        &mut self,
        mover: &mut Mover,
        coming: &Grant,
        training: &[u32],
        tally: &mut Tally,
        waits: &mut Waits,
    ) -> Result<()> {
        let Grant::Bucket {
            bucket,
            evict,
            written,
        } = coming
        else {
            return Ok(());
        };
        for &p in evict {
            if !training.contains(&p) {
                self.write_back(mover, p)?;
            }
        }
        let mut parts = vec![bucket.0, bucket.1];
        parts.dedup();
        for p in parts {
            if self.buffer.slot_of(p).is_none() && self.start_load(mover, p, written.contains(&p)) {
                tally.loads += 1;
                waits.prefetched += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::dist::TestRank;

    #[test]
    fn a_round_sums_both_ranks_changes_into_every_value_it_keeps() {
        // The relation rows, their state and a pinned region, as one round sees them.
        let (mut rel, mut state, mut pinned) = (vec![1.0f32, 2.0], vec![0.5f32], vec![3.0f32; 3]);
        let values = [
            RoundValues::F32(&mut rel[..]),
            RoundValues::F32(&mut state[..]),
            RoundValues::F32(&mut pinned[..]),
        ];
        let mut rounds = RelationRounds::new(&values, 7);
        rel[1] += 1.0;
        pinned[2] -= 2.0;
        let mut peer = TestRank {
            rank: 0,
            peer: Some(vec![0.0, 0.5, 0.25, 1.0, 0.0, 0.0]),
        };
        let values = &mut [
            RoundValues::F32(&mut rel[..]),
            RoundValues::F32(&mut state[..]),
            RoundValues::F32(&mut pinned[..]),
        ];
        assert!(!rounds.round(values, &mut peer, false).unwrap());
        assert_eq!(
            (rel, state, pinned),
            (vec![1.0, 3.5], vec![0.75], vec![4.0, 3.0, 1.0])
        );
        assert_eq!(rounds.base, vec![1.0, 3.5, 0.75, 4.0, 3.0, 1.0]);
        assert_eq!(rounds.rounds, 1);
    }

    #[test]
    fn both_ranks_round_a_bf16_region_alike_and_without_bias() {
        // A bf16 pinned region of 4,096 values at 1.0. Rank 0 moved every value up a bf16 step
        // (to 1 + 2^-7), rank 1 down one (to 1 - 2^-8, the step below 1 being half the step
        // above): the sum, 1 + 2^-8, lies halfway between the bf16 values 1 and 1 + 2^-7. Each
        // rank measures its own change and receives the other's; both must store the same
        // values, rounded up about half the time.
        let n = 4096;
        let (up, down) = (1.0 + 1.0 / 128.0, 1.0 - 1.0 / 256.0);
        let rank = |r: usize, moved_to: f32, peer_delta: f32| {
            let mut rel = [1.0f32];
            let mut region = vec![bf16::round(1.0); n];
            let mut rounds = RelationRounds::new(
                &[
                    RoundValues::F32(&mut rel[..]),
                    RoundValues::Bf16(&mut region[..]),
                ],
                11,
            );
            region.fill(bf16::round(moved_to));
            let mut peer = TestRank {
                rank: r,
                peer: Some([vec![0.0], vec![peer_delta; n]].concat()),
            };
            let values = &mut [
                RoundValues::F32(&mut rel[..]),
                RoundValues::Bf16(&mut region[..]),
            ];
            rounds.round(values, &mut peer, false).unwrap();
            // The base is what was stored: the next round's changes are measured from it.
            let mut stored = vec![0.0; n];
            bf16::widen(&region, &mut stored);
            assert_eq!(rounds.base[1..], stored[..]);
            region
        };
        let a = rank(0, up, down - 1.0);
        let b = rank(1, down, up - 1.0);
        assert_eq!(a, b, "the ranks disagree on the rounded region");
        let ups = a.iter().filter(|&&h| bf16::to_f32(h) == up).count();
        let ones = a.iter().filter(|&&h| bf16::to_f32(h) == 1.0).count();
        assert_eq!(ups + ones, n);
        assert!(ups.abs_diff(n / 2) < 200, "{ups} of {n} rounded up");
    }
}
