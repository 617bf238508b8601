//! The analysis path: a batching window collects requests, GLIST's scheduler (Alg. 1) turns
//! each (graph, model) share of the window into groups of distinct vertices to embed, and each
//! group is sampled, gathered (through the page cache) and run through the model as one fused
//! batch. Predictions then read the embeddings back through the scheduler's mapping table.
//!
//! Analyses sample with a fixed seed and batch key, so a vertex's embedding depends only on
//! the graph (for the layer types whose outputs do not depend on the other vertices of the
//! batch: SAGE and GIN; GCN normalises by block degrees) and can be cached until the next
//! mutation of the graph.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use strata_graph::{NeighborSampler, SamplerConfig};
use tokio::sync::watch;

use crate::error::{Result, ServeError};
use crate::graph::ServedGraph;
use crate::memory::Reservation;
use crate::page_cache::{Lru, PageCache};
use crate::registry::ServedModel;
use crate::schedule::{plan, RequestMap, ScheduleConfig, Targets};

/// The batch key analyses sample with (any fixed value would do; clients reproduce an
/// analysis's neighbourhood with `SampleNeighbors(seed = --sample-seed, batch_key = 0)`).
pub const ANALYSIS_BATCH_KEY: u64 = 0;

/// How analyses are batched, scheduled and cached.
#[derive(Debug, Clone)]
pub struct ExecConfig {
    /// How long the first request of a batch waits for others to join it.
    pub window: Duration,
    /// Most requests in one batch.
    pub max_batch: usize,
    pub schedule: ScheduleConfig,
    /// Seed of the neighbour sampling of analyses.
    pub sample_seed: u64,
    /// Bytes of the embedding cache; 0 turns it off.
    pub embedding_cache_bytes: u64,
    /// Bytes one fused group may take (its sample, input rows and activations); a group
    /// that needs more is split, down to single vertices.
    pub group_bytes: u64,
    /// How long a finished result waits to be fetched.
    pub result_ttl: Duration,
}

/// What an analysis computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Task {
    Embedding,
    Classification,
    LinkPrediction,
}

/// A finished analysis's values.
#[derive(Debug, Clone)]
pub enum Output {
    /// `(targets, dim)` row-major.
    Embeddings { dim: usize, values: Vec<f32> },
    /// `(targets, classes)` softmax probabilities and the argmax class per target.
    Classes {
        classes: usize,
        probabilities: Vec<f32>,
        labels: Vec<i64>,
    },
    /// `sigmoid(h_src . h_dst)` per pair.
    Scores(Vec<f32>),
}

/// A finished analysis.
#[derive(Debug, Clone)]
pub struct Finished {
    pub task: Task,
    pub output: std::result::Result<Output, String>,
    /// From acceptance to completion.
    pub latency: Duration,
    /// Of that, waiting for the window and the batches ahead.
    pub queued: Duration,
}

/// Where a request's result appears: `None` while pending.
pub type ResultWatch = watch::Receiver<Option<Arc<Finished>>>;

struct Job {
    id: u64,
    graph: Arc<ServedGraph>,
    model: Arc<ServedModel>,
    task: Task,
    targets: Targets,
    accepted: Instant,
    /// The working memory its result may take, held until the result is fetched or expires.
    held: Reservation,
}

struct Slot {
    tx: watch::Sender<Option<Arc<Finished>>>,
    finished_at: Option<Instant>,
    /// The request's working memory, once its result is in.
    held: Option<Reservation>,
}

/// Counters of the analysis path.
#[derive(Debug, Clone, Default)]
pub struct ExecStats {
    pub queue_depth: u64,
    pub done: u64,
    pub failed: u64,
    pub vertices_embedded: u64,
    pub embedding_hits: u64,
    pub embedding_misses: u64,
    pub embedding_cache_bytes: u64,
    pub embedding_cache_used: u64,
    /// Feature bytes read from disk (page-cache misses).
    pub bytes_read: u64,
}

/// Key of a cached embedding: model registration, graph, graph epoch, vertex.
type EmbeddingKey = (u64, u64, u64, u32);

struct Shared {
    config: ExecConfig,
    page_cache: Arc<PageCache>,
    embeddings: Mutex<Lru<EmbeddingKey, Arc<[f32]>>>,
    results: Mutex<HashMap<u64, Slot>>,
    next_id: AtomicU64,
    queue_depth: AtomicU64,
    done: AtomicU64,
    failed: AtomicU64,
    vertices_embedded: AtomicU64,
    bytes_read: AtomicU64,
}

