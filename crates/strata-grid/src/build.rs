//! `strata grid build`: edges into a P x P grid of blocks, streaming, in two passes within a
//! memory budget, from a store's train edges ([`build`]) or straight from an input edge list
//! ([`crate::input`]).
//!
//! Pass 1 ([`crate::spool`]) reads the edges once and bins each edge, and its reverse when
//! symmetrised, by major chunk (its destination chunk in column order) into one spool file of
//! large sequential writes. Pass 2 ([`crate::blocks`]) reads each major chunk's records back,
//! counting-sorts them by minor chunk into their blocks and appends them to `edges.npy` (and
//! their weights to `weights.npy`), so the edge file is written sequentially and memory holds
//! one major chunk, not the graph. A compressed grid (`compression` packed or byte) codes each
//! block as pass 2 writes it, into `edge_codes.npy` ([`crate::block_codec`]). The grid is written into a `.partial-PID` directory and
//! published only when complete (files, directory and parent fsynced, then renamed or swapped
//! with the old grid: `strata_io::durable::publish_dir`); readers refuse `.partial-PID`
//! directories, so a killed build leaves no grid that opens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::array::{decode_ints, NpyWriter, RowReader};
use strata_store::config::Size;
use strata_store::ids::IdCheck;
use strata_store::npy::DType;
use strata_store::units::fmt_bytes;
use strata_store::{ArrayInfo, Store};

use crate::block_codec::Compression;
use crate::blocks::{sort_pass, SortInput, Sorted};
use crate::build_budget::{BuildPlan, SPOOL_IN_FLIGHT};
use crate::error::{GridError, Result};
use crate::layout::{
    format_version, GridManifest, Layout, Order, WeightRequest, WeightSource, WeightSpec,
    CODE_INDEX, GRID_FORMAT, GRID_MANIFEST, STORE_WEIGHTS,
};
use crate::spool::{Binner, RecordFormat};

/// Grids of one default name (differing weights) before a build asks for a name.
const MAX_DEFAULT_NAMES: u32 = 100;
/// Vertex state the automatic P plans for (GridGraph's PageRank: 12 B, plus bitmaps).
pub(crate) const PLAN_VERTEX_BYTES: u64 = 16;

/// What to build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuildJob {
    pub store: PathBuf,
    /// Directory name under `STORE/grids/`; empty: `p{P}-{order}[-sym][-simple][-w]`.
    pub name: String,
    /// Vertex chunks P; 0 chooses from the vertex count and `memory`.
    pub partitions: u32,
    pub order: Order,
    /// Store both directions of every edge; `None` follows the store's `symmetrized` flag.
    pub symmetrize: Option<bool>,
    /// Drop self-loops and store each repeated edge once (with `symmetrize`, an edge given in
    /// both directions is one undirected edge); unweighted grids only.
    pub simple: bool,
    /// Weight the edges (needed by SSSP and weighted SpMV): the store's weights or drawn ones.
    pub weights: Option<WeightRequest>,
    /// Memory budget of the build and of the runs P is planned for.
    pub memory: Size,
    /// Replace an existing grid of the same name.
    pub overwrite: bool,
    /// How blocks store their edges: plain records or a code.
    pub compression: Compression,
}

impl Default for BuildJob {
    fn default() -> Self {
        BuildJob {
            store: PathBuf::new(),
            name: String::new(),
            partitions: 0,
            order: Order::Column,
            symmetrize: None,
            simple: false,
            weights: None,
            memory: Size(1 << 30),
            overwrite: false,
            compression: Compression::None,
        }
    }
}

/// One step of a build: its wall time, the processor time it took and the bytes it read and
/// wrote.
#[derive(Debug, Clone, Serialize)]
pub struct BuildStage {
    /// `count` (the node count pass), `parse` (text), `spool` (pass 1), `blocks` (pass 2).
    pub name: String,
    pub seconds: f64,
    /// User and system time of the process over the step, all threads (on a shared machine
    /// the wall time says how busy the machine was, this what the step cost).
    pub cpu_seconds: f64,
    pub read_bytes: u64,
    pub written_bytes: u64,
}

