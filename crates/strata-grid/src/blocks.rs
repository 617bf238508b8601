//! Pass 2 of a grid build: each major chunk's spooled records are read back in turn (the next
//! chunk's reads in flight while this one is sorted), counting-sorted by minor chunk into
//! their blocks and handed to the [`BlockWriter`], the one place a grid's blocks are written
//! (as plain records, or sorted and coded in a compressed grid: [`crate::block_codec`]).
//! Degrees are counted on the way: the major side's in a chunk-sized array written as each
//! major chunk ends (its vertices are contiguous), the minor side's in a vertex-sized array
//! through a buffer per minor chunk ([`MinorDegrees`]).

use std::collections::BTreeMap;
use std::path::Path;

use strata_io::progress::{Meter, Progress};
use strata_io::{AlignedBuf, IoQueue, Request};
use strata_store::array::NpyWriter;
use strata_store::npy::DType;
use strata_store::ArrayInfo;

use crate::block_codec::{self, Compression, Keys};
use crate::error::Result;
use crate::layout::{Layout, Order, WeightSpec, EDGE_BYTES, EDGE_CODES};
use crate::spool::{ChunkDiv, Spool};

/// Bytes of the edge file's write buffers (two halves: one fills while the other is written).
const EDGE_WRITE_BUFFER: usize = 8 << 20;
/// Bytes of the weight and degree files' write buffers.
const SMALL_WRITE_BUFFER: usize = 2 << 20;

/// Writes a grid's blocks in file order: their edge records to `edges.npy` (in a compressed
/// grid, each block sorted and its code appended to `edge_codes.npy`), their weights to
/// `weights.npy` (in the stored order), and the block index (and the code index). Every block
/// of a grid passes through [`BlockWriter::push_block`], whatever the build's source.
pub(crate) struct BlockWriter {
    edges: NpyWriter,
    weights: Option<NpyWriter>,
    index: Vec<i64>,
    written: u64,
    largest_block: u64,
    weight_range: Option<(f32, f32)>,
    coder: Option<Coder>,
}

/// A compressed grid's coding state: the keys, the code index so far, and the buffers reused
/// from block to block (the one block's code, and a weighted block's (key, weight) pairs as it
/// is sorted; see `BuildPlan`'s coding buffers).
struct Coder {
    compression: Compression,
    keys: Keys,
    index: Vec<i64>,
    code: Vec<u8>,
    pairs: Vec<(u64, f32)>,
}

/// What the block writer wrote.
pub(crate) struct Blocks {
    /// The edge arrays by name: `edges` (or `edge_codes`), and `weights` when weighted.
    pub arrays: BTreeMap<String, ArrayInfo>,
    /// Smallest and largest weight, when weighted.
    pub weight_range: Option<(f32, f32)>,
    /// First edge of each block in file order, then the edge count (P² + 1 entries).
    pub index: Vec<i64>,
    /// Compressed grids: first byte of each block's code, then the code's bytes (P² + 1).
    pub code_index: Option<Vec<i64>>,
    pub written: u64,
    pub largest_block: u64,
}

impl BlockWriter {
    /// Creates `dir/edges.npy`, or `dir/edge_codes.npy` when `compression` codes the blocks
    /// of a grid with `chunk_size` vertices a chunk (and `dir/weights.npy` when `weighted`),
    /// for `blocks` blocks.
    pub fn create(
        dir: &Path,
        weighted: bool,
        blocks: usize,
        compression: Compression,
        chunk_size: u64,
    ) -> Result<BlockWriter> {
        // Block offsets from 0, one entry per block after it.
        let offsets = || {
            let mut index = Vec::with_capacity(blocks + 1);
            index.push(0);
            index
        };
        let (edges, coder) = match compression {
            Compression::None => (
                NpyWriter::create(&dir.join("edges.npy"), DType::U32, &[2], EDGE_WRITE_BUFFER)?,
                None,
            ),
            _ => {
                let path = dir.join(format!("{EDGE_CODES}.npy"));
                let coder = Coder {
                    compression,
                    keys: Keys::new(chunk_size),
                    index: offsets(),
                    code: Vec::new(),
                    pairs: Vec::new(),
                };
                (
                    NpyWriter::create(&path, DType::U8, &[], EDGE_WRITE_BUFFER)?,
                    Some(coder),
                )
            }
        };
        Ok(BlockWriter {
            edges,
            weights: weighted
                .then(|| {
                    NpyWriter::create(
                        &dir.join("weights.npy"),
                        DType::F32,
                        &[],
                        SMALL_WRITE_BUFFER,
                    )
                })
                .transpose()?,
            index: offsets(),
            written: 0,
            largest_block: 0,
            weight_range: None,
            coder,
        })
    }

