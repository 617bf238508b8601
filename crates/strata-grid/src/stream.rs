//! The streaming engine: one pass applies an edge kernel to every block whose source chunk is
//! active, with segments fetched ahead of compute from their tiers, and compute threads that
//! each own whole major chunks (a column's destinations, in column order) so that writes to
//! the owned side need no atomic read-modify-write.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use strata_farmem::FarClient;
use strata_io::progress::Progress;
use strata_io::{AlignedBuf, Engine, IoFile, IoQueue, OpenMode};

use crate::error::{GridError, Result};
use crate::fetch::{self, FetchPlan, Fetched, Resident};
use crate::grid::{Grid, Segment};
use crate::layout::{Order, EDGE_BYTES};
use crate::vertex::{Bitmap, VertexMemory};

/// Which tier serves a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Resident in this process's memory.
    Local,
    /// Held by the memory server.
    Far,
    /// Streamed from the edge file.
    Disk,
}

/// Applies an algorithm to the edges of one block.
pub trait EdgeKernel: Sync {
    /// Whether the kernel reads edge weights.
    fn weighted(&self) -> bool {
        false
    }

    /// Processes the edges of block (i = source chunk, j = destination chunk): `edges` are
    /// (source, destination) offsets from the chunk bases; `weights` has one entry per edge
    /// when [`EdgeKernel::weighted`], else is empty. `owns_dst` is true when no other thread
    /// writes chunk j meanwhile. Returns a count the pass sums (say, vertices activated).
    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], weights: &[f32], owns_dst: bool) -> u64;
}

/// Knobs of the engine (the controller picks the thread counts).
#[derive(Debug, Clone, Serialize)]
pub struct StreamConfig {
    /// Compute threads.
    pub threads: usize,
    /// Threads fetching from disk (each with a segment's pieces in flight).
    pub disk_fetchers: usize,
    /// Threads fetching from far memory (each waits for one segment's chunks).
    pub far_fetchers: usize,
    /// Segments fetched ahead of compute per source: 2 per compute thread is double buffering.
    pub prefetch: usize,
    /// Bytes of the algorithm's work buffer (see
    /// [`Algorithm::work`](crate::algo::Algorithm::work); 0 when it asks for none).
    pub work_bytes: u64,
}

/// What one pass did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PassStats {
    /// Edges the kernel processed.
    pub edges: u64,
    pub blocks: u64,
    /// Non-empty blocks skipped because their source chunk was inactive.
    pub blocks_skipped: u64,
    pub bytes_local: u64,
    pub bytes_far: u64,
    pub bytes_disk: u64,
    /// Sum of the kernel's return values.
    pub total: u64,
    pub seconds: f64,
    /// Compute threads' time spent waiting for a fetch, summed over threads.
    pub wait_seconds: f64,
    /// Segments whose far read failed and that were read from disk instead.
    pub far_fallbacks: u64,
    /// With windowed vertex data: bytes the process read from storage since the previous pass
    /// ended, besides edge blocks (the windows paged in), from `/proc/self/io`.
    pub bytes_vertex_read: u64,
    /// With windowed vertex data: bytes of vertex pages dirtied since the previous pass ended
    /// (written back as the windows slide), from `/proc/self/io`.
    pub bytes_vertex_written: u64,
    /// Compressed grids: edges the fetch stage decoded from disk and far memory (resident
    /// blocks were decoded once, at load).
    pub edges_decoded: u64,
    /// Compressed grids: the fetchers' time decoding, summed over fetchers.
    pub decode_seconds: f64,
}

impl PassStats {
    /// Adds the counters and times of `other` (another pass of the same iteration).
    pub fn absorb(&mut self, other: &PassStats) {
        self.edges += other.edges;
        self.blocks += other.blocks;
        self.blocks_skipped += other.blocks_skipped;
        self.bytes_local += other.bytes_local;
        self.bytes_far += other.bytes_far;
        self.bytes_disk += other.bytes_disk;
        self.total += other.total;
        self.seconds += other.seconds;
        self.wait_seconds += other.wait_seconds;
        self.far_fallbacks += other.far_fallbacks;
        self.bytes_vertex_read += other.bytes_vertex_read;
        self.bytes_vertex_written += other.bytes_vertex_written;
        self.edges_decoded += other.edges_decoded;
        self.decode_seconds += other.decode_seconds;
    }
}

