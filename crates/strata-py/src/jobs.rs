//! Long jobs: generators (conversions are in `convert`).

use pyo3::prelude::*;
use strata_store::generate as generators;

use crate::call::run;
use crate::config::section;
use crate::errors::config_error;

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
    m.add_function(wrap_pyfunction!(generate, m)?)?;
    Ok(())
}
