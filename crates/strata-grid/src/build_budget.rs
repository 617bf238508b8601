//! The plan of a grid build within its memory budget: a pure function of the budget, the
//! grid's geometry and the spool's record format, printed at the start of a build.
//!
//! The two passes run one after the other, so each may use the whole budget. Pass 1 (binning)
//! holds one spool buffer per major chunk plus the buffers being written and the input's read
//! buffers. Pass 2 (sorting) holds the vertex-sized degree counters, the largest major chunk's
//! records (twice when the next chunk is read ahead) with their sorted copy, in a compressed
//! grid the buffers a block is coded through, and the output's write buffers; how large the
//! largest chunk is is known only after pass 1, so pass 2 is checked then
//! ([`BuildPlan::check_sort`]).

use strata_store::units::fmt_bytes;

use crate::block_codec::Compression;
use crate::error::{GridError, Result};
use crate::layout::{Layout, Order, EDGE_BYTES};
use crate::spool::RecordFormat;

/// Memory kept aside for the process's own needs (allocator slack, small tables).
pub const BUILD_RESERVE: u64 = 16 << 20;
/// The largest spool buffer: writes of 2 MiB already run at the device's sequential speed.
pub const MAX_SPOOL_BUFFER: u64 = 2 << 20;
/// Spool buffers being written at once (the write queue's depth).
pub const SPOOL_IN_FLIGHT: usize = 8;
/// Bytes of one read of the input (two are in flight).
pub const READ_BYTES: u64 = 4 << 20;
/// Bytes of the input side per byte read: two reads in flight and the decoded batch (two
/// 8-byte ids and a weight per 8-byte input edge).
const READ_FACTOR: u64 = 5;
/// Bytes of pass 2's write buffers: edges, weights, the major side's degrees, block index.
const WRITE_BUFFERS: u64 = 14 << 20;
/// Bytes of a block's code an edge, at most: the byte code's 8-byte gap and a run header
/// (the packed code's frames take 8 bytes and 1/32 of a byte).
const CODE_BYTES_PER_EDGE: u64 = 9;
/// Bytes an edge of a weighted block sorted for coding: its (64-bit key, weight) pair, padded.
const PAIR_BYTES_PER_EDGE: u64 = 16;
/// Pass 2's degree buffers: at most this much in all, at most [`MAX_DEGREE_BUFFER`] a minor
/// chunk (each buffer's counting touches its chunk's counters once per buffer of edges).
const DEGREE_BUFFERS: u64 = 128 << 20;
const MAX_DEGREE_BUFFER: u64 = 1 << 20;

/// How a build spends its budget.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildPlan {
    /// The budget (`memory`), bytes.
    pub memory: u64,
    /// The grid's major chunks (P).
    pub partitions: u32,
    /// The spool's records.
    pub format: RecordFormat,
    /// Bytes of each spool buffer (a whole number of records and pages).
    pub spool_buffer: u64,
    /// Bytes of each read of the input.
    pub read_bytes: u64,
    /// Pass 2's per-vertex degree counters (the minor side), bytes.
    pub degree_bytes: u64,
    /// Pass 2's counters of one major chunk's vertices, bytes.
    pub chunk_degree_bytes: u64,
    /// Pass 2's buffer of minor offsets per minor chunk, bytes.
    pub degree_buffer: u64,
    /// The grid is weighted (pass 2 keeps a weight per sorted edge).
    pub weighted: bool,
    /// How pass 2 stores the blocks (a compressed grid's are sorted and coded one at a time).
    pub compression: Compression,
}

