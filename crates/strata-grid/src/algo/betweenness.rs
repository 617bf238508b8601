//! Approximate betweenness centrality from sampled sources (Brandes and Pich; Bader et al.):
//! Brandes' dependency accumulation from `sources` vertices drawn with `seed` (every vertex
//! when 0: exact), scaled as networkx's `betweenness_centrality(k=...)` scales it.
//!
//! Sources go in batches of `batch`, each source a slot of every vertex's row (its BFS level,
//! its shortest-path count sigma and its dependency delta), as `radii` runs 64 BFSs in one
//! word. A batch takes level-synchronous forward passes (pass t extends each source's search
//! from the vertices at level t - 1: a vertex reached at level t adds its predecessors'
//! sigma), then backward passes from the deepest level (pass t adds
//! sigma(u)/sigma(v) (1 + delta(v)) to delta(u) along every edge u -> v from level t - 1 to
//! t); then each vertex adds its deltas, its own source's aside, to its centrality. Both kinds
//! of pass read only the blocks of source chunks holding a vertex at level t - 1.
//!
//! A symmetric grid is an undirected graph, any other a directed one. Parallel edges count as
//! distinct shortest paths (networkx counts a neighbour once).

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{chunk_bases, sample_vertices, Algorithm, Ctx, IterationValue, Output, Passes, Values};
use crate::error::{GridError, Result};
use crate::layout::Order;
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, F64Array, U32Array, U64Array};

/// Betweenness' parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Betweenness {
    /// vertices sampled as sources (0: every vertex, exact)
    pub sources: u64,
    /// sources searched at once, 1 to 64 (each adds 20 B a vertex of vertex data)
    #[schemars(range(min = 1, max = 64))]
    pub batch: u32,
    /// the seed of the random choices (the same seed gives the same result)
    pub seed: u64,
    /// divide by the pairs of vertices (networkx's normalized=True); off: networkx's normalized=False
    pub normalized: bool,
}

impl Default for Betweenness {
    fn default() -> Self {
        Betweenness {
            sources: 64,
            batch: 16,
            seed: 0,
            normalized: true,
        }
    }
}

/// The level of a vertex a source has not reached.
const UNSET: u32 = u32::MAX;

impl Betweenness {
    /// The sources on a graph of `n` vertices: every vertex when `sources` is 0 or at least
    /// `n`, else `sources` distinct vertices drawn from `seed`.
    pub fn pick(&self, n: u64) -> Vec<u64> {
        match self.sources {
            k if k == 0 || k >= n => (0..n).collect(),
            k => sample_vertices(self.seed, n, k),
        }
    }

    /// networkx's factors (`_rescale`, endpoints left out) for a source and for any other
    /// vertex, from `k` sources on `n` vertices: the dependencies of k sources stand for the
    /// n - 1 that could reach a vertex, and an undirected pair is counted from both ends.
    pub fn scale(&self, n: u64, k: u64, directed: bool) -> (f64, f64) {
        let pairs = n as f64 - 1.0;
        if n < 3 {
            return (1.0, 1.0);
        }
        let k = k as f64;
        let twice = if directed { 1.0 } else { 2.0 };
        // A source has no dependency on itself: k - 1 sources stand for it.
        let (own, other) = match self.normalized {
            true => (1.0 / ((k - 1.0) * (pairs - 1.0)), 1.0 / (k * (pairs - 1.0))),
            false => (pairs / ((k - 1.0) * twice), pairs / (k * twice)),
        };
        (if k > 1.0 { own } else { f64::NAN }, other)
    }
}

/// A batch's rows: slot b of vertex v at `v * width + b`.
struct Rows<'a> {
    width: usize,
    level: &'a U32Array,
    sigma: &'a F64Array,
    delta: &'a F64Array,
    /// The slots of each vertex at the level a pass starts from.
    front: &'a U64Array,
    base: &'a [u64],
    /// The level a pass reaches.
    t: AtomicU32,
}

impl Rows<'_> {
    #[inline]
    fn ends(&self, i: u32, j: u32, s: u32, d: u32) -> (usize, usize) {
        (
            self.base[i as usize] as usize + s as usize,
            self.base[j as usize] as usize + d as usize,
        )
    }
}

/// Slot numbers of the set bits of `mask`.
#[inline]
fn slots(mut mask: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (mask != 0).then(|| {
            let b = mask.trailing_zeros() as usize;
            mask &= mask - 1;
            b
        })
    })
}

