//! Training edges held in memory after their first read, when the plan has room for them
//! (`keep_edges`): later epochs copy each piece out of memory instead of reading it from the
//! SSD, so an out-of-core epoch's disk moves only partitions. On a GPU the edges read two
//! pieces ahead queued behind each swap's partition I/O on the same disk (RMAT scale 24 out of
//! core on an H200: 3.5 s of a 22 s epoch waiting for edges).

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Mutex;

/// One piece's edges as read and checked: `(src_local, rel, dst_local)` rows and their weights
/// (empty when read without them).
struct Piece {
    edges: Vec<[i32; 3]>,
    weights: Vec<f32>,
}

/// Pieces of the bucketed edge index by their row range (the prefetcher reads the same ranges
/// every epoch: a run's piece size is fixed).
#[derive(Default)]
pub struct EdgeCache {
    pieces: Mutex<HashMap<(u64, u64), Piece>>,
}

impl EdgeCache {
    /// A copy of the rows `rows` of the index, if kept (training shuffles its copy in place).
    pub fn get(&self, rows: &Range<u64>) -> Option<(Vec<[i32; 3]>, Vec<f32>)> {
        let pieces = self.pieces.lock().expect("edge cache lock");
        pieces
            .get(&(rows.start, rows.end))
            .map(|p| (p.edges.clone(), p.weights.clone()))
    }

    /// Keeps a copy of rows `rows` of the index, read and checked.
    pub fn put(&self, rows: &Range<u64>, edges: &[[i32; 3]], weights: &[f32]) {
        let piece = Piece {
            edges: edges.to_vec(),
            weights: weights.to_vec(),
        };
        let mut pieces = self.pieces.lock().expect("edge cache lock");
        pieces.insert((rows.start, rows.end), piece);
    }
}
