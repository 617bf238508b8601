//! PageRank, as networkx defines it: `r'(v) = (1-d)/N + d (sum_{u->v} r(u)/out(u) + D/N)`
//! where D is the rank held by vertices without out-edges.

use std::time::Instant;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Algorithm, Ctx, Iteration, IterationValue, Output, Values};
use crate::checkpoint::State;
use crate::dist::Reduce;
use crate::error::{GridError, Result};
use crate::stream::{EdgeKernel, Streamer};
use crate::vertex::{Bitmap, F32Array, Shared};

/// PageRank's parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PageRank {
    /// most iterations (all of them when --tolerance is 0)
    #[schemars(range(min = 1))]
    pub iterations: usize,
    /// stop once the L1 change of the ranks is below V x tolerance
    #[schemars(range(min = 0.0))]
    pub tolerance: f64,
    /// damping factor, in [0, 1)
    #[schemars(range(min = 0.0))]
    pub damping: f64,
}

impl Default for PageRank {
    fn default() -> Self {
        PageRank {
            iterations: 20,
            tolerance: 0.0,
            damping: 0.85,
        }
    }
}

struct Gather<'a> {
    contrib: &'a F32Array,
    sum: &'a F32Array,
    base: &'a [u64],
}

impl EdgeKernel for Gather<'_> {
    #[inline]
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], _: &[f32], owns_dst: bool) -> u64 {
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        if owns_dst {
            for &[s, d] in edges {
                self.sum
                    .add_owned(db + d as usize, self.contrib.get(sb + s as usize));
            }
        } else {
            for &[s, d] in edges {
                self.sum
                    .add_shared(db + d as usize, self.contrib.get(sb + s as usize));
            }
        }
        0
    }
}

/// The ranks a distributed run exchanges: taking one also sets the vertex's contribution.
struct Ranks<'a> {
    rank: &'a F32Array,
    contrib: &'a F32Array,
    inv_deg: &'a F32Array,
}

impl Shared for Ranks<'_> {
    fn width(&self) -> usize {
        4
    }

    fn put(&self, v: usize, out: &mut Vec<u8>) {
        self.rank.put(v, out);
    }

    fn take(&self, v: usize, bytes: &[u8]) {
        self.rank.take(v, bytes);
        let inv = self.inv_deg.get(v);
        if inv != 0.0 {
            self.contrib.set(v, self.rank.get(v) * inv);
        }
    }
}

impl Algorithm for PageRank {
    const NAME: &'static str = "pagerank";
    const ABOUT: &'static str = "PageRank, networkx's definition";
    const ARRAYS: &'static [&'static str] = &["rank"];
    const VALUE: IterationValue = IterationValue::Real("L1 change");

    /// Rank, contribution, sum and 1/degree (f32 each): GridGraph's 12 B plus the rank.
    fn vertex_bytes(&self) -> u64 {
        16
    }

    fn validate(&self) -> Result<()> {
        if self.iterations == 0 {
            return Err(GridError::config("iterations", "need at least 1"));
        }
        if self.tolerance.is_nan() || self.tolerance < 0.0 {
            return Err(GridError::config(
                "tolerance",
                format!("must be >= 0, got {}", self.tolerance),
            ));
        }
        if !(0.0..1.0).contains(&self.damping) {
            return Err(GridError::config(
                "damping",
                format!("must be in [0, 1), got {}", self.damping),
            ));
        }
        Ok(())
    }

    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        power_iteration(self, &Jump::Uniform, s, ctx)
    }
}

/// Where the random surfer jumps, on teleport and from a vertex without out-edges.
pub(crate) enum Jump {
    /// To every vertex alike (PageRank).
    Uniform,
    /// To the seed vertices alike (personalized PageRank); `count` seeds are set.
    Seeds { seeds: Bitmap, count: usize },
}

impl Jump {
    /// The probability of jumping to `v` in a graph of `n` vertices.
    #[inline]
    fn p(&self, v: usize, n: usize) -> f64 {
        match self {
            Jump::Uniform => 1.0 / n as f64,
            Jump::Seeds { seeds, count } if seeds.get(v) => 1.0 / *count as f64,
            Jump::Seeds { .. } => 0.0,
        }
    }
}

