//! Engines for tests, shared by every crate that reads through the engine: small windows,
//! so that batches wait for room and buffers are reused, on each backend the machine runs.

use std::sync::Arc;

use crate::engine::{BackendKind, Engine, EngineConfig};

/// The backends tests exercise: io_uring and the thread pool, or the thread pool only when
/// `STRATA_TEST_NO_URING` is set (systems without io_uring).
pub fn backends() -> Vec<BackendKind> {
    if std::env::var_os("STRATA_TEST_NO_URING").is_some() {
        vec![BackendKind::Threads]
    } else {
        vec![BackendKind::IoUring, BackendKind::Threads]
    }
}

/// An engine on `backend` with `depth` requests in flight and `threads` pool workers.
/// Panics naming the backend when it cannot start, or starts another one.
pub fn engine(backend: BackendKind, depth: usize, threads: usize) -> Arc<Engine> {
    let e = Engine::new(&EngineConfig {
        backend,
        depth,
        threads,
        ..EngineConfig::default()
    })
    .unwrap_or_else(|e| panic!("{} backend: {e}", backend.name()));
    assert_eq!(e.kind(), backend);
    e
}

/// One [`engine`] per backend of [`backends`].
pub fn engines(depth: usize, threads: usize) -> Vec<Arc<Engine>> {
    backends()
        .into_iter()
        .map(|backend| engine(backend, depth, threads))
        .collect()
}
