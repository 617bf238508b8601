//! `strata run ALGO`: find (or build) a grid, plan the budget and placement, connect far
//! memory, run the algorithm with per-iteration reports, and write the results.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use strata_farmem::FarClient;
use strata_io::progress::Progress;
use strata_store::array::NpyWriter;
use strata_store::npy::DType;
use strata_store::units::fmt_bytes;

use crate::algo::{Ctx, Iteration, Output, Values, NONE};
use crate::block_codec::Compression;
use crate::budget::{self, GridPlan};
use crate::build::{build, BuildJob};
use crate::checkpoint::Checkpoints;
use crate::config::RunJob;
use crate::dist::{Collective, Dist, DistSummary, RankFigures};
use crate::error::{GridError, Result};
use crate::far::{self, FarSetup};
use crate::grid::{is_grid_dir, Grid};
use crate::layout::{GridManifest, Order};
use crate::place::Placement;
use crate::stream::{PassStats, StreamConfig, Streamer, Tier};
use crate::vertex::VertexMemory;
use strata_store::budget::{MemoryPlan, Planned};

/// What a run did.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    pub algorithm: String,
    pub grid: PathBuf,
    pub out: PathBuf,
    pub iterations: usize,
    pub seconds: f64,
    /// Seconds of the iterations only (no grid build, loading or far preload).
    pub compute_seconds: f64,
    pub edges: u64,
    pub edges_per_second: f64,
    pub bytes_disk: u64,
    pub bytes_far: u64,
    pub bytes_local: u64,
    /// Windowed vertex data: bytes paged in and dirtied (see [`PassStats`]).
    pub bytes_vertex_read: u64,
    pub bytes_vertex_written: u64,
    /// How the grid stores its blocks (`none`, `byte`, `packed`), and in how many bytes an
    /// edge on average (8 plain).
    pub compression: String,
    pub stored_bytes_per_edge: f64,
    /// Compressed grids: edges the fetch stage decoded, and the fetchers' seconds decoding
    /// (summed over fetchers; decoded bytes are 8 an edge).
    pub edges_decoded: u64,
    pub decode_seconds: f64,
    pub placement: Placement,
    /// The plan in the shape every engine's takes.
    pub memory_plan: MemoryPlan,
    pub stream: StreamConfig,
    pub far: Option<FarSetup>,
    /// Set when far memory was lost during the run (it went on from disk).
    pub far_failure: Option<String>,
    /// The result arrays written (none on the ranks other than 0 of a distributed run).
    pub arrays: Vec<String>,
    pub result: serde_json::Map<String, serde_json::Value>,
    /// The ranks of a distributed run and their figures.
    pub dist: Option<DistSummary>,
}

/// Runs `job`; `on_iteration` sees every iteration as it ends.
pub fn run(
    job: &RunJob,
    progress: &dyn Progress,
    on_iteration: &mut dyn FnMut(&Iteration) -> Result<()>,
) -> Result<RunSummary> {
    run_with(job, None, progress, on_iteration)
}

/// Runs `job` as one rank of `group` (see [`crate::dist`]): this rank streams its own columns,
/// exchanges vertex values with the others each iteration, and rank 0 writes the results.
/// Every rank must run the same job on the same grid.
pub fn run_distributed(
    job: &RunJob,
    group: &mut dyn Collective,
    progress: &dyn Progress,
    on_iteration: &mut dyn FnMut(&Iteration) -> Result<()>,
) -> Result<RunSummary> {
    run_with(job, Some(group), progress, on_iteration)
}

