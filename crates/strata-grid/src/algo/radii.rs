//! Radii estimation (Ligra's and GridGraph's `radii`): breadth-first searches from up to 64
//! sampled sources at once, one bit per source in a word per vertex. Pass t ORs the words of
//! the vertices that changed in pass t - 1 into their out-neighbours'; a vertex's radius is
//! the last pass that changed its word, the largest distance from a sampled source that
//! reaches it: a lower bound on its eccentricity (on a symmetric grid), whose largest value
//! bounds the diameter from below.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::frontier::{Frontier, Step};
use super::{
    chunk_bases, frontier_loop, sample_vertices, Algorithm, Ctx, IterationValue, Output, Values,
    NONE,
};
use crate::error::{GridError, Result};
use crate::stream::Streamer;
use crate::vertex::{Bitmap, U64Array};

/// Radii estimation's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Radii {
    /// sources searched from (at most 64, one bit each)
    #[schemars(range(min = 1, max = 64))]
    pub samples: u32,
    /// the seed of the random choices (the same seed gives the same result)
    pub seed: u64,
}

impl Default for Radii {
    fn default() -> Self {
        Radii {
            samples: 64,
            seed: 0,
        }
    }
}

impl Radii {
    /// The sampled sources of a graph of `n` vertices: `min(samples, n)` distinct vertices
    /// drawn from `seed`, source k taking bit k.
    pub fn sources(&self, n: u64) -> Vec<u64> {
        sample_vertices(self.seed, n, self.samples as u64)
    }
}

/// The sources known to reach `u` reach `v` too; `v` first gains one in pass `pass`.
struct Spread<'a> {
    /// The sources known to reach each vertex as of the previous pass.
    seen: &'a U64Array,
    /// What this pass adds to them.
    seen_next: &'a U64Array,
    radius: &'a U64Array,
    pass: AtomicU64,
}

impl Step for Spread<'_> {
    #[inline]
    fn carry(&self, u: usize, v: usize, _: f32, owns_dst: bool) -> bool {
        let new = self.seen.get(u) & !self.seen_next.get(v);
        if new == 0 {
            return false;
        }
        let before = if owns_dst {
            let before = self.seen_next.get(v);
            self.seen_next.set(v, before | new);
            before
        } else {
            self.seen_next.or_shared(v, new)
        };
        before | new != before
    }

    /// Counted once a pass: the pass in which `v` is first activated is its radius so far.
    #[inline]
    fn activate(&self, next: &Bitmap, v: usize) -> bool {
        let first = next.set_new(v);
        if first {
            self.radius.set(v, self.pass.load(Relaxed));
        }
        first
    }
}

impl Algorithm for Radii {
    const NAME: &'static str = "radii";
    const ABOUT: &'static str = "radii estimation by multi-source BFS from --samples sources";
    const ARRAYS: &'static [&'static str] = &["radius"];
    const VALUE: IterationValue = IterationValue::Count("changed");

    /// Two source words and the radius (u64 each) and two bitmaps.
    fn vertex_bytes(&self) -> u64 {
        25
    }

    fn validate(&self) -> Result<()> {
        if !(1..=64).contains(&self.samples) {
            return Err(GridError::config(
                "samples",
                format!("must be in 1..=64, got {}", self.samples),
            ));
        }
        Ok(())
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let sources = self.sources(n as u64);
        let seen = U64Array::filled(s.vertex(), n, 0)?;
        let seen_next = U64Array::filled(s.vertex(), n, 0)?;
        let radius = U64Array::filled(s.vertex(), n, NONE)?;
        let (frontier, next) = (Bitmap::new(n), Bitmap::new(n));
        for (k, &v) in sources.iter().enumerate() {
            seen.set(v as usize, 1 << k);
            seen_next.set(v as usize, 1 << k);
            radius.set(v as usize, 0);
            frontier.set(v as usize);
        }
        let kernel = Frontier {
            frontier: &frontier,
            next: &next,
            base: &base,
            step: Spread {
                seen: &seen,
                seen_next: &seen_next,
                radius: &radius,
                pass: AtomicU64::new(1),
            },
        };
        // Before each pass, what the last one added becomes what the frontier passes on.
        let iterations = frontier_loop(
            s,
            ctx,
            &frontier,
            &next,
            &kernel,
            &[&seen_next, &radius],
            &[&seen, &seen_next, &radius],
            |it| {
                kernel.step.pass.store(it as u64 + 1, Relaxed);
                (0..n)
                    .filter(|&v| frontier.get(v))
                    .for_each(|v| seen.set(v, seen_next.get(v)));
            },
        )?;
        let (reached, largest) = (0..n)
            .map(|v| radius.get(v))
            .filter(|&r| r != NONE)
            .fold((0u64, 0u64), |(c, m), r| (c + 1, m.max(r)));
        let mut summary = serde_json::Map::new();
        summary.insert("sources".into(), sources.into());
        summary.insert("reached".into(), reached.into());
        summary.insert("largest_radius".into(), largest.into());
        Ok(Output {
            arrays: vec![("radius".into(), Values::Ids(radius))],
            summary,
            iterations,
        })
    }
}
