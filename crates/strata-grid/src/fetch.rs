//! Fetching the active blocks of a segment from its tier: resident memory, the disk (through
//! the I/O engine, many requests in flight) or far memory (chunked, through the far client).
//!
//! A fetch reads *runs*: maximal stretches of consecutive active blocks, merged across gaps of
//! inactive blocks shorter than [`MERGE_GAP`] (reading a little more beats another request).
//! Runs are read as stored: plain records, or a compressed grid's block codes, which the
//! fetch stage then decodes ([`Fetched::decode`]) so that compute always sees records.

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
    /// Where each run is stored: bytes of the edge array's data (`edges.npy`, 8 an edge, or
    /// `edge_codes.npy`).
    pub bytes: Vec<Range<u64>>,
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
            let b = grid.block_bytes(pos);
            match (plan.runs.last_mut(), plan.bytes.last_mut()) {
                (Some(last), Some(stored)) if b.start - stored.end <= MERGE_GAP => {
                    last.end = e.end;
                    stored.end = b.end;
                }
                _ => {
                    plan.runs.push(e.clone());
                    plan.bytes.push(b);
                }
            }
            plan.blocks.push((pos, plan.runs.len() - 1));
        }
        plan
    }

    /// Edges the runs read (including merged gaps).
    pub fn edges_read(&self) -> u64 {
        self.runs.iter().map(|r| r.end - r.start).sum()
    }

    /// Stored bytes of edges the runs read (including merged gaps).
    pub fn stored_read(&self) -> u64 {
        self.bytes.iter().map(|r| r.end - r.start).sum()
    }

    /// Edges of the active blocks.
    pub fn block_edges(&self, grid: &Grid) -> u64 {
        self.blocks
            .iter()
            .map(|&(pos, _)| {
                let e = grid.block_edges(pos);
                e.end - e.start
            })
            .sum()
    }
}

/// Where the bytes of a fetched segment's edges, or weights, are.
pub enum Bytes {
    /// A resident segment (the whole segment decoded, from its first edge; weights included).
    Local(Arc<Resident>),
    /// Disk runs, each at `at[k]` bytes into one aligned buffer.
    Disk { buf: AlignedBuf, at: Vec<usize> },
    /// Far runs, one buffer each.
    Far(Vec<Vec<u8>>),
    /// A compressed grid's active blocks decoded in the fetch stage: block k of the plan at
    /// record `at[k]`.
    Decoded {
        edges: Vec<[u32; 2]>,
        at: Vec<usize>,
    },
}

impl Bytes {
    /// `len` bytes from `from` bytes into run `run` (disk and far bytes).
    fn run_bytes(&self, run: usize, from: usize, len: usize) -> &[u8] {
        match self {
            Bytes::Disk { buf, at } => &buf.as_slice()[at[run] + from..][..len],
            Bytes::Far(runs) => &runs[run][from..from + len],
            Bytes::Local(_) | Bytes::Decoded { .. } => {
                unreachable!("resident and decoded bytes are not read by run")
            }
        }
    }
}

/// A segment kept in memory for the whole run, its edges as records (decoded once, at load,
/// in a compressed grid).
pub struct Resident {
    pub first_edge: u64,
    pub edges: AlignedBuf,
    pub weights: Option<AlignedBuf>,
}

