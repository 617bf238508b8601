//! The gRPC service: each RPC checks its request, runs the blocking work off the async
//! runtime, and maps errors to status codes (`wire.rs`).

use std::path::Path;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use prost::Message;
use strata_graph::{NeighborSampler, SamplerConfig};
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::error::{Result, ServeError};
use crate::executor::{Finished, Output, Task};
use crate::graph::{Applied, Change, Pending, ServedGraph};
use crate::memory::{self, Reservation, SampleBound};
use crate::proto::graph_learning_server::GraphLearning;
use crate::proto::{self, ResultState};
use crate::schedule::Targets;
use crate::shared::{graph_info, model_info, Core};
use crate::{service_embed, wire};
use strata_graph::order::glist::ReorderParams;

/// Longest a `GetAnalysisResult` may wait, so a drain is never held up for long.
const MAX_WAIT: Duration = Duration::from_secs(60);
/// Memory a mutation or registration takes, as a multiple of its encoded request: the decoded
/// values, the checked copy, the log record, the log's write batch, the staged layer's rows.
const MUTATION_COPIES: u64 = 5;
/// A batch of mutations holds one more: the layer its later mutations are checked against.
const BATCH_COPIES: u64 = MUTATION_COPIES + 1;
/// Copies of a finished analysis's result held until it is sent: the result, its message, and
/// the message encoded.
const RESULT_COPIES: u64 = 3;
/// Bytes the scheduler holds per analysis target besides its embedding: plan entries, the
/// mapping table, the request's ids.
const TARGET_OVERHEAD: u64 = 64;
/// A mutation whose request is at most this many bytes is checked and staged on the async
/// runtime's thread (a few microseconds: handing it to a blocking thread and back costs more
/// than the work); a larger one on a blocking thread, so it never holds up other connections.
const STAGE_INLINE_BYTES: u64 = 16 << 10;
/// Rows of one `StreamFeatures` message, at most this many bytes (the message limit may be
/// lower).
const STREAM_CHUNK_BYTES: u64 = 4 << 20;

/// The tonic service over a shared core.
#[derive(Clone)]
pub struct Service {
    pub core: Arc<Core>,
}

impl Service {
    /// Runs `f` on a blocking thread after the rate limit, counting request and response bytes.
    /// A `mutating` call (a mutation or a registration, refused while draining) holds
    /// [`MUTATION_COPIES`] times its request from the working memory while it runs; `f`
    /// bounds and reserves its reply itself, before building it.
    async fn call<Req, Resp, F>(
        &self,
        req: Request<Req>,
        mutating: bool,
        what: &'static str,
        f: F,
    ) -> std::result::Result<Response<Resp>, Status>
    where
        Req: Message + Send + 'static,
        Resp: Message + Send + 'static,
        F: FnOnce(&Core, Req) -> Result<Resp> + Send + 'static,
    {
        let (core, req, _, held) = self.admit(req, mutating.then_some(MUTATION_COPIES), what)?;
        let resp = tokio::task::spawn_blocking(move || {
            let r = f(&core, req);
            drop(held);
            if let Ok(resp) = &r {
                core.bytes_out
                    .fetch_add(resp.encoded_len() as u64, Ordering::Relaxed);
            }
            r
        })
        .await
        .map_err(|e| Status::internal(format!("request handler failed: {e}")))??;
        Ok(Response::new(resp))
    }

    /// The start of every call: the rate limit, the byte count, and for a mutating call (one
    /// that holds `copies` of its request from the working memory while it runs) the drain
    /// check and that hold. Returns the core, the request, its encoded size and the hold.
    fn admit<Req: Message>(
        &self,
        req: Request<Req>,
        copies: Option<u64>,
        what: &'static str,
    ) -> Result<(Arc<Core>, Req, u64, Option<Reservation>)> {
        let core = Arc::clone(&self.core);
        core.admit()?;
        if copies.is_some() {
            core.not_draining()?;
        }
        let req = req.into_inner();
        let size = req.encoded_len() as u64;
        core.bytes_in.fetch_add(size, Ordering::Relaxed);
        let held = match copies {
            Some(copies) => Some(core.working.reserve(size.saturating_mul(copies), what)?),
            None => None,
        };
        Ok((core, req, size, held))
    }

