//! Node partitions and edge buckets.
//!
//! Nodes are spread over `n` partitions by a seeded bijection of their ids (so hubs do not
//! crowd one partition): node `v` sits at position `π(v)`, in partition `π(v) / size` at local
//! index `π(v) % size`. Train edges are grouped into `n x n` buckets `(partition of source,
//! partition of destination)` and stored, with local ids, in the store under
//! `partitions/n{n}-seed{seed}/` (a derived index: the store's own arrays are unchanged), with
//! their weights (`edge_weights_train`) in the same order when the store has them.
//!
//! A typed run places each entity type on its own ([`crate::storage::entity_types`]): partitioned
//! types by their own permutations, the others in a pinned region `n` held in memory all
//! epoch. An edge with a pinned end goes to the bucket of its other end's partition on both
//! sides (`(q, q)`), so that only that partition need be resident; one with both ends
//! pinned to `(0, 0)`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use strata_io::progress::{Meter, Progress};
use strata_store::array::{decode_ints, IntCursor, NpyWriter, RowReader, IO_CHUNK};
use strata_store::ids::IdCheck;
use strata_store::perm::Perm;
use strata_store::rng::derive;
use strata_store::units::fmt_bytes;
use strata_store::{DType, Store, StoreError};

use crate::error::{EmbedError, Result};
use crate::storage::entity_types::{EntityType, TypedLayout};

/// Where each node lives.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Partitioning {
    pub num_nodes: u64,
    pub partitions: u32,
    /// Positions per partition (the last one may hold fewer nodes); in a typed run the rows
    /// of a partition region (every partitioned type's share).
    pub part_size: u64,
    pub seed: u64,
    /// A typed run's entity types (None: one table of all nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub types: Option<Vec<EntityType>>,
}

impl Partitioning {
    pub fn new(num_nodes: u64, partitions: u32, seed: u64) -> Result<Self> {
        if partitions == 0 || partitions as u64 > num_nodes.max(1) {
            return Err(EmbedError::Config(format!(
                "partitions must be between 1 and the number of nodes ({num_nodes}), got {partitions}"
            )));
        }
        let part_size = num_nodes.div_ceil(partitions as u64);
        if part_size > i32::MAX as u64 {
            return Err(EmbedError::Config(format!(
                "{part_size} nodes per partition do not fit int32 local ids; use at least {} partitions",
                num_nodes.div_ceil(i32::MAX as u64)
            )));
        }
        Ok(Partitioning {
            num_nodes,
            partitions,
            part_size,
            seed,
            types: None,
        })
    }

    /// A typed run's partitioning: `types` (covering the ids in order) over `partitions`
    /// partitions. With one partition every type that is not featurized shares partition 0.
    pub fn typed(types: Vec<EntityType>, partitions: u32, seed: u64) -> Result<Self> {
        let num_nodes = types.last().map_or(0, |t| t.first + t.count);
        let most = types
            .iter()
            .filter(|t| t.partitioned)
            .map(|t| t.count)
            .max()
            .unwrap_or(1);
        if partitions == 0 || partitions as u64 > most.max(1) {
            return Err(EmbedError::Config(format!(
                "partitions must be between 1 and the largest partitioned entity type's count ({most}), got {partitions}"
            )));
        }
        let types: Vec<EntityType> = types
            .into_iter()
            .map(|t| EntityType {
                partitioned: t.features.is_none() && (t.partitioned || partitions == 1),
                ..t
            })
            .collect();
        let part_size: u64 = types
            .iter()
            .filter(|t| t.partitioned)
            .map(|t| t.count.div_ceil(partitions as u64))
            .sum();
        let layout = TypedLayout::new(&types, partitions, seed);
        let largest = layout.stored_rows(partitions).max(part_size);
        if largest > i32::MAX as u64 {
            return Err(EmbedError::Config(format!(
                "{largest} rows in one region do not fit int32 local ids; partition more entity types or use more partitions"
            )));
        }
        Ok(Partitioning {
            num_nodes,
            partitions,
            part_size,
            seed,
            types: Some(types),
        })
    }

    /// A typed run's layout of its entity types (None in an untyped run).
    pub fn typed_layout(&self) -> Option<TypedLayout> {
        self.types
            .as_ref()
            .map(|t| TypedLayout::new(t, self.partitions, self.seed))
    }

