//! The work of the four stages, whichever way they are run (see the module docs of
//! [`crate::pipeline`]): sampling a batch, the look-ahead window with its pins and the lookup
//! in memory, the accumulator's merged disk read, and the assembly of read rows into batches.
//! [`super::serial`] calls them in turn on the caller's thread; [`super::threads`] runs each on
//! its own thread(s).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use strata_graph::features::Gather;
use strata_graph::sampler::{NeighborSampler, Sample};
use strata_graph::topology::Topology;

use crate::accumulator::{Accumulator, Merged};
use crate::error::{GnnError, Result};
use crate::tiers::{FeatureTiers, Lookup};

use super::batch::{add_busy, batch_key, Batch, BatchStats, Counters, Items, LinkIndex, Plan};
use super::pins::WindowPins;

/// What every stage shares.
#[derive(Clone)]
pub(super) struct Stages {
    pub(super) topo: Arc<Topology>,
    pub(super) sampler: Arc<NeighborSampler>,
    pub(super) tiers: Arc<FeatureTiers>,
    pub(super) plan: Arc<Plan>,
    pub(super) counters: Arc<Counters>,
    pub(super) fault: ReadFault,
}

/// A test hook: the merged read holding batch `batch` fails as a device error would (a real
/// one cannot be provoked from a test), to exercise the error paths. Empty, and inert, outside
/// tests.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct ReadFault {
    #[cfg(test)]
    pub(super) batch: Option<usize>,
}

impl ReadFault {
    /// An error when `merged` is the read to fail (never outside tests).
    #[inline]
    fn check(&self, merged: &Merged<Served>) -> Result<()> {
        #[cfg(test)]
        if let Some(b) = self.batch {
            if merged.items.iter().any(|s| s.batch.index == b) {
                return Err(GnnError::Config(format!(
                    "injected read error in the read of batch {b}"
                )));
            }
        }
        let _ = merged;
        Ok(())
    }
}

/// A sampled batch.
pub(super) struct Sampled {
    index: usize,
    seeds: Vec<u32>,
    links: Option<LinkIndex>,
    sample: Sample,
    sample_secs: f64,
}

pub(super) fn sample_batch(st: &Stages, index: usize) -> Result<Sampled> {
    let t = Instant::now();
    let range = st.plan.range(index);
    let key = batch_key(st.plan.epoch, index);
    let sampled = match &st.plan.items {
        Items::Nodes(seeds) => {
            let seeds = seeds[range].to_vec();
            st.sampler
                .sample(&st.topo, &seeds, key)
                .map(|sample| (seeds, None, sample))
        }
        Items::Links(edges) => st
            .sampler
            .sample_links(
                &st.topo,
                &edges.src[range.clone()],
                &edges.dst[range],
                edges.negatives_per_edge,
                key,
            )
            .map(|l| {
                let seeds = l.sample.nodes[..l.sample.num_seeds()].to_vec();
                let links = LinkIndex {
                    src_local: l.src_local,
                    dst_local: l.dst_local,
                    neg_dst_local: l.neg_dst_local,
                };
                (seeds, Some(links), l.sample)
            }),
    };
    add_busy(&st.counters.sample_ns, t);
    let (seeds, links, sample) = sampled?;
    Ok(Sampled {
        index,
        seeds,
        links,
        sample,
        sample_secs: t.elapsed().as_secs_f64(),
    })
}

/// A batch looked up in memory: `lookup` says which of its rows come from the disk (and which
/// the device tier holds); `pins` still holds every window pin it took, so its cache hits stay
/// cached until its feature buffer is filled at assembly (released then, or when the batch is
/// dropped unassembled). It holds no feature buffer yet.
pub(super) struct Served {
    batch: Sampled,
    lookup: Lookup,
    pins: WindowPins,
}

/// Where the front gets its sampled batches from, in batch order.
pub(super) trait SampleSource {
    /// The next batch in order; `None` when all were handed out (or the loader is stopping).
    fn next_sampled(&mut self) -> Option<Result<Sampled>>;
    /// Whether the loader is stopping.
    fn cancelled(&self) -> bool;
}

/// What the front hands to the I/O stage.
pub(super) enum Work {
    Read(Merged<Served>),
    /// The epoch ends with this error, after every earlier read.
    Fail(GnnError),
}

#[derive(Clone, Copy)]
pub(super) struct FrontConfig {
    pub(super) window: usize,
    pub(super) target: usize,
    pub(super) max_batches: usize,
}

