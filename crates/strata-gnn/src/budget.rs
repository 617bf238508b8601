//! The memory plan of the GNN data path: how a byte budget splits between the fixed needs
//! (the process's runtime, what training a batch adds, topology, batch buffers, the sampled
//! look-ahead window) and the feature
//! tiers (the static hot set and the dynamic cache of [`crate::tiers::FeatureTiers`]). The
//! plan is printed at start ([`Planned::memory_plan`]) and the run refuses to start when
//! the fixed needs do not fit.
//!
//! Features are what the budget is for: every row kept in memory is a read the SSD does not
//! serve. The fixed needs come off the top; what remains goes to the hot set and the cache in
//! the ratio `hot_share`, each tier's per-node index included (a tier that gets no row gets no
//! index either). When every row fits in the hot set, all of them go there and the cache is
//! empty: a static copy of everything needs neither eviction nor pins, and its index is
//! smaller.

use serde::Serialize;
use strata_store::budget::{MemoryPlan, Planned};
use strata_store::codec::FeatureCodec;
use strata_store::config::Size;
use strata_store::units::fmt_bytes;

use crate::cache::{Eviction, FeatureCache, MAX_CAPACITY};
use crate::error::{GnnError, Result};

/// Bytes reserved for the process itself when the caller does not measure it (see
/// [`Runtime`]).
pub use strata_store::budget::RUNTIME_BYTES;

/// Library code pages planned beside a measured process's anonymous memory (shared with the
/// embedding trainer's ranks, which measure theirs the same way).
pub use strata_store::budget::CODE_PAGES_BYTES;

/// What the process needs beside the data path: itself, and what training a batch adds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Runtime {
    /// The process: its anonymous memory as the caller measured it when opening the store
    /// (the interpreter, torch's heap, the model and optimizer already built) plus
    /// [`CODE_PAGES_BYTES`], or the [`RUNTIME_BYTES`] reserve.
    pub bytes: u64,
    /// Whether `bytes` was measured.
    pub measured: bool,
    /// What training one batch adds at most (activations kept for the backward pass, their
    /// gradients, the optimizer's state), from the consumer's model and the batch estimate.
    pub training_bytes: u64,
}

impl Runtime {
    /// The [`RUNTIME_BYTES`] reserve, nothing for training: a caller that says nothing.
    pub fn reserve() -> Runtime {
        Runtime {
            bytes: RUNTIME_BYTES,
            measured: false,
            training_bytes: 0,
        }
    }

    /// A process whose anonymous memory (`RssAnon`) was `anon_bytes` at open, with
    /// [`CODE_PAGES_BYTES`] for its libraries' code, and `training_bytes` for training.
    pub fn measured(anon_bytes: u64, training_bytes: u64) -> Runtime {
        Runtime {
            bytes: anon_bytes.saturating_add(CODE_PAGES_BYTES),
            measured: true,
            training_bytes,
        }
    }
}

/// Default fraction of the feature budget given to the static hot set; the rest goes to the
/// dynamic cache.
pub const DEFAULT_HOT_SHARE: f64 = 0.5;

/// The feature reader's read buffers: the aligned buffers it keeps between gathers (32 MiB at
/// most, `POOL_RETAIN_BYTES` in `features`), which also bounds what a gather holds in flight
/// at the default depth and request size.
pub const READ_BUFFER_BYTES: u64 = 32 << 20;

/// Bytes a batch's sample holds per feature row while the batch waits (ahead in the window,
/// merged into a read, being read): the node ids and the blocks' CSR entries (an 8-byte offset
/// per destination, a 4-byte index per edge), 11 to 13 bytes a row measured with fanouts 5,5,
/// 10,5 and 15,10, then its miss and pin lists (4 bytes a missed or a cacheable row each), and
/// headroom.
pub const SAMPLE_BYTES_PER_ROW: u64 = 32;

/// Bytes a batch handed out holds per feature row besides the row itself: its sample and the
/// edge index a consumer builds from the blocks (two 8-byte ids an edge, about two edges a row).
pub const HANDED_OUT_BYTES_PER_ROW: u64 = 64;

/// Bytes of the hot set's index per graph node and per hot row ([`crate::hotset::HotSet`]);
/// the device tier's index is the same structure.
const HOT_INDEX_BYTES: u64 = 4;

