//! The node embedding table on disk: partition-major, each partition's embeddings followed by
//! its Adagrad state, padded to 4096 bytes, read and written whole through the I/O engine.
//!
//! A run keeps three table files. `current` is the consistent state after the last completed
//! epoch; `best` the one with the best validation metric; an epoch reads partitions from
//! `current` (or from `next` once written back this epoch) and writes every partition back to
//! `next`, which becomes `current` only when the epoch's checkpoint is committed. A crash at
//! any moment therefore leaves `current` and `best` intact.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use strata_io::{align_up, AlignedBuf, Engine, IoBuf, IoFile, OpenMode, Request};
use strata_store::rng::{derive, Rng};

use crate::config::OptimizerKind;
use crate::error::Result;
use crate::partitioning::Partitioning;

/// Byte layout of the partition regions (and of a typed run's pinned region, after them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLayout {
    /// Rows per partition (the last partition's extra rows are never used).
    pub rows: u64,
    pub dim: usize,
    /// Adagrad state floats per row: `dim`, or 1 for row-wise Adagrad.
    pub state_per_row: usize,
    /// A typed run's pinned region (its unpartitioned and featurized entity types).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PinnedRegion>,
}

/// The region of a typed run's types that stay in memory all epoch: region id `region` (the
/// number of partitions), stored after the partitions with `rows` rows of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedRegion {
    pub region: u32,
    pub rows: u64,
}

impl TableLayout {
    pub fn new(p: &Partitioning, dim: usize, optimizer: OptimizerKind) -> TableLayout {
        TableLayout {
            rows: p.part_size,
            dim,
            state_per_row: match optimizer {
                OptimizerKind::Adagrad => dim,
                OptimizerKind::AdagradRow => 1,
            },
            pinned: p.pinned().map(|region| PinnedRegion {
                region,
                rows: p.stored_rows(region),
            }),
        }
    }

    /// Floats of embeddings in a partition.
    pub fn emb_floats(&self) -> usize {
        self.rows as usize * self.dim
    }

    /// Bytes of one partition region (embeddings + state), padded for `O_DIRECT`.
    pub fn part_bytes(&self) -> u64 {
        align_up(self.rows * (self.dim + self.state_per_row) as u64 * 4)
    }

    /// Whether region `p` is the pinned region.
    pub fn is_pinned(&self, p: u32) -> bool {
        self.pinned.is_some_and(|r| r.region == p)
    }

    /// Rows of region `p`.
    pub fn region_rows(&self, p: u32) -> u64 {
        match self.pinned {
            Some(r) if r.region == p => r.rows,
            _ => self.rows,
        }
    }

    /// Floats of embeddings in region `p`.
    pub fn emb_floats_in(&self, p: u32) -> usize {
        self.region_rows(p) as usize * self.dim
    }

    /// Bytes of region `p` (embeddings + state), padded for `O_DIRECT`.
    pub fn region_bytes(&self, p: u32) -> u64 {
        align_up(self.region_rows(p) * (self.dim + self.state_per_row) as u64 * 4)
    }

    /// Bytes of a whole table file of `partitions` partitions (and the pinned region).
    pub fn table_bytes(&self, partitions: u32) -> u64 {
        partitions as u64 * self.part_bytes()
            + self.pinned.map_or(0, |r| self.region_bytes(r.region))
    }
}

/// One table file.
pub struct TableFile {
    pub path: PathBuf,
    file: IoFile,
}

/// Size of each partition read or write request (several are in flight at once).
const IO_CHUNK: usize = 64 << 20;

impl TableFile {
    /// Opens (creating when `create`) the table file at `path`.
    pub fn open(engine: &Arc<Engine>, path: &Path, create: bool) -> Result<TableFile> {
        let mode = if create {
            OpenMode::Create
        } else {
            OpenMode::ReadWrite
        };
        Ok(TableFile {
            path: path.to_path_buf(),
            file: engine.open(path, mode)?,
        })
    }

