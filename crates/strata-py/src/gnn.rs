//! The GNN data path from Python: a store opened with its feature tiers, and the batches of an
//! epoch as raw arrays that `strata.gnn` turns into tensors.

use std::path::PathBuf;
use std::sync::Mutex;

use bytemuck::{cast_slice, pod_collect_to_vec};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyList, PyTuple};
use pythonize::pythonize;
use strata_gnn::data::{Consumer, DataConfig, GnnData};
use strata_gnn::pipeline::{Batch, NodeLoader};
use strata_store::budget::Planned;

use crate::call::job;
use crate::errors::{config_error, ToPyErr};
use crate::progress::PyProgress;

/// A store opened for GNN training (topology, sampler, feature tiers within the budget).
#[pyclass(frozen, name = "GnnData")]
struct PyGnnData {
    data: GnnData,
}

#[pymethods]
impl PyGnnData {
    /// Opens `store` with `config` (some of the `[gnn.train]` section's data-path options,
    /// `strata_gnn::data::DataConfig`, checked as that section; the rest take its defaults);
    /// `train_nodes` are little-endian uint32 ids (the pre-sampling ranking samples them).
    /// `consumer` holds the fields of `strata_gnn::data::Consumer` (the process's measured
    /// resident set, the model's training costs per layer).
    #[new]
    #[pyo3(signature = (store, config, train_nodes, consumer, progress=None))]
    fn new(
        py: Python<'_>,
        store: PathBuf,
        config: &Bound<'_, PyAny>,
        train_nodes: &[u8],
        consumer: &Bound<'_, PyAny>,
        progress: Option<Py<PyAny>>,
    ) -> PyResult<Self> {
        let cfg: DataConfig = crate::config::section(config)?;
        let consumer: Consumer = job(consumer)?;
        let nodes = ids(py, train_nodes)?;
        let progress = PyProgress::new(progress);
        match py.detach(|| GnnData::open(&store, cfg, &nodes, &consumer, &progress)) {
            Ok(data) => Ok(PyGnnData { data }),
            Err(e) => Err(progress.take_error().unwrap_or_else(|| e.to_py(py))),
        }
    }

    /// The budget plan, as lines to print.
    fn plan_lines(&self) -> Vec<String> {
        self.data.plan.memory_plan().describe()
    }

    /// The budget plan in the common shape (`strata_store::budget::MemoryPlan`).
    fn memory_plan(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(pythonize(py, &self.data.plan.memory_plan())?.unbind())
    }

    /// The budget plan's figures.
    fn plan(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(pythonize(py, &self.data.plan)?.unbind())
    }

    /// (num_nodes, dim, dtype name, row bytes) of the features.
    fn features_info(&self) -> (u64, usize, &'static str, usize) {
        let m = self.data.tiers.reader().meta();
        (m.num_rows, m.dim, m.dtype.name(), m.row_bytes)
    }

    /// The device tier's nodes in slot order (uint32 bytes; empty without a device tier): the
    /// rows the consumer loads into its device tensor.
    fn device_nodes(&self, py: Python<'_>) -> Py<PyByteArray> {
        PyByteArray::new(py, cast_slice(self.data.tiers.device_nodes())).unbind()
    }

    /// Seconds spent ranking and loading the hot set.
    #[getter]
    fn hot_seconds(&self) -> f64 {
        self.data.hot_seconds
    }

    /// The feature rows of `nodes` (uint32 bytes, any order, repeats allowed) through the
    /// tiers: a bytearray of `len(nodes) * row_bytes` bytes. With `window`, `nodes` were
    /// pinned by `pin_window` when their batch entered a look-ahead window, and the gather
    /// releases those pins (also on an error).
    #[pyo3(signature = (nodes, window=false))]
    fn gather(&self, py: Python<'_>, nodes: &[u8], window: bool) -> PyResult<Py<PyByteArray>> {
        let nodes = ids(py, nodes)?;
        let tiers = &self.data.tiers;
        let mut out = vec![0u8; nodes.len() * tiers.row_bytes()];
        py.detach(|| {
            if window {
                tiers.gather_window(&nodes, &mut out)
            } else {
                tiers.gather(&nodes, &mut out)
            }
        })
        .map_err(|e| e.to_py(py))?;
        Ok(PyByteArray::new(py, &out).unbind())
    }