    /// The pinned region of a typed run whose types are not all partitioned: region id
    /// `partitions`, held in memory for the whole epoch.
    pub fn pinned(&self) -> Option<u32> {
        self.types
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| !t.partitioned))
            .then_some(self.partitions)
    }

    /// Whether some entity type is featurized (its pinned rows are features, not entities).
    pub fn featurized(&self) -> bool {
        self.types
            .as_ref()
            .is_some_and(|t| t.iter().any(|t| t.features.is_some()))
    }

    /// Every region of the table: the partitions, then the pinned region if any.
    pub fn regions(&self) -> Vec<u32> {
        (0..self.partitions).chain(self.pinned()).collect()
    }

    /// The bijection, or `None` for a single partition (identity, which keeps exports in id order).
    fn perm(&self) -> Option<Perm> {
        (self.partitions > 1).then(|| Perm::new(self.num_nodes, derive(self.seed, 0x9a27)))
    }

    /// A locator reusable for many nodes.
    pub fn locator(&self) -> Locator {
        Locator {
            perm: if self.types.is_some() {
                None
            } else {
                self.perm()
            },
            part_size: self.part_size,
            num_nodes: self.num_nodes,
            typed: self.typed_layout(),
        }
    }

    /// Nodes in region `p` (entity view: a featurized entity is one row).
    pub fn size_of(&self, p: u32) -> u64 {
        if let Some(t) = &self.types {
            return TypedLayout::new(t, self.partitions, self.seed).entities_in(p);
        }
        let start = p as u64 * self.part_size;
        self.num_nodes.saturating_sub(start).min(self.part_size)
    }

    /// Rows region `p` stores: [`Partitioning::size_of`], except for a pinned region holding
    /// featurized types (their features).
    pub fn stored_rows(&self, p: u32) -> u64 {
        match &self.types {
            Some(t) => TypedLayout::new(t, self.partitions, self.seed).stored_rows(p),
            None => self.size_of(p),
        }
    }
}

/// Maps node ids to (partition, local index) and back.
pub struct Locator {
    perm: Option<Perm>,
    part_size: u64,
    num_nodes: u64,
    typed: Option<TypedLayout>,
}

impl Locator {
    /// `(partition, local index)` of node `v` (in a typed run: region and entity-view row).
    #[inline]
    pub fn locate(&self, v: u64) -> (u32, u32) {
        if let Some(t) = &self.typed {
            return t.locate(v);
        }
        let pos = self.perm.as_ref().map_or(v, |p| p.apply(v));
        ((pos / self.part_size) as u32, (pos % self.part_size) as u32)
    }

    /// The node at local index `local` of partition `p`.
    pub fn node(&self, p: u32, local: u32) -> u64 {
        if let Some(t) = &self.typed {
            return t.node(p, local);
        }
        let pos = p as u64 * self.part_size + local as u64;
        debug_assert!(pos < self.num_nodes);
        self.perm.as_ref().map_or(pos, |q| q.invert(pos))
    }
}

/// The bucketed train edges of a store for one partitioning.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Buckets {
    pub partitioning: Partitioning,
    pub num_edges: u64,
    /// Bytes of the store's train-edge array this was built from (a staleness check).
    pub source_bytes: u64,
    /// The store's edge weights, bucketed in `weights.npy` (None: the store has none).
    #[serde(default)]
    pub weights: Option<WeightSummary>,
    #[serde(skip)]
    pub dir: PathBuf,
    /// `offsets[a * n + b]..offsets[a * n + b + 1]` are the rows of bucket `(a, b)`.
    #[serde(skip)]
    pub offsets: Vec<u64>,
}

impl Buckets {
    /// Rows of bucket `(a, b)` in `edges.npy`.
    pub fn range(&self, a: u32, b: u32) -> std::ops::Range<u64> {
        let i = (a * self.partitioning.partitions + b) as usize;
        self.offsets[i]..self.offsets[i + 1]
    }

    /// Path of the bucketed edge array: `(E, 3)` int32 rows `(src_local, rel, dst_local)`.
    pub fn edges_path(&self) -> PathBuf {
        self.dir.join("edges.npy")
    }

    /// Path of the bucketed weights: `(E,)` float32, row `i` the weight of edge row `i`.
    pub fn weights_path(&self) -> PathBuf {
        self.dir.join("weights.npy")
    }

    /// Edges in the largest bucket.
    pub fn max_bucket(&self) -> u64 {
        self.offsets
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or(0)
    }
}

/// What the bucketing pass saw of the store's edge weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WeightSummary {
    /// Smallest, largest and summed weight over the finite ones.
    pub min: f32,
    pub max: f32,
    pub sum: f64,
    /// The first weight that is negative or not finite: its row in `edge_weights_train` and
    /// its value as text.
    pub first_bad: Option<(u64, String)>,
}

