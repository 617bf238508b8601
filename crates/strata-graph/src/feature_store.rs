//! The feature-store interface: a table of fixed-size node feature rows addressed by node id,
//! however it is held (a file read through the I/O engine, tiers of caches over one, a file read
//! in pages through a page cache). Modelled on DGL GraphBolt's `Feature` (`read(ids)`,
//! `read_async(ids)`, `size()`, `count()`, `update(value, ids)`), reduced to what Strata's
//! engines call: the row count, the row size, a read of arbitrary rows into a caller's buffer
//! (submitted, then completed, so that a caller can have several in flight), and an update of
//! rows.
//!
//! Rows are raw little-endian bytes; what they hold (float32 or float16 values, `dim` of them)
//! is the implementation's metadata, known to its owner. Implemented by
//! [`crate::features::FeatureReader`] (the file), `strata_gnn::tiers::FeatureTiers` (device
//! index, hot set and dynamic cache over the reader), `strata_serve::page_cache::PagedRows`
//! (a store version's file through the service's page cache) and
//! `strata_serve::graph::features::GraphFeatures` (a served graph's mutated rows over a
//! version's file: the one store whose rows change).

use crate::error::{GraphError, Result};

/// A read submitted with [`FeatureStore::submit`], not yet completed. `Send`: it may be
/// completed on another thread than the one that submitted it.
pub trait PendingRead: Send {
    /// Waits for the submitted rows and writes them into `out`: row `rows[i]` of the
    /// submission at `out[i * row_bytes..(i + 1) * row_bytes]`, so `out.len()` must be
    /// `rows.len() * row_bytes` bytes. Returns the bytes read from storage for it (whole blocks
    /// or pages; 0 when memory held every row).
    ///
    /// Errors: a wrong `out` length ([`GraphError::Config`]), or a read error naming the file.
    fn complete(self: Box<Self>, out: &mut [u8]) -> Result<u64>;
}

/// A pending read of a store borrowed for `'a`.
pub type Pending<'a> = Box<dyn PendingRead + 'a>;

/// A table of `num_rows()` feature rows of `row_bytes()` bytes each, row `v` belonging to node
/// `v`. `Send + Sync`: threads read from one store concurrently.
pub trait FeatureStore: Send + Sync {
    /// Rows in the table: node ids `0..num_rows()`.
    fn num_rows(&self) -> u64;

    /// Bytes per row (at least 1).
    fn row_bytes(&self) -> usize;

    /// Starts reading rows `rows` (node ids below `num_rows()`, any order, repeats allowed);
    /// [`PendingRead::complete`] finishes it into the caller's buffer. Several reads may be
    /// pending at once, and complete in any order. A store on a device puts the reads in
    /// flight before returning; a store in memory (or one read synchronously) reads when the
    /// read is completed. Either way the rows are checked here.
    ///
    /// Errors: a row out of range ([`GraphError::Config`], naming the file), before anything
    /// is read.
    fn submit(&self, rows: &[u32]) -> Result<Pending<'_>>;

    /// Reads rows `rows` into `out` (`rows.len() * row_bytes()` bytes): [`FeatureStore::submit`]
    /// then [`PendingRead::complete`], the one read path of every store. Returns the bytes
    /// read from storage.
    fn read(&self, rows: &[u32], out: &mut [u8]) -> Result<u64> {
        self.submit(rows)?.complete(out)
    }

    /// Writes rows: row `rows[i]` becomes `data[i * row_bytes()..(i + 1) * row_bytes()]`, so
    /// `data.len()` must be `rows.len() * row_bytes()` bytes; a later row of `rows` wins over an
    /// earlier one with the same id. `&mut self`: one writer, no reader meanwhile.
    ///
    /// Errors: [`GraphError::ReadOnly`] naming the file for a store over a read-only file (every
    /// file-backed store: Strata changes features through logged mutations over immutable
    /// files, never in place), a wrong `data` length or a row out of range
    /// ([`GraphError::Config`]).
    fn update(&mut self, rows: &[u32], data: &[u8]) -> Result<()>;
}

/// The [`FeatureStore::submit`] of a store that reads when the read is completed (its rows are
/// in memory, or it reads synchronously): checks `rows` against `store` (`what` names it in the
/// error) and returns a pending read that calls `read(rows, out)` on completion, after
/// checking the output's length. Holds a copy of `rows` (4 bytes per row) until then.
pub fn read_on_complete<'a, F>(
    store: &(impl FeatureStore + ?Sized),
    what: &str,
    rows: &[u32],
    read: F,
) -> Result<Pending<'a>>
where
    F: FnOnce(&[u32], &mut [u8]) -> Result<u64> + Send + 'a,
{
    check_rows(what, rows, store.num_rows())?;
    Ok(Box::new(OnComplete {
        rows: rows.to_vec(),
        row_bytes: store.row_bytes(),
        read,
    }))
}

/// See [`read_on_complete`].
struct OnComplete<F> {
    rows: Vec<u32>,
    row_bytes: usize,
    read: F,
}