    /// Appends the next block in file order: its edges as (source offset, destination offset)
    /// and, in a weighted grid, their weights. A compressed grid sorts both (the order it
    /// stores) and writes the block's code.
    pub fn push_block(
        &mut self,
        edges: &mut [[u32; 2]],
        mut weights: Option<&mut [f32]>,
    ) -> Result<()> {
        match self.coder.as_mut() {
            Some(c) => {
                block_codec::sort_block(edges, weights.as_deref_mut(), &mut c.pairs);
                c.code.clear();
                block_codec::encode(c.compression, c.keys, edges, &mut c.code);
                self.edges.write(&c.code)?;
                let end = c.index.last().copied().unwrap_or(0) + c.code.len() as i64;
                c.index.push(end);
            }
            None => self.edges.write::<u32>(bytemuck::cast_slice(edges))?,
        }
        if let (Some(w), Some(vals)) = (self.weights.as_mut(), weights) {
            debug_assert_eq!(vals.len(), edges.len());
            for &x in vals.iter() {
                let (lo, hi) = self.weight_range.get_or_insert((x, x));
                *lo = lo.min(x);
                *hi = hi.max(x);
            }
            w.write(&*vals)?;
        }
        self.written += edges.len() as u64;
        self.largest_block = self.largest_block.max(edges.len() as u64);
        self.index.push(self.written as i64);
        Ok(())
    }

    /// Closes the files (synced).
    pub fn finish(self) -> Result<Blocks> {
        let mut arrays = BTreeMap::new();
        let name = match self.coder {
            Some(_) => EDGE_CODES,
            None => "edges",
        };
        arrays.insert(name.to_string(), self.edges.finish()?);
        if let Some(w) = self.weights {
            arrays.insert("weights".to_string(), w.finish()?);
        }
        Ok(Blocks {
            arrays,
            weight_range: self.weight_range,
            index: self.index,
            code_index: self.coder.map(|c| c.index),
            written: self.written,
            largest_block: self.largest_block,
        })
    }
}

/// Per-vertex edge counts of one side, in 32 bits while no count can pass them.
enum Counts {
    Narrow(Vec<u32>),
    Wide(Vec<u64>),
}

impl Counts {
    /// Counters for `n` vertices of a grid of `edges` edges.
    fn new(n: usize, edges: u64) -> Counts {
        if edges <= u32::MAX as u64 {
            Counts::Narrow(vec![0; n])
        } else {
            Counts::Wide(vec![0; n])
        }
    }

    /// Counts one edge at each vertex `base + off` for `off` in `offsets`.
    fn add_all(&mut self, base: usize, offsets: &[u32]) {
        match self {
            Counts::Narrow(c) => {
                let window = &mut c[base..];
                offsets.iter().for_each(|&o| window[o as usize] += 1);
            }
            Counts::Wide(c) => {
                let window = &mut c[base..];
                offsets.iter().for_each(|&o| window[o as usize] += 1);
            }
        }
    }

    /// Writes the counts as an int64 array `path`.
    fn write(&self, path: &Path) -> Result<ArrayInfo> {
        let mut w = NpyWriter::create(path, DType::I64, &[], SMALL_WRITE_BUFFER)?;
        let mut out: Vec<i64> = Vec::with_capacity(1 << 16);
        let mut flush = |out: &mut Vec<i64>| -> Result<()> {
            w.write(out)?;
            out.clear();
            Ok(())
        };
        match self {
            Counts::Narrow(c) => {
                for part in c.chunks(1 << 16) {
                    out.extend(part.iter().map(|&x| x as i64));
                    flush(&mut out)?;
                }
            }
            Counts::Wide(c) => {
                for part in c.chunks(1 << 16) {
                    out.extend(part.iter().map(|&x| x as i64));
                    flush(&mut out)?;
                }
            }
        }
        Ok(w.finish()?)
    }
}