    /// A mutation (holding `copies` of its request from the working memory): `stage` checks
    /// it and stages it in the graph's log (see [`STAGE_INLINE_BYTES`] for which thread runs
    /// it), then the call waits for its group's flush without holding a thread, and `reply`
    /// builds the acknowledgement.
    async fn mutation<Req, Resp, T>(
        &self,
        req: Request<Req>,
        what: &'static str,
        copies: u64,
        stage: fn(&Core, Req) -> Result<Pending<T>>,
        reply: fn(T) -> Resp,
    ) -> std::result::Result<Response<Resp>, Status>
    where
        Req: Message + Send + 'static,
        Resp: Message,
        T: Send + 'static,
    {
        let (core, req, size, held) = self.admit(req, Some(copies), what)?;
        let pending = if size <= STAGE_INLINE_BYTES {
            stage(&core, req)?
        } else {
            let core = Arc::clone(&core);
            tokio::task::spawn_blocking(move || stage(&core, req))
                .await
                .map_err(|e| Status::internal(format!("request handler failed: {e}")))??
        };
        let resp = reply(pending.applied().await?);
        drop(held);
        core.bytes_out
            .fetch_add(resp.encoded_len() as u64, Ordering::Relaxed);
        Ok(Response::new(resp))
    }
}

impl Service {
    /// `AddEdge` and `RemoveEdge`: one request shape, two changes.
    async fn edge_mutation(
        &self,
        req: Request<proto::EdgeRequest>,
        stage: fn(&Core, proto::EdgeRequest) -> Result<Pending<Applied>>,
    ) -> std::result::Result<Response<proto::MutationResponse>, Status> {
        self.mutation(
            req,
            "an edge mutation",
            MUTATION_COPIES,
            stage,
            mutation_response,
        )
        .await
    }
}

/// The change an `AddVertex` request on graph `g` asks for.
fn add_vertex_change(core: &Core, g: &ServedGraph, r: proto::AddVertexRequest) -> Result<Change> {
    let (features, count) =
        wire::f32_matrix(r.features.as_ref(), "features", None, g.feature_dim())?;
    core.check_ids(count, "features")?;
    Ok(Change::AddVertices { count, features })
}

/// The change a `RemoveVertex` request asks for.
fn remove_vertex_change(core: &Core, r: proto::RemoveVertexRequest) -> Result<Change> {
    core.check_ids(r.ids.len(), "ids")?;
    Ok(Change::RemoveVertices { ids: r.ids })
}

/// The change an `UpdateVertex` request on graph `g` asks for.
fn update_vertex_change(
    core: &Core,
    g: &ServedGraph,
    r: proto::UpdateVertexRequest,
) -> Result<Change> {
    core.check_ids(r.ids.len(), "ids")?;
    let (features, _) = wire::f32_matrix(
        r.features.as_ref(),
        "features",
        Some(r.ids.len()),
        g.feature_dim(),
    )?;
    Ok(Change::UpdateVertices {
        ids: r.ids,
        features,
    })
}

/// The change an `AddEdge` (`add`) or `RemoveEdge` request asks for.
fn edge_change(core: &Core, r: proto::EdgeRequest, add: bool) -> Result<Change> {
    core.check_ids(r.src.len(), "src")?;
    let (src, dst) = (r.src, r.dst);
    Ok(if add {
        Change::AddEdges { src, dst }
    } else {
        Change::RemoveEdges { src, dst }
    })
}