/// The streaming engine over one grid with a placement.
pub struct Streamer {
    grid: Arc<Grid>,
    segments: Vec<Segment>,
    tiers: Vec<Tier>,
    resident: Vec<Option<Arc<Resident>>>,
    edges_file: IoFile,
    weights_file: Option<IoFile>,
    far: Option<Arc<FarClient>>,
    far_dead: AtomicBool,
    far_error: Mutex<Option<String>>,
    cfg: StreamConfig,
    engine: Arc<Engine>,
    vertex: VertexMemory,
    /// The process's storage counters when the last pass ended (windowed vertex data only).
    io_mark: Option<[u64; 2]>,
    /// The vertex chunks whose values this process computes (a rank's columns; all alone).
    chunks: Range<u32>,
    /// Where an algorithm puts scratch files (the run directory).
    scratch: PathBuf,
}

/// A fetched segment, or why it could not be.
type Ready = Result<Fetched>;

/// A slot per scheduled segment, filled by fetchers and drained by compute.
struct Slots {
    cells: Vec<Mutex<Option<Ready>>>,
    ready: Condvar,
    lock: Mutex<()>,
}

impl Slots {
    fn put(&self, k: usize, v: Ready) {
        *self.cells[k].lock().unwrap() = Some(v);
        let _g = self.lock.lock().unwrap();
        self.ready.notify_all();
    }

    fn take(&self, k: usize, abort: &AtomicBool) -> Option<Ready> {
        let mut g = self.lock.lock().unwrap();
        loop {
            if let Some(v) = self.cells[k].lock().unwrap().take() {
                return Some(v);
            }
            if abort.load(Ordering::Relaxed) {
                return None;
            }
            g = self
                .ready
                .wait_timeout(g, Duration::from_millis(50))
                .unwrap()
                .0;
        }
    }
}

/// Counts slots in flight per source, so fetchers stay at most `prefetch` ahead of compute.
struct Credits {
    free: Mutex<usize>,
    cv: Condvar,
}

impl Credits {
    fn new(n: usize) -> Credits {
        Credits {
            free: Mutex::new(n),
            cv: Condvar::new(),
        }
    }

    fn acquire(&self, abort: &AtomicBool) -> bool {
        let mut f = self.free.lock().unwrap();
        while *f == 0 {
            if abort.load(Ordering::Relaxed) {
                return false;
            }
            f = self
                .cv
                .wait_timeout(f, Duration::from_millis(50))
                .unwrap()
                .0;
        }
        *f -= 1;
        true
    }

    fn release(&self) {
        *self.free.lock().unwrap() += 1;
        self.cv.notify_one();
    }
}

