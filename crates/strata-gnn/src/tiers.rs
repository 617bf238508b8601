//! The feature tiers under one memory budget: GIDS' constant CPU buffer and Helios' static
//! cache (the **hot set**, filled once at start and never changed), GIDS' window-buffered
//! **dynamic cache** (rows read from the SSD, evicted by CLOCK or SIEVE except while a batch in
//! the look-ahead window still needs them), then the **SSD** through [`FeatureReader`].
//!
//! Above these sits the **device tier** (Helios' GPU cache): the hottest rows held in a device
//! tensor by the consumer (`strata.gnn` keeps them on the GPU). Its rows are not held here at
//! all, only its index ([`FeatureTiers::with_device_tier`]): [`FeatureTiers::serve`] reports the
//! batch positions it covers and their device slots instead of copying anything, so those rows
//! cost neither host memory, nor a copy, nor a transfer to the GPU.
//!
//! A row is looked up in that order: the device tier and the hot set (no lock: both are
//! immutable after construction), the dynamic cache (behind one mutex, since [`FeatureCache`] is
//! single-threaded by design), and whatever is left is read from disk by the caller and handed
//! back with [`FeatureTiers::admit`]. [`FeatureTiers::gather`] does the three steps in one call
//! for callers that do not overlap them; having no device tensor, it reads device rows from
//! disk.
//!
//! # Encoded rows
//!
//! The hot set and the dynamic cache may hold their rows encoded ([`FeatureCodec`]: float16,
//! or int8 with a scale per row), so that the same bytes hold about twice or four times the
//! rows. The file stays float32 on disk; rows are encoded when they enter a tier (the hot set's
//! load, [`FeatureTiers::admit`]) and decoded back to float32 when a batch is served, so every
//! caller sees float32 rows of [`FeatureTiers::row_bytes`] bytes whatever the codec.
//!
//! # Pin accounting (window buffering)
//!
//! A pin says "a batch in the look-ahead window will read this row; do not evict it". The rule
//! is **one pin per occurrence, one release per occurrence**, applied only to nodes that the
//! dynamic cache can hold (in range, neither hot nor on the device; such a row is never
//! evicted, so pinning it would only cost a lock):
//!
//! 1. [`pin_window`](FeatureTiers::pin_window) when the batch is sampled: each listed
//!    occurrence of a non-hot node adds one pin (a node listed twice is pinned twice). A node
//!    not cached yet keeps the pin pending in its state word, so the row is protected from the
//!    moment it lands.
//! 2. [`serve`](FeatureTiers::serve) with `unpin = true` when the batch is served: each
//!    occurrence that hits the cache releases one pin right there. The native pipeline splits
//!    this step in two, so that a batch waiting for its disk rows needs no feature buffer:
//!    `lookup_pinned` classifies the occurrences and releases nothing (the hits stay pinned,
//!    hence cached), and at the batch's assembly `copy_pinned_hits` copies the hits and
//!    releases their pins.
//! 3. Every occurrence that missed is returned as an index; the caller reads it from disk and
//!    passes it (once per returned index, repeats included) to
//!    [`admit`](FeatureTiers::admit) with `unpin = true`, which inserts the row and then
//!    releases one pin, whether or not the insert succeeded (a refused insert leaves the
//!    pending pins in place, and the release takes one of them).
//!
//! 4. A batch that is abandoned instead (its loader dropped, or an error ending the epoch) hands
//!    what it still holds to [`unpin_window`](FeatureTiers::unpin_window), the exact inverse
//!    of `pin_window`: every occurrence if it was only pinned (or looked up), only the missed
//!    occurrences if it was served but not admitted, nothing once admitted.
//!
//! Hits and misses partition the occurrences, so every pin taken in step 1 is released exactly
//! once in step 2, 3 or 4 and the counters return to zero when the window drains. This holds
//! whatever happens between `serve` and `admit` (another thread may admit the same node in
//! between: the pin count follows the node into the cache). Callers that never pinned a batch
//! pass `unpin = false` in both calls; passing `true` for an unpinned batch would release pins
//! that belong to other batches in the window (an unpin without a pin does nothing, but one
//! taken from a pending batch leaves that batch unprotected).
//!
//! # Concurrency
//!
//! `FeatureTiers` is `Send + Sync`. The cache lock is taken once per
//! [`LOCK_CHUNK_ROWS`] rows of a batch (a lookup is a few loads and a row copy, so a chunk
//! holds the lock for microseconds; a huge batch does not stall the other threads for the
//! whole of its copy). Splitting a batch this way keeps the accounting exact: an occurrence
//! either hits (and releases there) or misses (and releases in `admit`), whichever chunk it
//! falls in.

use std::sync::{Mutex, MutexGuard};

use strata_graph::feature_store::read_on_complete;
use strata_graph::features::{FeatureDType, FeatureFile};
use strata_graph::features::{FeatureReader, ReadStats};
use strata_graph::sampler::NeighborSampler;
use strata_graph::topology::Topology;
use strata_graph::{FeatureStore, GraphError, Pending};
use strata_store::codec::FeatureCodec;

use crate::cache::{Eviction, FeatureCache};
use crate::error::{GnnError, Result};
use crate::hotset::{self, HotRanking, HotSet};

/// Rows looked up or admitted per acquisition of the cache lock (see the module docs).
pub const LOCK_CHUNK_ROWS: usize = 4096;

/// Hot rows read per gather while loading the hot set: bounds the reader's per-call
/// bookkeeping (about 24 bytes per row) while keeping thousands of reads in flight. The rows
/// land directly in the hot arena, so no row buffer is needed besides the reader's own.
const HOT_LOAD_CHUNK_ROWS: usize = 1 << 16;

/// Bytes of float32 rows staged per gather while loading an encoded hot set (the rows are read
/// into this buffer and encoded into the hot arena from there).
const HOT_LOAD_STAGING_BYTES: usize = 4 << 20;

/// Where a batch's rows came from, and what the cache and the disk did for it. Counts are of
/// row occurrences (a node listed twice counts twice), except the disk's requests and bytes.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct TierStats {
    /// Rows asked for: `device_rows + hot_rows + cache_rows + disk_rows`.
    pub rows: u64,
    /// Rows left to the device tier (served by the consumer's device tensor).
    pub device_rows: u64,
    /// Rows copied from the static hot set.
    pub hot_rows: u64,
    /// Rows copied from the dynamic cache.
    pub cache_rows: u64,
    /// Rows left to the disk (misses of both tiers).
    pub disk_rows: u64,
    /// I/O requests submitted for those rows (after the reader's coalescing).
    pub disk_requests: u64,
    /// Bytes read from the device for them (whole aligned blocks).
    pub disk_bytes_read: u64,
    /// Rows the dynamic cache evicted to admit new ones.
    pub cache_evictions: u64,
    /// Rows the dynamic cache refused because every resident row was pinned by the window.
    pub cache_insert_failures_pinned: u64,
}

impl TierStats {
    /// Fraction of the rows served by the device tier (0 when no row was asked for).
    pub fn device_hit_rate(&self) -> f64 {
        ratio(self.device_rows, self.rows)
    }

    /// Fraction of the rows served by the hot set (0 when no row was asked for).
    pub fn hot_hit_rate(&self) -> f64 {
        ratio(self.hot_rows, self.rows)
    }

    /// Fraction of the rows *in neither the device tier nor the hot set* that the dynamic
    /// cache served: the cache's own hit rate (0 when there were none).
    pub fn cache_hit_rate(&self) -> f64 {
        ratio(
            self.cache_rows,
            self.rows - self.device_rows - self.hot_rows,
        )
    }

