//! Background I/O of an epoch: partition swaps (write the evicted partition back, read the next
//! one: into the same slot, or with a spare buffer into the spare while the evicted one is
//! written, the two at once; with a spare, the partition the next swap loads is also read
//! ahead into it as soon as the disk is free, so that swap hands it over at once and writes
//! its victim behind) and bucket edges read ahead in training order. The trainer decides when
//! a swap may start and which partition comes next (Legend's order fixes it in advance); these
//! threads only move bytes.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender};
use strata_io::{AlignedBuf, Engine, IoFile, OpenMode};
use strata_store::array::{decode_f32, decode_ints, RowReader};
use strata_store::ids::{Field, IdCheck};
use strata_store::DType;

use crate::error::{EmbedError, Result};
use crate::storage::edge_cache::EdgeCache;
use crate::storage::layout::TableLayout;
use crate::storage::partition_cache::PartitionCache;
use crate::storage::partitioning::Buckets;
use crate::storage::table::TableFile;

/// One swap: write `evict` (if any) from `buf` to `to`, and read `load` from `from`, into `buf`
/// after the write or, with a spare buffer, into the spare during it. With partitions kept in
/// memory the evicted one is written only when `write_back` says so (its last eviction of the
/// epoch), and kept either way.
pub struct Swap {
    pub slot: usize,
    pub buf: AlignedBuf,
    pub evict: Option<(u32, Arc<TableFile>)>,
    pub load: (u32, Arc<TableFile>),
    pub write_back: bool,
}

/// A finished swap: the slot's buffer, now holding the loaded partition (the spare's buffer
/// when it read into the spare, which then keeps the evicted partition's).
pub struct Swapped {
    pub slot: usize,
    pub buf: AlignedBuf,
    /// The swap's outcome, or a write behind an earlier swap that failed.
    pub result: Result<()>,
    /// When the swap thread started and finished moving its bytes before handing the buffer
    /// over (a swap whose partition was read ahead hands it over at once).
    pub started: Instant,
    pub finished: Instant,
    /// Whether the loaded partition had been read ahead.
    pub read_ahead: bool,
    /// The I/O the thread did behind the swaps since the last one was handed over.
    pub behind: Vec<Behind>,
}

/// Work for the swap thread, done in the order sent.
enum Job {
    Swap(Swap),
    /// Read this partition from this table into the spare, for the swap that loads it next.
    ReadAhead(u32, Arc<TableFile>),
}

/// Partition I/O the swap thread did after handing a swap's buffer over (the victim's write
/// behind it, the next partition's read ahead): when it started and ended.
pub type Behind = (Instant, Instant);

/// The thread doing partition swaps, and the spare buffer it reads into (given back by
/// [`Swapper::finish`]); with a [`PartitionCache`], also the thread writing evicted partitions
/// back behind the swaps.
pub struct Swapper {
    tx: Option<Sender<Job>>,
    rx: Receiver<Swapped>,
    handle: Option<JoinHandle<Spares>>,
    writer: Option<JoinHandle<()>>,
    cache: Option<Arc<PartitionCache>>,
}

/// The swap thread's spare buffers (the plan's swap spare: one or two partitions) and what
/// they hold: free ones, the partition read ahead for the next swap, a victim still to write
/// behind; the I/O done behind the swaps not yet reported, and a write behind that failed.
#[derive(Default)]
struct Spares {
    free: Vec<AlignedBuf>,
    held: Option<(u32, AlignedBuf)>,
    pending: Option<(u32, Arc<TableFile>, AlignedBuf)>,
    behind: Vec<Behind>,
    failed: Option<EmbedError>,
}

/// An evicted partition on its way to the SSD: its id, the table it goes to, its bytes.
type WriteBack = (u32, Arc<TableFile>, AlignedBuf);

