//! `strata run ALGO`: find (or build) a grid, plan the budget and placement, connect far
//! memory, run the algorithm with per-iteration reports, and write the results.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_io::progress::Progress;
use strata_store::array::NpyWriter;
use strata_store::npy::DType;
use strata_store::units::fmt_bytes;

use crate::algo::{AlgoConfig, Ctx, Iteration, Values, NONE};
use crate::build::{build, BuildJob};
use crate::error::{GridError, Result};
use crate::far::{self, FarConfig, FarSetup};
use crate::grid::Grid;
use crate::layout::{Order, WeightSpec, EDGE_BYTES};
use crate::place::{place, PlaceInput, Placement, VertexPlacement};
use crate::stream::{PassStats, StreamConfig, Streamer, Tier};
use crate::vertex::VertexMemory;

/// One run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunJob {
    pub store: PathBuf,
    pub algorithm: AlgoConfig,
    /// Grid name under `STORE/grids/`; `None` finds one that suits the algorithm or builds it.
    #[serde(default)]
    pub grid: Option<String>,
    /// Local memory budget in bytes.
    pub memory: u64,
    /// Compute threads; 0: one per core.
    #[serde(default)]
    pub threads: usize,
    /// Largest segment (unit of placement and fetch) in bytes; 0 sizes segments from the
    /// budget (see [`MAX_AUTO_SEGMENT`]).
    #[serde(default)]
    pub segment_bytes: u64,
    /// Segments fetched or waiting per source: 1 fetches the next segment only once compute
    /// has finished the last (no prefetch); 2 is double buffering.
    #[serde(default = "default_prefetch")]
    pub prefetch: usize,
    /// Threads reading from disk.
    #[serde(default = "default_disk_fetchers")]
    pub disk_fetchers: usize,
    /// Vertex data in memory, in windows, or whichever the budget allows.
    #[serde(default)]
    pub vertex: VertexPlacement,
    /// Far memory, when used.
    #[serde(default)]
    pub far: Option<FarConfig>,
    /// Keep edge blocks resident in memory when the budget allows (false: stream them from
    /// disk every pass, as an out-of-core run of a larger graph would).
    #[serde(default = "default_true")]
    pub keep_resident: bool,
    /// Where results go; `None`: `STORE/runs/grid-ALGO`.
    #[serde(default)]
    pub out: Option<PathBuf>,
    /// Weights drawn when a weighted grid must be built.
    #[serde(default)]
    pub weights: Option<WeightSpec>,
}

fn default_true() -> bool {
    true
}

/// The largest and smallest segments chosen automatically, in bytes: big enough for
/// sequential reads, small enough that the fetch buffers take at most a third of the budget.
pub const MAX_AUTO_SEGMENT: u64 = 4 << 20;
pub const MIN_AUTO_SEGMENT: u64 = 256 << 10;

/// Deep enough that the SSD sees about 32 MiB of reads in flight at 4 MiB segments: at 4 and 2,
/// PageRank out of core at RMAT scale 24 read at 77% of sequential bandwidth, at 8 and 4 at 95%.
fn default_prefetch() -> usize {
    8
}

fn default_disk_fetchers() -> usize {
    4
}

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
    pub placement: Placement,
    pub stream: StreamConfig,
    pub far: Option<FarSetup>,
    /// Set when far memory was lost during the run (it went on from disk).
    pub far_failure: Option<String>,
    pub arrays: Vec<String>,
    pub result: serde_json::Map<String, serde_json::Value>,
}