/// How the budget is spent. All sizes in bytes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GnnPlan {
    /// The budget (`--memory`).
    pub memory: u64,
    /// Graph nodes (feature rows in the file).
    pub num_nodes: u64,
    /// Bytes per feature row (on disk and in the batches).
    pub row_bytes: usize,
    /// How the hot set and the dynamic cache hold their rows (`feature_codec`), and
    pub codec: FeatureCodec,
    /// the bytes of a row held that way (`row_bytes` for f32).
    pub held_row_bytes: usize,
    /// Feature rows per batch the plan was sized for (sampled nodes of one mini-batch).
    pub batch_rows_estimate: u64,
    /// Batches holding feature buffers at once (being assembled, handed out).
    pub in_flight_batches: usize,
    /// Feature rows the merged disk reads hold at once (each read's distinct rows, until its
    /// last batch is assembled).
    pub read_rows: u64,
    /// Sampled batches holding their structure only: ahead in the look-ahead window, merged
    /// into a read, being read.
    pub window_batches: usize,
    /// Fraction of the feature budget asked for the hot set.
    pub hot_share: f64,
    /// The dynamic cache's eviction policy (its per-slot overhead depends on it).
    pub eviction: Eviction,
    /// The process itself ([`Runtime::bytes`]: measured anonymous memory and
    /// [`CODE_PAGES_BYTES`], or the reserve).
    pub runtime_bytes: u64,
    /// Whether `runtime_bytes` was measured (else it is the [`RUNTIME_BYTES`] reserve).
    pub runtime_measured: bool,
    /// What training a batch adds ([`Runtime::training_bytes`]).
    pub training_bytes: u64,
    /// The topology held in RAM.
    pub topology_bytes: u64,
    /// Batch output buffers (`in_flight_batches` batches of `batch_rows_estimate` rows), the
    /// reads' rows (`read_rows`), and [`READ_BUFFER_BYTES`].
    pub batch_buffers_bytes: u64,
    /// The sampled batches' structure: `batch_rows_estimate` rows of `window_batches` batches
    /// at [`SAMPLE_BYTES_PER_ROW`] and of `in_flight_batches` at [`HANDED_OUT_BYTES_PER_ROW`].
    pub window_bytes: u64,
    /// Rows in the static hot set.
    pub hot_rows: u64,
    /// The hot rows plus the hot set's index (4 bytes per node and per hot row; 0 with no hot
    /// row).
    pub hot_bytes: u64,
    /// Rows in the dynamic cache.
    pub cache_rows: u64,
    /// The cache's [`FeatureCache::footprint`] (0 with no row).
    pub cache_bytes: u64,
    /// Rows the device tier holds (in device memory, outside this budget).
    pub device_rows: u64,
    /// The device tier's index in host memory (4 bytes per node and per device row; 0 with
    /// no device row).
    pub device_index_bytes: u64,
    /// Rows other ranks own when the features are split across ranks (fetched from their
    /// owners per batch, held neither in this budget nor read from this host's disk); their
    /// index is `device_index_bytes`, the device tier's structure (see [`GnnPlan::remote`]).
    pub remote_rows: u64,
    /// The whole feature table (`num_nodes * row_bytes`), on disk.
    pub features_bytes: u64,
}

impl GnnPlan {
    /// Bytes that do not depend on the host's feature tiers: runtime, training, topology,
    /// batch buffers, the window and the device tier's index.
    pub fn fixed_bytes(&self) -> u64 {
        self.runtime_bytes
            + self.training_bytes
            + self.topology_bytes
            + self.batch_buffers_bytes
            + self.window_bytes
            + self.device_index_bytes
    }

    /// Total planned bytes (never more than `memory`).
    pub fn total(&self) -> u64 {
        self.fixed_bytes() + self.hot_bytes + self.cache_bytes
    }

    /// Whether every feature row this process reads itself is held in memory (in the hot
    /// set, or on the device; rows owned by other ranks are theirs to read).
    pub fn all_resident(&self) -> bool {
        self.hot_rows + self.device_rows + self.remote_rows == self.num_nodes
    }

    /// This plan with its `device_rows` counted as rows owned by other ranks instead: [`plan`]
    /// made with `device_rows` = the remote rows keeps them out of the host tiers and counts
    /// their index, which is what a rank holding only its own rows needs.
    pub fn remote(mut self) -> GnnPlan {
        self.remote_rows = self.device_rows;
        self.device_rows = 0;
        self
    }
}

impl Planned for GnnPlan {
    /// Parts: runtime, training, topology, batch buffers, sampled batches, the device tier's
    /// index, hot set, dynamic cache; data: the node features (hot and cached rows in memory,
    /// the device tier's in device memory, the rest on the SSD).
    fn memory_plan(&self) -> MemoryPlan {
        let rows = |n: u64| n * self.row_bytes as u64;
        let mut plan = MemoryPlan::new("gnn", self.memory)
            .minimum(self.fixed_bytes())
            .part(
                "runtime",
                self.runtime_bytes,
                runtime_source(self.runtime_measured),
            )
            .part(
                "training",
                self.training_bytes,
                if self.training_bytes > 0 {
                    "what training a batch adds"
                } else {
                    "not planned: no model given"
                },
            )
            .part("topology", self.topology_bytes, "")
            .part(
                "batch buffers",
                self.batch_buffers_bytes,
                format!(
                    "{} in flight x ~{} rows of {} B, merged reads of {} rows, read buffers",
                    self.in_flight_batches,
                    self.batch_rows_estimate,
                    self.row_bytes,
                    self.read_rows
                ),
            )
            .part(
                "sampled batches",
                self.window_bytes,
                format!(
                    "{} batches' samples: ahead, merged into reads, handed out",
                    self.window_batches + self.in_flight_batches
                ),
            );
        if self.device_rows > 0 {
            plan = plan.part(
                "device tier index",
                self.device_index_bytes,
                format!(
                    "the {} hottest rows ({}) in device memory, outside this budget",
                    self.device_rows,
                    fmt_bytes(rows(self.device_rows))
                ),
            );
        }
        if self.remote_rows > 0 {
            plan = plan.part(
                "remote rows index",
                self.device_index_bytes,
                format!(
                    "the {} rows ({}) other ranks own, fetched from them per batch",
                    self.remote_rows,
                    fmt_bytes(rows(self.remote_rows))
                ),
            );
        }
        let mut elsewhere = match (self.device_rows, self.all_resident()) {
            (0, _) => "SSD".to_string(),
            (d, true) => format!("device memory ({d} rows)"),
            (d, false) => format!("device memory ({d} rows) and the SSD"),
        };
        if self.remote_rows > 0 {
            elsewhere = format!("{elsewhere}; {} rows on other ranks", self.remote_rows);
        }
        let held = match self.codec {
            FeatureCodec::F32 => String::new(),
            c => format!(
                " {} ({} B a row against {} B)",
                c.name(),
                self.held_row_bytes,
                self.row_bytes
            ),
        };
        plan.part(
            "hot set",
            self.hot_bytes,
            format!("{} rows{held} with their index", self.hot_rows),
        )
        .part(
            "dynamic cache",
            self.cache_bytes,
            format!(
                "{} rows{held}, {}, window-pinned",
                self.cache_rows,
                eviction_name(self.eviction)
            ),
        )
        .data(
            "node features",
            self.features_bytes,
            rows(self.hot_rows + self.cache_rows),
            &elsewhere,
        )
    }
}

