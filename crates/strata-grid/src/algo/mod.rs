//! Graph algorithms in the streaming-apply model: each iteration is one edge pass (an
//! [`EdgeKernel`](crate::stream::EdgeKernel) over the active blocks) and one vertex pass
//! (per chunk, on the compute threads).

mod bfs;
mod kcore;
mod pagerank;
mod spmv;
mod sssp;
mod wcc;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use strata_io::progress::Progress;

use crate::error::{GridError, Result};
use crate::stream::{PassStats, Streamer};
use crate::vertex::{F32Array, F64Array, U64Array};

pub use bfs::Bfs;
pub use kcore::KCore;
pub use pagerank::PageRank;
pub use spmv::Spmv;
pub use sssp::Sssp;
pub use wcc::Wcc;

/// Marks an unreached vertex or a missing parent in id arrays.
pub const NONE: u64 = u64::MAX;

/// One algorithm and its parameters (`algorithm` names it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "algorithm", rename_all = "lowercase", deny_unknown_fields)]
pub enum AlgoConfig {
    /// PageRank with the networkx definition: teleport (1-d)/N, dangling mass spread evenly.
    Pagerank {
        /// Most iterations (all of them when `tolerance` is 0).
        #[serde(default = "default_iterations")]
        iterations: usize,
        /// Stop once the L1 change of the ranks is below `N * tolerance` (0: never).
        #[serde(default)]
        tolerance: f64,
        #[serde(default = "default_damping")]
        damping: f64,
    },
    /// Breadth-first search from `root`: levels and parents.
    Bfs { root: u64 },
    /// Weakly connected components by label propagation (on a symmetric grid).
    Wcc,
    /// Single-source shortest paths over the edge weights (frontier Bellman-Ford).
    Sssp { root: u64 },
    /// `y = A^T x`: `y[v] = sum over edges (u, v) of w(u, v) x[u]` (w = 1 unweighted).
    Spmv {
        /// A float `.npy` vector of length V; `None`: all ones.
        #[serde(default)]
        vector: Option<PathBuf>,
        /// Use the edge weights (a weighted grid).
        #[serde(default)]
        weighted: bool,
    },
    /// Core numbers (k-core decomposition by peeling, on a symmetric grid).
    Kcore,
}

fn default_iterations() -> usize {
    20
}

fn default_damping() -> f64 {
    0.85
}

impl AlgoConfig {
    pub fn name(&self) -> &'static str {
        match self {
            AlgoConfig::Pagerank { .. } => "pagerank",
            AlgoConfig::Bfs { .. } => "bfs",
            AlgoConfig::Wcc => "wcc",
            AlgoConfig::Sssp { .. } => "sssp",
            AlgoConfig::Spmv { .. } => "spmv",
            AlgoConfig::Kcore => "kcore",
        }
    }

    /// The grid must carry weights.
    pub fn needs_weights(&self) -> bool {
        matches!(
            self,
            AlgoConfig::Sssp { .. } | AlgoConfig::Spmv { weighted: true, .. }
        )
    }

    /// The grid must hold both directions of every edge.
    pub fn needs_symmetric(&self) -> bool {
        matches!(self, AlgoConfig::Wcc | AlgoConfig::Kcore)
    }

    /// Bytes of vertex data per vertex (what stays local: Fargraph+'s resistant set).
    pub fn vertex_bytes(&self) -> u64 {
        match self {
            // rank, contribution, sum and 1/degree (f32 each): GridGraph's 12 B plus the rank
            AlgoConfig::Pagerank { .. } => 16,
            // parent, level (u64) and two bitmaps
            AlgoConfig::Bfs { .. } => 17,
            AlgoConfig::Wcc => 9,
            AlgoConfig::Sssp { .. } => 9,
            AlgoConfig::Spmv { .. } => 12,
            AlgoConfig::Kcore => 17,
        }
    }

    /// Checks parameters against a graph of `n` vertices.
    pub fn check(&self, n: u64) -> Result<()> {
        match self {
            AlgoConfig::Pagerank {
                iterations,
                tolerance,
                damping,
            } => {
                if *iterations == 0 {
                    return Err(GridError::config("iterations", "need at least 1"));
                }
                if tolerance.is_nan() || *tolerance < 0.0 {
                    return Err(GridError::config(
                        "tolerance",
                        format!("must be >= 0, got {tolerance}"),
                    ));
                }
                if !(0.0..1.0).contains(damping) {
                    return Err(GridError::config(
                        "damping",
                        format!("must be in [0, 1), got {damping}"),
                    ));
                }
            }
            AlgoConfig::Bfs { root } | AlgoConfig::Sssp { root } if *root >= n => {
                return Err(GridError::config(
                    "root",
                    format!("vertex {root} is not in the graph (0..{n})"),
                ));
            }
            _ => {}
        }
        Ok(())
    }

    /// Runs the algorithm on `s`.
    pub fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        match self {
            AlgoConfig::Pagerank {
                iterations,
                tolerance,
                damping,
            } => PageRank {
                iterations: *iterations,
                tolerance: *tolerance,
                damping: *damping,
            }
            .run(s, ctx),
            AlgoConfig::Bfs { root } => Bfs { root: *root }.run(s, ctx),
            AlgoConfig::Wcc => Wcc.run(s, ctx),
            AlgoConfig::Sssp { root } => Sssp { root: *root }.run(s, ctx),
            AlgoConfig::Spmv { vector, weighted } => Spmv {
                vector: vector.clone(),
                weighted: *weighted,
            }
            .run(s, ctx),
            AlgoConfig::Kcore => KCore.run(s, ctx),
        }
    }
}

