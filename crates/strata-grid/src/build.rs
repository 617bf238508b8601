//! `strata grid build`: a store's train edges into a P x P grid, streaming, in two passes
//! within a memory budget.
//!
//! Pass 1 reads the edge array once and appends each edge to the spool of its major chunk
//! (its destination chunk in column order), as `(minor chunk, source offset, destination
//! offset)`. Pass 2 loads one spool at a time, counting-sorts it by minor chunk and appends
//! its blocks to `edges.npy` (and their weights to `weights.npy`), so the edge file is written
//! sequentially and memory holds one spool, not the graph. The grid is written into a
//! `.partial-PID` directory and published only when complete (files, directory and parent
//! fsynced, then renamed or swapped with the old grid: `strata_io::durable::publish_dir`);
//! readers refuse `.partial-PID` directories, so a killed build leaves no grid that opens.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::array::{decode_ints, NpyWriter, RowReader};
use strata_store::ids::IdCheck;
use strata_store::npy::DType;
use strata_store::units::fmt_bytes;
use strata_store::{ArrayInfo, Store};

use crate::block_codec::Compression;
use crate::edge_file::EdgeWriter;
use crate::error::{GridError, Result};
use crate::layout::{
    format_version, GridManifest, Layout, Order, WeightRequest, WeightSource, WeightSpec,
    EDGE_BYTES, GRID_FORMAT, GRID_MANIFEST, STORE_WEIGHTS,
};

/// Words (u32) of one spooled record: minor chunk, source offset, destination offset, and
/// the edge's weight (f32 bits) when the weights come from the store.
fn spool_words(weights: Option<&WeightSpec>) -> usize {
    if weights == Some(&WeightSpec::Store) {
        4
    } else {
        3
    }
}
/// Grids of one default name (differing weights) before a build asks for a name.
const MAX_DEFAULT_NAMES: u32 = 100;
/// Vertex state the automatic P plans for (GridGraph's PageRank: 12 B, plus bitmaps).
const PLAN_VERTEX_BYTES: u64 = 16;

/// What to build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BuildJob {
    pub store: PathBuf,
    /// Directory name under `STORE/grids/`; empty: `p{P}-{order}[-sym][-w]`.
    pub name: String,
    /// Vertex chunks P; 0 chooses from the vertex count and `memory`.
    pub partitions: u32,
    pub order: Order,
    /// Store both directions of every edge; `None` follows the store's `symmetrized` flag.
    pub symmetrize: Option<bool>,
    /// Weight the edges (needed by SSSP and weighted SpMV): the store's weights or drawn ones.
    pub weights: Option<WeightRequest>,
    /// Memory budget of the build and of the runs P is planned for, in bytes.
    pub memory: u64,
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
            weights: None,
            memory: 1 << 30,
            overwrite: false,
            compression: Compression::None,
        }
    }
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
}

/// Directory holding the grids of a store.
pub fn grids_dir(store: &Path) -> PathBuf {
    store.join("grids")
}