    /// Adds `other`'s counts to these (totals over batches or threads).
    pub fn add(&mut self, other: &TierStats) {
        self.rows += other.rows;
        self.device_rows += other.device_rows;
        self.hot_rows += other.hot_rows;
        self.cache_rows += other.cache_rows;
        self.disk_rows += other.disk_rows;
        self.disk_requests += other.disk_requests;
        self.disk_bytes_read += other.disk_bytes_read;
        self.cache_evictions += other.cache_evictions;
        self.cache_insert_failures_pinned += other.cache_insert_failures_pinned;
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// What [`FeatureTiers::serve`] left to others: the rows to read from disk and the rows the
/// device tier holds. Positions index the batch's node list, ascending.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// Positions to read from disk (one per occurrence).
    pub misses: Vec<u32>,
    /// Positions whose rows the device tier holds, and
    pub device_positions: Vec<u32>,
    /// their slots in the device tensor (same length).
    pub device_slots: Vec<u32>,
}

/// Panics unless `out_len` bytes hold `rows` rows of `row_bytes` bytes.
fn check_output(rows: usize, row_bytes: usize, out_len: usize) {
    assert_eq!(
        Some(out_len),
        rows.checked_mul(row_bytes),
        "FeatureTiers: {rows} rows of {row_bytes} bytes need an output of {} bytes",
        rows.saturating_mul(row_bytes)
    );
}

/// The hot set, the dynamic cache and the reader of one feature file (see the module docs).
pub struct FeatureTiers {
    reader: FeatureReader,
    /// Bytes of a row as served (the file's rows).
    row_bytes: usize,
    /// How the hot set and the cache hold their rows, and
    codec: FeatureCodec,
    /// the bytes of a row held that way.
    held_row_bytes: usize,
    num_rows: u64,
    /// The device tier's index (node -> slot in the consumer's device tensor); over 0 nodes,
    /// costing nothing, when there is no device tier.
    device: HotSet,
    /// The static hot set's index. Built over 0 nodes when empty, so that an absent hot set
    /// costs no per-node memory (every lookup is then out of range, i.e. not hot).
    hot: HotSet,
    /// Row of hot slot `s` at `s * held_row_bytes`, encoded.
    hot_rows: Vec<u8>,
    /// Whether the dynamic cache has any capacity; when not, it is built over 0 nodes (no
    /// per-node memory) and never touched.
    cache_enabled: bool,
    /// The cache's capacity in rows.
    cache_capacity: usize,
    cache: Mutex<FeatureCache>,
    /// [`FeatureCache::bytes`], fixed at build.
    cache_bytes: u64,
    /// Counters since build or the last `take_stats`. A mutex rather than atomics: it is taken
    /// once per call, and a snapshot then always satisfies `rows = hot + cache + disk`.
    stats: Mutex<TierStats>,
}

impl FeatureTiers {
    /// Loads the hot rows of `hot_nodes` (distinct ids below the file's row count) from disk
    /// through `reader`, and creates an empty dynamic cache of `cache_rows` rows with
    /// `eviction`.
    ///
    /// The hot set's slots are the hot nodes sorted by id, so that loading reads the file in
    /// order (neighbouring rows merge into large requests) in chunks of at most 65,536 rows,
    /// each gathered straight into the hot arena: no transient row buffer. The order
    /// `hot_nodes` comes in (e.g. best first from [`hotset::top_k`]) does not matter.
    ///
    /// `cache_rows` is capped at the rows that are not hot (a larger cache could never fill).
    ///
    /// Memory: `hot_nodes.len() * row_bytes` bytes of rows plus the index (4 bytes per graph
    /// node and per hot node, none when `hot_nodes` is empty), and the cache's
    /// [`FeatureCache::footprint`] (none when `cache_rows` is 0); see
    /// [`FeatureTiers::memory_bytes`].
    ///
    /// Errors: a hot node out of range or listed twice, sizes that overflow, more rows than
    /// 32-bit node ids address, or a read error.
    pub fn build(
        reader: FeatureReader,
        hot_nodes: &[u32],
        cache_rows: usize,
        eviction: Eviction,
    ) -> Result<FeatureTiers> {
        Self::build_encoded(reader, hot_nodes, cache_rows, eviction, FeatureCodec::F32)
    }

    /// [`FeatureTiers::build`] with the hot set and the cache holding their rows encoded by
    /// `codec` (see the module docs): rows of [`FeatureCodec::row_bytes`] instead of
    /// `row_bytes` in the memory figures. Loading the hot set then stages at most 4 MiB of
    /// float32 rows at a time.
    ///
    /// Errors: those of `build`, and a codec other than f32 for a file that is not float32.
    pub fn build_encoded(
        reader: FeatureReader,
        hot_nodes: &[u32],
        cache_rows: usize,
        eviction: Eviction,
        codec: FeatureCodec,
    ) -> Result<FeatureTiers> {
        let meta = reader.meta();
        let row_bytes = meta.row_bytes;
        let num_rows = meta.num_rows;
        let held_row_bytes = held_row_bytes(codec, meta)?;
        if num_rows > u32::MAX as u64 + 1 {
            return Err(GnnError::Config(format!(
                "{}: {num_rows} feature rows; the GNN data path handles at most {} (32-bit node ids)",
                meta.path.display(),
                u32::MAX as u64 + 1
            )));
        }
        let n = num_rows as usize;
        let mut sorted = hot_nodes.to_vec();
        sorted.sort_unstable();
        let hot = if sorted.is_empty() {
            HotSet::new(0, &[])?
        } else {
            HotSet::new(n, &sorted)?
        };
        let hot_bytes = sorted.len().checked_mul(held_row_bytes).ok_or_else(|| {
            GnnError::Budget(format!(
                "hot set: {} rows of {held_row_bytes} bytes overflow the address space",
                sorted.len()
            ))
        })?;
        let mut hot_rows = vec![0u8; hot_bytes];
        if codec == FeatureCodec::F32 {
            for (chunk, rows) in sorted
                .chunks(HOT_LOAD_CHUNK_ROWS)
                .zip(hot_rows.chunks_mut(HOT_LOAD_CHUNK_ROWS.saturating_mul(row_bytes)))
            {
                reader.gather(chunk, rows)?;
            }
        } else {
            let chunk_rows = (HOT_LOAD_STAGING_BYTES / row_bytes).clamp(1, HOT_LOAD_CHUNK_ROWS);
            let mut staging = vec![0u8; chunk_rows.min(sorted.len()) * row_bytes];
            for (chunk, held) in sorted
                .chunks(chunk_rows)
                .zip(hot_rows.chunks_mut(chunk_rows * held_row_bytes))
            {
                let rows = &mut staging[..chunk.len() * row_bytes];
                reader.gather(chunk, rows)?;
                for (src, dst) in rows
                    .chunks_exact(row_bytes)
                    .zip(held.chunks_exact_mut(held_row_bytes))
                {
                    codec.encode(src, dst);
                }
            }
        }
        let cache_rows = cache_rows.min(n - sorted.len());
        let cache_nodes = if cache_rows > 0 { n } else { 0 };
        let cache = FeatureCache::new(cache_nodes, cache_rows, held_row_bytes, eviction)?;
        let cache_bytes = cache.bytes();
        Ok(FeatureTiers {
            reader,
            row_bytes,
            codec,
            held_row_bytes,
            num_rows,
            device: HotSet::new(0, &[])?,
            hot,
            hot_rows,
            cache_enabled: cache_rows > 0,
            cache_capacity: cache_rows,
            cache: Mutex::new(cache),
            cache_bytes,
            stats: Mutex::new(TierStats::default()),
        })
    }

    /// Adds a device tier of `nodes` (distinct, in range, none of them hot), slot `i` being
    /// `nodes[i]`: the consumer loads their rows, in that order, into a device tensor (e.g. with
    /// [`FeatureTiers::gather`], which reads them from disk) and [`FeatureTiers::serve`] leaves
    /// them to it from then on. Build the tier before any batch is pinned or cached: it only
    /// changes which nodes the dynamic cache may hold.
    ///
    /// Memory: an index of 4 bytes per graph node and per device row; no row.
    ///
    /// Errors: a node out of range, listed twice, or already in the hot set.
    pub fn with_device_tier(mut self, nodes: &[u32]) -> Result<FeatureTiers> {
        if let Some(&v) = nodes.iter().find(|&&v| self.hot.contains(v)) {
            return Err(GnnError::Config(format!(
                "device tier: node {v} is in the hot set; a row lives in one tier"
            )));
        }
        if !nodes.is_empty() {
            self.device = HotSet::new(self.num_rows as usize, nodes)
                .map_err(|e| GnnError::Config(format!("device tier: {e}")))?;
        }
        Ok(self)
    }

    /// The device tier's nodes in slot order (the rows the consumer's device tensor holds).
    pub fn device_nodes(&self) -> &[u32] {
        self.device.nodes()
    }

    /// Bytes per feature row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Rows (nodes) in the feature file.
    pub fn num_rows(&self) -> u64 {
        self.num_rows
    }

    /// How the hot set and the dynamic cache hold their rows.
    pub fn codec(&self) -> FeatureCodec {
        self.codec
    }

    /// Bytes of a row as the hot set and the dynamic cache hold it.
    pub fn held_row_bytes(&self) -> usize {
        self.held_row_bytes
    }

    /// The reader misses go through (for callers that submit their own reads).
    pub fn reader(&self) -> &FeatureReader {
        &self.reader
    }

    /// The static hot set's index (slots in increasing node order).
    pub fn hot(&self) -> &HotSet {
        &self.hot
    }

    /// Capacity of the dynamic cache in rows (after the cap in [`FeatureTiers::build`]).
    pub fn cache_rows(&self) -> usize {
        self.cache_capacity
    }

    /// Copies into `out` (`nodes.len() * row_bytes` bytes, row `i` at `i * row_bytes`) every
    /// row held in memory, from the hot set and then the dynamic cache, and returns the
    /// indices `i`, ascending, of the rows that must come from disk (one per occurrence, so a
    /// node listed twice that missed is returned twice) and of the rows the device tier holds,
    /// with their device slots. The bytes of both in `out` are left as they were.
    ///
    /// With `unpin`, each cache hit releases one window pin of its node (see the module docs:
    /// the misses release theirs in [`FeatureTiers::admit`]); pass it only for batches that
    /// went through [`FeatureTiers::pin_window`]. Nodes out of range are returned as misses
    /// (the disk read reports them).
    ///
    /// Panics if `out` has the wrong length or `nodes` has more than `u32::MAX` entries.
    pub fn serve(&self, nodes: &[u32], out: &mut [u8], unpin: bool) -> Lookup {
        self.serve_counted(nodes, Some(out), unpin, true).0
    }