fn run_with(
    job: &RunJob,
    group: Option<&mut dyn Collective>,
    progress: &dyn Progress,
    on_iteration: &mut dyn FnMut(&Iteration) -> Result<()>,
) -> Result<RunSummary> {
    let t0 = Instant::now();
    if group.is_some() && !job.algorithm.distributed() {
        return Err(GridError::config(
            "algorithm",
            format!(
                "{} runs in one process only, not in a distributed group",
                job.algorithm.name()
            ),
        ));
    }
    let (dir, grid) = open_grid(job, group.is_none(), progress)?;
    let mut dist = group.map(|g| Dist::new(g, &grid)).transpose()?;
    let out_dir = job.out.clone().unwrap_or_else(|| {
        job.store
            .join("runs")
            .join(format!("grid-{}", job.algorithm.name()))
    });
    if let (Some(d), Some(every)) = (dist.as_mut(), job.checkpoint_seconds) {
        d.checkpoints = Some(Checkpoints::open(
            &out_dir,
            d.rank(),
            every,
            d.restarted(),
            job.algorithm.name(),
            job.algorithm.params(),
        )?);
    }
    let columns = match &dist {
        Some(d) => {
            let mine = d.columns[d.rank()].clone();
            progress.message(&format!(
                "rank {} of {}: columns {}..{} of {}, vertices {}..{}",
                d.rank(),
                d.world_size(),
                mine.start,
                mine.end,
                grid.layout().partitions,
                d.owned().start,
                d.owned().end
            ));
            mine
        }
        None => 0..grid.layout().partitions,
    };
    let threads = strata_io::resolve_threads(job.threads);
    let (far_client, far_setup) = match &job.far {
        Some(cfg) => {
            let (client, setup) = far::connect(cfg, progress)?;
            (Some(client), Some(setup))
        }
        None => (None, None),
    };
    let group_anon_bytes = dist.as_ref().and_then(|d| d.group_anon_bytes());
    let plan = budget::plan(
        job,
        &grid,
        threads,
        far_setup.as_ref(),
        columns.clone(),
        group_anon_bytes,
    )?;
    announce(job, &dir, &grid, &plan, far_setup.as_ref(), progress);
    let memory_plan = plan.memory_plan();
    memory_plan
        .check_machine(strata_store::budget::physical_memory())
        .map_err(GridError::Budget)?;
    let (tiers, far_client) = offload(&grid, &plan, far_client, progress);
    let vertex = match plan.placement.vertex_windowed {
        true => VertexMemory::windowed(&out_dir)?,
        false => VertexMemory::Heap,
    };
    let GridPlan {
        weighted,
        segments,
        stream,
        placement,
        compression,
        stored_bytes_per_edge,
        ..
    } = plan;
    let mut streamer = Streamer::new(
        grid,
        segments,
        tiers,
        far_client,
        weighted,
        stream.clone(),
        vertex,
        progress,
    )?;
    streamer.own(columns.clone());
    streamer.set_scratch_dir(&out_dir);
    let (output, totals, compute) =
        iterate(job, &mut streamer, progress, dist.as_mut(), on_iteration)?;
    let dist = match dist.as_mut() {
        Some(d) => {
            let (sent, received) = d.traffic();
            let owned = d.owned();
            let mine = RankFigures {
                rank: d.rank(),
                columns: [columns.start, columns.end],
                vertices: [owned.start, owned.end],
                edges: totals.edges,
                bytes_disk: totals.bytes_disk,
                bytes_far: totals.bytes_far,
                bytes_local: totals.bytes_local,
                bytes_sent: sent,
                bytes_received: received,
                compute_seconds: compute,
                checkpoints: d
                    .checkpoints
                    .as_ref()
                    .map(|c| c.figures.clone())
                    .unwrap_or_default(),
            };
            let summary = d.summary(mine)?;
            // The iterations are over: a group restarted from here redoes the run from the
            // beginning, to the same results.
            if let Some(c) = &d.checkpoints {
                c.finish()?;
            }
            Some(summary)
        }
        None => None,
    };
    let arrays = match dist.as_ref().is_none_or(|d| d.rank == 0) {
        true => write_results(&out_dir, &output.arrays)?,
        false => Vec::new(),
    };
    Ok(RunSummary {
        algorithm: job.algorithm.name().to_string(),
        grid: dir,
        out: out_dir,
        iterations: output.iterations,
        seconds: t0.elapsed().as_secs_f64(),
        compute_seconds: compute,
        edges: totals.edges,
        edges_per_second: totals.edges as f64 / compute.max(1e-9),
        bytes_disk: totals.bytes_disk,
        bytes_far: totals.bytes_far,
        bytes_local: totals.bytes_local,
        bytes_vertex_read: totals.bytes_vertex_read,
        bytes_vertex_written: totals.bytes_vertex_written,
        compression: compression.name().to_string(),
        stored_bytes_per_edge,
        edges_decoded: totals.edges_decoded,
        decode_seconds: totals.decode_seconds,
        placement,
        memory_plan,
        stream,
        far: far_setup,
        far_failure: streamer.far_failure(),
        arrays,
        result: output.summary,
        dist,
    })
}

