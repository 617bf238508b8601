//! The server's life: planning the budget ([`crate::budget`]), binding (loopback unless a token is set), the gRPC
//! service, background folds, and a drain on stop (no new analyses or mutations, queued
//! analyses finished, in-flight calls answered).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use strata_graph::embedding_run::EmbeddingBackend;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use tonic::service::interceptor::InterceptedService;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::budget::{self, ServePlan};
use crate::error::{Result, ServeError};
use crate::executor::{ExecConfig, Executor};
use crate::idle::IdleTimeout;
use crate::memory::{self, Kind};
use crate::page_cache::PageCache;
use crate::proto::graph_learning_server::GraphLearningServer;
use crate::registry::Registry;
use crate::service::Service;
use crate::shared::{Core, Limits};
use strata_graph::order::glist::ReorderParams;
use strata_store::budget::Planned;
use strata_store::config::AllSize;
use strata_store::secret::{check_listen_token, constant_time_eq};

/// How often the stop condition and the fold policy are checked.
const TICK: Duration = Duration::from_millis(100);

/// Everything `strata serve` is told.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// `HOST:PORT`; port 0 picks a free one.
    pub listen: String,
    /// Where registered graphs and models live.
    pub state_dir: PathBuf,
    /// The server's whole budget: its runtime, the registered graphs and models, and the
    /// working memory, executor and caches ([`ServePlan`]).
    pub memory: u64,
    /// Whether node embeddings are cached (GLIST's "C"); off, the page cache gets all of
    /// `memory`.
    pub embedding_cache: bool,
    /// Shared secret clients send as `authorization: Bearer TOKEN`; required to listen on a
    /// non-loopback address.
    pub token: Option<String>,
    /// A connection whose client sends nothing for this long is closed; live clients are
    /// pinged at half of it, so only clients that stop answering are dropped.
    pub idle_timeout: Duration,
    /// Largest request or response message, bytes (the plan lowers it to half the working
    /// memory when that is less).
    pub max_message_bytes: usize,
    pub limits: Limits,
    pub exec: ExecConfig,
    /// Fold a graph's log into a new store version once it holds this many records...
    pub fold_records: u64,
    /// ...or once its oldest unfolded record is this old.
    pub fold_after: Duration,
    /// Stores to register before listening, (name, path), unless already registered.
    pub register: Vec<(String, PathBuf)>,
    /// Embedding runs to register before listening, (name, run directory), unless already
    /// registered; each with `embedding_memory` bytes resident (or its whole table).
    pub register_embeddings: Vec<(String, PathBuf)>,
    pub embedding_memory: AllSize,
    /// How to re-order them (GLIST Alg. 2); None keeps their numbering.
    pub reorder: Option<ReorderParams>,
}

/// What a stopped server reports.
#[derive(Debug, Clone)]
pub struct ServeSummary {
    pub addr: SocketAddr,
    pub seconds: f64,
    pub status: crate::proto::StatusResponse,
    pub folds: u64,
}

/// Checks the bearer token of every call.
#[derive(Clone)]
struct TokenCheck(Option<Arc<str>>);

impl Interceptor for TokenCheck {
    fn call(&mut self, req: Request<()>) -> std::result::Result<Request<()>, Status> {
        let Some(token) = &self.0 else { return Ok(req) };
        let given = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok());
        match given.and_then(|v| v.strip_prefix("Bearer ")) {
            Some(t) if constant_time_eq(t.as_bytes(), token.as_bytes()) => Ok(req),
            Some(_) => Err(Status::unauthenticated("wrong token")),
            None => Err(Status::unauthenticated(
                "this server needs a token: send 'authorization: Bearer TOKEN'",
            )),
        }
    }
}

