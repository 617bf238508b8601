//! The feature-store interface: a table of fixed-size node feature rows addressed by node id,
//! however it is held (a file read through the I/O engine, tiers of caches over one, a file read
//! in pages through a page cache). Modelled on DGL GraphBolt's `Feature` (`read(ids)`, `size()`,
//! `count()`), reduced to what Strata's engines call: the row count, the row size and a read of
//! arbitrary rows into a caller's buffer.
//!
//! Rows are raw little-endian bytes; what they hold (float32 or float16 values, `dim` of them)
//! is the implementation's metadata, known to its owner. Implemented by
//! [`crate::features::FeatureReader`] (the file), `strata_gnn::tiers::FeatureTiers` (device
//! index, hot set and dynamic cache over the reader) and `strata_serve::page_cache::PagedRows`
//! (a store version's file through the service's page cache).

use crate::error::{GraphError, Result};

/// A table of `num_rows()` feature rows of `row_bytes()` bytes each, row `v` belonging to node
/// `v`. `Send + Sync`: threads read from one store concurrently.
pub trait FeatureStore: Send + Sync {
    /// Rows in the table: node ids `0..num_rows()`.
    fn num_rows(&self) -> u64;

    /// Bytes per row (at least 1).
    fn row_bytes(&self) -> usize;

    /// Reads rows `rows` (node ids below `num_rows()`, any order, repeats allowed) into `out`:
    /// row `rows[i]` at `out[i * row_bytes()..(i + 1) * row_bytes()]`, so `out.len()` must be
    /// `rows.len() * row_bytes()` bytes.
    ///
    /// Returns the bytes read from storage for it (whole blocks or pages; 0 when memory held
    /// every row). Errors: a wrong `out` length or a row out of range
    /// ([`GraphError::Config`], naming the file), or a read error.
    fn read(&self, rows: &[u32], out: &mut [u8]) -> Result<u64>;
}

/// Reads, for each `i` of `positions`, row `rows[i]` of `store` into `out` at
/// `i * row_bytes()`, leaving the other rows of `out` (`rows.len() * row_bytes()` bytes) as
/// they were: the rows that some other source (memory, an overlay of updates) did not supply.
///
/// Memory: a staging buffer of `positions.len()` rows, freed on return (none when `positions`
/// covers every row: then it reads straight into `out`). Returns the bytes read from storage.
///
/// Errors: those of [`FeatureStore::read`], and a position out of range or an `out` of the
/// wrong length ([`GraphError::Config`]).
pub fn read_at(
    store: &(impl FeatureStore + ?Sized),
    rows: &[u32],
    positions: &[usize],
    out: &mut [u8],
) -> Result<u64> {
    let rb = store.row_bytes();
    if Some(out.len()) != rows.len().checked_mul(rb) {
        return Err(GraphError::Config(format!(
            "{} rows of {rb} bytes need an output of {} bytes, got {}",
            rows.len(),
            rows.len().saturating_mul(rb),
            out.len()
        )));
    }
    if let Some(&i) = positions.iter().find(|&&i| i >= rows.len()) {
        return Err(GraphError::Config(format!(
            "position {i} is out of range: {} rows",
            rows.len()
        )));
    }
    if positions.is_empty() {
        return Ok(0);
    }
    if positions.len() == rows.len() && positions.iter().enumerate().all(|(k, &i)| k == i) {
        return store.read(rows, out);
    }
    let wanted: Vec<u32> = positions.iter().map(|&i| rows[i]).collect();
    let mut staging = vec![0u8; wanted.len() * rb];
    let bytes_read = store.read(&wanted, &mut staging)?;
    for (&i, row) in positions.iter().zip(staging.chunks_exact(rb)) {
        out[i * rb..(i + 1) * rb].copy_from_slice(row);
    }
    Ok(bytes_read)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows in memory, row `v` = `[v as u8; 3]`; counts the bytes it "reads" as 3 per row.
    struct Rows(u64);

    impl FeatureStore for Rows {
        fn num_rows(&self) -> u64 {
            self.0
        }

        fn row_bytes(&self) -> usize {
            3
        }

        fn read(&self, rows: &[u32], out: &mut [u8]) -> Result<u64> {
            assert_eq!(out.len(), rows.len() * 3);
            for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(3)) {
                if r as u64 >= self.0 {
                    return Err(GraphError::Config(format!("row {r} is out of range")));
                }
                dst.fill(r as u8);
            }
            Ok(rows.len() as u64 * 3)
        }
    }

    #[test]
    fn read_at_fills_only_the_positions() {
        let store = Rows(10);
        let rows = [4, 7, 4, 9];
        let mut out = vec![0xEE; 12];
        assert_eq!(read_at(&store, &rows, &[1, 3], &mut out).unwrap(), 6);
        assert_eq!(out, [0xEE, 0xEE, 0xEE, 7, 7, 7, 0xEE, 0xEE, 0xEE, 9, 9, 9]);
        // Every position, in order: straight into the output.
        assert_eq!(read_at(&store, &rows, &[0, 1, 2, 3], &mut out).unwrap(), 12);
        assert_eq!(out, [4, 4, 4, 7, 7, 7, 4, 4, 4, 9, 9, 9]);
        // Every position, out of order: still right.
        let mut out2 = vec![0; 12];
        read_at(&store, &rows, &[3, 2, 1, 0], &mut out2).unwrap();
        assert_eq!(out2, out);
        assert_eq!(read_at(&store, &rows, &[], &mut out).unwrap(), 0);
    }

    #[test]
    fn read_at_rejects_bad_arguments() {
        let store = Rows(10);
        let text = |r: Result<u64>| r.unwrap_err().to_string();
        assert!(text(read_at(&store, &[1, 2], &[0], &mut [0; 5])).contains("output of 6 bytes"));
        assert!(text(read_at(&store, &[1, 2], &[2], &mut [0; 6])).contains("position 2"));
        assert!(text(read_at(&store, &[1, 12], &[1], &mut [0; 6])).contains("row 12"));
    }
}