impl<F> PendingRead for OnComplete<F>
where
    F: FnOnce(&[u32], &mut [u8]) -> Result<u64> + Send,
{
    fn complete(self: Box<Self>, out: &mut [u8]) -> Result<u64> {
        check_output(self.rows.len(), self.row_bytes, out.len())?;
        (self.read)(&self.rows, out)
    }
}

/// Checks that every row of `rows` is below `num_rows`; `what` names the store in the error.
fn check_rows(what: &str, rows: &[u32], num_rows: u64) -> Result<()> {
    match rows.iter().find(|&&r| r as u64 >= num_rows) {
        Some(r) => Err(GraphError::Config(format!(
            "{what}: row {r} is out of range: {num_rows} rows"
        ))),
        None => Ok(()),
    }
}

/// Checks the arguments of [`FeatureStore::update`] for `store`: `data` holds `rows.len()`
/// rows and every row is below `num_rows()`; `what` names the store in the error.
pub fn check_update(
    store: &(impl FeatureStore + ?Sized),
    what: &str,
    rows: &[u32],
    data: &[u8],
) -> Result<()> {
    let rb = store.row_bytes();
    if Some(data.len()) != rows.len().checked_mul(rb) {
        return Err(GraphError::Config(format!(
            "{what}: an update of {} rows of {rb} bytes needs {} bytes of data, got {}",
            rows.len(),
            rows.len().saturating_mul(rb),
            data.len()
        )));
    }
    check_rows(what, rows, store.num_rows())
}

/// Checks that an output of `out_len` bytes holds `rows` rows of `row_bytes` bytes
/// ([`GraphError::Config`] if not), for a read that fills it row by row.
pub fn check_output(rows: usize, row_bytes: usize, out_len: usize) -> Result<()> {
    if Some(out_len) != rows.checked_mul(row_bytes) {
        return Err(GraphError::Config(format!(
            "{rows} rows of {row_bytes} bytes need an output of {} bytes, got {out_len}",
            rows.saturating_mul(row_bytes),
        )));
    }
    Ok(())
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
    check_output(rows.len(), rb, out.len())?;
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

    /// Rows in memory, 3 bytes each, row `v` starting as `[v as u8; 3]`; counts the bytes it
    /// "reads" as 3 per row.
    struct Rows(Vec<u8>);

    impl Rows {
        fn new(n: u8) -> Rows {
            Rows((0..n).flat_map(|v| [v; 3]).collect())
        }
    }

    impl FeatureStore for Rows {
        fn num_rows(&self) -> u64 {
            self.0.len() as u64 / 3
        }

        fn row_bytes(&self) -> usize {
            3
        }

        fn submit(&self, rows: &[u32]) -> Result<Pending<'_>> {
            read_on_complete(self, "rows", rows, |rows, out| {
                for (&r, dst) in rows.iter().zip(out.chunks_exact_mut(3)) {
                    dst.copy_from_slice(&self.0[r as usize * 3..r as usize * 3 + 3]);
                }
                Ok(rows.len() as u64 * 3)
            })
        }

        fn update(&mut self, rows: &[u32], data: &[u8]) -> Result<()> {
            check_update(self, "rows", rows, data)?;
            for (&r, row) in rows.iter().zip(data.chunks_exact(3)) {
                self.0[r as usize * 3..r as usize * 3 + 3].copy_from_slice(row);
            }
            Ok(())
        }
    }

    #[test]
    fn check_update_names_the_store() {
        let mut store = Rows::new(4);
        store
            .update(&[2, 0, 2], &[1, 1, 1, 5, 5, 5, 9, 9, 9])
            .unwrap();
        let mut out = vec![0; 9];
        store.read(&[0, 1, 2], &mut out).unwrap();
        assert_eq!(out, [5, 5, 5, 1, 1, 1, 9, 9, 9]);
        let text = |r: Result<()>| r.unwrap_err().to_string();
        assert_eq!(
            text(store.update(&[1, 2], &[0; 5])),
            "rows: an update of 2 rows of 3 bytes needs 6 bytes of data, got 5"
        );
        assert_eq!(
            text(store.update(&[1, 4], &[0; 6])),
            "rows: row 4 is out of range: 4 rows"
        );
        // A refused update changed nothing.
        store.read(&[0, 1, 2], &mut out).unwrap();
        assert_eq!(out, [5, 5, 5, 1, 1, 1, 9, 9, 9]);
    }

    #[test]
    fn read_at_fills_only_the_positions() {
        let store = Rows::new(10);
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
        let store = Rows::new(10);
        let text = |r: Result<u64>| r.unwrap_err().to_string();
        assert!(text(read_at(&store, &[1, 2], &[0], &mut [0; 5])).contains("output of 6 bytes"));
        assert!(text(read_at(&store, &[1, 2], &[2], &mut [0; 6])).contains("position 2"));
        assert!(text(read_at(&store, &[1, 12], &[1], &mut [0; 6])).contains("row 12"));
    }
}