/// Builds the grid `job` asks for.
pub fn build(job: &BuildJob, progress: &dyn Progress) -> Result<BuildSummary> {
    let t0 = Instant::now();
    let store = Store::open(&job.store)?;
    let n = store.manifest().graph.num_nodes;
    let symmetric = job.symmetrize.unwrap_or(store.manifest().graph.symmetrized);
    check_weights(job.weights.as_ref())?;
    let weights = job
        .weights
        .map(|r| r.resolve(store.array(STORE_WEIGHTS).is_some(), &job.store))
        .transpose()?;
    let layout = plan_layout(job, &store, symmetric)?;
    let (parent, name) = target(job, &layout, symmetric, weights.as_ref())?;
    let out = parent.join(&name);
    let edges_info = store.require("edges_train")?.clone();
    let stored = edges_info.shape[0];
    let total = if symmetric { stored * 2 } else { stored };
    let budget = BuildBudget::plan(job.memory, n, layout.partitions)?;

    strata_store::store::remove_stale_partials(&parent, &name);
    let tmp = parent.join(format!("{name}.partial-{}", std::process::id()));
    std::fs::create_dir_all(tmp.join("spool")).map_err(|e| GridError::os("mkdir", &tmp, e))?;
    let guard = PartialDir(tmp.clone());
    progress.message(&format!(
        "grid: {n} vertices in {} chunks of {}, {total} edges in {} blocks ({} order{}{}{}), budget {}",
        layout.partitions,
        layout.chunk_size,
        layout.blocks(),
        layout.order.name(),
        if symmetric { ", symmetrised" } else { "" },
        match weights {
            Some(WeightSpec::Store) => ", weighted by the store's weights",
            Some(WeightSpec::Random { .. }) => ", weighted by drawn weights",
            None => "",
        },
        match job.compression {
            Compression::None => String::new(),
            c => format!(", {} compression", c.name()),
        },
        fmt_bytes(job.memory)
    ));
    let spool = SpoolInput {
        edges: &edges_info,
        weights: weights.as_ref(),
        symmetric,
    };
    let spooled = spool_pass(&store, &spool, &layout, &tmp, &budget, progress)?;
    budget.check_sort(
        spooled.largest(),
        &layout,
        weights.as_ref(),
        job.compression,
    )?;
    let blocks = block_pass(
        &tmp,
        &layout,
        weights.as_ref(),
        job.compression,
        total,
        progress,
    )?;
    std::fs::remove_dir(tmp.join("spool")).map_err(|e| GridError::os("remove", &tmp, e))?;

    let manifest = GridManifest {
        format: GRID_FORMAT.to_string(),
        format_version: format_version(job.compression),
        num_vertices: n,
        num_edges: blocks.written,
        partitions: layout.partitions,
        chunk_size: layout.chunk_size,
        order: layout.order,
        symmetric,
        weights,
        weight_range: blocks.weight_range,
        largest_block_edges: blocks.largest_block,
        largest_major_edges: spooled.largest(),
        compression: job.compression,
        arrays: write_arrays(&tmp, blocks.arrays, &blocks.index, spooled)?,
        provenance: serde_json::json!({
            "store": job.store.canonicalize().unwrap_or(job.store.clone()),
            "store_name": store.manifest().name,
            "edges": "edges_train",
            "seconds": t0.elapsed().as_secs_f64(),
            "memory": job.memory,
        }),
    };
    let text = serde_json::to_string_pretty(&manifest).expect("manifest serialises");
    write_synced(&tmp.join(GRID_MANIFEST), text.as_bytes())?;
    strata_io::durable::fault_point("grid.manifest_written");
    strata_io::durable::publish_dir(&tmp, &out, "grid")?;
    std::mem::forget(guard);
    let bytes = dir_bytes(&out)?;
    Ok(BuildSummary {
        dir: out,
        partitions: layout.partitions,
        num_vertices: n,
        num_edges: blocks.written,
        bytes,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Refuses drawn weights whose range is empty or not finite.
fn check_weights(weights: Option<&WeightRequest>) -> Result<()> {
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

/// The grid's layout: the job's P, or one chosen from the vertex count, the edges (doubled
/// when symmetrised) and the budget of the runs.
fn plan_layout(job: &BuildJob, store: &Store, symmetric: bool) -> Result<Layout> {
    let n = store.manifest().graph.num_nodes;
    let partitions = match job.partitions {
        0 => {
            let edges = store.require("edges_train")?.shape[0] * if symmetric { 2 } else { 1 };
            Layout::auto_partitions(n, edges, PLAN_VERTEX_BYTES, job.memory)
        }
        p => p,
    };
    Layout::new(n, partitions, job.order)
}

/// Where the grid goes: `STORE/grids/` (created) and the grid's directory name, checked to be
/// a plain name that does not exist yet unless the job may overwrite it.
fn target(
    job: &BuildJob,
    layout: &Layout,
    symmetric: bool,
    weights: Option<&WeightSpec>,
) -> Result<(PathBuf, String)> {
    let parent = grids_dir(&job.store);
    let name = match job.name.as_str() {
        "" => free_default_name(
            &parent,
            default_name(layout, symmetric, weights, job.compression),
            symmetric,
            weights,
            job.compression,
        )?,
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
/// share a default name: the first of `base`, `base-2`, `base-3`, ... that is free or holds
/// the same kind of grid (which the caller then refuses to overwrite unless asked).
fn free_default_name(
    parent: &Path,
    base: String,
    symmetric: bool,
    weights: Option<&WeightSpec>,
    compression: Compression,
) -> Result<String> {
    for k in 1..=MAX_DEFAULT_NAMES {
        let name = if k == 1 {
            base.clone()
        } else {
            format!("{base}-{k}")
        };
        match GridManifest::load(&parent.join(&name)) {
            Ok(m)
                if m.symmetric != symmetric
                    || m.weights.as_ref() != weights
                    || m.compression != compression =>
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

/// How a build spends its budget. Degrees (2 x 8 B per vertex) stay in memory through both
/// passes; spool buffers take a quarter of the rest and pass 2 needs one spool plus its
/// sorted copy.
struct BuildBudget {
    memory: u64,
    degree_bytes: u64,
    /// The budget less degrees and fixed buffers.
    spare: u64,
    /// Write buffer of each spool, in bytes.
    spool_buf: usize,
}

impl BuildBudget {
    /// Plans `memory` bytes for `n` vertices in `partitions` chunks; refuses a budget that
    /// cannot hold the degrees and fixed buffers.
    fn plan(memory: u64, n: u64, partitions: u32) -> Result<BuildBudget> {
        let degree_bytes = 16 * n;
        let fixed = degree_bytes + (64 << 20);
        if memory < fixed {
            return Err(GridError::Budget(format!(
                "memory budget of {} is too small to build a grid of {n} vertices: degrees and buffers need {}",
                fmt_bytes(memory),
                fmt_bytes(fixed)
            )));
        }
        let spare = memory - fixed;
        let spool_buf = ((spare / 4) / partitions as u64).clamp(64 << 10, 1 << 20) as usize;
        Ok(BuildBudget {
            memory,
            degree_bytes,
            spare,
            spool_buf,
        })
    }

    /// Refuses a grid whose largest major chunk (`largest` edges) cannot be sorted within the
    /// budget.
    fn check_sort(
        &self,
        largest: u64,
        layout: &Layout,
        weights: Option<&WeightSpec>,
        compression: Compression,
    ) -> Result<()> {
        // The spool's records, the sorted edges, their minors and (weighted) their weights;
        // compressed, a block's code (at most 9 bytes an edge: 8-byte gaps and run headers)
        // and, weighted, the (key, weight) pairs its sort moves.
        let record = 4 * spool_words(weights) as u64;
        let weight = if weights.is_some() { 4 } else { 0 };
        let coding = match (compression.is_compressed(), weights.is_some()) {
            (false, _) => 0,
            (true, false) => 9,
            (true, true) => 9 + 16,
        };
        let sort_bytes = largest * (record + EDGE_BYTES + 4 + weight + coding);
        if sort_bytes > self.spare {
            return Err(GridError::Budget(format!(
                "memory budget of {} is too small: the largest {} of the grid holds {largest} edges and sorting it needs {} beside {} of degrees; raise --memory or the partitions",
                fmt_bytes(self.memory),
                if layout.order == Order::Column { "column" } else { "row" },
                fmt_bytes(sort_bytes),
                fmt_bytes(self.degree_bytes)
            )));
        }
        Ok(())
    }
}

/// What pass 1 leaves: each vertex's degrees and each spool's edge count.
struct Spooled {
    out_deg: Vec<u64>,
    in_deg: Vec<u64>,
    spool_edges: Vec<u64>,
}

impl Spooled {
    /// Edges of the largest major chunk.
    fn largest(&self) -> u64 {
        self.spool_edges.iter().copied().max().unwrap_or(0)
    }
}

/// What pass 1 reads: the train edges, their weights when they come from the store, and
/// whether to spool both directions.
struct SpoolInput<'a> {
    edges: &'a ArrayInfo,
    weights: Option<&'a WeightSpec>,
    symmetric: bool,
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

/// Pass 1: reads the edge array once (checking its ids) and appends each edge, and its
/// reverse when `symmetric`, to the spool `tmp/spool/{major}.npy` of its major chunk, with
/// its weight when the weights come from the store.
fn spool_pass(
    store: &Store,
    input: &SpoolInput,
    layout: &Layout,
    tmp: &Path,
    budget: &BuildBudget,
    progress: &dyn Progress,
) -> Result<Spooled> {
    let edges_info = input.edges;
    let n = layout.num_vertices as usize;
    let partitions = layout.partitions;
    let cols = edges_info.shape.get(1).copied().unwrap_or(1) as usize;
    let words = spool_words(input.weights);
    let mut out_deg = vec![0u64; n];
    let mut in_deg = vec![0u64; n];
    let mut spools = (0..partitions)
        .map(|m| {
            NpyWriter::create(
                &tmp.join("spool").join(format!("{m}.npy")),
                DType::U32,
                &[words as u64],
                budget.spool_buf,
            )
        })
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut reader = RowReader::open_array(store.path(), edges_info, 4 << 20)?;
    let mut column = match input.weights {
        Some(WeightSpec::Store) => Some(WeightColumn::open(store, edges_info)?),
        _ => None,
    };
    let mut meter = Meter::new(
        progress,
        "grid: spool",
        edges_info.data_bytes(),
        edges_info.shape[0],
    );
    let mut ids = Vec::new();
    let mut weights = Vec::new();
    let mut check = IdCheck::edges(store, "edges_train")?;
    let mut staged: Vec<Vec<u32>> = vec![Vec::new(); partitions as usize];
    let flush_at = (budget.spool_buf / 4).max(words * 1024);
    let mut degrees = Degrees {
        out_deg: &mut out_deg,
        in_deg: &mut in_deg,
    };
    while let Some(batch) = reader.next_batch()? {
        ids.clear();
        decode_ints(batch, edges_info.dtype, &mut ids);
        check.check(&ids)?;
        let rows = ids.len() / cols;
        if let Some(c) = column.as_mut() {
            c.take(rows, &mut weights)?;
        }
        for (e, row) in ids.chunks_exact(cols).enumerate() {
            let (u, v) = (row[0] as u64, row[cols - 1] as u64);
            let w = weights.get(e).copied();
            spool_edge(layout, u, v, w, &mut staged, &mut degrees);
            if input.symmetric && u != v {
                spool_edge(layout, v, u, w, &mut staged, &mut degrees);
            }
        }
        for (m, buf) in staged.iter_mut().enumerate() {
            if buf.len() >= flush_at {
                spools[m].write(buf)?;
                buf.clear();
            }
        }
        meter.add(rows as u64, batch.len() as u64)?;
    }
    meter.finish()?;
    let mut spool_edges = Vec::with_capacity(partitions as usize);
    for (m, w) in spools.into_iter().enumerate() {
        let mut w = w;
        w.write(&staged[m])?;
        spool_edges.push(w.finish()?.shape[0]);
    }
    Ok(Spooled {
        out_deg,
        in_deg,
        spool_edges,
    })
}

/// What pass 2 writes: the edge (and weight) arrays, the block index and its counts.
struct Blocks {
    /// The edge arrays by name (`edges`, or `edge_codes` and `code_index`; `weights`).
    arrays: BTreeMap<String, ArrayInfo>,
    /// Smallest and largest weight, when weighted (SSSP refuses negative ones).
    weight_range: Option<(f32, f32)>,
    /// First edge of each block in file order, then the edge count (P * P + 1 entries).
    index: Vec<i64>,
    written: u64,
    largest_block: u64,
}

/// Pass 2: loads each spool in turn (removing it), counting-sorts it by minor chunk and
/// hands its blocks, with their weights (spooled from the store, or drawn), to the
/// [`EdgeWriter`] (`tmp/edges.npy` or `tmp/edge_codes.npy`, and `tmp/weights.npy`).
fn block_pass(
    tmp: &Path,
    layout: &Layout,
    weights: Option<&WeightSpec>,
    compression: Compression,
    total: u64,
    progress: &dyn Progress,
) -> Result<Blocks> {
    let mut writer = EdgeWriter::create(tmp, compression, layout.chunk_size, weights.is_some())?;
    let p = layout.partitions as usize;
    let mut index = Vec::with_capacity(p * p + 1);
    index.push(0i64);
    let mut written = 0u64;
    let mut largest_block = 0u64;
    let mut meter = Meter::new(progress, "grid: blocks", total * EDGE_BYTES, total);
    let mut recs: Vec<u32> = Vec::new();
    let mut sorted: Vec<u32> = Vec::new();
    let mut wbuf: Vec<f32> = Vec::new();
    let words = spool_words(weights);
    let mut range: Option<(f32, f32)> = None;
    for major in 0..layout.partitions {
        let path = tmp.join("spool").join(format!("{major}.npy"));
        recs.clear();
        let header = strata_store::npy::read_header(&path)?;
        let mut r = RowReader::open(&path, &header, 4 << 20)?;
        while let Some(b) = r.next_batch()? {
            recs.extend_from_slice(bytemuck::cast_slice(b));
        }
        std::fs::remove_file(&path).map_err(|e| GridError::os("remove", &path, e))?;
        let mut counts = vec![0u64; p + 1];
        for rec in recs.chunks_exact(words) {
            counts[rec[0] as usize + 1] += 1;
        }
        for k in 0..p {
            counts[k + 1] += counts[k];
        }
        for k in 0..p {
            let c = counts[k + 1] - counts[k];
            largest_block = largest_block.max(c);
            index.push((written + counts[k + 1]) as i64);
        }
        let m = recs.len() / words;
        sorted.clear();
        sorted.resize(m * 2, 0);
        let mut fill = counts.clone();
        let mut minors = vec![0u32; m];
        wbuf.clear();
        wbuf.resize(if words == 4 { m } else { 0 }, 0.0);
        for rec in recs.chunks_exact(words) {
            let at = fill[rec[0] as usize] as usize;
            fill[rec[0] as usize] += 1;
            sorted[2 * at] = rec[1];
            sorted[2 * at + 1] = rec[2];
            minors[at] = rec[0];
            if words == 4 {
                wbuf[at] = f32::from_bits(rec[3]);
            }
        }
        if let Some(spec) = weights {
            if words == 3 {
                for (e, &minor) in minors.iter().enumerate() {
                    let (i, j) = match layout.order {
                        Order::Column => (minor, major),
                        Order::Row => (major, minor),
                    };
                    let u = layout.base(i) + sorted[2 * e] as u64;
                    let v = layout.base(j) + sorted[2 * e + 1] as u64;
                    wbuf.extend(spec.drawn(u, v));
                }
            }
            for &x in &wbuf {
                range = Some(range.map_or((x, x), |(lo, hi)| (lo.min(x), hi.max(x))));
            }
        }
        let records: &mut [[u32; 2]] = bytemuck::cast_slice_mut(&mut sorted);
        for k in 0..p {
            let (a, b) = (counts[k] as usize, counts[k + 1] as usize);
            let w = if wbuf.is_empty() {
                &mut [][..]
            } else {
                &mut wbuf[a..b]
            };
            writer.push(&mut records[a..b], w)?;
        }
        written += m as u64;
        meter.add(m as u64, m as u64 * EDGE_BYTES)?;
    }
    meter.finish()?;
    Ok(Blocks {
        arrays: writer.finish(tmp)?,
        weight_range: range,
        index,
        written,
        largest_block,
    })
}

/// The grid's array index: the edge arrays, and the block index and degrees written to `tmp`.
fn write_arrays(
    tmp: &Path,
    mut arrays: BTreeMap<String, ArrayInfo>,
    index: &[i64],
    spooled: Spooled,
) -> Result<BTreeMap<String, ArrayInfo>> {
    arrays.insert(
        "block_index".to_string(),
        write_i64(tmp, "block_index", index)?,
    );
    let as_i64 = |d: Vec<u64>| d.into_iter().map(|x| x as i64).collect::<Vec<_>>();
    arrays.insert(
        "out_degree".to_string(),
        write_i64(tmp, "out_degree", &as_i64(spooled.out_deg))?,
    );
    arrays.insert(
        "in_degree".to_string(),
        write_i64(tmp, "in_degree", &as_i64(spooled.in_deg))?,
    );
    Ok(arrays)
}

/// Default grid name: `p{P}-{order}`, then `-sym` when symmetrised, `-w` (drawn weights)
/// or `-ws` (the store's weights) when weighted, and `-byte` or `-packed` when compressed.
pub fn default_name(
    layout: &Layout,
    symmetric: bool,
    weights: Option<&WeightSpec>,
    compression: Compression,
) -> String {
    format!(
        "p{}-{}{}{}{}",
        layout.partitions,
        layout.order.name(),
        if symmetric { "-sym" } else { "" },
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

/// Each vertex's out- and in-degree, counted as edges are spooled.
struct Degrees<'a> {
    out_deg: &'a mut [u64],
    in_deg: &'a mut [u64],
}

#[inline]
fn spool_edge(
    layout: &Layout,
    u: u64,
    v: u64,
    weight: Option<f32>,
    staged: &mut [Vec<u32>],
    degrees: &mut Degrees,
) {
    let (i, j) = (layout.chunk_of(u), layout.chunk_of(v));
    let (major, minor) = match layout.order {
        Order::Column => (j, i),
        Order::Row => (i, j),
    };
    let spool = &mut staged[major as usize];
    spool.extend_from_slice(&[
        minor,
        (u - layout.base(i)) as u32,
        (v - layout.base(j)) as u32,
    ]);
    if let Some(w) = weight {
        spool.push(w.to_bits());
    }
    degrees.out_deg[u as usize] += 1;
    degrees.in_deg[v as usize] += 1;
}

fn write_i64(dir: &Path, name: &str, vals: &[i64]) -> Result<ArrayInfo> {
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

fn dir_bytes(dir: &Path) -> Result<u64> {
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

/// Removes an unfinished grid directory unless forgotten.
struct PartialDir(PathBuf);

impl Drop for PartialDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::store;
    use strata_io::progress::NoProgress;

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
            let l = *grid.layout();
            let (_, bytes) =
                strata_store::array::read_all_bytes(&grid.array_path("edges")).unwrap();
            let recs: Vec<[u32; 2]> = bytemuck::pod_collect_to_vec(&bytes);
            let mut got: Vec<(u64, u64)> = Vec::with_capacity(m as usize);
            for pos in 0..l.blocks() {
                let (i, j) = l.block_at(pos);
                for e in grid.block_edges(pos) {
                    let [s, d] = recs[e as usize];
                    assert!((s as u64) < l.chunk_len(i) && (d as u64) < l.chunk_len(j));
                    got.push((l.base(i) + s as u64, l.base(j) + d as u64));
                }
            }
            let mut want: Vec<(u64, u64)> = (0..m).map(|k| (k % n, (k * 7919) % n)).collect();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want);
            let mut total = 0;
            grid.for_each_degree("out_degree", |_, d| total += d)
                .unwrap();
            assert_eq!(total, m);
        }
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
            memory: 1 << 20,
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