/// The fetched active blocks of one segment, ready for compute.
pub struct Fetched {
    pub plan: FetchPlan,
    pub edges: Bytes,
    /// Weights read from disk or far memory (a resident segment holds its own).
    pub weights: Option<Bytes>,
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
        let edges: &[[u32; 2]] = match &self.edges {
            Bytes::Local(r) => {
                let at = (e.start - r.first_edge) as usize;
                cast(&r.edges.as_slice()[at * 8..(at + n) * 8])
            }
            Bytes::Decoded { edges, at } => &edges[at[k]..at[k] + n],
            raw => cast(raw.run_bytes(run, from_run * 8, n * 8)),
        };
        let weights: Option<&[u8]> = match (&self.edges, &self.weights) {
            (Bytes::Local(r), _) => r.weights.as_ref().map(|w| {
                let at = (e.start - r.first_edge) as usize;
                &w.as_slice()[at * 4..(at + n) * 4]
            }),
            (_, Some(w)) => Some(w.run_bytes(run, from_run * 4, n * 4)),
            (_, None) => None,
        };
        (edges, weights.map(cast).unwrap_or(&[]))
    }

    /// Whether compute must check the blocks' offsets: plain records read this pass (resident
    /// blocks were checked at load, decoded ones as they were decoded).
    pub fn needs_check(&self) -> bool {
        matches!(self.edges, Bytes::Disk { .. } | Bytes::Far(_))
    }

    /// Decodes the active blocks of a compressed grid's fetched codes (checking them) into
    /// `out` (a buffer to reuse, any length); returns the codes' bytes, for reuse.
    pub fn decode(&mut self, grid: &Grid, mut out: Vec<[u32; 2]>) -> Result<Bytes> {
        let total = self.plan.block_edges(grid) as usize;
        out.truncate(total);
        out.resize(total, [0; 2]);
        let mut at = Vec::with_capacity(self.plan.blocks.len());
        let mut next = 0;
        for &(pos, run) in &self.plan.blocks {
            let (e, b) = (grid.block_edges(pos), grid.block_bytes(pos));
            let n = (e.end - e.start) as usize;
            let from = (b.start - self.plan.bytes[run].start) as usize;
            let code = self.edges.run_bytes(run, from, (b.end - b.start) as usize);
            grid.decode_block(pos, code, &mut out[next..next + n])?;
            at.push(next);
            next += n;
        }
        Ok(std::mem::replace(
            &mut self.edges,
            Bytes::Decoded { edges: out, at },
        ))
    }
}

/// Reinterprets little-endian bytes; every buffer here is at least 8-byte aligned (aligned
/// buffers, or allocations of the system allocator, which aligns to 16).
fn cast<T: bytemuck::Pod>(b: &[u8]) -> &[T] {
    bytemuck::try_cast_slice(b).expect("fetch buffers are aligned")
}

/// Byte range in a `.npy` file of the data bytes `r`.
fn file_range(r: &Range<u64>) -> (u64, u64) {
    (DATA_OFFSET + r.start, DATA_OFFSET + r.end)
}

/// The data bytes of the weights (4 an edge) of edges `r`.
fn weight_bytes(r: &Range<u64>) -> Range<u64> {
    r.start * WEIGHT_BYTES..r.end * WEIGHT_BYTES
}

/// Aligned bytes a disk buffer needs for `runs` of data bytes.
pub fn disk_bytes(runs: &[Range<u64>]) -> usize {
    runs.iter()
        .map(|r| {
            let (a, b) = file_range(r);
            (align_up(b) - align_down(a)) as usize
        })
        .sum()
}

