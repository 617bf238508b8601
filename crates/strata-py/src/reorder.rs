//! `strata reorder` and the node orders it offers.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use strata_graph::order::OrderKind;
use strata_graph::reorder::ReorderOptions;
use strata_graph::{GraphError, Topology};

use crate::call::run;
use crate::config::section;
use crate::errors::{config_error, ToPyErr};

/// Writes a store renumbered by a node order; `options` is the `[reorder]` section. Returns
/// the summary (`strata_graph::reorder::ReorderSummary`); the memory plan goes to `progress`
/// as messages first.
#[pyfunction]
#[pyo3(signature = (options, progress=None))]
fn reorder_store(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ReorderOptions = section(options)?;
    run(py, progress, |p| {
        strata_graph::reorder::reorder_store(&o, p)
    })
}

/// The node order `order` of the adjacency `indptr` (little-endian uint64 bytes, `(N + 1,)`)
/// and `indices` (little-endian uint32 bytes, `(T,)`): `old_of_new` as little-endian uint32
/// bytes, `(N,)`.
#[pyfunction]
fn node_order<'py>(
    py: Python<'py>,
    indptr: &[u8],
    indices: &[u8],
    order: &str,
) -> PyResult<Bound<'py, PyBytes>> {
    let kind: OrderKind = order
        .parse()
        .map_err(|e: strata_store::registry::UnknownName| config_error(py, &e.to_string()))?;
    let words = |bytes: &[u8], size: usize, what: &str| {
        if !bytes.len().is_multiple_of(size) {
            return Err(config_error(
                py,
                &format!(
                    "node_order: {what} holds {} bytes, not whole {size}-byte values",
                    bytes.len()
                ),
            ));
        }
        Ok(())
    };
    words(indptr, 8, "indptr")?;
    words(indices, 4, "indices")?;
    let indptr: Vec<u64> = indptr
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let indices: Vec<u32> = indices
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let order = py
        .detach(|| -> Result<Vec<u32>, GraphError> {
            kind.get().order(&Topology::new(indptr, indices)?)
        })
        .map_err(|e| e.to_py(py))?;
    Ok(PyBytes::new(py, bytemuck::cast_slice(&order)))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(reorder_store, m)?)?;
    m.add_function(wrap_pyfunction!(node_order, m)?)?;
    Ok(())
}