/// The wall clock and the process's processor time at the start of a step.
pub(crate) struct StageClock {
    wall: Instant,
    cpu: f64,
}

impl StageClock {
    pub fn start() -> StageClock {
        StageClock {
            wall: Instant::now(),
            cpu: process_cpu_seconds(),
        }
    }

    /// The step `name` since the start, with its bytes.
    pub fn stage(&self, name: &str, read_bytes: u64, written_bytes: u64) -> BuildStage {
        BuildStage {
            name: name.into(),
            seconds: self.wall.elapsed().as_secs_f64(),
            cpu_seconds: process_cpu_seconds() - self.cpu,
            read_bytes,
            written_bytes,
        }
    }
}

/// User and system time of this process so far, in seconds.
fn process_cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct it is given and reads nothing else.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}

/// What a build did.
#[derive(Debug, Clone, Serialize)]
pub struct BuildSummary {
    pub dir: PathBuf,
    pub partitions: u32,
    pub num_vertices: u64,
    pub num_edges: u64,
    /// Bytes of the grid on disk.
    pub bytes: u64,
    pub seconds: f64,
    /// The steps in order, with their bytes.
    pub stages: Vec<BuildStage>,
    /// The budget plan, as printed.
    pub plan: Vec<String>,
}

/// Directory holding the grids of a store.
pub fn grids_dir(store: &Path) -> PathBuf {
    store.join("grids")
}

/// Builds the grid `job` asks for from the store's train edges.
pub fn build(job: &BuildJob, progress: &dyn Progress) -> Result<BuildSummary> {
    let t0 = Instant::now();
    let store = strata_store::open_checked(&job.store, progress)?;
    let n = store.manifest().graph.num_nodes;
    let symmetric = job.symmetrize.unwrap_or(store.manifest().graph.symmetrized);
    check_weights(job.weights.as_ref())?;
    check_simple(job.simple, job.weights.is_some())?;
    let weights = job
        .weights
        .map(|r| r.resolve(store.array(STORE_WEIGHTS).is_some(), &job.store))
        .transpose()?;
    let edges_info = store.require("edges_train")?.clone();
    let spec = GridSpec {
        layout: plan_layout(
            n,
            job.partitions,
            job.order,
            edges_info.shape[0],
            symmetric,
            job.memory.0,
        )?,
        symmetric,
        simple: job.simple,
        weights,
        memory: job.memory.0,
        input_edges: edges_info.shape[0],
        input_bytes: edges_info.data_bytes(),
        compression: job.compression,
    };
    let (parent, name) = target(job, &spec)?;
    let plan = spec.plan()?;
    let out = parent.join(&name);
    strata_store::store::remove_stale_partials(&parent, &name);
    let tmp = parent.join(format!("{name}.partial-{}", std::process::id()));
    let guard = PartialDir::create(&tmp)?;
    spec.announce(&plan, progress);
    let mut written = write_grid(&spec, &plan, &tmp, progress, |feed| {
        feed_store(&store, &edges_info, spec.weights.as_ref(), &plan, feed)
    })?;
    let stages = std::mem::take(&mut written.stages);
    let manifest = written.manifest(
        &spec,
        serde_json::json!({
            "store": job.store.canonicalize().unwrap_or(job.store.clone()),
            "store_name": store.manifest().name,
            "edges": "edges_train",
            "seconds": t0.elapsed().as_secs_f64(),
            "memory": job.memory,
        }),
    );
    publish(&tmp, &out, &manifest, guard)?;
    Ok(BuildSummary {
        bytes: dir_bytes(&out)?,
        dir: out,
        partitions: spec.layout.partitions,
        num_vertices: n,
        num_edges: manifest.num_edges,
        seconds: t0.elapsed().as_secs_f64(),
        stages,
        plan: plan.describe(),
    })
}