/// Checks the algorithm against the store and opens the grid it runs on (found, or built when
/// `may_build`), refusing a grid built for another vertex count.
fn open_grid(
    job: &RunJob,
    may_build: bool,
    progress: &dyn Progress,
) -> Result<(PathBuf, Arc<Grid>)> {
    let n = match is_grid_dir(&job.store) {
        true => GridManifest::load(&job.store)?.num_vertices,
        false => {
            strata_store::Store::open(&job.store)?
                .manifest()
                .graph
                .num_nodes
        }
    };
    job.algorithm.validate()?;
    job.algorithm.check(n)?;
    let dir = find_or_build(job, may_build, progress)?;
    let grid = Arc::new(Grid::open(&dir)?);
    if grid.manifest().num_vertices != n {
        return Err(GridError::invalid(
            &dir,
            format!(
                "has {} vertices, the store {n}: rebuild it",
                grid.manifest().num_vertices
            ),
        ));
    }
    Ok((dir, grid))
}

/// Tells the user what the run will do: the grid, the plan and the threads.
fn announce(
    job: &RunJob,
    dir: &Path,
    grid: &Grid,
    plan: &GridPlan,
    far: Option<&FarSetup>,
    progress: &dyn Progress,
) {
    progress.message(&format!(
        "{}: grid {} ({} vertices, {} edges, P = {}, {} order), {} segments of up to {}",
        job.algorithm.name(),
        dir.file_name().unwrap_or_default().to_string_lossy(),
        grid.manifest().num_vertices,
        grid.manifest().num_edges,
        grid.layout().partitions,
        grid.layout().order.name(),
        plan.segments.len(),
        fmt_bytes(plan.segment_bytes)
    ));
    for line in plan.memory_plan().describe() {
        progress.message(&line);
    }
    let stream = &plan.stream;
    progress.message(&format!(
        "threads: {} compute, {} disk fetchers{}, prefetch {} segments per source",
        stream.threads,
        stream.disk_fetchers,
        far.map_or(String::new(), |f| format!(
            ", {} far fetchers over {} connections",
            f.fetchers, f.connections
        )),
        stream.prefetch
    ));
}

/// Copies the segments placed in far memory to the memory server; returns each segment's
/// tier and the client to fetch with. When the copy fails the run goes on from disk: those
/// segments become disk segments and the client is dropped.
fn offload(
    grid: &Grid,
    plan: &GridPlan,
    far_client: Option<Arc<FarClient>>,
    progress: &dyn Progress,
) -> (Vec<Tier>, Option<Arc<FarClient>>) {
    let mut tiers = plan.placement.tiers.clone();
    let Some(client) = far_client else {
        return (tiers, None);
    };
    match far::preload(
        &client,
        grid,
        &plan.segments,
        &tiers,
        plan.weighted,
        progress,
    ) {
        Ok(()) => (tiers, Some(client)),
        Err(e) => {
            progress.message(&format!("warning: could not place edge blocks in far memory ({e}); streaming them from disk"));
            tiers
                .iter_mut()
                .filter(|t| **t == Tier::Far)
                .for_each(|t| *t = Tier::Disk);
            (tiers, None)
        }
    }
}

/// Runs the algorithm on `streamer` (as a rank of `dist`), passing each iteration to
/// `on_iteration`; returns its output, the passes' totals and the seconds spent in iterations.
fn iterate(
    job: &RunJob,
    streamer: &mut Streamer,
    progress: &dyn Progress,
    dist: Option<&mut Dist>,
    on_iteration: &mut dyn FnMut(&Iteration) -> Result<()>,
) -> Result<(Output, PassStats, f64)> {
    let mut totals = PassStats::default();
    let mut compute = 0.0;
    let mut record = |it: &Iteration| -> Result<()> {
        totals.edges += it.pass.edges;
        totals.bytes_disk += it.pass.bytes_disk;
        totals.bytes_far += it.pass.bytes_far;
        totals.bytes_local += it.pass.bytes_local;
        totals.bytes_vertex_read += it.pass.bytes_vertex_read;
        totals.bytes_vertex_written += it.pass.bytes_vertex_written;
        totals.edges_decoded += it.pass.edges_decoded;
        totals.decode_seconds += it.pass.decode_seconds;
        compute += it.seconds;
        on_iteration(it)
    };
    let mut ctx = Ctx {
        progress,
        on_iteration: &mut record,
        dist,
    };
    let output = job.algorithm.run(streamer, &mut ctx)?;
    Ok((output, totals, compute))
}