/// The change one mutation of a `Mutate` batch on graph `g` (named `graph`) asks for.
fn batch_change(core: &Core, g: &ServedGraph, graph: &str, m: proto::Mutation) -> Result<Change> {
    use proto::mutation::Kind;
    let kind = m.kind.ok_or_else(|| {
        ServeError::InvalidArgument(
            "kind: missing; set one of add_vertex, remove_vertex, update_vertex, add_edge, \
             remove_edge"
                .into(),
        )
    })?;
    let named = match &kind {
        Kind::AddVertex(r) => &r.graph,
        Kind::RemoveVertex(r) => &r.graph,
        Kind::UpdateVertex(r) => &r.graph,
        Kind::AddEdge(r) | Kind::RemoveEdge(r) => &r.graph,
    };
    if !named.is_empty() && named != graph {
        return Err(ServeError::InvalidArgument(format!(
            "graph: '{named}', but the batch is on graph '{graph}'; leave it empty or the same"
        )));
    }
    match kind {
        Kind::AddVertex(r) => add_vertex_change(core, g, r),
        Kind::RemoveVertex(r) => remove_vertex_change(core, r),
        Kind::UpdateVertex(r) => update_vertex_change(core, g, r),
        Kind::AddEdge(r) => edge_change(core, r, true),
        Kind::RemoveEdge(r) => edge_change(core, r, false),
    }
}

fn mutation_response(a: Applied) -> proto::MutationResponse {
    proto::MutationResponse {
        applied: a.applied,
        lsn: a.lsn,
    }
}

/// A `Finished` (or pending) result as its message.
fn result_message(id: u64, finished: Option<&Finished>) -> proto::AnalysisResult {
    let mut r = proto::AnalysisResult {
        request_id: id,
        state: ResultState::Pending as i32,
        ..Default::default()
    };
    let Some(f) = finished else { return r };
    r.task = match f.task {
        Task::Embedding => proto::Task::NodeEmbedding,
        Task::Classification => proto::Task::NodeClassification,
        Task::LinkPrediction => proto::Task::LinkPrediction,
    } as i32;
    r.latency_us = f.latency.as_micros() as u64;
    r.queued_us = f.queued.as_micros() as u64;
    match &f.output {
        Err(msg) => {
            r.state = ResultState::Failed as i32;
            r.error = msg.clone();
        }
        Ok(out) => {
            r.state = ResultState::Done as i32;
            match out {
                Output::Embeddings { dim, values } => {
                    r.values = Some(wire::f32_tensor(values, values.len() / dim.max(&1), *dim))
                }
                Output::Classes {
                    classes,
                    probabilities,
                    labels,
                } => {
                    r.values = Some(wire::f32_tensor(probabilities, labels.len(), *classes));
                    r.labels = labels.clone();
                }
                Output::Scores(s) => r.scores = s.clone(),
            }
        }
    }
    r
}

fn reorder_params(o: Option<&proto::ReorderOptions>) -> Option<ReorderParams> {
    let o = o.filter(|o| o.enabled)?;
    let defaults = ReorderParams::default();
    Some(ReorderParams {
        hops: if o.hops == 0 { defaults.hops } else { o.hops },
        centers: o.centers as usize,
        max_degree: o.max_degree,
        sample_above: o.sample_above as usize,
        seed: o.seed,
    })
}

type ResultStream =
    Pin<Box<dyn Stream<Item = std::result::Result<proto::AnalysisResult, Status>> + Send>>;
type FeatureStream = Pin<Box<dyn Stream<Item = std::result::Result<proto::Tensor, Status>> + Send>>;

/// The feature rows of internal ids `ids` as a `(len, dim)` FLOAT32 tensor, gathered straight
/// into the message's bytes.
fn features_tensor(core: &Core, g: &ServedGraph, ids: &[u32]) -> Result<proto::Tensor> {
    let dim = g.feature_dim();
    let mut data = vec![0u8; ids.len() * dim * 4];
    g.gather(&core.page_cache, ids, &mut data)?;
    Ok(wire::f32_tensor_bytes(data, ids.len(), dim))
}

