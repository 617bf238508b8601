//! Long jobs: conversions and generators.

use pyo3::prelude::*;
use strata_store::convert;
use strata_store::generate as generators;

use crate::config::section;
use crate::errors::config_error;
use crate::{job, run};

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

/// Converts typed NumPy arrays; `job` mirrors `strata_store::convert::TypedNumpyJob`.
#[pyfunction]
#[pyo3(signature = (job, progress=None))]
fn convert_typed_numpy(
    py: Python<'_>,
    job: &Bound<'_, PyAny>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let j: convert::TypedNumpyJob = self::job(job)?;
    run(py, progress, |p| convert::convert_typed_numpy(&j, p))
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

/// Generates a graph: `kind` is `rmat`, `kg`, `sbm` or `hetsbm`; `options` mirrors its options
/// struct.
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
            let o: generators::RmatOptions = section(options)?;
            run(py, progress, |p| generators::rmat(&o, p))
        }
        "kg" => {
            let o: generators::KgOptions = section(options)?;
            run(py, progress, |p| generators::kg(&o, p))
        }
        "sbm" => {
            let o: generators::SbmOptions = section(options)?;
            run(py, progress, |p| generators::sbm(&o, p))
        }
        "hetsbm" => {
            let o: generators::HetSbmOptions = section(options)?;
            run(py, progress, |p| generators::hetsbm(&o, p))
        }
        other => Err(config_error(
            py,
            &format!("unknown generator '{other}' (rmat, kg, sbm, hetsbm)"),
        )),
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(convert_text, m)?)?;
    m.add_function(wrap_pyfunction!(convert_numpy, m)?)?;
    m.add_function(wrap_pyfunction!(convert_typed_numpy, m)?)?;
    m.add_function(wrap_pyfunction!(convert_binary, m)?)?;
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    Ok(())
}