    /// [`FeatureTiers::serve`] without copying a row or releasing a pin, for a batch whose
    /// nodes hold window pins ([`FeatureTiers::pin_window`]): its cache hits stay cached until
    /// [`FeatureTiers::copy_pinned_hits`] copies them, so the batch needs no feature buffer
    /// until then. Counts the lookup as `serve` does.
    pub(crate) fn lookup_pinned(&self, nodes: &[u32]) -> Lookup {
        self.serve_counted(nodes, None, false, true).0
    }

    /// Copies into `out` (`nodes.len() * row_bytes` bytes) the memory rows that
    /// [`FeatureTiers::lookup_pinned`] found for `nodes` (the positions in neither
    /// `lookup.misses` nor `lookup.device_positions`), and releases each cache hit's window
    /// pin. The cache still holds those rows: the pins kept them since the lookup.
    ///
    /// Panics if `out` has the wrong length, or if a hit's row left the cache (its pin was
    /// released by someone else: a bug).
    pub(crate) fn copy_pinned_hits(&self, nodes: &[u32], lookup: &Lookup, out: &mut [u8]) {
        let (rb, hb, codec) = (self.row_bytes, self.held_row_bytes, self.codec);
        check_output(nodes.len(), rb, out.len());
        let mut misses = lookup.misses.iter().peekable();
        let mut device = lookup.device_positions.iter().peekable();
        let mut cached: Vec<u32> = Vec::new();
        for (i, &v) in nodes.iter().enumerate() {
            let i = i as u32;
            if misses.next_if_eq(&&i).is_some() || device.next_if_eq(&&i).is_some() {
                continue;
            }
            match self.hot.lookup(v) {
                Some(s) => codec.decode(
                    &self.hot_rows[s as usize * hb..][..hb],
                    &mut out[i as usize * rb..][..rb],
                ),
                None => cached.push(i),
            }
        }
        for chunk in cached.chunks(LOCK_CHUNK_ROWS) {
            let mut cache = self.lock_cache();
            for &i in chunk {
                let v = nodes[i as usize];
                let row = cache
                    .peek(v)
                    .expect("a window-pinned cache hit stays cached until it is copied");
                codec.decode(row, &mut out[i as usize * rb..][..rb]);
                cache.unpin(v);
            }
        }
    }

    /// [`FeatureTiers::serve`] (copying into `out` when given), also returning the batch's hot
    /// and cache hits; updates the counters. Without `use_device` the device tier's rows are
    /// misses like any other (for callers without the device tensor).
    fn serve_counted(
        &self,
        nodes: &[u32],
        mut out: Option<&mut [u8]>,
        unpin: bool,
        use_device: bool,
    ) -> (Lookup, u64, u64) {
        let (rb, hb, codec) = (self.row_bytes, self.held_row_bytes, self.codec);
        if let Some(out) = &out {
            check_output(nodes.len(), rb, out.len());
        }
        assert!(
            nodes.len() <= u32::MAX as usize,
            "FeatureTiers::serve: {} rows in one batch; at most {}",
            nodes.len(),
            u32::MAX
        );
        // The device tier and the hot set first, without the lock.
        let mut lookup = Lookup::default();
        let mut rest: Vec<u32> = Vec::new();
        let mut hot_hits = 0u64;
        let device = use_device && !self.device.is_empty();
        for (i, &v) in nodes.iter().enumerate() {
            if device {
                if let Some(s) = self.device.lookup(v) {
                    lookup.device_positions.push(i as u32);
                    lookup.device_slots.push(s);
                    continue;
                }
            }
            match self.hot.lookup(v) {
                Some(s) => {
                    if let Some(out) = out.as_deref_mut() {
                        codec.decode(
                            &self.hot_rows[s as usize * hb..][..hb],
                            &mut out[i * rb..][..rb],
                        );
                    }
                    hot_hits += 1;
                }
                None => rest.push(i as u32),
            }
        }
        let mut cache_hits = 0u64;
        let misses = if self.cache_enabled {
            let mut misses = Vec::with_capacity(rest.len());
            for chunk in rest.chunks(LOCK_CHUNK_ROWS) {
                let mut cache = self.lock_cache();
                for &i in chunk {
                    let v = nodes[i as usize];
                    let hit = match (cache.get(v), out.as_deref_mut()) {
                        (Some(row), Some(out)) => {
                            codec.decode(row, &mut out[i as usize * rb..][..rb]);
                            true
                        }
                        (row, None) => row.is_some(),
                        (None, Some(_)) => false,
                    };
                    if hit {
                        cache_hits += 1;
                        if unpin {
                            cache.unpin(v);
                        }
                    } else {
                        misses.push(i);
                    }
                }
            }
            misses
        } else {
            rest
        };
        let mut stats = self.lock_stats();
        stats.rows += nodes.len() as u64;
        stats.device_rows += lookup.device_positions.len() as u64;
        stats.hot_rows += hot_hits;
        stats.cache_rows += cache_hits;
        stats.disk_rows += misses.len() as u64;
        drop(stats);
        lookup.misses = misses;
        (lookup, hot_hits, cache_hits)
    }

    /// A batch entered the look-ahead window: pins its nodes, one pin per occurrence (GIDS
    /// window buffering), so the dynamic cache keeps their rows until the batch is served.
    /// Hot nodes and nodes out of range are skipped (they never enter the cache), and nothing
    /// is pinned without a dynamic cache. Each pin is released by [`FeatureTiers::serve`] or
    /// [`FeatureTiers::admit`] with `unpin = true`, or by [`FeatureTiers::unpin_window`] if the
    /// batch is abandoned.
    pub fn pin_window(&self, nodes: &[u32]) {
        self.pin_window_held(nodes);
    }

    /// [`FeatureTiers::pin_window`], returning the occurrences it pinned (the pipeline keeps
    /// them to release exactly those if the batch is abandoned).
    pub(crate) fn pin_window_held(&self, nodes: &[u32]) -> Vec<u32> {
        // Filter outside the lock; the pins themselves go in under one acquisition.
        let pins = self.pinnable(nodes);
        if !pins.is_empty() {
            self.lock_cache().pin_future(&pins);
        }
        pins
    }

    /// Releases the window pins of a batch that will not be served after all (the loader was
    /// dropped or stopped on an error): one pin per occurrence of each node that
    /// [`FeatureTiers::pin_window`] would pin (in range and not hot; nothing without a dynamic
    /// cache), its exact inverse. Releasing pins that were never taken takes them from other
    /// batches in the window, so pass only what is still held:
    ///
    /// - a batch only pinned: the nodes given to `pin_window`;
    /// - a batch already served with `unpin = true`: only the occurrences `serve` returned as
    ///   misses (its hits released theirs);
    /// - a batch already admitted with `unpin = true`: nothing.
    ///
    /// An unpin of a node holding no pin does nothing. The cache lock is taken once per
    /// [`LOCK_CHUNK_ROWS`] rows.
    pub fn unpin_window(&self, nodes: &[u32]) {
        let pins = self.pinnable(nodes);
        for chunk in pins.chunks(LOCK_CHUNK_ROWS) {
            self.lock_cache().unpin_all(chunk);
        }
    }

    /// The window pins each of `nodes` holds in the dynamic cache (cached or pending; 0 for a
    /// node the cache cannot hold, and for every node without a dynamic cache).
    pub fn window_pins(&self, nodes: &[u32]) -> Vec<u32> {
        if !self.cache_enabled {
            return vec![0; nodes.len()];
        }
        let cache = self.lock_cache();
        nodes.iter().map(|&v| cache.pins(v)).collect()
    }

    /// The occurrences of `nodes` that window pins apply to: those the dynamic cache can hold
    /// (in range, not hot), repeats kept, in order; none when there is no dynamic cache.
    pub(crate) fn pinnable(&self, nodes: &[u32]) -> Vec<u32> {
        if !self.cache_enabled {
            return Vec::new();
        }
        nodes
            .iter()
            .copied()
            .filter(|&v| self.cacheable(v))
            .collect()
    }

    /// Rows just read from disk (`rows` = `nodes.len() * row_bytes` bytes, node `nodes[j]`'s
    /// row at `j * row_bytes`) are offered to the dynamic cache. Hot nodes (and nodes out of
    /// range) are never admitted. With `unpin`, each admitted occurrence then releases one
    /// window pin: pass exactly the occurrences [`FeatureTiers::serve`] returned as misses
    /// (repeats included), so that every pin is released once.
    ///
    /// An insert that finds every resident row pinned is refused (counted in
    /// `cache_insert_failures_pinned`); the caller already has the row, so nothing is lost.
    ///
    /// Panics if `rows` has the wrong length.
    pub fn admit(&self, nodes: &[u32], rows: &[u8], unpin: bool) {
        self.admit_counted(nodes, rows, unpin);
    }

