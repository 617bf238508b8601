//! The grid's geometry and manifest: vertices in P contiguous chunks, edges in P x P blocks
//! stored one after another in column-major (or row-major) order, with a block index.

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::manifest::ArrayInfo;

use crate::block_codec::Compression;
use crate::error::{GridError, Result};

/// The `format` field of every grid manifest.
pub const GRID_FORMAT: &str = "strata-grid";
/// The newest grid format version this Strata reads: 2 added compressed edge blocks. A grid
/// is written with the oldest version that describes it ([`format_version`]), so plain grids
/// stay readable by a Strata that knows only version 1.
pub const GRID_FORMAT_VERSION: u32 = 2;

/// The format version a grid of `compression` is written with: 1 for plain edge records, 2
/// for compressed blocks (a Strata that reads only version 1 then refuses the grid by its
/// version, rather than missing `edges.npy`).
pub fn format_version(compression: Compression) -> u32 {
    if compression.is_compressed() {
        2
    } else {
        1
    }
}
/// The array of a compressed grid's block codes, and the index of their first bytes.
pub const EDGE_CODES: &str = "edge_codes";
pub const CODE_INDEX: &str = "code_index";
/// Name of the manifest inside a grid directory.
pub const GRID_MANIFEST: &str = "grid.json";
/// Bytes of one edge record: source and destination offsets from their chunk bases (u32 each).
pub const EDGE_BYTES: u64 = 8;
/// Vertices per chunk the automatic plan aims for: a chunk's source and destination values
/// (4 + 4 bytes each) then take 1 MiB and stay in a core's L2 cache while a block streams.
pub const CHUNK_TARGET: u64 = 1 << 17;
/// Average bytes of a block the automatic plan allows.
pub const BLOCK_TARGET: u64 = 1 << 20;
/// Most partitions a grid may have (the block index then holds 16M entries, 128 MiB).
pub const MAX_PARTITIONS: u32 = 4096;

/// Order of the blocks in the edge file, and so the natural streaming order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    /// Block (i, j) at position `j * P + i`: all blocks with destinations in chunk j together
    /// (GridGraph's `column` file, its default update mode).
    #[default]
    Column,
    /// Block (i, j) at position `i * P + j`: all blocks with sources in chunk i together.
    Row,
}

impl Order {
    pub fn name(self) -> &'static str {
        match self {
            Order::Column => "column",
            Order::Row => "row",
        }
    }
}

/// How a weighted grid's edge weights were made (recorded in its manifest as `kind`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum WeightSpec {
    /// Uniform in (low, high], a pure function of the seed and the unordered endpoint pair
    /// (so both directions of a symmetrised edge weigh the same).
    Random { seed: u64, low: f32, high: f32 },
    /// The store's `edge_weights_train` column, edge by edge (both directions of a
    /// symmetrised edge carry its weight).
    Store,
}

/// The store array a [`WeightSpec::Store`] grid takes its weights from.
pub const STORE_WEIGHTS: &str = "edge_weights_train";

impl WeightSpec {
    /// The drawn weight of edge `(u, v)`; `None` for store weights, which come with the edge.
    #[inline]
    pub fn drawn(&self, u: u64, v: u64) -> Option<f32> {
        let WeightSpec::Random { seed, low, high } = *self else {
            return None;
        };
        let (a, b) = if u <= v { (u, v) } else { (v, u) };
        let h = strata_store::rng::derive(strata_store::rng::derive(seed, a), b);
        let unit = ((h >> 11) as f64 + 1.0) / (1u64 << 53) as f64; // (0, 1]
        Some((low as f64 + unit * (high - low) as f64) as f32)
    }
}

/// Where a job wants a weighted grid's weights from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum WeightSource {
    /// The store's weights when it has them, else drawn ones.
    #[default]
    Auto,
    /// The store's `edge_weights_train` (an error when the store has none).
    Store,
    /// Drawn from the seed, uniform in (low, high].
    Random,
}