/// A forward pass: every edge from a vertex at level t - 1 of a source reaches its
/// destination at level t (if no shorter path did), adding the source vertex's sigma.
struct Forward<'a> {
    rows: &'a Rows<'a>,
    /// The slots each vertex was reached in by this pass.
    next: &'a U64Array,
    reached: &'a Bitmap,
}

impl EdgeKernel for Forward<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], owns_dst: bool) -> u64 {
        let r = self.rows;
        let t = r.t.load(Relaxed);
        let mut claimed = 0;
        for &[s, d] in edges {
            let (u, v) = r.ends(i, j, s, d);
            let mask = r.front.get(u);
            if mask == 0 {
                continue;
            }
            let mut new = 0u64;
            for b in slots(mask) {
                let (iu, iv) = (u * r.width + b, v * r.width + b);
                if r.level.get(iv) == UNSET {
                    let won = if owns_dst {
                        r.level.set(iv, t);
                        true
                    } else {
                        r.level.cas_shared(iv, UNSET, t)
                    };
                    if won {
                        new |= 1 << b;
                        claimed += 1;
                    }
                }
                if r.level.get(iv) == t {
                    match owns_dst {
                        true => r.sigma.add_owned(iv, r.sigma.get(iu)),
                        false => r.sigma.add_shared(iv, r.sigma.get(iu)),
                    }
                }
            }
            if new != 0 {
                match owns_dst {
                    true => self.next.set(v, self.next.get(v) | new),
                    false => {
                        self.next.or_shared(v, new);
                    }
                }
                self.reached.set(v);
            }
        }
        claimed
    }
}

/// A backward pass: every edge from a vertex at level t - 1 of a source to one at level t
/// adds sigma(u)/sigma(v) (1 + delta(v)) to the delta of the end at t - 1. That end is the
/// record's source, owned in row order only; on a symmetric grid in column order the pass
/// reads each edge's reverse record instead (`reversed`: source at t, destination at t - 1),
/// so the end it writes is the owned destination.
struct Backward<'a> {
    rows: &'a Rows<'a>,
    reversed: bool,
}

impl EdgeKernel for Backward<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], owns_dst: bool) -> u64 {
        let r = self.rows;
        let t = r.t.load(Relaxed);
        let mut added = 0;
        for &[s, d] in edges {
            let (u, v) = r.ends(i, j, s, d);
            let mask = r.front.get(u);
            if mask == 0 {
                continue;
            }
            // The front holds the slots where the record's source is at t (reversed: it is
            // the upper end) or at t - 1 (it is the lower end); the destination must be at
            // the other level.
            let want = if self.reversed { t - 1 } else { t };
            for b in slots(mask) {
                let (iu, iv) = (u * r.width + b, v * r.width + b);
                if r.level.get(iv) != want {
                    continue;
                }
                let (lower, upper) = if self.reversed { (iv, iu) } else { (iu, iv) };
                let c = r.sigma.get(lower) / r.sigma.get(upper) * (1.0 + r.delta.get(upper));
                match self.reversed || !owns_dst {
                    true => r.delta.add_owned(lower, c),
                    false => r.delta.add_shared(lower, c),
                }
                added += 1;
            }
        }
        added
    }
}

