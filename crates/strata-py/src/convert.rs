//! `strata convert` from Python: the `[convert]` section in, the plan or the conversion's
//! summary out.

use pyo3::prelude::*;
use pythonize::{depythonize, pythonize};
use strata_store::convert::{self as store, ConvertOptions};

use crate::call::run;
use crate::config::section;
use crate::errors::{config_error, ToPyErr};

/// What a conversion with the `[convert]` section `options` reads: the input format (detected
/// when `auto`) and the files by role (`strata_store::convert::SourcePlan`).
#[pyfunction]
fn convert_plan(py: Python<'_>, options: &Bound<'_, PyAny>) -> PyResult<Py<PyAny>> {
    let o: ConvertOptions = section(options)?;
    let plan = store::plan_inputs(&o).map_err(|e| e.to_py(py))?;
    Ok(pythonize(py, &plan)?.unbind())
}

/// Converts the inputs of the `[convert]` section `options` into the store `options.out`;
/// `provenance` is recorded in the manifest. Returns the summary.
#[pyfunction]
#[pyo3(signature = (options, provenance=None, progress=None))]
fn convert(
    py: Python<'_>,
    options: &Bound<'_, PyAny>,
    provenance: Option<&Bound<'_, PyAny>>,
    progress: Option<Py<PyAny>>,
) -> PyResult<Py<PyAny>> {
    let o: ConvertOptions = section(options)?;
    let provenance: serde_json::Value = match provenance {
        Some(p) => depythonize(p).map_err(|e| config_error(py, &format!("provenance: {e}")))?,
        None => serde_json::Value::Null,
    };
    run(py, progress, |p| store::convert(&o, provenance, p))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(convert_plan, m)?)?;
    m.add_function(wrap_pyfunction!(convert, m)?)?;
    Ok(())
}
