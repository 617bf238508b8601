//! `strata check`: reads every array of a store and checks every invariant the engines rely on,
//! listing all problems found (at most a cap per file, the rest counted) instead of stopping at
//! the first.
//!
//! Checked: the manifest against the array files (what [`Store::open`] checks, every
//! disagreement listed); ids in range in the edge arrays, CSR/CSC indices, node splits and
//! labels; each `indptr` starting at 0, never decreasing and ending at the edge count; the degree
//! arrays and the manifest's degree statistics against the `indptr` differences; the manifest's
//! topology edge count against the train edges; name-table offsets, and names sorted and unique;
//! feature values finite; and CSR, CSC and the train edges holding the same multiset of edges.
//! Grids are checked by `strata_grid::check`, which adds to the same [`Checked`].
//!
//! Memory is bounded whatever the store's size: arrays are streamed in chunks of [`CHUNK`]
//! bytes (several in lockstep where one is read against another), and the edge multisets are
//! compared through [`EdgeSigs`]: per destination range (at most [`SIG_BUCKETS`] ranges), the
//! count of edges and the wrapping sum of a 64-bit hash of each `(src, dst)`. Equal multisets
//! give equal signatures; two that differ agree in a range only if the sums of their hashes
//! collide (about 2^-64 for a random hash), and a difference is reported with the node range
//! it lies in.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde::Serialize;
use strata_io::progress::{Meter, Progress};

use crate::array::{decode_f32, decode_ints, IntCursor, RowReader};
use crate::convert::DegreeHistogram;
use crate::error::{quoted, Result, StoreError};
use crate::ids::{IdCheck, IndptrCheck};
use crate::manifest::{DegreeStats, Manifest};
use crate::npy::DType;
use crate::rng::derive;
use crate::store::{array_problems, Store, MANIFEST as MANIFEST_FILE};
use crate::verified::Stamp;

/// Bytes of each streaming read.
pub const CHUNK: usize = 4 << 20;
/// Most destination ranges the edge-multiset signatures distinguish (16 bytes each).
pub const SIG_BUCKETS: u64 = 4096;
/// Problems listed per file by default; the rest are counted.
pub const DEFAULT_MAX_PER_FILE: usize = 20;
/// Values taken from a cursor at a time when arrays are read in lockstep.
const PIECE: usize = 1 << 16;
/// Values a [`Stream`] reads from disk at a time (1 MiB once decoded to `i64`).
const STREAM_VALUES: usize = 1 << 17;
/// Key of the edge hash.
const EDGE_HASH_KEY: u64 = 0x0065_6467_6573_6967;

/// One problem: the file (relative to the store), the row when there is one, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub file: String,
    pub row: Option<u64>,
    pub message: String,
}

/// Problems found so far, at most `cap` listed per file.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Problems {
    pub listed: Vec<Problem>,
    /// Problems found beyond the cap, by file.
    pub unlisted: BTreeMap<String, u64>,
    #[serde(skip)]
    cap: usize,
    #[serde(skip)]
    per_file: HashMap<String, usize>,
}

impl Problems {
    /// An empty list that keeps at most `cap` problems per file (at least one).
    pub fn new(cap: usize) -> Problems {
        Problems {
            cap: cap.max(1),
            ..Problems::default()
        }
    }

    /// Records a problem of `file`.
    pub fn add(&mut self, file: &str, row: Option<u64>, message: String) {
        let n = self.per_file.entry(file.to_string()).or_default();
        *n += 1;
        if *n > self.cap {
            *self.unlisted.entry(file.to_string()).or_default() += 1;
        } else {
            self.listed.push(Problem {
                file: file.to_string(),
                row,
                message,
            });
        }
    }

    /// Problems found, listed or not.
    pub fn total(&self) -> u64 {
        self.listed.len() as u64 + self.unlisted.values().sum::<u64>()
    }

    pub fn is_empty(&self) -> bool {
        self.listed.is_empty() && self.unlisted.is_empty()
    }
}

/// What a check found, and what it read.
pub struct Checked {
    /// The store, when it opened (its values were then checked too).
    pub store: Option<Store>,
    pub problems: Problems,
    /// Files read in full, in the order they were checked.
    pub files: Vec<String>,
    pub bytes_read: u64,
}

