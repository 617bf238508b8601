//! CSR and CSC from the train edges within a memory budget.
//!
//! 1. Degrees: one streaming pass over the edges per node range whose counters fit the budget
//!    (usually one), writing `out_degree`, `in_degree` and both `indptr` arrays.
//! 2. Adjacency: nodes are cut into consecutive ranges whose slice of `indices` (plus per-node
//!    cursors) fits the budget. With one range the edges are scattered straight into memory;
//!    with several, one pass partitions `(node, neighbour)` pairs into a bucket file per range,
//!    and each bucket is then scattered and appended to `indices` in range order.
//!
//! Neighbours keep the order of the edge list in both cases, so the output does not depend
//! on the budget. A format-2 store carries each edge's id, type, weight and time through the
//! same steps (an [`EdgeRec`] instead of a bare neighbour id) and writes them as `*_eid`,
//! `*_etype`, `*_weights` and `*_times` parallel to `*_indices`; a typed store's segments are
//! then ordered by (edge type, edge id), so one edge type's neighbours are a contiguous run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use strata_io::{Engine, OpenMode, SeqWriter};

use crate::array::{decode_ints, read_i64_range, IntCursor, NpyWriter, RowReader};
use crate::disk_room;
use crate::error::{Result, StoreError};
use crate::manifest::{ArrayInfo, DegreeStats, GraphStats};
use crate::npy::DType;
use crate::store::StoreBuilder;
use crate::units::fmt_bytes;
use strata_io::progress::{Meter, Progress};

/// What the topology step needs to know about the graph.
pub(crate) struct TopologyInput<'a> {
    pub edges: &'a ArrayInfo,
    pub num_nodes: u64,
    pub id_dtype: DType,
    pub degree_dtype: DType,
    pub symmetrize: bool,
    pub budget: u64,
    pub io_chunk: usize,
    /// The per-edge columns of a format-2 store; `None` for a plain one.
    pub payload: Option<Payload<'a>>,
}

/// Per-edge columns carried into CSR/CSC order.
pub(crate) struct Payload<'a> {
    /// Number of edge types (the edges' relation column); 0 in an untyped store.
    pub num_etypes: u64,
    pub etype_dtype: DType,
    pub eid_dtype: DType,
    /// `edge_weights_train`, when the store has weights.
    pub weights: Option<&'a ArrayInfo>,
    /// `edge_times_train`, when the store has times.
    pub times: Option<&'a ArrayInfo>,
}

impl TopologyInput<'_> {
    /// Bytes one topology edge takes in memory and in bucket files.
    fn value_size(&self) -> u64 {
        match self.payload {
            Some(_) => std::mem::size_of::<EdgeRec>() as u64,
            None => self.id_dtype.size() as u64,
        }
    }
}

/// What was built, for the manifest and the summary.
pub(crate) struct TopologyOutput {
    pub num_topology_edges: u64,
    pub stats: GraphStats,
    /// Lines describing the budget plan and passes.
    pub plan: Vec<String>,
}

/// One of CSR (keyed by source) or CSC (keyed by destination).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Csr,
    Csc,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Csr => "csr",
            Side::Csc => "csc",
        }
    }
}

/// Consecutive nodes `[lo, hi)` whose neighbours are `indices[edge_lo..edge_hi]`.
#[derive(Clone, Copy, Debug)]
struct NodeRange {
    lo: u64,
    hi: u64,
    edge_lo: u64,
    edge_hi: u64,
}

/// Cuts nodes into ranges whose slice and cursors fit in `share` bytes.
struct RangePlanner {
    share: u64,
    id_size: u64,
    ranges: Vec<NodeRange>,
    cur: NodeRange,
}

impl RangePlanner {
    fn new(share: u64, id_size: u64) -> Self {
        RangePlanner {
            share,
            id_size,
            ranges: Vec::new(),
            cur: NodeRange {
                lo: 0,
                hi: 0,
                edge_lo: 0,
                edge_hi: 0,
            },
        }
    }

    fn cost(&self, nodes: u64, edges: u64) -> u64 {
        edges * self.id_size + (nodes + 1) * 8
    }

    /// Adds the next node with degree `d`.
    fn push(&mut self, d: u64) {
        let c = &self.cur;
        if c.hi > c.lo && self.cost(c.hi - c.lo + 1, c.edge_hi - c.edge_lo + d) > self.share {
            self.ranges.push(*c);
            self.cur = NodeRange {
                lo: c.hi,
                hi: c.hi,
                edge_lo: c.edge_hi,
                edge_hi: c.edge_hi,
            };
        }
        self.cur.hi += 1;
        self.cur.edge_hi += d;
    }

    fn finish(mut self) -> Vec<NodeRange> {
        if self.cur.hi > self.cur.lo || self.ranges.is_empty() {
            self.ranges.push(self.cur);
        }
        self.ranges
    }
}

