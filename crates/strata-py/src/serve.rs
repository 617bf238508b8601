//! `strata serve`: runs the graph service until a signal, and hands Python the schema the
//! client builds its messages from.

use std::path::PathBuf;
use std::time::Duration;

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pythonize::pythonize;
use serde::Deserialize;
use strata_serve::executor::ExecConfig;
use strata_serve::reorder::ReorderParams;
use strata_serve::schedule::ScheduleConfig;
use strata_serve::server::{serve, ServeConfig};
use strata_serve::service::Limits;
use strata_serve::ServeError;
use strata_store::budget::Planned;

use crate::callback::CallbackError;
use crate::errors::raise;

/// The `serve` config section as Python validated it.
#[derive(Deserialize)]
struct Options {
    listen: String,
    state_dir: PathBuf,
    memory: u64,
    embedding_cache: bool,
    token: Option<String>,
    max_message: usize,
    max_ids: usize,
    rate: f64,
    window_ms: f64,
    max_batch: usize,
    group_size: usize,
    reorder_requests: bool,
    sample_seed: u64,
    result_ttl: f64,
    fold_records: u64,
    fold_after: f64,
    /// Stores to register at start: (name, path).
    register: Vec<(String, PathBuf)>,
    /// Alg. 2 parameters for them; None registers without re-ordering.
    reorder: Option<ReorderOptions>,
}

#[derive(Deserialize)]
struct ReorderOptions {
    hops: u32,
    centers: usize,
    max_degree: u64,
}

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

/// Serves until SIGTERM or Ctrl-C: `on_ready(addr, plan, memory_plan)` once listening (the
/// split and the same in the common shape), `on_stop(summary)`
/// however it stops; returns the summary.
#[pyfunction]
fn serve_run(
    py: Python<'_>,
    options: &str,
    on_ready: Py<PyAny>,
    on_stop: Py<PyAny>,
) -> PyResult<Py<PyAny>> {
    let o: Options = serde_json::from_str(options)
        .map_err(|e| raise(py, "ConfigError", &format!("serve options: {e}")))?;
    let cfg = ServeConfig {
        listen: o.listen,
        state_dir: o.state_dir,
        memory: o.memory,
        embedding_cache: o.embedding_cache,
        token: o.token,
        max_message_bytes: o.max_message,
        limits: Limits {
            max_ids: o.max_ids,
            rate: o.rate,
        },
        exec: ExecConfig {
            window: Duration::from_secs_f64(o.window_ms / 1e3),
            max_batch: o.max_batch,
            schedule: ScheduleConfig {
                reorder: o.reorder_requests,
                group_size: o.group_size,
            },
            sample_seed: o.sample_seed,
            embedding_cache_bytes: 0,
            group_bytes: 0,
            result_ttl: Duration::from_secs_f64(o.result_ttl),
        },
        fold_records: o.fold_records,
        fold_after: Duration::from_secs_f64(o.fold_after),
        register: o.register,
        reorder: o.reorder.map(|r| ReorderParams {
            hops: r.hops,
            centers: r.centers,
            max_degree: r.max_degree,
            ..ReorderParams::default()
        }),
    };
    share_one_malloc_arena();
    let signal = CallbackError::default();
    let ready_error = CallbackError::default();
    let outcome = py.detach(|| {
        serve(
            &cfg,
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