fn runtime_source(measured: bool) -> String {
    if measured {
        format!(
            "anonymous memory as measured at open, and {} of code pages",
            fmt_bytes(CODE_PAGES_BYTES)
        )
    } else {
        "reserve".to_string()
    }
}

fn eviction_name(e: Eviction) -> &'static str {
    match e {
        Eviction::Clock => "CLOCK",
        Eviction::Sieve => "SIEVE",
    }
}

/// What the feature tiers are planned for besides the budget: the graph, its rows, the
/// batches, the tiers' policies and the process. All sizes in bytes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PlanInputs {
    /// Graph nodes (feature rows in the file).
    pub num_nodes: u64,
    /// Bytes per feature row on disk and in the batches.
    pub row_bytes: usize,
    /// The topology held in RAM ([`strata_graph::Topology::bytes`]).
    pub topology_bytes: u64,
    /// Feature rows per batch (the sampled nodes of a mini-batch, e.g. the largest of a few
    /// sampled batches).
    pub batch_rows_estimate: u64,
    /// Batches holding feature buffers at once, from their assembly to training (at least 1).
    pub in_flight_batches: usize,
    /// Feature rows the merged disk reads in flight hold together (each read's distinct rows).
    pub read_rows: u64,
    /// Batches holding their samples only: ahead in the look-ahead window, merged into a
    /// read, being read.
    pub window_batches: usize,
    /// Fraction in `[0, 1]` of the feature budget for the static hot set, the rest for the
    /// dynamic cache ([`DEFAULT_HOT_SHARE`]; 0 when there is no hot-set ranking). When the
    /// hot share cannot even hold its index, the cache gets everything, and the other way
    /// round (unless `hot_share` is 0).
    pub hot_share: f64,
    /// The cache's policy (SIEVE costs 8 bytes more per cached row).
    pub eviction: Eviction,
    /// Rows of the device tier (at most `num_nodes`): their rows live in device memory, but
    /// their index (4 bytes per node and per row) is a fixed need here, and the host tiers
    /// plan for the other rows only.
    pub device_rows: u64,
    /// The process itself and what training adds, fixed needs too.
    pub runtime: Runtime,
    /// How the hot set and the cache hold their rows: `row_bytes` are float32 rows (`4 * dim`)
    /// for an encoding codec, and each tier row costs [`FeatureCodec::row_bytes`]`(dim)`
    /// instead, so the same feature budget holds about 2x (f16) or 4x (int8) the rows. The
    /// batch buffers stay float32.
    pub codec: FeatureCodec,
}