/// Writes `manifest` into `tmp` and publishes `tmp` as `out` (see the module's doc).
pub(crate) fn publish(
    tmp: &Path,
    out: &Path,
    manifest: &GridManifest,
    guard: PartialDir,
) -> Result<()> {
    let text = serde_json::to_string_pretty(manifest).expect("manifest serialises");
    write_synced(&tmp.join(GRID_MANIFEST), text.as_bytes())?;
    strata_io::durable::fault_point("grid.manifest_written");
    // Kept in the grid before it is published: a distributed run compares it across ranks.
    strata_store::digest::content_digest(tmp, GRID_MANIFEST)?;
    strata_io::durable::publish_dir(tmp, out, "grid")?;
    std::mem::forget(guard);
    Ok(())
}

/// The grid a build writes: geometry, symmetry, weights, budget, the size of its input
/// (for the meters and the plan) and how its blocks are stored.
pub(crate) struct GridSpec {
    pub layout: Layout,
    pub symmetric: bool,
    /// Self-loops dropped and repeated edges merged (`BuildJob::simple`).
    pub simple: bool,
    pub weights: Option<WeightSpec>,
    pub memory: u64,
    /// Edges the input holds (before symmetrising).
    pub input_edges: u64,
    /// Bytes pass 1 reads.
    pub input_bytes: u64,
    pub compression: Compression,
}

impl GridSpec {
    /// Records pass 1 spools (each edge twice when symmetrised, a bound with self-loops).
    fn records(&self) -> u64 {
        self.input_edges * if self.symmetric { 2 } else { 1 }
    }

    /// The spool's record format: weights in the records when they come with the edges.
    fn format(&self) -> RecordFormat {
        RecordFormat::new(&self.layout, self.weights == Some(WeightSpec::Store))
    }

    /// The build's plan within the budget.
    pub fn plan(&self) -> Result<BuildPlan> {
        BuildPlan::new(
            self.memory,
            &self.layout,
            self.format(),
            self.records(),
            self.weights.is_some(),
            self.compression,
        )
    }

    /// Prints what will be built and the plan.
    pub fn announce(&self, plan: &BuildPlan, progress: &dyn Progress) {
        let l = &self.layout;
        progress.message(&format!(
            "grid: {} vertices in {} chunks of {}, {} edges in {} blocks ({} order{}{}{}), budget {}",
            l.num_vertices,
            l.partitions,
            l.chunk_size,
            self.records(),
            l.blocks(),
            l.order.name(),
            match (self.symmetric, self.simple) {
                (true, true) => ", symmetrised, simple",
                (true, false) => ", symmetrised",
                (false, true) => ", simple",
                (false, false) => "",
            },
            match self.weights {
                Some(WeightSpec::Store) => ", weighted by the edges' own weights",
                Some(WeightSpec::Random { .. }) => ", weighted by drawn weights",
                None => "",
            },
            match self.compression {
                Compression::None => String::new(),
                c => format!(", {} compression", c.name()),
            },
            fmt_bytes(self.memory)
        ));
        for line in plan.describe() {
            progress.message(&line);
        }
    }
}

/// Pass 1's end of the pipe: the binner and the meter of the input read.
pub(crate) struct Feed<'a> {
    binner: Binner,
    meter: Meter<'a>,
}

impl Feed<'_> {
    /// Bins edges `src[k] -> dst[k]` (global ids, already checked) with `weight[k]` when the
    /// weights come with the edges; `bytes` is the input they were read from.
    pub fn add(&mut self, src: &[u64], dst: &[u64], weight: &[f32], bytes: u64) -> Result<()> {
        self.binner.add(src, dst, weight)?;
        Ok(self.meter.add(src.len() as u64, bytes)?)
    }
}

/// What [`write_grid`] leaves in the grid's directory.
pub(crate) struct Written {
    sorted: Sorted,
    largest_major: u64,
    index: ArrayInfo,
    pub stages: Vec<BuildStage>,
    /// More arrays for the manifest (a node name table).
    pub extra: BTreeMap<String, ArrayInfo>,
}