/// What sampling `seeds` (internal, distinct or not yet checked) with `fanouts` can grow to on
/// `g` now: the first hop's edges exactly (each seed keeps at most `fanout` of its in-edges),
/// later hops bounded by [`SampleBound::of`].
fn sample_bound(g: &ServedGraph, seeds: &[u32], fanouts: &[i32]) -> SampleBound {
    g.with_view(|view| {
        let (n, e) = (view.num_nodes() as u64, view.num_edges());
        let start = SampleBound::seeds(seeds.len() as u64);
        let Some((&first, rest)) = fanouts.split_first() else {
            return start;
        };
        let cap = if first < 0 { u64::MAX } else { first as u64 };
        let first_edges: u64 = seeds
            .iter()
            .map(|&v| (view.in_neighbors(v).len() as u64).min(cap))
            .sum();
        start.hop(first_edges, n).hops(rest, n, e)
    })
}

/// Upper bound of an `AnalysisResult` of `rows` targets (pairs) of `task` from a model with
/// `width` outputs.
fn result_bytes(task: Task, rows: u64, width: u64) -> u64 {
    let values = match task {
        Task::Embedding => memory::tensor_bytes(rows, width, 4),
        Task::Classification => {
            memory::tensor_bytes(rows, width, 4).saturating_add(memory::u64s_bytes(rows))
        }
        Task::LinkPrediction => memory::tensor_bytes(rows, 1, 4),
    };
    values.saturating_add(memory::tensor_bytes(0, 0, 0))
}

#[tonic::async_trait]
impl GraphLearning for Service {
    async fn graph_register(
        &self,
        req: Request<proto::GraphRegisterRequest>,
    ) -> std::result::Result<Response<proto::GraphInfo>, Status> {
        self.call(req, true, "GraphRegister", |core, r| {
            if r.store_path.is_empty() {
                return Err(ServeError::InvalidArgument("store_path: missing".into()));
            }
            let params = reorder_params(r.reorder.as_ref());
            let path = core.limits.roots.resolve("store_path", &r.store_path)?;
            let g = core
                .registry
                .register_graph(&r.name, &path, params.as_ref())?;
            Ok(graph_info(&g.status()))
        })
        .await
    }

    async fn graph_unregister(
        &self,
        req: Request<proto::GraphUnregisterRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.call(req, true, "GraphUnregister", |core, r| {
            let g = core.registry.unregister_graph(&r.name)?;
            core.page_cache.forget_file(g.features_file_id());
            Ok(proto::Empty {})
        })
        .await
    }

    async fn model_register(
        &self,
        req: Request<proto::ModelRegisterRequest>,
    ) -> std::result::Result<Response<proto::ModelInfo>, Status> {
        self.call(req, true, "ModelRegister", |core, r| {
            crate::registered::check_name(&r.name, "model")?;
            let arch = wire::architecture(r.architecture.as_ref())?;
            let precision = wire::precision(r.precision)?;
            let format = (!r.format.is_empty()).then_some(r.format.as_str());
            let mut allowance = core.model_load_allowance();
            let m = match &r.source {
                Some(proto::model_register_request::Source::Path(p)) => {
                    let path = core.limits.roots.resolve("path", p)?;
                    // Errors name the path as the client sent it, not where it resolved.
                    let bytes = crate::model::file::read_file(&path, p, &mut allowance)?;
                    core.registry.register_model(
                        &r.name,
                        &bytes,
                        format,
                        arch,
                        precision,
                        Some(Path::new(p)),
                        &mut allowance,
                    )?
                }
                Some(proto::model_register_request::Source::Data(bytes)) => {
                    core.registry.register_model(
                        &r.name,
                        bytes,
                        format,
                        arch,
                        precision,
                        None,
                        &mut allowance,
                    )?
                }
                None => {
                    return Err(ServeError::InvalidArgument(
                        "source: give a path or the file's bytes".into(),
                    ))
                }
            };
            Ok(model_info(&m))
        })
        .await
    }

    async fn model_unregister(
        &self,
        req: Request<proto::ModelUnregisterRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.call(req, true, "ModelUnregister", |core, r| {
            core.registry.unregister_model(&r.name)?;
            Ok(proto::Empty {})
        })
        .await
    }

