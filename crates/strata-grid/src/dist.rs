//! Distributed runs (`torchrun ... -m strata run ALGO STORE`): each rank owns a contiguous
//! range of destination chunks (grid columns, balanced by edges) and streams only their
//! blocks; every rank keeps all vertex values, and after each pass the ranks exchange the
//! values their columns changed (docs/distributed.md, "Analytics").
//!
//! The engine talks to the other ranks through a [`Collective`], which the Python binding
//! implements over torch.distributed. An exchange sends, per rank, whichever of three forms is
//! smallest: the changed vertices as (offset, value) pairs, a bitmap of the owned range with
//! the changed values, or every owned value.

use std::ops::Range;
use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use crate::checkpoint::{CheckpointFigures, Checkpoints, State};
use crate::error::{GridError, Result};
use crate::grid::Grid;
use crate::layout::{Order, GRID_MANIFEST};
use crate::vertex::{Bitmap, Shared};

/// How [`Collective::all_reduce`] combines the ranks' values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Min,
}

/// What a distributed run needs from the group of ranks. Every call is collective: each rank
/// makes the same calls in the same order. Errors are [`GridError::Group`].
pub trait Collective {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Every rank's `mine`, in rank order (lengths may differ between ranks).
    fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>>;
    /// Combines `values` element-wise over the ranks, in place (same length on every rank).
    fn all_reduce(&mut self, values: &mut [f64], op: Reduce) -> Result<()>;
    /// Waits for every rank at the point named `what`.
    fn barrier(&mut self, what: &str) -> Result<()>;
    /// Bytes sent to and received from the other ranks so far, as they went on the wire.
    fn traffic(&self) -> (u64, u64);
    /// Fails (on every rank) unless every rank runs on the same data: `grid` is this rank's
    /// grid directory and `digest` its content digest (`strata_store::digest`).
    fn same_data(&mut self, grid: &Path, digest: &str) -> Result<()>;
    /// Whether this group replaces one that failed (torchrun restarted it): a run then
    /// resumes from its last checkpoint.
    fn restarted(&self) -> bool {
        false
    }
    /// This process's anonymous memory (`RssAnon`) once the group's runtime started, as
    /// measured by whoever started it (`None`: not measured); the rank's plan sets it aside.
    fn group_anon_bytes(&self) -> Option<u64> {
        None
    }
}

/// The destination chunks of each of `world_size` ranks: contiguous ranges of columns in
/// order, balanced by edges ([`balance_columns`]), every rank at least one column. Needs a
/// column-order grid, whose column j holds every edge into chunk j, with at least as many
/// columns as ranks: a column's destinations are summed by one rank, so a grid of fewer
/// columns is refused with the command that builds one with enough.
pub fn split_columns(grid: &Grid, world_size: usize) -> Result<Vec<Range<u32>>> {
    let layout = *grid.layout();
    if layout.order != Order::Column {
        return Err(GridError::config(
            "grid",
            format!(
                "{} is in row order; distributed runs split the grid by destination chunk and need a \
                 column-order grid (strata grid build --order column)",
                grid.dir().display()
            ),
        ));
    }
    let p = layout.partitions;
    if (p as usize) < world_size {
        return Err(GridError::config(
            "grid",
            format!(
                "{} has {p} columns (partitions) for {world_size} ranks: each rank owns whole columns \
                 and every rank needs one; build a grid with at least {world_size} partitions \
                 (strata grid build STORE --partitions {world_size} --order column, and run with \
                 --grid and the name it prints) or run fewer ranks",
                grid.dir().display()
            ),
        ));
    }
    let column_edges: Vec<u64> = (0..p)
        .map(|j| {
            let (first, last) = (layout.position(0, j), layout.position(p - 1, j));
            grid.block_edges(last).end - grid.block_edges(first).start
        })
        .collect();
    Ok(balance_columns(&column_edges, world_size))
}