impl Swapper {
    /// Starts the swap thread. With `spares` (buffers of a slot's size: the plan's swap spare)
    /// the partition each swap loads is read ahead ([`read_ahead`](Self::read_ahead)) and the
    /// swap hands it over at once, its victim written behind: with two spares while the next
    /// partition is read, with one before it. A swap whose partition was not read ahead reads
    /// it into a spare while it writes the evicted one (without spares, into the slot's buffer
    /// after the write). With a `cache` the spares join the cache's free buffers, a swap hands
    /// its slot a kept partition's buffer (or reads the SSD into a free one), and the evicted
    /// partition is written on a thread of its own, then kept.
    pub fn start(
        engine: Arc<Engine>,
        layout: TableLayout,
        spares: Vec<AlignedBuf>,
        cache: Option<Arc<PartitionCache>>,
    ) -> Swapper {
        let (tx, jobs) = unbounded::<Job>();
        let (done_tx, rx) = unbounded::<Swapped>();
        let (writes, writer) = match &cache {
            Some(cache) => {
                let (writes, handle) = write_back(engine.clone(), layout, cache.clone());
                (Some(writes), Some(handle))
            }
            None => (None, None),
        };
        let mut spares = Spares {
            free: spares,
            ..Spares::default()
        };
        if let Some(cache) = &cache {
            spares.free.drain(..).for_each(|buf| cache.recycle(buf));
        }
        let kept = cache.clone();
        let handle = std::thread::Builder::new()
            .name("strata-embed-swap".into())
            .spawn(move || {
                for job in jobs {
                    let sent = match (job, &kept, &writes) {
                        (Job::Swap(s), Some(cache), Some(writes)) => {
                            let started = Instant::now();
                            let slot = s.slot;
                            let (buf, result) = swap_kept(&engine, &layout, s, cache, writes);
                            done_tx
                                .send(Swapped {
                                    slot,
                                    buf,
                                    result,
                                    started,
                                    finished: Instant::now(),
                                    read_ahead: false,
                                    behind: Vec::new(),
                                })
                                .is_ok()
                        }
                        (Job::Swap(s), ..) => spares.swap(&engine, &layout, s, &done_tx),
                        // Kept partitions come from memory: nothing to read ahead.
                        (Job::ReadAhead(..), Some(_), _) => true,
                        (Job::ReadAhead(p, from), ..) => {
                            spares.read_ahead(&engine, &layout, p, &from);
                            true
                        }
                    };
                    if !sent {
                        break;
                    }
                }
                spares.write_pending(&engine, &layout);
                spares
            })
            .expect("spawn the swap thread");
        Swapper {
            tx: Some(tx),
            rx,
            handle: Some(handle),
            writer,
            cache,
        }
    }

    pub fn start_swap(&self, s: Swap) {
        self.send(Job::Swap(s));
    }

    /// Reads partition `p` from `from` into the spare once the swaps sent before are done, so
    /// the swap that loads it next hands it over at once (no spare, or partitions kept in
    /// memory: nothing to do). `p` must not change in `from` before that swap.
    pub fn read_ahead(&self, p: u32, from: Arc<TableFile>) {
        self.send(Job::ReadAhead(p, from));
    }

    fn send(&self, job: Job) {
        self.tx
            .as_ref()
            .expect("running")
            .send(job)
            .expect("the swap thread runs");
    }

    /// Waits for the swap in flight.
    pub fn wait(&self) -> Swapped {
        self.rx.recv().expect("the swap thread answers")
    }

    /// Ends the swap thread once every write-back has landed, and gives back its spare buffers
    /// (none when it had none, or gave them to the cache) and the I/O it did behind the swaps
    /// not yet reported; errors: a write-back failed.
    pub fn finish(mut self) -> Result<(Vec<AlignedBuf>, Vec<Behind>)> {
        let spares = self.join();
        if let Some(e) = spares.failed {
            return Err(e);
        }
        if let Some(cache) = &self.cache {
            cache.failure()?;
        }
        let mut free = spares.free;
        free.extend(spares.held.map(|(_, buf)| buf));
        Ok((free, spares.behind))
    }

    /// Ends the threads (the writer's after the swap thread's, which feeds it).
    fn join(&mut self) -> Spares {
        self.tx.take();
        let spares = self.handle.take().and_then(|h| h.join().ok());
        if let Some(h) = self.writer.take() {
            let _ = h.join();
        }
        spares.unwrap_or_default()
    }
}

/// Starts the thread that writes evicted partitions back and then keeps them in `cache`.
fn write_back(
    engine: Arc<Engine>,
    layout: TableLayout,
    cache: Arc<PartitionCache>,
) -> (Sender<WriteBack>, JoinHandle<()>) {
    let (writes, jobs) = unbounded::<WriteBack>();
    let handle = std::thread::Builder::new()
        .name("strata-embed-write-back".into())
        .spawn(move || {
            for (p, to, mut buf) in jobs {
                let result = to.write_partition(&engine, &layout, p, &mut buf);
                cache.landed(p, buf, result);
            }
        })
        .expect("spawn the write-back thread");
    (writes, handle)
}

