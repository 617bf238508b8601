//! Opening stores and reading their arrays.

use pyo3::prelude::*;
use pyo3::types::PyBytes;
use pythonize::pythonize;
use strata_store::check::CheckOptions;
use strata_store::strtab::NameTable as NativeNameTable;
use strata_store::Store;

use crate::call::run;
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
    fn name(&self, py: Python<'_>, i: usize) -> PyResult<String> {
        if i >= self.0.len() {
            return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                "id {i} out of range (0..{})",
                self.0.len()
            )));
        }
        self.0.name(i).map_err(|e| e.to_py(py))
    }

    /// The id of `name`, or None.
    fn find(&self, py: Python<'_>, name: &str) -> PyResult<Option<u64>> {
        self.0.find(name.as_bytes()).map_err(|e| e.to_py(py))
    }

    /// The id of `name` among ids `lo..hi` (a typed store's node type), or None.
    fn find_in(&self, py: Python<'_>, name: &str, lo: u64, hi: u64) -> PyResult<Option<u64>> {
        self.0
            .find_in(name.as_bytes(), lo, hi)
            .map_err(|e| e.to_py(py))
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

/// The content digest (`blake3:HEX`, `strata_store::digest`) of the store or grid directory at
/// `path`: the kept one when its files are unchanged, else (with `compute`) computed from the
/// files and kept; None when not kept and not `compute`. A store is opened (validated) first.
#[pyfunction]
#[pyo3(signature = (path, compute=true))]
fn content_digest(
    py: Python<'_>,
    path: std::path::PathBuf,
    compute: bool,
) -> PyResult<Option<String>> {
    py.detach(|| {
        let manifest = if strata_grid::grid::is_grid_dir(&path) {
            strata_grid::layout::GRID_MANIFEST
        } else {
            Store::open(&path)?;
            strata_store::store::MANIFEST
        };
        match compute {
            true => strata_store::digest::content_digest(&path, manifest).map(Some),
            false => strata_store::digest::kept_digest(&path, manifest),
        }
    })
    .map_err(|e| e.to_py(py))
}

/// Checks every array of the store at `path` and every grid built for it (`strata check`),
/// or, when `path` is a grid built on its own (no store manifest, a grid manifest), that grid,
/// with `options` (the `[check]` section's, checked as it: at most `max_problems` listed per
/// file); returns the report (`strata_store::check::CheckReport`). Raises only on bad options,
/// I/O errors and cancellation.
#[pyfunction]
#[pyo3(signature = (path, options, progress=None))]
fn check_store(
    py: Python<'_>,
    path: std::path::PathBuf,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let max_per_file = crate::config::section::<CheckOptions>(options)?.max_problems;
    run(py, progress, |p| {
        let start = std::time::Instant::now();
        let standalone_grid = !path.join(strata_store::store::MANIFEST).exists()
            && path.join(strata_grid::layout::GRID_MANIFEST).is_file();
        let mut checked = if standalone_grid {
            let mut checked = strata_store::check::Checked::new(max_per_file);
            strata_grid::check::check_grid_dir(&path, &mut checked, p)?;
            checked
        } else {
            strata_store::check::check_store(&path, max_per_file, p)
                .map_err(strata_grid::GridError::from)?
        };
        if let Some(store) = checked.store.take() {
            strata_grid::check::check_grids(&store, &mut checked, p)?;
        }
        let mut report = checked.report(&path, start.elapsed().as_secs_f64());
        if standalone_grid {
            report.kind = "grid";
        }
        Ok::<_, strata_grid::GridError>(report)
    })
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_store, m)?)?;
    m.add_function(wrap_pyfunction!(open_store, m)?)?;
    m.add_function(wrap_pyfunction!(content_digest, m)?)?;
    m.add_function(wrap_pyfunction!(disk_usage, m)?)?;
    m.add_function(wrap_pyfunction!(read_npy_rows, m)?)?;
    m.add_class::<NameTable>()?;
    Ok(())
}
