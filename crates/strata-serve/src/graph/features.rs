//! A served graph's feature rows as a feature store: the rows mutations wrote, held in the
//! overlay's layers, over the rows of the store version's file.
//!
//! Readers ([`ServedGraph::gather`](super::ServedGraph::gather), the fold) read a snapshot:
//! the layers they see, newest first, then the file through `read_at`. The overlay's apply
//! writes a mutation's rows (added or updated vertices) with `update` into the layer it is
//! applying to, after the group commit put the mutation's log record on disk.

use strata_graph::feature_store::{check_output, check_update, read_at, read_on_complete};
use strata_graph::{FeatureStore, GraphError, Pending};

use super::layer::{Layer, View};
use crate::page_cache::PagedRows;

/// Feature rows of a served graph: `dim` f32 (`base.row_bytes()` bytes) per vertex id,
/// `0..num_rows()` being every vertex id handed out (removed ones included).
pub struct GraphFeatures<'a> {
    /// The layer `update` writes into, read before `below`; `None` in a reader's snapshot,
    /// which refuses updates.
    top: Option<&'a mut Layer>,
    /// The layers under `top`, newest first, over the version's graph.
    below: View<'a>,
    /// The version's file: the rows no layer holds.
    base: PagedRows<'a>,
}

impl<'a> GraphFeatures<'a> {
    /// A reader's snapshot: the rows of `view`'s layers over `base`.
    pub fn reading(view: View<'a>, base: PagedRows<'a>) -> GraphFeatures<'a> {
        GraphFeatures {
            top: None,
            below: view,
            base,
        }
    }

    /// The rows of `top` over those of `below` and `base`; updates go into `top`.
    pub fn writing(top: &'a mut Layer, below: View<'a>, base: PagedRows<'a>) -> GraphFeatures<'a> {
        GraphFeatures {
            top: Some(top),
            below,
            base,
        }
    }

    /// The first half of [`FeatureStore::read`], for a reader that must not hold the overlay
    /// while it reads the disk: copies into `out` (`rows.len() * row_bytes()` bytes) the rows
    /// mutations wrote, zeros for a vertex added and removed before any fold (it has no row
    /// anywhere), and returns the positions of `rows` whose rows are in the version's file,
    /// for `read_at` on it.
    pub fn read_written(&self, rows: &[u32], out: &mut [u8]) -> strata_graph::Result<Vec<usize>> {
        let rb = self.row_bytes();
        check_output(rows.len(), rb, out.len())?;
        let in_file = self.base.num_rows();
        let mut from_file = Vec::new();
        for (i, (&v, dst)) in rows.iter().zip(out.chunks_exact_mut(rb)).enumerate() {
            match self.written(v) {
                Some(r) => dst.copy_from_slice(bytemuck::cast_slice(r)),
                None if (v as u64) < in_file => from_file.push(i),
                None => dst.fill(0),
            }
        }
        Ok(from_file)
    }

    /// The row a mutation wrote for `v`, newest first.
    fn written(&self, v: u32) -> Option<&[f32]> {
        self.top
            .as_ref()
            .and_then(|t| t.feature_row(v))
            .or_else(|| self.below.feature_row(v))
    }
}

impl FeatureStore for GraphFeatures<'_> {
    fn num_rows(&self) -> u64 {
        match &self.top {
            Some(t) => t.num_nodes as u64,
            None => self.below.num_nodes() as u64,
        }
    }

    fn row_bytes(&self) -> usize {
        self.base.row_bytes()
    }

    /// Reads when completed: rows a mutation wrote from memory
    /// ([`GraphFeatures::read_written`]), the rest from the file through `read_at` (straight
    /// into `out` when no row is in memory, the common case); completing returns the bytes
    /// read from disk.
    fn submit(&self, rows: &[u32]) -> strata_graph::Result<Pending<'_>> {
        read_on_complete(self, "served graph features", rows, |rows, out| {
            let from_file = self.read_written(rows, out)?;
            read_at(&self.base, rows, &from_file, out)
        })
    }

    /// Writes rows into the top layer (little-endian f32, `dim` per row). Every row of
    /// `rows` must be below `num_rows()`: an added vertex's id is handed out (the layer's
    /// `num_nodes` raised) before its row is written. A reader's snapshot refuses
    /// ([`GraphError::ReadOnly`]).
    fn update(&mut self, rows: &[u32], data: &[u8]) -> strata_graph::Result<()> {
        check_update(self, "served graph features", rows, data)?;
        let rb = self.row_bytes();
        let Some(top) = self.top.as_deref_mut() else {
            return Err(GraphError::ReadOnly(
                "a reader's snapshot of the served graph's features".to_string(),
            ));
        };
        for (&v, row) in rows.iter().zip(data.chunks_exact(rb)) {
            let values = row
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            top.set_feature_row(v, values);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::tests::write_lists;
    use crate::graph::version::Version;
    use crate::page_cache::PageCache;

    /// Rows as f32 values.
    fn values(bytes: &[u8]) -> Vec<f32> {
        bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn bytes(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A version of 4 vertices, rows `[v, v + 0.5]`.
    fn version(dir: &std::path::Path) -> Version {
        let path = dir.join("v1");
        write_lists(&path, 4, &[(0, 1)]);
        Version::open(&path, 1).unwrap()
    }

    #[test]
    fn updates_go_to_the_top_layer_and_reads_see_them_over_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let version = version(dir.path());
        let cache = PageCache::new(1 << 20);
        let rows = || version.feature_rows(&cache);
        let base = View::new(&version.graph, &[], 4);
        // A frozen layer rewrote row 1.
        let mut frozen = Layer::starting_at(4, 4, 1);
        GraphFeatures::writing(&mut frozen, base, rows())
            .update(&[1], &bytes(&[7.0, 7.5]))
            .unwrap();
        let layers = [&frozen];
        let below = View::new(&version.graph, &layers, 4);
        // The top layer added vertices 4 and 5 and wrote rows 4 and 2, row 4 twice: the later
        // one wins.
        let mut top = Layer::starting_at(6, 6, 1);
        let mut store = GraphFeatures::writing(&mut top, below, rows());
        assert_eq!((store.num_rows(), store.row_bytes()), (6, 8));
        store
            .update(&[4, 2, 4], &bytes(&[1.0, 1.5, 2.0, 2.5, 4.0, 4.5]))
            .unwrap();
        let ids = [0, 1, 2, 3, 4, 5];
        let mut out = vec![0xEE; ids.len() * 8];
        assert!(store.read(&ids, &mut out).unwrap() > 0);
        // Vertex 5 has a row nowhere: zeros.
        assert_eq!(
            values(&out),
            [0.0, 0.5, 7.0, 7.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 0.0, 0.0]
        );
        let e = store.update(&[6], &[0; 8]).unwrap_err().to_string();
        assert!(e.contains("row 6 is out of range: 6 rows"), "{e}");
        let e = store.update(&[5], &[0; 4]).unwrap_err().to_string();
        assert!(e.contains("needs 8 bytes of data, got 4"), "{e}");
        // A reader of the same layers reads the same rows, and refuses updates.
        let all = [&top, &frozen];
        let mut snapshot = GraphFeatures::reading(View::new(&version.graph, &all, 4), rows());
        let mut again = vec![0; out.len()];
        snapshot.read(&ids, &mut again).unwrap();
        assert_eq!(again, out);
        let e = snapshot.update(&[0], &[0; 8]).unwrap_err();
        assert!(matches!(e, GraphError::ReadOnly(_)), "{e}");
        assert!(e.to_string().contains("read-only"), "{e}");
    }
}
