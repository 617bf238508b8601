//! The server's memory plan: how `--memory` splits between the runtime, the graphs and models
//! registered at start, and the shared part (working memory, executor groups, embedding
//! cache, page cache). A pure function of the budget, what is registered and the options;
//! [`crate::server::serve`] follows it and prints it.

use serde::Serialize;
use strata_store::budget::{MemoryPlan, Planned};
use strata_store::units::fmt_bytes;

use crate::error::{Result, ServeError};

/// Bytes the server's runtime holds beside its planned parts: the async runtime and its RPC
/// worker threads (stacks, HTTP/2 connection buffers), the executor's thread, the I/O engine's
/// rings, and allocator overhead (the page cache's 16 KiB pages are 4 KiB-aligned
/// allocations). Measured: serving the budget matrix's workload (a 50k-vertex graph
/// registered, every feature row four times, sampling) at `--memory 32M` to `128M`, the server
/// holds up to 20 MiB more than at start beyond the parts it planned (see
/// docs/reliability.md, "Memory budgets").
pub const RUNTIME_BYTES: u64 = 24 << 20;
/// Least bytes a plan leaves for the working memory, the executor and the caches together.
pub const MIN_SHARED_BYTES: u64 = 8 << 20;
/// Share of the shared part given to the embedding cache (when on), of what the working
/// memory and the executor leave; the rest is the page cache.
const EMBEDDING_SHARE: f64 = 0.25;
/// `shared / WORKING_DIVISOR` is the working memory: requests, replies and results not yet
/// fetched (`memory.rs`).
const WORKING_DIVISOR: u64 = 8;
/// `shared / EXECUTOR_DIVISOR` holds the executor's fused groups: their input rows and
/// activations (a group too big for it is split).
const EXECUTOR_DIVISOR: u64 = 8;

/// How `--memory` is split, reported at start.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ServePlan {
    /// `--memory`, all of it.
    pub memory: u64,
    /// [`RUNTIME_BYTES`].
    pub runtime_bytes: u64,
    /// Topology, ids and labels of the graphs registered at start ([`crate::memory::graph_bytes`]).
    pub graphs_bytes: u64,
    /// Weights of the models registered at start, as served.
    pub models_bytes: u64,
    /// Resident sets of the embedding runs registered at start: partitions, relations, query
    /// scratch.
    pub embeddings_bytes: u64,
    /// The page cache at start; graphs and models registered later take from it.
    pub page_cache_bytes: u64,
    pub embedding_cache_bytes: u64,
    /// Requests, replies and results not yet fetched.
    pub working_bytes: u64,
    /// The executor's fused groups.
    pub executor_bytes: u64,
    /// The largest message, request or reply: `--max-message`, or half the working memory
    /// when that is less (a reply is held twice while it is encoded).
    pub max_message_bytes: u64,
}

/// What is registered when the plan is made, in bytes held in memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct Registered {
    /// Topology, ids and labels of the graphs ([`crate::memory::graph_bytes`]).
    pub graphs: u64,
    /// Weights of the models as served.
    pub models: u64,
    /// Resident sets of the embedding runs (partitions, relations, query scratch).
    pub embeddings: u64,
}