impl Spares {
    /// Moves one swap's bytes and sends the slot its buffer on `done` (false: the trainer is
    /// gone). A partition read ahead goes to the slot at once and its victim waits to be
    /// written behind (beside the next read ahead). Otherwise any victim still waiting is
    /// written first, then the next partition is read into a free spare while another
    /// thread writes the evicted one from its buffer, which becomes free; without a spare the
    /// slot's buffer is written, then read into. A write behind that failed is reported by the
    /// next swap, or at the end.
    fn swap(
        &mut self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        s: Swap,
        done: &Sender<Swapped>,
    ) -> bool {
        let started = Instant::now();
        let Swap {
            slot,
            mut buf,
            evict,
            load,
            ..
        } = s;
        let held = match self.held.take() {
            Some((p, next)) if p == load.0 => Some(next),
            Some((_, stale)) => {
                self.free.push(stale);
                None
            }
            None => None,
        };
        // Read ahead, the last victim was written beside that read: none waits here then.
        self.write_pending(engine, layout);
        let failed = self.failed.take().map_or(Ok(()), Err);
        let behind = std::mem::take(&mut self.behind);
        let sent = |buf: AlignedBuf, result: Result<()>, read_ahead: bool| {
            done.send(Swapped {
                slot,
                buf,
                result: failed.and(result),
                started,
                finished: Instant::now(),
                read_ahead,
                behind,
            })
            .is_ok()
        };
        if let Some(next) = held {
            self.pending = evict.map(|(p, to)| (p, to, buf));
            return sent(next, Ok(()), true);
        }
        let read = |into: &mut AlignedBuf| load.1.read_partition(engine, layout, load.0, into);
        match (evict, self.free.pop()) {
            (Some((p, to)), Some(mut next)) => {
                let (wrote, read) =
                    write_beside(engine, layout, (p, &to, &mut buf), || read(&mut next));
                self.free.push(buf);
                sent(next, wrote.and(read), false)
            }
            (evict, free) => {
                self.free.extend(free);
                let wrote = match &evict {
                    Some((p, to)) => to.write_partition(engine, layout, *p, &mut buf),
                    None => Ok(()),
                };
                let result = wrote.and_then(|()| read(&mut buf));
                sent(buf, result, false)
            }
        }
    }

    /// Reads partition `p` of `from` ahead for the next swap, into a free spare while the
    /// victim waiting to be written behind is written, or into the victim's buffer once it is
    /// (one spare); when `p` is that victim, its buffer already holds its newest bytes. A read
    /// that fails leaves nothing held: the swap that needs `p` reads it again and reports it.
    fn read_ahead(&mut self, engine: &Arc<Engine>, layout: &TableLayout, p: u32, from: &TableFile) {
        if let Some((_, stale)) = self.held.take() {
            self.free.push(stale);
        }
        let started = Instant::now();
        let read = |into: &mut AlignedBuf| from.read_partition(engine, layout, p, into).is_ok();
        let held = match (self.pending.take(), self.free.pop()) {
            (Some((victim, to, mut buf)), free) if victim == p => {
                self.free.extend(free);
                self.note_failed(to.write_partition(engine, layout, victim, &mut buf));
                Some(buf)
            }
            (Some((victim, to, mut buf)), Some(mut next)) => {
                let (wrote, ok) =
                    write_beside(engine, layout, (victim, &to, &mut buf), || read(&mut next));
                self.note_failed(wrote);
                self.free.push(buf);
                self.keep_read(next, ok)
            }
            (Some((victim, to, mut buf)), None) => {
                self.note_failed(to.write_partition(engine, layout, victim, &mut buf));
                let ok = read(&mut buf);
                self.keep_read(buf, ok)
            }
            (None, Some(mut next)) => {
                let ok = read(&mut next);
                self.keep_read(next, ok)
            }
            (None, None) => return,
        };
        self.held = held.map(|buf| (p, buf));
        self.behind.push((started, Instant::now()));
    }

    /// `buf` when its read succeeded, else nothing (the buffer goes back to the free ones).
    fn keep_read(&mut self, buf: AlignedBuf, ok: bool) -> Option<AlignedBuf> {
        if ok {
            return Some(buf);
        }
        self.free.push(buf);
        None
    }

    /// Writes the victim waiting to be written behind, if any (before a swap that needs its
    /// buffer or the disk, and at the end).
    fn write_pending(&mut self, engine: &Arc<Engine>, layout: &TableLayout) {
        let Some((p, to, mut buf)) = self.pending.take() else {
            return;
        };
        let started = Instant::now();
        self.note_failed(to.write_partition(engine, layout, p, &mut buf));
        self.free.push(buf);
        self.behind.push((started, Instant::now()));
    }

