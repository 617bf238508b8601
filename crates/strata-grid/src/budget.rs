//! The plan of a grid run: which segment size the fetch buffers allow within the budget, how
//! many bytes vertex data and its windows take, and where each segment lives (through
//! [`place`]). A pure function of the run's options, the grid's metadata, the compute threads
//! and what far memory offers; [`run`](crate::run::run) prints the plan and follows it.

use std::ops::Range;
use std::path::Path;

use crate::config::{RunJob, RunOptions};
use strata_store::budget::{group_bytes, MemoryPlan, Planned, Planning};
use strata_store::config::AutoSize;
use strata_store::units::fmt_bytes;

use crate::algo::Work;
use crate::block_codec::Compression;
use crate::error::{GridError, Result};
use crate::far::FarSetup;
use crate::grid::{Grid, Segment};
use crate::layout::EDGE_BYTES;
use crate::place::{place, PlaceInput, Placement, VertexPlacement, RUNTIME_RESERVE};
use crate::stream::StreamConfig;
use crate::stream::Tier;

/// The largest and smallest segments chosen automatically, in bytes: big enough for
/// sequential reads, small enough that the fetch buffers take at most a third of the budget.
pub const MAX_AUTO_SEGMENT: u64 = 4 << 20;
pub const MIN_AUTO_SEGMENT: u64 = 256 << 10;

/// How a run spends its budget.
#[derive(Debug, Clone)]
pub struct GridPlan {
    /// The budget (`memory`), bytes.
    pub memory: u64,
    /// The smallest budget the run accepts: vertex data (its windows unless it must stay in
    /// memory), the fetch buffers and the runtime reserve, bytes.
    pub minimum: u64,
    /// Edge weights stream with the edges.
    pub weighted: bool,
    /// Bytes per edge fetched, as compute sees it (8, or 12 with weights).
    pub bytes_per_edge: u64,
    /// How the grid stores its blocks (compressed ones are decoded by the fetchers).
    pub compression: Compression,
    /// Bytes the grid stores an edge in, on average (8 plain).
    pub stored_bytes_per_edge: f64,
    /// Largest segment in bytes: the job's, or the largest automatic size whose buffers fit a
    /// third of the budget.
    pub segment_bytes: u64,
    /// The grid's segments of at most `segment_bytes` in the run's columns, in file order.
    pub segments: Vec<Segment>,
    /// Thread counts and prefetch depth of the streaming engine.
    pub stream: StreamConfig,
    /// Where vertex data, buffers and every segment live.
    pub placement: Placement,
    /// Bytes a distributed rank's torch and gloo hold (0 alone): see [`plan`].
    pub group_bytes: u64,
    /// What the algorithm asked for besides vertex data (its work buffer got
    /// `placement.work_bytes` of it).
    pub work: Option<Work>,
}

/// The plan `strata run` makes for `options` on `store`'s grid (`strata info --memory`): the
/// grid that suits the algorithm, planned alone (no far memory, no group) over all its
/// columns. A budget below the minimum is [`Planning::Refused`]; without a grid yet there is
/// nothing to plan ([`Planning::NotPlanned`]): segments and fetch buffers follow the edge
/// count of every block, which only the build's pass over the edges finds.
pub fn plan_for(store: &Path, options: &RunOptions) -> Result<Planning> {
    let mut job = options
        .job()
        .map_err(|e| GridError::config(&e.key, e.msg))?;
    job.store = store.to_path_buf();
    let algo = &job.algorithm;
    let wanted = job.weights_wanted()?;
    let found = Grid::find(
        &job.store,
        job.grid.as_deref(),
        wanted.as_ref(),
        (algo.needs_symmetric(), algo.needs_simple()),
    )?;
    let Some(dir) = found else {
        return Ok(Planning::NotPlanned(format!(
            "no grid for {name} in {store} yet, and the plan needs one: it sizes segments and fetch buffers from the edge count of each of the grid's blocks, which the store's counts do not give; `strata grid build {store}` or a first `strata run {name}` builds it, then this plans it",
            name = algo.name(),
            store = store.display(),
        )));
    };
    let grid = Grid::open(&dir)?;
    let threads = strata_io::resolve_threads(job.threads);
    let columns = 0..grid.layout().partitions;
    match plan(&job, &grid, threads, None, columns, None) {
        Ok(p) => Ok(Planning::of(&p)),
        Err(GridError::Budget(why)) => Ok(Planning::Refused(why)),
        Err(e) => Err(e),
    }
}