impl Written {
    /// The grid's manifest, with `provenance`.
    pub fn manifest(self, spec: &GridSpec, provenance: serde_json::Value) -> GridManifest {
        let blocks = self.sorted.blocks;
        let mut arrays = self.extra;
        arrays.extend(blocks.arrays);
        arrays.insert("block_index".to_string(), self.index);
        arrays.insert("out_degree".to_string(), self.sorted.out_degree);
        arrays.insert("in_degree".to_string(), self.sorted.in_degree);
        GridManifest {
            format: GRID_FORMAT.to_string(),
            format_version: format_version(spec.compression),
            num_vertices: spec.layout.num_vertices,
            num_edges: blocks.written,
            partitions: spec.layout.partitions,
            chunk_size: spec.layout.chunk_size,
            order: spec.layout.order,
            symmetric: spec.symmetric,
            simple: spec.simple,
            weights: spec.weights.clone(),
            weight_range: blocks.weight_range,
            largest_block_edges: blocks.largest_block,
            largest_major_edges: self.largest_major,
            compression: spec.compression,
            arrays,
            provenance,
        }
    }
}

/// Writes a grid's arrays into `tmp` in two passes: `feed` hands every input edge to pass 1
/// through the [`Feed`]; pass 2 sorts the spool into blocks. Removes the spool.
pub(crate) fn write_grid(
    spec: &GridSpec,
    plan: &BuildPlan,
    tmp: &Path,
    progress: &dyn Progress,
    feed: impl FnOnce(&mut Feed) -> Result<()>,
) -> Result<Written> {
    let spool_path = tmp.join("spool.bin");
    let clock = StageClock::start();
    let binner = Binner::create(
        &spool_path,
        &spec.layout,
        spec.format(),
        (spec.symmetric, spec.simple),
        plan.spool_buffer as usize,
        SPOOL_IN_FLIGHT,
    )?;
    let mut pipe = Feed {
        binner,
        meter: Meter::new(progress, "grid: spool", spec.input_bytes, spec.input_edges),
    };
    feed(&mut pipe)?;
    let read = pipe.meter.bytes();
    pipe.meter.finish()?;
    let spool = pipe.binner.finish()?;
    strata_io::durable::fault_point("grid.spooled");
    let spooled = spool.total() * spool.format.bytes();
    let mut stages = vec![clock.stage("spool", read, spooled)];
    let clock = StageClock::start();
    let read_ahead = plan.check_sort(spool.largest(), &spec.layout)?;
    let input = SortInput {
        layout: &spec.layout,
        weights: spec.weights.as_ref(),
        read_ahead,
        degree_buffer: plan.degree_buffer,
        compression: spec.compression,
        simple: spec.simple,
    };
    let mut sorted = sort_pass(&spool, &input, tmp, progress)?;
    let largest_major = spool.largest();
    drop(spool);
    crate::spool::remove(&spool_path)?;
    let index = write_i64(tmp, "block_index", &sorted.blocks.index)?;
    if let Some(codes) = sorted.blocks.code_index.take() {
        let info = write_i64(tmp, CODE_INDEX, &codes)?;
        sorted.blocks.arrays.insert(CODE_INDEX.to_string(), info);
    }
    stages.push(clock.stage("blocks", spooled, dir_bytes(tmp)?));
    Ok(Written {
        sorted,
        largest_major,
        index,
        stages,
        extra: BTreeMap::new(),
    })
}

/// Pass 1's input from a store: its train edges (ids checked as they are read) and, for the
/// store's weights, `edge_weights_train` in step.
fn feed_store(
    store: &Store,
    edges: &ArrayInfo,
    weights: Option<&WeightSpec>,
    plan: &BuildPlan,
    feed: &mut Feed,
) -> Result<()> {
    let cols = edges.shape.get(1).copied().unwrap_or(1) as usize;
    let mut reader = RowReader::open_array(store.path(), edges, plan.read_bytes as usize)?;
    let mut column = match weights {
        Some(WeightSpec::Store) => Some(WeightColumn::open(store, edges)?),
        _ => None,
    };
    let mut check = IdCheck::edges(store, "edges_train")?;
    let (mut ids, mut src, mut dst, mut w) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    while let Some(batch) = reader.next_batch()? {
        ids.clear();
        decode_ints(batch, edges.dtype, &mut ids);
        check.check(&ids)?;
        src.clear();
        dst.clear();
        for row in ids.chunks_exact(cols) {
            src.push(row[0] as u64);
            dst.push(row[cols - 1] as u64);
        }
        if let Some(c) = column.as_mut() {
            c.take(src.len(), &mut w)?;
        }
        feed.add(&src, &dst, &w, batch.len() as u64)?;
    }
    Ok(())
}