    /// Keeps the first write behind that failed, for the next swap or the end to report.
    fn note_failed(&mut self, wrote: Result<()>) {
        if let Err(e) = wrote {
            self.failed.get_or_insert(e);
        }
    }
}

/// Writes partition `p` from `buf` to `to` on a thread of its own while `read` runs on this
/// one (the disk serves the write and the read at once); their outcomes.
fn write_beside<R>(
    engine: &Arc<Engine>,
    layout: &TableLayout,
    (p, to, buf): (u32, &TableFile, &mut AlignedBuf),
    read: impl FnOnce() -> R,
) -> (Result<()>, R) {
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| to.write_partition(engine, layout, p, buf));
        let read = read();
        (writer.join().expect("the write's thread"), read)
    })
}

/// One swap with partitions kept in memory: the evicted partition goes to the write-back
/// thread (or, when the epoch loads it again, straight into `cache`: only its last eviction
/// needs to reach the table the epoch commits), and the loaded one comes from `cache` (read
/// from the SSD into a free buffer when it is not kept). The outcome carries a write-back that
/// failed since the last swap.
fn swap_kept(
    engine: &Arc<Engine>,
    layout: &TableLayout,
    s: Swap,
    cache: &PartitionCache,
    writes: &Sender<WriteBack>,
) -> (AlignedBuf, Result<()>) {
    let Swap {
        buf,
        evict,
        load,
        write_back,
        ..
    } = s;
    let unused = match evict {
        Some((p, to)) if write_back => {
            cache.writing(p);
            writes
                .send((p, to, buf))
                .expect("the write-back thread runs");
            None
        }
        Some((p, _)) => {
            cache.keep(p, buf);
            None
        }
        None => Some(buf),
    };
    if let Some(kept) = cache.take(load.0) {
        if let Some(buf) = unused {
            cache.recycle(buf);
        }
        return (kept, cache.failure());
    }
    let mut into = unused.unwrap_or_else(|| cache.buffer(layout.part_bytes() as usize));
    let read = load.1.read_partition(engine, layout, load.0, &mut into);
    (into, read.and(cache.failure()))
}

impl Drop for Swapper {
    fn drop(&mut self) {
        self.join();
    }
}

/// A piece's groups: row ranges of its edges and their (source, destination) entity types
/// (`None`: untyped, one group).
pub type Groups = Vec<(std::ops::Range<usize>, Option<(usize, usize)>)>;

/// A piece of one bucket's edges as `(src_local, rel, dst_local)` rows, with their weights
/// (one per edge, or empty when the edges are read without them).
pub struct BucketEdges {
    pub bucket: (u32, u32),
    /// Whether this is the bucket's last piece.
    pub last: bool,
    pub edges: Result<(Vec<[i32; 3]>, Vec<f32>)>,
    /// Bytes read from the SSD (0: the piece came from the edge cache).
    pub bytes: u64,
    /// The piece's groups when it comes arranged for training (made ahead); `None`: as read,
    /// arranged when it is trained.
    pub groups: Option<Groups>,
}

