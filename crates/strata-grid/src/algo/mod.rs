//! Graph algorithms in the streaming-apply model: each iteration is one edge pass (an
//! [`EdgeKernel`](crate::stream::EdgeKernel) over the active blocks) and one vertex pass
//! (per chunk, on the compute threads).
//!
//! An algorithm is a struct of its parameters implementing [`Algorithm`], in a file of its
//! own, registered by one line in [`registry`]; a run holds it as a [`Configured`].

mod betweenness;
mod bfs;
mod frontier;
mod gather;
mod hyperanf;
mod kcore;
mod lpa;
mod mis;
mod oriented;
mod pagerank;
mod ppr;
mod radii;
pub mod registry;
mod scc;
mod spmv;
mod sssp;
#[cfg(test)]
mod tests;
mod triangles;
mod wcc;

use std::sync::Arc;

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_io::progress::Progress;

use crate::checkpoint::State;
use crate::dist::{Dist, Reduce};
use crate::error::{GridError, Result};
use crate::layout::GridManifest;
use crate::stream::{PassStats, Streamer};
use crate::vertex::{F32Array, F64Array, Shared, U64Array};

pub use betweenness::Betweenness;
pub use bfs::Bfs;
pub use hyperanf::HyperAnf;
pub use kcore::KCore;
pub use lpa::{most_frequent, Lpa};
pub use mis::Mis;
pub use pagerank::PageRank;
pub use ppr::PersonalizedPageRank;
pub use radii::Radii;
pub use scc::Scc;
pub use spmv::Spmv;
pub use sssp::Sssp;
pub use triangles::Triangles;
pub use wcc::Wcc;

/// Marks an unreached vertex or a missing parent in id arrays.
pub const NONE: u64 = u64::MAX;

/// A graph algorithm. Its fields are its parameters: they are read from the `[run]` section
/// (serde; a field missing takes its `Default`), and their JSON schema (doc comments as help,
/// `#[schemars(range(..))]` as bounds) is what `strata run` and `strata config run` offer.
pub trait Algorithm:
    Serialize + DeserializeOwned + JsonSchema + Default + Send + Sync + 'static
{
    /// The name `strata run NAME` takes.
    const NAME: &'static str;
    /// What it computes, in a few words (the command line's list of algorithms).
    const ABOUT: &'static str;
    /// The result arrays it writes (`NAME.npy` in the run directory), in order; empty when
    /// its parameters declare them ([`Algorithm::arrays`]).
    const ARRAYS: &'static [&'static str];
    /// What [`Iteration::value`] means, shown after each iteration's line.
    const VALUE: IterationValue;

    /// Bytes of vertex data per vertex (what stays local: Fargraph+'s resistant set); the
    /// budget plan sizes vertex data and its windows from it.
    fn vertex_bytes(&self) -> u64;

    /// Memory it asks for besides vertex data on a grid described by `grid`, streamed by
    /// `threads` compute threads: a work buffer whose size sets how many passes it needs. The
    /// plan grants at least the minimum (or refuses the run) and up to the want; the
    /// algorithm finds the grant in [`StreamConfig::work_bytes`](crate::stream::StreamConfig).
    fn work(&self, grid: &GridManifest, threads: usize) -> Option<Work> {
        let _ = (grid, threads);
        None
    }

    /// The grid must carry edge weights (they then stream with the edges).
    fn needs_weights(&self) -> bool {
        false
    }

    /// The grid must hold both directions of every edge.
    fn needs_symmetric(&self) -> bool {
        false
    }

    /// The grid must be simple: no self-loops, each edge once (a multigraph's repeated edges
    /// would count as several neighbours).
    fn needs_simple(&self) -> bool {
        false
    }

    /// Whether it runs in a distributed group: its passes write only to destinations (which
    /// the rank streaming their column owns) and it exchanges what changed through [`Ctx`].
    fn distributed(&self) -> bool {
        true
    }

    /// Checks the parameters by themselves; an error names the parameter
    /// ([`GridError::config`](crate::GridError::config)).
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// Checks the parameters against a graph of `num_vertices` vertices (a root in range).
    fn check(&self, num_vertices: u64) -> Result<()> {
        let _ = num_vertices;
        Ok(())
    }

    /// The result arrays these parameters make it write: [`Algorithm::ARRAYS`], unless the
    /// parameters declare them (a vertex program's outputs).
    fn arrays(&self) -> Vec<String> {
        Self::ARRAYS.iter().map(|a| a.to_string()).collect()
    }

    /// Runs on `s`, reporting each iteration to `ctx` as it ends.
    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output>;
}