/// Refuses drawn weights whose range is empty or not finite.
pub(crate) fn check_weights(weights: Option<&WeightRequest>) -> Result<()> {
    match weights {
        Some(w)
            if w.source != WeightSource::Store
                && !(w.low.is_finite() && w.high.is_finite() && w.low < w.high) =>
        {
            Err(GridError::config(
                "weights",
                format!("need finite low < high, got ({}, {}]", w.low, w.high),
            ))
        }
        _ => Ok(()),
    }
}

/// Refuses a simple grid with weights: merging repeated edges would have to pick one weight.
pub(crate) fn check_simple(simple: bool, weighted: bool) -> Result<()> {
    if simple && weighted {
        return Err(GridError::config(
            "simple",
            "a simple grid keeps one of each repeated edge and so cannot carry weights: drop \
             --weighted or --simple",
        ));
    }
    Ok(())
}

/// The grid's layout: `partitions` (P), or, for 0, one chosen from the vertex count, the
/// edges (`edges`, doubled when symmetrised) and the budget of the runs.
pub(crate) fn plan_layout(
    n: u64,
    partitions: u32,
    order: Order,
    edges: u64,
    symmetric: bool,
    memory: u64,
) -> Result<Layout> {
    let partitions = match partitions {
        0 => Layout::auto_partitions(
            n,
            edges * if symmetric { 2 } else { 1 },
            PLAN_VERTEX_BYTES,
            memory,
        ),
        p => p,
    };
    Layout::new(n, partitions, order)
}

/// Where the grid goes: `STORE/grids/` (created) and the grid's directory name, checked to be
/// a plain name that does not exist yet unless the job may overwrite it.
fn target(job: &BuildJob, spec: &GridSpec) -> Result<(PathBuf, String)> {
    let parent = grids_dir(&job.store);
    let name = match job.name.as_str() {
        "" => free_default_name(&parent, spec)?,
        s => s.to_string(),
    };
    if name.contains('/')
        || name.starts_with('.')
        || strata_io::durable::is_partial(Path::new(&name))
    {
        return Err(GridError::config(
            "name",
            format!("'{name}' must be a plain directory name"),
        ));
    }
    std::fs::create_dir_all(&parent).map_err(|e| GridError::os("mkdir", &parent, e))?;
    let out = parent.join(&name);
    if out.exists() && !job.overwrite {
        return Err(GridError::config(
            "overwrite",
            format!(
                "{} already exists; remove it or set overwrite",
                out.display()
            ),
        ));
    }
    Ok((parent, name))
}

/// Grids of one P and order whose weights differ (drawn from other seeds, or the store's)
/// share a default name: the first of `base`, `base-2`, `base-3`, ... (the [`default_name`]
/// of `spec`) that is free or holds the same kind of grid (which the caller then refuses to
/// overwrite unless asked).
fn free_default_name(parent: &Path, spec: &GridSpec) -> Result<String> {
    let base = default_name(
        &spec.layout,
        (spec.symmetric, spec.simple),
        spec.weights.as_ref(),
        spec.compression,
    );
    for k in 1..=MAX_DEFAULT_NAMES {
        let name = if k == 1 {
            base.clone()
        } else {
            format!("{base}-{k}")
        };
        match GridManifest::load(&parent.join(&name)) {
            Ok(m)
                if m.symmetric != spec.symmetric
                    || m.simple != spec.simple
                    || m.weights != spec.weights
                    || m.compression != spec.compression =>
            {
                continue
            }
            _ => return Ok(name),
        }
    }
    Err(GridError::config(
        "name",
        format!(
            "{MAX_DEFAULT_NAMES} grids named {base}[-K] already exist in {}; name this one",
            parent.display()
        ),
    ))
}