/// Plans the feature tiers of `inputs` under a budget of `memory`.
///
/// The result never plans more than `memory` bytes, nor more device, hot and cached rows
/// than `num_nodes`. Errors: [`GnnError::Budget`] when the fixed needs alone exceed `memory`
/// (naming each figure); [`GnnError::Config`] for inputs out of range, and `row_bytes` not a
/// multiple of 4 for an encoding codec.
pub fn plan(memory: Size, inputs: &PlanInputs) -> Result<GnnPlan> {
    let memory = memory.0;
    let PlanInputs {
        num_nodes,
        row_bytes,
        topology_bytes,
        batch_rows_estimate,
        in_flight_batches,
        read_rows,
        window_batches,
        hot_share,
        eviction,
        device_rows,
        runtime,
        codec,
    } = *inputs;
    check_arguments(
        num_nodes,
        row_bytes,
        in_flight_batches,
        hot_share,
        device_rows,
    )?;
    let held_row_bytes = match codec {
        FeatureCodec::F32 => row_bytes,
        c if row_bytes.is_multiple_of(4) => c.row_bytes(row_bytes / 4),
        c => {
            return Err(GnnError::Config(format!(
                "budget: feature_codec = {}: rows of {row_bytes} bytes are not float32 rows",
                c.name()
            )))
        }
    };
    let batches = Batches {
        rows: batch_rows_estimate,
        in_flight: in_flight_batches,
        read_rows,
        waiting: window_batches,
    };
    let fixed = FixedNeeds::of(
        num_nodes,
        row_bytes,
        topology_bytes,
        batches,
        device_rows,
        runtime,
    );
    if fixed.total > memory as u128 {
        return Err(GnnError::Budget(fixed.refusal(memory, row_bytes, batches)));
    }
    let costs = TierCosts::new(num_nodes, held_row_bytes, eviction);
    let tiers = costs.split(
        memory as u128 - fixed.total,
        num_nodes - device_rows,
        hot_share,
    );
    debug_assert!(fixed.total + tiers.hot_bytes + tiers.cache_bytes <= memory as u128);
    debug_assert_eq!(
        tiers.cache_bytes as u64,
        FeatureCache::footprint(
            if tiers.cache > 0 {
                num_nodes as usize
            } else {
                0
            },
            tiers.cache as usize,
            held_row_bytes,
            eviction
        )
    );
    // Every figure below is at most `memory` (or the file's size, saturated).
    Ok(GnnPlan {
        memory,
        num_nodes,
        row_bytes,
        codec,
        held_row_bytes,
        batch_rows_estimate,
        in_flight_batches,
        read_rows,
        window_batches,
        hot_share,
        eviction,
        runtime_bytes: runtime.bytes,
        runtime_measured: runtime.measured,
        training_bytes: runtime.training_bytes,
        topology_bytes,
        batch_buffers_bytes: fixed.batch_buffers as u64,
        window_bytes: fixed.window as u64,
        hot_rows: tiers.hot as u64,
        hot_bytes: tiers.hot_bytes as u64,
        cache_rows: tiers.cache as u64,
        cache_bytes: tiers.cache_bytes as u64,
        device_rows,
        device_index_bytes: fixed.device_index as u64,
        remote_rows: 0,
        features_bytes: saturate(num_nodes as u128 * row_bytes as u128),
    })
}

/// Refuses arguments [`plan`] cannot plan for, naming the one out of range.
fn check_arguments(
    num_nodes: u64,
    row_bytes: usize,
    in_flight_batches: usize,
    hot_share: f64,
    device_rows: u64,
) -> Result<()> {
    if row_bytes == 0 {
        return Err(GnnError::Config(
            "budget: feature rows of 0 bytes; the features need at least one column".into(),
        ));
    }
    if !(0.0..=1.0).contains(&hot_share) {
        return Err(GnnError::Config(format!(
            "budget: hot share {hot_share} is outside [0, 1] (the fraction of the feature budget for the hot set)"
        )));
    }
    if in_flight_batches == 0 {
        return Err(GnnError::Config(
            "budget: at least one batch must be in flight".into(),
        ));
    }
    if device_rows > num_nodes {
        return Err(GnnError::Config(format!(
            "budget: {device_rows} device rows but only {num_nodes} nodes"
        )));
    }
    if num_nodes > u32::MAX as u64 + 1 {
        return Err(GnnError::Config(format!(
            "budget: {num_nodes} nodes; the GNN data path handles at most {} (32-bit node ids)",
            u32::MAX as u64 + 1
        )));
    }
    Ok(())
}

/// The batches the plan is sized for: feature rows per batch, batches holding feature buffers
/// at once, the rows of the reads in flight, and batches holding their samples only.
#[derive(Clone, Copy)]
struct Batches {
    rows: u64,
    in_flight: usize,
    read_rows: u64,
    waiting: usize,
}

/// The needs that come off the top of the budget, in bytes. Everything in u128: products of
/// row counts and row sizes may pass u64 before the comparison with the budget decides they
/// are too large.
struct FixedNeeds {
    topology: u64,
    runtime: Runtime,
    /// `in_flight` batches of rows, the reads' rows, and [`READ_BUFFER_BYTES`].
    batch_buffers: u128,
    /// The sampled structure of the batches in flight and waiting.
    window: u128,
    /// The device tier's index (none without device rows).
    device_index: u128,
    /// All of the above.
    total: u128,
}

impl FixedNeeds {
    fn of(
        num_nodes: u64,
        row_bytes: usize,
        topology: u64,
        batches: Batches,
        device_rows: u64,
        runtime: Runtime,
    ) -> FixedNeeds {
        let rows = batches.rows as u128;
        let batch_buffers = (batches.in_flight as u128 * rows + batches.read_rows as u128)
            * row_bytes as u128
            + READ_BUFFER_BYTES as u128;
        let window = (batches.waiting as u128 * SAMPLE_BYTES_PER_ROW as u128
            + batches.in_flight as u128 * HANDED_OUT_BYTES_PER_ROW as u128)
            * rows;
        let device_index = if device_rows == 0 {
            0
        } else {
            HOT_INDEX_BYTES as u128 * (num_nodes as u128 + device_rows as u128)
        };
        let total = runtime.bytes as u128
            + runtime.training_bytes as u128
            + topology as u128
            + batch_buffers
            + window
            + device_index;
        FixedNeeds {
            topology,
            runtime,
            batch_buffers,
            window,
            device_index,
            total,
        }
    }

