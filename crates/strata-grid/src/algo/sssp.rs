//! Single-source shortest paths: Bellman-Ford restricted to the vertices whose distance
//! dropped in the previous pass.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::frontier::{Frontier, Step};
use super::{
    check_root, chunk_bases, frontier_loop, Algorithm, Ctx, IterationValue, Output, Values,
};
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use crate::vertex::{Bitmap, F64Array};

/// Single-source shortest paths' parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Sssp {
    /// the source vertex
    pub root: u64,
}

/// Bellman-Ford's relaxation: `v` takes the distance through `u` when it is shorter.
struct Relax<'a> {
    dist: &'a F64Array,
}

impl Step for Relax<'_> {
    const WEIGHTED: bool = true;

    #[inline]
    fn carry(&self, u: usize, v: usize, w: f32, owns_dst: bool) -> bool {
        let nd = self.dist.get(u) + w as f64;
        if nd >= self.dist.get(v) {
            return false;
        }
        if owns_dst {
            self.dist.set(v, nd);
            true
        } else {
            self.dist.min_shared(v, nd)
        }
    }
}

impl Algorithm for Sssp {
    const NAME: &'static str = "sssp";
    const ABOUT: &'static str = "single-source shortest paths from --root over the edge weights";
    const ARRAYS: &'static [&'static str] = &["distance"];
    const VALUE: IterationValue = IterationValue::Count("activated");

    /// The distance (f64) and two bitmaps.
    fn vertex_bytes(&self) -> u64 {
        9
    }

    fn needs_weights(&self) -> bool {
        true
    }

    fn check(&self, num_vertices: u64) -> Result<()> {
        check_root(self.root, num_vertices)
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let m = s.grid().manifest();
        if m.weights.is_none() {
            return Err(GridError::config(
                "grid",
                "sssp needs a weighted grid (strata grid build --weighted)",
            ));
        }
        // Bellman-Ford would not end on a negative cycle: refuse negative weights up front.
        if let Some(lowest) = m.lowest_weight().filter(|&w| w < 0.0) {
            return Err(GridError::config(
                "weights",
                format!(
                    "sssp needs non-negative weights; {} holds weights down to {lowest}",
                    s.grid().dir().display()
                ),
            ));
        }
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let dist = F64Array::filled(s.vertex(), n, f64::INFINITY)?;
        dist.set(self.root as usize, 0.0);
        let (frontier, next) = (Bitmap::new(n), Bitmap::new(n));
        frontier.set(self.root as usize);
        let kernel = Frontier {
            frontier: &frontier,
            next: &next,
            base: &base,
            step: Relax { dist: &dist },
        };
        let iterations = frontier_loop(
            s,
            ctx,
            &frontier,
            &next,
            &kernel,
            &[&dist],
            &[&dist],
            |_| {},
        )?;
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