/// The store's edge weights, read in step with the edges: `take(k)` hands the next `k`.
struct WeightColumn {
    reader: RowReader,
    buf: Vec<f32>,
    at: usize,
}

impl WeightColumn {
    fn open(store: &Store, edges: &ArrayInfo) -> Result<WeightColumn> {
        let info = store.require(STORE_WEIGHTS)?;
        if info.shape.first() != edges.shape.first() {
            return Err(GridError::config(
                "weight_source",
                format!(
                    "{}: {STORE_WEIGHTS} holds {:?} weights for {:?} train edges",
                    store.path().display(),
                    info.shape.first(),
                    edges.shape.first()
                ),
            ));
        }
        Ok(WeightColumn {
            reader: RowReader::open_array(store.path(), info, 1 << 20)?,
            buf: Vec::new(),
            at: 0,
        })
    }

    /// The next `k` weights (the edge batches and weight batches need not line up).
    fn take(&mut self, k: usize, out: &mut Vec<f32>) -> Result<()> {
        out.clear();
        while out.len() < k {
            if self.at == self.buf.len() {
                let batch = self.reader.next_batch()?.ok_or_else(|| {
                    GridError::config(
                        "weight_source",
                        format!("{STORE_WEIGHTS} ends before the edges"),
                    )
                })?;
                self.buf.clear();
                self.buf.extend(
                    batch
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
                self.at = 0;
            }
            let n = (k - out.len()).min(self.buf.len() - self.at);
            out.extend_from_slice(&self.buf[self.at..self.at + n]);
            self.at += n;
        }
        Ok(())
    }
}

/// Default grid name: `p{P}-{order}`, then `-sym` when symmetrised, `-simple` when simple
/// (`(symmetric, simple)`), `-w` (drawn weights)
/// or `-ws` (the store's weights) when weighted, and `-byte` or `-packed` when compressed.
pub fn default_name(
    layout: &Layout,
    (symmetric, simple): (bool, bool),
    weights: Option<&WeightSpec>,
    compression: Compression,
) -> String {
    format!(
        "p{}-{}{}{}{}{}",
        layout.partitions,
        layout.order.name(),
        if symmetric { "-sym" } else { "" },
        if simple { "-simple" } else { "" },
        match weights {
            Some(WeightSpec::Random { .. }) => "-w",
            Some(WeightSpec::Store) => "-ws",
            None => "",
        },
        match compression {
            Compression::None => String::new(),
            c => format!("-{}", c.name()),
        }
    )
}

pub(crate) fn write_i64(dir: &Path, name: &str, vals: &[i64]) -> Result<ArrayInfo> {
    let mut w = NpyWriter::create(&dir.join(format!("{name}.npy")), DType::I64, &[], 1 << 20)?;
    w.write(vals)?;
    Ok(w.finish()?)
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    let mut f = std::fs::File::create(path).map_err(|e| GridError::os("create", path, e))?;
    f.write_all(bytes)
        .map_err(|e| GridError::os("write", path, e))?;
    f.sync_all().map_err(|e| GridError::os("fsync", path, e))
}

pub(crate) fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).map_err(|e| GridError::os("list", dir, e))? {
        let e = e.map_err(|e| GridError::os("list", dir, e))?;
        total += e
            .metadata()
            .map_err(|err| GridError::os("stat", &e.path(), err))?
            .len();
    }
    Ok(total)
}

/// An unfinished grid directory, removed when dropped unless forgotten once published.
pub(crate) struct PartialDir(PathBuf);

impl PartialDir {
    /// Creates `tmp` (a `.partial-PID` directory).
    pub fn create(tmp: &Path) -> Result<PartialDir> {
        std::fs::create_dir_all(tmp).map_err(|e| GridError::os("mkdir", tmp, e))?;
        Ok(PartialDir(tmp.to_path_buf()))
    }
}