/// The minor side's degrees (sources in column order), counted through a buffer per minor
/// chunk: a block's minor offsets are appended to its chunk's buffer, and a full buffer is
/// counted into that chunk's counters, a window small enough to stay in cache. Counting each
/// edge straight into the vertex-sized array cost a cache miss per edge (75% of pass 2's time
/// at RMAT scale 22); through the buffers the window is fetched once per buffer of edges.
struct MinorDegrees {
    counts: Counts,
    buffers: Vec<Vec<u32>>,
    /// Offsets a buffer holds before it is counted.
    capacity: usize,
    chunk_size: usize,
}

impl MinorDegrees {
    fn new(layout: &Layout, edges: u64, buffer_bytes: u64) -> MinorDegrees {
        let capacity = (buffer_bytes / 4).max(1) as usize;
        MinorDegrees {
            counts: Counts::new(layout.num_vertices as usize, edges),
            buffers: vec![Vec::new(); layout.partitions as usize],
            capacity,
            chunk_size: layout.chunk_size as usize,
        }
    }

    /// Counts the edges whose minor-side vertices are `offsets` of minor chunk `minor`.
    fn add(&mut self, minor: usize, offsets: impl Iterator<Item = u32>) {
        for o in offsets {
            let buf = &mut self.buffers[minor];
            buf.push(o);
            if buf.len() == self.capacity {
                self.counts.add_all(minor * self.chunk_size, buf);
                buf.clear();
            }
        }
    }

    /// Counts what the buffers hold and returns the counters.
    fn finish(mut self) -> Counts {
        for (minor, buf) in self.buffers.iter().enumerate() {
            self.counts.add_all(minor * self.chunk_size, buf);
        }
        self.counts
    }
}

/// Reads one major chunk's spooled records at a time, with the next chunk's reads in flight.
struct MajorReader<'a> {
    spool: &'a Spool,
    queue: IoQueue,
    /// Capacity of each read buffer: the largest spool chunk, padded.
    buffer_bytes: usize,
    free: Vec<AlignedBuf>,
    /// The major chunk whose reads are in flight, and its buffers as they arrive.
    ahead: Option<(usize, Vec<Option<AlignedBuf>>)>,
}

impl<'a> MajorReader<'a> {
    fn new(spool: &'a Spool) -> MajorReader<'a> {
        let largest = spool.chunks.iter().flatten().map(|c| c.bytes).max();
        MajorReader {
            spool,
            queue: strata_io::Engine::shared().queue(),
            buffer_bytes: strata_io::align_up(largest.unwrap_or(0)).max(strata_io::ALIGN as u64)
                as usize,
            free: Vec::new(),
            ahead: None,
        }
    }

    /// Sends the reads of major chunk `major`.
    fn request(&mut self, major: usize) {
        let chunks = &self.spool.chunks[major];
        let mut reqs = Vec::with_capacity(chunks.len());
        for (k, c) in chunks.iter().enumerate() {
            let buf = self
                .free
                .pop()
                .unwrap_or_else(|| AlignedBuf::new(self.buffer_bytes));
            let len = strata_io::align_up(c.bytes) as usize;
            reqs.push(Request::read(
                &self.spool.file,
                c.offset,
                len,
                buf,
                k as u64,
            ));
        }
        self.queue.submit(reqs);
        self.ahead = Some((major, (0..chunks.len()).map(|_| None).collect()));
    }

    /// The buffers of major chunk `major` (requested before), in spool order, each holding
    /// its chunk's records in its first `bytes`.
    fn take(&mut self, major: usize) -> Result<Vec<AlignedBuf>> {
        let (m, mut got) = self.ahead.take().expect("a major chunk was requested");
        debug_assert_eq!(m, major);
        let mut first_error = None;
        while got.iter().any(Option::is_none) {
            let c = self.queue.wait().expect("spool reads are in flight");
            let mut buf = c.buf.into_heap().expect("spool reads use heap buffers");
            match c.result {
                Ok(_) => {
                    buf.set_len(self.spool.chunks[major][c.tag as usize].bytes as usize);
                    got[c.tag as usize] = Some(buf);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                    self.free.push(buf);
                    got[c.tag as usize] = Some(AlignedBuf::new(4096));
                }
            }
        }
        match first_error {
            Some(e) => Err(e.into()),
            None => Ok(got.into_iter().map(Option::unwrap).collect()),
        }
    }

    fn give_back(&mut self, bufs: Vec<AlignedBuf>) {
        self.free.extend(bufs);
    }
}

/// What pass 2 needs besides the spool.
pub(crate) struct SortInput<'a> {
    pub layout: &'a Layout,
    /// The grid's weights (from the records, or drawn here); `None` unweighted.
    pub weights: Option<&'a WeightSpec>,
    /// Read the next major chunk while sorting this one (two chunks' records in memory).
    pub read_ahead: bool,
    /// Bytes of each minor chunk's degree buffer (see `MinorDegrees`).
    pub degree_buffer: u64,
    /// How the blocks are stored.
    pub compression: Compression,
    /// Store each repeated edge once (an unweighted grid: `build::check_simple`).
    pub simple: bool,
}

