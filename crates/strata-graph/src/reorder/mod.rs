//! `strata reorder`: renumbers the nodes of a finished store by a node order ([`OrderKind`]) so
//! that nodes sampled together get nearby ids, and therefore share feature pages, and writes
//! the renumbered store, every node-indexed array permuted and every node id mapped, through
//! the store builder (the converters' writer: a `.partial-PID` directory published atomically).
//!
//! Memory ([`ReorderPlan`]): the order is computed from an adjacency read into memory (the
//! undirected one, or the CSC for `glist`) with the order's own arrays; the permutation and its
//! inverse (4 bytes a node each) are then kept while writing. Writing holds one `indices` array
//! in memory while its segments are permuted (a node's segment lies anywhere in it), and
//! streams everything else in chunks as large as the budget allows: feature and label rows
//! are gathered through the I/O engine (direct I/O, so the page cache is neither used nor
//! thrashed) and every output is written sequentially.
//!
//! The new store keeps the input's ids visible: `original_id` (`(N,)`, the id dtype) is the
//! input id of each new node (the first input's id when the input was itself reordered).

mod run;
mod write;

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use strata_store::array::{decode_ints, RowReader};
use strata_store::budget::{MemoryPlan, Planned};
use strata_store::config::{ConfigError, Section, Size};
use strata_store::ids::{IdCheck, IndptrCheck};
use strata_store::units::fmt_bytes;
use strata_store::{open_checked, Progress, Store, StoreError};

use crate::error::{GraphError, Result};
use crate::order::{Input, OrderKind};
use crate::topology::EdgeColumns;
use crate::Topology;

pub use run::{reorder_store, ReorderSummary};

/// Rows permuted per chunk, at most.
pub const CHUNK_ROWS: u64 = 1 << 16;

/// Node-indexed arrays whose rows move with their nodes (a reordered store's `original_id`
/// too, so that reordering it again keeps naming the first input's ids).
const ROW_ARRAYS: [&str; 5] = [
    "features",
    "labels",
    "out_degree",
    "in_degree",
    "original_id",
];

/// Alignment (and smallest size) of an I/O chunk, in bytes.
const ALIGN: u64 = strata_io::ALIGN as u64;

/// `strata reorder`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ReorderOptions {
    /// the input store
    #[schemars(extend("x-positional" = true, "x-required" = true, "x-kind" = "path"))]
    pub store: PathBuf,
    /// the reordered store to write
    #[schemars(extend("x-required" = true, "x-kind" = "path"))]
    pub out: PathBuf,
    /// the node order (each is described in docs/convert.md)
    #[schemars(extend("x-required" = true))]
    pub order: Option<OrderKind>,
    /// replace --out if it exists
    pub overwrite: bool,
    /// memory budget of the reordering
    pub memory: Size,
}

impl Default for ReorderOptions {
    /// `store`, `out` and `order` are required (empty is refused).
    fn default() -> Self {
        ReorderOptions {
            store: PathBuf::new(),
            out: PathBuf::new(),
            order: None,
            overwrite: false,
            memory: Size(1 << 30),
        }
    }
}

impl Section for ReorderOptions {
    const NAME: &'static str = "reorder";

    fn validate(&self) -> std::result::Result<(), ConfigError> {
        let refuse = |key: &str, msg: String| Err(ConfigError::new(Self::NAME, key, msg));
        if self.store.as_os_str().is_empty() {
            return refuse("store", "needs the store to reorder".into());
        }
        if self.out.as_os_str().is_empty() {
            return refuse("out", "needs a store directory to create".into());
        }
        if self.order.is_none() {
            return refuse(
                "order",
                format!("needs an order: {}", OrderKind::names().join(", ")),
            );
        }
        Ok(())
    }
}

/// What a reordering holds in memory, in bytes (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReorderPlan {
    pub order: String,
    pub memory: u64,
    pub nodes: u64,
    /// Entries of the adjacency the order reads.
    pub entries: u64,
    /// The adjacency the order reads (while it is built: the arrays it is built from too).
    pub adjacency_bytes: u64,
    /// The order's own arrays.
    pub order_bytes: u64,
    /// The permutation and its inverse, kept from the order to the end.
    pub permutation_bytes: u64,
    /// The largest topology (indptr and indices) permuted in memory.
    pub topology_bytes: u64,
    /// Staging buffers of the reads and writes.
    pub io_bytes: u64,
    /// Bytes of an I/O chunk.
    pub io_chunk: u64,
    /// Rows gathered per chunk, and the bytes of a chunk (rows and the engine's buffers).
    pub chunk_rows: u64,
    pub chunk_bytes: u64,
    /// The smallest budget the reordering accepts.
    pub minimum: u64,
}