/// Power iterations of `params` from the uniform vector, as networkx's `pagerank` runs them
/// with `personalization` = `jump`: `r'(v) = d sum_{u->v} r(u)/out(u) + (1 - d + d D) p(v)`,
/// D the rank held by vertices without out-edges.
pub(crate) fn power_iteration(
    params: &PageRank,
    jump: &Jump,
    s: &mut Streamer,
    ctx: &mut Ctx,
) -> Result<Output> {
    let grid = s.grid().clone();
    let layout = *grid.layout();
    let n = layout.num_vertices as usize;
    // 1/out-degree (0 for dangling vertices): 4 bytes a vertex where degrees take 8.
    let inv_deg = F32Array::filled(s.vertex(), n, 0.0)?;
    grid.for_each_degree("out_degree", |v, d| {
        if d > 0 {
            inv_deg.set(v, (1.0 / d as f64) as f32);
        }
    })?;
    let base: Vec<u64> = (0..=layout.partitions).map(|i| layout.base(i)).collect();
    let rank = F32Array::filled(s.vertex(), n, (1.0 / n as f64) as f32)?;
    let contrib = F32Array::filled(s.vertex(), n, 0.0)?;
    let sum = F32Array::filled(s.vertex(), n, 0.0)?;
    let mut dangling = 0.0;
    for v in 0..n {
        let inv = inv_deg.get(v);
        if inv == 0.0 {
            dangling += rank.get(v) as f64;
        } else {
            contrib.set(v, rank.get(v) * inv);
        }
    }
    let shared = Ranks {
        rank: &rank,
        contrib: &contrib,
        inv_deg: &inv_deg,
    };
    let state = State {
        saved: &[&shared],
        whole: &[&shared],
        frontier: None,
    };
    let first = ctx.resume(&state)?;
    if first.is_some() {
        // Contributions were set as the ranks were taken; the dangling mass follows them.
        dangling = (0..n)
            .filter(|&v| inv_deg.get(v) == 0.0)
            .map(|v| rank.get(v) as f64)
            .sum();
    }
    let d = params.damping;
    let mut converged = false;
    let mut delta = f64::NAN;
    let mut done = first.unwrap_or(0);
    for it in first.unwrap_or(0)..params.iterations {
        let t0 = Instant::now();
        let kernel = Gather {
            contrib: &contrib,
            sum: &sum,
            base: &base,
        };
        let pass = s.stream_edges(&kernel, None, ctx.progress)?;
        let jumped = 1.0 - d + d * dangling;
        let parts = s.par_chunks(|c| {
            let (mut delta, mut dangling) = (0.0f64, 0.0f64);
            let (start, end) = (base[c as usize] as usize, base[c as usize + 1] as usize);
            for v in start..end {
                let inv = inv_deg.get(v);
                let new = (jumped * jump.p(v, n) + d * sum.get(v) as f64) as f32;
                delta += (new as f64 - rank.get(v) as f64).abs();
                rank.set(v, new);
                sum.set(v, 0.0);
                if inv == 0.0 {
                    dangling += new as f64;
                } else {
                    contrib.set(v, new * inv);
                }
            }
            (delta, dangling)
        });
        let mut sums = [
            parts.iter().map(|p| p.0).sum(),
            parts.iter().map(|p| p.1).sum(),
        ];
        ctx.reduce(&mut sums, Reduce::Sum)?;
        [delta, dangling] = sums;
        ctx.exchange(None, &[&shared], 0)?;
        done = it + 1;
        let seconds = t0.elapsed().as_secs_f64();
        ctx.report(Iteration::new(it, pass, n as u64, delta, seconds))?;
        if params.tolerance > 0.0 && delta < n as f64 * params.tolerance {
            converged = true;
            break;
        }
        if done < params.iterations {
            ctx.checkpoint(done, &state)?;
        }
    }
    let mut summary = serde_json::Map::new();
    summary.insert("l1_change".into(), delta.into());
    summary.insert("converged".into(), converged.into());
    Ok(Output {
        arrays: vec![("rank".into(), Values::F32(rank))],
        summary,
        iterations: done,
    })
}