    /// A batch whose feature rows will be gathered (`gather(..., window=True)`) entered a
    /// look-ahead window: its `nodes` (uint32 bytes) are pinned in the dynamic cache, one pin
    /// per occurrence, so their rows stay cached until then (GIDS window buffering).
    fn pin_window(&self, py: Python<'_>, nodes: &[u8]) -> PyResult<()> {
        let nodes = ids(py, nodes)?;
        py.detach(|| self.data.tiers.pin_window(&nodes));
        Ok(())
    }

    /// A batch pinned by `pin_window` will not be gathered after all: its pins are released.
    fn unpin_window(&self, py: Python<'_>, nodes: &[u8]) -> PyResult<()> {
        let nodes = ids(py, nodes)?;
        py.detach(|| self.data.tiers.unpin_window(&nodes));
        Ok(())
    }

    /// The window pins each of `nodes` (uint32 bytes) holds in the dynamic cache.
    fn window_pins(&self, py: Python<'_>, nodes: &[u8]) -> PyResult<Vec<u32>> {
        let nodes = ids(py, nodes)?;
        Ok(self.data.tiers.window_pins(&nodes))
    }

    /// The tiers' counters since the last call (or the open), which it resets: rows per tier,
    /// disk requests and bytes read (`strata_gnn::tiers::TierStats`).
    fn take_tier_stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(pythonize(py, &self.data.tiers.take_stats())?.unbind())
    }

    /// Whether the tiers have a dynamic cache for `pin_window` to pin rows in.
    #[getter]
    fn has_cache(&self) -> bool {
        self.data.tiers.cache_rows() > 0
    }

    /// The sample of `seeds` (uint32 bytes, distinct) for `batch_key`, PyG style:
    /// `(nodes, hop_counts, row, col, edges_per_hop)` with `row`/`col` the local source and
    /// destination of every sampled edge (uint32 bytes), hop 1 first.
    fn sample(&self, py: Python<'_>, seeds: &[u8], batch_key: u64) -> PyResult<Py<PyTuple>> {
        let seeds = ids(py, seeds)?;
        let (sampler, topo) = (&self.data.sampler, &self.data.topology);
        let sample = py
            .detach(|| sampler.sample(topo, &seeds, batch_key))
            .map_err(|e| e.to_py(py))?;
        let (row, col) = sample.edge_index();
        let tuple = (
            PyByteArray::new(py, cast_slice(&sample.nodes)),
            sample.hop_counts.clone(),
            PyByteArray::new(py, cast_slice(&row)),
            PyByteArray::new(py, cast_slice(&col)),
            sample.edges_per_hop.clone(),
        );
        Ok(tuple.into_pyobject(py)?.unbind())
    }

    /// The link sample of the positive edges `src[i] -> dst[i]` (uint32 bytes of equal
    /// length) with `negatives` uniform negative destinations per edge, for `batch_key`:
    /// [`PyGnnData::sample`]'s tuple for the distinct endpoints, then `src_local`, `dst_local`
    /// and `neg_dst_local` (uint32 bytes, local ids; negatives edge-major).
    fn sample_links(
        &self,
        py: Python<'_>,
        src: &[u8],
        dst: &[u8],
        negatives: usize,
        batch_key: u64,
    ) -> PyResult<Py<PyTuple>> {
        let (src, dst) = (ids(py, src)?, ids(py, dst)?);
        let (sampler, topo) = (&self.data.sampler, &self.data.topology);
        let links = py
            .detach(|| sampler.sample_links(topo, &src, &dst, negatives, batch_key))
            .map_err(|e| e.to_py(py))?;
        let sample = &links.sample;
        let (row, col) = sample.edge_index();
        let u32s = |v: &[u32]| PyByteArray::new(py, cast_slice(v));
        let tuple = (
            u32s(&sample.nodes),
            sample.hop_counts.clone(),
            u32s(&row),
            u32s(&col),
            sample.edges_per_hop.clone(),
            u32s(&links.src_local),
            u32s(&links.dst_local),
            u32s(&links.neg_dst_local),
        );
        Ok(tuple.into_pyobject(py)?.unbind())
    }

    /// The batches of one epoch over `seeds` (little-endian uint32 ids), in order.
    fn epoch(
        &self,
        py: Python<'_>,
        seeds: &[u8],
        epoch: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> PyResult<PyEpoch> {
        let seeds = ids(py, seeds)?;
        let loader = self
            .data
            .epoch(seeds, epoch, shuffle, drop_last)
            .map_err(|e| e.to_py(py))?;
        Ok(PyEpoch {
            loader: Mutex::new(Some(loader)),
        })
    }

    /// The link-prediction batches of one epoch over the positive edges `src[i] -> dst[i]`
    /// (little-endian uint32 ids of equal length), `batch_size` edges each with `negatives`
    /// uniform negative destinations per edge, in order.
    #[allow(clippy::too_many_arguments)] // the Python signature, plus `self` and `py`
    fn link_epoch(
        &self,
        py: Python<'_>,
        src: &[u8],
        dst: &[u8],
        negatives: usize,
        epoch: u64,
        shuffle: bool,
        drop_last: bool,
    ) -> PyResult<PyEpoch> {
        let (src, dst) = (ids(py, src)?, ids(py, dst)?);
        let loader = self
            .data
            .link_epoch(src, dst, negatives, epoch, shuffle, drop_last)
            .map_err(|e| e.to_py(py))?;
        Ok(PyEpoch {
            loader: Mutex::new(Some(loader)),
        })
    }
}