impl Streamer {
    /// An engine over `grid` whose segments are served as `tiers` says (resident ones are
    /// loaded now; far ones must already be on the memory server, segment id = index), with
    /// the algorithm's vertex arrays in `vertex`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        grid: Arc<Grid>,
        segments: Vec<Segment>,
        tiers: Vec<Tier>,
        far: Option<Arc<FarClient>>,
        weighted: bool,
        cfg: StreamConfig,
        vertex: VertexMemory,
        progress: &dyn Progress,
    ) -> Result<Streamer> {
        let engine = Engine::shared();
        let edges_file = engine.open(
            &grid.array_path(grid.manifest().edge_array()),
            OpenMode::Read,
        )?;
        let weights_file = match weighted {
            true => Some(engine.open(&grid.array_path("weights"), OpenMode::Read)?),
            false => None,
        };
        let mut resident = vec![None; segments.len()];
        let local: u64 = segments
            .iter()
            .zip(&tiers)
            .filter(|(_, t)| **t == Tier::Local)
            .map(|(s, _)| s.stored_bytes())
            .sum();
        if local > 0 {
            let mut meter =
                strata_io::progress::Meter::new(progress, "grid: load resident blocks", local, 0);
            let mut q = engine.queue();
            for (k, seg) in segments.iter().enumerate() {
                if tiers[k] == Tier::Local {
                    let r = fetch::load_resident(
                        &mut q,
                        &grid,
                        &edges_file,
                        weights_file.as_ref(),
                        seg,
                    )
                    .map_err(|e| match e {
                        GridError::Invalid { .. } => e,
                        e => fetch::disk_error(&grid, e),
                    })?;
                    resident[k] = Some(Arc::new(r));
                    meter.add(0, seg.stored_bytes())?;
                }
            }
            meter.finish()?;
        }
        Ok(Streamer {
            chunks: 0..grid.layout().partitions,
            grid,
            segments,
            tiers,
            resident,
            edges_file,
            weights_file,
            far,
            far_dead: AtomicBool::new(false),
            far_error: Mutex::new(None),
            cfg,
            engine,
            io_mark: vertex.is_windowed().then(process_io).flatten(),
            vertex,
            scratch: std::env::temp_dir(),
        })
    }

    /// Makes `dir` (created when needed) the directory of the algorithm's scratch files; the
    /// system's temporary directory until set.
    pub fn set_scratch_dir(&mut self, dir: &Path) {
        self.scratch = dir.to_path_buf();
    }

    /// The directory of the algorithm's scratch files (see [`Streamer::set_scratch_dir`]).
    pub fn scratch_dir(&self) -> &Path {
        &self.scratch
    }

    /// Where the algorithm puts its vertex arrays.
    pub fn vertex(&self) -> &VertexMemory {
        &self.vertex
    }

    pub fn grid(&self) -> &Arc<Grid> {
        &self.grid
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn tiers(&self) -> &[Tier] {
        &self.tiers
    }

    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }

    /// Why far memory stopped serving, once it has (the run goes on from disk).
    pub fn far_failure(&self) -> Option<String> {
        self.far_error.lock().unwrap().clone()
    }

    /// One pass of `kernel` over every block whose source chunk has an active vertex (all
    /// blocks when `active` is `None`).
    pub fn stream_edges(
        &mut self,
        kernel: &dyn EdgeKernel,
        active: Option<&Bitmap>,
        progress: &dyn Progress,
    ) -> Result<PassStats> {
        let all = 0..self.grid.layout().partitions;
        self.stream_majors(kernel, active, all, progress)
    }

    /// [`Streamer::stream_edges`] over the blocks of major chunks `majors` only (columns in
    /// column order, rows in row order): a pass that computes the values of some owned
    /// vertices reads only their blocks.
    pub fn stream_majors(
        &mut self,
        kernel: &dyn EdgeKernel,
        active: Option<&Bitmap>,
        majors: Range<u32>,
        progress: &dyn Progress,
    ) -> Result<PassStats> {
        let t0 = Instant::now();
        let schedule = self.schedule(active, majors);
        if kernel.weighted() && self.weights_file.is_none() {
            return Err(GridError::config(
                "algorithm",
                "needs edge weights but the streamer was opened without them",
            ));
        }
        let pass = Pass::new(self, kernel, progress, schedule.seg_of, schedule.plans);
        let mut by_tier: [Vec<usize>; 3] = Default::default();
        for (slot, &tier) in pass.slot_tier.iter().enumerate() {
            by_tier[tier as usize].push(slot);
        }
        std::thread::scope(|scope| {
            pass.serve_resident(&by_tier[Tier::Local as usize]);
            let disk_list = &by_tier[Tier::Disk as usize];
            for _ in 0..self.cfg.disk_fetchers.max(1).min(disk_list.len()) {
                scope.spawn(|| pass.fetch_from_disk(disk_list));
            }
            let far_list = &by_tier[Tier::Far as usize];
            if let Some(client) = self.far.as_ref() {
                for _ in 0..self.cfg.far_fetchers.max(1).min(far_list.len()) {
                    scope.spawn(|| pass.fetch_from_far(client, far_list));
                }
            } else if !far_list.is_empty() {
                pass.fail(GridError::config(
                    "far",
                    "segments placed in far memory but no far client",
                ));
            }
            for _ in 0..self.cfg.threads.max(1) {
                scope.spawn(|| pass.compute(&schedule.majors));
            }
        });
        let mut stats = pass.stats()?;
        stats.blocks_skipped = schedule.blocks_skipped;
        stats.seconds = t0.elapsed().as_secs_f64();
        if let (Some([read0, written0]), Some([read, written])) = (self.io_mark, process_io()) {
            stats.bytes_vertex_read = (read - read0).saturating_sub(stats.bytes_disk);
            stats.bytes_vertex_written = written - written0;
            self.io_mark = Some([read, written]);
        }
        if self.far_dead.load(Ordering::Relaxed) {
            for t in self.tiers.iter_mut().filter(|t| **t == Tier::Far) {
                *t = Tier::Disk;
            }
            self.far = None;
        }
        Ok(stats)
    }

    /// The segments a pass visits: those of `majors` with a block whose source chunk has an
    /// active vertex, in file order, grouped by major chunk.
    fn schedule(&self, active: Option<&Bitmap>, majors: Range<u32>) -> Schedule {
        let grid = &self.grid;
        let layout = *grid.layout();
        let chunk_active: Vec<bool> = (0..layout.partitions)
            .map(|i| {
                active.is_none_or(|a| {
                    a.any_range(
                        layout.base(i) as usize,
                        (layout.base(i) + layout.chunk_len(i)) as usize,
                    )
                })
            })
            .collect();
        let mut blocks_skipped = 0;
        let mut scheduled: Vec<(usize, FetchPlan)> = Vec::new();
        for (k, seg) in self.segments.iter().enumerate() {
            if !majors.contains(&seg.major) {
                continue;
            }
            let plan = FetchPlan::new(grid, seg, |pos| {
                chunk_active[layout.block_at(pos).0 as usize]
            });
            let nonempty = seg
                .blocks
                .clone()
                .filter(|&p| !grid.block_edges(p).is_empty())
                .count() as u64;
            blocks_skipped += nonempty - plan.blocks.len() as u64;
            if !plan.blocks.is_empty() {
                scheduled.push((k, plan));
            }
        }
        let (seg_of, plans): (Vec<usize>, Vec<FetchPlan>) = scheduled.into_iter().unzip();
        let mut majors: Vec<Range<usize>> = Vec::new();
        for (n, &k) in seg_of.iter().enumerate() {
            match majors.last_mut() {
                Some(r) if self.segments[seg_of[r.start]].major == self.segments[k].major => {
                    r.end = n + 1
                }
                _ => majors.push(n..n + 1),
            }
        }
        Schedule {
            seg_of,
            plans,
            majors,
            blocks_skipped,
        }
    }

    /// Marks far memory lost (once) and tells the user; later fetches go to disk.
    fn lose_far(&self, why: &str, progress: &dyn Progress) {
        if !self.far_dead.swap(true, Ordering::Relaxed) {
            *self.far_error.lock().unwrap() = Some(why.to_string());
            progress.message(&format!(
                "warning: far memory stopped serving ({why}); continuing from the disk copy, results are unaffected"
            ));
        }
    }

    /// Makes `chunks` the vertex chunks this process computes (a rank's columns, whose
    /// segments are the only ones it was given): [`Streamer::par_chunks`] runs over them.
    pub fn own(&mut self, chunks: Range<u32>) {
        self.chunks = chunks;
    }

    /// Runs `f(chunk)` for every vertex chunk this process computes (see [`Streamer::own`]) on
    /// the compute threads and returns the results in chunk order (a vertex pass).
    pub fn par_chunks<R: Send>(&self, f: impl Fn(u32) -> R + Sync) -> Vec<R> {
        let (first, p) = (self.chunks.start, self.chunks.len());
        let next = AtomicUsize::new(0);
        let out: Vec<Mutex<Option<R>>> = (0..p).map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for _ in 0..self.cfg.threads.max(1).min(p) {
                s.spawn(|| loop {
                    let c = next.fetch_add(1, Ordering::Relaxed);
                    if c >= p {
                        return;
                    }
                    *out[c].lock().unwrap() = Some(f(first + c as u32));
                });
            }
        });
        out.into_iter()
            .map(|m| m.into_inner().unwrap().expect("every chunk ran"))
            .collect()
    }
}