/// A work buffer an algorithm asks the budget for (see [`Algorithm::work`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Work {
    /// The least it runs with, bytes.
    pub minimum: u64,
    /// The most it can use, bytes.
    pub wanted: u64,
    /// What it holds, for the plan's line.
    pub about: String,
}

/// What an iteration's `value` is, for the line printed after it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", content = "label", rename_all = "lowercase")]
pub enum IterationValue {
    /// Nothing worth showing.
    None,
    /// A real number (PageRank's L1 change), shown as `LABEL 1.234e-05`.
    Real(&'static str),
    /// A count (vertices activated, a level), shown as `LABEL 1,234`.
    Count(&'static str),
}

/// [`Algorithm`] without its associated items, so that a run can hold any algorithm: each
/// call dispatches once to the algorithm's own, whose edge kernels stay statically typed.
trait Dyn: Send + Sync {
    fn name(&self) -> &'static str;
    fn params(&self) -> serde_json::Value;
    fn vertex_bytes(&self) -> u64;
    fn work(&self, grid: &GridManifest, threads: usize) -> Option<Work>;
    fn needs_weights(&self) -> bool;
    fn needs_symmetric(&self) -> bool;
    fn needs_simple(&self) -> bool;
    fn distributed(&self) -> bool;
    fn validate(&self) -> Result<()>;
    fn check(&self, num_vertices: u64) -> Result<()>;
    fn arrays(&self) -> Vec<String>;
    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output>;
}

impl<A: Algorithm> Dyn for A {
    fn name(&self) -> &'static str {
        A::NAME
    }
    fn params(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("algorithm parameters serialize")
    }
    fn vertex_bytes(&self) -> u64 {
        Algorithm::vertex_bytes(self)
    }
    fn work(&self, grid: &GridManifest, threads: usize) -> Option<Work> {
        Algorithm::work(self, grid, threads)
    }
    fn needs_weights(&self) -> bool {
        Algorithm::needs_weights(self)
    }
    fn needs_symmetric(&self) -> bool {
        Algorithm::needs_symmetric(self)
    }
    fn needs_simple(&self) -> bool {
        Algorithm::needs_simple(self)
    }
    fn distributed(&self) -> bool {
        Algorithm::distributed(self)
    }
    fn validate(&self) -> Result<()> {
        Algorithm::validate(self)
    }
    fn check(&self, num_vertices: u64) -> Result<()> {
        Algorithm::check(self, num_vertices)
    }
    fn arrays(&self) -> Vec<String> {
        Algorithm::arrays(self)
    }
    fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        Algorithm::run(self, s, ctx)
    }
}

/// An algorithm with its parameters: what a run computes. Made from a registered algorithm's
/// struct ([`Configured::new`]) or by name from the `[run]` options
/// ([`registry::AlgoParams::configure`]).
#[derive(Clone)]
pub struct Configured(Arc<dyn Dyn>);

impl Configured {
    /// `algorithm`, to run.
    pub fn new<A: Algorithm>(algorithm: A) -> Configured {
        Configured(Arc::new(algorithm))
    }

    /// Its registered name.
    pub fn name(&self) -> &'static str {
        self.0.name()
    }

    /// Its parameters as JSON (an object).
    pub fn params(&self) -> serde_json::Value {
        self.0.params()
    }

    /// See [`Algorithm::vertex_bytes`].
    pub fn vertex_bytes(&self) -> u64 {
        self.0.vertex_bytes()
    }

    /// See [`Algorithm::work`].
    pub fn work(&self, grid: &GridManifest, threads: usize) -> Option<Work> {
        self.0.work(grid, threads)
    }

    /// See [`Algorithm::needs_weights`].
    pub fn needs_weights(&self) -> bool {
        self.0.needs_weights()
    }

    /// See [`Algorithm::needs_symmetric`].
    pub fn needs_symmetric(&self) -> bool {
        self.0.needs_symmetric()
    }

    /// See [`Algorithm::needs_simple`].
    pub fn needs_simple(&self) -> bool {
        self.0.needs_simple()
    }

    /// See [`Algorithm::distributed`].
    pub fn distributed(&self) -> bool {
        self.0.distributed()
    }

    /// See [`Algorithm::validate`].
    pub fn validate(&self) -> Result<()> {
        self.0.validate()
    }

    /// See [`Algorithm::check`].
    pub fn check(&self, num_vertices: u64) -> Result<()> {
        self.0.check(num_vertices)
    }

    /// See [`Algorithm::arrays`].
    pub fn arrays(&self) -> Vec<String> {
        self.0.arrays()
    }

    /// See [`Algorithm::run`].
    pub fn run(&self, s: &mut Streamer, ctx: &mut Ctx) -> Result<Output> {
        self.0.run(s, ctx)
    }
}