impl Planned for ReorderPlan {
    fn memory_plan(&self) -> MemoryPlan {
        let order_phase = self.adjacency_bytes + self.order_bytes + self.permutation_bytes;
        MemoryPlan::new("reorder", self.memory)
            .minimum(self.minimum)
            .part(
                "order",
                order_phase,
                format!(
                    "{} over {} entries of {} nodes: adjacency {}, the order's arrays {}, permutation {}",
                    self.order,
                    self.entries,
                    self.nodes,
                    fmt_bytes(self.adjacency_bytes),
                    fmt_bytes(self.order_bytes),
                    fmt_bytes(self.permutation_bytes)
                ),
            )
            .part(
                "write",
                self.permutation_bytes + self.topology_bytes.max(self.chunk_bytes),
                format!(
                    "one topology in memory ({}) or {} rows a chunk ({}), beside the permutation",
                    fmt_bytes(self.topology_bytes),
                    self.chunk_rows,
                    fmt_bytes(self.chunk_bytes)
                ),
            )
            .part(
                "I/O buffers",
                self.io_bytes,
                format!("{} chunks", fmt_bytes(self.io_chunk)),
            )
    }
}

/// The plan of reordering `store` by `order` within `memory` bytes, with I/O engine `depth`
/// reads in flight; a budget below the plan's minimum is an error naming both.
pub fn plan_for(store: &Store, order: OrderKind, memory: u64, depth: u64) -> Result<ReorderPlan> {
    let m = store.manifest();
    let n = m.graph.num_nodes;
    let indptr = 8 * (n + 1);
    let entries_of = |name: &str| store.array(name).map_or(0, |a| a.shape[0]);
    let (csr, csc) = (entries_of("csr_indices"), entries_of("csc_indices"));
    let (undirected_entries, undirected_bytes) = if m.graph.symmetrized {
        (csr, indptr + 4 * csr)
    } else {
        // Both indptr arrays beside the merged one while it is built.
        (csr + csc, 3 * indptr + 4 * (csr + csc))
    };
    let (entries, adjacency_bytes) = match order.get().input() {
        Input::Undirected => (undirected_entries, undirected_bytes),
        Input::InNeighbours => (csc, indptr + 4 * csc),
    };
    let (per_node, per_entry) = order.get().work_bytes();
    let order_bytes = per_node * n + per_entry * entries;
    let permutation_bytes = 8 * n;
    // The mean edge spans are measured on the undirected adjacency once the order is known.
    let order_phase = (adjacency_bytes + order_bytes + permutation_bytes)
        .max(undirected_bytes + permutation_bytes);
    let topology_bytes = indptr + 4 * csr.max(csc);
    let row_bytes = store
        .manifest()
        .arrays
        .iter()
        .filter(|(name, _)| ROW_ARRAYS.contains(&name.as_str()))
        .map(|(_, a)| a.shape[1..].iter().product::<u64>() * a.dtype.size() as u64)
        .max()
        .unwrap_or(8);
    // The engine's buffers of a gather: a row and its alignment slack per read in flight.
    let engine_bytes = depth * (row_bytes + 2 * ALIGN);
    let per_row = row_bytes + 8;
    let phases = order_phase
        .max(permutation_bytes + topology_bytes)
        .max(permutation_bytes + engine_bytes + per_row);
    // I/O chunks: a writer's buffer, a reader's two (one read ahead) and a chunk of decoded
    // values (8 bytes a value, from 4 or 8 read); what the phases leave, within 1/64 of the
    // budget and 4 KiB to 4 MiB each.
    const IO_CHUNKS: u64 = 5;
    let io_chunk = (memory / 64)
        .min(memory.saturating_sub(phases) / IO_CHUNKS)
        .clamp(ALIGN, 4 << 20)
        / ALIGN
        * ALIGN;
    let io_bytes = IO_CHUNKS * io_chunk;
    let minimum = phases + IO_CHUNKS * ALIGN;
    let spare = memory.saturating_sub(permutation_bytes + engine_bytes + io_bytes);
    let chunk_rows = (spare / per_row).clamp(1, CHUNK_ROWS);
    let chunk_bytes = engine_bytes + chunk_rows * per_row;
    let plan = ReorderPlan {
        order: order.name().to_string(),
        memory,
        nodes: n,
        entries,
        adjacency_bytes,
        order_bytes,
        permutation_bytes,
        topology_bytes,
        io_bytes,
        io_chunk,
        chunk_rows,
        chunk_bytes,
        minimum,
    };
    if memory < minimum {
        return Err(GraphError::Store(StoreError::Budget {
            budget: memory,
            needed: minimum,
            what: format!(
                "reorder --order {} of {} ({n} nodes, {entries} adjacency entries: the adjacency {}, the order's arrays {}, the permutation {}, one topology {}; set reorder.memory)",
                order.name(),
                store.path().display(),
                fmt_bytes(adjacency_bytes),
                fmt_bytes(order_bytes),
                fmt_bytes(permutation_bytes),
                fmt_bytes(topology_bytes)
            ),
        }));
    }
    Ok(plan)
}

