//! What every RPC shares ([`Core`]: the registry, the executor, the page cache, the limits and
//! the counters) and the descriptions of registered graphs, models and embedding runs that the
//! RPCs and the status report.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crate::budget::ServePlan;
use crate::embeddings::ServedEmbedding;
use crate::error::{Result, ServeError};
use crate::executor::Executor;
use crate::graph::GraphStatus;
use crate::memory::{Allowance, Pool};
use crate::page_cache::PageCache;
use crate::proto;
use crate::registry::{Registry, ServedModel};
use crate::roots::DataRoots;
use crate::wire;

/// Request limits (besides the message size, which tonic enforces).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most ids in one request (targets, seeds, vertices, edges, embedding queries).
    pub max_ids: usize,
    /// Most answers per query of an embedding run (top-k, neighbours).
    pub max_k: usize,
    /// Requests per second over all clients (a token bucket holding one second's worth);
    /// 0 means no limit.
    pub rate: f64,
    /// The directories whose files requests may name.
    pub roots: DataRoots,
}

/// A token bucket: `rate` tokens a second, at most `rate` banked.
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// Everything the RPCs share.
pub struct Core {
    pub registry: Registry,
    pub executor: Executor,
    pub page_cache: Arc<PageCache>,
    pub limits: Limits,
    pub sample_seed: u64,
    pub listen: String,
    pub memory: u64,
    /// Requests, replies and results not yet fetched reserve their bytes here first.
    pub working: Arc<Pool>,
    /// The largest message, request or reply (the plan's).
    pub max_message: u64,
    pub started: Instant,
    pub draining: AtomicBool,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    bucket: Mutex<Bucket>,
}

impl Core {
    pub fn new(
        registry: Registry,
        executor: Executor,
        page_cache: Arc<PageCache>,
        limits: Limits,
        plan: &ServePlan,
        sample_seed: u64,
        listen: String,
    ) -> Core {
        Core {
            working: Pool::new(plan.working_bytes, "working memory (1/8 of --memory)"),
            max_message: plan.max_message_bytes,
            registry,
            executor,
            page_cache,
            bucket: Mutex::new(Bucket {
                tokens: limits.rate,
                at: Instant::now(),
            }),
            limits,
            sample_seed,
            listen,
            memory: plan.memory,
            started: Instant::now(),
            draining: AtomicBool::new(false),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
        }
    }

    /// What loading one model may allocate (file bytes, inflated npz members, decoded
    /// tensors): half the working memory, reserved from it as it is taken, so that a hostile
    /// file or upload is refused before it can take the server past `--memory`. An uploaded
    /// file's bytes are already held with its request.
    pub fn model_load_allowance(&self) -> Allowance {
        Allowance::new(
            self.working.capacity() / 2,
            "half the working memory, itself 1/8 of --memory",
            Some(Arc::clone(&self.working)),
        )
    }