impl Drop for PartialDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{store, store_of};
    use crate::layout::EDGE_BYTES;
    use strata_io::progress::NoProgress;

    /// Every edge of the grid at `dir` as global (source, destination), sorted; checks each
    /// lies inside its block's chunks.
    fn grid_edges(dir: &Path) -> Vec<(u64, u64)> {
        let grid = crate::Grid::open(dir).unwrap();
        let l = *grid.layout();
        let (_, bytes) = strata_store::array::read_all_bytes(&grid.array_path("edges")).unwrap();
        let recs: Vec<[u32; 2]> = bytemuck::pod_collect_to_vec(&bytes);
        let mut got = Vec::with_capacity(recs.len());
        for pos in 0..l.blocks() {
            let (i, j) = l.block_at(pos);
            for e in grid.block_edges(pos) {
                let [s, d] = recs[e as usize];
                assert!((s as u64) < l.chunk_len(i) && (d as u64) < l.chunk_len(j));
                got.push((l.base(i) + s as u64, l.base(j) + d as u64));
            }
        }
        got.sort_unstable();
        got
    }

    #[test]
    fn every_edge_lands_once_in_its_block_across_many_read_batches() {
        let tmp = tempfile::tempdir().unwrap();
        // 1.5M edges: several 4 MiB read batches.
        let (n, m) = (10_007u64, 1_500_000u64);
        let st = store(tmp.path(), n, m);
        for order in [Order::Column, Order::Row] {
            let job = BuildJob {
                store: st.clone(),
                partitions: 5,
                order,
                overwrite: true,
                ..Default::default()
            };
            let s = build(&job, &NoProgress).unwrap();
            assert_eq!(s.num_edges, m);
            let grid = crate::Grid::open(&s.dir).unwrap();
            let mut want: Vec<(u64, u64)> = (0..m).map(|k| (k % n, (k * 7919) % n)).collect();
            want.sort_unstable();
            assert_eq!(grid_edges(&s.dir), want);
            let mut total = 0;
            grid.for_each_degree("out_degree", |_, d| total += d)
                .unwrap();
            assert_eq!(total, m);
        }
    }

    #[test]
    fn a_simple_grid_holds_each_undirected_edge_once_each_way() {
        let tmp = tempfile::tempdir().unwrap();
        // Both directions of 0-1 (twice), 1-2 once, 2-0 both ways, self-loops on 3 and 4 (4 has
        // no other edge), across 3 chunks of 2 vertices.
        let edges = [
            (0, 1),
            (1, 0),
            (1, 2),
            (2, 0),
            (0, 2),
            (0, 1),
            (3, 3),
            (4, 4),
            (5, 3),
        ];
        let st = store_of(tmp.path(), 6, edges);
        let want = vec![
            (0, 1),
            (0, 2),
            (1, 0),
            (1, 2),
            (2, 0),
            (2, 1),
            (3, 5),
            (5, 3),
        ];
        for (order, compression) in [
            (Order::Column, Compression::None),
            (Order::Row, Compression::None),
            (Order::Column, Compression::Packed),
        ] {
            let job = BuildJob {
                store: st.clone(),
                partitions: 3,
                order,
                symmetrize: Some(true),
                simple: true,
                compression,
                overwrite: true,
                ..Default::default()
            };
            let s = build(&job, &NoProgress).unwrap();
            let grid = crate::Grid::open(&s.dir).unwrap();
            let suffix = match compression {
                Compression::None => "",
                _ => "-packed",
            };
            let name = format!("p3-{}-sym-simple{suffix}", order.name());
            assert!(grid.manifest().simple && s.dir.ends_with(name));
            assert_eq!(s.num_edges, want.len() as u64);
            if compression == Compression::None {
                assert_eq!(grid_edges(&s.dir), want);
            }
            for (name, side) in [("out_degree", 0), ("in_degree", 1)] {
                let mut deg = vec![0u64; 6];
                grid.for_each_degree(name, |v, d| deg[v] = d).unwrap();
                let mut count = vec![0u64; 6];
                want.iter()
                    .for_each(|&e| count[[e.0, e.1][side] as usize] += 1);
                assert_eq!(deg, count, "{name} {order:?}");
            }
        }
        let weighted = BuildJob {
            store: st.clone(),
            simple: true,
            weights: Some(WeightRequest::default()),
            ..Default::default()
        };
        let err = build(&weighted, &NoProgress).unwrap_err().to_string();
        assert!(err.contains("cannot carry weights"), "{err}");
    }

    #[test]
    fn a_failed_build_leaves_no_grid() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 100, 1000);
        let job = BuildJob {
            store: st.clone(),
            partitions: 5000,
            ..Default::default()
        };
        assert!(build(&job, &NoProgress)
            .unwrap_err()
            .to_string()
            .contains("partitions"));
        let job = BuildJob {
            store: st.clone(),
            memory: Size(1 << 20),
            ..Default::default()
        };
        assert!(build(&job, &NoProgress)
            .unwrap_err()
            .to_string()
            .contains("memory budget"));
        let grids = grids_dir(&st);
        let left: Vec<_> = std::fs::read_dir(&grids)
            .map(|d| d.flatten().collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn compressed_blocks_hold_the_plain_blocks_sorted_with_their_weights() {
        let tmp = tempfile::tempdir().unwrap();
        let st = store(tmp.path(), 3001, 40_000);
        let read = |g: &crate::Grid, name: &str| {
            strata_store::array::read_all_bytes(&g.array_path(name))
                .unwrap()
                .1
        };
        for order in [Order::Column, Order::Row] {
            let job = |name: &str, compression| BuildJob {
                store: st.clone(),
                name: name.into(),
                partitions: 5,
                order,
                weights: Some(WeightRequest::random(3, 0.0, 1.0)),
                overwrite: true,
                compression,
                ..Default::default()
            };
            let plain = crate::Grid::open(
                &build(&job("plain", Compression::None), &NoProgress)
                    .unwrap()
                    .dir,
            )
            .unwrap();
            let records: Vec<[u32; 2]> = bytemuck::pod_collect_to_vec(&read(&plain, "edges"));
            let weights: Vec<f32> = bytemuck::pod_collect_to_vec(&read(&plain, "weights"));
            for codec in [Compression::Byte, Compression::Packed] {
                let built = build(&job(codec.name(), codec), &NoProgress).unwrap();
                let grid = crate::Grid::open(&built.dir).unwrap();
                let m = grid.manifest();
                assert_eq!((m.compression, m.format_version), (codec, 2));
                assert!(m.stored_edge_bytes() < m.num_edges * EDGE_BYTES / 2);
                for name in ["block_index", "out_degree", "in_degree"] {
                    assert_eq!(read(&grid, name), read(&plain, name), "{name}");
                }
                let codes = read(&grid, "edge_codes");
                let got_weights: Vec<f32> = bytemuck::pod_collect_to_vec(&read(&grid, "weights"));
                for pos in 0..grid.layout().blocks() {
                    let e = grid.block_edges(pos);
                    let (a, b) = (e.start as usize, e.end as usize);
                    let bytes = grid.block_bytes(pos);
                    let mut got = vec![[0u32; 2]; b - a];
                    grid.decode_block(
                        pos,
                        &codes[bytes.start as usize..bytes.end as usize],
                        &mut got,
                    )
                    .unwrap();
                    let mut want: Vec<([u32; 2], u32)> =
                        (a..b).map(|k| (records[k], weights[k].to_bits())).collect();
                    want.sort_unstable();
                    let got: Vec<([u32; 2], u32)> = got
                        .into_iter()
                        .zip(&got_weights[a..b])
                        .map(|(e, w)| (e, w.to_bits()))
                        .collect();
                    assert_eq!(got, want, "{codec:?} {order:?} block {pos}");
                }
            }
        }
    }
}
