//! Native GNN inference from Python without a server: a model exported by
//! `strata.serve.export_model`, loaded and run by `strata_serve::model` (the service's own
//! kernels). `strata.serve.native.NativeModel` wraps it with NumPy conversions.

use std::path::PathBuf;
use std::sync::Arc;

use bytemuck::{cast_slice, pod_collect_to_vec, Pod};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes};
use pythonize::pythonize;
use strata_graph::Block;
use strata_serve::model::{Architecture, Model, Precision};
use strata_serve::ServeError;

use crate::call::job;
use crate::errors::{config_error, raise, ToPyErr};

/// A GNN loaded for native inference (immutable; safe to share between threads).
#[pyclass(frozen, name = "NativeModel")]
struct PyNativeModel {
    model: Arc<Model>,
}

#[pymethods]
impl PyNativeModel {
    /// The model's outputs `(blocks[-1].num_dst, out_dim)` as float32 bytes (row-major).
    /// `blocks`: one `(num_src, num_dst, indptr, indices)` per layer in input-to-output order,
    /// `indptr` little-endian uint64 bytes (`num_dst + 1` offsets), `indices` little-endian
    /// uint32 bytes (local sources); `x`: the input rows `(blocks[0].num_src, in_dim)` as
    /// little-endian float32 bytes, row-major.
    #[allow(clippy::type_complexity)] // the Python signature: a list of tuples
    fn forward(
        &self,
        py: Python<'_>,
        blocks: Vec<(usize, usize, Bound<'_, PyBytes>, Bound<'_, PyBytes>)>,
        x: &[u8],
    ) -> PyResult<Py<PyByteArray>> {
        let blocks = blocks
            .iter()
            .enumerate()
            .map(|(i, (num_src, num_dst, indptr, indices))| {
                Ok(Block {
                    num_src: *num_src,
                    num_dst: *num_dst,
                    indptr: values(py, indptr.as_bytes(), &format!("blocks[{i}].indptr"))?,
                    indices: values(py, indices.as_bytes(), &format!("blocks[{i}].indices"))?,
                })
            })
            .collect::<PyResult<Vec<Block>>>()?;
        let x: Vec<f32> = values(py, x, "x")?;
        let model = &self.model;
        let out = py
            .detach(|| model.forward(&blocks, &x))
            .map_err(|e| serve_error(py, &e))?;
        Ok(PyByteArray::new(py, cast_slice(&out)).unbind())
    }

    /// The architecture: `kind`, `in_dim`, `hidden_dim`, `out_dim`, `layers`, `fanouts`.
    #[getter]
    fn architecture(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        Ok(pythonize(py, self.model.architecture())?.unbind())
    }

    /// `fp32` or `int8`.
    #[getter]
    fn precision(&self) -> &'static str {
        self.model.precision().name()
    }

    /// Number of scalars in the weights.
    #[getter]
    fn parameters(&self) -> u64 {
        self.model.parameters()
    }

    /// Bytes the weights occupy in memory as served.
    #[getter]
    fn nbytes(&self) -> u64 {
        self.model.bytes()
    }
}

/// Loads the weights file at `path` (safetensors or npz; `format` or the suffix says which)
/// for inference in `precision` (`fp32` or `int8`); `architecture` (a dict of the fields of
/// `strata_serve::model::Architecture`) overrides the one the file declares.
#[pyfunction]
#[pyo3(signature = (path, precision="fp32", format=None, architecture=None))]
fn serve_model_load(
    py: Python<'_>,
    path: PathBuf,
    precision: &str,
    format: Option<&str>,
    architecture: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyNativeModel> {
    let precision: Precision = precision
        .parse()
        .map_err(|e: ServeError| config_error(py, &e.to_string()))?;
    let arch: Option<Architecture> = architecture.map(job).transpose()?;
    let model = py
        .detach(|| Model::load(&path, format, arch, precision))
        .map_err(|e| serve_error(py, &e))?;
    Ok(PyNativeModel {
        model: Arc::new(model),
    })
}

/// Little-endian values of type `T` from Python bytes; `what` names the argument.
fn values<T: Pod>(py: Python<'_>, bytes: &[u8], what: &str) -> PyResult<Vec<T>> {
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
    // Python's buffer need not be aligned for T: copy rather than cast in place.
    Ok(pod_collect_to_vec(bytes))
}

/// The Python exception for an error of the model loader or kernels: a malformed or mismatched
/// weights file or input is an `InputError` (a `ValueError`) whose message names the file,
/// tensor or argument.
fn serve_error(py: Python<'_>, e: &ServeError) -> PyErr {
    let msg = e.to_string();
    match e {
        ServeError::InvalidArgument(_)
        | ServeError::FailedPrecondition(_)
        | ServeError::PermissionDenied(_) => raise(py, "InputError", &msg),
        ServeError::NotFound(_) => raise(py, "InputNotFoundError", &msg),
        ServeError::AlreadyExists(_) => raise(py, "StoreExistsError", &msg),
        ServeError::ResourceExhausted(_) | ServeError::OutOfRange(_) => {
            raise(py, "BudgetError", &msg)
        }
        ServeError::Unavailable(_) | ServeError::DeadlineExceeded(_) => {
            raise(py, "StrataError", &msg)
        }
        ServeError::Store(e) => e.to_py(py),
        ServeError::Graph(e) => e.to_py(py),
        ServeError::Io { source, .. } if source.kind() == std::io::ErrorKind::NotFound => {
            raise(py, "InputNotFoundError", &msg)
        }
        ServeError::Io { .. } => raise(py, "StrataIOError", &msg),
    }
}

/// Adds `serve_model_load` and the `NativeModel` class to the extension module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(serve_model_load, m)?)?;
    m.add_class::<PyNativeModel>()?;
    Ok(())
}