/// The summary `strata check` prints (and writes with `--json-summary`).
#[derive(Debug, Clone, Serialize)]
pub struct CheckReport {
    pub store: PathBuf,
    pub ok: bool,
    pub problems: u64,
    pub listed: Vec<Problem>,
    pub unlisted: BTreeMap<String, u64>,
    pub files_checked: Vec<String>,
    pub bytes_read: u64,
    pub seconds: f64,
}

impl Checked {
    /// The report of the check of the store at `path`, which took `seconds`.
    pub fn report(&self, path: &Path, seconds: f64) -> CheckReport {
        CheckReport {
            store: path.to_path_buf(),
            ok: self.problems.is_empty(),
            problems: self.problems.total(),
            listed: self.problems.listed.clone(),
            unlisted: self.problems.unlisted.clone(),
            files_checked: self.files.clone(),
            bytes_read: self.bytes_read,
            seconds,
        }
    }

    /// Streams the integers of array `name` of `store` (progress stage `check FILE`), calling
    /// `f` with each batch of whole rows.
    pub fn ints(
        &mut self,
        store: &Store,
        name: &str,
        progress: &dyn Progress,
        mut f: impl FnMut(&mut Problems, &[i64]),
    ) -> Result<()> {
        let info = store.require(name)?.clone();
        let mut reader = RowReader::open_array(store.path(), &info, CHUNK)?;
        let cols = info.shape.iter().skip(1).product::<u64>().max(1);
        let mut meter = Meter::new(
            progress,
            &format!("check {}", info.file),
            info.data_bytes(),
            info.shape[0],
        );
        let mut vals = Vec::new();
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, info.dtype, &mut vals);
            f(&mut self.problems, &vals);
            meter.add(vals.len() as u64 / cols, bytes.len() as u64)?;
        }
        meter.finish()?;
        self.read(&info.file, info.data_bytes());
        Ok(())
    }

    /// Records a file read in full.
    pub fn read(&mut self, file: &str, bytes: u64) {
        if !self.files.iter().any(|f| f == file) {
            self.files.push(file.to_string());
        }
        self.bytes_read += bytes;
    }

    /// Lists every value of `check`'s array out of its range.
    pub(crate) fn ids(
        &mut self,
        store: &Store,
        name: &str,
        mut check: IdCheck,
        progress: &dyn Progress,
    ) -> Result<()> {
        let file = check.file().to_string();
        self.ints(store, name, progress, |problems, vals| {
            check.scan(vals, |row, msg| problems.add(&file, Some(row), msg))
        })
    }
}

/// An integer array read value by value, in chunks (for reading arrays in lockstep).
pub(crate) struct Stream {
    cursor: IntCursor,
    buf: Vec<i64>,
    pos: usize,
}

impl Stream {
    pub(crate) fn open(checked: &mut Checked, store: &Store, name: &str) -> Result<Stream> {
        let info = store.require(name)?;
        checked.read(&info.file, info.data_bytes());
        // A float32 array (weights) is read as its bit patterns, for exact comparisons.
        let dtype = match info.dtype {
            DType::F32 => DType::I32,
            d => d,
        };
        // Values are decoded to i64: read at most STREAM_VALUES at a time, so that the several
        // streams read in lockstep stay small whatever their element size.
        let batch = STREAM_VALUES * info.dtype.size();
        Ok(Stream {
            cursor: IntCursor::new(RowReader::open_array(store.path(), info, batch)?, dtype),
            buf: Vec::new(),
            pos: 0,
        })
    }

    pub(crate) fn next(&mut self) -> Result<Option<i64>> {
        if self.pos == self.buf.len() {
            self.cursor.take(PIECE, &mut self.buf)?;
            self.pos = 0;
        }
        let v = self.buf.get(self.pos).copied();
        self.pos += v.is_some() as usize;
        Ok(v)
    }

    /// The next `n` values (fewer at the end) into `out`.
    pub(crate) fn take(&mut self, n: usize, out: &mut Vec<i64>) -> Result<()> {
        out.clear();
        let here = (self.buf.len() - self.pos).min(n);
        out.extend_from_slice(&self.buf[self.pos..self.pos + here]);
        self.pos += here;
        if out.len() < n {
            let mut rest = Vec::new();
            self.cursor.take(n - out.len(), &mut rest)?;
            out.extend_from_slice(&rest);
        }
        Ok(())
    }
}