/// The input store, refused unless it passes `strata check` (a store that does not would be
/// published under a new digest with its damage renumbered out of sight) and is a plain
/// (format 1), integer-id store not reordered before.
fn open_input(path: &std::path::Path, progress: &dyn Progress) -> Result<Store> {
    let store = open_checked(path, progress)?;
    let m = store.manifest();
    let refuse = |msg: String| {
        Err(GraphError::Store(StoreError::Invalid {
            store: path.to_path_buf(),
            msg,
        }))
    };
    let version = m.required_version();
    if version >= 2 {
        return refuse(format!(
            "reorder: this is a format {version} store (node or edge types, edge weights, times or features); reordering supports plain (format 1) stores only"
        ));
    }
    if m.graph.node_names {
        return refuse("reorder: the store has a node name table; reordering supports integer-id stores only (a name's id is its rank in the sorted table, which a new order would break)".into());
    }
    if m.graph.num_nodes > u32::MAX as u64 {
        return refuse(format!(
            "reorder: {} nodes; reordering handles at most {} (32-bit node ids)",
            m.graph.num_nodes,
            u32::MAX
        ));
    }
    Ok(store)
}

/// Calls `f` with each chunk of the integer array `name`'s values (whole rows), read in
/// `chunk`-byte batches.
fn for_each_chunk(
    store: &Store,
    name: &str,
    chunk: u64,
    mut f: impl FnMut(&[i64]) -> Result<()>,
) -> Result<()> {
    let info = store.require(name)?;
    let mut reader = RowReader::open_array(store.path(), info, chunk as usize)?;
    let mut values = Vec::new();
    while let Some(batch) = reader.next_batch()? {
        values.clear();
        decode_ints(batch, info.dtype, &mut values);
        f(&values)?;
    }
    Ok(())
}

/// The offsets array `name` (`(N + 1,)`), checked: from 0, never decreasing, to `end`.
fn load_indptr(store: &Store, name: &str, end: u64, chunk: u64) -> Result<Vec<u64>> {
    let mut check = IndptrCheck::array(store, name, end)?;
    let mut out = Vec::with_capacity(store.manifest().graph.num_nodes as usize + 1);
    for_each_chunk(store, name, chunk, |vals| {
        check.check(vals)?;
        out.extend(vals.iter().map(|&v| v as u64));
        Ok(())
    })?;
    check.finish()?;
    Ok(out)
}

/// Calls `place(k, id)` for every entry `k` of the node-id array `name`, checked to be ids
/// of the store's nodes (`field` names them in errors).
fn scan_ids(
    store: &Store,
    name: &str,
    field: &str,
    chunk: u64,
    mut place: impl FnMut(usize, u32),
) -> Result<()> {
    let mut check = IdCheck::nodes(store, name, field)?;
    let mut k = 0usize;
    for_each_chunk(store, name, chunk, |vals| {
        check.check(vals)?;
        for &v in vals {
            place(k, v as u32);
            k += 1;
        }
        Ok(())
    })
}

/// The store's CSR (`prefix` `csr`) or CSC (`csc`) in memory, checked.
fn load_direction(store: &Store, prefix: &str, chunk: u64) -> Result<Topology> {
    let indices_name = format!("{prefix}_indices");
    let len = store.require(&indices_name)?.shape[0];
    let indptr = load_indptr(store, &format!("{prefix}_indptr"), len, chunk)?;
    let mut indices = vec![0u32; len as usize];
    let field = if prefix == "csr" { "dst" } else { "src" };
    scan_ids(store, &indices_name, field, chunk, |k, v| indices[k] = v)?;
    Ok(Topology {
        indptr,
        indices,
        columns: EdgeColumns::default(),
    })
}

/// The undirected adjacency: the CSR of a symmetrized store, else each node's out-neighbours
/// (CSR) followed by its in-neighbours (CSC), read straight into place.
fn undirected(store: &Store, chunk: u64) -> Result<Topology> {
    if store.manifest().graph.symmetrized {
        return load_direction(store, "csr", chunk);
    }
    let len = |name: &str| -> Result<u64> { Ok(store.require(name)?.shape[0]) };
    let out_ip = load_indptr(store, "csr_indptr", len("csr_indices")?, chunk)?;
    let in_ip = load_indptr(store, "csc_indptr", len("csc_indices")?, chunk)?;
    let indptr: Vec<u64> = out_ip.iter().zip(&in_ip).map(|(a, b)| a + b).collect();
    let mut indices = vec![0u32; *indptr.last().unwrap_or(&0) as usize];
    // Entries arrive in node order: `v` advances past nodes whose segments are done.
    let mut scatter = |name: &str, field: &str, ip: &[u64], skip: &dyn Fn(usize) -> u64| {
        let mut v = 0usize;
        scan_ids(store, name, field, chunk, |k, id| {
            while ip[v + 1] <= k as u64 {
                v += 1;
            }
            indices[(indptr[v] + skip(v) + k as u64 - ip[v]) as usize] = id;
        })
    };
    scatter("csr_indices", "dst", &out_ip, &|_| 0)?;
    scatter("csc_indices", "src", &in_ip, &|v| out_ip[v + 1] - out_ip[v])?;
    Ok(Topology {
        indptr,
        indices,
        columns: EdgeColumns::default(),
    })
}

#[cfg(test)]
mod tests;