    /// [`FeatureTiers::admit`], returning the evictions and refused inserts it caused; updates
    /// the counters.
    fn admit_counted(&self, nodes: &[u32], rows: &[u8], unpin: bool) -> (u64, u64) {
        let rb = self.row_bytes;
        assert_eq!(
            Some(rows.len()),
            nodes.len().checked_mul(rb),
            "FeatureTiers::admit: {} rows of {rb} bytes need {} bytes",
            nodes.len(),
            nodes.len().saturating_mul(rb)
        );
        if !self.cache_enabled {
            return (0, 0);
        }
        let mut encoded = vec![0u8; self.held_row_bytes];
        let (mut evictions, mut failures) = (0u64, 0u64);
        for (chunk, bytes) in nodes
            .chunks(LOCK_CHUNK_ROWS)
            .zip(rows.chunks(LOCK_CHUNK_ROWS.saturating_mul(rb)))
        {
            let mut cache = self.lock_cache();
            // The cache's own counters are never reset, so their growth under this lock is
            // exactly what this chunk caused.
            let before = cache.stats();
            for (&v, row) in chunk.iter().zip(bytes.chunks_exact(rb)) {
                if !self.cacheable(v) {
                    continue;
                }
                // Insert first: the row lands with the node's pending pins, this batch's
                // included, and only then is this batch's pin released.
                if self.codec == FeatureCodec::F32 {
                    cache.insert(v, row);
                } else {
                    self.codec.encode(row, &mut encoded);
                    cache.insert(v, &encoded);
                }
                if unpin {
                    cache.unpin(v);
                }
            }
            let after = cache.stats();
            drop(cache);
            evictions += after.evictions - before.evictions;
            failures += after.insert_failures_pinned - before.insert_failures_pinned;
        }
        let mut stats = self.lock_stats();
        stats.cache_evictions += evictions;
        stats.cache_insert_failures_pinned += failures;
        (evictions, failures)
    }

    /// Adds reads the caller submitted itself for missed rows (through
    /// [`FeatureTiers::reader`]) to the disk counters: `requests` and `bytes_read` of `stats`
    /// (the row counts are already known from [`FeatureTiers::serve`]).
    pub fn record_disk_reads(&self, stats: &ReadStats) {
        let mut s = self.lock_stats();
        s.disk_requests += stats.requests;
        s.disk_bytes_read += stats.bytes_read;
    }

    /// Synchronous convenience for tests and simple callers: [`FeatureTiers::serve`], the
    /// misses gathered from disk, [`FeatureTiers::admit`], all without window pins. Rows of
    /// the device tier are read from disk too (this caller has no device tensor). Fills
    /// `out` (`nodes.len() * row_bytes` bytes, row `i` at `i * row_bytes`) and returns what
    /// this call did (also added to the counters).
    ///
    /// Memory: a staging buffer of one row per miss, freed on return.
    ///
    /// Errors: `out` of the wrong length, a node out of range (before anything is counted), or
    /// a read error.
    pub fn gather(&self, nodes: &[u32], out: &mut [u8]) -> strata_graph::Result<TierStats> {
        self.check_gather(nodes, out)?;
        self.gather_with(nodes, out, false)
    }

    /// [`FeatureTiers::gather`] for a caller that pinned `nodes` with
    /// [`FeatureTiers::pin_window`] when their batch entered its look-ahead window: each
    /// occurrence releases its pin as it is served (a hit) or admitted (a disk row), as the
    /// native pipeline's batches do. On an error every pin of `nodes` is released too, so a
    /// failed batch leaves the cache as if it had never entered the window.
    pub fn gather_window(&self, nodes: &[u32], out: &mut [u8]) -> strata_graph::Result<TierStats> {
        self.check_gather(nodes, out)
            .inspect_err(|_| self.unpin_window(nodes))?;
        self.gather_with(nodes, out, true)
    }

    /// The errors of [`FeatureTiers::gather`] found before anything is served.
    fn check_gather(&self, nodes: &[u32], out: &[u8]) -> strata_graph::Result<()> {
        let rb = self.row_bytes;
        let path = self.reader.meta().path.display();
        if Some(out.len()) != nodes.len().checked_mul(rb) {
            return Err(GraphError::Config(format!(
                "{}: a gather of {} rows of {rb} bytes needs an output of {} bytes, got {}",
                path,
                nodes.len(),
                nodes.len().saturating_mul(rb),
                out.len()
            )));
        }
        if let Some(&v) = nodes.iter().find(|&&v| v as u64 >= self.num_rows) {
            return Err(GraphError::Config(format!(
                "{}: row {v} is out of range: the features have {} rows",
                path, self.num_rows
            )));
        }
        if nodes.len() > u32::MAX as usize {
            return Err(GraphError::Config(format!(
                "{}: a gather of {} rows; at most {} per call",
                path,
                nodes.len(),
                u32::MAX
            )));
        }
        Ok(())
    }

    /// [`FeatureTiers::gather`] of checked arguments, releasing window pins with `unpin`.
    fn gather_with(
        &self,
        nodes: &[u32],
        out: &mut [u8],
        unpin: bool,
    ) -> strata_graph::Result<TierStats> {
        let rb = self.row_bytes;
        let (Lookup { misses, .. }, hot_rows, cache_rows) =
            self.serve_counted(nodes, Some(out), unpin, false);
        let mut stats = TierStats {
            rows: nodes.len() as u64,
            hot_rows,
            cache_rows,
            disk_rows: misses.len() as u64,
            ..TierStats::default()
        };
        if misses.is_empty() {
            return Ok(stats);
        }
        let miss_nodes: Vec<u32> = misses.iter().map(|&i| nodes[i as usize]).collect();
        let mut staging = vec![0u8; miss_nodes.len() * rb];
        let read = match self.reader.gather(&miss_nodes, &mut staging) {
            Ok(read) => read,
            Err(e) => {
                if unpin {
                    // The misses' pins would otherwise outlive the batch that took them.
                    self.unpin_window(&miss_nodes);
                }
                return Err(e);
            }
        };
        for (&i, row) in misses.iter().zip(staging.chunks_exact(rb)) {
            out[i as usize * rb..][..rb].copy_from_slice(row);
        }
        self.record_disk_reads(&read);
        let (evictions, failures) = self.admit_counted(&miss_nodes, &staging, unpin);
        stats.disk_requests = read.requests;
        stats.disk_bytes_read = read.bytes_read;
        stats.cache_evictions = evictions;
        stats.cache_insert_failures_pinned = failures;
        Ok(stats)
    }

    /// Counters since build or the last `take_stats` (which resets them). A consistent
    /// snapshot: `rows = hot_rows + cache_rows + disk_rows` always holds.
    pub fn take_stats(&self) -> TierStats {
        std::mem::take(&mut *self.lock_stats())
    }

    /// Bytes held in memory: the hot rows, the hot set's index, the dynamic cache's footprint
    /// (arena, per-slot and per-node words) and the device tier's index. The reader's buffers
    /// are not included. Matches `hot_bytes + cache_bytes + device_index_bytes` of
    /// [`crate::budget::plan`] for the same row counts.
    pub fn memory_bytes(&self) -> u64 {
        self.hot_rows.len() as u64 + self.hot.bytes() + self.cache_bytes + self.device.bytes()
    }

    /// Whether `v` may be cached (and so pinned): in range, neither hot nor on the device.
    #[inline]
    fn cacheable(&self, v: u32) -> bool {
        (v as u64) < self.num_rows && !self.hot.contains(v) && !self.device.contains(v)
    }

    fn lock_cache(&self) -> MutexGuard<'_, FeatureCache> {
        // A panic under the lock can only come from a cache assertion, after which the cache
        // is still consistent (they fire before any change).
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_stats(&self) -> MutexGuard<'_, TierStats> {
        self.stats.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The dynamic cache, for tests that check pins and residency.
    #[cfg(test)]
    pub(crate) fn cache_for_tests(&self) -> MutexGuard<'_, FeatureCache> {
        self.lock_cache()
    }
}

/// Bytes of a row of the feature file `meta` held with `codec`. Errors: an encoding codec
/// (f16, int8) for a file that is not float32.
pub fn held_row_bytes(codec: FeatureCodec, meta: &FeatureFile) -> Result<usize> {
    match (codec, meta.dtype) {
        (FeatureCodec::F32, _) => Ok(meta.row_bytes),
        (_, FeatureDType::F32) => Ok(codec.row_bytes(meta.dim)),
        (_, FeatureDType::F16) => Err(GnnError::Config(format!(
            "feature_codec = {}: {} holds float16 features; encoding applies to float32 \
             features only (use feature_codec = f32)",
            codec.name(),
            meta.path.display()
        ))),
    }
}

/// The tiers as a feature store: [`FeatureTiers::gather`] (no window pins; device rows from
/// disk) when a read is completed, counting the bytes the disk tier read.
impl FeatureStore for FeatureTiers {
    fn num_rows(&self) -> u64 {
        self.num_rows
    }

    fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// Reads when completed: the lookup in memory decides which rows the disk serves, and it
    /// must see the tiers as they are when the rows are copied.
    fn submit(&self, rows: &[u32]) -> strata_graph::Result<Pending<'_>> {
        let path = self.reader.meta().path.display().to_string();
        read_on_complete(self, &path, rows, |rows, out| {
            Ok(self.gather(rows, out)?.disk_bytes_read)
        })
    }

    /// Refused, as the reader under the tiers refuses it: the tiers cache a read-only file.
    fn update(&mut self, rows: &[u32], data: &[u8]) -> strata_graph::Result<()> {
        self.reader.update(rows, data)
    }
}

/// The `k` hottest nodes by `ranking`, best first (ties to the lower id), for
/// [`FeatureTiers::build`]; all nodes when `k` is at least their number.
///
/// - `ReversePageRank`: [`hotset::reverse_pagerank`] with GIDS' damping and iterations on the
///   CSR, built here by [`hotset::transpose`] of `topo_csc` (a second topology in memory while
///   ranking, freed on return).
/// - `Degree`: [`hotset::reverse_degree_scores`] of the CSC (how many nodes may pick each one).
/// - `PreSampling`: [`hotset::presampling_counts`] over `presample`'s sampler and seed batches
///   (batch `i` sampled with key `i`); required for this ranking.
/// - `None`: no node.
///
/// `threads`: workers for PageRank and pre-sampling (0: one per core). Errors: pre-sampling
/// without `presample`, or a sampler error.
pub fn rank_hot_nodes(
    ranking: HotRanking,
    k: usize,
    topo_csc: &Topology,
    threads: usize,
    presample: Option<(&NeighborSampler, &[Vec<u32>])>,
) -> Result<Vec<u32>> {
    let all = 0..topo_csc.num_nodes() as u32;
    rank_hot_nodes_within(ranking, k, topo_csc, threads, presample, all)
}

