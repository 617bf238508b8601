//! Single-source shortest paths: Bellman-Ford restricted to the vertices whose distance
//! dropped in the previous pass.

use super::{chunk_bases, frontier_loop, Ctx, Output, Values};
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, F64Array};

pub struct Sssp {
    pub root: u64,
}

struct Relax<'a> {
    frontier: &'a Bitmap,
    next: &'a Bitmap,
    dist: &'a F64Array,
    base: &'a [u64],
}

impl EdgeKernel for Relax<'_> {
    fn weighted(&self) -> bool {
        true
    }

    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], weights: &[f32], owns_dst: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let mut relaxed = 0;
        for (&[s, d], &w) in edges.iter().zip(weights) {
            let (u, v) = (sb + s as usize, db + d as usize);
            if !self.frontier.get(u) {
                continue;
            }
            let nd = self.dist.get(u) + w as f64;
            if nd >= self.dist.get(v) {
                continue;
            }
            let lowered = if owns_dst {
                self.dist.set(v, nd);
                true
            } else {
                self.dist.min_shared(v, nd)
            };
            if lowered {
                self.next.set(v);
                relaxed += 1;
            }
        }
        relaxed
    }
}

impl Sssp {
    pub fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        match &s.grid().manifest().weights {
            Some(w) if w.low >= 0.0 => {}
            Some(_) => {
                return Err(GridError::config(
                    "weights",
                    "sssp needs non-negative weights (low >= 0)",
                ))
            }
            None => {
                return Err(GridError::config(
                    "grid",
                    "sssp needs a weighted grid (strata grid build --weights)",
                ))
            }
        }
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let dist = F64Array::filled(s.vertex(), n, f64::INFINITY)?;
        dist.set(self.root as usize, 0.0);
        let (frontier, next) = (Bitmap::new(n), Bitmap::new(n));
        frontier.set(self.root as usize);
        let kernel = Relax {
            frontier: &frontier,
            next: &next,
            dist: &dist,
            base: &base,
        };
        let iterations = frontier_loop(s, ctx, &frontier, &next, &kernel, |_| {})?;
        let reached = (0..n).filter(|&v| dist.get(v).is_finite()).count();
        let mut summary = serde_json::Map::new();
        summary.insert("root".into(), self.root.into());
        summary.insert("reached".into(), reached.into());
        Ok(Output {
            arrays: vec![("distance".into(), Values::F64(dist))],
            summary,
            iterations,
        })
    }
}