    /// Admits one request under the rate limit.
    pub(crate) fn admit(&self) -> Result<()> {
        if self.limits.rate <= 0.0 {
            return Ok(());
        }
        let mut b = self.bucket.lock().unwrap();
        let now = Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * self.limits.rate)
            .min(self.limits.rate);
        b.at = now;
        if b.tokens < 1.0 {
            return Err(ServeError::ResourceExhausted(format!(
                "rate limit: more than {} requests per second; retry later",
                self.limits.rate
            )));
        }
        b.tokens -= 1.0;
        Ok(())
    }

    /// Refuses more than `--max-ids` ids in one request field `what`.
    pub fn check_ids(&self, n: usize, what: &str) -> Result<()> {
        if n > self.limits.max_ids {
            return Err(ServeError::ResourceExhausted(format!(
                "{what}: {n} ids in one request; the limit is {} (--max-ids)",
                self.limits.max_ids
            )));
        }
        Ok(())
    }

    pub(crate) fn not_draining(&self) -> Result<()> {
        if self.draining.load(Ordering::Acquire) {
            return Err(ServeError::Unavailable(
                "the server is draining before it stops".into(),
            ));
        }
        Ok(())
    }

    /// A status snapshot.
    pub fn status(&self) -> proto::StatusResponse {
        let graphs = self
            .registry
            .graphs()
            .iter()
            .map(|g| graph_info(&g.status()))
            .collect();
        let models = self
            .registry
            .models()
            .iter()
            .map(|m| model_info(m))
            .collect();
        let pc = self.page_cache.stats();
        let ex = self.executor.stats();
        let rate = |h: u64, m: u64| {
            if h + m == 0 {
                0.0
            } else {
                h as f64 / (h + m) as f64
            }
        };
        proto::StatusResponse {
            listen: self.listen.clone(),
            uptime_s: self.started.elapsed().as_secs_f64(),
            graphs,
            models,
            page_cache: Some(proto::CacheStatus {
                capacity_bytes: pc.capacity_bytes,
                used_bytes: pc.used_bytes,
                page_bytes: crate::page_cache::PAGE_BYTES as u64,
                hits: pc.hits,
                misses: pc.misses,
                hit_rate: rate(pc.hits, pc.misses),
                bytes_read: pc.bytes_read,
            }),
            embedding_cache: Some(proto::CacheStatus {
                capacity_bytes: ex.embedding_cache_bytes,
                used_bytes: ex.embedding_cache_used,
                page_bytes: 0,
                hits: ex.embedding_hits,
                misses: ex.embedding_misses,
                hit_rate: rate(ex.embedding_hits, ex.embedding_misses),
                bytes_read: 0,
            }),
            queue_depth: ex.queue_depth,
            requests_done: ex.done,
            requests_failed: ex.failed,
            bytes_in: self.bytes_in.load(Ordering::Relaxed),
            bytes_out: self.bytes_out.load(Ordering::Relaxed),
            memory: self.memory,
            draining: self.draining.load(Ordering::Acquire),
            working_used_bytes: self.working.used(),
            working_capacity_bytes: self.working.capacity(),
            max_message_bytes: self.max_message,
            embeddings: self
                .registry
                .embeddings
                .list()
                .iter()
                .map(|e| embedding_info(e))
                .collect(),
        }
    }
}

pub fn graph_info(s: &GraphStatus) -> proto::GraphInfo {
    proto::GraphInfo {
        name: s.meta.name.clone(),
        num_nodes: s.num_nodes,
        live_nodes: s.live_nodes,
        num_edges: s.num_edges,
        feature_dim: s.feature_dim as u32,
        version: s.version,
        last_lsn: s.last_lsn,
        pending_log_records: s.pending_log_records,
        reordered: s.meta.reordered,
        source_path: s.meta.source_path.clone(),
        num_classes: s.num_classes,
    }
}

pub fn model_info(m: &ServedModel) -> proto::ModelInfo {
    proto::ModelInfo {
        name: m.name.clone(),
        architecture: Some(wire::architecture_proto(m.model.architecture())),
        precision: wire::precision_proto(m.model.precision()),
        parameters: m.model.parameters(),
        bytes: m.model.bytes(),
    }
}

/// A registered run's description.
pub fn embedding_info(e: &ServedEmbedding) -> proto::EmbeddingInfo {
    let i = &e.info;
    proto::EmbeddingInfo {
        name: e.name.clone(),
        source_path: e.json.source.display().to_string(),
        store_path: i.store.clone(),
        checkpoint: e.json.checkpoint.clone(),
        epoch: i.epoch,
        model: i.model.clone(),
        dim: i.dim as u32,
        num_nodes: i.num_nodes,
        num_relations: i.num_relations,
        partitions: i.partitions,
        resident_partitions: i.resident_partitions,
        table_bytes: i.table_bytes,
        resident_bytes: i.resident_bytes,
    }
}