    async fn add_vertex(
        &self,
        req: Request<proto::AddVertexRequest>,
    ) -> std::result::Result<Response<proto::AddVertexResponse>, Status> {
        self.mutation(
            req,
            "AddVertex",
            MUTATION_COPIES,
            |core, r| {
                let g = core.registry.graph(&r.graph)?;
                g.stage(&add_vertex_change(core, &g, r)?)
            },
            |a| proto::AddVertexResponse {
                ids: a.new_ids,
                lsn: a.lsn,
            },
        )
        .await
    }

    async fn remove_vertex(
        &self,
        req: Request<proto::RemoveVertexRequest>,
    ) -> std::result::Result<Response<proto::MutationResponse>, Status> {
        self.mutation(
            req,
            "RemoveVertex",
            MUTATION_COPIES,
            |core, r| {
                let g = core.registry.graph(&r.graph)?;
                g.stage(&remove_vertex_change(core, r)?)
            },
            mutation_response,
        )
        .await
    }

    async fn update_vertex(
        &self,
        req: Request<proto::UpdateVertexRequest>,
    ) -> std::result::Result<Response<proto::MutationResponse>, Status> {
        self.mutation(
            req,
            "UpdateVertex",
            MUTATION_COPIES,
            |core, r| {
                let g = core.registry.graph(&r.graph)?;
                g.stage(&update_vertex_change(core, &g, r)?)
            },
            mutation_response,
        )
        .await
    }

    async fn add_edge(
        &self,
        req: Request<proto::EdgeRequest>,
    ) -> std::result::Result<Response<proto::MutationResponse>, Status> {
        self.edge_mutation(req, |core, r| {
            let g = core.registry.graph(&r.graph)?;
            g.stage(&edge_change(core, r, true)?)
        })
        .await
    }

    async fn remove_edge(
        &self,
        req: Request<proto::EdgeRequest>,
    ) -> std::result::Result<Response<proto::MutationResponse>, Status> {
        self.edge_mutation(req, |core, r| {
            let g = core.registry.graph(&r.graph)?;
            g.stage(&edge_change(core, r, false)?)
        })
        .await
    }

    async fn mutate(
        &self,
        req: Request<proto::MutateRequest>,
    ) -> std::result::Result<Response<proto::MutateResponse>, Status> {
        self.mutation(
            req,
            "Mutate",
            BATCH_COPIES,
            |core, r| {
                let g = core.registry.graph(&r.graph)?;
                let mut ids = 0usize;
                let mut changes = Vec::with_capacity(r.mutations.len());
                for (i, m) in r.mutations.into_iter().enumerate() {
                    let change = batch_change(core, &g, &r.graph, m)
                        .map_err(|e| e.within(&format!("mutations[{i}]")))?;
                    ids = ids.saturating_add(change.ids());
                    changes.push(change);
                }
                // The limit is per request: a batch does not multiply it.
                core.check_ids(ids, "mutations (all together)")?;
                g.stage_batch(&changes)
            },
            |applied| proto::MutateResponse {
                // A batch is never empty, and all of it has one lsn.
                lsn: applied.first().map_or(0, |a| a.lsn),
                results: applied
                    .into_iter()
                    .map(|a| proto::MutationResult {
                        applied: a.applied,
                        ids: a.new_ids,
                    })
                    .collect(),
            },
        )
        .await
    }