/// Exact degree distribution: counts of each degree (small degrees in an array).
pub struct DegreeHistogram {
    small: Vec<u64>,
    large: BTreeMap<u64, u64>,
    n: u64,
    sum: u64,
}

impl Default for DegreeHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl DegreeHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        DegreeHistogram {
            small: vec![0; 1 << 12],
            large: BTreeMap::new(),
            n: 0,
            sum: 0,
        }
    }

    /// Counts one node of degree `d`.
    pub fn add(&mut self, d: u64) {
        match self.small.get_mut(d as usize) {
            Some(c) => *c += 1,
            None => *self.large.entry(d).or_default() += 1,
        }
        self.n += 1;
        self.sum += d;
    }

    /// Summary with nearest-rank quantiles (the smallest degree whose cumulative count
    /// reaches `ceil(q * n)`).
    pub fn stats(&self) -> DegreeStats {
        if self.n == 0 {
            return DegreeStats::default();
        }
        let counts = self
            .small
            .iter()
            .enumerate()
            .filter(|(_, &c)| c > 0)
            .map(|(d, &c)| (d as u64, c))
            .chain(self.large.iter().map(|(&d, &c)| (d, c)));
        let qs = [0.5, 0.9, 0.99];
        let targets: Vec<u64> = qs
            .iter()
            .map(|q| ((q * self.n as f64).ceil() as u64).max(1))
            .collect();
        let mut found = [0u64; 3];
        let (mut cum, mut min, mut max) = (0u64, u64::MAX, 0u64);
        let mut next = 0;
        for (d, c) in counts {
            min = min.min(d);
            max = max.max(d);
            cum += c;
            while next < 3 && cum >= targets[next] {
                found[next] = d;
                next += 1;
            }
        }
        DegreeStats {
            min,
            max,
            mean: self.sum as f64 / self.n as f64,
            median: found[0],
            p90: found[1],
            p99: found[2],
            zeros: self.small[0],
        }
    }
}

/// One batch of train edges: sources, destinations, and with a payload the relation column,
/// weights and times (empty when absent); `first` is the edge id of the batch's first edge.
#[derive(Default)]
struct EdgeBatch {
    first: u64,
    src: Vec<i64>,
    dst: Vec<i64>,
    rel: Vec<i64>,
    weight: Vec<f32>,
    time: Vec<i64>,
}

/// Streams the train edges (and the attribute arrays in lockstep) in batches.
struct EdgeStream {
    reader: RowReader,
    dtype: DType,
    cols: usize,
    vals: Vec<i64>,
    weights: Option<IntCursor>,
    times: Option<IntCursor>,
    /// Read the relation column (the edge type).
    typed: bool,
    batch: EdgeBatch,
    scratch: Vec<i64>,
}

impl EdgeStream {
    fn open(dir: &Path, input: &TopologyInput) -> Result<Self> {
        let edges = input.edges;
        let cursor = |info: Option<&ArrayInfo>| -> Result<Option<IntCursor>> {
            info.map(|i| {
                // Weights are read as their 32-bit patterns, the bits go back into f32.
                let dtype = if i.dtype == DType::F32 {
                    DType::I32
                } else {
                    i.dtype
                };
                Ok(IntCursor::new(
                    RowReader::open_array(dir, i, input.io_chunk)?,
                    dtype,
                ))
            })
            .transpose()
        };
        let payload = input.payload.as_ref();
        Ok(EdgeStream {
            reader: RowReader::open_array(dir, edges, input.io_chunk)?,
            dtype: edges.dtype,
            cols: edges.shape[1] as usize,
            vals: Vec::new(),
            weights: cursor(payload.and_then(|p| p.weights))?,
            times: cursor(payload.and_then(|p| p.times))?,
            typed: payload.is_some_and(|p| p.num_etypes > 0),
            batch: EdgeBatch::default(),
            scratch: Vec::new(),
        })
    }

    /// The next batch and the bytes read for it.
    fn next(&mut self) -> Result<Option<(&EdgeBatch, u64)>> {
        let Some(bytes) = self.reader.next_batch()? else {
            return Ok(None);
        };
        let n = bytes.len() as u64;
        self.vals.clear();
        decode_ints(bytes, self.dtype, &mut self.vals);
        let b = &mut self.batch;
        b.first += b.src.len() as u64;
        b.src.clear();
        b.dst.clear();
        b.rel.clear();
        for row in self.vals.chunks_exact(self.cols) {
            b.src.push(row[0]);
            b.dst.push(row[self.cols - 1]);
            if self.typed {
                b.rel.push(row[1]);
            }
        }
        let rows = b.src.len();
        if let Some(c) = self.weights.as_mut() {
            c.take(rows, &mut self.scratch)?;
            b.weight.clear();
            b.weight
                .extend(self.scratch.iter().map(|&v| f32::from_bits(v as u32)));
        }
        if let Some(c) = self.times.as_mut() {
            c.take(rows, &mut b.time)?;
        }
        Ok(Some((&self.batch, n)))
    }
}

