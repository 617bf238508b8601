//! The data of 1vsAll and KvsAll chunks (see [`crate::train::all_entities`], their step):
//! what a chunk context carries, KvsAll's answers, and a worker's buffers.

use crate::model::{AllScratch, Dropped, ProductQuery};

/// What a chunk of a 1vsAll or KvsAll run trains with, beside its `BucketCtx`.
#[derive(Clone, Copy)]
pub struct VsAll<'a> {
    pub label_smoothing: f32,
    pub query: ProductQuery,
    /// KvsAll: the known answers of every training query (None for 1vsAll).
    pub answers: Option<&'a Answers>,
}

/// KvsAll's labels: the training edges of an in-memory run (local rows of its one
/// partition), sorted by query, once per side: `(s, r, t)` for tail queries and `(t, r, s)`
/// for head queries; duplicate edges are kept once.
pub struct Answers {
    sides: [Vec<[u32; 3]>; 2],
}

/// Bytes per training edge that [`Answers`] holds (a row per side).
pub const ANSWER_BYTES: u64 = 24;

/// Bytes per training edge of the answers' index on a torch device
/// (`strata.embed.device.vs_all.Answers`): per side each row's answer and at most one
/// distinct query's key, first row and count, as `i64`.
pub const DEVICE_ANSWER_BYTES: u64 = 2 * 4 * 8;

impl Answers {
    /// Indexes `edges` (`[source, relation, target]` rows).
    pub fn new(edges: &[[i32; 3]]) -> Answers {
        let side = |key: fn(&[i32; 3]) -> [u32; 3]| {
            let mut rows: Vec<[u32; 3]> = edges.iter().map(key).collect();
            rows.sort_unstable();
            rows.dedup();
            rows
        };
        Answers {
            sides: [
                side(|e| [e[0] as u32, e[1] as u32, e[2] as u32]),
                side(|e| [e[2] as u32, e[1] as u32, e[0] as u32]),
            ],
        }
    }

    /// Side `k`'s rows (0: `[s, r, t]` of tail queries, 1: `[t, r, s]` of head queries),
    /// sorted.
    pub fn side(&self, k: usize) -> &[[u32; 3]] {
        &self.sides[k]
    }

    /// The answers of query `(s, r)` on side `k` (0: tails of `(s, r, ?)`, 1: heads of
    /// `(?, r, s)`), as rows `[s, r, answer]` in increasing answer order.
    pub(crate) fn of(&self, k: usize, s: u32, r: u32) -> &[[u32; 3]] {
        let rows = &self.sides[k];
        let lo = rows.partition_point(|x| (x[0], x[1]) < (s, r));
        let hi = lo + rows[lo..].partition_point(|x| (x[0], x[1]) == (s, r));
        &rows[lo..hi]
    }

    /// Distinct queries on side `k`.
    pub fn queries(&self, k: usize) -> usize {
        let rows = &self.sides[k];
        rows.iter()
            .zip(rows.iter().skip(1))
            .filter(|(a, b)| (a[0], a[1]) != (b[0], b[1]))
            .count()
            + usize::from(!rows.is_empty())
    }
}

/// One side's queries: their source and relation rows, labels and weights, and the
/// relation gradients of its step (kept until the chunk's relation updates).
#[derive(Default)]
pub(crate) struct Side {
    pub(crate) src: Vec<f32>,
    pub(crate) rel: Vec<f32>,
    /// 1vsAll: the true targets' rows (for the regularizer).
    pub(crate) dst: Vec<f32>,
    /// Candidate index of each query's source row.
    pub(crate) src_at: Vec<u32>,
    /// Relation row of each query.
    pub(crate) rel_row: Vec<u32>,
    /// 1vsAll: each query's true candidate; KvsAll: offsets into `ids`.
    pub(crate) one: Vec<u32>,
    pub(crate) offsets: Vec<u32>,
    pub(crate) ids: Vec<u32>,
    pub(crate) weights: Vec<f32>,
    pub(crate) g_rel: Vec<f32>,
}

/// A worker's buffers for 1vsAll and KvsAll chunks.
#[derive(Default)]
pub struct VsAllWorker {
    /// Every candidate row, `n x d`, and the sum of their gradients.
    pub(crate) cands: Vec<f32>,
    pub(crate) grad: Vec<f32>,
    /// First candidate index of each resident part.
    pub(crate) first: Vec<u32>,
    pub(crate) sides: [Side; 2],
    pub(crate) scratch: AllScratch,
    /// With dropout: one side's dropped source, relation and candidate rows and their masks
    /// (the sides are stepped one after the other, so one set serves both).
    pub(crate) dropped: Dropped,
    pub(crate) updates: Vec<(u64, u32)>,
    pub(crate) sum: Vec<f32>,
}