impl std::fmt::Debug for Configured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.name(), self.params())
    }
}

impl PartialEq for Configured {
    fn eq(&self, other: &Self) -> bool {
        self.name() == other.name() && self.params() == other.params()
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
    /// In a distributed run, bytes this rank sent and received in the iteration's collectives
    /// (set by [`Ctx::report`]).
    pub bytes_exchanged: u64,
}

impl Iteration {
    /// Iteration `iteration` of `pass` over `active` vertices, with its `value`, ended
    /// `seconds` after it started.
    pub fn new(iteration: usize, pass: PassStats, active: u64, value: f64, seconds: f64) -> Self {
        Iteration {
            iteration,
            pass,
            active,
            value,
            seconds,
            bytes_exchanged: 0,
        }
    }
}

/// What an algorithm talks to while it runs. Alone, the collective methods are the identity;
/// in a distributed run (`dist`) they reach the other ranks, and every rank must call them in
/// the same order.
pub struct Ctx<'a, 'g> {
    pub progress: &'a dyn Progress,
    pub on_iteration: &'a mut dyn FnMut(&Iteration) -> Result<()>,
    /// This rank of a distributed run; `None` alone.
    pub dist: Option<&'a mut Dist<'g>>,
}

impl Ctx<'_, '_> {
    /// Reports `it` as ended, with the bytes exchanged since the last report.
    pub fn report(&mut self, mut it: Iteration) -> Result<()> {
        it.bytes_exchanged = self.dist.as_mut().map_or(0, |d| d.take_traffic());
        (self.on_iteration)(&it)
    }

    /// The vertices whose values this process computes: those of its columns (all of them
    /// alone).
    pub fn owned(&self, num_vertices: usize) -> std::ops::Range<usize> {
        match &self.dist {
            Some(d) => {
                let r = d.owned();
                r.start as usize..r.end as usize
            }
            None => 0..num_vertices,
        }
    }

    /// Combines `values` over the ranks in place with `op`.
    pub fn reduce(&mut self, values: &mut [f64], op: Reduce) -> Result<()> {
        match &mut self.dist {
            Some(d) => d.all_reduce(values, op),
            None => Ok(()),
        }
    }

    /// Shares the owned vertices `changed` marks (every owned vertex when `None`) with their
    /// `values`, and takes the other ranks' (see [`Dist::exchange`]); returns `count` summed
    /// over the ranks.
    pub fn exchange(
        &mut self,
        changed: Option<&crate::vertex::Bitmap>,
        values: &[&dyn Shared],
        count: u64,
    ) -> Result<u64> {
        match &mut self.dist {
            Some(d) => d.exchange(changed, values, count),
            None => Ok(count),
        }
    }

    /// On a group that torchrun restarted, loads the last checkpoint into `state` and returns
    /// the iterations it holds; `None` (nothing loaded) alone, on a first attempt or when no
    /// checkpoint was committed. Called before the first iteration.
    pub fn resume(&mut self, state: &State) -> Result<Option<usize>> {
        let Some(d) = &mut self.dist else {
            return Ok(None);
        };
        let resumed = d.resume(state)?;
        if let Some(k) = resumed {
            self.progress.message(&format!(
                "rank {}: resuming from the checkpoint after iteration {k}",
                d.rank()
            ));
        }
        Ok(resumed)
    }

    /// After `iterations` iterations, each reported: the fault point `grid.dist.iter` (its
    /// `N`th visit follows iteration `N`), then, when due, a checkpoint of `state`.
    pub fn checkpoint(&mut self, iterations: usize, state: &State) -> Result<()> {
        match &mut self.dist {
            Some(d) => {
                strata_io::durable::fault_point("grid.dist.iter");
                d.checkpoint(iterations, state)
            }
            None => Ok(()),
        }
    }