/// Runs `job`; `on_iteration` sees every iteration as it ends.
pub fn run(
    job: &RunJob,
    progress: &dyn Progress,
    on_iteration: &mut dyn FnMut(&Iteration) -> Result<()>,
) -> Result<RunSummary> {
    let t0 = Instant::now();
    let store = strata_store::Store::open(&job.store)?;
    let n = store.manifest().graph.num_nodes;
    job.algorithm.check(n)?;
    let algo = &job.algorithm;
    let dir = find_or_build(job, progress)?;
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
    let threads = strata_io::resolve_threads(job.threads);
    let weighted = algo.needs_weights() || matches!(algo, AlgoConfig::Spmv { weighted: true, .. });
    let bytes_per_edge = EDGE_BYTES + if weighted { 4 } else { 0 };
    let mut stream = StreamConfig {
        threads,
        disk_fetchers: job.disk_fetchers.max(1),
        far_fetchers: 0,
        prefetch: job.prefetch,
    };
    let far_fetchers = job.far.as_ref().map_or(0, |f| f.fetchers.max(1));
    // Each fetcher holds one segment in flight and `prefetch` per source wait for compute.
    let buffers_held = (job.prefetch.max(1) * 2 + stream.disk_fetchers + far_fetchers) as u64;
    let buffers_for = |segments: &[crate::grid::Segment]| {
        let largest = segments.iter().map(|s| s.edge_bytes()).max().unwrap_or(0);
        (largest * bytes_per_edge / EDGE_BYTES + (2 << 12)) * buffers_held
    };
    let mut segment_bytes = job.segment_bytes;
    if segment_bytes == 0 {
        segment_bytes = MAX_AUTO_SEGMENT;
        while segment_bytes > MIN_AUTO_SEGMENT
            && buffers_for(&grid.segments(segment_bytes)) > job.memory / 3
        {
            segment_bytes /= 2;
        }
    }
    let segments = grid.segments(segment_bytes);
    let buffer_bytes = buffers_for(&segments);
    let vertex_bytes = algo.vertex_bytes() * n;
    // Windowed, each compute thread holds a source and a destination chunk; bitmaps stay whole.
    let layout = *grid.layout();
    let chunk = (0..layout.partitions)
        .map(|i| layout.chunk_len(i))
        .max()
        .unwrap_or(0);
    let window_bytes =
        (2 * threads as u64 * chunk * algo.vertex_bytes() + n.div_ceil(4)).min(vertex_bytes);
    let mut far_client = None;
    let mut far_setup = None;
    let mut far_capacity = 0;
    if let Some(cfg) = &job.far {
        let (client, setup) = far::connect(cfg, progress)?;
        far_capacity = setup.free_capacity;
        stream.far_fetchers = setup.fetchers;
        far_client = Some(client);
        far_setup = Some(setup);
    }
    let input = PlaceInput {
        vertex_bytes,
        window_bytes,
        vertex_placement: job.vertex,
        buffer_bytes,
        bytes_per_edge,
        memory: job.memory,
        far_ratio: job.far.as_ref().map(|f| f.ratio),
        far_capacity,
        keep_resident: job.keep_resident,
    };
    let placement = place(&segments, &input)?;
    progress.message(&format!(
        "{}: grid {} ({} vertices, {} edges, P = {}, {} order), {} segments of up to {}",
        algo.name(),
        dir.file_name().unwrap_or_default().to_string_lossy(),
        n,
        grid.manifest().num_edges,
        grid.layout().partitions,
        grid.layout().order.name(),
        segments.len(),
        fmt_bytes(segment_bytes)
    ));
    for line in placement.describe(job.memory) {
        progress.message(&line);
    }
    progress.message(&format!(
        "threads: {} compute, {} disk fetchers{}, prefetch {} segments per source",
        stream.threads,
        stream.disk_fetchers,
        far_setup.as_ref().map_or(String::new(), |f| format!(
            ", {} far fetchers over {} connections",
            f.fetchers, f.connections
        )),
        stream.prefetch
    ));
    let mut tiers = placement.tiers.clone();
    if let Some(client) = &far_client {
        if let Err(e) = far::preload(client, &grid, &segments, &tiers, weighted, progress) {
            progress.message(&format!("warning: could not place edge blocks in far memory ({e}); streaming them from disk"));
            tiers
                .iter_mut()
                .filter(|t| **t == Tier::Far)
                .for_each(|t| *t = Tier::Disk);
            far_client = None;
        }
    }
    let out_dir = job
        .out
        .clone()
        .unwrap_or_else(|| job.store.join("runs").join(format!("grid-{}", algo.name())));
    let vertex = match placement.vertex_windowed {
        true => VertexMemory::windowed(&out_dir)?,
        false => VertexMemory::Heap,
    };
    let mut streamer = Streamer::new(
        grid.clone(),
        segments,
        tiers,
        far_client,
        weighted,
        stream.clone(),
        vertex,
        progress,
    )?;
    let mut totals = PassStats::default();
    let mut compute = 0.0;
    let mut record = |it: &Iteration| -> Result<()> {
        totals.edges += it.pass.edges;
        totals.bytes_disk += it.pass.bytes_disk;
        totals.bytes_far += it.pass.bytes_far;
        totals.bytes_local += it.pass.bytes_local;
        totals.bytes_vertex_read += it.pass.bytes_vertex_read;
        totals.bytes_vertex_written += it.pass.bytes_vertex_written;
        compute += it.seconds;
        on_iteration(it)
    };
    let output = {
        let mut ctx = Ctx {
            progress,
            on_iteration: &mut record,
        };
        algo.run(&mut streamer, &mut ctx)?
    };
    let arrays = write_results(&out_dir, &output.arrays)?;
    Ok(RunSummary {
        algorithm: algo.name().to_string(),
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
        placement,
        stream,
        far: far_setup,
        far_failure: streamer.far_failure(),
        arrays,
        result: output.summary,
    })
}