/// What a job asks for: the source, and the parameters of drawn weights.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WeightRequest {
    pub source: WeightSource,
    pub seed: u64,
    pub low: f32,
    pub high: f32,
}

impl Default for WeightRequest {
    /// The store's weights when it has them, else drawn from seed 0 in (0, 1].
    fn default() -> Self {
        WeightRequest {
            source: WeightSource::Auto,
            ..WeightRequest::random(0, 0.0, 1.0)
        }
    }
}

impl WeightRequest {
    /// Drawn weights, uniform in (low, high] from `seed`.
    pub fn random(seed: u64, low: f32, high: f32) -> WeightRequest {
        WeightRequest {
            source: WeightSource::Random,
            seed,
            low,
            high,
        }
    }

    /// The weights this request gives on `store`, whose `has_weights` says whether it carries
    /// `edge_weights_train`.
    pub fn resolve(&self, has_weights: bool, store: &Path) -> Result<WeightSpec> {
        let drawn = WeightSpec::Random {
            seed: self.seed,
            low: self.low,
            high: self.high,
        };
        match (self.source, has_weights) {
            (WeightSource::Random, _) | (WeightSource::Auto, false) => Ok(drawn),
            (WeightSource::Store, true) | (WeightSource::Auto, true) => Ok(WeightSpec::Store),
            (WeightSource::Store, false) => Err(GridError::config(
                "weight_source",
                format!(
                    "{} has no edge weights ({STORE_WEIGHTS}): convert it with a weight column \
                     (--columns src,dst,weight), or use weight_source random",
                    store.display()
                ),
            )),
        }
    }
}

/// Where vertices and blocks sit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub num_vertices: u64,
    pub partitions: u32,
    /// Vertices per chunk (the last chunk may hold fewer).
    pub chunk_size: u64,
    pub order: Order,
}

impl Layout {
    /// The layout of `num_vertices` vertices in `partitions` chunks.
    pub fn new(num_vertices: u64, partitions: u32, order: Order) -> Result<Layout> {
        if partitions == 0 || partitions > MAX_PARTITIONS {
            return Err(GridError::config(
                "partitions",
                format!("must be between 1 and {MAX_PARTITIONS}, got {partitions}"),
            ));
        }
        if partitions as u64 > num_vertices.max(1) {
            return Err(GridError::config(
                "partitions",
                format!(
                    "{partitions} partitions for {num_vertices} vertices: at most one per vertex"
                ),
            ));
        }
        let chunk_size = num_vertices.div_ceil(partitions as u64).max(1);
        if chunk_size > u32::MAX as u64 + 1 {
            return Err(GridError::config(
                "partitions",
                format!(
                    "{chunk_size} vertices per chunk do not fit the 32-bit in-block ids; use at least {}",
                    num_vertices.div_ceil(u32::MAX as u64 + 1)
                ),
            ));
        }
        Ok(Layout {
            num_vertices,
            partitions,
            chunk_size,
            order,
        })
    }

    /// P chosen for a graph: chunks of about [`CHUNK_TARGET`] vertices; at least enough
    /// that one chunk of `vertex_bytes`-per-vertex state is an eighth of `memory`; and enough
    /// that an average block holds at most [`BLOCK_TARGET`] bytes of edges (a block is the
    /// smallest unit the engine fetches, so it sizes the fetch buffers).
    pub fn auto_partitions(
        num_vertices: u64,
        num_edges: u64,
        vertex_bytes: u64,
        memory: u64,
    ) -> u32 {
        let by_cache = num_vertices.div_ceil(CHUNK_TARGET);
        let by_budget = (num_vertices * vertex_bytes * 8).div_ceil(memory.max(1));
        let by_blocks = ((num_edges * EDGE_BYTES) as f64 / BLOCK_TARGET as f64)
            .sqrt()
            .ceil() as u64;
        by_cache
            .max(by_budget)
            .max(by_blocks)
            .clamp(1, (MAX_PARTITIONS as u64).min(num_vertices.max(1))) as u32
    }

