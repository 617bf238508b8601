//! Label propagation communities (Raghavan, Albert and Kumara), in synchronous rounds: each
//! vertex takes the label most frequent among its neighbours' labels of the previous round,
//! keeping its own when it is among the most frequent and taking the largest of them otherwise
//! (the Prec-Max rule that networkx's `label_propagation_communities` applies to a vertex).
//! Labels start as vertex ids; a vertex without neighbours keeps its own. Edge records count
//! with their multiplicity (a parallel edge weighs twice; a self-loop makes a vertex its own
//! neighbour, as in networkx). Rounds stop when no label changes, or after `rounds`.
//!
//! The most frequent label is exact: each round gathers every vertex's neighbour labels
//! ([`gather`](super::gather)) for ranges of vertices whose lists fit the work buffer (a pass
//! per range, reading the blocks of its chunks; one pass when the buffer holds them all) and
//! sorts each list. networkx updates one colour class of a greedy colouring at a time
//! (semi-synchronous), which converges; synchronous rounds can instead oscillate (two
//! neighbours trading labels), which the round limit stops, as GraphX's `maxSteps` does.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::gather::{
    for_each_list, gather, plan_ranges, symmetric_u32, too_big, Lists, VALUE_BYTES, VERTEX_BYTES,
};
use super::{Algorithm, Ctx, Iteration, IterationValue, Output, Values, Work};
use crate::checkpoint::State;
use crate::error::{GridError, Result};
use crate::layout::{GridManifest, Order};
use crate::stream::{PassStats, Streamer};
use crate::vertex::{Bitmap, U64Array};

/// Label propagation's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Lpa {
    /// most rounds (it stops earlier when no label changes)
    #[schemars(range(min = 1))]
    pub rounds: usize,
}

impl Default for Lpa {
    fn default() -> Self {
        Lpa { rounds: 20 }
    }
}

/// The label a vertex labelled `current` takes from its neighbours' labels `list` (sorted in
/// place here): `current` when it is among the most frequent, else the largest of those (the
/// vote of [`strata_graph::order::most_frequent`], which the `community` node order shares).
pub fn most_frequent(list: &mut [u32], current: u64) -> u64 {
    strata_graph::order::most_frequent(list, |l| (l as u64 == current, l))
        .map_or(current, u64::from)
}

