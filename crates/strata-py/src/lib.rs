//! The `strata._native` extension module. Thin by design: each function turns a Python dict
//! into a typed Rust job (serde), runs it with the GIL released, and turns the result back
//! into Python objects. Progress and cancellation go through a Python callback; typed Rust
//! errors become the exception classes of `strata.errors`.

mod errors;
mod progress;

use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};
use serde::de::DeserializeOwned;
use serde::Serialize;
use strata_store::generate as generators;
use strata_store::strtab::NameTable as NativeNameTable;
use strata_store::{convert, Store};

use errors::{config_error, to_py};
use progress::PyProgress;

/// Converts a Python dict into a typed job, naming the offending field on failure.
fn job<T: DeserializeOwned>(obj: &Bound<'_, PyAny>) -> PyResult<T> {
    depythonize(obj).map_err(|e| config_error(obj.py(), &e.to_string()))
}

/// Runs `f` without the GIL, reporting progress to `callback`, and converts its result.
fn run<T: Serialize + Send>(
    py: Python<'_>,
    callback: Option<Py<PyAny>>,
    f: impl FnOnce(&PyProgress) -> strata_store::Result<T> + Send,
) -> PyResult<Py<PyAny>> {
    let progress = PyProgress::new(callback);
    let outcome = py.detach(|| f(&progress));
    match outcome {
        Ok(v) => Ok(pythonize(py, &v)?.unbind()),
        Err(e) => Err(progress.take_error().unwrap_or_else(|| to_py(py, &e))),
    }
}

/// Converts text edge lists; `job` mirrors `strata_store::convert::TextJob`.
#[pyfunction]
#[pyo3(signature = (job, progress=None))]
fn convert_text(
    py: Python<'_>,
    job: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j: convert::TextJob = self::job(job)?;
    run(py, progress, |p| convert::convert_text(&j, p))
}

/// Converts NumPy arrays; `job` mirrors `strata_store::convert::NumpyJob`.
#[pyfunction]
#[pyo3(signature = (job, progress=None))]
fn convert_numpy(
    py: Python<'_>,
    job: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j: convert::NumpyJob = self::job(job)?;
    run(py, progress, |p| convert::convert_numpy(&j, p))
}

/// Converts raw int32 pair files; `job` mirrors `strata_store::convert::BinaryJob`.
#[pyfunction]
#[pyo3(signature = (job, progress=None))]
fn convert_binary(
    py: Python<'_>,
    job: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j: convert::BinaryJob = self::job(job)?;
    run(py, progress, |p| convert::convert_binary(&j, p))
}

/// Generates a graph: `kind` is `rmat`, `kg` or `sbm`; `options` mirrors its options struct.
#[pyfunction]
#[pyo3(signature = (kind, options, progress=None))]
fn generate(
    py: Python<'_>,
    kind: &str,
    options: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    match kind {
        "rmat" => {
            let o: generators::RmatOptions = job(options)?;
            run(py, progress, |p| generators::rmat(&o, p))
        }
        "kg" => {
            let o: generators::KgOptions = job(options)?;
            run(py, progress, |p| generators::kg(&o, p))
        }
        "sbm" => {
            let o: generators::SbmOptions = job(options)?;
            run(py, progress, |p| generators::sbm(&o, p))
        }
        other => Err(config_error(
            py,
            &format!("unknown generator '{other}' (rmat, kg, sbm)"),
        )),
    }
}

/// The default options of generator `kind` (required fields filled with placeholders), so the
/// front end can check that the defaults it documents are the ones the generator applies.
#[pyfunction]
fn generator_defaults(py: Python<'_>, kind: &str) -> PyResult<Py<PyAny>> {
    let value = match kind {
        "rmat" => serde_json::to_value(generators::RmatOptions::new("out", 1)),
        "kg" => serde_json::to_value(generators::KgOptions::new("out")),
        "sbm" => serde_json::to_value(generators::SbmOptions::new("out")),
        other => {
            return Err(config_error(
                py,
                &format!("unknown generator '{other}' (rmat, kg, sbm)"),
            ))
        }
    }
    .expect("options serialise");
    Ok(pythonize(py, &value)?.unbind())
}

/// Opens and validates the store at `path`; returns its manifest as a dict.
#[pyfunction]
fn open_store(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Py<PyAny>> {
    let store = py
        .detach(|| Store::open(&path))
        .map_err(|e| to_py(py, &e))?;
    Ok(pythonize(py, store.manifest())?.unbind())
}

/// Bytes on disk of each file of the store at `path`.
#[pyfunction]
fn disk_usage(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Py<PyAny>> {
    let usage = Store::open(&path)
        .and_then(|s| s.disk_usage())
        .map_err(|e| to_py(py, &e))?;
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
            .map_err(|e| to_py(py, &e))?;
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

/// Makes glibc return large freed buffers to the OS at once. Its default raises the mmap
/// threshold after the first large free, after which freed buffers stay resident in per-thread
/// arenas: a job that plans its buffers within `--memory` would then exceed it in RSS.
fn pin_malloc_thresholds() {
    // SAFETY: mallopt only adjusts allocator parameters; it is safe to call at any time.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    pin_malloc_thresholds();
    m.add_function(wrap_pyfunction!(convert_text, m)?)?;
    m.add_function(wrap_pyfunction!(convert_numpy, m)?)?;
    m.add_function(wrap_pyfunction!(convert_binary, m)?)?;
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    m.add_function(wrap_pyfunction!(generator_defaults, m)?)?;
    m.add_function(wrap_pyfunction!(open_store, m)?)?;
    m.add_function(wrap_pyfunction!(disk_usage, m)?)?;
    m.add_class::<NameTable>()?;
    m.add("FORMAT_VERSION", strata_store::manifest::FORMAT_VERSION)?;
    Ok(())
}