    async fn graph_analysis(
        &self,
        req: Request<proto::GraphAnalysisRequest>,
    ) -> std::result::Result<Response<proto::GraphAnalysisResponse>, Status> {
        self.call(req, false, "GraphAnalysis", |core, r| {
            core.not_draining()?;
            let g = core.registry.graph(&r.graph)?;
            let m = core.registry.model(&r.model)?;
            let arch = m.model.architecture();
            if arch.in_dim != g.feature_dim() {
                return Err(ServeError::FailedPrecondition(format!(
                    "model '{}' takes {}-wide inputs but graph '{}' has {}-wide features",
                    m.name,
                    arch.in_dim,
                    r.graph,
                    g.feature_dim()
                )));
            }
            core.check_ids(r.targets.len() + r.targets_dst.len(), "targets")?;
            if r.targets.is_empty() {
                return Err(ServeError::InvalidArgument(
                    "targets: empty; give at least one".into(),
                ));
            }
            let (task, targets) = match proto::Task::try_from(r.task) {
                Ok(proto::Task::NodeEmbedding | proto::Task::NodeClassification) => {
                    if !r.targets_dst.is_empty() {
                        return Err(ServeError::InvalidArgument(
                            "targets_dst: only link prediction takes pairs".into(),
                        ));
                    }
                    let task = if r.task == proto::Task::NodeEmbedding as i32 {
                        Task::Embedding
                    } else {
                        Task::Classification
                    };
                    (task, Targets::Nodes(g.to_internal(&r.targets, "targets")?))
                }
                Ok(proto::Task::LinkPrediction) => {
                    if r.targets.len() != r.targets_dst.len() {
                        return Err(ServeError::InvalidArgument(format!(
                            "targets_dst: {} destinations for {} sources; they must pair up",
                            r.targets_dst.len(),
                            r.targets.len()
                        )));
                    }
                    let src = g.to_internal(&r.targets, "targets")?;
                    let dst = g.to_internal(&r.targets_dst, "targets_dst")?;
                    (
                        Task::LinkPrediction,
                        Targets::Links(src.into_iter().zip(dst).collect()),
                    )
                }
                _ => {
                    return Err(ServeError::InvalidArgument(format!(
                    "task: expected NODE_EMBEDDING, NODE_CLASSIFICATION or LINK_PREDICTION, got {}",
                    r.task
                )))
                }
            };
            // The result waits in memory until it is fetched: its size, known now, is checked
            // against the message limit and held from the working memory until then.
            let width = arch.out_dim as u64;
            let rows = r.targets.len() as u64;
            let result = result_bytes(task, rows, width);
            memory::check_reply(result, core.max_message, "GraphAnalysis")?;
            let embeddings =
                (rows + r.targets_dst.len() as u64).saturating_mul(width * 4 + TARGET_OVERHEAD);
            let held = core.working.reserve(
                result
                    .saturating_mul(RESULT_COPIES)
                    .saturating_add(embeddings),
                &format!("GraphAnalysis of {rows} targets"),
            )?;
            let request_id = core.executor.submit(g, m, task, targets, held)?;
            Ok(proto::GraphAnalysisResponse { request_id })
        })
        .await
    }

    async fn get_analysis_result(
        &self,
        req: Request<proto::GetAnalysisResultRequest>,
    ) -> std::result::Result<Response<proto::AnalysisResult>, Status> {
        self.core.admit()?;
        let r = req.into_inner();
        let mut watch = self.core.executor.watch(r.request_id)?;
        let wait = Duration::from_millis(r.wait_ms as u64).min(MAX_WAIT);
        if !wait.is_zero() {
            let _ = tokio::time::timeout(wait, watch.wait_for(Option::is_some)).await;
        }
        let finished = watch.borrow().clone();
        if finished.is_some() {
            self.core.executor.forget(r.request_id);
        }
        let msg = result_message(r.request_id, finished.as_deref());
        self.core
            .bytes_out
            .fetch_add(msg.encoded_len() as u64, Ordering::Relaxed);
        Ok(Response::new(msg))
    }

    type StreamAnalysisResultsStream = ResultStream;