impl Algorithm for Betweenness {
    const NAME: &'static str = "betweenness";
    const ABOUT: &'static str = "approximate betweenness centrality from --sources sampled sources";
    const ARRAYS: &'static [&'static str] = &["betweenness"];
    const VALUE: IterationValue = IterationValue::Count("reached or added");

    /// Per source of a batch a level (u32), sigma and delta (f64); the slot masks of two
    /// levels (u64 each), the centrality (f64) and two bitmaps.
    fn vertex_bytes(&self) -> u64 {
        20 * self.batch as u64 + 25
    }

    /// Its backward passes write to the source end of the edges, which another rank owns.
    fn distributed(&self) -> bool {
        false
    }

    fn validate(&self) -> Result<()> {
        if !(1..=64).contains(&self.batch) {
            return Err(GridError::config(
                "batch",
                format!("must be in 1..=64, got {}", self.batch),
            ));
        }
        Ok(())
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let m = s.grid().manifest().clone();
        let n = m.num_vertices as usize;
        let sources = self.pick(n as u64);
        let width = (self.batch as usize).min(sources.len()).max(1);
        let base = chunk_bases(s);
        let level = U32Array::filled(s.vertex(), n * width, UNSET)?;
        let sigma = F64Array::filled(s.vertex(), n * width, 0.0)?;
        let delta = F64Array::filled(s.vertex(), n * width, 0.0)?;
        let front = U64Array::filled(s.vertex(), n, 0)?;
        let next = U64Array::filled(s.vertex(), n, 0)?;
        let centrality = F64Array::filled(s.vertex(), n, 0.0)?;
        let (active, reached) = (Bitmap::new(n), Bitmap::new(n));
        let rows = Rows {
            width,
            level: &level,
            sigma: &sigma,
            delta: &delta,
            front: &front,
            base: &base,
            t: AtomicU32::new(0),
        };
        let reversed = m.symmetric && m.order == Order::Column;
        let mut passes = Passes::new(ctx);
        for batch in sources.chunks(width) {
            for (b, &x) in batch.iter().enumerate() {
                let at = x as usize * width + b;
                level.set(at, 0);
                sigma.set(at, 1.0);
                front.set(x as usize, front.get(x as usize) | 1 << b);
                active.set(x as usize);
            }
            // Forward, a level a pass, until no source reaches a new vertex.
            let mut depth = 0;
            loop {
                rows.t.store(depth + 1, Relaxed);
                let kernel = Forward {
                    rows: &rows,
                    next: &next,
                    reached: &reached,
                };
                let count = active.count();
                let claimed = passes.pass(s, &kernel, Some(&active), count)?;
                if claimed == 0 {
                    break;
                }
                depth += 1;
                s.par_chunks(|c| {
                    for v in base[c as usize] as usize..base[c as usize + 1] as usize {
                        front.set(v, next.get(v));
                        next.set(v, 0);
                    }
                });
                active.take_from(&reached);
            }
            // Backward, from the deepest level to the sources: the active sources of the
            // records are the vertices at level t - 1, or at t when reversed.
            for t in (1..=depth).rev() {
                active.fill(false);
                let from = if reversed { t } else { t - 1 };
                s.par_chunks(|c| {
                    for v in base[c as usize] as usize..base[c as usize + 1] as usize {
                        let row = v * width..(v + 1) * width;
                        let mask = row
                            .enumerate()
                            .filter(|&(_, k)| level.get(k) == from)
                            .fold(0u64, |m, (b, _)| m | 1 << b);
                        front.set(v, mask);
                        if mask != 0 {
                            active.set(v);
                        }
                    }
                });
                rows.t.store(t, Relaxed);
                let count = active.count();
                let kernel = Backward {
                    rows: &rows,
                    reversed,
                };
                passes.pass(s, &kernel, Some(&active), count)?;
            }
            // Each vertex takes its dependencies, its own source's aside; the rows clear.
            s.par_chunks(|c| {
                for v in base[c as usize] as usize..base[c as usize + 1] as usize {
                    let mut sum = 0.0;
                    for (b, &x) in batch.iter().enumerate() {
                        let k = v * width + b;
                        if x as usize != v && level.get(k) != UNSET {
                            sum += delta.get(k);
                        }
                        level.set(k, UNSET);
                        sigma.set(k, 0.0);
                        delta.set(k, 0.0);
                    }
                    centrality.set(v, centrality.get(v) + sum);
                    front.set(v, 0);
                    next.set(v, 0);
                }
            });
            active.fill(false);
            reached.fill(false);
        }
        let (own, other) = self.scale(n as u64, sources.len() as u64, !m.symmetric);
        let is_source = Bitmap::new(n);
        sources.iter().for_each(|&x| is_source.set(x as usize));
        for v in 0..n {
            let f = if is_source.get(v) { own } else { other };
            centrality.set(v, centrality.get(v) * f);
        }
        let mut summary = serde_json::Map::new();
        if (sources.len() as u64) < n as u64 {
            summary.insert("sources".into(), sources.clone().into());
        }
        summary.insert("batches".into(), sources.len().div_ceil(width).into());
        Ok(Output {
            arrays: vec![("betweenness".into(), Values::F64(centrality))],
            summary,
            iterations: passes.done,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::fixtures::{grid, hub_edges, run_alone, shapes, store_of, values, Setting, KINDS};
    use crate::stream::Tier;

    /// Brandes from each of `sources` over the records of `edges` (both ways when
    /// `undirected`; parallel records each a path), the sums scaled as `algo` scales them.
    fn brute(
        n: usize,
        edges: &[(u64, u64)],
        undirected: bool,
        sources: &[u64],
        algo: &Betweenness,
    ) -> Vec<f64> {
        let mut adj = vec![Vec::new(); n];
        for &(u, v) in edges {
            adj[u as usize].push(v as usize);
            if undirected && u != v {
                adj[v as usize].push(u as usize);
            }
        }
        let mut bc = vec![0.0; n];
        for &x in sources {
            let (mut dist, mut sigma) = (vec![usize::MAX; n], vec![0.0; n]);
            let mut order = Vec::new();
            dist[x as usize] = 0;
            sigma[x as usize] = 1.0;
            let mut q = VecDeque::from([x as usize]);
            while let Some(u) = q.pop_front() {
                order.push(u);
                for &v in &adj[u] {
                    if dist[v] == usize::MAX {
                        dist[v] = dist[u] + 1;
                        q.push_back(v);
                    }
                    if dist[v] == dist[u] + 1 {
                        sigma[v] += sigma[u];
                    }
                }
            }
            let mut delta = vec![0.0; n];
            for &w in order.iter().rev() {
                for &v in &adj[w] {
                    if dist[v] == dist[w] + 1 {
                        delta[w] += sigma[w] / sigma[v] * (1.0 + delta[v]);
                    }
                }
                if w != x as usize {
                    bc[w] += delta[w];
                }
            }
        }
        let (own, other) = algo.scale(n as u64, sources.len() as u64, !undirected);
        (0..n)
            .map(|v| {
                bc[v]
                    * if sources.contains(&(v as u64)) {
                        own
                    } else {
                        other
                    }
            })
            .collect()
    }

    fn close(got: &[f64], want: &[f64], what: &str) {
        for (v, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-9 * w.abs().max(1e-9),
                "{what}: vertex {v}: {g} vs {w}"
            );
        }
    }

    #[test]
    fn networkx_scales_sampled_and_exact_sums() {
        let b = |normalized| Betweenness {
            normalized,
            ..Betweenness::default()
        };
        // networkx 3.6 `_rescale` with endpoints=False on 10 vertices (N = 9 pairs' ends):
        // 4 sources: a source by 1/(3*8), another vertex by 1/(4*8); unnormalized, 9/(3*2)
        // and 9/(4*2) undirected.
        assert_eq!(b(true).scale(10, 4, true), (1.0 / 24.0, 1.0 / 32.0));
        assert_eq!(b(false).scale(10, 4, false), (1.5, 9.0 / 8.0));
        assert_eq!(b(false).scale(10, 4, true), (3.0, 9.0 / 4.0));
        // Every vertex a source: 1/(9*8), or 1/2 undirected.
        assert_eq!(b(true).scale(10, 10, false).0, 1.0 / 72.0);
        assert_eq!(b(false).scale(10, 10, false).0, 0.5);
        assert!(b(true).scale(10, 1, true).0.is_nan());
        assert_eq!(b(true).scale(2, 1, true), (1.0, 1.0));
    }

    #[test]
    fn sampled_and_exact_match_brandes_in_every_setting() {
        let tmp = tempfile::tempdir().unwrap();
        let (k, shape) = shapes();
        for (name, n, edges) in [("hubs", 400, hub_edges(400, 1200, 7)), ("shapes", k, shape)] {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let st = store_of(&dir, n, edges.clone());
            for symmetric in [false, true] {
                for kind @ (order, compression) in KINDS {
                    let name_of = format!("{order:?}-{compression:?}-{symmetric}");
                    let g = grid(&st, &name_of, 3, kind, symmetric);
                    for (algo, tier, windowed) in [
                        (
                            Betweenness {
                                sources: 0,
                                batch: 64,
                                ..Default::default()
                            },
                            Tier::Local,
                            false,
                        ),
                        (
                            Betweenness {
                                sources: 7,
                                batch: 3,
                                seed: 4,
                                normalized: false,
                            },
                            Tier::Disk,
                            false,
                        ),
                        (
                            Betweenness {
                                sources: 20,
                                batch: 8,
                                seed: 1,
                                normalized: true,
                            },
                            Tier::Disk,
                            true,
                        ),
                    ] {
                        let sources = algo.pick(n);
                        let want = brute(n as usize, &edges, symmetric, &sources, &algo);
                        let setting = Setting {
                            tier,
                            windowed,
                            work_bytes: 0,
                            scratch: &dir,
                        };
                        let (out, its) = run_alone(&algo, &g, &setting).unwrap();
                        let what = format!(
                            "{name} symmetric {symmetric} {order:?} {compression:?} {algo:?}"
                        );
                        close(&values(&out, 0), &want, &what);
                        let batches = sources.len().div_ceil(algo.batch as usize);
                        assert_eq!(out.summary["batches"], batches, "{what}");
                        assert!(its.len() >= 2 * batches, "{what}");
                        if algo.sources > 0 {
                            let listed: Vec<u64> =
                                serde_json::from_value(out.summary["sources"].clone()).unwrap();
                            assert_eq!(listed, sources, "{what}");
                        }
                    }
                }
            }
        }
    }
}