/// What an iteration did, reported as it ends.
#[derive(Debug, Clone, Serialize)]
pub struct Iteration {
    pub iteration: usize,
    pub pass: PassStats,
    /// Vertices active in the pass (sources considered).
    pub active: u64,
    /// Algorithm-specific progress (PageRank: L1 change; BFS: level size; ...).
    pub value: f64,
    /// Seconds of the iteration, edge and vertex pass together.
    pub seconds: f64,
}

/// What an algorithm talks to while it runs.
pub struct Ctx<'a> {
    pub progress: &'a dyn Progress,
    pub on_iteration: &'a mut dyn FnMut(&Iteration) -> Result<()>,
}

/// A result array, one value per vertex, written out as it is (in the heap or windowed).
pub enum Values {
    F32(F32Array),
    F64(F64Array),
    /// Vertex ids, labels or counts, written as int64 with [`NONE`] as -1.
    Ids(U64Array),
}

/// What an algorithm produced.
pub struct Output {
    /// Result arrays, one value per vertex, by name.
    pub arrays: Vec<(String, Values)>,
    /// Figures worth printing (components found, levels, converged, ...).
    pub summary: serde_json::Map<String, serde_json::Value>,
    pub iterations: usize,
}

/// Runs frontier iterations until no vertex is activated: each pass streams the blocks of
/// `frontier`'s chunks with `kernel`, which marks activated vertices in `next` and returns how
/// many; `next` then becomes the frontier. `on_start(iteration)` runs before each pass.
/// Returns the iterations run.
pub(crate) fn frontier_loop(
    s: &mut Streamer,
    ctx: &mut Ctx,
    frontier: &crate::vertex::Bitmap,
    next: &crate::vertex::Bitmap,
    kernel: &dyn crate::stream::EdgeKernel,
    mut on_start: impl FnMut(usize),
) -> Result<usize> {
    let mut it = 0;
    loop {
        let active = frontier.count();
        if active == 0 {
            return Ok(it);
        }
        let t0 = std::time::Instant::now();
        on_start(it);
        let pass = s.stream_edges(kernel, Some(frontier), ctx.progress)?;
        let activated = pass.total;
        frontier.take_from(next);
        (ctx.on_iteration)(&Iteration {
            iteration: it,
            pass,
            active,
            value: activated as f64,
            seconds: t0.elapsed().as_secs_f64(),
        })?;
        it += 1;
    }
}

/// One pass of `kernel` over every block, reported as iteration `iteration`.
pub(crate) fn full_pass(
    s: &mut Streamer,
    ctx: &mut Ctx,
    kernel: &dyn crate::stream::EdgeKernel,
    iteration: usize,
) -> Result<()> {
    let t0 = std::time::Instant::now();
    let pass = s.stream_edges(kernel, None, ctx.progress)?;
    let active = s.grid().layout().num_vertices;
    (ctx.on_iteration)(&Iteration {
        iteration,
        pass,
        active,
        value: 0.0,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Base vertex of every chunk, and the end (P + 1 entries): what kernels add in-block ids to.
pub(crate) fn chunk_bases(s: &Streamer) -> Vec<u64> {
    let l = *s.grid().layout();
    (0..=l.partitions).map(|i| l.base(i)).collect()
}
