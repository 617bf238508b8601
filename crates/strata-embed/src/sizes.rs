//! Sizes the rooms share: the bytes of a table region, and the tiles and batches of the
//! candidate scans that evaluation and neighbour queries run and the memory plan counts.

use strata_io::align_up;

use crate::config::{OptimizerKind, TableDtype};

/// Queries scored together against a candidate tile.
pub(crate) const QUERY_BATCH: usize = 512;
/// Candidate rows per tile of a scan (one matrix product each).
pub(crate) const TILE: usize = 4096;

/// Bytes of one node's row: `dim` values and `state_per_row` state values in `dtype`.
pub fn row_bytes(dim: usize, state_per_row: usize, dtype: TableDtype) -> usize {
    (dim + state_per_row) * dtype.bytes()
}

/// Bytes of a partition region of `rows` rows ([`row_bytes`]), padded for `O_DIRECT`.
pub fn region_bytes(rows: u64, dim: usize, state_per_row: usize, dtype: TableDtype) -> u64 {
    align_up(rows * row_bytes(dim, state_per_row, dtype) as u64)
}

/// Bytes of one partition of `rows` nodes stored in `dtype`.
pub fn part_bytes(rows: u64, dim: usize, optimizer: OptimizerKind, dtype: TableDtype) -> u64 {
    let state = match optimizer {
        OptimizerKind::Adagrad => dim,
        OptimizerKind::AdagradRow => 1,
    };
    region_bytes(rows, dim, state, dtype)
}
