//! Per-vertex lists gathered by a pass, for algorithms that need all of a vertex's neighbours
//! at once (label propagation's most frequent label, triangle counting's oriented adjacency).
//!
//! The lists belong to the owned end of the edge records (the destination in column order,
//! the source in row order: the major chunk, which one compute thread streams alone), so a
//! record's value goes in its vertex's list with a plain store. They are laid out from known
//! counts (degrees, or a counting pass), so no list grows. A range of vertices whose lists fit
//! the algorithm's work buffer is gathered in one pass that reads only the blocks of the
//! range's chunks; a graph whose lists do not fit at once takes a pass per range.

use std::ops::Range;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering::Relaxed};

use strata_io::progress::Progress;
use strata_store::units::fmt_bytes;

use super::chunk_bases;
use crate::error::{GridError, Result};
use crate::layout::{GridManifest, Order};
use crate::stream::{EdgeKernel, PassStats, Streamer};
use crate::vertex::U64Array;

/// Bytes a value of a list takes.
pub(crate) const VALUE_BYTES: u64 = 4;
/// Bytes a vertex of a gathered range takes besides its values: the offset of its list (u64)
/// and the count filled so far (u32).
pub(crate) const VERTEX_BYTES: u64 = 12;

/// Cuts `vertices` into consecutive ranges whose lists (`count(v)` values each) fit `capacity`
/// bytes with their per-vertex offsets, as few as can be. Fails with the first vertex whose
/// list alone does not fit, and the bytes it needs.
pub(crate) fn plan_ranges(
    vertices: Range<usize>,
    count: impl Fn(usize) -> u64,
    capacity: u64,
) -> std::result::Result<Vec<Range<usize>>, (usize, u64)> {
    let mut out = Vec::new();
    let (mut start, mut used) = (vertices.start, 0u64);
    for v in vertices.clone() {
        let cost = count(v) * VALUE_BYTES + VERTEX_BYTES;
        if cost > capacity {
            return Err((v, cost));
        }
        if used + cost > capacity {
            out.push(start..v);
            (start, used) = (v, 0);
        }
        used += cost;
    }
    if start < vertices.end {
        out.push(start..vertices.end);
    }
    Ok(out)
}

/// The error of a vertex whose list (`bytes` with its offsets) does not fit the `room` that a
/// work buffer of `capacity` bytes leaves for lists.
pub(crate) fn too_big(
    algorithm: &str,
    (v, bytes): (usize, u64),
    room: u64,
    capacity: u64,
) -> GridError {
    GridError::Budget(format!(
        "{algorithm}: the work buffer of {} leaves {} for lists and vertex {v}'s takes {}; raise --memory by at least {}",
        fmt_bytes(capacity),
        fmt_bytes(room),
        fmt_bytes(bytes),
        fmt_bytes(bytes - room)
    ))
}

/// The lists of a range of vertices while a pass fills them.
pub(crate) struct Lists {
    range: Range<usize>,
    /// Where each vertex's list starts in `values`, and the end (range length + 1 entries).
    first: Vec<u64>,
    fill: Vec<AtomicU32>,
    values: Vec<AtomicU32>,
    /// A vertex that got more values than its count (the counts do not describe the grid);
    /// `usize::MAX` while none has.
    overflow: AtomicUsize,
}

impl Lists {
    /// Empty lists for `range`, vertex v's of `count(v)` values.
    pub fn new(range: Range<usize>, count: impl Fn(usize) -> u64) -> Lists {
        let mut first = Vec::with_capacity(range.len() + 1);
        let mut at = 0u64;
        first.push(0);
        for v in range.clone() {
            at += count(v);
            first.push(at);
        }
        Lists {
            fill: (0..range.len()).map(|_| AtomicU32::new(0)).collect(),
            values: (0..at).map(|_| AtomicU32::new(0)).collect(),
            range,
            first,
            overflow: AtomicUsize::new(usize::MAX),
        }
    }

    /// Appends `x` to vertex `v`'s list; only the thread owning `v`'s chunk calls it.
    #[inline]
    fn push(&self, v: usize, x: u32) {
        let k = v - self.range.start;
        let filled = self.fill[k].load(Relaxed);
        let at = self.first[k] + filled as u64;
        if at >= self.first[k + 1] {
            self.overflow.store(v, Relaxed);
            return;
        }
        self.values[at as usize].store(x, Relaxed);
        self.fill[k].store(filled + 1, Relaxed);
    }