impl Algorithm for Lpa {
    const NAME: &'static str = "lpa";
    const ABOUT: &'static str = "label propagation communities, on a symmetric grid";
    const ARRAYS: &'static [&'static str] = &["community"];
    const VALUE: IterationValue = IterationValue::Count("labels changed");

    /// The label, the next label and the degree (u64 each) and a bitmap.
    fn vertex_bytes(&self) -> u64 {
        25
    }

    /// The neighbour labels of a range of vertices: at most all of them (4 B an edge record)
    /// with their offsets.
    fn work(&self, grid: &GridManifest, _threads: usize) -> Option<Work> {
        let minimum = 1 << 20;
        let wanted = grid.num_edges * VALUE_BYTES + grid.num_vertices * VERTEX_BYTES;
        Some(Work {
            minimum,
            wanted: wanted.max(minimum),
            about: "neighbour labels of a vertex range".into(),
        })
    }

    fn needs_symmetric(&self) -> bool {
        true
    }

    fn validate(&self) -> Result<()> {
        if self.rounds == 0 {
            return Err(GridError::config("rounds", "need at least 1"));
        }
        Ok(())
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let m = symmetric_u32(s, "lpa")?;
        let n = m.num_vertices as usize;
        let owned = ctx.owned(n);
        let (capacity, threads) = (s.config().work_bytes, s.config().threads);
        let grid = s.grid().clone();
        let label = U64Array::from_fn(s.vertex(), n, |v| v as u64)?;
        let next = U64Array::filled(s.vertex(), n, 0)?;
        // A list holds the records whose owned end is the vertex: its in-edges in column
        // order, its out-edges in row order.
        let degree = U64Array::filled(s.vertex(), n, 0)?;
        let degrees = match m.order {
            Order::Column => "in_degree",
            Order::Row => "out_degree",
        };
        grid.for_each_degree(degrees, |v, d| degree.set(v, d))?;
        let changed = Bitmap::new(n);
        let ranges = plan_ranges(owned.clone(), |v| degree.get(v), capacity)
            .map_err(|e| too_big("lpa", e, capacity, capacity))?;
        let state = State {
            saved: &[&label],
            whole: &[&label],
            frontier: None,
        };
        let mut round = ctx.resume(&state)?.unwrap_or(0);
        let mut converged = false;
        while round < self.rounds {
            let t0 = Instant::now();
            let mut pass = PassStats::default();
            let moved = AtomicU64::new(0);
            for r in &ranges {
                let lists = Lists::new(r.clone(), |v| degree.get(v));
                let got = gather(
                    s,
                    &lists,
                    |_, other| Some(label.get(other) as u32),
                    ctx.progress,
                )?;
                pass.absorb(&got);
                let (first, mut values) = lists.finish(grid.dir())?;
                for_each_list(r.start, &first, &mut values, threads, |v, list| {
                    let new = most_frequent(list, label.get(v));
                    next.set(v, new);
                    if new != label.get(v) {
                        changed.set(v);
                        moved.fetch_add(1, Relaxed);
                    }
                });
            }
            for v in owned.clone().filter(|&v| changed.get(v)) {
                label.set(v, next.get(v));
            }
            let total = ctx.exchange(Some(&changed), &[&label], moved.into_inner())?;
            changed.fill(false);
            pass.total = total;
            let seconds = t0.elapsed().as_secs_f64();
            ctx.report(Iteration::new(round, pass, n as u64, total as f64, seconds))?;
            round += 1;
            if total == 0 {
                converged = true;
                break;
            }
            ctx.checkpoint(round, &state)?;
        }
        let seen = Bitmap::new(n);
        (0..n).for_each(|v| seen.set(label.get(v) as usize));
        let mut summary = serde_json::Map::new();
        summary.insert("communities".into(), seen.count().into());
        summary.insert("converged".into(), converged.into());
        Ok(Output {
            arrays: vec![("community".into(), Values::Ids(label))],
            summary,
            iterations: round,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::block_codec::Compression;
    use crate::fixtures::{grid, hub_edges, run_alone, shapes, store_of, values, Setting, KINDS};
    use crate::layout::Order;
    use crate::stream::Tier;

    /// Synchronous Prec-Max rounds over the symmetric records of `edges` (both directions of
    /// each edge, a self-loop once), with counts in a hash map: the labels after the rounds
    /// and whether they stopped changing.
    fn brute(n: usize, edges: &[(u64, u64)], rounds: usize) -> (Vec<f64>, bool) {
        let mut nb = vec![Vec::new(); n];
        for &(u, v) in edges {
            nb[v as usize].push(u as usize);
            if u != v {
                nb[u as usize].push(v as usize);
            }
        }
        let mut label: Vec<u64> = (0..n as u64).collect();
        for _ in 0..rounds {
            let next: Vec<u64> = (0..n)
                .map(|v| {
                    let mut count: HashMap<u64, usize> = HashMap::new();
                    nb[v]
                        .iter()
                        .for_each(|&u| *count.entry(label[u]).or_default() += 1);
                    let Some(&top) = count.values().max() else {
                        return label[v];
                    };
                    match count.get(&label[v]) == Some(&top) {
                        true => label[v],
                        false => *count
                            .iter()
                            .filter(|(_, &c)| c == top)
                            .map(|(l, _)| l)
                            .max()
                            .unwrap(),
                    }
                })
                .collect();
            if next == label {
                return (label.iter().map(|&l| l as f64).collect(), true);
            }
            label = next;
        }
        (label.iter().map(|&l| l as f64).collect(), false)
    }

    #[test]
    fn the_most_frequent_label_keeps_its_own_on_a_tie_and_else_takes_the_largest() {
        assert_eq!(most_frequent(&mut [5, 2, 5, 2, 9], 2), 2);
        assert_eq!(most_frequent(&mut [5, 2, 5, 2, 9], 9), 5);
        assert_eq!(most_frequent(&mut [4, 1, 1], 4), 1);
        assert_eq!(most_frequent(&mut [], 7), 7);
        assert_eq!(most_frequent(&mut [3], 3), 3);
    }

    #[test]
    fn rounds_match_brute_force_in_memory_and_in_ranges() {
        let tmp = tempfile::tempdir().unwrap();
        let (k, shape) = shapes();
        for (name, n, edges) in [
            ("hubs", 1500, hub_edges(1500, 4000, 5)),
            ("shapes", k, shape),
        ] {
            let dir = tmp.path().join(name);
            std::fs::create_dir_all(&dir).unwrap();
            let st = store_of(&dir, n, edges.clone());
            for kind @ (order, compression) in KINDS {
                let g = grid(&st, &format!("{order:?}-{compression:?}"), 3, kind, true);
                for (rounds, tier, windowed, work_bytes) in [
                    (30, Tier::Local, false, 1 << 30),
                    (7, Tier::Disk, false, 4 << 10),
                    (30, Tier::Disk, true, 4 << 10),
                ] {
                    let (want, converged) = brute(n as usize, &edges, rounds);
                    let setting = Setting {
                        tier,
                        windowed,
                        work_bytes,
                        scratch: &dir,
                    };
                    let (out, its) = run_alone(&Lpa { rounds }, &g, &setting).unwrap();
                    let what = format!("{name} {order:?} {compression:?} {tier:?} {rounds} rounds");
                    assert_eq!(values(&out, 0), want, "{what}");
                    assert_eq!(out.summary["converged"], converged, "{what}");
                    assert_eq!(its.len(), out.iterations, "{what}");
                    let mut labels = want.clone();
                    labels.sort_by(f64::total_cmp);
                    labels.dedup();
                    assert_eq!(out.summary["communities"], labels.len(), "{what}");
                    if work_bytes < 1 << 20 {
                        // Each round gathers in several passes, together reading every edge
                        // at least once.
                        let edges = crate::grid::Grid::open(&g).unwrap().manifest().num_edges;
                        assert!(its.iter().all(|i| i.pass.edges >= edges), "{what}");
                    }
                }
            }
        }
    }

    #[test]
    fn planted_cliques_become_one_community_each() {
        // Six cliques of 8, each joined to the next by one edge.
        let mut edges = Vec::new();
        for c in 0..6u64 {
            for u in 0..8 {
                for v in u + 1..8 {
                    edges.push((c * 8 + u, c * 8 + v));
                }
            }
            edges.push((c * 8, ((c + 1) % 6) * 8 + 3));
        }
        let tmp = tempfile::tempdir().unwrap();
        let st = store_of(tmp.path(), 48, edges);
        let g = grid(&st, "s", 2, (Order::Column, Compression::None), true);
        let setting = Setting {
            tier: Tier::Local,
            windowed: false,
            work_bytes: 1 << 20,
            scratch: tmp.path(),
        };
        let (out, _) = run_alone(&Lpa::default(), &g, &setting).unwrap();
        let label = values(&out, 0);
        assert_eq!(out.summary["converged"], true);
        assert_eq!(out.summary["communities"], 6);
        for c in 0..6 {
            let clique = &label[c * 8..c * 8 + 8];
            assert!(
                clique.iter().all(|&l| l == clique[0]),
                "clique {c}: {clique:?}"
            );
        }
    }

    #[test]
    fn a_vertex_whose_labels_do_not_fit_is_a_budget_error() {
        let tmp = tempfile::tempdir().unwrap();
        let (n, edges) = shapes();
        let st = store_of(tmp.path(), n, edges);
        let g = grid(&st, "s", 2, (Order::Column, Compression::None), true);
        let setting = Setting {
            tier: Tier::Disk,
            windowed: false,
            work_bytes: 100,
            scratch: tmp.path(),
        };
        let Err(GridError::Budget(msg)) = run_alone(&Lpa::default(), &g, &setting) else {
            panic!("a budget error");
        };
        // The star's centre, 27 leaves.
        assert!(msg.contains("vertex 12's takes 120 B"), "{msg}");
    }
}