/// The grid a run uses: the named one, one that suits the algorithm, or (when `may_build`) a
/// new one.
fn find_or_build(job: &RunJob, may_build: bool, progress: &dyn Progress) -> Result<PathBuf> {
    let algo = &job.algorithm;
    let wanted = job.weights_wanted()?;
    let weighted = wanted.is_some();
    let (symmetric, simple) = (algo.needs_symmetric(), algo.needs_simple());
    let needs = (symmetric, simple);
    if let Some(dir) = Grid::find(&job.store, job.grid.as_deref(), wanted.as_ref(), needs)? {
        let m = Grid::open(&dir)?.manifest().clone();
        // A grid built from an input is the only grid there is: say how to build the one needed.
        let rebuild = |flag: &str| match is_grid_dir(&job.store) {
            true => format!(
                "; build one from the input with `strata grid build INPUT {flag} --out DIR`"
            ),
            false => String::new(),
        };
        if weighted && m.weights.is_none() {
            return Err(GridError::config(
                "grid",
                format!(
                    "{} has no weights and {} needs them{}",
                    dir.display(),
                    algo.name(),
                    rebuild("--weighted")
                ),
            ));
        }
        if symmetric && !m.symmetric {
            return Err(GridError::config(
                "grid",
                format!(
                    "{} is not symmetric and {} needs it{}",
                    dir.display(),
                    algo.name(),
                    rebuild("--symmetrize")
                ),
            ));
        }
        if simple && !m.simple {
            // A symmetric grid of a store that holds both directions holds each edge twice.
            return Err(GridError::config(
                "grid",
                format!(
                    "{} is not simple and {} needs it (it may hold an edge more than once, or \
                     a self-loop): build one with `strata grid build {} --symmetrize --simple`, \
                     or leave out the grid to have one built{}",
                    dir.display(),
                    algo.name(),
                    job.store.display(),
                    rebuild("--symmetrize --simple")
                ),
            ));
        }
        return Ok(dir);
    }
    if !may_build {
        // Ranks sharing a store would build the same grid at once.
        return Err(GridError::config(
            "grid",
            format!(
                "no {}{}{}grid for {} in {}: a distributed run does not build one; run `strata grid build {}{}{}{}` \
                 on every rank's copy of the store first",
                if simple { "simple " } else { "" },
                if symmetric { "symmetric " } else { "" },
                if weighted { "weighted " } else { "" },
                algo.name(),
                job.store.display(),
                job.store.display(),
                if symmetric { " --symmetrize" } else { "" },
                if simple { " --simple" } else { "" },
                if weighted { " --weighted" } else { "" },
            ),
        ));
    }
    progress.message(&format!(
        "no {}{}{}grid for {} yet: building one",
        if simple { "simple " } else { "" },
        if symmetric { "symmetric " } else { "" },
        if weighted { "weighted " } else { "" },
        algo.name()
    ));
    // The build resolves the request as weights_wanted did, so the grid is the one looked for.
    let weights = weighted.then(|| job.weights.unwrap_or_default());
    let built = build(
        &BuildJob {
            store: job.store.clone(),
            name: String::new(),
            partitions: 0,
            order: Order::Column,
            symmetrize: Some(symmetric),
            simple,
            weights,
            memory: job.memory,
            overwrite: false,
            compression: Compression::None,
        },
        progress,
    )?;
    Ok(built.dir)
}

/// Writes result arrays as `NAME.npy` in `dir`, each replacing an earlier one atomically and
/// durably ([`strata_io::durable::replace_file_by`]), a batch of values at a time so that
/// windowed arrays are never copied whole; returns the paths.
fn write_results(dir: &Path, arrays: &[(String, Values)]) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| GridError::os("mkdir", dir, e))?;
    let mut out = Vec::new();
    for (name, values) in arrays {
        let path = dir.join(format!("{name}.npy"));
        let write = |tmp: &Path| match values {
            Values::F32(a) => write_npy(tmp, DType::F32, a.len(), |i| a.get(i)),
            Values::F64(a) => write_npy(tmp, DType::F64, a.len(), |i| a.get(i)),
            Values::Ids(a) => write_npy(tmp, DType::I64, a.len(), |i| match a.get(i) {
                NONE => -1i64,
                x => x as i64,
            }),
        };
        strata_io::durable::replace_file_by(&path, write, || {})?;
        out.push(path.to_string_lossy().into_owned());
    }
    Ok(out)
}

/// Writes `get(0..n)` as a 1-D `.npy` of `dtype` at `path`.
fn write_npy<T: bytemuck::Pod>(
    path: &Path,
    dtype: DType,
    n: usize,
    get: impl Fn(usize) -> T,
) -> Result<()> {
    const BATCH: usize = 1 << 16;
    let mut w = NpyWriter::create(path, dtype, &[], 1 << 20)?;
    let mut batch = Vec::with_capacity(BATCH.min(n));
    for start in (0..n).step_by(BATCH) {
        batch.clear();
        batch.extend((start..(start + BATCH).min(n)).map(&get));
        w.write(&batch)?;
    }
    w.finish()?;
    Ok(())
}