/// A degree counter element: `u32` while the graph has fewer than 2^32 topology edges.
trait Counter: Copy + Default + Send + Into<u64> + std::ops::AddAssign {
    const ONE: Self;
}
impl Counter for u32 {
    const ONE: Self = 1;
}
impl Counter for u64 {
    const ONE: Self = 1;
}

/// What the fill step scatters for each topology edge: the neighbour id alone (`i32`/`i64`)
/// or an [`EdgeRec`] with the edge's payload.
trait Value: bytemuck::Pod + Default + Send + Sync {
    /// The value of edge `i` of `batch`, seen from the end whose other end is `nbr`.
    fn make(nbr: i64, i: usize, batch: &EdgeBatch) -> Self;
    /// Sort key within a node's segment of a typed store: (edge type, edge id).
    fn order(&self) -> (u32, i64);
    /// Appends `vals` to the side's output columns.
    fn write(vals: &[Self], out: &mut Columns) -> Result<()>;
}

macro_rules! id_value {
    ($t:ty) => {
        impl Value for $t {
            fn make(nbr: i64, _: usize, _: &EdgeBatch) -> Self {
                nbr as $t
            }
            fn order(&self) -> (u32, i64) {
                (0, 0)
            }
            fn write(vals: &[Self], out: &mut Columns) -> Result<()> {
                out.indices.write(vals)
            }
        }
    };
}
id_value!(i32);
id_value!(i64);

/// A topology edge with its payload, in memory and in bucket files.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq)]
struct EdgeRec {
    nbr: i64,
    /// Row of the edge in `edges_train`.
    eid: i64,
    time: i64,
    weight: f32,
    etype: u32,
}

// SAFETY: `EdgeRec` is `repr(C)` with fields of 8, 8, 8, 4 and 4 bytes: no padding, and every
// bit pattern is a valid value of each field.
unsafe impl bytemuck::Zeroable for EdgeRec {}
unsafe impl bytemuck::Pod for EdgeRec {}

impl Value for EdgeRec {
    fn make(nbr: i64, i: usize, b: &EdgeBatch) -> Self {
        EdgeRec {
            nbr,
            eid: (b.first + i as u64) as i64,
            time: b.time.get(i).copied().unwrap_or(0),
            weight: b.weight.get(i).copied().unwrap_or(0.0),
            etype: b.rel.get(i).map_or(0, |&r| r as u32),
        }
    }

    fn order(&self) -> (u32, i64) {
        (self.etype, self.eid)
    }

    /// Writes `vals` in pieces of `out.piece` records: the column staging vectors (and each
    /// writer's narrowing scratch) then stay within the I/O buffers of [`fixed_bytes`] instead
    /// of growing to a whole adjacency slice, which the budget does not count.
    fn write(vals: &[Self], out: &mut Columns) -> Result<()> {
        for piece in vals.chunks(out.piece) {
            let ints = &mut out.ints;
            let mut column = |w: &mut NpyWriter, f: fn(&EdgeRec) -> i64| {
                ints.clear();
                ints.extend(piece.iter().map(f));
                w.write_ints(ints)
            };
            column(&mut out.indices, |r| r.nbr)?;
            if let Some(w) = out.eid.as_mut() {
                column(w, |r| r.eid)?;
            }
            if let Some(w) = out.etype.as_mut() {
                column(w, |r| r.etype as i64)?;
            }
            if let Some(w) = out.times.as_mut() {
                column(w, |r| r.time)?;
            }
            if let Some(w) = out.weights.as_mut() {
                out.floats.clear();
                out.floats.extend(piece.iter().map(|r| r.weight));
                w.write(&out.floats)?;
            }
        }
        Ok(())
    }
}

/// The arrays of one side being written: `indices` and, with a payload, `eid`, `etype`,
/// `weights` and `times` in the same order.
struct Columns {
    side: Side,
    indices: NpyWriter,
    eid: Option<NpyWriter>,
    etype: Option<NpyWriter>,
    weights: Option<NpyWriter>,
    times: Option<NpyWriter>,
    /// Records staged per column at a time: `io_chunk / 8`, so `ints` is one I/O chunk.
    piece: usize,
    ints: Vec<i64>,
    floats: Vec<f32>,
}