/// Reads the edges of `order`'s buckets in that order, in pieces of at most `piece_rows`
/// edges, up to `ahead` pieces ahead (so edge memory stays bounded whatever a bucket's size).
/// `order` may be a channel's receiving iterator: a distributed rank feeds it each bucket as
/// soon as the scheduler grants it, so the next bucket's edges are read while the current one
/// trains; the thread ends when `order` does.
/// With `weighted` (the index must hold weights) each piece carries its edges' weights, and
/// holds 3/4 as many edges so that it takes the same bytes. Every bucket yields at least one
/// piece, possibly empty. Local ids are checked against their partitions' sizes and relations
/// against `relations` (the rows a relation id may index) as the rows are decoded, and
/// weights for being finite and >= 0, so a corrupt index fails with its file and row named.
/// With a `cache` each piece read is kept there, and a piece kept by an earlier epoch is
/// copied out of it instead of read (its `bytes` then 0: nothing came from the SSD).
#[allow(clippy::too_many_arguments)]
pub fn prefetch_edges(
    engine: Arc<Engine>,
    buckets: Arc<Buckets>,
    order: impl IntoIterator<Item = (u32, u32)> + Send + 'static,
    piece_rows: u64,
    ahead: usize,
    relations: u64,
    weighted: bool,
    cache: Option<Arc<EdgeCache>>,
) -> (Receiver<BucketEdges>, JoinHandle<()>) {
    let (tx, rx) = bounded::<BucketEdges>(ahead.max(1));
    let row_bytes = ROW_BYTES + if weighted { WEIGHT_BYTES } else { 0 };
    let piece_rows = piece_rows * ROW_BYTES / row_bytes;
    let handle = std::thread::Builder::new()
        .name("strata-embed-edges".into())
        .spawn(move || {
            let open = |path: &std::path::Path| {
                strata_store::npy::read_header(path)
                    .map_err(EmbedError::from)
                    .and_then(|h| Ok((h.data_offset, engine.open(path, OpenMode::Read)?)))
            };
            let path = buckets.edges_path();
            let file = open(&path);
            let weights_path = buckets.weights_path();
            let weights_file = weighted.then(|| open(&weights_path));
            // A typed run's edges with an end in the pinned region hold that end's row there.
            let partitioning = &buckets.partitioning;
            let pinned = partitioning.pinned().map_or(0, |r| partitioning.size_of(r));
            let sizes: Vec<u64> = (0..partitioning.partitions)
                .map(|p| partitioning.size_of(p))
                .collect();
            for bucket in order {
                let range = buckets.range(bucket.0, bucket.1);
                let mut at = range.start;
                loop {
                    let end = range.end.min(at + piece_rows.max(1));
                    let size = |p: u32| sizes[p as usize].max(pinned) as i64;
                    let fields = vec![
                        Field::new("src_local", 0, size(bucket.0)),
                        Field::new("rel", 0, relations.min(i32::MAX as u64) as i64),
                        Field::new("dst_local", 0, size(bucket.1)),
                    ];
                    let read = || {
                        let check = IdCheck::new(&buckets.dir, "edges.npy", fields).from_row(at);
                        let edges = match &file {
                            Ok((offset, f)) => read_rows(f, &path, *offset, at..end, check),
                            Err(e) => Err(EmbedError::Corrupt(format!("{}: {e}", path.display()))),
                        };
                        let weights = match &weights_file {
                            None => Ok(Vec::new()),
                            Some(Ok((offset, f))) => {
                                read_weights(f, &weights_path, *offset, at..end)
                            }
                            Some(Err(e)) => Err(EmbedError::Corrupt(format!(
                                "{}: {e}",
                                weights_path.display()
                            ))),
                        };
                        edges.and_then(|e| Ok((e, weights?)))
                    };
                    let rows = at..end;
                    let (edges, bytes) = match cache.as_ref().and_then(|c| c.get(&rows)) {
                        Some(kept) => (Ok(kept), 0),
                        None => {
                            let edges = read();
                            if let (Some(c), Ok((e, w))) = (&cache, &edges) {
                                c.put(&rows, e, w);
                            }
                            (edges, (end - at) * row_bytes)
                        }
                    };
                    let failed = edges.is_err();
                    let piece = BucketEdges {
                        bucket,
                        last: end == range.end,
                        bytes,
                        edges,
                        groups: None,
                    };
                    if tx.send(piece).is_err() || failed {
                        return;
                    }
                    at = end;
                    if at == range.end {
                        break;
                    }
                }
            }
        })
        .expect("spawn the edge prefetch thread");
    (rx, handle)
}

/// A one-bucket epoch's edges kept in memory when they came as one piece: the next epoch trains
/// a copy instead of reading and checking them again (for FB15k-237 at B1's settings, 20 to 30
/// ms at every epoch's start on the development machine, against about 3.5 s of training on its
/// 2 cores, or 0.1 s on a GPU). The copy holds the piece as read; the next epoch's arrangement
/// of it is made ahead (`train::arrange::ArrangedAhead`).
pub struct KeptEdges {
    pub bucket: (u32, u32),
    pub edges: Vec<[i32; 3]>,
    pub weights: Vec<f32>,
}

/// Bytes of one bucketed edge row (three int32).
pub(crate) const ROW_BYTES: u64 = 12;
/// Bytes of one bucketed weight (float32).
pub(crate) const WEIGHT_BYTES: u64 = 4;