/// Stages 2 and 3: the look-ahead window (pins), the lookup, the accumulator.
pub(super) struct Front<S> {
    source: S,
    tiers: Arc<FeatureTiers>,
    counters: Arc<Counters>,
    window: usize,
    /// Sampled and pinned, not yet served, oldest first.
    ahead: VecDeque<(Sampled, WindowPins)>,
    acc: Accumulator<Served>,
    /// The source has nothing more (or failed).
    exhausted: bool,
    /// The error that ends the epoch once the batches before it are out.
    failed: Option<GnnError>,
    finished: bool,
}

impl<S: SampleSource> Front<S> {
    pub(super) fn new(source: S, st: &Stages, cfg: FrontConfig) -> Front<S> {
        Front {
            source,
            tiers: st.tiers.clone(),
            counters: st.counters.clone(),
            window: cfg.window,
            ahead: VecDeque::with_capacity(cfg.window + 1),
            acc: Accumulator::new(cfg.target, cfg.max_batches),
            exhausted: false,
            failed: None,
            finished: false,
        }
    }

    /// Samples until `window` batches wait behind the next one to serve: pinning them first
    /// means rows read for the current batch that they also need are protected the moment
    /// they are admitted.
    fn fill(&mut self) {
        while !self.exhausted && self.ahead.len() <= self.window {
            match self.source.next_sampled() {
                None => self.exhausted = true,
                Some(Err(e)) => {
                    // Nothing after a failed batch is delivered: stop sampling, drain the
                    // batches before it, then report.
                    self.failed = Some(e);
                    self.exhausted = true;
                }
                Some(Ok(s)) => {
                    let t = Instant::now();
                    let pins = WindowPins::pin(&self.tiers, &s.sample.nodes);
                    add_busy(&self.counters.lookup_ns, t);
                    self.ahead.push_back((s, pins));
                }
            }
        }
    }

    /// Looks `batch` up in memory; also returns its missed nodes (one per miss, in order).
    fn look_up(&self, batch: Sampled, pins: WindowPins) -> (Served, Vec<u32>) {
        let t = Instant::now();
        let (lookup, miss_nodes) = pins.lookup(&batch.sample.nodes);
        add_busy(&self.counters.lookup_ns, t);
        let served = Served {
            batch,
            lookup,
            pins,
        };
        (served, miss_nodes)
    }

    /// The epoch stops early (an error, or the loader going): drops every batch waiting in
    /// the window or the accumulator, which releases the pins they still hold, and hands out
    /// no more work.
    pub(super) fn abandon(&mut self) {
        self.ahead.clear();
        drop(self.acc.take());
        self.exhausted = true;
        self.finished = true;
    }

    /// The next merged read, the error that ends the epoch, or `None` at the end.
    pub(super) fn next_work(&mut self) -> Option<Work> {
        if self.finished {
            return None;
        }
        loop {
            if self.source.cancelled() {
                self.finished = true;
                return None;
            }
            self.fill();
            let Some((batch, pins)) = self.ahead.pop_front() else {
                break;
            };
            let (served, miss_nodes) = self.look_up(batch, pins);
            let t = Instant::now();
            self.acc.push(served, miss_nodes);
            let full = self.acc.is_full();
            add_busy(&self.counters.accumulate_ns, t);
            if full {
                break;
            }
        }
        if !self.acc.is_empty() {
            let t = Instant::now();
            let merged = self.acc.take();
            add_busy(&self.counters.accumulate_ns, t);
            return Some(Work::Read(merged));
        }
        self.finished = true;
        self.failed.take().map(Work::Fail)
    }
}

/// Stage 3's I/O, started: one deduplicated gather for all the merged batches' misses, its
/// requests in flight.
pub(super) struct Submitted<'a> {
    merged: Merged<Served>,
    /// The rows' buffer, filled when the read completes.
    data: Vec<u8>,
    /// None when no batch missed memory.
    gather: Option<Gather<'a>>,
}

/// Submits the merged read of `merged`'s misses.
pub(super) fn submit_merged(st: &Stages, merged: Merged<Served>) -> Result<Submitted<'_>> {
    st.fault.check(&merged)?;
    let data = vec![0u8; merged.rows.len() * st.tiers.row_bytes()];
    let gather = if merged.rows.is_empty() {
        None
    } else {
        let t = Instant::now();
        let gather = st.tiers.reader().submit_gather(&merged.rows);
        add_busy(&st.counters.io_ns, t);
        Some(gather?)
    };
    Ok(Submitted {
        merged,
        data,
        gather,
    })
}

