//! The device side of embedding evaluation: the torch evaluator of the Python package
//! (`strata.embed.device.evaluate.TorchRanker`) behind the evaluator's ranker seam. Each block
//! of candidates takes the GIL and lends the round's rows and the candidates to Python as
//! read-only memoryviews (no copy), released before the call returns.

use pyo3::prelude::*;
use pyo3::types::PyDict;
use strata_embed::{DeviceRank, RankJob};

use crate::embed_device::{import_torch_module, view};

/// The Python evaluator object of one evaluation.
struct PyDeviceRank {
    ranker: Py<PyAny>,
}

/// A read-only view of `values`, kept in `views` for release.
fn lend<'py, T>(
    py: Python<'py>,
    values: &[T],
    views: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    // SAFETY: `values` outlive the call; the view is read-only and released before it returns.
    let v = unsafe {
        view(
            py,
            values.as_ptr() as *mut u8,
            std::mem::size_of_val(values),
            false,
        )?
    };
    views.push(v.clone());
    Ok(v)
}

impl PyDeviceRank {
    fn call<'py>(
        &self,
        py: Python<'py>,
        job: &RankJob,
        views: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<(u64, u64)>> {
        let d = PyDict::new(py);
        d.set_item("model", job.model)?;
        let (operator, comparator) = job.pbg.unzip();
        d.set_item("operator", operator)?;
        d.set_item("comparator", comparator)?;
        d.set_item("dim", job.dim)?;
        d.set_item("transe_norm", job.transe_norm)?;
        d.set_item("src", lend(py, job.src, views)?)?;
        d.set_item("rel", lend(py, job.rel, views)?)?;
        d.set_item("true_score", lend(py, job.true_score, views)?)?;
        d.set_item("cands", lend(py, job.cands, views)?)?;
        d.set_item("cands_dtype", job.cands_dtype)?;
        d.set_item("n", job.n)?;
        d.set_item("lo", lend(py, &job.lo, views)?)?;
        d.set_item("hi", lend(py, &job.hi, views)?)?;
        d.set_item(
            "excluded_per_query",
            lend(py, &job.excluded_per_query, views)?,
        )?;
        d.set_item("excluded_cand", lend(py, &job.excluded_cand, views)?)?;
        let (above, equal): (Vec<u64>, Vec<u64>) =
            self.ranker.call_method1(py, "count", (d,))?.extract(py)?;
        Ok(above.into_iter().zip(equal).collect())
    }
}

impl DeviceRank for PyDeviceRank {
    fn count(&mut self, job: &RankJob) -> Result<Vec<(u64, u64)>, String> {
        Python::attach(|py| {
            let mut views = Vec::new();
            // The exception (whose frames may hold tensors over the views) becomes its
            // message before the views are released.
            let outcome = self.call(py, job, &mut views).map_err(|e| e.to_string());
            for v in views {
                if let Err(e) = v.call_method0("release") {
                    return Err(format!("the device evaluator kept a view of a round: {e}"));
                }
            }
            outcome
        })
    }
}

/// The device evaluator of `device` (see `strata_embed::DeviceRankFactory`): a new
/// `TorchRanker(device)`, or why not (torch missing, CUDA absent).
fn make(device: &str) -> Result<Box<dyn DeviceRank>, String> {
    Python::attach(|py| {
        let module = import_torch_module(py, "strata.embed.device.evaluate", device)?;
        let ranker = module
            .getattr("TorchRanker")
            .and_then(|c| c.call1((device,)))
            .map_err(|e| e.value(py).to_string())?;
        Ok(Box::new(PyDeviceRank {
            ranker: ranker.unbind(),
        }) as Box<dyn DeviceRank>)
    })
}

/// Registers the torch evaluator as the engine's device ranker.
pub fn register() {
    strata_embed::register_device_rank(make);
}