    /// Reads partition `p` into `buf` (its whole region).
    pub fn read_partition(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        buf: &mut AlignedBuf,
    ) -> Result<()> {
        self.transfer(engine, layout, p, buf, false)
    }

    /// Writes partition `p` from `buf`.
    pub fn write_partition(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        buf: &mut AlignedBuf,
    ) -> Result<()> {
        self.transfer(engine, layout, p, buf, true)
    }

    fn transfer(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        buf: &mut AlignedBuf,
        write: bool,
    ) -> Result<()> {
        let bytes = layout.region_bytes(p) as usize;
        assert!(buf.capacity() >= bytes, "partition buffer too small");
        let base = p as u64 * layout.part_bytes();
        let region = buf.full_mut().as_mut_ptr();
        let mut q = engine.queue();
        let mut offset = 0usize;
        while offset < bytes {
            let len = IO_CHUNK.min(bytes - offset);
            // SAFETY: the pieces are disjoint parts of `buf`, which this function borrows
            // mutably until every completion below has been received.
            let piece = unsafe { IoBuf::borrowed(region.add(offset), len) };
            let at = base + offset as u64;
            q.submit([if write {
                Request::write(&self.file, at, len, piece, 0)
            } else {
                Request::read(&self.file, at, len, piece, 0)
            }]);
            offset += len;
        }
        Ok(q.drain()?)
    }

    /// Reads `out.len() / dim` embedding rows of partition `p` starting at local row `first`
    /// (an unaligned read: the engine reads the covering blocks).
    pub fn read_rows(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        first: u64,
        out: &mut [f32],
    ) -> Result<()> {
        let at = p as u64 * layout.part_bytes() + first * layout.dim as u64 * 4;
        self.read_floats(engine, at, out)
    }

    /// Reads `out.len() / state_per_row` rows of partition `p`'s optimizer state starting at
    /// local row `first` (an unaligned read, as [`TableFile::read_rows`]).
    pub fn read_state_rows(
        &self,
        engine: &Arc<Engine>,
        layout: &TableLayout,
        p: u32,
        first: u64,
        out: &mut [f32],
    ) -> Result<()> {
        let at = p as u64 * layout.part_bytes()
            + (layout.emb_floats_in(p) as u64 + first * layout.state_per_row as u64) * 4;
        self.read_floats(engine, at, out)
    }

    /// Reads `out.len()` little-endian floats at byte `at` of the file.
    fn read_floats(&self, engine: &Arc<Engine>, at: u64, out: &mut [f32]) -> Result<()> {
        let len = out.len() * 4;
        if len == 0 {
            return Ok(());
        }
        let mut q = engine.queue();
        q.submit([Request::read(&self.file, at, len, AlignedBuf::new(len), 0)]);
        let c = q.wait().expect("one request in flight");
        c.result?;
        let bytes = c.buf.as_slice();
        for (v, b) in out.iter_mut().zip(bytes.chunks_exact(4)) {
            *v = f32::from_le_bytes(b.try_into().expect("4 bytes"));
        }
        Ok(())
    }

    /// Flushes the file to the device.
    pub fn sync(&self) -> Result<()> {
        Ok(self.file.file().sync()?)
    }
}

/// Fills partition `p`'s embeddings with `N(0, init_scale)` values (a pure function of the
/// seed and `p`) and its Adagrad state with zeros.
pub fn init_partition(
    layout: &TableLayout,
    p: u32,
    used_rows: u64,
    init_scale: f32,
    seed: u64,
    buf: &mut AlignedBuf,
) {
    let floats: &mut [f32] =
        bytemuck::cast_slice_mut(&mut buf.full_mut()[..layout.region_bytes(p) as usize]);
    floats.fill(0.0);
    let mut rng = Rng::new(derive(derive(seed, 0xe3b0), p as u64));
    for v in floats[..used_rows as usize * layout.dim].chunks_mut(2) {
        let (a, b) = rng.normal_pair();
        v[0] = a as f32 * init_scale;
        if v.len() > 1 {
            v[1] = b as f32 * init_scale;
        }
    }
}