    /// The filled lists: vertex v's values are `values[first[v - start]..first[v - start + 1]]`.
    /// Fails, naming `grid`, when a vertex got other than its count.
    pub fn finish(self, grid: &std::path::Path) -> Result<(Vec<u64>, Vec<u32>)> {
        let short = (0..self.range.len())
            .find(|&k| self.fill[k].load(Relaxed) as u64 != self.first[k + 1] - self.first[k])
            .map(|k| self.range.start + k);
        let over = Some(self.overflow.load(Relaxed)).filter(|&v| v != usize::MAX);
        if let Some(v) = over.or(short) {
            return Err(GridError::invalid(
                grid,
                format!(
                    "vertex {v}: its degree in the degree arrays disagrees with its edges in the blocks"
                ),
            ));
        }
        let values = self.values.into_iter().map(AtomicU32::into_inner).collect();
        Ok((self.first, values))
    }
}

/// Calls `f(owner, other)` for every edge record whose owned end is in `range`; counts the
/// calls that return true.
struct ByOwner<'a, F> {
    base: &'a [u64],
    owner_is_dst: bool,
    range: Range<usize>,
    f: F,
}

impl<F: Fn(usize, usize) -> bool + Sync> EdgeKernel for ByOwner<'_, F> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], _: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let mut done = 0;
        for &[s, d] in edges {
            let (u, v) = (sb + s as usize, db + d as usize);
            let (owner, other) = if self.owner_is_dst { (v, u) } else { (u, v) };
            if self.range.contains(&owner) && (self.f)(owner, other) {
                done += 1;
            }
        }
        done
    }
}

/// The major chunks holding the blocks of owned vertices `range`.
fn majors(s: &Streamer, range: &Range<usize>) -> Range<u32> {
    let layout = s.grid().layout();
    if range.is_empty() {
        return 0..0;
    }
    layout.chunk_of(range.start as u64)..layout.chunk_of(range.end as u64 - 1) + 1
}

/// One pass over the blocks of `range`'s chunks calling `f(owner, other)` for every edge
/// record whose owned end is in `range`; the pass's total counts the calls that return true.
fn by_owner(
    s: &mut Streamer,
    range: Range<usize>,
    f: impl Fn(usize, usize) -> bool + Sync,
    progress: &dyn Progress,
) -> Result<PassStats> {
    let base = chunk_bases(s);
    let majors = majors(s, &range);
    let kernel = ByOwner {
        base: &base,
        owner_is_dst: s.grid().layout().order == Order::Column,
        range,
        f,
    };
    s.stream_majors(&kernel, None, majors, progress)
}

/// One pass over the blocks of `range`'s chunks adding to `counts[owner]` one for every edge
/// record whose owned end is in `range` and for which `keep(owner, other)`.
pub(crate) fn count(
    s: &mut Streamer,
    range: Range<usize>,
    counts: &U64Array,
    keep: impl Fn(usize, usize) -> bool + Sync,
    progress: &dyn Progress,
) -> Result<PassStats> {
    let add = |owner: usize, other: usize| {
        let kept = keep(owner, other);
        if kept {
            counts.set(owner, counts.get(owner) + 1);
        }
        kept
    };
    by_owner(s, range, add, progress)
}

/// One pass over the blocks of `lists`' range's chunks putting `value(owner, other)`, when it
/// is one, in the owner's list for every edge record whose owned end is in the range.
pub(crate) fn gather(
    s: &mut Streamer,
    lists: &Lists,
    value: impl Fn(usize, usize) -> Option<u32> + Sync,
    progress: &dyn Progress,
) -> Result<PassStats> {
    let put = |owner: usize, other: usize| match value(owner, other) {
        Some(x) => {
            lists.push(owner, x);
            true
        }
        None => false,
    };
    by_owner(s, lists.range.clone(), put, progress)
}

/// The manifest of `s`'s grid when it suits an algorithm that gathers vertex ids: symmetric,
/// and with ids that fit the 4 bytes of a list's value; else an error naming `algorithm`.
pub(crate) fn symmetric_u32(s: &Streamer, algorithm: &str) -> Result<GridManifest> {
    let m = s.grid().manifest().clone();
    if !m.symmetric {
        return Err(GridError::config(
            "grid",
            format!("{algorithm} needs a symmetric grid (strata grid build --symmetrize)"),
        ));
    }
    if m.num_vertices > u32::MAX as u64 {
        return Err(GridError::config(
            "algorithm",
            format!(
                "{algorithm} keeps 32-bit vertex ids and the grid has {} vertices",
                m.num_vertices
            ),
        ));
    }
    Ok(m)
}