/// Reads the weights of edge rows `rows` from the bucketed weights at `path`, checking each.
fn read_weights(
    file: &IoFile,
    path: &std::path::Path,
    data_offset: u64,
    rows: std::ops::Range<u64>,
) -> Result<Vec<f32>> {
    let first = rows.start;
    let out = read_records(
        file,
        path,
        data_offset,
        rows,
        WEIGHT_BYTES,
        "weights",
        |b, out| {
            decode_f32(b, DType::F32, out);
            Ok(())
        },
    )?;
    match out.iter().position(|w| !(*w >= 0.0 && w.is_finite())) {
        Some(i) => Err(EmbedError::Corrupt(format!(
            "{}: row {}: weight {} is not a finite number >= 0",
            path.display(),
            first + i as u64,
            out[i]
        ))),
        None => Ok(out),
    }
}

/// Reads edge rows `rows` of the bucketed edges at `path`, checking their ids with `check`.
fn read_rows(
    file: &IoFile,
    path: &std::path::Path,
    data_offset: u64,
    rows: std::ops::Range<u64>,
    mut check: IdCheck,
) -> Result<Vec<[i32; 3]>> {
    let mut vals = Vec::new();
    read_records(
        file,
        path,
        data_offset,
        rows,
        ROW_BYTES,
        "edges",
        |b, out| {
            vals.clear();
            decode_ints(b, DType::I32, &mut vals);
            check.check(&vals)?;
            out.extend(
                vals.chunks_exact(3)
                    .map(|r| [r[0] as i32, r[1] as i32, r[2] as i32]),
            );
            Ok(())
        },
    )
}