fn resolve_listen(listen: &str) -> Result<SocketAddr> {
    use std::net::ToSocketAddrs;
    listen
        .to_socket_addrs()
        .map_err(|e| {
            ServeError::InvalidArgument(format!("listen: cannot resolve {listen:?}: {e}"))
        })?
        .next()
        .ok_or_else(|| {
            ServeError::InvalidArgument(format!("listen: {listen:?} resolves to no address"))
        })
}

/// Makes the server's threads allocate from one malloc arena. With glibc's default (up to 8
/// per core), each RPC thread that reads pages gets an arena of its own, and the 16 KiB pages
/// the cache evicts stay resident as free space in the arena that allocated them while the
/// pages that replace them come from another: at `--memory 32M` the server held ~20 MiB more
/// (a second copy of its 18 MiB page cache) for every thread that joined in. The server's
/// threads mostly wait for the SSD and the network, so one arena's lock costs little.
fn share_one_malloc_arena() {
    // SAFETY: mallopt only adjusts allocator parameters; arenas made before it stay in use.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Runs the server until `should_stop` says so (polled on the calling thread every 100 ms,
/// so it may check for signals); `on_ready(addr, plan)` is called once it listens. Embedding
/// runs are opened with `backend` (without one, none can be registered).
pub fn serve(
    cfg: &ServeConfig,
    backend: Option<Arc<dyn EmbeddingBackend>>,
    on_ready: impl FnOnce(SocketAddr, ServePlan),
    should_stop: impl Fn() -> bool,
) -> Result<ServeSummary> {
    share_one_malloc_arena();
    let addr = resolve_listen(&cfg.listen)?;
    check_listen_token(&addr, cfg.token.as_deref(), "--token or STRATA_SERVE_TOKEN")
        .map_err(ServeError::InvalidArgument)?;
    let registry = Registry::open(&cfg.state_dir, backend)?;
    let plan_for = |graphs: u64, models: u64, embeddings: u64| {
        budget::plan(
            cfg.memory,
            budget::Registered {
                graphs,
                models,
                embeddings,
            },
            cfg.embedding_cache,
            cfg.max_message_bytes,
        )
    };
    let sum = |kind: Kind| -> u64 {
        let held = registry.held_bytes();
        held.iter()
            .filter(|((k, _), _)| *k == kind)
            .map(|(_, b)| b)
            .sum()
    };
    // The stores to register are planned from their manifests before any is written, so a
    // budget too small for them is refused before the work.
    let pending: Vec<&(String, PathBuf)> = cfg
        .register
        .iter()
        .filter(|(name, _)| registry.graph(name).is_err())
        .collect();
    let mut pending_bytes = 0u64;
    for (_, path) in &pending {
        pending_bytes = pending_bytes.saturating_add(memory::store_graph_bytes(path)?);
    }
    let pending_runs: Vec<&(String, PathBuf)> = cfg
        .register_embeddings
        .iter()
        .filter(|(name, _)| !registry.embeddings.contains(name))
        .collect();
    let mut pending_run_bytes = 0u64;
    for (_, path) in &pending_runs {
        pending_run_bytes = pending_run_bytes.saturating_add(
            registry
                .embeddings
                .planned_bytes(path, cfg.embedding_memory.bytes())?,
        );
    }
    plan_for(
        sum(Kind::Graph).saturating_add(pending_bytes),
        sum(Kind::Model),
        sum(Kind::Embedding).saturating_add(pending_run_bytes),
    )?
    .memory_plan()
    .check_machine(strata_store::budget::physical_memory())
    .map_err(ServeError::InvalidArgument)?;
    for (name, path) in pending {
        registry.register_graph(name, path, cfg.reorder.as_ref())?;
    }
    for (name, path) in pending_runs {
        registry.register_embedding(name, path, "best", cfg.embedding_memory.bytes())?;
    }
    let plan = plan_for(sum(Kind::Graph), sum(Kind::Model), sum(Kind::Embedding))?;
    let page_cache = Arc::new(PageCache::new(plan.page_cache_bytes));
    registry.attach(Arc::clone(&page_cache));
    let mut exec = cfg.exec.clone();
    exec.embedding_cache_bytes = plan.embedding_cache_bytes;
    exec.group_bytes = plan.executor_bytes;
    let executor = Executor::start(exec.clone(), Arc::clone(&page_cache));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("strata-serve-rpc")
        .build()
        .map_err(|e| ServeError::io("starting the async runtime", e))?;
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind(addr))
        .map_err(|e| ServeError::io(format!("binding {addr}"), e))?;
    let bound = listener
        .local_addr()
        .map_err(|e| ServeError::io("local address", e))?;
    let core = Arc::new(Core::new(
        registry,
        executor,
        Arc::clone(&page_cache),
        cfg.limits.clone(),
        &plan,
        exec.sample_seed,
        bound.to_string(),
    ));
    let service = InterceptedService::new(
        GraphLearningServer::new(Service {
            core: Arc::clone(&core),
        })
        .max_decoding_message_size(plan.max_message_bytes as usize)
        .max_encoding_message_size(plan.max_message_bytes as usize),
        TokenCheck(cfg.token.as_deref().map(Arc::from)),
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let idle = cfg.idle_timeout;
    let server = runtime.spawn(
        tonic::transport::Server::builder()
            // Pings make a live client answer within the idle timeout, however long it waits
            // between calls or for a long one; a client that does not is closed.
            .http2_keepalive_interval(Some(idle / 2))
            .http2_keepalive_timeout(Some(idle / 2))
            .add_service(service)
            .serve_with_incoming_shutdown(
                // Without TCP_NODELAY, a response's trailing frames wait for the client's
                // delayed ACK (Nagle): about 40 ms added to every call.
                TcpListenerStream::new(listener).map(move |conn| {
                    conn.and_then(|s| s.set_nodelay(true).map(|()| IdleTimeout::new(s, idle)))
                }),
                async {
                    let _ = stop_rx.await;
                },
            ),
    );
    on_ready(bound, plan);

    let started = Instant::now();
    let mut folds = 0u64;
    let mut unfolded_since: std::collections::HashMap<u64, Instant> = Default::default();
    let mut failure = None;
    while !should_stop() && !server.is_finished() {
        std::thread::sleep(TICK);
        match fold_due(&core, cfg, &mut unfolded_since) {
            Ok(n) => folds += n,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    // Drain: refuse new work, finish the queued analyses, then let in-flight calls complete.
    core.draining.store(true, Ordering::Release);
    core.executor.shutdown();
    let _ = stop_tx.send(());
    let served = runtime.block_on(server);
    let status = core.status();
    if let Some(e) = failure {
        return Err(e);
    }
    match served {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            return Err(ServeError::Unavailable(format!(
                "the gRPC server stopped: {e}"
            )))
        }
        Err(e) => {
            return Err(ServeError::Unavailable(format!(
                "the gRPC server task failed: {e}"
            )))
        }
    }
    Ok(ServeSummary {
        addr: bound,
        seconds: started.elapsed().as_secs_f64(),
        status,
        folds,
    })
}

/// Folds the graphs whose logs are due (by size or age); returns how many were folded.
fn fold_due(
    core: &Core,
    cfg: &ServeConfig,
    unfolded_since: &mut std::collections::HashMap<u64, Instant>,
) -> Result<u64> {
    let mut folds = 0;
    for g in core.registry.graphs() {
        let pending = g.pending_log_records();
        if pending == 0 {
            unfolded_since.remove(&g.uid);
            continue;
        }
        let since = *unfolded_since.entry(g.uid).or_insert_with(Instant::now);
        if pending >= cfg.fold_records || since.elapsed() >= cfg.fold_after {
            let cache = &core.page_cache;
            if g.fold(|old| cache.forget_file(old.features.file_id()))? {
                folds += 1;
            }
            unfolded_since.remove(&g.uid);
        }
    }
    Ok(folds)
}