/// Calls `f(v, list)` for every vertex v from `start` on with its list of `values` (laid out
/// by `first`, as [`Lists::finish`] returns them), on `threads` threads, each taking a run of
/// consecutive vertices with about the same number of values.
pub(crate) fn for_each_list(
    start: usize,
    first: &[u64],
    values: &mut [u32],
    threads: usize,
    f: impl Fn(usize, &mut [u32]) + Sync,
) {
    let vertices = first.len() - 1;
    let total = first[vertices];
    let parts = threads.max(1) as u64;
    // Cut after the vertex where each share of the values ends.
    let mut cuts = vec![0usize];
    for t in 1..parts {
        let at = first
            .partition_point(|&x| x < total * t / parts)
            .min(vertices);
        cuts.push(at.max(*cuts.last().unwrap()));
    }
    cuts.push(vertices);
    let mut pieces = Vec::new();
    let mut rest = values;
    for w in cuts.windows(2) {
        let len = (first[w[1]] - first[w[0]]) as usize;
        let (piece, tail) = rest.split_at_mut(len);
        pieces.push((w[0]..w[1], piece));
        rest = tail;
    }
    std::thread::scope(|scope| {
        for (ks, piece) in pieces {
            let f = &f;
            scope.spawn(move || {
                let offset = first[ks.start];
                for k in ks {
                    let (a, b) = (
                        (first[k] - offset) as usize,
                        (first[k + 1] - offset) as usize,
                    );
                    f(start + k, &mut piece[a..b]);
                }
            });
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_fit_the_capacity_and_cover_every_vertex() {
        let count = |v: usize| (v % 7) as u64;
        let ranges = plan_ranges(3..103, count, 100).unwrap();
        assert_eq!(ranges.first().unwrap().start, 3);
        assert_eq!(ranges.last().unwrap().end, 103);
        for w in ranges.windows(2) {
            assert_eq!(w[0].end, w[1].start);
            // As few as can be: the next vertex would not have fitted.
            let used: u64 = w[0].clone().map(|v| count(v) * 4 + 12).sum();
            assert!(used <= 100 && used + count(w[1].start) * 4 + 12 > 100);
        }
        assert_eq!(plan_ranges(0..10, |_| 0, 1 << 20).unwrap(), vec![0..10]);
        assert!(plan_ranges(0..0, count, 100).unwrap().is_empty());
        assert_eq!(plan_ranges(0..10, |v| v as u64 * 10, 100), Err((3, 132)));
    }

    #[test]
    fn lists_take_their_counts_and_refuse_other_counts() {
        let lists = Lists::new(10..13, |v| v as u64 - 10);
        lists.push(11, 7);
        lists.push(12, 8);
        lists.push(12, 9);
        let (first, values) = lists.finish(std::path::Path::new("g")).unwrap();
        assert_eq!((first, values), (vec![0, 0, 1, 3], vec![7, 8, 9]));
        let short = Lists::new(0..2, |_| 1);
        short.push(0, 1);
        assert!(short.finish(std::path::Path::new("g")).is_err());
        let over = Lists::new(0..2, |_| 1);
        [0, 1, 1].iter().for_each(|&v| over.push(v, 5));
        let e = over.finish(std::path::Path::new("g")).unwrap_err();
        assert!(e.to_string().contains("disagrees"), "{e}");
    }

    #[test]
    fn every_list_is_visited_once_whatever_the_threads() {
        let first: Vec<u64> = (0..=50u64).map(|k| k * (k + 1) / 2).collect();
        for threads in [1, 3, 8, 64] {
            let mut values: Vec<u32> = (0..first[50] as u32).collect();
            for_each_list(100, &first, &mut values, threads, |v, list| {
                assert_eq!(list.len(), v - 100 + 1);
                list.iter_mut().for_each(|x| *x = v as u32);
            });
            for k in 0..50 {
                let (a, b) = (first[k] as usize, first[k + 1] as usize);
                assert!(values[a..b].iter().all(|&x| x == 100 + k as u32));
            }
        }
    }
}