/// Splits columns with `edges[j]` edges each into `ranks` contiguous, non-empty ranges in order
/// (`1 <= ranks <= edges.len()`), so that the most edges any range holds is the least any such
/// split can reach; within that bound each cut lands nearest an equal share of the edges left.
///
/// The bound is found by bisection on the greedy count of ranges; a cut is chosen among those
/// whose remaining columns the remaining ranks can still cover within the bound. Cost:
/// O(columns x (log edges + ranks)).
pub fn balance_columns(edges: &[u64], ranks: usize) -> Vec<Range<u32>> {
    let p = edges.len();
    assert!(
        ranks >= 1 && ranks <= p,
        "balance_columns: {ranks} ranks for {p} columns"
    );
    // sums[j]: edges of the columns before j.
    let mut sums = Vec::with_capacity(p + 1);
    sums.push(0u64);
    for &e in edges {
        sums.push(sums.last().unwrap() + e);
    }
    // The furthest end of a range from column j that holds at most `bound` edges.
    let reach = |j: usize, bound: u64| sums.partition_point(|&s| s <= sums[j] + bound) - 1;
    let ranges_needed = |bound: u64| {
        let (mut j, mut n) = (0, 0);
        while j < p {
            j = reach(j, bound);
            n += 1;
        }
        n
    };
    let (mut lo, mut hi) = (edges.iter().copied().max().unwrap_or(0), sums[p]);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ranges_needed(mid) <= ranks {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    let bound = lo;
    // need[j]: ranges the columns from j on need within the bound (greedy, so the least).
    let mut need = vec![0usize; p + 1];
    for j in (0..p).rev() {
        need[j] = 1 + need[reach(j, bound)];
    }
    let mut out = Vec::with_capacity(ranks);
    let mut j = 0;
    for r in 0..ranks {
        let left = ranks - r;
        if left == 1 {
            out.push(j as u32..p as u32);
            break;
        }
        // Ends that keep this range within the bound and leave the rest coverable by the
        // others with a column each at least; `need` falls as the end moves right.
        let last = reach(j, bound).min(p - (left - 1));
        let first = (j + 1..=last)
            .find(|&e| need[e] < left)
            .expect("the bound admits a split");
        let share = (sums[p] - sums[j]) / left as u64;
        let end = (first..=last)
            .min_by_key(|&e| (sums[e] - sums[j]).abs_diff(share))
            .expect("a non-empty range of ends");
        out.push(j as u32..end as u32);
        j = end;
    }
    out
}

/// The forms of a rank's part of an exchange (its first byte after the header).
const SPARSE: u8 = 0;
const BITMAP: u8 = 1;
const FULL: u8 = 2;
/// Vertices per round when result arrays are gathered at the end (bounds the buffers).
const GATHER_BATCH: u64 = 1 << 20;

/// This rank of a distributed run: the group, what every rank owns, and the traffic counters.
pub struct Dist<'a> {
    group: &'a mut dyn Collective,
    /// Every rank's destination chunks.
    pub columns: Vec<Range<u32>>,
    /// Every rank's vertices (those of its chunks).
    pub vertices: Vec<Range<u64>>,
    /// Traffic when the last iteration was reported: (sent, received).
    mark: (u64, u64),
    /// Iteration checkpoints, when on.
    pub checkpoints: Option<Checkpoints>,
}

/// A rank's figures, gathered at the end of a distributed run.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct RankFigures {
    pub rank: usize,
    /// Its destination chunks and vertices, as [start, end).
    pub columns: [u32; 2],
    pub vertices: [u64; 2],
    pub edges: u64,
    pub bytes_disk: u64,
    pub bytes_far: u64,
    pub bytes_local: u64,
    /// Bytes sent to and received from the other ranks.
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub compute_seconds: f64,
    /// Its iteration checkpoints (none written when they are off).
    pub checkpoints: CheckpointFigures,
}

/// What a distributed run adds to the run summary.
#[derive(Debug, Clone, Serialize)]
pub struct DistSummary {
    pub world_size: usize,
    pub rank: usize,
    /// Every rank's figures, in rank order.
    pub ranks: Vec<RankFigures>,
}

impl<'a> Dist<'a> {
    /// This rank of `group` on `grid`, with the columns split by [`split_columns`].
    /// Every rank first proves it holds the same grid (its kept content digest, computed
    /// once when the grid has none).
    pub fn new(group: &'a mut dyn Collective, grid: &Grid) -> Result<Dist<'a>> {
        let digest = strata_store::digest::content_digest(grid.dir(), GRID_MANIFEST)?;
        group.same_data(grid.dir(), &digest)?;
        let columns = split_columns(grid, group.world_size())?;
        let layout = *grid.layout();
        let vertices = columns
            .iter()
            .map(|c| layout.base(c.start)..layout.base(c.end))
            .collect();
        let mark = group.traffic();
        Ok(Dist {
            group,
            columns,
            vertices,
            mark,
            checkpoints: None,
        })
    }

    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    pub fn world_size(&self) -> usize {
        self.group.world_size()
    }

    /// This rank's vertices.
    pub fn owned(&self) -> Range<u64> {
        self.vertices[self.rank()].clone()
    }

    /// Bytes sent plus received since the last call.
    pub fn take_traffic(&mut self) -> u64 {
        let now = self.group.traffic();
        let delta = (now.0 - self.mark.0) + (now.1 - self.mark.1);
        self.mark = now;
        delta
    }

    pub fn traffic(&self) -> (u64, u64) {
        self.group.traffic()
    }

    /// See [`Collective::restarted`].
    pub fn restarted(&self) -> bool {
        self.group.restarted()
    }

    /// See [`Collective::group_anon_bytes`].
    pub fn group_anon_bytes(&self) -> Option<u64> {
        self.group.group_anon_bytes()
    }

    pub fn all_reduce(&mut self, values: &mut [f64], op: Reduce) -> Result<()> {
        self.group.all_reduce(values, op)
    }

    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.group.all_gather(mine)
    }

