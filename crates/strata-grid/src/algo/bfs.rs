//! Breadth-first search: level by level, a frontier bitmap selects the blocks to stream.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::frontier::{Frontier, Step};
use super::{
    check_root, chunk_bases, frontier_loop, Algorithm, Ctx, IterationValue, Output, Values, NONE,
};
use crate::error::Result;
use crate::stream::Streamer;
use crate::vertex::{Bitmap, U64Array};

/// Breadth-first search's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Bfs {
    /// the source vertex
    pub root: u64,
}

/// A vertex reached for the first time takes the frontier vertex as its parent, at `depth`.
struct Claim<'a> {
    parent: &'a U64Array,
    level: &'a U64Array,
    depth: AtomicU64,
}

impl Step for Claim<'_> {
    #[inline]
    fn carry(&self, u: usize, v: usize, _: f32, owns_dst: bool) -> bool {
        if self.parent.get(v) != NONE {
            return false;
        }
        let claimed = if owns_dst {
            self.parent.set(v, u as u64);
            true
        } else {
            self.parent.cas_shared(v, NONE, u as u64)
        };
        if claimed {
            self.level.set(v, self.depth.load(Relaxed));
        }
        claimed
    }
}

impl Algorithm for Bfs {
    const NAME: &'static str = "bfs";
    const ABOUT: &'static str = "breadth-first search from --root";
    const ARRAYS: &'static [&'static str] = &["level", "parent"];
    const VALUE: IterationValue = IterationValue::Count("activated");

    /// Parent and level (u64 each) and two bitmaps.
    fn vertex_bytes(&self) -> u64 {
        17
    }

    fn check(&self, num_vertices: u64) -> Result<()> {
        check_root(self.root, num_vertices)
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let parent = U64Array::filled(s.vertex(), n, NONE)?;
        let level = U64Array::filled(s.vertex(), n, NONE)?;
        let root = self.root as usize;
        parent.set(root, self.root);
        level.set(root, 0);
        let (frontier, next) = (Bitmap::new(n), Bitmap::new(n));
        frontier.set(root);
        let kernel = Frontier {
            frontier: &frontier,
            next: &next,
            base: &base,
            step: Claim {
                parent: &parent,
                level: &level,
                depth: AtomicU64::new(1),
            },
        };
        // Only the frontier travels between ranks; each rank's levels and parents are
        // gathered once at the end.
        let iterations = frontier_loop(
            s,
            ctx,
            &frontier,
            &next,
            &kernel,
            &[],
            &[&level, &parent],
            |it| kernel.step.depth.store(it as u64 + 1, Relaxed),
        )?;
        ctx.gather(&[&level, &parent])?;
        let (reached, depth) = (0..n)
            .map(|v| level.get(v))
            .filter(|&l| l != NONE)
            .fold((0u64, 0u64), |(r, d), l| (r + 1, d.max(l)));
        let mut summary = serde_json::Map::new();
        summary.insert("root".into(), self.root.into());
        summary.insert("reached".into(), reached.into());
        summary.insert("depth".into(), depth.into());
        Ok(Output {
            arrays: vec![
                ("level".into(), Values::Ids(level)),
                ("parent".into(), Values::Ids(parent)),
            ],
            summary,
            iterations,
        })
    }
}
