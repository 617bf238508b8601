//! Core numbers by peeling (Batagelj-Zaversnik order, streamed): at level k, vertices of
//! remaining degree <= k get core number k and are removed, and a pass over their blocks
//! lowers their neighbours' degrees; when none is left at k, k jumps to the smallest
//! remaining degree. Core numbers are those of the simple graph, so kcore runs on a simple
//! symmetric grid (`strata grid build --symmetrize --simple`: self-loops dropped, an edge given
//! in both directions or repeated stored once each way); on any other grid repeated edges would
//! count as several neighbours (an edge given both ways doubles every core number).
//!
//! A distributed run checkpoints the owned degrees and core numbers after every peel: that is
//! the whole state, since the level to resume at is the highest core number assigned (levels
//! only rise, and a level's vertices left unpeeled are peeled again at it).

use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    chunk_bases, full_pass, Algorithm, Ctx, Iteration, IterationValue, Output, Values, NONE,
};
use crate::checkpoint::State;
use crate::dist::Reduce;
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, Shared, U64Array};

/// k-core decomposition (no parameters).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KCore {}

struct Degree<'a> {
    deg: &'a U64Array,
    base: &'a [u64],
}

impl EdgeKernel for Degree<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], owns_dst: bool) -> u64 {
        let db = self.base[j as usize] as usize;
        for &[s, d] in edges {
            if i == j && s == d {
                continue;
            }
            let v = db + d as usize;
            if owns_dst {
                self.deg.set(v, self.deg.get(v) + 1);
            } else {
                self.deg.add_shared(v, 1);
            }
        }
        0
    }
}

struct Peel<'a> {
    removed: &'a Bitmap,
    deg: &'a U64Array,
    core: &'a U64Array,
    base: &'a [u64],
}

impl EdgeKernel for Peel<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], owns_dst: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let mut lowered = 0;
        for &[s, d] in edges {
            let (u, v) = (sb + s as usize, db + d as usize);
            if u == v || !self.removed.get(u) || self.core.get(v) != NONE {
                continue;
            }
            if owns_dst {
                self.deg.set(v, self.deg.get(v) - 1);
            } else {
                self.deg.sub_shared(v, 1);
            }
            lowered += 1;
        }
        lowered
    }
}

/// Vertices another rank peeled at level `k`: only their ids travel, and taking one sets its
/// core number.
struct PeeledAt<'a> {
    core: &'a U64Array,
    k: u64,
}

impl Shared for PeeledAt<'_> {
    fn width(&self) -> usize {
        0
    }

    fn put(&self, _: usize, _: &mut Vec<u8>) {}

    fn take(&self, v: usize, _: &[u8]) {
        self.core.set(v, self.k);
    }
}

impl Algorithm for KCore {
    const NAME: &'static str = "kcore";
    const ABOUT: &'static str = "core numbers by k-core decomposition, on a symmetric grid";
    const ARRAYS: &'static [&'static str] = &["core"];
    const VALUE: IterationValue = IterationValue::Count("k");

    /// Degree and core number (u64 each) and the removed bitmap.
    fn vertex_bytes(&self) -> u64 {
        17
    }

    fn needs_symmetric(&self) -> bool {
        true
    }

    fn needs_simple(&self) -> bool {
        true
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        let m = s.grid().manifest();
        if !(m.symmetric && m.simple) {
            return Err(GridError::config(
                "grid",
                "kcore needs a simple symmetric grid (strata grid build --symmetrize --simple)",
            ));
        }
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let deg = U64Array::filled(s.vertex(), n, 0)?;
        let core = U64Array::filled(s.vertex(), n, NONE)?;
        let state = State {
            saved: &[&deg, &core],
            whole: &[&core],
            frontier: None,
        };
        let (mut k, mut it) = match ctx.resume(&state)? {
            // Every rank holds every core number (`whole`), so all resume at the same level.
            Some(done) => {
                let highest = (0..n).map(|v| core.get(v)).filter(|&c| c != NONE).max();
                (highest.unwrap_or(0), done)
            }
            None => {
                let degree = Degree {
                    deg: &deg,
                    base: &base,
                };
                full_pass(s, ctx, &degree, 0)?;
                ctx.checkpoint(1, &state)?;
                (0, 1)
            }
        };
        loop {
            let t0 = Instant::now();
            let removed = Bitmap::new(n);
            let local: u64 = s
                .par_chunks(|c| {
                    let mut m = 0;
                    for v in base[c as usize] as usize..base[c as usize + 1] as usize {
                        if core.get(v) == NONE && deg.get(v) <= k {
                            core.set(v, k);
                            removed.set(v);
                            m += 1;
                        }
                    }
                    m
                })
                .into_iter()
                .sum();
            let peeled = ctx.exchange(Some(&removed), &[&PeeledAt { core: &core, k }], local)?;
            if peeled == 0 {
                let local = s
                    .par_chunks(|c| {
                        (base[c as usize] as usize..base[c as usize + 1] as usize)
                            .filter(|&v| core.get(v) == NONE)
                            .map(|v| deg.get(v))
                            .min()
                            .unwrap_or(NONE)
                    })
                    .into_iter()
                    .min()
                    .unwrap_or(NONE);
                // Degrees are far below 2^53, so f64 carries them exactly; NONE stays the largest.
                let mut next = [local as f64];
                ctx.reduce(&mut next, Reduce::Min)?;
                let next = if next[0] >= NONE as f64 {
                    NONE
                } else {
                    next[0] as u64
                };
                if next == NONE {
                    break;
                }
                k = next;
                continue;
            }
            let pass = s.stream_edges(
                &Peel {
                    removed: &removed,
                    deg: &deg,
                    core: &core,
                    base: &base,
                },
                Some(&removed),
                ctx.progress,
            )?;
            let seconds = t0.elapsed().as_secs_f64();
            ctx.report(Iteration::new(it, pass, peeled, k as f64, seconds))?;
            it += 1;
            ctx.checkpoint(it, &state)?;
        }
        let mut summary = serde_json::Map::new();
        summary.insert("max_core".into(), k.into());
        Ok(Output {
            arrays: vec![("core".into(), Values::Ids(core))],
            summary,
            iterations: it,
        })
    }
}
