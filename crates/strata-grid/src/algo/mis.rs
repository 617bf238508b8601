//! Maximal independent set, Luby-style with priorities fixed by a seed (Blelloch, Fineman and
//! Shun's deterministic parallel greedy): each round, an undecided vertex whose priority beats
//! every undecided neighbour's joins the set, and its neighbours leave. The set is the one the
//! sequential greedy algorithm picks visiting vertices by priority, so a seed fixes it.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{chunk_bases, vertex_hash, Algorithm, Ctx, IterationValue, Output, Passes, Values};
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, U64Array};

/// Maximal independent set's parameters.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Mis {
    /// the seed of the random choices (the same seed gives the same result)
    pub seed: u64,
}

impl Mis {
    /// Vertex `v`'s priority under `seed`, lower first: a hash of both, then the id, so no
    /// two vertices tie.
    pub fn priority(seed: u64, v: u64) -> (u64, u64) {
        (vertex_hash(seed, v), v)
    }
}

/// Marks each undecided vertex that has an undecided neighbour of higher priority.
struct Beat<'a> {
    seed: u64,
    undecided: &'a Bitmap,
    beaten: &'a Bitmap,
    base: &'a [u64],
}

impl EdgeKernel for Beat<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], _: bool) -> u64 {
        let (sb, db) = (self.base[i as usize], self.base[j as usize]);
        for &[s, d] in edges {
            let (u, v) = (sb + s as u64, db + d as u64);
            if u == v || !self.undecided.get(u as usize) || !self.undecided.get(v as usize) {
                continue;
            }
            if Mis::priority(self.seed, u) < Mis::priority(self.seed, v) {
                self.beaten.set(v as usize);
            }
        }
        0
    }
}

/// Takes the neighbours of the vertices that joined the set out of the undecided ones.
struct Exclude<'a> {
    joined: &'a Bitmap,
    undecided: &'a Bitmap,
    base: &'a [u64],
}

impl EdgeKernel for Exclude<'_> {
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], _: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let mut excluded = 0;
        for &[s, d] in edges {
            let (u, v) = (sb + s as usize, db + d as usize);
            if u != v && self.joined.get(u) && self.undecided.get(v) {
                self.undecided.clear(v);
                excluded += 1;
            }
        }
        excluded
    }
}

impl Algorithm for Mis {
    const NAME: &'static str = "mis";
    const ABOUT: &'static str =
        "maximal independent set (randomized by --seed), on a symmetric grid";
    const ARRAYS: &'static [&'static str] = &["in_set"];
    const VALUE: IterationValue = IterationValue::Count("beaten or excluded");

    /// The result (u64) and four bitmaps.
    fn vertex_bytes(&self) -> u64 {
        9
    }

    fn needs_symmetric(&self) -> bool {
        true
    }

    /// Its rounds do not exchange the decided vertices between ranks.
    fn distributed(&self) -> bool {
        false
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        if !s.grid().manifest().symmetric {
            return Err(GridError::config(
                "grid",
                "mis needs a symmetric grid (strata grid build --symmetrize)",
            ));
        }
        let n = s.grid().layout().num_vertices as usize;
        let base = chunk_bases(s);
        let (undecided, beaten) = (Bitmap::full(n), Bitmap::new(n));
        let (joined, member) = (Bitmap::new(n), Bitmap::new(n));
        let beat = Beat {
            seed: self.seed,
            undecided: &undecided,
            beaten: &beaten,
            base: &base,
        };
        let exclude = Exclude {
            joined: &joined,
            undecided: &undecided,
            base: &base,
        };
        let mut passes = Passes::new(ctx);
        loop {
            let active = undecided.count();
            if active == 0 {
                break;
            }
            passes.pass(s, &beat, Some(&undecided), active)?;
            s.par_chunks(|c| {
                for v in base[c as usize] as usize..base[c as usize + 1] as usize {
                    if undecided.get(v) && !beaten.get(v) {
                        member.set(v);
                        joined.set(v);
                        undecided.clear(v);
                    }
                }
            });
            passes.pass(s, &exclude, Some(&joined), joined.count())?;
            beaten.fill(false);
            joined.fill(false);
        }
        let size = member.count();
        let in_set = U64Array::from_fn(s.vertex(), n, |v| member.get(v) as u64)?;
        let mut summary = serde_json::Map::new();
        summary.insert("size".into(), size.into());
        summary.insert("seed".into(), self.seed.into());
        Ok(Output {
            arrays: vec![("in_set".into(), Values::Ids(in_set))],
            summary,
            iterations: passes.done,
        })
    }
}