impl Submitted<'_> {
    /// Finishes the read ([`Gather::complete_with`], calling `between` as each request
    /// finishes) and counts it.
    pub(super) fn complete(self, st: &Stages, between: impl FnMut()) -> Result<ReadDone> {
        let Submitted {
            merged,
            mut data,
            gather,
        } = self;
        if let Some(gather) = gather {
            let t = Instant::now();
            let read = gather.complete_with(&mut data, between);
            add_busy(&st.counters.io_ns, t);
            let read = read?;
            st.tiers.record_disk_reads(&read);
            let c = &st.counters;
            let rows = merged.rows.len() as u64;
            c.reads.fetch_add(1, Ordering::Relaxed);
            c.read_rows.fetch_add(rows, Ordering::Relaxed);
            c.read_batches
                .fetch_add(merged.items.len() as u64, Ordering::Relaxed);
            c.max_read_rows.fetch_max(rows, Ordering::Relaxed);
            c.read.lock().unwrap_or_else(|p| p.into_inner()).add(&read);
        }
        let merged_batches = merged.items.len();
        Ok(ReadDone {
            batches: merged.items.into_iter().zip(merged.item_rows).collect(),
            merged_batches,
            rows: merged.rows,
            data,
        })
    }
}

/// A merged read done, its batches still to assemble (in order): the read's distinct rows
/// (`rows[k]`'s bytes at `k * row_bytes` of `data`), freed with its last batch.
pub(super) struct ReadDone {
    /// The batches not yet assembled, each with its missed nodes, oldest first.
    batches: VecDeque<(Served, Vec<u32>)>,
    merged_batches: usize,
    rows: Vec<u32>,
    data: Vec<u8>,
}

impl ReadDone {
    /// Whether every batch of the read was assembled.
    pub(super) fn is_finished(&self) -> bool {
        self.batches.is_empty()
    }
}

/// Stage 4: a batch's feature buffer filled from memory and from its read's rows (which are
/// admitted to the cache), the batch out. One batch at a time, so that the buffers alive are
/// those of the batch being assembled and of the batches handed out, whatever a read merged.
pub(super) struct Assembler {
    tiers: Arc<FeatureTiers>,
    counters: Arc<Counters>,
    /// Scratch for one batch's disk rows (reused).
    rows: Vec<u8>,
}

impl Assembler {
    pub(super) fn new(st: &Stages) -> Assembler {
        Assembler {
            tiers: st.tiers.clone(),
            counters: st.counters.clone(),
            rows: Vec::new(),
        }
    }

    /// Assembles the next batch of `read`; `None` once all were.
    pub(super) fn next_batch(&mut self, read: &mut ReadDone) -> Option<Batch> {
        let (served, miss_nodes) = read.batches.pop_front()?;
        let t = Instant::now();
        let rb = self.tiers.row_bytes();
        let Served {
            batch,
            lookup,
            pins,
        } = served;
        self.rows.clear();
        for &v in &miss_nodes {
            let k = read
                .rows
                .binary_search(&v)
                .expect("every miss is in its merged read");
            self.rows.extend_from_slice(&read.data[k * rb..][..rb]);
        }
        let nodes = &batch.sample.nodes;
        let mut features = vec![0u8; nodes.len() * rb];
        // Releases every pin the batch held, whether or not the cache keeps its disk rows.
        pins.fill(nodes, &lookup, &miss_nodes, &self.rows, &mut features);
        let merged_rows = read.rows.len();
        if read.batches.is_empty() {
            (read.rows, read.data) = (Vec::new(), Vec::new());
        }
        // Keep the scratch from growing to the largest batch forever.
        if self.rows.capacity() > 64 << 20 {
            self.rows = Vec::new();
        }
        let misses = lookup.misses.len();
        let device_rows = lookup.device_positions.len();
        let stats = BatchStats {
            sample_secs: batch.sample_secs,
            device_rows,
            memory_rows: nodes.len() - misses - device_rows,
            disk_rows: misses,
            merged_batches: if merged_rows > 0 {
                read.merged_batches
            } else {
                0
            },
            merged_rows,
        };
        add_busy(&self.counters.assemble_ns, t);
        Some(Batch {
            index: batch.index,
            seeds: batch.seeds,
            links: batch.links,
            sample: batch.sample,
            features,
            device_positions: lookup.device_positions,
            device_slots: lookup.device_slots,
            stats,
        })
    }
}