/// [`rank_hot_nodes`] restricted to the nodes of `within` (the rows a rank owns when the
/// features are split across ranks): the best `k` of them by the same whole-graph scores.
pub fn rank_hot_nodes_within(
    ranking: HotRanking,
    k: usize,
    topo_csc: &Topology,
    threads: usize,
    presample: Option<(&NeighborSampler, &[Vec<u32>])>,
    within: std::ops::Range<u32>,
) -> Result<Vec<u32>> {
    if k == 0 || within.is_empty() {
        return Ok(Vec::new());
    }
    // The best `k` of `scores[within]`, as node ids.
    fn top_within<T: PartialOrd + Copy>(
        scores: &[T],
        k: usize,
        within: &std::ops::Range<u32>,
    ) -> Vec<u32> {
        let part = &scores[within.start as usize..within.end as usize];
        hotset::top_k(part, k)
            .into_iter()
            .map(|v| v + within.start)
            .collect()
    }
    let best = |scores: &[f64]| top_within(scores, k, &within);
    Ok(match ranking {
        HotRanking::None => Vec::new(),
        HotRanking::Degree => best(&hotset::reverse_degree_scores(topo_csc)),
        HotRanking::ReversePageRank => {
            let csr = hotset::transpose(topo_csc);
            let scores = hotset::reverse_pagerank(
                &csr,
                hotset::DEFAULT_DAMPING,
                hotset::DEFAULT_ITERATIONS,
                threads,
            );
            drop(csr);
            best(&scores)
        }
        HotRanking::PreSampling => {
            let Some((sampler, batches)) = presample else {
                return Err(GnnError::Config(
                    "hot set ranking presampling needs a sampler and the epoch's seed batches"
                        .into(),
                ));
            };
            let counts = hotset::presampling_counts(sampler, topo_csc, batches, threads)?;
            top_within(&counts, k, &within)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::{Path, PathBuf};
    use std::sync::Arc;
    use strata_graph::sampler::SamplerConfig;
    use strata_store::npy::{self, DType};
    use strata_store::rng::splitmix;

    /// A `(rows, dim)` float32 `features.npy` with Strata's 4 KiB header and random bytes.
    fn write_features(dir: &Path, rows: u64, dim: usize, seed: u64) -> PathBuf {
        let path = dir.join(format!("features-{seed}.npy"));
        let mut bytes = npy::header_block(DType::F32, &[rows, dim as u64]);
        let mut s = seed;
        for _ in 0..rows as usize * dim {
            let v = (splitmix(&mut s) % 100_000) as f32 / 3.0;
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// The rows' bytes read plainly with std::fs.
    fn expected(reader: &FeatureReader, nodes: &[u32]) -> Vec<u8> {
        let meta = reader.meta();
        let all = std::fs::read(&meta.path).unwrap();
        let mut out = Vec::with_capacity(nodes.len() * meta.row_bytes);
        for &v in nodes {
            let s = meta.row_offset(v as u64) as usize;
            out.extend_from_slice(&all[s..s + meta.row_bytes]);
        }
        out
    }

    /// A batch of `len` nodes below `n`, skewed towards low ids (so tiers hit) and with
    /// repeats.
    fn batch(s: &mut u64, n: u32, len: usize) -> Vec<u32> {
        (0..len)
            .map(|_| {
                let r = splitmix(s);
                if r.is_multiple_of(3) {
                    (r >> 8) as u32 % n
                } else {
                    (r >> 8) as u32 % (n / 8).max(1)
                }
            })
            .collect()
    }

    fn tiers(path: &Path, hot: &[u32], cache_rows: usize, eviction: Eviction) -> FeatureTiers {
        FeatureTiers::build(
            FeatureReader::open(path).unwrap(),
            hot,
            cache_rows,
            eviction,
        )
        .unwrap()
    }

    fn check_sum(s: &TierStats) {
        assert_eq!(s.rows, s.hot_rows + s.cache_rows + s.disk_rows, "{s:?}");
    }

    #[test]
    fn gather_matches_the_file_for_every_tier_mix() {
        let dir = tempfile::tempdir().unwrap();
        let n = 600u32;
        let path = write_features(dir.path(), n as u64, 24, 1);
        // (hot nodes, cache rows): none, hot only, cache only, both, and everything hot.
        let hot_some: Vec<u32> = (0..n).rev().step_by(7).chain([1, 2, 3]).collect();
        let all: Vec<u32> = (0..n).collect();
        let mixes: [(&str, &[u32], usize); 5] = [
            ("none", &[], 0),
            ("hot only", &hot_some, 0),
            ("cache only", &[], 40),
            ("both", &hot_some, 40),
            ("all hot", &all, 40),
        ];
        for eviction in [Eviction::Clock, Eviction::Sieve] {
            for (name, hot, cache_rows) in mixes {
                let t = tiers(&path, hot, cache_rows, eviction);
                assert_eq!(t.hot().len(), hot.len(), "{name}");
                assert_eq!(t.cache_rows(), cache_rows.min(n as usize - hot.len()));
                let mut total = TierStats::default();
                let mut s = 42u64;
                for len in [0usize, 1, 5, 50, 120, 300, 120, 50] {
                    let nodes = batch(&mut s, n, len);
                    let mut out = vec![0xEEu8; nodes.len() * t.row_bytes()];
                    let st = t.gather(&nodes, &mut out).unwrap();
                    assert!(out == expected(t.reader(), &nodes), "{name}: bytes differ");
                    check_sum(&st);
                    assert_eq!(st.rows, nodes.len() as u64);
                    let hot_occ = nodes.iter().filter(|&&v| t.hot().contains(v)).count();
                    assert_eq!(st.hot_rows, hot_occ as u64, "{name}");
                    if cache_rows == 0 {
                        assert_eq!(st.cache_rows, 0, "{name}");
                        assert_eq!(st.cache_evictions, 0);
                    }
                    assert_eq!(st.disk_rows == 0, st.disk_requests == 0, "{name}: {st:?}");
                    assert!(st.disk_bytes_read >= st.disk_requests * 4096);
                    total.add(&st);
                }
                let taken = t.take_stats();
                assert_eq!(taken, total, "{name}");
                assert_eq!(t.take_stats(), TierStats::default());
                match name {
                    "none" => assert_eq!(total.disk_rows, total.rows),
                    "cache only" => {
                        assert!(
                            total.cache_rows > 0 && total.cache_evictions > 0,
                            "{total:?}"
                        )
                    }
                    "all hot" => {
                        assert_eq!(total.hot_rows, total.rows);
                        assert_eq!(t.cache_rows(), 0);
                        assert_eq!(total.hot_hit_rate(), 1.0);
                        assert_eq!(total.cache_hit_rate(), 0.0);
                    }
                    _ => assert!(total.hot_rows > 0),
                }
            }
        }
    }

    #[test]
    fn a_repeated_batch_hits_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 300, 10, 2);
        let t = tiers(&path, &[5, 6], 100, Eviction::Sieve);
        let nodes: Vec<u32> = (0..50).chain([5, 7, 7]).collect();
        let mut out = vec![0u8; nodes.len() * 40];
        let first = t.gather(&nodes, &mut out).unwrap();
        assert_eq!(
            (first.hot_rows, first.cache_rows, first.disk_rows),
            (3, 0, 50)
        );
        let second = t.gather(&nodes, &mut out).unwrap();
        assert_eq!(
            (second.hot_rows, second.cache_rows, second.disk_rows),
            (3, 50, 0)
        );
        assert_eq!(second.disk_requests, 0);
        assert_eq!(out, expected(t.reader(), &nodes));
        let mut both = first.clone();
        both.add(&second);
        assert_eq!(both.rows, 106);
        assert!((both.cache_hit_rate() - 0.5).abs() < 1e-12);
        assert!((both.hot_hit_rate() - 6.0 / 106.0).abs() < 1e-12);
        assert_eq!(TierStats::default().hot_hit_rate(), 0.0);
        assert_eq!(TierStats::default().cache_hit_rate(), 0.0);
    }

    #[test]
    fn the_tiers_are_a_feature_store() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 300, 10, 5);
        let t = tiers(&path, &[5, 6], 100, Eviction::Clock);
        let store: &dyn FeatureStore = &t;
        assert_eq!((store.num_rows(), store.row_bytes()), (300, 40));
        let nodes: Vec<u32> = vec![5, 40, 41, 6, 40];
        let mut out = vec![0u8; nodes.len() * 40];
        // The disk tier reads the misses, then the cache holds them: nothing read the second
        // time.
        assert!(store.read(&nodes, &mut out).unwrap() > 0);
        assert_eq!(out, expected(t.reader(), &nodes));
        out.fill(0);
        assert_eq!(store.read(&nodes, &mut out).unwrap(), 0);
        assert_eq!(out, expected(t.reader(), &nodes));
        let e = store.read(&[300], &mut [0; 40]).unwrap_err().to_string();
        assert!(e.contains("row 300 is out of range"), "{e}");
    }

    #[test]
    fn the_tiers_refuse_updates_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 300, 10, 5);
        let mut t = tiers(&path, &[5, 6], 100, Eviction::Clock);
        let e = t.update(&[5], &[0; 40]).unwrap_err();
        assert!(matches!(&e, GraphError::ReadOnly(p) if p == &path.display().to_string()));
        // The hot row still reads as the file holds it.
        let mut out = vec![0u8; 40];
        t.read(&[5], &mut out).unwrap();
        assert_eq!(out, expected(t.reader(), &[5]));
    }

    /// Pins each non-hot node of the pending batches should hold.
    fn expected_pins(t: &FeatureTiers, pending: &[&[u32]]) -> HashMap<u32, u32> {
        let mut m = HashMap::new();
        for b in pending {
            for &v in b.iter().filter(|&&v| !t.hot().contains(v)) {
                *m.entry(v).or_insert(0) += 1;
            }
        }
        m
    }

    /// Serves and admits `b` as the pipeline would (misses read straight from the reader).
    fn serve_and_read(t: &FeatureTiers, b: &[u32]) -> (Vec<u8>, Vec<u32>, Vec<u8>) {
        let rb = t.row_bytes();
        let mut out = vec![0u8; b.len() * rb];
        let misses = t.serve(b, &mut out, true).misses;
        assert!(misses.windows(2).all(|w| w[0] < w[1]), "misses ascending");
        let miss_nodes: Vec<u32> = misses.iter().map(|&i| b[i as usize]).collect();
        let mut rows = vec![0u8; miss_nodes.len() * rb];
        let read = t.reader().gather(&miss_nodes, &mut rows).unwrap();
        t.record_disk_reads(&read);
        for (&i, row) in misses.iter().zip(rows.chunks_exact(rb)) {
            out[i as usize * rb..][..rb].copy_from_slice(row);
        }
        (out, miss_nodes, rows)
    }

    #[test]
    fn window_pins_are_released_exactly_once_and_protect_their_rows() {
        let dir = tempfile::tempdir().unwrap();
        let n = 400u32;
        let path = write_features(dir.path(), n as u64, 8, 3);
        let (mut failures, mut protected_rows) = (0u64, 0usize);
        for eviction in [Eviction::Clock, Eviction::Sieve] {
            for interleave in [false, true] {
                let configs: [(Vec<u32>, usize); 4] = [
                    (vec![], 4),
                    (vec![], 24),
                    ((0..20).collect(), 24),
                    (vec![], 200),
                ];
                for (hot, cache_rows) in configs {
                    let t = tiers(&path, &hot, cache_rows, eviction);
                    let mut s = 7u64;
                    let batches: Vec<Vec<u32>> =
                        (0..40).map(|i| batch(&mut s, n, 5 + i % 17)).collect();
                    let window = 3usize;
                    let mut entered = 0usize;
                    let mut i = 0usize;
                    while i < batches.len() {
                        // Batches served this step: one, or two with the first's admit
                        // after the second's (another batch admits its misses in between).
                        let step = if interleave {
                            2.min(batches.len() - i)
                        } else {
                            1
                        };
                        while entered < batches.len() && entered < i + step + window {
                            t.pin_window(&batches[entered]);
                            entered += 1;
                        }
                        let pending: Vec<&[u32]> =
                            batches[i..entered].iter().map(Vec::as_slice).collect();
                        let want = expected_pins(&t, &pending);
                        // Rows the step's batches do not release all pins of stay protected.
                        let served: Vec<&[u32]> =
                            batches[i..i + step].iter().map(Vec::as_slice).collect();
                        let released = expected_pins(&t, &served);
                        let protected: Vec<u32> = {
                            let c = t.cache_for_tests();
                            for v in 0..n {
                                let p = want.get(&v).copied().unwrap_or(0);
                                assert_eq!(c.pins(v), p, "node {v} pins before step {i}");
                            }
                            (0..n)
                                .filter(|&v| {
                                    c.contains(v)
                                        && want.get(&v).copied().unwrap_or(0)
                                            > released.get(&v).copied().unwrap_or(0)
                                })
                                .collect()
                        };
                        let mut done = Vec::new();
                        for b in &batches[i..i + step] {
                            done.push(serve_and_read(&t, b));
                        }
                        for ((out, miss_nodes, rows), b) in
                            done.into_iter().zip(&batches[i..i + step]).rev()
                        {
                            assert!(out == expected(t.reader(), b), "bytes of a batch");
                            t.admit(&miss_nodes, &rows, true);
                        }
                        {
                            let c = t.cache_for_tests();
                            protected_rows += protected.len();
                            for v in &protected {
                                assert!(c.contains(*v), "pinned node {v} evicted at step {i}");
                            }
                            assert!(c.len() <= cache_rows);
                        }
                        let st = t.take_stats();
                        check_sum(&st);
                        failures += st.cache_insert_failures_pinned;
                        i += step;
                    }
                    let c = t.cache_for_tests();
                    for v in 0..n {
                        assert_eq!(c.pins(v), 0, "node {v} leaked a pin");
                    }
                    assert_eq!(c.pinned_rows(), 0);
                }
            }
        }
        // Somewhere the window pinned every resident row and an insert was refused (the
        // refusal path itself is checked in `refused_inserts_still_release_their_pin`).
        assert!(failures > 0);
        assert!(protected_rows > 100, "{protected_rows}");
    }

    #[test]
    fn unpin_window_is_the_inverse_of_pin_window() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 50, 4, 9);
        let t = tiers(&path, &[3, 1], 4, Eviction::Clock);
        let pins = |t: &FeatureTiers| -> Vec<u32> {
            let c = t.cache_for_tests();
            (0..50).map(|v| c.pins(v)).collect()
        };
        // 20 and 21 cached (their pins on the slot), the rest pending; hot and out-of-range
        // occurrences skipped both ways.
        let rows = expected(t.reader(), &[20, 21]);
        t.admit(&[20, 21], &rows, false);
        let a = [1, 3, 20, 20, 21, 30, 30, 30, 99];
        let b = [20, 30, 31];
        t.pin_window(&a);
        t.pin_window(&b);
        let both = pins(&t);
        assert_eq!((both[20], both[21], both[30], both[31]), (3, 1, 4, 1));
        assert_eq!((both[1], both[3]), (0, 0));
        // Releasing a leaves exactly b's pins.
        t.unpin_window(&a);
        let mut only_b = vec![0u32; 50];
        for v in b {
            only_b[v as usize] += 1;
        }
        assert_eq!(pins(&t), only_b);
        assert_eq!(t.cache_for_tests().pinned_rows(), 1, "20 still pinned by b");
        // A batch served with unpin releases the hits' pins; abandoning it then releases the
        // misses' pins, and no other batch's.
        t.pin_window(&a);
        let mut out = vec![0u8; a.len() * t.row_bytes()];
        let misses = t.serve(&a, &mut out, true).misses;
        let miss_nodes: Vec<u32> = misses.iter().map(|&i| a[i as usize]).collect();
        assert_eq!(miss_nodes, [30, 30, 30, 99]);
        t.unpin_window(&miss_nodes);
        assert_eq!(pins(&t), only_b);
        t.unpin_window(&b);
        assert!(pins(&t).iter().all(|&p| p == 0));
        assert_eq!(t.cache_for_tests().pinned_rows(), 0);
        // An unpin without a pin does nothing; without a cache nothing is pinned at all.
        t.unpin_window(&b);
        assert!(pins(&t).iter().all(|&p| p == 0));
        let t = tiers(&path, &[], 0, Eviction::Sieve);
        t.pin_window(&b);
        t.unpin_window(&b);
        assert!(pins(&t).iter().all(|&p| p == 0));
    }

    #[test]
    fn hot_nodes_are_never_pinned_nor_admitted() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 50, 4, 4);
        let t = tiers(&path, &[3, 1], 10, Eviction::Clock);
        t.pin_window(&[1, 3, 4, 4, 99]);
        {
            let c = t.cache_for_tests();
            assert_eq!((c.pins(1), c.pins(3), c.pins(4), c.pins(99)), (0, 0, 2, 0));
        }
        let rows = expected(t.reader(), &[1, 4, 4]);
        t.admit(&[1, 4, 4], &rows, true);
        let c = t.cache_for_tests();
        assert_eq!(c.nodes(), &[4]);
        assert_eq!((c.pins(1), c.pins(4)), (0, 0));
        assert_eq!(t.hot().nodes(), &[1, 3], "slots in node order");
    }

    #[test]
    fn refused_inserts_still_release_their_pin() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 50, 4, 7);
        let t = tiers(&path, &[], 2, Eviction::Sieve);
        let rb = t.row_bytes();
        t.pin_window(&[10, 11, 12]);
        let rows = expected(t.reader(), &[10, 11, 12]);
        // 10 and 11 fill the cache and keep their pins (their batch is still pending).
        t.admit(&[10, 11], &rows[..2 * rb], false);
        // 12 finds every resident row pinned: refused, and its pin released all the same.
        t.admit(&[12], &rows[2 * rb..], true);
        let st = t.take_stats();
        assert_eq!(
            (st.cache_insert_failures_pinned, st.cache_evictions),
            (1, 0)
        );
        {
            let c = t.cache_for_tests();
            assert_eq!((c.pins(10), c.pins(11), c.pins(12)), (1, 1, 0));
            assert!(!c.contains(12));
        }
        // The batch is served: both hits, both pins released; now 12 gets in.
        let mut out = vec![0u8; 2 * rb];
        assert!(t.serve(&[11, 10], &mut out, true).misses.is_empty());
        assert_eq!(out, expected(t.reader(), &[11, 10]));
        t.admit(&[12], &rows[2 * rb..], false);
        let st = t.take_stats();
        assert_eq!((st.cache_rows, st.cache_evictions), (2, 1));
        let c = t.cache_for_tests();
        assert_eq!(c.pinned_rows(), 0);
        assert!(c.contains(12));
    }

    #[test]
    fn gather_window_serves_pinned_batches_and_releases_every_pin() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 60, 4, 9);
        let t = tiers(&path, &[], 3, Eviction::Clock);
        let rb = t.row_bytes();
        // b's rows are cached, then b enters the window behind a, whose five rows would
        // evict them from three slots without b's pins.
        let (a, b) = ([1u32, 2, 3, 4, 5], [7u32, 8, 8]);
        t.gather(&[7, 8], &mut vec![0u8; 2 * rb]).unwrap();
        t.pin_window(&a);
        t.pin_window(&b);
        let mut out = vec![0u8; a.len() * rb];
        assert_eq!(t.gather_window(&a, &mut out).unwrap().disk_rows, 5);
        assert_eq!(out, expected(t.reader(), &a));
        let mut out = vec![0u8; b.len() * rb];
        let st = t.gather_window(&b, &mut out).unwrap();
        assert_eq!(out, expected(t.reader(), &b));
        assert_eq!((st.cache_rows, st.disk_rows), (3, 0));
        assert_eq!(t.cache_for_tests().pinned_rows(), 0, "every pin released");
        // An out-of-range node refuses the gather and releases the batch's pins all the same.
        t.pin_window(&[9, 10]);
        let mut out = vec![0u8; 3 * rb];
        let e = t.gather_window(&[9, 10, 60], &mut out).unwrap_err();
        assert!(e.to_string().contains("row 60 is out of range"), "{e}");
        assert_eq!(t.window_pins(&[9, 10]), [0, 0]);
        assert_eq!(t.cache_for_tests().pinned_rows(), 0);
    }

    /// `nodes`' rows of the file as `codec` holds them, decoded: what an encoded tier serves.
    fn decoded(reader: &FeatureReader, nodes: &[u32], codec: FeatureCodec) -> Vec<u8> {
        let rb = reader.meta().row_bytes;
        let mut out = expected(reader, nodes);
        let mut held = vec![0u8; codec.row_bytes(rb / 4)];
        for row in out.chunks_exact_mut(rb) {
            codec.encode(row, &mut held);
            codec.decode(&held, row);
        }
        out
    }

    #[test]
    fn encoded_tiers_serve_the_decoded_rows() {
        let dir = tempfile::tempdir().unwrap();
        let n = 500u32;
        let path = write_features(dir.path(), n as u64, 24, 11);
        let all: Vec<u32> = (0..n).collect();
        let mut s = 5;
        let nodes = batch(&mut s, n, 300);
        for codec in [FeatureCodec::F16, FeatureCodec::Int8] {
            let reader = FeatureReader::open(&path).unwrap();
            let want = decoded(&reader, &nodes, codec);
            assert_ne!(want, expected(&reader, &nodes), "{codec:?} is lossy here");
            // Every row hot: the batch is the decoded rows.
            let hot = FeatureTiers::build_encoded(reader, &all, 0, Eviction::Clock, codec).unwrap();
            assert_eq!(hot.held_row_bytes(), codec.row_bytes(24));
            let mut out = vec![0u8; nodes.len() * 96];
            assert_eq!(hot.gather(&nodes, &mut out).unwrap().hot_rows, 300);
            assert_eq!(out, want, "{codec:?} hot set");
            // Cache only: the first gather reads the file (exact), the second hits the cache.
            let reader = FeatureReader::open(&path).unwrap();
            let cached =
                FeatureTiers::build_encoded(reader, &[], n as usize, Eviction::Sieve, codec)
                    .unwrap();
            cached.gather(&nodes, &mut out).unwrap();
            assert_eq!(
                out,
                expected(cached.reader(), &nodes),
                "{codec:?} from disk"
            );
            assert_eq!(cached.gather(&nodes, &mut out).unwrap().cache_rows, 300);
            assert_eq!(out, want, "{codec:?} cache");
        }
    }

    #[test]
    fn an_encoding_codec_refuses_float16_features() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("features.npy");
        let mut bytes = npy::header_block(DType::F16, &[4, 2]);
        bytes.extend_from_slice(&[0u8; 16]);
        std::fs::write(&path, bytes).unwrap();
        let open = || FeatureReader::open(&path).unwrap();
        let e = FeatureTiers::build_encoded(open(), &[0], 0, Eviction::Clock, FeatureCodec::Int8)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("feature_codec = int8") && e.contains("float16"),
            "{e}"
        );
        assert!(
            FeatureTiers::build_encoded(open(), &[0], 0, Eviction::Clock, FeatureCodec::F32)
                .is_ok()
        );
    }

    #[test]
    fn memory_matches_the_budget_plan() {
        let dir = tempfile::tempdir().unwrap();
        let n = 2000u64;
        let path = write_features(dir.path(), n, 16, 8);
        let rb = 64;
        let plan = |memory, share, eviction, codec| {
            crate::budget::plan(
                strata_store::config::Size(memory),
                &crate::budget::PlanInputs {
                    num_nodes: n,
                    row_bytes: rb,
                    topology_bytes: 1 << 20,
                    batch_rows_estimate: 100,
                    in_flight_batches: 4,
                    read_rows: 100,
                    window_batches: 0,
                    hot_share: share,
                    eviction,
                    device_rows: 0,
                    runtime: crate::budget::Runtime::reserve(),
                    codec,
                },
            )
            .unwrap()
        };
        // The fixed needs; all 2000 rows and their index take 2000 * 64 + 8 * 2000 bytes more.
        let fixed = plan(1 << 40, 0.5, Eviction::Clock, FeatureCodec::F32).fixed_bytes();
        for codec in [FeatureCodec::F32, FeatureCodec::F16, FeatureCodec::Int8] {
            for (room, share, eviction) in [
                (100_000, 0.5, Eviction::Clock),
                (60_000, 0.0, Eviction::Sieve),
                (50_000, 1.0, Eviction::Sieve),
                (30_000, 0.3, Eviction::Sieve),
                (1 << 30, 0.5, Eviction::Clock),
            ] {
                let plan = plan(fixed + room, share, eviction, codec);
                assert_eq!(plan.fixed_bytes(), fixed, "the batches stay float32");
                assert!(plan.hot_rows + plan.cache_rows > 0, "{plan:?}");
                let hot: Vec<u32> = (0..plan.hot_rows as u32).collect();
                let reader = FeatureReader::open(&path).unwrap();
                let t = FeatureTiers::build_encoded(
                    reader,
                    &hot,
                    plan.cache_rows as usize,
                    eviction,
                    codec,
                )
                .unwrap();
                assert_eq!(t.cache_rows() as u64, plan.cache_rows);
                assert_eq!(
                    t.memory_bytes(),
                    plan.hot_bytes + plan.cache_bytes,
                    "{plan:?}"
                );
            }
        }
    }

    #[test]
    fn concurrent_gathers_and_pipelines() {
        let dir = tempfile::tempdir().unwrap();
        let n = 3000u32;
        let path = write_features(dir.path(), n as u64, 32, 5);
        let hot: Vec<u32> = (0..n).step_by(11).collect();
        let t = Arc::new(tiers(&path, &hot, 300, Eviction::Sieve));
        let threads: Vec<_> = (0..4u64)
            .map(|k| {
                let t = t.clone();
                std::thread::spawn(move || {
                    let mut s = k;
                    let mut total = TierStats::default();
                    for j in 0..30 {
                        let nodes = batch(&mut s, n, 200);
                        if (k + j) % 2 == 0 {
                            let mut out = vec![0u8; nodes.len() * t.row_bytes()];
                            total.add(&t.gather(&nodes, &mut out).unwrap());
                            assert!(out == expected(t.reader(), &nodes));
                        } else {
                            // The windowed path, with another thread's traffic in between.
                            t.pin_window(&nodes);
                            std::thread::yield_now();
                            let (out, miss_nodes, rows) = serve_and_read(&t, &nodes);
                            assert!(out == expected(t.reader(), &nodes));
                            t.admit(&miss_nodes, &rows, true);
                        }
                    }
                    total
                })
            })
            .collect();
        let mut sum = TierStats::default();
        for th in threads {
            sum.add(&th.join().unwrap());
        }
        let all = t.take_stats();
        check_sum(&all);
        assert!(all.rows >= sum.rows && all.cache_rows > 0 && all.hot_rows > 0);
        let c = t.cache_for_tests();
        assert!((0..n).all(|v| c.pins(v) == 0), "a pin leaked");
        assert_eq!(c.pinned_rows(), 0);
    }

    #[test]
    fn memory_and_build_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 100, 6, 6);
        let t = tiers(&path, &[9, 8, 7], 10, Eviction::Sieve);
        assert_eq!((t.row_bytes(), t.num_rows()), (24, 100));
        assert_eq!(
            t.memory_bytes(),
            3 * 24 + 4 * (100 + 3) + FeatureCache::footprint(100, 10, 24, Eviction::Sieve)
        );
        // No hot set and no cache: no per-node index at all.
        assert_eq!(tiers(&path, &[], 0, Eviction::Clock).memory_bytes(), 0);
        // The cache is capped at the rows that are not hot.
        assert_eq!(
            tiers(&path, &[1, 2], 1000, Eviction::Clock).cache_rows(),
            98
        );

        let open = || FeatureReader::open(&path).unwrap();
        let e = FeatureTiers::build(open(), &[1, 1], 0, Eviction::Clock)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("listed twice"), "{e}");
        let e = FeatureTiers::build(open(), &[100], 0, Eviction::Clock)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("out of range"), "{e}");

        let mut out = vec![0u8; 24];
        let e = t.gather(&[1, 2], &mut out).unwrap_err().to_string();
        assert!(e.contains("needs an output of 48 bytes, got 24"), "{e}");
        let e = t.gather(&[100], &mut out).unwrap_err().to_string();
        assert!(e.contains("row 100 is out of range"), "{e}");
        assert_eq!(t.take_stats(), TierStats::default(), "errors count nothing");
    }

    #[test]
    fn tiers_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<FeatureTiers>();
    }

    #[test]
    fn rankings_pick_the_hottest_nodes() {
        // CSC (in-neighbours): 0 <- {1, 2, 3}, 1 <- {2, 3}, 2 <- {3}, 3 <- {}, 4 <- {3}.
        // Message-flow out-degrees (how often a node may be picked): 3 -> 4, 2 -> 2, 1 -> 1.
        let csc = Topology::new(vec![0, 3, 5, 6, 6, 7], vec![1, 2, 3, 2, 3, 3, 3]).unwrap();
        assert_eq!(
            rank_hot_nodes(HotRanking::Degree, 3, &csc, 1, None).unwrap(),
            [3, 2, 1]
        );
        let pr = hotset::reverse_pagerank(
            &hotset::transpose(&csc),
            hotset::DEFAULT_DAMPING,
            hotset::DEFAULT_ITERATIONS,
            1,
        );
        assert_eq!(
            rank_hot_nodes(HotRanking::ReversePageRank, 2, &csc, 1, None).unwrap(),
            hotset::top_k(&pr, 2)
        );
        assert_eq!(
            rank_hot_nodes(HotRanking::ReversePageRank, 9, &csc, 0, None)
                .unwrap()
                .len(),
            5
        );
        assert!(rank_hot_nodes(HotRanking::None, 3, &csc, 1, None)
            .unwrap()
            .is_empty());
        assert!(rank_hot_nodes(HotRanking::Degree, 0, &csc, 1, None)
            .unwrap()
            .is_empty());
        let e = rank_hot_nodes(HotRanking::PreSampling, 2, &csc, 1, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("presampling"), "{e}");
        let sampler = NeighborSampler::new(SamplerConfig {
            fanouts: vec![-1],
            seed: 1,
            threads: 1,
            ..SamplerConfig::default()
        })
        .unwrap();
        // Full neighbourhoods: batch {0} reads 0..=3, batch {1} reads 1, 2, 3, batch {4}
        // reads 4 and 3. Counts [1, 2, 2, 3, 1].
        let batches = vec![vec![0u32], vec![1], vec![4]];
        let got = rank_hot_nodes(
            HotRanking::PreSampling,
            3,
            &csc,
            2,
            Some((&sampler, &batches)),
        )
        .unwrap();
        assert_eq!(got, [3, 1, 2]);
        // Restricted to a rank's rows 0..=2: the best of them by the same scores.
        let owned = rank_hot_nodes_within(HotRanking::Degree, 2, &csc, 1, None, 0..3).unwrap();
        assert_eq!(owned, [2, 1]);
        let tail = rank_hot_nodes_within(HotRanking::Degree, 9, &csc, 1, None, 3..5).unwrap();
        assert_eq!(tail, [3, 4]);
        assert!(
            rank_hot_nodes_within(HotRanking::Degree, 2, &csc, 1, None, 2..2)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn device_tier_rows_are_left_to_the_device() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_features(dir.path(), 40, 4, 5);
        let t = tiers(&path, &[3, 1], 4, Eviction::Sieve)
            .with_device_tier(&[5, 20, 7])
            .unwrap();
        assert_eq!(t.device_nodes(), [5, 20, 7]);
        t.take_stats();
        let b = [5, 1, 20, 30, 7, 5];
        t.pin_window(&b);
        let rb = t.row_bytes();
        let mut out = vec![0u8; b.len() * rb];
        let lookup = t.serve(&b, &mut out, true);
        assert_eq!(lookup.device_positions, [0, 2, 4, 5]);
        assert_eq!(lookup.device_slots, [0, 1, 2, 0]);
        assert_eq!(lookup.misses, [3]);
        // Device rows are neither copied nor pinned nor cached.
        assert!(out[..rb].iter().all(|&x| x == 0));
        assert_eq!(out[rb..2 * rb], expected(t.reader(), &[1])[..]);
        let c = t.cache_for_tests();
        assert_eq!((c.pins(5), c.pins(20), c.pins(30)), (0, 0, 1));
        drop(c);
        t.admit(&[30, 5], &expected(t.reader(), &[30, 5]), false);
        t.unpin_window(&[30]);
        assert!(t.cache_for_tests().get(5).is_none());
        let s = t.take_stats();
        assert_eq!(
            (s.rows, s.device_rows, s.hot_rows, s.disk_rows),
            (6, 4, 1, 1)
        );
        assert!((s.device_hit_rate() - 4.0 / 6.0).abs() < 1e-12);
        // gather has no device tensor: it reads those rows from disk, bytes exact.
        let mut all = vec![0u8; b.len() * rb];
        let g = t.gather(&b, &mut all).unwrap();
        assert_eq!(all, expected(t.reader(), &b));
        assert_eq!((g.device_rows, g.disk_rows), (0, 4));

        // One tier per row; ids checked.
        let hot = tiers(&path, &[3, 1], 4, Eviction::Sieve);
        let e = hot.with_device_tier(&[2, 3]).err().unwrap().to_string();
        assert!(e.contains("node 3 is in the hot set"), "{e}");
        let e = tiers(&path, &[], 4, Eviction::Sieve)
            .with_device_tier(&[2, 2])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("device tier") && e.contains("twice"), "{e}");
        let e = tiers(&path, &[], 4, Eviction::Sieve)
            .with_device_tier(&[40])
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("out of range"), "{e}");
    }
}