    pub fn barrier(&mut self, what: &str) -> Result<()> {
        self.group.barrier(what)
    }

    /// Sends the owned vertices `changed` marks (all owned vertices when `None`) with their
    /// `values`, and applies the other ranks': their values are taken and, with a bitmap,
    /// their vertices marked in `changed`. `count` is this rank's figure for the iteration;
    /// returns the sum over the ranks.
    pub fn exchange(
        &mut self,
        changed: Option<&Bitmap>,
        values: &[&dyn Shared],
        count: u64,
    ) -> Result<u64> {
        let mine = encode(self.owned(), changed, values, count);
        let parts = self.group.all_gather(&mine)?;
        let rank = self.rank();
        let mut total = 0;
        for (q, part) in parts.iter().enumerate() {
            if q == rank {
                total += count;
                continue;
            }
            let range = self.vertices[q].clone();
            total += decode(part, range, values, |v| {
                if let Some(b) = changed {
                    b.set(v);
                }
                true
            })
            .map_err(|msg| GridError::Group(format!("rank {q}'s exchange: {msg}")))?;
        }
        Ok(total)
    }

    /// Copies every rank's owned values of `values` to every rank, in rounds of at most
    /// [`GATHER_BATCH`] vertices a rank (the results of algorithms whose iterations exchange
    /// less than the values).
    pub fn gather(&mut self, values: &[&dyn Shared]) -> Result<()> {
        let rounds = self
            .vertices
            .iter()
            .map(|r| (r.end - r.start).div_ceil(GATHER_BATCH))
            .max()
            .unwrap_or(0);
        let owned = self.owned();
        for k in 0..rounds {
            let start = (owned.start + k * GATHER_BATCH).min(owned.end);
            let end = (start + GATHER_BATCH).min(owned.end);
            let mut mine = Vec::with_capacity(
                1 + 8 + (end - start) as usize * values.iter().map(|a| a.width()).sum::<usize>(),
            );
            mine.extend_from_slice(&0u64.to_le_bytes());
            mine.push(FULL);
            put_range(start..end, values, &mut mine);
            let parts = self.group.all_gather(&mine)?;
            for (q, part) in parts.iter().enumerate() {
                if q == self.rank() {
                    continue;
                }
                let r = &self.vertices[q];
                let s = (r.start + k * GATHER_BATCH).min(r.end);
                decode(part, s..(s + GATHER_BATCH).min(r.end), values, |_| true).map_err(
                    |msg| GridError::Group(format!("rank {q}'s results, round {k}: {msg}")),
                )?;
            }
        }
        Ok(())
    }

    /// After `iterations` iterations: when checkpoints are on and (by the ranks' agreement) at
    /// least their interval has passed since the last one, writes and commits a checkpoint of
    /// `state` ([`crate::checkpoint`]). Every rank calls it at the same points. Its collectives
    /// are not counted in the iterations' bytes.
    pub fn checkpoint(&mut self, iterations: usize, state: &State) -> Result<()> {
        let Some((every, last)) = self.checkpoints.as_ref().map(Checkpoints::timing) else {
            return Ok(());
        };
        let started = Instant::now();
        if every > 0.0 {
            // The ranks' clocks differ: the smallest wait decides for all of them.
            let mut waited = [last.elapsed().as_secs_f64()];
            self.all_reduce(&mut waited, Reduce::Min)?;
            if waited[0] < every {
                self.take_traffic();
                return Ok(());
            }
        }
        let owned = self.owned();
        let c = self.checkpoints.as_ref().expect("checked above");
        let mine = c.write_part(iterations, owned, state)?;
        let records = self.all_gather(&mine)?;
        let vertices = self.vertices.iter().map(|r| [r.start, r.end]).collect();
        let rank = self.rank();
        let c = self.checkpoints.as_mut().expect("checked above");
        c.commit(iterations, rank, vertices, &records, started)?;
        self.take_traffic();
        Ok(())
    }

    /// On a restarted attempt, loads the last checkpoint every rank's part of which is
    /// durable into `state` and returns the iterations it holds; `None` when the run starts
    /// from the beginning (a first attempt, checkpoints off, or nothing committed). Every rank
    /// calls it before its first iteration.
    pub fn resume(&mut self, state: &State) -> Result<Option<usize>> {
        let Some(c) = self.checkpoints.as_ref() else {
            return Ok(None);
        };
        let Some(mine) = c.record_to_share()? else {
            return Ok(None);
        };
        let records = self.all_gather(&mine)?;
        let vertices: Vec<[u64; 2]> = self.vertices.iter().map(|r| [r.start, r.end]).collect();
        let c = self.checkpoints.as_ref().expect("checked above");
        let Some(iterations) = c.load(&records, &vertices, self.rank(), self.owned(), state)?
        else {
            return Ok(None);
        };
        if !state.whole.is_empty() {
            self.gather(state.whole)?;
        }
        if let Some(frontier) = state.frontier {
            self.exchange(Some(frontier), &[], 0)?;
        }
        self.take_traffic();
        self.checkpoints
            .as_mut()
            .expect("checked above")
            .resumed(iterations);
        Ok(Some(iterations))
    }

