//! Fetching the active blocks of a segment from its tier: resident memory, the disk (through
//! the I/O engine, many requests in flight) or far memory (chunked, through the far client).
//!
//! A fetch reads *runs*: maximal stretches of consecutive active blocks, merged across gaps of
//! inactive blocks shorter than [`MERGE_GAP`] (reading a little more beats another request).

use std::ops::Range;
use std::sync::Arc;

use strata_farmem::{FarClient, FarCompletion, FarRead};
use strata_io::{align_down, align_up, AlignedBuf, IoBuf, IoFile, IoQueue, Request, ALIGN};
use strata_store::npy::DATA_OFFSET;

use crate::error::{GridError, Result};
use crate::grid::{Grid, Segment};
use crate::layout::EDGE_BYTES;

/// Inactive bytes between two active runs that are read anyway rather than split.
pub const MERGE_GAP: u64 = 64 << 10;
/// Largest single disk request.
pub const IO_PIECE: usize = 1 << 20;
const WEIGHT_BYTES: u64 = 4;

/// Active blocks of a segment, grouped into runs of edges to read.
#[derive(Debug, Clone, Default)]
pub struct FetchPlan {
    /// Edge ranges to read.
    pub runs: Vec<Range<u64>>,
    /// File positions of the active blocks, with the run each lies in.
    pub blocks: Vec<(usize, usize)>,
}

impl FetchPlan {
    /// The runs covering the blocks of `seg` for which `active(pos)` holds.
    pub fn new(grid: &Grid, seg: &Segment, active: impl Fn(usize) -> bool) -> FetchPlan {
        let mut plan = FetchPlan::default();
        for pos in seg.blocks.clone() {
            let e = grid.block_edges(pos);
            if e.start == e.end || !active(pos) {
                continue;
            }
            match plan.runs.last_mut() {
                Some(last) if (e.start - last.end) * EDGE_BYTES <= MERGE_GAP => last.end = e.end,
                _ => plan.runs.push(e.clone()),
            }
            plan.blocks.push((pos, plan.runs.len() - 1));
        }
        plan
    }

    /// Edges the runs read (including merged gaps).
    pub fn edges_read(&self) -> u64 {
        self.runs.iter().map(|r| r.end - r.start).sum()
    }
}

/// Where the bytes of a fetched segment are.
pub enum Bytes {
    /// A resident segment (the whole segment, from its first edge).
    Local(Arc<Resident>),
    /// Disk runs, each at `starts[k]` bytes into one aligned buffer.
    Disk {
        edges: AlignedBuf,
        weights: Option<AlignedBuf>,
        edge_at: Vec<usize>,
        weight_at: Vec<usize>,
    },
    /// Far runs, one buffer each.
    Far {
        edges: Vec<Vec<u8>>,
        weights: Vec<Vec<u8>>,
    },
}

/// A segment kept in memory for the whole run.
pub struct Resident {
    pub first_edge: u64,
    pub edges: AlignedBuf,
    pub weights: Option<AlignedBuf>,
}

impl Resident {
    /// Checks the offsets of every block of `seg` (the segment this holds) once, at load: its
    /// bytes stay as loaded for the whole run, so compute need not scan them again on every
    /// pass (in memory, that scan is a second read of every edge per iteration).
    pub fn check(&self, grid: &Grid, seg: &Segment) -> Result<()> {
        for pos in seg.blocks.clone() {
            let e = grid.block_edges(pos);
            let at = (e.start - self.first_edge) as usize * EDGE_BYTES as usize;
            let len = (e.end - e.start) as usize * EDGE_BYTES as usize;
            grid.check_block(pos, cast(&self.edges.as_slice()[at..at + len]))?;
        }
        Ok(())
    }
}

/// The fetched active blocks of one segment, ready for compute.
pub struct Fetched {
    pub plan: FetchPlan,
    pub bytes: Bytes,
}