/// What pass 2 wrote: the blocks and the degree arrays.
pub(crate) struct Sorted {
    pub blocks: Blocks,
    pub out_degree: ArrayInfo,
    pub in_degree: ArrayInfo,
}

/// Pass 2: sorts each major chunk of `spool` into its blocks and writes the grid's edge,
/// weight and degree arrays into `dir`. The spool's records are read once.
pub(crate) fn sort_pass(
    spool: &Spool,
    input: &SortInput,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<Sorted> {
    let layout = input.layout;
    let p = layout.partitions as usize;
    let total = spool.total();
    let mut writer = BlockWriter::create(
        dir,
        input.weights.is_some(),
        layout.blocks(),
        input.compression,
        layout.chunk_size,
    )?;
    let major_name = match layout.order {
        Order::Column => "in_degree",
        Order::Row => "out_degree",
    };
    let mut major_degrees = NpyWriter::create(
        &dir.join(format!("{major_name}.npy")),
        DType::I64,
        &[],
        SMALL_WRITE_BUFFER,
    )?;
    let mut minor_degrees = MinorDegrees::new(layout, total, input.degree_buffer);
    let mut reader = MajorReader::new(spool);
    let mut meter = Meter::new(progress, "grid: blocks", total * EDGE_BYTES, total);
    let mut sorter = Sorter::new(layout, spool, input.weights);
    let mut wide: Vec<i64> = Vec::new();
    if p > 0 {
        reader.request(0);
    }
    for major in 0..p {
        let bufs = reader.take(major)?;
        if input.read_ahead && major + 1 < p {
            reader.request(major + 1);
        }
        sorter.sort(major as u32, &bufs);
        if input.simple {
            sorter.merge_repeats();
        }
        reader.give_back(bufs);
        if !input.read_ahead && major + 1 < p {
            reader.request(major + 1);
        }
        let minor_side = match layout.order {
            Order::Column => 0,
            Order::Row => 1,
        };
        for k in 0..p {
            let (a, b) = (sorter.starts[k], sorter.starts[k + 1]);
            let edges = &mut sorter.edges[a..b];
            minor_degrees.add(k, edges.iter().map(|e| e[minor_side]));
            let weights = input.weights.map(|_| &mut sorter.weights[a..b]);
            writer.push_block(edges, weights)?;
        }
        wide.clear();
        wide.extend(sorter.major_counts.iter().map(|&c| c as i64));
        major_degrees.write(&wide)?;
        let m = sorter.edges.len() as u64;
        meter.add(m, m * EDGE_BYTES)?;
    }
    meter.finish()?;
    let major_side = major_degrees.finish()?;
    let minor_counts = minor_degrees.finish();
    let (out_degree, in_degree) = match layout.order {
        Order::Column => (minor_counts.write(&dir.join("out_degree.npy"))?, major_side),
        Order::Row => (major_side, minor_counts.write(&dir.join("in_degree.npy"))?),
    };
    Ok(Sorted {
        blocks: writer.finish()?,
        out_degree,
        in_degree,
    })
}

/// Counting sort of one major chunk's records into its blocks, with the buffers reused from
/// one major chunk to the next.
struct Sorter<'a> {
    layout: &'a Layout,
    div: ChunkDiv,
    words: usize,
    compact: bool,
    /// Weights come in the records (else drawn from `spec`, or none).
    in_records: bool,
    spec: Option<&'a WeightSpec>,
    /// First edge of each block of the chunk, then its edge count (P + 1 entries).
    starts: Vec<usize>,
    edges: Vec<[u32; 2]>,
    weights: Vec<f32>,
    /// Edges at each vertex of the major chunk (32 bits: half the cache lines of 64; a major
    /// chunk holds fewer than 2^32 edges, see `BuildPlan::check_sort`).
    major_counts: Vec<u32>,
}