    /// Every rank's `mine`, gathered at the end of the run.
    pub fn summary(&mut self, mine: RankFigures) -> Result<DistSummary> {
        let text = serde_json::to_vec(&mine).expect("figures serialize");
        let parts = self.group.all_gather(&text)?;
        let ranks = parts
            .iter()
            .enumerate()
            .map(|(q, p)| {
                serde_json::from_slice(p)
                    .map_err(|e| GridError::Group(format!("rank {q}'s figures: {e}")))
            })
            .collect::<Result<Vec<RankFigures>>>()?;
        Ok(DistSummary {
            world_size: self.world_size(),
            rank: self.rank(),
            ranks,
        })
    }
}

/// Appends the values of every vertex of `range`.
fn put_range(range: Range<u64>, values: &[&dyn Shared], out: &mut Vec<u8>) {
    for v in range {
        for a in values {
            a.put(v as usize, out);
        }
    }
}

/// A rank's part of an exchange: `count`, then the smallest form of the vertices of `owned`
/// that `changed` marks (all of them when `None`) with their values.
fn encode(
    owned: Range<u64>,
    changed: Option<&Bitmap>,
    values: &[&dyn Shared],
    count: u64,
) -> Vec<u8> {
    let width: usize = values.iter().map(|a| a.width()).sum();
    let len = (owned.end - owned.start) as usize;
    let marked = |v: u64| changed.is_none_or(|b| b.get(v as usize));
    let n = match changed {
        None => len,
        Some(b) => b.count_range(owned.start as usize, owned.end as usize) as usize,
    };
    // Offsets are u32: a range longer than that sends a bitmap instead.
    let sparse = match len <= u32::MAX as usize {
        true => 8 + n * (4 + width),
        false => usize::MAX,
    };
    let bitmap = len.div_ceil(8) + n * width;
    let full = if n == len { len * width } else { usize::MAX };
    let mut out = Vec::with_capacity(9 + sparse.min(bitmap).min(full));
    out.extend_from_slice(&count.to_le_bytes());
    if full <= sparse.min(bitmap) {
        out.push(FULL);
        put_range(owned, values, &mut out);
    } else if sparse <= bitmap {
        out.push(SPARSE);
        out.extend_from_slice(&(n as u64).to_le_bytes());
        for v in owned.clone().filter(|&v| marked(v)) {
            out.extend_from_slice(&((v - owned.start) as u32).to_le_bytes());
            for a in values {
                a.put(v as usize, &mut out);
            }
        }
    } else {
        out.push(BITMAP);
        let bits = out.len();
        out.resize(bits + len.div_ceil(8), 0);
        for v in owned.clone().filter(|&v| marked(v)) {
            let k = (v - owned.start) as usize;
            out[bits + k / 8] |= 1 << (k % 8);
        }
        for v in owned.filter(|&v| marked(v)) {
            for a in values {
                a.put(v as usize, &mut out);
            }
        }
    }
    out
}