    /// Chunk of vertex `v`.
    #[inline]
    pub fn chunk_of(&self, v: u64) -> u32 {
        (v / self.chunk_size) as u32
    }

    /// First vertex of chunk `i`.
    #[inline]
    pub fn base(&self, i: u32) -> u64 {
        (i as u64 * self.chunk_size).min(self.num_vertices)
    }

    /// Vertices in chunk `i`.
    #[inline]
    pub fn chunk_len(&self, i: u32) -> u64 {
        self.base(i + 1) - self.base(i)
    }

    /// Number of blocks, P².
    pub fn blocks(&self) -> usize {
        let p = self.partitions as usize;
        p * p
    }

    /// Position in the edge file of block (i = source chunk, j = destination chunk).
    #[inline]
    pub fn position(&self, i: u32, j: u32) -> usize {
        let p = self.partitions as usize;
        match self.order {
            Order::Column => j as usize * p + i as usize,
            Order::Row => i as usize * p + j as usize,
        }
    }

    /// Block (i, j) at file position `pos`.
    #[inline]
    pub fn block_at(&self, pos: usize) -> (u32, u32) {
        let p = self.partitions as usize;
        let (major, minor) = ((pos / p) as u32, (pos % p) as u32);
        match self.order {
            Order::Column => (minor, major),
            Order::Row => (major, minor),
        }
    }
}

/// The whole grid manifest (`grid.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridManifest {
    pub format: String,
    pub format_version: u32,
    pub num_vertices: u64,
    pub num_edges: u64,
    pub partitions: u32,
    pub chunk_size: u64,
    pub order: Order,
    /// Every edge is stored in both directions (self-loops once).
    pub symmetric: bool,
    /// A simple graph: self-loops dropped and repeated edges stored once, so each neighbour
    /// counts once (what k-core needs; absent in grids that keep every input edge).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simple: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights: Option<WeightSpec>,
    /// Smallest and largest edge weight (weighted grids; absent in grids built before it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_range: Option<(f32, f32)>,
    /// How blocks store their edges (absent in plain grids, and in every grid built before
    /// compression).
    #[serde(default, skip_serializing_if = "is_plain")]
    pub compression: Compression,
    /// `edges` (uint32, (E, 2): in-block source and destination; plain grids) or
    /// `edge_codes` (uint8, (B,): the blocks' codes) with `code_index` (int64, (P²+1,): first
    /// byte of each block's code) in compressed grids; `weights` (float32, (E,)),
    /// `block_index` (int64, (P²+1,): first edge of each block in file order), `out_degree`
    /// and `in_degree` (int64, (V,)).
    pub arrays: BTreeMap<String, ArrayInfo>,
    /// Bytes of each block's edge records are `EDGE_BYTES * count`; this summary saves
    /// reading the block index for a plan.
    pub largest_block_edges: u64,
    /// Edges of the largest column (or row, in row order): the biggest unit a compute thread owns.
    pub largest_major_edges: u64,
    /// The store it was built from and how.
    #[serde(default)]
    pub provenance: serde_json::Value,
}

fn is_plain(c: &Compression) -> bool {
    !c.is_compressed()
}

impl GridManifest {
    /// The smallest edge weight: measured at build, or (grids built before that was
    /// recorded) the low end of the drawn range; `None` when unweighted.
    pub fn lowest_weight(&self) -> Option<f32> {
        match (&self.weight_range, &self.weights) {
            (Some((lo, _)), _) => Some(*lo),
            (None, Some(WeightSpec::Random { low, .. })) => Some(*low),
            (None, _) => None,
        }
    }

    /// The layout the manifest describes.
    pub fn layout(&self) -> Result<Layout> {
        Layout::new(self.num_vertices, self.partitions, self.order)
    }