    /// Why `memory` cannot hold these needs, each figure named, and what to do about it.
    fn refusal(&self, memory: u64, row_bytes: usize, batches: Batches) -> String {
        format!(
            "memory budget {} cannot hold the topology ({}), the batch buffers ({}: {} batches in flight of ~{} rows of {row_bytes} B, merged reads of {} rows, read buffers), the sampled batches ({}), the device tier's index ({}), the runtime ({}: {}) and training a batch ({}): {} in all before any feature row; raise --memory to at least that (each feature row kept in memory then costs about {} B more), or lower the batch size or the batches in flight",
            fmt_bytes(memory),
            fmt_bytes(self.topology),
            fmt_bytes(saturate(self.batch_buffers)),
            batches.in_flight,
            batches.rows,
            batches.read_rows,
            fmt_bytes(saturate(self.window)),
            fmt_bytes(saturate(self.device_index)),
            fmt_bytes(self.runtime.bytes),
            runtime_source(self.runtime.measured),
            fmt_bytes(self.runtime.training_bytes),
            fmt_bytes(saturate(self.total)),
            row_bytes as u64 + HOT_INDEX_BYTES
        )
    }
}

/// What the host tiers cost, in bytes: a row in each, and the per-node index each tier
/// holds once it holds a row.
struct TierCosts {
    row: u128,
    per_slot: u128,
    index: u128,
}

/// Rows and bytes of the two host tiers.
struct TierSplit {
    hot: u128,
    hot_bytes: u128,
    cache: u128,
    cache_bytes: u128,
}

impl TierCosts {
    fn new(num_nodes: u64, row_bytes: usize, eviction: Eviction) -> TierCosts {
        TierCosts {
            row: row_bytes as u128,
            per_slot: FeatureCache::footprint(0, 1, 0, eviction) as u128,
            index: HOT_INDEX_BYTES as u128 * num_nodes as u128,
        }
    }

    /// Bytes of a hot set of `k` rows, its index included (none when empty).
    fn hot(&self, k: u128) -> u128 {
        if k == 0 {
            0
        } else {
            k * (self.row + HOT_INDEX_BYTES as u128) + self.index
        }
    }

    /// Bytes of a cache of `c` rows ([`FeatureCache::footprint`]; none when empty).
    fn cache(&self, c: u128) -> u128 {
        if c == 0 {
            0
        } else {
            c * (self.row + self.per_slot) + self.index
        }
    }

    /// The most hot rows `budget` bytes hold, at most `limit`.
    fn max_hot(&self, budget: u128, limit: u128) -> u128 {
        budget
            .checked_sub(self.index)
            .map_or(0, |b| (b / (self.row + HOT_INDEX_BYTES as u128)).min(limit))
    }

    /// The most cached rows `budget` bytes hold, at most `limit` and the cache's capacity.
    fn max_cache(&self, budget: u128, limit: u128) -> u128 {
        budget.checked_sub(self.index).map_or(0, |b| {
            (b / (self.row + self.per_slot))
                .min(limit)
                .min(MAX_CAPACITY as u128)
        })
    }

    /// Splits `available` bytes between the hot set and the cache for the `host_rows` rows
    /// the device tier does not hold: all of them to the hot set when they fit, else the hot
    /// set its `hot_share` and the cache the rest.
    fn split(&self, available: u128, host_rows: u64, hot_share: f64) -> TierSplit {
        let host_rows = host_rows as u128;
        // HotSet slots are 32-bit with one value reserved.
        let hot_limit = host_rows.min(u32::MAX as u128 - 1);
        let (hot, cache) = if host_rows == 0 {
            (0, 0)
        } else if host_rows <= hot_limit && self.hot(host_rows) <= available {
            (host_rows, 0)
        } else {
            let hot_budget = ((available as f64 * hot_share) as u128).min(available);
            let hot = self.max_hot(hot_budget, hot_limit);
            // The cache takes everything the hot set did not use (its share, rounding, or an
            // index the hot share could not hold).
            let cache = self.max_cache(available - self.hot(hot), host_rows - hot);
            if cache == 0 && hot_share > 0.0 {
                // Not even the cache's index fits in the rest: give it all to the hot set.
                (self.max_hot(available, hot_limit), 0)
            } else {
                (hot, cache)
            }
        };
        TierSplit {
            hot,
            hot_bytes: self.hot(hot),
            cache,
            cache_bytes: self.cache(cache),
        }
    }
}

