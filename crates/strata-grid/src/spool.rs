//! Pass 1 of a grid build: every edge is binned by its major chunk (its destination chunk in
//! column order, its source chunk in row order) into one spool file.
//!
//! Each major chunk owns a fill buffer; a full buffer is swapped for a free one and written,
//! asynchronously and with `O_DIRECT`, at the spool's end, so the device sees one sequential
//! stream of large aligned writes whatever the order of the edges (GridGraph's per-block
//! buffered appends, with one file instead of P² and the page cache kept out). The spool
//! records, per major chunk, where its buffers went; pass 2 ([`crate::blocks`]) reads them back
//! one major chunk at a time.
//!
//! A record is the edge's minor-side global id and its major-side offset (two `u32` words)
//! when every vertex id fits 32 bits, else its minor chunk, minor offset and major offset;
//! the weight's `f32` bits follow when the weights come with the edges.

use std::path::Path;
use std::sync::Arc;

use strata_io::{AlignedBuf, Engine, IoFile, IoQueue, OpenMode, Request, ALIGN};

use crate::error::{GridError, Result};
use crate::layout::{Layout, Order};

/// How a spool record is laid out (in `u32` words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecordFormat {
    /// Vertex ids fit 32 bits: the minor side is kept as a global id (its chunk follows by
    /// division), which saves a word.
    pub compact: bool,
    /// The record carries the edge's weight.
    pub weighted: bool,
}

impl RecordFormat {
    /// The format for a graph of `layout`'s vertices, with weights in the records or not.
    pub fn new(layout: &Layout, weighted: bool) -> RecordFormat {
        RecordFormat {
            compact: layout.num_vertices <= 1 << 32,
            weighted,
        }
    }

    /// Words per record.
    pub fn words(self) -> usize {
        (if self.compact { 2 } else { 3 }) + self.weighted as usize
    }

    /// Bytes per record.
    pub fn bytes(self) -> u64 {
        4 * self.words() as u64
    }

    /// The smallest buffer that holds whole records and whole 4 KiB pages: pass 1's unit of
    /// writing.
    pub fn unit_bytes(self) -> usize {
        let rec = self.bytes() as usize;
        rec / gcd(rec, ALIGN) * ALIGN
    }
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Exact division of 32-bit ids by a chunk size, by a multiplication (Lemire, Kaser and Kurz,
/// "Faster remainder by direct computation", 2019: with `c = ceil(2^64 / d)`, `n / d` is the
/// high word of `c * n` for every 32-bit `n` and `d`). Binning divides every edge's ids, which
/// a hardware division makes the slowest step of the loop.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ChunkDiv {
    magic: u64,
    divisor: u64,
}

impl ChunkDiv {
    /// Division by `divisor` (at least 1).
    pub fn new(divisor: u64) -> ChunkDiv {
        ChunkDiv {
            magic: if divisor > 1 && divisor <= u32::MAX as u64 {
                u64::MAX / divisor + 1
            } else {
                0
            },
            divisor,
        }
    }

    /// `n / divisor`.
    #[inline(always)]
    pub fn div(self, n: u64) -> u64 {
        if self.magic != 0 && n <= u32::MAX as u64 {
            ((self.magic as u128 * n as u128) >> 64) as u64
        } else {
            n / self.divisor
        }
    }
}

/// Where one major chunk's records are in the spool file: whole buffers (`bytes` of records
/// each, the last one possibly padded on disk to a page).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpoolChunk {
    pub offset: u64,
    pub bytes: u64,
}

/// What pass 1 leaves: the spool file and, per major chunk, its records' chunks and count.
pub(crate) struct Spool {
    pub file: IoFile,
    pub format: RecordFormat,
    pub chunks: Vec<Vec<SpoolChunk>>,
    pub records: Vec<u64>,
}

impl Spool {
    /// Records of the largest major chunk.
    pub fn largest(&self) -> u64 {
        self.records.iter().copied().max().unwrap_or(0)
    }

    /// Records in all.
    pub fn total(&self) -> u64 {
        self.records.iter().sum()
    }
}

/// Bins edges into the spool (pass 1). Memory: one fill buffer per major chunk plus
/// `in_flight` buffers being written, each `buffer_bytes`.
pub(crate) struct Binner {
    layout: Layout,
    div: ChunkDiv,
    format: RecordFormat,
    symmetric: bool,
    /// Self-loops are dropped (a simple grid).
    drop_loops: bool,
    file: IoFile,
    queue: IoQueue,
    fill: Vec<AlignedBuf>,
    /// Words written into each fill buffer.
    len: Vec<usize>,
    /// Capacity of a buffer in words (a whole number of records).
    cap: usize,
    free: Vec<AlignedBuf>,
    end: u64,
    chunks: Vec<Vec<SpoolChunk>>,
    records: Vec<u64>,
}

impl Binner {
    /// A binner writing `path` for `layout`'s major chunks: buffers of `buffer_bytes` (a
    /// multiple of [`RecordFormat::unit_bytes`]), `in_flight` of them being written at once.
    /// `symmetric` bins every edge both ways (a self-loop once); `drop_loops` drops
    /// self-loops.
    pub fn create(
        path: &Path,
        layout: &Layout,
        format: RecordFormat,
        (symmetric, drop_loops): (bool, bool),
        buffer_bytes: usize,
        in_flight: usize,
    ) -> Result<Binner> {
        debug_assert!(buffer_bytes.is_multiple_of(format.unit_bytes()));
        let engine: Arc<Engine> = Engine::shared();
        let file = engine.open(path, OpenMode::Create)?;
        let p = layout.partitions as usize;
        Ok(Binner {
            layout: *layout,
            div: ChunkDiv::new(layout.chunk_size),
            format,
            symmetric,
            drop_loops,
            file,
            queue: engine.queue(),
            fill: (0..p).map(|_| AlignedBuf::new(buffer_bytes)).collect(),
            len: vec![0; p],
            cap: buffer_bytes / 4,
            free: (0..in_flight.max(1))
                .map(|_| AlignedBuf::new(buffer_bytes))
                .collect(),
            end: 0,
            chunks: vec![Vec::new(); p],
            records: vec![0; p],
        })
    }