impl Columns {
    fn create(builder: &StoreBuilder, side: Side, input: &TopologyInput) -> Result<Self> {
        let p = input.payload.as_ref();
        let w = |on: bool, what: &str, dtype: DType| -> Result<Option<NpyWriter>> {
            on.then(|| {
                builder.writer(
                    &format!("{}_{what}", side.name()),
                    dtype,
                    &[],
                    input.io_chunk,
                )
            })
            .transpose()
        };
        Ok(Columns {
            side,
            indices: builder.writer(
                &format!("{}_indices", side.name()),
                input.id_dtype,
                &[],
                input.io_chunk,
            )?,
            eid: w(p.is_some(), "eid", p.map_or(DType::I64, |p| p.eid_dtype))?,
            etype: w(
                p.is_some_and(|p| p.num_etypes > 0),
                "etype",
                p.map_or(DType::U8, |p| p.etype_dtype),
            )?,
            weights: w(
                p.is_some_and(|p| p.weights.is_some()),
                "weights",
                DType::F32,
            )?,
            times: w(p.is_some_and(|p| p.times.is_some()), "times", DType::I64)?,
            piece: (input.io_chunk / 8).max(1),
            ints: Vec::new(),
            floats: Vec::new(),
        })
    }

    /// Closes every column; returns (array name, info) pairs.
    fn finish(self) -> Result<Vec<(String, ArrayInfo)>> {
        let side = self.side.name();
        let mut out = vec![(format!("{side}_indices"), self.indices.finish()?)];
        for (what, w) in [
            ("eid", self.eid),
            ("etype", self.etype),
            ("weights", self.weights),
            ("times", self.times),
        ] {
            if let Some(w) = w {
                out.push((format!("{side}_{what}"), w.finish()?));
            }
        }
        Ok(out)
    }
}

/// Orders each segment of `slice` (segment `v` ends at `ends[v]`, relative to the slice) by
/// (edge type, edge id); a no-op unless `typed`.
fn sort_segments<T: Value>(slice: &mut [T], ends: &[u64], typed: bool) {
    if !typed {
        return;
    }
    let mut start = 0usize;
    for &end in ends {
        let end = end as usize;
        slice[start..end].sort_unstable_by_key(T::order);
        start = end;
    }
}

/// Builds degrees, indptr and indices for CSR and CSC (one shared set when symmetrized).
pub(crate) fn build_topology(
    builder: &mut StoreBuilder,
    input: &TopologyInput,
    progress: &dyn Progress,
) -> Result<TopologyOutput> {
    let e = input.edges.shape[0];
    let num_topo = if input.symmetrize { 2 * e } else { e };
    // At least the indptr (int64) of each side and the 2e ids of the indices: a node count
    // too large for the disk is refused here, before its degrees are written.
    let sides = if input.symmetrize { 1 } else { 2 };
    let needed = disk_room::bytes(input.num_nodes.saturating_add(1), 8 * sides)
        .saturating_add(disk_room::bytes(2 * e, input.id_dtype.size() as u64));
    disk_room::ensure(builder.parent_dir(), needed, || {
        format!(
            "the topology (CSR and CSC) of {} nodes and {num_topo} edges",
            input.num_nodes
        )
    })?;
    let out = if num_topo <= u32::MAX as u64 {
        degrees::<u32>(builder, input, num_topo, progress)?
    } else {
        degrees::<u64>(builder, input, num_topo, progress)?
    };
    let (stats, ranges, mut plan) = out;
    let sides: Vec<(Side, Vec<NodeRange>)> = ranges;
    for (side, r) in &sides {
        plan.push(format!(
            "{}: {} node range{} ({})",
            side.name().to_uppercase(),
            r.len(),
            if r.len() == 1 { "" } else { "s" },
            if r.len() == 1 {
                "scattered in memory"
            } else {
                "partitioned into bucket files, one pass"
            }
        ));
    }
    match (input.payload.is_some(), input.id_dtype) {
        (true, _) => fill::<EdgeRec>(builder, input, &sides, progress)?,
        (false, DType::I32) => fill::<i32>(builder, input, &sides, progress)?,
        (false, _) => fill::<i64>(builder, input, &sides, progress)?,
    }
    if input.symmetrize {
        builder.alias("csc_indptr", "csr_indptr");
        builder.alias("in_degree", "out_degree");
        let csr: Vec<String> = builder
            .arrays()
            .keys()
            .filter(|k| k.starts_with("csr_") && *k != "csr_indptr")
            .cloned()
            .collect();
        for name in csr {
            builder.alias(&name.replacen("csr_", "csc_", 1), &name);
        }
    }
    Ok(TopologyOutput {
        num_topology_edges: num_topo,
        stats,
        plan,
    })
}

/// Fixed buffers of the topology step: edge reader, its decode vectors, and writers (twice
/// that with a payload: its readers, records, column writers and the pieces each side's
/// columns are staged in, see [`EdgeRec::write`]).
fn fixed_bytes(input: &TopologyInput) -> u64 {
    let per = if input.payload.is_some() { 24 } else { 12 };
    per * input.io_chunk as u64
}

type DegreeOutcome = (GraphStats, Vec<(Side, Vec<NodeRange>)>, Vec<String>);