/// Signatures of a multiset of edges by destination range: per range, the number of edges and
/// the wrapping sum of a hash of each `(src, dst)` (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeSigs {
    n: u64,
    count: Vec<u64>,
    sum: Vec<u64>,
}

impl EdgeSigs {
    /// Empty signatures of edges among `n` nodes.
    pub fn new(n: u64) -> EdgeSigs {
        let k = n.clamp(1, SIG_BUCKETS) as usize;
        EdgeSigs {
            n: n.max(1),
            count: vec![0; k],
            sum: vec![0; k],
        }
    }

    fn bucket(&self, v: u64) -> usize {
        (v as u128 * self.count.len() as u128 / self.n as u128) as usize
    }

    /// Adds edge `(u, v)` (`v < n`).
    pub fn add(&mut self, u: u64, v: u64) {
        let b = self.bucket(v);
        self.count[b] += 1;
        self.sum[b] = self.sum[b].wrapping_add(derive(derive(EDGE_HASH_KEY, u), v));
    }

    /// The destination nodes `[lo, hi)` of range `b`.
    pub fn range(&self, b: usize) -> (u64, u64) {
        let k = self.count.len() as u128;
        let lo = |b: u128| (b * self.n as u128).div_ceil(k) as u64;
        (lo(b as u128), lo(b as u128 + 1))
    }

    /// Whether `self` and `other` hold the same edges in range `b` (up to a hash collision).
    pub fn same(&self, other: &EdgeSigs, b: usize) -> bool {
        self.count[b] == other.count[b] && self.sum[b] == other.sum[b]
    }

    /// Number of destination ranges.
    pub fn ranges(&self) -> usize {
        self.count.len()
    }

    /// Edges in range `b`.
    pub fn count(&self, b: usize) -> u64 {
        self.count[b]
    }
}

/// The `[check]` section's engine options (the store to check is the front end's).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct CheckOptions {
    /// problems listed per file (the rest are counted); every array is read in full either way
    #[schemars(range(min = 1))]
    pub max_problems: usize,
}

impl Default for CheckOptions {
    fn default() -> Self {
        CheckOptions { max_problems: 20 }
    }
}

impl crate::config::Section for CheckOptions {
    const NAME: &'static str = "check";
}

/// Checks the store at `path`, listing at most `max_per_file` problems per file. Fails only on
/// I/O errors and cancellation: a store that does not open is a problem found, and then only
/// the manifest and the array files' headers are checked. A store without problems is stamped
/// as checked (`crate::verified`), keyed to its files as they were before the check read them.
pub fn check_store(path: &Path, max_per_file: usize, progress: &dyn Progress) -> Result<Checked> {
    let mut checked = Checked {
        store: None,
        problems: Problems::new(max_per_file),
        files: Vec::new(),
        bytes_read: 0,
    };
    let store = match Store::open(path) {
        Ok(s) => s,
        Err(
            e @ (StoreError::Invalid { .. }
            | StoreError::NewerFormat { .. }
            | StoreError::BadFile { .. }),
        ) => {
            structure_problems(path, &e, &mut checked.problems);
            return Ok(checked);
        }
        Err(e) => return Err(e),
    };
    let stamp = Stamp::of(&store);
    values(&store, &mut checked, progress)?;
    if let (true, Some(stamp)) = (checked.problems.is_empty(), stamp) {
        stamp.record(path);
    }
    checked.store = Some(store);
    Ok(checked)
}

/// Every structural problem of a store that does not open: all disagreements between a
/// readable manifest and the files, or else the error that stopped the open.
fn structure_problems(path: &Path, err: &StoreError, problems: &mut Problems) {
    let manifest: Option<Manifest> = std::fs::read_to_string(path.join(MANIFEST_FILE))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let listed = manifest
        .map(|m| array_problems(path, &m))
        .unwrap_or_default();
    if listed.is_empty() {
        let msg = match err {
            StoreError::Invalid { msg, .. } => msg.clone(),
            other => other.to_string(),
        };
        problems.add(MANIFEST_FILE, None, msg);
    }
    for msg in listed {
        problems.add(MANIFEST_FILE, None, msg);
    }
}