    async fn stream_analysis_results(
        &self,
        req: Request<proto::StreamAnalysisResultsRequest>,
    ) -> std::result::Result<Response<ResultStream>, Status> {
        self.core.admit()?;
        let ids = req.into_inner().request_ids;
        // Every id must exist before anything is streamed.
        let watches = ids
            .iter()
            .map(|&id| self.core.executor.watch(id).map(|w| (id, w)))
            .collect::<Result<Vec<_>>>()?;
        let (tx, rx) = tokio::sync::mpsc::channel(watches.len().max(1));
        for (id, mut watch) in watches {
            let tx = tx.clone();
            let core = Arc::clone(&self.core);
            tokio::spawn(async move {
                if watch.wait_for(Option::is_some).await.is_err() {
                    return;
                }
                let finished = watch.borrow().clone();
                core.executor.forget(id);
                let msg = result_message(id, finished.as_deref());
                core.bytes_out
                    .fetch_add(msg.encoded_len() as u64, Ordering::Relaxed);
                let _ = tx.send(Ok(msg)).await;
            });
        }
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn sample_neighbors(
        &self,
        req: Request<proto::SampleNeighborsRequest>,
    ) -> std::result::Result<Response<proto::SampleNeighborsResponse>, Status> {
        self.call(req, false, "SampleNeighbors", |core, r| {
            let g = core.registry.graph(&r.graph)?;
            core.check_ids(r.seeds.len(), "seeds")?;
            let seeds = g.to_internal(&r.seeds, "seeds")?;
            let bound = sample_bound(&g, &seeds, &r.fanouts);
            let sampler = NeighborSampler::new(SamplerConfig {
                fanouts: r.fanouts,
                seed: r.seed,
                threads: 0,
                ..SamplerConfig::default()
            })?;
            let what = format!(
                "SampleNeighbors of {} seeds (up to {} vertices and {} edges)",
                seeds.len(),
                bound.nodes,
                bound.edges
            );
            let reply = bound.reply_bytes();
            memory::check_reply(reply, core.max_message, &what)?;
            // Checked here, in the client's ids (the sampler would name the internal one), and after
            // the reply's bound, which refuses an oversized request before a set of its seeds is built.
            let mut seen = std::collections::HashSet::with_capacity(r.seeds.len());
            if let Some(v) = r.seeds.iter().find(|&&v| !seen.insert(v)) {
                return Err(ServeError::InvalidArgument(format!(
                    "seeds: must be distinct; vertex {v} appears twice"
                )));
            }
            let _held = core.working.reserve(
                reply
                    .saturating_mul(2)
                    .saturating_add(bound.working_bytes()),
                &what,
            )?;
            let sample = g.with_view(|view| sampler.sample(view, &seeds, r.batch_key))?;
            Ok(proto::SampleNeighborsResponse {
                nodes: g.to_external(&sample.nodes),
                hop_counts: sample.hop_counts.iter().map(|&c| c as u64).collect(),
                blocks: sample
                    .blocks
                    .into_iter()
                    .map(|b| proto::Block {
                        num_src: b.num_src as u64,
                        num_dst: b.num_dst as u64,
                        indptr: b.indptr,
                        indices: b.indices,
                    })
                    .collect(),
            })
        })
        .await
    }

    async fn get_features(
        &self,
        req: Request<proto::GetFeaturesRequest>,
    ) -> std::result::Result<Response<proto::Tensor>, Status> {
        self.call(req, false, "GetFeatures", |core, r| {
            let g = core.registry.graph(&r.graph)?;
            core.check_ids(r.ids.len(), "ids")?;
            let (n, dim) = (r.ids.len(), g.feature_dim());
            let what = format!("GetFeatures of {n} rows of {dim} float32");
            let reply = memory::tensor_bytes(n as u64, dim as u64, 4);
            memory::check_reply(
                reply,
                core.max_message,
                &format!("{what} (StreamFeatures sends any number of rows in pieces)"),
            )?;
            // The reply, its encoded copy, and the internal ids.
            let _held = core
                .working
                .reserve(reply.saturating_mul(2).saturating_add(4 * n as u64), &what)?;
            let ids = g.to_internal(&r.ids, "ids")?;
            features_tensor(core, &g, &ids)
        })
        .await
    }

    type StreamFeaturesStream = FeatureStream;

    async fn stream_features(
        &self,
        req: Request<proto::GetFeaturesRequest>,
    ) -> std::result::Result<Response<FeatureStream>, Status> {
        let core = Arc::clone(&self.core);
        core.admit()?;
        let r = req.into_inner();
        core.bytes_in
            .fetch_add(r.encoded_len() as u64, Ordering::Relaxed);
        let g = core.registry.graph(&r.graph)?;
        core.check_ids(r.ids.len(), "ids")?;
        let dim = g.feature_dim() as u64;
        let row = memory::tensor_bytes(1, dim, 4);
        memory::check_reply(row, core.max_message, "StreamFeatures: one row")?;
        // Pieces of whole rows within the message limit, and small enough that three (one being
        // gathered, one queued for the client, one being encoded) fit in a quarter of the
        // working memory each.
        let piece = STREAM_CHUNK_BYTES
            .min(core.max_message)
            .min(core.working.capacity() / 4);
        let rows_per_piece = (piece.saturating_sub(memory::tensor_bytes(0, 0, 0))
            / (4 * dim).max(1))
        .max(1) as usize;
        let n = r.ids.len();
        let piece = memory::tensor_bytes(rows_per_piece.min(n) as u64, dim, 4);
        let held = core.working.reserve(
            piece.saturating_mul(3).saturating_add(4 * n as u64),
            &format!("StreamFeatures of {n} rows"),
        )?;
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::task::spawn_blocking(move || {
            let _held = held;
            let ids = match g.to_internal(&r.ids, "ids") {
                Ok(ids) => ids,
                Err(e) => {
                    let _ = tx.blocking_send(Err(Status::from(e)));
                    return;
                }
            };
            // An empty request still gets one (0, dim) message, so the client learns the width.
            let pieces: Vec<&[u32]> = if ids.is_empty() {
                vec![&[]]
            } else {
                ids.chunks(rows_per_piece).collect()
            };
            for part in pieces {
                let msg = features_tensor(&core, &g, part).map_err(Status::from);
                let len = msg.as_ref().map_or(0, |t| t.encoded_len() as u64);
                let failed = msg.is_err();
                if tx.blocking_send(msg).is_err() {
                    return; // the client went away
                }
                core.bytes_out.fetch_add(len, Ordering::Relaxed);
                if failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn embedding_register(
        &self,
        req: Request<proto::EmbeddingRegisterRequest>,
    ) -> std::result::Result<Response<proto::EmbeddingInfo>, Status> {
        self.call(req, true, "EmbeddingRegister", service_embed::register)
            .await
    }

    async fn embedding_unregister(
        &self,
        req: Request<proto::EmbeddingUnregisterRequest>,
    ) -> std::result::Result<Response<proto::Empty>, Status> {
        self.call(req, true, "EmbeddingUnregister", service_embed::unregister)
            .await
    }

    async fn embedding_top_k(
        &self,
        req: Request<proto::EmbeddingTopKRequest>,
    ) -> std::result::Result<Response<proto::EmbeddingTopKResponse>, Status> {
        let deadline = service_embed::deadline_of(&req);
        self.call(req, false, "EmbeddingTopK", move |core, r| {
            service_embed::top_k(core, r, deadline)
        })
        .await
    }

    async fn embedding_score(
        &self,
        req: Request<proto::EmbeddingScoreRequest>,
    ) -> std::result::Result<Response<proto::EmbeddingScoreResponse>, Status> {
        let deadline = service_embed::deadline_of(&req);
        self.call(req, false, "EmbeddingScore", move |core, r| {
            service_embed::score(core, r, deadline)
        })
        .await
    }

    async fn embedding_neighbors(
        &self,
        req: Request<proto::EmbeddingNeighborsRequest>,
    ) -> std::result::Result<Response<proto::EmbeddingNeighborsResponse>, Status> {
        let deadline = service_embed::deadline_of(&req);
        self.call(req, false, "EmbeddingNeighbors", move |core, r| {
            service_embed::neighbors(core, r, deadline)
        })
        .await
    }

    async fn status(
        &self,
        req: Request<proto::StatusRequest>,
    ) -> std::result::Result<Response<proto::StatusResponse>, Status> {
        self.call(req, false, "Status", |core, _| Ok(core.status()))
            .await
    }
}