impl Fetched {
    /// Edge records and weights (empty when not loaded) of active block `k` of the plan.
    pub fn block<'a>(&'a self, grid: &Grid, k: usize) -> (&'a [[u32; 2]], &'a [f32]) {
        let (pos, run) = self.plan.blocks[k];
        let e = grid.block_edges(pos);
        let (n, from_run) = (
            (e.end - e.start) as usize,
            (e.start - self.plan.runs[run].start) as usize,
        );
        let (eb, wb): (&[u8], Option<&[u8]>) = match &self.bytes {
            Bytes::Local(r) => {
                let at = (e.start - r.first_edge) as usize;
                (
                    &r.edges.as_slice()[at * 8..(at + n) * 8],
                    r.weights
                        .as_ref()
                        .map(|w| &w.as_slice()[at * 4..(at + n) * 4]),
                )
            }
            Bytes::Disk {
                edges,
                weights,
                edge_at,
                weight_at,
            } => (
                &edges.as_slice()[edge_at[run] + from_run * 8..][..n * 8],
                weights
                    .as_ref()
                    .map(|w| &w.as_slice()[weight_at[run] + from_run * 4..][..n * 4]),
            ),
            Bytes::Far { edges, weights } => (
                &edges[run][from_run * 8..(from_run + n) * 8],
                weights
                    .get(run)
                    .map(|w| &w[from_run * 4..(from_run + n) * 4]),
            ),
        };
        (cast(eb), wb.map(cast).unwrap_or(&[]))
    }
}

/// Reinterprets little-endian bytes; every buffer here is at least 8-byte aligned (aligned
/// buffers, or allocations of the system allocator, which aligns to 16).
fn cast<T: bytemuck::Pod>(b: &[u8]) -> &[T] {
    bytemuck::try_cast_slice(b).expect("fetch buffers are aligned")
}

/// Byte range in a `.npy` file of edges `r`, for records of `width` bytes.
fn file_range(r: &Range<u64>, width: u64) -> (u64, u64) {
    (DATA_OFFSET + r.start * width, DATA_OFFSET + r.end * width)
}

/// Aligned bytes a disk buffer needs for `runs` of records of `width` bytes.
pub fn disk_bytes(runs: &[Range<u64>], width: u64) -> usize {
    runs.iter()
        .map(|r| {
            let (a, b) = file_range(r, width);
            (align_up(b) - align_down(a)) as usize
        })
        .sum()
}

/// Reads runs of records of `width` bytes from `file` into `buf` (which must hold
/// [`disk_bytes`]), returning where each run's first record landed. Pieces of at most
/// [`IO_PIECE`] go out together, so a segment keeps many requests in flight.
pub fn read_runs(
    q: &mut IoQueue,
    file: &IoFile,
    runs: &[Range<u64>],
    width: u64,
    buf: &mut AlignedBuf,
) -> Result<Vec<usize>> {
    let file_len = file.file().size()?;
    let base = buf.full_mut().as_mut_ptr();
    assert!(
        buf.capacity() >= disk_bytes(runs, width),
        "fetch buffer too small"
    );
    let mut at = Vec::with_capacity(runs.len());
    let mut reqs = Vec::new();
    let mut off = 0usize;
    for r in runs {
        let (a, b) = file_range(r, width);
        let start = align_down(a);
        at.push(off + (a - start) as usize);
        let end = align_up(b).min(file_len);
        let mut p = start;
        while p < end {
            let len = ((end - p) as usize).min(IO_PIECE);
            // SAFETY: pieces are disjoint, aligned regions of `buf` (each gets its aligned
            // length), and every completion is received below before `buf` is used again.
            let piece = unsafe { IoBuf::borrowed(base.add(off), align_up(len as u64) as usize) };
            reqs.push(Request::read(file, p, len, piece, 0));
            off += align_up(len as u64) as usize;
            p += len as u64;
        }
        off = off.next_multiple_of(ALIGN);
    }
    q.submit(reqs);
    q.drain()?;
    buf.set_len(off);
    Ok(at)
}

/// Reads a plan's runs (and weights) from disk.
pub fn fetch_disk(
    q: &mut IoQueue,
    edges_file: &IoFile,
    weights_file: Option<&IoFile>,
    plan: FetchPlan,
    pool: &mut Vec<AlignedBuf>,
) -> Result<Fetched> {
    let mut take = |need: usize| match pool.iter().position(|b| b.capacity() >= need) {
        Some(k) => pool.swap_remove(k),
        None => AlignedBuf::new(need),
    };
    let mut edges = take(disk_bytes(&plan.runs, EDGE_BYTES));
    let edge_at = read_runs(q, edges_file, &plan.runs, EDGE_BYTES, &mut edges)?;
    let (weights, weight_at) = match weights_file {
        Some(f) => {
            let mut w = take(disk_bytes(&plan.runs, WEIGHT_BYTES));
            let at = read_runs(q, f, &plan.runs, WEIGHT_BYTES, &mut w)?;
            (Some(w), at)
        }
        None => (None, Vec::new()),
    };
    Ok(Fetched {
        plan,
        bytes: Bytes::Disk {
            edges,
            weights,
            edge_at,
            weight_at,
        },
    })
}

