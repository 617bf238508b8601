//! Strata's neighbour sampler on its own, without feature tiers: uniform, weighted, temporal
//! and per-edge-type sampling of a store's CSC, for `strata.gnn.sampling` (and through it
//! PyG's samplers). Samples come back as raw little-endian arrays that Python wraps.

use std::path::PathBuf;

use bytemuck::cast_slice;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyTuple};
use strata_graph::sampler::{HeteroSample, NeighborSampler, Sample, SamplerConfig};
use strata_graph::topology::{ColumnSet, Direction, Topology};
use strata_store::{open_checked, NoProgress};

use crate::call::job;
use crate::errors::{config_error, ToPyErr};
use crate::gnn::values;

/// A store's CSC in RAM with the edge columns its sampler needs (edge ids when it records
/// them).
#[pyclass(frozen, name = "Sampler")]
struct PySampler {
    sampler: NeighborSampler,
    topology: Topology,
    /// First global id of each node type (empty for an untyped store).
    type_offsets: Vec<u64>,
    num_edge_types: usize,
}

#[pymethods]
impl PySampler {
    /// Opens `store`'s CSC for `config` (`strata_graph::sampler::SamplerConfig`'s fields):
    /// with weights when `weighted`, times when `temporal` is set, edge ids when `edge_ids`,
    /// and edge types whenever the store has them (so samples can be grouped by type).
    #[new]
    fn new(py: Python<'_>, store: PathBuf, config: &Bound<'_, PyAny>) -> PyResult<Self> {
        let config: SamplerConfig = job(config)?;
        let weighted = config.weighted;
        let temporal = config.temporal.is_some();
        let ids = config.edge_ids;
        let sampler = NeighborSampler::new(config).map_err(|e| e.to_py(py))?;
        let open = || -> Result<_, strata_graph::GraphError> {
            let store = open_checked(&store, &NoProgress)?;
            let m = store.manifest();
            let wanted = ColumnSet {
                weights: weighted,
                times: temporal,
                edge_types: m.edge_types.len(),
                ids,
            };
            let offsets: Vec<u64> = m.node_types.iter().map(|t| t.offset).collect();
            Ok((Topology::load_with(&store, Direction::In, wanted)?, offsets))
        };
        let (topology, type_offsets) = py.detach(open).map_err(|e| e.to_py(py))?;
        let num_edge_types = topology.columns.num_types;
        Ok(PySampler {
            sampler,
            topology,
            type_offsets,
            num_edge_types,
        })
    }

    /// Bytes the topology and its edge columns hold in RAM.
    #[getter]
    fn topology_bytes(&self) -> u64 {
        self.topology.bytes()
    }

    /// The sample of `seeds` (uint32 bytes of global ids) for `batch_key`; `times` (int64
    /// bytes, one per seed) for a temporal sampler. Returns `(nodes, hop_counts, row, col,
    /// edges_per_hop, edge_types, batch, edge_ids)`: `row`/`col` the local source and
    /// destination of every sampled edge, hop 1 first (uint32 bytes); `edge_types` their types
    /// (uint32 bytes, empty for an untyped store); `batch` each node's seed in a temporal
    /// (disjoint) sample (uint32 bytes, empty otherwise); `edge_ids` their rows in the store's
    /// `edges_train` (uint64 bytes, empty unless the config asks for `edge_ids`).
    #[pyo3(signature = (seeds, batch_key, times=None))]
    fn sample(
        &self,
        py: Python<'_>,
        seeds: &[u8],
        batch_key: u64,
        times: Option<&[u8]>,
    ) -> PyResult<Py<PyTuple>> {
        let s = self.draw(py, seeds, batch_key, times)?;
        let (row, col) = s.edge_index();
        let types = Sample::by_hop(&s.edge_types);
        let ids = Sample::by_hop(&s.edge_ids);
        let u32s = |v: &[u32]| PyByteArray::new(py, cast_slice(v));
        let tuple = (
            u32s(&s.nodes),
            s.hop_counts.clone(),
            u32s(&row),
            u32s(&col),
            s.edges_per_hop.clone(),
            u32s(&types),
            u32s(&s.batch),
            PyByteArray::new(py, cast_slice(&ids)),
        );
        Ok(tuple.into_pyobject(py)?.unbind())
    }

    /// The sample of [`PySampler::sample`] grouped by type (a typed store only), as PyG's
    /// heterogeneous sampler output: `(nodes, hop_counts, batch, rows, cols, edges_per_hop,
    /// edge_ids)`, `nodes`/`hop_counts`/`batch` one entry per node type (type-local ids as
    /// uint32 bytes, nodes first reached per hop, seeds of a disjoint sample as uint32 bytes),
    /// `rows`/`cols`/`edges_per_hop`/`edge_ids` one per edge type (indices into the source and
    /// destination type's `nodes` as uint32 bytes, edges per hop, rows in `edges_train` as
    /// uint64 bytes, empty unless the config asks for `edge_ids`).
    #[pyo3(signature = (seeds, batch_key, times=None))]
    fn sample_hetero(
        &self,
        py: Python<'_>,
        seeds: &[u8],
        batch_key: u64,
        times: Option<&[u8]>,
    ) -> PyResult<Py<PyTuple>> {
        if self.type_offsets.is_empty() {
            return Err(config_error(
                py,
                "sampler: the store has no node types; use sample() for a homogeneous graph",
            ));
        }
        let s = self.draw(py, seeds, batch_key, times)?;
        let h = HeteroSample::new(&s, &self.type_offsets, self.num_edge_types)
            .map_err(|e| e.to_py(py))?;
        fn lists<'py, T: bytemuck::Pod>(
            py: Python<'py>,
            v: &[Vec<T>],
        ) -> Vec<Bound<'py, PyByteArray>> {
            v.iter()
                .map(|l| PyByteArray::new(py, cast_slice(l)))
                .collect()
        }
        let tuple = (
            lists(py, &h.nodes),
            h.hop_counts.clone(),
            lists(py, &h.batch),
            lists(py, &h.rows),
            lists(py, &h.cols),
            h.edges_per_hop.clone(),
            lists(py, &h.edge_ids),
        );
        Ok(tuple.into_pyobject(py)?.unbind())
    }
}

impl PySampler {
    /// Samples without the GIL: temporally when `times` is given.
    fn draw(
        &self,
        py: Python<'_>,
        seeds: &[u8],
        batch_key: u64,
        times: Option<&[u8]>,
    ) -> PyResult<Sample> {
        let seeds: Vec<u32> = values(py, seeds, "seeds")?;
        let (sampler, topo) = (&self.sampler, &self.topology);
        let out = match times {
            None => py.detach(|| sampler.sample(topo, &seeds, batch_key)),
            Some(bytes) => {
                let times: Vec<i64> = values(py, bytes, "seed times")?;
                py.detach(|| sampler.sample_temporal(topo, &seeds, &times, batch_key))
            }
        };
        out.map_err(|e| e.to_py(py))
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PySampler>()
}