/// Checks the values of an open store.
fn values(store: &Store, checked: &mut Checked, progress: &dyn Progress) -> Result<()> {
    let m = store.manifest();
    let g = &m.graph;
    let train_edges = g.num_edges.get("train").copied().unwrap_or(0);
    let want_topo = if g.symmetrized {
        2 * train_edges
    } else {
        train_edges
    };
    if g.num_topology_edges != want_topo {
        checked.problems.add(
            MANIFEST_FILE,
            None,
            format!(
                "graph.num_topology_edges is {} but {train_edges} train edges{} make {want_topo}",
                g.num_topology_edges,
                if g.symmetrized { ", symmetrized," } else { "" }
            ),
        );
    }
    let mut edge_sigs = EdgeSigs::new(g.num_nodes);
    for split in g.num_edges.keys() {
        let name = format!("edges_{split}");
        let mut check = IdCheck::edges(store, &name)?;
        let file = check.file().to_string();
        let (cols, n, train) = (check.columns(), g.num_nodes as i64, split == "train");
        let sym = g.symmetrized;
        checked.ints(store, &name, progress, |problems, vals| {
            check.scan(vals, |row, msg| problems.add(&file, Some(row), msg));
            if train {
                for row in vals.chunks_exact(cols) {
                    let (u, v) = (row[0], row[cols - 1]);
                    if (0..n).contains(&u) && (0..n).contains(&v) {
                        edge_sigs.add(u as u64, v as u64);
                        if sym {
                            edge_sigs.add(v as u64, u as u64);
                        }
                    }
                }
            }
        })?;
    }
    let csr = topology(
        store,
        checked,
        "csr",
        "out_degree",
        &m.stats.out_degree,
        progress,
    )?;
    let csc_aliased = store.require("csc_indices")?.file == store.require("csr_indices")?.file
        && store.require("csc_indptr")?.file == store.require("csr_indptr")?.file;
    let csc = if csc_aliased {
        None
    } else {
        topology(
            store,
            checked,
            "csc",
            "in_degree",
            &m.stats.in_degree,
            progress,
        )?
    };
    compare_edges(
        store,
        &mut checked.problems,
        &edge_sigs,
        csr.as_ref(),
        csc.as_ref(),
    )?;
    if m.labels.is_some() {
        let check = IdCheck::labels(store)?;
        checked.ids(store, "labels", check, progress)?;
    }
    for split in m.node_splits.keys() {
        let name = format!("node_{split}");
        let check = IdCheck::nodes(store, &name, "node")?;
        checked.ids(store, &name, check, progress)?;
    }
    for (table, present) in [
        ("node_names", g.node_names),
        ("relation_names", g.relation_names),
    ] {
        if present {
            name_table(store, checked, table, progress)?;
        }
    }
    if m.features.is_some() {
        finite(store, checked, "features", progress)?;
    }
    crate::check_v2::format2(store, checked, progress)
}