/// The segments one pass visits, each in a slot: slots are numbered in file order.
struct Schedule {
    /// Each slot's segment.
    seg_of: Vec<usize>,
    /// Each slot's fetch plan (its active blocks).
    plans: Vec<FetchPlan>,
    /// The slots of each major chunk, in file order: a compute thread's unit of work.
    majors: Vec<Range<usize>>,
    /// Non-empty blocks left out because their source chunk is inactive.
    blocks_skipped: u64,
}

/// What the threads of one pass share: the slots fetchers fill and compute drains, the
/// credits that keep fetchers at most `prefetch` ahead, the counters and the first error.
struct Pass<'a> {
    streamer: &'a Streamer,
    kernel: &'a dyn EdgeKernel,
    progress: &'a dyn Progress,
    weighted: bool,
    seg_of: Vec<usize>,
    /// Each slot's tier (far segments go to disk once far memory is lost).
    slot_tier: Vec<Tier>,
    /// Each slot's plan until a fetcher takes it.
    plans: Mutex<Vec<Option<FetchPlan>>>,
    slots: Slots,
    abort: AtomicBool,
    disk_credits: Credits,
    far_credits: Credits,
    /// Next index into the disk and far slot lists, and the next major chunk to compute.
    disk_next: AtomicUsize,
    far_next: AtomicUsize,
    next_major: AtomicUsize,
    bytes_local: AtomicU64,
    bytes_far: AtomicU64,
    bytes_disk: AtomicU64,
    fallbacks: AtomicU64,
    wait_ns: AtomicU64,
    decode_ns: AtomicU64,
    edges_decoded: AtomicU64,
    /// Decode buffers compute has finished with, for the fetchers to reuse.
    decoded_pool: Mutex<Vec<Vec<[u32; 2]>>>,
    edges_done: AtomicU64,
    total: AtomicU64,
    blocks_done: AtomicU64,
    first_err: Mutex<Option<GridError>>,
}