/// The grid a run uses: the named one, one that suits the algorithm, or a new one.
fn find_or_build(job: &RunJob, progress: &dyn Progress) -> Result<PathBuf> {
    let algo = &job.algorithm;
    let weighted = algo.needs_weights();
    let symmetric = algo.needs_symmetric();
    if let Some(dir) = Grid::find(&job.store, job.grid.as_deref(), weighted, symmetric)? {
        let m = Grid::open(&dir)?.manifest().clone();
        if weighted && m.weights.is_none() {
            return Err(GridError::config(
                "grid",
                format!(
                    "{} has no weights and {} needs them",
                    dir.display(),
                    algo.name()
                ),
            ));
        }
        if symmetric && !m.symmetric {
            return Err(GridError::config(
                "grid",
                format!(
                    "{} is not symmetric and {} needs it",
                    dir.display(),
                    algo.name()
                ),
            ));
        }
        return Ok(dir);
    }
    progress.message(&format!(
        "no {}{}grid for {} yet: building one",
        if symmetric { "symmetric " } else { "" },
        if weighted { "weighted " } else { "" },
        algo.name()
    ));
    let weights = weighted.then(|| {
        job.weights.clone().unwrap_or(WeightSpec {
            kind: "random".into(),
            seed: 0,
            low: 0.0,
            high: 1.0,
        })
    });
    let built = build(
        &BuildJob {
            store: job.store.clone(),
            name: String::new(),
            partitions: 0,
            order: Order::Column,
            symmetrize: Some(symmetric),
            weights,
            memory: job.memory,
            overwrite: false,
        },
        progress,
    )?;
    Ok(built.dir)
}

/// Writes result arrays as `NAME.npy` in `dir` (replacing earlier ones), a batch of values at
/// a time so that windowed arrays are never copied whole; returns the paths.
fn write_results(dir: &Path, arrays: &[(String, Values)]) -> Result<Vec<String>> {
    std::fs::create_dir_all(dir).map_err(|e| GridError::os("mkdir", dir, e))?;
    let mut out = Vec::new();
    for (name, values) in arrays {
        let path = dir.join(format!("{name}.npy"));
        let tmp = dir.join(format!(".{name}.npy.partial"));
        match values {
            Values::F32(a) => write_npy(&tmp, DType::F32, a.len(), |i| a.get(i))?,
            Values::F64(a) => write_npy(&tmp, DType::F64, a.len(), |i| a.get(i))?,
            Values::Ids(a) => write_npy(&tmp, DType::I64, a.len(), |i| match a.get(i) {
                NONE => -1i64,
                x => x as i64,
            })?,
        }
        std::fs::rename(&tmp, &path).map_err(|e| GridError::os("rename", &path, e))?;
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
