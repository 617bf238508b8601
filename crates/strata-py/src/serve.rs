//! `strata serve`: runs the graph service until a signal, and hands Python the schema the
//! client builds its messages from.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pythonize::pythonize;
use strata_serve::config::ServeOptions;
use strata_serve::server::serve;
use strata_serve::ServeError;
use strata_store::budget::Planned;

use crate::callback::CallbackError;
use crate::config::section;
use crate::errors::raise;

fn error_class(e: &ServeError) -> &'static str {
    use strata_store::StoreError;
    match e {
        ServeError::InvalidArgument(_) | ServeError::AlreadyExists(_) => "ConfigError",
        // A store registered at start that fails validation (its arrays' ids, say).
        ServeError::Store(StoreError::Invalid { .. } | StoreError::NewerFormat { .. })
        | ServeError::Graph(strata_graph::GraphError::Store(
            StoreError::Invalid { .. } | StoreError::NewerFormat { .. },
        )) => "StoreFormatError",
        ServeError::Io { .. } => "StrataIOError",
        _ => "RunError",
    }
}

/// Serves the `serve` section's `options` (a dict) until SIGTERM or Ctrl-C: `on_ready(addr,
/// plan, memory_plan)` once listening (the split and the same in the common shape),
/// `on_stop(summary)` however it stops; returns the summary.
#[pyfunction]
fn serve_run(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    on_ready: Py<PyAny>,
    on_stop: Py<PyAny>,
) -> PyResult<Py<PyAny>> {
    let options: ServeOptions = section(options)?;
    let cfg = options
        .server_config()
        .map_err(|e| raise(py, error_class(&e), &e.to_string()))?;
    let signal = CallbackError::default();
    let ready_error = CallbackError::default();
    let backend: std::sync::Arc<dyn strata_graph::embedding_run::EmbeddingBackend> =
        std::sync::Arc::new(strata_embed::ServingBackend);
    let outcome = py.detach(|| {
        serve(
            &cfg,
            Some(backend),
            |addr, plan| {
                Python::attach(|py| {
                    let memory_plan = plan.memory_plan();
                    let r = pythonize(py, &plan)
                        .and_then(|p| Ok((p, pythonize(py, &memory_plan)?)))
                        .map_err(PyErr::from)
                        .and_then(|(p, m)| on_ready.call1(py, (addr.to_string(), p, m)));
                    if let Err(e) = r {
                        ready_error.keep(e);
                    }
                })
            },
            || ready_error.is_set() || signal.signalled(),
        )
    });
    let summary = match outcome {
        Ok(s) => s,
        Err(e) => return Err(raise(py, error_class(&e), &e.to_string())),
    };
    let summary = pythonize(
        py,
        &serde_json::json!({
            "addr": summary.addr.to_string(),
            "seconds": summary.seconds,
            "folds": summary.folds,
            "status": status_json(&summary.status),
        }),
    )?
    .unbind();
    on_stop.call1(py, (summary.clone_ref(py),))?;
    ready_error.or(signal.or(Ok(summary)))
}

/// The counters of a final status, for the stop line.
fn status_json(s: &strata_serve::proto::StatusResponse) -> serde_json::Value {
    let cache = |c: Option<strata_serve::proto::CacheStatus>| {
        let c = c.unwrap_or_default();
        serde_json::json!({"hits": c.hits, "misses": c.misses, "hit_rate": c.hit_rate, "used_bytes": c.used_bytes, "capacity_bytes": c.capacity_bytes, "bytes_read": c.bytes_read})
    };
    serde_json::json!({
        "graphs": s.graphs.iter().map(|g| g.name.clone()).collect::<Vec<_>>(),
        "models": s.models.iter().map(|m| m.name.clone()).collect::<Vec<_>>(),
        "embeddings": s.embeddings.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
        "requests_done": s.requests_done,
        "requests_failed": s.requests_failed,
        "bytes_in": s.bytes_in,
        "bytes_out": s.bytes_out,
        "page_cache": cache(s.page_cache),
        "embedding_cache": cache(s.embedding_cache),
    })
}

/// The encoded `FileDescriptorSet` of `serve.proto`.
#[pyfunction]
fn serve_descriptor(py: Python<'_>) -> Bound<'_, PyBytes> {
    PyBytes::new(py, strata_serve::proto::FILE_DESCRIPTOR_SET)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve_run, m)?)?;
    m.add_function(wrap_pyfunction!(serve_descriptor, m)?)?;
    Ok(())
}