/// Accepts analyses and runs them on one scheduler thread.
pub struct Executor {
    tx: Mutex<Option<Sender<Job>>>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Executor {
    /// Starts the scheduler thread.
    pub fn start(config: ExecConfig, page_cache: Arc<PageCache>) -> Executor {
        let (tx, rx) = crossbeam_channel::unbounded();
        let shared = Arc::new(Shared {
            embeddings: Mutex::new(Lru::new(config.embedding_cache_bytes)),
            config,
            page_cache,
            results: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            queue_depth: AtomicU64::new(0),
            done: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            vertices_embedded: AtomicU64::new(0),
            bytes_read: AtomicU64::new(0),
        });
        let worker = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("strata-serve-scheduler".into())
            .spawn(move || run(&worker, &rx))
            .expect("spawn the scheduler thread");
        Executor {
            tx: Mutex::new(Some(tx)),
            shared,
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Queues an analysis of `targets` (internal ids, checked) and returns its request id;
    /// `held` (the memory its result may take) is released once the result is fetched or
    /// expires.
    pub fn submit(
        &self,
        graph: Arc<ServedGraph>,
        model: Arc<ServedModel>,
        task: Task,
        targets: Targets,
        held: Reservation,
    ) -> Result<u64> {
        let tx = self.tx.lock().unwrap();
        let tx = tx.as_ref().ok_or_else(|| {
            ServeError::Unavailable("the server is shutting down; no new analyses".into())
        })?;
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let (slot_tx, _) = watch::channel(None);
        self.shared.results.lock().unwrap().insert(
            id,
            Slot {
                tx: slot_tx,
                finished_at: None,
                held: None,
            },
        );
        self.shared.queue_depth.fetch_add(1, Ordering::AcqRel);
        let job = Job {
            id,
            graph,
            model,
            task,
            targets,
            accepted: Instant::now(),
            held,
        };
        tx.send(job).expect("the scheduler outlives the sender");
        Ok(id)
    }

    /// Where request `id`'s result will appear.
    pub fn watch(&self, id: u64) -> Result<ResultWatch> {
        self.shared
            .results
            .lock()
            .unwrap()
            .get(&id)
            .map(|s| s.tx.subscribe())
            .ok_or_else(|| {
                ServeError::NotFound(format!(
                    "analysis request {id} is unknown (never issued, already fetched, or expired after {} s)",
                    self.shared.config.result_ttl.as_secs()
                ))
            })
    }

    /// Drops a delivered result.
    pub fn forget(&self, id: u64) {
        self.shared.results.lock().unwrap().remove(&id);
    }

    pub fn stats(&self) -> ExecStats {
        let s = &self.shared;
        let cache = s.embeddings.lock().unwrap();
        ExecStats {
            queue_depth: s.queue_depth.load(Ordering::Acquire),
            done: s.done.load(Ordering::Relaxed),
            failed: s.failed.load(Ordering::Relaxed),
            vertices_embedded: s.vertices_embedded.load(Ordering::Relaxed),
            embedding_hits: cache.hits(),
            embedding_misses: cache.misses(),
            embedding_cache_bytes: s.config.embedding_cache_bytes,
            embedding_cache_used: cache.used_bytes(),
            bytes_read: s.bytes_read.load(Ordering::Relaxed),
        }
    }

    /// Stops accepting analyses, finishes the queued ones, and stops the thread.
    pub fn shutdown(&self) {
        self.tx.lock().unwrap().take();
        if let Some(t) = self.thread.lock().unwrap().take() {
            let _ = t.join();
        }
    }
}

impl Drop for Executor {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn run(shared: &Shared, rx: &Receiver<Job>) {
    // The input rows of a group, reused: a fresh multi-MB buffer per group is a fresh mapping
    // (large allocations are mmap'ed), and faulting its pages in cost more than the copy.
    let mut x: Vec<f32> = Vec::new();
    while let Ok(first) = rx.recv() {
        let deadline = Instant::now() + shared.config.window;
        let mut batch = vec![first];
        while batch.len() < shared.config.max_batch {
            match rx.recv_deadline(deadline) {
                Ok(job) => batch.push(job),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => break,
            }
        }
        run_batch(shared, batch, &mut x);
        expire(shared);
    }
}

/// Drops results nobody fetched within the TTL.
fn expire(shared: &Shared) {
    let ttl = shared.config.result_ttl;
    shared
        .results
        .lock()
        .unwrap()
        .retain(|_, slot| slot.finished_at.is_none_or(|t| t.elapsed() < ttl));
}

/// Runs a window's jobs, one (graph, model) share at a time (Alg. 1 line 2).
fn run_batch(shared: &Shared, batch: Vec<Job>, x: &mut Vec<f32>) {
    let mut shares: Vec<Vec<Job>> = Vec::new();
    for job in batch {
        let same =
            |s: &Vec<Job>| Arc::ptr_eq(&s[0].graph, &job.graph) && s[0].model.id == job.model.id;
        match shares.iter_mut().find(|s| same(s)) {
            Some(share) => share.push(job),
            None => shares.push(vec![job]),
        }
    }
    for share in shares {
        let started = Instant::now();
        match run_share(shared, &share, x) {
            Ok(outputs) => {
                for (job, output) in share.into_iter().zip(outputs) {
                    finish(shared, job, Ok(output), started);
                }
            }
            // One request's failure (a vertex whose neighbourhood does not fit the executor's
            // memory, say) must not fail the others it was batched with: run each alone.
            Err(e) if share.len() == 1 => {
                let job = share.into_iter().next().unwrap();
                finish(shared, job, Err(e.to_string()), started);
            }
            Err(_) => {
                for job in share {
                    let output = run_share(shared, std::slice::from_ref(&job), x)
                        .map(|mut outs| outs.remove(0))
                        .map_err(|e| e.to_string());
                    finish(shared, job, output, started);
                }
            }
        }
    }
}

fn finish(
    shared: &Shared,
    job: Job,
    output: std::result::Result<Output, String>,
    started: Instant,
) {
    let counter = if output.is_ok() {
        &shared.done
    } else {
        &shared.failed
    };
    counter.fetch_add(1, Ordering::Relaxed);
    let finished = Arc::new(Finished {
        task: job.task,
        output,
        latency: job.accepted.elapsed(),
        queued: started.saturating_duration_since(job.accepted),
    });
    if let Some(slot) = shared.results.lock().unwrap().get_mut(&job.id) {
        slot.tx.send_replace(Some(finished));
        slot.finished_at = Some(Instant::now());
        slot.held = Some(job.held);
    }
    shared.queue_depth.fetch_sub(1, Ordering::AcqRel);
}

/// Embeds the distinct vertices of a share group by group, then answers each job; `x` is
/// scratch for the groups' input rows.
fn run_share(shared: &Shared, share: &[Job], x: &mut Vec<f32>) -> Result<Vec<Output>> {
    let graph = &share[0].graph;
    let model = &share[0].model;
    let arch = model.model.architecture();
    let targets: Vec<Targets> = share.iter().map(|j| j.targets.clone()).collect();
    let plan = plan(&targets, &shared.config.schedule)?;
    let sampler = NeighborSampler::new(SamplerConfig {
        fanouts: arch.fanouts.clone(),
        seed: shared.config.sample_seed,
        threads: 0,
        ..SamplerConfig::default()
    })?;
    let mut table: HashMap<u32, Arc<[f32]>> = HashMap::new();
    for group in &plan.groups {
        embed_group(shared, graph, model, &sampler, group, &mut table, x)?;
    }
    // The mapping table addresses embeddings by position in the concatenated groups.
    let order: Vec<u32> = plan.groups.concat();
    let rows: Vec<&[f32]> = order.iter().map(|v| &*table[v]).collect();
    share
        .iter()
        .zip(&plan.requests)
        .map(|(job, map)| answer(job.task, map, &rows, arch.out_dim))
        .collect()
}

/// Embeddings of `group` into `table`: from the cache, else one fused sample + forward
/// (`x` is scratch for the input rows). A group whose sample, rows and activations need more
/// than `group_bytes` is embedded in halves; a single vertex that needs more fails.
fn embed_group(
    shared: &Shared,
    graph: &ServedGraph,
    model: &ServedModel,
    sampler: &NeighborSampler,
    group: &[u32],
    table: &mut HashMap<u32, Arc<[f32]>>,
    x: &mut Vec<f32>,
) -> Result<()> {
    let epoch = graph.epoch();
    let key = |v: u32| (model.id, graph.uid, epoch, v);
    let mut need = Vec::with_capacity(group.len());
    {
        let mut cache = shared.embeddings.lock().unwrap();
        for &v in group {
            match cache.get(&key(v)) {
                Some(e) => {
                    table.insert(v, Arc::clone(e));
                }
                None => need.push(v),
            }
        }
    }
    if need.is_empty() {
        return Ok(());
    }
    let sample = graph.with_view(|view| sampler.sample(view, &need, ANALYSIS_BATCH_KEY))?;
    let arch = model.model.architecture();
    let bytes = group_bytes(&sample, arch);
    if bytes > shared.config.group_bytes {
        drop(sample);
        if need.len() == 1 {
            return Err(ServeError::ResourceExhausted(format!(
                "vertex {}: its sampled neighbourhood (fanouts {:?}) needs {bytes} bytes for its rows and activations, more than the {} bytes of the executor's share of --memory",
                graph.to_external(&need)[0],
                arch.fanouts,
                shared.config.group_bytes
            )));
        }
        let (a, b) = need.split_at(need.len() / 2);
        embed_group(shared, graph, model, sampler, a, table, x)?;
        return embed_group(shared, graph, model, sampler, b, table, x);
    }
    let dim = graph.feature_dim();
    x.clear();
    x.resize(sample.nodes.len() * dim, 0.0);
    let read = graph.gather(
        &shared.page_cache,
        &sample.nodes,
        bytemuck::cast_slice_mut(x),
    )?;
    shared.bytes_read.fetch_add(read, Ordering::Relaxed);
    let out = model.model.forward(&sample.blocks, x)?;
    let width = model.model.architecture().out_dim;
    shared
        .vertices_embedded
        .fetch_add(need.len() as u64, Ordering::Relaxed);
    let mut cache = shared.embeddings.lock().unwrap();
    for (i, &v) in need.iter().enumerate() {
        let e: Arc<[f32]> = Arc::from(&out[i * width..(i + 1) * width]);
        cache.insert(key(v), Arc::clone(&e), (width * 4 + 64) as u64);
        table.insert(v, e);
    }
    Ok(())
}

/// Upper bound of the memory a fused group takes: its sample (local ids, node list, blocks),
/// its input rows, and the forward's activations (the input of a layer, its aggregate and its
/// output alive at once, each at most as wide as the widest of the model's widths).
fn group_bytes(sample: &strata_graph::Sample, arch: &crate::model::Architecture) -> u64 {
    let nodes = sample.nodes.len() as u64;
    let edges: u64 = sample.blocks.iter().map(|b| b.indices.len() as u64).sum();
    let widest = arch.in_dim.max(arch.hidden_dim).max(arch.out_dim) as u64;
    nodes * (28 + 4 * (arch.in_dim as u64 + 3 * widest)) + edges * 12
}

/// One job's answer from the embeddings (the prediction commands of Alg. 1); `rows[p]` is
/// the embedding at position `p` of the plan's concatenated groups.
fn answer(task: Task, map: &RequestMap, rows: &[&[f32]], width: usize) -> Result<Output> {
    let row = |p: &u32| -> &[f32] { rows[*p as usize] };
    Ok(match (task, map) {
        (Task::Embedding, RequestMap::Nodes(vs)) => Output::Embeddings {
            dim: width,
            values: vs.iter().flat_map(|v| row(v).iter().copied()).collect(),
        },
        (Task::Classification, RequestMap::Nodes(vs)) => {
            let mut probabilities = Vec::with_capacity(vs.len() * width);
            let mut labels = Vec::with_capacity(vs.len());
            for v in vs {
                let logits = row(v);
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let exps: Vec<f32> = logits.iter().map(|&z| (z - max).exp()).collect();
                let sum: f32 = exps.iter().sum();
                probabilities.extend(exps.iter().map(|e| e / sum));
                let best = logits
                    .iter()
                    .enumerate()
                    .fold(0, |b, (i, &z)| if z > logits[b] { i } else { b });
                labels.push(best as i64);
            }
            Output::Classes {
                classes: width,
                probabilities,
                labels,
            }
        }
        (Task::LinkPrediction, RequestMap::Links(pairs)) => Output::Scores(
            pairs
                .iter()
                .map(|(u, v)| {
                    let dot: f32 = row(u).iter().zip(row(v)).map(|(a, b)| a * b).sum();
                    1.0 / (1.0 + (-dot).exp())
                })
                .collect(),
        ),
        _ => {
            return Err(ServeError::InvalidArgument(
                "task: link prediction needs pairs, node tasks need nodes".into(),
            ))
        }
    })
}