impl BuildPlan {
    /// Plans a build of `layout` with `records` spool records in all (edges, doubled when
    /// symmetrised), in `format`, into a grid that is `weighted` or not, its blocks stored as
    /// `compression` says. Fails when the budget cannot hold pass 1's smallest buffers or pass
    /// 2's counters.
    pub fn new(
        memory: u64,
        layout: &Layout,
        format: RecordFormat,
        records: u64,
        weighted: bool,
        compression: Compression,
    ) -> Result<BuildPlan> {
        let p = layout.partitions as u64;
        let unit = format.unit_bytes() as u64;
        let read_bytes = READ_BYTES.min(strata_io::align_down(memory / 64).max(256 << 10));
        let spool_room = memory
            .saturating_sub(BUILD_RESERVE)
            .saturating_sub(READ_FACTOR * read_bytes);
        let buffers = p + SPOOL_IN_FLIGHT as u64;
        let spool_buffer = (spool_room / buffers).min(MAX_SPOOL_BUFFER) / unit * unit;
        let counter = if records <= u32::MAX as u64 { 4 } else { 8 };
        let plan = BuildPlan {
            memory,
            partitions: layout.partitions,
            format,
            spool_buffer,
            read_bytes,
            degree_bytes: counter * layout.num_vertices,
            chunk_degree_bytes: 8 * layout.chunk_size,
            degree_buffer: (DEGREE_BUFFERS.min(memory / 8) / p).clamp(4096, MAX_DEGREE_BUFFER),
            weighted,
            compression,
        };
        if spool_buffer == 0 {
            return Err(GridError::Budget(format!(
                "memory budget of {} is too small to build a grid of {p} partitions: binning needs a {} buffer per partition and {SPOOL_IN_FLIGHT} more, with {} of input reads: at least {}; raise --memory or lower --partitions",
                fmt_bytes(memory),
                fmt_bytes(unit),
                fmt_bytes(READ_FACTOR * read_bytes),
                fmt_bytes(BUILD_RESERVE + READ_FACTOR * read_bytes + buffers * unit)
            )));
        }
        let fixed = plan.sort_fixed();
        if fixed > memory {
            return Err(GridError::Budget(format!(
                "memory budget of {} is too small to build a grid of {} vertices: the degree counters and their buffers need {} and the write buffers {}: at least {}",
                fmt_bytes(memory),
                layout.num_vertices,
                fmt_bytes(plan.sort_fixed() - WRITE_BUFFERS - BUILD_RESERVE),
                fmt_bytes(WRITE_BUFFERS),
                fmt_bytes(fixed)
            )));
        }
        Ok(plan)
    }

    /// Pass 1's bytes: the spool buffers, those being written, and the input's reads.
    pub fn spool_bytes(&self) -> u64 {
        (self.partitions as u64 + SPOOL_IN_FLIGHT as u64) * self.spool_buffer
            + READ_FACTOR * self.read_bytes
    }

    /// Pass 2's bytes besides the major chunks' records.
    fn sort_fixed(&self) -> u64 {
        BUILD_RESERVE
            + self.degree_bytes
            + self.chunk_degree_bytes
            + self.partitions as u64 * self.degree_buffer
            + WRITE_BUFFERS
    }

    /// Bytes a compressed grid's coding buffers take per edge of the block being coded: its
    /// code and, weighted, its (key, weight) pairs (0 plain).
    pub fn coding_bytes_per_edge(&self) -> u64 {
        match (self.compression.is_compressed(), self.weighted) {
            (false, _) => 0,
            (true, false) => CODE_BYTES_PER_EDGE,
            (true, true) => CODE_BYTES_PER_EDGE + PAIR_BYTES_PER_EDGE,
        }
    }

    /// Pass 2's bytes for one major chunk of `records` records: the records as read (whole
    /// spool buffers), and the sorted edges with their weights and, in a compressed grid, the
    /// coding buffers (one block at a time, but a block may hold the whole chunk).
    fn chunk_bytes(&self, records: u64) -> (u64, u64) {
        let read = records * self.format.bytes() + self.spool_buffer;
        let weight = if self.weighted { 4 } else { 0 };
        let sorted = records * (EDGE_BYTES + weight + self.coding_bytes_per_edge());
        (read, sorted)
    }

    /// Checks that pass 2 can sort a major chunk of `largest` records; returns whether the
    /// next chunk's records can be read ahead while one is sorted. Fails with what to raise.
    pub fn check_sort(&self, largest: u64, layout: &Layout) -> Result<bool> {
        if largest > u32::MAX as u64 {
            return Err(GridError::Budget(format!(
                "the largest {} of the grid holds {largest} edges, more than the 2^32 a column's sort counts: raise the partitions",
                if layout.order == Order::Column { "column" } else { "row" },
            )));
        }
        let (read, sorted) = self.chunk_bytes(largest);
        let room = self.memory.saturating_sub(self.sort_fixed());
        if read + sorted > room {
            return Err(GridError::Budget(format!(
                "memory budget of {} is too small: the largest {} of the grid holds {largest} edges and sorting {}it needs {} beside {} of degree counters and buffers; raise --memory or the partitions",
                fmt_bytes(self.memory),
                if layout.order == Order::Column { "column" } else { "row" },
                match self.compression {
                    Compression::None => String::new(),
                    c => format!("and coding ({}) ", c.name()),
                },
                fmt_bytes(read + sorted),
                fmt_bytes(self.sort_fixed())
            )));
        }
        Ok(2 * read + sorted <= room)
    }