/// Checks `DIR_indptr` with the degree array `degrees` and the manifest's `stats`, then
/// `DIR_indices`; returns the signatures of the edges they hold when `indptr` is sound.
fn topology(
    store: &Store,
    checked: &mut Checked,
    dir: &str,
    degrees: &str,
    stats: &DegreeStats,
    progress: &dyn Progress,
) -> Result<Option<EdgeSigs>> {
    let g = &store.manifest().graph;
    let (indptr_name, indices_name) = (format!("{dir}_indptr"), format!("{dir}_indices"));
    let indptr_file = store.require(&indptr_name)?.file.clone();
    let degree_file = store.require(degrees)?.file.clone();
    let mut offsets = IndptrCheck::array(store, &indptr_name, g.num_topology_edges)?;
    let mut indptr = Stream::open(checked, store, &indptr_name)?;
    let mut degree = Stream::open(checked, store, degrees)?;
    let mut hist = DegreeHistogram::new();
    let mut meter = Meter::new(
        progress,
        &format!("check {indptr_file}"),
        0,
        g.num_nodes + 1,
    );
    // The offsets check may blame an entry only once it sees the next one, so a row's degree
    // is compared one entry late, once both its offsets have their verdict: `before` and
    // `last` are the previous two entries (value, good).
    type Entry = Option<(i64, bool)>;
    let mut sound = true;
    let (mut before, mut last): (Entry, Entry) = (None, None);
    // The problem with degree row `row` (between entries `before` and `last`), if any.
    let mut compare = |row: u64, before: Entry, last: Entry| {
        let stored = degree.next()?.unwrap_or(0);
        let (Some((lo, true)), Some((hi, true))) = (before, last) else {
            return Ok(None);
        };
        let d = hi - lo;
        hist.add(d as u64);
        Ok::<_, StoreError>((d != stored).then(|| {
            format!("{degree_file} row {row}: degree {stored} but {indptr_file} gives {d}")
        }))
    };
    while let Some(v) = indptr.next()? {
        let row = offsets.row();
        let mut good = true;
        offsets.scan(&[v], |r, msg| {
            sound = false;
            if r == row {
                good = false;
            } else if let Some(l) = last.as_mut() {
                l.1 = false;
            }
            checked.problems.add(&indptr_file, Some(r), msg);
        });
        if row >= 2 {
            if let Some(msg) = compare(row - 2, before, last)? {
                checked.problems.add(&degree_file, Some(row - 2), msg);
            }
        }
        (before, last) = (last, Some((v, good)));
        if offsets.row() % PIECE as u64 == 0 {
            meter.add(PIECE as u64, PIECE as u64 * 8)?;
        }
    }
    meter.finish()?;
    if let Some((row, msg)) = offsets.end_problem() {
        sound = false;
        if let Some(l) = last.as_mut() {
            l.1 = false;
        }
        checked.problems.add(&indptr_file, Some(row), msg);
    }
    if offsets.row() >= 2 {
        let row = offsets.row() - 2;
        if let Some(msg) = compare(row, before, last)? {
            checked.problems.add(&degree_file, Some(row), msg);
        }
    }
    let field = if dir == "csr" { "dst" } else { "src" };
    let mut ids = IdCheck::nodes(store, &indices_name, field)?;
    let indices_file = ids.file().to_string();
    if !sound {
        // Without sound offsets the indices cannot be attributed to nodes: ranges only.
        checked.ids(store, &indices_name, ids, progress)?;
        return Ok(None);
    }
    let stat_name = if dir == "csr" {
        "out_degree"
    } else {
        "in_degree"
    };
    compare_stats(
        &mut checked.problems,
        stat_name,
        stats,
        &hist.stats(),
        &indptr_file,
    );
    let mut indptr = Stream::open(checked, store, &indptr_name)?;
    let mut indices = Stream::open(checked, store, &indices_name)?;
    let mut sigs = EdgeSigs::new(g.num_nodes);
    let n = g.num_nodes as i64;
    let mut meter = Meter::new(
        progress,
        &format!("check {indices_file}"),
        0,
        g.num_topology_edges,
    );
    let mut start = indptr.next()?.unwrap_or(0);
    let mut buf = Vec::new();
    for node in 0..g.num_nodes {
        let end = indptr.next()?.unwrap_or(start);
        let mut left = (end - start) as usize;
        while left > 0 {
            indices.take(left.min(PIECE), &mut buf)?;
            if buf.is_empty() {
                break;
            }
            left -= buf.len();
            ids.scan(&buf, |row, msg| {
                checked.problems.add(&indices_file, Some(row), msg)
            });
            for &x in buf.iter().filter(|&&x| (0..n).contains(&x)) {
                match dir {
                    "csr" => sigs.add(node, x as u64),
                    _ => sigs.add(x as u64, node),
                }
            }
            meter.add(buf.len() as u64, buf.len() as u64 * 8)?;
        }
        start = end;
    }
    meter.finish()?;
    Ok(Some(sigs))
}