impl<'a> Sorter<'a> {
    fn new(layout: &'a Layout, spool: &Spool, spec: Option<&'a WeightSpec>) -> Sorter<'a> {
        Sorter {
            layout,
            div: ChunkDiv::new(layout.chunk_size),
            words: spool.format.words(),
            compact: spool.format.compact,
            in_records: spool.format.weighted,
            spec,
            starts: vec![0; layout.partitions as usize + 1],
            edges: Vec::new(),
            weights: Vec::new(),
            major_counts: Vec::new(),
        }
    }

    /// The minor chunk, minor offset and major offset of a record.
    #[inline(always)]
    fn fields(&self, rec: &[u32]) -> (usize, u32, u32) {
        if self.compact {
            let minor = self.div.div(rec[0] as u64);
            let off = (rec[0] as u64 - minor * self.layout.chunk_size) as u32;
            (minor as usize, off, rec[1])
        } else {
            (rec[0] as usize, rec[1], rec[2])
        }
    }

    /// Stores each repeated edge of the sorted major chunk once: sorts each block and drops
    /// its repeats (an edge's repeats all fall in its block), moving the blocks down over the
    /// gaps, and counts the major side's degrees again. Unweighted chunks only.
    fn merge_repeats(&mut self) {
        debug_assert!(self.weights.is_empty());
        let major_side = match self.layout.order {
            Order::Column => 1,
            Order::Row => 0,
        };
        let mut at = 0;
        for k in 0..self.layout.partitions as usize {
            let (a, b) = (self.starts[k], self.starts[k + 1]);
            self.edges[a..b].sort_unstable();
            self.starts[k] = at;
            let mut last = None;
            for i in a..b {
                let e = self.edges[i];
                if last != Some(e) {
                    self.edges[at] = e;
                    at += 1;
                    last = Some(e);
                }
            }
        }
        *self.starts.last_mut().expect("P + 1 starts") = at;
        self.edges.truncate(at);
        self.major_counts.iter_mut().for_each(|c| *c = 0);
        for e in &self.edges {
            self.major_counts[e[major_side] as usize] += 1;
        }
    }

    /// Sorts major chunk `major`'s records (in `bufs`) into `edges` (and `weights`), block
    /// by block from `starts`; counts the major side's degrees into `major_counts`.
    fn sort(&mut self, major: u32, bufs: &[AlignedBuf]) {
        let p = self.layout.partitions as usize;
        let records = || {
            bufs.iter().flat_map(|b| {
                bytemuck::cast_slice::<u8, u32>(b.as_slice()).chunks_exact(self.words)
            })
        };
        self.starts.iter_mut().for_each(|s| *s = 0);
        self.major_counts.clear();
        self.major_counts
            .resize(self.layout.chunk_len(major) as usize, 0);
        for rec in records() {
            let (minor, _, major_off) = self.fields(rec);
            self.starts[minor + 1] += 1;
            self.major_counts[major_off as usize] += 1;
        }
        for k in 0..p {
            self.starts[k + 1] += self.starts[k];
        }
        let m = self.starts[p];
        self.edges.clear();
        self.edges.resize(m, [0, 0]);
        self.weights.clear();
        if self.spec.is_some() {
            self.weights.resize(m, 0.0);
        }
        let mut fill = self.starts.clone();
        let major_base = self.layout.base(major);
        let cs = self.layout.chunk_size;
        for rec in records() {
            let (minor, minor_off, major_off) = self.fields(rec);
            let at = fill[minor];
            fill[minor] += 1;
            let minor_id = minor as u64 * cs + minor_off as u64;
            let (edge, u, v) = match self.layout.order {
                Order::Column => (
                    [minor_off, major_off],
                    minor_id,
                    major_base + major_off as u64,
                ),
                Order::Row => (
                    [major_off, minor_off],
                    major_base + major_off as u64,
                    minor_id,
                ),
            };
            self.edges[at] = edge;
            if let Some(spec) = self.spec {
                self.weights[at] = if self.in_records {
                    f32::from_bits(rec[self.words - 1])
                } else {
                    spec.drawn(u, v).expect("drawn weights")
                };
            }
        }
    }
}