impl WeightSummary {
    fn new() -> Self {
        WeightSummary {
            min: f32::INFINITY,
            max: f32::NEG_INFINITY,
            sum: 0.0,
            first_bad: None,
        }
    }

    fn add(&mut self, row: u64, w: f32) {
        if w.is_finite() {
            self.min = self.min.min(w);
            self.max = self.max.max(w);
            self.sum += w as f64;
        }
        if !(w >= 0.0 && w.is_finite()) && self.first_bad.is_none() {
            self.first_bad = Some((row, w.to_string()));
        }
    }

    /// An error naming the first weight training cannot use (negative, NaN or infinite).
    pub fn check(&self, store: &Path) -> Result<()> {
        match &self.first_bad {
            None => Ok(()),
            Some((row, value)) => Err(StoreError::Invalid {
                store: store.to_path_buf(),
                msg: format!(
                    "{WEIGHTS} row {row}: weight {value}: embedding training scales each edge's \
                     loss by its weight, which must be a finite number >= 0 (set \
                     embed.train.edge_weights = false to ignore the weights)"
                ),
            }
            .into()),
        }
    }
}

/// The store array of train-edge weights.
pub const WEIGHTS: &str = "edge_weights_train";

/// The store's edge weights read in step with its edges (as their bit patterns).
fn weight_cursor(store: &Store) -> Result<Option<IntCursor>> {
    let Some(info) = store.array(WEIGHTS) else {
        return Ok(None);
    };
    let reader = RowReader::open_array(store.path(), info, IO_CHUNK)?;
    Ok(Some(IntCursor::new(reader, DType::I32)))
}

/// The next `k` weights of `cursor` into `out` (emptied when there is no cursor).
fn take_weights(
    cursor: &mut Option<IntCursor>,
    k: usize,
    bits: &mut Vec<i64>,
    out: &mut Vec<f32>,
) -> Result<()> {
    out.clear();
    if let Some(c) = cursor {
        c.take(k, bits)?;
        out.extend(bits.iter().map(|&b| f32::from_bits(b as u32)));
        if out.len() != k {
            return Err(EmbedError::Corrupt(format!(
                "{WEIGHTS} holds fewer weights than edges_train has edges"
            )));
        }
    }
    Ok(())
}

fn index_dir(store: &Store, p: &Partitioning) -> PathBuf {
    let name = match &p.types {
        None => format!("n{}-seed{}", p.partitions, p.seed),
        // A typed layout buckets differently: its own index, named by a hash of the types.
        Some(types) => {
            let text = serde_json::to_string(types).expect("serialises");
            let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
            });
            format!("n{}-seed{}-typed-{hash:016x}", p.partitions, p.seed)
        }
    };
    store.path().join("partitions").join(name)
}

/// The bucket of an edge whose ends are in regions `a` and `b`: `(a, b)`, or with an end in
/// the pinned region `pinned` the bucket of the other end's partition on both sides (`(0, 0)`
/// when both ends are pinned).
#[inline]
pub fn bucket_of(a: u32, b: u32, pinned: Option<u32>) -> (u32, u32) {
    match pinned {
        Some(p) if a == p && b == p => (0, 0),
        Some(p) if a == p => (b, b),
        Some(p) if b == p => (a, a),
        _ => (a, b),
    }
}