    /// Bins edges `src[k] -> dst[k]` (global ids, checked against the vertex count by the
    /// source) with weights `weight[k]` when the records carry them.
    pub fn add(&mut self, src: &[u64], dst: &[u64], weight: &[f32]) -> Result<()> {
        match (self.format.compact, self.format.weighted) {
            (true, false) => self.add_as::<2>(src, dst, weight),
            (true, true) => self.add_as::<3>(src, dst, weight),
            (false, false) => self.add_as::<3>(src, dst, weight),
            (false, true) => self.add_as::<4>(src, dst, weight),
        }
    }

    fn add_as<const W: usize>(&mut self, src: &[u64], dst: &[u64], weight: &[f32]) -> Result<()> {
        for k in 0..src.len() {
            let w = if self.format.weighted {
                weight[k].to_bits()
            } else {
                0
            };
            let (u, v) = (src[k], dst[k]);
            if self.drop_loops && u == v {
                continue;
            }
            self.push::<W>(u, v, w)?;
            if self.symmetric && u != v {
                self.push::<W>(v, u, w)?;
            }
        }
        Ok(())
    }

    #[inline(always)]
    fn push<const W: usize>(&mut self, u: u64, v: u64, w: u32) -> Result<()> {
        let (minor_id, major_id) = match self.layout.order {
            Order::Column => (u, v),
            Order::Row => (v, u),
        };
        let major = self.div.div(major_id) as usize;
        let major_off = (major_id - major as u64 * self.layout.chunk_size) as u32;
        let mut rec = [0u32; W];
        if self.format.compact {
            rec[0] = minor_id as u32;
            rec[1] = major_off;
        } else {
            let minor = self.div.div(minor_id);
            rec[0] = minor as u32;
            rec[1] = (minor_id - minor * self.layout.chunk_size) as u32;
            rec[2] = major_off;
        }
        if self.format.weighted {
            rec[W - 1] = w;
        }
        let at = self.len[major];
        let words: &mut [u32] = bytemuck::cast_slice_mut(self.fill[major].full_mut());
        words[at..at + W].copy_from_slice(&rec);
        self.len[major] = at + W;
        if at + 2 * W > self.cap {
            self.flush(major)?;
        }
        Ok(())
    }

    /// Sends major chunk `major`'s full buffer to the spool's end and gives it a free one.
    fn flush(&mut self, major: usize) -> Result<()> {
        let next = match self.free.pop() {
            Some(b) => b,
            None => self.wait_one()?,
        };
        let mut full = std::mem::replace(&mut self.fill[major], next);
        let bytes = self.len[major] * 4;
        let padded = strata_io::align_up(bytes as u64) as usize;
        full.set_len(bytes);
        full.pad_to_align();
        self.queue
            .submit([Request::write(&self.file, self.end, padded, full, 0)]);
        self.chunks[major].push(SpoolChunk {
            offset: self.end,
            bytes: bytes as u64,
        });
        self.records[major] += (bytes / 4 / self.format.words()) as u64;
        self.end += padded as u64;
        self.len[major] = 0;
        Ok(())
    }

    /// Waits for one write to finish; returns its buffer.
    fn wait_one(&mut self) -> Result<AlignedBuf> {
        let c = self.queue.wait().expect("a spool write is in flight");
        c.result?;
        let mut buf = c.buf.into_heap().expect("spool writes use heap buffers");
        buf.clear();
        Ok(buf)
    }

    /// Writes the partial buffers and waits for every write; returns the spool.
    pub fn finish(mut self) -> Result<Spool> {
        for major in 0..self.fill.len() {
            if self.len[major] > 0 {
                self.flush(major)?;
            }
        }
        self.queue.drain()?;
        self.fill.clear();
        self.free.clear();
        Ok(Spool {
            file: self.file,
            format: self.format,
            chunks: self.chunks,
            records: self.records,
        })
    }
}

/// Removes the spool file (once pass 2 has read it, or when the build fails).
pub(crate) fn remove(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(GridError::os("remove", path, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunk_division_is_exact(n in any::<u32>(), d in 1u64..=u32::MAX as u64) {
            prop_assert_eq!(ChunkDiv::new(d).div(n as u64), n as u64 / d);
        }

        #[test]
        fn wide_ids_divide_exactly(n in any::<u64>(), d in 1u64..u64::MAX) {
            prop_assert_eq!(ChunkDiv::new(d).div(n), n / d);
        }
    }

    #[test]
    fn units_hold_whole_records_and_pages() {
        let l = Layout::new(100, 4, Order::Column).unwrap();
        for weighted in [false, true] {
            let f = RecordFormat::new(&l, weighted);
            let unit = f.unit_bytes();
            assert!(unit.is_multiple_of(ALIGN) && unit.is_multiple_of(f.bytes() as usize));
        }
        assert_eq!(RecordFormat::new(&l, true).unit_bytes(), 3 * ALIGN);
        let wide = Layout::new(1 << 33, 4, Order::Column).unwrap();
        assert_eq!(RecordFormat::new(&wide, false).words(), 3);
    }
}