    /// The plan in words, one line per pass.
    pub fn describe(&self) -> Vec<String> {
        let coding = match self.compression {
            Compression::None => String::new(),
            c => format!(
                " and the {} coding buffers of its blocks ({} B an edge)",
                c.name(),
                self.coding_bytes_per_edge()
            ),
        };
        vec![
            format!(
                "grid build budget {}: pass 1 (spool) {}: {} + {SPOOL_IN_FLIGHT} buffers of {}, reads of {}",
                fmt_bytes(self.memory),
                fmt_bytes(self.spool_bytes()),
                self.partitions,
                fmt_bytes(self.spool_buffer),
                fmt_bytes(self.read_bytes)
            ),
            format!(
                "  pass 2 (blocks): degree counters {} and their buffers {}, write buffers {}, the rest ({}) for the largest column's records and their sorted copy{coding}",
                fmt_bytes(self.degree_bytes + self.chunk_degree_bytes),
                fmt_bytes(self.partitions as u64 * self.degree_buffer),
                fmt_bytes(WRITE_BUFFERS),
                fmt_bytes(self.memory.saturating_sub(self.sort_fixed()))
            ),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(n: u64, p: u32) -> Layout {
        Layout::new(n, p, Order::Column).unwrap()
    }

    #[test]
    fn spool_buffers_share_what_the_reads_leave_and_stay_whole_units() {
        let l = layout(1 << 26, 512);
        let f = RecordFormat::new(&l, false);
        let plan = BuildPlan::new(2 << 30, &l, f, 1 << 30, false, Compression::None).unwrap();
        assert_eq!(plan.spool_buffer, MAX_SPOOL_BUFFER);
        assert!(plan.spool_bytes() <= 2 << 30);
        assert_eq!(plan.degree_bytes, 4 << 26);
        let tight = BuildPlan::new(512 << 20, &l, f, 1 << 30, false, Compression::None).unwrap();
        assert!(tight.spool_buffer < MAX_SPOOL_BUFFER);
        assert_eq!(tight.spool_buffer % f.unit_bytes() as u64, 0);
        assert!(tight.spool_bytes() + BUILD_RESERVE <= 512 << 20);
        let weighted = RecordFormat::new(&l, true);
        let w = BuildPlan::new(512 << 20, &l, weighted, 1 << 30, true, Compression::None).unwrap();
        assert_eq!(w.spool_buffer % weighted.unit_bytes() as u64, 0);
    }

    #[test]
    fn budgets_that_cannot_hold_the_minimum_say_what_is_needed() {
        let l = layout(1 << 20, 4096);
        let f = RecordFormat::new(&l, false);
        let err = BuildPlan::new(32 << 20, &l, f, 1 << 24, false, Compression::None).unwrap_err();
        assert!(err.to_string().contains("lower --partitions"), "{err}");
        let l = layout(1 << 28, 16);
        let err = BuildPlan::new(512 << 20, &l, f, 1 << 30, false, Compression::None).unwrap_err();
        assert!(err.to_string().contains("degree counters"), "{err}");
        let wide = BuildPlan::new(4 << 30, &l, f, 1 << 33, false, Compression::None).unwrap();
        assert_eq!(wide.degree_bytes, 8 << 28);
    }

    #[test]
    fn the_largest_column_decides_read_ahead_or_refusal() {
        let l = layout(1 << 20, 8);
        let f = RecordFormat::new(&l, false);
        let plan = BuildPlan::new(128 << 20, &l, f, 1 << 24, false, Compression::None).unwrap();
        let room = 128u64 << 20;
        assert!(plan.check_sort(1 << 20, &l).unwrap());
        // 5M records: 40 MB as read, 40 MB sorted; twice the first does not fit.
        assert!(!plan.check_sort(5 << 20, &l).unwrap());
        let err = plan.check_sort(room / 8, &l).unwrap_err().to_string();
        assert!(err.contains("largest column"), "{err}");
    }

    #[test]
    fn a_compressed_build_plans_its_coding_buffers() {
        let l = layout(1 << 20, 8);
        let f = RecordFormat::new(&l, false);
        let plan = |weighted, compression| {
            BuildPlan::new(128 << 20, &l, f, 1 << 24, weighted, compression).unwrap()
        };
        let plain = plan(false, Compression::None);
        let packed = plan(false, Compression::Packed);
        assert_eq!(plain.coding_bytes_per_edge(), 0);
        assert_eq!(packed.coding_bytes_per_edge(), CODE_BYTES_PER_EDGE);
        assert_eq!(
            plan(true, Compression::Byte).coding_bytes_per_edge(),
            CODE_BYTES_PER_EDGE + PAIR_BYTES_PER_EDGE
        );
        assert!(packed.describe()[1].contains("packed coding buffers of its blocks (9 B an edge)"));
        // A column that plain sorting fits, without read-ahead, and coding does not: 4.5M
        // records take 36 MB as read and 36 MB sorted, and 40.5 MB more coded.
        let largest = 4_500_000;
        assert!(!plain.check_sort(largest, &l).unwrap());
        let err = packed.check_sort(largest, &l).unwrap_err().to_string();
        assert!(
            err.contains("sorting and coding (packed) it needs"),
            "{err}"
        );
    }
}