/// How the degree step spends the budget: I/O buffers, then degree counters for
/// `per_pass` nodes in each read of the edges.
struct DegreeBudget {
    per_pass: u64,
    passes: u64,
    /// Bytes of adjacency a fill slice may hold, per side.
    share: u64,
    /// The plan as a line for the user.
    line: String,
}

impl DegreeBudget {
    /// Plans `input.budget` for counters of `counter_bytes` per node (all sides together);
    /// refuses a budget that cannot hold the I/O buffers and one node's counters.
    fn plan(input: &TopologyInput, counter_bytes: u64) -> Result<DegreeBudget> {
        let fixed = fixed_bytes(input);
        let avail =
            input
                .budget
                .checked_sub(fixed)
                .filter(|&a| a > 0)
                .ok_or(StoreError::Budget {
                    budget: input.budget,
                    needed: fixed + 64 * 1024,
                    what: "building CSR/CSC (I/O buffers)".into(),
                })?;
        let per_pass = (avail / counter_bytes).min(input.num_nodes.max(1));
        if per_pass == 0 {
            return Err(StoreError::Budget {
                budget: input.budget,
                needed: fixed + counter_bytes,
                what: "counting degrees".into(),
            });
        }
        let passes = input.num_nodes.div_ceil(per_pass).max(1);
        let sides = if input.symmetrize { 1 } else { 2 };
        // The fill step keeps 1/8 of what is left for bucket write buffers.
        let share = avail * 7 / 8 / sides;
        let line = format!(
            "topology budget {}: I/O buffers {}, degree counters {} per pass ({} pass{}), adjacency slices up to {} per side",
            fmt_bytes(input.budget),
            fmt_bytes(fixed),
            fmt_bytes(per_pass * counter_bytes),
            passes,
            if passes == 1 { "" } else { "es" },
            fmt_bytes(share)
        );
        Ok(DegreeBudget {
            per_pass,
            passes,
            share,
            line,
        })
    }
}

/// Counts the degrees of the nodes in `range` over one read of the edges: into `counts[0]`
/// both endpoints when symmetrising, else out-degrees into `counts[0]` and in-degrees into
/// `counts[1]` (on two threads). `counts` are cleared to the range's width first.
fn count_range<C: Counter>(
    dir: &Path,
    input: &TopologyInput,
    range: std::ops::Range<u64>,
    counts: &mut [Vec<C>],
    meter: &mut Meter,
) -> Result<()> {
    let (lo, hi) = (range.start, range.end);
    let width = (hi - lo) as usize;
    for c in counts.iter_mut() {
        c.clear();
        c.resize(width, C::default());
    }
    let mut stream = EdgeStream::open(
        dir,
        &TopologyInput {
            payload: None,
            ..*input
        },
    )?;
    while let Some((batch, bytes)) = stream.next()? {
        let (src, dst) = (&batch.src, &batch.dst);
        let in_range = |v: i64| (v as u64).wrapping_sub(lo) < (hi - lo);
        if input.symmetrize {
            let c = &mut counts[0];
            for (&u, &v) in src.iter().zip(dst) {
                if in_range(u) {
                    c[(u as u64 - lo) as usize] += C::ONE;
                }
                if in_range(v) {
                    c[(v as u64 - lo) as usize] += C::ONE;
                }
            }
        } else {
            let (outs, ins) = counts.split_at_mut(1);
            let count = |c: &mut [C], keys: &[i64]| {
                for &k in keys {
                    if in_range(k) {
                        c[(k as u64 - lo) as usize] += C::ONE;
                    }
                }
            };
            std::thread::scope(|scope| {
                scope.spawn(|| count(&mut ins[0], dst));
                count(&mut outs[0], src);
            });
        }
        meter.add(src.len() as u64, bytes)?;
    }
    Ok(())
}