/// Reads runs of data bytes from `file` into `buf` (which must hold [`disk_bytes`]),
/// returning where each run's first byte landed. Pieces of at most [`IO_PIECE`] go out
/// together, so a segment keeps many requests in flight.
pub fn read_runs(
    q: &mut IoQueue,
    file: &IoFile,
    runs: &[Range<u64>],
    buf: &mut AlignedBuf,
) -> Result<Vec<usize>> {
    let file_len = file.file().size()?;
    let base = buf.full_mut().as_mut_ptr();
    assert!(buf.capacity() >= disk_bytes(runs), "fetch buffer too small");
    let mut at = Vec::with_capacity(runs.len());
    let mut reqs = Vec::new();
    let mut off = 0usize;
    for r in runs {
        let (a, b) = file_range(r);
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
    let mut read = |file: &IoFile, runs: &[Range<u64>]| -> Result<Bytes> {
        let need = disk_bytes(runs);
        let mut buf = match pool.iter().position(|b| b.capacity() >= need) {
            Some(k) => pool.swap_remove(k),
            None => AlignedBuf::new(need),
        };
        let at = read_runs(q, file, runs, &mut buf)?;
        Ok(Bytes::Disk { buf, at })
    };
    let edges = read(edges_file, &plan.bytes)?;
    let weights = match weights_file {
        Some(f) => Some(read(
            f,
            &plan.runs.iter().map(weight_bytes).collect::<Vec<_>>(),
        )?),
        None => None,
    };
    Ok(Fetched {
        plan,
        edges,
        weights,
    })
}

/// Far-memory layout of a segment: its stored edges, then its weights. Returns the offsets
/// of `run`'s edges and weights there.
pub fn far_offsets(seg: &Segment, plan: &FetchPlan, run: usize) -> (u64, u64) {
    let edge_off = plan.bytes[run].start - seg.bytes.start;
    let weight_off = seg.stored_bytes() + (plan.runs[run].start - seg.edges.start) * WEIGHT_BYTES;
    (edge_off, weight_off)
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
    for k in 0..plan.runs.len() {
        let (eo, wo) = far_offsets(seg, &plan, k);
        let len = (plan.bytes[k].end - plan.bytes[k].start) as usize;
        reqs.push(FarRead {
            segment: id,
            offset: eo,
            len,
            buf: take(len),
            tag: 2 * k as u64,
        });
        if weighted {
            let len = ((plan.runs[k].end - plan.runs[k].start) * WEIGHT_BYTES) as usize;
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
        edges: Bytes::Far(edges),
        weights: weighted.then_some(Bytes::Far(weights)),
    })
}

/// A segment's stored bytes read whole: its edges as stored (records or codes) and its
/// weights, each from the start of its buffer.
pub struct Stored {
    pub edges: AlignedBuf,
    pub weights: Option<AlignedBuf>,
}

/// Reads the stored bytes of a whole segment (what far memory holds, and what a resident
/// segment is loaded from).
pub fn load_stored(
    q: &mut IoQueue,
    edges_file: &IoFile,
    weights_file: Option<&IoFile>,
    seg: &Segment,
) -> Result<Stored> {
    let whole = |q: &mut IoQueue, file: &IoFile, r: Range<u64>| -> Result<AlignedBuf> {
        let runs = [r];
        let mut buf = AlignedBuf::new(disk_bytes(&runs));
        let at = read_runs(q, file, &runs, &mut buf)?;
        let len = (runs[0].end - runs[0].start) as usize;
        Ok(compact(buf, at[0], len))
    };
    let edges = whole(q, edges_file, seg.bytes.clone())?;
    let weights = match weights_file {
        Some(f) => Some(whole(q, f, weight_bytes(&seg.edges))?),
        None => None,
    };
    Ok(Stored { edges, weights })
}

/// Loads a whole segment into memory (a resident segment), checking its blocks once, at
/// load: its bytes stay as loaded for the whole run, so compute need not scan them again on
/// every pass (in memory, that scan is a second read of every edge per iteration). A
/// compressed grid's blocks are decoded here, once.
pub fn load_resident(
    q: &mut IoQueue,
    grid: &Grid,
    edges_file: &IoFile,
    weights_file: Option<&IoFile>,
    seg: &Segment,
) -> Result<Resident> {
    let stored = load_stored(q, edges_file, weights_file, seg)?;
    let edges = match grid.compression().is_compressed() {
        true => decode_segment(grid, seg, stored.edges.as_slice())?,
        false => {
            for pos in seg.blocks.clone() {
                let e = grid.block_edges(pos);
                let at = (e.start - seg.edges.start) as usize * EDGE_BYTES as usize;
                let len = (e.end - e.start) as usize * EDGE_BYTES as usize;
                grid.check_block(pos, cast(&stored.edges.as_slice()[at..at + len]))?;
            }
            stored.edges
        }
    };
    Ok(Resident {
        first_edge: seg.edges.start,
        edges,
        weights: stored.weights,
    })
}

/// Decodes every block of `seg` from its stored `codes` into records.
fn decode_segment(grid: &Grid, seg: &Segment, codes: &[u8]) -> Result<AlignedBuf> {
    let mut records = AlignedBuf::new(seg.edge_bytes() as usize);
    records.set_len(seg.edge_bytes() as usize);
    let out: &mut [[u32; 2]] = bytemuck::cast_slice_mut(records.as_mut_slice());
    for pos in seg.blocks.clone() {
        let (e, b) = (grid.block_edges(pos), grid.block_bytes(pos));
        let (at, from) = (
            (e.start - seg.edges.start) as usize,
            (b.start - seg.bytes.start) as usize,
        );
        grid.decode_block(
            pos,
            &codes[from..from + (b.end - b.start) as usize],
            &mut out[at..at + (e.end - e.start) as usize],
        )?;
    }
    Ok(records)
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