    /// Gives every rank the other ranks' owned values of `values` (result arrays that the
    /// iterations did not exchange).
    pub fn gather(&mut self, values: &[&dyn Shared]) -> Result<()> {
        match &mut self.dist {
            Some(d) => d.gather(values),
            None => Ok(()),
        }
    }
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
/// many; the ranks of a distributed run then exchange the activated vertices with their
/// `values`, and `next` becomes the frontier. `on_start(iteration)` runs before each pass.
/// A distributed run's checkpoints hold the frontier and the owned values of `saved` (which
/// include `values`). Returns the iterations run.
#[allow(clippy::too_many_arguments)]
pub(crate) fn frontier_loop(
    s: &mut Streamer,
    ctx: &mut Ctx,
    frontier: &crate::vertex::Bitmap,
    next: &crate::vertex::Bitmap,
    kernel: &dyn crate::stream::EdgeKernel,
    values: &[&dyn Shared],
    saved: &[&dyn Shared],
    mut on_start: impl FnMut(usize),
) -> Result<usize> {
    let state = State {
        saved,
        whole: values,
        frontier: Some(frontier),
    };
    let mut it = ctx.resume(&state)?.unwrap_or(0);
    loop {
        let active = frontier.count();
        if active == 0 {
            return Ok(it);
        }
        let t0 = std::time::Instant::now();
        on_start(it);
        let pass = s.stream_edges(kernel, Some(frontier), ctx.progress)?;
        let activated = ctx.exchange(Some(next), values, pass.total)?;
        frontier.take_from(next);
        let seconds = t0.elapsed().as_secs_f64();
        ctx.report(Iteration::new(it, pass, active, activated as f64, seconds))?;
        it += 1;
        ctx.checkpoint(it, &state)?;
    }
}

/// Passes of an algorithm with several kinds of them (phases, rounds), each reported as an
/// iteration, numbered in order.
pub(crate) struct Passes<'c, 'a, 'g> {
    ctx: &'c mut Ctx<'a, 'g>,
    /// Passes run.
    pub done: usize,
}

impl<'c, 'a, 'g> Passes<'c, 'a, 'g> {
    pub fn new(ctx: &'c mut Ctx<'a, 'g>) -> Self {
        Passes { ctx, done: 0 }
    }

    /// Streams `kernel` over the blocks of `active`'s chunks (all when `None`) and reports the
    /// pass with `count` vertices active and the kernel's total as its value; returns the total.
    pub fn pass(
        &mut self,
        s: &mut Streamer,
        kernel: &dyn crate::stream::EdgeKernel,
        active: Option<&crate::vertex::Bitmap>,
        count: u64,
    ) -> Result<u64> {
        let pass = s.stream_edges(kernel, active, self.ctx.progress)?;
        let total = pass.total;
        self.report(pass, count)?;
        Ok(total)
    }

    /// Reports `pass` (made by the algorithm, or by a streaming call of its own) as the next
    /// iteration, with `count` vertices active and its total as the value.
    pub fn report(&mut self, pass: PassStats, count: u64) -> Result<()> {
        let (total, seconds) = (pass.total, pass.seconds);
        self.ctx.report(Iteration::new(
            self.done,
            pass,
            count,
            total as f64,
            seconds,
        ))?;
        self.done += 1;
        Ok(())
    }

    /// What the algorithm talks to (its progress and collectives).
    pub fn ctx(&mut self) -> &mut Ctx<'a, 'g> {
        self.ctx
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
    ctx.report(Iteration::new(
        iteration,
        pass,
        active,
        0.0,
        t0.elapsed().as_secs_f64(),
    ))
}

/// A 64-bit hash of vertex `v` under `seed` (SplitMix64's mixer), for per-vertex random
/// choices that need no stored state.
#[inline]
pub fn vertex_hash(seed: u64, v: u64) -> u64 {
    let mut z = seed ^ v.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `min(k, n)` distinct vertices of a graph of `n` drawn from `seed`, in the order drawn.
pub fn sample_vertices(seed: u64, n: u64, k: u64) -> Vec<u64> {
    let mut rng = strata_store::rng::Rng::new(seed);
    let mut picked = std::collections::HashSet::new();
    let mut out: Vec<u64> = Vec::new();
    while (out.len() as u64) < n.min(k) {
        let v = rng.below(n);
        if picked.insert(v) {
            out.push(v);
        }
    }
    out
}

/// `root` is a vertex of a graph of `n` vertices, or an error naming option `root`.
pub(crate) fn check_root(root: u64, n: u64) -> Result<()> {
    if root >= n {
        return Err(GridError::config(
            "root",
            format!("vertex {root} is not in the graph (0..{n})"),
        ));
    }
    Ok(())
}

/// Base vertex of every chunk, and the end (P + 1 entries): what kernels add in-block ids to.
pub(crate) fn chunk_bases(s: &Streamer) -> Vec<u64> {
    let l = *s.grid().layout();
    (0..=l.partitions).map(|i| l.base(i)).collect()
}