/// Counts degrees in node-range passes; writes degree and indptr arrays; plans fill ranges.
fn degrees<C: Counter>(
    builder: &mut StoreBuilder,
    input: &TopologyInput,
    num_topo: u64,
    progress: &dyn Progress,
) -> Result<DegreeOutcome> {
    let n = input.num_nodes;
    let dir = builder.dir().to_path_buf();
    let sides: &[Side] = if input.symmetrize {
        &[Side::Csr]
    } else {
        &[Side::Csr, Side::Csc]
    };
    let DegreeBudget {
        per_pass,
        passes,
        share,
        line,
    } = DegreeBudget::plan(input, sides.len() as u64 * std::mem::size_of::<C>() as u64)?;
    let id_size = input.value_size();
    let plan = vec![line];
    let mut deg_w = Vec::new();
    let mut ptr_w = Vec::new();
    let mut planners = Vec::new();
    let mut hists = Vec::new();
    for side in sides {
        let deg_name = if *side == Side::Csr {
            "out_degree"
        } else {
            "in_degree"
        };
        deg_w.push((
            deg_name,
            builder.writer(deg_name, input.degree_dtype, &[], input.io_chunk)?,
        ));
        let mut w = builder.writer(
            &format!("{}_indptr", side.name()),
            DType::I64,
            &[],
            input.io_chunk,
        )?;
        w.write(&[0i64])?;
        ptr_w.push(w);
        planners.push(RangePlanner::new(share, id_size));
        hists.push(DegreeHistogram::new());
    }
    let mut acc = vec![0i64; sides.len()];
    let mut meter = Meter::new(
        progress,
        "degrees",
        passes * input.edges.data_bytes(),
        passes * input.edges.shape[0],
    );
    let mut counts: Vec<Vec<C>> = sides.iter().map(|_| Vec::new()).collect();
    let mut scratch = Vec::new();
    for pass in 0..passes {
        let lo = pass * per_pass;
        let hi = (lo + per_pass).min(n);
        count_range(&dir, input, lo..hi, &mut counts, &mut meter)?;
        for (i, c) in counts.iter().enumerate() {
            // In pieces, so the staging vector stays small whatever the range's width.
            for piece in c.chunks(8192) {
                scratch.clear();
                for &d in piece {
                    let d: u64 = d.into();
                    scratch.push(d as i64);
                    hists[i].add(d);
                    planners[i].push(d);
                }
                deg_w[i].1.write_ints(&scratch)?;
                for v in scratch.iter_mut() {
                    acc[i] += *v;
                    *v = acc[i];
                }
                ptr_w[i].write(&scratch)?;
            }
        }
    }
    meter.finish()?;
    for ((name, w), pw) in deg_w.into_iter().zip(ptr_w) {
        builder.add(name, w.finish()?);
        let info = pw.finish()?;
        let side = if name == "out_degree" { "csr" } else { "csc" };
        builder.add(&format!("{side}_indptr"), info);
    }
    debug_assert!(acc.iter().all(|&a| a as u64 == num_topo));
    let stats_of = |i: usize| hists[i].stats();
    let stats = GraphStats {
        out_degree: stats_of(0),
        in_degree: if input.symmetrize {
            stats_of(0)
        } else {
            stats_of(1)
        },
    };
    let ranges = sides
        .iter()
        .copied()
        .zip(planners.into_iter().map(RangePlanner::finish))
        .collect();
    Ok((stats, ranges, plan))
}

/// Where one side's `(key, value)` pairs go during the fill pass.
enum Sink<T> {
    /// One range: the whole `indices` slice in memory.
    Direct { slice: Vec<T>, cursor: Vec<u64> },
    /// Several ranges: one bucket file per range of `(key - lo: u32, value)` records.
    Buckets {
        starts: Vec<u64>,
        writers: Vec<SeqWriter>,
        paths: Vec<PathBuf>,
        record: Vec<u8>,
    },
}

/// Reads `indptr[lo..=hi]` of a finished indptr array, relative to its first entry.
fn read_cursors(path: &Path, lo: u64, hi: u64, io_chunk: usize) -> Result<Vec<u64>> {
    let mut vals = read_i64_range(path, lo, hi - lo + 1, io_chunk)?;
    let base = vals[0];
    for v in vals.iter_mut() {
        *v -= base;
    }
    Ok(bytemuck::cast_vec(vals))
}

/// What the distribution pass left for each side: the whole slice, or its bucket files.
enum Filled<T> {
    Direct(Vec<T>),
    Buckets(Vec<PathBuf>),
}

fn fill<T: Value>(
    builder: &mut StoreBuilder,
    input: &TopologyInput,
    sides: &[(Side, Vec<NodeRange>)],
    progress: &dyn Progress,
) -> Result<()> {
    let filled = distribute::<T>(builder, input, sides, progress)?;
    drain::<T>(builder, input, sides, filled, progress)
}