impl<'a> Pass<'a> {
    fn new(
        streamer: &'a Streamer,
        kernel: &'a dyn EdgeKernel,
        progress: &'a dyn Progress,
        seg_of: Vec<usize>,
        plans: Vec<FetchPlan>,
    ) -> Pass<'a> {
        let slot_tier = seg_of
            .iter()
            .map(|&k| match streamer.tiers[k] {
                Tier::Far if streamer.far_dead.load(Ordering::Relaxed) => Tier::Disk,
                t => t,
            })
            .collect();
        Pass {
            streamer,
            kernel,
            progress,
            weighted: kernel.weighted(),
            slots: Slots {
                cells: (0..seg_of.len()).map(|_| Mutex::new(None)).collect(),
                ready: Condvar::new(),
                lock: Mutex::new(()),
            },
            seg_of,
            slot_tier,
            plans: Mutex::new(plans.into_iter().map(Some).collect()),
            abort: AtomicBool::new(false),
            disk_credits: Credits::new(streamer.cfg.prefetch.max(1)),
            far_credits: Credits::new(streamer.cfg.prefetch.max(1)),
            disk_next: AtomicUsize::new(0),
            far_next: AtomicUsize::new(0),
            next_major: AtomicUsize::new(0),
            bytes_local: AtomicU64::new(0),
            bytes_far: AtomicU64::new(0),
            bytes_disk: AtomicU64::new(0),
            fallbacks: AtomicU64::new(0),
            wait_ns: AtomicU64::new(0),
            decode_ns: AtomicU64::new(0),
            edges_decoded: AtomicU64::new(0),
            decoded_pool: Mutex::new(Vec::new()),
            edges_done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            blocks_done: AtomicU64::new(0),
            first_err: Mutex::new(None),
        }
    }

    fn take_plan(&self, slot: usize) -> FetchPlan {
        self.plans.lock().unwrap()[slot]
            .take()
            .expect("each slot is fetched once")
    }

    /// Keeps the first error and stops every thread of the pass.
    fn fail(&self, e: GridError) {
        self.first_err.lock().unwrap().get_or_insert(e);
        self.abort.store(true, Ordering::Relaxed);
    }

    /// Bytes a fetch of `plan` reads: its stored edges, with their weights when the kernel
    /// reads them.
    fn read_bytes(&self, plan: &FetchPlan) -> u64 {
        plan.stored_read()
            + if self.weighted {
                plan.edges_read() * 4
            } else {
                0
            }
    }

    /// Puts a fetch into `slot`, first decoding a compressed grid's codes (timed: the fetch
    /// stage's decode, overlapped with compute); returns the codes' bytes for reuse.
    fn deliver(&self, slot: usize, fetched: Result<Fetched>) -> Option<fetch::Bytes> {
        let grid = &self.streamer.grid;
        let mut spent = None;
        let ready = fetched.and_then(|mut f| {
            if grid.compression().is_compressed() {
                let t = Instant::now();
                let out = self.decoded_pool.lock().unwrap().pop().unwrap_or_default();
                spent = Some(f.decode(grid, out)?);
                self.decode_ns
                    .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
                self.edges_decoded
                    .fetch_add(f.plan.block_edges(grid), Ordering::Relaxed);
            }
            Ok(f)
        });
        self.slots.put(slot, ready);
        spent
    }

    /// Fills the slots of resident segments (they need no fetch).
    fn serve_resident(&self, list: &[usize]) {
        for &slot in list {
            let k = self.seg_of[slot];
            let res = self.streamer.resident[k]
                .clone()
                .expect("local segments are resident");
            let plan = self.take_plan(slot);
            self.bytes_local
                .fetch_add(plan.edges_read() * EDGE_BYTES, Ordering::Relaxed);
            self.slots.put(
                slot,
                Ok(Fetched {
                    plan,
                    edges: fetch::Bytes::Local(res),
                    weights: None,
                }),
            );
        }
    }

    /// The next slot of `list` for a fetcher, once `credits` let it fetch another segment
    /// ahead of compute; `None` when the list is done or the pass aborted.
    fn next_slot(&self, credits: &Credits, next: &AtomicUsize, list: &[usize]) -> Option<usize> {
        if !credits.acquire(&self.abort) {
            return None;
        }
        let slot = list.get(next.fetch_add(1, Ordering::Relaxed)).copied();
        if slot.is_none() {
            // Hand the credit on: another fetcher may be waiting for it to find the list
            // done too.
            credits.release();
        }
        slot
    }

    /// Reads `plan` from the edge (and weight) file into `slot`.
    fn read_disk(&self, q: &mut IoQueue, slot: usize, plan: FetchPlan, pool: &mut Vec<AlignedBuf>) {
        let s = self.streamer;
        let read = self.read_bytes(&plan);
        let r = fetch::fetch_disk(
            q,
            &s.edges_file,
            s.weights_file.as_ref().filter(|_| self.weighted),
            plan,
            pool,
        )
        .map_err(|e| fetch::disk_error(&s.grid, e));
        self.bytes_disk.fetch_add(read, Ordering::Relaxed);
        if let Some(fetch::Bytes::Disk { buf, .. }) = self.deliver(slot, r) {
            pool.push(buf);
        }
    }

    /// A disk fetcher: reads the slots of `list` in turn, each once a credit frees.
    fn fetch_from_disk(&self, list: &[usize]) {
        let mut q = self.streamer.engine.queue();
        let mut pool: Vec<AlignedBuf> = Vec::new();
        while let Some(slot) = self.next_slot(&self.disk_credits, &self.disk_next, list) {
            let plan = self.take_plan(slot);
            self.read_disk(&mut q, slot, plan, &mut pool);
        }
    }

    /// A far fetcher: reads the slots of `list` in turn from the memory server, and from
    /// disk once far memory fails.
    fn fetch_from_far(&self, client: &FarClient, list: &[usize]) {
        let s = self.streamer;
        let mut q = s.engine.queue();
        let mut far_pool: Vec<Vec<u8>> = Vec::new();
        let mut disk_pool: Vec<AlignedBuf> = Vec::new();
        while let Some(slot) = self.next_slot(&self.far_credits, &self.far_next, list) {
            let k = self.seg_of[slot];
            let plan = self.take_plan(slot);
            if !s.far_dead.load(Ordering::Relaxed) {
                let read = self.read_bytes(&plan);
                match fetch::fetch_far(
                    client,
                    k as u64,
                    &s.segments[k],
                    plan.clone(),
                    self.weighted,
                    &mut far_pool,
                ) {
                    Ok(f) => {
                        self.bytes_far.fetch_add(read, Ordering::Relaxed);
                        if let Some(fetch::Bytes::Far(bufs)) = self.deliver(slot, Ok(f)) {
                            far_pool.extend(bufs);
                        }
                        continue;
                    }
                    Err(e) => s.lose_far(&e.to_string(), self.progress),
                }
            }
            self.fallbacks.fetch_add(1, Ordering::Relaxed);
            self.read_disk(&mut q, slot, plan, &mut disk_pool);
        }
    }

    /// A compute thread: takes whole major chunks in turn and applies the kernel to their
    /// fetched blocks in order, returning each slot's credit to its tier.
    fn compute(&self, majors: &[Range<usize>]) {
        let grid = &self.streamer.grid;
        let layout = *grid.layout();
        let owns_dst = layout.order == Order::Column;
        loop {
            let m = self.next_major.fetch_add(1, Ordering::Relaxed);
            let Some(range) = majors.get(m) else { return };
            for slot in range.clone() {
                let tw = Instant::now();
                let Some(got) = self.slots.take(slot, &self.abort) else {
                    return;
                };
                self.wait_ns
                    .fetch_add(tw.elapsed().as_nanos() as u64, Ordering::Relaxed);
                let fetched = match got {
                    Ok(f) => f,
                    Err(e) => return self.fail(e),
                };
                let mut edges = 0;
                let mut sum = 0;
                for b in 0..fetched.plan.blocks.len() {
                    let (pos, _) = fetched.plan.blocks[b];
                    let (i, j) = layout.block_at(pos);
                    let (e, w) = fetched.block(grid, b);
                    let checked = match fetched.needs_check() {
                        true => grid.check_block(pos, e),
                        false => Ok(()),
                    };
                    if let Err(err) = checked {
                        return self.fail(err);
                    }
                    sum += self.kernel.block(i, j, e, w, owns_dst);
                    edges += e.len() as u64;
                }
                self.edges_done.fetch_add(edges, Ordering::Relaxed);
                self.total.fetch_add(sum, Ordering::Relaxed);
                self.blocks_done
                    .fetch_add(fetched.plan.blocks.len() as u64, Ordering::Relaxed);
                if let fetch::Bytes::Decoded { edges, .. } = fetched.edges {
                    self.decoded_pool.lock().unwrap().push(edges);
                }
                match self.slot_tier[slot] {
                    Tier::Disk => self.disk_credits.release(),
                    Tier::Far => self.far_credits.release(),
                    Tier::Local => {}
                }
            }
        }
    }

    /// The pass's counters, or its first error.
    fn stats(self) -> Result<PassStats> {
        if let Some(e) = self.first_err.into_inner().unwrap() {
            return Err(e);
        }
        Ok(PassStats {
            edges: self.edges_done.into_inner(),
            blocks: self.blocks_done.into_inner(),
            total: self.total.into_inner(),
            bytes_local: self.bytes_local.into_inner(),
            bytes_far: self.bytes_far.into_inner(),
            bytes_disk: self.bytes_disk.into_inner(),
            far_fallbacks: self.fallbacks.into_inner(),
            wait_seconds: self.wait_ns.into_inner() as f64 * 1e-9,
            edges_decoded: self.edges_decoded.into_inner(),
            decode_seconds: self.decode_ns.into_inner() as f64 * 1e-9,
            ..PassStats::default()
        })
    }
}

/// The process's `read_bytes` and `write_bytes` from `/proc/self/io` (bytes it made the
/// storage layer read, and bytes of pages it dirtied); `None` where the kernel does not say.
fn process_io() -> Option<[u64; 2]> {
    let text = std::fs::read_to_string("/proc/self/io").ok()?;
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse::<u64>().ok())
    };
    Some([field("read_bytes:")?, field("write_bytes:")?])
}