    /// Bytes the grid stores its edges in: records (8 B an edge) or the blocks' codes.
    pub fn stored_edge_bytes(&self) -> u64 {
        match self.compression {
            Compression::None => self.num_edges * EDGE_BYTES,
            _ => self
                .arrays
                .get(EDGE_CODES)
                .and_then(|a| a.shape.first().copied())
                .unwrap_or(0),
        }
    }

    /// The array holding the edges: `edges` (plain) or `edge_codes` (compressed).
    pub fn edge_array(&self) -> &'static str {
        if self.compression.is_compressed() {
            EDGE_CODES
        } else {
            "edges"
        }
    }

    /// Reads and checks `grid.json` in `dir`.
    pub fn load(dir: &Path) -> Result<GridManifest> {
        let path = dir.join(GRID_MANIFEST);
        if strata_io::durable::is_partial(dir) {
            return Err(GridError::invalid(
                dir,
                "this is an unfinished grid (a `.partial-PID` directory that an interrupted or still running `strata grid build` left); it is never opened: build the grid again",
            ));
        }
        if !path.exists() {
            return Err(GridError::invalid(
                dir,
                format!(
                    "not a grid: {GRID_MANIFEST} is missing (build one with `strata grid build`)"
                ),
            ));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| GridError::os("read", &path, e))?;
        let raw: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            GridError::invalid(dir, format!("{GRID_MANIFEST} is not valid JSON: {e}"))
        })?;
        if raw.get("format").and_then(|v| v.as_str()) != Some(GRID_FORMAT) {
            return Err(GridError::invalid(
                dir,
                format!("{GRID_MANIFEST} does not say \"format\": \"{GRID_FORMAT}\""),
            ));
        }
        let version = raw
            .get("format_version")
            .and_then(|v| v.as_u64())
            .unwrap_or(0);
        if version == 0 || version > GRID_FORMAT_VERSION as u64 {
            return Err(GridError::invalid(
                dir,
                format!(
                    "grid format version {version}; this Strata reads versions 1 to {GRID_FORMAT_VERSION}"
                ),
            ));
        }
        let m: GridManifest = serde_json::from_value(raw).map_err(|e| {
            GridError::invalid(
                dir,
                format!("{GRID_MANIFEST} does not match the format: {e}"),
            )
        })?;
        m.layout()
            .map_err(|e| GridError::invalid(dir, format!("inconsistent geometry: {e}")))?;
        if m.format_version < format_version(m.compression) {
            return Err(GridError::invalid(
                dir,
                format!(
                    "{GRID_MANIFEST} says compression {} in format version {}; compressed grids are version 2",
                    m.compression.name(),
                    m.format_version
                ),
            ));
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_tile_the_vertices(n in 1u64..100_000, p in 1u32..300) {
            prop_assume!(p as u64 <= n);
            let l = Layout::new(n, p, Order::Column).unwrap();
            let mut next = 0;
            for i in 0..p {
                prop_assert_eq!(l.base(i), next);
                next += l.chunk_len(i);
            }
            prop_assert_eq!(next, n);
            for v in [0, n / 2, n - 1] {
                let c = l.chunk_of(v);
                prop_assert!(c < p && l.base(c) <= v && v < l.base(c) + l.chunk_len(c));
            }
        }

        #[test]
        fn positions_are_a_bijection(p in 1u32..40, row in any::<bool>()) {
            let order = if row { Order::Row } else { Order::Column };
            let l = Layout::new(10_000, p, order).unwrap();
            let mut seen = vec![false; l.blocks()];
            for i in 0..p {
                for j in 0..p {
                    let pos = l.position(i, j);
                    prop_assert!(!seen[pos]);
                    seen[pos] = true;
                    prop_assert_eq!(l.block_at(pos), (i, j));
                }
            }
        }
    }

    #[test]
    fn auto_partitions_follow_cache_and_budget() {
        assert_eq!(Layout::auto_partitions(1000, 16_000, 16, 1 << 30), 1);
        assert_eq!(Layout::auto_partitions(1 << 24, 1 << 28, 16, 1 << 30), 128);
        // 16M vertices x 16 B x 8 over 64 MiB: 32 chunks by budget, 128 by cache.
        assert_eq!(Layout::auto_partitions(1 << 24, 1 << 28, 16, 64 << 20), 128);
        assert_eq!(Layout::auto_partitions(1 << 24, 1 << 28, 16, 8 << 20), 256);
        // 65k vertices with 1M edges (8 MiB): one chunk by cache, 3 for 1 MiB blocks.
        assert_eq!(Layout::auto_partitions(1 << 16, 1 << 20, 16, 1 << 30), 3);
    }

    #[test]
    fn weights_are_symmetric_and_in_range() {
        let w = WeightSpec::Random {
            seed: 3,
            low: 1.0,
            high: 10.0,
        };
        for (u, v) in [(0, 1), (5, 2), (7, 7)] {
            let x = w.drawn(u, v).unwrap();
            assert_eq!(Some(x), w.drawn(v, u));
            assert!(x > 1.0 && x <= 10.0);
        }
        assert_eq!(WeightSpec::Store.drawn(0, 1), None);
    }

    #[test]
    fn a_request_takes_the_stores_weights_when_it_has_them() {
        let at = Path::new("g.strata");
        let req = |source| WeightRequest {
            source,
            ..WeightRequest::random(1, 0.0, 2.0)
        };
        let drawn = WeightSpec::Random {
            seed: 1,
            low: 0.0,
            high: 2.0,
        };
        assert_eq!(
            req(WeightSource::Auto).resolve(true, at).unwrap(),
            WeightSpec::Store
        );
        assert_eq!(req(WeightSource::Auto).resolve(false, at).unwrap(), drawn);
        assert_eq!(req(WeightSource::Random).resolve(true, at).unwrap(), drawn);
        let err = req(WeightSource::Store)
            .resolve(false, at)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("option weight_source") && err.contains("no edge weights"),
            "{err}"
        );
    }

    #[test]
    fn manifests_written_before_store_weights_still_read() {
        let old = r#"{"kind": "random", "seed": 7, "low": 0.0, "high": 1.0}"#;
        let w: WeightSpec = serde_json::from_str(old).unwrap();
        assert_eq!(
            w,
            WeightSpec::Random {
                seed: 7,
                low: 0.0,
                high: 1.0
            }
        );
        let store: WeightSpec = serde_json::from_str(r#"{"kind": "store"}"#).unwrap();
        assert_eq!(
            serde_json::to_string(&store).unwrap(),
            r#"{"kind":"store"}"#
        );
    }

    #[test]
    fn plain_manifests_keep_version_1_and_compressed_ones_need_2() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = |version: u32, compression: Option<&str>| {
            let mut m = serde_json::json!({
                "format": GRID_FORMAT, "format_version": version, "num_vertices": 10,
                "num_edges": 0, "partitions": 2, "chunk_size": 5, "order": "column",
                "symmetric": false, "arrays": {}, "largest_block_edges": 0,
                "largest_major_edges": 0,
            });
            if let Some(c) = compression {
                m["compression"] = c.into();
            }
            std::fs::write(dir.path().join(GRID_MANIFEST), m.to_string()).unwrap();
            GridManifest::load(dir.path())
        };
        // Grids built before compression have no `compression` key: plain.
        let old = manifest(1, None).unwrap();
        assert_eq!(old.compression, Compression::None);
        assert!(!serde_json::to_string(&old).unwrap().contains("compression"));
        assert_eq!(format_version(Compression::None), 1);
        assert_eq!(
            manifest(2, Some("packed")).unwrap().compression,
            Compression::Packed
        );
        let err = manifest(1, Some("byte")).unwrap_err().to_string();
        assert!(err.contains("compressed grids are version 2"), "{err}");
        let err = manifest(1, Some("zstd")).unwrap_err().to_string();
        assert!(err.contains("does not match the format"), "{err}");
        let err = manifest(3, None).unwrap_err().to_string();
        assert!(err.contains("reads versions 1 to 2"), "{err}");
    }
}
