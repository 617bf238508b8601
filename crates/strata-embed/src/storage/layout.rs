//! The byte layout of a node table: rows per partition, values per row, the pinned region of
//! a typed run and the dtype, and from them the bytes of every region (padded for `O_DIRECT`).

use serde::{Deserialize, Serialize};

use crate::config::{OptimizerKind, TableDtype};
use crate::sizes::{region_bytes, row_bytes};
use crate::storage::partitioning::Partitioning;

/// Byte layout of the partition regions (and of a typed run's pinned region, after them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLayout {
    /// Rows per partition (the last partition's extra rows are never used).
    pub rows: u64,
    pub dim: usize,
    /// Adagrad state values per row: `dim`, or 1 for row-wise Adagrad.
    pub state_per_row: usize,
    /// A typed run's pinned region (its unpartitioned and featurized entity types).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<PinnedRegion>,
    /// How every value (embeddings and state) is stored (float32 in runs written before
    /// bf16 tables existed).
    #[serde(default)]
    pub dtype: TableDtype,
}

/// The region of a typed run's types that stay in memory all epoch: region id `region` (the
/// number of partitions), stored after the partitions with `rows` rows of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PinnedRegion {
    pub region: u32,
    pub rows: u64,
}

impl TableLayout {
    pub fn new(
        p: &Partitioning,
        dim: usize,
        optimizer: OptimizerKind,
        dtype: TableDtype,
    ) -> TableLayout {
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
            dtype,
        }
    }

    /// Values of embeddings in a partition.
    pub fn emb_floats(&self) -> usize {
        self.rows as usize * self.dim
    }

    /// Bytes of one node's row: its embedding and its optimizer state.
    pub fn node_bytes(&self) -> usize {
        row_bytes(self.dim, self.state_per_row, self.dtype)
    }

    /// Bytes of a partition's embeddings (its state follows them).
    pub fn emb_bytes(&self) -> usize {
        self.emb_floats() * self.dtype.bytes()
    }

    /// Bytes of one partition region (embeddings + state), padded for `O_DIRECT`.
    pub fn part_bytes(&self) -> u64 {
        region_bytes(self.rows, self.dim, self.state_per_row, self.dtype)
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

    /// Bytes of region `p` (embeddings + state), padded for `O_DIRECT`.
    pub fn region_bytes(&self, p: u32) -> u64 {
        self.region(p).part_bytes()
    }

    /// Region `p`'s layout as one partition of its own rows (the pinned region's rows differ).
    pub fn region(&self, p: u32) -> TableLayout {
        TableLayout {
            rows: self.region_rows(p),
            pinned: None,
            ..*self
        }
    }

    /// Bytes of a whole table file of `partitions` partitions (and the pinned region).
    pub fn table_bytes(&self, partitions: u32) -> u64 {
        partitions as u64 * self.part_bytes()
            + self.pinned.map_or(0, |r| self.region_bytes(r.region))
    }
}