/// Applies another rank's part of an exchange for the vertices `range` it owns: for each
/// vertex it names, `mark(v)` is called and says whether to take the values. Returns the
/// rank's count, or what is wrong with the bytes.
fn decode(
    part: &[u8],
    range: Range<u64>,
    values: &[&dyn Shared],
    mut mark: impl FnMut(usize) -> bool,
) -> std::result::Result<u64, String> {
    let width: usize = values.iter().map(|a| a.width()).sum();
    let len = (range.end - range.start) as usize;
    let short = || format!("{} bytes are too few", part.len());
    if part.len() < 9 {
        return Err(short());
    }
    let count = u64::from_le_bytes(part[..8].try_into().expect("8 bytes"));
    let body = &part[9..];
    let mut take = |v: usize, mut bytes: &[u8]| {
        if mark(v) {
            for a in values {
                let (now, rest) = bytes.split_at(a.width());
                a.take(v, now);
                bytes = rest;
            }
        }
    };
    match part[8] {
        FULL => {
            if body.len() != len * width {
                return Err(short());
            }
            for k in 0..len {
                take(range.start as usize + k, &body[k * width..(k + 1) * width]);
            }
        }
        SPARSE => {
            let n = body
                .get(..8)
                .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
                .ok_or_else(short)?;
            let pairs = &body[8..];
            if pairs.len() != n * (4 + width) {
                return Err(short());
            }
            for pair in pairs.chunks_exact(4 + width) {
                let k = u32::from_le_bytes(pair[..4].try_into().expect("4 bytes")) as usize;
                if k >= len {
                    return Err(format!("vertex offset {k} is outside its {len} vertices"));
                }
                take(range.start as usize + k, &pair[4..]);
            }
        }
        BITMAP => {
            let bits = body.get(..len.div_ceil(8)).ok_or_else(short)?;
            let set: Vec<usize> = (0..len)
                .filter(|&k| bits[k / 8] & (1 << (k % 8)) != 0)
                .collect();
            let vals = &body[bits.len()..];
            if vals.len() != set.len() * width {
                return Err(short());
            }
            for (i, k) in set.into_iter().enumerate() {
                take(range.start as usize + k, &vals[i * width..(i + 1) * width]);
            }
        }
        form => return Err(format!("unknown form {form}")),
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Barrier, Mutex};

    use super::*;
    use crate::algo::registry::ALGORITHMS;
    use crate::block_codec::Compression;
    use crate::build::{build, BuildJob};
    use crate::config::RunOptions;
    use crate::fixtures::{far_server, for_algorithm, grids, store};
    use crate::vertex::U64Array;
    use strata_io::progress::NoProgress;
    use strata_store::config::check;

    /// The least, over every split of `edges` into `ranks` contiguous non-empty ranges, of
    /// the most edges a range holds (dynamic programming, for small cases).
    fn best_bound(edges: &[u64], ranks: usize) -> u64 {
        let p = edges.len();
        let sum = |a: usize, b: usize| edges[a..b].iter().sum::<u64>();
        // best[r][i]: the first i columns in r ranges.
        let mut best = vec![vec![u64::MAX; p + 1]; ranks + 1];
        best[0][0] = 0;
        for r in 1..=ranks {
            for i in r..=p {
                best[r][i] = (r - 1..i)
                    .filter(|&k| best[r - 1][k] != u64::MAX)
                    .map(|k| best[r - 1][k].max(sum(k, i)))
                    .min()
                    .unwrap_or(u64::MAX);
            }
        }
        best[ranks][p]
    }

    proptest::proptest! {
        #[test]
        fn columns_split_into_contiguous_ranges_with_the_least_largest_share(
            edges in proptest::collection::vec(
                proptest::prop_oneof![0u64..3, 0u64..1000, 0u64..1_000_000], 1..24),
            ranks_seed in 0usize..1000,
        ) {
            let ranks = 1 + ranks_seed % edges.len();
            let split = balance_columns(&edges, ranks);
            proptest::prop_assert_eq!(split.len(), ranks);
            let mut next = 0u32;
            for r in &split {
                proptest::prop_assert_eq!(r.start, next, "contiguous, each column once");
                proptest::prop_assert!(r.end > r.start, "every rank gets a column: {:?}", split);
                next = r.end;
            }
            proptest::prop_assert_eq!(next as usize, edges.len());
            let largest = split
                .iter()
                .map(|r| edges[r.start as usize..r.end as usize].iter().sum::<u64>())
                .max()
                .unwrap();
            proptest::prop_assert_eq!(largest, best_bound(&edges, ranks), "{:?}", split);
        }
    }

    #[test]
    fn three_ranks_on_three_skewed_columns_get_one_column_each() {
        // The first column holds most edges (a power-law graph's hub chunk): cutting at equal
        // shares of the running count left rank 0 nothing and rank 1 two thirds.
        assert_eq!(balance_columns(&[660, 170, 170], 3), vec![0..1, 1..2, 2..3]);
        assert_eq!(
            balance_columns(&[5, 5, 5, 5, 5, 5], 3),
            vec![0..2, 2..4, 4..6]
        );
        assert_eq!(balance_columns(&[0, 0, 0, 9], 2), vec![0..1, 1..4]);
        assert_eq!(balance_columns(&[0, 0, 0], 3), vec![0..1, 1..2, 2..3]);
    }

    #[test]
    fn a_grid_with_fewer_columns_than_ranks_is_refused_with_the_build_command() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 300, 2000);
        let built = build(
            &BuildJob {
                store: st,
                partitions: 2,
                ..Default::default()
            },
            &NoProgress,
        )
        .unwrap();
        let grid = Grid::open(&built.dir).unwrap();
        assert_eq!(split_columns(&grid, 2).unwrap().len(), 2);
        let err = split_columns(&grid, 3).unwrap_err().to_string();
        assert!(
            err.contains("has 2 columns (partitions) for 3 ranks")
                && err.contains("strata grid build STORE --partitions 3"),
            "{err}"
        );
    }

    /// Ranks of one process, each on its own thread, meeting at a barrier.
    struct Threads {
        rank: usize,
        slots: Arc<Mutex<Vec<Vec<u8>>>>,
        barrier: Arc<Barrier>,
        sent: u64,
        received: u64,
        restarted: bool,
    }

    fn threads(world_size: usize) -> Vec<Threads> {
        let slots = Arc::new(Mutex::new(vec![Vec::new(); world_size]));
        let barrier = Arc::new(Barrier::new(world_size));
        (0..world_size)
            .map(|rank| Threads {
                rank,
                slots: slots.clone(),
                barrier: barrier.clone(),
                sent: 0,
                received: 0,
                restarted: false,
            })
            .collect()
    }

    impl Collective for Threads {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world_size(&self) -> usize {
            self.slots.lock().unwrap().len()
        }
        fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
            self.slots.lock().unwrap()[self.rank] = mine.to_vec();
            self.barrier.wait();
            let all = self.slots.lock().unwrap().clone();
            // Nobody writes the next round before everyone has read this one.
            self.barrier.wait();
            self.sent += mine.len() as u64;
            self.received += all.iter().map(|p| p.len() as u64).sum::<u64>() - mine.len() as u64;
            Ok(all)
        }
        fn all_reduce(&mut self, values: &mut [f64], op: Reduce) -> Result<()> {
            let mine: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            for part in self.all_gather(&mine)? {
                for (v, b) in values.iter_mut().zip(part.chunks_exact(8)) {
                    let x = f64::from_le_bytes(b.try_into().unwrap());
                    *v = match op {
                        Reduce::Sum => *v + x,
                        Reduce::Min => v.min(x),
                    };
                }
            }
            // The loop added this rank's own values once more.
            if op == Reduce::Sum {
                for (v, b) in values.iter_mut().zip(mine.chunks_exact(8)) {
                    *v -= f64::from_le_bytes(b.try_into().unwrap());
                }
            }
            Ok(())
        }
        fn barrier(&mut self, _: &str) -> Result<()> {
            self.barrier.wait();
            Ok(())
        }
        fn traffic(&self) -> (u64, u64) {
            (self.sent, self.received)
        }
        fn same_data(&mut self, _: &Path, digest: &str) -> Result<()> {
            let all = self.all_gather(digest.as_bytes())?;
            match all.iter().all(|d| d == digest.as_bytes()) {
                true => Ok(()),
                false => Err(GridError::Group("the ranks' grids differ".into())),
            }
        }
        fn restarted(&self) -> bool {
            self.restarted
        }
    }

    /// Runs `job` on `world_size` ranks of one process (a restarted group when `restarted`),
    /// each passing its iterations to `each`; returns every rank's outcome.
    fn run_ranks(
        job: &crate::config::RunJob,
        world_size: usize,
        restarted: bool,
        each: &(dyn Fn(&crate::algo::Iteration) -> Result<()> + Sync),
    ) -> Vec<Result<crate::run::RunSummary>> {
        std::thread::scope(|s| {
            let handles: Vec<_> = threads(world_size)
                .into_iter()
                .map(|mut g| {
                    g.restarted = restarted;
                    s.spawn(move || {
                        crate::run::run_distributed(job, &mut g, &NoProgress, &mut |it| each(it))
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    /// Asserts that result arrays `got` equal `want`: exactly, or for (personalized) PageRank,
    /// SSSP and SpMV
    /// within float tolerance.
    fn assert_same(
        algorithm: &str,
        want: &[(String, Vec<u8>)],
        got: &[(String, Vec<u8>)],
        what: &str,
    ) {
        for ((name, a), (_, b)) in want.iter().zip(got) {
            let close = match algorithm {
                "pagerank" | "ppr" | "program" => {
                    a.chunks_exact(4).zip(b.chunks_exact(4)).all(|(x, y)| {
                        let x = f32::from_le_bytes(x.try_into().unwrap());
                        let y = f32::from_le_bytes(y.try_into().unwrap());
                        (x - y).abs() <= 1e-6 * x.abs().max(1e-6)
                    })
                }
                "sssp" | "spmv" => a.chunks_exact(8).zip(b.chunks_exact(8)).all(|(x, y)| {
                    let x = f64::from_le_bytes(x.try_into().unwrap());
                    let y = f64::from_le_bytes(y.try_into().unwrap());
                    x == y || (x - y).abs() <= 1e-9 * x.abs()
                }),
                _ => a == b,
            };
            assert!(close, "{algorithm} {name} {what}");
        }
    }

    #[test]
    fn every_form_of_an_exchange_carries_the_changed_values() {
        let mem = crate::vertex::VertexMemory::Heap;
        let values = U64Array::from_fn(&mem, 1000, |v| v as u64 * 3).unwrap();
        let owned = 200..600u64;
        for marked in [
            vec![201usize, 599],
            (200..600).step_by(3).collect(),
            (200..600).collect(),
        ] {
            let changed = Bitmap::new(1000);
            marked.iter().for_each(|&v| changed.set(v));
            let part = encode(owned.clone(), Some(&changed), &[&values], 7);
            let form = part[8];
            // Sparse for 2 vertices, a bitmap for a third of them, every value for all.
            let expected = match marked.len() {
                2 => SPARSE,
                400 => FULL,
                _ => BITMAP,
            };
            assert_eq!(form, expected);
            let into = U64Array::filled(&mem, 1000, 0).unwrap();
            let mut seen = Vec::new();
            let count = decode(&part, owned.clone(), &[&into], |v| {
                seen.push(v);
                true
            })
            .unwrap();
            assert_eq!((count, &seen), (7, &marked));
            for v in 0..1000 {
                let want = if marked.contains(&v) { v as u64 * 3 } else { 0 };
                assert_eq!(into.get(v), want, "vertex {v}, form {form}");
            }
            assert!(decode(&part[..part.len() - 1], owned.clone(), &[&into], |_| true).is_err());
        }
    }

    /// The result arrays of a run in `dir`, as raw bytes by name.
    fn results(dir: &std::path::Path, arrays: &[&str]) -> Vec<(String, Vec<u8>)> {
        arrays
            .iter()
            .map(|a| {
                let (_, b) =
                    strata_store::array::read_all_bytes(&dir.join(format!("{a}.npy"))).unwrap();
                (a.to_string(), b)
            })
            .collect()
    }

    #[test]
    fn ranks_split_the_columns_and_every_algorithm_matches_a_single_process() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 5000, 12_000);
        grids(&st, 7, Compression::None);
        let program = serde_json::to_string(&crate::program::spec::tests::pagerank()).unwrap();
        for e in ALGORITHMS {
            let job = |out: &str| {
                check::<RunOptions>(&for_algorithm(serde_json::json!({
                    "store": st,
                    "algorithm": e.name,
                    "out": tmp.path().join(out),
                    "memory": "256M",
                    "threads": 2,
                    "root": 3,
                    "program": program,
                })))
                .unwrap()
                .job()
                .unwrap()
            };
            let one = job(e.name);
            if !one.algorithm.distributed() {
                let refused = run_ranks(&one, 2, false, &|_| Ok(()));
                for r in refused {
                    let err = r.unwrap_err().to_string();
                    assert!(err.contains("runs in one process only"), "{err}");
                }
                continue;
            }
            let single = crate::run::run(&one, &NoProgress, &mut |_| Ok(())).unwrap();
            let arrays = one.algorithm.arrays();
            let arrays: Vec<&str> = arrays.iter().map(String::as_str).collect();
            let want = results(&single.out, &arrays);
            for world_size in [2, 3] {
                let out = format!("{}-{world_size}", e.name);
                let job = job(&out);
                let summaries: Vec<_> = run_ranks(&job, world_size, false, &|_| Ok(()))
                    .into_iter()
                    .map(|r| r.unwrap())
                    .collect();
                let d = summaries[0].dist.as_ref().unwrap();
                assert_eq!(d.world_size, world_size);
                // Alone, a label or distance lowered early in a pass travels on in the same
                // pass; across ranks it waits for the exchange, so those runs may take more
                // passes. The others stream the same blocks, split between the ranks.
                if !matches!(e.name, "wcc" | "sssp") {
                    let edges = d.ranks.iter().map(|r| r.edges).sum::<u64>();
                    assert_eq!(edges, single.edges, "{} x{world_size}", e.name);
                }
                let cols: Vec<[u32; 2]> = d.ranks.iter().map(|r| r.columns).collect();
                assert_eq!(cols[0][0], 0);
                assert!(cols.windows(2).all(|w| w[0][1] == w[1][0]));
                assert_eq!(cols[world_size - 1][1], 7);
                assert!(d
                    .ranks
                    .iter()
                    .all(|r| r.bytes_sent > 0 && r.bytes_received > 0));
                assert!(summaries[1..].iter().all(|s| s.arrays.is_empty()));
                // A program's aggregates are sums of floats, added in another order.
                let mut result = summaries[0].result.clone();
                if let Some(a) = result.get_mut("aggregates") {
                    let alone = &single.result["aggregates"]["dangling"];
                    let x = a["dangling"].as_f64().unwrap();
                    assert!(
                        (x - alone.as_f64().unwrap()).abs() <= 1e-6 * x,
                        "{x} {alone}"
                    );
                    a["dangling"] = alone.clone();
                }
                assert_eq!(result, single.result, "{} x{world_size}", e.name);
                let got = results(&tmp.path().join(&out), &arrays);
                assert_same(e.name, &want, &got, &format!("x{world_size}"));
            }
        }
    }

    #[test]
    fn a_restarted_group_resumes_from_the_last_checkpoint_to_the_same_results() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 5000, 12_000);
        for (name, symmetrize, simple) in [
            ("plain", false, false),
            ("sym", true, false),
            ("simple", true, true),
        ] {
            build(
                &BuildJob {
                    store: st.clone(),
                    name: name.into(),
                    partitions: 7,
                    symmetrize: Some(symmetrize),
                    simple,
                    ..Default::default()
                },
                &NoProgress,
            )
            .unwrap();
        }
        for (algorithm, arrays) in [
            ("pagerank", &["rank"][..]),
            ("bfs", &["level", "parent"][..]),
            ("wcc", &["component"][..]),
            ("kcore", &["core"][..]),
            ("lpa", &["community"][..]),
        ] {
            let job = |out: &str| {
                check::<RunOptions>(&for_algorithm(serde_json::json!({
                    "store": st,
                    "algorithm": algorithm,
                    "out": tmp.path().join(out),
                    "memory": "256M",
                    "threads": 2,
                    "root": 3,
                    "checkpoint_seconds": 0.0,
                })))
                .unwrap()
                .job()
                .unwrap()
            };
            let whole = job(&format!("{algorithm}-whole"));
            run_ranks(&whole, 2, false, &|_| Ok(()));
            let want = results(whole.out.as_ref().unwrap(), arrays);
            // The first attempt stops after 3 iterations, before the third's checkpoint.
            let cut = job(&format!("{algorithm}-cut"));
            let out = cut.out.clone().unwrap();
            let stop = |it: &crate::algo::Iteration| match it.iteration {
                2 => Err(GridError::Cancelled),
                _ => Ok(()),
            };
            let first = run_ranks(&cut, 2, false, &stop);
            assert!(
                first.iter().all(|r| matches!(r, Err(GridError::Cancelled))),
                "{algorithm}"
            );
            assert!(crate::checkpoint::rank_dir(&out, 1)
                .join("iter-2.part")
                .is_file());
            let seen = Mutex::new(Vec::new());
            let again = run_ranks(&cut, 2, true, &|it| {
                seen.lock().unwrap().push(it.iteration);
                Ok(())
            });
            let summaries: Vec<_> = again.into_iter().map(|r| r.unwrap()).collect();
            let d = summaries[0].dist.as_ref().unwrap();
            for r in &d.ranks {
                assert_eq!(
                    r.checkpoints.resumed_from,
                    Some(2),
                    "{algorithm} rank {}",
                    r.rank
                );
                assert!(r.checkpoints.written > 0 && r.checkpoints.bytes > 0);
            }
            assert_eq!(seen.lock().unwrap().iter().min(), Some(&2), "{algorithm}");
            assert_same(algorithm, &want, &results(&out, arrays), "resumed");
            assert!(!crate::checkpoint::rank_dir(&out, 0).exists());
            // A first attempt in a directory with another attempt's checkpoint starts over.
            run_ranks(&cut, 2, false, &stop);
            let fresh = run_ranks(&cut, 2, false, &|_| Ok(()));
            let d = fresh[0].as_ref().unwrap().dist.clone().unwrap();
            assert!(d.ranks.iter().all(|r| r.checkpoints.resumed_from.is_none()));
        }
    }

    #[test]
    fn ranks_share_one_memory_server() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 5000, 12_000);
        for compression in [Compression::None, Compression::Packed] {
            let grid = compression.name();
            build(
                &BuildJob {
                    store: st.clone(),
                    name: grid.into(),
                    partitions: 7,
                    compression,
                    ..Default::default()
                },
                &NoProgress,
            )
            .unwrap();
            let (addr, stop, serving) = far_server();
            let job = |out: &str, far: Option<&str>| {
                let mut options = serde_json::json!({
                    "store": st,
                    "grid": grid,
                    "algorithm": "pagerank",
                    "out": tmp.path().join(out),
                    "memory": "256M",
                    "threads": 2,
                    "far_ratio": 1.0,
                    "far_connections": 2,
                });
                if let Some(far) = far {
                    options["far"] = far.into();
                }
                check::<RunOptions>(&options).unwrap().job().unwrap()
            };
            let alone = job(&format!("{grid}-alone"), None);
            crate::run::run(&alone, &NoProgress, &mut |_| Ok(())).unwrap();
            let shared = job(&format!("{grid}-shared"), Some(&addr));
            let summaries: Vec<_> = run_ranks(&shared, 2, false, &|_| Ok(()))
                .into_iter()
                .map(|r| r.unwrap())
                .collect();
            stop.stop();
            serving.join().unwrap();
            // Each rank's client is a session of its own on the server, whose segment ids are
            // its own: both placed their blocks there (a compressed grid's as codes) and read
            // them back.
            for s in &summaries {
                assert!(s.far_failure.is_none(), "{:?}", s.far_failure);
                assert_eq!(s.edges_decoded > 0, compression.is_compressed(), "{grid}");
            }
            let d = summaries[0].dist.as_ref().unwrap();
            assert!(d.ranks.iter().all(|r| r.bytes_far > 0 && r.bytes_disk == 0));
            assert_same(
                "pagerank",
                &results(alone.out.as_ref().unwrap(), &["rank"]),
                &results(shared.out.as_ref().unwrap(), &["rank"]),
                &format!("one server, {grid}"),
            );
        }
    }
}