/// Plans `job` on `grid` with `threads` compute threads and, when the job uses far memory,
/// the connected server's `far` setup (its fetchers and free capacity). Only the segments of
/// major chunks `columns` are streamed (all of them, or a rank's share of a distributed run).
/// A distributed rank passes `group_anon_bytes`, its process's anonymous memory measured
/// after torch's import and the group's start: the plan sets it aside for torch and gloo with
/// their library code ([`group_bytes`]; `None` alone, or where it was not measured).
///
/// Errors: those of [`place`] (the budget cannot hold the minimum, or vertex data must stay
/// in memory and does not fit).
pub fn plan(
    job: &RunJob,
    grid: &Grid,
    threads: usize,
    far: Option<&FarSetup>,
    columns: Range<u32>,
    group_anon_bytes: Option<u64>,
) -> Result<GridPlan> {
    let group_bytes = group_bytes(group_anon_bytes);
    let algo = &job.algorithm;
    let n = grid.manifest().num_vertices;
    let weighted = algo.needs_weights();
    let bytes_per_edge = EDGE_BYTES + if weighted { 4 } else { 0 };
    let work = algo.work(grid.manifest(), threads);
    let mut stream = StreamConfig {
        threads,
        disk_fetchers: job.disk_fetchers.max(1),
        far_fetchers: far.map_or(0, |f| f.fetchers),
        prefetch: job.prefetch,
        work_bytes: 0,
    };
    let far_fetchers = job.far.as_ref().map_or(0, |f| f.fetchers.max(1));
    let fetchers = (stream.disk_fetchers + far_fetchers) as u64;
    // Each fetcher holds one segment in flight and `prefetch` per source wait for compute;
    // in a compressed grid those hold decoded records, and each fetcher also the codes it
    // decodes from.
    let buffers_held = job.prefetch.max(1) as u64 * 2 + fetchers;
    let compression = grid.compression();
    let buffers_for = |segments: &[Segment]| {
        let largest = segments.iter().map(|s| s.edge_bytes()).max().unwrap_or(0);
        let decoded = (largest * bytes_per_edge / EDGE_BYTES + (2 << 12)) * buffers_held;
        let codes = match compression.is_compressed() {
            true => {
                let stored = segments.iter().map(|s| s.stored_bytes()).max().unwrap_or(0);
                (stored + (2 << 12)) * fetchers
            }
            false => 0,
        };
        decoded + codes
    };
    let segments_of = |bytes: u64| {
        let mut all = grid.segments(bytes);
        all.retain(|s| columns.contains(&s.major));
        all
    };
    let segment_bytes = match job.segment {
        AutoSize::Bytes(bytes) => bytes,
        AutoSize::Auto => {
            let mut bytes = MAX_AUTO_SEGMENT;
            while bytes > MIN_AUTO_SEGMENT && buffers_for(&segments_of(bytes)) > job.memory.0 / 3 {
                bytes /= 2;
            }
            bytes
        }
    };
    let segments = segments_of(segment_bytes);
    let vertex_bytes = algo.vertex_bytes() * n;
    // Windowed, each compute thread holds a source and a destination chunk; bitmaps stay whole.
    let layout = *grid.layout();
    let chunk = (0..layout.partitions)
        .map(|i| layout.chunk_len(i))
        .max()
        .unwrap_or(0);
    let window_bytes =
        (2 * threads as u64 * chunk * algo.vertex_bytes() + n.div_ceil(4)).min(vertex_bytes);
    let input = PlaceInput {
        vertex_bytes,
        window_bytes,
        vertex_placement: job.vertex,
        buffer_bytes: buffers_for(&segments),
        bytes_per_edge,
        memory: job.memory.0,
        far_ratio: job.far.as_ref().map(|f| f.ratio),
        far_capacity: far.map_or(0, |f| f.free_capacity),
        keep_resident: job.keep_resident,
        group_bytes,
        work_minimum: work.as_ref().map_or(0, |w| w.minimum),
        work_wanted: work.as_ref().map_or(0, |w| w.wanted),
    };
    let placement = place(&segments, &input)?;
    stream.work_bytes = placement.work_bytes;
    let vertex_minimum = match job.vertex {
        VertexPlacement::Memory => vertex_bytes,
        VertexPlacement::Auto | VertexPlacement::Windows => window_bytes,
    };
    let m = grid.manifest();
    Ok(GridPlan {
        memory: job.memory.0,
        minimum: vertex_minimum
            + placement.buffer_bytes
            + RUNTIME_RESERVE
            + group_bytes
            + input.work_minimum,
        weighted,
        bytes_per_edge,
        compression,
        stored_bytes_per_edge: m.stored_edge_bytes() as f64 / m.num_edges.max(1) as f64,
        segment_bytes,
        segments,
        stream,
        placement,
        group_bytes,
        work,
    })
}

