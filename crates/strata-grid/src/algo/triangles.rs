//! Exact triangle counting by degree ordering (the node-iterator with ranks of Schank and
//! Wagner, as GBBS and Shun and Tangwongsan count): on the degree-oriented adjacency
//! ([`oriented`](super::oriented)), each triangle u < v < w (by rank) is found once, as a
//! common neighbour w of u and v for each v in N+(u): a merge of two sorted lists.
//!
//! Out of core, the counting works like the build, a range at a time: vertex ranges R whose
//! lists fit the work buffer are loaded in turn, and for each the scratch file is read once
//! more from the start; every list N+(u) meets N+(v) for the v of it that fall in R (a run of
//! it, the lists being sorted by id). With the adjacency in memory it takes one sweep.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::gather::{plan_ranges, symmetric_u32, too_big, VALUE_BYTES, VERTEX_BYTES};
use super::oriented::{longest_list_bytes, orient, Oriented, Scratch};
use super::{Algorithm, Ctx, IterationValue, Output, Passes, Values, Work};
use crate::error::Result;
use crate::layout::GridManifest;
use crate::stream::{PassStats, Streamer};
use crate::vertex::U64Array;

/// Triangle counting (no parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Triangles {}

/// How much longer one list must be than the other for the intersection to binary-search the
/// long one for each value of the short one instead of merging them.
const GALLOP: usize = 16;

/// The number of common values of sorted lists `a` and `b` (without repeats), calling
/// `each(i)` with the position in `a` of every one. Merges them without branching on the
/// comparison, or binary-searches the longer for each value of the shorter when it is at
/// least [`GALLOP`] times longer.
#[inline]
fn intersect(a: &[u32], b: &[u32], mut each: impl FnMut(usize)) -> u64 {
    let mut found = 0;
    if a.len() * GALLOP < b.len() {
        let mut lo = 0;
        for (i, &x) in a.iter().enumerate() {
            lo += b[lo..].partition_point(|&y| y < x);
            if lo == b.len() {
                break;
            }
            if b[lo] == x {
                each(i);
                found += 1;
            }
        }
    } else if b.len() * GALLOP < a.len() {
        let mut lo = 0;
        for &x in b {
            lo += a[lo..].partition_point(|&y| y < x);
            if lo == a.len() {
                break;
            }
            if a[lo] == x {
                each(lo);
                found += 1;
            }
        }
    } else {
        let (mut i, mut j) = (0, 0);
        while i < a.len() && j < b.len() {
            let (x, y) = (a[i], b[j]);
            if x == y {
                each(i);
                found += 1;
            }
            i += (x <= y) as usize;
            j += (y <= x) as usize;
        }
    }
    found
}

/// The triangles found at `u`: for each v of `list_u` in `r` (vertex ids), those through the
/// common neighbours w of u and v (`list_of(v)`), each counted once in the total and once for
/// each of its three corners in `counts`. The w's are all in `list_u`: their counts gather in
/// `at_w` (one per entry of `list_u`; zero before and after) and go to `counts` once per w.
fn triangles_at<'l>(
    u: usize,
    list_u: &[u32],
    r: &Range<usize>,
    list_of: impl Fn(usize) -> &'l [u32],
    counts: &U64Array,
    at_w: &mut Vec<u64>,
) -> u64 {
    let from = list_u.partition_point(|&v| (v as usize) < r.start);
    let to = list_u.partition_point(|&v| (v as usize) < r.end);
    at_w.resize(list_u.len(), 0);
    let mut at_u = 0;
    for &v in &list_u[from..to] {
        let found = intersect(list_u, list_of(v as usize), |i| at_w[i] += 1);
        if found > 0 {
            counts.add_shared(v as usize, found);
            at_u += found;
        }
    }
    if at_u > 0 {
        counts.add_shared(u, at_u);
        for (k, c) in at_w.iter_mut().enumerate() {
            if *c > 0 {
                counts.add_shared(list_u[k] as usize, *c);
                *c = 0;
            }
        }
    }
    at_u
}

/// Vertices a thread takes at a time in the sweep over an adjacency in memory.
const SWEEP_BLOCK: usize = 1024;