/// An epoch's batches: iterating yields
/// `(index, seeds, nodes, hop_counts, blocks, features, stats, device, links)` with
/// `seeds`/`nodes` as uint32 bytes, `blocks` as `(num_src, num_dst, indptr uint64 bytes, indices uint32 bytes)` in
/// input to output order, `features` a bytearray of the rows of `nodes` (zeros where the device
/// tier holds the row), `device` the `(positions, slots)` of those rows as uint32 bytes, and
/// `links` None for node batches or `(src_local, dst_local, neg_dst_local)` uint32 bytes (rows
/// of `nodes`) for link batches.
#[pyclass(name = "GnnEpoch")]
struct PyEpoch {
    loader: Mutex<Option<NodeLoader>>,
}

#[pymethods]
impl PyEpoch {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&self, py: Python<'_>) -> PyResult<Option<Py<PyTuple>>> {
        let mut guard = self.loader.lock().unwrap();
        let Some(loader) = guard.as_mut() else {
            return Ok(None);
        };
        match py.detach(|| loader.next()) {
            None => Ok(None),
            Some(Err(e)) => {
                // The pipeline stopped: drop it now so its threads end and pins are released.
                *guard = None;
                Err(e.to_py(py))
            }
            Some(Ok(batch)) => batch_tuple(py, batch).map(Some),
        }
    }

    /// The epoch's counters so far: per-stage busy seconds, merged reads, tier hit rates.
    fn stats(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        match self.loader.lock().unwrap().as_ref() {
            Some(l) => Ok(pythonize(py, &l.stats())?.unbind()),
            None => Ok(py.None()),
        }
    }

    /// Stops the epoch early (threads end, window pins are released).
    fn close(&self) {
        self.loader.lock().unwrap().take();
    }
}

fn batch_tuple(py: Python<'_>, b: Batch) -> PyResult<Py<PyTuple>> {
    let u32s = |v: &[u32]| PyByteArray::new(py, cast_slice(v));
    let blocks = PyList::empty(py);
    for blk in &b.sample.blocks {
        blocks.append((
            blk.num_src,
            blk.num_dst,
            PyByteArray::new(py, cast_slice(&blk.indptr)),
            u32s(&blk.indices),
        ))?;
    }
    let tuple = (
        b.index,
        u32s(&b.seeds),
        u32s(&b.sample.nodes),
        b.sample.hop_counts.clone(),
        blocks,
        PyByteArray::new(py, &b.features),
        pythonize(py, &b.stats)?,
        (u32s(&b.device_positions), u32s(&b.device_slots)),
        b.links.map(|l| {
            (
                u32s(&l.src_local),
                u32s(&l.dst_local),
                u32s(&l.neg_dst_local),
            )
        }),
    );
    Ok(tuple.into_pyobject(py)?.unbind())
}

/// Little-endian uint32 ids from Python bytes.
fn ids(py: Python<'_>, bytes: &[u8]) -> PyResult<Vec<u32>> {
    values(py, bytes, "node ids")
}

/// Little-endian values of type `T` from Python bytes; `what` names them in the error.
pub(crate) fn values<T: bytemuck::Pod>(
    py: Python<'_>,
    bytes: &[u8],
    what: &str,
) -> PyResult<Vec<T>> {
    let size = std::mem::size_of::<T>();
    if !bytes.len().is_multiple_of(size) {
        return Err(config_error(
            py,
            &format!(
                "{what}: {} bytes is not a whole number of {size}-byte values",
                bytes.len()
            ),
        ));
    }
    // Python's buffer need not be aligned: copy rather than cast in place.
    Ok(pod_collect_to_vec(bytes))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGnnData>()?;
    m.add_class::<PyEpoch>()?;
    Ok(())
}
