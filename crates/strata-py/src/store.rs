//! Opening stores and reading their arrays.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pythonize::pythonize;
use strata_store::strtab::NameTable as NativeNameTable;
use strata_store::Store;

use crate::errors::ToPyErr;

/// Opens and validates the store at `path`; returns its manifest as a dict.
#[pyfunction]
fn open_store(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Py<PyAny>> {
    let store = py.detach(|| Store::open(&path)).map_err(|e| e.to_py(py))?;
    Ok(pythonize(py, store.manifest())?.unbind())
}

/// Bytes on disk of each file of the store at `path`.
#[pyfunction]
fn disk_usage(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Py<PyAny>> {
    let usage = Store::open(&path)
        .and_then(|s| s.disk_usage())
        .map_err(|e| e.to_py(py))?;
    Ok(pythonize(py, &usage)?.unbind())
}

/// A store's string table (node or relation names), memory-mapped for lookups.
#[pyclass(frozen)]
struct NameTable(NativeNameTable);

#[pymethods]
impl NameTable {
    /// Opens table `prefix` (`node_names` or `relation_names`) of the store at `path`.
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf, prefix: &str) -> PyResult<Self> {
        let table = Store::open(&path)
            .and_then(|s| NativeNameTable::open(&s, prefix))
            .map_err(|e| e.to_py(py))?;
        Ok(NameTable(table))
    }

    fn __len__(&self) -> usize {
        self.0.len()
    }

    /// The name of id `i`.
    fn name(&self, i: usize) -> PyResult<String> {
        if i >= self.0.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "id {i} out of range (0..{})",
                self.0.len()
            )));
        }
        Ok(String::from_utf8_lossy(self.0.get(i)).into_owned())
    }

    /// The id of `name`, or None.
    fn find(&self, name: &str) -> Option<u64> {
        self.0.find(name.as_bytes())
    }
}

/// Reads `rows` of the `.npy` at `path` through the I/O engine; returns
/// `(bytes, dtype, row_shape)` for NumPy to wrap.
#[pyfunction]
fn read_npy_rows(
    py: Python<'_>,
    path: std::path::PathBuf,
    rows: Vec<u64>,
) -> PyResult<(Py<PyBytes>, String, Vec<u64>)> {
    let (header, bytes) = py
        .detach(|| strata_store::array::read_rows(&path, &rows))
        .map_err(|e| e.to_py(py))?;
    let row_shape = header.shape.iter().skip(1).copied().collect();
    Ok((
        PyBytes::new(py, &bytes).unbind(),
        header.dtype.descr().to_string(),
        row_shape,
    ))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(open_store, m)?)?;
    m.add_function(wrap_pyfunction!(disk_usage, m)?)?;
    m.add_function(wrap_pyfunction!(read_npy_rows, m)?)?;
    m.add_class::<NameTable>()?;
    Ok(())
}
