//! One reordering from start to end: the plan, the order, the arrays written through the
//! store builder and the commit, with the summary the front end prints.

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;
use strata_store::budget::Planned;
use strata_store::{Progress, StoreBuilder};

use super::write;
use super::{load_direction, open_input, plan_for, undirected, ReorderOptions};
use crate::error::{GraphError, Result};
use crate::order::{inverse, mean_span, Input, OrderKind};

/// What a reordering did, for the front end's summary.
#[derive(Debug, Clone, Serialize)]
pub struct ReorderSummary {
    pub store: PathBuf,
    pub order: String,
    pub nodes: u64,
    pub order_seconds: f64,
    pub seconds: f64,
    /// The mean `|id(u) - id(v)|` over the undirected adjacency's entries, before and after.
    pub mean_edge_span_before: f64,
    pub mean_edge_span_after: f64,
    pub memory: u64,
    pub plan: Vec<String>,
}

/// Writes `options.store` renumbered by `options.order` to `options.out` (see the module
/// documentation); reports the memory plan through `progress` first.
pub fn reorder_store(options: &ReorderOptions, progress: &dyn Progress) -> Result<ReorderSummary> {
    let order = options.order.ok_or_else(|| {
        GraphError::Config(format!(
            "reorder: needs an order: {}",
            OrderKind::names().join(", ")
        ))
    })?;
    let (src, out) = (&options.store, &options.out);
    if out.exists() && out.canonicalize().ok() == src.canonicalize().ok() {
        return Err(GraphError::Config(format!(
            "reorder: --out {} is the input store; write to a new directory",
            out.display()
        )));
    }
    let store = open_input(src, progress)?;
    let depth = strata_io::Engine::shared().depth() as u64;
    let plan = plan_for(&store, order, options.memory.0, depth)?;
    let memory_plan = plan.memory_plan();
    memory_plan
        .check_machine(strata_store::budget::physical_memory())
        .map_err(GraphError::Config)?;
    let lines = memory_plan.describe();
    for line in &lines {
        progress.message(line);
    }
    let builder = StoreBuilder::create(out, options.overwrite)?;
    let t0 = Instant::now();
    progress.stage(&format!("order ({order})"), 0, 0);
    let old_of_new = {
        let adj = match order.get().input() {
            Input::Undirected => undirected(&store, plan.io_chunk)?,
            Input::InNeighbours => load_direction(&store, "csc", plan.io_chunk)?,
        };
        order.get().order(&adj)?
    };
    let new_of_old = inverse(&old_of_new);
    let (span_before, span_after) = {
        let adj = undirected(&store, plan.io_chunk)?;
        (mean_span(&adj, None), mean_span(&adj, Some(&new_of_old)))
    };
    let order_seconds = t0.elapsed().as_secs_f64();
    let mut manifest = store.manifest().clone();
    let perm = write::Permutation {
        old_of_new: &old_of_new,
        new_of_old: &new_of_old,
    };
    let mut builder = builder;
    write::write_arrays(&store, &mut builder, &perm, &plan, progress)?;
    manifest.provenance = serde_json::json!({
        "converter": "reorder",
        "seconds": (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        "reorder": {
            "order": order.name(),
            "input": src.display().to_string(),
            "input_provenance": store.manifest().provenance,
        },
    });
    let written = builder.commit(manifest)?;
    Ok(ReorderSummary {
        store: written.path().to_path_buf(),
        order: order.name().to_string(),
        nodes: old_of_new.len() as u64,
        order_seconds: (order_seconds * 1000.0).round() / 1000.0,
        seconds: (t0.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        mean_edge_span_before: span_before,
        mean_edge_span_after: span_after,
        memory: options.memory.0,
        plan: lines,
    })
}
