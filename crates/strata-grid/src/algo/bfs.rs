//! Breadth-first search: level by level, a frontier bitmap selects the blocks to stream.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    check_root, chunk_bases, frontier_loop, Algorithm, Ctx, IterationValue, Output, Values, NONE,
};
use crate::error::Result;
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, U64Array};

/// Breadth-first search's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Bfs {
    /// the source vertex
    pub root: u64,
}

struct Expand<'a> {
    frontier: &'a Bitmap,
    next: &'a Bitmap,
    parent: &'a U64Array,
    level: &'a U64Array,
    depth: AtomicU64,
    base: &'a [u64],
}

impl EdgeKernel for Expand<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], owns_dst: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let mut found = 0;
        for &[s, d] in edges {
            let (u, v) = (sb + s as usize, db + d as usize);
            if !self.frontier.get(u) || self.parent.get(v) != NONE {
                continue;
            }
            let claimed = if owns_dst {
                self.parent.set(v, u as u64);
                true
            } else {
                self.parent.cas_shared(v, NONE, u as u64)
            };
            if claimed {
                self.level.set(v, self.depth.load(Relaxed));
                self.next.set(v);
                found += 1;
            }
        }
        found
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
        let kernel = Expand {
            frontier: &frontier,
            next: &next,
            parent: &parent,
            level: &level,
            depth: AtomicU64::new(1),
            base: &base,
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
            |it| kernel.depth.store(it as u64 + 1, Relaxed),
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
