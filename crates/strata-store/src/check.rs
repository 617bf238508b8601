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

use std::path::Path;

use serde::Serialize;
use strata_io::progress::{Meter, Progress};

use crate::check_stamp::Stamp;
use crate::checked::{finite, name_table, Stream, PIECE};
pub use crate::checked::{CheckReport, Checked, Problem, Problems, CHUNK, DEFAULT_MAX_PER_FILE};
use crate::convert::DegreeHistogram;
use crate::error::{Result, StoreError};
use crate::ids::{IdCheck, IndptrCheck};
use crate::manifest::{DegreeStats, Manifest};
use crate::rng::derive;
use crate::store::{array_problems, Store, MANIFEST as MANIFEST_FILE};

/// Most destination ranges the edge-multiset signatures distinguish (16 bytes each).
pub const SIG_BUCKETS: u64 = 4096;
/// Key of the edge hash.
const EDGE_HASH_KEY: u64 = 0x0065_6467_6573_6967;

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
    let mut checked = Checked::new(max_per_file);
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