/// Compares the manifest's degree statistics with those computed from `indptr`.
fn compare_stats(
    problems: &mut Problems,
    name: &str,
    stored: &DegreeStats,
    actual: &DegreeStats,
    from: &str,
) {
    let pairs = [
        ("min", stored.min, actual.min),
        ("max", stored.max, actual.max),
        ("median", stored.median, actual.median),
        ("p90", stored.p90, actual.p90),
        ("p99", stored.p99, actual.p99),
        ("zeros", stored.zeros, actual.zeros),
    ];
    for (field, s, a) in pairs {
        if s != a {
            problems.add(
                MANIFEST_FILE,
                None,
                format!("stats.{name}.{field} is {s} but {from} gives {a}"),
            );
        }
    }
    // The mean is a float written as JSON: allow for its rounding.
    if (stored.mean - actual.mean).abs() > 1e-6 * actual.mean.abs().max(1.0) {
        problems.add(
            MANIFEST_FILE,
            None,
            format!(
                "stats.{name}.mean is {} but {from} gives {}",
                stored.mean, actual.mean
            ),
        );
    }
}

/// Reports the destination ranges where CSR, CSC and the train edges disagree, blaming the one
/// that differs from the other two when there is one.
fn compare_edges(
    store: &Store,
    problems: &mut Problems,
    edges: &EdgeSigs,
    csr: Option<&EdgeSigs>,
    csc: Option<&EdgeSigs>,
) -> Result<()> {
    let file = |name: &str| store.require(name).map(|i| i.file.clone());
    let (edges_file, csr_file, csc_file) = (
        file("edges_train")?,
        file("csr_indices")?,
        file("csc_indices")?,
    );
    for b in 0..edges.ranges() {
        let agrees = |s: Option<&EdgeSigs>| s.is_none_or(|s| s.same(edges, b));
        let (csr_ok, csc_ok) = (agrees(csr), agrees(csc));
        if csr_ok && csc_ok {
            continue;
        }
        let (lo, hi) = edges.range(b);
        let topology_agrees = csr
            .zip(csc)
            .filter(|(r, c)| !csr_ok && !csc_ok && r.same(c, b));
        if let Some((r, _)) = topology_agrees {
            problems.add(
                &edges_file,
                None,
                format!(
                    "{edges_file}: the train edges into nodes [{lo}, {hi}) differ from those CSR and CSC agree on ({} edges, {} in CSR and CSC)",
                    edges.count(b),
                    r.count(b)
                ),
            );
            continue;
        }
        for (ok, sigs, f) in [(csr_ok, csr, &csr_file), (csc_ok, csc, &csc_file)] {
            if let (false, Some(s)) = (ok, sigs) {
                problems.add(
                    f,
                    None,
                    format!(
                        "{f}: the edges into nodes [{lo}, {hi}) differ from {edges_file}'s ({} edges, {} there)",
                        s.count(b),
                        edges.count(b)
                    ),
                );
            }
        }
    }
    Ok(())
}

/// Checks a name table: offsets from 0 to the byte count, never decreasing; names sorted and
/// unique (ids are ranks, found by binary search).
pub(crate) fn name_table(
    store: &Store,
    checked: &mut Checked,
    table: &str,
    progress: &dyn Progress,
) -> Result<()> {
    let (offsets_name, bytes_name) = (format!("{table}_offsets"), format!("{table}_bytes"));
    let total = store.require(&bytes_name)?.shape[0];
    let offsets_file = store.require(&offsets_name)?.file.clone();
    let mut check = IndptrCheck::array(store, &offsets_name, total)?;
    let mut sound = true;
    checked.ints(store, &offsets_name, progress, |problems, vals| {
        check.scan(vals, |row, msg| {
            sound = false;
            problems.add(&offsets_file, Some(row), msg);
        })
    })?;
    if let Some((row, msg)) = check.end_problem() {
        sound = false;
        checked.problems.add(&offsets_file, Some(row), msg);
    }
    if !sound {
        return Ok(());
    }
    let bytes_file = store.require(&bytes_name)?.file.clone();
    let mut offsets = Stream::open(checked, store, &offsets_name)?;
    let mut bytes = Stream::open(checked, store, &bytes_name)?;
    let (mut prev, mut name, mut vals) = (Vec::<u8>::new(), Vec::<u8>::new(), Vec::new());
    // A typed store's node names are sorted within each node type's id range.
    let restarts: Vec<u64> = match table {
        "node_names" => store
            .manifest()
            .node_types
            .iter()
            .map(|t| t.offset)
            .collect(),
        _ => Vec::new(),
    };
    let mut start = offsets.next()?.unwrap_or(0);
    let mut id = 0u64;
    while let Some(end) = offsets.next()? {
        bytes.take((end - start) as usize, &mut vals)?;
        name.clear();
        name.extend(vals.iter().map(|&b| b as u8));
        if id > 0 && restarts.binary_search(&id).is_err() && name <= prev {
            checked.problems.add(
                &bytes_file,
                Some(id),
                format!(
                    "{bytes_file}: name {id} ({}) does not sort after name {} ({}): names must be sorted and unique",
                    quoted(&name),
                    id - 1,
                    quoted(&prev)
                ),
            );
        }
        std::mem::swap(&mut prev, &mut name);
        start = end;
        id += 1;
    }
    Ok(())
}