/// The buckets of `store` for `partitioning`, built (within `budget` bytes) unless an index
/// built from the same edges already exists.
pub fn buckets(
    store: &Store,
    partitioning: &Partitioning,
    budget: u64,
    progress: &dyn Progress,
) -> Result<Buckets> {
    let dir = index_dir(store, partitioning);
    let edges = store.require("edges_train")?.clone();
    let source_bytes = std::fs::metadata(store.array_path("edges_train")?)
        .map_err(|e| StoreError::Io(strata_io::IoError::os("stat", &dir, 0, e)))?
        .len();
    let weighted = store.array(WEIGHTS).is_some();
    if let Ok(existing) = load(&dir) {
        if existing.partitioning == *partitioning
            && existing.source_bytes == source_bytes
            && existing.weights.is_some() == weighted
        {
            return Ok(existing);
        }
    }
    let n = partitioning.partitions as usize;
    let locator = partitioning.locator();
    let pinned = partitioning.pinned();
    let cols = edges.shape[1] as usize;
    let num_edges = edges.shape[0];
    // Pass 1: bucket sizes, with every id checked (the later passes re-read the same rows).
    let mut counts = vec![0u64; n * n];
    let mut meter = Meter::new(progress, "bucket counts", edges.data_bytes(), num_edges);
    let mut reader = RowReader::open_array(store.path(), &edges, IO_CHUNK)?;
    let mut ids = IdCheck::edges(store, "edges_train")?;
    let (mut vals, mut bits, mut w) = (Vec::new(), Vec::new(), Vec::new());
    let mut weight_col = weight_cursor(store)?;
    let mut summary = weighted.then(WeightSummary::new);
    let mut row_at = 0u64;
    while let Some(bytes) = reader.next_batch()? {
        vals.clear();
        decode_ints(bytes, edges.dtype, &mut vals);
        ids.check(&vals)?;
        for row in vals.chunks_exact(cols) {
            let (a, _) = locator.locate(row[0] as u64);
            let (b, _) = locator.locate(row[cols - 1] as u64);
            let (a, b) = bucket_of(a, b, pinned);
            counts[a as usize * n + b as usize] += 1;
        }
        let rows = vals.len() / cols;
        take_weights(&mut weight_col, rows, &mut bits, &mut w)?;
        if let Some(summary) = &mut summary {
            for (i, &x) in w.iter().enumerate() {
                summary.add(row_at + i as u64, x);
            }
        }
        row_at += rows as u64;
        meter.add(rows as u64, bytes.len() as u64)?;
    }
    meter.finish()?;
    let mut offsets = vec![0u64; n * n + 1];
    for i in 0..n * n {
        offsets[i + 1] = offsets[i] + counts[i];
    }
    // Pass 2+: groups of consecutive buckets that fit the budget, scattered in memory.
    let row_bytes = if weighted { 16u64 } else { 12 };
    let group_budget = budget
        .saturating_sub(4 * IO_CHUNK as u64)
        .max(row_bytes * 1024);
    let parent = dir.parent().expect("index dir has a parent").to_path_buf();
    std::fs::create_dir_all(&parent)
        .map_err(|e| StoreError::Io(strata_io::IoError::os("mkdir", &parent, 0, e)))?;
    let tmp = parent.join(format!(
        ".n{n}-seed{}.partial-{}",
        partitioning.seed,
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir(&tmp)
        .map_err(|e| StoreError::Io(strata_io::IoError::os("mkdir", &tmp, 0, e)))?;
    let cleanup = TempDir(tmp.clone());
    let mut edge_w = NpyWriter::create(
        &tmp.join("edges.npy"),
        strata_store::DType::I32,
        &[3],
        IO_CHUNK,
    )?;
    let mut weight_w = match weighted {
        true => Some(NpyWriter::create(
            &tmp.join("weights.npy"),
            strata_store::DType::F32,
            &[],
            IO_CHUNK,
        )?),
        false => None,
    };
    let mut start = 0usize;
    let mut passes = 0;
    while start < n * n {
        let mut end = start + 1;
        while end < n * n && (offsets[end + 1] - offsets[start]) * row_bytes <= group_budget {
            end += 1;
        }
        let base = offsets[start];
        let mut group = vec![[0i32; 3]; (offsets[end] - base) as usize];
        let mut group_w = vec![0f32; if weighted { group.len() } else { 0 }];
        let mut cursor: Vec<u64> = offsets[start..end].iter().map(|o| o - base).collect();
        passes += 1;
        let mut meter = Meter::new(
            progress,
            &format!("bucket pass {passes}"),
            edges.data_bytes(),
            num_edges,
        );
        let mut reader = RowReader::open_array(store.path(), &edges, IO_CHUNK)?;
        let mut weight_col = weight_cursor(store)?;
        while let Some(bytes) = reader.next_batch()? {
            vals.clear();
            decode_ints(bytes, edges.dtype, &mut vals);
            let rows = vals.len() / cols;
            take_weights(&mut weight_col, rows, &mut bits, &mut w)?;
            for (i, row) in vals.chunks_exact(cols).enumerate() {
                let (a, la) = locator.locate(row[0] as u64);
                let (b, lb) = locator.locate(row[cols - 1] as u64);
                let (a, b) = bucket_of(a, b, pinned);
                let bucket = a as usize * n + b as usize;
                if (start..end).contains(&bucket) {
                    let rel = if cols == 3 { row[1] as i32 } else { 0 };
                    let c = &mut cursor[bucket - start];
                    group[*c as usize] = [la as i32, rel, lb as i32];
                    if let Some(&x) = w.get(i) {
                        group_w[*c as usize] = x;
                    }
                    *c += 1;
                }
            }
            meter.add(rows as u64, bytes.len() as u64)?;
        }
        meter.finish()?;
        edge_w.write(bytemuck::cast_slice::<[i32; 3], i32>(&group))?;
        if let Some(ww) = &mut weight_w {
            ww.write(&group_w)?;
        }
        start = end;
    }
    edge_w.finish()?;
    if let Some(ww) = weight_w {
        ww.finish()?;
    }
    let mut off_w = NpyWriter::create(
        &tmp.join("offsets.npy"),
        strata_store::DType::I64,
        &[],
        IO_CHUNK,
    )?;
    off_w.write(&offsets.iter().map(|&o| o as i64).collect::<Vec<_>>())?;
    off_w.finish()?;
    let result = Buckets {
        partitioning: partitioning.clone(),
        num_edges,
        source_bytes,
        weights: summary,
        dir: dir.clone(),
        offsets,
    };
    let manifest = serde_json::to_string_pretty(&result).expect("serialises");
    std::fs::write(tmp.join("manifest.json"), manifest)
        .map_err(|e| StoreError::Io(strata_io::IoError::os("write", &tmp, 0, e)))?;
    strata_io::durable::publish_dir(&tmp, &dir, "buckets").map_err(StoreError::Io)?;
    std::mem::forget(cleanup);
    progress.message(&format!(
        "bucketed {num_edges} train edges{} into {}x{} buckets in {} pass(es) within {} (largest bucket {} edges)",
        if weighted { " and their weights" } else { "" },
        n,
        n,
        passes + 1,
        fmt_bytes(budget),
        result.max_bucket()
    ));
    Ok(result)
}

/// Reads an existing bucket index.
pub fn load(dir: &Path) -> Result<Buckets> {
    let text = std::fs::read_to_string(dir.join("manifest.json"))
        .map_err(|e| StoreError::Io(strata_io::IoError::os("read", dir, 0, e)))?;
    let mut b: Buckets = serde_json::from_str(&text)
        .map_err(|e| EmbedError::Corrupt(format!("{}: {e}", dir.display())))?;
    let (_, bytes) = strata_store::array::read_all_bytes(&dir.join("offsets.npy"))?;
    b.offsets = bytes
        .chunks_exact(8)
        .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u64)
        .collect();
    b.dir = dir.to_path_buf();
    let n = b.partitioning.partitions as usize;
    if b.offsets.len() != n * n + 1 || b.offsets.last() != Some(&b.num_edges) {
        return Err(EmbedError::Corrupt(format!(
            "{}: offsets do not match {n}x{n} buckets",
            dir.display()
        )));
    }
    Ok(b)
}

/// Removes a directory when dropped (a failed build leaves nothing behind).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::entity_types::tests::ty;

    #[test]
    fn typed_buckets_need_only_their_partitions_resident() {
        // Users and items in 4 partitions each, tags unpartitioned (PBG's num_partitions 1).
        let p = Partitioning::typed(
            vec![
                ty("user", 0, 50, true),
                ty("item", 50, 30, true),
                ty("tag", 80, 5, false),
            ],
            4,
            1,
        )
        .unwrap();
        assert_eq!(p.pinned(), Some(4));
        assert_eq!(p.regions(), vec![0, 1, 2, 3, 4]);
        assert_eq!(p.part_size, 13 + 8);
        let loc = p.locator();
        let mut seen = std::collections::HashSet::new();
        for u in 0..85 {
            for v in 0..85 {
                let ((a, la), (b, lb)) = (loc.locate(u), loc.locate(v));
                let (x, y) = bucket_of(a, b, p.pinned());
                assert!(x < 4 && y < 4, "{u} {v}");
                // Each end is in one of the bucket's partitions or in the pinned region.
                assert!([x, y, 4].contains(&a) && [x, y, 4].contains(&b));
                assert_eq!((loc.node(a, la), loc.node(b, lb)), (u, v));
                seen.insert((x, y));
            }
        }
        // Tag-to-tag edges share bucket (0, 0); a tag's edges go to the other end's diagonal.
        assert_eq!(bucket_of(4, 4, Some(4)), (0, 0));
        assert_eq!(bucket_of(4, 2, Some(4)), (2, 2));
        assert_eq!(bucket_of(3, 4, Some(4)), (3, 3));
        assert_eq!(seen.len(), 16);
        // With one partition every plain type shares it: no pinned region.
        let one = Partitioning::typed(vec![ty("user", 0, 50, true), ty("tag", 50, 5, false)], 1, 1)
            .unwrap();
        assert_eq!((one.pinned(), one.size_of(0)), (None, 55));
        // More partitions than the largest partitioned type has nodes are refused.
        assert!(Partitioning::typed(vec![ty("user", 0, 3, true)], 4, 1).is_err());
    }
}