/// One pass over the edges: scatters each side into memory or partitions it into bucket
/// files. Returns with every read and write buffer of the pass freed.
fn distribute<T: Value>(
    builder: &StoreBuilder,
    input: &TopologyInput,
    sides: &[(Side, Vec<NodeRange>)],
    progress: &dyn Progress,
) -> Result<Vec<Filled<T>>> {
    let dir = builder.dir().to_path_buf();
    let scratch = builder.scratch()?;
    let id_size = std::mem::size_of::<T>();
    let total_buckets: usize = sides
        .iter()
        .filter(|(_, r)| r.len() > 1)
        .map(|(_, r)| r.len())
        .sum();
    let bucket_buf = if total_buckets == 0 {
        0
    } else {
        let avail = input.budget.saturating_sub(fixed_bytes(input)) / 8;
        ((avail / total_buckets as u64) as usize).clamp(strata_io::ALIGN, 1 << 20)
    };
    let mut sinks = Vec::new();
    for (side, ranges) in sides {
        let indptr = dir.join(format!("{}_indptr.npy", side.name()));
        if ranges.len() == 1 {
            let r = ranges[0];
            sinks.push(Sink::Direct {
                slice: vec![T::default(); (r.edge_hi - r.edge_lo) as usize],
                cursor: read_cursors(&indptr, r.lo, r.hi, input.io_chunk)?,
            });
        } else {
            let mut writers = Vec::new();
            let mut paths = Vec::new();
            for i in 0..ranges.len() {
                let p = scratch.join(format!("{}-bucket-{i}.bin", side.name()));
                writers.push(SeqWriter::create(&p, 0, bucket_buf)?);
                paths.push(p);
            }
            sinks.push(Sink::Buckets {
                starts: ranges.iter().map(|r| r.lo).collect(),
                writers,
                paths,
                record: Vec::with_capacity(4 + id_size),
            });
        }
    }
    let e = input.edges.shape[0];
    let mut meter = Meter::new(progress, "adjacency", input.edges.data_bytes(), e);
    let mut stream = EdgeStream::open(&dir, input)?;
    let (mut both_keys, mut both_vals) = (Vec::new(), Vec::new());
    let (mut out_vals, mut in_vals) = (Vec::new(), Vec::new());
    while let Some((batch, bytes)) = stream.next()? {
        let (src, dst) = (&batch.src, &batch.dst);
        if input.symmetrize {
            // Each edge's reverse right after it, so the order never depends on batch sizes.
            both_keys.clear();
            both_vals.clear();
            for (i, (&u, &v)) in src.iter().zip(dst).enumerate() {
                both_keys.extend([u, v]);
                both_vals.extend([T::make(v, i, batch), T::make(u, i, batch)]);
            }
            push_pairs(&mut sinks[0], &both_keys, &both_vals)?;
        } else {
            out_vals.clear();
            out_vals.extend(dst.iter().enumerate().map(|(i, &v)| T::make(v, i, batch)));
            in_vals.clear();
            in_vals.extend(src.iter().enumerate().map(|(i, &u)| T::make(u, i, batch)));
            // CSR and CSC scatter into separate memory: one thread each.
            let (csr, csc) = sinks.split_at_mut(1);
            std::thread::scope(|scope| {
                let other = scope.spawn(|| push_pairs(&mut csc[0], dst, &in_vals));
                let mine = push_pairs(&mut csr[0], src, &out_vals);
                mine.and(other.join().expect("CSC scatter thread panicked"))
            })?;
        }
        meter.add(src.len() as u64, bytes)?;
    }
    meter.finish()?;
    let typed = input.payload.as_ref().is_some_and(|p| p.num_etypes > 0);
    sinks
        .into_iter()
        .map(|sink| match sink {
            Sink::Direct { mut slice, cursor } => {
                // Every cursor now ends its node's segment.
                sort_segments(&mut slice, &cursor[..cursor.len() - 1], typed);
                Ok(Filled::Direct(slice))
            }
            Sink::Buckets { writers, paths, .. } => {
                for w in writers {
                    w.finish()?;
                }
                Ok(Filled::Buckets(paths))
            }
        })
        .collect()
}