/// Reads records `rows` (of `row_bytes` each, from `data_offset`) of the file at `path`,
/// turning each batch of bytes into values with `decode`; `what` names the values in the
/// error when the file holds fewer.
fn read_records<T>(
    file: &IoFile,
    path: &std::path::Path,
    data_offset: u64,
    rows: std::ops::Range<u64>,
    row_bytes: u64,
    what: &str,
    mut decode: impl FnMut(&[u8], &mut Vec<T>) -> Result<()>,
) -> Result<Vec<T>> {
    let count = (rows.end - rows.start) as usize;
    let mut out = Vec::with_capacity(count);
    if count == 0 {
        return Ok(out);
    }
    let start = data_offset + rows.start * row_bytes;
    let end = start + count as u64 * row_bytes;
    let mut reader = RowReader::records(file.clone(), start, end, row_bytes as usize, 4 << 20);
    while let Some(batch) = reader.next_batch()? {
        decode(batch, &mut out)?;
    }
    if out.len() != count {
        return Err(EmbedError::Corrupt(format!(
            "{}: bucket rows {rows:?} hold {} {what}",
            path.display(),
            out.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{OptimizerKind, TableDtype};
    use crate::storage::partitioning::Partitioning;

    /// A buffer of `layout`'s partition size filled with `byte`.
    fn filled(layout: &TableLayout, byte: u8) -> AlignedBuf {
        let mut buf = AlignedBuf::new(layout.part_bytes() as usize);
        buf.full_mut().fill(byte);
        buf
    }

    /// A table file in `dir` of four partitions, partition `p` holding bytes `p + 1`, and an
    /// engine of its own (whose counters only this test moves).
    fn four_partitions(dir: &std::path::Path) -> (Arc<Engine>, TableLayout, Arc<TableFile>) {
        let p = Partitioning::new(64, 4, 3).unwrap();
        let layout = TableLayout::new(&p, 8, OptimizerKind::Adagrad, TableDtype::F32);
        let engine = Engine::new(&strata_io::EngineConfig::default()).unwrap();
        let table = Arc::new(TableFile::open(&engine, &dir.join("t.bin"), true).unwrap());
        for part in 0..4u32 {
            table
                .write_partition(&engine, &layout, part, &mut filled(&layout, part as u8 + 1))
                .unwrap();
        }
        (engine, layout, table)
    }

    /// Swaps `buf`, slot 1's, evicting `evict` for `load` in `table`, and waits for the swap.
    fn swap_in_slot_1(
        swapper: &Swapper,
        table: &Arc<TableFile>,
        buf: AlignedBuf,
        (evict, load): (u32, u32),
        write_back: bool,
    ) -> Swapped {
        swapper.start_swap(Swap {
            slot: 1,
            buf,
            evict: Some((evict, table.clone())),
            load: (load, table.clone()),
            write_back,
        });
        swapper.wait()
    }

    /// Swaps of a table whose partition `p` holds bytes `p + 1`, with and without a spare: the
    /// evicted partition lands in the file, the loaded one in the returned buffer, and with a
    /// spare the two buffers trade places (the slot gets the spare, the spare the victim's).
    #[test]
    fn a_swap_writes_the_evicted_partition_and_returns_the_next_with_or_without_a_spare() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, layout, table) = four_partitions(dir.path());
        let bytes = layout.part_bytes() as usize;
        for with_spare in [false, true] {
            let spare: Vec<AlignedBuf> =
                with_spare.then(|| filled(&layout, 0)).into_iter().collect();
            let spare_at = spare.first().map(|b| b.prefix(1).as_ptr());
            let swapper = Swapper::start(engine.clone(), layout, spare, None);
            // Slot 1 held partition 0, changed in memory to bytes 9: it leaves for 2.
            let victim = filled(&layout, 9);
            let victim_at = victim.prefix(1).as_ptr();
            let done = swap_in_slot_1(&swapper, &table, victim, (0, 2), true);
            done.result.unwrap();
            assert_eq!(done.slot, 1);
            assert!(
                done.buf.prefix(bytes).iter().all(|&b| b == 3),
                "partition 2 loaded"
            );
            let mut back = filled(&layout, 0);
            table
                .read_partition(&engine, &layout, 0, &mut back)
                .unwrap();
            assert!(
                back.prefix(bytes).iter().all(|&b| b == 9),
                "partition 0 written"
            );
            let (returned, _) = swapper.finish().unwrap();
            if with_spare {
                assert_eq!(
                    Some(done.buf.prefix(1).as_ptr()),
                    spare_at,
                    "the slot takes the spare"
                );
                let kept = returned.into_iter().next().expect("the spare comes back");
                assert_eq!(
                    kept.prefix(1).as_ptr(),
                    victim_at,
                    "the victim's buffer is the spare now"
                );
            } else {
                assert_eq!(done.buf.prefix(1).as_ptr(), victim_at);
                assert!(returned.is_empty());
            }
            // Partition 0 back as it was, for the next round.
            table
                .write_partition(&engine, &layout, 0, &mut filled(&layout, 1))
                .unwrap();
        }
    }

    /// With partitions kept in memory, a swap hands the slot the kept buffer of the loaded
    /// partition (read from the SSD only the first time) and the evicted one reaches the file
    /// behind the swap when it is written back; the second swap, whose victim the epoch loads
    /// again, reads and writes nothing: its victim stays in memory alone.
    #[test]
    fn a_kept_partition_comes_back_from_memory_and_the_evicted_one_still_reaches_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, layout, table) = four_partitions(dir.path());
        let bytes = layout.part_bytes() as usize;
        let cache = Arc::new(PartitionCache::default());
        let swapper = Swapper::start(
            engine.clone(),
            layout,
            vec![filled(&layout, 0)],
            Some(cache.clone()),
        );
        let victim = filled(&layout, 9);
        let victim_at = victim.prefix(1).as_ptr();
        let first = swap_in_slot_1(&swapper, &table, victim, (0, 2), true);
        first.result.unwrap();
        assert!(
            first.buf.prefix(bytes).iter().all(|&b| b == 3),
            "partition 2 read"
        );
        // Partition 2, changed to bytes 7, leaves for partition 0, which is kept.
        let mut second = first.buf;
        second.full_mut()[..bytes].fill(7);
        let before = engine.stats();
        let back = swap_in_slot_1(&swapper, &table, second, (2, 0), false);
        back.result.unwrap();
        assert_eq!(
            back.buf.prefix(1).as_ptr(),
            victim_at,
            "the victim's own buffer"
        );
        assert!(
            back.buf.prefix(bytes).iter().all(|&b| b == 9),
            "with its bytes"
        );
        assert!(
            swapper.finish().unwrap().0.is_empty(),
            "the spare went to the cache"
        );
        assert_eq!(engine.stats().since(&before).read_bytes, 0, "nothing read");
        let kept = cache.take(2).expect("partition 2 kept");
        assert!(
            kept.prefix(bytes).iter().all(|&b| b == 7),
            "its newest bytes"
        );
        for (part, byte) in [(0u32, 9u8), (2, 3)] {
            let mut on_disk = filled(&layout, 0);
            table
                .read_partition(&engine, &layout, part, &mut on_disk)
                .unwrap();
            assert!(
                on_disk.prefix(bytes).iter().all(|&b| b == byte),
                "partition {part} on disk"
            );
        }
    }

    /// Reads partition 2 of `table` ahead, then starts the swap of slot 1's partition 0 (bytes
    /// 9, written to `to`) for it.
    fn start_0_for_2_read_ahead(
        swapper: &Swapper,
        layout: &TableLayout,
        table: &Arc<TableFile>,
        to: &Arc<TableFile>,
    ) {
        swapper.read_ahead(2, table.clone());
        swapper.start_swap(Swap {
            slot: 1,
            buf: filled(layout, 9),
            evict: Some((0, to.clone())),
            load: (2, table.clone()),
            write_back: true,
        });
    }

    /// With one spare or two, a partition read ahead goes to the slot at once and the victim
    /// waits to be written behind beside the next read ahead (after it, with one spare); when
    /// the next swap loads that victim, the read ahead is its own buffer, newest bytes and all.
    /// The I/O behind each swap is reported with the one after it. A read ahead of another
    /// partition than the swap loads is not taken.
    #[test]
    fn a_partition_read_ahead_is_handed_over_at_once_and_the_victim_written_behind() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, layout, table) = four_partitions(dir.path());
        let bytes = layout.part_bytes() as usize;
        let all = |buf: &AlignedBuf, byte: u8| buf.prefix(bytes).iter().all(|&b| b == byte);
        for spares in [1, 2] {
            let swapper = Swapper::start(
                engine.clone(),
                layout,
                (0..spares).map(|_| filled(&layout, 0)).collect(),
                None,
            );
            // Slot 1 held partition 0, changed to bytes 9: it leaves for 2, read ahead; then
            // 2, changed to 7, leaves for 0, whose read ahead is its write behind.
            start_0_for_2_read_ahead(&swapper, &layout, &table, &table);
            swapper.read_ahead(0, table.clone());
            let first = swapper.wait();
            first.result.unwrap();
            assert!(
                first.read_ahead && all(&first.buf, 3),
                "partition 2, read ahead"
            );
            assert_eq!(first.behind.len(), 1, "the read ahead before it");
            let mut second = first.buf;
            second.full_mut()[..bytes].fill(7);
            let back = swap_in_slot_1(&swapper, &table, second, (2, 0), true);
            back.result.unwrap();
            assert!(
                back.read_ahead && all(&back.buf, 9),
                "partition 0 as written behind"
            );
            assert_eq!(back.behind.len(), 1, "0's write behind");
            // A read ahead of 3 while the next swap loads 1: read the ordinary way.
            swapper.read_ahead(3, table.clone());
            let third = swap_in_slot_1(&swapper, &table, back.buf, (0, 1), true);
            third.result.unwrap();
            assert!(
                !third.read_ahead && all(&third.buf, 2),
                "partition 1, read in the swap"
            );
            let (returned, behind) = swapper.finish().unwrap();
            assert_eq!(returned.len(), spares, "every spare comes back");
            assert!(behind.is_empty(), "the third swap wrote its victim itself");
            for (part, byte) in [(0u32, 9u8), (2, 7)] {
                let mut on_disk = filled(&layout, 0);
                table
                    .read_partition(&engine, &layout, part, &mut on_disk)
                    .unwrap();
                assert!(
                    all(&on_disk, byte),
                    "{spares} spare(s): partition {part} on disk"
                );
            }
            // The table as it was, for the next round.
            for part in 0..4u32 {
                table
                    .write_partition(&engine, &layout, part, &mut filled(&layout, part as u8 + 1))
                    .unwrap();
            }
        }
    }

    /// A write behind that fails is reported by the next swap, or at the end when no swap
    /// follows: `/dev/full` refuses every write.
    #[test]
    fn a_failed_write_behind_is_reported_by_the_next_swap_or_at_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let (engine, layout, table) = four_partitions(dir.path());
        let full =
            Arc::new(TableFile::open(&engine, std::path::Path::new("/dev/full"), false).unwrap());
        for swaps in [1, 2] {
            let swapper = Swapper::start(engine.clone(), layout, vec![filled(&layout, 0)], None);
            start_0_for_2_read_ahead(&swapper, &layout, &table, &full);
            let first = swapper.wait();
            first.result.expect("handed over before its victim's write");
            if swaps == 2 {
                let next = swap_in_slot_1(&swapper, &table, first.buf, (2, 1), true);
                let err = next.result.unwrap_err().to_string();
                assert!(err.contains("/dev/full"), "{err}");
                swapper.finish().expect("reported once");
            } else {
                let err = swapper.finish().map(|_| ()).unwrap_err().to_string();
                assert!(err.contains("/dev/full"), "{err}");
            }
        }
    }
}