/// The split of `memory`: the runtime and what is `registered` off the top; of the rest
/// (the shared part), an eighth each to the working memory and the executor, of what
/// remains a quarter to embeddings when `embedding_cache`, and the remainder (or all) to
/// pages. `max_message` is the configured message limit. Refuses (`INVALID_ARGUMENT`,
/// naming each part) a budget whose shared part would be less than [`MIN_SHARED_BYTES`].
pub fn plan(
    memory: u64,
    registered: Registered,
    embedding_cache: bool,
    max_message: usize,
) -> Result<ServePlan> {
    let Registered {
        graphs: graphs_bytes,
        models: models_bytes,
        embeddings: embeddings_bytes,
    } = registered;
    let fixed = RUNTIME_BYTES
        .saturating_add(graphs_bytes)
        .saturating_add(models_bytes)
        .saturating_add(embeddings_bytes);
    let minimum = fixed.saturating_add(MIN_SHARED_BYTES);
    if memory < minimum {
        return Err(ServeError::InvalidArgument(format!(
            "memory: --memory {} is below this server's minimum of {}: runtime {} (async runtime, RPC threads, allocator; measured), registered graphs {} (topology, ids, labels), models {}, embedding runs {} (resident partitions, relations), and at least {} for the working memory, the executor and the caches; raise --memory",
            fmt_bytes(memory),
            fmt_bytes(minimum),
            fmt_bytes(RUNTIME_BYTES),
            fmt_bytes(graphs_bytes),
            fmt_bytes(models_bytes),
            fmt_bytes(embeddings_bytes),
            fmt_bytes(MIN_SHARED_BYTES)
        )));
    }
    let shared = memory - fixed;
    let working = shared / WORKING_DIVISOR;
    let executor = shared / EXECUTOR_DIVISOR;
    let rest = shared - working - executor;
    let embedding = if embedding_cache {
        (rest as f64 * EMBEDDING_SHARE) as u64
    } else {
        0
    };
    Ok(ServePlan {
        memory,
        runtime_bytes: RUNTIME_BYTES,
        graphs_bytes,
        models_bytes,
        embeddings_bytes,
        page_cache_bytes: rest - embedding,
        embedding_cache_bytes: embedding,
        working_bytes: working,
        executor_bytes: executor,
        max_message_bytes: (max_message as u64).min(working / 2),
    })
}

impl Planned for ServePlan {
    /// Parts: runtime, registered graphs, models, page cache, embedding cache, working
    /// memory, executor groups. The features are read through the page cache, from the SSD.
    fn memory_plan(&self) -> MemoryPlan {
        MemoryPlan::new("serve", self.memory)
            .minimum(
                self.runtime_bytes
                    + self.graphs_bytes
                    + self.models_bytes
                    + self.embeddings_bytes
                    + MIN_SHARED_BYTES,
            )
            .part(
                "runtime",
                self.runtime_bytes,
                "async runtime, RPC threads, allocator; measured",
            )
            .part(
                "registered graphs",
                self.graphs_bytes,
                "topology, ids, labels",
            )
            .part("models", self.models_bytes, "weights as served")
            .part(
                "embedding runs",
                self.embeddings_bytes,
                "resident partitions, relations, query scratch",
            )
            .part(
                "page cache",
                self.page_cache_bytes,
                "16 KiB pages, LRU; graphs, models and embedding runs registered later take from it",
            )
            .part("embedding cache", self.embedding_cache_bytes, "")
            .part(
                "working memory",
                self.working_bytes,
                format!(
                    "requests, replies, results; messages up to {}",
                    fmt_bytes(self.max_message_bytes)
                ),
            )
            .part(
                "executor groups",
                self.executor_bytes,
                "fused groups' input rows and activations",
            )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plan_takes_the_runtime_graphs_and_models_off_the_top() {
        let reg = |graphs, models, embeddings| Registered {
            graphs,
            models,
            embeddings,
        };
        let p = plan(128 << 20, reg(3 << 20, 1 << 20, 2 << 20), true, 64 << 20).unwrap();
        let shared = (128 - 24 - 6) << 20;
        assert_eq!(
            (p.working_bytes, p.executor_bytes),
            (shared / 8, shared / 8)
        );
        let parts = p.runtime_bytes
            + p.graphs_bytes
            + p.models_bytes
            + p.embeddings_bytes
            + p.working_bytes
            + p.executor_bytes
            + p.embedding_cache_bytes
            + p.page_cache_bytes;
        assert_eq!(parts, 128 << 20);
        let mp = p.memory_plan();
        assert_eq!((mp.total(), mp.minimum), (128 << 20, (24 + 6 + 8) << 20));
        assert_eq!(p.max_message_bytes, shared / 16);
        let e = plan(37 << 20, reg(3 << 20, 1 << 20, 2 << 20), true, 64 << 20)
            .unwrap_err()
            .to_string();
        for want in [
            "--memory 37.0 MiB is below this server's minimum of 38.0 MiB",
            "runtime 24.0 MiB",
            "registered graphs 3.00 MiB",
            "models 1.00 MiB",
            "embedding runs 2.00 MiB",
        ] {
            assert!(e.contains(want), "{want:?} not in {e}");
        }
        assert!(plan(38 << 20, reg(3 << 20, 1 << 20, 2 << 20), false, 64 << 20).is_ok());
    }
}