impl Planned for GridPlan {
    /// Parts: vertex data (whole, or its windows and the page cache of the scratch files),
    /// fetch buffers, resident edge blocks, runtime; data: the edge blocks (resident, in far
    /// memory, streamed from disk) and windowed vertex data.
    fn memory_plan(&self) -> MemoryPlan {
        let p = &self.placement;
        let mut plan = MemoryPlan::new("grid", self.memory).minimum(self.minimum);
        if p.vertex_windowed {
            let fixed =
                p.window_bytes + p.buffer_bytes + RUNTIME_RESERVE + self.group_bytes + p.work_bytes;
            plan = plan
                .part(
                    "vertex windows",
                    p.window_bytes,
                    format!(
                        "compute threads' chunks and bitmaps of {} of vertex data",
                        fmt_bytes(p.vertex_bytes)
                    ),
                )
                .part(
                    "vertex page cache",
                    self.memory.saturating_sub(fixed),
                    "the rest of the budget caches the scratch files' pages",
                );
        } else {
            plan = plan.part("vertex data", p.vertex_bytes, "local");
        }
        let far_segments = p.tiers.iter().filter(|t| **t == Tier::Far).count();
        let elsewhere = if p.far_bytes > 0 {
            format!(
                "far memory ({} in {far_segments} segments; far ratio {:.2} of a {} footprint) and SSD ({})",
                fmt_bytes(p.far_bytes),
                p.far_ratio,
                fmt_bytes(p.footprint),
                fmt_bytes(p.disk_bytes)
            )
        } else {
            "SSD".to_string()
        };
        plan = plan
            .part(
                "fetch buffers",
                p.buffer_bytes,
                format!(
                    "{} segments of up to {}, {} B per edge{}",
                    self.segments.len(),
                    fmt_bytes(self.segment_bytes),
                    self.bytes_per_edge,
                    match self.compression {
                        Compression::None => String::new(),
                        c => format!(
                            ", decoded from {} codes of {:.2} B per edge",
                            c.name(),
                            self.stored_bytes_per_edge
                        ),
                    }
                ),
            )
            .part("resident edge blocks", p.local_edge_bytes, "");
        if let Some(w) = &self.work {
            plan = plan.part(
                "work buffer",
                p.work_bytes,
                format!(
                    "{} (at least {}, at most {})",
                    w.about,
                    fmt_bytes(w.minimum),
                    fmt_bytes(w.wanted)
                ),
            );
        }
        plan = plan
            .part("runtime", RUNTIME_RESERVE, "reserve")
            .group_part(self.group_bytes);
        plan = plan.data(
            "edge blocks",
            p.local_edge_bytes + p.far_bytes + p.disk_bytes,
            p.local_edge_bytes,
            &elsewhere,
        );
        if p.vertex_windowed {
            plan = plan.data(
                "vertex data",
                p.vertex_bytes,
                p.window_bytes,
                "scratch files",
            );
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::{build, BuildJob};
    use crate::config::RunOptions;
    use crate::fixtures::store;
    use strata_io::progress::NoProgress;
    use strata_store::config::{check, Size};

    /// A grid of 4 x 4 blocks of about 94K edges (750 KB) each, so that a major chunk holds
    /// 3 MB of edges; and a job on it with `memory` and `algorithm` (the `[run]` options).
    fn grid_and_job(
        dir: &std::path::Path,
        memory: u64,
        algorithm: serde_json::Value,
    ) -> (Grid, RunJob) {
        let st = store(dir, 10_007, 1_500_000);
        let mut options = serde_json::json!({"store": st, "memory": memory});
        options
            .as_object_mut()
            .unwrap()
            .extend(algorithm.as_object().unwrap().clone());
        let job = check::<RunOptions>(&options).unwrap().job().unwrap();
        let built = build(
            &BuildJob {
                store: st.clone(),
                partitions: 4,
                weights: job
                    .algorithm
                    .needs_weights()
                    .then(|| crate::layout::WeightRequest::random(0, 0.0, 1.0)),
                ..Default::default()
            },
            &NoProgress,
        )
        .unwrap();
        (Grid::open(&built.dir).unwrap(), job)
    }

    fn pagerank() -> serde_json::Value {
        serde_json::json!({"algorithm": "pagerank", "iterations": 1})
    }

    #[test]
    fn automatic_segments_shrink_until_the_buffers_fit_a_third_of_the_budget() {
        let tmp = tempfile::tempdir().unwrap();
        let (grid, mut job) = grid_and_job(tmp.path(), 1 << 30, pagerank());
        let roomy = plan(&job, &grid, 2, None, 0..4, None).unwrap();
        assert_eq!(roomy.segment_bytes, MAX_AUTO_SEGMENT);
        assert_eq!(roomy.bytes_per_edge, EDGE_BYTES);
        // 20 buffers (8 prefetched per source, 4 disk fetchers) of a 3 MB column exceed a
        // third of 96 MiB; of half a column they do not.
        job.memory = Size(96 << 20);
        let tight = plan(&job, &grid, 2, None, 0..4, None).unwrap();
        assert_eq!(tight.segment_bytes, MAX_AUTO_SEGMENT / 2);
        assert!(tight.placement.buffer_bytes <= job.memory.0 / 3);
        assert!(tight.segments.len() > roomy.segments.len());
        for s in &tight.segments {
            assert!(s.edge_bytes() <= tight.segment_bytes || s.blocks.len() == 1);
        }
        assert_eq!(tight.segments, grid.segments(tight.segment_bytes));
    }

    #[test]
    fn weights_far_memory_and_threads_come_from_the_inputs() {
        let tmp = tempfile::tempdir().unwrap();
        let (grid, mut job) = grid_and_job(
            tmp.path(),
            1 << 30,
            serde_json::json!({"algorithm": "sssp", "root": 0}),
        );
        job.segment = AutoSize::Bytes(1 << 20);
        job.far = Some(crate::far::FarConfig {
            addr: "127.0.0.1:1".into(),
            ratio: 0.5,
            chunk_bytes: 256 << 10,
            transport: strata_farmem::TransportKind::Tcp,
            connections: 1,
            fetchers: 2,
            token: None,
        });
        let capacity = 4 << 20;
        let setup = FarSetup {
            addr: "127.0.0.1:1".into(),
            chunk_bytes: 256 << 10,
            transport: strata_farmem::TransportKind::Tcp,
            connections: 1,
            fetchers: 3,
            free_capacity: capacity,
            probe: Vec::new(),
            ping_us: 0.0,
        };
        let p = plan(&job, &grid, 5, Some(&setup), 0..4, None).unwrap();
        assert!(p.weighted);
        assert_eq!(p.bytes_per_edge, EDGE_BYTES + 4);
        assert_eq!(p.segment_bytes, 1 << 20);
        assert_eq!(p.stream.threads, 5);
        assert_eq!(p.stream.far_fetchers, 3);
        let far = p
            .placement
            .tiers
            .iter()
            .filter(|t| **t == Tier::Far)
            .count();
        assert!(far > 0 && p.placement.far_bytes <= capacity);
    }
}