/// Writes each side's `indices`: a direct slice as is, buckets scattered one range at a time.
/// Each side's slices were budgeted separately, so both sides drain at once, one thread each;
/// this thread reports progress and turns a cancellation into a stop signal.
fn drain<T: Value>(
    builder: &mut StoreBuilder,
    input: &TopologyInput,
    sides: &[(Side, Vec<NodeRange>)],
    filled: Vec<Filled<T>>,
    progress: &dyn Progress,
) -> Result<()> {
    let dir = builder.dir().to_path_buf();
    let total: u64 = sides.iter().map(|(_, r)| r.len() as u64).sum();
    let done = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let mut writers = Vec::new();
    for (side, _) in sides {
        writers.push(Columns::create(builder, *side, input)?);
    }
    let typed = input.payload.as_ref().is_some_and(|p| p.num_etypes > 0);
    let infos = std::thread::scope(|scope| -> Result<Vec<Vec<(String, ArrayInfo)>>> {
        let handles: Vec<_> = sides
            .iter()
            .zip(filled)
            .zip(writers)
            .map(|(((side, ranges), filled), mut w)| {
                let indptr = dir.join(format!("{}_indptr.npy", side.name()));
                let (done, stop) = (&done, &stop);
                scope.spawn(move || -> Result<Vec<(String, ArrayInfo)>> {
                    match filled {
                        Filled::Direct(slice) => T::write(&slice, &mut w)?,
                        Filled::Buckets(paths) => {
                            for (r, path) in ranges.iter().zip(&paths) {
                                if stop.load(Ordering::Relaxed) {
                                    return Err(StoreError::Cancelled);
                                }
                                drain_bucket::<T>(path, r, &indptr, &mut w, input, typed)?;
                                let _ = std::fs::remove_file(path);
                                done.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                    w.finish()
                })
            })
            .collect();
        let mut meter = Meter::new(progress, "adjacency slices", 0, total);
        while !handles.iter().all(|h| h.is_finished()) {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let now = done.load(Ordering::Relaxed);
            if meter.add(now - meter.rows(), 0).is_err() {
                stop.store(true, Ordering::Relaxed);
            }
        }
        let infos = handles
            .into_iter()
            .map(|h| h.join().expect("adjacency thread panicked"))
            .collect::<Result<Vec<_>>>()?;
        meter.add(done.load(Ordering::Relaxed) - meter.rows(), 0)?;
        meter.finish()?;
        Ok(infos)
    })?;
    for (name, info) in infos.into_iter().flatten() {
        builder.add(&name, info);
    }
    Ok(())
}

fn push_pairs<T: Value>(sink: &mut Sink<T>, keys: &[i64], vals: &[T]) -> Result<()> {
    match sink {
        Sink::Direct { slice, cursor } => {
            for (&k, &v) in keys.iter().zip(vals) {
                let c = &mut cursor[k as usize];
                slice[*c as usize] = v;
                *c += 1;
            }
        }
        Sink::Buckets {
            starts,
            writers,
            record,
            ..
        } => {
            for (&k, &v) in keys.iter().zip(vals) {
                let k = k as u64;
                let r = starts.partition_point(|&s| s <= k) - 1;
                record.clear();
                record.extend_from_slice(&((k - starts[r]) as u32).to_le_bytes());
                record.extend_from_slice(bytemuck::bytes_of(&v));
                writers[r].write_all(record)?;
            }
        }
    }
    Ok(())
}

/// Scatters one bucket into its slice of `indices` (or streams it when the range is a single
/// node, whose neighbours are already in edge order) and appends it to `w`; in a typed store
/// each segment is ordered by (edge type, edge id), a single node's by one read of its bucket
/// per edge type.
fn drain_bucket<T: Value>(
    path: &Path,
    r: &NodeRange,
    indptr: &Path,
    w: &mut Columns,
    input: &TopologyInput,
    typed: bool,
) -> Result<()> {
    let rec = 4 + std::mem::size_of::<T>();
    let open = || -> Result<RowReader> {
        let file = Engine::shared().open(path, OpenMode::Read)?;
        let len = file.file().size()?;
        Ok(RowReader::records(file, 0, len, rec, input.io_chunk))
    };
    if r.hi - r.lo == 1 {
        let passes = match &input.payload {
            Some(p) if typed => p.num_etypes,
            _ => 1,
        };
        let mut values: Vec<T> = Vec::new();
        for etype in 0..passes {
            let mut reader = open()?;
            while let Some(batch) = reader.next_batch()? {
                values.clear();
                values.extend(
                    batch
                        .chunks_exact(rec)
                        .map(|c| bytemuck::pod_read_unaligned::<T>(&c[4..]))
                        .filter(|v| !typed || v.order().0 as u64 == etype),
                );
                T::write(&values, w)?;
            }
        }
        return Ok(());
    }
    let mut slice = vec![T::default(); (r.edge_hi - r.edge_lo) as usize];
    let mut cursor = read_cursors(indptr, r.lo, r.hi, input.io_chunk)?;
    let mut reader = open()?;
    while let Some(batch) = reader.next_batch()? {
        for c in batch.chunks_exact(rec) {
            let key = u32::from_le_bytes(c[..4].try_into().unwrap()) as usize;
            let pos = &mut cursor[key];
            slice[*pos as usize] = bytemuck::pod_read_unaligned::<T>(&c[4..]);
            *pos += 1;
        }
    }
    sort_segments(&mut slice, &cursor[..cursor.len() - 1], typed);
    T::write(&slice, w)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantiles() {
        let mut h = DegreeHistogram::new();
        for d in [0, 1, 1, 2, 3, 5, 8, 13, 21, 100_000] {
            h.add(d);
        }
        let s = h.stats();
        assert_eq!((s.min, s.max, s.zeros), (0, 100_000, 1));
        assert_eq!(s.median, 3);
        assert_eq!(s.p90, 21);
        assert_eq!(s.p99, 100_000);
        assert!((s.mean - 10005.4).abs() < 1e-9);
    }

    #[test]
    fn planner_respects_share_except_for_single_nodes() {
        let mut p = RangePlanner::new(100, 4);
        for d in [5, 5, 5, 50, 5, 5] {
            p.push(d);
        }
        let r = p.finish();
        assert_eq!(r.len(), 3);
        assert_eq!((r[0].lo, r[0].hi, r[0].edge_hi), (0, 3, 15));
        assert_eq!((r[1].lo, r[1].hi), (3, 4));
        assert_eq!(r.last().unwrap().edge_hi, 75);
    }
}