/// Checks that every value of float array `name` (features, weights) is finite (a NaN poisons
/// every model that reads the row).
pub(crate) fn finite(
    store: &Store,
    checked: &mut Checked,
    name: &str,
    progress: &dyn Progress,
) -> Result<()> {
    let info = store.require(name)?.clone();
    let dim = info.shape.get(1).copied().unwrap_or(1).max(1) as usize;
    let mut reader = RowReader::open_array(store.path(), &info, CHUNK)?;
    let mut meter = Meter::new(
        progress,
        &format!("check {}", info.file),
        info.data_bytes(),
        info.shape[0],
    );
    let (mut row, mut vals) = (0u64, Vec::new());
    while let Some(bytes) = reader.next_batch()? {
        vals.clear();
        decode_f32(bytes, info.dtype, &mut vals);
        for r in vals.chunks_exact(dim) {
            if let Some(col) = r.iter().position(|x| !x.is_finite()) {
                checked.problems.add(
                    &info.file,
                    Some(row),
                    format!(
                        "{} row {row}: column {col} is {} ({name} must be finite)",
                        info.file, r[col]
                    ),
                );
            }
            row += 1;
        }
        meter.add((vals.len() / dim) as u64, bytes.len() as u64)?;
    }
    meter.finish()?;
    checked.read(&info.file, info.data_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_ignore_order_and_locate_a_difference() {
        let edges: Vec<(u64, u64)> = (0..5000u64)
            .map(|i| (i * 7 % 1000, i * 13 % 1000))
            .collect();
        let (mut a, mut b) = (EdgeSigs::new(1000), EdgeSigs::new(1000));
        edges.iter().for_each(|&(u, v)| a.add(u, v));
        edges.iter().rev().for_each(|&(u, v)| b.add(u, v));
        assert!((0..a.ranges()).all(|r| a.same(&b, r)));
        // One source changed: the same counts everywhere, one range differs.
        let mut c = EdgeSigs::new(1000);
        edges
            .iter()
            .enumerate()
            .for_each(|(i, &(u, v))| c.add(if i == 17 { u + 1 } else { u }, v));
        let differ: Vec<usize> = (0..a.ranges()).filter(|&r| !a.same(&c, r)).collect();
        assert_eq!(differ.len(), 1);
        let (lo, hi) = a.range(differ[0]);
        assert!((lo..hi).contains(&edges[17].1) && a.count(differ[0]) == c.count(differ[0]));
    }

    #[test]
    fn ranges_cover_the_nodes_once() {
        for n in [1u64, 7, 4096, 4097, 1_000_003] {
            let s = EdgeSigs::new(n);
            let mut next = 0;
            for r in 0..s.ranges() {
                let (lo, hi) = s.range(r);
                assert_eq!(lo, next);
                assert!((lo..hi).all(|v| s.bucket(v) == r) || hi - lo > 10_000);
                assert_eq!(s.bucket(lo), r);
                next = hi;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn problems_are_capped_per_file_and_counted() {
        let mut p = Problems::new(2);
        for row in 0..5 {
            p.add("a.npy", Some(row), format!("a.npy row {row}: bad"));
        }
        p.add("b.npy", None, "b".into());
        assert_eq!(p.listed.len(), 3);
        assert_eq!(p.unlisted["a.npy"], 3);
        assert_eq!(p.total(), 6);
    }
}