fn saturate(x: u128) -> u64 {
    x.min(u64::MAX as u128) as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    /// Inputs of a graph of `num_nodes` rows of `row_bytes`, `topology_bytes` of topology and
    /// batches of `batch_rows` rows: 4 in flight, reads of a batch's rows, none waiting, half the feature budget to the
    /// hot set, CLOCK, no device tier, the runtime reserve, float32 tiers.
    fn inputs(
        num_nodes: u64,
        row_bytes: usize,
        topology_bytes: u64,
        batch_rows: u64,
    ) -> PlanInputs {
        PlanInputs {
            num_nodes,
            row_bytes,
            topology_bytes,
            batch_rows_estimate: batch_rows,
            in_flight_batches: 4,
            read_rows: batch_rows,
            window_batches: 0,
            hot_share: 0.5,
            eviction: Eviction::Clock,
            device_rows: 0,
            runtime: Runtime::reserve(),
            codec: FeatureCodec::F32,
        }
    }

    fn eviction(sieve: bool) -> Eviction {
        if sieve {
            Eviction::Sieve
        } else {
            Eviction::Clock
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn plans_fit_the_budget_and_the_graph(
            memory in prop_oneof![0u64..(512 * MIB), 0u64..(64 << 30), Just(u64::MAX)],
            num_nodes in prop_oneof![0u64..100, 0u64..5_000_000, Just(u32::MAX as u64 + 1)],
            row_bytes in prop_oneof![1usize..64, 64usize..8192, Just(512)],
            topology_bytes in prop_oneof![0u64..(256 * MIB), Just(u64::MAX / 2)],
            batch_rows in prop_oneof![0u64..200_000, Just(u64::MAX / 4)],
            in_flight in 1usize..8,
            reads in 0u64..4,
            window in 0usize..16,
            hot_share in prop_oneof![Just(0.0), Just(0.5), Just(1.0), 0.0f64..=1.0],
            sieve in any::<bool>(),
            device_share in prop_oneof![Just(0.0), 0.0f64..=1.0],
        ) {
            let device_rows = (num_nodes as f64 * device_share) as u64;
            let ev = eviction(sieve);
            match plan(Size(memory), &PlanInputs { in_flight_batches: in_flight, read_rows: reads * batch_rows, window_batches: window, hot_share, eviction: ev, device_rows, ..inputs(num_nodes, row_bytes, topology_bytes, batch_rows) }) {
                Ok(p) => {
                    prop_assert!(p.total() <= memory, "{:?}", p);
                    prop_assert!(p.hot_rows + p.cache_rows + device_rows <= num_nodes, "{:?}", p);
                    let index = if device_rows == 0 { 0 } else { 4 * (num_nodes + device_rows) };
                    prop_assert_eq!((p.device_rows, p.device_index_bytes), (device_rows, index));
                    prop_assert!(p.hot_rows < u32::MAX as u64, "HotSet slots are 32-bit");
                    prop_assert!(p.cache_rows <= MAX_CAPACITY as u64);
                    let rb = row_bytes as u64;
                    let hot_bytes = if p.hot_rows == 0 { 0 } else { p.hot_rows * (rb + 4) + 4 * num_nodes };
                    prop_assert_eq!(p.hot_bytes, hot_bytes);
                    let cache_nodes = if p.cache_rows == 0 { 0 } else { num_nodes as usize };
                    prop_assert_eq!(
                        p.cache_bytes,
                        FeatureCache::footprint(cache_nodes, p.cache_rows as usize, row_bytes, ev)
                    );
                    let available = memory - p.fixed_bytes();
                    let host = num_nodes - device_rows;
                    let all = host * (rb + 4) + 4 * num_nodes;
                    if host > 0 && host < u32::MAX as u64 && all <= available {
                        prop_assert!(p.all_resident() && p.cache_rows == 0, "{:?}", p);
                    } else {
                        prop_assert!(!p.all_resident() || host == 0);
                    }
                    if hot_share == 0.0 && !p.all_resident() {
                        prop_assert_eq!(p.hot_rows, 0);
                    }
                    // A cache below every limit took all it could: less than a row is left.
                    let per_slot = if sieve { 17 } else { 9 };
                    if p.cache_rows > 0
                        && p.hot_rows + p.cache_rows + device_rows < num_nodes
                        && p.cache_rows < MAX_CAPACITY as u64
                    {
                        prop_assert!(memory - p.total() < rb + per_slot, "{:?}", p);
                    }
                    let mp = p.memory_plan();
                    prop_assert_eq!(mp.parts.len(), 7 + usize::from(device_rows > 0));
                    prop_assert_eq!(mp.total(), p.total());
                    prop_assert_eq!(mp.minimum, p.fixed_bytes());
                }
                Err(e) => {
                    let msg = e.to_string();
                    prop_assert!(matches!(e, GnnError::Budget(_)), "{}", msg);
                    prop_assert!(msg.contains("raise --memory"), "{}", msg);
                    let fixed = RUNTIME_BYTES as u128
                        + topology_bytes as u128
                        + (in_flight as u128 + reads as u128) * batch_rows as u128 * row_bytes as u128
                        + READ_BUFFER_BYTES as u128
                        + (window as u128 * SAMPLE_BYTES_PER_ROW as u128 + in_flight as u128 * HANDED_OUT_BYTES_PER_ROW as u128) * batch_rows as u128
                        + if device_rows == 0 { 0 } else { 4 * (num_nodes as u128 + device_rows as u128) };
                    prop_assert!(fixed > memory as u128, "refused although {} fits in {}", fixed, memory);
                }
            }
        }
    }

    #[test]
    fn an_encoding_codec_multiplies_the_rows_a_budget_holds() {
        // 1M nodes of 128 float32 values (512 B); 200 MiB of budget, not enough for all rows.
        let (n, rb) = (1_000_000u64, 512usize);
        let p = |codec| {
            plan(
                Size(200 * MIB),
                &PlanInputs {
                    hot_share: 1.0,
                    codec,
                    ..inputs(n, rb, 8 * MIB, 1000)
                },
            )
            .unwrap()
        };
        let f32 = p(FeatureCodec::F32);
        let available = 200 * MIB - f32.fixed_bytes();
        for (codec, held, factor) in [
            (FeatureCodec::F32, 512, 1.0),
            (FeatureCodec::F16, 256, 1.98),
            (FeatureCodec::Int8, 132, 3.79),
        ] {
            let plan = p(codec);
            assert_eq!((plan.codec, plan.held_row_bytes), (codec, held));
            assert_eq!(
                plan.fixed_bytes(),
                f32.fixed_bytes(),
                "batches stay float32"
            );
            // All to the hot set: each row costs its held bytes and 4 of index, beside the
            // index of 4 bytes per node.
            assert_eq!(
                plan.hot_rows,
                (available - 4 * n) / (held as u64 + 4),
                "{codec:?}"
            );
            let ratio = plan.hot_rows as f64 / f32.hot_rows as f64;
            assert!((ratio - factor).abs() < 0.01, "{codec:?}: {ratio}");
            let text = plan.memory_plan().describe().join("\n");
            let said = format!(
                "{} rows {} ({held} B a row against 512 B)",
                plan.hot_rows,
                codec.name()
            );
            assert_eq!(text.contains(&said), codec != FeatureCodec::F32, "{text}");
        }
        let e = plan(
            Size(200 * MIB),
            &PlanInputs {
                in_flight_batches: 1,
                codec: FeatureCodec::F16,
                ..inputs(n, 6, 0, 10)
            },
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("feature_codec = f16: rows of 6 bytes"), "{e}");
    }

    #[test]
    fn refuses_when_the_topology_does_not_fit() {
        let e = plan(Size(64 * MIB), &inputs(1_000_000, 512, 95 * MIB, 1000)).unwrap_err();
        assert!(matches!(e, GnnError::Budget(_)));
        let msg = e.to_string();
        for want in [
            "memory budget 64.0 MiB cannot hold",
            "the topology (95.0 MiB)",
            "the runtime (64.0 MiB: reserve)",
            "4 batches in flight of ~1000 rows of 512 B",
            "raise --memory",
        ] {
            assert!(msg.contains(want), "{want:?} not in {msg}");
        }
    }

    #[test]
    fn a_measured_runtime_and_training_are_fixed_needs() {
        let runtime = Runtime::measured(604 * MIB, 30 * MIB);
        assert_eq!(runtime.bytes, 700 * MIB);
        let args = |memory| {
            plan(
                Size(memory),
                &PlanInputs {
                    runtime,
                    ..inputs(1_000_000, 512, 10 * MIB, 1000)
                },
            )
        };
        let msg = args(512 * MIB).unwrap_err().to_string();
        for want in [
            "the runtime (700 MiB: anonymous memory as measured at open, and 96.0 MiB of code pages)",
            "training a batch (30.0 MiB)",
            "raise --memory to at least",
        ] {
            assert!(msg.contains(want), "{want:?} not in {msg}");
        }
        let p = args(1 << 30).unwrap();
        assert_eq!(p.fixed_bytes(), p.total() - p.hot_bytes - p.cache_bytes);
        assert!(p.fixed_bytes() >= 730 * MIB && p.total() <= 1 << 30);
        let lines = p.memory_plan().describe();
        assert!(
            lines.iter().any(|l| l.contains("runtime")
                && l.contains("700 MiB")
                && l.ends_with("anonymous memory as measured at open, and 96.0 MiB of code pages")),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("training") && l.contains("30.0 MiB")),
            "{lines:?}"
        );
    }

    #[test]
    fn a_rank_with_split_features_plans_only_its_own_rows() {
        // 10,000 nodes, 6,000 of them owned by other ranks: planned as rows outside the host
        // tiers (the device tier's index structure), then counted as remote.
        let p = plan(
            Size(1 << 30),
            &PlanInputs {
                eviction: Eviction::Sieve,
                device_rows: 6_000,
                ..inputs(10_000, 400, 10 * MIB, 1000)
            },
        )
        .unwrap()
        .remote();
        assert_eq!((p.remote_rows, p.device_rows), (6_000, 0));
        assert_eq!((p.hot_rows, p.cache_rows), (4_000, 0));
        assert!(p.all_resident());
        assert_eq!(p.device_index_bytes, 4 * (10_000 + 6_000));
        let lines = p.memory_plan().describe();
        assert!(
            lines
                .iter()
                .any(|l| l.contains("remote rows index") && l.contains("6000 rows")),
            "{lines:?}"
        );
        assert!(
            !lines.iter().any(|l| l.contains("device tier")),
            "{lines:?}"
        );
    }

    #[test]
    fn everything_fits_in_the_hot_set() {
        let p = plan(
            Size(1 << 30),
            &PlanInputs {
                eviction: Eviction::Sieve,
                ..inputs(10_000, 400, 10 * MIB, 1000)
            },
        )
        .unwrap();
        assert!(p.all_resident());
        assert_eq!((p.hot_rows, p.cache_rows, p.cache_bytes), (10_000, 0, 0));
        assert_eq!(p.hot_bytes, 10_000 * 404 + 40_000);
        assert_eq!(p.features_bytes, 4_000_000);
        let lines = p.memory_plan().describe();
        assert!(lines[0].starts_with("gnn budget 1.00 GiB"), "{lines:?}");
        assert!(
            lines
                .last()
                .unwrap()
                .ends_with("node features 3.81 MiB: all in memory"),
            "{lines:?}"
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("topology") && l.contains("10.0 MiB")),
            "{lines:?}"
        );
        // Even with no hot share, a full copy goes to the hot set rather than the cache.
        let p0 = plan(
            Size(1 << 30),
            &PlanInputs {
                hot_share: 0.0,
                eviction: Eviction::Sieve,
                ..inputs(10_000, 400, 10 * MIB, 1000)
            },
        )
        .unwrap();
        assert!(p0.all_resident());
    }

    #[test]
    fn splits_the_rest_by_the_hot_share() {
        let n = 1_000_000u64;
        let fixed = plan(Size(u64::MAX), &inputs(n, 256, 50 * MIB, 10_000))
            .unwrap()
            .fixed_bytes();
        let room = 100 * MIB;
        let p = plan(Size(fixed + room), &inputs(n, 256, 50 * MIB, 10_000)).unwrap();
        // Half of the room each, minus the 4 MB indexes.
        assert_eq!(p.hot_rows, (room / 2 - 4 * n) / 260);
        assert_eq!(p.cache_rows, (room - p.hot_bytes - 4 * n) / 265);
        assert!(room - p.hot_bytes - p.cache_bytes < 265);
        let text = p.memory_plan().describe().join("\n");
        assert!(
            text.contains(&format!("{} rows with their index", p.hot_rows)),
            "{text}"
        );
        assert!(text.contains("CLOCK, window-pinned"), "{text}");
        assert!(
            text.contains("4 in flight x ~10000 rows of 256 B"),
            "{text}"
        );
        // No hot share: all to the cache.
        let p = plan(
            Size(fixed + room),
            &PlanInputs {
                hot_share: 0.0,
                eviction: Eviction::Sieve,
                ..inputs(n, 256, 50 * MIB, 10_000)
            },
        )
        .unwrap();
        assert_eq!((p.hot_rows, p.cache_rows), (0, (room - 4 * n) / 273));
        // All hot share: the cache gets what rounding leaves, here nothing.
        let p = plan(
            Size(fixed + room),
            &PlanInputs {
                hot_share: 1.0,
                eviction: Eviction::Sieve,
                ..inputs(n, 256, 50 * MIB, 10_000)
            },
        )
        .unwrap();
        assert_eq!((p.hot_rows, p.cache_rows), ((room - 4 * n) / 260, 0));
        // A budget that holds no index: nothing in memory, every read from the SSD.
        let p = plan(
            Size(fixed + 1000),
            &PlanInputs {
                eviction: Eviction::Sieve,
                ..inputs(n, 256, 50 * MIB, 10_000)
            },
        )
        .unwrap();
        assert_eq!((p.hot_rows, p.cache_rows, p.total()), (0, 0, fixed));
        let lines = p.memory_plan().describe();
        assert!(
            lines
                .last()
                .unwrap()
                .ends_with("0.0% in memory (0 B), the rest from SSD"),
            "{lines:?}"
        );
    }

    #[test]
    fn the_device_tier_takes_rows_off_the_host_tiers() {
        let n = 1_000_000u64;
        let p = plan(
            Size(1 << 30),
            &PlanInputs {
                device_rows: 400_000,
                ..inputs(n, 256, 50 * MIB, 10_000)
            },
        )
        .unwrap();
        // The other 600k rows fit in the hot set; the device index (5.6 MB) is a fixed need.
        assert!(p.all_resident());
        assert_eq!((p.hot_rows, p.cache_rows), (600_000, 0));
        assert_eq!(p.device_index_bytes, 4 * 1_400_000);
        let lines = p.memory_plan().describe();
        assert!(
            lines.iter().any(|l| l.contains("device tier index")
                && l.contains("the 400000 hottest rows (97.7 MiB) in device memory")),
            "{lines:?}"
        );
        assert!(
            lines
                .last()
                .unwrap()
                .ends_with("the rest from device memory (400000 rows)"),
            "{lines:?}"
        );
        // Everything on the device: no host tier at all.
        let p = plan(
            Size(1 << 30),
            &PlanInputs {
                device_rows: n,
                ..inputs(n, 256, 50 * MIB, 10_000)
            },
        )
        .unwrap();
        assert!(p.all_resident());
        assert_eq!((p.hot_rows, p.cache_rows, p.hot_bytes), (0, 0, 0));
    }

    #[test]
    fn rejects_arguments_out_of_range() {
        let e = |r: Result<GnnPlan>| r.unwrap_err().to_string();
        let m = 1 << 30;
        assert!(e(plan(
            Size(m),
            &PlanInputs {
                in_flight_batches: 1,
                ..inputs(10, 0, 0, 1)
            }
        ))
        .contains("0 bytes"));
        assert!(e(plan(
            Size(m),
            &PlanInputs {
                in_flight_batches: 1,
                hot_share: 1.5,
                ..inputs(10, 4, 0, 1)
            }
        ))
        .contains("hot share 1.5"));
        assert!(e(plan(
            Size(m),
            &PlanInputs {
                in_flight_batches: 1,
                hot_share: f64::NAN,
                ..inputs(10, 4, 0, 1)
            }
        ))
        .contains("hot share NaN"));
        assert!(e(plan(
            Size(m),
            &PlanInputs {
                in_flight_batches: 0,
                ..inputs(10, 4, 0, 1)
            }
        ))
        .contains("in flight"));
        assert!(e(plan(
            Size(m),
            &PlanInputs {
                in_flight_batches: 1,
                ..inputs(1 << 33, 4, 0, 1)
            }
        ))
        .contains("32-bit"));
        assert!(e(plan(
            Size(m),
            &PlanInputs {
                in_flight_batches: 1,
                device_rows: 11,
                ..inputs(10, 4, 0, 1)
            }
        ))
        .contains("11 device rows"));
    }
}
