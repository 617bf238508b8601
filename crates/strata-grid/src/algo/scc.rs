//! Strongly connected components by forward-backward coloring (Orzan; X-Stream's SCC), in
//! rounds over the vertices not yet assigned:
//!
//! 1. trim: a vertex with no remaining in-edge or no remaining out-edge (self-loops aside) is a
//!    component by itself;
//! 2. color: every remaining vertex takes the smallest id that reaches it (min-label
//!    propagation along the out-edges, among remaining vertices);
//! 3. back: each vertex whose color is its own id is a root, and the vertices of its color
//!    that reach it (found along the edges backwards: a pass marks the source of every edge
//!    whose destination is marked, within a color) are its component.
//!
//! A component's label is its smallest vertex id. Each round assigns at least its roots; a
//! graph with one giant component and a shallow remainder takes a few rounds.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::frontier::{Frontier, MinLabel, Step};
use super::{chunk_bases, Algorithm, Ctx, IterationValue, Output, Passes, Values, NONE};
use crate::error::Result;
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, U64Array};

/// Strongly connected components (no parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Scc {}

/// Arrays every phase reads: the component of each vertex (NONE while unassigned) and the
/// chunk bases.
struct Common<'a> {
    scc: &'a U64Array,
    base: &'a [u64],
}

impl Common<'_> {
    /// The global ids of the edges of block (i, j) whose endpoints are both unassigned and
    /// distinct.
    #[inline]
    fn remaining<'e>(
        &'e self,
        i: u32,
        j: u32,
        edges: &'e [[u32; 2]],
    ) -> impl Iterator<Item = (usize, usize)> + 'e {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        edges
            .iter()
            .map(move |&[s, d]| (sb + s as usize, db + d as usize))
            .filter(|&(u, v)| u != v && self.scc.get(u) == NONE && self.scc.get(v) == NONE)
    }
}

/// Marks the vertices with a remaining out-edge and those with a remaining in-edge.
struct Trim<'a> {
    c: Common<'a>,
    has_out: &'a Bitmap,
    has_in: &'a Bitmap,
}

impl EdgeKernel for Trim<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], _: bool) -> u64 {
        for (u, v) in self.c.remaining(i, j, edges) {
            self.has_out.set(u);
            self.has_in.set(v);
        }
        0
    }
}

/// Lowers each remaining destination's color to its frontier source's: min-label
/// propagation along the edges whose endpoints are both unassigned and distinct.
struct Color<'a> {
    scc: &'a U64Array,
    color: MinLabel<'a>,
}

impl Step for Color<'_> {
    #[inline]
    fn carry(&self, u: usize, v: usize, w: f32, owns_dst: bool) -> bool {
        u != v
            && self.scc.get(u) == NONE
            && self.scc.get(v) == NONE
            && self.color.carry(u, v, w, owns_dst)
    }
}

/// Marks the source of each remaining edge whose destination is marked and of its color.
struct Back<'a> {
    c: Common<'a>,
    color: &'a U64Array,
    marked: &'a Bitmap,
}

impl EdgeKernel for Back<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], _: bool) -> u64 {
        let mut found = 0;
        for (u, v) in self.c.remaining(i, j, edges) {
            if self.marked.get(v)
                && !self.marked.get(u)
                && self.color.get(u) == self.color.get(v)
                && self.marked.set_new(u)
            {
                found += 1;
            }
        }
        found
    }
}

impl Algorithm for Scc {
    const NAME: &'static str = "scc";
    const ABOUT: &'static str = "strongly connected components by forward-backward coloring";
    const ARRAYS: &'static [&'static str] = &["component"];
    const VALUE: IterationValue = IterationValue::Count("changed");

    /// Component and color (u64 each) and five bitmaps.
    fn vertex_bytes(&self) -> u64 {
        17
    }

    /// Its backward passes write to sources, which other ranks own.
    fn distributed(&self) -> bool {
        false
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let scc = U64Array::filled(s.vertex(), n, NONE)?;
        let color = U64Array::filled(s.vertex(), n, NONE)?;
        let (has_out, has_in) = (Bitmap::new(n), Bitmap::new(n));
        let (frontier, next, marked) = (Bitmap::new(n), Bitmap::new(n), Bitmap::new(n));
        let common = || Common {
            scc: &scc,
            base: &base,
        };
        let mut passes = Passes::new(ctx);
        let mut remaining = n as u64;
        let mut rounds = 0u64;
        while remaining > 0 {
            rounds += 1;
            has_out.fill(false);
            has_in.fill(false);
            let trim = Trim {
                c: common(),
                has_out: &has_out,
                has_in: &has_in,
            };
            passes.pass(s, &trim, None, remaining)?;
            // Trimmed vertices are their own components; the rest start with their own color.
            let each = |c: u32, f: &(dyn Fn(usize) -> u64 + Sync)| -> u64 {
                (base[c as usize] as usize..base[c as usize + 1] as usize)
                    .map(f)
                    .sum()
            };
            remaining = s
                .par_chunks(|c| {
                    each(c, &|v| {
                        if scc.get(v) != NONE {
                            return 0;
                        }
                        if !has_out.get(v) || !has_in.get(v) {
                            scc.set(v, v as u64);
                            return 0;
                        }
                        color.set(v, v as u64);
                        frontier.set(v);
                        1
                    })
                })
                .into_iter()
                .sum();
            if remaining == 0 {
                break;
            }
            let kernel = Frontier {
                frontier: &frontier,
                next: &next,
                base: &base,
                step: Color {
                    scc: &scc,
                    color: MinLabel { label: &color },
                },
            };
            loop {
                let active = frontier.count();
                if active == 0 {
                    break;
                }
                passes.pass(s, &kernel, Some(&frontier), active)?;
                frontier.take_from(&next);
            }
            s.par_chunks(|c| {
                each(c, &|v| {
                    if scc.get(v) == NONE && color.get(v) == v as u64 {
                        marked.set(v);
                    }
                    0
                })
            });
            let back = Back {
                c: common(),
                color: &color,
                marked: &marked,
            };
            while passes.pass(s, &back, None, remaining)? > 0 {}
            // Every marked vertex reaches its color's root and is reached from it.
            remaining -= s
                .par_chunks(|c| {
                    each(c, &|v| {
                        if !marked.get(v) {
                            return 0;
                        }
                        scc.set(v, color.get(v));
                        marked.clear(v);
                        1
                    })
                })
                .into_iter()
                .sum::<u64>();
        }
        let components = (0..n).filter(|&v| scc.get(v) == v as u64).count();
        let mut summary = serde_json::Map::new();
        summary.insert("components".into(), components.into());
        summary.insert("rounds".into(), rounds.into());
        Ok(Output {
            arrays: vec![("component".into(), Values::Ids(scc))],
            summary,
            iterations: passes.done,
        })
    }
}