/// Counts every triangle of the adjacency `all` in memory (lists laid out by `start`) on
/// `threads` threads; returns the total.
fn count_in_memory(
    all: &[u32],
    start: &U64Array,
    n: usize,
    counts: &U64Array,
    threads: usize,
) -> u64 {
    let list = |v: usize| &all[start.get(v) as usize..start.get(v + 1) as usize];
    let (next, total) = (AtomicUsize::new(0), AtomicU64::new(0));
    std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            scope.spawn(|| loop {
                let first = next.fetch_add(SWEEP_BLOCK, Relaxed);
                if first >= n {
                    return;
                }
                let (mut found, mut at_w) = (0, Vec::new());
                for u in first..(first + SWEEP_BLOCK).min(n) {
                    found += triangles_at(u, list(u), &(0..n), list, counts, &mut at_w);
                }
                total.fetch_add(found, Relaxed);
            });
        }
    });
    total.into_inner()
}

/// Counts the triangles whose middle vertex (v, by rank) falls in `r`, with `r`'s lists
/// loaded and every list read from `scratch` by `threads` threads, each a run of vertices
/// of about the same number of entries. Returns the triangles found and the bytes read.
fn count_range(
    scratch: &Scratch,
    start: &U64Array,
    n: usize,
    r: Range<usize>,
    counts: &U64Array,
    threads: usize,
) -> Result<(u64, u64)> {
    let base = start.get(r.start);
    let loaded = {
        let mut out = vec![0u32; (start.get(r.end) - base) as usize];
        scratch.reader(base..start.get(r.end)).fill(&mut out)?;
        out
    };
    let list_of =
        |v: usize| &loaded[(start.get(v) - base) as usize..(start.get(v + 1) - base) as usize];
    let entries = start.get(n);
    let parts = threads.max(1) as u64;
    let cuts: Vec<usize> = (0..=parts)
        .map(|t| {
            let target = entries * t / parts;
            // The first vertex whose list starts at or after the target.
            let (mut lo, mut hi) = (0usize, n);
            while lo < hi {
                let mid = (lo + hi) / 2;
                if start.get(mid) < target {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            if t == parts {
                n
            } else {
                lo
            }
        })
        .collect();
    let results: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = cuts
            .windows(2)
            .map(|w| {
                let (first, last) = (w[0], w[1]);
                let list_of = &list_of;
                let r = &r;
                scope.spawn(move || -> Result<u64> {
                    let mut reader = scratch.reader(start.get(first)..start.get(last));
                    let (mut list, mut at_w) = (Vec::new(), Vec::new());
                    let mut found = 0;
                    for u in first..last {
                        list.resize((start.get(u + 1) - start.get(u)) as usize, 0);
                        reader.fill(&mut list)?;
                        found += triangles_at(u, &list, r, list_of, counts, &mut at_w);
                    }
                    Ok(found)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a counting thread"))
            .collect()
    });
    let mut found = 0;
    for r in results {
        found += r?;
    }
    Ok((found, (entries + loaded.len() as u64) * VALUE_BYTES))
}

impl Algorithm for Triangles {
    const NAME: &'static str = "triangles";
    const ABOUT: &'static str = "exact triangle counts by degree ordering, on a symmetric grid";
    const ARRAYS: &'static [&'static str] = &["triangles"];
    const VALUE: IterationValue = IterationValue::Count("kept or found");

    /// Degree, list offset and triangle count (u64 each).
    fn vertex_bytes(&self) -> u64 {
        24
    }

    /// The build's ranges and the scratch file's writer, or the counting's ranges and its
    /// threads' readers (each with the longest list); at most the whole oriented adjacency
    /// (half the symmetric grid's records) with its offsets. The least lets the I/O buffers
    /// shrink to a page.
    fn work(&self, grid: &GridManifest, threads: usize) -> Option<Work> {
        let longest = longest_list_bytes(grid.num_edges) + VERTEX_BYTES;
        let minimum =
            4 * (threads as u64 * (2 * strata_io::ALIGN as u64 + longest) + longest).max(64 << 10);
        let wanted = grid.num_edges.div_ceil(2) * VALUE_BYTES + grid.num_vertices * VERTEX_BYTES;
        Some(Work {
            minimum,
            wanted: wanted.max(minimum),
            about: "oriented adjacency of a vertex range".into(),
        })
    }

    fn needs_symmetric(&self) -> bool {
        true
    }

    /// Its counts go to any vertex of a triangle, which another rank may own.
    fn distributed(&self) -> bool {
        false
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let m = symmetric_u32(s, "triangles")?;
        let n = m.num_vertices as usize;
        let (capacity, threads) = (s.config().work_bytes, s.config().threads);
        let degree = U64Array::filled(s.vertex(), n, 0)?;
        s.grid()
            .for_each_degree("out_degree", |v, d| degree.set(v, d))?;
        let start = U64Array::filled(s.vertex(), n + 1, 0)?;
        let counts = U64Array::filled(s.vertex(), n, 0)?;
        let mut passes = Passes::new(ctx);
        let oriented = orient(s, &mut passes, &degree, &start, capacity)?;
        let build_passes = passes.done;
        let entries = start.get(n);
        let mut triangles = 0;
        match &oriented {
            Oriented::Memory(all) => {
                let t0 = Instant::now();
                let found = count_in_memory(all, &start, n, &counts, threads);
                triangles += found;
                let pass = PassStats {
                    edges: entries,
                    bytes_local: entries * VALUE_BYTES,
                    total: found,
                    seconds: t0.elapsed().as_secs_f64(),
                    ..PassStats::default()
                };
                passes.report(pass, n as u64)?;
            }
            Oriented::File(scratch) => {
                let longest = (0..n).map(|v| start.get(v + 1) - start.get(v)).max();
                let held = 2 * scratch.chunk() + longest.unwrap_or(0) * VALUE_BYTES;
                let room = capacity.saturating_sub(threads as u64 * held);
                let ranges = plan_ranges(0..n, |v| start.get(v + 1) - start.get(v), room)
                    .map_err(|e| too_big("triangles", e, room, capacity))?;
                for r in ranges {
                    let t0 = Instant::now();
                    let len = r.len() as u64;
                    let (found, bytes) = count_range(scratch, &start, n, r, &counts, threads)?;
                    triangles += found;
                    let pass = PassStats {
                        edges: entries,
                        bytes_disk: bytes,
                        total: found,
                        seconds: t0.elapsed().as_secs_f64(),
                        ..PassStats::default()
                    };
                    passes.report(pass, len)?;
                }
            }
        }
        let mut summary = serde_json::Map::new();
        summary.insert("triangles".into(), triangles.into());
        summary.insert("oriented_edges".into(), entries.into());
        summary.insert(
            "adjacency".into(),
            match oriented {
                Oriented::Memory(_) => "memory",
                Oriented::File(_) => "scratch file",
            }
            .into(),
        );
        summary.insert("build_passes".into(), build_passes.into());
        summary.insert("count_passes".into(), (passes.done - build_passes).into());
        Ok(Output {
            arrays: vec![("triangles".into(), Values::Ids(counts))],
            summary,
            iterations: passes.done,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::block_codec::Compression;
    use crate::error::GridError;
    use crate::fixtures::{grid, hub_edges, run_alone, shapes, store_of, values, Setting, KINDS};
    use crate::layout::Order;
    use crate::stream::Tier;

    /// Triangles through each vertex of the simple undirected graph under `edges` (self-loops
    /// and repeats dropped), by trying every pair of its neighbours.
    fn brute(n: usize, edges: &[(u64, u64)]) -> Vec<f64> {
        let mut adj = vec![BTreeSet::new(); n];
        for &(u, v) in edges.iter().filter(|(u, v)| u != v) {
            adj[u as usize].insert(v as usize);
            adj[v as usize].insert(u as usize);
        }
        (0..n)
            .map(|v| {
                let nb: Vec<usize> = adj[v].iter().copied().collect();
                let mut c = 0;
                for a in 0..nb.len() {
                    for b in a + 1..nb.len() {
                        c += adj[nb[a]].contains(&nb[b]) as u64;
                    }
                }
                c as f64
            })
            .collect()
    }

    #[test]
    fn intersections_call_back_with_each_common_position_merging_or_searching() {
        let mut seen = Vec::new();
        assert_eq!(
            intersect(&[1, 3, 5, 9], &[2, 3, 9, 10], |i| seen.push(i)),
            2
        );
        assert_eq!(seen, [1, 3]);
        assert_eq!(intersect(&[], &[1], |_| ()), 0);
        // One list many times the other, either way round: the positions are in the first.
        let long: Vec<u32> = (0..400).map(|x| x * 3).collect();
        let short = [0, 4, 9, 600, 1197, 1200];
        for (a, b) in [(&short[..], &long[..]), (&long[..], &short[..])] {
            let mut at = Vec::new();
            assert_eq!(intersect(a, b, |i| at.push(a[i])), 4);
            assert_eq!(at, [0, 9, 600, 1197]);
        }
    }

    #[test]
    fn counts_match_brute_force_in_memory_and_from_a_scratch_file() {
        let tmp = tempfile::tempdir().unwrap();
        let (k, shape) = shapes();
        for (name, n, edges) in [
            ("hubs", 2000, hub_edges(2000, 20_000, 3)),
            ("shapes", k, shape),
        ] {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let st = store_of(&dir, n, edges.clone());
            let want = brute(n as usize, &edges);
            let total = want.iter().sum::<f64>() / 3.0;
            assert!(total > 100.0, "{name}: a graph with triangles");
            for kind @ (order, compression) in KINDS {
                let g = grid(&st, &format!("{order:?}-{compression:?}"), 4, kind, true);
                for (tier, windowed, work_bytes) in [
                    (Tier::Local, false, 1 << 30),
                    (Tier::Disk, false, 40 << 10),
                    (Tier::Disk, true, 40 << 10),
                ] {
                    let setting = Setting {
                        tier,
                        windowed,
                        work_bytes,
                        scratch: &dir,
                    };
                    let (out, its) = run_alone(&Triangles {}, &g, &setting).unwrap();
                    let what =
                        format!("{name} {order:?} {compression:?} {tier:?} windowed {windowed}");
                    assert_eq!(values(&out, 0), want, "{what}");
                    assert_eq!(out.summary["triangles"], total as u64, "{what}");
                    let built = out.summary["build_passes"].as_u64().unwrap() as usize;
                    let found: u64 = its.iter().skip(built).map(|i| i.value as u64).sum();
                    assert_eq!(found, total as u64, "{what}");
                    let adjacency = out.summary["adjacency"].as_str().unwrap();
                    if work_bytes == 1 << 30 {
                        assert_eq!(adjacency, "memory", "{what}");
                        assert_eq!(its.len(), 3, "{what}: count, gather and sweep");
                    } else if name == "hubs" {
                        // The build and the count each take several ranges.
                        assert_eq!(adjacency, "scratch file", "{what}");
                        assert!(out.summary["build_passes"].as_u64().unwrap() > 3, "{what}");
                        assert!(out.summary["count_passes"].as_u64().unwrap() > 2, "{what}");
                        assert!(its.last().unwrap().pass.bytes_disk > 0, "{what}");
                    }
                }
            }
        }
        // Scratch files are unlinked as they are made.
        let left: Vec<_> = std::fs::read_dir(tmp.path().join("hubs"))
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".scratch"))
            .collect();
        assert!(left.is_empty());
    }

    #[test]
    fn a_work_buffer_too_small_for_a_list_is_a_budget_error() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store_of(tmp.path(), 2000, hub_edges(2000, 20_000, 3));
        let g = grid(&st, "s", 4, (Order::Column, Compression::None), true);
        let setting = Setting {
            tier: Tier::Disk,
            windowed: false,
            work_bytes: 9 << 10,
            scratch: tmp.path(),
        };
        let Err(GridError::Budget(msg)) = run_alone(&Triangles {}, &g, &setting) else {
            panic!("a budget error");
        };
        assert!(
            msg.starts_with("triangles: the work buffer of 9.00 KiB leaves"),
            "{msg}"
        );
    }
}