/// Far-memory layout of a segment: its edge records, then its weights.
pub fn far_offsets(seg: &Segment, run: &Range<u64>) -> (u64, u64, u64) {
    let edge_off = (run.start - seg.edges.start) * EDGE_BYTES;
    let weight_off = seg.edge_bytes() + (run.start - seg.edges.start) * WEIGHT_BYTES;
    (edge_off, weight_off, run.end - run.start)
}

/// Reads a plan's runs from far memory (segment id `id`), waiting for all of them.
pub fn fetch_far(
    client: &FarClient,
    id: u64,
    seg: &Segment,
    plan: FetchPlan,
    weighted: bool,
    pool: &mut Vec<Vec<u8>>,
) -> std::result::Result<Fetched, strata_farmem::FarError> {
    let (tx, rx) = crossbeam_channel::unbounded::<FarCompletion>();
    let mut take = |need: usize| match pool.iter().position(|b| b.capacity() >= need) {
        Some(k) => {
            let mut b = pool.swap_remove(k);
            b.resize(need, 0);
            b
        }
        None => vec![0u8; need],
    };
    let mut reqs = Vec::new();
    for (k, run) in plan.runs.iter().enumerate() {
        let (eo, wo, n) = far_offsets(seg, run);
        let len = (n * EDGE_BYTES) as usize;
        reqs.push(FarRead {
            segment: id,
            offset: eo,
            len,
            buf: take(len),
            tag: 2 * k as u64,
        });
        if weighted {
            let len = (n * WEIGHT_BYTES) as usize;
            reqs.push(FarRead {
                segment: id,
                offset: wo,
                len,
                buf: take(len),
                tag: 2 * k as u64 + 1,
            });
        }
    }
    let count = reqs.len();
    client.submit(reqs, &tx);
    let mut edges = vec![Vec::new(); plan.runs.len()];
    let mut weights = vec![Vec::new(); if weighted { plan.runs.len() } else { 0 }];
    let mut first_error = None;
    for _ in 0..count {
        let c = rx.recv().expect("the far client completes every read");
        match c.result {
            Ok(_) if c.tag % 2 == 0 => edges[(c.tag / 2) as usize] = c.buf,
            Ok(_) => weights[(c.tag / 2) as usize] = c.buf,
            Err(e) => {
                pool.push(c.buf);
                first_error.get_or_insert(e);
            }
        }
    }
    if let Some(e) = first_error {
        pool.extend(edges.into_iter().chain(weights));
        return Err(e);
    }
    Ok(Fetched {
        plan,
        bytes: Bytes::Far { edges, weights },
    })
}

/// Loads a whole segment into memory (a resident segment).
pub fn load_resident(
    q: &mut IoQueue,
    edges_file: &IoFile,
    weights_file: Option<&IoFile>,
    seg: &Segment,
) -> Result<Resident> {
    let runs = [seg.edges.clone()];
    let mut edges = AlignedBuf::new(disk_bytes(&runs, EDGE_BYTES));
    let at = read_runs(q, edges_file, &runs, EDGE_BYTES, &mut edges)?;
    let edges = compact(edges, at[0], seg.edge_bytes() as usize);
    let weights = match weights_file {
        Some(f) => {
            let mut w = AlignedBuf::new(disk_bytes(&runs, WEIGHT_BYTES));
            let at = read_runs(q, f, &runs, WEIGHT_BYTES, &mut w)?;
            let n = (seg.edges.end - seg.edges.start) * WEIGHT_BYTES;
            Some(compact(w, at[0], n as usize))
        }
        None => None,
    };
    Ok(Resident {
        first_edge: seg.edges.start,
        edges,
        weights,
    })
}

/// Moves `len` bytes at `at` to the start of `buf`.
fn compact(mut buf: AlignedBuf, at: usize, len: usize) -> AlignedBuf {
    if at > 0 {
        buf.full_mut().copy_within(at..at + len, 0);
    }
    buf.set_len(len);
    buf
}

/// A disk-read failure as a grid error naming the grid.
pub fn disk_error(grid: &Grid, e: GridError) -> GridError {
    GridError::invalid(grid.dir(), format!("reading edge blocks failed: {e}"))
}
